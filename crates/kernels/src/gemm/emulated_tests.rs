//! The emulated bf16 products against the scalar model of `vdpbf16ps` that `bf16_tests` holds the
//! hardware kernel to, bit for bit, on values that exercise the rounding and the flushing; and,
//! where the CPU has AVX512_BF16, against the hardware kernel itself.

use super::bf16::{gemm_with, supported, Kernel};
use super::bf16_tests::{accessors, modelled, same_bits};
use super::emulated::{
    gemm, gemm_packed_parts, product, round, round_in_place, to_bf16, unflushed_is_exact, Packed, Rounded, KC,
};
use super::tests::{operands, LAYOUTS};
use super::{Mat, Part};

/// Values that exercise the rounding and the flushing: signed zeros, a tie (1 + 2⁻⁸ rounds to
/// even), operands whose products underflow, a denormal operand, and ordinary values whose
/// sums cancel.
fn values(len: usize, seed: u64) -> Vec<f32> {
    let ordinary = super::tests::values(len, seed);
    (0..len)
        .map(|i| match i % 11 {
            0 => 0.0,
            1 => -0.0,
            2 => f32::from_bits(0x3f80_8000),
            3 => 1e-20 * ordinary[i],
            4 => 3e-39,
            _ => 8.0 * ordinary[i],
        })
        .collect()
}

/// Values of magnitudes 2⁻¹⁰ to 8 and zeros: no sum of their products can be a denormal, so the
/// emulation sums them without flushing ([`unflushed_is_exact`]).
fn ordinary(len: usize, seed: u64) -> Vec<f32> {
    let ordinary = super::tests::values(len, seed);
    (0..len)
        .map(|i| match i % 13 {
            0 => 0.0,
            1 => -0.0,
            _ => 8.0 * ordinary[i] + ordinary[i].signum() / 1024.0,
        })
        .collect()
}

/// The exponent field of the smallest nonzero magnitude of the values rounded to bf16.
fn least_exponent(values: &[f32]) -> u32 {
    values
        .iter()
        .map(|&v| (round(v).to_bits() >> 23) & 0xff)
        .filter(|&e| e != 0)
        .min()
        .unwrap_or(255)
}

/// A (m×k, row-major) stored as a layout reads it: itself, or for `a_t` its transpose,
/// row-major.
fn stored_as(a: &[f32], (m, k): (usize, usize), a_t: bool) -> Vec<f32> {
    match a_t {
        false => a.to_vec(),
        true => (0..k * m).map(|e| a[(e % m) * k + e / m]).collect(),
    }
}

/// `A·B` (β = 0, B row-major, A stored as `a_t` says) emulated, and as the model of `vdpbf16ps`
/// gives it.
fn emulated_and_modelled(
    a: &[f32],
    b: &[f32],
    (m, k, n): (usize, usize, usize),
    a_t: bool,
) -> (Vec<f32>, Vec<f32>) {
    let (ao, bo) = operands(a, b, (m, k, n), a_t, false);
    let mut got = vec![0f32; m * n];
    // SAFETY: the operands hold their views and C its m×n elements.
    unsafe { gemm(m, k, n, ao, bo, 0.0, got.as_mut_ptr(), n) };
    let (fa, fb) = accessors(a, b, (m, k, n), a_t, false);
    let want = modelled(Kernel::Avx512, (m, k, n), &fa, &fb, 0.0, &vec![0f32; m * n], n);
    (got, want)
}

