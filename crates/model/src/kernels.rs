//! Fused CPU kernels with backward passes, for the hot spots of training on CPU.
//!
//! Each public function here computes exactly what the unfused composition of candle primitives
//! next to it computes (up to float rounding), in one pass over memory instead of five to ten,
//! with a hand-written backward pass. Every kernel is single-threaded and sums in a fixed order,
//! so the same inputs always give the same bits. When a tensor is not an f32 tensor on the CPU
//! (CUDA, f64 finite-difference tests) the public function falls back to the unfused
//! composition, which is kept here as the reference (`*_unfused`) the tests compare against.

use std::sync::Arc;

use crate::rng::{splitmix64_output, SPLITMIX_GAMMA};
use candle_core::{
    bail, CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, Device, Layout, Result, Shape, Storage, Tensor,
    D,
};

/// Whether `t` can take the fused CPU path.
fn fast(t: &Tensor) -> bool {
    t.device().is_cpu() && t.dtype() == DType::F32
}

/// The f32 elements of a contiguous CPU tensor's storage.
fn cpu_slice<'a>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [f32]> {
    let v = match s {
        CpuStorage::F32(v) => v,
        _ => bail!("ember kernels: expected f32 storage"),
    };
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&v[a..b]),
        None => bail!("ember kernels: expected a contiguous tensor"),
    }
}

fn storage_slice<'a>(s: &'a Storage, l: &Layout) -> Result<&'a [f32]> {
    match s {
        Storage::Cpu(c) => cpu_slice(c, l),
        _ => bail!("ember kernels: expected a CPU tensor"),
    }
}

/// Runs `f` on the f32 data of `t` (made contiguous first).
fn with_data<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> Result<R>) -> Result<R> {
    let t = t.contiguous()?;
    let (s, l) = t.storage_and_layout();
    f(storage_slice(&s, l)?)
}

fn cpu_tensor(v: Vec<f32>, shape: &Shape) -> Result<Tensor> {
    Tensor::from_vec(v, shape, &Device::Cpu)
}

/// Dot product with eight independent accumulators (vectorises; fixed summation order).
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// Sum with eight independent accumulators.
#[inline(always)]
fn sum(a: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let c = a.chunks_exact(8);
    let r = c.remainder();
    for x in c {
        for i in 0..8 {
            acc[i] += x[i];
        }
    }
    let tail: f32 = r.iter().sum();
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// Largest element (−∞ for an empty slice; NaN if any element is NaN, so a diverged run stays
/// visibly diverged). Eight independent lanes: a single running `max` is a serial chain that
/// does not vectorise, and cost 8% of a 10k-vocabulary training step in the cross-entropy.
#[inline(always)]
fn max_of(a: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 8];
    let c = a.chunks_exact(8);
    let r = c.remainder();
    for x in c {
        for i in 0..8 {
            // `if` rather than `f32::max`: this form compiles to vector max instructions
            // and propagates NaN (a comparison with NaN is false, so NaN is kept or taken).
            acc[i] = if acc[i] > x[i] || acc[i].is_nan() {
                acc[i]
            } else {
                x[i]
            };
        }
    }
    let mut m = f32::NEG_INFINITY;
    for &x in acc.iter().chain(r) {
        m = if m > x || m.is_nan() { m } else { x };
    }
    m
}

/// A matrix operand of [`sgemm`]: its elements and the element strides of its rows and columns
/// (a transposed view is the same data with the strides swapped).
#[derive(Clone, Copy)]
struct Mat<'a> {
    data: &'a [f32],
    row_stride: usize,
    col_stride: usize,
}

impl<'a> Mat<'a> {
    /// Row-major with `cols` columns.
    fn rows(data: &'a [f32], cols: usize) -> Self {
        Self {
            data,
            row_stride: cols,
            col_stride: 1,
        }
    }

    /// The transpose of a row-major matrix with `cols` columns.
    fn transposed(data: &'a [f32], cols: usize) -> Self {
        Self {
            data,
            row_stride: 1,
            col_stride: cols,
        }
    }

    /// Whether every element of an `r`×`c` view lies inside `data`.
    fn fits(&self, r: usize, c: usize) -> bool {
        r == 0 || c == 0 || (r - 1) * self.row_stride + (c - 1) * self.col_stride < self.data.len()
    }
}

/// `C = A·B + beta·C` for A (m×k), B (k×n) and a row-major C (m×n), single-threaded.
///
/// [`crate::gemm`] multiplies small operands in place with an AVX-512 kernel and hands the rest
/// to matrixmultiply's packed kernels (1.6–1.8× faster than the gemm crate behind candle's
/// matmul at our shapes, see docs/performance.md); one thread with a fixed order of summation
/// gives the same bits on every run.
fn sgemm(m: usize, k: usize, n: usize, a: Mat<'_>, b: Mat<'_>, beta: f32, c: &mut [f32]) {
    assert!(
        a.fits(m, k) && b.fits(k, n) && c.len() >= m * n,
        "sgemm: operand out of bounds"
    );
    if m == 0 || n == 0 {
        return;
    }
    // SAFETY: the assertion above keeps every element the kernel reads or writes in bounds, and
    // `c` is exclusively borrowed, so it cannot alias `a` or `b`.
    unsafe { raw_sgemm(m, k, n, a, b, beta, c.as_mut_ptr()) }
}

/// [`crate::gemm::gemm`] with C row-major (m×n) at `c`. Caller: operands in bounds, `c` valid
/// for m·n writes (and reads, unless β = 0) and not aliasing A or B.
unsafe fn raw_sgemm(m: usize, k: usize, n: usize, a: Mat<'_>, b: Mat<'_>, beta: f32, c: *mut f32) {
    raw_sgemm_ld(m, k, n, a, b, beta, c, n)
}

/// [`raw_sgemm`] with C's rows `ldc` elements apart.
#[allow(clippy::too_many_arguments)]
unsafe fn raw_sgemm_ld(
    m: usize,
    k: usize,
    n: usize,
    a: Mat<'_>,
    b: Mat<'_>,
    beta: f32,
    c: *mut f32,
    ldc: usize,
) {
    let operand = |x: Mat<'_>| crate::gemm::Operand {
        ptr: x.data.as_ptr(),
        row_stride: x.row_stride,
        col_stride: x.col_stride,
    };
    crate::gemm::gemm(m, k, n, operand(a), operand(b), beta, c, ldc)
}

/// `A·B` for A (m×k) and B (k×n) into a new row-major (m×n) vector (no zero-fill first).
fn product(m: usize, k: usize, n: usize, a: Mat<'_>, b: Mat<'_>) -> Vec<f32> {
    let mut c = Blocks::new(m * n);
    c.product(0, m, k, n, a, b);
    c.finish()
}

/// A vector assembled from disjoint blocks, each written in full — by a β = 0 product (which
/// writes every element of its block without reading it) or by the caller — so it needs no
/// zero-fill first.
struct Blocks {
    data: Vec<f32>,
    len: usize,
    written: usize,
}

impl Blocks {
    fn new(len: usize) -> Self {
        Self {
            data: Vec::with_capacity(len),
            len,
            written: 0,
        }
    }

