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

pub const CHECKPOINTS: &str = "checkpoints";
const STATE: &str = "state.json";
const MODEL: &str = "model.safetensors";
const OPTIMIZER: &str = "optimizer.safetensors";
const CONFIG: &str = "config.yaml";

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
    /// [`crate::run_state::SPIKE_FACTOR`] × `initial_val_loss`.
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
fn file_hash(path: &Path) -> Result<String> {
    let reading = || format!("reading {}", path.display());
    let mut file = fs::File::open(path).with_context(reading)?;
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
/// in `<run>/checkpoints/`; a run directory stands for its newest checkpoint.
pub fn run_and_checkpoint(run: &Path) -> Result<(PathBuf, PathBuf)> {
    if run.join("state.json").is_file() {
        let run_dir = run
            .parent()
            .and_then(Path::parent)
            .context("a checkpoint directory must sit in <run>/checkpoints/")?;
        Ok((run_dir.to_path_buf(), run.to_path_buf()))
    } else {
        let newest = list(run)
            .pop()
            .with_context(|| format!("{} has no checkpoint (is it a run directory?)", run.display()))?;
        Ok((run.to_path_buf(), newest.1))
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

/// Writes a checkpoint atomically and returns its directory.
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
        fs::remove_dir_all(&tmp)?;
    }
    fs::create_dir_all(&tmp)?;
    params
        .save(&tmp.join(MODEL))
        .context("writing model.safetensors")?;
    candle_core::safetensors::save(optimizer, tmp.join(OPTIMIZER))
        .context("writing optimizer.safetensors")?;
    fs::write(tmp.join(CONFIG), config_yaml)?;
    state.files.clear();
    for name in [MODEL, OPTIMIZER, CONFIG] {
        let path = tmp.join(name);
        fs::File::open(&path)?.sync_all()?;
        state.files.insert(name.to_string(), file_hash(&path)?);
    }
    let mut f = fs::File::create(tmp.join(STATE))?;
    f.write_all(serde_json::to_string_pretty(&state)?.as_bytes())?;
    f.sync_all()?;
    fsync_dir(&tmp);
    let dest = root.join(step_dir_name(state.step));
    if dest.exists() {
        // Re-saving a step (e.g. final save right after a periodic one): replace it.
        let old = root.join(format!(
            ".old-{}-{}",
            step_dir_name(state.step),
            std::process::id()
        ));
        fs::rename(&dest, &old)?;
        fs::rename(&tmp, &dest)?;
        fs::remove_dir_all(&old)?;
    } else {
        fs::rename(&tmp, &dest)?;
    }
    fsync_dir(&root);
    Ok(dest)
}

/// Reads and verifies one checkpoint directory.
pub fn load(dir: &Path, device: &Device) -> Result<Loaded> {
    let state_path = dir.join(STATE);
    let text = fs::read_to_string(&state_path).with_context(|| {
        format!(
            "{} is missing: the checkpoint is incomplete",
            state_path.display()
        )
    })?;
    let state: CheckpointState = serde_json::from_str(&text)
        .with_context(|| format!("{} is corrupt (not valid checkpoint JSON)", state_path.display()))?;
    for name in [MODEL, OPTIMIZER, CONFIG] {
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

/// Averages the weights of the newest `last` checkpoints into `checkpoints/average-last-N/`
/// (Vaswani et al. 2017; fairseq's `average_checkpoints.py`). The result is a checkpoint for
/// evaluation and decoding; it carries the newest checkpoint's state, and `--resume` ignores it.
pub fn average(run_dir: &Path, last: usize) -> Result<PathBuf> {
    if last == 0 {
        bail!("--last must be at least 1");
    }
    let all = list(run_dir);
    if all.len() < last {
        bail!(
            "{} has {} checkpoint(s), fewer than --last {last}; lower --last or raise checkpoint.keep_last",
            run_dir.display(),
            all.len()
        );
    }
    let chosen = &all[all.len() - last..];
    let device = Device::Cpu;
    let mut sum: Option<HashMap<String, Tensor>> = None;
    let mut newest = None;
    for (_, dir) in chosen {
        let loaded = load(dir, &device)?;
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
    let averaged = sum
        .into_iter()
        .map(|(k, t)| Ok((k, (t / last as f64)?)))
        .collect::<Result<Vec<_>>>()?;
    let params = ParamStore::from_tensors(averaged, candle_core::DType::F32, &device)?;
    let config = fs::read_to_string(newest.dir.join(CONFIG))?;
    let tmp_root = run_dir.join(format!(".average-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp_root);
    let written = save(
        &tmp_root,
        newest.state.clone(),
        &params,
        &newest.optimizer,
        &config,
    )?;
    let dest = run_dir.join(CHECKPOINTS).join(format!("average-last-{last}"));
    if dest.exists() {
        fs::remove_dir_all(&dest)?;
    }
    fs::rename(&written, &dest)?;
    fs::remove_dir_all(&tmp_root)?;
    Ok(dest)
}
