//! The ops in bf16 on CUDA (`Precision::Bf16`: cuBLAS's bf16 GEMMs with f32 compute, their
//! outputs rounded to bf16; everything else Ember's f32 kernels or candle's f32 ops, but for the
//! loss, which with every kernel on, as here, reads cuBLAS's bf16 logits through its bf16
//! variant: bf16_loss_and_optimizer.rs holds it to the widened logits' bits): each op
//! within bf16's rounding of the same op in f32 on the CPU — forward and every gradient — really
//! in bf16 (not the f32 op's values), and the same bits on a second run.

use crate::common::*;
use candle_core::{DType, Device, Tensor};
use ember_kernels as kernels;
use ember_kernels::{AttentionOptions, PositionScale, Precision, RopeTables};

const BF16: Precision = Precision::Bf16;

/// bf16 keeps 8 bits: a product of bf16 operands, its output rounded, and the gradients'
/// products the same way, land within a few 2⁻⁹ of f32's (relative, over the tensor).
const TOL: f64 = 2e-2;

/// `op_gpu` (bf16, on the GPU) against `op_cpu` (f32, on the CPU) on the same inputs.
fn within_bf16_of_f32(
    what: &str,
    inputs: &[Tensor],
    op_gpu: &dyn Fn(&[Tensor]) -> Tensor,
    op_cpu: &dyn Fn(&[Tensor]) -> Tensor,
) {
    let dev = gpu();
    let on_gpu: Vec<Tensor> = inputs.iter().map(|t| t.to_device(&dev).unwrap()).collect();
    let probe = randn_cpu(99, op_cpu(inputs).dims(), 1.0);
    let (y, g) = run(&on_gpu, &probe.to_device(&dev).unwrap(), op_gpu);
    let (y_again, g_again) = run(&on_gpu, &probe.to_device(&dev).unwrap(), op_gpu);
    let (y_cpu, g_cpu) = run(inputs, &probe, op_cpu);
    // What the first GPU run measures, to set TOL by.
    let errors: Vec<String> = std::iter::once(&y)
        .chain(&g)
        .zip(std::iter::once(&y_cpu).chain(&g_cpu))
        .map(|(a, b)| format!("{:.1e}", rel_error(a, b)))
        .collect();
    eprintln!("{what}: relative error of the forward and each gradient against f32: {errors:?}");
    assert!(same_bits(&y, &y_again), "{what}: forward not repeatable");
    assert_close(&format!("{what} forward"), &y, &y_cpu, TOL);
    let e = rel_error(&y, &y_cpu);
    assert!(e > 1e-6, "{what}: within {e:e} of f32: not computed in bf16");
    for (i, ((a, b), c)) in g.iter().zip(&g_again).zip(&g_cpu).enumerate() {
        assert!(same_bits(a, b), "{what}: gradient {i} not repeatable");
        assert_close(&format!("{what} gradient {i}"), a, c, TOL);
    }
}

#[test]
fn projections_in_bf16_are_within_its_rounding_of_f32() {
    let dev = gpu();
    let tables_gpu = RopeTables::new(8, 64, 10_000.0, DType::F32, &dev).unwrap();
    let tables_cpu = RopeTables::new(8, 64, 10_000.0, DType::F32, &Device::Cpu).unwrap();
    let logn = PositionScale {
        scale: 0.35,
        logn_length: Some(4),
    };
    let x = randn_cpu(1, &[2, 19, 48], 1.0);
    let w = randn_cpu(2, &[64, 48], 0.3);
    let stream = randn_cpu(3, &[2, 19, 64], 1.0);
    let xw = [x.clone(), w.clone()];
    within_bf16_of_f32(
        "linear",
        &xw,
        &|t| kernels::linear_in(&t[0], &t[1], BF16).unwrap(),
        &|t| kernels::linear(&t[0], &t[1]).unwrap(),
    );
    within_bf16_of_f32(
        "linear_gelu",
        &xw,
        &|t| kernels::linear_gelu_in(&t[0], &t[1], BF16).unwrap(),
        &|t| kernels::linear_gelu(&t[0], &t[1]).unwrap(),
    );
    within_bf16_of_f32(
        "linear_scaled",
        &xw,
        &|t| kernels::linear_scaled_in(&t[0], &t[1], -0.3, BF16).unwrap(),
        &|t| kernels::linear_scaled(&t[0], &t[1], -0.3).unwrap(),
    );
    for scale in [PositionScale::from(1.0), logn] {
        within_bf16_of_f32(
            &format!("linear_rope {scale:?}"),
            &xw,
            &|t| kernels::linear_rope_in(&t[0], &t[1], &tables_gpu, 3, scale, BF16).unwrap(),
            &|t| kernels::linear_rope(&t[0], &t[1], &tables_cpu, 3, scale).unwrap(),
        );
    }
    within_bf16_of_f32(
        "linear_residual",
        &[stream, x, w],
        &|t| kernels::linear_residual_in(&t[0], &t[1], &t[2], 0.0, 7, BF16).unwrap(),
        &|t| kernels::linear_residual(&t[0], &t[1], &t[2], 0.0, 7).unwrap(),
    );
}

