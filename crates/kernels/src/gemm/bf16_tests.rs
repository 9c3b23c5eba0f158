//! The bf16 GEMM against a scalar model of `vdpbf16ps` (or of AMX's `tdpbf16ps`: the helpers here
//! serve `amx_tests` too), bit for bit, and against the f64 sum
//! of the rounded operands' products; at every layout, ragged edge and thread count.

use std::arch::x86_64::*;

use super::bf16::amx::{flushed as ftz, worst_error};
use super::bf16::{gemm, gemm_with, pack_b_bits_for, pack_b_for, supported, to_bf16, Kernel};
use super::emulated::fma_flushed;
use super::tests::{b_view, operands, values, LAYOUTS};
use super::{Bits, Element, Mat, Operand, PackedIn};
use crate::Precision;

pub(super) use super::emulated::round;

/// What `kernel` must give, modelled element by element on the rounded operands (each product
/// exact unless it underflows, each sum rounded, denormal results flushed), then `beta·C + acc`
/// in one fused multiply-add:
/// - `vdpbf16ps` as Intel's SDM defines it ("FP32 FMA with DAZ in, FTZ out"): one chain of
///   fused multiply-adds over the pairs of k, `acc = (acc + a₁·b₁) + a₀·b₀`;
/// - AMX's `tdpbf16ps` as Intel's SDM defines it: per 16 pairs (one instruction), the even
///   products and the odd products in two chains of fused multiply-adds from zero, then
///   `acc = acc + (even + odd)`.
pub(super) fn modelled(
    kernel: Kernel,
    (m, k, n): (usize, usize, usize),
    a: impl Fn(usize, usize) -> f32,
    b: impl Fn(usize, usize) -> f32,
    beta: f32,
    c: &[f32],
    ldc: usize,
) -> Vec<f32> {
    let mut out = c.to_vec();
    for i in 0..m {
        for j in 0..n {
            let at = |x: &dyn Fn(usize, usize) -> f32, r, s| round(x(r, s));
            // The pair of k starting at p, zeros past k.
            let pair = |p: usize| {
                let (a0, b0) = (at(&a, i, p), at(&b, p, j));
                let (a1, b1) = if p + 1 < k {
                    (at(&a, i, p + 1), at(&b, p + 1, j))
                } else {
                    (0.0, 0.0)
                };
                (a0, b0, a1, b1)
            };
            let mut acc = 0f32;
            if kernel == Kernel::Avx512 {
                for p in (0..k).step_by(2) {
                    let (a0, b0, a1, b1) = pair(p);
                    acc = fma_flushed(a1, b1, acc);
                    acc = fma_flushed(a0, b0, acc);
                }
            } else {
                for p0 in (0..k).step_by(32) {
                    let (mut even, mut odd) = (0f32, 0f32);
                    for p in (p0..k.min(p0 + 32)).step_by(2) {
                        let (a0, b0, a1, b1) = pair(p);
                        even = fma_flushed(a0, b0, even);
                        odd = fma_flushed(a1, b1, odd);
                    }
                    acc = ftz(acc + ftz(even + odd));
                }
            }
            let old = c[i * ldc + j];
            out[i * ldc + j] = if beta != 0.0 { beta.mul_add(old, acc) } else { acc };
        }
    }
    out
}

pub(super) fn same_bits(x: &[f32], y: &[f32]) -> bool {
    x.len() == y.len() && x.iter().zip(y).all(|(a, b)| a.to_bits() == b.to_bits())
}

/// `kernel`'s product at (m, k, n) for every layout of A and B, with C inside a wider buffer:
/// the modelled bits exactly (so nothing written outside C's view), and within rounding of the
/// f64 sum of the rounded operands' products.
pub(super) fn holds_to_the_model_at_every_layout(kernel: Kernel, (m, k, n): (usize, usize, usize)) {
    for (case, (a_t, b_t, beta)) in LAYOUTS.into_iter().enumerate() {
        let a = values(m * k, (m * 31 + k * 7 + n) as u64);
        let b = values(k * n, (n * 17 + k + case) as u64);
        let ldc = n + 5;
        let c0 = values(m * ldc, 99);
        let (ao, bo) = operands(&a, &b, (m, k, n), a_t, b_t);
        let mut c = c0.clone();
        unsafe { gemm_with(kernel, m, k, n, ao, bo, beta, c.as_mut_ptr(), ldc) };
        let (fa, fb) = accessors(&a, &b, (m, k, n), a_t, b_t);
        let want = modelled(kernel, (m, k, n), &fa, &fb, beta, &c0, ldc);
        assert!(
            same_bits(&c, &want),
            "{kernel:?} m={m} k={k} n={n} case={case}: not the modelled bits"
        );
        for i in 0..m {
            for j in 0..n {
                let exact: f64 = (0..k)
                    .map(|p| round(fa(i, p)) as f64 * round(fb(p, j)) as f64)
                    .sum();
                let exact = exact + beta as f64 * c0[i * ldc + j] as f64;
                let got = c[i * ldc + j] as f64;
                assert!(
                    (got - exact).abs() <= 1e-6 * (1.0 + exact.abs()) * (k as f64 + 1.0),
                    "{kernel:?} m={m} k={k} n={n} case={case}: C[{i},{j}] = {got}, exact {exact}"
                );
            }
        }
    }
}

