//! The training loop — one for both architectures.
//!
//! A step draws `train.accumulation` micro-batches, runs forward and backward on each
//! ([`crate::step`]), checks and clips the global gradient norm, and applies AdamW. Everything
//! random derives from the run seed, the step and the micro-batch index, so the same config
//! gives bit-identical losses, and a resumed run continues exactly as if never stopped.

use std::fs;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use serde::Serialize;

use crate::checkpoint::{self, Best, CheckpointState, LogWindow};
use crate::config::{KeepBestBy, NonFinitePolicy, RunConfig};
use crate::evaluate::{evaluate, validate, EvalResult, Split};
use crate::metrics::{self, EvalRecord, MetricsLog, Progress, Record, TrainRecord, Verbosity};
use crate::optim::{clip_grad_norm, AdamW};
use crate::setup::TrainingRun;
use crate::step::{forward_backward, micro_batches};

// The ablation runner, its report and their tests import these through `train::`.
pub use crate::setup::{make_batcher, RUN_CONFIG};

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
    let training = TrainingRun::prepare(cfg, opts)?;
    let header = training.describe();
    let TrainingRun {
        cfg,
        run_dir,
        device,
        data,
        model,
        params,
        mut opt,
        schedule,
        mut batcher,
        total_steps,
        resumed,
        config_yaml,
    } = training;
    let run_dir = run_dir.as_path();

    // Everything besides weights, moments and the data cursor that a checkpoint must carry.
    let mut run = Counters::default();
    let mut restored_window = LogWindow::default();
    let resumed_from_step = resumed.as_ref().map(|s| s.step);
    if let Some(s) = resumed {
        restored_window = s.log_window.clone();
        run = Counters::from_state(&s);
    }
    // A fresh run starts a fresh log (a run killed before its first checkpoint may have left one).
    let mut log = MetricsLog::open(run_dir, Some(resumed_from_step.unwrap_or(0)))?;
    let progress = Progress::new(total_steps, run.step, opts.verbosity);
    progress.line(&header);
    if let Some(s) = resumed_from_step {
        progress.line(&format!("resuming after step {s}"));
    }
    if cfg.train.divergence_evals.is_some() && run.initial_val_loss.is_none() {
        run.initial_val_loss = Some(evaluate(&model, &data, &cfg, Split::Valid, &device)?.loss);
    }

    let save = |run: &Counters, window: &LogWindow, opt: &AdamW, cursor| -> Result<PathBuf> {
        let state = CheckpointState {
            format: 1,
            step: run.step,
            cursor,
            optimizer_step: opt.step,
            seed: cfg.train.seed,
            best: run.best,
            initial_val_loss: run.initial_val_loss,
            evals_above_initial: run.evals_above_initial,
            log_window: window.clone(),
            skipped_steps: run.skipped,
            tokens_seen: run.tokens_seen,
            elapsed_secs: run.train_secs,
            model_config_hash: checkpoint::model_config_hash(&cfg.model),
            model_config: cfg.model.clone(),
            files: Default::default(),
        };
        let dir = checkpoint::save(run_dir, state, &params, &opt.state_tensors()?, &config_yaml)?;
        checkpoint::prune(run_dir, cfg.checkpoint.keep_last, run.best.map(|b| b.step))?;
        metrics::export_csv(run_dir)?;
        Ok(dir)
    };
    let write_summary = |run: &Counters, diverged: Option<String>, stats: &RunStats| -> Result<Summary> {
        let mut rates = stats.rates.clone();
        rates.sort_by(|a, b| a.total_cmp(b));
        let summary = Summary {
            run_dir: run_dir.to_path_buf(),
            steps: run.step,
            total_steps,
            finished: run.step == total_steps && diverged.is_none(),
            params: params.num_params(),
            final_train_loss: stats.last_train_loss,
            val_loss: stats.last_eval.map(|e| e.loss),
            val_ppl: stats.last_eval.map(|e| e.ppl),
            best: run.best,
            skipped_steps: run.skipped,
            tokens_per_sec: rates.get(rates.len() / 2).copied().unwrap_or(0.0),
            wall_secs: started.elapsed().as_secs_f64(),
            train_secs: run.train_secs,
            resumed_from_step,
            diverged,
        };
        metrics::export_csv(run_dir)?;
        fs::write(run_dir.join(SUMMARY), serde_json::to_string_pretty(&summary)?)?;
        Ok(summary)
    };

    let start_step = run.step;
    let mut window = restored_window;
    let mut stats = RunStats::default();
    let mut diverged = None;
    while run.step < total_steps {
        if opts.stop_after.is_some_and(|n| run.step - start_step >= n) {
            if checkpoint::list(run_dir).last().map(|(s, _)| *s) != Some(run.step) {
                save(&run, &window, &opt, batcher.cursor())?;
            }
            break;
        }
        let next = run.step + 1;
        let epoch = batcher.cursor().epoch;
        let batches = micro_batches(batcher.as_mut(), cfg.train.accumulation);
        let log_now = next % cfg.train.log_every == 0 || next == total_steps;
        let t0 = Instant::now();
        let out = forward_backward(&model, opt.params(), &batches, &cfg.train, &device, next, log_now)?;
        let check = clip_grad_norm(opt.params(), &out.grads, cfg.train.clip_grad_norm)?;
        let problem = out.non_finite(&check);
        let lr = schedule.at(next);
        match problem {
            Some(what) => match cfg.train.on_nonfinite {
                NonFinitePolicy::Stop => {
                    progress.finish();
                    let reason = format!("step {next}: {what}");
                    write_summary(&run, Some(reason.clone()), &stats)?;
                    bail!(
                        "{reason}; the update was not applied and nothing was saved for this step. \
                         The newest checkpoint ({}) is intact. Lower train.lr, keep train.clip_grad_norm, \
                         or set train.on_nonfinite: skip to skip such steps.",
                        checkpoint::list(run_dir)
                            .last()
                            .map_or("none yet".into(), |(_, d)| d.display().to_string())
                    )
                }
                NonFinitePolicy::Skip => {
                    run.skipped += 1;
                    progress.line(&format!(
                        "step {next}: {what}; update skipped ({} so far)",
                        run.skipped
                    ));
                }
            },
            None => opt.step(&out.grads, lr, check.scale)?,
        }
        let secs = t0.elapsed().as_secs_f64();
        run.step = next;
        run.train_secs += secs;
        run.tokens_seen += out.tokens as u64;
        if out.loss.is_finite() {
            window.loss += out.loss * out.tokens as f64;
            window.nll += out.nll * out.tokens as f64;
            window.tokens += out.tokens;
        }
        window.grad_norm += if check.norm.is_finite() { check.norm } else { 0.0 };
        window.steps += 1;
        window.secs += secs;

        if log_now {
            let n = window.tokens.max(1) as f64;
            let rate = window.tokens as f64 / window.secs.max(1e-9);
            stats.rates.push(rate);
            let record = TrainRecord {
                step: run.step,
                epoch,
                loss: window.loss / n,
                nll: window.nll / n,
                lr,
                grad_norm: window.grad_norm / window.steps.max(1) as f64,
                tokens_per_sec: rate,
                elapsed_secs: run.train_secs,
                skipped_steps: run.skipped,
                attn_max_logit: out.attention.iter().map(|a| a.max_logit).collect(),
                attn_entropy: out.attention.iter().map(|a| a.entropy).collect(),
            };
            stats.last_train_loss = Some(record.loss);
            progress.train(&record, total_steps);
            log.write(&Record::Train(record))?;
            window = LogWindow::default();
        }

        let is_last = run.step == total_steps;
        let mut saved = false;
        if is_last || (cfg.eval.every > 0 && run.step % cfg.eval.every == 0) {
            let validation = validate(&model, &data, &cfg, &device)?;
            let (r, bleu) = (validation.result, validation.bleu);
            progress.line(&format!("step {}: {validation}", run.step));
            log.write(&Record::Eval(EvalRecord {
                step: run.step,
                split: "valid".into(),
                loss: r.loss,
                ppl: r.ppl,
                tokens: r.tokens,
                elapsed_secs: run.train_secs,
                bleu,
            }))?;
            stats.last_eval = Some(r);
            if let (Some(limit), Some(initial)) = (cfg.train.divergence_evals, run.initial_val_loss) {
                // NaN compares false, so a NaN validation loss also counts as "above".
                let healthy = r.loss <= initial;
                run.evals_above_initial = if healthy { 0 } else { run.evals_above_initial + 1 };
                if run.evals_above_initial >= limit {
                    diverged = Some(format!(
                        "step {}: validation loss {:.4} has been above its initial value {initial:.4} \
                         for {limit} evaluation(s)",
                        run.step, r.loss
                    ));
                }
            }
            let better = match (cfg.checkpoint.keep_best_by, run.best) {
                (_, None) => r.loss.is_finite(),
                (KeepBestBy::Loss, Some(b)) => r.loss < b.val_loss,
                (KeepBestBy::Bleu, Some(b)) => bleu > b.bleu,
            };
            if better {
                run.best = Some(Best {
                    step: run.step,
                    val_loss: r.loss,
                    bleu,
                });
                save(&run, &window, &opt, batcher.cursor())?;
                saved = true;
            }
        }
        if !saved
            && (is_last
                || diverged.is_some()
                || (cfg.checkpoint.every > 0 && run.step % cfg.checkpoint.every == 0))
        {
            save(&run, &window, &opt, batcher.cursor())?;
        }
        if let Some(reason) = &diverged {
            progress.line(&format!("stopping: diverged at {reason}"));
            break;
        }
    }
    progress.finish();
    write_summary(&run, diverged, &stats)
}

/// Counters that a checkpoint carries besides weights, moments and the data cursor.
#[derive(Debug, Clone, Default)]
struct Counters {
    step: u64,
    best: Option<Best>,
    skipped: u64,
    tokens_seen: u64,
    train_secs: f64,
    initial_val_loss: Option<f64>,
    evals_above_initial: u32,
}

impl Counters {
    fn from_state(s: &CheckpointState) -> Self {
        Self {
            step: s.step,
            best: s.best,
            skipped: s.skipped_steps,
            tokens_seen: s.tokens_seen,
            train_secs: s.elapsed_secs,
            initial_val_loss: s.initial_val_loss,
            evals_above_initial: s.evals_above_initial,
        }
    }
}

/// What this invocation observed, for the summary.
#[derive(Default)]
struct RunStats {
    rates: Vec<f64>,
    last_train_loss: Option<f64>,
    last_eval: Option<EvalResult>,
}