    /// `A·B` (m×k times k×n) into rows of n elements starting at `at`, `ldc` apart.
    #[allow(clippy::too_many_arguments)]
    fn product_ld(&mut self, at: usize, ldc: usize, m: usize, k: usize, n: usize, a: Mat<'_>, b: Mat<'_>) {
        assert!(
            a.fits(m, k) && b.fits(k, n) && n <= ldc && (m == 0 || at + (m - 1) * ldc + n <= self.len),
            "sgemm: operand out of bounds"
        );
        if m == 0 || n == 0 {
            return;
        }
        let c = self.data.spare_capacity_mut()[at..].as_mut_ptr().cast::<f32>();
        // SAFETY: operands in bounds (asserted); the rows of C lie in our spare capacity, which
        // no operand borrows. With β = 0 every element of each row is written without being
        // read (matrixmultiply: "If β is zero, then C does not need to be initialized"); for
        // k = 0 the fill writes it.
        unsafe {
            if k == 0 {
                for r in 0..m {
                    std::ptr::write_bytes(c.add(r * ldc), 0, n);
                }
            } else {
                raw_sgemm_ld(m, k, n, a, b, 0.0, c, ldc);
            }
        }
        self.written += m * n;
    }

    /// `A·B` (m×k times k×n) into elements `at..at + m·n`; returns them.
    fn product(&mut self, at: usize, m: usize, k: usize, n: usize, a: Mat<'_>, b: Mat<'_>) -> &mut [f32] {
        self.product_ld(at, n, m, k, n, a, b);
        // SAFETY: product_ld wrote (and bounds-checked) these m·n contiguous elements.
        unsafe { std::slice::from_raw_parts_mut(self.data.as_mut_ptr().add(at), m * n) }
    }

    /// Elements `at..at + len`, to be written by the caller (counted as written).
    fn row(&mut self, at: usize, len: usize) -> &mut [std::mem::MaybeUninit<f32>] {
        self.written += len;
        &mut self.data.spare_capacity_mut()[at..at + len]
    }

    /// The vector, once disjoint blocks have covered it.
    fn finish(mut self) -> Vec<f32> {
        assert_eq!(self.written, self.len, "blocks do not cover the vector");
        // SAFETY: disjoint blocks (the callers' block ranges partition the vector) wrote
        // `len` elements in all, so every element is initialised.
        unsafe { self.data.set_len(self.len) };
        self.data
    }
}

/// eˣ to about 2 ulp, branch-free so loops over it vectorise (libm's `expf` is a scalar call).
/// Cody–Waite reduction x = n·ln2 + r, |r| ≤ ln2/2, then a degree-6 Taylor polynomial in r.
/// Below −87.3 (where eˣ is subnormal) it returns exactly 0, which masked logits rely on.
#[inline(always)]
fn exp_fast(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let xc = x.clamp(-87.3, 88.0);
    // Round to nearest by adding and removing 1.5·2²³ (plain SSE2; `round` would be a call).
    // The sum's low mantissa bits then hold n itself, so 2ⁿ comes from integer arithmetic on
    // its bits: a float-to-int `as` cast saturates and maps NaN to 0, which compiles to a scalar
    // convert, compare and cmov per lane and kept every loop calling this from vectorising.
    const ROUND: f32 = 12_582_912.0;
    let shifted = xc * std::f32::consts::LOG2_E + ROUND;
    let n = shifted - ROUND;
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    let n_int = shifted.to_bits() as i32 - ROUND.to_bits() as i32;
    let scale = f32::from_bits((n_int + 127).wrapping_shl(23) as u32);
    if x < -87.3 {
        0.0
    } else {
        p * scale
    }
}

/// erf(x) and e^(−x²) (the latter is needed by the GELU gradient anyway), absolute error of
/// erf below 1.5·10⁻⁷ (Abramowitz & Stegun 7.1.26), branch-free.
#[inline(always)]
fn erf_and_gauss(x: f32) -> (f32, f32) {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [0.254_829_6, -0.284_496_74, 1.421_413_7, -1.453_152, 1.061_405_4];
    let ax = x.abs();
    let t = 1.0 / (1.0 + P * ax);
    let poly = t * (A[0] + t * (A[1] + t * (A[2] + t * (A[3] + t * A[4]))));
    let gauss = exp_fast(-x * x);
    let erf_abs = 1.0 - poly * gauss;
    (erf_abs.copysign(x), gauss)
}

/// Defines `$name(args) -> ret` that runs the `#[inline(always)]` function `$generic` compiled
/// for AVX-512 or AVX2 when the CPU has it (the crate is built for baseline x86-64, which only
/// has SSE2). The arithmetic is the same either way: every reduction above sums in a fixed lane
/// order, and no copy contracts a multiply and an add into one rounding.
macro_rules! simd_dispatch {
    ($name:ident => $generic:ident ($($arg:ident : $ty:ty),* $(,)?) -> $ret:ty) => {
        #[allow(clippy::too_many_arguments)]
        fn $name($($arg: $ty),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx512dq,avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx512($($arg: $ty),*) -> $ret {
                    $generic($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx2($($arg: $ty),*) -> $ret {
                    $generic($($arg),*)
                }
                if std::is_x86_feature_detected!("avx512f")
                    && std::is_x86_feature_detected!("avx512vl")
                    && std::is_x86_feature_detected!("avx512dq")
                {
                    // SAFETY: the CPU supports the enabled features (checked just above).
                    return unsafe { avx512($($arg),*) };
                }
                if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                    // SAFETY: as above.
                    return unsafe { avx2($($arg),*) };
                }
            }
            $generic($($arg),*)
        }
    };
}

type MaskView<'a> = Option<(&'a [f32], [usize; 4], usize)>;

// ---------------------------------------------------------------------------------------------
// Linear map x·Wᵀ.
// ---------------------------------------------------------------------------------------------

/// `x·Wᵀ` for x (N, in) and a weight (out, in), from candle's matmul.
pub fn linear_unfused(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    x.matmul(&w.t()?)
}

/// `x·Wᵀ` for x (N, in) and a weight (out, in) through [`sgemm`] on CPU f32, forward and
/// backward (dx = g·W, dW = gᵀ·x) without materialising a transpose. Falls back to
/// [`linear_unfused`] elsewhere.
pub fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (_, in_dim) = x.dims2()?;
    let (_, w_in) = w.dims2()?;
    if !(fast(x) && fast(w)) || in_dim != w_in {
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
        let (dx, dw) = with_data(x, |x| {
            with_data(w, |w| {
                with_data(g, |g| {
                    let dx = product(rows, out_dim, in_dim, Mat::rows(g, out_dim), Mat::rows(w, in_dim));
                    let dw = product(
                        out_dim,
                        rows,
                        in_dim,
                        Mat::transposed(g, out_dim),
                        Mat::rows(x, in_dim),
                    );
                    Ok((dx, dw))
                })
            })
        })?;
        Ok((Some(cpu_tensor(dx, x.shape())?), Some(cpu_tensor(dw, w.shape())?)))
    }
}

// ---------------------------------------------------------------------------------------------
// RMSNorm / LayerNorm over the last dimension.
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq)]
enum NormType {
    Rms,
    Layer,
}

/// `x / sqrt(mean(x²) + eps) · w`, from differentiable primitives.
pub fn rms_norm_unfused(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    x.broadcast_mul(&(ms + eps)?.sqrt()?.recip()?)?.broadcast_mul(w)
}

/// `(x − mean) / sqrt(var + eps) · w (+ b)`, from differentiable primitives.
pub fn layer_norm_unfused(x: &Tensor, w: &Tensor, b: Option<&Tensor>, eps: f64) -> Result<Tensor> {
    let centred = x.broadcast_sub(&x.mean_keepdim(D::Minus1)?)?;
    let var = centred.sqr()?.mean_keepdim(D::Minus1)?;
    let scaled = centred
        .broadcast_mul(&(var + eps)?.sqrt()?.recip()?)?
        .broadcast_mul(w)?;
    match b {
        Some(b) => scaled.broadcast_add(b),
        None => Ok(scaled),
    }
}