#[test]
fn the_output_layer_and_loss_in_bf16_are_within_its_rounding_of_f32() {
    let (rows, d, vocab) = (150, 32, 3_000);
    let h = randn_cpu(4, &[rows, d], 1.0);
    let w = randn_cpu(5, &[vocab, d], 0.5);
    let targets: Vec<u32> = (0..rows).map(|j| ((j * 7 + 1) % vocab) as u32).collect();
    let mask: Vec<f32> = (0..rows).map(|j| if j % 3 == 2 { 0.0 } else { 1.0 }).collect();
    let on = |dev: &Device| {
        (
            Tensor::new(targets.as_slice(), dev).unwrap(),
            Tensor::new(mask.as_slice(), dev).unwrap(),
        )
    };
    let ((tg, mg), (tc, mc)) = (on(&gpu()), on(&Device::Cpu));
    // With `grads` the backward pass reads the forward pass's probabilities; without, it makes
    // the logits again (the same bf16 GEMM).
    for grads in [true, false] {
        within_bf16_of_f32(
            &format!("linear_cross_entropy, grads {grads}"),
            &[h.clone(), w.clone()],
            &|t| kernels::linear_cross_entropy_in(&t[0], &t[1], &tg, &mg, 0.1, 1e-3, grads, BF16).unwrap(),
            &|t| kernels::linear_cross_entropy(&t[0], &t[1], &tc, &mc, 0.1, 1e-3, grads).unwrap(),
        );
    }
}

#[test]
fn attention_in_bf16_is_within_its_rounding_of_f32() {
    let opts = |precision| AttentionOptions {
        heads: 4,
        kv_heads: 2,
        dropout: None,
        telemetry: false,
        precision,
    };
    let (bf16, f32) = (opts(BF16), opts(Precision::F32));
    let q = randn_cpu(6, &[2, 33, 64], 0.5);
    let k = randn_cpu(7, &[2, 33, 32], 1.0);
    let v = randn_cpu(8, &[2, 33, 32], 1.0);
    let causal = |dev: &Device| kernels::causal_mask(33, 0, DType::F32, dev).unwrap();
    let (mg, mc) = (causal(&gpu()), causal(&Device::Cpu));
    within_bf16_of_f32(
        "attention",
        &[q, k, v],
        &|t| {
            kernels::attention(&t[0], &t[1], &t[2], Some(&mg), &bf16)
                .unwrap()
                .0
        },
        &|t| {
            kernels::attention(&t[0], &t[1], &t[2], Some(&mc), &f32)
                .unwrap()
                .0
        },
    );
}

