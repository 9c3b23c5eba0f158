//! The ablation report: `report.md`, `report.json` and `plots/` in a sweep's output directory,
//! computed from the run directories alone (`summary.json`, `metrics.jsonl`, `config.yaml`,
//! checkpoint `state.json`) plus the sweep's `grid.json` and `status.json`, so `ember report DIR`
//! regenerates it without training. Nothing in it depends on when it was generated: the same
//! run directories give byte-identical files.
//!
//! Statistics (see [`stats`]): per variant and learning rate, mean ± sample std over seeds of
//! the finished runs (diverged runs are counted, not averaged); the paired difference to `none`
//! on the same seed with a two-sided 95% t interval (df = n − 1); and per variant the LR
//! sensitivity of Wortsman et al. (2023).
//!
//! With factorial axes (`--grid`), every combination of their levels (a setting) is reported as
//! a grid of its own, and `effects` gives the QK-norm effect on LR sensitivity per level of each
//! axis, pooled over the other axes.
//!
//! One submodule per step: `runs` reads the run directories, `grid` lays them out by setting ×
//! variant × learning rate × seed, `cells`, `sensitivity` and `effects` compute the statistics,
//! `markdown` writes report.md section by section, and `plots` draws the figures.

mod cells;
mod effects;
mod grid;
mod markdown;
pub(crate) mod plots;
mod runs;
mod sensitivity;
pub mod stats;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

pub use cells::{Cell, Counts};
pub use effects::AxisEffect;
pub use runs::RunResult;
pub use sensitivity::Sensitivity;

use crate::layout::{
    write_json, Axis, Hardware, Plan, SweepStatus, GRID, REPORT_JSON, REPORT_MD, RUNS, STATUS,
};
use grid::Grid;
use runs::{load_runs, LoadedRun};

/// The baseline every variant is paired against.
pub const BASELINE: &str = "none";
/// Confidence level of the paired intervals.
pub const LEVEL: f64 = 0.95;

/// Everything the report says, as written to `report.json`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub out_dir: PathBuf,
    /// The base config and the user's overrides (from grid.json).
    pub config: Option<PathBuf>,
    pub overrides: Vec<String>,
    pub base_command: Option<Vec<String>>,
    /// `seq2seq` or `lm`.
    pub arch: Option<String>,
    /// The quality column: `bleu` when eval records carry BLEU, else `ppl`.
    pub quality: String,
    pub variants: Vec<String>,
    pub lrs: Vec<f64>,
    pub seeds: Vec<u64>,
    /// Factorial axes of the sweep (empty without).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub axes: Vec<Axis>,
    /// Planned optimizer steps per run.
    pub steps: Option<u64>,
    pub hardware: Option<Hardware>,
    pub jobs: Option<usize>,
    pub threads: Option<usize>,
    /// Wall time of the sweep, summed over invocations of `ember ablate`.
    pub wall_secs: Option<f64>,
    pub invocations: usize,
    /// Training time summed over runs.
    pub train_secs: f64,
    pub counts: Counts,
    /// One per setting × variant × learning rate.
    pub cells: Vec<Cell>,
    /// One per setting × variant (empty with a single learning rate).
    pub lr_sensitivity: Vec<Sensitivity>,
    /// The QK-norm effect on LR sensitivity per level of each axis (empty without axes).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub axis_effects: Vec<AxisEffect>,
    /// Where ℓ₀ (loss at initialisation) in the LR sensitivity came from.
    pub init_loss_source: String,
    pub runs: Vec<RunResult>,
    /// Relative to the output directory.
    pub plots: Vec<String>,
    pub notes: Vec<String>,
    /// Run files that could not be read as what they should be (a damaged metrics.jsonl or
    /// summary.json): the report is made without them, and the CLI prints these.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// Reads every run under `out_dir`, writes `report.md`, `report.json` and `plots/`, and returns