/// RMSNorm over the last dimension with gain `w`; fused on CPU f32.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    if !(fast(x) && fast(w)) {
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

/// LayerNorm over the last dimension with gain `w` and optional bias `b`; fused on CPU f32.
pub fn layer_norm(x: &Tensor, w: &Tensor, b: Option<&Tensor>, eps: f64) -> Result<Tensor> {
    if !(fast(x) && fast(w) && b.is_none_or(fast)) {
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

    #[inline(always)]
    fn forward(&self, x: &[f32], w: &[f32], b: Option<&[f32]>) -> Result<Vec<f32>> {
        let d = w.len();
        if x.len().checked_rem(d) != Some(0) || d == 0 {
            bail!(
                "norm: input size {} is not a multiple of the gain size {d}",
                x.len()
            );
        }
        // Slices of exactly d elements, so the loops below carry no bounds checks and vectorise.
        let w = &w[..d];
        let b = b.map(|b| &b[..d]);
        let mut y = Vec::with_capacity(x.len());
        for (xr, yr) in x.chunks_exact(d).zip(y.spare_capacity_mut().chunks_exact_mut(d)) {
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
        // SAFETY: x.len() is a multiple of d (checked above), so the rows cover every element.
        unsafe { y.set_len(x.len()) };
        Ok(y)
    }

    /// (dx, dw, db) from x, w and the output gradient g.
    #[inline(always)]
    fn backward(&self, x: &[f32], w: &[f32], g: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let d = w.len();
        let w = &w[..d];
        let mut dx = vec![0f32; x.len()];
        let mut dw = vec![0f32; d];
        let mut db = vec![0f32; d];
        let mut xhat = vec![0f32; d];
        let mut gx = vec![0f32; d];
        let inv_d = 1.0 / d as f32;
        for ((xr, gr), dxr) in x
            .chunks_exact(d)
            .zip(g.chunks_exact(d))
            .zip(dx.chunks_exact_mut(d))
        {
            let (mean, r) = self.stats(xr);
            for i in 0..d {
                xhat[i] = (xr[i] - mean) * r;
                gx[i] = gr[i] * w[i];
                dw[i] += gr[i] * xhat[i];
                db[i] += gr[i];
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
        (dx, dw, db)
    }
}

#[inline(always)]
fn norm_forward_generic(op: NormOp, x: &[f32], w: &[f32], b: Option<&[f32]>) -> Result<Vec<f32>> {
    op.forward(x, w, b)
}
simd_dispatch!(norm_forward => norm_forward_generic(
    op: NormOp, x: &[f32], w: &[f32], b: Option<&[f32]>) -> Result<Vec<f32>>);

#[inline(always)]
fn norm_backward_generic(op: NormOp, x: &[f32], w: &[f32], g: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    op.backward(x, w, g)
}
simd_dispatch!(norm_backward => norm_backward_generic(
    op: NormOp, x: &[f32], w: &[f32], g: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<f32>));

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
        let y = norm_forward(*self, cpu_slice(s1, l1)?, cpu_slice(s2, l2)?, None)?;
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }
    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (dx, dw, _) = with_data(x, |x| {
            with_data(w, |w| with_data(g, |g| Ok(norm_backward(*self, x, w, g))))
        })?;
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
        let y = norm_forward(
            *self,
            cpu_slice(s1, l1)?,
            cpu_slice(s2, l2)?,
            Some(cpu_slice(s3, l3)?),
        )?;
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }
    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (dx, dw, db) = with_data(x, |x| {
            with_data(w, |w| with_data(g, |g| Ok(norm_backward(*self, x, w, g))))
        })?;
        Ok((
            Some(cpu_tensor(dx, x.shape())?),
            Some(cpu_tensor(dw, w.shape())?),
            Some(cpu_tensor(db, b.shape())?),
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// Rotary embeddings, rotate-half layout, with an optional output scale.
// ---------------------------------------------------------------------------------------------

/// cos/sin tables of (max_len, head_dim / 2) angles, shared by every rotation op.
#[derive(Clone)]
pub struct RopeTables {
    cos: Arc<Vec<f32>>,
    sin: Arc<Vec<f32>>,
    half: usize,
    max_len: usize,
}

impl RopeTables {
    /// Tables for `max_len` positions of vectors of size 2·`half` from f64 angles (rounded to f32
    /// exactly as the f32 tables of [`crate::rope::Rotary`] are).
    pub fn new(cos: &[f64], sin: &[f64], half: usize, max_len: usize) -> Self {
        Self {
            cos: Arc::new(cos.iter().map(|&c| c as f32).collect()),
            sin: Arc::new(sin.iter().map(|&s| s as f32).collect()),
            half,
            max_len,
        }
    }
}

/// `scale · rotated(x)` for x (B, H, T, 2·half) whose first position is `offset`: pairs (i, i + half)
/// rotated by the tabled angle. Fused on CPU f32; `None` when the caller must use the unfused form.
pub fn rope_scaled(x: &Tensor, tables: &RopeTables, offset: usize, scale: f32) -> Result<Option<Tensor>> {
    if !fast(x) {
        return Ok(None);
    }
    let (_, _, t, d) = x.dims4()?;
    if d != 2 * tables.half || offset + t > tables.max_len {
        return Ok(None);
    }
    let op = RopeOp {
        tables: tables.clone(),
        offset,
        scale,
        inverse: false,
    };
    // The kernel reads any layout whose last dimension is contiguous: in particular the
    // (B, T, H, d) projection output viewed as (B, H, T, d), which saves the head-split copy.
    let x = if x.stride()[3] == 1 {
        x.clone()
    } else {
        x.contiguous()?
    };
    Ok(Some(x.apply_op1(op)?))
}

#[derive(Clone)]
struct RopeOp {
    tables: RopeTables,
    offset: usize,
    scale: f32,
    /// Rotate by the negative angles (the transpose: the backward pass).
    inverse: bool,
}

impl RopeOp {
    /// Rotates every row of d elements: row (b, h, t) of `x` starts at `src(b, h, t)` and goes to
    /// row `dst(b, h, t)` of the output.
    #[inline(always)]
    fn run(
        &self,
        x: &[f32],
        dims: [usize; 3],
        src: impl Fn(usize, usize, usize) -> usize,
        dst: impl Fn(usize, usize, usize) -> usize,
    ) -> Vec<f32> {
        let half = self.tables.half;
        let d = 2 * half;
        let [b, h, t] = dims;
        let sign = if self.inverse { -1.0 } else { 1.0 };
        let mut y = Blocks::new(b * h * t * d);
        for bi in 0..b {
            for hi in 0..h {
                for ti in 0..t {
                    let pos = self.offset + ti;
                    let cos = &self.tables.cos[pos * half..(pos + 1) * half];
                    let sin = &self.tables.sin[pos * half..(pos + 1) * half];
                    let (x1, x2) = x[src(bi, hi, ti)..][..d].split_at(half);
                    let (y1, y2) = y.row(dst(bi, hi, ti) * d, d).split_at_mut(half);
                    for i in 0..half {
                        let s = sin[i] * sign;
                        y1[i].write((x1[i] * cos[i] - x2[i] * s) * self.scale);
                        y2[i].write((x2[i] * cos[i] + x1[i] * s) * self.scale);
                    }
                }
            }
        }
        y.finish()
    }
}

impl CustomOp1 for RopeOp {
    fn name(&self) -> &'static str {
        "ember-rope"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let data = match s {
            CpuStorage::F32(v) => v.as_slice(),
            _ => bail!("ember kernels: expected f32 storage"),
        };
        let (b, h, t, _) = l.shape().dims4()?;
        let (st, off) = (l.stride(), l.start_offset());
        if st[3] != 1 {
            bail!("ember-rope: the last dimension must be contiguous");
        }
        let y = self.run(
            data,
            [b, h, t],
            |bi, hi, ti| off + bi * st[0] + hi * st[1] + ti * st[2],
            |bi, hi, ti| (bi * h + hi) * t + ti,
        );
        Ok((CpuStorage::F32(y), l.shape().clone()))
    }
    /// The inverse rotation of the gradient, written in (B, T, H, d) order and returned as its
    /// (B, H, T, d) view: when the input was the head-split view of a projection, the
    /// gradient then reaches the projection's backward already contiguous (no copy).
    fn bwd(&self, _x: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        let op = RopeOp {
            inverse: !self.inverse,
            ..self.clone()
        };
        let (b, h, t, d) = g.dims4()?;
        let dx = with_data(g, |g| {
            Ok(op.run(
                g,
                [b, h, t],
                |bi, hi, ti| ((bi * h + hi) * t + ti) * d,
                |bi, hi, ti| (bi * t + ti) * h + hi,
            ))
        })?;
        Ok(Some(cpu_tensor(dx, &Shape::from((b, t, h, d)))?.transpose(1, 2)?))
    }
}

// ---------------------------------------------------------------------------------------------
// Softmax over the last dimension.
// ---------------------------------------------------------------------------------------------

/// Softmax over the last dimension from differentiable primitives (the max is detached: softmax
/// is shift-invariant, so its gradient through the max is exactly zero).
pub fn softmax_rows_unfused(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let e = x.broadcast_sub(&max)?.exp()?;
    e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
}

/// Softmax over the last dimension; fused on CPU f32.
pub fn softmax_rows(x: &Tensor) -> Result<Tensor> {
    if !fast(x) {
        return softmax_rows_unfused(x);
    }
    x.contiguous()?.apply_op1(SoftmaxOp)
}

/// Softmax of one row, in place (shared by [`SoftmaxOp`] and the attention kernel).
#[inline(always)]
fn softmax_in_place(row: &mut [f32]) {
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
        let dx = with_data(res, |p| {
            with_data(g, |g| {
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
            })
        })?;
        Ok(Some(cpu_tensor(dx, x.shape())?))
    }
}

// ---------------------------------------------------------------------------------------------
// Activations: GELU (erf form) and SwiGLU.
// ---------------------------------------------------------------------------------------------

/// GELU, erf form; fused backward on CPU f32 (candle's backward is eleven elementwise passes).
/// Forward and gradient follow candle's formulas with a vectorisable erf (|error| < 1.5·10⁻⁷),
/// so they agree with `Tensor::gelu_erf` to float rounding.
///
/// When a gradient will be needed, the forward pass also stores GELU's derivative at each
/// element: erf is the expensive part of both passes and the forward has it in hand, so the
/// backward becomes one multiplication per element (for one more activation-sized buffer).
pub fn gelu_erf(x: &Tensor) -> Result<Tensor> {
    if !fast(x) {
        return x.gelu_erf();
    }
    let op = GeluOp {
        derivative: x.track_op().then(|| std::sync::Mutex::new(None)),
    };
    x.contiguous()?.apply_op1(op)
}

struct GeluOp {
    /// dGELU/dx from the forward pass, taken by the backward pass (`None`: not kept).
    derivative: Option<std::sync::Mutex<Option<Vec<f32>>>>,
}

// The loops below write into spare capacity instead of `map().collect()` (collect's fold is
// not inlined into the AVX2 copy, which would leave the arithmetic unvectorised) or a zeroed
// vector (a memset per call that every element then overwrites).
#[inline(always)]
fn gelu_fwd_generic(x: &[f32]) -> Vec<f32> {
    let mut y = Vec::with_capacity(x.len());
    for (y, &v) in y.spare_capacity_mut().iter_mut().zip(x) {
        y.write((erf_and_gauss(v * std::f32::consts::FRAC_1_SQRT_2).0 + 1.) * 0.5 * v);
    }
    // SAFETY: the loop initialised the first x.len() elements.
    unsafe { y.set_len(x.len()) };
    y
}
simd_dispatch!(gelu_fwd => gelu_fwd_generic(x: &[f32]) -> Vec<f32>);

/// d/dx gelu_erf(x) = 0.5 + 0.398942·x·e^(−x²/2) + 0.5·erf(x/√2), as candle writes it; the erf
/// of x/√2 comes with e^(−x²/2) for free.
#[inline(always)]
fn gelu_derivative(v: f32) -> (f32, f32) {
    let (erf, e) = erf_and_gauss(v * std::f32::consts::FRAC_1_SQRT_2);
    ((erf + 1.) * 0.5 * v, 0.5 + 0.398942 * e * v + 0.5 * erf)
}

/// GELU and its derivative at each element.
#[inline(always)]
fn gelu_fwd_keep_generic(x: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let (mut y, mut d) = (Vec::with_capacity(x.len()), Vec::with_capacity(x.len()));
    for ((y, d), &v) in y
        .spare_capacity_mut()
        .iter_mut()
        .zip(d.spare_capacity_mut())
        .zip(x)
    {
        let (value, slope) = gelu_derivative(v);
        y.write(value);
        d.write(slope);
    }
    // SAFETY: the loop initialised the first x.len() elements of both.
    unsafe {
        y.set_len(x.len());
        d.set_len(x.len());
    }
    (y, d)
}
simd_dispatch!(gelu_fwd_keep => gelu_fwd_keep_generic(x: &[f32]) -> (Vec<f32>, Vec<f32>));

#[inline(always)]
fn gelu_bwd_generic(x: &[f32], g: &[f32]) -> Vec<f32> {
    let mut dx = Vec::with_capacity(x.len());
    for ((d, &v), &g) in dx.spare_capacity_mut().iter_mut().zip(x).zip(g) {
        d.write(g * gelu_derivative(v).1);
    }
    // SAFETY: the loop initialised min(x.len(), g.len()) = x.len() elements (same shapes).
    unsafe { dx.set_len(x.len().min(g.len())) };
    dx
}
simd_dispatch!(gelu_bwd => gelu_bwd_generic(x: &[f32], g: &[f32]) -> Vec<f32>);

impl CustomOp1 for GeluOp {
    fn name(&self) -> &'static str {
        "ember-gelu-erf"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = cpu_slice(s, l)?;
        let y = match &self.derivative {
            Some(slot) => {
                let (y, d) = gelu_fwd_keep(x);
                *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(d);
                y
            }
            None => gelu_fwd(x),
        };
        Ok((CpuStorage::F32(y), l.shape().clone()))
    }
    fn bwd(&self, x: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        let kept = self
            .derivative
            .as_ref()
            .and_then(|slot| slot.lock().unwrap_or_else(|e| e.into_inner()).take());
        let dx = match kept {
            Some(d) if d.len() == g.elem_count() => with_data(g, |g| Ok(mul(g, &d)))?,
            // Not kept (or already used by an earlier backward through this graph): recompute.
            _ => with_data(x, |x| with_data(g, |g| Ok(gelu_bwd(x, g))))?,
        };
        Ok(Some(cpu_tensor(dx, x.shape())?))
    }
}

#[inline(always)]
fn mul_generic(a: &[f32], b: &[f32]) -> Vec<f32> {
    let mut out = Vec::with_capacity(a.len());
    for ((o, &a), &b) in out.spare_capacity_mut().iter_mut().zip(a).zip(b) {
        o.write(a * b);
    }
    // SAFETY: the loop initialised min(a.len(), b.len()) elements.
    unsafe { out.set_len(a.len().min(b.len())) };
    out
}
simd_dispatch!(mul => mul_generic(a: &[f32], b: &[f32]) -> Vec<f32>);

// ---------------------------------------------------------------------------------------------
// Dropout.
// ---------------------------------------------------------------------------------------------

/// Inverted dropout on CPU f32 in one pass, with the mask recomputed in the backward pass
/// instead of stored: element i (in row-major order) is zeroed when draw i + 1 of a SplitMix64
/// stream at `state` is below p, and scaled by 1/(1 − p) otherwise. SplitMix64's state only
/// steps by a constant, so draw i is computed directly and the loop vectorises. The caller
/// advances its generator past the `x.elem_count()` draws used here. `None`: not a CPU f32
/// tensor.
pub fn dropout(x: &Tensor, state: u64, p: f64) -> Result<Option<Tensor>> {
    if !fast(x) {
        return Ok(None);
    }
    let op = DropoutOp {
        state,
        // uniform = (z >> 11)·2⁻⁵³ < p  ⟺  z >> 11 < ⌈p·2⁵³⌉ (an exact integer comparison).
        threshold: (p * (1u64 << 53) as f64).ceil() as u64,
        keep: (1.0 / (1.0 - p)) as f32,
    };
    Ok(Some(x.contiguous()?.apply_op1(op)?))
}

#[derive(Clone, Copy)]
struct DropoutOp {
    state: u64,
    threshold: u64,
    keep: f32,
}

/// `x[i] · mask[i]` for the mask of [`dropout`].
#[inline(always)]
fn dropout_generic(op: DropoutOp, x: &[f32]) -> Vec<f32> {
    let mut y = Vec::with_capacity(x.len());
    for (i, (y, &v)) in y.spare_capacity_mut().iter_mut().zip(x).enumerate() {
        // SplitMix64's output after i + 1 steps from `state`.
        let z = splitmix64_output(op.state.wrapping_add((i as u64 + 1).wrapping_mul(SPLITMIX_GAMMA)));
        y.write(if (z >> 11) < op.threshold {
            0.0
        } else {
            v * op.keep
        });
    }
    // SAFETY: the loop initialised x.len() elements.
    unsafe { y.set_len(x.len()) };
    y
}
simd_dispatch!(dropout_apply => dropout_generic(op: DropoutOp, x: &[f32]) -> Vec<f32>);

impl CustomOp1 for DropoutOp {
    fn name(&self) -> &'static str {
        "ember-dropout"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        Ok((
            CpuStorage::F32(dropout_apply(*self, cpu_slice(s, l)?)),
            l.shape().clone(),
        ))
    }
    fn bwd(&self, x: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        let dx = with_data(g, |g| Ok(dropout_apply(*self, g)))?;
        Ok(Some(cpu_tensor(dx, x.shape())?))
    }
}

