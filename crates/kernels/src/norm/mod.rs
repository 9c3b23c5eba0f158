//! RMSNorm and LayerNorm over vectors of the gain's size (the residual-stream norms, and QK-norm
//! over each head of a projection).
//!
//! The vectors are the consecutive runs of `w.len()` elements of the last dimension: a
//! (B, T, D) tensor with a gain of D is normalised per position, a (B, T, H·d) projection with a
//! gain of d per head — in the projection's own layout, with no head split.
//!
//! Rows are cut into tasks for the forward pass and for the input gradient; the gain's and
//! bias's gradients, sums over every row, are computed per column range in row order, so every
//! sum has the order of a single-threaded pass whatever the thread count.
//!
//! On CUDA (the `norm` kernel switched on, `cuda/norm.cu`) a warp normalises each vector; the
//! gain's and bias's gradients are summed per column over fixed chunks of vectors, then over the
//! chunks in order, so they too have the same bits on every run. Its bf16 variants (the `bf16`
//! kernels switched on too) read a bf16 input or gradient widened and write a bf16 output or
//! dx rounded once, for any pairing of an f32 or bf16 input with an f32 or bf16 output.

use std::mem::MaybeUninit;

use candle_core::{bail, CpuStorage, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor, D};

use crate::cuda::{takes, takes_dtype, takes_param, Kernel};
use crate::host::{
    cpu_slice, cpu_storage_as, cpu_tensor, cpu_tensor_as, cpu_values, is_host, is_host_f32, with_data,
};
use crate::par::{for_each_chunk, SharedMut};
use crate::simd::{dot, simd_dispatch, sum};

#[derive(Clone, Copy, Debug, PartialEq)]
enum NormType {
    Rms,
    Layer,
}

/// `x` with its last dimension split into vectors of `d` (a no-op when it is d already).
fn vectors(x: &Tensor, d: usize) -> Result<Tensor> {
    let last = x.dims().last().copied().unwrap_or(0);
    if last == d || d == 0 {
        return Ok(x.clone());
    }
    let mut dims = x.dims().to_vec();
    dims.pop();
    dims.extend([last / d, d]);
    x.reshape(dims)
}

/// `x / sqrt(mean(x²) + eps) · w` per vector of w's size, from differentiable primitives.
pub fn rms_norm_unfused(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let v = vectors(x, w.elem_count())?;
    let ms = v.sqr()?.mean_keepdim(D::Minus1)?;
    v.broadcast_mul(&(ms + eps)?.sqrt()?.recip()?)?
        .broadcast_mul(w)?
        .reshape(x.shape())
}

/// `(x − mean) / sqrt(var + eps) · w (+ b)` per vector of w's size, from differentiable
/// primitives.
pub fn layer_norm_unfused(x: &Tensor, w: &Tensor, b: Option<&Tensor>, eps: f64) -> Result<Tensor> {
    let v = vectors(x, w.elem_count())?;
    let centred = v.broadcast_sub(&v.mean_keepdim(D::Minus1)?)?;
    let var = centred.sqr()?.mean_keepdim(D::Minus1)?;
    let scaled = centred
        .broadcast_mul(&(var + eps)?.sqrt()?.recip()?)?
        .broadcast_mul(w)?;
    match b {
        Some(b) => scaled.broadcast_add(b)?.reshape(x.shape()),
        None => scaled.reshape(x.shape()),
    }
}

/// Whether x, w (and b) take the fused op: on the CPU an f32 or bf16 input with an f32 gain
/// and bias; on CUDA, with the norm kernel switched on, an f32 gain and bias, and an input and
/// output each f32 or (with the bf16 variants on too) bf16.
fn fused(x: &Tensor, w: &Tensor, b: Option<&Tensor>, out: DType) -> bool {
    let params = |f: &dyn Fn(&Tensor) -> bool| f(w) && b.is_none_or(f);
    (is_host(x) && params(&is_host_f32))
        || (takes(x, Kernel::Norm)
            && takes_dtype(out, Kernel::Norm)
            && params(&|t| takes_param(t, Kernel::Norm)))
}

