//! The CUDA kernels' arithmetic (`cuda/norm.cuh`, run on the host by `cuda/norm_mirror.cpp`)
//! against this CPU kernel.

use super::{NormOp, NormType};
use crate::simd::{dot, sum};

extern "C" {
    fn ember_mirror_norm_forward(
        x: *const f32,
        w: *const f32,
        b: *const f32,
        vectors: u64,
        d: u32,
        layer: i32,
        eps: f32,
        y: *mut f32,
    );
    fn ember_mirror_norm_backward(
        x: *const f32,
        w: *const f32,
        g: *const f32,
        vectors: u64,
        d: u32,
        layer: i32,
        eps: f32,
        per_chunk: u64,
        dx: *mut f32,
        dw: *mut f32,
        db: *mut f32,
    );
}

/// The mirrors of the kernels with bf16 inputs or outputs (`_X_Y`: X the input's and dx's
/// element, Y the output's and its gradient's; u16 for bf16).
macro_rules! bf16_mirrors {
    ($($forward:ident, $backward:ident: $x:ty, $y:ty;)*) => {
        extern "C" {
            $(
                fn $forward(x: *const $x, w: *const f32, b: *const f32, vectors: u64, d: u32, layer: i32,
                    eps: f32, y: *mut $y);
                #[allow(clippy::too_many_arguments)]
                fn $backward(x: *const $x, w: *const f32, g: *const $y, vectors: u64, d: u32, layer: i32,
                    eps: f32, per_chunk: u64, dx: *mut $x, dw: *mut f32, db: *mut f32);
            )*
        }
    };
}
bf16_mirrors! {
    ember_mirror_norm_forward_f32_bf16, ember_mirror_norm_backward_f32_bf16: f32, u16;
    ember_mirror_norm_forward_bf16_bf16, ember_mirror_norm_backward_bf16_bf16: u16, u16;
    ember_mirror_norm_forward_bf16_f32, ember_mirror_norm_backward_bf16_f32: u16, f32;
}

extern "C" {
    fn ember_mirror_norm_value(x: f32, mean: f32, rstd: f32, w: f32, b: f32, has_bias: i32) -> f32;
    fn ember_mirror_norm_dx(x: f32, w: f32, g: f32, mean: f32, rstd: f32, m_gx: f32, m_gx_xhat: f32) -> f32;
}

fn random(n: usize, seed: u64, shift: f32) -> Vec<f32> {
    let mut rng = ember_rng::SplitMix64::new(seed);
    (0..n).map(|_| rng.normal() as f32 + shift).collect()
}