/// `silu(gate) · up` from candle primitives.
pub fn swiglu_unfused(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    gate.silu()?.mul(up)
}

/// `silu(gate) · up` in one pass with a fused backward on CPU f32.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    if !(fast(gate) && fast(up)) || gate.shape() != up.shape() {
        return swiglu_unfused(gate, up);
    }
    gate.contiguous()?.apply_op2(&up.contiguous()?, SwigluOp)
}

struct SwigluOp;

#[inline(always)]
fn swiglu_fwd_generic(a: &[f32], u: &[f32]) -> Vec<f32> {
    let mut y = vec![0f32; a.len()];
    for ((y, &a), &u) in y.iter_mut().zip(a).zip(u) {
        *y = (a / (1.0 + exp_fast(-a))) * u;
    }
    y
}
simd_dispatch!(swiglu_fwd => swiglu_fwd_generic(a: &[f32], u: &[f32]) -> Vec<f32>);

#[inline(always)]
fn swiglu_bwd_generic(a: &[f32], u: &[f32], g: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let mut da = vec![0f32; a.len()];
    let mut du = vec![0f32; a.len()];
    for i in 0..a.len() {
        let sig = 1.0 / (1.0 + exp_fast(-a[i]));
        let silu = a[i] * sig;
        du[i] = g[i] * silu;
        // d/da silu = σ(a)·(1 − silu(a)) + silu(a)
        da[i] = g[i] * u[i] * (sig * (1.0 - silu) + silu);
    }
    (da, du)
}
simd_dispatch!(swiglu_bwd => swiglu_bwd_generic(a: &[f32], u: &[f32], g: &[f32]) -> (Vec<f32>, Vec<f32>));

