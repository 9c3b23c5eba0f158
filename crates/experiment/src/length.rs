//! The length-generalisation study's report (`ember length-report DIR`): how the loss of
//! language models trained at one length behaves at longer contexts, per QK-norm variant, with
//! log-n attention scaling off and on.
//!
//! `scripts/length-study.sh` fills `DIR`: `DIR/sweep` is an `ember ablate` sweep (variants ×
//! seeds at one learning rate), and `DIR/evals/<run>/context-<N>-logn-<on|off>.json` holds
//! `ember eval <run> --context N --logn on|off --json` of every run. Log-n scaling is a no-op at
//! the training length, so one trained model serves both arms. This module pairs the
//! evaluations by seed and writes `report.md`, `report.json` and `plots/`:
//! - validation loss at every context, mean and 95% t interval over seeds, per arm;
//! - the paired effect of log-n (on − off) and of each QK-norm variant (− none) per context;
//! - the reach: loss at each longer context minus loss at the training length, per seed;
//! - attention entropy by position bucket at the longest context, against what entropy
//!   invariance predicts (flat past the training length with log-n);
//! - plots of loss vs context, and of loss and attention entropy by position.
//!
//! One submodule per step, as in [`crate::report`]: `evals` reads the evaluations, `losses`
//! and `entropy` compute the statistics, `bleu` reads the translation runs' BLEU by source
//! length, `markdown` writes report.md and `plots` draws the figures.

mod bleu;
mod entropy;
mod evals;
mod losses;
mod markdown;
mod plots;

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::layout::{write_json, REPORT_JSON, REPORT_MD, VARIANT_ORDER};
use crate::report::stats::PairedDiff;
use evals::{read_evals, Eval, EvalIndex};

/// Where the evaluations live inside the study directory.
pub const EVALS: &str = "evals";
/// Where the sweep of trained runs lives inside the study directory.
pub const SWEEP: &str = "sweep";
/// Where `ember bleu --source --json` of translation runs lives inside the study directory
/// (`<variant>-lr<LR>-seed<S>.json`, one per run).
pub const MULTI30K: &str = "multi30k";

/// One arm's validation loss at one context: mean over seeds and the 95% t interval half-width.
#[derive(Debug, Clone, Serialize)]
pub struct ArmLoss {
    pub variant: String,
    pub logn: bool,
    pub context: usize,
    pub mean: f64,
    /// Half-width of the 95% t interval (`None` with one seed).
    pub ci95: Option<f64>,
    pub seeds: usize,
}

/// A paired difference at one context.
#[derive(Debug, Clone, Serialize)]
pub struct Effect {
    /// What is compared, e.g. "rmsnorm: log-n on − off" or "rmsnorm − none (log-n on)".
    pub what: String,
    pub context: usize,
    pub diff: PairedDiff,
}

/// Attention entropy of one arm in one position bucket at the longest context.
#[derive(Debug, Clone, Serialize)]
pub struct BucketEntropy {
    pub variant: String,
    pub logn: bool,
    pub first: usize,
    pub last: usize,
    pub entropy: f64,
    pub loss: f64,
}

/// BLEU of one translation variant in one source-length bucket: mean over seeds, and the
/// paired difference to `none`.
#[derive(Debug, Clone, Serialize)]
pub struct BleuBucket {
    pub variant: String,
    /// Source words, inclusive; `last` = `None`: open-ended.
    pub first: usize,
    pub last: Option<usize>,
    pub sentences: usize,
    pub bleu: f64,
    pub seeds: usize,
    pub vs_none: Option<PairedDiff>,
}

/// Everything the report says, as `report.json`.
#[derive(Debug, Clone, Serialize)]
pub struct LengthReport {
    pub train_length: usize,
    pub contexts: Vec<usize>,
    pub variants: Vec<String>,
    pub seeds: Vec<u64>,
    pub losses: Vec<ArmLoss>,
    pub logn_effects: Vec<Effect>,
    pub qk_norm_effects: Vec<Effect>,
    /// Loss at each context minus loss at the training length, per arm.
    pub reach: Vec<Effect>,
    pub entropy_buckets: Vec<BucketEntropy>,
    /// BLEU by source length of translation runs, when `DIR/multi30k` holds them.
    pub bleu_by_source_length: Vec<BleuBucket>,
    pub plots: Vec<String>,
    /// Evaluations the study lacks (an arm without a seed at a context), each naming its file.
    pub warnings: Vec<String>,
}

/// Reads the study in `dir` and writes `report.md`, `report.json` and the plots there.
pub fn length_report(dir: &Path) -> Result<LengthReport> {
    let evals = read_evals(dir)?;
    let train_length = common_train_length(&evals)?;
    let contexts: Vec<usize> = evals
        .iter()
        .map(|e| e.result.context)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let seeds: Vec<u64> = evals
        .iter()
        .map(|e| e.seed)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let variants = variant_order(evals.iter().map(|e| e.variant.clone()));
    let warnings = evals::missing(dir, &evals, &seeds, &contexts);
    let index = EvalIndex::new(&evals, &seeds);
    let compared = losses::compare(&index, &variants, &contexts, train_length);
    let longest = *contexts.last().context("no evaluations")?;
    let entropy_buckets = entropy::entropy_buckets(&index, &variants, longest);
    let bleu_by_source_length = bleu::bleu_buckets(&dir.join(MULTI30K))?;
    let plots = plots::write_length_plots(dir, &variants, &contexts, &evals, longest)?;
    let report = LengthReport {
        train_length,
        contexts,
        variants,
        seeds,
        losses: compared.losses,
        logn_effects: compared.logn_effects,
        qk_norm_effects: compared.qk_norm_effects,
        reach: compared.reach,
        entropy_buckets,
        bleu_by_source_length,
        plots,
        warnings,
    };
    write_json(&dir.join(REPORT_JSON), &report)?;
    let md_path = dir.join(REPORT_MD);
    ember_data::io::write_atomic(&md_path, markdown::markdown(&report).as_bytes())
        .with_context(|| format!("writing {}", md_path.display()))?;
    Ok(report)
}

/// The length every run was trained at: a length study compares one.
fn common_train_length(evals: &[Eval]) -> Result<usize> {
    let train_length = evals[0].result.train_length;
    if let Some(e) = evals.iter().find(|e| e.result.train_length != train_length) {
        bail!(
            "the runs were trained at different lengths ({} and {train_length}, e.g. {} seed {}); \
             a length study compares one training length",
            e.result.train_length,
            e.variant,
            e.seed
        );
    }
    Ok(train_length)
}

fn on_off(logn: bool) -> &'static str {
    if logn {
        "on"
    } else {
        "off"
    }
}

/// Variants in the order of the seed's table: none first, then the norms.
fn variant_order(names: impl Iterator<Item = String>) -> Vec<String> {
    let set: BTreeSet<String> = names.collect();
    let rank = |v: &str| {
        VARIANT_ORDER
            .iter()
            .position(|x| *x == v)
            .unwrap_or(VARIANT_ORDER.len())
    };
    let mut v: Vec<String> = set.into_iter().collect();
    v.sort_by_key(|x| (rank(x), x.clone()));
    v
}
