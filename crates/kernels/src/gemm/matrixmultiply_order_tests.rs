//! Products in matrixmultiply's order on the AVX-512 kernel give matrixmultiply's bits (its
//! AVX-512 kernel's, which it runs on this CPU): at every layout of A and B and at strides of
//! neither, at ragged edges of every block (tile, strip, k's blocks of 256), at β zero, one and
//! neither, sums of −0 included, on one thread and two, and without reading C where β is zero.

use super::tests::{
    at_strides_gives_matrixmultiplys_bits, by_matrixmultiply, on_threads_gives_matrixmultiplys_bits,
    operands, same_bits, values,
};
use super::{matrixmultiply_order, Operand};
use crate::par::SharedMut;

/// C = A·B + β·C in matrixmultiply's order on the AVX-512 kernel.
fn in_its_order(
    (m, k, n): (usize, usize, usize),
    a: Operand,
    b: Operand,
    beta: f32,
    c: &mut [f32],
    ldc: usize,
) {
    let c = SharedMut(c.as_mut_ptr());
    // SAFETY: as above; the tests run only where the CPU has AVX-512F.
    unsafe { matrixmultiply_order::gemm(m, k, n, a, b, beta, c, ldc) }
}

/// Whether matrixmultiply runs its AVX-512 kernel here, whose bits these products give (the
/// AVX-512 unit in use: `EMBER_CPU_VECTOR_UNIT` may turn it off, as in training).
fn available() -> bool {
    if crate::simd::avx512() {
        return true;
    }
    eprintln!("skipped: the AVX-512 unit is not in use on this CPU");
    false
}

#[test]
fn gives_matrixmultiplys_bits_at_every_layout_edge_and_beta() {
    if !available() {
        return;
    }
    // Tiles (12 × 32) whole and ragged, blocks of 96 rows whole and ragged, k's 256-blocks
    // whole, ragged and several, a single row, column and step; the last three large enough
    // to be cut into tasks, over rows or columns.
    for (m, k, n) in [
        (1, 1, 1),
        (12, 32, 32),
        (96, 40, 64),
        (7, 5, 17),
        (5, 256, 15),
        (13, 257, 33),
        (121, 300, 40),
        (64, 700, 9),
        (3, 1, 1100),
        (130, 64, 1030),
        (300, 600, 100),
        (40, 520, 700),
    ] {
        let (a, b) = (values(m * k, 1), values(k * n, 2));
        let ldc = n + 3;
        for (a_t, b_t) in [(false, false), (false, true), (true, false), (true, true)] {
            for beta in [0.0, 1.0, 0.5] {
                let (ao, bo) = operands(&a, &b, (m, k, n), a_t, b_t);
                let c0 = values(m * ldc, 3);
                let (mut want, mut got) = (c0.clone(), c0);
                by_matrixmultiply((m, k, n), ao, bo, beta, &mut want, ldc);
                in_its_order((m, k, n), ao, bo, beta, &mut got, ldc);
                assert!(
                    same_bits(&want, &got),
                    "({m}, {k}, {n}), A transposed {a_t}, B transposed {b_t}, β {beta}"
                );
            }
        }
    }
}

#[test]
fn strided_operands_give_matrixmultiplys_bits() {
    if available() {
        at_strides_gives_matrixmultiplys_bits(in_its_order);
    }
}

#[test]
fn on_two_threads_as_on_one() {
    if available() {
        on_threads_gives_matrixmultiplys_bits(in_its_order);
    }
}

/// Sums of −0 (every product underflowing below zero) into C of −0: matrixmultiply's AVX-512
/// kernel keeps −0 + −0 = −0 in every tile, cut or whole, and gives the sum alone (−0) where β
/// is zero; −0 · 0.5 is −0 too.
#[test]
fn sums_of_negative_zero_as_matrixmultiplys_avx512_kernel() {
    if !available() {
        return;
    }
    for (m, k, n) in [(8, 2, 32), (13, 3, 21), (17, 300, 35)] {
        // a·b = −1e−30 · 1e−30, below f32's smallest subnormal: every sum rounds to −0.
        let (a, b) = (vec![-1e-30f32; m * k], vec![1e-30f32; k * n]);
        for beta in [1.0, 0.0, -0.0, 0.5] {
            let (ao, bo) = operands(&a, &b, (m, k, n), false, false);
            let (mut want, mut got) = (vec![-0.0f32; m * n], vec![-0.0f32; m * n]);
            by_matrixmultiply((m, k, n), ao, bo, beta, &mut want, n);
            in_its_order((m, k, n), ao, bo, beta, &mut got, n);
            assert!(got.iter().all(|x| x.to_bits() == (-0.0f32).to_bits()), "β {beta}");
            assert!(same_bits(&want, &got), "({m}, {k}, {n}), β {beta}");
        }
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
    in_its_order((m, k, n), ao, bo, 0.0, &mut c, n);
    assert!(c.iter().all(|x| x.is_finite()), "a NaN in C leaked through β = 0");
    let mut c = vec![2.0f32; m * n];
    in_its_order((m, 0, n), ao, bo, 0.5, &mut c, n);
    assert!(c.iter().all(|&x| x == 1.0));
    in_its_order((m, 0, n), ao, bo, 0.0, &mut c, n);
    assert!(c.iter().all(|&x| x.to_bits() == 0));
}

/// The products as the ops call them (`gemm`, whose in-place kernel takes small B's): a
/// feed-forward projection's B, too large for L2, and dW's column-major A with a large C come
/// here, with matrixmultiply's bits.
#[test]
fn the_products_that_skip_the_in_place_kernel_come_here() {
    if !available() {
        return;
    }
    // x·W₁ᵀ at d 384 → 1,536 (B 2.25 MiB), and dW₁ = gᵀ·x over 256 tokens.
    for (m, k, n, a_t, b_t) in [(64, 384, 1536, false, true), (1536, 256, 384, true, false)] {
        let (a, b) = (values(m * k, 15), values(k * n, 16));
        let (ao, bo) = operands(&a, &b, (m, k, n), a_t, b_t);
        let c0 = values(m * n, 17);
        let (mut want, mut got) = (c0.clone(), c0);
        by_matrixmultiply((m, k, n), ao, bo, 1.0, &mut want, n);
        // SAFETY: the operands hold these shapes; C is exclusively borrowed.
        unsafe { super::gemm(m, k, n, ao, bo, 1.0, got.as_mut_ptr(), n) };
        assert!(same_bits(&want, &got), "({m}, {k}, {n})");
    }
}
