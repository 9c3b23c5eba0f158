//! Taking Ember models to where the field runs them: `ember export RUN --format hf OUT/` writes a
//! decoder-only run as a Hugging Face `transformers` model directory that
//! `AutoModelForCausalLM.from_pretrained(OUT)` and `AutoTokenizer.from_pretrained(OUT)` load.
//!
//! Ember's language model is, block for block, the Llama architecture when its settings are
//! RMSNorm, SwiGLU and rotary embeddings (rotate-half pairs (i, i + d/2), as transformers' own),
//! with grouped-query attention and no biases; with `qk_norm: rmsnorm` (per-head RMSNorm, gain
//! shared across heads, before the rotation) it is Qwen3's, with `qkv_bias: true` (biases on the
//! query, key and value projections) Qwen2's. So the export renames tensors and
//! writes the config; no weight is permuted or changed. A run that does not map is refused with
//! every blocking setting named ([`architecture`]).
//!
//! ```
//! use ember_model::{Arch, ModelConfig, QkNorm};
//! let mut cfg = ModelConfig::tiny(Arch::Lm); // RMSNorm, SwiGLU, rotary positions
//! assert_eq!(ember_export::architecture(&cfg).unwrap().class_name(), "LlamaForCausalLM");
//! cfg.qk_norm = QkNorm::Rmsnorm; // per-head RMSNorm on q and k: Qwen3's q_norm/k_norm
//! assert_eq!(ember_export::architecture(&cfg).unwrap().class_name(), "Qwen3ForCausalLM");
//! cfg.qk_norm = QkNorm::L2; // a learnable logit scale, which no transformers class has
//! let blockers = ember_export::architecture(&cfg).unwrap_err();
//! assert!(blockers.iter().any(|b| b.contains("qk_norm")));
//! ```
//!
//! A separate crate because it is a translation into another project's conventions, not part of
//! training: it reads a finished run (config, checkpoint, tokenizer) and nothing reads it back.

mod hf_config;
mod weights;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use ember_data::{Tokenizer, TokenizerKind, TOKENIZER_FILE};
use ember_model::{
    Arch, ForwardCtx, MlpKind, Model, ModelConfig, NormKind, NormPlacement, ParamStore, Positions, QkNorm,
};
use ember_trainer::checkpoint;
use ember_trainer::config::RunConfig;
use ember_trainer::run_dir::RUN_CONFIG;
use serde::Serialize;

pub use weights::hf_weight_name;

/// The transformers architecture a run maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum HfArch {
    /// `LlamaForCausalLM`: no QK-norm.
    Llama,
    /// `Qwen3ForCausalLM`: per-head RMSNorm on queries and keys before RoPE.
    Qwen3,
    /// `Qwen2ForCausalLM`: biases on the q, k and v projections, no QK-norm.
    Qwen2,
}

impl HfArch {
    pub fn class_name(self) -> &'static str {
        match self {
            HfArch::Llama => "LlamaForCausalLM",
            HfArch::Qwen3 => "Qwen3ForCausalLM",
            HfArch::Qwen2 => "Qwen2ForCausalLM",
        }
    }
    pub fn model_type(self) -> &'static str {
        match self {
            HfArch::Llama => "llama",
            HfArch::Qwen3 => "qwen3",
            HfArch::Qwen2 => "qwen2",
        }
    }
}

