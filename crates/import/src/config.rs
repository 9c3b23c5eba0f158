//! A transformers `config.json` in Ember's terms: the keys of the `model:` section it fixes, or
//! every setting Ember cannot represent, each with why.
//!
//! Llama, Mistral, Qwen2 and Qwen3 decoders are Ember's language model with `norm: rmsnorm`,
//! `mlp: swiglu` and `positions: rope`; Qwen2 adds biases on the query, key and value projections
//! (`qkv_bias: true`), Qwen3 per-head RMSNorm on queries and keys before the rotation
//! (`qk_norm: rmsnorm`). Defaults for keys a config.json leaves out are
//! transformers' own for that model type (Qwen3's `head_dim` defaults to 128, not
//! hidden_size / num_attention_heads).

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};

/// The file this module reads.
pub const CONFIG_FILE: &str = "config.json";

/// A config.json larger than this is not a model config (real ones are a few kilobytes).
const MAX_CONFIG_BYTES: u64 = 1 << 24;

/// The transformers model types that map onto Ember's language model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
}

impl Family {
    /// transformers' `model_type`.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Mistral => "mistral",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
        }
    }
}

/// The keys of Ember's `model:` section a config.json fixes: a run that imports the model must
/// not set them otherwise. Every one is filled in from the config.
pub const ARCHITECTURE_KEYS: [&str; 16] = [
    "arch",
    "vocab_size",
    "d_model",
    "n_layers",
    "n_heads",
    "n_kv_heads",
    "head_dim",
    "qkv_bias",
    "d_ff",
    "mlp",
    "norm",
    "norm_eps",
    "positions",
    "rope_theta",
    "qk_norm",
    "tie_embeddings",
];

/// A model folder's architecture as Ember's `model:` keys.
#[derive(Debug, Clone, PartialEq)]
pub struct HfModel {
    pub family: Family,
    /// Each of [`ARCHITECTURE_KEYS`] with its value, and the config.json key it came from.
    pub architecture: Vec<(&'static str, Value, &'static str)>,
    /// Keys the config suggests but a run may set otherwise: the training length
    /// (`max_seq_len` from `max_position_embeddings`), attention dropout, the init std.
    pub defaults: Vec<(&'static str, Value)>,
}

impl HfModel {
    /// The value of one of [`ARCHITECTURE_KEYS`].
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.architecture
            .iter()
            .find(|(k, ..)| *k == key)
            .map(|(_, v, _)| v)
    }
}

/// The model section of a run that imports `dir` and sets nothing else: the architecture keys
/// of its config.json, its suggestions, Ember's defaults for the rest.
pub fn model_config(dir: &Path) -> Result<ember_model::ModelConfig> {
    let hf = read(dir)?;
    let mut section = Map::new();
    section.insert("init_from".into(), json!(dir));
    for (key, value, _) in hf.architecture {
        section.insert(key.into(), value);
    }
    for (key, value) in hf.defaults {
        section.insert(key.into(), value);
    }
    serde_json::from_value(Value::Object(section))
        .with_context(|| format!("the model section of {}", dir.join(CONFIG_FILE).display()))
}

/// Reads `dir/config.json`. An architecture Ember cannot represent is an error listing every
/// setting that blocks it; a config that is not a decoder's (missing sizes, wrong types) names
/// the key.
pub fn read(dir: &Path) -> Result<HfModel> {
    let path = dir.join(CONFIG_FILE);
    let text = read_small(&path)?;
    let map: Map<String, Value> = match serde_json::from_str(&text) {
        Ok(Value::Object(map)) => map,
        Ok(_) => bail!(
            "{} is not a JSON object; expected a transformers config.json",
            path.display()
        ),
        Err(e) => bail!(
            "{} is not valid JSON ({e}); expected a transformers config.json",
            path.display()
        ),
    };
    from_map(&map).with_context(|| format!("reading {}", path.display()))
}

/// Reads `path` as other inputs are read ([`ember_data::io::open_input`]), naming it and, when
/// it is missing, what a model folder holds.
fn read_small(path: &Path) -> Result<String> {
    ember_data::io::read_small_text(path, MAX_CONFIG_BYTES).map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::NotFound => {
                " (model.init_from must be a Hugging Face model folder: config.json, *.safetensors \
                 and tokenizer.json, e.g. from `huggingface-cli download OWNER/NAME --local-dir DIR`)"
            }
            _ => "",
        };
        anyhow::anyhow!("cannot read {}{hint}: {e}", path.display())
    })
}