/// `(m, k, n)` at every layout of A and B and β ∈ {0, 1, ½}, C inside a wider buffer, operands
/// drawn by `draw`: the emulation's bits and `kernel`'s, or the model's where `kernel` is `None`.
fn check(kernel: Option<Kernel>, (m, k, n): (usize, usize, usize), draw: fn(usize, u64) -> Vec<f32>) {
    for (case, (a_t, b_t, beta)) in LAYOUTS.into_iter().enumerate() {
        let a = draw(m * k, (m * 31 + k * 7 + n) as u64);
        let b = draw(k * n, (n * 17 + k + case) as u64);
        let ldc = n + 5;
        let c0 = values(m * ldc, 99);
        let (ao, bo) = operands(&a, &b, (m, k, n), a_t, b_t);
        let mut got = c0.clone();
        // SAFETY: the operands hold their views and C holds m rows of ldc.
        unsafe { gemm(m, k, n, ao, bo, beta, got.as_mut_ptr(), ldc) };
        let want = match kernel {
            Some(kernel) => {
                let mut c = c0.clone();
                // SAFETY: as above; the caller checked that the CPU runs `kernel`.
                unsafe { gemm_with(kernel, m, k, n, ao, bo, beta, c.as_mut_ptr(), ldc) };
                c
            }
            None => {
                let (fa, fb) = accessors(&a, &b, (m, k, n), a_t, b_t);
                modelled(Kernel::Avx512, (m, k, n), &fa, &fb, beta, &c0, ldc)
            }
        };
        assert!(same_bits(&got, &want), "{kernel:?} m={m} k={k} n={n} case={case}");
    }
}

/// Edges of the emulation's tiles (6 × 16), blocks of k (192) and of rows (96), and tasks (the
/// last: a task of several blocks of rows, the last one short).
const SHAPES: [(usize, usize, usize); 10] = [
    (1, 1, 1),
    (7, 0, 9),
    (8, 3, 17),
    (9, 33, 16),
    (17, 129, 70),
    (33, 2, 600),
    (40, 600, 33),
    (3, 1100, 5),
    (200, 401, 50),
    (301, 2, 40),
];

#[test]
fn emulated_products_give_the_modelled_bits_at_every_layout_and_edge() {
    for shape in SHAPES {
        check(None, shape, values);
    }
}

/// Where no sum can be a denormal, the emulation skips the flushing; the bits are the model's,
/// which flushes every step.
#[test]
fn products_summed_without_flushing_give_the_modelled_bits() {
    let (a, b) = (ordinary(1 << 16, 1), ordinary(1 << 16, 2));
    assert!(
        unflushed_is_exact(least_exponent(&a), least_exponent(&b)),
        "the operands leave nothing to flush"
    );
    for shape in SHAPES {
        check(None, shape, ordinary);
    }
}

/// Products whose exponents add to one less than [`unflushed_is_exact`] asks for cancel to a
/// denormal (2⁻¹²⁷), which `vdpbf16ps` flushes; at the threshold they cancel to 2⁻¹²⁶, a normal.
#[test]
fn sums_that_cancel_to_a_denormal_are_flushed_at_the_threshold() {
    let p = |e: i32| 2f32.powi(e);
    let (e7, e6) = (1.0 + p(-7), 1.0 + p(-6));
    // k = 1 first: (1 + 2⁻⁶ + 2⁻¹⁴)·2⁻¹¹³; then k = 0 adds −(1 + 2⁻⁶)·2⁻¹¹³.
    let a = [e6 * p(-56), e7 * p(-56)];
    for (b_scale, want) in [(p(-57), 0.0), (p(-56), p(-126))] {
        let b = [-b_scale, e7 * b_scale];
        let exponents = (least_exponent(&a), least_exponent(&b));
        assert_eq!(exponents.0 + exponents.1, if want == 0.0 { 141 } else { 142 });
        let (got, modelled) = emulated_and_modelled(&a, &b, (1, 2, 1), false);
        assert_eq!(got[0].to_bits(), modelled[0].to_bits(), "exponents {exponents:?}");
        assert_eq!(got[0].to_bits(), want.to_bits(), "exponents {exponents:?}");
    }
}