/// RMSNorm with gain `w` over each vector of w's size along the last dimension; fused on CPU f32
/// and (with the norm kernel switched on) CUDA f32, and on bf16 inputs on the CPU and (with the
/// `bf16` kernels switched on too) on CUDA. The output is in x's dtype.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    rms_norm_as(x, w, eps, x.dtype())
}

/// [`rms_norm`] with its output in `out` (bf16: rounded once, from the f32 the op computes; the
/// gradient that comes back is widened). x may be f32 or bf16.
pub fn rms_norm_as(x: &Tensor, w: &Tensor, eps: f64, out: DType) -> Result<Tensor> {
    if !fused(x, w, None, out) {
        return rms_norm_unfused(&x.to_dtype(w.dtype())?, w, eps)?.to_dtype(out);
    }
    let op = NormOp {
        kind: NormType::Rms,
        eps,
        out,
    };
    x.contiguous()?.apply_op2(&w.contiguous()?, op)
}

/// LayerNorm with gain `w` and optional bias `b` over each vector of w's size along the last
/// dimension; fused where [`rms_norm`] is. The output is in x's dtype.
pub fn layer_norm(x: &Tensor, w: &Tensor, b: Option<&Tensor>, eps: f64) -> Result<Tensor> {
    layer_norm_as(x, w, b, eps, x.dtype())
}

/// [`layer_norm`] with its output in `out`, as [`rms_norm_as`].
pub fn layer_norm_as(x: &Tensor, w: &Tensor, b: Option<&Tensor>, eps: f64, out: DType) -> Result<Tensor> {
    if !fused(x, w, b, out) {
        return layer_norm_unfused(&x.to_dtype(w.dtype())?, w, b, eps)?.to_dtype(out);
    }
    let op = NormOp {
        kind: NormType::Layer,
        eps,
        out,
    };
    match b {
        Some(b) => x.contiguous()?.apply_op3(&w.contiguous()?, &b.contiguous()?, op),
        None => x.contiguous()?.apply_op2(&w.contiguous()?, op),
    }
}

#[derive(Clone, Copy)]
pub(crate) struct NormOp {
    kind: NormType,
    eps: f64,
    /// The output's dtype (f32 or bf16).
    out: DType,
}

/// Rows per parallel task.
const ROWS_PER_TASK: usize = 64;
/// Gain columns per task of the parameter-gradient pass.
const COLS_PER_TASK: usize = 32;

impl NormOp {
    /// RMSNorm (`rms`) or LayerNorm with an f32 output, for ops that run a norm inside them.
    pub(crate) fn f32(rms: bool, eps: f64) -> Self {
        let kind = if rms { NormType::Rms } else { NormType::Layer };
        Self {
            kind,
            eps,
            out: DType::F32,
        }
    }

    /// Per-row (shift, 1/σ): mean (LayerNorm) or 0 (RMSNorm), and the reciprocal scale.
    #[inline(always)]
    fn stats(&self, row: &[f32]) -> (f32, f32) {
        let d = row.len() as f32;
        let mean = match self.kind {
            NormType::Rms => 0.0,
            NormType::Layer => sum(row) / d,
        };
        let mut acc = [0f32; 8];
        let c = row.chunks_exact(8);
        let rem = c.remainder();
        for x in c {
            for i in 0..8 {
                let v = x[i] - mean;
                acc[i] += v * v;
            }
        }
        let mut tail = 0f32;
        for x in rem {
            tail += (x - mean) * (x - mean);
        }
        let ss = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
        let var = ss / d;
        (mean, 1.0 / (var + self.eps as f32).sqrt())
    }

