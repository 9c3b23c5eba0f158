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

use crate::say;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{anyhow, Context, Result};

use ember_distributed::World;
use ember_model::AttentionStats;

use crate::checkpoint;
use crate::config::RunConfig;
use crate::data_parallel::DataParallel;
use crate::evaluate::{validate, validation_loss, Validation};
use crate::interrupt::{signal_name, Interrupted, StopRequest};
use crate::metrics::{self, EvalRecord, MetricsLog, Progress, Record, TrainRecord, Verbosity};
use crate::run_state::RunState;
use crate::setup::TrainingRun;
use crate::step::micro_batches;
use crate::tensorboard::RunEvents;
use crate::update::Outcome;

// The ablation runner, its report and their tests import these through `train::`.
pub use crate::setup::{make_batcher, RUN_CONFIG};

pub use crate::options::TrainOptions;
pub use crate::summary::{Summary, SUMMARY};

/// Trains `cfg` into `opts.run_dir`: fresh, or resumed from its newest checkpoint. As one rank
/// of a data-parallel job (`opts.world`), it trains its share of every batch; rank 0 alone
/// writes the run directory and prints.
pub fn train(cfg: RunConfig, opts: &TrainOptions) -> Result<Summary> {
    let started = Instant::now();
    let dp = DataParallel::new(opts.world.clone(), cfg.shares(), cfg.distributed.bucket_mib);
    let leader = dp.is_leader();
    let mut run = prepare_in_turn(&dp, cfg, opts)?;
    if run.already_finished {
        return already_finished(&run, opts.verbosity);
    }
    let mut state = RunState::new(&run.cfg, run.total_steps, run.resumed.as_ref(), opts.stop_after);
    let mut out = Outputs::open(&run, &state, opts, leader)?;
    if leader {
        announce(&run, &state, &out.progress, dp.world());
    }
    let phase = |what: String| {
        if let Some(stop) = &opts.stop {
            stop.set_phase(what);
        }
    };
    if state.needs_initial_val_loss() {
        phase(format!(
            "stopping after the validation before step {} (a few seconds), {}",
            state.step() + 1,
            match state.resumed_from_step() {
                Some(s) => format!("then keeping the checkpoint of step {s}"),
                None => "then ending with nothing saved (no step has been trained yet)".to_string(),
            }
        ));
        let initial = validation_loss(&run.model, &run.data, &run.cfg, &run.device, &dp, state.step())?;
        state.set_initial_val_loss(initial.loss);
    }
    // A job agrees on its stop signal inside each step (any rank's signal stops all of them after
    // that step); a lone process checks before each step.
    let mut agreed_stop = None;
    phase("stopping after the step in progress, with a checkpoint".into());

    while state.step() < run.total_steps {
        let local_stop = opts.stop.as_ref().and_then(StopRequest::requested);
        if let Some(signal) = agreed_stop.or(local_stop.filter(|_| !dp.world().is_launched())) {
            out.progress.finish();
            settle(&mut run, &mut state, &dp, &mut out, started)?;
            return Err(interrupted(&run, &mut state, &dp, signal, started));
        }
        if state.stop_requested() {
            settle(&mut run, &mut state, &dp, &mut out, started)?;
            save_unless_saved(&run, &state, &dp)?;
            break;
        }
        let step = state.step() + 1;
        let epoch = run.batcher.cursor().epoch;
        let batches = micro_batches(run.batcher.as_mut(), run.cfg.train.accumulation);
        let log_now = state.is_log_step(step);
        let t0 = Instant::now();
        let reduced = dp.forward_backward(
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
            local_stop,
        )?;
        agreed_stop = reduced.stop;
        let step_out = reduced.out;
        let lr = run.schedule.at(step);
        let spike = state.spike_loss();
        let outcome = run
            .updater
            .update(&mut run.opt, &step_out, lr, step, spike, &run.cfg.train)?;
        let secs = t0.elapsed().as_secs_f64();
        match outcome {
            Outcome::Judged {
                loss,
                nll,
                grad_norm,
                skipped,
            } => {
                if let Some(what) = skipped {
                    let skipped = state.skip_update();
                    out.progress
                        .line(&format!("step {step}: {what}; update skipped ({skipped} so far)"));
                }
                state.record(step_out.tokens, secs, Some((loss, nll, grad_norm)));
            }
            Outcome::Stop(what) => {
                out.progress.finish();
                let reason = format!("step {step}: {what}");
                return Err(stop_non_finite(&run, &mut state, &dp, reason, started));
            }
            Outcome::Pending => state.record(step_out.tokens, secs, None),
        }
        // A step judged on the device is known to the host from here on: whatever follows
        // (the record, validation, a checkpoint, the end) reads it.
        if log_now || state.is_eval_step() || state.checkpoint_due() {
            settle(&mut run, &mut state, &dp, &mut out, started)?;
        }

        if state.is_eval_step() {
            // Said before the step's record is written: whoever sees the record and stops the
            // run is told the evaluation comes first.
            phase(format!(
                "stopping after this evaluation (step {step} is trained), with a checkpoint of step {step}"
            ));
        }
        if log_now {
            let record = state.train_record(epoch, lr, &step_out.attention);
            out.train(record, &step_out.attention, run.total_steps)?;
        }
        if state.is_eval_step() {
            let validation = validate_keeping_the_step(&run, &state, &dp, &out.progress)?;
            phase("stopping after the step in progress, with a checkpoint".into());
            out.progress.line(&format!("step {step}: {validation}"));
            let record = state.record_eval(&validation);
            out.eval(record)?;
        }
        state.check_skipped();
        if state.checkpoint_due() {
            save_checkpoint(&run, &state, &dp)?;
        }
        if let Some(reason) = state.diverged() {
            out.progress.line(&format!("stopping: diverged at {reason}"));
            break;
        }
    }
    settle(&mut run, &mut state, &dp, &mut out, started)?;
    out.progress.finish();
    write_summary(&run, &state, &dp, started)
}

