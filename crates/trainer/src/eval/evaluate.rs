//! Evaluation on held-out data: loss and perplexity of a split, and, for translation runs,
//! BLEU of the decoded validation split during training.
//!
//! Decoding and scoring themselves live in [`crate::translate`], which `ember translate` and
//! `ember eval` use as well; this module decides what to evaluate and with which settings.

use std::fmt;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use candle_core::Device;
use ember_data::{Batch, Dataset, EvalBatches, LmEvalBatches, Splits};
use ember_model::{BeamConfig, ForwardCtx, Model};
use ember_sacrebleu::{corpus_bleu, BleuConfig};
use serde::{Deserialize, Serialize};

use crate::config::{Batched, Batching, RunConfig};
use crate::data_parallel::{sum_shares, DataParallel};
use crate::step::BatchTensors;
use crate::translate::translate_ids;

/// Validation loss of a split.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct EvalResult {
    /// Mean negative log-likelihood per target token (nats).
    pub loss: f64,
    pub ppl: f64,
    pub tokens: u64,
}

/// Which held-out split to evaluate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    Valid,
    Test,
}

impl std::str::FromStr for Split {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "valid" | "val" | "validation" => Ok(Split::Valid),
            "test" => Ok(Split::Test),
            other => bail!("unknown split {other:?}; use valid or test"),
        }
    }
}

impl EvalResult {
    /// From summed NLL and target tokens.
    pub fn from_sums(nll: f64, tokens: u64) -> Self {
        let loss = nll / tokens.max(1) as f64;
        EvalResult {
            loss,
            ppl: loss.exp(),
            tokens,
        }
    }
}

/// Mean NLL per target token over a held-out split, without dropout. Every batch is split into
/// the run's shares ([`RunConfig::shares`]) and summed in share order, as training evaluates
/// in one process, so the loss is the one its validation logged, to the last bit.
pub fn evaluate(
    model: &Model,
    data: &Dataset,
    cfg: &RunConfig,
    split: Split,
    device: &Device,
) -> Result<EvalResult> {
    let shares = cfg.shares();
    let (nll, tokens) = sum_shares(0..shares, |share| {
        evaluate_share(model, data, cfg, split, device, share, shares)
    })?;
    Ok(EvalResult::from_sums(nll, tokens))
}

/// Summed NLL and target tokens of share `share` of `shares` of every batch of a split
/// ([`Batch::share`]): how the ranks of a job divide an evaluation. (Whole batches dealt out in
/// turn would leave a rank idle: a validation split is often only a batch or two.)
pub fn evaluate_share(
    model: &Model,
    data: &Dataset,
    cfg: &RunConfig,
    split: Split,
    device: &Device,
    share: usize,
    shares: usize,
) -> Result<(f64, u64)> {
    let mut nll = 0f64;
    let mut tokens = 0u64;
    let mut run = |batch: Batch| -> Result<()> {
        let Some(batch) = batch.share(share, shares) else {
            return Ok(());
        };
        let bt = BatchTensors::new(&batch, device)?;
        nll += bt
            .loss(model, ForwardCtx::eval(), 0.0, 0.0, false)?
            .nll
            .to_scalar::<f32>()? as f64;
        tokens += bt.tokens as u64;
        Ok(())
    };
    match Batching::of_data(cfg, &data.splits)? {
        Batched::Translation { splits: s, .. } => {
            let split = match split {
                Split::Valid => &s.valid,
                Split::Test => s
                    .test
                    .as_ref()
                    .context("this corpus has no test split (data.corpus.test)")?,
            };
            for b in EvalBatches::new(&split.examples, cfg.eval.max_tokens, data.tokenizer.specials())? {
                run(Batch::Seq2Seq(b))?;
            }
        }
        Batched::Text {
            splits: s,
            batch_size,
            block_size,
        } => {
            if split == Split::Test {
                bail!("text corpora have train and valid splits only");
            }
            for batch in LmEvalBatches::new(&s.valid, batch_size, block_size, cfg.eval.max_batches)? {
                run(Batch::Lm(batch))?;
            }
        }
    }
    Ok((nll, tokens))
}

/// The decoder settings for evaluation: `eval.beam`, capped by the model's positions.
pub fn eval_beam(cfg: &RunConfig, beam_size: usize) -> BeamConfig {
    let default = BeamConfig::default();
    BeamConfig {
        beam_size,
        n_best: 1,
        max_seq_len: Some(cfg.model.max_seq_len),
        length_penalty: cfg.eval.length_penalty.unwrap_or(default.length_penalty),
        ..default
    }
}

