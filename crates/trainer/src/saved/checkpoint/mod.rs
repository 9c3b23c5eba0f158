//! Checkpoints: everything needed to continue a run exactly where it stopped.
//!
//! A checkpoint is a directory `checkpoints/step-NNNNNNNN/` holding
//! - `model.safetensors` — the parameters, named as in `ember_model::transformer`'s docs;
//! - `optimizer.safetensors` — AdamW moments `m.NAME` and `v.NAME`;
//! - `config.yaml` — the resolved run config;
//! - `state.json` — step, data cursor, optimizer step, best metric, counters, the seed from
//!   which every random stream (dropout) is derived per step, a hash of the model config, and
//!   SHA-256 checksums of the files above.
//!
//! It is written into a temporary directory and renamed into place, and `state.json` is
//! written last, so a crash never leaves a directory that looks complete but is not; the
//! checksums catch files damaged afterwards.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor};
use ember_data::Cursor;
use ember_model::{ModelConfig, ParamStore};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::run::lock_file::{not_a_lock_file, open_lock_file, LockFile};
use crate::run_dir::{CHECKPOINTS, LOCK_FILE, MODEL, OPTIMIZER, RUN_CONFIG, STATE};

/// The best validation result so far.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Best {
    pub step: u64,
    pub val_loss: f64,
    #[serde(default)]
    pub bleu: Option<f64>,
}

/// Running sums between two `metrics.jsonl` training records.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LogWindow {
    pub loss: f64,
    pub nll: f64,
    pub tokens: usize,
    pub grad_norm: f64,
    pub steps: u64,
    pub secs: f64,
}

/// `state.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointState {
    pub format: u32,
    /// Optimizer updates completed (the next step to run is `step + 1`).
    pub step: u64,
    /// The data position of the next batch.
    pub cursor: Cursor,
    /// AdamW's own update count (differs from `step` when non-finite steps were skipped).
    pub optimizer_step: u64,
    /// The run seed; dropout masks for step s, micro-batch i come from a stream derived from
    /// (seed, s, i), so no generator state needs saving.
    pub seed: u64,
    pub best: Option<Best>,
    /// Validation loss at initialisation (recorded when divergence detection is on).
    #[serde(default)]
    pub initial_val_loss: Option<f64>,
    /// Consecutive evaluations so far with validation loss above `initial_val_loss`.
    #[serde(default)]
    pub evals_above_initial: u32,
    /// Whether a training loss since the last evaluation spiked past
    /// `run_state::SPIKE_FACTOR` × `initial_val_loss`.
    #[serde(default)]
    pub spiked_since_eval: bool,
    /// Sums of the training-metrics window open at this step, so a resumed run logs exactly
    /// the records an uninterrupted one would.
    #[serde(default)]
    pub log_window: LogWindow,
    pub skipped_steps: u64,
    pub tokens_seen: u64,
    pub elapsed_secs: f64,
    pub model_config_hash: String,
    pub model_config: ModelConfig,
    /// SHA-256 of the run's `tokenizer.json`: `--resume` refuses another one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer_sha256: Option<String>,
    /// Fingerprint of the training and evaluation text (`RawCorpus::fingerprint`): `--resume`
    /// refuses other data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_fingerprint: Option<String>,
    /// Shares each batch was split into (ranks × `train.shares`; absent: whole batches). A run
    /// may resume with another split: every rank runs the whole batcher, so the data position is
    /// global and only the split of each batch (and its dropout masks) changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shares: Option<usize>,
    /// What computed the run's steps so far, in the order first used: the CPU's vector unit
    /// (`AVX-512`, `AVX2`, as [`ember_kernels::vector_unit`] names it, which
    /// `EMBER_CPU_VECTOR_UNIT` chooses) or `CUDA`. The matrix products sum in another order on
    /// another unit, so a run computed with two is not bit-identical to one computed with
    /// either; `--resume` says so, and the report names each run's units. Empty in checkpoints
    /// from before it was recorded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vector_units: Vec<String>,
    /// SHA-256 of each file in the directory (except this one).
    pub files: BTreeMap<String, String>,
}

