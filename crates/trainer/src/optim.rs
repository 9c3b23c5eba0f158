//! AdamW with state we own (so checkpoints hold it), learning-rate schedules, and global-norm
//! gradient clipping. candle's `AdamW` hides its moments and step count, which makes exact
//! resume impossible; this one exposes both.

use std::collections::HashMap;

use candle_core::{DType, Result, Tensor, Var};

use crate::config::{Schedule, TrainConfig};

/// Learning rate at a given optimizer step (1-based).
#[derive(Debug, Clone, PartialEq)]
pub struct LrSchedule {
    pub kind: Schedule,
    pub peak: f64,
    pub min: f64,
    pub warmup: u64,
    pub total: u64,
}

impl LrSchedule {
    pub fn new(cfg: &TrainConfig, total_steps: u64) -> Self {
        Self {
            kind: cfg.schedule,
            peak: cfg.lr,
            min: cfg.min_lr,
            warmup: cfg.warmup_steps,
            total: total_steps,
        }
    }

    /// The rate for update number `step` (1 = the first update).
    pub fn at(&self, step: u64) -> f64 {
        let step = step.max(1);
        if step <= self.warmup {
            return self.peak * step as f64 / self.warmup as f64;
        }
        match self.kind {
            Schedule::Constant => self.peak,
            Schedule::Cosine => {
                let span = self.total.saturating_sub(self.warmup).max(1) as f64;
                let progress = ((step - self.warmup) as f64 / span).min(1.0);
                self.min + 0.5 * (self.peak - self.min) * (1.0 + (std::f64::consts::PI * progress).cos())
            }
            Schedule::InverseSqrt => self.peak * (self.warmup.max(1) as f64 / step as f64).sqrt(),
        }
    }
}

/// One trainable tensor and how the optimizer treats it.
pub struct Param {
    pub name: String,
    pub var: Var,
    /// Decoupled weight decay applies (matrices; not norms, biases, scales or — by default — embeddings).
    pub decay: bool,
    m: Tensor,
    v: Tensor,
}

/// AdamW (Loshchilov & Hutter 2019) with bias correction.
pub struct AdamW {
    params: Vec<Param>,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// Updates applied so far.
    pub step: u64,
}

/// Whether a parameter gets weight decay, from its name and shape.
pub fn decays(name: &str, var: &Var, decay_embeddings: bool) -> bool {
    let is_embedding = name.starts_with("embed.") || name.starts_with("lm_head.");
    var.rank() >= 2 && (decay_embeddings || !is_embedding)
}