/// The typed fields of a config.json, each read once with its key in any error.
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn present(&self, key: &str) -> Option<&Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }
    fn count(&self, key: &str) -> Result<Option<usize>> {
        match self.present(key) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n > 0 => Ok(Some(n as usize)),
                _ => bail!("`{key}` must be a positive integer, got {v}"),
            },
        }
    }
    fn required(&self, key: &str) -> Result<usize> {
        self.count(key)?
            .with_context(|| format!("`{key}` is missing; a decoder's config.json gives it"))
    }
    fn number(&self, key: &str) -> Result<Option<f64>> {
        match self.present(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .with_context(|| format!("`{key}` must be a number, got {v}")),
        }
    }
    fn flag(&self, key: &str) -> Result<Option<bool>> {
        match self.present(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .with_context(|| format!("`{key}` must be true or false, got {v}")),
        }
    }
    fn text(&self, key: &str) -> Option<&str> {
        self.present(key).and_then(Value::as_str)
    }
}

/// A RoPE setting other than plain rotary embeddings (`rope_scaling`, or v5's
/// `rope_parameters`), described; `None` for the default kind.
fn rope_variant(key: &str, v: Option<&Value>) -> Option<String> {
    let v = v?;
    let kind = v
        .get("rope_type")
        .or_else(|| v.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("?");
    (kind != "default").then(|| {
        format!("{key}: {v} (RoPE scaling of kind {kind:?}; Ember's rotary embeddings are unscaled)")
    })
}

fn from_map(map: &Map<String, Value>) -> Result<HfModel> {
    let f = Fields(map);
    let family = family(&f)?;
    let shape = Shape::read(&f, family)?;
    let mut blockers = feature_blockers(&f, family)?;
    blockers.extend(attention_blockers(&f, family, &shape)?);
    if !blockers.is_empty() {
        bail!("Ember cannot represent this model:\n  {}", blockers.join("\n  "));
    }
    Ok(HfModel {
        family,
        architecture: architecture(family, &shape),
        defaults: defaults(&f)?,
    })
}

/// The model family named by `model_type`; a family Ember does not map is an error.
fn family(f: &Fields) -> Result<Family> {
    let model_type = f.text("model_type").context(
        "`model_type` is missing; Ember reads transformers configs of model_type llama, mistral, qwen2 or qwen3",
    )?;
    Ok(match model_type {
        "llama" => Family::Llama,
        "mistral" => Family::Mistral,
        "qwen2" => Family::Qwen2,
        "qwen3" => Family::Qwen3,
        other if other.contains("moe") || other == "mixtral" => bail!(
            "Ember cannot represent this model:\n  model_type: {other} (a mixture of experts; each \
             Ember block has one MLP)"
        ),
        other => bail!(
            "Ember cannot represent this model:\n  model_type: {other} (Ember maps the decoders of \
             model_type llama, mistral, qwen2 and qwen3)"
        ),
    })
}

/// The sizes of the model, with transformers' defaults for the keys a config may leave out.
#[derive(Clone, Copy)]
struct Shape {
    vocab: usize,
    hidden: usize,
    ff: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    eps: f64,
    rope_theta: f64,
    tie: bool,
}

impl Shape {
    fn read(f: &Fields, family: Family) -> Result<Self> {
        let vocab = f.required("vocab_size")?;
        let hidden = f.required("hidden_size")?;
        let ff = f.required("intermediate_size")?;
        let layers = f.required("num_hidden_layers")?;
        let heads = f.required("num_attention_heads")?;
        let kv_heads = f.count("num_key_value_heads")?.unwrap_or(heads);
        // transformers' Qwen3Config defaults head_dim to 128; the others' to hidden / heads.
        let head_dim = match (f.count("head_dim")?, family) {
            (Some(d), _) => d,
            (None, Family::Qwen3) => 128,
            (None, _) => hidden / heads,
        };
        let eps = f.number("rms_norm_eps")?.unwrap_or(1e-6);
        let rope_theta = match f.number("rope_theta")? {
            Some(t) => t,
            None => match f.present("rope_parameters").and_then(|p| p.get("rope_theta")) {
                Some(t) => t
                    .as_f64()
                    .context("`rope_parameters.rope_theta` must be a number")?,
                None => 10_000.0,
            },
        };
        let tie = f.flag("tie_word_embeddings")?.unwrap_or(false);
        Ok(Shape {
            vocab,
            hidden,
            ff,
            layers,
            heads,
            kv_heads,
            head_dim,
            eps,
            rope_theta,
            tie,
        })
    }
}

/// Parts a model may have that Ember's blocks lack: experts, quantized weights, another
/// activation, biases outside q, k and v.
fn feature_blockers(f: &Fields, family: Family) -> Result<Vec<String>> {
    let mut blockers: Vec<String> = vec![];
    for key in ["num_experts", "num_local_experts", "n_routed_experts"] {
        if let Some(n) = f.count(key).ok().flatten() {
            blockers.push(format!(
                "{key}: {n} (a mixture of experts; each Ember block has one MLP)"
            ));
        }
    }
    if let Some(q) = f.present("quantization_config") {
        let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("?");
        blockers.push(format!(
            "quantization_config (a {method}-quantized checkpoint; Ember reads f32, f16 and bf16 weights)"
        ));
    }
    let act = f.text("hidden_act").unwrap_or("silu");
    if act != "silu" {
        blockers.push(format!("hidden_act: {act} (Ember's SwiGLU gates with SiLU)"));
    }
    // Qwen2's q, k and v biases are fixed in its code; transformers reads no attention_bias
    // for it.
    if family != Family::Qwen2 && f.flag("attention_bias")? == Some(true) {
        blockers.push(
            "attention_bias: true (biases on q_proj, k_proj, v_proj and o_proj; Ember's attention \
             has biases on q, k and v only, as Qwen2's, none on o_proj)"
                .to_string(),
        );
    }
    if f.flag("mlp_bias")? == Some(true) {
        blockers.push(
            "mlp_bias: true (biases on gate_proj, up_proj and down_proj; Ember's MLP has none)".to_string(),
        );
    }
    Ok(blockers)
}

/// Attention Ember cannot stand in for: a sliding window, other layer kinds, scaled or partial
/// rotary embeddings, and head counts or widths it cannot split.
fn attention_blockers(f: &Fields, family: Family, shape: &Shape) -> Result<Vec<String>> {
    let mut blockers: Vec<String> = vec![];
    let positions = f.count("max_position_embeddings")?;
    let window = f.count("sliding_window")?;
    let windowed = match family {
        // Qwen configs carry a sliding_window that only `use_sliding_window` switches on.
        Family::Qwen2 | Family::Qwen3 => f.flag("use_sliding_window")? == Some(true),
        // Mistral's applies whenever it is set (null in v0.2 and later); a window as long as
        // the positions changes nothing.
        _ => window.is_some_and(|w| positions.is_none_or(|p| w < p)),
    };
    if windowed {
        blockers.push(format!(
            "sliding_window: {} (each position attends to the last {} only; Ember's attention sees \
             the whole context)",
            window.map_or("?".into(), |w| w.to_string()),
            window.map_or("?".into(), |w| w.to_string()),
        ));
    }
    if let Some(types) = f.present("layer_types").and_then(Value::as_array) {
        if let Some(other) = types
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "full_attention")
        {
            blockers.push(format!(
                "layer_types: {other} (layers of another attention kind; Ember's layers all attend \
                 to the whole context)"
            ));
        }
    }
    blockers.extend(rope_variant("rope_scaling", f.present("rope_scaling")));
    blockers.extend(rope_variant("rope_parameters", f.present("rope_parameters")));
    if let Some(p) = f.number("partial_rotary_factor")?.filter(|p| *p != 1.0) {
        blockers.push(format!(
            "partial_rotary_factor: {p} (rotary embeddings on part of each head; Ember rotates all of it)"
        ));
    }
    let Shape {
        heads,
        kv_heads,
        head_dim,
        ..
    } = *shape;
    if kv_heads > heads || heads % kv_heads != 0 {
        blockers.push(format!(
            "num_key_value_heads: {kv_heads} (must divide num_attention_heads = {heads})"
        ));
    }
    if head_dim % 2 != 0 {
        blockers.push(format!(
            "head_dim: {head_dim} (rotary embeddings need an even width)"
        ));
    }
    Ok(blockers)
}

