//! The training loop — one for both architectures.
//!
//! A step draws `train.accumulation` micro-batches, runs forward and backward on each
//! ([`crate::step`]), checks and clips the global gradient norm, and applies AdamW. Everything
//! random derives from the run seed, the step and the micro-batch index, so the same config
//! gives bit-identical losses, and a resumed run continues exactly as if never stopped.
//!
//! Set-up is in [`crate::setup`], validation in [`crate::evaluate`](mod@crate::evaluate), and
//! the bookkeeping (what to log, when to evaluate and checkpoint, best and divergence) in
//! `run_state`.

use std::fs;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{anyhow, Result};
use serde::Serialize;

use crate::checkpoint::{self, Best};
use crate::config::{NonFinitePolicy, RunConfig};
use crate::evaluate::{evaluate, validate, Split};
use crate::metrics::{self, MetricsLog, Progress, Record, Verbosity};
use crate::optim::clip_grad_norm;
use crate::run_state::RunState;
use crate::setup::TrainingRun;
use crate::step::{forward_backward, micro_batches};

// The ablation runner, its report and their tests import these through `train::`.
pub use crate::setup::{make_batcher, RUN_CONFIG};

/// The run directory's [`Summary`], written when the run ends.
pub const SUMMARY: &str = "summary.json";

/// How `train` is invoked (everything that is not part of the config).
#[derive(Debug, Clone)]
pub struct TrainOptions {
    pub run_dir: PathBuf,
    /// Continue from the newest complete checkpoint in `run_dir`.
    pub resume: bool,
    /// With `resume`: if the newest checkpoint is corrupt, use the newest good one instead of stopping.
    pub fallback: bool,
    pub verbosity: Verbosity,
    /// Stop (with a checkpoint) after this many steps of this invocation, as an interruption would.
    pub stop_after: Option<u64>,
}

/// What a run reports when it ends; also written to `summary.json`.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub run_dir: PathBuf,
    pub steps: u64,
    pub total_steps: u64,
    /// Whether the run reached `total_steps` (false after `stop_after`).
    pub finished: bool,
    pub params: usize,
    /// Training objective per token over the last logging window.
    pub final_train_loss: Option<f64>,
    pub val_loss: Option<f64>,
    pub val_ppl: Option<f64>,
    pub best: Option<Best>,
    pub skipped_steps: u64,
    /// Median over logged windows of target tokens per second.
    pub tokens_per_sec: f64,
    /// Wall time of this invocation.
    pub wall_secs: f64,
    /// Training time over all invocations of the run.
    pub train_secs: f64,
    pub resumed_from_step: Option<u64>,
    /// Why the run stopped early as diverged (non-finite values, or validation loss stuck above
    /// its initial value); `None` for a healthy run.
    pub diverged: Option<String>,
}

