//! The weights of a model folder — `model.safetensors`, or the shards that
//! `model.safetensors.index.json` lists — as Ember's f32 parameters.
//!
//! Every file's header is read first and checked against the model config: each parameter the
//! model needs is there with its shape and a float dtype, and no tensor is left that Ember would
//! silently drop (a bias, an expert). Only then are values read, one shard at a time and one
//! tensor at a time into the parameter store, so the peak is the f32 parameters plus one shard;
//! each tensor's values are checked to be finite as they are read (a NaN or Inf is named by
//! tensor and file, before any training step).
//!
//! Which files: `model.safetensors` when it is there, as transformers reads it (a stale
//! `model.safetensors.index.json` and its shards beside it are left alone, and said so), else
//! the shards the index lists. A head saved beside a config that ties it to the embedding is
//! dropped as transformers drops it, with a warning when it differs from the embedding. Every
//! file is opened as other inputs are ([`ember_data::io`]): a FIFO or device in a weight file's
//! place is refused by name at once.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::safetensors::Load;
use candle_core::{DType, Device, Tensor};
use ember_model::{ModelConfig, ParamStore, QkNorm};
use safetensors::tensor::TensorInfo;
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

use crate::names::{ember_weight_name, hf_weight_name};

/// The weights of an unsharded model.
pub const SINGLE_FILE: &str = "model.safetensors";
/// The tensor → shard map of a sharded one.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// safetensors' own bound on a header (the crate refuses larger ones too).
const MAX_HEADER_BYTES: u64 = 100_000_000;
/// A shard index larger than this is not one (real ones are kilobytes to a few megabytes).
const MAX_INDEX_BYTES: u64 = 1 << 26;
/// Why a weight file must be a regular file, for the refusal of a FIFO in its place.
const IN_PLACE: &str = "safetensors weights are read in place (the header, then each tensor), so \
                        they must be a regular file";

/// What [`load`] read: the parameters under Ember's names, and what the user should be told
/// about the folder (which weight files were read, a head that is not used).
pub struct Imported {
    pub params: ParamStore,
    pub notes: Vec<String>,
}

/// One tensor of the folder, as its file's header describes it.
#[derive(Debug, Clone)]
struct Entry {
    file: PathBuf,
    info: TensorInfo,
}

/// Ember's parameter names and shapes for `cfg`, a decoder-only model (what `Model::new` asks
/// the parameter store for; a test keeps the two in step).
pub fn expected_shapes(cfg: &ModelConfig) -> BTreeMap<String, Vec<usize>> {
    let (d, ff, v) = (cfg.d_model, cfg.d_ff, cfg.vocab());
    let (q, kv, hd) = (cfg.q_width(), cfg.kv_heads() * cfg.head_dim(), cfg.head_dim());
    let mut out = BTreeMap::from([
        ("embed.weight".to_string(), vec![v, d]),
        ("decoder.norm.weight".to_string(), vec![d]),
    ]);
    if !cfg.tie_embeddings {
        out.insert("lm_head.weight".into(), vec![v, d]);
    }
    for i in 0..cfg.decoder_layers() {
        let mut layer = vec![
            ("attn_norm.weight", vec![d]),
            ("mlp_norm.weight", vec![d]),
            ("self_attn.q_proj.weight", vec![q, d]),
            ("self_attn.k_proj.weight", vec![kv, d]),
            ("self_attn.v_proj.weight", vec![kv, d]),
            ("self_attn.o_proj.weight", vec![d, q]),
            ("mlp.gate_proj.weight", vec![ff, d]),
            ("mlp.up_proj.weight", vec![ff, d]),
            ("mlp.down_proj.weight", vec![d, ff]),
        ];
        if cfg.qk_norm == QkNorm::Rmsnorm {
            layer.push(("self_attn.q_norm.weight", vec![hd]));
            layer.push(("self_attn.k_norm.weight", vec![hd]));
        }
        if cfg.qkv_bias {
            layer.push(("self_attn.q_proj.bias", vec![q]));
            layer.push(("self_attn.k_proj.bias", vec![kv]));
            layer.push(("self_attn.v_proj.bias", vec![kv]));
        }
        for (name, shape) in layer {
            out.insert(format!("decoder.layers.{i}.{name}"), shape);
        }
    }
    out
}

