//! The ops in bf16 on CUDA (`Precision::Bf16`: cuBLAS's bf16 GEMMs with f32 compute, their
//! outputs rounded to bf16; everything else Ember's f32 kernels or candle's f32 ops): each op
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
    within_bf16_of_f32(
        "linear_cross_entropy",
        &[h, w],
        &|t| kernels::linear_cross_entropy_in(&t[0], &t[1], &tg, &mg, 0.1, 1e-3, true, BF16).unwrap(),
        &|t| kernels::linear_cross_entropy(&t[0], &t[1], &tc, &mc, 0.1, 1e-3, true).unwrap(),
    );
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
