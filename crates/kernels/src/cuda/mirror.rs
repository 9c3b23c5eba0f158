//! The CUDA kernels' shared arithmetic (`cuda/common.cuh`), compiled as C++ for the host
//! (`cuda/host_mirror.cpp`), against the Rust CPU kernels: what the GPU computes per element is
//! checked on every machine, GPU or not.

use crate::dropout::DropoutOp;
use crate::ledger;

/// `EmberAdamW` of common.cuh.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct MirrorAdamW {
    pub grad_scale: f32,
    pub beta1: f32,
    pub one_minus_beta1: f32,
    pub beta2: f32,
    pub one_minus_beta2: f32,
    pub inv_bc1: f32,
    pub inv_bc2: f32,
    pub eps: f32,
    pub decay: f32,
    pub lr: f32,
}

extern "C" {
    fn ember_mirror_draw_at(state: u64, i: u64) -> u64;
    fn ember_mirror_exp_fast(x: f32) -> f32;
    fn ember_mirror_round_bf16(x: f32) -> f32;
    fn ember_mirror_store_bf16(x: f32) -> u16;
    fn ember_mirror_load_bf16(x: u16) -> f32;
    fn ember_mirror_dropout_value(v: f32, state: u64, threshold: u64, keep: f32, i: u64) -> f32;
    fn ember_mirror_adamw(theta: *mut f32, g: *const f32, m: *mut f32, v: *mut f32, n: u64, c: MirrorAdamW);
    fn ember_mirror_adamw_bf16(
        theta: *mut f32,
        g: *const u16,
        m: *mut f32,
        v: *mut f32,
        n: u64,
        c: MirrorAdamW,
    );
    fn ember_mirror_dropout_bf16(x: *const u16, y: *mut u16, n: u64, state: u64, threshold: u64, keep: f32);
    #[allow(clippy::too_many_arguments)]
    fn ember_mirror_finish_step(
        ledger: *mut f64,
        partials: *const f64,
        count: u32,
        objective: f64,
        nll: f64,
        tokens: f64,
        max_norm: f64,
        spike_loss: f64,
        stop: i32,
        beta1: f64,
        beta2: f64,
        step: u64,
    );
}

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = ember_rng::SplitMix64::new(seed);
    (0..n).map(|_| rng.normal() as f32).collect()
}

#[test]
fn the_device_counter_is_splitmix64() {
    for (state, i) in [(0, 1), (1, 1), (u64::MAX, 7), (0x1234_5678_9abc_def0, 1 << 40)] {
        assert_eq!(
            unsafe { ember_mirror_draw_at(state, i) },
            ember_rng::draw_at(state, i)
        );
    }
}

#[test]
fn the_device_exponential_is_exp_fast_bit_for_bit() {
    // The softmax's and the cross-entropy's e^x: special values, the clamp's edges, a sweep and
    // random values.
    let mut xs = vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        -0.5,
        -87.2,
        -87.29,
        -87.3,
        -87.31,
        -87.4,
        -88.0,
        88.0,
        88.1,
        88.5,
        1e4,
        1e-30,
        -1e-30,
        1e30,
        -1e9,
        -1e30,
        f32::MIN_POSITIVE,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ];
    xs.extend((0..14_600).map(|i| -100.0 + i as f32 * 0.0137));
    xs.extend(random(20_000, 7).into_iter().map(|x| x * 30.0));
    for x in xs {
        let (d, c) = (unsafe { ember_mirror_exp_fast(x) }, crate::simd::exp_fast(x));
        let same = d.to_bits() == c.to_bits() || (d.is_nan() && c.is_nan());
        assert!(same, "e^{x:e}: device {d:e}, CPU {c:e}");
    }
}

