//! Whole sub-blocks of a transformer layer as one op each, their parameters' gradients handed
//! to a [`GradSink`] instead of through candle's graph.
//!
//! Each op of a composition costs candle's backward pass a zero-filled gradient buffer per input
//! and an add into it; at nanoGPT's standard shape these were 14% of the bf16 step
//! (docs/performance.md, twelfth session). A sub-block op has one candle input, the residual
//! stream, so the buffers of its inner activations and parameters go.

use candle_core::{Result, Tensor};

mod attention;
mod mlp;
mod sink;

pub use attention::{attention_block, AttentionWeights, BlockPositions};
pub use mlp::{mlp_block, MlpWeights};
pub use sink::GradSink;

/// The norm that opens a block's branch: its gain, its bias (LayerNorm with one) and epsilon.
#[derive(Clone, Copy)]
pub struct BlockNorm<'a> {
    pub weight: &'a Tensor,
    pub bias: Option<&'a Tensor>,
    /// RMSNorm (no bias); LayerNorm otherwise.
    pub rms: bool,
    pub eps: f64,
}

impl BlockNorm<'_> {
    /// The norm on its own, as the model runs it outside a fused block.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self.rms {
            true => crate::rms_norm(x, self.weight, self.eps),
            false => crate::layer_norm(x, self.weight, self.bias, self.eps),
        }
    }
}