/// A checkpoint read back and verified.
pub struct Loaded {
    pub dir: PathBuf,
    pub state: CheckpointState,
    pub params: ParamStore,
    pub optimizer: HashMap<String, Tensor>,
}

/// SHA-256 of the model config's canonical JSON: checkpoints of another architecture are refused.
pub fn model_config_hash(cfg: &ModelConfig) -> String {
    let json = serde_json::to_string(cfg).unwrap_or_default();
    hex(&Sha256::digest(json.as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 of a file, read in pieces: the optimizer's moments of a model imported with
/// `model.init_from` are gigabytes, which reading whole would hold in memory a second time at
/// every checkpoint.
pub(crate) fn file_hash(path: &Path) -> Result<String> {
    let reading = || format!("reading {}", path.display());
    let mut file = ember_data::io::open_own(path).with_context(reading)?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).with_context(reading)?;
    Ok(hex(&hasher.finalize()))
}

fn step_dir_name(step: u64) -> String {
    format!("step-{step:08}")
}

/// Where the checkpoint of `step` is (or will be) in `run_dir`.
pub fn dir_for(run_dir: &Path, step: u64) -> PathBuf {
    run_dir.join(CHECKPOINTS).join(step_dir_name(step))
}

/// `run` as (run directory, checkpoint directory): a checkpoint directory names itself and sits
/// in `<run>/checkpoints/`; a run directory stands for its newest checkpoint. Anything else is
/// refused naming what it is (a model folder, a Hugging Face folder, a sweep, a run that has
/// saved nothing yet).
pub fn run_and_checkpoint(run: &Path) -> Result<(PathBuf, PathBuf)> {
    if run.join(STATE).is_file() {
        let run_dir = run
            .parent()
            .and_then(Path::parent)
            .context("a checkpoint directory must sit in <run>/checkpoints/")?;
        return Ok((run_dir.to_path_buf(), run.to_path_buf()));
    }
    match list(run).pop() {
        Some((_, newest)) => Ok((run.to_path_buf(), newest)),
        None => bail!("{}", no_checkpoint(run)),
    }
}

/// Why `path` gives no checkpoint to read, in terms of what it is.
fn no_checkpoint(path: &Path) -> String {
    use crate::places::Place;
    let p = path.display();
    let take = "give a run directory (the --run-dir of `ember train`) or one checkpoint in it";
    if path.symlink_metadata().is_err() {
        return format!("{p} does not exist; {take}");
    }
    if !path.is_dir() {
        return format!("{p} is a file, not a run directory; {take}");
    }
    match crate::places::of(path) {
        Place::ModelFolder { manifest: true } => format!(
            "{p} is a model folder (`ember package` made it), not a run: translate, generate and \
             eval open it, but it holds no checkpoint to package, export or average; give the run \
             it came from (its model.json names the checkpoint)"
        ),
        place @ Place::ModelFolder { manifest: false } => format!(
            "{p} is {}: the folder is incomplete. Put its model.json back, or package the run \
             again (`ember package RUN {p}` into a new folder)",
            place.describe(path)
        ),
        place @ (Place::HfFolder | Place::Sweep) => format!(
            "{p} is {}, not a run; {}",
            place.describe(path),
            if place == Place::HfFolder {
                "train from it with `model.init_from`, then use that run"
            } else {
                "give one of the runs in its runs/ folder"
            }
        ),
        Place::Checkpoints { run } => format!(
            "{p} is the checkpoints folder of the run {} and holds no finished checkpoint yet; give \
             the run, or one checkpoint in it, once training has saved one",
            run.display()
        ),
        Place::Run => format!(
            "{p} is a run that has no finished checkpoint yet (training saves one every \
             checkpoint.every steps and when it ends); wait for one, or resume it"
        ),
        Place::Checkpoint { .. } => {
            format!("{p} has a {STATE} that is not a regular file, so it is not a checkpoint ember can read")
        }
        Place::Other => format!("{p} has no checkpoint (it is not a run directory); {take}"),
    }
}

/// Completed checkpoints of a run, oldest first (a directory without `state.json` is not one).
pub fn list(run_dir: &Path) -> Vec<(u64, PathBuf)> {
    let mut out: Vec<(u64, PathBuf)> = fs::read_dir(run_dir.join(CHECKPOINTS))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            let step = name.strip_prefix("step-")?.parse().ok()?;
            e.path().join(STATE).is_file().then(|| (step, e.path()))
        })
        .collect();
    out.sort();
    out
}

