//! Everything a run needs before its first step, and opening a trained run again.
//!
//! For training: the device and thread pools, the config completed from the data (vocabulary
//! size, the QK-norm length), the batcher, the run directory (never silently over an earlier
//! run's checkpoints), and the model, optimizer and data position — fresh, or restored from the
//! newest checkpoint. For evaluation and decoding: [`open_run`].

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device};
use ember_data::{Batcher, Dataset, LmWindowBatcher, Splits, TokenBudgetBatcher};
use ember_model::{init_model, Model, ParamStore, QkNorm};

use crate::checkpoint::{self, CheckpointState};
use crate::config::{RunConfig, TrainConfig};
use crate::optim::{AdamW, LrSchedule};
use crate::train::TrainOptions;

/// The resolved config a run directory holds (also copied into every checkpoint).
pub const RUN_CONFIG: &str = "config.yaml";

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

/// Sizes candle's CPU thread pools from `train.threads` (default 1); call before any tensor work.
/// Ember's matmuls and fused kernels are single-threaded, so more threads only feed candle's
/// spinning elementwise pool, which measured 3-4x slower than one thread on 2 cores: one thread
/// per run, with runs side by side (`ember ablate --jobs`), is the faster way to use cores.
pub fn set_threads(cfg: &RunConfig) {
    let n = cfg.train.threads.unwrap_or(1);
    std::env::set_var("RAYON_NUM_THREADS", n.to_string());
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

/// A training run ready for its next step: fresh, or restored from its newest checkpoint.
pub(crate) struct TrainingRun {
    /// The config completed from the data, as written to `config.yaml`.
    pub cfg: RunConfig,
    pub run_dir: PathBuf,
    pub device: Device,
    pub data: Dataset,
    pub model: Model,
    pub params: ParamStore,
    pub opt: AdamW,
    pub schedule: LrSchedule,
    pub batcher: Box<dyn Batcher>,
    pub total_steps: u64,
    /// The state of the checkpoint this invocation continues from (`--resume`).
    pub resumed: Option<CheckpointState>,
    /// `config.yaml`'s text, stored again in every checkpoint.
    pub config_yaml: String,
}

impl TrainingRun {
    /// Sets up `cfg` in `opts.run_dir`. Nothing in the directory changes before the checks that
    /// can refuse the run (existing checkpoints without `--resume`) have passed.
    pub fn prepare(mut cfg: RunConfig, opts: &TrainOptions) -> Result<Self> {
        set_threads(&cfg);
        let device = device(&cfg.device)?;
        let run_dir = opts.run_dir.clone();
        claim_run_dir(&run_dir, opts.resume)?;
        let data = Dataset::prepare(&cfg.data, Some(&run_dir)).context("preparing the data")?;
        resolve_model_config(&mut cfg, &data)?;
        let loaded = if opts.resume {
            Some(load_latest(&run_dir, &device, opts.fallback)?)
        } else {
            None
        };
        let (model, params) = match &loaded {
            Some(l) => restore_model(&cfg, l, &run_dir)?,
            None => init_model(&cfg.model, cfg.train.seed, DType::F32, &device)?,
        };
        let config_yaml = cfg.to_yaml();
        fs::write(run_dir.join(RUN_CONFIG), &config_yaml).context("writing config.yaml")?;

        let mut batcher = make_batcher(&cfg, &data)?;
        let total_steps = total_steps(&cfg.train, batcher.as_ref())?;
        let mut opt = AdamW::new(params.vars(), &cfg.train)?;
        let schedule = LrSchedule::new(&cfg.train, total_steps);
        let resumed = match loaded {
            Some(l) => {
                opt.load_state(l.optimizer, l.state.optimizer_step)
                    .with_context(|| format!("restoring the optimizer from {}", l.dir.display()))?;
                batcher.restore(l.state.cursor)?;
                Some(l.state)
            }
            None => None,
        };
        Ok(Self {
            cfg,
            run_dir,
            device,
            data,
            model,
            params,
            opt,
            schedule,
            batcher,
            total_steps,
            resumed,
            config_yaml,
        })
    }

    /// The line a run starts with: model, size, length, data and where it is written.
    pub fn describe(&self) -> String {
        format!(
            "{} model, {} parameters, {} steps, data: {}; run directory {}",
            format!("{:?}", self.cfg.model.arch).to_lowercase(),
            self.params.num_params(),
            self.total_steps,
            describe_data(&self.data),
            self.run_dir.display()
        )
    }
}

/// Refuses to start a fresh run over an earlier run's checkpoints, then creates the directory.
fn claim_run_dir(run_dir: &Path, resume: bool) -> Result<()> {
    let existing = checkpoint::list(run_dir);
    if !resume && !existing.is_empty() {
        bail!(
            "{} already holds checkpoints (newest: step {}); pass --resume to continue that run, \
             or choose another --run-dir. Nothing was changed.",
            run_dir.display(),
            existing.last().map_or(0, |(s, _)| *s)
        );
    }
    fs::create_dir_all(run_dir).with_context(|| format!("creating the run directory {}", run_dir.display()))
}

/// The model of a checkpoint, provided it was trained with this model config.
fn restore_model(
    cfg: &RunConfig,
    loaded: &checkpoint::Loaded,
    run_dir: &Path,
) -> Result<(Model, ParamStore)> {
    if checkpoint::model_config_hash(&cfg.model) != loaded.state.model_config_hash {
        bail!(
            "cannot resume: {} was trained with a different model config:\n  {}\nResume with the \
             config the run was started with ({}), or start a new run directory.",
            loaded.dir.display(),
            checkpoint::config_differences(&loaded.state.model_config, &cfg.model).join("\n  "),
            run_dir.join(RUN_CONFIG).display()
        );
    }
    let model = Model::new(&cfg.model, &loaded.params)
        .with_context(|| format!("rebuilding the model from {}", loaded.dir.display()))?;
    Ok((model, loaded.params.clone()))
}

/// `train.steps`, or enough optimizer steps to cover `train.epochs` of the batcher's data.
fn total_steps(t: &TrainConfig, batcher: &dyn Batcher) -> Result<u64> {
    Ok(match (t.steps, t.epochs) {
        (Some(s), _) => s,
        (None, Some(e)) => ((e * batcher.batches_per_epoch() as f64) / t.accumulation as f64)
            .ceil()
            .max(1.0) as u64,
        (None, None) => bail!("set train.steps or train.epochs"),
    })
}

/// Newest complete, verified checkpoint; with `fallback`, skips corrupt ones (saying so).
fn load_latest(run_dir: &Path, device: &Device, fallback: bool) -> Result<checkpoint::Loaded> {
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
