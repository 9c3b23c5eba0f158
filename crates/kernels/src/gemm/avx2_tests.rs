//! The AVX2 kernel gives matrixmultiply's bits: at every layout of A and B, at ragged edges of
//! every block (tile, packed panel, k's blocks of 256), at β zero, one and neither, and
//! without reading C where β is zero.

use super::avx2;
use super::tests::{
    at_strides_gives_matrixmultiplys_bits, by_matrixmultiply, on_threads_gives_matrixmultiplys_bits,
    operands, same_bits, values,
};

/// Both products of (m, k, n) at every layout of A and B and every β, C inside a wider buffer
/// (row stride n + 3) whose other elements must stay as they were: the same bits.
fn same_bits_as_matrixmultiply((m, k, n): (usize, usize, usize)) {
    let (a, b) = (values(m * k, 1), values(k * n, 2));
    let ldc = n + 3;
    for (a_t, b_t) in [(false, false), (false, true), (true, false), (true, true)] {
        for beta in [0.0, 1.0, 0.5] {
            let (ao, bo) = operands(&a, &b, (m, k, n), a_t, b_t);
            let c0 = values(m * ldc, 3);
            let (mut want, mut got) = (c0.clone(), c0.clone());
            by_matrixmultiply((m, k, n), ao, bo, beta, &mut want, ldc);
            // SAFETY: as above; the test runs only where the kernel is available.
            unsafe { avx2::gemm(m, k, n, ao, bo, beta, got.as_mut_ptr(), ldc) };
            let same = same_bits(&want, &got);
            assert!(
                same,
                "({m}, {k}, {n}), A transposed {a_t}, B transposed {b_t}, β {beta}"
            );
        }
    }
}

fn available() -> bool {
    if avx2::available() {
        return true;
    }
    eprintln!("skipped: this CPU has no AVX2 with FMA");
    false
}

#[test]
fn gives_matrixmultiplys_bits_at_every_layout_edge_and_beta() {
    if !available() {
        return;
    }
    // Tiles (6 × 16) whole and ragged, the packed A's 120 rows, k's 256-blocks whole, ragged
    // and several, a single row, column and step.
    for shape in [
        (1, 1, 1),
        (6, 16, 16),
        (7, 5, 17),
        (5, 256, 15),
        (13, 257, 33),
        (121, 300, 40),
        (240, 512, 48),
        (64, 700, 9),
        (3, 1, 1100),
        (130, 64, 1030),
    ] {
        same_bits_as_matrixmultiply(shape);
    }
}

#[test]
fn strided_operands_give_matrixmultiplys_bits() {
    if available() {
        at_strides_gives_matrixmultiplys_bits(|(m, k, n), a, b, beta, c, ldc| {
            // SAFETY: the helper's views lie inside its buffers; C holds m rows of ldc.
            unsafe { avx2::gemm(m, k, n, a, b, beta, c.as_mut_ptr(), ldc) }
        });
    }
}

#[test]
fn beta_zero_never_reads_c_and_k_zero_scales_it() {
    if !available() {
        return;
    }
    let (m, k, n) = (7, 9, 18);
    let (a, b) = (values(m * k, 7), values(k * n, 8));
    let (ao, bo) = operands(&a, &b, (m, k, n), false, false);
    let mut c = vec![f32::NAN; m * n];
    // SAFETY: the operands hold these shapes.
    unsafe { avx2::gemm(m, k, n, ao, bo, 0.0, c.as_mut_ptr(), n) };
    assert!(c.iter().all(|x| x.is_finite()), "a NaN in C leaked through β = 0");
    let mut c = vec![2.0f32; m * n];
    // SAFETY: k = 0 reads neither operand.
    unsafe { avx2::gemm(m, 0, n, ao, bo, 0.5, c.as_mut_ptr(), n) };
    assert!(c.iter().all(|&x| x == 1.0));
    unsafe { avx2::gemm(m, 0, n, ao, bo, 0.0, c.as_mut_ptr(), n) };
    assert!(c.iter().all(|&x| x.to_bits() == 0));
}

