//! Hugging Face models in: `model.init_from: DIR` starts a run from a transformers model folder
//! (`config.json`, `model.safetensors` or shards with `model.safetensors.index.json`,
//! `tokenizer.json`), such as one `huggingface-cli download` fetched.
//!
//! The inverse of `ember export --format hf`: a Llama, Mistral, Qwen2 or Qwen3 decoder is Ember's
//! language model with RMSNorm, SwiGLU and rotary positions (rotate-half, as transformers') and
//! grouped-query attention; Qwen2's biases on the query, key and value projections are Ember's
//! `qkv_bias: true`, Qwen3's per-head RMSNorm on queries and keys before the rotation its
//! `qk_norm: rmsnorm`. So the import reads the config ([`read_config`]),
//! renames tensors ([`ember_weight_name`]) and widens them to f32; no weight is permuted.
//! Whatever Ember cannot represent (other biases, sliding windows, scaled RoPE, experts, other
//! activations) is refused by name before a weight is read.
//!
//! ```
//! use ember_import::{ember_weight_name, hf_weight_name};
//! let ember = ember_weight_name("model.layers.3.self_attn.q_proj.weight").unwrap();
//! assert_eq!(hf_weight_name(&ember).as_deref(), Some("model.layers.3.self_attn.q_proj.weight"));
//! assert_eq!(ember_weight_name("model.layers.0.mlp.experts.0.up_proj.weight"), None);
//! ```
//!
//! The tokenizer is read by `ember-data` (`data.tokenizer.kind: pretrained`), and the trainer
//! joins the three (`crates/trainer/src/setup/init_from.rs`).

mod config;
mod names;
mod weights;

pub use config::{model_config, read as read_config, Family, HfModel, ARCHITECTURE_KEYS, CONFIG_FILE};
pub use names::{ember_weight_name, hf_weight_name};
pub use weights::{expected_shapes, load as load_weights, Imported, INDEX_FILE, SINGLE_FILE};
