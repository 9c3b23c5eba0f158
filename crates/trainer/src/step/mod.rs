//! One training step's forward and backward: a batch as tensors, the loss of each micro-batch,
//! and the gradients summed over them.
//!
//! The loss of every micro-batch is divided by the target tokens of all of them, so the summed
//! gradient equals that of one big batch. Dropout for micro-batch i of step s draws from a
//! stream derived from (seed, s, i): no generator state to save, and a resumed run draws the
//! same masks as an uninterrupted one.
//!
//! The rest of a step lives beside it: the [`loss`], how gradients become the [`update`] (with
//! [`optim`]'s AdamW and clipping), the sum over ranks ([`data_parallel`], `nccl`), and the
//! `training` state that `ember train` and `ember bench` step.

pub mod data_parallel;
pub mod loss;
#[cfg(feature = "nccl")]
pub mod nccl;
pub mod optim;
pub(crate) mod training;
pub mod update;

use std::time::Instant;

use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};
use ember_data::{Batch, Batcher};
use ember_kernels::GradSink;
use ember_model::{AttentionStats, DropoutRng, ForwardCtx, Model, Telemetry};
use ember_rng::SplitMix64;

use crate::config::TrainConfig;
use crate::loss::{linear_cross_entropy, TokenLoss};
use crate::optim::{GradCheck, Param};