/// A validation during training: the loss, BLEU where the config asks for it, and how long
/// both took.
#[derive(Debug, Clone, Copy)]
pub struct Validation {
    pub result: EvalResult,
    pub bleu: Option<f64>,
    pub secs: f64,
}

/// Validation loss as the training loop measures it: divided between the ranks of a job (or
/// the shares of `train.shares`) and summed.
pub fn validation_loss(
    model: &Model,
    data: &Dataset,
    cfg: &RunConfig,
    device: &Device,
    dp: &DataParallel,
    step: u64,
) -> Result<EvalResult> {
    let (nll, tokens) = dp.evaluate(
        &format!("the validation loss after step {step}"),
        |share, shares| evaluate_share(model, data, cfg, Split::Valid, device, share, shares),
    )?;
    Ok(EvalResult::from_sums(nll, tokens))
}

/// Evaluates the validation split as the training loop does every `eval.every` steps; the ranks
/// of a job divide the loss and the decoding for BLEU between them.
pub fn validate(
    model: &Model,
    data: &Dataset,
    cfg: &RunConfig,
    device: &Device,
    dp: &DataParallel,
    step: u64,
) -> Result<Validation> {
    let t0 = Instant::now();
    let result = validation_loss(model, data, cfg, device, dp, step)?;
    // A model whose loss is not finite has diverged (the training loop stops it as such);
    // decoding its non-finite outputs would only fail.
    let bleu = if result.loss.is_finite() {
        validation_bleu(model, data, cfg, device, dp, step)?
    } else {
        None
    };
    Ok(Validation {
        result,
        bleu,
        secs: t0.elapsed().as_secs_f64(),
    })
}

/// The progress line's account: `val loss 3.6342 | ppl 37.87 | BLEU 0.88 (1.2s)`.
impl fmt::Display for Validation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "val loss {:.4} | ppl {:.2}{} ({:.1}s)",
            self.result.loss,
            self.result.ppl,
            self.bleu.map_or(String::new(), |b| format!(" | BLEU {b:.2}")),
            self.secs
        )
    }
}

/// Validation BLEU for translation runs with `eval.bleu` (None otherwise). The ranks of a job
/// each decode a contiguous share of the sentences and gather the hypotheses, and every rank
/// scores them (so all keep the same best checkpoint).
fn validation_bleu(
    model: &Model,
    data: &Dataset,
    cfg: &RunConfig,
    device: &Device,
    dp: &DataParallel,
    step: u64,
) -> Result<Option<f64>> {
    let (Model::Seq2seq(m), Splits::Translation(s)) = (model, &data.splits) else {
        return Ok(None);
    };
    if !cfg.eval.bleu {
        return Ok(None);
    }
    let beam = eval_beam(cfg, cfg.eval.beam);
    let n = cfg
        .eval
        .bleu_sentences
        .unwrap_or(usize::MAX)
        .min(s.valid.examples.len());
    let shares = dp.gather_shares(
        &format!("the validation translations after step {step}"),
        |share, shares| {
            let sources: Vec<Vec<u32>> = s.valid.examples[share * n / shares..(share + 1) * n / shares]
                .iter()
                .map(|e| e.source.clone())
                .collect();
            match translate_ids(m, &data.tokenizer, &sources, &beam, device) {
                Ok(t) => Decoded::Hypotheses(t.into_iter().map(|t| t.text).collect()),
                // Finite loss but overflowing logits on some decoding path: no BLEU for this
                // evaluation (logged as absent), rather than the end of the run.
                Err(e) if format!("{e:#}").contains("non-finite") => Decoded::NonFinite,
                Err(e) => Decoded::Failed(format!("{e:#}")),
            }
        },
    )?;
    let mut hyps = Vec::with_capacity(n);
    for (share, decoded) in shares.into_iter().enumerate() {
        match decoded {
            Decoded::Hypotheses(h) => hyps.extend(h),
            Decoded::NonFinite => return Ok(None),
            Decoded::Failed(e) if dp.is_sharded() => {
                bail!("decoding share {share} of the validation split: {e}")
            }
            Decoded::Failed(e) => bail!("{e}"),
        }
    }
    let refs = [s.valid.references[..n].to_vec()];
    Ok(Some(corpus_bleu(&hyps, &refs, &BleuConfig::default())?.score))
}

/// What decoding one share of the validation sentences gave.
#[derive(Serialize, Deserialize)]
enum Decoded {
    Hypotheses(Vec<String>),
    NonFinite,
    Failed(String),
}
