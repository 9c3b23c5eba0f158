//! Ember's parameter names → transformers' Llama/Qwen3 names, and the safetensors file.
//!
//! ```text
//! embed.weight                                  model.embed_tokens.weight
//! decoder.layers.{i}.attn_norm.weight           model.layers.{i}.input_layernorm.weight
//! decoder.layers.{i}.self_attn.{q,k,v,o}_proj   model.layers.{i}.self_attn.{q,k,v,o}_proj
//! decoder.layers.{i}.self_attn.{q,k}_norm       model.layers.{i}.self_attn.{q,k}_norm     (Qwen3)
//! decoder.layers.{i}.mlp_norm.weight            model.layers.{i}.post_attention_layernorm.weight
//! decoder.layers.{i}.mlp.{gate,up,down}_proj    model.layers.{i}.mlp.{gate,up,down}_proj
//! decoder.norm.weight                           model.norm.weight
//! lm_head.weight                                lm_head.weight   (untied only)
//! ```
//!
//! Shapes need no change: both store linear weights as (out, in). A tied model stores no
//! `lm_head.weight` (transformers ties it to the embedding from `tie_word_embeddings`).

use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use ember_model::{ModelConfig, ParamStore};

/// The transformers name of an Ember LM parameter; `None` for a name with no counterpart.
pub fn hf_weight_name(ember: &str) -> Option<String> {
    match ember {
        "embed.weight" => return Some("model.embed_tokens.weight".into()),
        "lm_head.weight" => return Some("lm_head.weight".into()),
        "decoder.norm.weight" => return Some("model.norm.weight".into()),
        _ => {}
    }
    let rest = ember.strip_prefix("decoder.layers.")?;
    let (layer, param) = rest.split_once('.')?;
    layer.parse::<usize>().ok()?;
    let mapped = match param {
        "attn_norm.weight" => "input_layernorm.weight",
        "mlp_norm.weight" => "post_attention_layernorm.weight",
        "self_attn.q_proj.weight"
        | "self_attn.k_proj.weight"
        | "self_attn.v_proj.weight"
        | "self_attn.o_proj.weight"
        | "self_attn.q_norm.weight"
        | "self_attn.k_norm.weight"
        | "mlp.gate_proj.weight"
        | "mlp.up_proj.weight"
        | "mlp.down_proj.weight" => param,
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{mapped}"))
}

/// Writes every parameter under its transformers name, in f32 with `format: pt` metadata;
/// returns the number of tensors and of parameters.
pub fn write(cfg: &ModelConfig, params: &ParamStore, path: &Path) -> Result<(usize, usize)> {
    let mut tensors = Vec::new();
    for (name, var) in params.vars() {
        let Some(hf) = hf_weight_name(&name) else {
            bail!("parameter {name} has no Hugging Face counterpart; this run's model does not map");
        };
        tensors.push((hf, var.as_tensor().to_dtype(candle_core::DType::F32)?));
    }
    // Per layer: two norms, four attention and three MLP projections, and Qwen3's q/k norms;
    // then the embedding, the final norm and an untied output projection.
    let per_layer = 9 + if cfg.qk_norm == ember_model::QkNorm::Rmsnorm {
        2
    } else {
        0
    };
    let expected = cfg.decoder_layers() * per_layer + 2 + usize::from(!cfg.tie_embeddings);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_transformers_layout() {
        for (ember, hf) in [
            ("embed.weight", "model.embed_tokens.weight"),
            ("decoder.norm.weight", "model.norm.weight"),
            (
                "decoder.layers.3.attn_norm.weight",
                "model.layers.3.input_layernorm.weight",
            ),
            (
                "decoder.layers.0.mlp_norm.weight",
                "model.layers.0.post_attention_layernorm.weight",
            ),
            (
                "decoder.layers.1.self_attn.k_norm.weight",
                "model.layers.1.self_attn.k_norm.weight",
            ),
            (
                "decoder.layers.10.mlp.down_proj.weight",
                "model.layers.10.mlp.down_proj.weight",
            ),
        ] {
            assert_eq!(hf_weight_name(ember).as_deref(), Some(hf), "{ember}");
        }
        for ember in [
            "encoder.layers.0.attn_norm.weight",
            "decoder.layers.0.self_attn.qk_scale",
            "decoder.layers.0.cross_attn.q_proj.weight",
            "decoder.layers.0.attn_norm.bias",
            "decoder.layers.x.mlp.up_proj.weight",
        ] {
            assert_eq!(hf_weight_name(ember), None, "{ember}");
        }
    }
}
