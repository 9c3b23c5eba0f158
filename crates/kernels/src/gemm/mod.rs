//! Single-precision GEMM for the small matrices of small transformers.
//!
//! A packed GEMM (matrixmultiply, BLAS) copies both operands into kernel-shaped panels before
//! multiplying. At d_model = 128 that copy is not small: in nanoGPT's CPU shape it was 13% of a
//! training step, most of it gathering activations whose reduction dimension is the contiguous
//! one. When B fits in L2 packing buys little, so [`gemm`] multiplies in place instead: an
//! AVX-512 kernel broadcasts A's elements straight from its rows and loads B's rows as vectors,
//! keeping an 8×32 tile of C in sixteen registers. From [`STRIPS_MIN_ROWS`] rows of C, B is first
//! packed into 32-column strips (64-byte aligned, zero-padded) and the kernel runs strip by
//! strip, so a strip stays in L1 while A's rows pass and B's loads are sequential, aligned and
//! unmasked: 1.05–1.18× matrixmultiply at multi30k-tiny's shapes, where the kernel reading B
//! where it lies was 0.89–1.05× (`timing` below); 1.04× (multi30k-tiny) to 1.06×
//! (shakespeare-char) per training step. Below that many rows, a row-contiguous B is read where
//! it lies and a transposed B (a weight in x·Wᵀ, K in q·Kᵀ) is transposed into a scratch buffer
//! first. Either copy costs k·n against m·k·n multiply-adds. A column-major A (gᵀ in dW = gᵀ·x,
//! a reduction over all tokens) with a small C is read where it lies too, k cut into chunks of
//! [`K_CHUNK`] tokens that run as tasks of their own and are summed in order ([`k_chunked`]):
//! 1.03× per multi30k-tiny step against matrixmultiply, whose tasks each packed all of B. A large
//! B (the output layer packs its W once, [`PackedB`]), a large C with a column-major A (the
//! output layer's dW), or a CPU without AVX-512 go to a packed GEMM with matrixmultiply's bits:
//! with AVX-512, Ember's 12×32 tile (the `matrixmultiply_order` module), 1.05–1.17× faster
//! than matrixmultiply's own (a B of up to 16 MiB; a larger one stays with matrixmultiply); on
//! a CPU without AVX-512 (or with it turned off), Ember's AVX2 kernel (the `avx2` module),
//! 1.07–1.11× faster; elsewhere matrixmultiply itself.
//!
//! The kernel sums over k in order, one fused multiply-add per term, so results are the same
//! on every run; where k is cut into chunks, the cut depends on k alone.
//!
//! Products in bf16 (mixed precision) go to the `bf16` module's `vdpbf16ps` kernel instead,
//! whose steps run on AMX's tiles (the `amx` module) where the CPU has them; `mixed` chooses
//! by [`Precision`](crate::Precision), so the ops never look at it themselves.

#[cfg(all(test, target_arch = "x86_64"))]
mod amx_tests;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(all(test, target_arch = "x86_64"))]
mod avx2_tests;
#[cfg(target_arch = "x86_64")]
mod bf16;
#[cfg(all(test, target_arch = "x86_64"))]
mod bf16_tests;
mod blocks;
mod emulated;
#[cfg(all(test, target_arch = "x86_64"))]
mod emulated_tests;
#[cfg(target_arch = "x86_64")]
mod matrixmultiply_order;
#[cfg(all(test, target_arch = "x86_64"))]
mod matrixmultiply_order_tests;
mod mixed;
#[cfg(target_arch = "x86_64")]
mod packed;
#[cfg(all(test, target_arch = "x86_64"))]
mod rounded_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
pub(crate) mod timing;
#[cfg(target_arch = "x86_64")]
mod x86;