/// Whether `path` names anything (a FIFO, a device, a dangling link too: opening it says what
/// is wrong with it, by name).
fn present(path: &Path) -> bool {
    path.symlink_metadata().is_ok()
}

/// The weight files of `dir`, for a sharded model which tensor the index puts in which, and a
/// note when a single file is read beside an index.
type WeightFiles = (Vec<PathBuf>, Option<BTreeMap<String, PathBuf>>, Vec<String>);

/// The weight files of `dir`: the single file when there is one (transformers reads it first),
/// else the index's shards.
fn weight_files(dir: &Path) -> Result<WeightFiles> {
    let index = dir.join(INDEX_FILE);
    let single = dir.join(SINGLE_FILE);
    if present(&single) {
        let notes = if present(&index) {
            vec![format!(
                "{} has both {SINGLE_FILE} and {INDEX_FILE}: {} is read, as transformers reads it; \
                 the index and the shards it lists are not (remove whichever is stale)",
                dir.display(),
                single.display()
            )]
        } else {
            vec![]
        };
        return Ok((vec![single], None, notes));
    }
    if present(&index) {
        let text = ember_data::io::read_small_text(&index, MAX_INDEX_BYTES)
            .with_context(|| format!("reading {}", index.display()))?;
        let json: Value =
            serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", index.display()))?;
        let map = json
            .get("weight_map")
            .and_then(Value::as_object)
            .with_context(|| format!("{} has no `weight_map` object", index.display()))?;
        let mut placed = BTreeMap::new();
        for (name, file) in map {
            let file = file
                .as_str()
                .filter(|f| Path::new(f).file_name().is_some_and(|n| n == *f))
                .with_context(|| {
                    format!(
                        "{}: weight_map[{name:?}] must be the name of a file next to the index, got {file}",
                        index.display()
                    )
                })?;
            placed.insert(name.clone(), dir.join(file));
        }
        let files: BTreeSet<PathBuf> = placed.values().cloned().collect();
        return Ok((files.into_iter().collect(), Some(placed), vec![]));
    }
    let pickles = ["pytorch_model.bin", "pytorch_model.bin.index.json"];
    let hint = match pickles.iter().find(|p| dir.join(p).is_file()) {
        Some(p) => format!(
            " (it has {p}: PyTorch pickles are not read; save the model with safetensors, \
             `model.save_pretrained(DIR)` in transformers does by default)"
        ),
        None => String::new(),
    };
    bail!(
        "{} has neither {SINGLE_FILE} nor {INDEX_FILE}{hint}",
        dir.display()
    )
}

/// The tensors a safetensors file's header lists, without reading their values; checks that the
/// file is long enough to hold them (a truncated download is named here, not at the first read).
fn read_header(path: &Path) -> Result<BTreeMap<String, TensorInfo>> {
    let bad = |what: String| anyhow::anyhow!("{} is not a safetensors file: {what}", path.display());
    let mut file = ember_data::io::open_regular(path, IN_PLACE)
        .with_context(|| format!("opening {}", path.display()))?;
    let file_len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut len = [0u8; 8];
    file.read_exact(&mut len)
        .map_err(|_| bad("shorter than its 8-byte header length".into()))?;
    let n = u64::from_le_bytes(len);
    if n > MAX_HEADER_BYTES || 8 + n > file_len {
        return Err(bad(format!("a header of {n} bytes in a file of {file_len}")));
    }
    let mut header = vec![0u8; n as usize];
    file.read_exact(&mut header)
        .map_err(|e| bad(format!("reading the header: {e}")))?;
    let map: BTreeMap<String, Value> =
        serde_json::from_slice(&header).map_err(|e| bad(format!("its header is not JSON ({e})")))?;
    let mut out = BTreeMap::new();
    let mut end = 0usize;
    for (name, value) in map {
        if name == "__metadata__" {
            continue;
        }
        let info: TensorInfo =
            serde_json::from_value(value).map_err(|e| bad(format!("the header entry of {name}: {e}")))?;
        end = end.max(info.data_offsets.1);
        out.insert(name, info);
    }
    if 8 + n + end as u64 > file_len {
        bail!(
            "{} is truncated: its header describes {} bytes of tensors, the file holds {} (download it again)",
            path.display(),
            end,
            file_len.saturating_sub(8 + n)
        );
    }
    Ok(out)
}

