//! AdamW with state we own (so checkpoints hold it), learning-rate schedules, and global-norm
//! gradient clipping. candle's `AdamW` hides its moments and step count, which makes exact
//! resume impossible; this one exposes both. The per-parameter arithmetic is the kernels
//! crate's ([`ember_kernels::adamw`]).

use std::collections::HashMap;

use candle_core::{Result, Tensor, Var};
use ember_kernels::adamw::{adamw_step, adamw_step_unfused, AdamWStep, Moments};
use ember_kernels::ledger::{DeviceAdamW, StepLedger};
use ember_kernels::sum_of_squares;

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
    moments: Moments,
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
    /// Update every parameter with tensor ops even where the fused CPU pass applies (the
    /// reference the fused pass is tested against).
    pub unfused: bool,
}

/// Whether a parameter gets weight decay, from its name and shape.
pub fn decays(name: &str, var: &Var, decay_embeddings: bool) -> bool {
    // Learned position tables (`*.embed_positions.weight`) count as embeddings, as in GPT-2.
    let is_embedding =
        name.starts_with("embed.") || name.starts_with("lm_head.") || name.contains("embed_positions.");
    var.rank() >= 2 && (decay_embeddings || !is_embedding)
}

impl AdamW {
    pub fn new(vars: Vec<(String, Var)>, cfg: &TrainConfig) -> Result<Self> {
        let params = vars
            .into_iter()
            .map(|(name, var)| {
                let moments = Moments::zeros(&var)?;
                Ok(Param {
                    decay: decays(&name, &var, cfg.decay_embeddings),
                    name,
                    moments,
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
            unfused: false,
        })
    }

    pub fn params(&self) -> &[Param] {
        &self.params
    }

    /// Applies one update with learning rate `lr` from gradients given in the order of
    /// [`params`](Self::params), each multiplied by `grad_scale` first (the clipping factor from
    /// [`clip_grad_norm`]); `None` leaves a parameter and its moments alone.
    pub fn step(&mut self, grads: &[Option<Tensor>], lr: f64, grad_scale: f64) -> Result<()> {
        self.step += 1;
        let t = self.step as i32;
        let (b1, b2) = (self.beta1, self.beta2);
        let bc1 = 1.0 - b1.powi(t);
        let bc2 = 1.0 - b2.powi(t);
        for (p, g) in self.params.iter_mut().zip(grads) {
            let Some(g) = g else {
                continue;
            };
            let c = AdamWStep {
                lr,
                beta1: b1,
                beta2: b2,
                eps: self.eps,
                decay: if p.decay {
                    1.0 - lr * self.weight_decay
                } else {
                    1.0
                },
                bias_correction1: bc1,
                bias_correction2: bc2,
                grad_scale,
            };
            if self.unfused {
                adamw_step_unfused(&p.var, g, &mut p.moments, &c)?;
            } else {
                adamw_step(&p.var, g, &mut p.moments, &c)?;
            }
        }
        Ok(())
    }

    /// [`step`](Self::step) on the device, one launch per parameter, with the clip factor, the
    /// bias corrections and whether to apply the update at all read from `ledger` (which
    /// counts the updates applied: [`Updater::settle`](crate::update::Updater::settle) copies
    /// the count into [`step`](Self::step)).
    pub fn step_on_device(
        &mut self,
        grads: &[Option<Tensor>],
        lr: f64,
        ledger: &mut StepLedger,
    ) -> Result<()> {
        for (p, g) in self.params.iter_mut().zip(grads) {
            let Some(g) = g else {
                continue;
            };
            let c = DeviceAdamW {
                lr,
                beta1: self.beta1,
                beta2: self.beta2,
                eps: self.eps,
                decay: if p.decay {
                    1.0 - lr * self.weight_decay
                } else {
                    1.0
                },
            };
            ledger.adamw(&p.var, g, &mut p.moments, &c)?;
        }
        Ok(())
    }

    /// Moments by name (`m.NAME`, `v.NAME`), for checkpoints.
    pub fn state_tensors(&self) -> Result<HashMap<String, Tensor>> {
        let mut out = HashMap::new();
        for p in &self.params {
            let (m, v) = p.moments.tensors(p.var.shape())?;
            out.insert(format!("m.{}", p.name), m);
            out.insert(format!("v.{}", p.name), v);
        }
        Ok(out)
    }

    /// Restores moments saved by [`state_tensors`](Self::state_tensors); every parameter must be present.
    pub fn load_state(&mut self, mut tensors: HashMap<String, Tensor>, step: u64) -> Result<()> {
        for p in &mut self.params {
            let mut take = |prefix: &str| -> Result<Tensor> {
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
                t.to_dtype(p.var.dtype())?.to_device(p.var.device())
            };
            let (m, v) = (take("m")?, take("v")?);
            p.moments.store(m, v)?;
        }
        self.step = step;
        Ok(())
    }
}

/// Result of measuring gradients.
#[derive(Debug, Clone, PartialEq)]
pub struct GradCheck {
    /// Global L2 norm before clipping.
    pub norm: f64,
    /// What to multiply every gradient by so the global norm is at most the clipping threshold
    /// (1 when it already is, or when there is no threshold); [`AdamW::step`] applies it.
    pub scale: f64,
    /// The first parameter whose gradient holds NaN or ±inf, if any.
    pub non_finite: Option<String>,
}

/// Global L2 norm of `grads` (aligned with `params`) and the factor that clips it to `max_norm`.
pub fn clip_grad_norm(
    params: &[Param],
    grads: &[Option<Tensor>],
    max_norm: Option<f64>,
) -> Result<GradCheck> {
    let mut total = 0f64;
    let mut non_finite = None;
    for (p, g) in params.iter().zip(grads) {
        if let Some(g) = g {
            let sq = sum_of_squares(g)?;
            if !sq.is_finite() && non_finite.is_none() {
                non_finite = Some(p.name.clone());
            }
            total += sq;
        }
    }
    let norm = total.sqrt();
    let scale = match (max_norm, &non_finite) {
        (Some(max), None) if norm > max => max / (norm + 1e-6),
        _ => 1.0,
    };
    Ok(GradCheck {
        norm,
        scale,
        non_finite,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn matrices_decay_but_embeddings_and_learned_positions_only_when_asked() {
        let matrix = Var::zeros((4, 4), candle_core::DType::F32, &Device::Cpu).unwrap();
        let gain = Var::zeros(4, candle_core::DType::F32, &Device::Cpu).unwrap();
        assert!(decays("decoder.layers.0.mlp.up_proj.weight", &matrix, false));
        assert!(!decays("decoder.layers.0.mlp_norm.weight", &gain, true));
        for name in [
            "embed.weight",
            "lm_head.weight",
            "decoder.embed_positions.weight",
            "encoder.embed_positions.weight",
        ] {
            assert!(!decays(name, &matrix, false), "{name}");
            assert!(decays(name, &matrix, true), "{name}");
        }
    }

    fn sched(kind: Schedule) -> LrSchedule {
        LrSchedule {
            kind,
            peak: 1.0,
            min: 0.1,
            warmup: 10,
            total: 110,
        }
    }

    fn cfg() -> TrainConfig {
        serde_json::from_value(serde_json::json!({"steps": 1, "lr": 1e-2, "weight_decay": 0.1})).unwrap()
    }

    /// Two parameters that decay (a matrix) and do not (a vector), of sizes that are not
    /// multiples of the vector width.
    fn vars() -> Vec<(String, Var)> {
        let w = Tensor::randn(0f32, 1.0, (7, 13), &Device::Cpu).unwrap();
        let b = Tensor::randn(0f32, 1.0, 13, &Device::Cpu).unwrap();
        vec![
            ("blocks.0.w".into(), Var::from_tensor(&w).unwrap()),
            ("blocks.0.b".into(), Var::from_tensor(&b).unwrap()),
        ]
    }

    fn copy(vars: &[(String, Var)]) -> Vec<(String, Var)> {
        vars.iter()
            .map(|(n, v)| {
                (
                    n.clone(),
                    Var::from_tensor(&v.as_tensor().copy().unwrap()).unwrap(),
                )
            })
            .collect()
    }

    fn random_grads(opt: &AdamW) -> Vec<Option<Tensor>> {
        opt.params()
            .iter()
            .map(|p| Some(Tensor::randn(0f32, 1.0, p.var.shape(), &Device::Cpu).unwrap()))
            .collect()
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar()
            .unwrap()
    }

    #[test]
    fn the_fused_update_is_the_tensor_update() {
        let vars = vars();
        let mut fused = AdamW::new(copy(&vars), &cfg()).unwrap();
        let mut reference = AdamW::new(copy(&vars), &cfg()).unwrap();
        reference.unfused = true;
        // Steps with and without a clipping factor, and one that skips the vector's gradient.
        for (step, scale) in [(0, 1.0), (1, 0.37), (2, 1.0), (3, 2.5)] {
            let grads: Vec<Option<Tensor>> = vars
                .iter()
                .enumerate()
                .map(|(i, (_, v))| {
                    (step != 2 || i == 0).then(|| Tensor::randn(0f32, 1.0, v.shape(), &Device::Cpu).unwrap())
                })
                .collect();
            let lr = 1e-2 * (step + 1) as f64;
            fused.step(&grads, lr, scale).unwrap();
            reference.step(&grads, lr, scale).unwrap();
        }
        for (f, r) in fused.params().iter().zip(reference.params()) {
            let d = max_diff(f.var.as_tensor(), r.var.as_tensor());
            assert!(d < 1e-6, "{}: parameters differ by {d}", f.name);
        }
        let (fs, rs) = (fused.state_tensors().unwrap(), reference.state_tensors().unwrap());
        assert_eq!(fs.len(), 4);
        for (k, f) in &fs {
            let d = max_diff(f, &rs[k]);
            assert!(d < 1e-6, "{k}: moments differ by {d}");
        }
    }

    #[test]
    fn the_first_update_moves_each_weight_by_lr_against_its_gradient_sign() {
        // With bias correction, step 1 is θ·(1 − lr·wd) − lr·g/(|g| + ε): a closed form.
        let mut opt = AdamW::new(vars(), &cfg()).unwrap();
        let before: Vec<Tensor> = opt
            .params()
            .iter()
            .map(|p| p.var.as_tensor().copy().unwrap())
            .collect();
        let grads = random_grads(&opt);
        opt.step(&grads, 0.01, 1.0).unwrap();
        for ((p, theta), g) in opt.params().iter().zip(&before).zip(&grads) {
            let g = g.as_ref().unwrap();
            let decay = if p.decay { 1.0 - 0.01 * 0.1 } else { 1.0 };
            let expected = ((theta * decay).unwrap()
                - (g / (g.abs().unwrap() + 1e-8).unwrap()).unwrap() * 0.01)
                .unwrap();
            let d = max_diff(p.var.as_tensor(), &expected);
            assert!(d < 1e-6, "{}: {d}", p.name);
        }
    }

    #[test]
    fn moments_survive_a_save_and_load() {
        let mut opt = AdamW::new(vars(), &cfg()).unwrap();
        let grads = random_grads(&opt);
        opt.step(&grads, 0.01, 1.0).unwrap();
        let saved = opt.state_tensors().unwrap();
        let mut restored = AdamW::new(vars(), &cfg()).unwrap();
        restored.load_state(saved.clone(), opt.step).unwrap();
        for (k, t) in restored.state_tensors().unwrap() {
            assert_eq!(max_diff(&t, &saved[&k]), 0.0, "{k}");
        }
        assert!(
            restored.load_state(HashMap::new(), 1).is_err(),
            "missing moments are an error"
        );
    }

    #[test]
    fn clipping_scales_to_the_threshold_and_flags_non_finite_gradients() {
        let opt = AdamW::new(vars(), &cfg()).unwrap();
        // ‖g‖² = 7·13·4 + 13·9 = 481.
        let grads = vec![
            Some(Tensor::full(2f32, (7, 13), &Device::Cpu).unwrap()),
            Some(Tensor::full(-3f32, 13, &Device::Cpu).unwrap()),
        ];
        let check = clip_grad_norm(opt.params(), &grads, Some(1.0)).unwrap();
        assert!((check.norm - 481f64.sqrt()).abs() < 1e-9, "{}", check.norm);
        assert!((check.scale * check.norm - 1.0).abs() < 1e-6);
        assert_eq!(
            clip_grad_norm(opt.params(), &grads, Some(100.0)).unwrap().scale,
            1.0
        );
        assert_eq!(clip_grad_norm(opt.params(), &grads, None).unwrap().scale, 1.0);
        let bad = vec![
            grads[0].clone(),
            Some(Tensor::new(&[f32::NAN; 13], &Device::Cpu).unwrap()),
        ];
        let check = clip_grad_norm(opt.params(), &bad, Some(1.0)).unwrap();
        assert_eq!(check.non_finite.as_deref(), Some("blocks.0.b"));
        assert_eq!(check.scale, 1.0);
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