/// ‖a − b‖ / ‖b‖.
fn rel(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

const KINDS: [NormType; 2] = [NormType::Rms, NormType::Layer];

#[test]
fn the_device_norm_elements_are_the_cpu_elements_bit_for_bit() {
    // Given one vector's statistics and means (the CPU kernel's own), every output and
    // input-gradient element is the same expression, rounded the same way.
    let d = 77;
    for kind in KINDS {
        let op = NormOp {
            kind,
            eps: 1e-5,
            out: candle_core::DType::F32,
        };
        let (x, w, b, g) = (
            random(d, 1, 0.3),
            random(d, 2, 1.0),
            random(d, 3, 0.0),
            random(d, 4, 0.0),
        );
        let (mean, r) = op.stats(&x);
        let y = op.forward(&x, &w, Some(&b)).unwrap();
        let y_plain = op.forward(&x, &w, None).unwrap();
        let (dx, _, _) = op.backward(&x, &w, &g);
        let xhat: Vec<f32> = x.iter().map(|&v| (v - mean) * r).collect();
        let gx: Vec<f32> = g.iter().zip(&w).map(|(g, w)| g * w).collect();
        let inv_d = 1.0 / d as f32;
        let m_gx_xhat = dot(&gx, &xhat) * inv_d;
        let m_gx = match kind {
            NormType::Rms => 0.0,
            NormType::Layer => sum(&gx) * inv_d,
        };
        for i in 0..d {
            let (yb, yp, dxi) = unsafe {
                (
                    ember_mirror_norm_value(x[i], mean, r, w[i], b[i], 1),
                    ember_mirror_norm_value(x[i], mean, r, w[i], 0.0, 0),
                    ember_mirror_norm_dx(x[i], w[i], g[i], mean, r, m_gx, m_gx_xhat),
                )
            };
            assert_eq!(yb.to_bits(), y[i].to_bits(), "{kind:?} y[{i}]");
            assert_eq!(yp.to_bits(), y_plain[i].to_bits(), "{kind:?} y (no bias)[{i}]");
            assert_eq!(dxi.to_bits(), dx[i].to_bits(), "{kind:?} dx[{i}]");
        }
    }
}

#[test]
fn the_device_norm_of_whole_vectors_matches_the_cpu_kernel() {
    // The warp sums in another order than the CPU's eight lanes: the statistics, and so
    // every output, differ by float rounding only. Widths below, at and above a warp's 32,
    // not multiples of it, above a block's 1024; no vectors at all; chunks of the parameter
    // sums that do and do not divide the vector count.
    for (i, (vectors, d)) in [(7, 33), (130, 64), (3, 1), (20, 768), (2, 1500), (0, 48), (5, 5)]
        .into_iter()
        .enumerate()
    {
        for kind in KINDS {
            let op = NormOp {
                kind,
                eps: 1e-5,
                out: candle_core::DType::F32,
            };
            let n = vectors * d;
            let seed = 10 * i as u64;
            let (x, w, b, g) = (
                random(n, seed, 0.5),
                random(d, seed + 1, 1.0),
                random(d, seed + 2, 0.0),
                random(n, seed + 3, 0.0),
            );
            let cpu = op.forward(&x, &w, Some(&b)).unwrap();
            let mut y = vec![f32::NAN; n];
            unsafe {
                ember_mirror_norm_forward(
                    x.as_ptr(),
                    w.as_ptr(),
                    b.as_ptr(),
                    vectors as u64,
                    d as u32,
                    (kind == NormType::Layer) as i32,
                    1e-5,
                    y.as_mut_ptr(),
                )
            };
            let what = format!("{kind:?} {vectors}×{d}");
            assert!(rel(&y, &cpu) < 1e-6, "{what} forward: {:e}", rel(&y, &cpu));
            let (cdx, cdw, cdb) = op.backward(&x, &w, &g);
            for per_chunk in [1u64, 3, 64] {
                let (mut dx, mut dw, mut db) = (vec![f32::NAN; n], vec![f32::NAN; d], vec![f32::NAN; d]);
                unsafe {
                    ember_mirror_norm_backward(
                        x.as_ptr(),
                        w.as_ptr(),
                        g.as_ptr(),
                        vectors as u64,
                        d as u32,
                        (kind == NormType::Layer) as i32,
                        1e-5,
                        per_chunk,
                        dx.as_mut_ptr(),
                        dw.as_mut_ptr(),
                        db.as_mut_ptr(),
                    )
                };
                assert!(rel(&dx, &cdx) < 1e-5, "{what} dx: {:e}", rel(&dx, &cdx));
                assert!(rel(&dw, &cdw) < 1e-5, "{what} dw: {:e}", rel(&dw, &cdw));
                assert!(rel(&db, &cdb) < 1e-6, "{what} db: {:e}", rel(&db, &cdb));
                if vectors == 0 {
                    assert!(
                        dw.iter().chain(&db).all(|&v| v == 0.0),
                        "{what}: no vectors, no gradient"
                    );
                }
            }
        }
    }
}

/// An f32 or bf16 (u16) element, for the bf16 kernels' mirrors.
trait Element: Copy {
    const NAN: Self;
    fn from_f32(v: f32) -> Self;
    fn widen(self) -> f32;
}
impl Element for f32 {
    const NAN: Self = f32::NAN;
    fn from_f32(v: f32) -> Self {
        v
    }
    fn widen(self) -> f32 {
        self
    }
}
impl Element for u16 {
    const NAN: Self = u16::MAX;
    fn from_f32(v: f32) -> Self {
        half::bf16::from_f32(v).to_bits()
    }
    fn widen(self) -> f32 {
        f32::from_bits((self as u32) << 16)
    }
}

type Forward<X, Y> = unsafe extern "C" fn(*const X, *const f32, *const f32, u64, u32, i32, f32, *mut Y);
type Backward<X, Y> =
    unsafe extern "C" fn(*const X, *const f32, *const Y, u64, u32, i32, f32, u64, *mut X, *mut f32, *mut f32);

/// The kernels for inputs X and outputs Y are the f32 kernels on the widened inputs, each
/// output rounded once: the same bits, dw and db included.
fn between_casts<X: Element + PartialEq + std::fmt::Debug, Y: Element + PartialEq + std::fmt::Debug>(
    what: &str,
    forward: Forward<X, Y>,
    backward: Backward<X, Y>,
) {
    for (i, (vectors, d)) in [(7, 33), (130, 64), (3, 1), (2, 1500), (0, 48)]
        .into_iter()
        .enumerate()
    {
        let n = vectors * d;
        let seed = 100 + 10 * i as u64;
        let x: Vec<X> = random(n, seed, 0.5).into_iter().map(X::from_f32).collect();
        let g: Vec<Y> = random(n, seed + 3, 0.0).into_iter().map(Y::from_f32).collect();
        let (w, b) = (random(d, seed + 1, 1.0), random(d, seed + 2, 0.0));
        let xw: Vec<f32> = x.iter().map(|v| v.widen()).collect();
        let gw: Vec<f32> = g.iter().map(|v| v.widen()).collect();
        for layer in [0, 1] {
            let what = format!("{what} {vectors}×{d} layer {layer}");
            let (mut y, mut y32) = (vec![Y::NAN; n], vec![f32::NAN; n]);
            unsafe {
                forward(
                    x.as_ptr(),
                    w.as_ptr(),
                    b.as_ptr(),
                    vectors as u64,
                    d as u32,
                    layer,
                    1e-5,
                    y.as_mut_ptr(),
                );
                ember_mirror_norm_forward(
                    xw.as_ptr(),
                    w.as_ptr(),
                    b.as_ptr(),
                    vectors as u64,
                    d as u32,
                    layer,
                    1e-5,
                    y32.as_mut_ptr(),
                );
            }
            let rounded: Vec<Y> = y32.iter().map(|&v| Y::from_f32(v)).collect();
            assert_eq!(y, rounded, "{what}: forward");
            let (mut dx, mut dw, mut db) = (vec![X::NAN; n], vec![f32::NAN; d], vec![f32::NAN; d]);
            let (mut dx32, mut dw32, mut db32) = (vec![f32::NAN; n], vec![f32::NAN; d], vec![f32::NAN; d]);
            unsafe {
                backward(
                    x.as_ptr(),
                    w.as_ptr(),
                    g.as_ptr(),
                    vectors as u64,
                    d as u32,
                    layer,
                    1e-5,
                    3,
                    dx.as_mut_ptr(),
                    dw.as_mut_ptr(),
                    db.as_mut_ptr(),
                );
                ember_mirror_norm_backward(
                    xw.as_ptr(),
                    w.as_ptr(),
                    gw.as_ptr(),
                    vectors as u64,
                    d as u32,
                    layer,
                    1e-5,
                    3,
                    dx32.as_mut_ptr(),
                    dw32.as_mut_ptr(),
                    db32.as_mut_ptr(),
                );
            }
            let rounded: Vec<X> = dx32.iter().map(|&v| X::from_f32(v)).collect();
            assert_eq!(dx, rounded, "{what}: dx");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&dw), bits(&dw32), "{what}: dw");
            assert_eq!(bits(&db), bits(&db32), "{what}: db");
        }
    }
}

#[test]
fn the_bf16_norm_kernels_are_the_f32_kernels_between_casts_bit_for_bit() {
    between_casts::<f32, u16>(
        "f32 → bf16",
        ember_mirror_norm_forward_f32_bf16,
        ember_mirror_norm_backward_f32_bf16,
    );
    between_casts::<u16, u16>(
        "bf16 → bf16",
        ember_mirror_norm_forward_bf16_bf16,
        ember_mirror_norm_backward_bf16_bf16,
    );
    between_casts::<u16, f32>(
        "bf16 → f32",
        ember_mirror_norm_forward_bf16_f32,
        ember_mirror_norm_backward_bf16_f32,
    );
}
