//! One cell per variant × learning rate: how its runs ended, mean ± std over the seeds of its
//! finished runs of every metric, and the paired difference to the baseline on the same seeds.

use std::collections::BTreeMap;

use serde::Serialize;

use super::grid::Grid;
use super::runs::RunResult;
use super::stats::{mean_std, paired_diff, MeanStd, PairedDiff};
use super::{BASELINE, LEVEL};

/// How many runs ended how.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Counts {
    pub runs: usize,
    pub ok: usize,
    pub diverged: usize,
    pub failed: usize,
    /// Started but neither finished nor diverged (interrupted, or running now).
    pub incomplete: usize,
    pub not_run: usize,
}

/// One variant at one learning rate, over seeds.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    /// Its setting's value on each axis of the sweep (empty without axes).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub levels: Vec<String>,
    pub variant: String,
    pub lr: f64,
    pub counts: Counts,
    /// Parameters of the model (from a run's summary).
    pub params: Option<usize>,
    /// Over finished runs: final training objective, final validation loss, BLEU, perplexity,
    /// max |attention logit| (peak over training, and at the last logged step), tokens/s.
    pub train_loss: Option<MeanStd>,
    pub val_loss: Option<MeanStd>,
    pub bleu: Option<MeanStd>,
    pub ppl: Option<MeanStd>,
    pub max_attn_logit: Option<MeanStd>,
    pub final_attn_logit: Option<MeanStd>,
    pub tokens_per_sec: Option<MeanStd>,
    /// This variant − `none` on the same seed, per metric (empty for `none` itself).
    pub vs_none: BTreeMap<String, PairedDiff>,
}

type Getter = fn(&RunResult) -> Option<f64>;

/// Every metric of a run that cells summarise, by its key in `vs_none`.
const METRICS: [(&str, Getter); 7] = [
    ("train_loss", |r| r.final_train_loss),
    ("val_loss", |r| r.val_loss),
    ("bleu", |r| r.bleu),
    ("ppl", |r| r.val_ppl),
    ("max_attn_logit", |r| r.max_attn_logit),
    ("final_attn_logit", |r| r.final_attn_logit),
    ("tokens_per_sec", |r| r.tokens_per_sec),
];

/// The cells of one setting's grid that hold runs, variant by variant, learning rates ascending.
pub(crate) fn cells(grid: &Grid, levels: &[String]) -> Vec<Cell> {
    let has_baseline = grid.variants.iter().any(|v| v == BASELINE);
    let mut cells = vec![];
    for v in &grid.variants {
        for &lr in &grid.lrs {
            let runs = grid.cell(v, lr);
            if runs.is_empty() {
                continue;
            }
            let vs_none = if has_baseline && v != BASELINE {
                vs_baseline(grid, v, lr)
            } else {
                BTreeMap::new()
            };
            cells.push(cell(levels, v, lr, &runs, vs_none));
        }
    }
    cells
}

fn cell(
    levels: &[String],
    variant: &str,
    lr: f64,
    runs: &[&RunResult],
    vs_none: BTreeMap<String, PairedDiff>,
) -> Cell {
    let ok: Vec<&RunResult> = runs.iter().copied().filter(|r| r.status == "ok").collect();
    let stat = |f: Getter| mean_std(&ok.iter().filter_map(|r| f(r)).collect::<Vec<_>>());
    Cell {
        levels: levels.to_vec(),
        variant: variant.to_string(),
        lr,
        counts: count(runs.iter().copied()),
        params: runs.iter().find_map(|r| r.params),
        train_loss: stat(METRICS[0].1),
        val_loss: stat(METRICS[1].1),
        bleu: stat(METRICS[2].1),
        ppl: stat(METRICS[3].1),
        max_attn_logit: stat(METRICS[4].1),
        final_attn_logit: stat(METRICS[5].1),
        tokens_per_sec: stat(METRICS[6].1),
        vs_none,
    }
}

/// Variant `v` − the baseline at learning rate `lr`, seed by seed over finished runs, per metric
/// (metrics with no seed where both finished are left out).
fn vs_baseline(grid: &Grid, v: &str, lr: f64) -> BTreeMap<String, PairedDiff> {
    let mut diffs = BTreeMap::new();
    for (key, f) in METRICS {
        let a: Vec<Option<f64>> = grid.seeds.iter().map(|&s| grid.ok_value(v, lr, s, f)).collect();
        let b: Vec<Option<f64>> = grid
            .seeds
            .iter()
            .map(|&s| grid.ok_value(BASELINE, lr, s, f))
            .collect();
        if let Some(d) = paired_diff(&a, &b, LEVEL) {
            diffs.insert(key.to_string(), d);
        }
    }
    diffs
}

/// How the given runs ended.
pub(crate) fn count<'a>(runs: impl Iterator<Item = &'a RunResult>) -> Counts {
    let mut c = Counts::default();
    for r in runs {
        c.runs += 1;
        match r.status.as_str() {
            "ok" => c.ok += 1,
            "diverged" => c.diverged += 1,
            "failed" => c.failed += 1,
            "incomplete" | "running" => c.incomplete += 1,
            _ => c.not_run += 1,
        }
    }
    c
}
