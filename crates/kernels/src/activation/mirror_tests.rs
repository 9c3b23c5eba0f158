//! The CUDA kernels' arithmetic (`cuda/activation.cuh`, run on the host by
//! `cuda/activation_mirror.cpp`, with the C library's erff and expf) against this CPU kernel.

use super::*;

extern "C" {
    fn ember_mirror_gelu(x: f32) -> f32;
    fn ember_mirror_gelu_slope(x: f32) -> f32;
    fn ember_mirror_swiglu(a: f32, u: f32) -> f32;
    fn ember_mirror_swiglu_bwd(a: f32, u: f32, g: f32, da: *mut f32, du: *mut f32);
    fn ember_mirror_gelu_fwd_f32(x: *const f32, y: *mut f32, n: u64);
    fn ember_mirror_gelu_bwd_f32(x: *const f32, g: *const f32, dx: *mut f32, n: u64);
    fn ember_mirror_swiglu_fwd_f32(a: *const f32, u: *const f32, y: *mut f32, n: u64);
    fn ember_mirror_swiglu_bwd_f32(
        a: *const f32,
        u: *const f32,
        g: *const f32,
        da: *mut f32,
        du: *mut f32,
        n: u64,
    );
    fn ember_mirror_gelu_fwd_bf16(x: *const u16, y: *mut u16, n: u64);
    fn ember_mirror_gelu_bwd_bf16(x: *const u16, g: *const u16, dx: *mut u16, n: u64);
    fn ember_mirror_swiglu_fwd_bf16(a: *const u16, u: *const u16, y: *mut u16, n: u64);
    fn ember_mirror_swiglu_bwd_bf16(
        a: *const u16,
        u: *const u16,
        g: *const u16,
        da: *mut u16,
        du: *mut u16,
        n: u64,
    );
}

/// −8 to 8 in steps of about 0.0013, and the special values.
fn inputs() -> Vec<f32> {
    let mut x: Vec<f32> = (0..12_001).map(|i| (i as f32 - 6000.0) / 750.0).collect();
    x.extend([0.0, -0.0, 1e-30, -1e-30, 20.0, -20.0, 90.0, -90.0]);
    x
}

#[test]
fn the_device_gelu_and_its_derivative_match_the_cpu_kernel() {
    // The CPU's erf is within 1.5·10⁻⁷ of erf, and its exp within a few ulp; erff and expf
    // are within a few ulp. gelu = (erf + 1)·0.5·x moves by 0.5·|x|·Δerf, the derivative by
    // 0.5·Δerf + 0.4·|x|·e^(−x²/2)·Δexp: tolerance 1.5·10⁻⁷·(1 + |x|) plus 2 ulp of the value.
    let x = inputs();
    let slope = GeluSlope::new(true, Precision::F32);
    let y = slope.forward(&x);
    let ones = vec![1f32; x.len()];
    let d = slope
        .backward(&ones, || unreachable!("the derivative was kept"))
        .unwrap();
    let recomputed = GeluSlope::new(false, Precision::F32)
        .backward(&ones, || Ok(Cow::Borrowed(&x)))
        .unwrap();
    for (i, &v) in x.iter().enumerate() {
        let (gy, gd) = unsafe { (ember_mirror_gelu(v), ember_mirror_gelu_slope(v)) };
        let tol = |c: f32| 1.5e-7 * (1.0 + v.abs()) + 2.0 * f32::EPSILON * c.abs();
        assert!((gy - y[i]).abs() <= tol(y[i]), "gelu({v}): {gy} vs {}", y[i]);
        assert!((gd - d[i]).abs() <= tol(d[i]), "gelu'({v}): {gd} vs {}", d[i]);
        assert_eq!(d[i].to_bits(), recomputed[i].to_bits());
    }
    // gelu(0) is 0 and gelu'(0) one half exactly on both.
    assert_eq!(unsafe { ember_mirror_gelu(0.0) }, 0.0);
    assert_eq!(unsafe { ember_mirror_gelu_slope(0.0) }, 0.5);
}

