//! Everything a run needs before its first step, and opening a trained run again.
//!
//! For training: the device and thread pools, the batcher, the run directory (never silently
//! over an earlier run's checkpoints), the config completed from the data (`resolve`), and the
//! model, optimizer and data position — fresh, or restored from the newest checkpoint — as a
//! [`Training`] that the loop steps. Opening a trained model again for evaluation and decoding is
//! `open`'s (in `saved/`). Beside it: completing the config from the data (`resolve`), starting
//! from an imported model (`init_from`), the memory [`limits`] checked before allocating, the
//! products' [`precision`], resolved once for the model, evaluation and decoding, and what the
//! backward pass recomputes (`activations`).

pub mod activations;
pub(crate) mod init_from;
pub mod limits;
pub mod precision;
pub(crate) mod resolve;

use crate::tell;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device};
use ember_data::{Batcher, Dataset, LmWindowBatcher, Splits, TokenBudgetBatcher, TOKENIZER_FILE};
use ember_model::{init_model, Model, ParamStore};

use crate::checkpoint::{self, CheckpointState};
use crate::config::{Batched, Batching, RunConfig, Schedule, TrainConfig};
use crate::data_parallel::DataParallel;
use crate::optim::{AdamW, LrSchedule};
use crate::protected::Output;
use crate::resume_check::{self, Allowed, RunIdentity};
use crate::run::files::write_atomic;
use crate::run::options::TrainOptions;
use crate::run_dir::RUN_CONFIG;
use crate::run_lock::DirLock;
use crate::setup::resolve::{check_data_fits, resolve_model_config};
use crate::step::training::Training;
use crate::update::Updater;

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
    ember_kernels::cuda::check_env().map_err(|e| anyhow::anyhow!(e))?;
    let device = Device::new_cuda(n).with_context(|| format!("device: cannot open {spec}"))?;
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = &device {
        // cudarc gives every allocation two CUDA events to order its uses across streams, and
        // records and waits on them around every launch once a context has a stream of its own:
        // ~55,000 driver calls a multi30k-tiny step (scripts/gpu-check.sh counts them), all
        // host time in a launch-bound step. Ember runs each device on candle's one stream
        // (cuBLAS and NCCL included), where that ordering is the stream's own.
        // SAFETY: no other stream ever touches this device's tensors (the precondition of
        // `disable_event_tracking`), and no tensor exists on it yet.
        unsafe { d.disable_event_tracking() };
    }
    Ok(device)
}

/// Sizes the CPU thread pools from `train.threads` (default: the physical cores this process
/// may use); call before any tensor work. Ember's kernels (GEMM, attention, norms, elementwise)
/// run on their own pool (`ember_kernels::par`), whose results are bit-identical at any thread
/// count. candle's elementwise ops outside them (residual adds, the backward pass's gradient
/// sums) get the same number of threads, parked between ops: with candle's default spinning its
/// pool fought Ember's for the cores and two threads were slower than one, parked
/// (`CANDLE_BARRIER_POOL_SPIN_LIMIT=0`; an explicit setting in the environment wins) two threads
/// measured 3–7% faster per step than one (docs/performance.md). Those ops are elementwise, so
/// the thread count changes no bit. candle's own matmul (unused: Ember's GEMM replaces it) stays
/// at one thread.
pub(crate) fn set_threads(cfg: &RunConfig) -> Result<()> {
    let n = cfg.train.threads.unwrap_or_else(default_threads);
    // With several shares each thread computes a share of its own, and candle's ops are best
    // run on it too (measured: 1.1x faster than handing them to candle's pool).
    let candle_threads = if cfg.shares() > 1 { 1 } else { n };
    std::env::set_var("CANDLE_NUM_THREADS", candle_threads.to_string());
    if std::env::var_os("CANDLE_BARRIER_POOL_SPIN_LIMIT").is_none() {
        std::env::set_var("CANDLE_BARRIER_POOL_SPIN_LIMIT", "0");
    }
    std::env::set_var("RAYON_NUM_THREADS", "1");
    ember_kernels::par::set_threads(n).map_err(|e| anyhow::anyhow!("train.threads = {n}: {e}"))
}

/// Physical cores available to this process: SMT siblings share one core's arithmetic units, and
/// a second thread on them slowed Ember's compute-bound kernels down rather than up.
pub(crate) fn default_threads() -> usize {
    let allowed = std::thread::available_parallelism().map_or(1, |n| n.get());
    allowed.min(num_cpus::get_physical()).max(1)
}

