//! Where a fused block op leaves its parameters' gradients for the caller to collect.
//!
//! A candle custom op takes at most three tensors, and candle's backward pass hands gradients
//! only to those. A block op takes the residual stream (and a cross-attention op the keys and
//! values it reads) and holds its parameters itself; its backward pass computes their gradients
//! with the rest and deposits them here. The caller merges them into candle's [`GradStore`] right after `backward()`, where they sit exactly as
//! if candle had computed them (candle's public `GradStore::insert`; Ember keeps no autograd of
//! its own).
//!
//! The output projection and loss ([`crate::linear_cross_entropy_to_sink`]) and the token
//! embedding's lookup ([`crate::embedding_to_sink`]) leave their weight's gradient here too, so
//! that candle never holds a vocabulary-wide gradient while the activations are still held
//! (its zero-filled buffer, the sum, and a tied embedding's second term). The lookup leaves the
//! rows it read and their gradients; the merge adds them into the weight's gradient in the
//! deposits' order, with candle's own `index_add`, so a tied weight's gradient is summed in the
//! order candle's backward pass sums it: the same bits.
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

use crate::gemm::transposed;
use crate::host::{cpu_tensor, is_host_f32, with_data};

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
    grads: Vec<(Tensor, Deposit)>,
}

/// A parameter's gradient as an op deposits it.
enum Deposit {
    /// The gradient itself (a view, such as a transpose, is laid out at the merge).
    Whole(Tensor),
    /// The gradients `rows` (n × d) of the parameter's rows `ids` (n, u32), read by a lookup:
    /// added into the parameter's gradient, a row at a time, at the merge.
    Rows { ids: Tensor, rows: Tensor },
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
        state.grads.extend(
            grads
                .into_iter()
                .map(|(param, grad)| (param, Deposit::Whole(grad))),
        );
    }

    /// The gradients `rows` of the rows `ids` of `param` that op `id`'s lookup read, from its
    /// backward pass.
    pub(crate) fn deposit_rows(&self, id: u64, param: Tensor, ids: Tensor, rows: Tensor) {
        let mut state = self.state();
        state.owing.remove(&id);
        state.grads.push((param, Deposit::Rows { ids, rows }));
    }

    /// Moves every deposited gradient into `store`, laid out row-major (a gradient deposited as
    /// a view, the output projection's transposed dW, is copied out here, after the backward
    /// pass has let go of the activations), adding it to the gradient candle computed for the
    /// same parameter where there is one. An error (naming the op) when an op made with
    /// this sink has not run its backward pass: its parameters would silently get no gradient.
    pub fn merge_into(&self, store: &mut GradStore) -> Result<()> {
        let mut state = self.state();
        if let Some(what) = state.owing.values().next() {
            bail!(
                "{what}: its backward pass never ran (the loss differentiated does not depend on \
                 it, or its input carried no gradient), so its parameters would get none; run it \
                 without a gradient sink"
            );
        }
        for (param, deposit) in std::mem::take(&mut state.grads) {
            let grad = match (deposit, store.remove(&param)) {
                (Deposit::Whole(grad), Some(earlier)) => (earlier + laid_out(grad)?)?,
                (Deposit::Whole(grad), None) => laid_out(grad)?,
                // As candle's backward pass adds an `index_select`'s gradient.
                (Deposit::Rows { ids, rows }, earlier) => {
                    let earlier = match earlier {
                        Some(earlier) => earlier,
                        None => param.zeros_like()?,
                    };
                    earlier.index_add(&ids, &rows, 0)?
                }
            };
            store.insert(&param, grad);
        }
        Ok(())
    }

    /// What the ops made with this sink whose backward pass has not run yet are, in the order
    /// they were made (after a forward pass: every op that will deposit).
    pub fn owing(&self) -> Vec<&'static str> {
        self.state().owing.values().copied().collect()
    }

    /// Whether no gradient is waiting (and no op owes one).
    pub fn is_empty(&self) -> bool {
        let state = self.state();
        state.owing.is_empty() && state.grads.is_empty()
    }
}

/// `grad` row-major: a transposed view of a host f32 matrix through the blocked transpose
/// ([`transposed`]; candle's copy of a strided view goes element by element), anything else as
/// candle lays it out.
fn laid_out(grad: Tensor) -> Result<Tensor> {
    if grad.is_contiguous() {
        return Ok(grad);
    }
    if let Ok((rows, cols)) = grad.dims2() {
        let stored = grad.t()?;
        if stored.is_contiguous() && is_host_f32(&stored) {
            return with_data([&stored], |[x]| {
                cpu_tensor(transposed(cols, rows, x), &(rows, cols).into())
            });
        }
    }
    grad.contiguous()
}
