//! One cell of a planned sweep, trained on its own, and the sweep's state cell by cell.
//!
//! - [`ablate_cell`] is what each task of a Slurm job array runs (`ember ablate DIR --cell I`):
//!   it reads the plan from `DIR/grid.json`, and trains (or resumes, or skips) exactly that
//!   run, as a local sweep would. Many cells run at once, possibly on different machines
//!   sharing the directory, so none takes the sweep's lock; each run directory keeps its own
//!   (the trainer's), and `status.json` is updated read-modify-write under a lock of its own.
//! - [`sweep_status`] (`ember ablate DIR --status`) says which cells are done, running,
//!   interrupted, failed or pending, from the run directories, their locks and `status.json`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use ember_trainer::interrupt::StopRequest;
use ember_trainer::run_dir::CHECKPOINTS;
use ember_trainer::run_dir::RUN_CONFIG;
use ember_trainer::run_lock::{holder, open_lock_file};
use fs4::fs_std::FileExt;
use serde::Serialize;

use super::execute::execute;
use super::existing_runs::{next, Next};
use super::print::{describe, say};
use super::status::{outcome, record_run, running_record};
use super::{RunAction, RunOutcome, RunStatus, Runner, SweepInterrupted};
use crate::layout::{
    disk_state, read_status, read_summary, write_json, DiskState, Plan, PlannedRun, SweepStatus, GRID, STATUS,
};
use crate::shell::shell_word;

/// The plan in `out/grid.json`, with an error that says what to do when there is none.
pub fn load_plan(out: &Path) -> Result<Plan> {
    if out.is_file() {
        let hint = match planned_out(out) {
            Some(dir) => format!(
                "; if it is the sweep's config, its sweep is planned in {} (`ember ablate {} --status`)",
                dir.display(),
                shell_word(&dir.display().to_string())
            ),
            None => String::new(),
        };
        anyhow::bail!(
            "{} is a file, but --cell and --status take the output directory of a planned sweep \
             (the --out of `ember ablate CONFIG`){hint}",
            out.display()
        );
    }
    let path = out.join(GRID);
    if !path.exists() && out.join(RUN_CONFIG).is_file() && out.join(CHECKPOINTS).is_dir() {
        anyhow::bail!(
            "{} is a training run's directory, not a sweep's: --cell and --status take the output \
             directory of a planned sweep (the --out of `ember ablate CONFIG`); for this run, see \
             its summary.json or `ember eval {}`",
            out.display(),
            shell_word(&out.display().to_string())
        );
    }
    let text = ember_data::io::read_own_to_string(&path).map_err(|e| {
        anyhow::anyhow!(
            "{} cannot be read ({e}): {} is not the output directory of a planned sweep; plan it first \
             with `ember ablate CONFIG --out {}` (add `--launcher slurm` to plan it for a cluster)",
            path.display(),
            out.display(),
            out.display()
        )
    })?;
    let plan: Plan = serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not a plan ember wrote; re-plan with `ember ablate CONFIG --out {}`",
            path.display(),
            out.display()
        )
    })?;
    check_run_dirs(&plan, out, &path)?;
    Ok(plan.rebased(out))
}

/// Every run a plan names must live in `runs/<its name>` of the sweep (as `grid.json` stores
/// it, relative to the sweep; or, in plans from before, under the path the sweep had then): a
/// plan that was edited to put a run elsewhere is refused rather than trained. A sweep that was
/// moved or copied is read where it lies now ([`Plan::rebased`]).
fn check_run_dirs(plan: &Plan, out: &Path, grid: &Path) -> Result<()> {
    for run in &plan.runs {
        let plain = Path::new(&run.name)
            .file_name()
            .is_some_and(|n| n == run.name.as_str());
        let inside = plain
            && run.dir.file_name().is_some_and(|n| n == run.name.as_str())
            && run
                .dir
                .parent()
                .and_then(Path::file_name)
                .is_some_and(|p| p == crate::layout::RUNS);
        if !inside {
            anyhow::bail!(
                "{} plans run {:?} in {}, which is not {}: the plan was edited. Re-plan it with \
                 `ember ablate CONFIG --out {}` (finished runs are kept). Nothing was changed.",
                grid.display(),
                run.name.chars().take(80).collect::<String>(),
                run.dir.display(),
                out.join(crate::layout::RUNS).join(&run.name).display(),
                shell_word(&out.display().to_string())
            );
        }
    }
    Ok(())
}

/// The output directory `ember ablate CONFIG` plans into, if `config` is a config.
fn planned_out(config: &Path) -> Option<PathBuf> {
    let cfg = ember_trainer::config::RunConfig::load(config, &[]).ok()?;
    Some(cfg.ablation.and_then(|a| a.out).unwrap_or_else(|| {
        let stem = config
            .file_stem()
            .map_or("run".into(), |s| s.to_string_lossy().to_string());
        PathBuf::from("runs").join(format!("{stem}-ablation"))
    }))
}

