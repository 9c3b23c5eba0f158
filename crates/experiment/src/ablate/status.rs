//! A run's outcome in this invocation, and its record in `status.json`.

use std::time::Instant;

use super::{RunAction, RunOutcome, RunStatus};
use crate::layout::{read_summary, utc_now, PlannedRun, RunRecord, SweepStatus};

/// The record of a run being trained (from scratch, or resumed from a step).
pub(super) fn running_record(resume_from: Option<u64>) -> RunRecord {
    RunRecord {
        status: "running".into(),
        action: if resume_from.is_some() {
            "resumed"
        } else {
            "started"
        }
        .into(),
        detail: None,
        stderr_tail: None,
        wall_secs: None,
        updated: utc_now(),
    }
}

/// A run's outcome, with its steps and validation loss from its summary.json.
pub(super) fn outcome(run: &PlannedRun, action: RunAction, status: RunStatus, wall_secs: f64) -> RunOutcome {
    let summary = read_summary(&run.dir);
    let get = |k: &str| summary.as_ref().and_then(|s| s.get(k).cloned());
    RunOutcome {
        name: run.name.clone(),
        variant: run.variant,
        seed: run.seed,
        lr: run.lr,
        run_dir: run.dir.clone(),
        action,
        status,
        wall_secs,
        steps: get("steps").and_then(|v| v.as_u64()),
        total_steps: get("total_steps").and_then(|v| v.as_u64()),
        val_loss: get("val_loss").and_then(|v| v.as_f64()),
    }
}

/// Writes a run's outcome into `status.json`'s record of it.
pub(super) fn record_run(status: &mut SweepStatus, o: &RunOutcome) {
    let (detail, tail) = match &o.status {
        RunStatus::Ok => (None, None),
        RunStatus::Diverged { reason } => (Some(reason.clone()), None),
        RunStatus::Interrupted { signal } => (
            Some(format!("stopped by {signal}; resumes on the next run")),
            None,
        ),
        RunStatus::Failed { error, stderr_tail } => (
            Some(error.clone()),
            (!stderr_tail.is_empty()).then(|| stderr_tail.clone()),
        ),
    };
    let action = match &o.action {
        RunAction::Started => "started",
        RunAction::Resumed { .. } => "resumed",
        RunAction::Skipped => "skipped",
        RunAction::Refused => "refused",
    };
    // A refused run's directory belongs to another config: its record stays as it was.
    if o.action == RunAction::Refused {
        return;
    }
    // A skipped run keeps the record of the invocation that ran it.
    if o.action == RunAction::Skipped
        && status
            .runs
            .get(&o.name)
            .is_some_and(|r| r.status == o.status.label())
    {
        return;
    }
    status.runs.insert(
        o.name.clone(),
        RunRecord {
            status: o.status.label().into(),
            action: action.into(),
            detail,
            stderr_tail: tail,
            wall_secs: (o.action != RunAction::Skipped).then_some(o.wall_secs),
            updated: utc_now(),
        },
    );
}

/// [`record_run`], then the invocation's wall time so far.
pub(super) fn record(status: &mut SweepStatus, o: &RunOutcome, started: Instant) {
    record_run(status, o);
    if let Some(inv) = status.invocations.last_mut() {
        inv.wall_secs = started.elapsed().as_secs_f64();
    }
}
