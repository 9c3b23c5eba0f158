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
//! chunks in order, so they too have the same bits on every run.

use std::mem::MaybeUninit;

use candle_core::{bail, CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor, D};

use crate::cuda::{takes, Kernel};
use crate::host::{cpu_slice, cpu_tensor, is_host_f32, with_data};
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

/// Whether x, w (and b) take the fused op: all f32 on the CPU, or all f32 on CUDA with the norm
/// kernel switched on.
fn fused(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> bool {
    let all = |f: &dyn Fn(&Tensor) -> bool| f(x) && f(w) && b.is_none_or(f);
    all(&is_host_f32) || all(&|t| takes(t, Kernel::Norm))
}

/// RMSNorm with gain `w` over each vector of w's size along the last dimension; fused on CPU f32
/// and (with the norm kernel switched on) CUDA f32.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    if !fused(x, w, None) {
        return rms_norm_unfused(x, w, eps);
    }
    x.contiguous()?.apply_op2(
        &w.contiguous()?,
        NormOp {
            kind: NormType::Rms,
            eps,
        },
    )
}

/// LayerNorm with gain `w` and optional bias `b` over each vector of w's size along the last
/// dimension; fused on CPU f32 and (with the norm kernel switched on) CUDA f32.
pub fn layer_norm(x: &Tensor, w: &Tensor, b: Option<&Tensor>, eps: f64) -> Result<Tensor> {
    if !fused(x, w, b) {
        return layer_norm_unfused(x, w, b, eps);
    }
    let op = NormOp {
        kind: NormType::Layer,
        eps,
    };
    match b {
        Some(b) => x.contiguous()?.apply_op3(&w.contiguous()?, &b.contiguous()?, op),
        None => x.contiguous()?.apply_op2(&w.contiguous()?, op),
    }
}

#[derive(Clone, Copy)]
struct NormOp {
    kind: NormType,
    eps: f64,
}

/// Rows per parallel task.
const ROWS_PER_TASK: usize = 64;
/// Gain columns per task of the parameter-gradient pass.
const COLS_PER_TASK: usize = 32;

impl NormOp {
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

    /// The input gradient of whole rows, and each row's (shift, 1/σ) for the parameter pass.
    #[inline(always)]
    fn backward_rows(&self, x: &[f32], w: &[f32], g: &[f32], dx: &mut [f32], stats: &mut [(f32, f32)]) {
        let d = w.len();
        let w = &w[..d];
        let mut xhat = vec![0f32; d];
        let mut gx = vec![0f32; d];
        let inv_d = 1.0 / d as f32;
        for (((xr, gr), dxr), st) in x
            .chunks_exact(d)
            .zip(g.chunks_exact(d))
            .zip(dx.chunks_exact_mut(d))
            .zip(stats.iter_mut())
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
            for ((dx, &gx), &xhat) in dxr.iter_mut().zip(&gx).zip(&xhat) {
                *dx = r * (gx - m_gx - xhat * m_gx_xhat);
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

    fn forward(&self, x: &[f32], w: &[f32], b: Option<&[f32]>) -> Result<Vec<f32>> {
        let d = w.len();
        if d == 0 || !x.len().is_multiple_of(d) {
            bail!(
                "norm: input size {} is not a multiple of the gain size {d}",
                x.len()
            );
        }
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

    /// (dx, dw, db) from x, w and the output gradient g.
    fn backward(&self, x: &[f32], w: &[f32], g: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let d = w.len();
        let rows = x.len() / d.max(1);
        let mut dx = vec![0f32; x.len()];
        let mut stats = vec![(0f32, 0f32); rows];
        let (dx_out, stats_out) = (SharedMut(dx.as_mut_ptr()), SharedMut(stats.as_mut_ptr()));
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
                dx,
                st,
            );
        });
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
fn norm_backward_rows_generic(
    op: NormOp,
    x: &[f32],
    w: &[f32],
    g: &[f32],
    dx: &mut [f32],
    stats: &mut [(f32, f32)],
) {
    op.backward_rows(x, w, g, dx, stats)
}
simd_dispatch!(norm_backward_rows => norm_backward_rows_generic(
    op: NormOp, x: &[f32], w: &[f32], g: &[f32], dx: &mut [f32], stats: &mut [(f32, f32)]) -> ());

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
        let y = self.forward(cpu_slice(s1, l1)?, cpu_slice(s2, l2)?, None)?;
        Ok((CpuStorage::F32(y), l1.shape().clone()))
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
        Ok((Some(cpu_tensor(dx, x.shape())?), Some(cpu_tensor(dw, w.shape())?)))
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
        let y = self.forward(cpu_slice(s1, l1)?, cpu_slice(s2, l2)?, Some(cpu_slice(s3, l3)?))?;
        Ok((CpuStorage::F32(y), l1.shape().clone()))
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
            Some(cpu_tensor(dx, x.shape())?),
            Some(cpu_tensor(dw, w.shape())?),
            Some(cpu_tensor(db, b.shape())?),
        ))
    }
}

