//! LR sensitivity per variant (Wortsman et al., 2023): computed per seed from the final
//! validation losses at every learning rate, then mean ± std over seeds and the paired difference
//! to the baseline; and, in words, where the loss at initialisation ℓ₀ came from.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::cells::Cell;
use super::grid::Grid;
use super::runs::RunResult;
use super::stats::{lr_sensitivity, mean_std, paired_diff, MeanStd, PairedDiff};
use super::{BASELINE, LEVEL};

/// LR sensitivity of one variant.
#[derive(Debug, Clone, Serialize)]
pub struct Sensitivity {
    /// Its setting's value on each axis of the sweep (empty without axes).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub levels: Vec<String>,
    pub variant: String,
    /// Over seeds whose runs at every learning rate finished or diverged.
    pub value: Option<MeanStd>,
    pub per_seed: BTreeMap<u64, f64>,
    pub vs_none: Option<PairedDiff>,
    /// The learning rate with the lowest mean final validation loss over finished runs.
    pub best_lr: Option<f64>,
    pub best_val_loss: Option<f64>,
}

/// Every variant's LR sensitivity in every setting (none with a single learning rate), and where
/// ℓ₀ came from.
pub(crate) fn lr_sensitivities(grid: &Grid, cells: &[Cell]) -> (Vec<Sensitivity>, String) {
    let mut init = InitLosses::default();
    if grid.lrs.len() < 2 {
        return (vec![], init.source(grid.lrs.len()));
    }
    let mut sensitivities = vec![];
    for levels in &grid.settings {
        let setting = grid.setting(levels);
        let cells: Vec<Cell> = cells.iter().filter(|c| &c.levels == levels).cloned().collect();
        let per_variant: BTreeMap<&str, BTreeMap<u64, f64>> = setting
            .variants
            .iter()
            .map(|v| (v.as_str(), per_seed(&setting, v, &mut init)))
            .collect();
        sensitivities.extend(setting.variants.iter().map(|v| Sensitivity {
            levels: levels.clone(),
            ..summarise(v, &per_variant, &setting.seeds, &cells)
        }));
    }
    (sensitivities, init.source(grid.lrs.len()))
}

/// Variant `v`'s sensitivity for each seed with a finished or diverged run at every learning rate.
fn per_seed(grid: &Grid, v: &str, init: &mut InitLosses) -> BTreeMap<u64, f64> {
    let mut per_seed = BTreeMap::new();
    for &s in &grid.seeds {
        let runs: Option<Vec<&RunResult>> = grid
            .lrs
            .iter()
            .map(|&lr| {
                grid.find(v, lr, s)
                    .filter(|r| r.status == "ok" || r.status == "diverged")
            })
            .collect();
        let Some(runs) = runs else {
            continue;
        };
        let Some(l0) = init.of(&runs) else {
            continue;
        };
        let losses: Vec<f64> = runs.iter().map(|r| r.val_loss.unwrap_or(f64::NAN)).collect();
        if let Some(x) = lr_sensitivity(&losses, l0) {
            per_seed.insert(s, x);
        }
    }
    per_seed
}

/// Mean ± std over seeds, the paired difference to the baseline, and the best learning rate.
fn summarise(
    v: &str,
    per_variant: &BTreeMap<&str, BTreeMap<u64, f64>>,
    seeds: &[u64],
    cells: &[Cell],
) -> Sensitivity {
    let per_seed = per_variant.get(v).cloned().unwrap_or_default();
    let value = mean_std(&per_seed.values().copied().collect::<Vec<_>>());
    let vs_none = if v == BASELINE {
        None
    } else {
        per_variant.get(BASELINE).and_then(|base| {
            let a: Vec<Option<f64>> = seeds.iter().map(|s| per_seed.get(s).copied()).collect();
            let b: Vec<Option<f64>> = seeds.iter().map(|s| base.get(s).copied()).collect();
            paired_diff(&a, &b, LEVEL)
        })
    };
    let best = cells
        .iter()
        .filter(|c| c.variant == v)
        .filter_map(|c| c.val_loss.map(|m| (c.lr, m.mean)))
        .min_by(|a, b| a.1.total_cmp(&b.1));
    Sensitivity {
        levels: vec![],
        variant: v.to_string(),
        value,
        per_seed,
        vs_none,
        best_lr: best.map(|b| b.0),
        best_val_loss: best.map(|b| b.1),
    }
}

/// Where the ℓ₀ of the seeds scored so far came from.
#[derive(Default)]
struct InitLosses {
    /// Seeds whose runs recorded their validation loss before training.
    recorded: usize,
    /// Vocabulary sizes whose logarithm stood in for it.
    fallback_vocabs: BTreeSet<usize>,
}

impl InitLosses {
    /// ℓ₀ of one seed's runs across learning rates: the validation loss before training that a
    /// run recorded, else ln(vocab_size) (the loss of a uniform prediction).
    fn of(&mut self, runs: &[&RunResult]) -> Option<f64> {
        if let Some(l) = runs.iter().find_map(|r| r.init_val_loss) {
            self.recorded += 1;
            return Some(l);
        }
        let vocab = runs.iter().find_map(|r| r.vocab_size)?;
        self.fallback_vocabs.insert(vocab);
        Some((vocab as f64).ln())
    }

    /// The report's words for it.
    fn source(&self, n_lrs: usize) -> String {
        let vocabs = || {
            self.fallback_vocabs
                .iter()
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join(", ln ")
        };
        match (self.recorded > 0, self.fallback_vocabs.is_empty()) {
            (_, true) if n_lrs < 2 => "not needed (one learning rate)".to_string(),
            (_, true) => "the validation loss before training, recorded by the runs (train.divergence_evals is set)".to_string(),
            (false, false) => format!(
                "ln(vocab_size) = ln {} — train.divergence_evals was not set, so the runs did not record their validation loss before training",
                vocabs()
            ),
            (true, false) => format!(
                "the recorded validation loss before training where available, else ln(vocab_size) = ln {} (runs without train.divergence_evals)",
                vocabs()
            ),
        }
    }
}
