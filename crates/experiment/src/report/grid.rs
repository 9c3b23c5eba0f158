//! The grid the report is laid out on: its variants, learning rates and seeds (the plan's, then
//! whatever else is on disk), and which run sits in which cell.

use std::collections::BTreeSet;

use super::runs::{LoadedRun, RunResult};
use crate::layout::{lr_label, variant_name, Plan, VARIANT_ORDER};

/// The loaded runs on their axes.
pub(crate) struct Grid<'a> {
    pub runs: &'a [LoadedRun],
    pub variants: Vec<String>,
    /// Ascending.
    pub lrs: Vec<f64>,
    /// Ascending.
    pub seeds: Vec<u64>,
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
        Self {
            runs,
            variants,
            lrs,
            seeds,
        }
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
}

/// Learning rates equal as run names print them.
fn same_lr(a: f64, b: f64) -> bool {
    lr_label(a) == lr_label(b)
}