/// Sets the run up on rank 0 first (it writes the run directory: tokenizer, token cache,
/// config), then on the others, which read what it wrote. Every rank learns whether all
/// succeeded, so a failure on one ends the job instead of leaving the others waiting.
fn prepare_in_turn(dp: &DataParallel, cfg: RunConfig, opts: &TrainOptions) -> Result<TrainingRun> {
    let world = dp.world();
    if world.size() == 1 {
        return TrainingRun::prepare(cfg, opts);
    }
    // The lowest failing rank, agreed by all (each proposes itself if it failed).
    let first_failure = |ok: bool, what: &str| -> Option<usize> {
        let mut failed = [if ok { 0 } else { -(world.rank() as i64) - 1 }];
        world.all_reduce_max_i64(&mut failed, what);
        (failed[0] < 0).then(|| (-failed[0] - 1) as usize)
    };
    let leader_run = world.is_leader().then(|| TrainingRun::prepare(cfg.clone(), opts));
    let leader_ok = leader_run.as_ref().is_none_or(|r| r.is_ok());
    let leader_failed = first_failure(leader_ok, "the set-up of rank 0");
    let run = match leader_failed {
        Some(_) => leader_run.unwrap_or_else(|| Err(anyhow!("rank 0 could not set the run up"))),
        None => leader_run.unwrap_or_else(|| TrainingRun::prepare(cfg, opts)),
    };
    let failed = match leader_failed {
        Some(rank) => Some(rank),
        None => first_failure(run.is_ok(), "the set-up of every rank"),
    };
    match (run, failed) {
        (run, None) => run,
        // Every rank ends: the one that failed with its own error, marked as agreed, the others
        // quietly with a RankFailed.
        (Err(e), Some(rank)) if rank == world.rank() => Err(e.context(RankFailed(rank))),
        (_, Some(rank)) => Err(anyhow!(RankFailed(rank))),
    }
}

