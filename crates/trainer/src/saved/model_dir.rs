//! A model folder: one checkpoint's weights with the tokenizer and config that give them meaning,
//! and nothing else — the form a trained model is released in, and that `ember translate`,
//! `ember generate` and `ember eval` open in place of a run.
//!
//! ```text
//! multi30k-layernorm/
//! ├── model.json               MANIFEST: format, the checkpoint it came from, SHA-256 of the rest
//! ├── model.safetensors        MODEL: the weights, as in a checkpoint
//! ├── config.yaml              RUN_CONFIG: the config the checkpoint was trained with
//! ├── tokenizer.json           the run's tokenizer
//! └── tokenizer_config.json    a pretrained tokenizer's special tokens (only for those)
//! ```
//!
//! A checkpoint cannot serve as one: it needs the run directory around it for its tokenizer,
//! and carries the optimizer's moments (twice the weights) that only a resume reads.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device};
use ember_data::{Tokenizer, TokenizerKind, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE};
use ember_model::{LengthPenalty, ParamStore};
use serde::{Deserialize, Serialize};

use crate::checkpoint::{self, file_hash};
use crate::config::RunConfig;
use crate::protected::Output;
use crate::run::files::write_atomic;
use crate::run_dir::{MODEL, RUN_CONFIG};

/// The manifest that makes a folder a model folder.
pub const MANIFEST: &str = "model.json";

/// [`Manifest::format`]'s one value.
const FORMAT: &str = "ember-model";
/// The layout version this build writes and reads.
const VERSION: u32 = 1;

/// `model.json`: what the folder is, where it came from, and the checksum of every other file.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    /// The checkpoint directory the weights were read from, as it was given.
    pub source: String,
    /// The training step of that checkpoint (of the newest one averaged, for an average).
    pub step: u64,
    /// The Ember version that wrote the folder.
    pub ember: String,
    /// SHA-256 of each file in the folder except this one.
    pub files: BTreeMap<String, String>,
}

/// Whether `dir` is a model folder (it holds a [`MANIFEST`]).
pub fn is_model_dir(dir: &Path) -> bool {
    dir.join(MANIFEST).is_file()
}

/// What [`package`] wrote.
#[derive(Clone, Debug, Serialize)]
pub struct Packaged {
    pub dir: PathBuf,
    pub checkpoint: PathBuf,
    pub step: u64,
    /// Bytes of every file in the folder.
    pub bytes: u64,
}

/// Writes the model folder `out` from a run (its newest checkpoint) or one checkpoint directory
/// (e.g. `checkpoints/average-last-10`). `out` is checked first by the one rule of
/// [`crate::protected`] (new, and not in a checkpoint, model folder or Hugging Face folder),
/// then the checkpoint is verified; the folder is written beside `out` and renamed into place,
/// so `out` is whole or absent.
///
/// `length_penalty`, when given, becomes the folder config's `eval.length_penalty`: the decoding
/// the model was chosen with, which `ember translate` and `ember eval` then use by default.
pub fn package(source: &Path, out: &Path, length_penalty: Option<LengthPenalty>) -> Result<Packaged> {
    crate::protected::check(out, "OUT", Output::Folder, &[source], &[])?;
    let (run_dir, ckpt_dir) = checkpoint::run_and_checkpoint(source)?;
    // Every file of the checkpoint against its state.json, before anything is copied (the
    // weights are copied as bytes, never loaded).
    let state = checkpoint::verify(&ckpt_dir)?;
    let config_text = ember_data::io::read_own_to_string(ckpt_dir.join(RUN_CONFIG))
        .with_context(|| format!("reading {}", ckpt_dir.join(RUN_CONFIG).display()))?;
    let mut cfg = RunConfig::from_yaml(&config_text, &ckpt_dir.join(RUN_CONFIG), &[])?;
    let config_text = match length_penalty {
        Some(penalty) => {
            penalty
                .check()
                .map_err(|e| anyhow::anyhow!("--length-penalty: {e}"))?;
            cfg.eval.length_penalty = Some(penalty);
            cfg.to_yaml()
        }
        None => config_text,
    };
    let tokenizer = read_tokenizer(&run_dir, cfg.data.tokenizer.kind)?;
    check_tokenizer_fits(&tokenizer, &run_dir, &cfg)?;
    let bytes = crate::protected::write_folder(out, |tmp| {
        fs::copy(ckpt_dir.join(MODEL), tmp.join(MODEL))
            .with_context(|| format!("writing {}", tmp.join(MODEL).display()))?;
        write_atomic(&tmp.join(RUN_CONFIG), config_text.as_bytes())?;
        // fs::copy keeps the checkpoint's mode: give the weights the umask's, as the config has.
        ember_data::io::permissions_like(&tmp.join(MODEL), &tmp.join(RUN_CONFIG))
            .with_context(|| format!("writing {}", tmp.join(MODEL).display()))?;
        tokenizer.save_in(tmp)?;
        let mut files = BTreeMap::new();
        for name in [MODEL, RUN_CONFIG, TOKENIZER_FILE, TOKENIZER_CONFIG_FILE] {
            if tmp.join(name).is_file() {
                files.insert(name.to_string(), file_hash(&tmp.join(name))?);
            }
        }
        let manifest = Manifest {
            format: FORMAT.into(),
            version: VERSION,
            source: ckpt_dir.display().to_string(),
            step: state.step,
            ember: env!("CARGO_PKG_VERSION").into(),
            files,
        };
        let json = serde_json::to_string_pretty(&manifest)? + "\n";
        write_atomic(&tmp.join(MANIFEST), json.as_bytes())?;
        let mut bytes = 0;
        for entry in fs::read_dir(tmp)? {
            bytes += entry?.metadata()?.len();
        }
        Ok(bytes)
    })?;
    Ok(Packaged {
        dir: out.to_path_buf(),
        checkpoint: ckpt_dir,
        step: state.step,
        bytes,
    })
}

