//! What `--resume` verifies before continuing a run: that the tokenizer and the data are the
//! ones the checkpoint was trained on, and which config keys changed.
//!
//! - **Tokenizer**: the SHA-256 of `tokenizer.json` is stored in every checkpoint's `state.json`.
//!   A missing or different tokenizer is refused (a new one would give most ids another meaning
//!   and the model would silently learn from scratch), unless `--allow-tokenizer-change`.
//! - **Data**: a fingerprint of every split's text ([`ember_data::RawCorpus::fingerprint`]) is
//!   stored too; a different corpus, or a change of the keys that select examples from it
//!   (`data.max_source_len`, `data.max_target_len`, `data.too_long`), is refused unless
//!   `--allow-data-change`.
//! - **Compute**: the vector unit (or `CUDA`) that computed the checkpoint's steps is recorded;
//!   resuming on another (another CPU, or `EMBER_CPU_VECTOR_UNIT`) continues from the same
//!   state with a warning that the run is no longer bit-identical to an uninterrupted one, as a
//!   changed split of the batches does.
//! - **Precision**: `train.precision` changes the numerics of every product, so a run continued
//!   in another precision is not the run its checkpoints describe: refused unless
//!   `--allow-precision-change`.
//! - **Config**: model keys were never allowed to change (the checkpoint's tensors would not
//!   fit); every other change is listed, the previous `config.yaml` is kept under
//!   `config-history/`, and the run goes on.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use ember_data::{Dataset, TOKENIZER_FILE};
use ember_kernels::Precision;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::checkpoint::CheckpointState;
use crate::config::RunConfig;
use crate::run_dir::{CONFIG_HISTORY, RUN_CONFIG};

/// What a run was trained on, as recorded in each checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunIdentity {
    pub tokenizer_sha256: String,
    pub data_fingerprint: String,
}

impl RunIdentity {
    pub fn of(data: &Dataset) -> Result<Self> {
        let json = data.tokenizer.to_json()?;
        Ok(Self {
            tokenizer_sha256: sha256_hex(json.as_bytes()),
            data_fingerprint: data.raw.fingerprint(),
        })
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// What computes a run's steps on `device` in `precision`: the CPU's vector unit (as
/// [`ember_kernels::vector_unit`] names it, `EMBER_CPU_VECTOR_UNIT` included), `AMX` for bf16
/// products on its tiles ([`Precision::cpu_unit`](ember_kernels::Precision::cpu_unit)), or `CUDA`.
pub fn compute_unit(device: &candle_core::Device, precision: ember_kernels::Precision) -> String {
    if device.is_cpu() {
        precision.cpu_unit().to_string()
    } else {
        "CUDA".to_string()
    }
}

/// The units a run resumed from `saved` has computed with, `now` added, and a warning when
/// `now` is not the one the checkpoint's last steps were computed with.
pub fn vector_units(saved: &CheckpointState, checkpoint: &Path, now: &str) -> (Vec<String>, Option<String>) {
    let mut units = saved.vector_units.clone();
    let warning = units
        .last()
        .filter(|last| *last != now)
        .map(|last| unit_change(last, now, checkpoint));
    if !units.iter().any(|u| u == now) {
        units.push(now.to_string());
    }
    (units, warning)
}

/// The warning for a run computed with `before` that goes on with `now`.
fn unit_change(before: &str, now: &str, checkpoint: &Path) -> String {
    let env = ember_kernels::VECTOR_UNIT_ENV;
    let chosen = std::env::var(env)
        .map(|v| format!(" ({env}={v})"))
        .unwrap_or_default();
    let back = match before {
        "AVX-512" => format!("; set {env}=avx512 (or unset it) to go on with AVX-512 where the CPU has it"),
        "AVX2" => format!("; set {env}=avx2 to go on with AVX2"),
        "AMX" => format!("; unset {env} on a CPU with AMX to go on with its tiles"),
        "CUDA" => "; resume on the GPU to go on as before".to_string(),
        _ => format!("; set {env}=baseline to go on as before"),
    };
    format!(
        "the checkpoint {} was computed with {before}, this run computes with {now}{chosen}: it \
         continues from the same state, but its numbers differ in the last digits from a run \
         that stayed on {before}, so it is no longer bit-identical to one{back}",
        checkpoint.display()
    )
}

/// The changes `--resume` accepts without refusing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Allowed {
    pub data_change: bool,
    pub tokenizer_change: bool,
    pub precision_change: bool,
}

/// Before the data is prepared: a resumed run's tokenizer must exist, or preparing the data
/// would train a new one.
pub fn check_tokenizer_present(run_dir: &Path, checkpoint: &Path, allowed: Allowed) -> Result<()> {
    let path = run_dir.join(TOKENIZER_FILE);
    if path.exists() || allowed.tokenizer_change {
        return Ok(());
    }
    bail!(
        "cannot resume: {} is missing, and the checkpoint {} was trained with it. A new tokenizer \
         would give most token ids another meaning, so none is trained on resume. Put the run's \
         tokenizer.json back (from a backup or a copy of the run directory) and resume again; \
         or pass --allow-tokenizer-change to train a new one anyway (the model then starts over \
         on ids it has not seen), or start a new run directory.",
        path.display(),
        checkpoint.display()
    )
}

/// After the data is prepared: the tokenizer and the data must be the checkpoint's.
/// Returns notes on the changes that were allowed.
pub fn check_identity(
    saved: &CheckpointState,
    now: &RunIdentity,
    checkpoint: &Path,
    run_dir: &Path,
    allowed: Allowed,
) -> Result<Vec<String>> {
    let mut notes = vec![];
    if let Some(old) = &saved.tokenizer_sha256 {
        if *old != now.tokenizer_sha256 {
            if !allowed.tokenizer_change {
                bail!(
                    "cannot resume: {} is not the tokenizer the checkpoint {} was trained with \
                     (SHA-256 {} now, {} then), so token ids would change meaning. Restore the \
                     run's original tokenizer.json, or pass --allow-tokenizer-change to continue \
                     with this one anyway.",
                    run_dir.join(TOKENIZER_FILE).display(),
                    checkpoint.display(),
                    short(&now.tokenizer_sha256),
                    short(old)
                );
            }
            notes.push(format!(
                "the tokenizer differs from the checkpoint's (SHA-256 {} now, {} then): allowed by --allow-tokenizer-change",
                short(&now.tokenizer_sha256),
                short(old)
            ));
        }
    }
    if let Some(old) = &saved.data_fingerprint {
        if *old != now.data_fingerprint {
            if !allowed.data_change {
                bail!(
                    "cannot resume: the data differs from what the checkpoint {} was trained on \
                     (fingerprint of every split's text {} now, {} then: a file of data.corpus \
                     changed, or another one is named). Resume with the original data, or pass \
                     --allow-data-change to continue on this data.",
                    checkpoint.display(),
                    short(&now.data_fingerprint),
                    short(old)
                );
            }
            notes.push(format!(
                "the data differs from the checkpoint's (fingerprint {} now, {} then): allowed by --allow-data-change",
                short(&now.data_fingerprint),
                short(old)
            ));
        }
    }
    Ok(notes)
}

fn short(hash: &str) -> &str {
    &hash[..hash.len().min(12)]
}

/// One config key whose value differs from the checkpoint's config.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub key: String,
    pub before: Value,
    pub after: Value,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} → {}", self.key, self.before, self.after)
    }
}

