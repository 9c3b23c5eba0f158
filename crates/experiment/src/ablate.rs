//! `ember ablate`: the QK-norm ablation grid — every variant × seed × peak learning rate of one
//! base config — as ordinary run directories under `OUT/runs/<variant>-lr<lr>-seed<s>/`.
//!
//! - **Paired.** Seeds are 1..=n (`train.seed = s`). Ember derives every parameter's initial
//!   values from (train.seed, parameter name) and the data order from train.seed, so for a given
//!   seed all variants start from the same values of every parameter they share and see the same
//!   batches; the report compares variants seed by seed.
//! - **Resumable.** A run whose `summary.json` says finished (or diverged) is skipped; one with
//!   checkpoints but no finished summary is resumed (`--resume`); anything else starts afresh.
//!   A run directory that holds a run of a different config is refused, not overwritten.
//! - **Parallel.** With [`Runner::Process`], `jobs` runs go at once, each an `ember train`
//!   process told its share of the cores with `--set train.threads=T`.
//! - **Robust.** A diverged run (summary.json `diverged`) is recorded as such; a crash is
//!   recorded as failed with its stderr tail; the sweep goes on either way. The caller decides
//!   the exit status from [`AblateOutcome::any_failed`].
//!
//! Besides the run directories, `OUT/grid.json` holds the plan (every run, its overrides and its
//! exact command) and `OUT/status.json` each run's last outcome and every invocation's wall
//! time ([`crate::layout`] names every file). The report ([`crate::report`]) is written at the end
//! and can be regenerated alone.
//!
//! [`plan`] resolves the grid (in `ablate/grid.rs`); [`ablate`] runs it.

use std::collections::VecDeque;
use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use anyhow::{Context, Result};
use ember_model::QkNorm;
use ember_trainer::config::RunConfig;
use ember_trainer::interrupt::{signal_name, Interrupted, StopRequest};
use ember_trainer::metrics::{self, Verbosity};
use ember_trainer::resume_check::json_changes;
use ember_trainer::run_lock::{holder, DirLock};
use ember_trainer::train::{self, TrainOptions, RUN_CONFIG, SUMMARY};
use serde::{Deserialize, Serialize};

use crate::layout::{
    disk_state, read_status, read_summary, utc_now, write_json, DiskState, Invocation, Plan, PlannedRun,
    RunRecord, SweepStatus, GRID, REPORT_MD, RUNS, STATUS, STDERR_LOG, STDOUT_LOG,
};
use crate::report::{self, Report};

mod cell;
mod grid;

pub use cell::{ablate_cell, find_cell, load_plan, status_table, sweep_status, CellState, CellStatus};
pub use grid::{
    cell_count, parse_axis, parse_lrs, parse_variant, parse_variants, plan, run_config, MAX_CELLS, MAX_JOBS,
};

/// Lines of stderr kept in a failed run's record.
const TAIL_LINES: usize = 20;

/// How each run of the grid is trained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Runner {
    /// `EXE train CONFIG --set ... --run-dir DIR --quiet --json [--resume]`, `jobs` at a time.
    /// The CLI passes `std::env::current_exe()`.
    Process { exe: PathBuf },
    /// [`ember_trainer::train::train`] in this process, one run after the other (`jobs` is ignored and
    /// `train.threads` is left as the config says). For tests and embedding.
    InProcess,
}

/// Everything `ember ablate` is told. `None` fields fall back to the config's `ablation:`
/// section, then to its defaults (all four variants, 3 seeds, `train.lr` only, 1 job,
/// cores / jobs threads, `runs/<config name>-ablation`).
#[derive(Debug, Clone)]
pub struct AblateOptions {
    pub config: PathBuf,
    /// `--set KEY=VALUE` for every run (the grid's own keys win over these).
    pub overrides: Vec<String>,
    pub variants: Option<Vec<QkNorm>>,
    /// Seeds 1..=n.
    pub seeds: Option<usize>,
    pub lrs: Option<Vec<f64>>,
    /// Factorial axes, each `KEY=V1,V2,...`; given, they replace the config's `ablation.grid`.
    pub grid: Option<Vec<String>>,
    pub jobs: Option<usize>,
    /// Threads per run.
    pub threads: Option<usize>,
    pub out: Option<PathBuf>,
    pub runner: Runner,
    /// Print nothing (the outcome is returned either way).
    pub quiet: bool,
    /// Stop signals: forwarded to the running children (each stops with a checkpoint), no
    /// further run is started, and [`ablate`] ends in [`SweepInterrupted`].
    pub stop: Option<StopRequest>,
}