/// Checks a model folder without loading it: its manifest is one this build reads, names the
/// files a model needs, and every file matches its checksum.
pub fn verify(dir: &Path) -> Result<Manifest> {
    let manifest_path = dir.join(MANIFEST);
    let text = ember_data::io::read_own_to_string(&manifest_path)
        .with_context(|| format!("reading {}", manifest_path.display()))?;
    let manifest: Manifest = serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not a model folder's manifest (not the JSON `ember package` writes)",
            manifest_path.display()
        )
    })?;
    if manifest.format != FORMAT || manifest.version != VERSION {
        bail!(
            "{} is format {:?} version {}; this build reads {FORMAT:?} version {VERSION}",
            manifest_path.display(),
            manifest.format,
            manifest.version
        );
    }
    for name in [MODEL, RUN_CONFIG, TOKENIZER_FILE] {
        if !manifest.files.contains_key(name) {
            bail!(
                "{} lists no {name}: the folder is incomplete",
                manifest_path.display()
            );
        }
    }
    for (name, expected) in &manifest.files {
        let path = dir.join(name);
        let actual = file_hash(&path).with_context(|| format!("{} is missing", path.display()))?;
        if &actual != expected {
            bail!(
                "{} is corrupt: its SHA-256 does not match the one in {MANIFEST} (the file was \
                 truncated or modified); restore the folder",
                path.display()
            );
        }
    }
    Ok(manifest)
}

/// The tokenizer and weights of a [`verify`]d model folder whose `config.yaml` is `cfg`.
pub fn read(dir: &Path, cfg: &RunConfig, device: &Device) -> Result<(Tokenizer, ParamStore)> {
    let tokenizer = read_tokenizer(dir, cfg.data.tokenizer.kind)?;
    check_tokenizer_fits(&tokenizer, dir, cfg)?;
    let params = ParamStore::load(&dir.join(MODEL), DType::F32, device)
        .with_context(|| format!("loading {}", dir.join(MODEL).display()))?;
    Ok((tokenizer, params))
}

/// The tokenizer a run directory (or model folder) holds, read as the run wrote it.
pub(crate) fn read_tokenizer(dir: &Path, kind: TokenizerKind) -> Result<Tokenizer> {
    Ok(match kind {
        TokenizerKind::Pretrained => Tokenizer::load_pretrained(dir)?,
        _ => Tokenizer::load(dir.join(TOKENIZER_FILE))?,
    })
}

/// The tokenizer of `dir` must give ids the model has rows for: as many as `model.vocab_size`,
/// or (a pretrained model's padded embedding) no more.
pub(crate) fn check_tokenizer_fits(tokenizer: &Tokenizer, dir: &Path, cfg: &RunConfig) -> Result<()> {
    let path = dir.join(TOKENIZER_FILE);
    let vocab = tokenizer.vocab_size();
    let Some(rows) = cfg.model.vocab_size else {
        bail!(
            "{} has no model.vocab_size: it is not the config of a trained model (a run fills it in \
             from its tokenizer)",
            dir.join(RUN_CONFIG).display()
        );
    };
    let fits = match tokenizer.kind() {
        TokenizerKind::Pretrained => vocab <= rows,
        _ => vocab == rows,
    };
    if !fits {
        bail!(
            "{} has {vocab} tokens but the model has {rows} embedding rows (model.vocab_size): it is \
             not the tokenizer this model was trained with; restore the original",
            path.display()
        );
    }
    Ok(())
}