/// Trains `cfg` into `opts.run_dir`: fresh, or resumed from its newest checkpoint.
pub fn train(cfg: RunConfig, opts: &TrainOptions) -> Result<Summary> {
    let started = Instant::now();
    let mut run = TrainingRun::prepare(cfg, opts)?;
    let mut state = RunState::new(&run.cfg, run.total_steps, run.resumed.as_ref(), opts.stop_after);
    // A fresh run starts a fresh log (a run killed before its first checkpoint may have left one).
    let mut log = MetricsLog::open(&run.run_dir, Some(state.resumed_from_step().unwrap_or(0)))?;
    let progress = Progress::new(run.total_steps, state.step(), opts.verbosity);
    progress.line(&run.describe());
    if let Some(s) = state.resumed_from_step() {
        progress.line(&format!("resuming after step {s}"));
    }
    if state.needs_initial_val_loss() {
        let initial = evaluate(&run.model, &run.data, &run.cfg, Split::Valid, &run.device)?;
        state.set_initial_val_loss(initial.loss);
    }

    while state.step() < run.total_steps {
        if state.stop_requested() {
            // Stop as an interruption would, with the newest state on disk (saved only once).
            if checkpoint::list(&run.run_dir).last().map(|(s, _)| *s) != Some(state.step()) {
                save_checkpoint(&run, &state)?;
            }
            break;
        }
        let step = state.step() + 1;
        let epoch = run.batcher.cursor().epoch;
        let batches = micro_batches(run.batcher.as_mut(), run.cfg.train.accumulation);
        let log_now = state.is_log_step(step);
        let t0 = Instant::now();
        let out = forward_backward(
            &run.model,
            run.opt.params(),
            &batches,
            &run.cfg.train,
            &run.device,
            step,
            log_now,
        )?;
        let grads = clip_grad_norm(run.opt.params(), &out.grads, run.cfg.train.clip_grad_norm)?;
        let lr = run.schedule.at(step);
        match (out.non_finite(&grads), run.cfg.train.on_nonfinite) {
            (None, _) => run.opt.step(&out.grads, lr, grads.scale)?,
            (Some(what), NonFinitePolicy::Skip) => {
                let skipped = state.skip_update();
                progress.line(&format!("step {step}: {what}; update skipped ({skipped} so far)"));
            }
            (Some(what), NonFinitePolicy::Stop) => {
                progress.finish();
                let reason = format!("step {step}: {what}");
                return Err(stop_non_finite(&run, &mut state, reason, started));
            }
        }
        state.record(&out, grads.norm, t0.elapsed().as_secs_f64());

        if log_now {
            let record = state.train_record(epoch, lr, &out.attention);
            progress.train(&record, run.total_steps);
            log.write(&Record::Train(record))?;
        }
        if state.is_eval_step() {
            let validation = validate(&run.model, &run.data, &run.cfg, &run.device)?;
            progress.line(&format!("step {step}: {validation}"));
            log.write(&Record::Eval(state.record_eval(&validation)))?;
        }
        if state.checkpoint_due() {
            save_checkpoint(&run, &state)?;
        }
        if let Some(reason) = state.diverged() {
            progress.line(&format!("stopping: diverged at {reason}"));
            break;
        }
    }
    progress.finish();
    write_summary(&run, &state, started)
}

/// Checkpoints the run as it stands, prunes older checkpoints (keeping the best) and refreshes
/// `metrics.csv`, so the CSV is current whenever a checkpoint is.
fn save_checkpoint(run: &TrainingRun, state: &RunState) -> Result<()> {
    let ckpt = state.checkpoint_state(&run.cfg, run.batcher.cursor(), run.opt.step);
    checkpoint::save(
        &run.run_dir,
        ckpt,
        &run.params,
        &run.opt.state_tensors()?,
        &run.config_yaml,
    )?;
    checkpoint::prune(&run.run_dir, run.cfg.checkpoint.keep_last, state.best_step())?;
    metrics::export_csv(&run.run_dir)
}

/// Writes `summary.json` (and `metrics.csv`) and returns the summary.
fn write_summary(run: &TrainingRun, state: &RunState, started: Instant) -> Result<Summary> {
    let summary = state.summary(
        &run.run_dir,
        run.params.num_params(),
        started.elapsed().as_secs_f64(),
    );
    metrics::export_csv(&run.run_dir)?;
    fs::write(run.run_dir.join(SUMMARY), serde_json::to_string_pretty(&summary)?)?;
    Ok(summary)
}

/// Ends the run at a non-finite step (`train.on_nonfinite: stop`): `summary.json` records why,
/// and the error says what is intact and what to change.
fn stop_non_finite(
    run: &TrainingRun,
    state: &mut RunState,
    reason: String,
    started: Instant,
) -> anyhow::Error {
    state.mark_diverged(reason.clone());
    if let Err(e) = write_summary(run, state, started) {
        return e;
    }
    anyhow!(
        "{reason}; the update was not applied and nothing was saved for this step. \
         The newest checkpoint ({}) is intact. Lower train.lr, keep train.clip_grad_norm, \
         or set train.on_nonfinite: skip to skip such steps.",
        checkpoint::list(&run.run_dir)
            .last()
            .map_or("none yet".into(), |(_, d)| d.display().to_string())
    )
}
