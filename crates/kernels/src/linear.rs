//! The linear map `x·Wᵀ` (no bias), forward and backward through Ember's GEMM.
//!
//! x may have any number of leading dimensions: they are folded into the rows of one product
//! inside the op, so the model needs no reshape (and its autograd node) around each projection.

use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

use crate::gemm::{product, Mat};
use crate::host::{cpu_slice, cpu_tensor, is_host_f32, with_data};

/// The output shape of `x·Wᵀ`: x's with its last dimension replaced by W's rows.
fn output_shape(x: &Shape, out_dim: usize) -> Shape {
    let mut dims = x.dims().to_vec();
    if let Some(last) = dims.last_mut() {
        *last = out_dim;
    }
    Shape::from(dims)
}

/// `x·Wᵀ` for x (…, in) and a weight (out, in), from candle's matmul.
pub fn linear_unfused(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (out_dim, in_dim) = w.dims2()?;
    let rows = x.elem_count() / in_dim.max(1);
    x.reshape((rows, in_dim))?
        .matmul(&w.t()?)?
        .reshape(output_shape(x.shape(), out_dim))
}

/// `x·Wᵀ` for x (…, in) and a weight (out, in) through the crate's GEMM on CPU f32, forward and
/// backward (dx = g·W, dW = gᵀ·x) without materialising a transpose. Falls back to
/// [`linear_unfused`] elsewhere.
pub fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (_, w_in) = w.dims2()?;
    if x.dims().last() != Some(&w_in) {
        candle_core::bail!(
            "linear: input {:?} does not fit a weight {:?}",
            x.shape(),
            w.shape()
        );
    }
    if !(is_host_f32(x) && is_host_f32(w)) {
        return linear_unfused(x, w);
    }
    x.contiguous()?.apply_op2(&w.contiguous()?, LinearOp)
}

struct LinearOp;

impl CustomOp2 for LinearOp {
    fn name(&self) -> &'static str {
        "ember-linear"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (out_dim, in_dim) = l2.shape().dims2()?;
        let rows = l1.shape().elem_count() / in_dim.max(1);
        let (x, w) = (cpu_slice(s1, l1)?, cpu_slice(s2, l2)?);
        let y = product(
            rows,
            in_dim,
            out_dim,
            Mat::rows(x, in_dim),
            Mat::rows(w, in_dim).t(),
        );
        Ok((CpuStorage::F32(y), output_shape(l1.shape(), out_dim)))
    }
    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (out_dim, in_dim) = w.dims2()?;
        let rows = x.elem_count() / in_dim.max(1);
        let (dx, dw) = with_data([x, w, g], |[x, w, g]| {
            let dx = product(rows, out_dim, in_dim, Mat::rows(g, out_dim), Mat::rows(w, in_dim));
            let dw = product(
                out_dim,
                rows,
                in_dim,
                Mat::rows(g, out_dim).t(),
                Mat::rows(x, in_dim),
            );
            Ok((dx, dw))
        })?;
        Ok((Some(cpu_tensor(dx, x.shape())?), Some(cpu_tensor(dw, w.shape())?)))
    }
}