impl AdamW {
    pub fn new(vars: Vec<(String, Var)>, cfg: &TrainConfig) -> Result<Self> {
        let params = vars
            .into_iter()
            .map(|(name, var)| {
                let zeros = var.zeros_like()?;
                Ok(Param {
                    decay: decays(&name, &var, cfg.decay_embeddings),
                    name,
                    m: zeros.clone(),
                    v: zeros,
                    var,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            params,
            beta1: cfg.beta1,
            beta2: cfg.beta2,
            eps: cfg.adam_eps,
            weight_decay: cfg.weight_decay,
            step: 0,
        })
    }

    pub fn params(&self) -> &[Param] {
        &self.params
    }

    /// Applies one update with learning rate `lr` from (already clipped) gradients, given in
    /// the order of [`params`](Self::params); `None` leaves a parameter and its moments alone.
    pub fn step(&mut self, grads: &[Option<Tensor>], lr: f64) -> Result<()> {
        self.step += 1;
        let t = self.step as i32;
        let (b1, b2) = (self.beta1, self.beta2);
        let bc1 = 1.0 - b1.powi(t);
        let bc2 = 1.0 - b2.powi(t);
        for (p, g) in self.params.iter_mut().zip(grads) {
            let Some(g) = g else {
                continue;
            };
            let theta = p.var.as_tensor().detach();
            p.m = ((&p.m * b1)? + (g * (1.0 - b1))?)?;
            p.v = ((&p.v * b2)? + (g.sqr()? * (1.0 - b2))?)?;
            let denom = ((&p.v / bc2)?.sqrt()? + self.eps)?;
            let update = ((&p.m / bc1)? / denom)?;
            let decayed = if p.decay && self.weight_decay > 0.0 {
                (theta * (1.0 - lr * self.weight_decay))?
            } else {
                theta
            };
            p.var.set(&(decayed - (update * lr)?)?)?;
        }
        Ok(())
    }

    /// Moments by name (`m.NAME`, `v.NAME`), for checkpoints.
    pub fn state_tensors(&self) -> HashMap<String, Tensor> {
        let mut out = HashMap::new();
        for p in &self.params {
            out.insert(format!("m.{}", p.name), p.m.clone());
            out.insert(format!("v.{}", p.name), p.v.clone());
        }
        out
    }

    /// Restores moments saved by [`state_tensors`](Self::state_tensors); every parameter must be present.
    pub fn load_state(&mut self, mut tensors: HashMap<String, Tensor>, step: u64) -> Result<()> {
        for p in &mut self.params {
            for (prefix, slot) in [("m", &mut p.m), ("v", &mut p.v)] {
                let key = format!("{prefix}.{}", p.name);
                let t = tensors
                    .remove(&key)
                    .ok_or_else(|| candle_core::Error::Msg(format!("optimizer state lacks {key}")))?;
                if t.shape() != p.var.shape() {
                    candle_core::bail!(
                        "optimizer state {key} has shape {:?}, expected {:?}",
                        t.shape(),
                        p.var.shape()
                    );
                }
                *slot = t.to_dtype(p.var.dtype())?.to_device(p.var.device())?;
            }
        }
        self.step = step;
        Ok(())
    }
}

/// Result of measuring (and possibly clipping) gradients.
#[derive(Debug, Clone, PartialEq)]
pub struct GradCheck {
    /// Global L2 norm before clipping.
    pub norm: f64,
    /// The first parameter whose gradient holds NaN or ±inf, if any.
    pub non_finite: Option<String>,
}

/// Global L2 norm of `grads` (aligned with `params`); scales them in place to norm ≤ `max_norm`.
pub fn clip_grad_norm(
    params: &[Param],
    grads: &mut [Option<Tensor>],
    max_norm: Option<f64>,
) -> Result<GradCheck> {
    let mut total = 0f64;
    let mut non_finite = None;
    for (p, g) in params.iter().zip(grads.iter()) {
        if let Some(g) = g {
            let sq = g.sqr()?.sum_all()?.to_dtype(DType::F64)?.to_scalar::<f64>()?;
            if !sq.is_finite() && non_finite.is_none() {
                non_finite = Some(p.name.clone());
            }
            total += sq;
        }
    }
    let norm = total.sqrt();
    if let (Some(max), None) = (max_norm, &non_finite) {
        if norm > max {
            let scale = max / (norm + 1e-6);
            for g in grads.iter_mut().flatten() {
                *g = (&*g * scale)?;
            }
        }
    }
    Ok(GradCheck { norm, non_finite })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched(kind: Schedule) -> LrSchedule {
        LrSchedule {
            kind,
            peak: 1.0,
            min: 0.1,
            warmup: 10,
            total: 110,
        }
    }

    #[test]
    fn warmup_is_linear_then_each_schedule_takes_over() {
        for kind in [Schedule::Constant, Schedule::Cosine, Schedule::InverseSqrt] {
            let s = sched(kind);
            assert!((s.at(1) - 0.1).abs() < 1e-12);
            assert!((s.at(5) - 0.5).abs() < 1e-12);
            assert!((s.at(10) - 1.0).abs() < 1e-12);
        }
        let c = sched(Schedule::Cosine);
        assert!((c.at(60) - 0.55).abs() < 1e-12, "halfway is the midpoint");
        assert!((c.at(110) - 0.1).abs() < 1e-12, "ends at the floor");
        assert!((c.at(500) - 0.1).abs() < 1e-12, "stays at the floor");
        let i = sched(Schedule::InverseSqrt);
        assert!((i.at(40) - 0.5).abs() < 1e-12);
        assert_eq!(sched(Schedule::Constant).at(1000), 1.0);
    }
}