/// A tile flushed in one block of k is flushed in the blocks after it: its sum there is any
/// normal number (2⁻¹²⁶ + 2⁻¹³⁵ here), which products that could not give a denormal from zero
/// (exponents adding to 142) can bring to one (2⁻¹³⁵, flushed to 0).
#[test]
fn a_tile_flushed_in_one_block_of_k_stays_flushed() {
    let p = |e: i32| 2f32.powi(e);
    let k = KC + 2;
    let (mut a, mut b) = (vec![0f32; k], vec![0f32; k]);
    // The first block: 2⁻¹²⁶ (k = 1), then 2⁻¹³⁵ (k = 0); B's smallest magnitude is 2⁻²⁶.
    (a[0], a[1], b[0], b[1]) = (p(-109), p(-100), p(-26), p(-26));
    // The next: (1 + 2⁻⁶)·2⁻¹¹² (k = KC + 1), then −(1 + 2⁻⁶ + 2⁻¹⁴)·2⁻¹¹² (k = KC).
    (a[KC], b[KC]) = ((1.0 + p(-7)) * p(-86), -(1.0 + p(-7)) * p(-26));
    (a[KC + 1], b[KC + 1]) = ((1.0 + p(-6)) * p(-86), p(-26));
    assert!(unflushed_is_exact(least_exponent(&a[KC..]), least_exponent(&b)));
    let (got, modelled) = emulated_and_modelled(&a, &b, (1, k, 1), false);
    assert_eq!(modelled[0].to_bits(), 0, "the model flushes 2⁻¹³⁵");
    assert_eq!(got[0].to_bits(), modelled[0].to_bits());
}

#[test]
fn emulated_products_give_the_vdpbf16ps_kernels_bits() {
    if !supported() {
        eprintln!("skipped: this CPU has no AVX512_BF16 (the model stands in for it above)");
        return;
    }
    for shape in SHAPES {
        check(Some(Kernel::Avx512), shape, values);
        check(Some(Kernel::Avx512), shape, ordinary);
    }
}

/// Operands near 2⁻⁶³ whose products lie around the smallest normal f32 (2⁻¹²⁶), some below it,
/// so that the chain's sums are tiny too: where Intel's "FMA with DAZ in, FTZ out" and a
/// product flushed before it is added would differ.
#[test]
fn products_that_underflow_into_tiny_sums_give_the_definitions_bits() {
    let (m, k, n) = (9, 40, 33);
    let tiny = |len: usize, seed: u64, scale: f32| -> Vec<f32> {
        super::tests::values(len, seed)
            .iter()
            .map(|v| scale * (1.0 + v))
            .collect()
    };
    let (a, b) = (
        tiny(m * k, 11, -(2f32.powi(-63))),
        tiny(k * n, 12, 2f32.powi(-64)),
    );
    let (got, want) = emulated_and_modelled(&a, &b, (m, k, n), false);
    assert!(same_bits(&got, &want), "against the model");
    assert!(
        got.iter().any(|&x| x != 0.0 && x.abs() < 2f32.powi(-120)),
        "the sums stay tiny: {got:?}"
    );
    if supported() {
        let (ao, bo) = operands(&a, &b, (m, k, n), false, false);
        let mut hw = vec![0f32; m * n];
        // SAFETY: the operands hold their elements, C its m×n; the CPU has AVX512_BF16.
        unsafe { gemm_with(Kernel::Avx512, m, k, n, ao, bo, 0.0, hw.as_mut_ptr(), n) };
        assert!(same_bits(&got, &hw), "against vdpbf16ps itself");
    }
}

