//! `y + b`, a bias added to every row, with its backward: dy = g and db the column sums of g;
//! and `x·Wᵀ + b` (and its ReLU) as one op with the projection.
//!
//! Candle's `broadcast_add` sums the bias gradient with its generic strided reduction, which
//! made a model with fairseq's biases (`model.proj_bias`) 1.43× slower per step:
//! `configs/multi30k-tiny-wu.yaml` took 561 ms a step against 391 without its biases, all of it
//! in the backward pass (655 against 298 ms; `ember bench`, 2 threads). Here the column sums
//! run down the rows in order, each column's terms added first row to last, so the result does
//! not depend on the thread count. On the CPU, f32 or bf16 activations (y, x) with an f32 bias
//! and weight: a bf16 activation is read widened, the sum (and its ReLU) made in f32 and rounded
//! once, its gradient likewise; the bias's and weight's gradients stay f32 — the f32 op between
//! casts. Every other device and dtype takes `broadcast_add` (the bias cast to y's dtype).

use std::borrow::Cow;
use std::sync::Mutex;

use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Tensor, D};

use crate::host::{
    cpu_slice, cpu_storage_like, cpu_tensor, cpu_tensor_as, cpu_values, is_host, is_host_f32, with_data,
};
use crate::linear::{
    check_fit, dims, linear_in, linear_unfused, output_shape, project, project_grads, wide_unless_bf16,
};
use crate::par::{fill, for_each_chunk, rows_per_task, SharedMut, ELEMENTS_PER_TASK};
use crate::Precision;

/// `y + b` over y's last dimension (`b` of shape (C,), `y` of shape (…, C)).
pub fn add_bias(y: &Tensor, b: &Tensor) -> Result<Tensor> {
    let fused =
        is_host(y) && is_host_f32(b) && b.rank() == 1 && b.dim(0)? > 0 && y.dim(D::Minus1)? == b.dim(0)?;
    match fused {
        true => y.contiguous()?.apply_op2(&b.contiguous()?, AddBiasOp),
        false => add_bias_unfused(y, b),
    }
}

/// The reference: candle's broadcast add (an f32 bias cast to a bf16 y's dtype first, a
/// differentiable cast).
pub fn add_bias_unfused(y: &Tensor, b: &Tensor) -> Result<Tensor> {
    y.broadcast_add(&b.to_dtype(y.dtype())?)
}

struct AddBiasOp;

impl candle_core::CustomOp2 for AddBiasOp {
    fn name(&self) -> &'static str {
        "ember-add-bias"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let mut out = cpu_values(s1, l1)?.into_owned();
        add_to_rows(&mut out, cpu_slice(s2, l2)?);
        Ok((cpu_storage_like(out, s1)?, l1.shape().clone()))
    }
    fn bwd(
        &self,
        _y: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        Ok((Some(g.clone()), Some(column_sums(g, b.dim(0)?)?)))
    }
}

/// Σ over the rows of `g` viewed as (rows, c), each column summed from the first row to the last.
/// (`g` is the gradient of the op's CPU output, a bf16 one widened: the sums are f32.)
fn column_sums(g: &Tensor, c: usize) -> Result<Tensor> {
    let sums = with_data([&g.contiguous()?], |[g]| Ok(column_sums_of(g, c)))?;
    cpu_tensor(sums, &Shape::from(c))
}

/// [`column_sums`] of contiguous rows of `c` values.
pub(crate) fn column_sums_of(g: &[f32], c: usize) -> Vec<f32> {
    let mut acc = vec![0f32; c];
    for row in g.chunks_exact(c) {
        for (a, &x) in acc.iter_mut().zip(row) {
            *a += x;
        }
    }
    acc
}

/// `y += b` on every row of `y` (rows of `b.len()`), whole rows per task, so that every row
/// meets the bias from its first column.
pub(crate) fn add_to_rows(y: &mut [f32], b: &[f32]) {
    let c = b.len().max(1);
    let out = SharedMut(y.as_mut_ptr());
    for_each_chunk(y.len(), rows_per_task(c) * c, |r| {
        // SAFETY: the elements `r` belong to this task alone, and lie within y.
        let rows = unsafe { out.slice(r.start, r.len()) };
        for row in rows.chunks_exact_mut(c) {
            for (y, &b) in row.iter_mut().zip(b) {
                *y += b;
            }
        }
    });
}