/// The architecture `cfg` maps to, or every setting that keeps it from mapping, each with why.
pub fn architecture(cfg: &ModelConfig) -> std::result::Result<HfArch, Vec<String>> {
    let mut blockers = Vec::new();
    if cfg.arch == Arch::Seq2seq {
        blockers.push(
            "model.arch: seq2seq (an encoder-decoder; Llama and Qwen3 are decoder-only language models)"
                .to_string(),
        );
    }
    if cfg.norm == NormKind::Layernorm {
        blockers.push("model.norm: layernorm (Llama and Qwen3 use RMSNorm)".to_string());
    }
    match cfg.mlp {
        MlpKind::Gelu => blockers.push("model.mlp: gelu (Llama and Qwen3 use SwiGLU)".to_string()),
        MlpKind::Relu => blockers.push("model.mlp: relu (Llama and Qwen3 use SwiGLU)".to_string()),
        MlpKind::Swiglu => {}
    }
    if cfg.norm_placement == NormPlacement::Post {
        blockers
            .push("model.norm_placement: post (Llama and Qwen3 are pre-norm, with a final norm)".to_string());
    }
    if cfg.scale_embeddings {
        blockers.push(
            "model.scale_embeddings: true (Llama and Qwen3 do not scale their embeddings by sqrt(d_model))"
                .to_string(),
        );
    }
    match cfg.qk_norm {
        QkNorm::Layernorm => blockers.push(
            "model.qk_norm: layernorm (Qwen3's q_norm/k_norm are RMSNorm; use rmsnorm or none)".to_string(),
        ),
        QkNorm::L2 => blockers.push(
            "model.qk_norm: l2 (a learnable logit scale in place of 1/sqrt(head_dim), which no transformers \
             architecture has; use rmsnorm or none)"
                .to_string(),
        ),
        QkNorm::None | QkNorm::Rmsnorm => {}
    }
    if cfg.positions != Positions::Rope {
        blockers.push(format!(
            "model.positions: {} (Llama and Qwen3 use rotary positions)",
            serde_json::to_value(cfg.positions)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default()
        ));
    }
    if cfg.qkv_bias && cfg.qk_norm == QkNorm::Rmsnorm {
        blockers.push(
            "model.qkv_bias: true with qk_norm: rmsnorm (Qwen2 has q, k and v biases but no QK-norm; \
             Qwen3 has QK-norm, and biases only together with one on o_proj, which Ember lacks)"
                .to_string(),
        );
    }
    if cfg.proj_bias {
        blockers.push(
            "model.proj_bias: true (biases on the attention's output and the MLP, which Llama, Qwen2 \
             and Qwen3 do not have)"
                .to_string(),
        );
    }
    if cfg.logn_attention {
        blockers.push(
            "model.logn_attention: true (log-n query scaling past the training length, which Llama and Qwen3 do not have; the exported model would differ beyond logn_length)"
                .to_string(),
        );
    }
    if !blockers.is_empty() {
        return Err(blockers);
    }
    Ok(match (cfg.qk_norm, cfg.qkv_bias) {
        (QkNorm::Rmsnorm, _) => HfArch::Qwen3,
        (_, true) => HfArch::Qwen2,
        _ => HfArch::Llama,
    })
}

/// The files of a Hugging Face model directory, as [`export_hf`] writes them.
pub const HF_FILES: [&str; 5] = [
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
];

/// The dtype an export stores its weights in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ExportDtype {
    /// The checkpoint's own f32 weights, exactly.
    #[default]
    F32,
    /// Rounded to bf16 (to nearest even): half the size, as Hugging Face models ship.
    Bf16,
}

impl ExportDtype {
    fn candle(self) -> DType {
        match self {
            ExportDtype::F32 => DType::F32,
            ExportDtype::Bf16 => DType::BF16,
        }
    }
    /// transformers' name of the dtype (`torch_dtype` in config.json).
    pub fn hf_name(self) -> &'static str {
        match self {
            ExportDtype::F32 => "float32",
            ExportDtype::Bf16 => "bfloat16",
        }
    }
}

/// What [`export_hf`] wrote.
#[derive(Debug, Clone, Serialize)]
pub struct HfExport {
    pub arch: HfArch,
    /// The dtype of the exported weights.
    pub dtype: ExportDtype,
    /// The checkpoint the weights came from.
    pub checkpoint: PathBuf,
    pub out: PathBuf,
    pub tensors: usize,
    pub params: usize,
}