/// How [`ablate`] ends when a stop signal arrived: the runs it stopped are recorded as
/// interrupted (not failed), and the same command resumes them.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "ablation interrupted by {}: {interrupted} run(s) stopped with a checkpoint, {not_started} not \
     started; run the same command again to resume them (finished runs are skipped)",
    signal_name(*signal)
)]
pub struct SweepInterrupted {
    pub signal: i32,
    pub interrupted: usize,
    pub not_started: usize,
}

/// How planning ends when a stop signal arrives before the plan is complete: nothing was
/// written.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "stopped by {} while planning the sweep; nothing was written or run",
    signal_name(*signal)
)]
pub struct PlanningInterrupted {
    pub signal: i32,
}

impl AblateOptions {
    /// Options with every grid setting left to the config.
    pub fn new(config: impl Into<PathBuf>, runner: Runner) -> Self {
        Self {
            config: config.into(),
            overrides: vec![],
            variants: None,
            seeds: None,
            lrs: None,
            grid: None,
            jobs: None,
            threads: None,
            out: None,
            runner,
            quiet: false,
            stop: None,
        }
    }
}

/// What the sweep did with a run in this invocation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunAction {
    /// Started from scratch.
    Started,
    /// Continued from the newest checkpoint (the step it had reached).
    Resumed { from_step: u64 },
    /// Already finished (or diverged) in an earlier invocation: nothing was run.
    Skipped,
    /// Not run: the directory holds something else (see the status).
    Refused,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum RunStatus {
    /// Reached its last step.
    Ok,
    /// Stopped as diverged (non-finite loss, or validation loss stuck above its initial value).
    Diverged { reason: String },
    /// Crashed, or could not be run; `stderr_tail` holds the end of its error output.
    Failed { error: String, stderr_tail: String },
    /// Stopped by a signal with a checkpoint: the next invocation resumes it.
    Interrupted { signal: String },
}

impl RunStatus {
    pub fn label(&self) -> &'static str {
        match self {
            RunStatus::Ok => "ok",
            RunStatus::Diverged { .. } => "diverged",
            RunStatus::Failed { .. } => "failed",
            RunStatus::Interrupted { .. } => "interrupted",
        }
    }
}

/// One run's outcome in this invocation.
#[derive(Debug, Clone, Serialize)]
pub struct RunOutcome {
    pub name: String,
    pub variant: QkNorm,
    pub seed: u64,
    pub lr: f64,
    pub run_dir: PathBuf,
    pub action: RunAction,
    #[serde(flatten)]
    pub status: RunStatus,
    /// Seconds this invocation spent on the run (0 when skipped).
    pub wall_secs: f64,
    /// Steps reached / planned, from summary.json.
    pub steps: Option<u64>,
    pub total_steps: Option<u64>,
    pub val_loss: Option<f64>,
}

/// What [`ablate`] returns.
#[derive(Debug, Clone, Serialize)]
pub struct AblateOutcome {
    pub plan: Plan,
    pub runs: Vec<RunOutcome>,
    pub report: Report,
    pub wall_secs: f64,
}

impl AblateOutcome {
    /// Runs that crashed or could not be run (diverged runs are results, not failures).
    pub fn failed(&self) -> Vec<&RunOutcome> {
        self.runs
            .iter()
            .filter(|r| matches!(r.status, RunStatus::Failed { .. }))
            .collect()
    }

    /// Whether the command should exit non-zero.
    pub fn any_failed(&self) -> bool {
        !self.failed().is_empty()
    }
}

