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

use super::{on_off, EVALS, SWEEP};
use crate::layout::{variant_name, RUNS};

/// One evaluation of one run.
#[derive(Debug, Clone)]
pub(super) struct Eval {
    /// The run's name (its folder under `DIR/evals/`).
    pub run: String,
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
            check_name(&file, &result)?;
            if let Some(other) = out.iter().find(|e: &&Eval| {
                e.run == name && e.logn == result.logn_attention && e.result.context == result.context
            }) {
                bail!(
                    "{} holds the same evaluation as another file of {} (context {}, log-n {}): \
                     remove one of them",
                    file.display(),
                    run.display(),
                    other.result.context,
                    on_off(other.logn)
                );
            }
            out.push(Eval {
                run: name.clone(),
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

/// The name a study gives the evaluation `result`: `context-<N>-logn-<on|off>.json`.
pub(super) fn file_name(context: usize, logn: bool) -> String {
    format!("context-{context}-logn-{}.json", on_off(logn))
}

/// A result whose file name says another context or log-n setting than it holds is refused: the
/// study would report it under the wrong arm.
fn check_name(file: &Path, result: &ContextEval) -> Result<()> {
    let name = file.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let holds = file_name(result.context, result.logn_attention);
    if name.starts_with("context-") && name != holds {
        bail!(
            "{} holds an evaluation at context {} with log-n {}, which its name does not say (it \
             would be {holds}); rename it or evaluate again",
            file.display(),
            result.context,
            on_off(result.logn_attention)
        );
    }
    Ok(())
}

/// Every evaluation the study lacks: for each arm (variant, log-n) and context that some run
/// was evaluated at, the seeds of the study with no evaluation there, naming the file that would
/// hold it. Its paired effects use the seeds that are there; the report says which are not.
pub(super) fn missing(dir: &Path, evals: &[Eval], seeds: &[u64], contexts: &[usize]) -> Vec<String> {
    let arms: std::collections::BTreeSet<(String, bool)> =
        evals.iter().map(|e| (e.variant.clone(), e.logn)).collect();
    let mut out = vec![];
    for (variant, logn) in arms {
        for &context in contexts {
            for &seed in seeds {
                let have = |e: &&Eval| {
                    e.variant == variant && e.logn == logn && e.result.context == context && e.seed == seed
                };
                if evals.iter().any(|e| have(&e)) {
                    continue;
                }
                let run = evals
                    .iter()
                    .find(|e| e.variant == variant && e.seed == seed)
                    .map_or_else(
                        || format!("<the {variant} run of seed {seed}>"),
                        |e| e.run.clone(),
                    );
                out.push(format!(
                    "{variant} with log-n {} has no evaluation at context {context} for seed {seed} \
                     ({} is missing): its paired effects there use the other seeds",
                    on_off(logn),
                    dir.join(EVALS).join(run).join(file_name(context, logn)).display()
                ));
            }
        }
    }
    out
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
