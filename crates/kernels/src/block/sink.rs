//! Where a fused block op leaves its parameters' gradients for the caller to collect.
//!
//! A candle custom op takes at most three tensors, and candle's backward pass hands gradients
//! only to those. A block op takes one — the residual stream — and holds its parameters itself;
//! its backward pass computes their gradients with the rest and deposits them here. The caller
//! merges them into candle's [`GradStore`] right after `backward()`, where they sit exactly as
//! if candle had computed them (candle's public `GradStore::insert`; Ember keeps no autograd of
//! its own).
//!
//! The risk of a side channel is a gradient that never arrives. An op whose backward never ran
//! (its input carried no gradient) is an error at [`GradSink::merge_into`], which names the op.
//! A caller that passes a sink owns the merge: a sink dropped unmerged loses its gradients, and
//! two backward passes before one merge add both passes' gradients. So the one caller that
//! passes a sink, the trainer's `gradient_sums`, makes one per micro-batch and merges it right
//! after that micro-batch's `backward()`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use candle_core::backprop::GradStore;
use candle_core::{bail, Result, Tensor};

/// The gradients a pass's fused block ops computed for their parameters, waiting to be merged
/// into the pass's [`GradStore`]. Cheap to clone: the clones share one store.
#[derive(Clone, Default)]
pub struct GradSink(Arc<Mutex<SinkState>>);

#[derive(Default)]
struct SinkState {
    /// Ops made with this sink whose backward has not run yet: their id and what they are.
    owing: BTreeMap<u64, &'static str>,
    next_id: u64,
    /// (parameter, gradient) in the order the backward pass deposited them.
    grads: Vec<(Tensor, Tensor)>,
}

impl GradSink {
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, SinkState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records an op (described by `what`, for the error that names it) that will deposit
    /// gradients; returns its id.
    pub(crate) fn register(&self, what: &'static str) -> u64 {
        let mut state = self.state();
        let id = state.next_id;
        state.next_id += 1;
        state.owing.insert(id, what);
        id
    }

    /// The gradients of op `id`'s parameters, from its backward pass.
    pub(crate) fn deposit(&self, id: u64, grads: impl IntoIterator<Item = (Tensor, Tensor)>) {
        let mut state = self.state();
        state.owing.remove(&id);
        state.grads.extend(grads);
    }

    /// Moves every deposited gradient into `store`, adding it to the gradient candle computed
    /// for the same parameter where there is one. An error (naming the op) when an op made with
    /// this sink has not run its backward pass: its parameters would silently get no gradient.
    pub fn merge_into(&self, store: &mut GradStore) -> Result<()> {
        let mut state = self.state();
        if let Some(what) = state.owing.values().next() {
            bail!(
                "{what}: its backward pass never ran (its input carried no gradient), so its \
                 parameters would get none; run it unfused (without a gradient sink)"
            );
        }
        for (param, grad) in std::mem::take(&mut state.grads) {
            let grad = match store.remove(&param) {
                Some(earlier) => (earlier + grad)?,
                None => grad,
            };
            store.insert(&param, grad);
        }
        Ok(())
    }

    /// Whether no gradient is waiting (and no op owes one).
    pub fn is_empty(&self) -> bool {
        let state = self.state();
        state.owing.is_empty() && state.grads.is_empty()
    }
}
