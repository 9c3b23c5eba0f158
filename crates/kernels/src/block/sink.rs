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
//! deposits' order as candle's `index_add` adds them (in place into the output layer's dW, a
//! buffer of the merge's own, on the CPU; with `index_add` itself elsewhere), so a tied weight's
//! gradient is summed in the order candle's backward pass sums it: the same bits.
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
use candle_core::{bail, DType, Result, Tensor};

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
    /// The gradient itself (a view is laid out row-major at the merge).
    Whole(Tensor),
    /// The gradient of a host f32 parameter, row-major in its shape, in a buffer the merge may
    /// add a lookup's rows into in place (the output layer's, which a tied embedding shares).
    Owned(Vec<f32>),
    /// The gradients `rows` (n × d) of the parameter's rows `ids` (n, u32), read by a lookup:
    /// added into the parameter's gradient, a row at a time, at the merge.
    Rows { ids: Tensor, rows: Tensor },
}

/// A parameter's gradient while the merge sums its deposits: a buffer of the merge's own, which
/// a lookup's rows are added into in place, or a tensor.
enum Sum {
    Owned(Vec<f32>),
    Tensor(Tensor),
}

impl Sum {
    /// A parameter's first deposit, added to candle's gradient for it where there is one.
    fn first(deposit: Deposit, param: &Tensor, candle: Option<Tensor>) -> Result<Sum> {
        if let Some(earlier) = candle {
            return Sum::Tensor(earlier).plus(deposit, param);
        }
        Ok(match deposit {
            Deposit::Whole(grad) => Sum::Tensor(grad.contiguous()?),
            Deposit::Owned(grad) => Sum::Owned(grad),
            // As candle's backward pass adds an `index_select`'s gradient: into zeros.
            rows @ Deposit::Rows { .. } => {
                let zeros = match is_host_f32(param) {
                    true => Sum::Owned(vec![0f32; param.elem_count()]),
                    false => Sum::Tensor(param.zeros_like()?),
                };
                zeros.plus(rows, param)?
            }
        })
    }

    /// This sum plus a later deposit, as candle's backward pass adds them.
    fn plus(self, deposit: Deposit, param: &Tensor) -> Result<Sum> {
        Ok(match (deposit, self) {
            (Deposit::Rows { ids, rows }, Sum::Owned(mut sum)) if ids.dtype() == DType::U32 => {
                add_rows(&mut sum, param, &ids, &rows)?;
                Sum::Owned(sum)
            }
            (Deposit::Rows { ids, rows }, sum) => {
                Sum::Tensor(sum.into_tensor(param)?.index_add(&ids, &rows, 0)?)
            }
            (Deposit::Whole(grad), sum) => Sum::Tensor((sum.into_tensor(param)? + grad.contiguous()?)?),
            (Deposit::Owned(grad), sum) => {
                Sum::Tensor((sum.into_tensor(param)? + cpu_tensor(grad, param.shape())?)?)
            }
        })
    }

    fn into_tensor(self, param: &Tensor) -> Result<Tensor> {
        match self {
            Sum::Owned(v) => cpu_tensor(v, param.shape()),
            Sum::Tensor(t) => Ok(t),
        }
    }
}

