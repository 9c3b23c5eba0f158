//! Training one run of a sweep with its runner (a child `ember train`, or the trainer in this
//! process), and judging how it ended from what its run directory holds afterwards.

use std::fs;
use std::path::Path;

use anyhow::Result;
use ember_trainer::interrupt::{signal_name, Interrupted, StopRequest};
use ember_trainer::metrics::Verbosity;
use ember_trainer::run_dir::{METRICS, METRICS_CSV, SUMMARY};
use ember_trainer::{train, Summary, TrainOptions};

use super::children::train_in_child;
use super::grid::run_config;
use super::{RunStatus, Runner};
use crate::layout::{disk_state, read_summary, DiskState, Plan, PlannedRun};

/// Trains one run and judges the result from its summary.json.
pub(super) fn execute(
    plan: &Plan,
    run: &PlannedRun,
    runner: &Runner,
    resume: bool,
    stop: Option<&StopRequest>,
) -> RunStatus {
    if let Err(e) = fs::create_dir_all(&run.dir) {
        return RunStatus::Failed {
            error: format!("cannot create {}: {e}", run.dir.display()),
            stderr_tail: String::new(),
        };
    }
    // A stale summary must not speak for this attempt; a fresh start must not append to the
    // metrics of an attempt that never reached a checkpoint.
    let _ = fs::remove_file(run.dir.join(SUMMARY));
    if !resume {
        for f in [METRICS, METRICS_CSV] {
            let _ = fs::remove_file(run.dir.join(f));
        }
    }
    let (error, stderr_tail) = match runner {
        Runner::Process { exe } => train_in_child(exe, run, resume, stop),
        Runner::InProcess => match train_in_process(plan, run, resume, stop) {
            Ok(_) => (
                "returned without a finished summary.json".to_string(),
                String::new(),
            ),
            Err(e) => match e.downcast_ref::<Interrupted>() {
                Some(i) => {
                    return RunStatus::Interrupted {
                        signal: signal_name(i.signal),
                    }
                }
                None => ("error".to_string(), format!("error: {e:#}")),
            },
        },
    };
    judge(run, stop, error, stderr_tail)
}

/// [`train`] in this process, a panic turned into an error (one run must not take the
/// sweep down with it).
fn train_in_process(
    plan: &Plan,
    run: &PlannedRun,
    resume: bool,
    stop: Option<&StopRequest>,
) -> Result<Summary> {
    run_config(plan, run).and_then(|cfg| {
        let opts = TrainOptions {
            resume,
            fallback: false,
            verbosity: Verbosity::Quiet,
            stop: stop.cloned(),
            ..TrainOptions::new(run.dir.clone())
        };
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| train(cfg, &opts))).unwrap_or_else(|p| {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".into());
            Err(anyhow::anyhow!("panicked: {msg}"))
        })
    })
}

/// How an attempt ended, from its run directory: interrupted, finished, diverged, or else
/// failed with the runner's `error` and `stderr_tail`.
fn judge(run: &PlannedRun, stop: Option<&StopRequest>, error: String, stderr_tail: String) -> RunStatus {
    if let Some(signal) = summary_interrupted(&run.dir) {
        return RunStatus::Interrupted { signal };
    }
    // A child aborted by a repeated signal wrote no summary, but its last checkpoint stands.
    if let Some(signal) = stop.and_then(StopRequest::requested) {
        if !matches!(disk_state(&run.dir), DiskState::Finished | DiskState::Diverged(_)) {
            return RunStatus::Interrupted {
                signal: signal_name(signal),
            };
        }
    }
    match disk_state(&run.dir) {
        DiskState::Finished => RunStatus::Ok,
        DiskState::Diverged(reason) => RunStatus::Diverged { reason },
        _ => RunStatus::Failed { error, stderr_tail },
    }
}

/// The stop signal a run's `summary.json` says interrupted it, if any.
fn summary_interrupted(dir: &Path) -> Option<String> {
    read_summary(dir)?
        .get("interrupted")?
        .as_str()
        .map(str::to_string)
}