pub(crate) use blocks::Blocks;
pub use emulated::{emulate_bf16_products, BF16_ENV};
pub(crate) use emulated::{round_into as round_into_bf16, to_bf16, Element};
pub use mixed::bf16_emulated;
pub use mixed::bf16_slowdown;
use mixed::gemm_in;
pub(crate) use mixed::{
    bf16_on_amx, bf16_supported, product_from, product_in, sgemm_in, AFrom, Activation, BFrom, PackedIn,
    Part, PartsOf, RowsOfProduct, SharedB,
};

use crate::Precision;

use crate::par::SharedMut;

/// A matrix operand of [`sgemm`]: its elements and the element strides of its rows and columns
/// (a transposed view is the same data with the strides swapped).
#[derive(Clone, Copy)]
pub(crate) struct Mat<'a> {
    pub data: &'a [f32],
    pub row_stride: usize,
    pub col_stride: usize,
}

impl<'a> Mat<'a> {
    /// Row-major with `cols` columns.
    pub fn rows(data: &'a [f32], cols: usize) -> Self {
        Self {
            data,
            row_stride: cols,
            col_stride: 1,
        }
    }

    /// The transpose: the same data with the strides swapped.
    pub fn t(self) -> Self {
        Self {
            data: self.data,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
        }
    }

    /// The view from row `r` on (empty past its data).
    pub fn skip_rows(self, r: usize) -> Self {
        Self {
            data: &self.data[(r * self.row_stride).min(self.data.len())..],
            ..self
        }
    }

    /// The raw operand of [`gemm`].
    fn operand(&self) -> Operand {
        Operand {
            ptr: self.data.as_ptr(),
            row_stride: self.row_stride,
            col_stride: self.col_stride,
        }
    }

    /// Whether every element of an `r`×`c` view lies inside `data`.
    fn fits(&self, r: usize, c: usize) -> bool {
        view_fits(self.data.len(), (self.row_stride, self.col_stride), r, c)
    }
}

/// Whether every element of an `r`×`c` view with `strides` (rows, columns) lies inside `len`
/// elements.
fn view_fits(len: usize, (row_stride, col_stride): (usize, usize), r: usize, c: usize) -> bool {
    r == 0 || c == 0 || (r - 1) * row_stride + (c - 1) * col_stride < len
}

/// A matrix of bf16 values held as their bits (as [`crate::held::Held`] holds them), viewed as
/// [`Mat`] views f32: element (r, c) at `data[r·row_stride + c·col_stride]`. bf16 products take
/// it as B where the f32 view would have been rounded to these same bits. The bits are what
/// [`to_bf16`] makes (no denormals, quiet NaNs), which round to themselves when widened: other
/// bits would be packed as they are, where rounding their widened values changes them.
#[derive(Clone, Copy)]
pub(crate) struct Bits<'a> {
    pub data: &'a [u16],
    pub row_stride: usize,
    pub col_stride: usize,
}

impl Bits<'_> {
    /// The transpose: the same bits with the strides swapped.
    pub fn t(self) -> Self {
        Self {
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..self
        }
    }

    /// Whether every element of an `r`×`c` view lies inside `data`.
    fn fits(&self, r: usize, c: usize) -> bool {
        view_fits(self.data.len(), (self.row_stride, self.col_stride), r, c)
    }
}

/// `C = A·B + beta·C` for A (m×k), B (k×n) and a row-major C (m×n), single-threaded.
///
/// [`gemm`] multiplies small operands in place with an AVX-512 kernel and hands the rest
/// to a packed GEMM with matrixmultiply's sums (1.6–1.8× faster than the gemm crate behind
/// candle's matmul at our shapes, see docs/performance.md); one thread with a fixed order of
/// summation gives the same bits on every run.
pub(crate) fn sgemm(m: usize, k: usize, n: usize, a: Mat<'_>, b: Mat<'_>, beta: f32, c: &mut [f32]) {
    assert!(
        a.fits(m, k) && b.fits(k, n) && c.len() >= m * n,
        "sgemm: operand out of bounds"
    );
    if m == 0 || n == 0 {
        return;
    }
    // SAFETY: the assertion above keeps every element the kernel reads or writes in bounds, and
    // `c` is exclusively borrowed, so it cannot alias `a` or `b`.
    unsafe { gemm(m, k, n, a.operand(), b.operand(), beta, c.as_mut_ptr(), n) }
}