/// `kernel`'s products of `cases` ((m, k, n), A transposed, B transposed), large enough to be
/// split over threads: the same bits at 1, 2 and 3 threads, the modelled ones, and within the
/// chain's rounding (k half-ulps of Σ|a·b|) of the f64 sum of the rounded operands' products.
pub(super) fn bits_do_not_depend_on_the_threads(
    kernel: Kernel,
    cases: &[((usize, usize, usize), bool, bool)],
) {
    for &((m, k, n), a_t, b_t) in cases {
        let a = values(m * k, (m + k) as u64);
        let b = values(k * n, (k + n) as u64);
        let (ao, bo) = operands(&a, &b, (m, k, n), a_t, b_t);
        let run = |threads: usize| {
            crate::par::set_threads(threads).unwrap();
            let mut c = vec![0f32; m * n];
            unsafe { gemm_with(kernel, m, k, n, ao, bo, 0.0, c.as_mut_ptr(), n) };
            crate::par::set_threads(1).unwrap();
            c
        };
        let one = run(1);
        for threads in [2, 3] {
            assert!(
                same_bits(&one, &run(threads)),
                "{kernel:?} m={m} k={k} n={n}: bits differ at {threads} threads"
            );
        }
        let (fa, fb) = accessors(&a, &b, (m, k, n), a_t, b_t);
        let want = modelled(kernel, (m, k, n), &fa, &fb, 0.0, &vec![0f32; m * n], n);
        assert!(
            same_bits(&one, &want),
            "{kernel:?} m={m} k={k} n={n}: not the modelled bits"
        );
        let (ra, rb) = (|i, p| round(fa(i, p)), |p, j| round(fb(p, j)));
        let exact: Vec<f32> = (0..m * n)
            .map(|e| {
                let (i, j) = (e / n, e % n);
                (0..k).map(|p| ra(i, p) as f64 * rb(p, j) as f64).sum::<f64>() as f32
            })
            .collect();
        let worst = worst_error(&one, &exact, ra, rb, (m, k, n));
        assert!(
            worst <= k as f64 * 2f64.powi(-24),
            "{kernel:?} m={m} k={k} n={n}: error {worst:e}"
        );
    }
}

/// The scalar rounding is the hardware's, on special values and on a sweep of bit patterns
/// (ties, carries into the exponent, overflow to infinity, NaN payloads, denormals).
#[test]
fn to_bf16_rounds_as_the_hardware_does() {
    if !supported() {
        return;
    }
    let mut xs: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0,
        1.0 + 1.0 / 256.0,
        1.0 + 3.0 / 256.0,
        f32::MAX,
        -f32::MAX,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7f80_0001),
        f32::from_bits(0xff81_2345),
        f32::MIN_POSITIVE,
        1e-39,
        -1e-39,
        f32::from_bits(0x3f80_7fff),
        f32::from_bits(0x3f80_8000),
        f32::from_bits(0x3f81_8000),
        f32::from_bits(0x3fff_ffff),
    ];
    xs.extend((0..200_000u32).map(|i| f32::from_bits(i.wrapping_mul(0x9E37_79B9) ^ 0x5555)));
    for chunk in xs.chunks(32) {
        let hw: [u16; 32] = unsafe { hardware_round(chunk) };
        for (x, h) in chunk.iter().zip(hw) {
            assert_eq!(to_bf16(*x), h, "{x:e} ({:08x})", x.to_bits());
        }
    }
}

/// `vcvtne2ps2bf16` of up to 32 floats.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn hardware_round(x: &[f32]) -> [u16; 32] {
    let mut buf = [0f32; 32];
    buf[..x.len()].copy_from_slice(x);
    let v = _mm512_cvtne2ps_pbh(
        _mm512_loadu_ps(buf.as_ptr().add(16)),
        _mm512_loadu_ps(buf.as_ptr()),
    );
    std::mem::transmute(v)
}