/// A rank could not set the run up, and every rank knows: the failing rank's own error carries
/// it as context (and is printed), the others end quietly with it.
#[derive(Debug)]
pub struct RankFailed(pub usize);

impl std::fmt::Display for RankFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rank {} could not set the run up; every rank stops", self.0)
    }
}

impl std::error::Error for RankFailed {}

/// Where the run reports: the progress display, `metrics.jsonl` and TensorBoard events, all
/// on rank 0 only (the other ranks' display is silent and they write nothing).
struct Outputs {
    progress: Progress,
    log: Option<MetricsLog>,
    events: Option<RunEvents>,
}

impl Outputs {
    fn open(run: &TrainingRun, state: &RunState, opts: &TrainOptions, leader: bool) -> Result<Self> {
        if !leader {
            return Ok(Outputs {
                progress: Progress::plain(Verbosity::Quiet),
                log: None,
                events: None,
            });
        }
        // A fresh run starts a fresh log (a run killed before its first checkpoint may have left one).
        let log = MetricsLog::open(&run.run_dir, Some(state.resumed_from_step().unwrap_or(0)))?;
        let events = RunEvents::open(&run.run_dir, run.cfg.log.tensorboard, state.resumed_from_step())?;
        let progress = if opts.world.size() > 1 {
            Progress::plain(opts.verbosity)
        } else {
            Progress::new(run.total_steps, state.step(), opts.verbosity)
        };
        Ok(Outputs {
            progress,
            log: Some(log),
            events: Some(events),
        })
    }

    fn train(&mut self, record: TrainRecord, attention: &[AttentionStats], total: u64) -> Result<()> {
        self.progress.train(&record, total);
        if let (Some(log), Some(events)) = (&mut self.log, &mut self.events) {
            events.train(&record, attention)?;
            log.write(&Record::Train(record))?;
        }
        Ok(())
    }

    fn eval(&mut self, record: EvalRecord) -> Result<()> {
        if let (Some(log), Some(events)) = (&mut self.log, &mut self.events) {
            events.eval(&record)?;
            log.write(&Record::Eval(record))?;
        }
        Ok(())
    }
}

/// The run's opening lines: what trains, the config's warnings, where it resumes.
fn announce(run: &TrainingRun, state: &RunState, progress: &Progress, world: &World) {
    progress.line(&run.describe());
    if world.size() > 1 {
        progress.line(&format!(
            "data parallel: {} ranks (started by {}), each training 1/{} of every batch",
            world.size(),
            world.launcher().unwrap_or("a launcher"),
            world.size()
        ));
    }
    for note in &run.notes {
        progress.warn(note);
    }
    if let Some(s) = state.resumed_from_step() {
        progress.line(&format!("resuming after step {s}"));
    }
}

/// Brings the host up to date with the steps the device judged (nothing to do when the host
/// judges them): their losses join the logging window, skipped steps are reported, and a step
/// that stops the run under `train.on_nonfinite: stop` ends it here, with nothing saved after it.
fn settle(
    run: &mut TrainingRun,
    state: &mut RunState,
    dp: &DataParallel,
    out: &mut Outputs,
    started: Instant,
) -> Result<()> {
    let Some(s) = run.updater.settle(&mut run.opt)? else {
        return Ok(());
    };
    state.settle(&s);
    if let Some((step, what)) = &s.first_bad {
        if s.skipped > 0 {
            let also = match s.skipped {
                1 => String::new(),
                n => format!(" and {} later step(s) before step {}", n - 1, state.step()),
            };
            out.progress.line(&format!(
                "step {step}: {what}; update skipped{also} ({} so far)",
                s.skipped_total
            ));
        }
    }
    if let Some((bad, what)) = s.stopped {
        out.progress.finish();
        let held = state.step() - bad;
        let reason = if held == 0 {
            format!("step {bad}: {what}")
        } else {
            format!(
                "step {bad}: {what} (learnt at step {}; the {held} step(s) after it applied no update)",
                state.step()
            )
        };
        return Err(stop_non_finite(run, state, dp, reason, started));
    }
    Ok(())
}