/// A run's checkpoint, opened for export: its model config, weights and tokenizer. Reads no
/// corpus, so a run can be exported where its data is not.
pub struct ExportSource {
    pub model: ModelConfig,
    pub checkpoint: checkpoint::Loaded,
    pub tokenizer: Tokenizer,
}

impl ExportSource {
    /// `run` is a run directory (its newest checkpoint) or one checkpoint directory in it.
    pub fn open(run: &Path) -> Result<Self> {
        let (run_dir, ckpt_dir) = checkpoint::run_and_checkpoint(run)?;
        let checkpoint = checkpoint::load(&ckpt_dir, &Device::Cpu)?;
        let model = checkpoint.state.model_config.clone();
        let tokenizer = if pretrained_tokenizer(&ckpt_dir)? {
            // A pretrained model's embedding may have more rows than its tokenizer has tokens.
            let tok = Tokenizer::load_pretrained(&run_dir)?;
            if tok.vocab_size() > model.vocab() {
                bail!(
                    "{} has {} tokens, more than the model's vocab_size {}",
                    run_dir.join(TOKENIZER_FILE).display(),
                    tok.vocab_size(),
                    model.vocab()
                );
            }
            tok
        } else {
            Tokenizer::load_checked(run_dir.join(TOKENIZER_FILE), model.vocab())?
        };
        Ok(Self {
            model,
            checkpoint,
            tokenizer,
        })
    }

    /// The architecture, or an error naming every setting that blocks the export.
    pub fn architecture(&self) -> Result<HfArch> {
        architecture(&self.model).or_else(|blockers| {
            bail!(
                "cannot export {} to Hugging Face transformers: its model does not map to Llama, \
                 Qwen2 or Qwen3 because of\n  {}\nOnly decoder-only runs with norm: rmsnorm, mlp: \
                 swiglu and qk_norm: none (Llama; Qwen2 with qkv_bias) or rmsnorm (Qwen3) map.",
                self.checkpoint.dir.display(),
                blockers.join("\n  ")
            )
        })
    }

    /// Next-token logits (T, V) of the Ember model for `tokens`, in evaluation mode.
    pub fn logits(&self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        self.logits_as(tokens, ExportDtype::F32)
    }

    /// [`logits`](Self::logits) of the weights as an export in `dtype` stores them (rounded for
    /// bf16), computed in f32: what transformers computes from that export in float32.
    pub fn logits_as(&self, tokens: &[u32], dtype: ExportDtype) -> Result<Vec<Vec<f32>>> {
        let params = match dtype {
            ExportDtype::F32 => self.checkpoint.params.clone(),
            ExportDtype::Bf16 => {
                let rounded = self.checkpoint.params.vars().into_iter().map(|(name, var)| {
                    let t = var.as_tensor();
                    (name, t.to_dtype(DType::BF16).and_then(|r| r.to_dtype(t.dtype())))
                });
                let rounded = rounded
                    .map(|(name, t)| t.map(|t| (name, t)))
                    .collect::<candle_core::Result<Vec<_>>>()?;
                ParamStore::from_tensors(rounded, DType::F32, &Device::Cpu)?
            }
        };
        let model = Model::new(&self.model, &params)?;
        let lm = model
            .as_lm()
            .context("only a language model gives next-token logits")?;
        if tokens.is_empty() || tokens.len() > self.model.max_seq_len {
            bail!(
                "need 1 to model.max_seq_len = {} tokens, got {}",
                self.model.max_seq_len,
                tokens.len()
            );
        }
        let input = Tensor::new(tokens, &Device::Cpu)?.unsqueeze(0)?;
        Ok(lm
            .forward(&input, ForwardCtx::eval())?
            .squeeze(0)?
            .to_vec2::<f32>()?)
    }
}

