//! The model's configuration: the `model:` section of a run's YAML, field for field.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::init::InitScheme;

/// Which shape of transformer to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    /// Decoder-only language model (causal self-attention).
    Lm,
    /// Encoder–decoder translation model (bidirectional encoder, causal decoder with cross-attention).
    Seq2seq,
}

/// The feed-forward block inside every layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MlpKind {
    /// `down(silu(gate(x)) * up(x))`, as in LLaMA, Qwen and OLMo.
    Swiglu,
    /// `down(gelu(up(x)))` with the exact (erf) GELU, as in the original GPT/BERT blocks.
    Gelu,
    /// `down(relu(up(x)))`, as in the original Transformer and fairseq's `transformer` models.
    Relu,
}

/// Where each block's norms sit relative to its residual adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum NormPlacement {
    /// `x + branch(norm(x))`, with a final norm after each stack (GPT-2 onwards, LLaMA;
    /// fairseq's `--encoder-normalize-before`).
    #[default]
    Pre,
    /// `norm(x + branch(x))` and no final norm (the original Transformer, Vaswani et al. 2017;
    /// fairseq's `transformer` default, Wu et al.'s Transformer-Tiny).
    Post,
}

/// The residual-stream normalisation (pre-norm) and, for `qk_norm`, the per-head normalisation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum NormKind {
    /// `x / rms(x) * gain`.
    Rmsnorm,
    /// `(x - mean) / std * gain + bias`.
    Layernorm,
}

/// How the model knows where a token is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Positions {
    /// Rotary embeddings on self-attention's queries and keys (LLaMA, Qwen, OLMo).
    Rope,
    /// A learned `max_seq_len` × d table added to the token embeddings (GPT-2, nanoGPT, fairseq),
    /// one per stack; initialised and decayed like the token embedding.
    Learned,
    /// No position information at all (causal attention alone; NoPE).
    None,
    /// The fixed sinusoids of Vaswani et al. 2017, added to the token embeddings, in fairseq's
    /// layout: the first half of each vector holds sin(p·ωᵢ), the second cos(p·ωᵢ), with
    /// ωᵢ = 10000^(−i / (d/2 − 1)). No parameters; `max_seq_len` bounds the positions.
    Sinusoidal,
}

/// How queries and keys are normalised per head before their dot product.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum QkNorm {
    /// Plain scaled dot-product attention: `softmax(q·kᵀ / √d)`.
    None,
    /// LayerNorm over head_dim with a gain and bias shared across heads (ViT-22B; Wortsman et al. 2023).
    Layernorm,
    /// RMSNorm over head_dim with a gain shared across heads (Qwen3, Gemma 3, OLMo 2).
    Rmsnorm,
    /// Unit-normalise q and k and replace 1/√d by a learnable scalar g (Henry et al. 2020, "QKNorm").
    L2,
}