/// A (m×k) and B (k×n) element accessors for storage `a`, `b` transposed or not.
pub(super) fn accessors<'a>(
    a: &'a [f32],
    b: &'a [f32],
    (m, k, n): (usize, usize, usize),
    a_t: bool,
    b_t: bool,
) -> (
    impl Fn(usize, usize) -> f32 + 'a,
    impl Fn(usize, usize) -> f32 + 'a,
) {
    (
        move |i, p| a[if a_t { p * m + i } else { i * k + p }],
        move |p, j| b[if b_t { j * k + p } else { p * n + j }],
    )
}

/// Every layout of A and B, odd and even k, ragged rows and columns, β ∈ {0, 1, ½}, C inside a
/// wider buffer: the modelled bits exactly, nothing written outside C's view, and within
/// rounding of the f64 sum of the rounded operands' products.
#[test]
fn bf16_gemm_gives_the_modelled_bits_for_every_layout_and_edge() {
    if !supported() {
        return;
    }
    for m in [1usize, 7, 8, 9, 17, 33] {
        for k in [0usize, 1, 2, 3, 32, 33, 129] {
            for n in [1usize, 15, 16, 17, 32, 33, 70] {
                holds_to_the_model_at_every_layout(Kernel::Avx512, (m, k, n));
            }
        }
    }
}

/// Operands with neither stride 1 (every other element, read transposed) go through the
/// scalar packers and give the same bits.
#[test]
fn operands_with_no_unit_stride_give_the_modelled_bits() {
    if !supported() {
        return;
    }
    let (m, k, n) = (11, 13, 37);
    let raw_a = values(m * 2 * k, 1);
    let raw_b = values(n * 2 * k, 2);
    let ao = Operand::strided(&raw_a, 2 * k, 2);
    let bo = Operand::strided(&raw_b, 2, 2 * k);
    let mut c = vec![0f32; m * n];
    unsafe { gemm_with(Kernel::Avx512, m, k, n, ao, bo, 0.0, c.as_mut_ptr(), n) };
    let want = modelled(
        Kernel::Avx512,
        (m, k, n),
        |i, p| raw_a[i * 2 * k + 2 * p],
        |p, j| raw_b[2 * p + 2 * k * j],
        0.0,
        &vec![0f32; m * n],
        n,
    );
    assert!(same_bits(&c, &want));
}

/// Products large enough to be split over threads — by C's rows, by its columns, with a long
/// k taken in pieces, with a column-major A — give the same bits at 1, 2 and 3 threads, and the
/// modelled ones.
#[test]
fn bf16_gemm_bits_do_not_depend_on_the_threads() {
    if !supported() {
        return;
    }
    bits_do_not_depend_on_the_threads(
        Kernel::Avx512,
        &[
            ((300, 1100, 70), false, true),
            ((37, 600, 500), false, false),
            ((1000, 64, 40), false, true),
            ((384, 2049, 129), true, false),
            ((129, 513, 384), true, false),
        ],
    );
}

/// A B packed once (the output layer's weight) serves products with several A, at any β,
/// with the bits of the unpacked call; so does `product_in`.
#[test]
fn a_b_packed_once_in_bf16_gives_the_bits_of_each_product() {
    if !supported() {
        return;
    }
    for ((k, n), b_t) in [((37, 70), false), ((37, 70), true), ((1100, 40), true)] {
        let b = values(k * n, 21);
        let (_, bo) = operands(&[], &b, (0, k, n), false, b_t);
        let view = b_view(&b, (k, n), b_t);
        let packed = PackedIn::new(Precision::Bf16, k, n, view);
        for (m, beta) in [(1usize, 0.0f32), (9, 1.0), (131, 0.0), (300, 0.5)] {
            let a = values(m * k, m as u64);
            let c0 = values(m * n, 5);
            let mut got = c0.clone();
            packed.product(m, Mat::rows(&a, k), beta, &mut got);
            let mut want = c0.clone();
            unsafe { gemm(m, k, n, Operand::rows(&a, k), bo, beta, want.as_mut_ptr(), n) };
            assert!(same_bits(&got, &want), "k={k} n={n} m={m} beta={beta}");
            if beta == 0.0 {
                let fresh = super::product_in(Precision::Bf16, m, k, n, Mat::rows(&a, k), view);
                assert!(same_bits(&fresh, &want), "product_in, k={k} n={n} m={m}");
            }
        }
    }
}