#[test]
fn the_device_bf16_rounding_is_the_cpu_cast_bit_for_bit() {
    // What bf16 attention on the GPU does to its products' operands, against candle's cast
    // (Precision::round): ties both ways, the carry into the exponent, overflow to infinity,
    // subnormals, signed zeros, NaNs with and without the quiet bit, and random values.
    let mut bits: Vec<u32> = vec![
        0x3f80_8000, // 1 + 2⁻⁸: a tie, even below (stays)
        0x3f81_8000, // a tie, odd below (goes up)
        0x3f80_8001, // just above a tie
        0x3f80_7fff, // just below
        0x3fff_ffff, // carries into the exponent
        0x7f7f_ffff, // f32::MAX: rounds to infinity
        0x7f7f_7fff,
        0x0000_0001, // the smallest subnormal
        0x0000_8000,
        0x0000_8001,
        0x007f_ffff,
        0x8000_0000,
        0x0000_0000,
        0x7f80_0000,
        0xff80_0000,
        0x7f80_0001, // a signalling NaN whose payload is in the low half only
        0x7fc0_0000,
        0xffbf_ffff,
    ];
    bits.extend((0..=u16::MAX as u32).map(|hi| (hi << 16) | 0x8000));
    bits.extend(random(50_000, 11).into_iter().map(|x| (x * 1e3).to_bits()));
    for b in bits {
        let x = f32::from_bits(b);
        let device = unsafe { ember_mirror_round_bf16(x) };
        let cpu = half::bf16::from_f32(x).to_f32();
        assert_eq!(
            device.to_bits(),
            cpu.to_bits(),
            "{b:#010x}: device {device:e}, CPU {cpu:e}"
        );
    }
}

#[test]
fn the_device_bf16_elements_are_candles_bit_for_bit() {
    // The kernels' bf16 variants read a bf16 activation as the CPU ops widen one (the top half
    // of an f32, exactly; signalling NaNs stay signalling, where the half crate's `to_f32`
    // would quieten them) and write one as candle's cast rounds it: all 65,536 bf16 values
    // widen alike, and a store of an f32 keeps the bits of `bf16::from_f32`.
    for b in 0..=u16::MAX {
        let (device, cpu) = (
            unsafe { ember_mirror_load_bf16(b) },
            f32::from_bits((b as u32) << 16),
        );
        assert_eq!(device.to_bits(), cpu.to_bits(), "load {b:#06x}");
    }
    let mut xs: Vec<f32> = (0..=u16::MAX as u32)
        .flat_map(|hi| {
            [
                hi << 16,
                (hi << 16) | 0x8000,
                (hi << 16) | 0x8001,
                (hi << 16) | 0x7fff,
            ]
        })
        .map(f32::from_bits)
        .collect();
    xs.extend(random(50_000, 12).into_iter().map(|x| x * 1e3));
    for x in xs {
        let (device, cpu) = (
            unsafe { ember_mirror_store_bf16(x) },
            half::bf16::from_f32(x).to_bits(),
        );
        assert_eq!(device, cpu, "store {:#010x} ({x:e})", x.to_bits());
    }
}

#[test]
fn the_device_dropout_mask_is_the_cpu_mask_bit_for_bit() {
    // Special values too: a dropped NaN or -0.0 must come out +0.0 as on the CPU.
    let mut x = random(4099, 3);
    x[..4].copy_from_slice(&[f32::NAN, -0.0, f32::INFINITY, 1e-30]);
    for p in [0.1, 0.3, 0.5, 0.9] {
        let op = DropoutOp::new(p, 0xDEAD_BEEF).unwrap();
        let cpu = crate::dropout::dropout_apply(op, &x);
        for (i, (&v, &c)) in x.iter().zip(&cpu).enumerate() {
            let (state, threshold, keep) = op.parts();
            let d = unsafe { ember_mirror_dropout_value(v, state, threshold, keep, i as u64) };
            assert_eq!(d.to_bits(), c.to_bits(), "p {p}, element {i}: {d} vs {c}");
        }
    }
}