/// Runs (or resumes, or skips) every run of the grid, then writes the report.
pub fn ablate(opts: &AblateOptions) -> Result<AblateOutcome> {
    let started = Instant::now();
    if let Some(stop) = &opts.stop {
        stop.set_phase("stopping the planning of the sweep (nothing has been written yet)");
    }
    let plan = plan(opts)?;
    ember_trainer::run_lock::refuse_foreign_dir(&plan.out, "--out", ember_trainer::run_lock::DirKind::Sweep)?;
    // One sweep per output directory: two would train the same runs into the same directories.
    let _lock = DirLock::acquire(&plan.out, "ablation sweep")?;
    refuse_other_configs(&plan)?;
    if let Some(stop) = &opts.stop {
        stop.set_phase(
            "passing it on to the running run(s), which stop after their current step with a \
             checkpoint; no further run starts",
        );
    }
    fs::create_dir_all(plan.out.join(RUNS))
        .with_context(|| format!("creating {}", plan.out.join(RUNS).display()))?;
    write_json(&plan.out.join(GRID), &plan)?;
    say(opts.quiet, header(&plan));
    let sweep = Sweep::start(&plan, opts, started)?;
    let queue = sweep.settle_or_queue()?;
    sweep.train_queued(queue);
    let runs = sweep.finish()?;
    say(opts.quiet, summary_table(&runs, started.elapsed().as_secs_f64()));
    if let Some(signal) = opts.stop.as_ref().and_then(StopRequest::requested) {
        let interrupted = runs
            .iter()
            .filter(|r| matches!(r.status, RunStatus::Interrupted { .. }))
            .count();
        return Err(SweepInterrupted {
            signal,
            interrupted,
            not_started: plan.runs.len() - runs.len(),
        }
        .into());
    }
    let report = report::report(&plan.out)
        .context("writing the report (the runs are saved; `ember report` retries)")?;
    say(
        opts.quiet,
        format!("report: {}", plan.out.join(REPORT_MD).display()),
    );
    Ok(AblateOutcome {
        plan,
        runs,
        report,
        wall_secs: started.elapsed().as_secs_f64(),
    })
}

/// Prints a progress line unless quiet; a closed stdout (`| head`) must not stop the sweep.
fn say(quiet: bool, line: String) {
    if !quiet {
        use std::io::Write;
        let _ = writeln!(std::io::stdout(), "{line}");
    }
}

/// The first progress line: what runs, where, and how many at a time.
fn header(plan: &Plan) -> String {
    format!(
        "ablation: {} runs ({} variants × {} seeds × {} learning rates{}) of {} into {}; {} at a time{}",
        plan.runs.len(),
        plan.variants.len(),
        plan.seeds.len(),
        plan.lrs.len(),
        plan.axes
            .iter()
            .map(|a| format!(" × {} {}", a.values.len(), a.label(&plan.axes)))
            .collect::<String>(),
        plan.config.display(),
        plan.out.display(),
        plan.jobs,
        plan.threads.map_or(String::new(), |t| format!(
            ", {t} thread{} each",
            if t == 1 { "" } else { "s" }
        )),
    )
}

/// What to do with a planned run, judged from its directory.
enum Next {
    /// Nothing to train: finished or diverged earlier, or refused.
    Settled(RunAction, RunStatus),
    /// Train it, from scratch or from a checkpoint's step.
    Train { resume_from: Option<u64> },
}

