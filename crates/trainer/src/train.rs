//! The training loop — one for both architectures.
//!
//! A step draws `train.accumulation` micro-batches, runs forward and backward on each
//! ([`crate::step`]), checks and clips the global gradient norm, and applies AdamW. Everything
//! random derives from the run seed, the step and the micro-batch index, so the same config
//! gives bit-identical losses, and a resumed run continues exactly as if never stopped.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device};
use ember_data::{Batcher, Dataset, LmWindowBatcher, Splits, TokenBudgetBatcher};
use ember_model::{init_model, Model, QkNorm};
use serde::Serialize;

use crate::checkpoint::{self, Best, CheckpointState, LogWindow};
use crate::config::{KeepBestBy, NonFinitePolicy, RunConfig};
use crate::evaluate::{evaluate, validate, EvalResult, Split};
use crate::metrics::{self, EvalRecord, MetricsLog, Progress, Record, TrainRecord, Verbosity};
use crate::optim::{clip_grad_norm, AdamW, LrSchedule};
use crate::step::{forward_backward, micro_batches};

pub const RUN_CONFIG: &str = "config.yaml";
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

/// `cpu` or `cuda:N`.
pub fn device(spec: &str) -> Result<Device> {
    if spec == "cpu" {
        return Ok(Device::Cpu);
    }
    let Some(n) = spec.strip_prefix("cuda:").and_then(|n| n.parse::<usize>().ok()) else {
        bail!("device: expected `cpu` or `cuda:N`, got {spec:?}");
    };
    if !cfg!(feature = "cuda") {
        bail!("device: {spec} needs CUDA, but this build has none; rebuild with `cargo build --release --features cuda`");
    }
    Device::new_cuda(n).with_context(|| format!("device: cannot open {spec}"))
}

