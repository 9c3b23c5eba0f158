//! Softmax over the last dimension.

use std::mem::MaybeUninit;

use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor, D};

use crate::host::{cpu_slice, cpu_tensor, is_host_f32, with_data};
use crate::par::{fill, rows_per_task};
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

/// Softmax of each row of `n` elements of `block`, in place (for [`SoftmaxOp`] and the attention
/// kernel). Each row's max is subtracted first and the exponentials then run over the whole block
/// in one loop: over one row of fewer elements than a vector holds (attention's rows of a dozen
/// keys) the loop ran lane by lane, and the exponentials were most of the attention forward
/// pass's softmax.
#[inline(always)]
pub(crate) fn softmax_rows_in_place(block: &mut [f32], n: usize) {
    for row in block.chunks_exact_mut(n) {
        let max = max_of(row);
        for x in row.iter_mut() {
            *x -= max;
        }
    }
    for x in block.iter_mut() {
        *x = exp_fast(*x);
    }
    for row in block.chunks_exact_mut(n) {
        let inv = 1.0 / sum(row);
        for x in row.iter_mut() {
            *x *= inv;
        }
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
        let y = fill(x.len(), rows_per_task(n) * n, |r, y| {
            for (o, &v) in y.iter_mut().zip(&x[r]) {
                o.write(v);
            }
            // SAFETY: every element of `y` was written just above.
            softmax_rows_in_place(unsafe { &mut *(y as *mut [MaybeUninit<f32>] as *mut [f32]) }, n);
        });
        Ok((CpuStorage::F32(y), l.shape().clone()))
    }
    fn bwd(&self, x: &Tensor, res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        let n = x.dims().last().copied().unwrap_or(1).max(1);
        let dx = with_data([res, g], |[p, g]| {
            Ok(fill(p.len(), rows_per_task(n) * n, |r, dx| {
                for ((pr, gr), dr) in p[r.clone()]
                    .chunks_exact(n)
                    .zip(g[r].chunks_exact(n))
                    .zip(dx.chunks_exact_mut(n))
                {
                    let s = dot(pr, gr);
                    for i in 0..n {
                        dr[i].write(pr[i] * (gr[i] - s));
                    }
                }
            }))
        })?;
        Ok(Some(cpu_tensor(dx, x.shape())?))
    }
}