#[test]
fn the_bf16_kernels_are_the_f32_kernels_between_casts_bit_for_bit() {
    // `_bf16` reads bf16 activations and gradients, widens them exactly, computes as the f32
    // kernel does and rounds each output once: the f32 kernel's bits on the widened
    // inputs, rounded as candle's cast rounds (the CPU ops' contract on bf16 activations).
    let bits = |v: &[f32]| -> Vec<u16> { v.iter().map(|&x| half::bf16::from_f32(x).to_bits()).collect() };
    let wide = |v: &[u16]| -> Vec<f32> { v.iter().map(|&h| f32::from_bits((h as u32) << 16)).collect() };
    let mut rng = ember_rng::SplitMix64::new(6);
    let x = bits(&inputs());
    let (u, g) = (
        bits(&x.iter().map(|_| rng.normal() as f32).collect::<Vec<_>>()),
        bits(&x.iter().map(|_| rng.normal() as f32).collect::<Vec<_>>()),
    );
    let (xw, uw, gw) = (wide(&x), wide(&u), wide(&g));
    let n = x.len();
    let (mut y, mut y16) = (vec![f32::NAN; n], vec![u16::MAX; n]);
    let (mut d, mut d16) = (vec![f32::NAN; n], vec![u16::MAX; n]);
    unsafe {
        ember_mirror_gelu_fwd_f32(xw.as_ptr(), y.as_mut_ptr(), n as u64);
        ember_mirror_gelu_fwd_bf16(x.as_ptr(), y16.as_mut_ptr(), n as u64);
        ember_mirror_gelu_bwd_f32(xw.as_ptr(), gw.as_ptr(), d.as_mut_ptr(), n as u64);
        ember_mirror_gelu_bwd_bf16(x.as_ptr(), g.as_ptr(), d16.as_mut_ptr(), n as u64);
    }
    assert_eq!(y16, bits(&y), "gelu");
    assert_eq!(d16, bits(&d), "gelu backward");
    let (mut du, mut du16) = (vec![f32::NAN; n], vec![u16::MAX; n]);
    unsafe {
        ember_mirror_swiglu_fwd_f32(xw.as_ptr(), uw.as_ptr(), y.as_mut_ptr(), n as u64);
        ember_mirror_swiglu_fwd_bf16(x.as_ptr(), u.as_ptr(), y16.as_mut_ptr(), n as u64);
        ember_mirror_swiglu_bwd_f32(
            xw.as_ptr(),
            uw.as_ptr(),
            gw.as_ptr(),
            d.as_mut_ptr(),
            du.as_mut_ptr(),
            n as u64,
        );
        ember_mirror_swiglu_bwd_bf16(
            x.as_ptr(),
            u.as_ptr(),
            g.as_ptr(),
            d16.as_mut_ptr(),
            du16.as_mut_ptr(),
            n as u64,
        );
    }
    assert_eq!(y16, bits(&y), "swiglu");
    assert_eq!(d16, bits(&d), "swiglu: gate gradient");
    assert_eq!(du16, bits(&du), "swiglu: up gradient");
    // And the f32 bodies are the per-element functions the tests above check.
    for (i, &v) in xw.iter().enumerate() {
        assert_eq!(y[i].to_bits(), unsafe { ember_mirror_swiglu(v, uw[i]) }.to_bits());
    }
}

#[test]
fn the_device_swiglu_and_its_gradients_match_the_cpu_kernel() {
    // Only exp differs (expf against the CPU's exp_fast, both within a few ulp): relative
    // tolerance 8 ulp of each value's scale.
    let a = inputs();
    let mut rng = ember_rng::SplitMix64::new(5);
    let u: Vec<f32> = a.iter().map(|_| rng.normal() as f32).collect();
    let g: Vec<f32> = a.iter().map(|_| rng.normal() as f32).collect();
    let y = fill(a.len(), ELEMENTS_PER_TASK, |r, y| {
        swiglu_fwd(&a[r.clone()], &u[r], y)
    });
    let (da, du) = fill2(a.len(), ELEMENTS_PER_TASK, |r, da, du| {
        swiglu_bwd(&a[r.clone()], &u[r.clone()], &g[r], da, du)
    });
    let close = |m: f32, c: f32, scale: f32| (m - c).abs() <= 8.0 * f32::EPSILON * scale + 1e-30;
    for i in 0..a.len() {
        let my = unsafe { ember_mirror_swiglu(a[i], u[i]) };
        let (mut mda, mut mdu) = (f32::NAN, f32::NAN);
        unsafe { ember_mirror_swiglu_bwd(a[i], u[i], g[i], &mut mda, &mut mdu) };
        // silu(a) is at most |a|; its derivative at most 1.1.
        let s = a[i].abs().max(1.0);
        assert!(
            close(my, y[i], s * u[i].abs()),
            "swiglu({}, {}): {my} vs {}",
            a[i],
            u[i],
            y[i]
        );
        assert!(
            close(mdu, du[i], s * g[i].abs()),
            "du at a = {}: {mdu} vs {}",
            a[i],
            du[i]
        );
        assert!(
            close(mda, da[i], s * (g[i] * u[i]).abs()),
            "da at a = {}: {mda} vs {}",
            a[i],
            da[i]
        );
    }
}