/// Steps whose exact sums lie a little above and below ±2⁻¹²⁶, the smallest normal f32: after a
/// sum of 2⁻¹²⁶ (k = 0), k = 2 adds ±c·2⁻¹⁵² (an even element, so that AMX's chains meet it in
/// a step too). Below 2⁻¹²⁶ the hardware flushes a sum that is tiny once rounded to 24 bits with
/// an unbounded exponent (x86's "tininess after rounding"): 2⁻¹²⁶ − 2·2⁻¹⁵² is a tie that rounds
/// to 2⁻¹²⁶ and stays, 2⁻¹²⁶ − 2.5·2⁻¹⁵² rounds below it and is flushed, although on the
/// denormals' coarser grid it would round to 2⁻¹²⁶ too. The emulation and the scalar models give
/// that definition's bits on every CPU; where the CPU has AVX512_BF16 or AMX, the emulated tiles
/// and the hardware do too (on an AMX Xeon they do: before 2026-12-03 the models flushed only
/// denormals, and this test found them wrong there). Without AVX512_BF16 the emulated tiles
/// cannot run (their packers are its code); the scalar model of `tdpbf16ps` stands for them.
#[test]
fn a_sum_just_below_the_smallest_normal_gives_the_hardwares_bits() {
    let p = |e: i32| 2f32.powi(e);
    let amx = matches!(super::bf16::amx::state(), super::bf16::amx::State::Active);
    for sign in [1f32, -1.0] {
        for c in [-16f32, -5.0, -4.0, -3.0, -2.5, -2.0, -1.0, 1.0, 2.5, 4.0] {
            let a = [sign * p(-63), 0.0, sign * c * p(-76), 0.0];
            let b = [p(-63), 0.0, p(-76), 0.0];
            let exact = sign as f64 * (2f64.powi(-126) + c as f64 * 2f64.powi(-152));
            // Rounded to 24 bits 2⁶⁴ times larger, far from f32's denormals.
            let rounded = ((exact * 2f64.powi(64)) as f32) as f64 * 2f64.powi(-64);
            // A chain flushes to a zero of the sum's sign; the tiles then add the two chains'
            // sums and C's, which makes a flushed −0 a +0.
            let (want_chain, want_tiles) = if rounded.abs() < 2f64.powi(-126) {
                (0f32.copysign(sign), 0.0)
            } else {
                (rounded as f32, rounded as f32)
            };
            let (ao, bo) = operands(&a, &b, (1, 4, 1), false, false);
            let run = |kernel: Option<Kernel>| {
                let mut c = [f32::NAN];
                // SAFETY: A (1×4), B (4×1) and C (1×1) hold their elements; the kernels of
                // `gemm_with` (the emulated tiles too: their packers are AVX512_BF16 code) run
                // only where the CPU has AVX512_BF16, AMX's only where it has AMX.
                unsafe {
                    match kernel {
                        None => gemm(1, 4, 1, ao, bo, 0.0, c.as_mut_ptr(), 1),
                        Some(kernel) => gemm_with(kernel, 1, 4, 1, ao, bo, 0.0, c.as_mut_ptr(), 1),
                    }
                }
                c[0]
            };
            let case = format!("exact sum {sign}·(2⁻¹²⁶ + {c}·2⁻¹⁵²)");
            let emulated = run(None);
            let modelled = |kernel| modelled(kernel, (1, 4, 1), |_, p| a[p], |p, _| b[p], 0.0, &[0.0], 1)[0];
            for (model, got, want) in [
                ("the emulation", emulated, want_chain),
                ("the model of vdpbf16ps", modelled(Kernel::Avx512), want_chain),
                (
                    "the model of tdpbf16ps",
                    modelled(Kernel::AmxEmulated),
                    want_tiles,
                ),
            ] {
                assert_eq!(got.to_bits(), want.to_bits(), "{case}: {model} gives {got:e}");
            }
            if supported() {
                let tiles = run(Some(Kernel::AmxEmulated));
                assert_eq!(
                    tiles.to_bits(),
                    want_tiles.to_bits(),
                    "{case}: the emulated tiles give {tiles:e}"
                );
                let hardware = run(Some(Kernel::Avx512));
                assert_eq!(
                    hardware.to_bits(),
                    emulated.to_bits(),
                    "{case}: vdpbf16ps gives {hardware:e}"
                );
            }
            if amx {
                let hardware = run(Some(Kernel::Amx));
                assert_eq!(
                    hardware.to_bits(),
                    want_tiles.to_bits(),
                    "{case}: tdpbf16ps gives {hardware:e}"
                );
            }
        }
    }
}