/// Every tensor of the folder with the file that holds it, and the notes on which files.
fn catalogue(dir: &Path) -> Result<(BTreeMap<String, Entry>, Vec<String>)> {
    let (files, placed, notes) = weight_files(dir)?;
    let mut out = BTreeMap::new();
    for file in &files {
        for (name, info) in read_header(file)? {
            if let Some(placed) = &placed {
                // A tensor the index puts elsewhere (or nowhere) is not the model's.
                if placed.get(&name) != Some(file) {
                    continue;
                }
            }
            out.insert(
                name,
                Entry {
                    file: file.clone(),
                    info,
                },
            );
        }
    }
    if let Some(placed) = placed {
        for (name, file) in placed {
            if !out.contains_key(&name) {
                bail!(
                    "{} lists {name} in {}, which does not hold it",
                    dir.join(INDEX_FILE).display(),
                    file.display()
                );
            }
        }
    }
    Ok((out, notes))
}

/// Why a transformers tensor has no place in Ember's model.
fn no_place(name: &str) -> String {
    if name.ends_with(".bias") {
        format!(
            "{name} (a bias; Ember's norms and output, MLP and head projections have none, and \
             its q, k and v projections only with model.qkv_bias, as Qwen2's)"
        )
    } else if name.contains("expert") {
        format!("{name} (a mixture-of-experts weight; each Ember block has one MLP)")
    } else {
        format!("{name} (not part of a Llama/Qwen2/Qwen3 decoder as Ember builds it)")
    }
}

/// What to read from a folder: Ember name → folder entry, the saved head a tied config leaves
/// unused (compared with the embedding as it is read), and the notes on which files.
struct Plan {
    read: BTreeMap<String, Entry>,
    unused_head: Option<Entry>,
    notes: Vec<String>,
}

/// transformers' name of the output head.
const HEAD: &str = "lm_head.weight";

/// The tensors to read. Every check happens here, on the headers.
fn plan(dir: &Path, cfg: &ModelConfig) -> Result<Plan> {
    let expected = expected_shapes(cfg);
    let mut found = BTreeMap::new();
    let mut extra = vec![];
    let mut unused_head = None;
    let (catalogue, notes) = catalogue(dir)?;
    for (hf, entry) in catalogue {
        // RoPE's inverse frequencies (old checkpoints save the buffer) follow from rope_theta,
        // and a tied model's head is its embedding, as transformers ties it.
        if hf.ends_with("rotary_emb.inv_freq") {
            continue;
        }
        if hf == HEAD && cfg.tie_embeddings {
            unused_head = Some(entry);
            continue;
        }
        match ember_weight_name(&hf).filter(|e| expected.contains_key(e)) {
            Some(ember) => {
                found.insert(ember, entry);
            }
            None => extra.push(no_place(&hf)),
        }
    }
    if !extra.is_empty() {
        bail!(
            "the weights in {} have tensors Ember's model has no place for:\n  {}",
            dir.display(),
            extra.join("\n  ")
        );
    }
    let mut problems = vec![];
    for (ember, shape) in &expected {
        let hf = hf_weight_name(ember).unwrap_or_default();
        match found.get(ember) {
            None if hf == HEAD => problems.push(format!(
                "{HEAD} is missing, and config.json has tie_word_embeddings: false (a model whose \
                 head is its embedding says true)"
            )),
            None => problems.push(format!("{hf} is missing (Ember's {ember})")),
            Some(e) if e.info.shape != *shape => problems.push(format!(
                "{hf} has shape {:?}, but config.json makes it {shape:?}",
                e.info.shape
            )),
            Some(e) if !is_float(e.info.dtype) => problems.push(format!(
                "{hf} is {:?}; Ember reads f32, f16 and bf16 (and f64) weights",
                e.info.dtype
            )),
            Some(_) => {}
        }
    }
    if !problems.is_empty() {
        bail!(
            "the weights in {} do not fit its config.json:\n  {}",
            dir.display(),
            problems.join("\n  ")
        );
    }
    Ok(Plan {
        read: found,
        unused_head,
        notes,
    })
}