/// the report.
pub fn report(out_dir: &Path) -> Result<Report> {
    let plan: Option<Plan> = read_json::<Plan>(&out_dir.join(GRID)).with_context(|| {
        format!(
            "{} is not a plan ember wrote; re-plan with `ember ablate CONFIG --out {}` (finished runs \
             are kept), or remove it to report the run directories alone",
            out_dir.join(GRID).display(),
            out_dir.display()
        )
    })?;
    // Wherever the sweep lies now (moved, copied): its runs and base config are read there.
    let plan = plan.map(|p| p.rebased(out_dir));
    let mut warnings = vec![];
    let status: Option<SweepStatus> = match read_json(&out_dir.join(STATUS)) {
        Ok(s) => s,
        Err(e) => {
            warnings.push(format!(
                "{e:#}: it is not a status file ember wrote, so the report leaves out what it records \
                 (failed runs' errors, wall time)"
            ));
            None
        }
    };
    let runs = load_runs(out_dir, plan.as_ref(), status.as_ref())?;
    refuse_without_runs(out_dir, &runs)?;
    let grid = Grid::new(plan.as_ref(), &runs);
    let quality = quality(&runs);
    let cells: Vec<Cell> = grid
        .settings
        .iter()
        .flat_map(|levels| cells::cells(&grid.setting(levels), levels))
        .collect();
    let (lr_sensitivity, init_loss_source) = sensitivity::lr_sensitivities(&grid, &cells);
    let axis_effects = effects::axis_effects(&grid.axes, &grid.variants, &lr_sensitivity);
    let results = grid.results();
    let groups: Vec<plots::PlotGroup> = grid
        .settings
        .iter()
        .map(|levels| plots::PlotGroup {
            label: grid.label(levels),
            title: setting_words(&grid.axes, levels),
            runs: grid.setting(levels).results(),
        })
        .collect();
    let plots = plots::write_plots(out_dir, &grid.variants, &grid.lrs, &groups, &quality)?;
    let Grid {
        variants,
        lrs,
        seeds,
        axes,
        ..
    } = grid;
    let report = Report {
        out_dir: out_dir.to_path_buf(),
        config: plan
            .as_ref()
            .map(|p| p.config_source.clone().unwrap_or_else(|| p.config.clone())),
        overrides: plan.as_ref().map(|p| p.overrides.clone()).unwrap_or_default(),
        base_command: plan.as_ref().map(|p| p.base_command.clone()),
        arch: runs.iter().find_map(|r| r.arch.clone()),
        quality,
        variants,
        lrs,
        seeds,
        axes,
        steps: runs.iter().find_map(|r| r.total_steps.or(r.planned_steps)),
        hardware: hardware(plan.as_ref(), status.as_ref()),
        jobs: plan.as_ref().map(|p| p.jobs),
        threads: plan.as_ref().and_then(|p| p.threads),
        wall_secs: wall_secs(status.as_ref()),
        invocations: status.as_ref().map_or(0, |s| s.invocations.len()),
        train_secs: runs.iter().filter_map(|r| r.train_secs).sum(),
        counts: cells::count(results.into_iter()),
        cells,
        lr_sensitivity,
        axis_effects,
        init_loss_source,
        runs: runs.iter().map(|r| r.result.clone()).collect(),
        plots,
        notes: plan.map(|p| p.notes).unwrap_or_default(),
        warnings: warnings
            .into_iter()
            .chain(runs.iter().flat_map(|r| r.warnings.iter().cloned()))
            .collect(),
    };
    write(out_dir, &report)?;
    Ok(report)
}

/// Refuses an `out_dir` that is not a folder, or holds no runs to report.
fn refuse_without_runs(out_dir: &Path, runs: &[LoadedRun]) -> Result<()> {
    if !out_dir.is_dir() {
        bail!(
            "{} is not a folder{}: give the output directory of a sweep (the --out of `ember \
             ablate`, runs/NAME-ablation by default)",
            out_dir.display(),
            if out_dir.exists() {
                ""
            } else {
                " (it does not exist)"
            }
        );
    }
    if runs.is_empty() {
        bail!(
            "{} holds no runs: expected {GRID} or run directories under {}/",
            out_dir.display(),
            out_dir.join(RUNS).display()
        );
    }
    Ok(())
}

/// `positions=learned, decay_embeddings=true`: a setting in words (empty without axes).
pub(crate) fn setting_words(axes: &[Axis], levels: &[String]) -> String {
    axes.iter()
        .zip(levels)
        .map(|(a, v)| format!("{}={v}", a.label(axes)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The quality column: `bleu` when eval records carry BLEU, else `ppl`.
fn quality(runs: &[LoadedRun]) -> String {
    if runs.iter().any(|r| r.bleu.is_some()) {
        "bleu"
    } else {
        "ppl"
    }
    .to_string()
}

/// The machine of the first invocation, else the one the plan was made on.
fn hardware(plan: Option<&Plan>, status: Option<&SweepStatus>) -> Option<Hardware> {
    status
        .and_then(|s| s.invocations.first().map(|i| i.hardware.clone()))
        .or_else(|| plan.map(|p| p.hardware.clone()))
}

/// Wall time summed over invocations (none before the first).
fn wall_secs(status: Option<&SweepStatus>) -> Option<f64> {
    status
        .filter(|s| !s.invocations.is_empty())
        .map(|s| s.invocations.iter().map(|i| i.wall_secs).sum())
}

/// `report.md` and `report.json`.
fn write(out_dir: &Path, report: &Report) -> Result<()> {
    let md_path = out_dir.join(REPORT_MD);
    ember_data::io::write_atomic(&md_path, markdown::markdown(report).as_bytes())
        .with_context(|| format!("writing {}", md_path.display()))?;
    write_json(&out_dir.join(REPORT_JSON), report)
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Option<T>> {
    match ember_data::io::read_own_to_string(path) {
        Ok(text) => Ok(Some(
            serde_json::from_str(&text).with_context(|| format!("reading {}", path.display()))?,
        )),
        Err(_) => Ok(None),
    }
}
