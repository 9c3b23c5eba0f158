//! The bf16 products on AMX's tiles, run on the emulated tiles (this machine has no AMX): bit
//! for bit the scalar model of `tdpbf16ps`'s sums at every layout, ragged edge, β, piece of k
//! and thread count; the start-up check's verdicts; and, where the CPU has AMX (an ignored test
//! that `scripts/gpu-check.sh` runs on the device machine's CPU), the hardware against the
//! emulator.

use super::bf16::amx::{check, state, worst_error, State};
use super::bf16::{gemm_packed, gemm_with, pack_b_for, supported, Kernel};
use super::bf16_tests::{
    accessors, bits_do_not_depend_on_the_threads, holds_to_the_model_at_every_layout, same_bits,
};
use super::tests::{operands, values, LAYOUTS};

/// Rows and columns on both sides of a tile's 16 and a step's 32, k on both sides of a tile's
/// 16 pairs (odd and even), every layout of A and B, β ∈ {0, 1, ½}, C inside a wider buffer.
/// The model sums element by element where the emulator sums tiles that the packers and the
/// steps filled: what this holds the kernel to is the packing, the tiling and the edges; both
/// read Intel's definition the same way, and only the hardware can say whether that reading is
/// right (`amx_hardware_gives_the_emulated_products`).
#[test]
fn the_tiles_give_the_modelled_bits_for_every_layout_and_edge() {
    if !supported() {
        return;
    }
    for m in [1usize, 16, 31, 32, 33, 65] {
        for k in [0usize, 1, 2, 31, 32, 33, 129] {
            for n in [1usize, 15, 17, 32, 33, 70] {
                holds_to_the_model_at_every_layout(Kernel::AmxEmulated, (m, k, n));
            }
        }
    }
}

/// A product wider than a block's 384 columns: with B small enough for L2 its rows go one tile
/// step at a time (a ragged last step included), beyond that in blocks of 128; either way the
/// modelled bits, at any thread count.
#[test]
fn wide_products_give_the_modelled_bits_in_either_blocking() {
    if !supported() {
        return;
    }
    holds_to_the_model_at_every_layout(Kernel::AmxEmulated, (70, 33, 800));
    // B: 560 pairs × 800 columns × 4 bytes = 1.7 MiB, past the bound.
    bits_do_not_depend_on_the_threads(Kernel::AmxEmulated, &[((40, 1100, 800), false, true)]);
}

/// A long k in pieces (each resuming from C's sums, through the edge buffer where the step is
/// ragged), split over threads by C's rows or its columns, with a column-major A: the same bits
/// at 1, 2 and 3 threads, the modelled ones, and within rounding of the f64 sum.
#[test]
fn the_tiles_bits_do_not_depend_on_the_threads() {
    if !supported() {
        return;
    }
    bits_do_not_depend_on_the_threads(
        Kernel::AmxEmulated,
        &[
            ((300, 1100, 70), false, true),
            ((37, 600, 200), false, false),
            ((129, 513, 100), true, false),
        ],
    );
}

/// A B packed once for the tiles (k padded to 16 pairs) serves products with several A and β
/// with the bits of the unpacked call.
#[test]
fn a_b_packed_once_for_the_tiles_gives_the_bits_of_each_product() {
    if !supported() {
        return;
    }
    for ((k, n), b_t) in [((37, 70), false), ((37, 70), true), ((600, 40), true)] {
        let b = values(k * n, 21);
        let (_, bo) = operands(&[], &b, (0, k, n), false, b_t);
        let packed = unsafe { pack_b_for(Kernel::AmxEmulated, k, n, bo) };
        for (m, beta) in [(1usize, 0.0f32), (9, 1.0), (131, 0.0), (40, 0.5)] {
            let a = values(m * k, m as u64);
            let (ao, _) = operands(&a, &[], (m, k, 0), false, false);
            let c0 = values(m * n, 5);
            let mut got = c0.clone();
            unsafe { gemm_packed(m, ao, &packed, beta, got.as_mut_ptr(), n) };
            let mut want = c0.clone();
            unsafe { gemm_with(Kernel::AmxEmulated, m, k, n, ao, bo, beta, want.as_mut_ptr(), n) };
            assert!(same_bits(&got, &want), "k={k} n={n} m={m} beta={beta}");
        }
    }
}