/// Parts of a product, each over its own elements of k (A zero elsewhere in its rows, as the
/// attention kernel's are), β = 1: in each part's rows and columns, the bits of its own product
/// added to C; an empty part (a key block no query sees: ks empty, starting at an odd k) leaves
/// β·C; C outside the parts untouched.
#[test]
fn parts_give_their_products_bits_in_their_rows_and_columns() {
    let (m, k, n) = (8, 69, 72);
    let (a, b) = (values(m * k, 4), values(k * n, 5));
    let parts: Vec<Part> = vec![
        (0..3, 0..32, 0..32),
        (3..6, 32..40, 32..69),
        (6..8, 0..72, 69..69),
    ];
    let mut a_parts = vec![0f32; m * k];
    for (rows, _, ks) in &parts {
        for i in rows.clone() {
            a_parts[i * k + ks.start..i * k + ks.end].copy_from_slice(&a[i * k + ks.start..i * k + ks.end]);
        }
    }
    let packed = Packed::of(k, n, Mat::rows(&b, n));
    let c0 = values(m * n, 6);
    let mut got = c0.clone();
    // SAFETY: A and C hold their elements; the parts do not overlap.
    unsafe {
        gemm_packed_parts(
            Mat::rows(&a_parts, k).operand().into(),
            &packed,
            &parts,
            1.0,
            got.as_mut_ptr(),
            n,
        )
    };
    let mut touched = vec![false; m * n];
    for (rows, cols, ks) in &parts {
        let fa = |i: usize, p: usize| a[(rows.start + i) * k + ks.start + p];
        let fb = |p: usize, j: usize| b[(ks.start + p) * n + cols.start + j];
        let (pm, pn) = (rows.len(), cols.len());
        let old: Vec<f32> = rows
            .clone()
            .flat_map(|i| c0[i * n + cols.start..i * n + cols.end].to_vec())
            .collect();
        let want = modelled(Kernel::Avx512, (pm, ks.len(), pn), fa, fb, 1.0, &old, pn);
        for (r, i) in rows.clone().enumerate() {
            let row = &got[i * n + cols.start..i * n + cols.end];
            assert!(
                same_bits(row, &want[r * pn..(r + 1) * pn]),
                "row {i}, part {ks:?}"
            );
            touched[i * n + cols.start..i * n + cols.end].fill(true);
        }
    }
    for (e, _) in touched.iter().enumerate().filter(|(_, t)| !**t) {
        assert_eq!(got[e].to_bits(), c0[e].to_bits(), "C[{e}] outside the parts");
    }
}

/// A part that starts off the hardware kernel's blocks is refused here as there, so that what
/// the emulation runs, AVX512_BF16 runs too.
#[test]
#[should_panic(expected = "off the blocks")]
fn a_part_off_the_hardware_blocks_is_refused() {
    let (k, n) = (64, 32);
    let (a, b) = (values(k, 1), values(k * n, 2));
    let packed = Packed::of(k, n, Mat::rows(&b, n));
    let mut c = vec![0f32; n];
    // SAFETY: A and C hold their elements.
    unsafe {
        gemm_packed_parts(
            Mat::rows(&a, k).operand().into(),
            &packed,
            &[(0..1, 0..n, 2..64)],
            0.0,
            c.as_mut_ptr(),
            n,
        )
    };
}

#[test]
fn emulated_bits_do_not_depend_on_the_threads() {
    let (m, k, n) = (300, 96, 700);
    let (a, b) = (values(m * k, 6), values(k * n, 7));
    let run = |threads| {
        crate::par::set_threads(threads).unwrap();
        let mut c = vec![0f32; m * n];
        // SAFETY: the views and C hold their elements.
        unsafe {
            gemm(
                m,
                k,
                n,
                Mat::rows(&a, k).operand(),
                Mat::rows(&b, n).operand(),
                0.0,
                c.as_mut_ptr(),
                n,
            )
        };
        crate::par::set_threads(1).unwrap();
        c
    };
    assert!(same_bits(&run(1), &run(3)));
}