/// The 16×16 transpose the packer of a transposed B uses.
#[test]
fn transpose16_transposes() {
    if !supported() {
        return;
    }
    let src: [[u32; 16]; 16] = std::array::from_fn(|r| std::array::from_fn(|c| (r * 100 + c) as u32));
    let out: [[u32; 16]; 16] = unsafe {
        let rows = std::array::from_fn(|r| _mm512_loadu_si512(src[r].as_ptr().cast()));
        std::mem::transmute(super::bf16::transpose16(rows))
    };
    for r in 0..16 {
        for c in 0..16 {
            assert_eq!(out[c][r], src[r][c], "({r}, {c})");
        }
    }
}

/// Packing alone: every pair of the strips is the two rounded elements (zero past k and n),
/// for row-major, column-major and no-unit-stride B (`None`: every other element of a
/// column-major buffer, the scalar packer).
#[test]
fn packed_strips_hold_the_rounded_pairs() {
    if !supported() {
        return;
    }
    for (k, n, b_t) in [
        (5usize, 40usize, Some(false)),
        (5, 40, Some(true)),
        (64, 17, Some(true)),
        (33, 33, Some(false)),
        (7, 37, None),
    ] {
        let b = values(2 * k * n, 3);
        let strided = Operand::strided(&b, 2, 2 * k);
        let (bo, fb): (Operand, Box<dyn Fn(usize, usize) -> f32>) = match b_t {
            Some(b_t) => (
                operands(&[], &b, (0, k, n), false, b_t).1,
                Box::new(accessors(&[], &b, (0, k, n), false, b_t).1),
            ),
            None => (strided, Box::new(|p, j| b[2 * p + 2 * k * j])),
        };
        let packed = unsafe { pack_b_for(Kernel::Avx512, k, n, bo) };
        let kq = k.div_ceil(2);
        let strips = n.div_ceil(32);
        let data = packed.as_slice(strips * kq * 32);
        for s in 0..strips {
            for q in 0..kq {
                for jj in 0..32 {
                    let j = s * 32 + jj;
                    let at = |p: usize| if p < k && j < n { to_bf16(fb(p, j)) } else { 0 };
                    let want = at(2 * q) as u32 | (at(2 * q + 1) as u32) << 16;
                    assert_eq!(
                        data[(s * kq + q) * 32 + jj],
                        want,
                        "k={k} n={n} b_t={b_t:?} s={s} q={q} j={jj}"
                    );
                }
            }
        }
    }
}

/// B held as bf16 bits packs into the strips its widened values pack into, for each kernel's
/// padding of k: rows contiguous (a whole strip, and the partial one past it), columns
/// contiguous (k in whole runs of 32 and not), and neither.
#[test]
fn bits_pack_as_their_widened_values_do() {
    if !supported() {
        return;
    }
    let kernels = [Kernel::Avx512, Kernel::AmxEmulated];
    for (k, n) in [
        (1usize, 1usize),
        (5, 40),
        (64, 17),
        (33, 64),
        (96, 70),
        (150, 32),
        (7, 37),
    ] {
        let len = 4 * k * n + 4 * (k + n) + 8;
        let bits: Vec<u16> = values(len, 7).iter().map(|&x| to_bf16(x)).collect();
        let widened: Vec<f32> = bits.iter().map(|b| b.widen()).collect();
        // (row stride, column stride): rows of n + 3, columns of k + 1, and every third row
        // of a column-major buffer.
        for (rs, cs) in [(n + 3, 1), (1, k + 1), (3, 3 * k + 1)] {
            // The views' data end at their last element.
            let end = (k - 1) * rs + (n - 1) * cs + 1;
            let held = Bits {
                data: &bits[..end],
                row_stride: rs,
                col_stride: cs,
            };
            let values = Operand::strided(&widened, rs, cs);
            for kernel in kernels {
                // SAFETY: both views lie inside their buffers ((k-1)·rs + (n-1)·cs < len).
                let (from_bits, from_values) = unsafe {
                    (
                        pack_b_bits_for(kernel, k, n, held),
                        pack_b_for(kernel, k, n, values),
                    )
                };
                let size = n.div_ceil(32) * kernel.kq_stride(k) * 32;
                assert!(
                    from_bits.as_slice(size) == from_values.as_slice(size),
                    "k={k} n={n} strides ({rs}, {cs}) {kernel:?}"
                );
            }
        }
    }
}
