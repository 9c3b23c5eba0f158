//! What a sweep makes of what a run directory already holds: a finished or diverged run is
//! settled, one with a checkpoint is resumed, an empty one is started, and one trained with a
//! different config is refused rather than overwritten.

use std::fs;

use anyhow::Result;
use ember_trainer::config::RunConfig;
use ember_trainer::resume_check::json_changes;
use ember_trainer::run_dir::RUN_CONFIG;
use ember_trainer::DataFilled;

use super::grid::run_config;
use super::{RunAction, RunStatus};
use crate::layout::{disk_state, DiskState, Plan, PlannedRun};

/// What to do with a planned run, judged from its directory.
pub(super) enum Next {
    /// Nothing to train: finished or diverged earlier, or refused.
    Settled(RunAction, RunStatus),
    /// Train it, from scratch or from a checkpoint's step.
    Train { resume_from: Option<u64> },
}

pub(super) fn next(plan: &Plan, run: &PlannedRun) -> Next {
    let state = disk_state(&run.dir);
    let mismatch = match &state {
        DiskState::Empty => {
            if config_mismatch(plan, run).is_some() {
                // Nothing was saved there (no checkpoint): start clean, tokenizer included.
                let _ = fs::remove_dir_all(&run.dir);
            }
            None
        }
        _ => config_mismatch(plan, run),
    };
    if let Some(diff) = mismatch {
        return Next::Settled(
            RunAction::Refused,
            RunStatus::Failed {
                error: format!(
                    "{} holds a run of a different config ({}); delete it or choose another --out",
                    run.dir.display(),
                    diff.join("; ")
                ),
                stderr_tail: String::new(),
            },
        );
    }
    match state {
        DiskState::Finished => Next::Settled(RunAction::Skipped, RunStatus::Ok),
        DiskState::Diverged(reason) => Next::Settled(RunAction::Skipped, RunStatus::Diverged { reason }),
        DiskState::Interrupted { step } => Next::Train {
            resume_from: Some(step),
        },
        DiskState::Empty => Next::Train { resume_from: None },
    }
}

/// Refuses, before anything is written, a sweep whose output directory holds runs (with
/// checkpoints or a summary) of another config, naming the runs and the keys that differ.
pub(super) fn refuse_other_configs(plan: &Plan) -> Result<()> {
    if let Some(run) = plan.runs.iter().find(|r| r.dir.exists() && !r.dir.is_dir()) {
        anyhow::bail!(
            "{} is not a folder, but the sweep keeps run {} there; move it away or choose another \
             --out. Nothing was run or changed.",
            run.dir.display(),
            run.name
        );
    }
    let other: Vec<String> = plan
        .runs
        .iter()
        .filter(|r| disk_state(&r.dir) != DiskState::Empty)
        .filter_map(|r| config_mismatch(plan, r).map(|d| format!("{} ({})", r.name, d.join("; "))))
        .collect();
    if other.is_empty() {
        return Ok(());
    }
    anyhow::bail!(
        "{} holds {} run(s) of a different config than this sweep plans: {}{}. Run the sweep with \
         the config (and --set) it was started with, delete those run directories, or choose \
         another --out. Nothing was run or changed.",
        plan.out.display(),
        other.len(),
        other.iter().take(3).cloned().collect::<Vec<_>>().join(", "),
        if other.len() > 3 {
            format!(" and {} more", other.len() - 3)
        } else {
            String::new()
        }
    )
}

/// Differences between the config a run directory was trained with and the planned one
/// (`None` when they agree, or when there is nothing to compare).
fn config_mismatch(plan: &Plan, run: &PlannedRun) -> Option<Vec<String>> {
    let stored_path = run.dir.join(RUN_CONFIG);
    if !stored_path.is_file() {
        return None;
    }
    let mut planned = run_config(plan, run).ok()?;
    let mut stored = match RunConfig::load(&stored_path, &[]) {
        Ok(c) => c,
        Err(e) => return Some(vec![format!("its config.yaml cannot be read: {e}")]),
    };
    // What the data fills in, and the thread count, are not part of the experiment.
    DataFilled::fill_from(&mut planned.model, &stored.model);
    planned.train.threads = None;
    stored.train.threads = None;
    planned.ablation = None;
    stored.ablation = None;
    let (a, b) = (
        serde_json::to_value(&stored).ok()?,
        serde_json::to_value(&planned).ok()?,
    );
    let diffs: Vec<String> = json_changes(&a, &b)
        .into_iter()
        .map(|c| format!("{}: {} there, {} planned", c.key, c.before, c.after))
        .collect();
    (!diffs.is_empty()).then_some(diffs)
}