/// Fills in what the config leaves to the data: the vocabulary size and, for `qk_norm: l2`,
/// the length L of g₀ = log2(L² − L) (the 97.5th-percentile training length, as Henry et al.).
pub fn resolve_model_config(cfg: &mut RunConfig, data: &Dataset) -> Result<()> {
    let vocab = data.tokenizer.vocab_size();
    match cfg.model.vocab_size {
        None => cfg.model.vocab_size = Some(vocab),
        Some(v) if v != vocab => bail!(
            "model.vocab_size is {v} but the tokenizer has {vocab} tokens; remove model.vocab_size \
             to take it from the tokenizer"
        ),
        Some(_) => {}
    }
    let m = &mut cfg.model;
    if m.qk_norm == QkNorm::L2 && m.qk_norm_init_scale.is_none() && m.qk_norm_length.is_none() {
        let length = match &data.splits {
            // +1: the decoder sees bos + target, the loss target + eos.
            Splits::Translation(s) => s
                .train
                .stats
                .p975_source_len
                .max(s.train.stats.p975_target_len + 1),
            Splits::Text(_) => cfg.train.block_size.unwrap_or(m.max_seq_len),
        };
        m.qk_norm_length = Some(length.max(2));
    }
    m.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

/// The training batcher the config asks for.
pub fn make_batcher(cfg: &RunConfig, data: &Dataset) -> Result<Box<dyn Batcher>> {
    let t = &cfg.train;
    Ok(match &data.splits {
        Splits::Translation(s) => Box::new(TokenBudgetBatcher::new(
            s.train.examples.clone(),
            t.max_tokens.unwrap_or(4096),
            data.tokenizer.specials(),
            t.seed,
        )?),
        Splits::Text(s) => Box::new(LmWindowBatcher::new(
            s.train.clone(),
            t.batch_size.unwrap_or(1),
            t.block_size.unwrap_or(1),
            t.seed,
            t.windows,
        )?),
    })
}

/// Newest complete, verified checkpoint; with `fallback`, skips corrupt ones (saying so).
pub fn load_latest(run_dir: &Path, device: &Device, fallback: bool) -> Result<checkpoint::Loaded> {
    let all = checkpoint::list(run_dir);
    if all.is_empty() {
        bail!(
            "{} has no complete checkpoint to resume from; run without --resume to start training",
            run_dir.display()
        );
    }
    let mut problems = vec![];
    for (_, dir) in all.iter().rev() {
        match checkpoint::load(dir, device) {
            Ok(l) => {
                for p in &problems {
                    eprintln!("warning: skipped corrupt checkpoint: {p}");
                }
                return Ok(l);
            }
            Err(e) if fallback => problems.push(format!("{e:#}")),
            Err(e) => {
                return Err(e.context(
                    "the newest checkpoint cannot be used; pass --fallback to resume from the newest \
                     intact one instead (the corrupt one is left in place for inspection)",
                ))
            }
        }
    }
    bail!(
        "every checkpoint in {} is corrupt:\n  {}",
        run_dir.display(),
        problems.join("\n  ")
    )
}

/// Sizes candle's CPU thread pools from `train.threads` (default 1); call before any tensor work.
/// Ember's matmuls and fused kernels are single-threaded, so more threads only feed candle's
/// spinning elementwise pool, which measured 3-4x slower than one thread on 2 cores: one thread
/// per run, with runs side by side (`ember ablate --jobs`), is the faster way to use cores.
pub fn set_threads(cfg: &RunConfig) {
    let n = cfg.train.threads.unwrap_or(1);
    std::env::set_var("RAYON_NUM_THREADS", n.to_string());
}

/// Trains `cfg` into `opts.run_dir`: fresh, or resumed from its newest checkpoint.
pub fn train(mut cfg: RunConfig, opts: &TrainOptions) -> Result<Summary> {
    let started = Instant::now();
    set_threads(&cfg);
    let device = device(&cfg.device)?;
    let run_dir = opts.run_dir.as_path();
    let existing = checkpoint::list(run_dir);
    if !opts.resume && !existing.is_empty() {
        bail!(
            "{} already holds checkpoints (newest: step {}); pass --resume to continue that run, \
             or choose another --run-dir. Nothing was changed.",
            run_dir.display(),
            existing.last().map_or(0, |(s, _)| *s)
        );
    }
    fs::create_dir_all(run_dir)
        .with_context(|| format!("creating the run directory {}", run_dir.display()))?;
    let progress_quiet = opts.verbosity == Verbosity::Quiet;

    let data = Dataset::prepare(&cfg.data, Some(run_dir)).context("preparing the data")?;
    resolve_model_config(&mut cfg, &data)?;

    let loaded = if opts.resume {
        Some(load_latest(run_dir, &device, opts.fallback)?)
    } else {
        None
    };
    let (model, params) = match &loaded {
        Some(l) => {
            let hash = checkpoint::model_config_hash(&cfg.model);
            if hash != l.state.model_config_hash {
                bail!(
                    "cannot resume: {} was trained with a different model config:\n  {}\nResume with the \
                     config the run was started with ({}), or start a new run directory.",
                    l.dir.display(),
                    checkpoint::config_differences(&l.state.model_config, &cfg.model).join("\n  "),
                    run_dir.join(RUN_CONFIG).display()
                );
            }
            let model = Model::new(&cfg.model, &l.params)
                .with_context(|| format!("rebuilding the model from {}", l.dir.display()))?;
            (model, l.params.clone())
        }
        None => init_model(&cfg.model, cfg.train.seed, DType::F32, &device)?,
    };
    let config_yaml = cfg.to_yaml();
    fs::write(run_dir.join(RUN_CONFIG), &config_yaml).context("writing config.yaml")?;

    let mut batcher = make_batcher(&cfg, &data)?;
    let t = &cfg.train;
    let total_steps = match (t.steps, t.epochs) {
        (Some(s), _) => s,
        (None, Some(e)) => ((e * batcher.batches_per_epoch() as f64) / t.accumulation as f64)
            .ceil()
            .max(1.0) as u64,
        (None, None) => bail!("set train.steps or train.epochs"),
    };
    let mut opt = AdamW::new(params.vars(), t)?;
    let schedule = LrSchedule::new(t, total_steps);

    // Everything besides weights, moments and the data cursor that a checkpoint must carry.
    let mut run = Counters::default();
    let mut restored_window = LogWindow::default();
    let resumed_from_step = loaded.as_ref().map(|l| l.state.step);
    if let Some(l) = loaded {
        restored_window = l.state.log_window.clone();
        opt.load_state(l.optimizer, l.state.optimizer_step)
            .with_context(|| format!("restoring the optimizer from {}", l.dir.display()))?;
        batcher.restore(l.state.cursor)?;
        run = Counters::from_state(&l.state);
    }
    // A fresh run starts a fresh log (a run killed before its first checkpoint may have left one).
    let mut log = MetricsLog::open(run_dir, Some(resumed_from_step.unwrap_or(0)))?;
    let progress = Progress::new(total_steps, run.step, opts.verbosity);
    if !progress_quiet {
        progress.line(&format!(
            "{} model, {} parameters, {} steps, data: {}; run directory {}",
            format!("{:?}", cfg.model.arch).to_lowercase(),
            params.num_params(),
            total_steps,
            describe_data(&data),
            run_dir.display()
        ));
        if let Some(s) = resumed_from_step {
            progress.line(&format!("resuming after step {s}"));
        }
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

fn describe_data(data: &Dataset) -> String {
    match &data.splits {
        Splits::Translation(s) => format!(
            "{} train / {} valid pairs, vocab {}",
            s.train.examples.len(),
            s.valid.examples.len(),
            data.tokenizer.vocab_size()
        ),
        Splits::Text(s) => format!(
            "{} train / {} valid tokens, vocab {}",
            s.train.len(),
            s.valid.len(),
            data.tokenizer.vocab_size()
        ),
    }
}

/// A trained run opened for evaluation or decoding: its config, data and newest (or best) weights.
pub struct OpenRun {
    pub cfg: RunConfig,
    pub data: Dataset,
    pub model: Model,
    pub device: Device,
    pub checkpoint: PathBuf,
}

/// Opens a run (its newest checkpoint) or one checkpoint for evaluation or decoding, on the
/// run's own device or on `device` when given (a run trained on a GPU, evaluated on a CPU).
pub fn open_run(run: &Path, device_override: Option<&str>) -> Result<OpenRun> {
    let (run_dir, ckpt_dir) = if run.join("state.json").is_file() {
        let run_dir = run
            .parent()
            .and_then(|p| p.parent())
            .context("a checkpoint directory must sit in <run>/checkpoints/")?;
        (run_dir.to_path_buf(), run.to_path_buf())
    } else {
        let newest = checkpoint::list(run)
            .pop()
            .with_context(|| format!("{} has no checkpoint (is it a run directory?)", run.display()))?;
        (run.to_path_buf(), newest.1)
    };
    let mut cfg = RunConfig::load(&run_dir.join(RUN_CONFIG), &[])?;
    if let Some(d) = device_override {
        cfg.device = d.to_string();
    }
    set_threads(&cfg);
    let device = device(&cfg.device)?;
    let data = Dataset::prepare(&cfg.data, Some(&run_dir)).context("preparing the data")?;
    let loaded = checkpoint::load(&ckpt_dir, &device)?;
    let model = Model::new(&cfg.model, &loaded.params)?;
    Ok(OpenRun {
        cfg,
        data,
        model,
        device,
        checkpoint: ckpt_dir,
    })
}
