//! Vectorisable building blocks of the CPU kernels: reductions in a fixed lane order, eˣ and
//! erf without libm calls, and a dispatcher that compiles a loop for AVX-512 or AVX2.
//!
//! The crate is built for baseline x86-64 (SSE2 only). [`simd_dispatch`] compiles an
//! `#[inline(always)]` loop a second and third time with AVX2 and AVX-512 enabled and picks one
//! at run time; the arithmetic is the same either way — every reduction below sums in a fixed
//! lane order, and no copy contracts a multiply and an add into one rounding — so the bits do
//! not depend on the CPU.

/// Dot product with eight independent accumulators (vectorises; fixed summation order).
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// Sum with eight independent accumulators.
#[inline(always)]
pub(crate) fn sum(a: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let c = a.chunks_exact(8);
    let r = c.remainder();
    for x in c {
        for i in 0..8 {
            acc[i] += x[i];
        }
    }
    let tail: f32 = r.iter().sum();
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// Largest element (−∞ for an empty slice; NaN if any element is NaN, so a diverged run stays
/// visibly diverged), in eight lanes ([`max_of_wide`] for rows of thousands).
#[inline(always)]
pub(crate) fn max_of(a: &[f32]) -> f32 {
    max_in_lanes::<8>(a)
}

/// [`max_of`] in `L` independent lanes: a single running `max` is a serial chain that does not
/// vectorise, and cost 8% of a 10k-vocabulary training step in the cross-entropy. The result
/// does not depend on `L` (a maximum does not depend on the order).
#[inline(always)]
fn max_in_lanes<const L: usize>(a: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; L];
    let c = a.chunks_exact(L);
    let r = c.remainder();
    for x in c {
        let x: &[f32; L] = x.try_into().expect("a chunk of L");
        for i in 0..L {
            // `if` rather than `f32::max`: this form compiles to vector max instructions
            // and propagates NaN (a comparison with NaN is false, so NaN is kept or taken).
            acc[i] = if acc[i] > x[i] || acc[i].is_nan() {
                acc[i]
            } else {
                x[i]
            };
        }
    }
    let mut m = f32::NEG_INFINITY;
    for &x in acc.iter().chain(r) {
        m = if m > x || m.is_nan() { m } else { x };
    }
    m
}

/// [`sum`] in sixteen lanes, for rows of thousands of elements (a vocabulary's logits): at
/// 10,000 elements 0.049 against `sum`'s 0.125 ns per element, where the eight-lane loop
/// compiles to shuffles; slower than `sum` below ~100 elements (`reduce_timing` below). A
/// different order of summation from `sum`'s.
#[inline(always)]
pub(crate) fn sum_wide(a: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let c = a.chunks_exact(16);
    let r = c.remainder();
    for x in c {
        let x: &[f32; 16] = x.try_into().expect("a chunk of 16");
        for i in 0..16 {
            acc[i] += x[i];
        }
    }
    let tail: f32 = r.iter().sum();
    acc.iter().sum::<f32>() + tail
}

/// [`max_of`] in sixteen lanes, for rows of thousands of elements: the same result, at 10,000
/// elements 0.091 against 0.181 ns per element; slower on short rows.
#[inline(always)]
pub(crate) fn max_of_wide(a: &[f32]) -> f32 {
    max_in_lanes::<16>(a)
}

/// eˣ to about 2 ulp, branch-free so loops over it vectorise (libm's `expf` is a scalar call).
/// Cody–Waite reduction x = n·ln2 + r, |r| ≤ ln2/2, then a degree-6 Taylor polynomial in r.
/// Below −87.3 (where eˣ is subnormal) it returns exactly 0, which masked logits rely on.
#[inline(always)]
pub(crate) fn exp_fast(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let xc = x.clamp(-87.3, 88.0);
    // Round to nearest by adding and removing 1.5·2²³ (plain SSE2; `round` would be a call).
    // The sum's low mantissa bits then hold n itself, so 2ⁿ comes from integer arithmetic on
    // its bits: a float-to-int `as` cast saturates and maps NaN to 0, which compiles to a scalar
    // convert, compare and cmov per lane and kept every loop calling this from vectorising.
    const ROUND: f32 = 12_582_912.0;
    let shifted = xc * std::f32::consts::LOG2_E + ROUND;
    let n = shifted - ROUND;
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    let n_int = shifted.to_bits() as i32 - ROUND.to_bits() as i32;
    let scale = f32::from_bits((n_int + 127).wrapping_shl(23) as u32);
    if x < -87.3 {
        0.0
    } else {
        p * scale
    }
}