/// Whether the run of the checkpoint `ckpt_dir` reads text with a pretrained model's tokenizer
/// (`data.tokenizer.kind: pretrained` in the config.yaml it was trained with).
fn pretrained_tokenizer(ckpt_dir: &Path) -> Result<bool> {
    let cfg = RunConfig::load(&ckpt_dir.join(RUN_CONFIG), &[])?;
    Ok(cfg.data.tokenizer.kind == TokenizerKind::Pretrained)
}

/// Writes `source` as a Hugging Face model directory `out`: a new folder (or an empty one),
/// written whole into a temporary sibling and renamed into place, so that it holds the five
/// [`HF_FILES`] or does not exist. Everything that can refuse the export (the architecture, the
/// folder, the tokenizer's config) is settled before the first byte is written. Its weights are
/// stored in f32.
pub fn export_hf(source: &ExportSource, out: &Path) -> Result<HfExport> {
    export_hf_as(source, out, ExportDtype::F32)
}

/// [`export_hf`] with the weights stored in `dtype` (`ember export --dtype`).
pub fn export_hf_as(source: &ExportSource, out: &Path, dtype: ExportDtype) -> Result<HfExport> {
    let arch = source.architecture()?;
    check_out(out, &source.checkpoint.dir)?;
    let specials = source.tokenizer.special_tokens();
    let tokenizer_config = hf_config::tokenizer_config(&source.model, &source.tokenizer)
        .context("the run's tokenizer_config.json is not valid JSON")?;
    let json_files = [
        (
            "config.json",
            hf_config::model_config(arch, &source.model, specials, dtype.hf_name()),
        ),
        ("generation_config.json", hf_config::generation_config(specials)),
        ("tokenizer_config.json", tokenizer_config),
    ];
    let (tensors, params) = ember_trainer::protected::write_folder(out, |tmp| {
        let written = weights::write(
            &source.model,
            &source.checkpoint.params,
            &tmp.join("model.safetensors"),
            dtype.candle(),
        )?;
        for (name, value) in &json_files {
            let path = tmp.join(name);
            ember_data::io::write_atomic(&path, (serde_json::to_string_pretty(value)? + "\n").as_bytes())
                .with_context(|| format!("writing {}", path.display()))?;
        }
        // The weights were written through a 0600 temporary file: give them config.json's mode.
        ember_data::io::permissions_like(&tmp.join("model.safetensors"), &tmp.join("config.json"))
            .with_context(|| format!("writing {}", tmp.join("model.safetensors").display()))?;
        source
            .tokenizer
            .save(tmp.join("tokenizer.json"))
            .context("writing tokenizer.json")?;
        Ok(written)
    })?;
    Ok(HfExport {
        arch,
        dtype,
        checkpoint: source.checkpoint.dir.clone(),
        out: out.to_path_buf(),
        tensors,
        params,
    })
}

/// Refuses an export folder by the one rule of [`ember_trainer::protected`]: `out` must be a new
/// (or empty) folder, not inside a run's checkpoints, a model folder or a Hugging Face folder —
/// the one the run `run` starts from (`model.init_from`) above all. Nothing is written on a
/// refusal.
pub fn check_out(out: &Path, run: &Path) -> Result<()> {
    ember_trainer::protected::check(out, "OUT", ember_trainer::protected::Output::Folder, &[run], &[])
}

/// Ember's logits for `text`, as JSON `{text, tokens, logits}`: what the exported model must
/// reproduce (`scripts/check-hf-export.py` compares them with transformers' output); of the
/// weights as an export in `dtype` stores them.
pub fn reference_logits(source: &ExportSource, text: &str, dtype: ExportDtype) -> Result<serde_json::Value> {
    let mut tokens = source.tokenizer.encode(text)?;
    tokens.truncate(source.model.max_seq_len);
    if tokens.is_empty() {
        bail!("--reference-text encodes to no tokens");
    }
    let logits = source.logits_as(&tokens, dtype)?;
    Ok(serde_json::json!({
        "text": source.tokenizer.decode(&tokens)?,
        "tokens": tokens,
        "logits": logits,
    }))
}
