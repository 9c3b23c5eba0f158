//! Ember's parameter names and transformers' Llama/Qwen2/Qwen3 names, one table for both directions
//! (`ember export` maps one way, `model.init_from` the other).
//!
//! ```text
//! embed.weight                                  model.embed_tokens.weight
//! decoder.layers.{i}.attn_norm.weight           model.layers.{i}.input_layernorm.weight
//! decoder.layers.{i}.self_attn.{q,k,v,o}_proj   model.layers.{i}.self_attn.{q,k,v,o}_proj
//! decoder.layers.{i}.self_attn.{q,k,v}_proj.bias  the same                              (Qwen2)
//! decoder.layers.{i}.self_attn.{q,k}_norm       model.layers.{i}.self_attn.{q,k}_norm     (Qwen3)
//! decoder.layers.{i}.mlp_norm.weight            model.layers.{i}.post_attention_layernorm.weight
//! decoder.layers.{i}.mlp.{gate,up,down}_proj    model.layers.{i}.mlp.{gate,up,down}_proj
//! decoder.norm.weight                           model.norm.weight
//! lm_head.weight                                lm_head.weight   (untied only)
//! ```
//!
//! Shapes need no change: both store linear weights as (out, in), and both rotate pairs
//! (i, i + d/2) of each head ("rotate half"), so no query or key row is permuted.

/// Whole-model parameters: (Ember, transformers).
const MODEL: [(&str, &str); 3] = [
    ("embed.weight", "model.embed_tokens.weight"),
    ("decoder.norm.weight", "model.norm.weight"),
    ("lm_head.weight", "lm_head.weight"),
];

/// Per-layer parameters under `decoder.layers.{i}.` / `model.layers.{i}.`: (Ember, transformers).
const LAYER: [(&str, &str); 14] = [
    ("attn_norm.weight", "input_layernorm.weight"),
    ("mlp_norm.weight", "post_attention_layernorm.weight"),
    ("self_attn.q_proj.weight", "self_attn.q_proj.weight"),
    ("self_attn.k_proj.weight", "self_attn.k_proj.weight"),
    ("self_attn.v_proj.weight", "self_attn.v_proj.weight"),
    ("self_attn.o_proj.weight", "self_attn.o_proj.weight"),
    ("self_attn.q_proj.bias", "self_attn.q_proj.bias"),
    ("self_attn.k_proj.bias", "self_attn.k_proj.bias"),
    ("self_attn.v_proj.bias", "self_attn.v_proj.bias"),
    ("self_attn.q_norm.weight", "self_attn.q_norm.weight"),
    ("self_attn.k_norm.weight", "self_attn.k_norm.weight"),
    ("mlp.gate_proj.weight", "mlp.gate_proj.weight"),
    ("mlp.up_proj.weight", "mlp.up_proj.weight"),
    ("mlp.down_proj.weight", "mlp.down_proj.weight"),
];

const EMBER_LAYERS: &str = "decoder.layers.";
const HF_LAYERS: &str = "model.layers.";

/// Looks `name` up in the table, from the side `from` (0: Ember, 1: transformers).
fn translate(name: &str, from: usize) -> Option<String> {
    let pick = |pair: &(&'static str, &'static str), side: usize| if side == 0 { pair.0 } else { pair.1 };
    if let Some(pair) = MODEL.iter().find(|p| pick(p, from) == name) {
        return Some(pick(pair, 1 - from).to_string());
    }
    let prefixes = [EMBER_LAYERS, HF_LAYERS];
    let (layer, param) = name.strip_prefix(prefixes[from])?.split_once('.')?;
    // Only a plain layer number: "01" or "+1" would name the same layer twice.
    if layer.is_empty()
        || !layer.bytes().all(|b| b.is_ascii_digit())
        || (layer.len() > 1 && layer.starts_with('0'))
    {
        return None;
    }
    let pair = LAYER.iter().find(|p| pick(p, from) == param)?;
    Some(format!("{}{layer}.{}", prefixes[1 - from], pick(pair, 1 - from)))
}

/// The transformers name of an Ember language-model parameter; `None` for a name with no
/// counterpart (an encoder's, a LayerNorm bias, the `l2` scale).
pub fn hf_weight_name(ember: &str) -> Option<String> {
    translate(ember, 0)
}

/// The Ember name of a transformers Llama/Qwen2/Qwen3 tensor; `None` for a tensor Ember has no
/// place for (an o_proj or MLP bias, an expert, a vision tower).
pub fn ember_weight_name(hf: &str) -> Option<String> {
    translate(hf, 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_transformers_layout_both_ways() {
        for (ember, hf) in [
            ("embed.weight", "model.embed_tokens.weight"),
            ("decoder.norm.weight", "model.norm.weight"),
            ("lm_head.weight", "lm_head.weight"),
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
                "decoder.layers.2.self_attn.v_proj.bias",
                "model.layers.2.self_attn.v_proj.bias",
            ),
            (
                "decoder.layers.10.mlp.down_proj.weight",
                "model.layers.10.mlp.down_proj.weight",
            ),
        ] {
            assert_eq!(hf_weight_name(ember).as_deref(), Some(hf), "{ember}");
            assert_eq!(ember_weight_name(hf).as_deref(), Some(ember), "{hf}");
        }
    }

    #[test]
    fn names_without_a_counterpart_map_to_none() {
        for ember in [
            "encoder.layers.0.attn_norm.weight",
            "decoder.layers.0.self_attn.qk_scale",
            "decoder.layers.0.cross_attn.q_proj.weight",
            "decoder.layers.0.attn_norm.bias",
            "decoder.layers.x.mlp.up_proj.weight",
            "decoder.layers.01.mlp.up_proj.weight",
            "decoder.layers..mlp.up_proj.weight",
        ] {
            assert_eq!(hf_weight_name(ember), None, "{ember}");
        }
        for hf in [
            "model.layers.0.self_attn.o_proj.bias",
            "model.layers.0.mlp.up_proj.bias",
            "model.layers.0.mlp.experts.0.up_proj.weight",
            "model.layers.0.self_attn.rotary_emb.inv_freq",
            "model.layers.+1.mlp.up_proj.weight",
            "embed_tokens.weight",
            "vision_tower.patch_embed.weight",
        ] {
            assert_eq!(ember_weight_name(hf), None, "{hf}");
        }
    }
}