fn next(plan: &Plan, run: &PlannedRun) -> Next {
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
fn refuse_other_configs(plan: &Plan) -> Result<()> {
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

/// One invocation in progress: what its runs share.
struct Sweep<'a> {
    plan: &'a Plan,
    opts: &'a AblateOptions,
    started: Instant,
    status_path: PathBuf,
    /// `status.json` as it stands, and each planned run's outcome once known.
    state: Mutex<(SweepStatus, Vec<Option<RunOutcome>>)>,
}

impl<'a> Sweep<'a> {
    /// Reads `status.json` (or starts one) and records this invocation in it.
    fn start(plan: &'a Plan, opts: &'a AblateOptions, started: Instant) -> Result<Self> {
        let status_path = plan.out.join(STATUS);
        let mut status = read_status(&plan.out);
        status.invocations.push(Invocation {
            started: utc_now(),
            wall_secs: 0.0,
            jobs: plan.jobs,
            threads: plan.threads,
            hardware: plan.hardware.clone(),
            executed: 0,
            skipped: 0,
        });
        write_json(&status_path, &status)?;
        Ok(Self {
            plan,
            opts,
            started,
            status_path,
            state: Mutex::new((status, vec![None; plan.runs.len()])),
        })
    }

    fn lock(&self) -> MutexGuard<'_, (SweepStatus, Vec<Option<RunOutcome>>)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `[ 3/12]`: run `i`'s place in the plan, for progress lines.
    fn tag(&self, i: usize) -> String {
        let total = self.plan.runs.len();
        format!("[{:>w$}/{total}]", i + 1, w = total.to_string().len())
    }

    /// Records the runs that need no training (skipped, refused) and returns the others, each
    /// with the step to resume from.
    fn settle_or_queue(&self) -> Result<VecDeque<(usize, Option<u64>)>> {
        let mut queue = VecDeque::new();
        for (i, run) in self.plan.runs.iter().enumerate() {
            match next(self.plan, run) {
                Next::Settled(action, status) => {
                    let outcome = outcome(run, action, status, 0.0);
                    say(self.opts.quiet, format!("{} {}", self.tag(i), describe(&outcome)));
                    let mut guard = self.lock();
                    record(&mut guard.0, &outcome, self.started);
                    guard.1[i] = Some(outcome);
                }
                Next::Train { resume_from } => queue.push_back((i, resume_from)),
            }
        }
        let mut guard = self.lock();
        let skipped = guard
            .1
            .iter()
            .flatten()
            .filter(|o| o.action == RunAction::Skipped)
            .count();
        if let Some(inv) = guard.0.invocations.last_mut() {
            inv.executed = queue.len();
            inv.skipped = skipped;
        }
        write_json(&self.status_path, &guard.0)?;
        Ok(queue)
    }

    /// Trains the queued runs, `jobs` at a time.
    fn train_queued(&self, queue: VecDeque<(usize, Option<u64>)>) {
        let queue = Mutex::new(queue);
        let worker = || loop {
            if self.stop_requested() {
                break; // the runs still queued stay as they are: the next invocation starts them
            }
            let Some((i, resume_from)) = queue.lock().unwrap_or_else(|e| e.into_inner()).pop_front() else {
                break;
            };
            self.train(i, resume_from);
        };
        std::thread::scope(|s| {
            for _ in 0..self.plan.jobs.min(self.plan.runs.len().max(1)) {
                s.spawn(worker);
            }
        });
    }

    fn stop_requested(&self) -> bool {
        self.opts.stop.as_ref().is_some_and(|s| s.requested().is_some())
    }

    /// Trains run `i`, recorded as running in `status.json` until its outcome replaces that.
    fn train(&self, i: usize, resume_from: Option<u64>) {
        let run = &self.plan.runs[i];
        let tag = self.tag(i);
        // Another process (`ember train`, `ember ablate --cell`) trains it now: leave it, its
        // logs and its record alone.
        if let Some(holder) = holder(&run.dir) {
            let o = outcome(
                run,
                RunAction::Refused,
                RunStatus::Failed {
                    error: format!(
                        "{} is being trained by another process ({holder}); left alone (re-run the \
                         sweep once it has finished)",
                        run.dir.display()
                    ),
                    stderr_tail: String::new(),
                },
                0.0,
            );
            say(self.opts.quiet, format!("{tag} {}", describe(&o)));
            self.lock().1[i] = Some(o);
            return;
        }
        say(
            self.opts.quiet,
            match resume_from {
                Some(step) => format!("{tag} resume   {} (from step {step})", run.name),
                None => format!("{tag} start    {}", run.name),
            },
        );
        {
            let mut guard = self.lock();
            guard.0.runs.insert(run.name.clone(), running_record(resume_from));
            let _ = write_json(&self.status_path, &guard.0);
        }
        let t0 = Instant::now();
        let st = execute(
            self.plan,
            run,
            &self.opts.runner,
            resume_from.is_some(),
            self.opts.stop.as_ref(),
        );
        let action = match resume_from {
            Some(from_step) => RunAction::Resumed { from_step },
            None => RunAction::Started,
        };
        let outcome = outcome(run, action, st, t0.elapsed().as_secs_f64());
        say(self.opts.quiet, format!("{tag} {}", describe(&outcome)));
        let mut guard = self.lock();
        record(&mut guard.0, &outcome, self.started);
        let _ = write_json(&self.status_path, &guard.0);
        guard.1[i] = Some(outcome);
    }

    /// Writes the invocation's wall time and returns the outcomes in plan order.
    fn finish(self) -> Result<Vec<RunOutcome>> {
        let (mut status, outcomes) = self.state.into_inner().unwrap_or_else(|e| e.into_inner());
        if let Some(inv) = status.invocations.last_mut() {
            inv.wall_secs = self.started.elapsed().as_secs_f64();
        }
        write_json(&self.status_path, &status)?;
        Ok(outcomes.into_iter().flatten().collect())
    }
}

/// The record of a run being trained (from scratch, or resumed from a step).
fn running_record(resume_from: Option<u64>) -> RunRecord {
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

/// Trains one run and judges the result from its summary.json.
fn execute(
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
        for f in [metrics::METRICS, metrics::METRICS_CSV] {
            let _ = fs::remove_file(run.dir.join(f));
        }
    }
    let (error, stderr_tail) = match runner {
        Runner::Process { exe } => {
            let mut args: Vec<String> = run.command[1..].to_vec();
            if resume {
                args.push("--resume".into());
            }
            let files = create_log(&run.dir.join(STDOUT_LOG))
                .and_then(|o| Ok((o, create_log(&run.dir.join(STDERR_LOG))?)));
            let result = files.and_then(|(out, err)| {
                let mut command = Command::new(exe);
                command.args(&args).stdin(Stdio::null()).stdout(out).stderr(err);
                run_child(command, stop)
            });
            let tail = tail_lines(&run.dir.join(STDERR_LOG), TAIL_LINES);
            match result {
                Ok(s) if s.success() => (
                    "exited successfully without a finished summary.json".to_string(),
                    tail,
                ),
                Ok(s) => (
                    match s.code() {
                        Some(c) => format!("exit status {c}"),
                        None => format!("killed ({s})"),
                    },
                    tail,
                ),
                Err(e) => (format!("cannot run {}: {e}", exe.display()), tail),
            }
        }
        Runner::InProcess => {
            let result = run_config(plan, run).and_then(|cfg| {
                let opts = TrainOptions {
                    resume,
                    fallback: false,
                    verbosity: Verbosity::Quiet,
                    stop: stop.cloned(),
                    ..TrainOptions::new(run.dir.clone())
                };
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| train::train(cfg, &opts)))
                    .unwrap_or_else(|p| {
                        let msg = p
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_else(|| "panic".into());
                        Err(anyhow::anyhow!("panicked: {msg}"))
                    })
            });
            match result {
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
            }
        }
    };
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