/// Stops as an interruption would, with the newest state on disk (saved only once).
fn save_unless_saved(run: &TrainingRun, state: &RunState, dp: &DataParallel) -> Result<()> {
    if checkpoint::list(&run.run_dir).last().map(|(s, _)| *s) != Some(state.step()) {
        save_checkpoint(run, state, dp)?;
    }
    Ok(())
}

/// Validates after the step just recorded; if validation fails, the step's training is done
/// and is saved before the failure is reported.
fn validate_keeping_the_step(
    run: &TrainingRun,
    state: &RunState,
    dp: &DataParallel,
    progress: &Progress,
) -> Result<Validation> {
    let e = match validate(&run.model, &run.data, &run.cfg, &run.device, dp, state.step()) {
        Ok(v) => return Ok(v),
        Err(e) => e,
    };
    progress.finish();
    let step = state.step();
    Err(e.context(match save_checkpoint(run, state, dp) {
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
        say!(
            "{} already finished its {step} steps; nothing to do (nothing was changed). To train \
             longer, resume with --set train.steps=N for N > {step}.",
            run.run_dir.display()
        );
    }
    let path = run.run_dir.join(SUMMARY);
    let saved = ember_data::io::read_own_to_string(&path)
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
fn interrupted(
    run: &TrainingRun,
    state: &mut RunState,
    dp: &DataParallel,
    signal: i32,
    started: Instant,
) -> anyhow::Error {
    let step = state.step();
    let newest = checkpoint::list(&run.run_dir).last().cloned();
    let checkpoint = match newest {
        Some((s, dir)) if s == step => Some(dir),
        _ if step == 0 => None,
        _ => match save_checkpoint(run, state, dp) {
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
    if let Err(e) = write_summary(run, state, dp, started) {
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
/// `metrics.csv`, so the CSV is current whenever a checkpoint is. In a job every rank first
/// checks that all hold the same weights; rank 0 writes.
fn save_checkpoint(run: &TrainingRun, state: &RunState, dp: &DataParallel) -> Result<PathBuf> {
    if dp.world().size() > 1 {
        dp.agreed_weights_sha256(run.opt.params(), state.step())?;
    }
    let dir = checkpoint::dir_for(&run.run_dir, state.step());
    if !dp.is_leader() {
        return Ok(dir);
    }
    // `ember average` reads the checkpoints under this lock: none is pruned while it reads.
    let _writing = checkpoint::lock_for_writing(&run.run_dir)?;
    let mut ckpt = state.checkpoint_state(&run.cfg, run.batcher.cursor(), run.opt.step);
    ckpt.tokenizer_sha256 = Some(run.identity.tokenizer_sha256.clone());
    ckpt.data_fingerprint = Some(run.identity.data_fingerprint.clone());
    ckpt.shares = dp.shares_per_batch();
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

/// Writes `summary.json` (and `metrics.csv`) and returns the summary; in a job, with the
/// world size and the weights' SHA-256 all ranks agreed on. Rank 0 writes.
fn write_summary(
    run: &TrainingRun,
    state: &RunState,
    dp: &DataParallel,
    started: Instant,
) -> Result<Summary> {
    let mut summary = state.summary(
        &run.run_dir,
        run.params.num_params(),
        started.elapsed().as_secs_f64(),
    );
    if dp.world().size() > 1 {
        summary.world_size = Some(dp.world().size());
        summary.weights_sha256 = Some(dp.agreed_weights_sha256(run.opt.params(), state.step())?);
    }
    if !dp.is_leader() {
        return Ok(summary);
    }
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
    dp: &DataParallel,
    reason: String,
    started: Instant,
) -> anyhow::Error {
    state.mark_diverged(reason.clone());
    if let Err(e) = write_summary(run, state, dp, started) {
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
