//! A matrix rounded to bf16 once for several emulated products ([`Rounded`]), held in bf16's
//! 16 bits a value as the hardware path holds it, and products that read it.

use super::{gemm_packed_parts, round_into, Element, Lines, Packed, SCRATCH};
use crate::par;

/// A rows × cols activation rounded to bf16 for emulated products: the bits of each bf16,
/// row-major, so that it takes the memory it takes where the CPU runs bf16 itself (a product
/// widens them exactly as it gathers them).
pub(crate) struct Rounded {
    rows: usize,
    cols: usize,
    bits: Vec<u16>,
}

impl Rounded {
    /// `x` (rows × cols, row-major) rounded.
    pub(crate) fn new(rows: usize, cols: usize, x: &[f32]) -> Self {
        let len = rows.checked_mul(cols).expect("Rounded: too many elements");
        assert!(x.len() >= len, "Rounded: {rows}×{cols} from {} elements", x.len());
        let x = &x[..len];
        let bits = par::fill(len, par::ELEMENTS_PER_TASK, |range, out| {
            round_into(&x[range], out)
        });
        Self { rows, cols, bits }
    }

    /// A rows × cols matrix made in blocks of rows by `fill(rows, out)` and rounded as it is made
    /// (from scratch of the thread's, so the f32 values never go to memory).
    pub(crate) fn from_rows_with(
        rows: usize,
        cols: usize,
        fill: impl Fn(std::ops::Range<usize>, &mut [std::mem::MaybeUninit<f32>]) + Sync + Send,
    ) -> Self {
        let bits = match cols {
            0 => Vec::new(),
            _ => par::fill(
                rows.checked_mul(cols).expect("Rounded: too many elements"),
                par::rows_per_task(cols) * cols,
                |range, out| {
                    // Taken out, not borrowed, while `fill` runs: a `fill` that ran parallel
                    // tasks could have this thread pick up another block meanwhile.
                    let mut scratch = SCRATCH.with(|s| std::mem::take(&mut *s.borrow_mut()));
                    scratch.resize(range.len(), 0.0);
                    let first = range.start / cols;
                    // SAFETY: f32 and MaybeUninit<f32> share a layout; `fill` writes only
                    // values, so the scratch stays initialised.
                    fill(first..first + range.len() / cols, unsafe {
                        &mut *(scratch.as_mut_slice() as *mut [f32] as *mut [std::mem::MaybeUninit<f32>])
                    });
                    round_into(&scratch, out);
                    SCRATCH.with(|s| *s.borrow_mut() = scratch);
                },
            ),
        };
        Self { rows, cols, bits }
    }

    pub(crate) fn dims(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// The bits as a rows × cols operand (`transposed`: its transpose, cols × rows), checked
    /// against the shape a product reads it as.
    pub(crate) fn lines(&self, (rows, cols): (usize, usize), transposed: bool) -> Lines<u16> {
        let want = if transposed { (cols, rows) } else { (rows, cols) };
        assert_eq!(
            self.dims(),
            want,
            "emulated bf16 product: an operand of another shape"
        );
        let (row_stride, col_stride) = if transposed {
            (1, self.cols)
        } else {
            (self.cols, 1)
        };
        Lines {
            ptr: self.bits.as_ptr(),
            row_stride,
            col_stride,
        }
    }

    /// The values, widened (exact): the tests' view.
    #[cfg(test)]
    pub(crate) fn to_f32(&self) -> Vec<f32> {
        self.bits.iter().map(|&b| b.widen()).collect()
    }
}

/// `A·B` (m×k times k×n) into a new row-major m×n vector, A's and B's views f32 values or
/// rounded bits.
///
/// # Safety
/// Every element of A's m×k view and of B's k×n view is readable.
pub(crate) unsafe fn product<T: Element, U: Element>(
    m: usize,
    k: usize,
    n: usize,
    a: Lines<T>,
    b: Lines<U>,
) -> Vec<f32> {
    let mut c = vec![0f32; m * n];
    let part = (0..m, 0..n, 0..k);
    gemm_packed_parts(
        a,
        &Packed::new(k, n, b),
        std::slice::from_ref(&part),
        0.0,
        c.as_mut_ptr(),
        n,
    );
    c
}