    /// The normalised rows of `x` into `y` (both whole rows of w.len()).
    #[inline(always)]
    fn forward_rows(&self, x: &[f32], w: &[f32], b: Option<&[f32]>, y: &mut [MaybeUninit<f32>]) {
        let d = w.len();
        // Slices of exactly d elements, so the loops below carry no bounds checks and vectorise.
        let w = &w[..d];
        let b = b.map(|b| &b[..d]);
        for (xr, yr) in x.chunks_exact(d).zip(y.chunks_exact_mut(d)) {
            let (mean, r) = self.stats(xr);
            match b {
                Some(b) => {
                    for (((y, &x), &w), &b) in yr.iter_mut().zip(xr).zip(w).zip(b) {
                        y.write((x - mean) * r * w + b);
                    }
                }
                None => {
                    for ((y, &x), &w) in yr.iter_mut().zip(xr).zip(w) {
                        y.write((x - mean) * r * w);
                    }
                }
            }
        }
    }

    /// The input gradient of whole rows (plus the rows of `residual`: a gradient that reaches x
    /// by another path, added as candle would add it), and each row's (shift, 1/σ) for the
    /// parameter pass.
    #[inline(always)]
    fn backward_rows(
        &self,
        x: &[f32],
        w: &[f32],
        g: &[f32],
        residual: Option<&[f32]>,
        dx: &mut [MaybeUninit<f32>],
        stats: &mut [(f32, f32)],
    ) {
        let d = w.len();
        let w = &w[..d];
        let mut xhat = vec![0f32; d];
        let mut gx = vec![0f32; d];
        let inv_d = 1.0 / d as f32;
        for (row, (((xr, gr), dxr), st)) in x
            .chunks_exact(d)
            .zip(g.chunks_exact(d))
            .zip(dx.chunks_exact_mut(d))
            .zip(stats.iter_mut())
            .enumerate()
        {
            let (mean, r) = self.stats(xr);
            *st = (mean, r);
            for i in 0..d {
                xhat[i] = (xr[i] - mean) * r;
                gx[i] = gr[i] * w[i];
            }
            let m_gx_xhat = dot(&gx, &xhat) * inv_d;
            let m_gx = match self.kind {
                NormType::Rms => 0.0,
                NormType::Layer => sum(&gx) * inv_d,
            };
            match residual {
                Some(res) => {
                    let res = &res[row * d..(row + 1) * d];
                    for (((dx, &gx), &xhat), &res) in dxr.iter_mut().zip(&gx).zip(&xhat).zip(res) {
                        dx.write(res + r * (gx - m_gx - xhat * m_gx_xhat));
                    }
                }
                None => {
                    for ((dx, &gx), &xhat) in dxr.iter_mut().zip(&gx).zip(&xhat) {
                        dx.write(r * (gx - m_gx - xhat * m_gx_xhat));
                    }
                }
            }
        }
    }

    /// (dw, db) of the gain columns `cols`: Σ over rows, in row order, of g·x̂ and g.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)] // the SIMD dispatch macro needs plain slices, not a struct
    fn param_grads(
        &self,
        x: &[f32],
        g: &[f32],
        stats: &[(f32, f32)],
        d: usize,
        cols: std::ops::Range<usize>,
        dw: &mut [f32],
        db: &mut [f32],
    ) {
        for ((xr, gr), &(mean, r)) in x.chunks_exact(d).zip(g.chunks_exact(d)).zip(stats) {
            let (xr, gr) = (&xr[cols.clone()], &gr[cols.clone()]);
            for (((dw, db), &x), &g) in dw.iter_mut().zip(db.iter_mut()).zip(xr).zip(gr) {
                *dw += g * ((x - mean) * r);
                *db += g;
            }
        }
    }

    pub(crate) fn forward(&self, x: &[f32], w: &[f32], b: Option<&[f32]>) -> Result<Vec<f32>> {
        let d = Self::row_width(x, w)?;
        let mut y = Vec::with_capacity(x.len());
        let out = SharedMut(y.as_mut_ptr());
        for_each_chunk(x.len() / d, ROWS_PER_TASK, |rows| {
            let span = rows.start * d..rows.end * d;
            // SAFETY: the rows `rows` of the output belong to this task alone.
            let y = unsafe { out.slice(span.start, span.len()) };
            // SAFETY: a Vec<f32>'s spare capacity viewed as MaybeUninit, which it is.
            let y = unsafe { &mut *(y as *mut [f32] as *mut [MaybeUninit<f32>]) };
            norm_forward_rows(*self, &x[span], w, b, y);
        });
        // SAFETY: the tasks wrote every row (x.len() is a multiple of d, checked above).
        unsafe { y.set_len(x.len()) };
        Ok(y)
    }

