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
use serde::Serialize;

use crate::config::RunConfig;
use crate::data_parallel::DataParallel;
use crate::step::BatchTensors;
use crate::translate::score_split;

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

/// Mean NLL per target token over a held-out split, without dropout.
pub fn evaluate(
    model: &Model,
    data: &Dataset,
    cfg: &RunConfig,
    split: Split,
    device: &Device,
) -> Result<EvalResult> {
    let (nll, tokens) = evaluate_share(model, data, cfg, split, device, 0, 1)?;
    Ok(EvalResult::from_sums(nll, tokens))
}

/// Summed NLL and target tokens of share `share` of `shares` of a split's batches (batch k
/// belongs to share k mod `shares`): how the ranks of a job divide an evaluation.
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
    let mut k = 0usize;
    let mut run = |batch: Batch| -> Result<()> {
        k += 1;
        if (k - 1) % shares != share {
            return Ok(());
        }
        let bt = BatchTensors::new(&batch, device)?;
        nll += bt
            .loss(model, ForwardCtx::eval(), 0.0, 0.0, false)?
            .nll
            .to_scalar::<f32>()? as f64;
        tokens += bt.tokens as u64;
        Ok(())
    };
    match &data.splits {
        Splits::Translation(s) => {
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
        Splits::Text(s) => {
            if split == Split::Test {
                bail!("text corpora have train and valid splits only");
            }
            let (b, t) = (
                cfg.train.batch_size.unwrap_or(1),
                cfg.train.block_size.unwrap_or(1),
            );
            for batch in LmEvalBatches::new(&s.valid, b, t, cfg.eval.max_batches)? {
                run(Batch::Lm(batch))?;
            }
        }
    }
    Ok((nll, tokens))
}

/// The decoder settings for evaluation: `eval.beam`, capped by the model's positions.
pub fn eval_beam(cfg: &RunConfig, beam_size: usize) -> BeamConfig {
    BeamConfig {
        beam_size,
        n_best: 1,
        max_seq_len: Some(cfg.model.max_seq_len),
        ..BeamConfig::default()
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
/// the shares of an emulated one) and summed.
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

/// Evaluates the validation split as the training loop does every `eval.every` steps. The loss
/// is divided between the ranks of a job; BLEU is decoded by rank 0 alone (the others go on to
/// the next step and wait for it there).
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
    let bleu = if result.loss.is_finite() && dp.is_leader() {
        validation_bleu(model, data, cfg, device)?
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

/// Validation BLEU for translation runs with `eval.bleu` (None otherwise).
fn validation_bleu(model: &Model, data: &Dataset, cfg: &RunConfig, device: &Device) -> Result<Option<f64>> {
    let (Model::Seq2seq(m), Splits::Translation(s)) = (model, &data.splits) else {
        return Ok(None);
    };
    if !cfg.eval.bleu {
        return Ok(None);
    }
    let beam = eval_beam(cfg, cfg.eval.beam);
    match score_split(
        m,
        &data.tokenizer,
        &s.valid,
        &beam,
        cfg.eval.bleu_sentences,
        device,
    ) {
        Ok(scores) => Ok(Some(scores.bleu.score)),
        // Finite loss but overflowing logits on some decoding path: no BLEU for this evaluation
        // (logged as absent), rather than the end of the run.
        Err(e) if format!("{e:#}").contains("non-finite") => Ok(None),
        Err(e) => Err(e),
    }
}