/// The vectorised rounding gives the scalar one's bits (NaNs quiet, denormals signed zeros,
/// ties to even, the largest finite values to infinity) and the smallest exponent among them.
#[test]
fn rounding_in_place_rounds_each_value_as_the_hardware_does() {
    let specials = [
        0.0,
        -0.0,
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7f80_0001),
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        -f32::MAX,
        f32::MIN_POSITIVE,
        f32::from_bits(1),
        -3e-39,
        f32::from_bits(0x3f80_8000),
        f32::from_bits(0x3f81_8000),
        1.0 + f32::EPSILON,
        -7.25e-20,
    ];
    let mut values: Vec<f32> = specials.iter().copied().chain(values(1000, 3)).collect();
    let want: Vec<u32> = values.iter().map(|&v| (to_bf16(v) as u32) << 16).collect();
    let least = round_in_place(&mut values);
    let got: Vec<u32> = values.iter().map(|v| v.to_bits()).collect();
    assert_eq!(got, want);
    assert_eq!(least, least_exponent(&values));
    assert_eq!(
        round_in_place(&mut [0.0, -0.0, 3e-39]),
        255,
        "no nonzero magnitude"
    );
}

/// Tiles of one block of rows, some summed without flushing and some flushed (rows of magnitudes
/// near 2⁻¹²⁶, whose products with B's come out denormal, among ordinary rows), at both layouts
/// of A: each row has the model's bits, which the flushing changes in the tiny rows alone.
#[test]
fn flushed_and_unflushed_tiles_side_by_side_give_the_modelled_bits() {
    let (m, k, n) = (40, 250, 20);
    let mut a = ordinary(m * k, 21);
    let b = ordinary(k * n, 22);
    let tiny_rows = [7, 30];
    for i in tiny_rows {
        for v in &mut a[i * k..(i + 1) * k] {
            *v *= 2f32.powi(-126);
        }
    }
    let row = |i: usize| &a[i * k..(i + 1) * k];
    assert!(!unflushed_is_exact(least_exponent(row(7)), least_exponent(&b)));
    assert!(unflushed_is_exact(least_exponent(row(0)), least_exponent(&b)));
    // The chain without any flush (k is even: no padding), to show where the flushing matters.
    let unflushed = |i: usize, j: usize| {
        let (x, y) = (|p: usize| round(a[i * k + p]), |p: usize| round(b[p * n + j]));
        (0..k / 2).fold(0f32, |s, q| {
            x(2 * q).mul_add(y(2 * q), x(2 * q + 1).mul_add(y(2 * q + 1), s))
        })
    };
    for a_t in [false, true] {
        let (got, want) = emulated_and_modelled(&stored_as(&a, (m, k), a_t), &b, (m, k, n), a_t);
        assert!(same_bits(&got, &want), "A transposed: {a_t}");
        for i in 0..m {
            let differs = (0..n).any(|j| unflushed(i, j).to_bits() != want[i * n + j].to_bits());
            assert_eq!(
                differs,
                tiny_rows.contains(&i),
                "row {i}: the flushing matters in the tiny rows alone"
            );
        }
    }
}