fn is_float(dtype: Dtype) -> bool {
    matches!(dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16 | Dtype::F64)
}

/// How many of the little-endian floats of `dtype` in `bytes` are NaN or infinite: their
/// exponent bits are all ones. Read from the file's bytes, so no copy of the tensor is made.
fn non_finite(dtype: Dtype, bytes: &[u8]) -> usize {
    let count = |width: usize, exponent: u64| {
        bytes
            .chunks_exact(width)
            .filter(|c| {
                let mut word = [0u8; 8];
                word[..width].copy_from_slice(c);
                u64::from_le_bytes(word) & exponent == exponent
            })
            .count()
    };
    match dtype {
        Dtype::F32 => count(4, 0x7f80_0000),
        Dtype::F16 => count(2, 0x7c00),
        Dtype::BF16 => count(2, 0x7f80),
        Dtype::F64 => count(8, 0x7ff0_0000_0000_0000),
        _ => 0,
    }
}

/// A hash of a tensor's dtype, shape and bytes, for telling a saved head from the embedding.
fn fingerprint(view: &safetensors::tensor::TensorView) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    format!("{:?}", view.dtype()).hash(&mut h);
    view.shape().hash(&mut h);
    h.write(view.data());
    h.finish()
}

/// The warning for a head saved beside a config that ties it: `None` when it is the embedding
/// saved twice (as many checkpoints do), else what is done with it.
fn unused_head_note(dir: &Path, head: &Entry, read: &BTreeMap<String, Entry>) -> Result<Option<String>> {
    let embed = hf_weight_name("embed.weight").unwrap_or_default();
    let Some(embed_entry) = read.get("embed.weight") else {
        return Ok(None);
    };
    let print = |file: &Path, name: &str| -> Result<u64> {
        let bytes = read_file(file)?;
        let st = SafeTensors::deserialize(&bytes)
            .with_context(|| format!("{} is not a valid safetensors file", file.display()))?;
        let view = st
            .tensor(name)
            .with_context(|| format!("{}: {name}", file.display()))?;
        Ok(fingerprint(&view))
    };
    if print(&head.file, HEAD)? == print(&embed_entry.file, &embed)? {
        return Ok(None);
    }
    let config = dir.join(crate::CONFIG_FILE);
    Ok(Some(format!(
        "{} holds an {HEAD} that differs from the embedding ({embed}), but {} has \
         tie_word_embeddings: true: the head is the embedding, as transformers ties it, so this \
         {HEAD} is not used. If the model was trained with a separate head, set \
         \"tie_word_embeddings\": false in {}",
        head.file.display(),
        config.display(),
        config.display()
    )))
}

/// Reads the whole of the weight file `file`, as other inputs are opened.
fn read_file(file: &Path) -> Result<Vec<u8>> {
    let mut bytes = vec![];
    ember_data::io::open_regular(file, IN_PLACE)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .with_context(|| format!("reading {}", file.display()))?;
    Ok(bytes)
}