/// The training batcher the config asks for.
pub fn make_batcher(cfg: &RunConfig, data: &Dataset) -> Result<Box<dyn Batcher>> {
    let t = &cfg.train;
    Ok(match Batching::of_data(cfg, &data.splits)? {
        Batched::Translation { splits, max_tokens } => Box::new(TokenBudgetBatcher::new(
            splits.train.examples.clone(),
            max_tokens,
            data.tokenizer.specials(),
            t.seed,
        )?),
        Batched::Text {
            splits,
            batch_size,
            block_size,
        } => Box::new(LmWindowBatcher::new(
            splits.train.clone(),
            batch_size,
            block_size,
            t.seed,
            t.windows,
        )?),
    })
}

/// A training run ready for its next step: fresh, or restored from its newest checkpoint, in
/// its run directory.
pub(crate) struct TrainingRun {
    /// The model, optimizer, data and schedule, and their step.
    pub training: Training,
    pub run_dir: PathBuf,
    /// The state of the checkpoint this invocation continues from (`--resume`).
    pub resumed: Option<CheckpointState>,
    /// `config.yaml`'s text, stored again in every checkpoint.
    pub config_yaml: String,
    /// The tokenizer and data this run trains on, recorded in every checkpoint.
    pub identity: RunIdentity,
    /// The vector units (or CUDA) the run's steps were computed with, this invocation's last,
    /// recorded in every checkpoint.
    pub vector_units: Vec<String>,
    /// `--resume` of a run that already reached `train.steps`: nothing to train, nothing written.
    pub already_finished: bool,
    /// What the set-up has to tell the user (changed config keys, allowed changes, data fitting).
    pub notes: Vec<String>,
    /// Held for the whole run by the writer (rank 0): a second writer into the directory is
    /// refused.
    _lock: Option<DirLock>,
}

impl TrainingRun {
    /// Sets up `cfg` in `opts.run_dir`. Nothing in the directory changes before the checks that
    /// can refuse the run have passed (another writer holding it, existing checkpoints without
    /// `--resume`, a changed tokenizer, data or model on `--resume`, too little memory);
    /// `config.yaml` is written last.
    pub fn prepare(mut cfg: RunConfig, opts: &TrainOptions) -> Result<Self> {
        activations::check(&cfg)?;
        set_threads(&cfg)?;
        let device = device(&cfg.device)?;
        let precision = precision::for_training(&cfg)?;
        let run_dir = opts.run_dir.clone();
        // Only rank 0 writes the run directory; the other ranks of a job read what it prepared.
        let leader = opts.world.is_leader();
        let lock = lock_run_dir(&cfg, opts)?;
        let loaded = if opts.resume {
            let l = load_latest(&run_dir, &device, opts.fallback)?;
            resume_check::check_tokenizer_present(&run_dir, &l.dir, allowed(opts))?;
            Some(l)
        } else {
            None
        };
        // A tokenizer this set-up trains is removed again if the run is refused (or stopped)
        // before it starts: left behind, it would refuse the next plain `--resume`.
        let mut new_tokenizer = RemoveOnFailure::new(&run_dir.join(TOKENIZER_FILE), leader);
        let mut data = prepare_data(&cfg, opts, loaded.as_ref())?;
        let identity = RunIdentity::of(&data)?;
        let mut notes = match &loaded {
            Some(l) => resume_check::check_identity(&l.state, &identity, &l.dir, &run_dir, allowed(opts))?,
            None => vec![],
        };
        let unit = resume_check::compute_unit(&device, precision);
        let vector_units = match &loaded {
            Some(l) => {
                let (units, warning) = resume_check::vector_units(&l.state, &l.dir, &unit);
                notes.extend(warning);
                units
            }
            None => vec![unit],
        };
        resolve_model_config(&mut cfg, &data)?;
        check_data_fits(&cfg, &mut data, &mut notes)?;
        notes.extend(data.warnings());
        if leader {
            // Measured (a few products) where it is told: rank 0 alone speaks for a job.
            notes.extend(precision::products_note(&cfg));
        }
        limits::check_memory(&cfg, &data)?;
        let (mut model, params) = match &loaded {
            Some(l) => restore_model(&cfg, l, &run_dir)?,
            None => initial_model(&cfg, &device)?,
        };
        model.set_precision(precision);
        let config_yaml = cfg.to_yaml();

        let mut batcher = make_batcher(&cfg, &data)?;
        let total_steps = total_steps(&cfg.train, batcher.as_ref())?;
        let mut opt = AdamW::new(params.vars(), &cfg.train)?;
        let schedule = LrSchedule::new(&cfg.train, total_steps);
        let (resumed, already_finished) = match loaded {
            Some(l) => {
                let finished = l.state.step == total_steps;
                let state =
                    continue_from(l, &cfg, opts, total_steps, &mut opt, batcher.as_mut(), &mut notes)?;
                (Some(state), finished)
            }
            None => (None, false),
        };
        let skipped = resumed.as_ref().map_or(0, |s| s.skipped_steps);
        let updater = Updater::new(&device, &opt, skipped, !opts.world.is_launched())?;
        if !already_finished && leader {
            write_atomic(&run_dir.join(RUN_CONFIG), config_yaml.as_bytes())?;
        }
        new_tokenizer.keep();
        Ok(Self {
            training: Training {
                cfg,
                device,
                data,
                model,
                params,
                opt,
                updater,
                schedule,
                batcher,
                total_steps,
            },
            run_dir,
            resumed,
            config_yaml,
            identity,
            vector_units,
            already_finished,
            notes,
            _lock: lock,
        })
    }