impl CustomOp2 for SwigluOp {
    fn name(&self) -> &'static str {
        "ember-swiglu"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        Ok((
            CpuStorage::F32(swiglu_fwd(cpu_slice(s1, l1)?, cpu_slice(s2, l2)?)),
            l1.shape().clone(),
        ))
    }
    fn bwd(
        &self,
        a: &Tensor,
        u: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (da, du) = with_data(a, |a| with_data(u, |u| with_data(g, |g| Ok(swiglu_bwd(a, u, g)))))?;
        Ok((Some(cpu_tensor(da, a.shape())?), Some(cpu_tensor(du, u.shape())?)))
    }
}

// ---------------------------------------------------------------------------------------------
// Attention core: softmax(q·kᵀ + mask)·v with grouped-query heads.
// ---------------------------------------------------------------------------------------------

/// softmax(q·kᵀ + mask)·v from candle primitives: q (B, H, T, d) (already scaled), k and v
/// (B, H_kv, S, d) with H a multiple of H_kv (query head h uses KV head h / (H / H_kv)), and an
/// additive mask broadcastable to (B, H, T, S). Returns (B, H, T, d).
pub fn attention_unfused(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
    let (b, h, t, d) = q.dims4()?;
    let (_, hkv, s, _) = k.dims4()?;
    let group = h / hkv;
    let logits = q
        .reshape((b, hkv, group * t, d))?
        .matmul(&k.t()?)?
        .reshape((b, h, t, s))?;
    let masked = match mask {
        Some(m) => logits.broadcast_add(m)?,
        None => logits,
    };
    let probs = softmax_rows_unfused(&masked)?;
    probs
        .reshape((b, hkv, group * t, s))?
        .matmul(v)?
        .reshape((b, h, t, d))
}

/// Fused [`attention_unfused`] on CPU f32 (the mask is treated as a constant: it gets no
/// gradient). Falls back to the unfused form elsewhere.
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
    attention_heads_last(q, k, v, mask)?.transpose(1, 2)
}