#[test]
fn the_device_adamw_update_is_the_cpu_update_bit_for_bit() {
    use candle_core::{DType, Device, Tensor, Var};

    use crate::adamw::{adamw_step, AdamWStep, Moments};
    let n = 1000;
    let c = AdamWStep {
        lr: 3e-3,
        beta1: 0.9,
        beta2: 0.98,
        eps: 1e-8,
        decay: 1.0 - 3e-3 * 0.01,
        bias_correction1: 1.0 - 0.9f64.powi(3),
        bias_correction2: 1.0 - 0.98f64.powi(3),
        grad_scale: 0.37,
    };
    let mc = MirrorAdamW {
        grad_scale: c.grad_scale as f32,
        beta1: c.beta1 as f32,
        one_minus_beta1: (1.0 - c.beta1) as f32,
        beta2: c.beta2 as f32,
        one_minus_beta2: (1.0 - c.beta2) as f32,
        inv_bc1: (1.0 / c.bias_correction1) as f32,
        inv_bc2: (1.0 / c.bias_correction2) as f32,
        eps: c.eps as f32,
        decay: c.decay as f32,
        lr: c.lr as f32,
    };
    // An f32 gradient (ember_adamw) and a bf16 one (ember_adamw_bf16, mixed precision's).
    for dtype in [DType::F32, DType::BF16] {
        let theta = random(n, 1);
        let var = Var::from_tensor(&Tensor::from_slice(&theta, n, &Device::Cpu).unwrap()).unwrap();
        let mut moments = Moments::Host {
            m: random(n, 3),
            v: random(n, 4).iter().map(|x| x * x).collect(),
        };
        let (mut m, mut v) = match &moments {
            Moments::Host { m, v } => (m.clone(), v.clone()),
            _ => unreachable!(),
        };
        let g = random(n, 2);
        let gt = Tensor::from_slice(&g, n, &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        adamw_step(&var, &gt, &mut moments, &c).unwrap();
        let mut t = theta.clone();
        unsafe {
            if dtype == DType::BF16 {
                let g16: Vec<u16> = gt
                    .to_vec1::<half::bf16>()
                    .unwrap()
                    .iter()
                    .map(|h| h.to_bits())
                    .collect();
                ember_mirror_adamw_bf16(
                    t.as_mut_ptr(),
                    g16.as_ptr(),
                    m.as_mut_ptr(),
                    v.as_mut_ptr(),
                    n as u64,
                    mc,
                )
            } else {
                ember_mirror_adamw(
                    t.as_mut_ptr(),
                    g.as_ptr(),
                    m.as_mut_ptr(),
                    v.as_mut_ptr(),
                    n as u64,
                    mc,
                )
            }
        };
        let cpu: Vec<f32> = var.as_tensor().to_vec1().unwrap();
        let Moments::Host { m: cm, v: cv } = &moments else {
            unreachable!()
        };
        for i in 0..n {
            assert_eq!(t[i].to_bits(), cpu[i].to_bits(), "{dtype:?} θ[{i}]");
            assert_eq!(m[i].to_bits(), cm[i].to_bits(), "{dtype:?} m[{i}]");
            assert_eq!(v[i].to_bits(), cv[i].to_bits(), "{dtype:?} v[{i}]");
        }
    }
}

#[test]
fn the_device_bf16_dropout_is_the_cpu_ops_bit_for_bit() {
    use candle_core::{DType, Device, Tensor};

    let mut x = random(4099, 5);
    x[..4].copy_from_slice(&[f32::NAN, -0.0, f32::INFINITY, 1e-30]);
    let xt = Tensor::from_slice(&x, x.len(), &Device::Cpu)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    let x16: Vec<u16> = xt
        .to_vec1::<half::bf16>()
        .unwrap()
        .iter()
        .map(|h| h.to_bits())
        .collect();
    for p in [0.1, 0.5] {
        let cpu: Vec<u16> = crate::dropout::dropout(&xt, p, 0xF00D)
            .unwrap()
            .to_vec1::<half::bf16>()
            .unwrap()
            .iter()
            .map(|h| h.to_bits())
            .collect();
        let (state, threshold, keep) = DropoutOp::new(p, 0xF00D).unwrap().parts();
        let mut y = vec![0u16; x.len()];
        unsafe {
            ember_mirror_dropout_bf16(
                x16.as_ptr(),
                y.as_mut_ptr(),
                x.len() as u64,
                state,
                threshold,
                keep,
            )
        };
        assert_eq!(y, cpu, "p {p}");
    }
}

/// One step through the device's verdict, from a fresh ledger.
fn finish(ledger: &mut [f64; ledger::LEN], partials: &[f64], objective: f64, stop: bool, step: u64) {
    unsafe {
        ember_mirror_finish_step(
            ledger.as_mut_ptr(),
            partials.as_ptr(),
            partials.len() as u32,
            objective,
            objective * 0.9,
            100.0,
            1.0,
            50.0,
            stop as i32,
            0.9,
            0.98,
            step,
        )
    }
}

#[test]
fn the_device_verdict_clips_counts_and_corrects_bias_as_the_host_does() {
    let mut l = [0f64; ledger::LEN];
    // ‖g‖² = 4 + 12: norm 4, clipped to 1.
    finish(&mut l, &[4.0, 12.0], 250.0, false, 1);
    assert_eq!(l[ledger::NORM], 4.0);
    assert_eq!(l[ledger::SCALE], 1.0 / (4.0 + 1e-6));
    assert_eq!(l[ledger::APPLY], 1.0);
    assert_eq!(l[ledger::UPDATES], 1.0);
    assert_eq!((l[ledger::INV_BC1] as f32), (1.0 / (1.0 - 0.9f64)) as f32);
    assert_eq!((l[ledger::INV_BC2] as f32), (1.0 / (1.0 - 0.98f64)) as f32);
    assert_eq!((l[ledger::W_LOSS], l[ledger::W_TOKENS]), (250.0, 100.0));
    // A gradient that is not finite: skipped, counted, named by index; the bias corrections
    // stay those of the last applied update.
    finish(&mut l, &[1.0, f64::INFINITY], 240.0, false, 2);
    assert_eq!(l[ledger::APPLY], 0.0);
    assert_eq!((l[ledger::SKIPPED], l[ledger::W_SKIPPED]), (1.0, 1.0));
    assert_eq!((l[ledger::W_FIRST_BAD], l[ledger::W_FIRST_WHAT]), (2.0, 1.0));
    assert_eq!(l[ledger::UPDATES], 1.0);
    assert_eq!(
        l[ledger::W_TOKENS],
        200.0,
        "the loss was finite: its tokens count"
    );
    assert_eq!(l[ledger::W_SPIKED], 0.0);
    // A NaN loss spikes; and under `stop` every later update is held back.
    finish(&mut l, &[1.0], f64::NAN, true, 3);
    assert_eq!(
        (l[ledger::APPLY], l[ledger::STOPPED], l[ledger::W_SPIKED]),
        (0.0, 3.0, 1.0)
    );
    finish(&mut l, &[1.0], 10.0, true, 4);
    assert_eq!((l[ledger::APPLY], l[ledger::STOPPED]), (0.0, 3.0));
    assert_eq!(l[ledger::SKIPPED], 1.0, "stopping is not skipping");
    // Without an initial validation loss (spike_loss < 0) nothing counts as a spike.
    let mut fresh = [0f64; ledger::LEN];
    unsafe {
        ember_mirror_finish_step(
            fresh.as_mut_ptr(),
            [1.0].as_ptr(),
            1,
            f64::NAN,
            0.0,
            1.0,
            1.0,
            -1.0,
            0,
            0.9,
            0.98,
            1,
        )
    };
    assert_eq!(fresh[ledger::W_SPIKED], 0.0);
}