    /// The line a run starts with: model, size, length, data and where it is written.
    pub fn describe(&self) -> String {
        let t = &self.training;
        let start = match (&t.cfg.model.init_from, &self.resumed) {
            (Some(dir), None) => format!(" from {}", dir.display()),
            _ => String::new(),
        };
        // f32 says nothing (the line as it always was); bf16 names its instructions.
        let precision = match t.model.precision() {
            ember_kernels::Precision::F32 => String::new(),
            _ => format!(", {}", crate::setup::precision::describe_products(&t.cfg)),
        };
        let activations = match activations::note(t.cfg.train.activations) {
            "" => String::new(),
            note => format!("{note} in the backward pass"),
        };
        format!(
            "{} model{start}, {} parameters, {} steps{precision}{activations}, data: {}; run directory {}",
            format!("{:?}", t.cfg.model.arch).to_lowercase(),
            t.params.num_params(),
            t.total_steps,
            describe_data(&t.data),
            self.run_dir.display()
        )
    }
}

/// The changes `--resume` was told to accept.
fn allowed(opts: &TrainOptions) -> Allowed {
    Allowed {
        data_change: opts.allow_data_change,
        tokenizer_change: opts.allow_tokenizer_change,
        precision_change: opts.allow_precision_change,
    }
}