fn fsync_dir(dir: &Path) {
    // Directory fsync makes the rename durable on Linux; other platforms may refuse, harmlessly.
    if let Ok(f) = fs::File::open(dir) {
        let _ = f.sync_all();
    }
}

/// Writes a checkpoint atomically and returns its directory. Every failure names the file it
/// was writing (a full disk says where).
pub fn save(
    run_dir: &Path,
    mut state: CheckpointState,
    params: &ParamStore,
    optimizer: &HashMap<String, Tensor>,
    config_yaml: &str,
) -> Result<PathBuf> {
    let root = run_dir.join(CHECKPOINTS);
    fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let tmp = root.join(format!(
        ".tmp-{}-{}",
        step_dir_name(state.step),
        std::process::id()
    ));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).with_context(|| format!("removing {}", tmp.display()))?;
    }
    fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let written = write_into(&tmp, &mut state, params, optimizer, config_yaml);
    if let Err(e) = written {
        // A half-written checkpoint would only hold the space a full disk lacks; the
        // checkpoints saved before are untouched.
        let _ = fs::remove_dir_all(&tmp);
        return Err(with_disk_hint(e, &root));
    }
    let dest = root.join(step_dir_name(state.step));
    let moving = || format!("moving {} into place as {}", tmp.display(), dest.display());
    if dest.exists() {
        // Re-saving a step (e.g. final save right after a periodic one): replace it.
        let old = root.join(format!(
            ".old-{}-{}",
            step_dir_name(state.step),
            std::process::id()
        ));
        fs::rename(&dest, &old).with_context(moving)?;
        fs::rename(&tmp, &dest).with_context(moving)?;
        fs::remove_dir_all(&old).with_context(|| format!("removing {}", old.display()))?;
    } else {
        fs::rename(&tmp, &dest).with_context(moving)?;
    }
    fsync_dir(&root);
    Ok(dest)
}

/// A failed write on a full disk says what to do (and that nothing saved before is lost).
fn with_disk_hint(e: anyhow::Error, root: &Path) -> anyhow::Error {
    let full = e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().is_some_and(|io| {
            matches!(
                io.kind(),
                std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
            )
        }) || c.to_string().contains("No space left on device")
    });
    if !full {
        return e;
    }
    e.context(format!(
        "the disk that holds {} is full: free space there and run again (the half-written \
         checkpoint was removed; those saved before it are intact)",
        root.display()
    ))
}

/// Writes a checkpoint's files into the temporary directory `tmp` (and `state.files`, their
/// hashes).
fn write_into(
    tmp: &Path,
    state: &mut CheckpointState,
    params: &ParamStore,
    optimizer: &HashMap<String, Tensor>,
    config_yaml: &str,
) -> Result<()> {
    let writing = |p: &Path| format!("writing {}", p.display());
    // The config first: written the ordinary way, its mode is the one the weights are given.
    fs::write(tmp.join(RUN_CONFIG), config_yaml).with_context(|| writing(&tmp.join(RUN_CONFIG)))?;
    params
        .save(&tmp.join(MODEL))
        .with_context(|| writing(&tmp.join(MODEL)))?;
    candle_core::safetensors::save(optimizer, tmp.join(OPTIMIZER))
        .with_context(|| writing(&tmp.join(OPTIMIZER)))?;
    for name in [MODEL, OPTIMIZER] {
        ember_data::io::permissions_like(&tmp.join(name), &tmp.join(RUN_CONFIG))
            .with_context(|| writing(&tmp.join(name)))?;
    }
    state.files.clear();
    for name in [MODEL, OPTIMIZER, RUN_CONFIG] {
        let path = tmp.join(name);
        fs::File::open(&path)
            .and_then(|f| f.sync_all())
            .with_context(|| writing(&path))?;
        state.files.insert(name.to_string(), file_hash(&path)?);
    }
    let state_path = tmp.join(STATE);
    let mut f = fs::File::create(&state_path).with_context(|| writing(&state_path))?;
    f.write_all(serde_json::to_string_pretty(&state)?.as_bytes())
        .and_then(|()| f.sync_all())
        .with_context(|| writing(&state_path))?;
    fsync_dir(tmp);
    Ok(())
}