/// Ember's architecture keys with their values, each beside the config.json key it comes from.
fn architecture(family: Family, shape: &Shape) -> Vec<(&'static str, Value, &'static str)> {
    let qk_norm = if family == Family::Qwen3 {
        "rmsnorm"
    } else {
        "none"
    };
    let architecture = vec![
        ("arch", json!("lm"), "model_type"),
        ("vocab_size", json!(shape.vocab), "vocab_size"),
        ("d_model", json!(shape.hidden), "hidden_size"),
        ("n_layers", json!(shape.layers), "num_hidden_layers"),
        ("n_heads", json!(shape.heads), "num_attention_heads"),
        ("n_kv_heads", json!(shape.kv_heads), "num_key_value_heads"),
        ("head_dim", json!(shape.head_dim), "head_dim"),
        ("qkv_bias", json!(family == Family::Qwen2), "model_type"),
        ("d_ff", json!(shape.ff), "intermediate_size"),
        ("mlp", json!("swiglu"), "hidden_act"),
        ("norm", json!("rmsnorm"), "model_type"),
        ("norm_eps", json!(shape.eps), "rms_norm_eps"),
        ("positions", json!("rope"), "model_type"),
        ("rope_theta", json!(shape.rope_theta), "rope_theta"),
        ("qk_norm", json!(qk_norm), "model_type"),
        ("tie_embeddings", json!(shape.tie), "tie_word_embeddings"),
    ];
    debug_assert!(architecture.iter().map(|(k, ..)| *k).eq(ARCHITECTURE_KEYS));
    architecture
}

