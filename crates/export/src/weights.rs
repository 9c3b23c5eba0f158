//! The safetensors file of an export: every parameter under its transformers name (the table
//! of names is `ember_import`'s, shared by both directions).
//!
//! Shapes need no change: both store linear weights as (out, in). A tied model stores no
//! `lm_head.weight` (transformers ties it to the embedding from `tie_word_embeddings`).

use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use candle_core::DType;
use ember_model::{ModelConfig, ParamStore};

pub use ember_import::hf_weight_name;

/// Writes every parameter under its transformers name, in `dtype` (f32, or bf16 rounded to
/// nearest even) with `format: pt` metadata; returns the number of tensors and of parameters.
pub fn write(cfg: &ModelConfig, params: &ParamStore, path: &Path, dtype: DType) -> Result<(usize, usize)> {
    let mut tensors = Vec::new();
    for (name, var) in params.vars() {
        let Some(hf) = hf_weight_name(&name) else {
            bail!("parameter {name} has no Hugging Face counterpart; this run's model does not map");
        };
        tensors.push((hf, var.as_tensor().to_dtype(dtype)?));
    }
    // What an import of this config reads back: per layer two norms, four attention and three
    // MLP projections, Qwen3's q/k norms and Qwen2's q/k/v biases; the embedding, the final norm
    // and an untied output projection.
    let expected = ember_import::expected_shapes(cfg).len();
    if tensors.len() != expected {
        bail!(
            "the checkpoint has {} tensors where a {}-layer model has {expected}",
            tensors.len(),
            cfg.decoder_layers()
        );
    }
    let count = tensors.iter().map(|(_, t)| t.elem_count()).sum();
    let n = tensors.len();
    // transformers checks the `format` entry of safetensors metadata (older releases refuse
    // files without pt/tf/flax/mlx there).
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(tensors, Some(metadata), path)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok((n, count))
}