/// Keys that decide which examples the data yields: changing them is a data change.
const DATA_SELECTION_KEYS: &[&str] = &["data.max_source_len", "data.max_target_len", "data.too_long"];

/// The differences between the checkpoint's config and `now` (`ablation:`, which `train` never
/// reads, is left out), refusing the ones that need a flag.
pub fn config_changes(
    saved_yaml: &str,
    checkpoint: &Path,
    now: &RunConfig,
    allowed: Allowed,
) -> Result<Vec<Change>> {
    let mut saved = RunConfig::from_yaml(saved_yaml, &checkpoint.join(RUN_CONFIG), &[])
        .with_context(|| format!("reading the config stored in {}", checkpoint.display()))?;
    let mut now = now.clone();
    saved.ablation = None;
    now.ablation = None;
    let (a, b) = (serde_json::to_value(&saved)?, serde_json::to_value(&now)?);
    let mut changes = json_changes(&a, &b);
    // A config at the default leaves these keys out (its files stay as before the key
    // existed): say the default.
    let defaults = [
        ("train.precision", Precision::F32.name()),
        ("train.activations", "keep"),
    ];
    for c in &mut changes {
        let Some((_, default)) = defaults.iter().find(|(key, _)| c.key == *key) else {
            continue;
        };
        for v in [&mut c.before, &mut c.after] {
            if v.is_null() {
                *v = Value::String((*default).into());
            }
        }
    }
    let selection: Vec<&Change> = changes
        .iter()
        .filter(|c| DATA_SELECTION_KEYS.contains(&c.key.as_str()))
        .collect();
    if !selection.is_empty() && !allowed.data_change {
        bail!(
            "cannot resume: {} select(s) which examples the run trains on, and changing it \
             mid-run changes the data: {}. Resume with the run's value, or pass \
             --allow-data-change.",
            selection
                .iter()
                .map(|c| c.key.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            selection
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    if saved.train.precision != now.train.precision && !allowed.precision_change {
        bail!(
            "cannot resume: the checkpoint {} was trained with train.precision: {}, and the config              now says {}. A run continued in another precision is no longer the run its              checkpoints describe (every product's rounding changes). Resume with              train.precision: {}, or pass --allow-precision-change to continue in {} anyway.",
            checkpoint.display(),
            saved.train.precision,
            now.train.precision,
            saved.train.precision,
            now.train.precision
        );
    }
    Ok(changes)
}

/// Every leaf where two JSON documents differ, keyed by its dotted path (`train.lr`), in key
/// order; a key missing on one side counts as `null` there.
pub fn json_changes(a: &Value, b: &Value) -> Vec<Change> {
    let mut out = vec![];
    diff("", a, b, &mut out);
    out
}

fn diff(prefix: &str, a: &Value, b: &Value, out: &mut Vec<Change>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                diff(
                    &key,
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                    out,
                );
            }
        }
        _ if a != b => out.push(Change {
            key: prefix.to_string(),
            before: a.clone(),
            after: b.clone(),
        }),
        _ => {}
    }
}

/// Keeps `src` (the config the checkpoint at `step` was trained with) as
/// `config-history/config.step-NNNNNNNN.yaml` before a resumed run with changed keys replaces
/// the run's `config.yaml`.
pub fn keep_config_history(run_dir: &Path, src: &Path, step: u64) -> Result<PathBuf> {
    let dir = run_dir.join(CONFIG_HISTORY);
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let dest = dir.join(format!("config.step-{step:08}.yaml"));
    fs::copy(src, &dest).with_context(|| format!("copying {} to {}", src.display(), dest.display()))?;
    Ok(dest)
}
