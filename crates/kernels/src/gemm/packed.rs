//! What the packed products with matrixmultiply's bits (the `avx2` and
//! `matrixmultiply_order` modules) share: matrixmultiply's C ← β·C, and a thread's scratch for
//! packed operands.

/// matrixmultiply's C ← β·C where k is zero: zeros where β is zero (C never read then).
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