/// Parts over several blocks of k, starting past k's start, with A transposed and not, on
/// ordinary values and on the flushing ones: each part's rows and columns hold its product.
#[test]
fn parts_over_several_blocks_of_k_give_their_products_bits() {
    let (m, k, n) = (14, 480, 64);
    for draw in [ordinary as fn(usize, u64) -> Vec<f32>, values] {
        let (a, b) = (draw(m * k, 31), draw(k * n, 32));
        let parts: Vec<Part> = vec![(0..7, 0..64, 32..480), (7..14, 32..64, 64..448)];
        let packed = Packed::of(k, n, Mat::rows(&b, n));
        for a_t in [false, true] {
            let mut a_parts = vec![0f32; m * k];
            for (rows, _, ks) in &parts {
                for i in rows.clone() {
                    for p in ks.clone() {
                        a_parts[i * k + p] = a[i * k + p];
                    }
                }
            }
            let stored = stored_as(&a_parts, (m, k), a_t);
            let view = match a_t {
                false => Mat::rows(&stored, k),
                true => Mat::rows(&stored, m).t(),
            };
            let mut got = vec![0f32; m * n];
            // SAFETY: A and C hold their elements; the parts do not overlap.
            unsafe { gemm_packed_parts(view.operand().into(), &packed, &parts, 0.0, got.as_mut_ptr(), n) };
            for (rows, cols, ks) in &parts {
                let fa = |i: usize, p: usize| a[(rows.start + i) * k + ks.start + p];
                let fb = |p: usize, j: usize| b[(ks.start + p) * n + cols.start + j];
                let (pm, pn) = (rows.len(), cols.len());
                let want = modelled(
                    Kernel::Avx512,
                    (pm, ks.len(), pn),
                    fa,
                    fb,
                    0.0,
                    &vec![0f32; pm * pn],
                    pn,
                );
                for (r, i) in rows.clone().enumerate() {
                    let row = &got[i * n + cols.start..i * n + cols.end];
                    assert!(
                        same_bits(row, &want[r * pn..(r + 1) * pn]),
                        "row {i}, part {ks:?}, A transposed: {a_t}"
                    );
                }
            }
        }
    }
}

/// An activation kept rounded holds each value's bf16 bits, made whole or block by block (rows
/// in tasks, the last one short, and no columns at all).
#[test]
fn a_kept_activation_holds_each_values_bf16() {
    for (rows, cols) in [(1, 1), (3, 7), (301, 40), (2, 20_000), (5, 0)] {
        let x = values(rows * cols, (rows + cols) as u64);
        let want: Vec<u32> = x.iter().map(|&v| round(v).to_bits()).collect();
        let bits = |r: &Rounded| -> Vec<u32> { r.to_f32().iter().map(|v| v.to_bits()).collect() };
        assert_eq!(bits(&Rounded::new(rows, cols, &x)), want, "whole, {rows}×{cols}");
        let made = Rounded::from_rows_with(rows, cols, |r, out| {
            for (o, &v) in out.iter_mut().zip(&x[r.start * cols..r.end * cols]) {
                o.write(v);
            }
        });
        assert_eq!(made.dims(), (rows, cols));
        assert_eq!(bits(&made), want, "block by block, {rows}×{cols}");
    }
}

/// Products reading activations kept rounded (A in rows or transposed, B an f32 view or kept)
/// give the bits of the same products from the f32 values, across the tiles' and k's blocks.
#[test]
fn products_of_kept_activations_give_the_bits_of_their_values() {
    for (m, k, n) in SHAPES {
        let a = values(m * k, (m + 3 * k) as u64);
        let b = values(k * n, (n + 5 * k) as u64);
        for a_t in [false, true] {
            let stored = stored_as(&a, (m, k), a_t);
            let (_, want) = emulated_and_modelled(&stored, &b, (m, k, n), a_t);
            let kept_a = match a_t {
                false => Rounded::new(m, k, &stored),
                true => Rounded::new(k, m, &stored),
            };
            let kept_b = Rounded::new(k, n, &b);
            let a_lines = kept_a.lines((m, k), a_t);
            // SAFETY: the kept operands' shapes are checked by `lines`; B's view holds k×n.
            let (from_view, from_kept) = unsafe {
                (
                    product(m, k, n, a_lines, Mat::rows(&b, n).operand().into()),
                    product(m, k, n, a_lines, kept_b.lines((k, n), false)),
                )
            };
            let case = format!("m={m} k={k} n={n} a_t={a_t}");
            assert!(same_bits(&from_view, &want), "B an f32 view, {case}");
            assert!(same_bits(&from_kept, &want), "B kept, {case}");
        }
    }
}

/// A kept activation read as another shape is refused, not read out of bounds.
#[test]
#[should_panic(expected = "an operand of another shape")]
fn a_kept_activation_read_as_another_shape_is_refused() {
    Rounded::new(3, 4, &[1.0; 12]).lines((4, 4), false);
}