/// A held lock on a run's `checkpoints/` folder (released when dropped).
pub struct CheckpointsLock {
    _file: Option<LockFile>,
}

/// How long a run waits to save while a reader holds the checkpoints: past this it saves
/// anyway (a reader stopped mid-read must not stall training).
const WRITER_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// Locks `run_dir/checkpoints/` for writing (a save and the pruning after it). Waits for
/// readers up to `WRITER_PATIENCE`, then goes on without the lock; a lock file that cannot
/// be used (a link put in its place) never stops a run from saving its steps.
pub fn lock_for_writing(run_dir: &Path) -> Result<CheckpointsLock> {
    use fs4::fs_std::FileExt;
    let root = run_dir.join(CHECKPOINTS);
    fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let file = match open_lock_file(&root.join(LOCK_FILE)) {
        Ok(file) => file,
        Err(e) => {
            // Said once per process: every save after it goes the same way.
            static WARNED: std::sync::Once = std::sync::Once::new();
            let path = root.join(LOCK_FILE);
            let why = fs::symlink_metadata(&path)
                .ok()
                .and_then(|meta| not_a_lock_file(&meta, &path))
                .map_or_else(
                    || format!("cannot be opened ({})", e.root_cause()),
                    |w| format!("is {w}"),
                );
            WARNED.call_once(|| {
                crate::tell!(
                    "warning: {} {why}, not a lock file ember can use: checkpoints are saved \
                     without the readers' lock, so an `ember average` run meanwhile may find one \
                     pruned under it. Remove it (`rm {}`) to have the lock back.",
                    path.display(),
                    path.display()
                )
            });
            return Ok(CheckpointsLock { _file: None });
        }
    };
    let started = std::time::Instant::now();
    loop {
        match FileExt::try_lock_exclusive(&*file) {
            Ok(true) => return Ok(CheckpointsLock { _file: Some(file) }),
            Ok(false) if started.elapsed() < WRITER_PATIENCE => {
                std::thread::sleep(std::time::Duration::from_millis(50))
            }
            _ => return Ok(CheckpointsLock { _file: None }),
        }
    }
}

/// Locks `run_dir/checkpoints/` for reading, waiting for a save in progress to end. A run
/// without a `checkpoints/` folder (or one that cannot be locked) is read without the lock.
pub fn lock_for_reading(run_dir: &Path) -> Result<CheckpointsLock> {
    use fs4::fs_std::FileExt;
    let root = run_dir.join(CHECKPOINTS);
    if !root.is_dir() {
        return Ok(CheckpointsLock { _file: None });
    }
    let file = open_lock_file(&root.join(LOCK_FILE))?;
    FileExt::lock_shared(&*file).with_context(|| format!("locking {}", root.join(LOCK_FILE).display()))?;
    Ok(CheckpointsLock { _file: Some(file) })
}

/// Reads and verifies one checkpoint directory.
pub fn load(dir: &Path, device: &Device) -> Result<Loaded> {
    let state = verify(dir)?;
    let params = ParamStore::load(&dir.join(MODEL), candle_core::DType::F32, device)
        .with_context(|| format!("loading {}", dir.join(MODEL).display()))?;
    let optimizer = candle_core::safetensors::load(dir.join(OPTIMIZER), device)
        .with_context(|| format!("loading {}", dir.join(OPTIMIZER).display()))?;
    Ok(Loaded {
        dir: dir.to_path_buf(),
        state,
        params,
        optimizer,
    })
}

