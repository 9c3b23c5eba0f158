//! Validation loss per arm (variant × log-n) and context, and the paired effects at each
//! context: of log-n scaling (on − off), of each QK-norm variant (− none), and of the context
//! itself (the reach: loss at a longer context − at the training length).

use super::evals::EvalIndex;
use super::{on_off, ArmLoss, Effect};
use crate::report::stats::{mean_std, paired_diff, t_half_width};

/// The loss table and the three kinds of paired effect.
pub(super) struct Compared {
    pub losses: Vec<ArmLoss>,
    pub logn_effects: Vec<Effect>,
    pub qk_norm_effects: Vec<Effect>,
    pub reach: Vec<Effect>,
}

/// Every arm at every context, in context, variant, log-n order.
pub(super) fn compare(
    index: &EvalIndex,
    variants: &[String],
    contexts: &[usize],
    train_length: usize,
) -> Compared {
    let mut out = Compared {
        losses: Vec::new(),
        logn_effects: Vec::new(),
        qk_norm_effects: Vec::new(),
        reach: Vec::new(),
    };
    for &context in contexts {
        for v in variants {
            for logn in [false, true] {
                arm(&mut out, index, v, logn, context, train_length);
            }
            if let Some(diff) = paired_diff(
                &index.per_seed(v, true, context),
                &index.per_seed(v, false, context),
                0.95,
            ) {
                out.logn_effects.push(Effect {
                    what: format!("{v}: log-n on − off"),
                    context,
                    diff,
                });
            }
            if v != "none" {
                for logn in [false, true] {
                    if let Some(diff) = paired_diff(
                        &index.per_seed(v, logn, context),
                        &index.per_seed("none", logn, context),
                        0.95,
                    ) {
                        out.qk_norm_effects.push(Effect {
                            what: format!("{v} − none (log-n {})", on_off(logn)),
                            context,
                            diff,
                        });
                    }
                }
            }
        }
    }
    out
}

/// One arm at one context: its loss over seeds, and its reach past the training length.
fn arm(out: &mut Compared, index: &EvalIndex, v: &str, logn: bool, context: usize, train_length: usize) {
    let xs: Vec<f64> = index.per_seed(v, logn, context).into_iter().flatten().collect();
    if let Some(ms) = mean_std(&xs) {
        let ci95 = t_half_width(&ms, 0.95);
        out.losses.push(ArmLoss {
            variant: v.to_string(),
            logn,
            context,
            mean: ms.mean,
            ci95,
            seeds: ms.n,
        });
    }
    if context != train_length {
        let at = index.per_seed(v, logn, context);
        let base = index.per_seed(v, logn, train_length);
        if let Some(diff) = paired_diff(&at, &base, 0.95) {
            out.reach.push(Effect {
                what: format!(
                    "{v}, log-n {}: loss at {context} − at {train_length}",
                    on_off(logn)
                ),
                context,
                diff,
            });
        }
    }
}
