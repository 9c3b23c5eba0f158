//! The linear map `x·Wᵀ` (no bias), forward and backward through Ember's GEMM.

use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

use crate::gemm::{product, Mat};
use crate::host::{cpu_slice, cpu_tensor, is_host_f32, with_data};

/// `x·Wᵀ` for x (N, in) and a weight (out, in), from candle's matmul.
pub fn linear_unfused(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    x.matmul(&w.t()?)
}

/// `x·Wᵀ` for x (N, in) and a weight (out, in) through the crate's GEMM on CPU f32, forward and
/// backward (dx = g·W, dW = gᵀ·x) without materialising a transpose. Falls back to
/// [`linear_unfused`] elsewhere.
pub fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (_, in_dim) = x.dims2()?;
    let (_, w_in) = w.dims2()?;
    if !(is_host_f32(x) && is_host_f32(w)) || in_dim != w_in {
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
        let (rows, in_dim) = l1.shape().dims2()?;
        let (out_dim, _) = l2.shape().dims2()?;
        let (x, w) = (cpu_slice(s1, l1)?, cpu_slice(s2, l2)?);
        let y = product(
            rows,
            in_dim,
            out_dim,
            Mat::rows(x, in_dim),
            Mat::transposed(w, in_dim),
        );
        Ok((CpuStorage::F32(y), Shape::from((rows, out_dim))))
    }
    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (rows, in_dim) = x.dims2()?;
        let (out_dim, _) = w.dims2()?;
        let (dx, dw) = with_data([x, w, g], |[x, w, g]| {
            let dx = product(rows, out_dim, in_dim, Mat::rows(g, out_dim), Mat::rows(w, in_dim));
            let dw = product(
                out_dim,
                rows,
                in_dim,
                Mat::transposed(g, out_dim),
                Mat::rows(x, in_dim),
            );
            Ok((dx, dw))
        })?;
        Ok((Some(cpu_tensor(dx, x.shape())?), Some(cpu_tensor(dw, w.shape())?)))
    }
}
