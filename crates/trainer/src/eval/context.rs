//! A language model evaluated at a context length of the user's choosing, including past the
//! length it was trained at (`ember eval RUN --context N`).
//!
//! The validation split is cut into consecutive, non-overlapping windows of N + 1 tokens; each
//! window's first N tokens predict its last N, so the token at window position i is predicted
//! from i + 1 tokens of context. Besides the mean loss this measures, per position, the loss and
//! how focused self-attention is (the mean entropy of its distributions over layers, heads and
//! windows), and groups both into buckets that double from the training length m: positions
//! 1..m, m+1..2m, 2m+1..4m, …. Past `model.max_seq_len` the rotary tables are extended (RoPE
//! is defined at every position); log-n scaling can be switched on or off for the evaluation
//! alone, because at the training length it is a no-op.

use anyhow::{bail, Context, Result};
use candle_core::{Tensor, D};
use ember_data::{LmEvalBatches, Splits};
use ember_model::{ForwardCtx, ModelConfig, Positions, Telemetry};
use serde::{Deserialize, Serialize};

use crate::OpenRun;

/// Most tokens one forward pass takes (windows per batch = this ÷ N, at least one).
const BATCH_TOKENS: usize = 8192;

/// What to evaluate.
#[derive(Debug, Clone, Copy)]
pub struct ContextOptions {
    /// N: tokens of context of the last prediction of every window.
    pub context: usize,
    /// Log-n scaling on or off for this evaluation (`None`: as the run was trained).
    pub logn: Option<bool>,
    /// At most this many windows (`None`: every whole window of the split).
    pub max_windows: Option<usize>,
}

/// Loss and attention entropy over a range of positions (1-based, inclusive).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PositionBucket {
    pub first: usize,
    pub last: usize,
    /// Mean NLL (nats) of the tokens predicted at these positions.
    pub loss: f64,
    /// Mean entropy (nats) of self-attention at these query positions.
    pub entropy: f64,
    pub tokens: u64,
}

/// The result of [`evaluate_context`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContextEval {
    pub context: usize,
    /// The length the run was trained at (`train.block_size`, else `model.max_seq_len`).
    pub train_length: usize,
    /// Whether positions past `train_length` were evaluated.
    pub beyond_training: bool,
    pub logn_attention: bool,
    /// m of log-n scaling, when it is on.
    pub logn_length: Option<usize>,
    pub windows: usize,
    pub tokens: u64,
    pub loss: f64,
    pub ppl: f64,
    pub buckets: Vec<PositionBucket>,
    /// Mean NLL at each window position 1..=N.
    pub loss_by_position: Vec<f64>,
    /// Mean self-attention entropy at each query position 1..=N.
    pub entropy_by_position: Vec<f64>,
}

/// Evaluates `run` (a language model) at `opts.context` tokens of context; rebuilds its model
/// for that length (and log-n setting) first.
pub fn evaluate_context(run: &mut OpenRun, opts: ContextOptions) -> Result<ContextEval> {
    let n = opts.context;
    if n == 0 {
        bail!("--context must be at least 1");
    }
    if let Splits::Translation(_) = &run.data.splits {
        bail!(
            "--context evaluates language models; this is a translation run (its sentences are \
             evaluated whole: use --split test for BLEU, or `ember bleu --source` for BLEU by source length)"
        );
    }
    let train_length = run.cfg.text_training_length();
    if run.cfg.model.positions == Positions::Learned && n > run.cfg.model.max_seq_len {
        bail!(
            "--context {n} is beyond model.max_seq_len = {}: this model's learned position table \
             has no rows past it (rotary or no positions extend to any length)",
            run.cfg.model.max_seq_len
        );
    }
    let model_cfg = context_model(&run.cfg.model, opts, train_length);
    // What the data allows first (the same answer on every machine), then what fits.
    let Splits::Text(text) = &run.data.splits else {
        bail!("--context evaluates language models");
    };
    let available = text.valid.len().saturating_sub(1) / n;
    let windows = opts.max_windows.map_or(available, |m| m.min(available));
    if windows == 0 {
        bail!(
            "the validation split has {} tokens, fewer than one window of --context {n} + 1; use a \
             shorter context",
            text.valid.len()
        );
    }
    // Attention at N positions holds N² scores per head: refuse what cannot fit before the
    // model is rebuilt for N positions or a window is cut.
    let per_batch = (BATCH_TOKENS / n).max(1);
    let in_batch = windows.clamp(1, per_batch);
    crate::limits::check_eval_context(&model_cfg, in_batch, n)?;
    let (logn_attention, logn_length) = (model_cfg.logn_attention, model_cfg.logn_length);
    run.rebuild(model_cfg)
        .context("rebuilding the model for the evaluation length")?;
    let (Some(lm), Splits::Text(text)) = (run.model.as_lm(), &run.data.splits) else {
        bail!("--context evaluates language models");
    };
    // Exactly `windows` windows of the stream, `per_batch` at a time.
    let stream = &text.valid[..windows * n + 1];
    let (nll, entropy) = sums_by_position(lm, stream, n, per_batch, &run.device)?;
    let loss_by_position: Vec<f64> = nll.iter().map(|s| s / windows as f64).collect();
    let entropy_by_position: Vec<f64> = entropy.iter().map(|s| s / windows as f64).collect();
    let loss = loss_by_position.iter().sum::<f64>() / n as f64;
    let buckets = buckets(&loss_by_position, &entropy_by_position, train_length, windows);
    Ok(ContextEval {
        context: n,
        train_length,
        beyond_training: n > train_length,
        logn_attention,
        logn_length,
        windows,
        tokens: (windows * n) as u64,
        loss,
        ppl: loss.exp(),
        buckets,
        loss_by_position,
        entropy_by_position,
    })
}

