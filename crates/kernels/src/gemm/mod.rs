//! Single-precision GEMM for the small matrices of small transformers.
//!
//! A packed GEMM (matrixmultiply, BLAS) copies both operands into kernel-shaped panels before
//! multiplying. At d_model = 128 that copy is not small: in nanoGPT's CPU shape it was 13% of a
//! training step, most of it gathering activations whose reduction dimension is the contiguous
//! one. When B fits in L2 packing buys little, so [`gemm`] multiplies in place instead: an
//! AVX-512 kernel broadcasts A's elements straight from its rows and loads B's rows as vectors,
//! keeping an 8×32 tile of C in sixteen registers. B must be row-contiguous; a transposed B (a
//! weight in x·Wᵀ, K in q·Kᵀ) is transposed into a scratch buffer first, which costs k·n copies
//! against m·k·n multiply-adds. A column-major A (gᵀ in dW = gᵀ·x, a reduction over all tokens),
//! a large B, or a CPU without AVX-512 go to matrixmultiply: for the first, its packing is a
//! plain copy and it measured faster than the in-place kernel (`timing` below).
//!
//! The kernel sums over k in order, one fused multiply-add per term, so results are the same
//! on every run.

#[cfg(test)]
mod tests;
#[cfg(test)]
mod timing;
#[cfg(target_arch = "x86_64")]
mod x86;

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

    /// The transpose of a row-major matrix with `cols` columns.
    pub fn transposed(data: &'a [f32], cols: usize) -> Self {
        Self {
            data,
            row_stride: 1,
            col_stride: cols,
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
        r == 0 || c == 0 || (r - 1) * self.row_stride + (c - 1) * self.col_stride < self.data.len()
    }
}

/// `C = A·B + beta·C` for A (m×k), B (k×n) and a row-major C (m×n), single-threaded.
///
/// [`gemm`] multiplies small operands in place with an AVX-512 kernel and hands the rest
/// to matrixmultiply's packed kernels (1.6–1.8× faster than the gemm crate behind candle's
/// matmul at our shapes, see docs/performance.md); one thread with a fixed order of summation
/// gives the same bits on every run.
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

/// `A·B` for A (m×k) and B (k×n) into a new row-major (m×n) vector (no zero-fill first).
pub(crate) fn product(m: usize, k: usize, n: usize, a: Mat<'_>, b: Mat<'_>) -> Vec<f32> {
    let mut c = Blocks::new(m * n);
    c.product(0, m, k, n, a, b);
    c.finish()
}

/// A vector assembled from disjoint blocks, each written in full — by a β = 0 product (which
/// writes every element of its block without reading it) or by the caller — so it needs no
/// zero-fill first.
pub(crate) struct Blocks {
    data: Vec<f32>,
    len: usize,
    written: usize,
}

impl Blocks {
    pub fn new(len: usize) -> Self {
        Self {
            data: Vec::with_capacity(len),
            len,
            written: 0,
        }
    }

    /// `A·B` (m×k times k×n) into rows of n elements starting at `at`, `ldc` apart.
    #[allow(clippy::too_many_arguments)]
    pub fn product_ld(
        &mut self,
        at: usize,
        ldc: usize,
        m: usize,
        k: usize,
        n: usize,
        a: Mat<'_>,
        b: Mat<'_>,
    ) {
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
                gemm(m, k, n, a.operand(), b.operand(), 0.0, c, ldc);
            }
        }
        self.written += m * n;
    }

    /// `A·B` (m×k times k×n) into elements `at..at + m·n`; returns them.
    pub fn product(&mut self, at: usize, m: usize, k: usize, n: usize, a: Mat<'_>, b: Mat<'_>) -> &mut [f32] {
        self.product_ld(at, n, m, k, n, a, b);
        // SAFETY: product_ld wrote (and bounds-checked) these m·n contiguous elements.
        unsafe { std::slice::from_raw_parts_mut(self.data.as_mut_ptr().add(at), m * n) }
    }

    /// Elements `at..at + len`, to be written by the caller (counted as written).
    pub fn row(&mut self, at: usize, len: usize) -> &mut [std::mem::MaybeUninit<f32>] {
        self.written += len;
        &mut self.data.spare_capacity_mut()[at..at + len]
    }

    /// The vector, once disjoint blocks have covered it.
    pub fn finish(mut self) -> Vec<f32> {
        assert_eq!(self.written, self.len, "blocks do not cover the vector");
        // SAFETY: disjoint blocks (the callers' block ranges partition the vector) wrote
        // `len` elements in all, so every element is initialised.
        unsafe { self.data.set_len(self.len) };
        self.data
    }
}

/// A raw operand of [`gemm`]: a pointer with element strides for rows and columns.
#[derive(Clone, Copy)]
pub(crate) struct Operand {
    pub ptr: *const f32,
    pub row_stride: usize,
    pub col_stride: usize,
}

#[cfg(test)]
impl Operand {
    /// Row-major data with `cols` columns.
    fn rows(data: &[f32], cols: usize) -> Self {
        Self {
            ptr: data.as_ptr(),
            row_stride: cols,
            col_stride: 1,
        }
    }
    /// The transpose of row-major data with `cols` columns.
    fn transposed(data: &[f32], cols: usize) -> Self {
        Self {
            ptr: data.as_ptr(),
            row_stride: 1,
            col_stride: cols,
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

/// [`gemm`], with the in-place kernel allowed or not (the tests run both paths).
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
    #[cfg(target_arch = "x86_64")]
    if in_place
        && a.col_stride == 1
        && k * n <= L2_FLOATS
        && k > 0
        && std::is_x86_feature_detected!("avx512f")
    {
        if b.col_stride == 1 {
            x86::avx512::gemm(m, k, n, a, b.ptr, b.row_stride, beta, c, ldc);
            return;
        }
        // B row-contiguous after a k·n transpose: worth it when m is at least a tile.
        if m >= 8 {
            let bt = transpose(k, n, b);
            x86::avx512::gemm(m, k, n, a, bt.as_ptr(), n, beta, c, ldc);
            return;
        }
    }
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
