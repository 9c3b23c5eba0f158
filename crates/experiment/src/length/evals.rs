//! The study's evaluations: every `DIR/evals/<run>/context-<N>-logn-<on|off>.json`, with the
//! variant and seed of the run it evaluates, and an index of their losses by arm, context and
//! seed.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use ember_trainer::config::RunConfig;
use ember_trainer::context::ContextEval;
use ember_trainer::run_dir::RUN_CONFIG;

use super::{EVALS, SWEEP};
use crate::layout::{variant_name, RUNS};

/// One evaluation of one run.
#[derive(Debug, Clone)]
pub(super) struct Eval {
    pub variant: String,
    pub seed: u64,
    pub logn: bool,
    pub result: ContextEval,
}

/// Every `DIR/evals/<run>/context-<N>-logn-<on|off>.json`, with the run's variant and seed from
/// `DIR/sweep/runs/<run>/config.yaml`.
pub(super) fn read_evals(dir: &Path) -> Result<Vec<Eval>> {
    let evals_dir = dir.join(EVALS);
    let runs = fs::read_dir(&evals_dir).with_context(|| {
        format!(
            "reading {} (run scripts/length-study.sh first: it trains the sweep and evaluates it there)",
            evals_dir.display()
        )
    })?;
    let mut out = Vec::new();
    for run in runs {
        let run = run?.path();
        let Some(name) = run.file_name().and_then(|n| n.to_str()).map(str::to_string) else {
            continue;
        };
        if !run.is_dir() {
            continue;
        }
        let config = dir.join(SWEEP).join(RUNS).join(&name).join(RUN_CONFIG);
        let cfg = RunConfig::load(&config, &[]).with_context(|| format!("reading {}", config.display()))?;
        let variant = variant_name(cfg.model.qk_norm);
        let mut files: Vec<PathBuf> = fs::read_dir(&run)?
            .filter_map(|f| f.ok().map(|f| f.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        files.sort();
        for file in files {
            let text = ember_data::io::read_small_text(&file, 1 << 28)
                .with_context(|| format!("reading {}", file.display()))?;
            let result: ContextEval = serde_json::from_str(&text).with_context(|| {
                format!(
                    "{} is not an `ember eval --context --json` result",
                    file.display()
                )
            })?;
            out.push(Eval {
                variant: variant.clone(),
                seed: cfg.train.seed,
                logn: result.logn_attention,
                result,
            });
        }
    }
    if out.is_empty() {
        bail!("{} holds no evaluations", evals_dir.display());
    }
    Ok(out)
}

/// The evaluations by (variant, log-n, context, seed), for pairing them by seed.
pub(super) struct EvalIndex<'a> {
    by_key: BTreeMap<(String, bool, usize, u64), &'a ContextEval>,
    seeds: &'a [u64],
}

impl<'a> EvalIndex<'a> {
    pub fn new(evals: &'a [Eval], seeds: &'a [u64]) -> Self {
        let by_key = evals
            .iter()
            .map(|e| ((e.variant.clone(), e.logn, e.result.context, e.seed), &e.result))
            .collect();
        Self { by_key, seeds }
    }

    /// One arm's evaluation at `context` with seed `seed`, if there is one.
    pub fn get(&self, variant: &str, logn: bool, context: usize, seed: u64) -> Option<&'a ContextEval> {
        self.by_key
            .get(&(variant.to_string(), logn, context, seed))
            .copied()
    }

    /// One arm's loss at `context` for every seed of the study (`None` where it was not evaluated).
    pub fn per_seed(&self, variant: &str, logn: bool, context: usize) -> Vec<Option<f64>> {
        self.seeds
            .iter()
            .map(|&s| self.get(variant, logn, context, s).map(|r| r.loss))
            .collect()
    }

    /// One arm's evaluations at `context`, in seed order.
    pub fn runs(&self, variant: &str, logn: bool, context: usize) -> Vec<&'a ContextEval> {
        self.seeds
            .iter()
            .filter_map(|&s| self.get(variant, logn, context, s))
            .collect()
    }
}