/// B (k×n) packed once into the in-place kernel's strips, for several products with it: the
/// output layer multiplies every block of rows by the same weight, and matrixmultiply would pack
/// that weight again for each block.
pub(crate) struct PackedB {
    #[cfg(target_arch = "x86_64")]
    strips: Strips,
    k: usize,
    n: usize,
}

impl PackedB {
    /// `None` where the in-place kernel does not run (no AVX-512); then use [`sgemm`].
    pub fn new(k: usize, n: usize, b: Mat<'_>) -> Option<Self> {
        assert!(b.fits(k, n), "sgemm: operand out of bounds");
        #[cfg(target_arch = "x86_64")]
        if k > 0 && n > 0 && crate::simd::avx512() {
            // SAFETY: B's k×n view is in bounds (asserted).
            let strips = unsafe { pack_strips(k, n, b.operand()) };
            return Some(Self { strips, k, n });
        }
        None
    }
}

/// [`sgemm`] with B packed beforehand: `C = A·B + beta·C` for a row-major A (m×k) and C (m×n).
/// The same bits as [`sgemm`]'s in-place kernel (each element one chain of multiply-adds in k's
/// order).
pub(crate) fn sgemm_packed(m: usize, a: Mat<'_>, b: &PackedB, beta: f32, c: &mut [f32]) {
    let (k, n) = (b.k, b.n);
    assert!(
        a.col_stride == 1 && a.fits(m, k) && c.len() >= m * n,
        "sgemm: operand out of bounds"
    );
    #[cfg(target_arch = "x86_64")]
    {
        let (a, c) = (a.operand(), SharedMut(c.as_mut_ptr()));
        let strips = SharedMut(b.strips.as_ptr().cast_mut());
        for_each_block(m, blocks_for(m, k, n, m, 8), 8, |r| {
            // SAFETY: operands in bounds (asserted; the strips hold B's k×n); each task writes
            // C's rows `r` only, and C is exclusively borrowed.
            unsafe {
                x86::avx512::gemm_strips(
                    r.len(),
                    k,
                    n,
                    a.skip_rows(r.start),
                    strips.at(0),
                    beta,
                    c.at(r.start * n),
                    n,
                )
            };
        });
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (m, beta, c);
        unreachable!("PackedB::new packs nothing off x86-64");
    }
}

/// `A·B` for A (m×k) and B (k×n) into a new row-major (m×n) vector (no zero-fill first).
pub(crate) fn product(m: usize, k: usize, n: usize, a: Mat<'_>, b: Mat<'_>) -> Vec<f32> {
    let c = Blocks::new(m * n);
    // SAFETY: the only block of a vector no one else can see.
    unsafe { c.product(Precision::F32, 0, m, k, n, a, b) };
    c.finish()
}

/// A raw operand of [`gemm`]: a pointer with element strides for rows and columns.
#[derive(Clone, Copy)]
pub(crate) struct Operand {
    pub ptr: *const f32,
    pub row_stride: usize,
    pub col_stride: usize,
}

// SAFETY: an operand is only read, by tasks of a parallel region its owner outlives.
unsafe impl Send for Operand {}
unsafe impl Sync for Operand {}

impl Operand {
    /// The operand from row `r` on.
    fn skip_rows(self, r: usize) -> Self {
        Self {
            ptr: self.ptr.wrapping_add(r * self.row_stride),
            ..self
        }
    }
    /// The operand from column `c` on.
    fn skip_cols(self, c: usize) -> Self {
        Self {
            ptr: self.ptr.wrapping_add(c * self.col_stride),
            ..self
        }
    }
}