/// Checks one checkpoint directory without loading it: its `state.json` agrees with itself and
/// its directory, and every file matches the checksum recorded when it was saved.
pub fn verify(dir: &Path) -> Result<CheckpointState> {
    let state_path = dir.join(STATE);
    let text = ember_data::io::read_own_to_string(&state_path).with_context(|| {
        format!(
            "{} is missing: the checkpoint is incomplete",
            state_path.display()
        )
    })?;
    let state: CheckpointState = serde_json::from_str(&text)
        .with_context(|| format!("{} is corrupt (not valid checkpoint JSON)", state_path.display()))?;
    check_state(dir, &state_path, &state)?;
    for name in [MODEL, OPTIMIZER, RUN_CONFIG] {
        let expected = state
            .files
            .get(name)
            .with_context(|| format!("{} lists no checksum for {name}", state_path.display()))?;
        let path = dir.join(name);
        let actual = file_hash(&path).with_context(|| format!("{} is missing", path.display()))?;
        if &actual != expected {
            bail!(
                "{} is corrupt: its SHA-256 does not match the one recorded when it was saved \
                 (the file was truncated or modified)",
                path.display()
            );
        }
    }
    Ok(state)
}

/// The step a checkpoint directory's name gives (`step-00000020` → 20; `None` for other names,
/// such as `average-last-5`).
fn step_of_dir(dir: &Path) -> Option<u64> {
    dir.file_name()?.to_str()?.strip_prefix("step-")?.parse().ok()
}

/// `state.json` must agree with the directory it sits in and with itself: a state copied from
/// another checkpoint (or edited) would resume at the wrong step and overwrite a checkpoint.
fn check_state(dir: &Path, state_path: &Path, state: &CheckpointState) -> Result<()> {
    let corrupt = |what: String| {
        anyhow::anyhow!(
            "{} is inconsistent: {what}. It was edited or copied from another checkpoint; restore \
             it, or resume with --fallback to continue from the newest intact checkpoint. Nothing \
             was changed.",
            state_path.display()
        )
    };
    if let Some(step) = step_of_dir(dir) {
        if step != state.step {
            return Err(corrupt(format!(
                "it says step {} but its directory {} holds step {step}",
                state.step,
                dir.display()
            )));
        }
    }
    if state.optimizer_step > state.step {
        return Err(corrupt(format!(
            "optimizer_step {} is past step {}",
            state.optimizer_step, state.step
        )));
    }
    Ok(())
}

/// Deletes all but the newest `keep_last` checkpoints, sparing the best one.
pub fn prune(run_dir: &Path, keep_last: usize, best_step: Option<u64>) -> Result<()> {
    let all = list(run_dir);
    let cutoff = all.len().saturating_sub(keep_last);
    for (step, dir) in &all[..cutoff] {
        if Some(*step) != best_step {
            fs::remove_dir_all(dir).with_context(|| format!("removing old checkpoint {}", dir.display()))?;
        }
    }
    // Temporary directories of crashed saves by this or earlier processes.
    for entry in fs::read_dir(run_dir.join(CHECKPOINTS))
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().to_string();
        if name.starts_with(".tmp-") && !name.ends_with(&format!("-{}", std::process::id())) {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
    Ok(())
}

/// Names the model-config fields that differ, for the refusal message.
pub fn config_differences(saved: &ModelConfig, current: &ModelConfig) -> Vec<String> {
    let a = serde_json::to_value(saved).unwrap_or_default();
    let b = serde_json::to_value(current).unwrap_or_default();
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return vec![];
    };
    a.iter()
        .filter(|(k, v)| b.get(*k) != Some(v))
        .map(|(k, v)| {
            format!(
                "model.{k}: checkpoint {v}, config {}",
                b.get(k).cloned().unwrap_or_default()
            )
        })
        .collect()
}

/// Who is writing `run_dir`'s checkpoints now, in words: a training run holding its lock, or a
/// save in progress (its temporary folder); `None` when nobody is.
fn being_written(run_dir: &Path) -> Option<String> {
    if let Some(holder) = crate::run_lock::holder(run_dir) {
        return Some(format!("the run is training now ({holder})"));
    }
    fs::read_dir(run_dir.join(CHECKPOINTS))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .find(|n| {
            // A save's temporary folder ends with the saving process's id: a live one is saving.
            let pid = n.rsplit('-').next().and_then(|p| p.parse::<u32>().ok());
            (n.starts_with(".tmp-") || n.starts_with(".old-"))
                && pid.is_some_and(|p| Path::new("/proc").join(p.to_string()).exists())
        })
        .map(|n| {
            format!(
                "a checkpoint is being saved ({}/{n})",
                run_dir.join(CHECKPOINTS).display()
            )
        })
}

