//! [`Blocks`]: a product's output assembled from disjoint blocks written by parallel tasks.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::{gemm_in, Mat};
use crate::par::SharedMut;
use crate::Precision;

/// A vector assembled from disjoint blocks, each written in full — by a β = 0 product (which
/// writes every element of its block without reading it) or by the caller — so it needs no
/// zero-fill first. Tasks of one parallel region write their blocks through a shared reference;
/// the count of written elements checks at the end that the blocks covered the vector.
pub(crate) struct Blocks {
    data: Vec<f32>,
    ptr: SharedMut<f32>,
    len: usize,
    written: AtomicUsize,
}

impl Blocks {
    pub fn new(len: usize) -> Self {
        let mut data = Vec::with_capacity(len);
        let ptr = SharedMut(data.as_mut_ptr());
        Self {
            data,
            ptr,
            len,
            written: AtomicUsize::new(0),
        }
    }

    /// Panics unless A (m×k), B (k×n) and the m rows of n elements at `at`, `ldc` apart, fit.
    #[allow(clippy::too_many_arguments)]
    fn check(&self, at: usize, ldc: usize, m: usize, k: usize, n: usize, a: &Mat<'_>, b: &Mat<'_>) {
        assert!(
            a.fits(m, k) && b.fits(k, n) && n <= ldc && (m == 0 || at + (m - 1) * ldc + n <= self.len),
            "sgemm: operand out of bounds"
        );
    }

    /// `A·B` (m×k times k×n) in `precision` into rows of n elements starting at `at`, `ldc`
    /// apart.
    ///
    /// # Safety
    /// No other task writes or reads these rows while this runs. (bf16 products on a CPU
    /// without them panic: the ops refuse first, [`Precision::missing_cpu_feature`].)
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn product_ld(
        &self,
        precision: Precision,
        at: usize,
        ldc: usize,
        m: usize,
        k: usize,
        n: usize,
        a: Mat<'_>,
        b: Mat<'_>,
    ) {
        self.check(at, ldc, m, k, n, &a, &b);
        if m == 0 || n == 0 {
            return;
        }
        let c = self.ptr.0.add(at);
        // Operands in bounds (asserted); the rows of C lie in our spare capacity, which no
        // operand borrows. With β = 0 every element of each row is written without being read
        // (matrixmultiply: "If β is zero, then C does not need to be initialized"); for k = 0
        // the fill writes it.
        if k == 0 {
            for r in 0..m {
                std::ptr::write_bytes(c.add(r * ldc), 0, n);
            }
        } else {
            gemm_in(precision, m, k, n, a.operand(), b.operand(), 0.0, c, ldc);
        }
        self.written.fetch_add(m * n, Ordering::Relaxed);
    }

    /// Rows of n elements starting at `at`, `ldc` apart (m of them), written by `write` from
    /// a pointer to the first (element (0, 0) of the m×n view), which must write every one of
    /// them: products over parts of the rows ([`PartsOf::products`]) that together cover it.
    ///
    /// # Safety
    /// As [`product_ld`](Self::product_ld); `write` writes the whole view and nothing else.
    pub unsafe fn write_ld(&self, at: usize, ldc: usize, m: usize, n: usize, write: impl FnOnce(*mut f32)) {
        assert!(
            n <= ldc && (m == 0 || at + (m - 1) * ldc + n <= self.len),
            "sgemm: output rows out of bounds"
        );
        write(self.ptr.0.add(at));
        self.written.fetch_add(m * n, Ordering::Relaxed);
    }

    /// Elements `at..at + len`, which writes of this task covered.
    ///
    /// # Safety
    /// As [`product_ld`](Self::product_ld), for as long as the returned slice lives; every
    /// element was written.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn written(&self, at: usize, len: usize) -> &mut [f32] {
        assert!(at + len <= self.len, "sgemm: output rows out of bounds");
        self.ptr.slice(at, len)
    }

    /// As [`write_ld`](Self::write_ld) for rows an earlier write of the same task covered
    /// (`update` may read them: a β = 1 product).
    ///
    /// # Safety
    /// As [`write_ld`](Self::write_ld); the rows were written before.
    pub unsafe fn update_ld(&self, at: usize, ldc: usize, m: usize, n: usize, update: impl FnOnce(*mut f32)) {
        assert!(
            n <= ldc && (m == 0 || at + (m - 1) * ldc + n <= self.len),
            "sgemm: output rows out of bounds"
        );
        update(self.ptr.0.add(at));
    }

    /// `A·B` (m×k times k×n) in `precision` into elements `at..at + m·n`; returns them.
    ///
    /// # Safety
    /// As [`product_ld`](Self::product_ld), for as long as the returned slice lives.
    #[allow(clippy::mut_from_ref, clippy::too_many_arguments)]
    pub unsafe fn product(
        &self,
        precision: Precision,
        at: usize,
        m: usize,
        k: usize,
        n: usize,
        a: Mat<'_>,
        b: Mat<'_>,
    ) -> &mut [f32] {
        self.product_ld(precision, at, n, m, k, n, a, b);
        // product_ld wrote (and bounds-checked) these m·n contiguous elements.
        self.ptr.slice(at, m * n)
    }

    /// The vector, once disjoint blocks have covered it.
    pub fn finish(mut self) -> Vec<f32> {
        assert_eq!(
            self.written.load(Ordering::Relaxed),
            self.len,
            "blocks do not cover the vector"
        );
        // SAFETY: disjoint blocks (the callers' block ranges partition the vector) wrote
        // `len` elements in all, so every element is initialised.
        unsafe { self.data.set_len(self.len) };
        self.data
    }
}