/// Every knob of the architecture. One struct for both architectures; fields that only one of
/// them reads say so.
///
/// The schema states the rules between keys that a JSON Schema can (see the `allOf` below);
/// Ember checks those and the rest: `d_model` divisible by `n_heads` (unless `head_dim` is
/// given), `n_heads` by `n_kv_heads`, and an even head width for rotary embeddings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("allOf" = [
    {"$comment": "Without `init_from`, `arch`, `d_model`, `n_heads` and `d_ff` are required, `arch: lm` needs `n_layers` (and no `n_encoder_layers`/`n_decoder_layers`), and `arch: seq2seq` needs `n_layers` or both stacks' counts; with `init_from` the model folder gives them and `arch` can only be `lm`.",
     "if": {"properties": {"init_from": {"type": "string"}}, "required": ["init_from"]},
     "then": {"properties": {"arch": {"const": "lm"}}},
     "else": {"required": ["arch", "d_model", "n_heads", "d_ff"], "allOf": [
        {"if": {"properties": {"arch": {"const": "lm"}}},
         "then": {"required": ["n_layers"],
                  "properties": {"n_layers": {"type": "integer"},
                                 "n_encoder_layers": {"type": "null"}, "n_decoder_layers": {"type": "null"}}}},
        {"if": {"properties": {"arch": {"const": "seq2seq"}}},
         "then": {"allOf": [
            {"anyOf": [{"required": ["n_layers"], "properties": {"n_layers": {"type": "integer"}}},
                       {"required": ["n_encoder_layers"], "properties": {"n_encoder_layers": {"type": "integer"}}}]},
            {"anyOf": [{"required": ["n_layers"], "properties": {"n_layers": {"type": "integer"}}},
                       {"required": ["n_decoder_layers"], "properties": {"n_decoder_layers": {"type": "integer"}}}]}]}}]}},
    {"$comment": "`qkv_bias: true` needs `arch: lm` and `positions: rope`.",
     "if": {"properties": {"qkv_bias": {"const": true}}, "required": ["qkv_bias"]},
     "then": {"properties": {"arch": {"const": "lm"}, "positions": {"const": "rope"}}}},
    {"$comment": "`qk_norm_init_scale` and `qk_norm_length` apply to `qk_norm: l2` only.",
     "if": {"properties": {"qk_norm": {"const": "l2"}}, "required": ["qk_norm"]},
     "else": {"properties": {"qk_norm_init_scale": {"type": "null"}, "qk_norm_length": {"type": "null"}}}},
    {"$comment": "`logn_length` needs `logn_attention: true`.",
     "if": {"properties": {"logn_length": {"type": "integer"}}, "required": ["logn_length"]},
     "then": {"properties": {"logn_attention": {"const": true}}, "required": ["logn_attention"]}},
    {"$comment": "`logn_attention: true` without `logn_length` needs `max_seq_len` of at least 2.",
     "if": {"properties": {"logn_attention": {"const": true}, "logn_length": {"type": "null"}},
            "required": ["logn_attention"]},
     "then": {"properties": {"max_seq_len": {"minimum": 2}}}},
    {"$comment": "With rotary positions (the default) `head_dim` must be even: they turn pairs of a head's dimensions.",
     "if": {"properties": {"positions": {"enum": ["learned", "none"]}}, "required": ["positions"]},
     "else": {"properties": {"head_dim": {"multipleOf": 2}}}}
]))]
#[schemars(transform = required_by_the_rules_above)]
pub struct ModelConfig {
    /// A Hugging Face model folder to start from (`config.json`, `*.safetensors`,
    /// `tokenizer.json`): its config gives the architecture keys of this section, its weights
    /// the initial parameters and its tokenizer the run's (see the `ember-import` crate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_from: Option<PathBuf>,
    /// `lm` (decoder-only language model) or `seq2seq` (encoder–decoder translation model).
    pub arch: Arch,
    /// Size of the (joint) vocabulary. Leave it out to take it from the tokenizer: the trainer
    /// fills it in before the model is built, and saves the resolved value with the run.
    #[serde(default)]
    #[schemars(range(min = 2))]
    pub vocab_size: Option<usize>,
    /// Width of the residual stream (the embedding size).
    #[schemars(range(min = 1))]
    pub d_model: usize,
    /// Layers of the LM, and the default for both stacks of a seq2seq model.
    #[serde(default)]
    #[schemars(range(min = 1, max = MAX_LAYERS))]
    pub n_layers: Option<usize>,
    /// seq2seq only: encoder layers (defaults to `n_layers`).
    #[serde(default)]
    #[schemars(range(min = 1, max = MAX_LAYERS))]
    pub n_encoder_layers: Option<usize>,
    /// seq2seq only: decoder layers (defaults to `n_layers`).
    #[serde(default)]
    #[schemars(range(min = 1, max = MAX_LAYERS))]
    pub n_decoder_layers: Option<usize>,
    /// Attention (query) heads per layer; `d_model` must be divisible by it unless `head_dim`
    /// is given.
    #[schemars(range(min = 1))]
    pub n_heads: usize,
    /// Key/value heads for grouped-query attention; defaults to `n_heads` (plain multi-head).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub n_kv_heads: Option<usize>,
    /// Width of each attention head; defaults to `d_model / n_heads`. Some models set it apart
    /// from the residual width (Qwen3-0.6B: d_model 1024, 16 heads of 128).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub head_dim: Option<usize>,
    /// Biases on the query, key and value projections (Qwen2's; the output projection has none),
    /// initialised to zero. Left out when false, so configs written before it hash the same.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[schemars(extend("default" = false))]
    pub qkv_bias: bool,
    /// Biases on every projection but the output layer, as fairseq's linear layers have them:
    /// q, v, the attention's output and the MLP's (and k's where keys are rotated: without a
    /// rotation a key bias adds the same amount to every logit of a query, which the softmax
    /// cancels). They start at 0, or under `init_scheme: fairseq` or `fairseq_0_9` as that
    /// fairseq starts them. Left out when false, so configs written before it hash the same.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[schemars(extend("default" = false))]
    pub proj_bias: bool,
    /// Hidden width of each feed-forward block.
    #[schemars(range(min = 1))]
    pub d_ff: usize,
    /// The feed-forward block: `swiglu`, `gelu` or `relu`.
    #[serde(default = "default_mlp")]
    pub mlp: MlpKind,
    /// The residual-stream normalisation: `rmsnorm` or `layernorm`.
    #[serde(default = "default_norm")]
    pub norm: NormKind,
    /// Where the residual-stream norms sit: `pre` (default) or `post` (the original
    /// Transformer's `norm(x + branch(x))`, without a final norm). Post-norm projections all
    /// start at `init_std`: the norm after every residual add already bounds the stream, so the
    /// depth scaling of pre-norm's output projections does not apply. Left out when `pre`, so
    /// configs written before it hash the same.
    #[serde(default, skip_serializing_if = "NormPlacement::is_pre")]
    #[schemars(extend("default" = "pre"))]
    pub norm_placement: NormPlacement,
    /// `norm: layernorm` only: give the residual-stream LayerNorms (each block's pre-norms and
    /// the final norm) a learned bias. nanoGPT's default (`bias=False`) and OLMo drop it, the
    /// original GPT-2 keeps it; `false` matches the former. RMSNorm never has a bias, and the
    /// qk-norm LayerNorms keep their own (see `qk_norm`).
    #[serde(default = "default_true")]
    pub norm_bias: bool,
    /// The ε added to the variance in every norm.
    #[serde(default = "default_norm_eps")]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub norm_eps: f64,
    /// The base of the rotary embeddings' frequencies.
    #[serde(default = "default_rope_theta")]
    #[schemars(extend("exclusiveMinimum" = 1))]
    pub rope_theta: f64,
    /// Longest sequence (source or target) the rotary tables or learned positions cover.
    #[serde(default = "default_max_seq_len")]
    #[schemars(range(min = 1, max = MAX_SEQ_LEN))]
    pub max_seq_len: usize,
    /// Position information: `rope` (default), `learned`, `sinusoidal` or `none`.
    #[serde(default = "default_positions")]
    pub positions: Positions,
    /// Multiply token embeddings by √d_model before positions are added (Vaswani et al.;
    /// fairseq unless `--no-scale-embedding`): with `init_std` = d_model^−½ the scaled
    /// embeddings have unit variance, like the sinusoids they are added to. Left out when
    /// false, so configs written before it hash the same.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[schemars(extend("default" = false))]
    pub scale_embeddings: bool,
    /// How queries and keys are normalised per head before their dot product: `none` (the
    /// baseline), `layernorm`, `rmsnorm` or `l2`.
    #[serde(default = "default_qk_norm")]
    pub qk_norm: QkNorm,
    /// `l2` only: the initial value g₀ of the learnable logit scale. Leave it out for Henry et
    /// al.'s rule g₀ = log2(L² − L), with L = `qk_norm_length` (or `max_seq_len`).
    #[serde(default)]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub qk_norm_init_scale: Option<f64>,
    /// `l2` only: the length L in g₀ = log2(L² − L); Henry et al. use the 97.5th percentile of
    /// training sequence lengths, which the trainer measures and fills in when left out.
    #[serde(default)]
    #[schemars(range(min = 2))]
    pub qk_norm_length: Option<usize>,
    /// Log-n attention scaling (entropy-invariant attention; Qwen's `use_logn_attn`): in causal
    /// self-attention a query that sees n > m keys has its logits scaled by ln n / ln m on top
    /// of 1/√d (for `l2`, on top of g), with m = `logn_length`. A no-op up to length m, so it
    /// changes nothing in training at length m and only acts when evaluating past it.
    #[serde(default)]
    pub logn_attention: bool,
    /// The training length m of `logn_attention` (default `max_seq_len`). Evaluating past the
    /// training length raises `max_seq_len`, so `ember eval --context` pins m here first.
    #[serde(default)]
    #[schemars(range(min = 2))]
    pub logn_length: Option<usize>,
    /// Dropout on embeddings and on each residual branch's output.
    #[serde(default)]
    #[schemars(range(min = 0), extend("exclusiveMaximum" = 1))]
    pub dropout: f64,
    /// Dropout on attention probabilities.
    #[serde(default)]
    #[schemars(range(min = 0), extend("exclusiveMaximum" = 1))]
    pub attn_dropout: f64,
    /// Use the token embedding as the output projection. In seq2seq the encoder and decoder
    /// always share one embedding (the vocabulary is joint).
    #[serde(default = "default_true")]
    pub tie_embeddings: bool,
    /// Standard deviation of the normal initialisation of embeddings, and of projections under
    /// `init_scheme: normal`.
    #[serde(default = "default_init_std")]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub init_std: f64,
    /// How the projections start: `normal` (default; normal(0, `init_std`)), `fairseq`
    /// (fairseq's `transformer` today: Xavier-uniform attention, gain 1/√2 for q, k, v; uniform
    /// ±1/√fan_in MLP) or `fairseq_0_9` (as fairseq 0.9 drew it, with which Wu et al. trained
    /// Transformer-Tiny: the MLP Xavier-uniform too, its biases at 0). Left out when `normal`,
    /// so configs written before it hash the same.
    #[serde(default, skip_serializing_if = "InitScheme::is_normal")]
    #[schemars(extend("default" = "normal"))]
    pub init_scheme: InitScheme,
}

