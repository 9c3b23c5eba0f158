//! Softmax over the last dimension.

use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor, D};

use crate::host::{cpu_slice, cpu_tensor, is_host_f32, with_data};
use crate::simd::{dot, exp_fast, max_of, sum};

/// Softmax over the last dimension from differentiable primitives (the max is detached: softmax
/// is shift-invariant, so its gradient through the max is exactly zero).
pub fn softmax_rows_unfused(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let e = x.broadcast_sub(&max)?.exp()?;
    e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
}

/// Softmax over the last dimension; fused on CPU f32.
pub fn softmax_rows(x: &Tensor) -> Result<Tensor> {
    if !is_host_f32(x) {
        return softmax_rows_unfused(x);
    }
    x.contiguous()?.apply_op1(SoftmaxOp)
}

/// Softmax of one row, in place (shared by [`SoftmaxOp`] and the attention kernel).
#[inline(always)]
pub(crate) fn softmax_in_place(row: &mut [f32]) {
    let max = max_of(row);
    for x in row.iter_mut() {
        *x = exp_fast(*x - max);
    }
    let inv = 1.0 / sum(row);
    for x in row.iter_mut() {
        *x *= inv;
    }
}

struct SoftmaxOp;

impl CustomOp1 for SoftmaxOp {
    fn name(&self) -> &'static str {
        "ember-softmax"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = cpu_slice(s, l)?;
        let n = l.dims().last().copied().unwrap_or(1).max(1);
        let mut y = x.to_vec();
        for row in y.chunks_exact_mut(n) {
            softmax_in_place(row);
        }
        Ok((CpuStorage::F32(y), l.shape().clone()))
    }
    fn bwd(&self, x: &Tensor, res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        let n = x.dims().last().copied().unwrap_or(1).max(1);
        let dx = with_data([res, g], |[p, g]| {
            let mut dx = vec![0f32; p.len()];
            for ((pr, gr), dr) in p
                .chunks_exact(n)
                .zip(g.chunks_exact(n))
                .zip(dx.chunks_exact_mut(n))
            {
                let s = dot(pr, gr);
                for i in 0..n {
                    dr[i] = pr[i] * (gr[i] - s);
                }
            }
            Ok(dx)
        })?;
        Ok(Some(cpu_tensor(dx, x.shape())?))
    }
}
