//! What the packed products with matrixmultiply's bits (the `avx2` and
//! `matrixmultiply_order` modules) share: matrixmultiply's C ← β·C, a thread's scratch for
//! packed operands, and the packing of a column-major A.

use super::Operand;

/// A column-major A's `mc` × `kc` view (gᵀ in dW = gᵀ·x: a step's rows lie side by side) as
/// panels of `MR` rows, each `kc` steps of `MR` elements (rows past `mc` zero).
#[inline(always)]
pub(super) unsafe fn pack_column_major<const MR: usize>(mc: usize, kc: usize, a: Operand, out: &mut [f32]) {
    debug_assert_eq!(a.row_stride, 1);
    for (q, i) in (0..mc).step_by(MR).enumerate() {
        let panel = &mut out[q * MR * kc..(q + 1) * MR * kc];
        let rows = MR.min(mc - i);
        if rows < MR {
            panel.fill(0.0);
        }
        for p in 0..kc {
            let column = a.ptr.add(i + p * a.col_stride);
            copy_up_to::<MR>(column, panel.as_mut_ptr().add(p * MR), rows);
        }
    }
}

/// `len` ≤ `N` floats from `src` to `dst`; a whole `N` as one fixed-size move (a call to
/// `memmove` per step of k was 11% of a product with a column-major A).
#[inline(always)]
pub(super) unsafe fn copy_up_to<const N: usize>(src: *const f32, dst: *mut f32, len: usize) {
    if len == N {
        dst.cast::<[f32; N]>()
            .write_unaligned(src.cast::<[f32; N]>().read_unaligned());
    } else {
        std::ptr::copy_nonoverlapping(src, dst, len);
    }
}

/// matrixmultiply's C ← β·C: all of a product where k is zero, and the prescaling of C where
/// β is neither 0 nor 1 (its first block of k then adds its sum to round(β·c)); zeros where β
/// is zero (C never read then).
pub(super) unsafe fn scale(m: usize, n: usize, beta: f32, c: *mut f32, ldc: usize) {
    for i in 0..m {
        for j in 0..n {
            let x = c.add(i * ldc + j);
            *x = if beta == 0.0 { 0.0 } else { *x * beta };
        }
    }
}

/// `task` with this thread's scratch of at least `len` floats. Kept between products:
/// allocating and zeroing a megabyte for each product showed in the profile.
pub(super) fn with_scratch<R>(len: usize, task: impl FnOnce(&mut [f32]) -> R) -> R {
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    SCRATCH.with_borrow_mut(|scratch| {
        if scratch.len() < len {
            scratch.resize(len, 0.0);
        }
        task(&mut scratch[..len])
    })
}
