//! Ember's transformer: pre-norm blocks with RMSNorm or LayerNorm, rotary positions,
//! grouped-query attention, and switchable QK-norm (none, LayerNorm, RMSNorm, L2 with a learnable
//! scale), as a decoder-only language model or an encoder–decoder translation model.
//!
//! Everything on the training path has a backward pass; the tests in `tests/` check every
//! parameter's gradient for every architecture variant, and check gradients against finite
//! differences.
//!
//! ```
//! use ember_model::{init_model, Arch, ForwardCtx, ModelConfig, QkNorm};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut cfg = ModelConfig::tiny(Arch::Lm); // 2 layers of width 16, a vocabulary of 32
//! cfg.qk_norm = QkNorm::Rmsnorm;
//! let (model, params) = init_model(&cfg, 0, candle_core::DType::F32, &candle_core::Device::Cpu)?;
//! let tokens = candle_core::Tensor::new(&[[1u32, 2, 3]], params.device())?;
//! let logits = model.as_lm().unwrap().forward(&tokens, ForwardCtx::eval())?;
//! assert_eq!(logits.dims(), &[1, 3, 32]); // (batch, positions, vocabulary)
//! # Ok(()) }
//! ```

mod attention;
mod block;
mod config;
mod decoding;
mod init;
mod layers;
mod length_penalty;
mod params;
mod recompute;
mod rope;
mod transformer;

pub use attention::{Attention, CrossKv, KvCache};
pub use block::Memory;
pub use config::{
    Arch, ConfigError, MlpKind, ModelConfig, NormKind, NormPlacement, Positions, QkNorm, MAX_LAYERS,
    MAX_SEQ_LEN,
};
pub use decoding::{
    beam_search, beam_search_finished, greedy, rank, sample, BeamConfig, Hypothesis, SampleConfig,
};
pub use init::InitScheme;
pub use layers::{sinusoids, AttentionStats, DropoutRng, ForwardCtx, Telemetry};
pub use length_penalty::LengthPenalty;
pub use params::ParamStore;
pub use rope::Rotary;
pub use transformer::{init_model, DecoderCache, LanguageModel, Model, ModelError, Seq2Seq};
