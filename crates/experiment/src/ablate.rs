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
//! One submodule per job: `grid` resolves the plan ([`plan`]), `sweep` runs it ([`ablate`]),
//! `existing_runs` judges what a run directory already holds, `execute` trains one run and
//! `children` does so in a child process (forwarding stop signals), `status` keeps the outcomes
//! and their records in `status.json`, `print` writes the progress lines and tables, and `cell`
//! trains one cell of a planned sweep on its own (a Slurm array task) and reports the sweep's
//! state.

use std::path::PathBuf;

use ember_model::QkNorm;
use ember_trainer::interrupt::{signal_name, StopRequest};
use serde::{Deserialize, Serialize};

use crate::layout::Plan;
use crate::report::Report;

mod cell;
mod children;
mod execute;
mod existing_runs;
mod grid;
mod launcher;
mod print;
mod status;
mod sweep;

pub use cell::{ablate_cell, find_cell, load_plan, status_table, sweep_status, CellState, CellStatus};
pub use grid::{
    cell_count, parse_axis, parse_lrs, parse_variant, parse_variants, plan, run_config, MAX_CELLS, MAX_JOBS,
};
pub use launcher::refuse_foreign_launcher;
pub use print::summary_table;
pub use sweep::ablate;

/// How each run of the grid is trained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Runner {
    /// `EXE train CONFIG --set ... --run-dir DIR --quiet --json [--resume]`, `jobs` at a time.
    /// The CLI passes `std::env::current_exe()`.
    Process { exe: PathBuf },
    /// [`ember_trainer::train`] in this process, one run after the other (`jobs` is ignored and
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
