//! Whole sub-blocks of a transformer layer as one op each, their parameters' gradients handed
//! to a [`GradSink`] instead of through candle's graph.
//!
//! Each op of a composition costs candle's backward pass a zero-filled gradient buffer per input
//! and an add into it; at nanoGPT's standard shape these were 14% of the bf16 step
//! (docs/performance.md, twelfth session). A sub-block op has one candle input, the residual
//! stream, so the buffers of its inner activations and parameters go.

mod attention;
mod mlp;
mod sink;

pub use attention::{attention_block, AttentionWeights, BlockPositions};

pub use mlp::{mlp_block, BlockNorm};
pub use sink::GradSink;