/// [`attention`] with the output laid out (B, T, H, d): the heads of each position side by side,
/// so (B, T, H·d) for the output projection is a free reshape and its gradient arrives
/// contiguous (no head-merge copy in either pass).
pub fn attention_heads_last(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
    let (b, h, t, d) = q.dims4()?;
    let (bk, hkv, s, dk) = k.dims4()?;
    if !(fast(q) && fast(k) && fast(v) && mask.is_none_or(fast)) {
        return attention_unfused(q, k, v, mask)?.transpose(1, 2);
    }
    if bk != b || dk != d || hkv == 0 || h % hkv != 0 || v.dims4()? != (b, hkv, s, d) {
        bail!(
            "attention: q {:?}, k {:?}, v {:?} do not fit together",
            q.shape(),
            k.shape(),
            v.shape()
        );
    }
    let mask = match mask {
        Some(m) => Some(m.detach().broadcast_as((b, h, t, s))?),
        None => None,
    };
    // Keeping the probabilities for the backward pass spares it a q·kᵀ product and a softmax
    // per block, for B·H·T·S floats: done when that is at most four times what q holds (S ≤ 4d),
    // so long sequences still recompute instead of storing T² per head.
    let keep = q.track_op() && s <= 4 * d;
    let op = AttnOp {
        mask,
        probs: keep.then(|| std::sync::Mutex::new(None)),
    };
    q.contiguous()?.apply_op3(&k.contiguous()?, &v.contiguous()?, op)
}

struct AttnOp {
    /// The additive mask broadcast (by strides) to (B, H, T, S).
    mask: Option<Tensor>,
    /// The forward pass's probabilities, block after block, taken by the backward pass
    /// (`None`: not kept, the backward recomputes them).
    probs: Option<std::sync::Mutex<Option<Vec<f32>>>>,
}

/// Shapes of one attention call.
#[derive(Clone, Copy)]
struct AttnDims {
    b: usize,
    h: usize,
    hkv: usize,
    t: usize,
    s: usize,
    d: usize,
}

