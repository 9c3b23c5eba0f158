//! Attention entropy (and loss) by position bucket at the longest context, per arm, mean over
//! seeds: what entropy invariance predicts stays flat past the training length with log-n on.

use ember_trainer::context::ContextEval;

use super::evals::EvalIndex;
use super::BucketEntropy;

/// Every arm's position buckets at context `longest`, in variant, log-n, position order.
pub(super) fn entropy_buckets(index: &EvalIndex, variants: &[String], longest: usize) -> Vec<BucketEntropy> {
    let mut entropy_buckets = Vec::new();
    for v in variants {
        for logn in [false, true] {
            let runs = index.runs(v, logn, longest);
            let Some(first) = runs.first() else { continue };
            for (i, b) in first.buckets.iter().enumerate() {
                let mean = |f: &dyn Fn(&ContextEval) -> f64| {
                    runs.iter().map(|r| f(r)).sum::<f64>() / runs.len() as f64
                };
                entropy_buckets.push(BucketEntropy {
                    variant: v.clone(),
                    logn,
                    first: b.first,
                    last: b.last,
                    entropy: mean(&|r| r.buckets[i].entropy),
                    loss: mean(&|r| r.buckets[i].loss),
                });
            }
        }
    }
    entropy_buckets
}