    /// The rows of x normalised into `y` (x's size), on this thread: for a caller that makes
    /// a matrix in blocks of rows (`Activation::rounded_with`); the rows [`Self::forward`] gives.
    pub(crate) fn forward_into(&self, x: &[f32], w: &[f32], b: Option<&[f32]>, y: &mut [MaybeUninit<f32>]) {
        assert_eq!(x.len(), y.len(), "norm: input and output sizes differ");
        norm_forward_rows(*self, x, w, b, y);
    }

    /// The width of x's rows (w's size), checked to divide x's size.
    pub(crate) fn row_width(x: &[f32], w: &[f32]) -> Result<usize> {
        let d = w.len();
        if d == 0 || !x.len().is_multiple_of(d) {
            bail!(
                "norm: input size {} is not a multiple of the gain size {d}",
                x.len()
            );
        }
        Ok(d)
    }

    /// (dx, dw, db) from x, w and the output gradient g.
    fn backward(&self, x: &[f32], w: &[f32], g: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        self.backward_adding(x, w, g, None)
    }

    /// [`backward`](Self::backward) with `residual` (x's size) added to dx in the same pass:
    /// x's gradient where x also reaches the loss around the norm (a pre-norm block's residual
    /// stream), with the bits of candle's sum of the two.
    pub(crate) fn backward_adding(
        &self,
        x: &[f32],
        w: &[f32],
        g: &[f32],
        residual: Option<&[f32]>,
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let d = w.len();
        let rows = x.len() / d.max(1);
        // dx is written whole by the rows' tasks, so it is not zero-filled first (a pass over
        // an activation-sized buffer: 0.7% of the standard shape's bf16 step in a profile).
        let mut dx: Vec<f32> = Vec::with_capacity(x.len());
        let mut stats = vec![(0f32, 0f32); rows];
        let (dx_out, stats_out) = (
            SharedMut(dx.as_mut_ptr().cast::<MaybeUninit<f32>>()),
            SharedMut(stats.as_mut_ptr()),
        );
        for_each_chunk(rows, ROWS_PER_TASK, |r| {
            // SAFETY: the rows `r` of dx and of the stats belong to this task alone.
            let (dx, st) = unsafe {
                (
                    dx_out.slice(r.start * d, r.len() * d),
                    stats_out.slice(r.start, r.len()),
                )
            };
            norm_backward_rows(
                *self,
                &x[r.start * d..r.end * d],
                w,
                &g[r.start * d..r.end * d],
                residual.map(|res| &res[r.start * d..r.end * d]),
                dx,
                st,
            );
        });
        // SAFETY: the tasks covered rows 0..rows, and `backward_rows` writes every element of
        // each of its rows: rows·d elements, all of x where d divides it (as
        // [`Self::row_width`] checks for the ops).
        unsafe { dx.set_len(rows * d) };
        let (mut dw, mut db) = (vec![0f32; d], vec![0f32; d]);
        let (dw_out, db_out) = (SharedMut(dw.as_mut_ptr()), SharedMut(db.as_mut_ptr()));
        for_each_chunk(d, COLS_PER_TASK, |cols| {
            // SAFETY: the gain columns `cols` belong to this task alone.
            let (dw, db) = unsafe {
                (
                    dw_out.slice(cols.start, cols.len()),
                    db_out.slice(cols.start, cols.len()),
                )
            };
            norm_param_grads(*self, x, g, &stats, d, cols, dw, db);
        });
        (dx, dw, db)
    }
}