/// `x·Wᵀ + b` from candle's ops (every device and dtype).
pub fn linear_bias_unfused(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    linear_unfused(x, w)?.broadcast_add(b)
}

/// `x·Wᵀ + b` for x (…, in), a weight (out, in) and a bias (out): one op on the CPU (f32 W and
/// b; x f32, or bf16 read widened with the output rounded once), the bias
/// added to the product in place and its gradient summed in the op's backward pass, with the
/// bits of [`linear`](crate::linear) then [`add_bias`]; those two elsewhere (for a bf16 x, the
/// product in f32, the sum rounded once).
///
/// As two ops, the bias add cost a second activation-sized buffer and pass in the forward pass
/// and, in the backward pass, candle's zero-filled gradient buffer for the product and the add
/// into it: 7.5% of a step of `configs/multi30k-tiny-wu.yaml` went to the forward add alone.
pub fn linear_bias(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    linear_bias_in(x, w, b, Precision::F32)
}

/// [`linear_bias`] with its products in `precision`.
pub fn linear_bias_in(x: &Tensor, w: &Tensor, b: &Tensor, precision: Precision) -> Result<Tensor> {
    biased_op(x, w, b, precision, None)
}

/// `relu(x·Wᵀ + b)` from candle's ops (every device and dtype).
pub fn linear_bias_relu_unfused(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    linear_bias_unfused(x, w, b)?.relu()
}

/// `relu(x·Wᵀ + b)`: [`linear_bias`] and candle's `relu` as one op on the CPU (a fairseq
/// feed-forward block's up-projection), with their bits; its backward pass lets the gradient
/// through where the sum is ≥ 0, as candle's does, and saves candle's four passes over the
/// activation for it.
pub fn linear_bias_relu(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    linear_bias_relu_in(x, w, b, Precision::F32)
}

/// [`linear_bias_relu`] with its products in `precision`.
pub fn linear_bias_relu_in(x: &Tensor, w: &Tensor, b: &Tensor, precision: Precision) -> Result<Tensor> {
    let keep = x.track_op() || w.track_op() || b.track_op();
    biased_op(x, w, b, precision, Some(ReluMask::new(keep)))
}

/// The op of [`linear_bias_in`] (`relu` `None`) or [`linear_bias_relu_in`], or their two or
/// three ops where it does not apply.
fn biased_op(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    precision: Precision,
    relu: Option<ReluMask>,
) -> Result<Tensor> {
    check_fit("linear_bias", x, w)?;
    let (out_dim, _) = w.dims2()?;
    if b.dims() != [out_dim] {
        candle_core::bail!(
            "linear_bias: bias {:?} does not fit a weight {:?}",
            b.shape(),
            w.shape()
        );
    }
    // A bf16 x's output is rounded once, after the add (and the ReLU), as the CPU op rounds
    // it: elsewhere its product is made in f32 (under bf16 products cuBLAS's, rounded to bf16
    // by the precision's contract, is widened exactly) for the bias in the weight's dtype.
    if !(is_host(x) && is_host_f32(w) && is_host_f32(b)) {
        let product = match x.dtype() {
            DType::BF16 => linear_in(&wide_unless_bf16(x, precision)?, w, precision)?.to_dtype(w.dtype())?,
            _ => linear_in(x, w, precision)?,
        };
        let y = add_bias(&product, b)?;
        let y = if relu.is_some() { y.relu()? } else { y };
        return y.to_dtype(x.dtype());
    }
    precision.check_cpu()?;
    x.contiguous()?.apply_op3(
        &w.contiguous()?,
        &b.contiguous()?,
        LinearBiasOp { precision, relu },
    )
}

/// Which elements of a ReLU's input were ≥ 0 (where candle's backward pass lets the gradient
/// through), kept by the forward pass when a backward pass may follow. Kept, not taken, so that
/// a second backward pass through the same graph finds it too.
struct ReluMask(Option<Mutex<Vec<bool>>>);

impl ReluMask {
    fn new(keep: bool) -> Self {
        Self(keep.then(|| Mutex::new(Vec::new())))
    }