/// erf(x) and e^(−x²) (the latter is needed by the GELU gradient anyway), absolute error of
/// erf below 1.5·10⁻⁷ (Abramowitz & Stegun 7.1.26), branch-free.
#[inline(always)]
pub(crate) fn erf_and_gauss(x: f32) -> (f32, f32) {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [0.254_829_6, -0.284_496_74, 1.421_413_7, -1.453_152, 1.061_405_4];
    let ax = x.abs();
    let t = 1.0 / (1.0 + P * ax);
    let poly = t * (A[0] + t * (A[1] + t * (A[2] + t * (A[3] + t * A[4]))));
    let gauss = exp_fast(-x * x);
    let erf_abs = 1.0 - poly * gauss;
    (erf_abs.copysign(x), gauss)
}

/// Defines `$name(args) -> ret` that runs the `#[inline(always)]` function `$generic` compiled
/// for AVX-512 or AVX2 when the CPU has it (the crate is built for baseline x86-64, which only
/// has SSE2). The arithmetic is the same either way: every reduction above sums in a fixed lane
/// order, and no copy contracts a multiply and an add into one rounding.
macro_rules! simd_dispatch {
    ($vis:vis $name:ident => $generic:ident ($($arg:ident : $ty:ty),* $(,)?) -> $ret:ty) => {
        #[allow(clippy::too_many_arguments)]
        $vis fn $name($($arg: $ty),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx512dq,avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx512($($arg: $ty),*) -> $ret {
                    $generic($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx2($($arg: $ty),*) -> $ret {
                    $generic($($arg),*)
                }
                match $crate::simd::unit() {
                    // SAFETY: `unit` names a unit only where the CPU supports its features.
                    $crate::simd::Unit::Avx512 => return unsafe { avx512($($arg),*) },
                    // SAFETY: as above.
                    $crate::simd::Unit::Avx2 => return unsafe { avx2($($arg),*) },
                    $crate::simd::Unit::Baseline => {}
                }
            }
            $generic($($arg),*)
        }
    };
}

pub(crate) use simd_dispatch;

/// A vector unit the kernels are compiled for; ordered, so a unit can be capped by another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Unit {
    Baseline,
    Avx2,
    Avx512,
}

impl Unit {
    fn name(self) -> &'static str {
        match self {
            Unit::Avx512 => "AVX-512",
            Unit::Avx2 => "AVX2",
            Unit::Baseline => "baseline x86-64",
        }
    }
}

/// Names the vector unit to use in place of the best one the CPU has: `avx2` or `baseline`
/// (`avx512` only where the CPU has it). With `avx2` an AVX-512 machine computes exactly what an
/// AVX2 one does — the same loops and the same products (matrixmultiply's sums, on Ember's AVX2
/// kernel) — so a result from one can be reproduced bit for bit on the other. (`baseline` turns
/// off Ember's own vector loops and kernels; the products then run on matrixmultiply, which
/// chooses its kernel by itself and gives the same sums, but for a zero's sign on AVX-512.) Any of these also keeps AMX's
/// tiles off, so `avx512` makes an AMX machine compute what an AVX512_BF16 one does; `amx`
/// asks for the best the CPU has, as no value does.
pub const VECTOR_UNIT_ENV: &str = "EMBER_CPU_VECTOR_UNIT";

/// The unit every dispatch uses, decided once per process: the best the CPU supports, capped by
/// [`VECTOR_UNIT_ENV`].
pub(crate) fn unit() -> Unit {
    static UNIT: std::sync::OnceLock<Unit> = std::sync::OnceLock::new();
    *UNIT.get_or_init(|| {
        let supported = supported_unit();
        cap_from_env().map_or(supported, |cap| supported.min(cap))
    })
}

/// The unit [`VECTOR_UNIT_ENV`] names, read once: `None` where it is unset, `amx` (the best the
/// CPU has) or no unit's name (with a warning).
fn cap_from_env() -> Option<Unit> {
    static CAP: std::sync::OnceLock<Option<Unit>> = std::sync::OnceLock::new();
    *CAP.get_or_init(|| {
        let v = std::env::var(VECTOR_UNIT_ENV).ok()?;
        match v.trim().to_ascii_lowercase().replace(['-', '_'], "").as_str() {
            "amx" => None,
            "avx512" => Some(Unit::Avx512),
            "avx2" => Some(Unit::Avx2),
            "baseline" | "sse2" | "none" => Some(Unit::Baseline),
            _ => {
                eprintln!(
                    "warning: {VECTOR_UNIT_ENV}={v:?} is not one of amx, avx512, avx2, baseline; \
                     using this CPU's best ({})",
                    supported_unit().name()
                );
                None
            }
        }
    })
}

/// Whether [`VECTOR_UNIT_ENV`] names a vector unit (`avx512` or below), which keeps AMX's tiles
/// off as well: a machine with AMX then acts as one without (`amx`, or no value, allows them).
pub(crate) fn unit_capped_by_env() -> bool {
    cap_from_env().is_some()
}