/// Floats of B the in-place kernel may stream from L2 per row tile (1 MiB: half of this
/// machine's 2 MiB L2, leaving room for A's rows and C).
const L2_FLOATS: usize = 1 << 18;

/// `C = A·B + beta·C` for A (m×k), B (k×n) and C row-major (m×n) with row stride `ldc`.
///
/// # Safety
/// Every element of the m×k view of A and the k×n view of B is readable, `c` is valid for
/// reads and writes of the m×n view, and C does not overlap A or B.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm(
    m: usize,
    k: usize,
    n: usize,
    a: Operand,
    b: Operand,
    beta: f32,
    c: *mut f32,
    ldc: usize,
) {
    gemm_with(true, m, k, n, a, b, beta, c, ldc)
}

/// Whether the f32 products that the AVX-512 kernels do not take run on Ember's AVX2 kernel
/// (where the vector unit in use is AVX2: the CPU has AVX2 and FMA, and AVX-512 is absent or
/// turned off) rather than on matrixmultiply's: the same bits either way.
pub(crate) fn f32_on_avx2() -> bool {
    crate::simd::unit() == crate::simd::Unit::Avx2
}

/// Multiply-adds below which a product runs as one task: splitting costs more than it saves.
const PAR_MIN_FMAS: usize = 1 << 18;

/// How many row (or column) blocks to cut a product into: about two per thread, so a slow
/// thread's block can be picked up by another, and only for products large enough to pay.
fn blocks_for(m: usize, k: usize, n: usize, span: usize, align: usize) -> usize {
    if m * k * n < PAR_MIN_FMAS {
        return 1;
    }
    let threads = crate::par::threads();
    if threads <= 1 {
        return 1;
    }
    (2 * threads).min(span.div_ceil(align)).max(1)
}

/// Runs `task(range)` for `0..len` cut into `blocks` ranges whose starts are multiples of
/// `align`, the ranges as parallel tasks.
fn for_each_block(
    len: usize,
    blocks: usize,
    align: usize,
    task: impl Fn(std::ops::Range<usize>) + Sync + Send,
) {
    let size = len.div_ceil(blocks).div_ceil(align) * align;
    let ranges: Vec<_> = (0..len)
        .step_by(size.max(1))
        .map(|s| s..len.min(s + size))
        .collect();
    crate::par::for_each(ranges.len(), |i| task(ranges[i].clone()));
}