/// Runs a child `ember train` to its end, forwarding every stop signal this process receives to
/// it. The child runs in a process group of its own, so a Ctrl-C at the terminal reaches only
/// the sweep, which passes it on once: the child then stops at its next step boundary with a
/// checkpoint (a second Ctrl-C, passed on again, makes it abort).
fn run_child(mut command: Command, stop: Option<&StopRequest>) -> std::io::Result<std::process::ExitStatus> {
    use std::os::unix::process::CommandExt;
    command.process_group(0);
    // If the sweep itself dies without forwarding (kill -9), its children get SIGTERM and
    // stop with a checkpoint instead of training on as orphans. The worker thread that spawns
    // a child waits for it, so the thread's end (which is what PDEATHSIG watches) is the
    // sweep's death.
    #[cfg(target_os = "linux")]
    // SAFETY: prctl is async-signal-safe and touches only the child's own attributes.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    let mut child = command.spawn()?;
    let mut forwarded = 0;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if let Some(stop) = stop {
            let (count, signal) = (stop.count(), stop.requested());
            if let (true, Some(signal)) = (count > forwarded, signal) {
                // SAFETY: kill(2) on our own child's pid, which try_wait has not reaped yet.
                unsafe {
                    libc::kill(child.id() as libc::pid_t, signal);
                }
                forwarded = count;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The stop signal a run's `summary.json` says interrupted it, if any.
fn summary_interrupted(dir: &Path) -> Option<String> {
    read_summary(dir)?
        .get("interrupted")?
        .as_str()
        .map(str::to_string)
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
    if planned.model.vocab_size.is_none() {
        planned.model.vocab_size = stored.model.vocab_size;
    }
    if planned.model.qk_norm == QkNorm::L2
        && planned.model.qk_norm_length.is_none()
        && planned.model.qk_norm_init_scale.is_none()
    {
        planned.model.qk_norm_length = stored.model.qk_norm_length;
    }
    if planned.model.logn_attention && planned.model.logn_length.is_none() {
        planned.model.logn_length = stored.model.logn_length;
    }
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

fn outcome(run: &PlannedRun, action: RunAction, status: RunStatus, wall_secs: f64) -> RunOutcome {
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

fn describe(o: &RunOutcome) -> String {
    let skipped = o.action == RunAction::Skipped;
    match &o.status {
        RunStatus::Ok => format!(
            "{:<8} {}: {}val loss {}{}",
            if skipped { "skipped" } else { "ok" },
            o.name,
            if skipped { "finished earlier; " } else { "" },
            o.val_loss.map_or("-".into(), |v| format!("{v:.4}")),
            if skipped {
                String::new()
            } else {
                format!(", {:.1} s", o.wall_secs)
            }
        ),
        RunStatus::Interrupted { signal } => format!(
            "{:<8} {}: stopped by {signal} with a checkpoint; the next invocation resumes it",
            "stopped", o.name
        ),
        RunStatus::Diverged { reason } => format!(
            "{:<8} {}: {}{reason}",
            "diverged",
            o.name,
            if skipped { "(recorded earlier) " } else { "" }
        ),
        RunStatus::Failed { error, stderr_tail } => {
            let last = stderr_tail
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            format!(
                "{:<8} {}: {error}{}",
                "FAILED",
                o.name,
                if last.is_empty() {
                    String::new()
                } else {
                    format!(" — {last}")
                }
            )
        }
    }
}

/// Writes a run's outcome into `status.json`'s record of it.
fn record_run(status: &mut SweepStatus, o: &RunOutcome) {
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
fn record(status: &mut SweepStatus, o: &RunOutcome, started: Instant) {
    record_run(status, o);
    if let Some(inv) = status.invocations.last_mut() {
        inv.wall_secs = started.elapsed().as_secs_f64();
    }
}

/// The table printed at the end of a sweep.
pub fn summary_table(runs: &[RunOutcome], wall_secs: f64) -> String {
    let w = runs.iter().map(|r| r.name.len()).max().unwrap_or(3).max(3);
    let mut s = format!(
        "\n{:<w$}  {:<9} {:>9}  {:>10}  {:>9}\n",
        "run", "status", "steps", "val loss", "wall"
    );
    for r in runs {
        let status = match (&r.status, &r.action) {
            (RunStatus::Ok, RunAction::Skipped) => "ok (done)",
            (RunStatus::Ok, RunAction::Resumed { .. }) => "ok (res.)",
            (st, _) => st.label(),
        };
        let steps = match (r.steps, r.total_steps) {
            (Some(a), Some(b)) => format!("{a}/{b}"),
            _ => "-".into(),
        };
        s.push_str(&format!(
            "{:<w$}  {:<9} {:>9}  {:>10}  {:>9}\n",
            r.name,
            status,
            steps,
            r.val_loss.map_or("-".into(), |v| format!("{v:.4}")),
            if r.action == RunAction::Skipped {
                "-".into()
            } else {
                format!("{:.1}s", r.wall_secs)
            }
        ));
    }
    let count = |f: &dyn Fn(&RunOutcome) -> bool| runs.iter().filter(|r| f(r)).count();
    s.push_str(&format!(
        "{} runs: {} ok ({} skipped as done, {} resumed), {} diverged, {} failed; {:.1}s",
        runs.len(),
        count(&|r| r.status == RunStatus::Ok),
        count(&|r| r.status == RunStatus::Ok && r.action == RunAction::Skipped),
        count(&|r| matches!(r.action, RunAction::Resumed { .. }) && r.status == RunStatus::Ok),
        count(&|r| matches!(r.status, RunStatus::Diverged { .. })),
        count(&|r| matches!(r.status, RunStatus::Failed { .. })),
        wall_secs
    ));
    s
}

/// The last `n` lines of a text file (reads at most its last 64 KiB).
fn tail_lines(path: &Path, n: usize) -> String {
    let Ok(mut f) = fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map_or(0, |m| m.len());
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut buf = vec![];
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Creates (or truncates) a log file of a run, replacing a link put in its place rather than
/// writing into whatever it points at.
fn create_log(path: &Path) -> std::io::Result<fs::File> {
    if fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        fs::remove_file(path)?;
    }
    fs::File::create(path)
}