/// The launches of `cuda/norm.cu`.
#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::cuda::cudarc::driver::LaunchConfig;
    use candle_core::{bail, CudaStorage, Layout, Result, Tensor};

    use super::{NormOp, NormType};
    use crate::cuda::device::{alloc, elementwise, launch, storage, tensor, view, with_cuda, NORM};

    /// Threads per block of the per-vector kernels: 8 warps, one vector each.
    const VECTOR_THREADS: u32 = 256;
    /// At most this many blocks of those: a grid-stride loop takes the vectors beyond.
    const MAX_VECTOR_BLOCKS: usize = 1 << 20;
    /// Vectors per chunk of the parameter gradients' first pass (at least; more when there would
    /// be over MAX_CHUNKS chunks). A function of the shapes alone, so the sums' order is too.
    const PER_CHUNK: usize = 64;
    const MAX_CHUNKS: usize = 1 << 16;

    /// The geometry of a kernel taking one warp per vector.
    fn per_vector(vectors: usize) -> LaunchConfig {
        let warps = (VECTOR_THREADS / 32) as usize;
        LaunchConfig {
            grid_dim: (vectors.div_ceil(warps).clamp(1, MAX_VECTOR_BLOCKS) as u32, 1, 1),
            block_dim: (VECTOR_THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// (vectors, d) of an input of `n` elements and a gain of `d`, or the CPU kernel's error.
    fn vectors(n: usize, d: usize) -> Result<(usize, u32)> {
        if d == 0 || !n.is_multiple_of(d) {
            bail!("norm: input size {n} is not a multiple of the gain size {d}");
        }
        let Ok(d32) = u32::try_from(d) else {
            bail!("norm: a gain of {d} elements is too large for the CUDA kernel");
        };
        Ok((n / d, d32))
    }

    fn flags(op: NormOp) -> (i32, f32) {
        ((op.kind == NormType::Layer) as i32, op.eps as f32)
    }

    pub(super) fn forward(
        op: NormOp,
        (xs, xl): (&CudaStorage, &Layout),
        (ws, wl): (&CudaStorage, &Layout),
        b: Option<(&CudaStorage, &Layout)>,
    ) -> Result<CudaStorage> {
        let (n, d) = (xl.shape().elem_count(), wl.shape().elem_count());
        let (count, d32) = vectors(n, d)?;
        let (x, w) = (view(xs, xl)?, view(ws, wl)?);
        // Without a bias the kernel reads no `b`; the gain stands in for the pointer.
        let (b, has_bias) = match b {
            Some((bs, bl)) => {
                if bl.shape().elem_count() != d {
                    bail!(
                        "norm: a bias of {} elements for a gain of {d}",
                        bl.shape().elem_count()
                    );
                }
                (view(bs, bl)?, 1i32)
            }
            None => (view(ws, wl)?, 0i32),
        };
        let (layer, eps) = flags(op);
        let dev = &xs.device;
        let mut y = alloc(dev, n)?;
        if count > 0 {
            launch!(dev, NORM, "ember_norm_fwd", per_vector(count);
                &x, &w, &b, &mut y, &(count as u64), &d32, &layer, &has_bias, &eps)?;
        }
        Ok(storage(y, dev))
    }

    /// (dx, dw, db) from x, w and the output gradient g.
    pub(super) fn backward(
        op: NormOp,
        x: &Tensor,
        w: &Tensor,
        g: &Tensor,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        with_cuda([x, w, g], |[(xs, xl), (ws, wl), (gs, gl)]| {
            let (n, d) = (xl.shape().elem_count(), wl.shape().elem_count());
            let (count, d32) = vectors(n, d)?;
            if gl.shape().elem_count() != n {
                bail!(
                    "norm: a gradient of {:?} for an input of {:?}",
                    gl.shape(),
                    xl.shape()
                );
            }
            let (xv, wv, gv) = (view(xs, xl)?, view(ws, wl)?, view(gs, gl)?);
            let (layer, eps) = flags(op);
            let dev = &xs.device;
            let mut dx = alloc(dev, n)?;
            let mut stats = alloc(dev, 2 * count)?;
            if count > 0 {
                launch!(dev, NORM, "ember_norm_bwd_dx", per_vector(count);
                    &xv, &wv, &gv, &mut dx, &mut stats, &(count as u64), &d32, &layer, &eps)?;
            }
            let per_chunk = PER_CHUNK.max(count.div_ceil(MAX_CHUNKS));
            let chunks = count.div_ceil(per_chunk).max(1);
            let threads = d.next_multiple_of(32).min(256);
            let column_blocks = d.div_ceil(threads);
            if column_blocks > 65_535 {
                bail!("norm: a gain of {d} elements is too large for the CUDA kernel");
            }
            let (mut pw, mut pb) = (alloc(dev, chunks * d)?, alloc(dev, chunks * d)?);
            let cfg = LaunchConfig {
                grid_dim: (chunks as u32, column_blocks as u32, 1),
                block_dim: (threads as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            launch!(dev, NORM, "ember_norm_bwd_partials", cfg;
                &xv, &gv, &stats, &mut pw, &mut pb, &(count as u64), &d32, &(per_chunk as u64))?;
            let (mut dw, mut db) = (alloc(dev, d)?, alloc(dev, d)?);
            launch!(dev, NORM, "ember_norm_bwd_reduce", elementwise(d);
                &pw, &pb, &mut dw, &mut db, &(chunks as u64), &d32)?;
            Ok((
                tensor(dx, dev, xl.shape()),
                tensor(dw, dev, wl.shape()),
                tensor(db, dev, wl.shape()),
            ))
        })
    }
}

/// The CUDA kernels' arithmetic (`cuda/norm.cuh`, run on the host by `cuda/norm_mirror.cpp`)
/// against this CPU kernel.
#[cfg(test)]
mod mirror {
    use super::{NormOp, NormType};
    use crate::simd::{dot, sum};

    extern "C" {
        fn ember_mirror_norm_forward(
            x: *const f32,
            w: *const f32,
            b: *const f32,
            vectors: u64,
            d: u32,
            layer: i32,
            eps: f32,
            y: *mut f32,
        );
        fn ember_mirror_norm_backward(
            x: *const f32,
            w: *const f32,
            g: *const f32,
            vectors: u64,
            d: u32,
            layer: i32,
            eps: f32,
            per_chunk: u64,
            dx: *mut f32,
            dw: *mut f32,
            db: *mut f32,
        );
        fn ember_mirror_norm_value(x: f32, mean: f32, rstd: f32, w: f32, b: f32, has_bias: i32) -> f32;
        fn ember_mirror_norm_dx(
            x: f32,
            w: f32,
            g: f32,
            mean: f32,
            rstd: f32,
            m_gx: f32,
            m_gx_xhat: f32,
        ) -> f32;
    }

    fn random(n: usize, seed: u64, shift: f32) -> Vec<f32> {
        let mut rng = ember_rng::SplitMix64::new(seed);
        (0..n).map(|_| rng.normal() as f32 + shift).collect()
    }

    /// ‖a − b‖ / ‖b‖.
    fn rel(a: &[f32], b: &[f32]) -> f64 {
        assert_eq!(a.len(), b.len());
        let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
        let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
        (num / den.max(1e-30)).sqrt()
    }

    const KINDS: [NormType; 2] = [NormType::Rms, NormType::Layer];

    #[test]
    fn the_device_norm_elements_are_the_cpu_elements_bit_for_bit() {
        // Given one vector's statistics and means (the CPU kernel's own), every output and
        // input-gradient element is the same expression, rounded the same way.
        let d = 77;
        for kind in KINDS {
            let op = NormOp { kind, eps: 1e-5 };
            let (x, w, b, g) = (
                random(d, 1, 0.3),
                random(d, 2, 1.0),
                random(d, 3, 0.0),
                random(d, 4, 0.0),
            );
            let (mean, r) = op.stats(&x);
            let y = op.forward(&x, &w, Some(&b)).unwrap();
            let y_plain = op.forward(&x, &w, None).unwrap();
            let (dx, _, _) = op.backward(&x, &w, &g);
            let xhat: Vec<f32> = x.iter().map(|&v| (v - mean) * r).collect();
            let gx: Vec<f32> = g.iter().zip(&w).map(|(g, w)| g * w).collect();
            let inv_d = 1.0 / d as f32;
            let m_gx_xhat = dot(&gx, &xhat) * inv_d;
            let m_gx = match kind {
                NormType::Rms => 0.0,
                NormType::Layer => sum(&gx) * inv_d,
            };
            for i in 0..d {
                let (yb, yp, dxi) = unsafe {
                    (
                        ember_mirror_norm_value(x[i], mean, r, w[i], b[i], 1),
                        ember_mirror_norm_value(x[i], mean, r, w[i], 0.0, 0),
                        ember_mirror_norm_dx(x[i], w[i], g[i], mean, r, m_gx, m_gx_xhat),
                    )
                };
                assert_eq!(yb.to_bits(), y[i].to_bits(), "{kind:?} y[{i}]");
                assert_eq!(yp.to_bits(), y_plain[i].to_bits(), "{kind:?} y (no bias)[{i}]");
                assert_eq!(dxi.to_bits(), dx[i].to_bits(), "{kind:?} dx[{i}]");
            }
        }
    }

    #[test]
    fn the_device_norm_of_whole_vectors_matches_the_cpu_kernel() {
        // The warp sums in another order than the CPU's eight lanes: the statistics, and so
        // every output, differ by float rounding only. Widths below, at and above a warp's 32,
        // not multiples of it, above a block's 1024; no vectors at all; chunks of the parameter
        // sums that do and do not divide the vector count.
        for (i, (vectors, d)) in [(7, 33), (130, 64), (3, 1), (20, 768), (2, 1500), (0, 48), (5, 5)]
            .into_iter()
            .enumerate()
        {
            for kind in KINDS {
                let op = NormOp { kind, eps: 1e-5 };
                let n = vectors * d;
                let seed = 10 * i as u64;
                let (x, w, b, g) = (
                    random(n, seed, 0.5),
                    random(d, seed + 1, 1.0),
                    random(d, seed + 2, 0.0),
                    random(n, seed + 3, 0.0),
                );
                let cpu = op.forward(&x, &w, Some(&b)).unwrap();
                let mut y = vec![f32::NAN; n];
                unsafe {
                    ember_mirror_norm_forward(
                        x.as_ptr(),
                        w.as_ptr(),
                        b.as_ptr(),
                        vectors as u64,
                        d as u32,
                        (kind == NormType::Layer) as i32,
                        1e-5,
                        y.as_mut_ptr(),
                    )
                };
                let what = format!("{kind:?} {vectors}×{d}");
                assert!(rel(&y, &cpu) < 1e-6, "{what} forward: {:e}", rel(&y, &cpu));
                let (cdx, cdw, cdb) = op.backward(&x, &w, &g);
                for per_chunk in [1u64, 3, 64] {
                    let (mut dx, mut dw, mut db) = (vec![f32::NAN; n], vec![f32::NAN; d], vec![f32::NAN; d]);
                    unsafe {
                        ember_mirror_norm_backward(
                            x.as_ptr(),
                            w.as_ptr(),
                            g.as_ptr(),
                            vectors as u64,
                            d as u32,
                            (kind == NormType::Layer) as i32,
                            1e-5,
                            per_chunk,
                            dx.as_mut_ptr(),
                            dw.as_mut_ptr(),
                            db.as_mut_ptr(),
                        )
                    };
                    assert!(rel(&dx, &cdx) < 1e-5, "{what} dx: {:e}", rel(&dx, &cdx));
                    assert!(rel(&dw, &cdw) < 1e-5, "{what} dw: {:e}", rel(&dw, &cdw));
                    assert!(rel(&db, &cdb) < 1e-6, "{what} db: {:e}", rel(&db, &cdb));
                    if vectors == 0 {
                        assert!(
                            dw.iter().chain(&db).all(|&v| v == 0.0),
                            "{what}: no vectors, no gradient"
                        );
                    }
                }
            }
        }
    }
}