/// [`gemm`], with the in-place kernel allowed or not (the tests run both paths).
///
/// Large products are cut into blocks of C's rows (or, when C is wide, of its columns) that run
/// as parallel tasks. Each element of C is still the same sum over k in the same order — the
/// kernels' summation order depends on k alone — so the bits do not depend on the cut.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_with(
    in_place: bool,
    m: usize,
    k: usize,
    n: usize,
    a: Operand,
    b: Operand,
    beta: f32,
    c: *mut f32,
    ldc: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    let c = SharedMut(c);
    #[cfg(target_arch = "x86_64")]
    if in_place
        && a.row_stride == 1
        && b.col_stride == 1
        && m * n <= K_PIECES_MAX_C
        && k > 0
        && crate::simd::avx512()
    {
        k_chunked(m, k, n, a, b, beta, c, ldc);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if in_place && a.col_stride == 1 && k * n <= L2_FLOATS && k > 0 && crate::simd::avx512() {
        // B is packed into strips (from STRIPS_MIN_ROWS rows), or read where it lies when its
        // rows are contiguous, or else transposed (worth it when m is at least a tile); once,
        // before the rows are shared out.
        enum B {
            Strips(Strips),
            Rows(*const f32, usize),
            Transposed(Vec<f32>),
        }
        let packed_b = if m >= STRIPS_MIN_ROWS {
            Some(B::Strips(pack_strips(k, n, b)))
        } else if b.col_stride == 1 {
            Some(B::Rows(b.ptr, b.row_stride))
        } else {
            (m >= 8).then(|| B::Transposed(transpose(k, n, b)))
        };
        if let Some(packed_b) = packed_b {
            let (strips, b_ptr, ldb) = match &packed_b {
                B::Strips(s) => (true, s.as_ptr(), 0),
                B::Rows(ptr, ldb) => (false, *ptr, *ldb),
                B::Transposed(bt) => (false, bt.as_ptr(), n),
            };
            let b_ptr = SharedMut(b_ptr.cast_mut());
            for_each_block(m, blocks_for(m, k, n, m, 8), 8, |r| {
                let (a, c) = (a.skip_rows(r.start), c.at(r.start * ldc));
                // SAFETY: each task writes C's rows `r` only.
                if strips {
                    x86::avx512::gemm_strips(r.len(), k, n, a, b_ptr.at(0), beta, c, ldc);
                } else {
                    x86::avx512::gemm(r.len(), k, n, a, b_ptr.at(0), ldb, beta, c, ldc);
                }
            });
            return;
        }
    }
    #[cfg(target_arch = "x86_64")]
    if in_place && k * n <= matrixmultiply_order::MAX_B_FLOATS && crate::simd::avx512() {
        // matrixmultiply's bits on Ember's 12×32 tile, each block of B packed once for all tasks.
        return matrixmultiply_order::gemm(m, k, n, a, b, beta, c, ldc);
    }
    #[cfg(target_arch = "x86_64")]
    let own_avx2 = f32_on_avx2();
    let packed = |m: usize, n: usize, a: Operand, b: Operand, c: *mut f32| {
        // matrixmultiply's bits either way (the `avx2` module's doc): Ember's AVX2 kernel where
        // the AVX-512 ones are off, matrixmultiply's own (AVX-512 or older) elsewhere.
        #[cfg(target_arch = "x86_64")]
        if own_avx2 {
            return avx2::gemm(m, k, n, a, b, beta, c, ldc);
        }
        by_matrixmultiply(m, k, n, a, b, beta, c, ldc)
    };
    if m >= n {
        let blocks = blocks_for(m, k, n, m, 8);
        #[cfg(target_arch = "x86_64")]
        if own_avx2 && blocks > 1 && k > 0 && k * n <= SHARED_B_MAX_FLOATS {
            // SAFETY: B's k×n view is readable (the caller's contract); the unit is AVX2 (with FMA).
            let b = avx2::PackedB::new(k, n, b);
            for_each_block(m, blocks, 8, |r| {
                // SAFETY: each task writes C's rows `r` only.
                avx2::gemm_packed(r.len(), a.skip_rows(r.start), &b, beta, c.at(r.start * ldc), ldc);
            });
            return;
        }
        for_each_block(m, blocks, 8, |r| {
            // SAFETY: each task writes C's rows `r` only.
            packed(r.len(), n, a.skip_rows(r.start), b, c.at(r.start * ldc));
        });
    } else {
        for_each_block(n, blocks_for(m, k, n, n, 16), 16, |r| {
            // SAFETY: each task writes C's columns `r` only.
            packed(m, r.len(), a, b.skip_cols(r.start), c.at(r.start));
        });
    }
}

/// Elements of B up to which the AVX2 kernel's row blocks share one packed copy of it (16 MiB);
/// a larger B (a wide vocabulary's output layer) is packed by each block a part at a time.
#[cfg(target_arch = "x86_64")]
const SHARED_B_MAX_FLOATS: usize = 1 << 22;

/// `C = A·B + beta·C` by matrixmultiply, on the calling thread.
///
/// # Safety
/// As [`gemm`].
#[allow(clippy::too_many_arguments)]
unsafe fn by_matrixmultiply(
    m: usize,
    k: usize,
    n: usize,
    a: Operand,
    b: Operand,
    beta: f32,
    c: *mut f32,
    ldc: usize,
) {
    matrixmultiply::sgemm(
        m,
        k,
        n,
        1.0,
        a.ptr,
        a.row_stride as isize,
        a.col_stride as isize,
        b.ptr,
        b.row_stride as isize,
        b.col_stride as isize,
        beta,
        c,
        ldc as isize,
        1,
    )
}

