//! The QK-norm effect on LR sensitivity at each level of each factorial axis: which factor
//! carries the stability effect. For a level, every setting at that level and every seed gives
//! one pair (variant, `none`), so the effect is pooled over the other axes' levels — a main
//! effect; the per-setting table in the report shows the interactions.

use serde::Serialize;

use super::sensitivity::Sensitivity;
use super::stats::{mean_std, paired_diff, MeanStd, PairedDiff};
use super::{BASELINE, LEVEL};
use crate::layout::Axis;

/// One variant against the baseline at one level of one axis.
#[derive(Debug, Clone, Serialize)]
pub struct AxisEffect {
    /// The axis's config key.
    pub axis: String,
    pub level: String,
    pub variant: String,
    /// Settings at this level that hold both the variant and the baseline.
    pub settings: usize,
    /// LR sensitivity of the baseline and of the variant over the paired (setting, seed)s.
    pub none: Option<MeanStd>,
    pub value: Option<MeanStd>,
    /// Variant − none, paired by setting and seed, with a 95% t interval over the pairs.
    pub vs_none: Option<PairedDiff>,
}

/// Every (axis, level, variant other than the baseline) with at least one pair.
pub(crate) fn axis_effects(
    axes: &[Axis],
    variants: &[String],
    sensitivities: &[Sensitivity],
) -> Vec<AxisEffect> {
    let mut effects = vec![];
    for (i, axis) in axes.iter().enumerate() {
        for level in &axis.values {
            for v in variants.iter().filter(|v| *v != BASELINE) {
                if let Some(e) = effect(i, axis, level, v, sensitivities) {
                    effects.push(e);
                }
            }
        }
    }
    effects
}

fn effect(i: usize, axis: &Axis, level: &str, v: &str, sensitivities: &[Sensitivity]) -> Option<AxisEffect> {
    let (mut a, mut b) = (vec![], vec![]);
    let mut settings = 0;
    let at_level = |s: &&Sensitivity| s.levels.get(i).map(String::as_str) == Some(level);
    for s in sensitivities.iter().filter(at_level).filter(|s| s.variant == v) {
        let Some(base) = sensitivities
            .iter()
            .find(|b| b.variant == BASELINE && b.levels == s.levels)
        else {
            continue;
        };
        let mut paired = false;
        for (seed, x) in &s.per_seed {
            if let Some(y) = base.per_seed.get(seed) {
                a.push(Some(*x));
                b.push(Some(*y));
                paired = true;
            }
        }
        settings += usize::from(paired);
    }
    let flat = |xs: &[Option<f64>]| xs.iter().flatten().copied().collect::<Vec<_>>();
    (!a.is_empty()).then(|| AxisEffect {
        axis: axis.key.clone(),
        level: level.to_string(),
        variant: v.to_string(),
        settings,
        none: mean_std(&flat(&b)),
        value: mean_std(&flat(&a)),
        vs_none: paired_diff(&a, &b, LEVEL),
    })
}