/// The settings config.json suggests for keys that are not architecture (Ember's defaults stand
/// where it has none).
fn defaults(f: &Fields) -> Result<Vec<(&'static str, Value)>> {
    let mut defaults = vec![];
    if let Some(p) = f.count("max_position_embeddings")? {
        defaults.push(("max_seq_len", json!(p)));
    }
    if let Some(p) = f.number("attention_dropout")? {
        defaults.push(("attn_dropout", json!(p)));
    }
    if let Some(s) = f.number("initializer_range")?.filter(|s| *s > 0.0) {
        defaults.push(("init_std", json!(s)));
    }
    Ok(defaults)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qwen3() -> Map<String, Value> {
        let v = json!({
            "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
            "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
            "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
            "hidden_act": "silu", "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000, "rope_scaling": null, "attention_bias": false,
            "attention_dropout": 0.0, "tie_word_embeddings": true, "use_sliding_window": false,
            "sliding_window": null, "max_window_layers": 28, "torch_dtype": "bfloat16",
            "initializer_range": 0.02
        });
        v.as_object().unwrap().clone()
    }

    fn blockers(map: &Map<String, Value>) -> String {
        format!("{:#}", from_map(map).unwrap_err())
    }

    #[test]
    fn qwen3_0_6b_maps_with_its_wide_heads_and_qk_norm() {
        let m = from_map(&qwen3()).unwrap();
        assert_eq!(m.family, Family::Qwen3);
        for (key, value) in [
            ("d_model", json!(1024)),
            ("head_dim", json!(128)),
            ("n_kv_heads", json!(8)),
            ("qk_norm", json!("rmsnorm")),
            ("rope_theta", json!(1e6)),
            ("tie_embeddings", json!(true)),
            ("norm_eps", json!(1e-6)),
        ] {
            assert_eq!(m.get(key), Some(&value), "{key}");
        }
        assert!(m.defaults.contains(&("max_seq_len", json!(40960))));
    }

    #[test]
    fn left_out_keys_take_transformers_defaults_for_the_model_type() {
        let mut c = qwen3();
        for k in [
            "head_dim",
            "num_key_value_heads",
            "rope_theta",
            "rms_norm_eps",
            "tie_word_embeddings",
        ] {
            c.remove(k);
        }
        let m = from_map(&c).unwrap();
        assert_eq!(m.get("head_dim"), Some(&json!(128)), "Qwen3's default");
        assert_eq!(m.get("n_kv_heads"), Some(&json!(16)));
        assert_eq!(m.get("rope_theta"), Some(&json!(10000.0)));
        assert_eq!(m.get("tie_embeddings"), Some(&json!(false)));
        c.insert("model_type".into(), json!("llama"));
        let m = from_map(&c).unwrap();
        assert_eq!(
            m.get("head_dim"),
            Some(&json!(64)),
            "Llama's default: hidden / heads"
        );
        assert_eq!(m.get("qk_norm"), Some(&json!("none")));
        // transformers 5 writes RoPE as rope_parameters only.
        c.insert(
            "rope_parameters".into(),
            json!({"rope_type": "default", "rope_theta": 5e5}),
        );
        assert_eq!(from_map(&c).unwrap().get("rope_theta"), Some(&json!(5e5)));
    }

    #[test]
    fn what_ember_cannot_represent_is_refused_with_every_reason_named() {
        let mut c = qwen3();
        c.insert("model_type".into(), json!("llama"));
        c.insert("attention_bias".into(), json!(true));
        c.insert("mlp_bias".into(), json!(true));
        c.insert("hidden_act".into(), json!("gelu"));
        c.insert(
            "rope_scaling".into(),
            json!({"rope_type": "llama3", "factor": 8.0}),
        );
        c.insert("sliding_window".into(), json!(4096));
        let e = blockers(&c);
        for reason in [
            "attention_bias: true",
            "mlp_bias: true",
            "hidden_act: gelu",
            "rope_scaling: ",
            "\"llama3\"",
            "sliding_window: 4096",
        ] {
            assert!(e.contains(reason), "{reason} missing from: {e}");
        }
        for (model_type, reason) in [
            ("qwen3_moe", "mixture of experts"),
            ("mixtral", "mixture of experts"),
            ("gemma3", "model_type: gemma3"),
        ] {
            let mut c = qwen3();
            c.insert("model_type".into(), json!(model_type));
            let e = blockers(&c);
            assert!(e.contains(reason), "{model_type}: {e}");
        }
        let mut c = qwen3();
        c.insert("use_sliding_window".into(), json!(true));
        c.insert("sliding_window".into(), json!(4096));
        assert!(blockers(&c).contains("sliding_window: 4096"));
        let mut c = qwen3();
        c.insert("quantization_config".into(), json!({"quant_method": "awq"}));
        assert!(blockers(&c).contains("awq-quantized"));
        let mut c = qwen3();
        c.insert(
            "layer_types".into(),
            json!(["full_attention", "sliding_attention"]),
        );
        assert!(blockers(&c).contains("layer_types: sliding_attention"));
    }

    #[test]
    fn qwen2_maps_with_its_qkv_biases_and_no_qk_norm() {
        // Qwen2.5-0.5B's config.json, as published.
        let v = json!({
            "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 151936,
            "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
            "num_attention_heads": 14, "num_key_value_heads": 2, "hidden_act": "silu",
            "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
            "tie_word_embeddings": true, "use_sliding_window": false, "sliding_window": 32768,
            "max_window_layers": 24, "attention_dropout": 0.0, "torch_dtype": "bfloat16",
            "initializer_range": 0.02, "use_cache": true
        });
        let m = from_map(v.as_object().unwrap()).unwrap();
        assert_eq!(m.family, Family::Qwen2);
        for (key, value) in [
            ("qkv_bias", json!(true)),
            ("qk_norm", json!("none")),
            ("head_dim", json!(64)),
            ("n_kv_heads", json!(2)),
            ("tie_embeddings", json!(true)),
        ] {
            assert_eq!(m.get(key), Some(&value), "{key}");
        }
        for c in [qwen3(), {
            let mut c = qwen3();
            c.insert("model_type".into(), json!("llama"));
            c
        }] {
            assert_eq!(from_map(&c).unwrap().get("qkv_bias"), Some(&json!(false)));
        }
        let mut c = v.as_object().unwrap().clone();
        c.insert("use_sliding_window".into(), json!(true));
        assert!(blockers(&c).contains("sliding_window: 32768"));
    }

    #[test]
    fn a_window_no_shorter_than_the_positions_is_no_window() {
        let mut c = qwen3();
        c.insert("model_type".into(), json!("mistral"));
        c.insert("sliding_window".into(), json!(40960));
        assert_eq!(from_map(&c).unwrap().family, Family::Mistral);
    }

    #[test]
    fn a_config_that_is_not_a_decoders_names_the_key() {
        let mut c = qwen3();
        c.remove("hidden_size");
        assert!(blockers(&c).contains("`hidden_size` is missing"));
        let mut c = qwen3();
        c.insert("num_attention_heads".into(), json!("sixteen"));
        assert!(blockers(&c).contains("`num_attention_heads` must be a positive integer"));
        let mut c = qwen3();
        c.remove("model_type");
        assert!(blockers(&c).contains("`model_type` is missing"));
    }
}