#[inline(always)]
fn norm_forward_rows_generic(
    op: NormOp,
    x: &[f32],
    w: &[f32],
    b: Option<&[f32]>,
    y: &mut [MaybeUninit<f32>],
) {
    op.forward_rows(x, w, b, y)
}
simd_dispatch!(norm_forward_rows => norm_forward_rows_generic(
    op: NormOp, x: &[f32], w: &[f32], b: Option<&[f32]>, y: &mut [MaybeUninit<f32>]) -> ());

#[inline(always)]
#[allow(clippy::too_many_arguments)] // the SIMD dispatch macro needs plain slices, not a struct
fn norm_backward_rows_generic(
    op: NormOp,
    x: &[f32],
    w: &[f32],
    g: &[f32],
    residual: Option<&[f32]>,
    dx: &mut [MaybeUninit<f32>],
    stats: &mut [(f32, f32)],
) {
    op.backward_rows(x, w, g, residual, dx, stats)
}
simd_dispatch!(norm_backward_rows => norm_backward_rows_generic(
    op: NormOp, x: &[f32], w: &[f32], g: &[f32], residual: Option<&[f32]>, dx: &mut [MaybeUninit<f32>],
    stats: &mut [(f32, f32)]) -> ());

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn norm_param_grads_generic(
    op: NormOp,
    x: &[f32],
    g: &[f32],
    stats: &[(f32, f32)],
    d: usize,
    cols: std::ops::Range<usize>,
    dw: &mut [f32],
    db: &mut [f32],
) {
    op.param_grads(x, g, stats, d, cols, dw, db)
}
simd_dispatch!(norm_param_grads => norm_param_grads_generic(
    op: NormOp, x: &[f32], g: &[f32], stats: &[(f32, f32)], d: usize, cols: std::ops::Range<usize>,
    dw: &mut [f32], db: &mut [f32]) -> ());

impl CustomOp2 for NormOp {
    fn name(&self) -> &'static str {
        "ember-norm"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let y = self.forward(&cpu_values(s1, l1)?, cpu_slice(s2, l2)?, None)?;
        Ok((cpu_storage_as(y, self.out)?, l1.shape().clone()))
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        Ok((
            cuda::forward(*self, (s1, l1), (s2, l2), None)?,
            l1.shape().clone(),
        ))
    }
    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        #[cfg(feature = "cuda")]
        if x.device().is_cuda() {
            let (dx, dw, _) = cuda::backward(*self, x, w, g)?;
            return Ok((Some(dx), Some(dw)));
        }
        let (dx, dw, _) = with_data([x, w, g], |[x, w, g]| Ok(self.backward(x, w, g)))?;
        Ok((
            Some(cpu_tensor_as(dx, x.shape(), x.dtype())?),
            Some(cpu_tensor(dw, w.shape())?),
        ))
    }
}

impl CustomOp3 for NormOp {
    fn name(&self) -> &'static str {
        "ember-norm-bias"
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
        let y = self.forward(&cpu_values(s1, l1)?, cpu_slice(s2, l2)?, Some(cpu_slice(s3, l3)?))?;
        Ok((cpu_storage_as(y, self.out)?, l1.shape().clone()))
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let y = cuda::forward(*self, (s1, l1), (s2, l2), Some((s3, l3)))?;
        Ok((y, l1.shape().clone()))
    }
    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        #[cfg(feature = "cuda")]
        if x.device().is_cuda() {
            let (dx, dw, db) = cuda::backward(*self, x, w, g)?;
            return Ok((Some(dx), Some(dw), Some(db.reshape(b.shape())?)));
        }
        let (dx, dw, db) = with_data([x, w, g], |[x, w, g]| Ok(self.backward(x, w, g)))?;
        Ok((
            Some(cpu_tensor_as(dx, x.shape(), x.dtype())?),
            Some(cpu_tensor(dw, w.shape())?),
            Some(cpu_tensor(db, b.shape())?),
        ))
    }
}

#[cfg(feature = "cuda")]
mod cuda;

#[cfg(test)]
mod mirror;