/// Refuses to touch a cell that a process is training now (its run directory's lock is held),
/// or any cell while a local sweep holds the output directory: nothing is recorded or
/// truncated for it.
fn refuse_if_running(plan: &Plan, cell: &str, run: &PlannedRun) -> Result<()> {
    if let Some(holder) = holder(&plan.out) {
        anyhow::bail!(
            "{} is in use by a local sweep ({holder}), which trains its cells itself; wait for it \
             to finish, or stop it (kill -INT PID saves a checkpoint first) and run the cell then. \
             Nothing was changed.",
            plan.out.display()
        );
    }
    if let Some(holder) = holder(&run.dir) {
        anyhow::bail!(
            "cell {cell} ({}) is being trained now by another process ({holder}); `ember ablate {} \
             --status` shows it as running. Nothing was changed.",
            run.name,
            shell_word(&plan.out.display().to_string())
        );
    }
    Ok(())
}

/// Cell `cell` of the plan: its index in `grid.json` (as `$SLURM_ARRAY_TASK_ID` gives it) or
/// its run name.
pub fn find_cell<'a>(plan: &'a Plan, cell: &str) -> Result<(usize, &'a PlannedRun)> {
    let found = match cell.trim().parse::<usize>() {
        Ok(i) => plan.runs.get(i).map(|r| (i, r)),
        Err(_) => plan.runs.iter().enumerate().find(|(_, r)| r.name == cell),
    };
    found.with_context(|| {
        format!(
            "--cell {cell:?}: the plan in {} has {} cells, numbered 0 to {} (or named like {}); \
             `ember ablate {} --status` lists them",
            plan.out.join(GRID).display(),
            plan.runs.len(),
            plan.runs.len().saturating_sub(1),
            plan.runs.first().map_or("-", |r| r.name.as_str()),
            plan.out.display()
        )
    })
}

/// Trains cell `cell` of the sweep planned in `out`: skipped if it finished (or diverged)
/// earlier, resumed if it has a checkpoint, started otherwise. Its outcome goes into
/// `status.json`, a failure with the tail of its stderr, so the report lists it as failed.
/// A stop signal ends it with a checkpoint, recorded as interrupted, and returns
/// [`SweepInterrupted`] (the same invocation resumes it).
pub fn ablate_cell(
    out: &Path,
    cell: &str,
    runner: &Runner,
    stop: Option<&StopRequest>,
    quiet: bool,
) -> Result<RunOutcome> {
    super::refuse_foreign_launcher(|k| std::env::var(k).ok())?;
    let plan = load_plan(out)?;
    let (i, run) = find_cell(&plan, cell)?;
    refuse_if_running(&plan, cell, run)?;
    if let Some(warning) = crate::layout::unit_change(out, ember_kernels::vector_unit()) {
        ember_trainer::tell!("warning: {warning}");
    }
    let tag = format!("[cell {i}/{}]", plan.runs.len());
    let outcome = match next(&plan, run) {
        Next::Settled(action, status) => {
            let o = outcome(run, action, status, 0.0);
            update_status(out, |s| record_run(s, &o))?;
            o
        }
        Next::Train { resume_from } => {
            say(
                quiet,
                match resume_from {
                    Some(step) => format!("{tag} resume   {} (from step {step})", run.name),
                    None => format!("{tag} start    {}", run.name),
                },
            );
            update_status(out, |s| {
                s.runs.insert(run.name.clone(), running_record(resume_from));
            })?;
            let t0 = Instant::now();
            let status = execute(&plan, run, runner, resume_from.is_some(), stop);
            let action = match resume_from {
                Some(from_step) => RunAction::Resumed { from_step },
                None => RunAction::Started,
            };
            let o = outcome(run, action, status, t0.elapsed().as_secs_f64());
            update_status(out, |s| record_run(s, &o))?;
            o
        }
    };
    say(quiet, format!("{tag} {}", describe(&outcome)));
    if let (RunStatus::Interrupted { .. }, Some(signal)) =
        (&outcome.status, stop.and_then(StopRequest::requested))
    {
        return Err(SweepInterrupted {
            signal,
            interrupted: 1,
            not_started: 0,
        }
        .into());
    }
    Ok(outcome)
}

/// Reads `out/status.json`, lets `change` edit it and writes it back, holding an exclusive lock
/// on `out/status.json.lock` meanwhile: the cells of an array finish at any moment, and each
/// must add its record to the others'.
fn update_status(out: &Path, change: impl FnOnce(&mut SweepStatus)) -> Result<()> {
    let lock_path = out.join(format!("{STATUS}.lock"));
    let lock = open_lock_file(&lock_path)?;
    FileExt::lock_exclusive(&*lock).with_context(|| format!("locking {}", lock_path.display()))?;
    let path = out.join(STATUS);
    let mut status = read_status(out);
    change(&mut status);
    write_json(&path, &status)
    // The lock is released when `lock` is dropped.
}