/// Checks that `opts.run_dir` can take this run (the one rule of [`crate::protected`]: not in a
/// checkpoint, a model folder or the folder `model.init_from` reads) and, on rank 0, locks it
/// for the run. A missing directory is not created just to find it has nothing to resume; an
/// existing one is locked first, so that a writer in it is named rather than its half-written
/// state.
fn lock_run_dir(cfg: &RunConfig, opts: &TrainOptions) -> Result<Option<DirLock>> {
    let run_dir = &opts.run_dir;
    if opts.resume && !run_dir.is_dir() {
        bail!(
            "{} does not exist, so there is nothing to resume; run without --resume to start training",
            run_dir.display()
        );
    }
    let leader = opts.world.is_leader();
    // The folders the config reads a model or tokenizer from: the run never writes into them.
    let mut reads: Vec<(&Path, &'static str)> = vec![];
    reads.extend(cfg.model.init_from.as_deref().map(|d| (d, "model.init_from")));
    if cfg.data.tokenizer.kind == ember_data::TokenizerKind::Pretrained {
        reads.extend(
            cfg.data
                .tokenizer
                .path
                .as_deref()
                .map(|d| (d, "data.tokenizer.path")),
        );
    }
    crate::protected::check(run_dir, "--run-dir", Output::RunDir, &[], &reads)?;
    let lock = if leader {
        Some(DirLock::acquire(run_dir, "training run")?)
    } else {
        None
    };
    if opts.resume && checkpoint::list(run_dir).is_empty() {
        bail!(
            "{} has no complete checkpoint to resume from; run without --resume to start training",
            run_dir.display()
        );
    }
    if leader {
        claim_run_dir(run_dir, opts.resume)?;
    }
    Ok(lock)
}

/// Prepares the data in the run directory (training or copying the tokenizer, filling the token
/// cache), first telling a stop signal what stopping then means; a signal that came meanwhile
/// ends the set-up as an interruption, with nothing trained.
fn prepare_data(
    cfg: &RunConfig,
    opts: &TrainOptions,
    loaded: Option<&checkpoint::Loaded>,
) -> Result<Dataset> {
    if let Some(stop) = &opts.stop {
        stop.set_phase(match loaded {
            Some(l) => format!(
                "stopping once the data is ready (nothing new has been trained; the checkpoint of \
                 step {} stays the newest)",
                l.state.step
            ),
            None => "stopping once the data is ready (nothing has been trained yet, so nothing is \
                     saved and the run will start over)"
                .to_string(),
        });
    }
    let data = Dataset::prepare(&cfg.data, Some(&opts.run_dir)).context("preparing the data")?;
    if let Some(signal) = opts
        .stop
        .as_ref()
        .and_then(crate::interrupt::StopRequest::requested)
    {
        return Err(anyhow::Error::new(crate::interrupt::Interrupted {
            signal,
            step: loaded.map_or(0, |l| l.state.step),
            checkpoint: loaded.map(|l| l.dir.clone()),
            run_dir: opts.run_dir.clone(),
        }));
    }
    Ok(data)
}

/// Continues from the checkpoint `l` (`--resume`): refuses a checkpoint past this config's
/// `total_steps`, notes (and keeps a copy of the old config for) changed config keys and a
/// changed split of the batches, and restores the optimizer and the data position. Returns the
/// checkpoint's state.
fn continue_from(
    l: checkpoint::Loaded,
    cfg: &RunConfig,
    opts: &TrainOptions,
    total_steps: u64,
    opt: &mut AdamW,
    batcher: &mut dyn Batcher,
    notes: &mut Vec<String>,
) -> Result<CheckpointState> {
    if l.state.step > total_steps {
        bail!(
            "cannot resume: the newest checkpoint {} is at step {}, beyond the {total_steps} \
            steps this config asks for; to train longer, raise train.steps above {}. \
            Nothing was changed.",
            l.dir.display(),
            l.state.step,
            l.state.step
        );
    }
    let already_finished = l.state.step == total_steps;
    if !already_finished {
        let saved_yaml = ember_data::io::read_own_to_string(l.dir.join(RUN_CONFIG))
            .with_context(|| format!("reading {}", l.dir.join(RUN_CONFIG).display()))?;
        let changes = resume_check::config_changes(&saved_yaml, &l.dir, cfg, allowed(opts))?;
        if !changes.is_empty() && opts.world.is_leader() {
            let kept =
                resume_check::keep_config_history(&opts.run_dir, &l.dir.join(RUN_CONFIG), l.state.step)?;
            notes.push(format!(
                "resuming with a changed config: {} (the config of steps 1-{} is kept as {})",
                changes
                    .iter()
                    .map(|c| c.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                l.state.step,
                kept.display()
            ));
            notes.extend(schedule_note(cfg, &changes));
        }
    }
    let (saved, now) = (l.state.shares.unwrap_or(1), opts.world.size() * cfg.shares());
    if saved != now && !already_finished {
        notes.push(format!(
            "the checkpoint's batches were split {saved} way(s) (ranks x train.shares), this \
             run splits them {now}: it continues with the same batches from the same data \
             position (so its dropout masks, and the bits of every sum, differ from a run \
             split {saved} ways)"
        ));
    }
    opt.load_state(l.optimizer, l.state.optimizer_step)
        .with_context(|| format!("restoring the optimizer from {}", l.dir.display()))?;
    restore_cursor(batcher, l.state.cursor, &l.dir, allowed(opts), notes)?;
    Ok(l.state)
}

impl Training {
    /// A fresh run of `total_steps` steps on `cfg` with nothing written anywhere (the data is
    /// prepared without a run directory), set up as [`TrainingRun`] sets up a
    /// fresh run: for `ember bench`, as one rank of `dp`'s job.
    pub fn in_memory(mut cfg: RunConfig, total_steps: u64, dp: &DataParallel) -> Result<Self> {
        activations::check(&cfg)?;
        set_threads(&cfg)?;
        let device = device(&cfg.device)?;
        let precision = precision::for_training(&cfg)?;
        let mut data = Dataset::prepare(&cfg.data, None)?;
        resolve_model_config(&mut cfg, &data)?;
        // The same checks as a run's (data too short for a window is refused); their notes are
        // for a run's log, which a benchmark has not.
        check_data_fits(&cfg, &mut data, &mut Vec::new())?;
        limits::check_memory(&cfg, &data)?;
        let (mut model, params) = initial_model(&cfg, &device)?;
        model.set_precision(precision);
        let batcher = make_batcher(&cfg, &data)?;
        let opt = AdamW::new(params.vars(), &cfg.train)?;
        let schedule = LrSchedule::new(&cfg.train, total_steps);
        let updater = Updater::new(&device, &opt, 0, !dp.world().is_launched())?;
        Ok(Self {
            cfg,
            device,
            data,
            model,
            params,
            opt,
            updater,
            schedule,
            batcher,
            total_steps,
        })
    }
}

/// A fresh run's model: `model.init_from`'s weights, or initialised from `train.seed`.
fn initial_model(cfg: &RunConfig, device: &Device) -> Result<(Model, ParamStore)> {
    match cfg.model.init_from {
        Some(_) => crate::setup::init_from::load_model(&cfg.model, device),
        None => Ok(init_model(&cfg.model, cfg.train.seed, DType::F32, device)?),
    }
}

/// A file that did not exist when set-up began, removed again unless [`Self::keep`] is called
/// (the run was set up): a refused run leaves the directory as it found it.
struct RemoveOnFailure(Option<PathBuf>);

impl RemoveOnFailure {
    fn new(path: &Path, writer: bool) -> Self {
        Self((writer && !path.exists()).then(|| path.to_path_buf()))
    }

    fn keep(&mut self) {
        self.0 = None;
    }
}

impl Drop for RemoveOnFailure {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = fs::remove_file(path);
        }
    }
}

