//! One training step's forward and backward: a batch as tensors, the loss of each micro-batch,
//! and the gradients summed over them.
//!
//! The loss of every micro-batch is divided by the target tokens of all of them, so the summed
//! gradient equals that of one big batch. Dropout for micro-batch i of step s draws from a
//! stream derived from (seed, s, i): no generator state to save, and a resumed run draws the
//! same masks as an uninterrupted one.

use std::time::Instant;

use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};
use ember_data::{Batch, Batcher};
use ember_model::{AttentionStats, DropoutRng, ForwardCtx, Model, Telemetry};
use ember_rng::SplitMix64;

use crate::config::TrainConfig;
use crate::loss::{linear_cross_entropy, TokenLoss};
use crate::optim::{GradCheck, Param};

/// A batch as tensors, with targets flattened to one row per token.
pub struct BatchTensors {
    inputs: Inputs,
    /// (N) target ids.
    targets: Tensor,
    /// (N) 1 at real targets, 0 at padding.
    mask: Tensor,
    /// Real target tokens: the loss normaliser.
    pub tokens: usize,
}

enum Inputs {
    Seq2seq {
        src: Tensor,
        src_mask: Tensor,
        tgt_in: Tensor,
    },
    Lm {
        input: Tensor,
    },
}

impl BatchTensors {
    pub fn new(batch: &Batch, device: &Device) -> Result<Self> {
        Ok(match batch {
            Batch::Seq2Seq(b) => {
                let mask: Vec<f32> = b.tgt_mask.iter().map(|&m| m as f32).collect();
                let src_mask: Vec<u32> = b.src_mask.iter().map(|&m| m as u32).collect();
                Self {
                    inputs: Inputs::Seq2seq {
                        src: Tensor::from_slice(&b.src, (b.batch_size, b.src_len), device)?,
                        src_mask: Tensor::from_vec(src_mask, (b.batch_size, b.src_len), device)?,
                        tgt_in: Tensor::from_slice(&b.tgt_in, (b.batch_size, b.tgt_len), device)?,
                    },
                    targets: Tensor::from_slice(&b.tgt_out, b.tgt_out.len(), device)?,
                    mask: Tensor::from_vec(mask, b.tgt_out.len(), device)?,
                    tokens: b.n_tgt_tokens,
                }
            }
            Batch::Lm(b) => Self {
                inputs: Inputs::Lm {
                    input: Tensor::from_slice(&b.input, (b.batch_size, b.block_size), device)?,
                },
                targets: Tensor::from_slice(&b.target, b.target.len(), device)?,
                mask: Tensor::ones(b.target.len(), DType::F32, device)?,
                tokens: b.target.len(),
            },
        })
    }

    /// Summed losses over the batch's real target tokens; `ctx` says train (dropout) or eval,
    /// `grads` whether a backward pass of the objective follows.
    pub fn loss(
        &self,
        model: &Model,
        ctx: ForwardCtx,
        label_smoothing: f64,
        z_loss: f64,
        grads: bool,
    ) -> Result<TokenLoss> {
        let (hidden, output_weight) = self.hidden(model, ctx)?;
        Ok(linear_cross_entropy(
            &hidden,
            output_weight,
            &self.targets,
            &self.mask,
            label_smoothing,
            z_loss,
            grads,
        )?)
    }

    /// Final hidden states (N, D), one row per target position, and the output projection's
    /// weight that turns them into logits.
    fn hidden<'m>(&self, model: &'m Model, ctx: ForwardCtx) -> Result<(Tensor, &'m Tensor)> {
        let (hidden, output_weight) = match (&self.inputs, model) {
            (
                Inputs::Seq2seq {
                    src,
                    src_mask,
                    tgt_in,
                },
                Model::Seq2seq(m),
            ) => {
                let memory = m.encode(src, Some(src_mask), ctx)?;
                (m.decode_hidden(tgt_in, &memory, ctx)?, m.output_weight())
            }
            (Inputs::Lm { input }, Model::Lm(m)) => (m.hidden(input, ctx)?, m.output_weight()),
            _ => bail!("the batch does not fit the model architecture"),
        };
        let d = hidden.dim(2)?;
        Ok((hidden.reshape(((), d))?, output_weight))
    }
}

/// Gradients of one optimizer step, in the order of the optimizer's parameters.
pub struct StepOutput {
    pub grads: Vec<Option<Tensor>>,
    /// Training objective per target token.
    pub loss: f64,
    /// Negative log-likelihood per target token.
    pub nll: f64,
    pub tokens: usize,
    pub attention: Vec<AttentionStats>,
    /// Wall time of the forward passes (loss included) and of the backward passes.
    pub forward_secs: f64,
    pub backward_secs: f64,
}

impl StepOutput {
    /// Why this step's update must not be applied: a non-finite loss, or else the first
    /// parameter whose gradient is not finite (`grads` measured by `clip_grad_norm`).
    pub fn non_finite(&self, grads: &GradCheck) -> Option<String> {
        if !self.loss.is_finite() {
            Some(format!("the loss is {}", self.loss))
        } else {
            grads
                .non_finite
                .as_ref()
                .map(|name| format!("the gradient of {name} is not finite"))
        }
    }
}

/// The `accumulation` micro-batches of the next step, in the batcher's order.
pub fn micro_batches(batcher: &mut dyn Batcher, accumulation: usize) -> Vec<Batch> {
    (0..accumulation).map(|_| batcher.next_batch()).collect()
}

/// Forward and backward over the micro-batches of one step, summing the gradients. Dropout for
/// micro-batch i draws from a stream derived from (seed, step, i).
pub fn forward_backward(
    model: &Model,
    params: &[Param],
    batches: &[Batch],
    cfg: &TrainConfig,
    device: &Device,
    step: u64,
    telemetry: bool,
) -> Result<StepOutput> {
    let tensors = batches
        .iter()
        .map(|b| BatchTensors::new(b, device))
        .collect::<Result<Vec<_>>>()?;
    let total_tokens: usize = tensors.iter().map(|t| t.tokens).sum();
    let mut grads: Vec<Option<Tensor>> = vec![None; params.len()];
    let (mut objective, mut nll) = (0f64, 0f64);
    let collector = Telemetry::new();
    let (mut forward_secs, mut backward_secs) = (0f64, 0f64);
    for (i, bt) in tensors.iter().enumerate() {
        let t0 = Instant::now();
        let seed = SplitMix64::for_stream(cfg.seed, &format!("dropout/{step}/{i}")).next_u64();
        let rng = DropoutRng::new(seed);
        let mut ctx = ForwardCtx::train(&rng);
        if telemetry && i == 0 {
            ctx = ctx.with_telemetry(&collector);
        }
        let loss = bt.loss(model, ctx, cfg.label_smoothing, cfg.z_loss, true)?;
        objective += loss.objective.to_scalar::<f32>()? as f64;
        nll += loss.nll.to_scalar::<f32>()? as f64;
        forward_secs += t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let store = (loss.objective / total_tokens.max(1) as f64)?.backward()?;
        for (slot, p) in grads.iter_mut().zip(params) {
            if let Some(g) = store.get(p.var.as_tensor()) {
                *slot = Some(match slot.take() {
                    Some(acc) => (acc + g)?,
                    None => g.clone(),
                });
            }
        }
        device.synchronize()?;
        backward_secs += t1.elapsed().as_secs_f64();
    }
    let n = total_tokens.max(1) as f64;
    Ok(StepOutput {
        grads,
        loss: objective / n,
        nll: nll / n,
        tokens: total_tokens,
        attention: collector.take(),
        forward_secs,
        backward_secs,
    })
}
