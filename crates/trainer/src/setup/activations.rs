//! `train.activations`, checked before any work (the model's config is complete once loaded:
//! the data fills in only sizes). `recompute` needs every sub-block to run as one op, and
//! `recompute_attention` every attention sub-block
//! ([`ModelConfig::unfused_sub_blocks`](ember_model::ModelConfig::unfused_sub_blocks)), which
//! they do on the CPU alone; anything else is refused instead of quietly keeping what the user
//! asked to recompute. `ember ablate` checks every cell of a sweep the same way.

use anyhow::{bail, Result};
use ember_kernels::ActivationMemory;

use crate::config::RunConfig;
use crate::step::fused_blocks;

/// Why `cfg`'s model could not recompute its activations as `memory` says, each naming its key
/// or setting (empty: it can, or `memory` is `keep`).
pub fn recompute_refusals(cfg: &RunConfig, memory: ActivationMemory) -> Vec<String> {
    if memory == ActivationMemory::Keep {
        return Vec::new();
    }
    let mut reasons = cfg.model.unfused_sub_blocks(memory);
    if cfg.device.starts_with("cuda") {
        reasons.push(format!(
            "device: {} (the one-op sub-blocks run on the CPU)",
            cfg.device
        ));
    }
    if !fused_blocks() {
        reasons.push("EMBER_FUSED_BLOCKS=0 (the sub-blocks run op by op)".into());
    }
    reasons
}

/// `, activations recomputed` (`, attention's activations recomputed` where only those are)
/// for a report's line about a run or benchmark with `memory`; nothing for `keep`, so that
/// line reads as it always did.
pub fn note(memory: ActivationMemory) -> &'static str {
    match memory {
        ActivationMemory::Keep => "",
        ActivationMemory::Recompute => ", activations recomputed",
        ActivationMemory::RecomputeAttention => ", attention's activations recomputed",
    }
}

/// Refuses `train.activations: recompute` (or `recompute_attention`) where some sub-block it
/// recomputes could not.
pub fn check(cfg: &RunConfig) -> Result<()> {
    let memory = cfg.train.activations;
    let reasons = recompute_refusals(cfg, memory);
    if !reasons.is_empty() {
        let which = match memory {
            ActivationMemory::RecomputeAttention => "every attention sub-block",
            _ => "every sub-block",
        };
        bail!(
            "train.activations: {memory} needs {which} of the model to run as one op on the \
             CPU, and here some do not: {}. Set train.activations: keep (the default), or change \
             what is named.",
            reasons.join("; ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Messages spell a setting as the config does.
    #[test]
    fn every_setting_is_named_as_the_config_spells_it() {
        for memory in ActivationMemory::ALL {
            let spelled = serde_json::to_value(memory).unwrap();
            assert_eq!(spelled, memory.name(), "{memory:?}");
        }
    }
}