/// The keys serde requires (`arch`, `d_model`, …) are required only without `init_from`, whose
/// model folder fills them in before serde sees the section: the `allOf` rules say so, in place
/// of schemars' unconditional list.
fn required_by_the_rules_above(schema: &mut schemars::Schema) {
    schema.remove("required");
}

fn default_mlp() -> MlpKind {
    MlpKind::Swiglu
}
fn default_norm() -> NormKind {
    NormKind::Rmsnorm
}
fn default_norm_eps() -> f64 {
    1e-5
}
fn default_rope_theta() -> f64 {
    10_000.0
}
fn default_max_seq_len() -> usize {
    512
}
fn default_positions() -> Positions {
    Positions::Rope
}
fn default_qk_norm() -> QkNorm {
    QkNorm::None
}
fn default_true() -> bool {
    true
}
fn default_init_std() -> f64 {
    0.02
}

impl NormPlacement {
    fn is_pre(&self) -> bool {
        *self == NormPlacement::Pre
    }
}

/// A configuration value that cannot build a model. `key` is the YAML path of the offending field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct ConfigError {
    pub key: String,
    pub message: String,
}

/// The most layers a stack may have: far beyond any published transformer, and well inside
/// what the autograd graph's depth allows (a deeper stack would overflow the stack walking it).
pub const MAX_LAYERS: usize = 1024;