/// Puts the batcher at the checkpoint's data position. A position past the end of an epoch
/// of this data (the data shrank, or the batch settings changed) is refused, naming what
/// changed; with `--allow-data-change` the run goes on from the start of the next epoch.
fn restore_cursor(
    batcher: &mut dyn Batcher,
    cursor: ember_data::Cursor,
    checkpoint: &Path,
    allowed: Allowed,
    notes: &mut Vec<String>,
) -> Result<()> {
    let Err(e) = batcher.restore(cursor) else {
        return Ok(());
    };
    let per_epoch = batcher.batches_per_epoch();
    if !allowed.data_change {
        let said = format!(
            "cannot resume: the checkpoint {} stopped at batch {} of epoch {}, but an epoch of this \
             data has only {per_epoch} batches (the data shrank, or train.batch_size, \
             train.block_size or train.max_tokens changed). Resume with the data and batch settings \
             the run was saved with, or pass --allow-data-change to continue from the start of the \
             next epoch. Nothing was changed.",
            checkpoint.display(),
            cursor.position,
            cursor.epoch
        );
        // The message says all the data's own error would (and says what to do).
        return Err(match e {
            ember_data::DataError::CursorOutOfRange { .. } => anyhow::anyhow!(said),
            other => anyhow::Error::new(other).context(said),
        });
    }
    let next = ember_data::Cursor {
        epoch: cursor.epoch.saturating_add(1),
        position: 0,
    };
    batcher
        .restore(next)
        .with_context(|| format!("moving the data position to the start of epoch {}", next.epoch))?;
    notes.push(format!(
        "the checkpoint stopped at batch {} of epoch {}, past the {per_epoch} batches an epoch of \
         this data has: continuing from the start of epoch {} (allowed by --allow-data-change)",
        cursor.position, cursor.epoch, next.epoch
    ));
    Ok(())
}

/// A changed step count under a decaying schedule moves the rest of the learning-rate curve;
/// say so (under `schedule: constant` after warmup, extending a run is exact).
fn schedule_note(cfg: &RunConfig, changes: &[resume_check::Change]) -> Option<String> {
    let steps_changed = changes
        .iter()
        .any(|c| c.key == "train.steps" || c.key == "train.epochs");
    (steps_changed && cfg.train.schedule != Schedule::Constant).then(|| {
        "train.steps changed under a decaying schedule: the learning rate from here on follows \
                        the new length, so the result differs from a run of that length from the start (use \
                        train.schedule: constant to extend runs exactly)"
            .to_string()
    })
}

/// Refuses to start a fresh run over an earlier run's checkpoints (the directory exists: the
/// lock created it).
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
    Ok(())
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
                    tell!("warning: skipped corrupt checkpoint: {p}");
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
