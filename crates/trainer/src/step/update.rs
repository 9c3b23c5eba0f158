//! How a step's gradients become the weights' update, and what the host learns of it.
//!
//! On the CPU every step is judged on the host as it ends: the global gradient norm and the clip
//! factor ([`clip_grad_norm`]), the non-finite check, then AdamW. On a CUDA device with the
//! optimizer kernel switched on (`ember_kernels::cuda`), the same rules run on the device
//! ([`ember_kernels::ledger`]) and the host learns the outcome only when it *settles*: at logged,
//! evaluated and checkpointed steps, before a stop and at the end. So no step waits for the GPU,
//! and a logged step reads one small buffer back. Settling hands the run state what the device
//! recorded meanwhile: the window's loss sums, skipped steps (with the first one's reason), a
//! loss spike, or the step that stops the run under `train.on_nonfinite: stop` (from which on
//! no update was applied, so the weights are those before it).

use anyhow::{bail, Result};
use candle_core::Device;
use ember_kernels::cuda::{enabled, Kernel};
use ember_kernels::ledger::{self, StepLedger, Verdict};

use crate::config::{NonFinitePolicy, TrainConfig};
use crate::optim::{clip_grad_norm, AdamW};
use crate::step::{non_finite, LossSums, StepOutput};

/// Where a run's steps are judged.
pub enum Updater {
    Host,
    Device(StepLedger),
}

/// What the host knows of a step as it ends.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Judged on the host: the losses per token, the gradient norm, and why the update was
    /// skipped if it was (`train.on_nonfinite: skip`).
    Judged {
        loss: f64,
        nll: f64,
        grad_norm: f64,
        skipped: Option<String>,
    },
    /// `train.on_nonfinite: stop` on a non-finite step: why.
    Stop(String),
    /// Judged on the device: known at the next [`Updater::settle`].
    Pending,
}

/// What the device judged since the last settle.
#[derive(Debug, Clone, PartialEq)]
pub struct Settled {
    /// Sums over the window's finite steps: objective and NLL (over tokens), target tokens,
    /// and the finite gradient norms.
    pub loss_sum: f64,
    pub nll_sum: f64,
    pub tokens: u64,
    pub grad_norm_sum: f64,
    /// Steps skipped in the window, and in the whole run.
    pub skipped: u64,
    pub skipped_total: u64,
    /// The window's first non-finite step and why.
    pub first_bad: Option<(u64, String)>,
    /// A training loss spiked (NaN, or above the spike threshold) in the window.
    pub spiked: bool,
    /// Under `train.on_nonfinite: stop`: the step that stops the run, and why.
    pub stopped: Option<(u64, String)>,
}

impl Updater {
    /// The device's judge for a CUDA run with the optimizer kernel on (and one process: a job
    /// of several sums its losses on the host anyway), else the host's. `skipped`: the run's
    /// skipped steps so far (a resumed run's).
    pub fn new(device: &Device, opt: &AdamW, skipped: u64, one_process: bool) -> Result<Self> {
        if device.is_cuda() && enabled(Kernel::Optimizer) && one_process {
            return Ok(Updater::Device(StepLedger::new(
                device,
                opt.params().len(),
                opt.step,
                skipped,
            )?));
        }
        Ok(Updater::Host)
    }

    /// Judges the step `out` (number `step`, learning rate `lr`) and applies its update if it
    /// passes. `spike_loss`: a training loss per token above it (or NaN) is a spike.
    pub fn update(
        &mut self,
        opt: &mut AdamW,
        out: &StepOutput,
        lr: f64,
        step: u64,
        spike_loss: Option<f64>,
        cfg: &TrainConfig,
    ) -> Result<Outcome> {
        match self {
            Updater::Host => {
                let grads = clip_grad_norm(opt.params(), &out.grads, cfg.clip_grad_norm)?;
                let (loss, nll) = out.per_token()?;
                let skipped = match (non_finite(loss, &grads), cfg.on_nonfinite) {
                    (None, _) => {
                        opt.step(&out.grads, lr, grads.scale)?;
                        None
                    }
                    (Some(what), NonFinitePolicy::Skip) => Some(what),
                    (Some(what), NonFinitePolicy::Stop) => return Ok(Outcome::Stop(what)),
                };
                Ok(Outcome::Judged {
                    loss,
                    nll,
                    grad_norm: grads.norm,
                    skipped,
                })
            }
            Updater::Device(ledger) => {
                let LossSums::Device { objective, nll } = &out.losses else {
                    bail!("step {step}: the losses of a CUDA step are not on the device");
                };
                ledger.begin_step()?;
                for (slot, g) in out.grads.iter().enumerate() {
                    if let Some(g) = g {
                        ledger.sum_of_squares(slot, g)?;
                    }
                }
                let verdict = Verdict {
                    max_norm: cfg.clip_grad_norm,
                    spike_loss,
                    stop: cfg.on_nonfinite == NonFinitePolicy::Stop,
                    beta1: opt.beta1,
                    beta2: opt.beta2,
                };
                ledger.finish_step(objective, nll, out.tokens, &verdict, step)?;
                opt.step_on_device(&out.grads, lr, ledger)?;
                Ok(Outcome::Pending)
            }
        }
    }

    /// What the device judged since the last settle (`None` for the host's judge, which has
    /// nothing pending). Brings the optimizer's update count up to date (checkpoints save it).
    pub fn settle(&mut self, opt: &mut AdamW) -> Result<Option<Settled>> {
        let Updater::Device(ledger) = self else {
            return Ok(None);
        };
        let l = ledger.take_window()?;
        opt.step = l[ledger::UPDATES] as u64;
        let what = |index: f64, loss: f64| -> String {
            if index < 0.0 {
                format!("the loss is {loss}")
            } else {
                let name = opt.params().get(index as usize).map_or("?", |p| p.name.as_str());
                format!("the gradient of {name} is not finite")
            }
        };
        let first_bad = (l[ledger::W_FIRST_BAD] > 0.0).then(|| {
            (
                l[ledger::W_FIRST_BAD] as u64,
                what(l[ledger::W_FIRST_WHAT], l[ledger::W_FIRST_LOSS]),
            )
        });
        let stopped = (l[ledger::STOPPED] > 0.0).then(|| {
            let step = l[ledger::STOPPED] as u64;
            let why = match &first_bad {
                Some((s, why)) if *s == step => why.clone(),
                _ => "a value is not finite".to_string(),
            };
            (step, why)
        });
        Ok(Some(Settled {
            loss_sum: l[ledger::W_LOSS],
            nll_sum: l[ledger::W_NLL],
            tokens: l[ledger::W_TOKENS] as u64,
            grad_norm_sum: l[ledger::W_GRAD_NORM],
            skipped: l[ledger::W_SKIPPED] as u64,
            skipped_total: l[ledger::SKIPPED] as u64,
            first_bad,
            spiked: l[ledger::W_SPIKED] != 0.0,
            stopped,
        }))
    }
}