/// One tensor of `st` (from `file`) as f32 on the CPU, refused when a value is not finite.
fn read_tensor(st: &SafeTensors, hf: &str, file: &Path) -> Result<Tensor> {
    let view = st
        .tensor(hf)
        .with_context(|| format!("{}: {hf}", file.display()))?;
    let bad = non_finite(view.dtype(), view.data());
    if bad > 0 {
        bail!(
            "{}: {hf} holds {bad} non-finite value(s) (NaN or Inf) of {}; the checkpoint is damaged \
             or was saved after training diverged. Nothing was trained; use an intact copy of the model",
            file.display(),
            view.shape().iter().product::<usize>()
        );
    }
    let t: Tensor = view
        .load(&Device::Cpu)
        .with_context(|| format!("{}: reading {hf}", file.display()))?;
    Ok(t.to_dtype(DType::F32)?)
}

/// Checks the weights of the folder `dir` against `cfg` (from its headers alone), then reads
/// them as f32 parameters on `device` under Ember's names, each checked to be finite. bf16 and
/// f16 become f32 exactly.
pub fn load(dir: &Path, cfg: &ModelConfig, device: &Device) -> Result<Imported> {
    let Plan {
        read,
        unused_head,
        mut notes,
    } = plan(dir, cfg)?;
    // Shard by shard: one file's bytes in memory at a time.
    let mut by_file: BTreeMap<&Path, Vec<(&String, &Entry)>> = BTreeMap::new();
    for (ember, entry) in &read {
        by_file
            .entry(entry.file.as_path())
            .or_default()
            .push((ember, entry));
    }
    if let Some(head) = &unused_head {
        notes.extend(unused_head_note(dir, head, &read)?);
    }
    let mut failure: Option<anyhow::Error> = None;
    let tensors = by_file.into_iter().flat_map(|(file, entries)| {
        let bytes = read_file(file);
        entries.into_iter().map(move |(ember, _)| {
            let hf = hf_weight_name(ember).unwrap_or_default();
            let bytes = bytes.as_ref().map_err(|e| anyhow::anyhow!("{e:#}"))?;
            let st = SafeTensors::deserialize(bytes)
                .with_context(|| format!("{} is not a valid safetensors file", file.display()))?;
            Ok::<_, anyhow::Error>((ember.clone(), read_tensor(&st, &hf, file)?))
        })
    });
    // The store takes the tensors one at a time; the first failure ends the stream.
    let stream = tensors.map_while(|r| match r {
        Ok(t) => Some(t),
        Err(e) => {
            failure = Some(e);
            None
        }
    });
    let params = ParamStore::from_tensors(stream, DType::F32, device)?;
    if let Some(e) = failure {
        return Err(e);
    }
    Ok(Imported { params, notes })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ember_model::{init_model, Arch};

    #[test]
    fn expected_shapes_are_what_the_model_asks_for() {
        for (qk, tie, kv, head_dim, bias) in [
            (QkNorm::None, true, None, None, false),
            (QkNorm::Rmsnorm, false, Some(2), None, false),
            (QkNorm::Rmsnorm, true, Some(1), Some(8), false),
            (QkNorm::None, false, Some(2), Some(8), true),
        ] {
            let mut cfg = ModelConfig::tiny(Arch::Lm);
            (
                cfg.qk_norm,
                cfg.tie_embeddings,
                cfg.n_kv_heads,
                cfg.head_dim,
                cfg.qkv_bias,
            ) = (qk, tie, kv, head_dim, bias);
            let (_, params) = init_model(&cfg, 0, DType::F32, &Device::Cpu).unwrap();
            let built: BTreeMap<String, Vec<usize>> = params
                .vars()
                .into_iter()
                .map(|(n, v)| (n, v.dims().to_vec()))
                .collect();
            assert_eq!(expected_shapes(&cfg), built, "{qk:?} tie={tie} kv={kv:?}");
        }
    }
}