/// Elements of C up to which a column-major A (dW = gᵀ·x) is multiplied in place, k cut into
/// [`K_PIECE`]s: C is then small enough to be read and written once per piece.
const K_PIECES_MAX_C: usize = 1 << 16;

/// Rows of k per piece of [`x86::avx512::gemm_k_pieces`].
const K_PIECE: usize = 64;

/// Rows of k per chunk of [`k_chunked`]: a fixed size, so the order of summation (and the bits)
/// depend on k alone, never on the number of threads.
const K_CHUNK: usize = 256;

/// `C = A·B + beta·C` for a column-major A (m×k, as gᵀ in dW = gᵀ·x) and a row-major B, both
/// read where they lie: k is cut into [`K_CHUNK`]s, each chunk's product is a task of its own
/// (the first adds beta·C, the others go to scratch), and the chunks' products are summed into
/// C in chunk order. Cut over C's rows instead, every task would read all of B (the
/// activations, mostly from L3); on 2 threads the two cuts measured alike (1.017× for chunks,
/// 5 pairs), and chunks keep the traffic from growing with the thread count.
///
/// # Safety
/// As [`gemm`]; the CPU has AVX-512.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn k_chunked(
    m: usize,
    k: usize,
    n: usize,
    a: Operand,
    b: Operand,
    beta: f32,
    c: SharedMut<f32>,
    ldc: usize,
) {
    let chunks = k.div_ceil(K_CHUNK).max(1);
    let mut scratch: Vec<f32> = Vec::with_capacity((chunks - 1) * m * n);
    let partials = SharedMut(scratch.as_mut_ptr());
    crate::par::for_each(chunks, |i| {
        let p0 = i * K_CHUNK;
        let (a, b) = (a.skip_cols(p0), b.skip_rows(p0));
        let kc = K_CHUNK.min(k - p0.min(k));
        let (out, ld, beta) = if i == 0 {
            (c.at(0), ldc, beta)
        } else {
            (partials.at((i - 1) * m * n), n, 0.0)
        };
        // SAFETY: chunk 0 writes C, chunk i > 0 the i-th m·n block of the scratch (within its
        // capacity); a β = 0 product writes every element of its block without reading it.
        x86::avx512::gemm_k_pieces(m, kc, n, a, b.ptr, b.row_stride, beta, out, ld, K_PIECE);
    });
    if chunks == 1 {
        return;
    }
    // SAFETY: every element of the chunks' blocks was written above.
    scratch.set_len((chunks - 1) * m * n);
    let partials = &scratch;
    crate::par::for_each_chunk(m, crate::par::rows_per_task(n), |rows| {
        for r in rows {
            // SAFETY: each task writes C's rows `rows` only.
            let c_row = c.slice(r * ldc, n);
            for block in partials.chunks_exact(m * n) {
                crate::simd::add_assign(c_row, &block[r * n..(r + 1) * n]);
            }
        }
    });
}

/// Rows of C from which packing B into strips pays for itself.
const STRIPS_MIN_ROWS: usize = 128;

/// The k×n view `b` packed for [`x86::avx512::gemm_strips`]: strip s holds columns
/// `32s..32s + 32` (zero past n), k rows of 32 floats each, one strip after another.
#[cfg(target_arch = "x86_64")]
unsafe fn pack_strips(k: usize, n: usize, b: Operand) -> Strips {
    let strips = Strips::zeroed(k, n);
    pack_strips_into(k, n, b, strips.as_ptr().cast_mut());
    strips
}