/// `rows` (n × d) added into the rows `ids` (n, u32) of `sum`, the gradient of `param` (V × d,
/// row-major), in place, in the order candle's CPU `index_add` adds them (row after row in the
/// ids' order; an id of `u32::MAX` skipped, one of V or more an error that leaves `sum` as it
/// was): its bits, without its copy of the whole V × d matrix (108 MiB for SmolLM2-135M's tied
/// embedding). The lookup ([`crate::embedding_to_sink`]) deposits exactly such rows and ids.
fn add_rows(sum: &mut [f32], param: &Tensor, ids: &Tensor, rows: &Tensor) -> Result<()> {
    let (v, d) = param.dims2()?;
    let ids = ids.to_vec1::<u32>()?;
    if !is_host_f32(rows) || rows.dims2()? != (ids.len(), d) || sum.len() != v * d {
        bail!(
            "the gradient sink: a lookup's rows {:?} ({:?}) for {} ids of a {v} × {d} parameter",
            rows.shape(),
            rows.dtype(),
            ids.len()
        );
    }
    if let Some(id) = ids.iter().find(|&&id| id != u32::MAX && id as usize >= v) {
        bail!("the gradient sink: row {id} of a parameter of {v} rows");
    }
    if d == 0 {
        return Ok(());
    }
    with_data([rows], |[rows]| {
        for (row, &id) in rows.chunks_exact(d).zip(&ids) {
            if id == u32::MAX {
                continue;
            }
            let at = id as usize * d;
            for (s, &r) in sum[at..at + d].iter_mut().zip(row) {
                *s += r;
            }
        }
        Ok(())
    })
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

    /// The gradient of op `id`'s host f32 parameter `param`, row-major in its shape, from its
    /// backward pass.
    pub(crate) fn deposit_owned(&self, id: u64, param: Tensor, grad: Vec<f32>) {
        let mut state = self.state();
        state.owing.remove(&id);
        state.grads.push((param, Deposit::Owned(grad)));
    }

    /// The gradients `rows` of the rows `ids` of `param` that op `id`'s lookup read, from its
    /// backward pass.
    pub(crate) fn deposit_rows(&self, id: u64, param: Tensor, ids: Tensor, rows: Tensor) {
        let mut state = self.state();
        state.owing.remove(&id);
        state.grads.push((param, Deposit::Rows { ids, rows }));
    }

    /// Moves every deposited gradient into `store`, laid out row-major (a gradient deposited as
    /// a view is copied out here, after the backward pass has let go of the activations),
    /// adding it to the gradient candle computed for the same parameter where there is one. An
    /// error (naming the op) when an op made with this sink has not run its backward pass: its
    /// parameters would silently get no gradient.
    pub fn merge_into(&self, store: &mut GradStore) -> Result<()> {
        let mut state = self.state();
        if let Some(what) = state.owing.values().next() {
            bail!(
                "{what}: its backward pass never ran (the loss differentiated does not depend on \
                 it, or its input carried no gradient), so its parameters would get none; run it \
                 without a gradient sink"
            );
        }
        // Each parameter's sum so far (a few hundred parameters at most: a linear search).
        let mut sums: Vec<(Tensor, Sum)> = Vec::new();
        for (param, deposit) in std::mem::take(&mut state.grads) {
            match sums.iter().position(|(p, _)| p.id() == param.id()) {
                Some(i) => {
                    let (param, sum) = sums.swap_remove(i);
                    let sum = sum.plus(deposit, &param)?;
                    sums.push((param, sum));
                }
                None => {
                    let sum = Sum::first(deposit, &param, store.remove(&param))?;
                    sums.push((param, sum));
                }
            }
        }
        for (param, sum) in sums {
            let grad = sum.into_tensor(&param)?;
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

#[cfg(test)]
mod tests {
    use candle_core::{Device, Var};

    use super::*;

    const V: usize = 4;
    const D: usize = 3;

    /// A V × d gradient and rows whose total depends on the order they are added in (row 0's
    /// first element: (1 − 1) + 2⁻³⁰ is 2⁻³⁰, (1 + 2⁻³⁰) − 1 is 0), a -0, an id of `u32::MAX`
    /// (skipped).
    fn case() -> (Vec<f32>, Tensor, Tensor) {
        let sum: Vec<f32> = (0..V * D).map(|i| 1.0 + i as f32).collect();
        let tiny = 2f32.powi(-30);
        let rows = [
            [-1.0, -2.0, 0.5],
            [7.0, 1e30, -0.0],
            [tiny, 2.0, -0.5],
            [9.0, 9.0, 9.0],
        ];
        let rows = Tensor::new(&rows, &Device::Cpu).unwrap();
        let ids = Tensor::new(&[0u32, 3, 0, u32::MAX], &Device::Cpu).unwrap();
        (sum, ids, rows)
    }

    fn param() -> Var {
        Var::zeros((V, D), DType::F32, &Device::Cpu).unwrap()
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn rows_add_in_place_with_index_adds_bits() {
        let (mut sum, ids, rows) = case();
        let want = cpu_tensor(sum.clone(), &(V, D).into())
            .unwrap()
            .index_add(&ids, &rows, 0)
            .unwrap();
        add_rows(&mut sum, param().as_tensor(), &ids, &rows).unwrap();
        assert_eq!(bits(&cpu_tensor(sum, &(V, D).into()).unwrap()), bits(&want));
    }

    #[test]
    fn a_row_past_the_parameter_is_an_error_that_adds_nothing() {
        let (mut sum, _, rows) = case();
        let before = sum.clone();
        let ids = Tensor::new(&[0u32, 4, 1, 2], &Device::Cpu).unwrap();
        let err = add_rows(&mut sum, param().as_tensor(), &ids, &rows)
            .unwrap_err()
            .to_string();
        assert!(err.contains("row 4 of a parameter of 4 rows"), "{err}");
        assert_eq!(sum, before);
    }

    #[test]
    fn rows_that_do_not_fit_the_parameter_are_an_error() {
        let (mut sum, _, rows) = case();
        let ids = Tensor::new(&[0u32, 1, 2], &Device::Cpu).unwrap();
        let err = add_rows(&mut sum, param().as_tensor(), &ids, &rows)
            .unwrap_err()
            .to_string();
        assert!(err.contains("for 3 ids of a 4 × 3 parameter"), "{err}");
    }

    /// A weight's deposits — the output layer's gradient and a lookup's rows, in either order,
    /// after candle's own gradient or not, or the rows alone (an untied embedding) — merge to
    /// the bits of candle's additions.
    #[test]
    fn deposits_merge_as_candle_adds_them() {
        let (dw, ids, rows) = case();
        let w = param();
        let dw_t = cpu_tensor(dw.clone(), &(V, D).into()).unwrap();
        let ones = Tensor::ones((V, D), DType::F32, &Device::Cpu).unwrap();
        let zeros = Tensor::zeros((V, D), DType::F32, &Device::Cpu).unwrap();
        let rows_into = |t: &Tensor| t.index_add(&ids, &rows, 0).unwrap();
        let cases = [
            ("dW, then rows", false, "dw rows", rows_into(&dw_t)),
            (
                "candle's, dW, then rows",
                true,
                "dw rows",
                rows_into(&(&ones + &dw_t).unwrap()),
            ),
            ("rows alone", false, "rows", rows_into(&zeros)),
            (
                "rows, then dW",
                false,
                "rows dw",
                (rows_into(&zeros) + &dw_t).unwrap(),
            ),
        ];
        for (what, candle, order, want) in cases {
            let sink = GradSink::new();
            for deposit in order.split(' ') {
                let (id, param) = (sink.register(deposit), w.as_tensor().clone());
                match deposit {
                    "dw" => sink.deposit_owned(id, param, dw.clone()),
                    _ => sink.deposit_rows(id, param, ids.clone(), rows.clone()),
                }
            }
            // A store with candle's gradient of w (the sum's: ones), or without one.
            let mut store = match candle {
                true => w.as_tensor().sum_all().unwrap().backward().unwrap(),
                false => {
                    let other = Var::zeros(1, DType::F32, &Device::Cpu).unwrap();
                    other.as_tensor().sum_all().unwrap().backward().unwrap()
                }
            };
            sink.merge_into(&mut store).unwrap();
            let got = store.get(w.as_tensor()).expect("merged");
            assert_eq!(bits(got), bits(&want), "{what}");
        }
    }
}
