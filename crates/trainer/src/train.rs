//! The training loop — one for both architectures.
//!
//! A step draws `train.accumulation` micro-batches, runs forward and backward on each
//! ([`crate::step`]), checks and clips the global gradient norm, and applies AdamW. Everything
//! random derives from the run seed, the step and the micro-batch index, so the same config
//! gives bit-identical losses, and a resumed run continues exactly as if never stopped.
//!
//! Set-up is in `setup`, the step itself in `training` (shared with `ember bench`), validation
//! in `evaluate`, and the bookkeeping (what to log, when to evaluate and checkpoint, best and
//! divergence) in `run_state`.

use crate::say;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{anyhow, Result};

use ember_distributed::World;
use ember_model::AttentionStats;

use crate::checkpoint;
use crate::config::RunConfig;
use crate::data_parallel::DataParallel;
use crate::eval::evaluate::{validate, validation_loss, Validation};
use crate::interrupt::{signal_name, Interrupted, StopRequest};
use crate::metrics::{self, EvalRecord, MetricsLog, Progress, Record, TrainRecord, Verbosity};
use crate::output::summary::Summary;
use crate::run::options::TrainOptions;
use crate::run::run_state::RunState;
use crate::run_dir::SUMMARY;
use crate::setup::TrainingRun;
use crate::step::training::Stepped;
use crate::tensorboard::RunEvents;
use crate::update::Outcome;

/// Trains `cfg` into `opts.run_dir`: fresh, or resumed from its newest checkpoint. As one rank
/// of a data-parallel job (`opts.world`), it trains its share of every batch; rank 0 alone
/// writes the run directory and prints.
pub fn train(cfg: RunConfig, opts: &TrainOptions) -> Result<Summary> {
    let started = Instant::now();
    let dp = DataParallel::new(opts.world.clone(), cfg.shares(), cfg.distributed.bucket_mib);
    let mut run = prepare_in_turn(&dp, cfg, opts)?;
    if run.already_finished {
        return already_finished(&run, opts.verbosity);
    }
    let (cfg, total_steps) = (&run.training.cfg, run.training.total_steps);
    let mut state = RunState::new(cfg, total_steps, run.resumed.as_ref(), opts.stop_after);
    let mut out = Outputs::open(&run, &state, opts, dp.is_leader())?;
    if dp.is_leader() {
        announce(&run, &state, &out.progress, dp.world());
    }
    let phase = Phase(opts.stop.as_ref());
    if state.needs_initial_val_loss() {
        initial_validation(&run, &mut state, &dp, &phase)?;
    }
    // A job agrees on its stop signal inside each step (any rank's signal stops all of them after
    // that step); a lone process checks before each step.
    let mut agreed_stop = None;
    phase.set("stopping after the step in progress, with a checkpoint".into());

    while state.step() < total_steps {
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
        let epoch = run.training.batcher.cursor().epoch;
        // Attention telemetry on every step that logs, the last one included. The kernel
        // measures it in the pass that computes the output, so measuring changes no value: a
        // 30-step run extended to 60 ends with the weights of a 60-step run (tested).
        let log_now = state.is_log_step(step);
        let stepped = run
            .training
            .step(&dp, step, log_now, state.spike_loss(), local_stop)?;
        agreed_stop = stepped.stop;
        record_step(&run, &mut state, &dp, &mut out, &stepped, started)?;
        // A step judged on the device is known to the host from here on: whatever follows
        // (the record, validation, a checkpoint, the end) reads it.
        if log_now || state.is_eval_step() || state.checkpoint_due() {
            settle(&mut run, &mut state, &dp, &mut out, started)?;
        }
        log_and_validate(&run, &mut state, &dp, &mut out, &phase, epoch, &stepped)?;
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

/// What stopping now means, told to the stop signals (when connected) as the run moves on.
struct Phase<'a>(Option<&'a StopRequest>);

impl Phase<'_> {
    fn set(&self, what: String) {
        if let Some(stop) = self.0 {
            stop.set_phase(what);
        }
    }
}

/// The validation loss at initialisation, which divergence detection compares against.
fn initial_validation(
    run: &TrainingRun,
    state: &mut RunState,
    dp: &DataParallel,
    phase: &Phase,
) -> Result<()> {
    phase.set(format!(
        "stopping after the validation before step {} (a few seconds), {}",
        state.step() + 1,
        match state.resumed_from_step() {
            Some(s) => format!("then keeping the checkpoint of step {s}"),
            None => "then ending with nothing saved (no step has been trained yet)".to_string(),
        }
    ));
    let t = &run.training;
    let initial = validation_loss(&t.model, &t.data, &t.cfg, &t.device, dp, state.step())?;
    state.set_initial_val_loss(initial.loss);
    Ok(())
}