/// The start-up check passes a kernel that computes what the emulator does and fails one with
/// a wrong instruction; its measure of error catches one wrong element of a product, and a NaN.
#[test]
fn the_start_up_check_passes_the_model_and_catches_a_wrong_element() {
    if !supported() {
        return;
    }
    assert_eq!(check(Kernel::AmxEmulated), Ok(()));
    let faulty = check(Kernel::AmxFaulty);
    assert!(
        faulty.as_ref().is_err_and(|why| why.contains("largest error")),
        "{faulty:?}"
    );
    let (m, k, n) = (3, 40, 4);
    let (a, b) = (values(m * k, 1), values(k * n, 2));
    let (fa, fb) = (
        |i: usize, p: usize| a[i * k + p],
        |p: usize, j: usize| b[p * n + j],
    );
    let want: Vec<f32> = (0..m * n)
        .map(|e| (0..k).map(|p| fa(e / n, p) * fb(p, e % n)).sum())
        .collect();
    let mut wrong = want.clone();
    wrong[5] += 0.01 * wrong[5].abs().max(1.0);
    let allowed = k as f64 * 2f64.powi(-24);
    assert!(worst_error(&want, &want, fa, fb, (m, k, n)) == 0.0);
    assert!(worst_error(&wrong, &want, fa, fb, (m, k, n)) > allowed);
    let mut nan = want.clone();
    nan[2] = f32::NAN;
    assert!(worst_error(&nan, &want, fa, fb, (m, k, n)) > allowed);
}

/// On a CPU with AMX: the tiles are on (unless the environment caps the unit) and the hardware
/// gives the emulator's bits at every layout and edge (or, where the silicon adds a pair in
/// another order, results within rounding: the test says which). Ignored by default: only a
/// machine with AMX can run it, and the development machine has none; `scripts/gpu-check.sh`
/// runs it on the device machine's CPU.
#[test]
#[ignore = "needs a CPU with AMX-BF16"]
fn amx_hardware_gives_the_emulated_products() {
    match state() {
        State::Active => {}
        other => panic!("AMX is not in use on this machine: {other:?}"),
    }
    let mut differing = 0;
    for m in [1usize, 33, 65, 300] {
        for k in [1usize, 33, 129, 1100] {
            for n in [1usize, 17, 70] {
                for (case, (a_t, b_t, beta)) in LAYOUTS.into_iter().enumerate() {
                    let a = values(m * k, (m + k + case) as u64);
                    let b = values(k * n, (n + k) as u64);
                    let c0 = values(m * n, 3);
                    let (ao, bo) = operands(&a, &b, (m, k, n), a_t, b_t);
                    let run = |kernel| {
                        let mut c = c0.clone();
                        unsafe { gemm_with(kernel, m, k, n, ao, bo, beta, c.as_mut_ptr(), n) };
                        c
                    };
                    let (hardware, emulated) = (run(Kernel::Amx), run(Kernel::AmxEmulated));
                    if !same_bits(&hardware, &emulated) {
                        differing += 1;
                        let (fa, fb) = accessors(&a, &b, (m, k, n), a_t, b_t);
                        let worst = worst_error(&hardware, &emulated, fa, fb, (m, k, n));
                        assert!(
                            worst <= (k + 1) as f64 * 2f64.powi(-24),
                            "m={m} k={k} n={n} case={case}: error {worst:e} against the emulator"
                        );
                    }
                }
            }
        }
    }
    println!(
        "AMX hardware: {differing} of 192 products differ in bits from the emulator (all within rounding)"
    );
}
