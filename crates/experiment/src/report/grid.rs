//! The grid the report is laid out on: its variants, learning rates and seeds (the plan's, then
//! whatever else is on disk), its factorial axes and their combinations (settings), and which
//! run sits in which cell.

use std::collections::BTreeSet;

use super::runs::{LoadedRun, RunResult};
use crate::layout::{levels_label, lr_label, variant_name, Axis, Plan, VARIANT_ORDER};

/// The loaded runs on their axes.
pub(crate) struct Grid<'a> {
    pub runs: Vec<&'a LoadedRun>,
    pub variants: Vec<String>,
    /// Ascending.
    pub lrs: Vec<f64>,
    /// Ascending.
    pub seeds: Vec<u64>,
    /// The plan's factorial axes (empty without; then there is one setting, with no levels).
    pub axes: Vec<Axis>,
    /// Every combination of levels that holds a run: the plan's order, then any found on disk.
    pub settings: Vec<Vec<String>>,
}

impl<'a> Grid<'a> {
    /// Axes of the grid: the plan's order, then anything else found on disk.
    pub fn new(plan: Option<&Plan>, runs: &'a [LoadedRun]) -> Self {
        let mut variants: Vec<String> = plan
            .map(|p| p.variants.iter().map(|v| variant_name(*v)).collect())
            .unwrap_or_default();
        for r in runs {
            if !variants.contains(&r.variant) {
                variants.push(r.variant.clone());
            }
        }
        if plan.is_none() {
            // No plan: the baseline first, then the variants' config order.
            variants.sort_by_key(|v| {
                VARIANT_ORDER
                    .iter()
                    .position(|o| o == v)
                    .unwrap_or(VARIANT_ORDER.len())
            });
        }
        let mut lrs: Vec<f64> = vec![];
        for r in runs {
            if !lrs.iter().any(|l| same_lr(*l, r.lr)) {
                lrs.push(r.lr);
            }
        }
        lrs.sort_by(|a, b| a.total_cmp(b));
        let seeds: Vec<u64> = runs
            .iter()
            .map(|r| r.seed)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut settings: Vec<Vec<String>> = vec![];
        for levels in plan
            .into_iter()
            .flat_map(|p| p.runs.iter().map(|r| &r.levels))
            .chain(runs.iter().map(|r| &r.levels))
        {
            if !settings.contains(levels) {
                settings.push(levels.clone());
            }
        }
        Self {
            runs: runs.iter().collect(),
            variants,
            lrs,
            seeds,
            axes: plan.map(|p| p.axes.clone()).unwrap_or_default(),
            settings,
        }
    }

    /// The grid of one setting: its runs only, on the same variants, learning rates and seeds.
    pub fn setting(&self, levels: &[String]) -> Grid<'a> {
        Grid {
            runs: self.runs.iter().copied().filter(|r| r.levels == levels).collect(),
            variants: self.variants.clone(),
            lrs: self.lrs.clone(),
            seeds: self.seeds.clone(),
            axes: vec![],
            settings: vec![levels.to_vec()],
        }
    }

    /// How a setting is named in plot files and run names (empty without axes).
    pub fn label(&self, levels: &[String]) -> String {
        levels_label(&self.axes, levels)
    }

    /// The run of variant `v` at learning rate `lr` with seed `s`.
    pub fn find(&self, v: &str, lr: f64, s: u64) -> Option<&'a RunResult> {
        self.runs
            .iter()
            .find(|r| r.variant == v && same_lr(r.lr, lr) && r.seed == s)
            .map(|r| &r.result)
    }

    /// `f` of that run, if it finished.
    pub fn ok_value(&self, v: &str, lr: f64, s: u64, f: impl Fn(&RunResult) -> Option<f64>) -> Option<f64> {
        self.find(v, lr, s).filter(|r| r.status == "ok").and_then(f)
    }

    /// Every run of variant `v` at learning rate `lr`, in load order.
    pub fn cell(&self, v: &str, lr: f64) -> Vec<&'a RunResult> {
        self.runs
            .iter()
            .map(|r| &r.result)
            .filter(|r| r.variant == v && same_lr(r.lr, lr))
            .collect()
    }

    /// Every run, in load order.
    pub fn results(&self) -> Vec<&'a RunResult> {
        self.runs.iter().map(|r| &r.result).collect()
    }
}

/// Learning rates equal as run names print them.
fn same_lr(a: f64, b: f64) -> bool {
    lr_label(a) == lr_label(b)
}