/// Records the step just trained: its tokens and time, and its losses where the host judged
/// them; a skipped update is reported, and a step that stops the run under
/// `train.on_nonfinite: stop` ends it here.
fn record_step(
    run: &TrainingRun,
    state: &mut RunState,
    dp: &DataParallel,
    out: &mut Outputs,
    stepped: &Stepped,
    started: Instant,
) -> Result<()> {
    let secs = stepped.began.elapsed().as_secs_f64();
    let step = state.step() + 1;
    let tokens = stepped.out.tokens;
    match &stepped.outcome {
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
            state.record(tokens, secs, Some((*loss, *nll, *grad_norm)));
        }
        Outcome::Stop(what) => {
            out.progress.finish();
            let reason = format!("step {step}: {what}");
            return Err(stop_non_finite(run, state, dp, reason, started));
        }
        Outcome::Pending => state.record(tokens, secs, None),
    }
    Ok(())
}

/// Logs the step just recorded (on a logging step) and validates after it (on an evaluation
/// step).
fn log_and_validate(
    run: &TrainingRun,
    state: &mut RunState,
    dp: &DataParallel,
    out: &mut Outputs,
    phase: &Phase,
    epoch: u64,
    stepped: &Stepped,
) -> Result<()> {
    let step = state.step();
    if state.is_eval_step() {
        // Said before the step's record is written: whoever sees the record and stops the
        // run is told the evaluation comes first.
        phase.set(format!(
            "stopping after this evaluation (step {step} is trained), with a checkpoint of step {step}"
        ));
    }
    if state.is_log_step(step) {
        let attention = &stepped.out.attention;
        let record = state.train_record(epoch, stepped.lr, attention);
        out.train(record, attention, run.training.total_steps)?;
    }
    if state.is_eval_step() {
        let validation = validate_keeping_the_step(run, state, dp, &out.progress)?;
        phase.set("stopping after the step in progress, with a checkpoint".into());
        out.progress.line(&format!("step {step}: {validation}"));
        let record = state.record_eval(&validation);
        out.eval(record)?;
    }
    Ok(())
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
        let events = RunEvents::open(
            &run.run_dir,
            run.training.cfg.log.tensorboard,
            state.resumed_from_step(),
        )?;
        let progress = if opts.world.size() > 1 {
            Progress::plain(opts.verbosity)
        } else {
            Progress::new(run.training.total_steps, state.step(), opts.verbosity)
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
    let Some(s) = run.training.updater.settle(&mut run.training.opt)? else {
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
    let e = match validate(
        &run.training.model,
        &run.training.data,
        &run.training.cfg,
        &run.training.device,
        dp,
        state.step(),
    ) {
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
    let step = run.training.total_steps;
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
        let state = RunState::new(
            &run.training.cfg,
            run.training.total_steps,
            run.resumed.as_ref(),
            None,
        );
        state.summary(&run.run_dir, run.training.params.num_params(), 0.0)
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
        dp.agreed_weights_sha256(run.training.opt.params(), state.step())?;
    }
    let dir = checkpoint::dir_for(&run.run_dir, state.step());
    if !dp.is_leader() {
        return Ok(dir);
    }
    // `ember average` reads the checkpoints under this lock: none is pruned while it reads.
    let _writing = checkpoint::lock_for_writing(&run.run_dir)?;
    let mut ckpt = state.checkpoint_state(
        &run.training.cfg,
        run.training.batcher.cursor(),
        run.training.opt.step,
    );
    ckpt.tokenizer_sha256 = Some(run.identity.tokenizer_sha256.clone());
    ckpt.data_fingerprint = Some(run.identity.data_fingerprint.clone());
    ckpt.shares = dp.shares_per_batch();
    ckpt.vector_units = run.vector_units.clone();
    let dir = checkpoint::save(
        &run.run_dir,
        ckpt,
        &run.training.params,
        &run.training.opt.state_tensors()?,
        &run.config_yaml,
    )?;
    checkpoint::prune(
        &run.run_dir,
        run.training.cfg.checkpoint.keep_last,
        state.best_step(),
    )?;
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
        run.training.params.num_params(),
        started.elapsed().as_secs_f64(),
    );
    if dp.world().size() > 1 {
        summary.world_size = Some(dp.world().size());
        summary.weights_sha256 = Some(dp.agreed_weights_sha256(run.training.opt.params(), state.step())?);
    }
    if !dp.is_leader() {
        return Ok(summary);
    }
    metrics::export_csv(&run.run_dir)?;
    let path = run.run_dir.join(SUMMARY);
    crate::run::files::write_atomic(&path, serde_json::to_string_pretty(&summary)?.as_bytes())?;
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