/// [`pack_strips`] into `out` (room for all of n's strips, 64-byte aligned). The lanes past n
/// in the last strip are left as they were: zeros in a zeroed buffer, as [`pack_strips`] gives
/// it; a buffer packed again holds the last block's values there, which kernels compute and
/// never store.
#[cfg(target_arch = "x86_64")]
unsafe fn pack_strips_into(k: usize, n: usize, b: Operand, out: *mut f32) {
    const S: usize = x86::avx512::STRIP;
    let strips = n.div_ceil(S);
    if b.col_stride == 1 {
        for p in 0..k {
            let row = b.ptr.add(p * b.row_stride);
            for s in 0..strips {
                let cols = S.min(n - s * S);
                std::ptr::copy_nonoverlapping(row.add(s * S), out.add((s * k + p) * S), cols);
            }
        }
        return;
    }
    let avx = std::is_x86_feature_detected!("avx");
    for s in 0..strips {
        let cols = S.min(n - s * S);
        let (mut j, mut k8) = (0, 0);
        if b.row_stride == 1 && avx {
            // B transposed (a weight in x·Wᵀ): its columns are rows, 8 × 8 blocks transposed.
            k8 = k / 8 * 8;
            while j + 8 <= cols {
                for p in (0..k8).step_by(8) {
                    let from = b.ptr.add((s * S + j) * b.col_stride + p);
                    x86::avx::transpose8x8(from, b.col_stride, out.add(s * k * S + p * S + j), S);
                }
                j += 8;
            }
        }
        for j in 0..cols {
            let col = b.ptr.add((s * S + j) * b.col_stride);
            let dst = out.add(s * k * S + j);
            let done = if j < cols / 8 * 8 { k8 } else { 0 };
            for p in done..k {
                *dst.add(p * S) = *col.add(p * b.row_stride);
            }
        }
    }
}

/// B packed by [`pack_strips`], starting `skip` floats into `buf`.
#[cfg(target_arch = "x86_64")]
struct Strips {
    buf: Vec<f32>,
    skip: usize,
}

#[cfg(target_arch = "x86_64")]
impl Strips {
    /// Zeros for a k×n B's strips. 16 spare floats to start on a 64-byte boundary: a strip row
    /// is then one cache line pair and no vector load of B splits a line.
    fn zeroed(k: usize, n: usize) -> Self {
        let len = n.div_ceil(x86::avx512::STRIP) * x86::avx512::STRIP * k;
        let buf = vec![0f32; len + 16];
        let skip = buf.as_ptr().align_offset(64).min(16);
        Strips { buf, skip }
    }

    fn as_ptr(&self) -> *const f32 {
        self.buf[self.skip..].as_ptr()
    }
}

/// The k×n view `b` as a row-major vector.
#[cfg(target_arch = "x86_64")]
unsafe fn transpose(k: usize, n: usize, b: Operand) -> Vec<f32> {
    let mut out: Vec<f32> = Vec::with_capacity(k * n);
    let dst = out.as_mut_ptr();
    if b.row_stride == 1 {
        // B is the transpose of a row-major n×k matrix S (row stride `col_stride`): transpose
        // S back in 8×8 register blocks, then the ragged edges element by element.
        let (k8, n8) = (k - k % 8, n - n % 8);
        for j0 in (0..n8).step_by(8) {
            for p0 in (0..k8).step_by(8) {
                x86::avx::transpose8x8(
                    b.ptr.add(j0 * b.col_stride + p0),
                    b.col_stride,
                    dst.add(p0 * n + j0),
                    n,
                );
            }
        }
        for p in 0..k {
            let js = if p < k8 { n8..n } else { 0..n };
            for j in js {
                *dst.add(p * n + j) = *b.ptr.add(p + j * b.col_stride);
            }
        }
    } else {
        for p in 0..k {
            for j in 0..n {
                *dst.add(p * n + j) = *b.ptr.add(p * b.row_stride + j * b.col_stride);
            }
        }
    }
    // Every (p, j) with p < k, j < n was written above.
    out.set_len(k * n);
    out
}