/// The longest `max_seq_len`: 2^20 positions (16× the longest `ember eval --context`); the
/// rotary tables of a longer one take minutes to build and more memory than a run needs.
pub const MAX_SEQ_LEN: usize = 1 << 20;

fn bad(key: &str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        key: format!("model.{key}"),
        message: message.into(),
    }
}

fn positive(key: &str, v: usize) -> Result<(), ConfigError> {
    if v == 0 {
        Err(bad(key, "must be greater than 0"))
    } else {
        Ok(())
    }
}

impl ModelConfig {
    /// A small valid configuration to start from in code and tests.
    pub fn tiny(arch: Arch) -> Self {
        Self {
            init_from: None,
            arch,
            vocab_size: Some(32),
            d_model: 16,
            n_layers: Some(2),
            n_encoder_layers: None,
            n_decoder_layers: None,
            n_heads: 4,
            n_kv_heads: None,
            head_dim: None,
            qkv_bias: false,
            proj_bias: false,
            d_ff: 32,
            mlp: default_mlp(),
            norm: default_norm(),
            norm_placement: NormPlacement::Pre,
            norm_bias: true,
            norm_eps: default_norm_eps(),
            rope_theta: default_rope_theta(),
            max_seq_len: 64,
            positions: default_positions(),
            scale_embeddings: false,
            qk_norm: default_qk_norm(),
            qk_norm_init_scale: None,
            qk_norm_length: None,
            logn_attention: false,
            logn_length: None,
            dropout: 0.0,
            attn_dropout: 0.0,
            tie_embeddings: true,
            init_std: default_init_std(),
            init_scheme: InitScheme::Normal,
        }
    }

