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

/// Mean NLL per target token over a held-out split, without dropout.
pub fn evaluate(
    model: &Model,
    data: &Dataset,
    cfg: &RunConfig,
    split: Split,
    device: &Device,
) -> Result<EvalResult> {
    let mut nll = 0f64;
    let mut tokens = 0u64;
    let mut run = |batch: Batch| -> Result<()> {
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
    let loss = nll / tokens.max(1) as f64;
    Ok(EvalResult {
        loss,
        ppl: loss.exp(),
        tokens,
    })
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

/// Evaluates the validation split as the training loop does every `eval.every` steps.
pub fn validate(model: &Model, data: &Dataset, cfg: &RunConfig, device: &Device) -> Result<Validation> {
    let t0 = Instant::now();
    let result = evaluate(model, data, cfg, Split::Valid, device)?;
    // A model whose loss is not finite has diverged (the training loop stops it as such);
    // decoding its non-finite outputs would only fail.
    let bleu = if result.loss.is_finite() {
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
