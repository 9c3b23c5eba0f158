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

use anyhow::{anyhow, Context, Result};

use crate::checkpoint;
use crate::config::{NonFinitePolicy, RunConfig};
use crate::evaluate::{evaluate, validate, Split, Validation};
use crate::interrupt::{signal_name, Interrupted, StopRequest};
use crate::metrics::{self, MetricsLog, Progress, Record, Verbosity};
use crate::optim::clip_grad_norm;
use crate::run_state::RunState;
use crate::setup::TrainingRun;
use crate::step::{forward_backward, micro_batches};
use crate::tensorboard::RunEvents;

// The ablation runner, its report and their tests import these through `train::`.
pub use crate::setup::{make_batcher, RUN_CONFIG};

pub use crate::options::TrainOptions;
pub use crate::summary::{Summary, SUMMARY};

/// Trains `cfg` into `opts.run_dir`: fresh, or resumed from its newest checkpoint.
pub fn train(cfg: RunConfig, opts: &TrainOptions) -> Result<Summary> {
    let started = Instant::now();
    let mut run = TrainingRun::prepare(cfg, opts)?;
    if run.already_finished {
        return already_finished(&run, opts.verbosity);
    }
    let mut state = RunState::new(&run.cfg, run.total_steps, run.resumed.as_ref(), opts.stop_after);
    // A fresh run starts a fresh log (a run killed before its first checkpoint may have left one).
    let mut log = MetricsLog::open(&run.run_dir, Some(state.resumed_from_step().unwrap_or(0)))?;
    let mut events = RunEvents::open(&run.run_dir, run.cfg.log.tensorboard, state.resumed_from_step())?;
    let progress = Progress::new(run.total_steps, state.step(), opts.verbosity);
    announce(&run, &state, &progress);
    if state.needs_initial_val_loss() {
        let initial = evaluate(&run.model, &run.data, &run.cfg, Split::Valid, &run.device)?;
        state.set_initial_val_loss(initial.loss);
    }

    while state.step() < run.total_steps {
        if let Some(signal) = opts.stop.as_ref().and_then(StopRequest::requested) {
            progress.finish();
            return Err(interrupted(&run, &mut state, signal, started));
        }
        if state.stop_requested() {
            save_unless_saved(&run, &state)?;
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
            // Attention telemetry on every step that logs, the last one included. The kernel
            // measures it in the pass that computes the output, so measuring changes no value: a
            // 30-step run extended to 60 ends with the weights of a 60-step run (tested).
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
            events.train(&record, &out.attention)?;
            log.write(&Record::Train(record))?;
        }
        if state.is_eval_step() {
            let validation = validate_keeping_the_step(&run, &state, &progress)?;
            progress.line(&format!("step {step}: {validation}"));
            let record = state.record_eval(&validation);
            events.eval(&record)?;
            log.write(&Record::Eval(record))?;
        }
        state.check_skipped();
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

/// The run's opening lines: what trains, the config's warnings, where it resumes.
fn announce(run: &TrainingRun, state: &RunState, progress: &Progress) {
    progress.line(&run.describe());
    for note in &run.notes {
        progress.warn(note);
    }
    if let Some(s) = state.resumed_from_step() {
        progress.line(&format!("resuming after step {s}"));
    }
}

/// Stops as an interruption would, with the newest state on disk (saved only once).
fn save_unless_saved(run: &TrainingRun, state: &RunState) -> Result<()> {
    if checkpoint::list(&run.run_dir).last().map(|(s, _)| *s) != Some(state.step()) {
        save_checkpoint(run, state)?;
    }
    Ok(())
}

/// Validates after the step just recorded; if validation fails, the step's training is done
/// and is saved before the failure is reported.
fn validate_keeping_the_step(run: &TrainingRun, state: &RunState, progress: &Progress) -> Result<Validation> {
    let e = match validate(&run.model, &run.data, &run.cfg, &run.device) {
        Ok(v) => return Ok(v),
        Err(e) => e,
    };
    progress.finish();
    let step = state.step();
    Err(e.context(match save_checkpoint(run, state) {
        Ok(dir) => format!(
            "validating after step {step} (the step is saved in {}; fix the cause and resume with --resume)",
            dir.display()
        ),
        Err(s) => format!("validating after step {step} (saving its checkpoint failed too: {s:#})"),
    }))
}

/// `--resume` of a run that already reached its last step: say so, change nothing, and return
/// the summary it ended with.
fn already_finished(run: &TrainingRun, verbosity: Verbosity) -> Result<Summary> {
    let step = run.total_steps;
    if verbosity == Verbosity::Normal {
        println!(
            "{} already finished its {step} steps; nothing to do (nothing was changed). To train \
             longer, resume with --set train.steps=N for N > {step}.",
            run.run_dir.display()
        );
    }
    let path = run.run_dir.join(SUMMARY);
    let saved = fs::read_to_string(&path)
        .ok()
        .and_then(|t| serde_json::from_str::<Summary>(&t).ok());
    Ok(saved.unwrap_or_else(|| {
        let state = RunState::new(&run.cfg, run.total_steps, run.resumed.as_ref(), None);
        state.summary(&run.run_dir, run.params.num_params(), 0.0)
    }))
}

/// Ends the run at a stop signal: the step in progress has completed, so checkpoint it (unless
/// the newest checkpoint already holds it), write a summary marked interrupted, and return the
/// error that tells the user how to resume.
fn interrupted(run: &TrainingRun, state: &mut RunState, signal: i32, started: Instant) -> anyhow::Error {
    let step = state.step();
    let newest = checkpoint::list(&run.run_dir).last().cloned();
    let checkpoint = match newest {
        Some((s, dir)) if s == step => Some(dir),
        _ if step == 0 => None,
        _ => match save_checkpoint(run, state) {
            Ok(dir) => Some(dir),
            Err(e) => {
                return e.context(format!(
                    "saving the checkpoint of step {step} after {}",
                    signal_name(signal)
                ))
            }
        },
    };
    state.mark_interrupted(signal_name(signal));
    if let Err(e) = write_summary(run, state, started) {
        return e;
    }
    anyhow::Error::new(Interrupted {
        signal,
        step,
        checkpoint,
        run_dir: run.run_dir.clone(),
    })
}

/// Checkpoints the run as it stands, prunes older checkpoints (keeping the best) and refreshes
/// `metrics.csv`, so the CSV is current whenever a checkpoint is.
fn save_checkpoint(run: &TrainingRun, state: &RunState) -> Result<PathBuf> {
    let mut ckpt = state.checkpoint_state(&run.cfg, run.batcher.cursor(), run.opt.step);
    ckpt.tokenizer_sha256 = Some(run.identity.tokenizer_sha256.clone());
    ckpt.data_fingerprint = Some(run.identity.data_fingerprint.clone());
    let dir = checkpoint::save(
        &run.run_dir,
        ckpt,
        &run.params,
        &run.opt.state_tensors()?,
        &run.config_yaml,
    )?;
    checkpoint::prune(&run.run_dir, run.cfg.checkpoint.keep_last, state.best_step())?;
    metrics::export_csv(&run.run_dir)?;
    Ok(dir)
}

/// Writes `summary.json` (and `metrics.csv`) and returns the summary.
fn write_summary(run: &TrainingRun, state: &RunState, started: Instant) -> Result<Summary> {
    let summary = state.summary(
        &run.run_dir,
        run.params.num_params(),
        started.elapsed().as_secs_f64(),
    );
    metrics::export_csv(&run.run_dir)?;
    let path = run.run_dir.join(SUMMARY);
    crate::files::write_atomic(&path, serde_json::to_string_pretty(&summary)?.as_bytes())
        .with_context(|| format!("writing {}", path.display()))?;
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
