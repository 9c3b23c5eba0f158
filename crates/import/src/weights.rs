//! The weights of a model folder — `model.safetensors`, or the shards that
//! `model.safetensors.index.json` lists — as Ember's f32 parameters.
//!
//! Every file's header is read first and checked against the model config: each parameter the
//! model needs is there with its shape and a float dtype, and no tensor is left that Ember would
//! silently drop (a bias, an expert). Only then are values read, one shard at a time and one
//! tensor at a time into the parameter store, so the peak is the f32 parameters plus one shard.

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

/// The weight files of `dir` and, for a sharded model, which tensor the index puts in which.
fn weight_files(dir: &Path) -> Result<(Vec<PathBuf>, Option<BTreeMap<String, PathBuf>>)> {
    let index = dir.join(INDEX_FILE);
    if index.is_file() {
        let text = std::fs::read_to_string(&index).with_context(|| format!("reading {}", index.display()))?;
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
        return Ok((files.into_iter().collect(), Some(placed)));
    }
    let single = dir.join(SINGLE_FILE);
    if single.is_file() {
        return Ok((vec![single], None));
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
    let mut file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
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

/// Every tensor of the folder with the file that holds it.
fn catalogue(dir: &Path) -> Result<BTreeMap<String, Entry>> {
    let (files, placed) = weight_files(dir)?;
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
    Ok(out)
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

/// The tensors to read: Ember name → folder entry. Every check happens here, on the headers.
fn plan(dir: &Path, cfg: &ModelConfig) -> Result<BTreeMap<String, Entry>> {
    let expected = expected_shapes(cfg);
    let mut found = BTreeMap::new();
    let mut extra = vec![];
    for (hf, entry) in catalogue(dir)? {
        // RoPE's inverse frequencies (old checkpoints save the buffer) follow from rope_theta,
        // and a tied model's head is its embedding, as transformers ties it.
        if hf.ends_with("rotary_emb.inv_freq") || (hf == "lm_head.weight" && cfg.tie_embeddings) {
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
            None => problems.push(format!("{hf} is missing (Ember's {ember})")),
            Some(e) if e.info.shape != *shape => problems.push(format!(
                "{hf} has shape {:?}, but config.json makes it {shape:?}",
                e.info.shape
            )),
            Some(e) if !matches!(e.info.dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16 | Dtype::F64) => {
                problems.push(format!(
                    "{hf} is {:?}; Ember reads f32, f16 and bf16 (and f64) weights",
                    e.info.dtype
                ))
            }
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
    Ok(found)
}

/// Checks the weights of the folder `dir` against `cfg` (from its headers alone), then reads
/// them as f32 parameters on `device` under Ember's names. bf16 and f16 become f32 exactly.
pub fn load(dir: &Path, cfg: &ModelConfig, device: &Device) -> Result<ParamStore> {
    let plan = plan(dir, cfg)?;
    // Shard by shard: one file's bytes in memory at a time.
    let mut by_file: BTreeMap<&Path, Vec<(&String, &Entry)>> = BTreeMap::new();
    for (ember, entry) in &plan {
        by_file
            .entry(entry.file.as_path())
            .or_default()
            .push((ember, entry));
    }
    let mut failure: Option<anyhow::Error> = None;
    let tensors = by_file.into_iter().flat_map(|(file, entries)| {
        let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()));
        entries.into_iter().map(move |(ember, _)| {
            let hf = hf_weight_name(ember).unwrap_or_default();
            let bytes = bytes.as_ref().map_err(|e| anyhow::anyhow!("{e:#}"))?;
            let st = SafeTensors::deserialize(bytes)
                .with_context(|| format!("{} is not a valid safetensors file", file.display()))?;
            let t: Tensor = st
                .tensor(&hf)
                .with_context(|| format!("{}: {hf}", file.display()))?
                .load(&Device::Cpu)
                .with_context(|| format!("{}: reading {hf}", file.display()))?;
            Ok::<_, anyhow::Error>((ember.clone(), t.to_dtype(DType::F32)?))
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
    let store = ParamStore::from_tensors(stream, DType::F32, device)?;
    if let Some(e) = failure {
        return Err(e);
    }
    Ok(store)
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