/// The model config evaluated at `opts.context` positions: log-n scaling as `opts` sets it
/// (m stays the training length), rotary tables extended to the context.
fn context_model(trained: &ModelConfig, opts: ContextOptions, train_length: usize) -> ModelConfig {
    let mut model_cfg = trained.clone();
    if let Some(on) = opts.logn {
        model_cfg.logn_attention = on;
    }
    // m stays the training length however far the tables are extended.
    model_cfg.logn_length = match (model_cfg.logn_attention, model_cfg.logn_length) {
        (false, _) => None,
        (true, Some(m)) => Some(m),
        (true, None) => Some(train_length.max(2)),
    };
    model_cfg.max_seq_len = model_cfg.max_seq_len.max(opts.context);
    model_cfg
}

/// The NLL and the self-attention entropy at each of the `n` window positions, summed over the
/// windows of `stream` (cut into windows of n + 1 tokens, `per_batch` windows a pass).
fn sums_by_position(
    lm: &ember_model::LanguageModel,
    stream: &[u32],
    n: usize,
    per_batch: usize,
    device: &candle_core::Device,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let mut nll = vec![0f64; n];
    let mut entropy = vec![0f64; n];
    for batch in LmEvalBatches::new(stream, per_batch, n, None)? {
        let count = batch.batch_size;
        let inputs = Tensor::from_vec(batch.input, (count, n), device)?;
        let targets = Tensor::from_vec(batch.target, (count, n, 1), device)?;
        let telemetry = Telemetry::new();
        let logits = lm.forward(&inputs, ForwardCtx::eval().with_telemetry(&telemetry))?;
        let log_probs = candle_nn::ops::log_softmax(&logits.to_dtype(candle_core::DType::F32)?, D::Minus1)?;
        // (count, N): the NLL of every predicted token, summed over windows.
        let token_nll = log_probs.gather(&targets, 2)?.squeeze(2)?.neg()?;
        for (sum, x) in nll.iter_mut().zip(token_nll.sum(0)?.to_vec1::<f32>()?) {
            *sum += x as f64;
        }
        let modules = telemetry.take();
        for stats in &modules {
            for (sum, h) in entropy.iter_mut().zip(&stats.entropy_by_position) {
                // Each module's entropy is a mean over this batch's windows and heads.
                *sum += *h as f64 * count as f64 / modules.len() as f64;
            }
        }
    }
    Ok((nll, entropy))
}

/// The per-position means grouped into [`bucket_edges`] from the training length `m`.
fn buckets(
    loss_by_position: &[f64],
    entropy_by_position: &[f64],
    m: usize,
    windows: usize,
) -> Vec<PositionBucket> {
    bucket_edges(loss_by_position.len(), m)
        .into_iter()
        .map(|(first, last)| {
            let range = first - 1..last;
            let len = range.len() as f64;
            PositionBucket {
                first,
                last,
                loss: loss_by_position[range.clone()].iter().sum::<f64>() / len,
                entropy: entropy_by_position[range.clone()].iter().sum::<f64>() / len,
                tokens: (range.len() * windows) as u64,
            }
        })
        .collect()
}

/// Buckets of 1-based positions up to `n`: 1..m, then doubling (m+1..2m, 2m+1..4m, …), the
/// last one cut at n.
pub fn bucket_edges(n: usize, m: usize) -> Vec<(usize, usize)> {
    let m = m.max(1);
    let mut edges = vec![(1, m.min(n))];
    let mut last = m;
    while last < n {
        let next = (last * 2).min(n);
        edges.push((last + 1, next));
        last = next;
    }
    edges
}

#[cfg(test)]
mod tests {
    use super::bucket_edges;

    #[test]
    fn buckets_double_from_the_training_length_and_stop_at_the_context() {
        assert_eq!(bucket_edges(64, 64), vec![(1, 64)]);
        assert_eq!(bucket_edges(32, 64), vec![(1, 32)]);
        assert_eq!(
            bucket_edges(1024, 64),
            vec![(1, 64), (65, 128), (129, 256), (257, 512), (513, 1024)]
        );
        assert_eq!(bucket_edges(100, 64), vec![(1, 64), (65, 100)]);
    }
}