/// A batch as tensors, with targets flattened to one row per token.
pub struct BatchTensors {
    inputs: Inputs,
    /// The rows of the model's (N, D) final hidden states that have a real target, when some do
    /// not (padding): only these go through the output layer, where a padded row would cost as
    /// much as a real one and count for nothing. `None`: every row.
    real_rows: Option<Tensor>,
    /// Target ids, one per row that goes through the output layer.
    targets: Tensor,
    /// 1 at real targets, 0 at padding, one per row that goes through the output layer.
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
                let real: Vec<u32> = (0..b.tgt_out.len() as u32)
                    .filter(|&i| b.tgt_mask[i as usize] != 0)
                    .collect();
                let targets: Vec<u32> = real.iter().map(|&i| b.tgt_out[i as usize]).collect();
                let n = real.len();
                let real_rows = if n < b.tgt_out.len() {
                    Some(Tensor::from_vec(real, n, device)?)
                } else {
                    None
                };
                let src_mask: Vec<u32> = b.src_mask.iter().map(|&m| m as u32).collect();
                Self {
                    inputs: Inputs::Seq2seq {
                        src: Tensor::from_slice(&b.src, (b.batch_size, b.src_len), device)?,
                        src_mask: Tensor::from_vec(src_mask, (b.batch_size, b.src_len), device)?,
                        tgt_in: Tensor::from_slice(&b.tgt_in, (b.batch_size, b.tgt_len), device)?,
                    },
                    real_rows,
                    targets: Tensor::from_vec(targets, n, device)?,
                    mask: Tensor::ones(n, DType::F32, device)?,
                    tokens: b.n_tgt_tokens,
                }
            }
            Batch::Lm(b) => Self {
                inputs: Inputs::Lm {
                    input: Tensor::from_slice(&b.input, (b.batch_size, b.block_size), device)?,
                },
                real_rows: None,
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
        let hidden = match &self.real_rows {
            Some(rows) => hidden.index_select(rows, 0)?,
            None => hidden,
        };
        Ok(linear_cross_entropy(
            &hidden,
            output_weight,
            &self.targets,
            &self.mask,
            label_smoothing,
            z_loss,
            grads,
            model.precision(),
            ctx.grad_sink,
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

/// A step's losses summed over its target tokens: read on the host as each micro-batch ends
/// (CPU: reading costs nothing), or kept on the device as f64 scalars (CUDA), where reading one
/// back would make the host wait for the GPU every step.
#[derive(Debug, Clone)]
pub enum LossSums {
    Host { objective: f64, nll: f64 },
    Device { objective: Tensor, nll: Tensor },
}

impl LossSums {
    /// Zero sums for a step on `device`.
    pub fn zero(device: &Device) -> Result<Self> {
        Ok(if device.is_cuda() {
            let zero = Tensor::zeros((), DType::F64, device)?;
            LossSums::Device {
                objective: zero.clone(),
                nll: zero,
            }
        } else {
            LossSums::Host {
                objective: 0.0,
                nll: 0.0,
            }
        })
    }

    /// Adds one micro-batch's (or share's) losses.
    fn add(&mut self, objective: &Tensor, nll: &Tensor) -> Result<()> {
        match self {
            LossSums::Host { objective: o, nll: n } => {
                *o += objective.to_scalar::<f32>()? as f64;
                *n += nll.to_scalar::<f32>()? as f64;
            }
            LossSums::Device { objective: o, nll: n } => {
                *o = (&*o + objective.detach().to_dtype(DType::F64)?)?;
                *n = (&*n + nll.detach().to_dtype(DType::F64)?)?;
            }
        }
        Ok(())
    }

    /// Adds another step part's sums (shares, in order).
    fn add_sums(&mut self, other: &LossSums) -> Result<()> {
        match other {
            LossSums::Host { objective, nll } => match self {
                LossSums::Host { objective: o, nll: n } => {
                    *o += objective;
                    *n += nll;
                }
                LossSums::Device { .. } => bail!("cannot add host loss sums to device ones"),
            },
            LossSums::Device { objective, nll } => self.add(objective, nll)?,
        }
        Ok(())
    }

    /// (objective, NLL) on the host: a read back from the device for [`LossSums::Device`].
    pub fn to_host(&self) -> Result<(f64, f64)> {
        Ok(match self {
            LossSums::Host { objective, nll } => (*objective, *nll),
            LossSums::Device { objective, nll } => (objective.to_scalar::<f64>()?, nll.to_scalar::<f64>()?),
        })
    }
}

/// Gradients of one optimizer step, in the order of the optimizer's parameters.
pub struct StepOutput {
    pub grads: Vec<Option<Tensor>>,
    /// The losses summed over the step's target tokens.
    pub losses: LossSums,
    pub tokens: usize,
    pub attention: Vec<AttentionStats>,
    /// Wall time of the forward passes (loss included) and of the backward passes, summed over
    /// shares (which may run at once, so the two can add up to more than the step).
    pub forward_secs: f64,
    pub backward_secs: f64,
    /// Wall time of waiting for the slowest rank before the gradients can be summed, and of
    /// summing them (both 0 in a single process).
    pub wait_secs: f64,
    pub comm_secs: f64,
}

impl StepOutput {
    /// (training objective, NLL) per target token, on the host.
    pub fn per_token(&self) -> Result<(f64, f64)> {
        let (objective, nll) = self.losses.to_host()?;
        let n = self.tokens.max(1) as f64;
        Ok((objective / n, nll / n))
    }
}

/// Why a step's update must not be applied: a non-finite `loss`, or else the first parameter
/// whose gradient is not finite (`grads` measured by `clip_grad_norm`).
pub fn non_finite(loss: f64, grads: &GradCheck) -> Option<String> {
    if !loss.is_finite() {
        Some(format!("the loss is {loss}"))
    } else {
        grads
            .non_finite
            .as_ref()
            .map(|name| format!("the gradient of {name} is not finite"))
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
    let total_tokens = batches.iter().map(Batch::target_tokens).sum();
    let indexed: Vec<(usize, &Batch)> = batches.iter().enumerate().collect();
    let sums = gradient_sums(
        model,
        params,
        &indexed,
        total_tokens,
        cfg,
        device,
        step,
        telemetry,
        Share::Whole,
    )?;
    Ok(sums.into_output(total_tokens))
}

/// Which part of each micro-batch a process computes: all of it, or one share of a
/// data-parallel step (whose dropout masks then come from a stream of the share's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Share {
    Whole,
    Of { share: usize, shares: usize },
}

impl Share {
    /// The seed of micro-batch `i`'s dropout masks at `step`.
    fn dropout_seed(self, seed: u64, step: u64, i: usize) -> u64 {
        let stream = match self {
            // The only share of a job of one is the whole micro-batch, with its masks.
            Share::Whole | Share::Of { shares: 1, .. } => format!("dropout/{step}/{i}"),
            Share::Of { share, shares } => format!("dropout/{step}/{i}/share-{share}-of-{shares}"),
        };
        SplitMix64::for_stream(seed, &stream).next_u64()
    }
}

/// Gradients and summed losses of some micro-batches (or shares of them), each loss divided by
/// `total_tokens`: the target tokens of the whole step, so that sums of these over shares and
/// ranks are the step's gradient.
pub struct GradientSums {
    pub grads: Vec<Option<Tensor>>,
    /// Summed training objective and NLL (not yet divided by the tokens).
    pub losses: LossSums,
    pub attention: Vec<AttentionStats>,
    pub forward_secs: f64,
    pub backward_secs: f64,
}

impl GradientSums {
    pub fn empty(params: usize, device: &Device) -> Result<Self> {
        Ok(Self {
            grads: vec![None; params],
            losses: LossSums::zero(device)?,
            attention: vec![],
            forward_secs: 0.0,
            backward_secs: 0.0,
        })
    }

    /// The shares' sums added up in share order: every parameter's gradients in one pass
    /// ([`ember_kernels::sum_in_order`], the bits of adding them in turn), the losses and times
    /// summed, the telemetry the first share's that has any.
    pub fn total(shares: Vec<GradientSums>, params: usize, device: &Device) -> Result<Self> {
        let mut total = Self::empty(params, device)?;
        let mut grads: Vec<Vec<Tensor>> = vec![vec![]; params];
        for share in shares {
            for (slot, g) in grads.iter_mut().zip(share.grads) {
                slot.extend(g);
            }
            total.losses.add_sums(&share.losses)?;
            if total.attention.is_empty() {
                total.attention = share.attention;
            }
            total.forward_secs += share.forward_secs;
            total.backward_secs += share.backward_secs;
        }
        for (slot, parts) in total.grads.iter_mut().zip(grads) {
            if !parts.is_empty() {
                *slot = Some(ember_kernels::sum_in_order(&parts)?);
            }
        }
        Ok(total)
    }

    pub fn into_output(self, total_tokens: usize) -> StepOutput {
        StepOutput {
            grads: self.grads,
            losses: self.losses,
            tokens: total_tokens,
            attention: self.attention,
            forward_secs: self.forward_secs,
            backward_secs: self.backward_secs,
            wait_secs: 0.0,
            comm_secs: 0.0,
        }
    }
}

fn add_grad(acc: Option<Tensor>, g: Option<Tensor>) -> Result<Option<Tensor>> {
    Ok(match (acc, g) {
        (Some(a), Some(g)) => Some((a + g)?),
        (a, None) => a,
        (None, g) => g,
    })
}

/// Runs `f` (a micro-batch's forward and backward) under candle's upload cache on a CUDA device
/// (unless `EMBER_CUDA_PARAM_CACHE=0`): candle's ops on non-contiguous tensors then upload each
/// distinct dims-and-strides vector once per process instead of once per op. Measured on an H100
/// (docs/performance.md): host-to-device copies per multi30k-tiny step 75.5 → 8.5 and per
/// shakespeare-char step 30 → 2, what remains being the batch itself (uploaded before, so it never
/// enters the cache); 1.05–1.09× faster per step (median of 5 alternating pairs); trajectories
/// and kill -9 resume unchanged (tests/gpu_training.rs passes with it on and off). The cache is
/// keyed by content and hands out copies, so nothing cached is ever written through; it costs a
/// few tens of MiB of GPU memory for the distinct shapes a run meets.
fn with_param_cache<R>(device: &Device, f: impl FnOnce() -> R) -> R {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = device {
        if std::env::var("EMBER_CUDA_PARAM_CACHE").as_deref() != Ok("0") {
            let _cache = d.enable_cuda_graph_htod_cache();
            return f();
        }
    }
    let _ = device;
    f()
}

/// Whether training passes run sub-blocks as one op each, their parameter gradients
/// merged from a [`GradSink`] (unless `EMBER_FUSED_BLOCKS=0`, which A/B benchmarks use: both
/// ways give the same bits, `crates/model/tests/fused_blocks.rs`).
pub(crate) fn fused_blocks() -> bool {
    std::env::var("EMBER_FUSED_BLOCKS").as_deref() != Ok("0")
}

/// Forward and backward over `batches` (each with its micro-batch index, for its dropout
/// stream), summing the gradients in order.
#[allow(clippy::too_many_arguments)]
pub fn gradient_sums(
    model: &Model,
    params: &[Param],
    batches: &[(usize, &Batch)],
    total_tokens: usize,
    cfg: &TrainConfig,
    device: &Device,
    step: u64,
    telemetry: bool,
    share: Share,
) -> Result<GradientSums> {
    let tensors = batches
        .iter()
        .map(|(i, b)| Ok((*i, BatchTensors::new(b, device)?)))
        .collect::<Result<Vec<_>>>()?;
    let mut sums = GradientSums::empty(params.len(), device)?;
    let collector = Telemetry::new();
    for (n, (i, bt)) in tensors.iter().enumerate() {
        let rng = DropoutRng::new(share.dropout_seed(cfg.seed, step, *i));
        let sink = GradSink::new();
        let mut ctx = ForwardCtx::train(&rng);
        if fused_blocks() {
            ctx = ctx.with_grad_sink(&sink).with_activations(cfg.activations);
        }
        if telemetry && n == 0 {
            ctx = ctx.with_telemetry(&collector);
        }
        with_param_cache(device, || -> Result<()> {
            let t0 = Instant::now();
            let loss = bt.loss(model, ctx, cfg.label_smoothing, cfg.z_loss, true)?;
            sums.losses.add(&loss.objective, &loss.nll)?;
            sums.forward_secs += t0.elapsed().as_secs_f64();
            let t1 = Instant::now();
            let mut store = (loss.objective / total_tokens.max(1) as f64)?.backward()?;
            sink.merge_into(&mut store)?;
            for (slot, p) in sums.grads.iter_mut().zip(params) {
                *slot = add_grad(slot.take(), store.get(p.var.as_tensor()).cloned())?;
            }
            // On a GPU the times are the host's (the work is queued, not done): waiting for the
            // device here would idle it every micro-batch; `ember bench` synchronises per step.
            sums.backward_secs += t1.elapsed().as_secs_f64();
            Ok(())
        })?;
    }
    sums.attention = collector.take();
    Ok(sums)
}