/// Attention in bf16 on the GPU computes what the CPU's does: where the shape fits the fused
/// kernels, their products' operands rounded to bf16 and f32 sums, the CPU kernel's arithmetic
/// (only the order of the sums differs; its host mirror holds the kernels' algorithm to the CPU
/// kernel on every machine); for longer sequences cuBLAS's bf16 GEMMs around the fused softmax,
/// within bf16's rounding. Masks, dropout and grouped heads; the same bits on a second run.
#[test]
fn attention_in_bf16_is_the_cpu_attention_in_bf16() {
    let dev = gpu();
    // The reference: the CPU kernel (the same arithmetic; its products emulated with
    // AVX512_BF16's bits where the CPU has none), else — where this build's CPU kernel cannot
    // run bf16 at all — the CPU composition of the rounded operands (its backward pass rounds dP
    // and the gradients it returns where the kernels round dS and dO, so the gradients agree to
    // bf16's rounding only: 2–5e-3 by a model of both).
    kernels::emulate_bf16_products();
    let cpu_kernel = BF16.missing_cpu_feature().is_none();
    for (shape, fused) in [
        ((16, 4, 4, 37, 41, 32), true),
        ((8, 4, 2, 18, 29, 32), true),
        ((4, 6, 6, 64, 64, 16), true),
        ((2, 6, 6, 256, 256, 64), false),
    ] {
        let (b, h, hkv, t, s, d) = shape;
        let q = randn_cpu(10, &[b, t, h * d], 0.5);
        let k = randn_cpu(11, &[b, s, hkv * d], 1.0);
        let v = randn_cpu(12, &[b, s, hkv * d], 1.0);
        let causal = |dev: &Device| kernels::causal_mask(t, s.saturating_sub(t), DType::F32, dev).unwrap();
        for dropout in [None, Some((0.1, 3))] {
            let opts = AttentionOptions {
                heads: h,
                kv_heads: hkv,
                dropout,
                telemetry: false,
                precision: BF16,
            };
            assert_eq!(
                kernels::cuda_fuses(q.dims(), k.dims(), &opts, true),
                fused,
                "{shape:?}: not the path this case is for"
            );
            let (mg, mc) = (causal(&dev), causal(&Device::Cpu));
            let what = format!("attention {shape:?} dropout {dropout:?} in bf16");
            let inputs = [q.clone(), k.clone(), v.clone()];
            let on_gpu: Vec<Tensor> = inputs.iter().map(|x| x.to_device(&dev).unwrap()).collect();
            let probe = randn_cpu(13, q.dims(), 1.0);
            let gpu_op = |x: &[Tensor]| {
                kernels::attention(&x[0], &x[1], &x[2], Some(&mg), &opts)
                    .unwrap()
                    .0
            };
            let f32_opts = AttentionOptions {
                precision: Precision::F32,
                ..opts
            };
            let f32_op = |x: &[Tensor]| {
                kernels::attention(&x[0], &x[1], &x[2], Some(&mc), &f32_opts)
                    .unwrap()
                    .0
            };
            let cpu_op = |x: &[Tensor]| {
                if cpu_kernel {
                    kernels::attention(&x[0], &x[1], &x[2], Some(&mc), &opts)
                        .unwrap()
                        .0
                } else {
                    kernels::attention_unfused(&x[0], &x[1], &x[2], Some(&mc), &opts)
                        .unwrap()
                        .0
                }
            };
            let (y, g) = run(&on_gpu, &probe.to_device(&dev).unwrap(), &gpu_op);
            let (y_again, g_again) = run(&on_gpu, &probe.to_device(&dev).unwrap(), &gpu_op);
            let (y_cpu, g_cpu) = run(&inputs, &probe, &cpu_op);
            let (y_f32, g_f32) = run(&inputs, &probe, &f32_op);
            // The fused kernels against the CPU kernel: f32 sums in another order, and now and
            // then a value the two orders leave an ulp apart rounded to neighbouring bf16 values.
            // cuBLAS's path rounds its outputs to bf16 as well.
            let (forward_tol, gradient_tol) = match (fused, cpu_kernel) {
                (true, true) => (1e-4, 1e-4),
                (true, false) => (1e-4, 1e-2),
                (false, _) => (TOL, TOL),
            };
            eprintln!(
                "{what}: against the CPU's, forward {:.1e}, gradients {:?}",
                rel_error(&y, &y_cpu),
                g.iter()
                    .zip(&g_cpu)
                    .map(|(a, c)| format!("{:.1e}", rel_error(a, c)))
                    .collect::<Vec<_>>()
            );
            assert!(same_bits(&y, &y_again), "{what}: forward not repeatable");
            assert_close(&format!("{what} forward"), &y, &y_cpu, forward_tol);
            // Really in bf16: f32's results are some 2e-3 or more away (f32's rounding: 1e-6).
            assert!(rel_error(&y, &y_f32) > 1e-4, "{what}: forward within f32's");
            for (i, (((a, again), c), f)) in g.iter().zip(&g_again).zip(&g_cpu).zip(&g_f32).enumerate() {
                assert!(same_bits(a, again), "{what}: gradient {i} not repeatable");
                assert_close(&format!("{what} gradient {i}"), a, c, gradient_tol);
                assert!(rel_error(a, f) > 1e-4, "{what}: gradient {i} within f32's");
            }
        }
    }
}