fn supported_unit() -> Unit {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("avx512dq")
        {
            return Unit::Avx512;
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            return Unit::Avx2;
        }
    }
    Unit::Baseline
}

/// Whether the AVX-512 kernels run (the CPU has them and [`VECTOR_UNIT_ENV`] allows them).
pub(crate) fn avx512() -> bool {
    unit() == Unit::Avx512
}

/// The vector unit this process's CPU kernels run on: `"AVX-512"`, `"AVX2"` or
/// `"baseline x86-64"` (the best the CPU has, unless [`VECTOR_UNIT_ENV`] names a lower one).
///
/// `simd_dispatch`'s loops give the same bits on all three, but the matrix products do not:
/// with AVX-512 they run Ember's own GEMM kernel, otherwise matrixmultiply's sums (on Ember's AVX2
/// kernel where the CPU has AVX2 and FMA), in another order. A run is bit-identical across thread counts and reruns on one machine; between
/// machines whose vector units differ its first steps differ in the last digits, which training
/// can amplify (the quickstart's baseline runs: up to 3.6 BLEU); reports name the unit.
pub fn vector_unit() -> &'static str {
    unit().name()
}

/// `a[i] + b[i]` into `out`.
#[inline(always)]
fn add_generic(a: &[f32], b: &[f32], out: &mut [std::mem::MaybeUninit<f32>]) {
    for ((o, &a), &b) in out.iter_mut().zip(a).zip(b) {
        o.write(a + b);
    }
}
simd_dispatch!(pub(crate) add => add_generic(a: &[f32], b: &[f32], out: &mut [std::mem::MaybeUninit<f32>]) -> ());

/// `a[i]·b[i]` into `out`.
#[inline(always)]
fn mul_generic(a: &[f32], b: &[f32], out: &mut [std::mem::MaybeUninit<f32>]) {
    for ((o, &a), &b) in out.iter_mut().zip(a).zip(b) {
        o.write(a * b);
    }
}
simd_dispatch!(pub(crate) mul => mul_generic(a: &[f32], b: &[f32], out: &mut [std::mem::MaybeUninit<f32>]) -> ());

/// `a[i]·c + 0` into `out`: candle's `affine(c, 0)`, whose `+ 0` turns −0 into +0.
#[inline(always)]
fn scale_generic(a: &[f32], c: f32, out: &mut [std::mem::MaybeUninit<f32>]) {
    for (o, &a) in out.iter_mut().zip(a) {
        o.write(a * c + 0.0);
    }
}
simd_dispatch!(scale_into => scale_generic(a: &[f32], c: f32, out: &mut [std::mem::MaybeUninit<f32>]) -> ());

/// `x·c + 0` of every element (candle's `affine(c, 0)`), in parallel pieces.
pub(crate) fn scaled(x: &[f32], c: f32) -> Vec<f32> {
    crate::par::fill(x.len(), crate::par::ELEMENTS_PER_TASK, |r, out| {
        scale_into(&x[r], c, out)
    })
}

/// `a[i]·c + 0` in place.
#[inline(always)]
fn scale_assign_generic(a: &mut [f32], c: f32) {
    for a in a {
        *a = *a * c + 0.0;
    }
}
simd_dispatch!(scale_assign => scale_assign_generic(a: &mut [f32], c: f32) -> ());

/// [`scaled`] in place: the same values, without a second buffer.
pub(crate) fn scale_in_place(x: &mut [f32], c: f32) {
    let out = crate::par::SharedMut(x.as_mut_ptr());
    crate::par::for_each_chunk(x.len(), crate::par::ELEMENTS_PER_TASK, |r| {
        // SAFETY: the chunks are disjoint ranges of x, which outlives the parallel tasks.
        scale_assign(
            unsafe { std::slice::from_raw_parts_mut(out.at(r.start), r.len()) },
            c,
        )
    });
}

/// `c[i] += p[i]`.
#[inline(always)]
fn add_assign_generic(c: &mut [f32], p: &[f32]) {
    for (c, &p) in c.iter_mut().zip(p) {
        *c += p;
    }
}
simd_dispatch!(pub(crate) add_assign => add_assign_generic(c: &mut [f32], p: &[f32]) -> ());

/// `c[i] += p[i]` in parallel pieces: candle's add of two gradients, without a third buffer.
pub(crate) fn add_in_place(c: &mut [f32], p: &[f32]) {
    let out = crate::par::SharedMut(c.as_mut_ptr());
    crate::par::for_each_chunk(c.len(), crate::par::ELEMENTS_PER_TASK, |r| {
        // SAFETY: the chunks are disjoint ranges of c, which outlives the parallel tasks.
        add_assign(
            unsafe { std::slice::from_raw_parts_mut(out.at(r.start), r.len()) },
            &p[r],
        )
    });
}