/// Averages the weights of the newest `last` checkpoints into `checkpoints/average-last-N/`
/// (Vaswani et al. 2017; fairseq's `average_checkpoints.py`). The result is a checkpoint for
/// evaluation and decoding; it carries the newest checkpoint's state, and `--resume` ignores it.
pub fn average(run_dir: &Path, last: usize) -> Result<PathBuf> {
    if last == 0 {
        bail!("--last must be at least 1");
    }
    if !run_dir.join(CHECKPOINTS).is_dir() {
        bail!(
            "{} has no {CHECKPOINTS}/ folder: give a run directory (the --run-dir of `ember train`)",
            run_dir.display()
        );
    }
    // A run training now saves and prunes under this lock: the checkpoints listed are there
    // until they are read.
    let reading = lock_for_reading(run_dir)?;
    let all = list(run_dir);
    if all.len() < last {
        if let Some(busy) = being_written(run_dir) {
            bail!(
                "{} has {} finished checkpoint(s), fewer than --last {last}, because its checkpoints \
                 are being written: {busy}, saving and pruning as it goes. Average once it has saved \
                 {last} (or has finished), or lower --last",
                run_dir.display(),
                all.len()
            );
        }
        bail!(
            "{} has {} checkpoint(s), fewer than --last {last}; lower --last (a run keeps its newest \
             checkpoint.keep_last, so wait for more to be saved or raise checkpoint.keep_last for the \
             next run)",
            run_dir.display(),
            all.len()
        );
    }
    let chosen = &all[all.len() - last..];
    let device = Device::Cpu;
    let mut sum: Option<HashMap<String, Tensor>> = None;
    let mut newest = None;
    for (_, dir) in chosen {
        let loaded = load(dir, &device).map_err(|e| match being_written(run_dir) {
            Some(busy) => e.context(format!(
                "{} changed while it was read, because the run's checkpoints are being written \
                 ({busy}); average again",
                dir.display()
            )),
            None => e,
        })?;
        let tensors: HashMap<String, Tensor> = loaded
            .params
            .vars()
            .into_iter()
            .map(|(k, v)| (k, v.as_tensor().clone()))
            .collect();
        sum = Some(match sum {
            None => tensors,
            Some(mut acc) => {
                for (name, t) in tensors {
                    let a = acc.get(&name).with_context(|| {
                        format!(
                            "{} has parameter {name} that older checkpoints lack",
                            dir.display()
                        )
                    })?;
                    let s = (a + t)?;
                    acc.insert(name, s);
                }
                acc
            }
        });
        newest = Some(loaded);
    }
    let (sum, newest) = (sum.expect("last ≥ 1"), newest.expect("last ≥ 1"));
    drop(reading);
    let averaged = sum
        .into_iter()
        .map(|(k, t)| Ok((k, (t / last as f64)?)))
        .collect::<Result<Vec<_>>>()?;
    let params = ParamStore::from_tensors(averaged, candle_core::DType::F32, &device)?;
    let config = ember_data::io::read_own_to_string(newest.dir.join(RUN_CONFIG))?;
    let tmp_root = run_dir.join(format!(".average-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp_root);
    let dest = run_dir.join(CHECKPOINTS).join(format!("average-last-{last}"));
    let placed = save(
        &tmp_root,
        newest.state.clone(),
        &params,
        &newest.optimizer,
        &config,
    )
    .and_then(|written| {
        if dest.exists() {
            fs::remove_dir_all(&dest).with_context(|| format!("replacing {}", dest.display()))?;
        }
        fs::rename(&written, &dest).with_context(|| format!("moving the average into {}", dest.display()))
    });
    // The temporary folder goes whether or not the average was written.
    let _ = fs::remove_dir_all(&tmp_root);
    placed?;
    Ok(dest)
}

#[cfg(test)]
mod tests;
