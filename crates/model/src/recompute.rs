//! Which models can recompute their activations in the backward pass (`train.activations:
//! recompute`, or `recompute_attention` for the attention sub-blocks alone): those whose every
//! sub-block that recomputes runs as one op in training (`ember_kernels::attention_block`,
//! `cross_attention_block`, `mlp_block`), for only those ops can compute their activations
//! again from their input alone. [`crate::ForwardCtx::with_activations`] sets it for a pass; a
//! pass that meets a sub-block of another kind fails naming it, and
//! [`ModelConfig::unfused_sub_blocks`] says the same from the config before any pass.

use ember_kernels::{ActivationMemory, SubBlock};

use crate::config::{ModelConfig, Positions, QkNorm};

impl ModelConfig {
    /// What keeps some of this model's sub-blocks that `memory` recomputes from running as one
    /// op each in training, each naming its config key; empty where every such sub-block does
    /// (on the CPU, in f32 weights), or where nothing is recomputed.
    pub fn unfused_sub_blocks(&self, memory: ActivationMemory) -> Vec<String> {
        // Every feed-forward sub-block runs as one op; some attention sub-blocks do not.
        let attention = memory.recomputes(SubBlock::Attention);
        let reasons = [
            (
                attention && self.qk_norm == QkNorm::L2,
                "model.qk_norm: l2 (layernorm and rmsnorm run as one op)",
            ),
            (
                attention && self.logn_attention && self.positions != Positions::Rope,
                "model.logn_attention without rotary positions",
            ),
        ];
        reasons
            .into_iter()
            .filter(|(applies, _)| *applies)
            .map(|(_, reason)| reason.to_string())
            .collect()
    }
}