    /// Checks everything the constructors rely on, so that building a model never panics.
    /// The checks run in a fixed order, section by section, and the first failure is reported.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check_widths()?;
        self.check_layers()?;
        self.check_max_seq_len()?;
        self.check_heads()?;
        self.check_scalars()?;
        self.check_logn()?;
        self.check_combinations()
    }

    /// The vocabulary and the widths every layer is built with.
    fn check_widths(&self) -> Result<(), ConfigError> {
        match self.vocab_size {
            None => return Err(bad(
                "vocab_size",
                "is not set (the trainer takes it from the tokenizer; set it when building a model directly)",
            )),
            Some(v) if v < 2 => return Err(bad("vocab_size", format!("must be at least 2, got {v}"))),
            _ => {}
        }
        positive("d_model", self.d_model)?;
        positive("n_heads", self.n_heads)?;
        positive("d_ff", self.d_ff)?;
        positive("max_seq_len", self.max_seq_len)?;
        Ok(())
    }

    /// The layer counts the architecture needs, each within what Ember builds.
    fn check_layers(&self) -> Result<(), ConfigError> {
        match self.arch {
            Arch::Lm => {
                if self.n_layers.is_none() {
                    return Err(bad("n_layers", "is required for arch: lm"));
                }
                if self.n_encoder_layers.is_some() || self.n_decoder_layers.is_some() {
                    return Err(bad(
                        "n_encoder_layers",
                        "n_encoder_layers/n_decoder_layers apply to arch: seq2seq only; use n_layers",
                    ));
                }
            }
            Arch::Seq2seq => {
                if self.n_encoder_layers.or(self.n_layers).is_none() {
                    return Err(bad(
                        "n_encoder_layers",
                        "is required (or set n_layers for both stacks)",
                    ));
                }
                if self.n_decoder_layers.or(self.n_layers).is_none() {
                    return Err(bad(
                        "n_decoder_layers",
                        "is required (or set n_layers for both stacks)",
                    ));
                }
            }
        }
        let layers = |key: &str, n: usize| {
            positive(key, n)?;
            if n > MAX_LAYERS {
                return Err(bad(
                    key,
                    format!(
                        "{n} layers is more than Ember builds (at most {MAX_LAYERS} per stack); use fewer"
                    ),
                ));
            }
            Ok(())
        };
        if let Some(n) = self.n_layers {
            layers("n_layers", n)?;
        }
        if let Some(n) = self.n_encoder_layers {
            layers("n_encoder_layers", n)?;
        }
        if let Some(n) = self.n_decoder_layers {
            layers("n_decoder_layers", n)?;
        }
        Ok(())
    }

    /// The longest sequence, within the positions Ember supports.
    fn check_max_seq_len(&self) -> Result<(), ConfigError> {
        if self.max_seq_len > MAX_SEQ_LEN {
            return Err(bad(
                "max_seq_len",
                format!(
                    "{} positions is more than Ember supports (at most {MAX_SEQ_LEN}); use the \
                     longest length the model trains or evaluates at",
                    self.max_seq_len
                ),
            ));
        }
        Ok(())
    }

    /// The attention heads: their width (even for rotary embeddings) and the key/value groups.
    fn check_heads(&self) -> Result<(), ConfigError> {
        if self.head_dim == Some(0) {
            return Err(bad("head_dim", "must be greater than 0"));
        }
        if self.head_dim.is_none() && !self.d_model.is_multiple_of(self.n_heads) {
            return Err(bad(
                "d_model",
                format!(
                    "d_model ({}) must be divisible by n_heads ({})",
                    self.d_model, self.n_heads
                ),
            ));
        }
        if self.positions == Positions::Rope && !self.head_dim().is_multiple_of(2) {
            return Err(bad(
                "n_heads",
                match self.head_dim {
                    Some(hd) => format!("head_dim = {hd} must be even for rotary embeddings"),
                    None => format!(
                        "head_dim = d_model / n_heads = {} must be even for rotary embeddings",
                        self.head_dim()
                    ),
                },
            ));
        }
        let kv = self.kv_heads();
        if kv == 0 {
            return Err(bad("n_kv_heads", "must be greater than 0"));
        }
        if !self.n_heads.is_multiple_of(kv) {
            return Err(bad(
                "n_kv_heads",
                format!(
                    "n_heads ({}) must be divisible by n_kv_heads ({kv})",
                    self.n_heads
                ),
            ));
        }
        Ok(())
    }

    /// The numeric settings' ranges: norm epsilon, RoPE base, dropouts, init and QK-norm scales.
    fn check_scalars(&self) -> Result<(), ConfigError> {
        if !(self.norm_eps > 0.0 && self.norm_eps.is_finite()) {
            return Err(bad(
                "norm_eps",
                format!("must be a positive number, got {}", self.norm_eps),
            ));
        }
        if !(self.rope_theta > 1.0 && self.rope_theta.is_finite()) {
            return Err(bad(
                "rope_theta",
                format!("must be a number above 1, got {}", self.rope_theta),
            ));
        }
        for (key, p) in [("dropout", self.dropout), ("attn_dropout", self.attn_dropout)] {
            if !(0.0..1.0).contains(&p) {
                return Err(bad(key, format!("must be in [0, 1), got {p}")));
            }
        }
        if !(self.init_std > 0.0 && self.init_std.is_finite()) {
            return Err(bad(
                "init_std",
                format!("must be a positive number, got {}", self.init_std),
            ));
        }
        if let Some(g) = self.qk_norm_init_scale {
            if !(g > 0.0 && g.is_finite()) {
                return Err(bad(
                    "qk_norm_init_scale",
                    format!("must be a positive number, got {g}"),
                ));
            }
        }
        if let Some(l) = self.qk_norm_length {
            if l < 2 {
                return Err(bad("qk_norm_length", format!("must be at least 2, got {l}")));
            }
        }
        Ok(())
    }

    /// Log-n attention scaling: its training length, and a length to take it from.
    fn check_logn(&self) -> Result<(), ConfigError> {
        if let Some(m) = self.logn_length {
            if m < 2 {
                return Err(bad(
                    "logn_length",
                    format!("must be at least 2 (ln m divides), got {m}"),
                ));
            }
            if !self.logn_attention {
                return Err(bad(
                    "logn_length",
                    "applies to logn_attention: true only; set logn_attention: true or leave logn_length out",
                ));
            }
        }
        if self.logn_attention && self.logn_length.is_none() && self.max_seq_len < 2 {
            return Err(bad(
                "logn_attention",
                "needs a training length of at least 2: set logn_length (or max_seq_len ≥ 2)",
            ));
        }
        Ok(())
    }

    /// Settings that apply only together with others.
    fn check_combinations(&self) -> Result<(), ConfigError> {
        if self.qkv_bias && (self.arch != Arch::Lm || self.positions != Positions::Rope) {
            return Err(bad(
                "qkv_bias",
                "needs arch: lm and positions: rope (Qwen2's biases; without a rotation a key bias \
                 adds the same amount to every logit of a query, which the softmax cancels)",
            ));
        }
        if self.init_from.is_some() && self.arch != Arch::Lm {
            return Err(bad(
                "init_from",
                "imports a decoder-only language model, so it needs arch: lm",
            ));
        }
        if self.qk_norm != QkNorm::L2 && (self.qk_norm_init_scale.is_some() || self.qk_norm_length.is_some())
        {
            return Err(bad(
                "qk_norm_init_scale",
                "qk_norm_init_scale and qk_norm_length apply to qk_norm: l2 only",
            ));
        }
        Ok(())
    }

    /// Vocabulary size; call after [`validate`](Self::validate).
    pub fn vocab(&self) -> usize {
        self.vocab_size.unwrap_or(0)
    }
    /// Width of each attention head: `head_dim`, or `d_model / n_heads`.
    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.d_model / self.n_heads.max(1))
    }
    /// Whether the attention's query and value projections add a bias: Qwen2's (`qkv_bias`) or
    /// fairseq's (`proj_bias`).
    pub fn query_value_bias(&self) -> bool {
        self.qkv_bias || self.proj_bias
    }

    /// Whether an attention's key projection adds a bias, `rotated` saying whether its keys are
    /// rotated. Qwen2's always; fairseq's only with a rotation: without one a key bias adds the
    /// same q·b to every logit of a query, which the softmax cancels, so it could never learn.
    pub fn key_bias(&self, rotated: bool) -> bool {
        self.qkv_bias || (self.proj_bias && rotated)
    }

    /// Width of all query heads together (the query projection's output, the output
    /// projection's input): `d_model` unless `head_dim` says otherwise.
    pub fn q_width(&self) -> usize {
        self.n_heads * self.head_dim()
    }
    pub fn kv_heads(&self) -> usize {
        self.n_kv_heads.unwrap_or(self.n_heads)
    }
    /// Layers in the encoder (0 for a language model).
    pub fn encoder_layers(&self) -> usize {
        match self.arch {
            Arch::Lm => 0,
            Arch::Seq2seq => self.n_encoder_layers.or(self.n_layers).unwrap_or(0),
        }
    }
    /// Layers in the decoder (the whole stack of a language model).
    pub fn decoder_layers(&self) -> usize {
        match self.arch {
            Arch::Lm => self.n_layers.unwrap_or(0),
            Arch::Seq2seq => self.n_decoder_layers.or(self.n_layers).unwrap_or(0),
        }
    }
    /// The training length m of log-n scaling, when it is on.
    pub fn logn_train_length(&self) -> Option<usize> {
        self.logn_attention
            .then(|| self.logn_length.unwrap_or(self.max_seq_len))
    }
    /// Initial value of the `l2` logit scale g: explicit, or log2(L² − L) (Henry et al. 2020).
    pub fn l2_init_scale(&self) -> f64 {
        self.qk_norm_init_scale.unwrap_or_else(|| {
            let l = self.qk_norm_length.unwrap_or(self.max_seq_len).max(2) as f64;
            (l * l - l).log2()
        })
    }
}