/// Sums of −0 (every product underflowing below zero) into C of −0, at β one, zero, −0 and
/// neither, at shapes whose last rows and columns cut matrixmultiply's 8×8 tiles and this
/// kernel's 6×16 ones in different places. matrixmultiply's AVX2 kernel keeps −0 + −0 = −0 in
/// its whole tiles and gives +0 in its cut ones and wherever β is zero, and so must this: the
/// rule is checked as written, and against matrixmultiply itself where it runs that kernel (a
/// CPU without AVX-512; on one with it, matrixmultiply's AVX-512 kernel keeps every −0).
#[test]
fn sums_of_negative_zero_as_matrixmultiplys_avx2_kernel() {
    if !available() {
        return;
    }
    let matrixmultiply_on_avx2 = !std::is_x86_feature_detected!("avx512f");
    for (m, k, n) in [(6, 2, 16), (13, 3, 21), (17, 300, 35)] {
        // a·b = −1e−30 · 1e−30, below f32's smallest subnormal: every sum rounds to −0.
        let a = vec![-1e-30f32; m * k];
        let b = vec![1e-30f32; k * n];
        for beta in [1.0, 0.0, -0.0, 0.5] {
            let (ao, bo) = operands(&a, &b, (m, k, n), false, false);
            let mut got = vec![-0.0f32; m * n];
            // SAFETY: the operands hold these shapes.
            unsafe { avx2::gemm(m, k, n, ao, bo, beta, got.as_mut_ptr(), n) };
            for (at, x) in got.iter().enumerate() {
                let whole_tile = at / n < m / 8 * 8 && at % n < n / 8 * 8;
                let want = if beta != 0.0 && whole_tile { -0.0f32 } else { 0.0 };
                assert_eq!(
                    x.to_bits(),
                    want.to_bits(),
                    "({m}, {k}, {n}), β {beta}, element {at}"
                );
            }
            if matrixmultiply_on_avx2 {
                let mut want = vec![-0.0f32; m * n];
                by_matrixmultiply((m, k, n), ao, bo, beta, &mut want, n);
                let same = same_bits(&want, &got);
                assert!(same, "({m}, {k}, {n}), β {beta}: not matrixmultiply's bits");
            }
        }
    }
}

/// `gemm_with`'s packed path as the ops call it, on 1 and 2 threads (row blocks sharing one
/// packed B, or column blocks packing their own), C inside a wider buffer: matrixmultiply's bits.
/// (Where the AVX-512 kernels are on, that path is matrixmultiply itself.)
#[test]
fn products_on_several_threads_give_matrixmultiplys_bits() {
    if !available() {
        return;
    }
    on_threads_gives_matrixmultiplys_bits(|(m, k, n), a, b, beta, c, ldc| {
        // SAFETY: the operands hold these shapes; C is exclusively borrowed.
        unsafe { super::gemm_with(false, m, k, n, a, b, beta, c.as_mut_ptr(), ldc) }
    });
}

/// B packed once and shared by blocks of C's rows (as `gemm_with` does on several threads):
/// each block's rows get matrixmultiply's bits, with B's blocks of 1,024 columns and of 256
/// steps of k ragged, and B as it lies or transposed.
#[test]
fn b_packed_once_for_row_blocks_gives_matrixmultiplys_bits() {
    if !available() {
        return;
    }
    for (m, k, n) in [(40, 600, 1100), (13, 5, 20), (6, 256, 16)] {
        let (a, b) = (values(m * k, 9), values(k * n, 10));
        let ldc = n + 2;
        for (a_t, b_t) in [(false, false), (false, true), (true, false)] {
            let (ao, bo) = operands(&a, &b, (m, k, n), a_t, b_t);
            let c0 = values(m * ldc, 11);
            let (mut want, mut got) = (c0.clone(), c0);
            // Row blocks of 8, as the ops cut them: matrixmultiply's edges are each block's.
            for start in (0..m).step_by(8) {
                let rows = 8.min(m - start);
                let c = &mut want[start * ldc..];
                by_matrixmultiply((rows, k, n), ao.skip_rows(start), bo, 0.5, c, ldc);
            }
            // SAFETY: the operands hold these shapes; each block writes rows of its own.
            unsafe {
                let packed = avx2::PackedB::new(k, n, bo);
                for start in (0..m).step_by(8) {
                    let rows = 8.min(m - start);
                    let c = got.as_mut_ptr().add(start * ldc);
                    avx2::gemm_packed(rows, ao.skip_rows(start), &packed, 0.5, c, ldc);
                }
            }
            let same = same_bits(&want, &got);
            assert!(same, "({m}, {k}, {n}), A transposed {a_t}, B transposed {b_t}");
        }
    }
}