impl AttnOp {
    /// Runs `f(mask_data, strides)`; strides are (b, h, t, s) element strides, offset included.
    fn with_mask<R>(&self, f: impl FnOnce(MaskView<'_>) -> Result<R>) -> Result<R> {
        match &self.mask {
            None => f(None),
            Some(m) => {
                let (st, l) = m.storage_and_layout();
                let data = match &*st {
                    Storage::Cpu(CpuStorage::F32(v)) => v.as_slice(),
                    _ => bail!("attention: the mask must be an f32 CPU tensor"),
                };
                let s = l.stride();
                f(Some((data, [s[0], s[1], s[2], s[3]], l.start_offset())))
            }
        }
    }

    fn forward(&self, dims: AttnDims, q: &[f32], k: &[f32], v: &[f32]) -> Result<Vec<f32>> {
        let (out, probs) =
            self.with_mask(|mask| Ok(attn_forward(dims, q, k, v, mask, self.probs.is_some())))?;
        if let (Some(slot), Some(probs)) = (&self.probs, probs) {
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(probs);
        }
        Ok(out)
    }

    /// (dq, dk, dv), from the kept probabilities or recomputing them; `o` is the forward
    /// output, `go` its gradient.
    #[allow(clippy::type_complexity)]
    fn backward(
        &self,
        dims: AttnDims,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        o: &[f32],
        go: &[f32],
    ) -> Result<(Vec<f32>, Vec<f32>, Vec<f32>)> {
        let kept = self
            .probs
            .as_ref()
            .and_then(|slot| slot.lock().unwrap_or_else(|e| e.into_inner()).take())
            .filter(|p| p.len() == dims.b * dims.h * dims.t * dims.s);
        self.with_mask(|mask| Ok(attn_backward(dims, q, k, v, o, go, mask, kept.as_deref())))
    }
}

/// The work is done per (batch, KV head): the query heads that share a KV head are adjacent in
/// (B, H, T, d), so their rows form one (group·T)×d block and every product is one GEMM.
impl AttnDims {
    fn group(&self) -> usize {
        self.h / self.hkv
    }
    /// Element range of the query (and output) block of KV head `kh` in batch `bi`.
    fn q_block(&self, bi: usize, kh: usize) -> std::ops::Range<usize> {
        let first = bi * self.h + kh * self.group();
        first * self.t * self.d..(first + self.group()) * self.t * self.d
    }
    /// Offset of row (batch `bi`, position `ti`, query head `hq`) in a (B, T, H, d) tensor.
    fn bthd_row(&self, bi: usize, ti: usize, hq: usize) -> usize {
        ((bi * self.t + ti) * self.h + hq) * self.d
    }
    /// Element range of the key (and value) block of KV head `kh` in batch `bi`.
    fn kv_block(&self, bi: usize, kh: usize) -> std::ops::Range<usize> {
        let kv = bi * self.hkv + kh;
        kv * self.s * self.d..(kv + 1) * self.s * self.d
    }
}

/// Probabilities of one block: `p` holds q·kᵀ for the (group·T) query rows of KV head `kh`;
/// adds the mask and takes the softmax of each row in place.
#[inline(always)]
fn softmax_block(dims: AttnDims, p: &mut [f32], mask: MaskView<'_>, bi: usize, kh: usize) {
    let (t, s) = (dims.t, dims.s);
    for (r, row) in p.chunks_exact_mut(s).enumerate() {
        if let Some((m, st, off)) = mask {
            let hi = kh * dims.group() + r / t;
            let base = off + bi * st[0] + hi * st[1] + (r % t) * st[2];
            if st[3] == 1 {
                for (x, &mv) in row.iter_mut().zip(&m[base..base + s]) {
                    *x += mv;
                }
            } else {
                for (si, x) in row.iter_mut().enumerate() {
                    *x += m[base + si * st[3]];
                }
            }
        }
        softmax_in_place(row);
    }
}

simd_dispatch!(attn_forward => attn_forward_generic(
    dims: AttnDims, q: &[f32], k: &[f32], v: &[f32], mask: MaskView<'_>, keep: bool) -> (Vec<f32>, Option<Vec<f32>>));

/// The output and, with `keep`, the probabilities of every block (in block order).
#[inline(always)]
fn attn_forward_generic(
    dims: AttnDims,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: MaskView<'_>,
    keep: bool,
) -> (Vec<f32>, Option<Vec<f32>>) {
    let AttnDims { b, hkv, t, s, d, .. } = dims;
    let rows = dims.group() * t;
    let block = rows * s;
    let mut out = Blocks::new(q.len());
    let mut kept = keep.then(|| Blocks::new(b * hkv * block));
    let mut scratch = if keep { Vec::new() } else { vec![0f32; block] };
    for bi in 0..b {
        for kh in 0..hkv {
            let (qr, kvr) = (dims.q_block(bi, kh), dims.kv_block(bi, kh));
            let (qm, km) = (Mat::rows(&q[qr.clone()], d), Mat::transposed(&k[kvr.clone()], d));
            let p: &mut [f32] = match &mut kept {
                Some(all) => all.product((bi * hkv + kh) * block, rows, d, s, qm, km),
                None => {
                    sgemm(rows, d, s, qm, km, 0.0, &mut scratch);
                    &mut scratch
                }
            };
            softmax_block(dims, p, mask, bi, kh);
            // Output rows go to (B, T, H, d): head `hq`'s rows are H·d apart.
            for gi in 0..dims.group() {
                let hq = kh * dims.group() + gi;
                let p_head = Mat::rows(&p[gi * t * s..(gi + 1) * t * s], s);
                out.product_ld(
                    dims.bthd_row(bi, 0, hq),
                    dims.h * d,
                    t,
                    s,
                    d,
                    p_head,
                    Mat::rows(&v[kvr.clone()], d),
                );
            }
        }
    }
    (out.finish(), kept.map(Blocks::finish))
}

simd_dispatch!(attn_backward => attn_backward_generic(
    dims: AttnDims, q: &[f32], k: &[f32], v: &[f32], o: &[f32], go: &[f32], mask: MaskView<'_>,
    kept: Option<&[f32]>) -> (Vec<f32>, Vec<f32>, Vec<f32>));

/// With P the probabilities and δ_r = ⟨go_r, o_r⟩: dS = P ⊙ (go·vᵀ − δ), dq = dS·k,
/// dk = dSᵀ·q, dv = Pᵀ·go (the query heads of a group summed in a fixed order). o and go are
/// (B, T, H, d); P comes from the forward pass when kept, else it is recomputed per block.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attn_backward_generic(
    dims: AttnDims,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    o: &[f32],
    go: &[f32],
    mask: MaskView<'_>,
    kept: Option<&[f32]>,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let AttnDims { b, hkv, t, s, d, .. } = dims;
    let rows = dims.group() * t;
    let mut dq = Blocks::new(q.len());
    let mut dk = Blocks::new(k.len());
    let mut dv = Blocks::new(v.len());
    let block = rows * s;
    let mut scratch = vec![0f32; if kept.is_some() { 0 } else { block }];
    let mut ds = vec![0f32; block];
    let (h, group) = (dims.h, dims.group());
    for bi in 0..b {
        for kh in 0..hkv {
            let (qr, kvr) = (dims.q_block(bi, kh), dims.kv_block(bi, kh));
            let qb = &q[qr.clone()];
            let (kb, vb) = (&k[kvr.clone()], &v[kvr.clone()]);
            let p: &[f32] = match kept {
                Some(all) => &all[(bi * hkv + kh) * block..][..block],
                None => {
                    sgemm(
                        rows,
                        d,
                        s,
                        Mat::rows(qb, d),
                        Mat::transposed(kb, d),
                        0.0,
                        &mut scratch,
                    );
                    softmax_block(dims, &mut scratch, mask, bi, kh);
                    &scratch
                }
            };
            // o and its gradient are (B, T, H, d): head hq's rows are H·d apart.
            let grad_rows = |hq: usize| Mat {
                data: &go[dims.bthd_row(bi, 0, hq)..],
                row_stride: h * d,
                col_stride: 1,
            };
            for gi in 0..group {
                let hq = kh * group + gi;
                let ds_head = &mut ds[gi * t * s..(gi + 1) * t * s];
                sgemm(t, d, s, grad_rows(hq), Mat::transposed(vb, d), 0.0, ds_head);
                for ti in 0..t {
                    let row = dims.bthd_row(bi, ti, hq);
                    let delta = dot(&go[row..row + d], &o[row..row + d]);
                    let r = gi * t + ti;
                    let (pr, dr) = (&p[r * s..(r + 1) * s], &mut ds[r * s..(r + 1) * s]);
                    for (x, &pv) in dr.iter_mut().zip(pr) {
                        *x = pv * (*x - delta);
                    }
                }
            }
            dq.product(qr.start, rows, s, d, Mat::rows(&ds, s), Mat::rows(kb, d));
            dk.product(kvr.start, s, rows, d, Mat::transposed(&ds, s), Mat::rows(qb, d));
            // dV = Σ over the group's heads of Pᵀ·dO (the first writes, the rest add).
            let dv_block = dv.product(
                kvr.start,
                s,
                t,
                d,
                Mat::transposed(&p[..t * s], s),
                grad_rows(kh * group),
            );
            for gi in 1..group {
                let p_head = Mat::transposed(&p[gi * t * s..(gi + 1) * t * s], s);
                sgemm(s, t, d, p_head, grad_rows(kh * group + gi), 1.0, dv_block);
            }
        }
    }
    (dq.finish(), dk.finish(), dv.finish())
}

fn attn_dims(lq: &Layout, lk: &Layout) -> Result<AttnDims> {
    let (qd, kd) = (lq.dims(), lk.dims());
    if qd.len() != 4 || kd.len() != 4 {
        bail!("attention: expected rank-4 q and k");
    }
    Ok(AttnDims {
        b: qd[0],
        h: qd[1],
        t: qd[2],
        d: qd[3],
        hkv: kd[1],
        s: kd[2],
    })
}

impl CustomOp3 for AttnOp {
    fn name(&self) -> &'static str {
        "ember-attention"
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
        let dims = attn_dims(l1, l2)?;
        let out = self.forward(dims, cpu_slice(s1, l1)?, cpu_slice(s2, l2)?, cpu_slice(s3, l3)?)?;
        Ok((
            CpuStorage::F32(out),
            Shape::from((dims.b, dims.t, dims.h, dims.d)),
        ))
    }
    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let dims = attn_dims(q.layout(), k.layout())?;
        let (dq, dk, dv) = with_data(q, |qd| {
            with_data(k, |kd| {
                with_data(v, |vd| {
                    with_data(res, |od| {
                        with_data(g, |gd| self.backward(dims, qd, kd, vd, od, gd))
                    })
                })
            })
        })?;
        Ok((
            Some(cpu_tensor(dq, q.shape())?),
            Some(cpu_tensor(dk, k.shape())?),
            Some(cpu_tensor(dv, v.shape())?),
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// Log-softmax + label-smoothed cross-entropy + z-loss.
// ---------------------------------------------------------------------------------------------

/// Per-token losses of logits (N, V) as a (2, N) tensor: row 0 is the training objective
/// mask·[(1−ε)·nll + ε·mean_v(−log p) + z·(log Z)²], row 1 is mask·nll. The smoothing and z
/// terms are left out when ε or z is 0, as in the unfused form.
pub fn cross_entropy_unfused(
    logits: &Tensor,
    targets: &Tensor,
    mask: &Tensor,
    label_smoothing: f64,
    z_loss: f64,
) -> Result<Tensor> {
    let max = logits.max_keepdim(D::Minus1)?.detach();
    let shifted = logits.broadcast_sub(&max)?;
    let lse = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    let log_probs = shifted.broadcast_sub(&lse)?;
    let nll = log_probs.gather(&targets.unsqueeze(1)?, 1)?.squeeze(1)?.neg()?;
    let mut per_token = if label_smoothing > 0.0 {
        let uniform = log_probs.mean(D::Minus1)?.neg()?;
        ((&nll * (1.0 - label_smoothing))? + (uniform * label_smoothing)?)?
    } else {
        nll.clone()
    };
    if z_loss > 0.0 {
        let log_z = (lse + &max)?.squeeze(1)?;
        per_token = (per_token + (log_z.sqr()? * z_loss)?)?;
    }
    Tensor::stack(&[(per_token * mask)?, (nll * mask)?], 0)
}

/// Fused [`cross_entropy_unfused`] for f32 CPU logits; `targets` (N) integer ids and `mask` (N)
/// are constants (no gradient).
pub fn cross_entropy(
    logits: &Tensor,
    targets: &Tensor,
    mask: &Tensor,
    label_smoothing: f64,
    z_loss: f64,
) -> Result<Tensor> {
    if !fast(logits) {
        return cross_entropy_unfused(logits, targets, mask, label_smoothing, z_loss);
    }
    let (n, vocab) = logits.dims2()?;
    let targets: Vec<u32> = targets.to_dtype(DType::U32)?.to_vec1()?;
    let mask: Vec<f32> = mask.to_dtype(DType::F32)?.to_vec1()?;
    if targets.len() != n || mask.len() != n {
        bail!(
            "cross_entropy: {n} rows but {} targets and {} mask entries",
            targets.len(),
            mask.len()
        );
    }
    if let Some(&bad) = targets.iter().find(|&&t| t as usize >= vocab) {
        bail!("cross_entropy: target {bad} is outside the vocabulary of {vocab}");
    }
    let op = CrossEntropyOp {
        targets: Arc::new(targets),
        mask: Arc::new(mask),
        smoothing: label_smoothing as f32,
        z: z_loss as f32,
        row_stats: std::sync::Mutex::new(None),
    };
    logits.contiguous()?.apply_op1(op)
}

struct CrossEntropyOp {
    targets: Arc<Vec<u32>>,
    mask: Arc<Vec<f32>>,
    smoothing: f32,
    z: f32,
    /// (max, log Σ exp(x − max)) of every row, saved by the forward pass for the backward.
    row_stats: std::sync::Mutex<Option<Arc<Vec<(f32, f32)>>>>,
}

/// (max, lse of shifted logits) of one row; `scratch` (same length) receives exp(row − max).
#[inline(always)]
fn ce_row_stats(row: &[f32], scratch: &mut [f32]) -> (f32, f32) {
    let max = max_of(row);
    // Exponentials first, then the sum: a fused loop with a reduction does not vectorise.
    for (e, &x) in scratch.iter_mut().zip(row) {
        *e = exp_fast(x - max);
    }
    (max, sum(scratch).ln())
}

simd_dispatch!(ce_forward => ce_forward_generic(op: &CrossEntropyOp, x: &[f32], v: usize)
    -> (Vec<f32>, Vec<(f32, f32)>));

/// Rows 0 and 1 of the (2, N) output, and each row's (max, lse).
#[inline(always)]
fn ce_forward_generic(op: &CrossEntropyOp, x: &[f32], v: usize) -> (Vec<f32>, Vec<(f32, f32)>) {
    let n = x.len() / v;
    let mut out = vec![0f32; 2 * n];
    let mut stats = Vec::with_capacity(n);
    let mut scratch = vec![0f32; v];
    for (i, row) in x.chunks_exact(v).enumerate() {
        let (max, lse) = ce_row_stats(row, &mut scratch);
        stats.push((max, lse));
        let nll = -((row[op.targets[i] as usize] - max) - lse);
        let mut obj = nll;
        if op.smoothing > 0.0 {
            // mean_v(−log p) = lse − mean_v(shifted)
            let mean_lp = (sum(row) / v as f32 - max) - lse;
            obj = nll * (1.0 - op.smoothing) + (-mean_lp) * op.smoothing;
        }
        if op.z > 0.0 {
            let log_z = lse + max;
            obj += log_z * log_z * op.z;
        }
        out[i] = obj * op.mask[i];
        out[n + i] = nll * op.mask[i];
    }
    (out, stats)
}

simd_dispatch!(ce_backward => ce_backward_generic(
    op: &CrossEntropyOp, x: &[f32], g: &[f32], v: usize, stats: Option<&[(f32, f32)]>) -> Vec<f32>);

#[inline(always)]
fn ce_backward_generic(
    op: &CrossEntropyOp,
    x: &[f32],
    g: &[f32],
    v: usize,
    stats: Option<&[(f32, f32)]>,
) -> Vec<f32> {
    let n = x.len() / v;
    let mut dx = vec![0f32; x.len()];
    let uniform = 1.0 / v as f32;
    for (i, (row, drow)) in x.chunks_exact(v).zip(dx.chunks_exact_mut(v)).enumerate() {
        let (g_obj, g_nll) = (g[i] * op.mask[i], g[n + i] * op.mask[i]);
        if g_obj == 0.0 && g_nll == 0.0 {
            continue;
        }
        let (max, lse) = match stats {
            Some(s) => s[i],
            None => ce_row_stats(row, drow),
        };
        // d/dl of each term: nll → p − onehot; mean(−log p) → p − 1/V; log²Z → 2·logZ·p.
        let w_nll = g_obj * (1.0 - op.smoothing.max(0.0)) + g_nll;
        let w_unif = if op.smoothing > 0.0 {
            g_obj * op.smoothing
        } else {
            0.0
        };
        let w_z = if op.z > 0.0 {
            g_obj * 2.0 * op.z * (lse + max)
        } else {
            0.0
        };
        let w_p = w_nll + w_unif + w_z;
        let shift = max + lse;
        let offset = w_unif * uniform;
        for (d, &x) in drow.iter_mut().zip(row) {
            *d = exp_fast(x - shift) * w_p - offset;
        }
        drow[op.targets[i] as usize] -= w_nll;
    }
    dx
}

impl CustomOp1 for CrossEntropyOp {
    fn name(&self) -> &'static str {
        "ember-cross-entropy"
    }
    fn cpu_fwd(&self, st: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = cpu_slice(st, l)?;
        let (n, v) = l.shape().dims2()?;
        let (out, stats) = ce_forward(self, x, v);
        *self.row_stats.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(stats));
        Ok((CpuStorage::F32(out), Shape::from((2, n))))
    }
    fn bwd(&self, x: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        let (n, v) = x.dims2()?;
        let stats = self.row_stats.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let stats = stats.filter(|s| s.len() == n);
        let dx = with_data(x, |x| {
            with_data(g, |g| {
                Ok(ce_backward(self, x, g, v, stats.as_ref().map(|s| s.as_slice())))
            })
        })?;
        Ok(Some(cpu_tensor(dx, x.shape())?))
    }
}

#[cfg(test)]
mod tests {
    use super::exp_fast;

    #[test]
    fn exp_fast_is_within_a_few_ulp_of_exp_over_the_whole_range() {
        let mut worst = 0f64;
        let mut x = -87.3f32;
        while x < 88.0 {
            let exact = (x as f64).exp();
            let rel = ((exp_fast(x) as f64 - exact) / exact).abs();
            worst = worst.max(rel);
            x += 0.0137;
        }
        assert!(
            worst < 4.0 * f32::EPSILON as f64,
            "worst relative error {worst:e}"
        );
        assert_eq!(exp_fast(0.0), 1.0);
    }

    #[test]
    fn exp_fast_saturates_and_propagates_nan() {
        assert_eq!(exp_fast(-87.31), 0.0);
        assert_eq!(exp_fast(-1e30), 0.0);
        assert_eq!(exp_fast(f32::NEG_INFINITY), 0.0);
        assert!(exp_fast(f32::INFINITY).is_finite() && exp_fast(f32::INFINITY) > 1e38);
        assert!(exp_fast(f32::NAN).is_nan());
    }
}

#[cfg(test)]
mod timing {
    /// Not a test: `cargo test --release -p ember-model --lib kernels::timing -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn print_elementwise_rates() {
        let n = 768 * 512;
        let x: Vec<f32> = (0..n).map(|i| ((i % 97) as f32 - 48.0) / 16.0).collect();
        let g: Vec<f32> = (0..n).map(|i| ((i % 89) as f32 - 44.0) / 32.0).collect();
        let time = |name: &str, f: &dyn Fn() -> usize| {
            let mut best = f64::MAX;
            for _ in 0..20 {
                let t = std::time::Instant::now();
                std::hint::black_box(f());
                best = best.min(t.elapsed().as_secs_f64());
            }
            println!("{name:>16}: {:.3} ns/element", best / n as f64 * 1e9);
        };
        time("gelu_fwd", &|| super::gelu_fwd(&x).len());
        time("gelu_fwd_keep", &|| super::gelu_fwd_keep(&x).0.len());
        time("gelu_bwd", &|| super::gelu_bwd(&x, &g).len());
        time("mul", &|| super::mul(&x, &g).len());
    }
}
