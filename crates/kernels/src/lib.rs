//! Ember's kernels: the ops of a training step, each fused into one pass with a hand-written
//! backward, beside the unfused composition of candle primitives it must equal.
//!
//! candle 0.11's own fused norm, softmax and rotary ops have no backward pass (gradients vanish
//! silently), and its elementwise compositions make five to ten passes over memory per op. Each
//! module here owns one op:
//!
//! | module | op |
//! |---|---|
//! | [`linear`] | `x·Wᵀ` through `gemm` (Ember's in-place AVX-512 kernel, or matrixmultiply's sums on Ember's AVX2 kernel; in bf16 its `vdpbf16ps` kernel), alone, followed by GELU or by the rotary rotation, or ending a residual branch |
//! | `precision` | the products' [`Precision`]: f32, or bf16 operands with f32 sums |
//! | `norm` | RMSNorm and LayerNorm over the last dimension |
//! | [`rope`] | rotary position embeddings with a folded-in output scale (constant, or grown per position by log-n scaling) |
//! | `softmax` | softmax over the last dimension |
//! | `activation` | GELU (erf form) and SwiGLU |
//! | `held` | what the activation and attention keep for their backward pass: f32, or bf16's bits under bf16 products |
//! | [`dropout`] | inverted dropout from a counter-based SplitMix64 mask, alone or on a residual branch |
//! | `embedding` | the token embedding's lookup, its gradient left in a [`GradSink`] |
//! | [`attention`] | softmax(q·kᵀ + mask)·v with grouped-query heads |
//! | `cross_entropy` | log-softmax, label smoothing, z-loss and padding: the per-row math, and its unfused reference |
//! | [`linear_cross_entropy`] | the output projection and that loss, a block of rows at a time (the logits are never stored whole) |
//! | `block` | a sub-block — self-attention, a decoder's cross-attention, the feed-forward block — as one op (a post-norm one's residual branch), its parameters' gradients left in a [`GradSink`] |
//! | [`adamw`] | the AdamW update of one parameter |
//! | `sum` | the shares' gradients summed in order, and a gradient's sum of squares |
//!
//! **One convention.** Every public op takes and returns tensors and decides by itself which
//! path to take: the fused CPU kernel for f32 CPU tensors, the unfused reference (`*_unfused`,
//! public, what the tests compare against) for everything else (CUDA, f64 finite-difference
//! tests). A CUDA kernel, where one is written, is the `cuda_fwd` half of the same custom op,
//! next to its `cpu_fwd`.
//!
//! **Determinism.** Every CPU kernel sums in a fixed order, so the same inputs give the same
//! bits on every run.
//!
//! A fused op equals its unfused reference, and gradients flow through it:
//!
//! ```
//! use candle_core::{DType, Device, Tensor, Var};
//! # fn main() -> candle_core::Result<()> {
//! let x = Var::from_tensor(&Tensor::new(&[[1f32, 2., 3., 4.], [0.5, -1., 2., 0.]], &Device::Cpu)?)?;
//! let gain = Tensor::ones(4, DType::F32, &Device::Cpu)?;
//! let fused = ember_kernels::rms_norm(x.as_tensor(), &gain, 1e-5)?;
//! let reference = ember_kernels::rms_norm_unfused(x.as_tensor(), &gain, 1e-5)?;
//! let gap = (&fused - &reference)?.abs()?.max_all()?.to_scalar::<f32>()?;
//! assert!(gap < 1e-6);
//! let grads = fused.sqr()?.sum_all()?.backward()?; // candle's own rms_norm would give none
//! assert!(grads.get(x.as_tensor()).is_some());
//! # Ok(()) }
//! ```

pub mod cuda;
mod gemm;
mod host;
pub mod par;
mod precision;
pub(crate) mod simd;

mod activation;
pub mod adamw;
mod attention;
mod bias;
mod block;
mod cross_entropy;
mod dropout;
mod embedding;
mod held;
pub mod ledger;
mod linear;
mod linear_cross_entropy;
mod norm;
mod rope;
mod softmax;
mod sum;

pub use activation::{gelu_erf, gelu_erf_in, swiglu, swiglu_in, swiglu_unfused};
pub use attention::{
    attention, attention_unfused, causal_mask, cuda_fuses, padding_mask, AttentionOptions, AttentionTelemetry,
};
pub use bias::{
    add_bias, add_bias_unfused, linear_bias, linear_bias_in, linear_bias_relu, linear_bias_relu_in,
    linear_bias_relu_unfused, linear_bias_unfused,
};
pub use block::{
    attention_block, cross_attention_block, mlp_block, ActivationMemory, AttentionWeights, BlockNorm,
    BlockPositions, BlockProjection, CrossAttentionWeights, GradSink, MlpActivation, MlpWeights, SubBlock,
};
pub use cross_entropy::cross_entropy_unfused;
pub use dropout::{add_dropout, dropout, dropout_unfused};
pub use embedding::embedding_to_sink;
pub use gemm::{bf16_emulated, bf16_slowdown, emulate_bf16_products, BF16_ENV};
pub use linear::{
    linear, linear_gelu, linear_gelu_in, linear_gelu_unfused, linear_in, linear_residual, linear_residual_in,
    linear_residual_unfused, linear_rope, linear_rope_in, linear_rope_unfused, linear_scaled,
    linear_scaled_in, linear_scaled_unfused, linear_unfused,
};
pub use linear_cross_entropy::{
    linear_cross_entropy, linear_cross_entropy_in, linear_cross_entropy_to_sink, linear_cross_entropy_unfused,
};
pub use norm::{layer_norm, layer_norm_as, layer_norm_unfused, rms_norm, rms_norm_as, rms_norm_unfused};
pub use precision::Precision;
pub use rope::{logn_factor, rope, rope_unfused, PositionScale, RopeTables};
pub use simd::{vector_unit, VECTOR_UNIT_ENV};
pub use softmax::{softmax_rows, softmax_rows_unfused};
pub use sum::{sum_in_order, sum_in_order_unfused, sum_of_squares};