#[cfg(test)]
mod tests {
    use super::{exp_fast, max_of, max_of_wide, sum, sum_wide};

    #[test]
    fn the_wide_reductions_agree_with_the_narrow_ones_at_every_length() {
        for len in [0usize, 1, 15, 16, 17, 100, 10_000, 10_007] {
            let mut a: Vec<f32> = (0..len)
                .map(|i| ((i * 7919) % 1013) as f32 * 0.37 - 150.0)
                .collect();
            assert_eq!(max_of_wide(&a).to_bits(), max_of(&a).to_bits(), "max of {len}");
            let exact: f64 = a.iter().map(|&x| x as f64).sum();
            let tol = 1e-6 * a.iter().map(|&x| x.abs() as f64).sum::<f64>() + 1e-9;
            assert!((sum_wide(&a) as f64 - exact).abs() <= tol, "sum of {len}");
            assert!((sum(&a) as f64 - exact).abs() <= tol, "sum of {len}");
            if len > 0 {
                // A NaN anywhere, in a lane or in the tail, makes the maximum NaN.
                a[len - 1] = f32::NAN;
                assert!(max_of_wide(&a).is_nan(), "NaN at the end of {len}");
                a[len - 1] = 0.0;
                a[0] = f32::NAN;
                assert!(max_of_wide(&a).is_nan(), "NaN at the start of {len}");
            }
        }
    }

    #[test]
    fn exp_fast_is_within_a_few_ulp_of_exp_over_the_whole_range() {
        let mut worst = 0f64;
        let mut x = -87.3f32;
        while x < 88.0 {
            let exact = (x as f64).exp();
            let rel = ((exp_fast(x) as f64 - exact) / exact).abs();
            worst = worst.max(rel);
            x += 0.0137;
        }
        assert!(
            worst < 4.0 * f32::EPSILON as f64,
            "worst relative error {worst:e}"
        );
        assert_eq!(exp_fast(0.0), 1.0);
    }

    #[test]
    fn exp_fast_saturates_and_propagates_nan() {
        assert_eq!(exp_fast(-87.31), 0.0);
        assert_eq!(exp_fast(-1e30), 0.0);
        assert_eq!(exp_fast(f32::NEG_INFINITY), 0.0);
        assert!(exp_fast(f32::INFINITY).is_finite() && exp_fast(f32::INFINITY) > 1e38);
        assert!(exp_fast(f32::NAN).is_nan());
    }
}

/// Not tests: nanoseconds per element of the reductions, as the kernels compile them.
#[cfg(test)]
mod reduce_timing {
    use super::*;

    #[inline(always)]
    fn sum_generic(a: &[f32]) -> f32 {
        sum(a)
    }
    #[inline(always)]
    fn sum_wide_generic(a: &[f32]) -> f32 {
        sum_wide(a)
    }
    #[inline(always)]
    fn max_generic(a: &[f32]) -> f32 {
        max_of(a)
    }
    #[inline(always)]
    fn max_wide_generic(a: &[f32]) -> f32 {
        max_of_wide(a)
    }
    simd_dispatch!(sum_d => sum_generic(a: &[f32]) -> f32);
    simd_dispatch!(sum_wide_d => sum_wide_generic(a: &[f32]) -> f32);
    simd_dispatch!(max_d => max_generic(a: &[f32]) -> f32);
    simd_dispatch!(max_wide_d => max_wide_generic(a: &[f32]) -> f32);

    /// A reduction as the kernels compile it.
    type Reduction = fn(&[f32]) -> f32;

    /// `cargo test --release -p ember-kernels --lib reduce_timing -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn print_ns_per_element() {
        let variants: [(&str, Reduction); 4] = [
            ("sum", sum_d),
            ("sum_wide", sum_wide_d),
            ("max_of", max_d),
            ("max_of_wide", max_wide_d),
        ];
        for len in [32usize, 128, 10_000] {
            let a: Vec<f32> = (0..len)
                .map(|i| ((i * 7919) % 1000) as f32 * 0.01 - 5.0)
                .collect();
            for (name, f) in variants {
                let mut best = f64::MAX;
                for _ in 0..20 {
                    let t = std::time::Instant::now();
                    for _ in 0..100 {
                        std::hint::black_box(f(std::hint::black_box(&a)));
                    }
                    best = best.min(t.elapsed().as_secs_f64() / 100.0);
                }
                println!("{len:>6} {name:>12}: {:.3} ns/element", best * 1e9 / len as f64);
            }
        }
    }
}