    /// `max(v, 0)` of every element in place, as candle's `relu` computes it.
    fn forward(&self, v: &mut [f32]) {
        let kept = relu_in_place(v, self.0.is_some());
        if let (Some(slot), Some(kept)) = (&self.0, kept) {
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = kept;
        }
    }

    /// The gradient at the ReLU's input: `g` where the input was ≥ 0, 0 elsewhere (candle
    /// multiplies by its 0/1 mask and adds into zeros, which gives +0 there too).
    fn backward(&self, g: &[f32]) -> Result<Vec<f32>> {
        let mask = match &self.0 {
            Some(mask) => mask.lock().unwrap_or_else(|e| e.into_inner()),
            None => candle_core::bail!("linear_bias_relu: backward pass through an untracked forward pass"),
        };
        if mask.len() != g.len() {
            candle_core::bail!(
                "linear_bias_relu: gradient of {} elements for {}",
                g.len(),
                mask.len()
            );
        }
        Ok(relu_grad(&mask, g))
    }
}

/// `max(v, 0)` of every element in place, as candle's `relu` computes it, and (`with_mask`)
/// which elements were ≥ 0: where candle's backward pass lets the gradient through.
pub(crate) fn relu_in_place(v: &mut [f32], with_mask: bool) -> Option<Vec<bool>> {
    let mut kept = with_mask.then(|| vec![false; v.len()]);
    let passes = kept.as_mut().map(|m| SharedMut(m.as_mut_ptr()));
    let out = SharedMut(v.as_mut_ptr());
    for_each_chunk(v.len(), ELEMENTS_PER_TASK, |r| {
        // SAFETY: the elements `r` of v and of the mask (as long as v) belong to this task
        // alone.
        let v = unsafe { out.slice(r.start, r.len()) };
        if let Some(passes) = passes {
            let passes = unsafe { passes.slice(r.start, r.len()) };
            for (pass, &v) in passes.iter_mut().zip(v.iter()) {
                *pass = v >= 0.0;
            }
        }
        for v in v {
            *v = v.max(0.0);
        }
    });
    kept
}

/// The gradient at a ReLU's input for `g` at its output: `g` where the input `passes` (was ≥ 0),
/// 0 elsewhere (candle multiplies by its 0/1 mask and adds into zeros, which gives +0 there
/// too).
pub(crate) fn relu_grad(passes: &[bool], g: &[f32]) -> Vec<f32> {
    fill(g.len(), ELEMENTS_PER_TASK, |r, out| {
        for ((o, &g), &pass) in out.iter_mut().zip(&g[r.clone()]).zip(&passes[r]) {
            o.write(if pass { g } else { 0.0 });
        }
    })
}

/// The op of [`linear_bias`] and [`linear_bias_relu`].
struct LinearBiasOp {
    precision: Precision,
    relu: Option<ReluMask>,
}

impl CustomOp3 for LinearBiasOp {
    fn name(&self) -> &'static str {
        match self.relu {
            Some(_) => "ember-linear-bias-relu",
            None => "ember-linear-bias",
        }
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let dims = dims(l1.shape(), l2.shape())?;
        let mut y = project(&cpu_values(s1, l1)?, cpu_slice(s2, l2)?, dims, self.precision);
        add_to_rows(&mut y, cpu_slice(s3, l3)?);
        if let Some(relu) = &self.relu {
            relu.forward(&mut y);
        }
        Ok((cpu_storage_like(y, s1)?, output_shape(l1.shape(), dims.2)))
    }
    /// The gradient at the sum (the incoming one, or the ReLU's share of it) gives dx = g·W,
    /// dW = gᵀ·x and db, its column sums.
    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let dims = dims(x.shape(), w.shape())?;
        let (dx, dw, db) = with_data([x, w, g], |[xs, ws, gs]| {
            let g_sum = match &self.relu {
                Some(relu) => Cow::Owned(relu.backward(gs)?),
                None => Cow::Borrowed(gs),
            };
            let (dx, dw) = project_grads(xs, ws, &g_sum, dims, self.precision);
            Ok((dx, dw, column_sums_of(&g_sum, dims.2)))
        })?;
        Ok((
            Some(cpu_tensor_as(dx, x.shape(), x.dtype())?),
            Some(cpu_tensor(dw, w.shape())?),
            Some(cpu_tensor(db, b.shape())?),
        ))
    }
}