/// Where a cell stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CellState {
    /// Reached its last step.
    Done,
    /// Stopped as diverged (a result, not a failure).
    Diverged,
    /// A process is training it now (it holds the run directory's lock).
    Running,
    /// Stopped with a checkpoint (a signal, a time limit, a killed job): the next attempt
    /// resumes it.
    Interrupted,
    /// Its last attempt crashed or could not run (`detail` says why).
    Failed,
    /// Not started.
    Pending,
}

/// One cell of [`sweep_status`].
#[derive(Debug, Clone, Serialize)]
pub struct CellStatus {
    pub index: usize,
    pub name: String,
    pub state: CellState,
    /// Steps saved (the newest checkpoint, or the finished summary's) and planned.
    pub step: Option<u64>,
    pub total_steps: Option<u64>,
    pub detail: Option<String>,
    pub run_dir: PathBuf,
}

/// Every cell of the sweep planned in `out`, in plan order.
pub fn sweep_status(out: &Path) -> Result<Vec<CellStatus>> {
    let plan = load_plan(out)?;
    let status = read_status(out);
    Ok(plan
        .runs
        .iter()
        .enumerate()
        .map(|(index, run)| {
            let record = status.runs.get(&run.name);
            let summary = read_summary(&run.dir);
            let total_steps = summary.as_ref().and_then(|s| s.get("total_steps")?.as_u64());
            let disk = disk_state(&run.dir);
            let (state, step, detail) = match disk {
                DiskState::Finished => (
                    CellState::Done,
                    summary.as_ref().and_then(|s| s.get("steps")?.as_u64()),
                    None,
                ),
                DiskState::Diverged(reason) => (CellState::Diverged, None, Some(reason)),
                _ if is_locked(&run.dir) => (CellState::Running, saved_step(&disk), None),
                _ if record.is_some_and(|r| r.status == "failed") => (
                    CellState::Failed,
                    saved_step(&disk),
                    record.and_then(|r| r.detail.clone()),
                ),
                DiskState::Interrupted { step } => (
                    CellState::Interrupted,
                    Some(step),
                    record.and_then(|r| r.detail.clone()),
                ),
                DiskState::Empty => match record {
                    // Recorded as running, yet nobody holds the directory: the process died
                    // before its first checkpoint (killed, out of memory, a node lost).
                    Some(r) if r.status == "running" => (
                        CellState::Interrupted,
                        None,
                        Some(format!(
                            "{} at {} but no process holds it now, and no checkpoint was saved",
                            r.action, r.updated
                        )),
                    ),
                    _ => (CellState::Pending, None, None),
                },
            };
            CellStatus {
                index,
                name: run.name.clone(),
                state,
                step,
                total_steps,
                detail,
                run_dir: run.dir.clone(),
            }
        })
        .collect())
}

fn saved_step(disk: &DiskState) -> Option<u64> {
    match disk {
        DiskState::Interrupted { step } => Some(*step),
        _ => None,
    }
}

/// Whether a process holds the run directory's lock (the trainer's one-writer lock) now.
fn is_locked(dir: &Path) -> bool {
    holder(dir).is_some()
}

/// The `--status` table.
pub fn status_table(cells: &[CellStatus]) -> String {
    let w = cells.iter().map(|c| c.name.len()).max().unwrap_or(4).max(4);
    let mut s = format!(
        "{:>4}  {:<w$}  {:<11}  {:>9}  detail\n",
        "cell", "run", "state", "steps"
    );
    for c in cells {
        let steps = match (c.step, c.total_steps) {
            (Some(a), Some(b)) => format!("{a}/{b}"),
            (Some(a), None) => a.to_string(),
            _ => "-".into(),
        };
        let state = serde_json::to_value(c.state)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        s.push_str(&format!(
            "{:>4}  {:<w$}  {:<11}  {:>9}  {}\n",
            c.index,
            c.name,
            state,
            steps,
            c.detail.as_deref().unwrap_or("").lines().next().unwrap_or("")
        ));
    }
    let count = |st: CellState| cells.iter().filter(|c| c.state == st).count();
    s.push_str(&format!(
        "{} cells: {} done, {} diverged, {} running, {} interrupted, {} failed, {} pending",
        cells.len(),
        count(CellState::Done),
        count(CellState::Diverged),
        count(CellState::Running),
        count(CellState::Interrupted),
        count(CellState::Failed),
        count(CellState::Pending)
    ));
    s
}
