//! The bf16 variants of the norm, activation, rope and attention kernels (`Kernel::Bf16`; the
//! softmax, dropout, loss and optimizer ones: bf16_loss_and_optimizer.rs): on bf16
//! activations each op is its f32 kernel between casts — the inputs widened exactly, the f32
//! kernel's arithmetic, the output and every bf16 input's gradient rounded once — so the same
//! bits as the f32 kernel on the GPU wrapped in candle's casts, forward and backward, on
//! contiguous and strided inputs. (The CPU ops keep the same contract on bf16 activations:
//! tests/bf16_activations.rs; the kernels' load and store are checked against candle's casts on
//! the host: `cuda::mirror`.)

use crate::common::*;
use candle_core::{DType, Tensor};
use ember_kernels as kernels;
use ember_kernels::{causal_mask, cuda_fuses, AttentionOptions, PositionScale, Precision, RopeTables};

fn bf16(t: &Tensor) -> Tensor {
    t.to_dtype(DType::BF16).unwrap()
}

/// `op` on `inputs` (some bf16) against `f32_op` on them widened, its output cast to `out`:
/// the output in `out` and each gradient in its input's dtype, all the same bits.
pub(crate) fn between_casts(
    what: &str,
    inputs: &[Tensor],
    out: DType,
    op: &dyn Fn(&[Tensor]) -> Tensor,
    f32_op: &dyn Fn(&[Tensor]) -> Tensor,
) {
    between_casts_within(what, inputs, out, op, f32_op, None)
}

/// [`between_casts`], the gradients within `gradient_tol` (relative) where it is given, for an
/// op whose backward pass reads its own rounded output.
pub(crate) fn between_casts_within(
    what: &str,
    inputs: &[Tensor],
    out: DType,
    op: &dyn Fn(&[Tensor]) -> Tensor,
    f32_op: &dyn Fn(&[Tensor]) -> Tensor,
    gradient_tol: Option<f64>,
) {
    let dev = inputs[0].device().clone();
    let probe = randn(&dev, 97, op(inputs).dims(), 1.0);
    let (y, g) = run(inputs, &probe, op);
    let reference = |ts: &[Tensor]| {
        let wide: Vec<Tensor> = ts.iter().map(|t| t.to_dtype(DType::F32).unwrap()).collect();
        f32_op(&wide).to_dtype(out).unwrap()
    };
    let (y_ref, g_ref) = run(inputs, &probe, &reference);
    assert_eq!(y.dtype(), out, "{what}: output dtype");
    assert!(
        same_bits(&y, &y_ref),
        "{what}: output differs from the f32 kernel between casts"
    );
    for (i, ((a, b), input)) in g.iter().zip(&g_ref).zip(inputs).enumerate() {
        assert_eq!(a.dtype(), input.dtype(), "{what}: gradient {i} dtype");
        match gradient_tol {
            None => assert!(
                same_bits(a, b),
                "{what}: gradient {i} differs from the f32 kernel's between casts"
            ),
            Some(tol) => assert_close(&format!("{what}: gradient {i}"), a, b, tol),
        }
    }
    let (y2, g2) = run(inputs, &probe, op);
    assert!(same_bits(&y, &y2), "{what}: forward not repeatable");
    for (i, (a, b)) in g.iter().zip(&g2).enumerate() {
        assert!(same_bits(a, b), "{what}: gradient {i} not repeatable");
    }
}

pub(crate) fn layouts(inputs: &[Tensor]) -> [(&'static str, Vec<Tensor>); 2] {
    [
        ("contiguous", inputs.to_vec()),
        ("strided", inputs.iter().map(strided).collect()),
    ]
}

#[test]
fn norms_on_bf16_activations_are_the_f32_kernel_between_casts() {
    let dev = gpu();
    // A residual stream's norm (a gain of D, widths around a warp and above a block) and
    // QK-norm over the heads of a projection (a gain of head_dim).
    for (i, (shape, d)) in [
        (&[3usize, 5, 128][..], 128usize),
        (&[7, 33], 33),
        (&[2, 3, 1500], 1500),
        (&[4, 9, 4 * 24], 24),
    ]
    .into_iter()
    .enumerate()
    {
        let seed = 900 + 10 * i as u64;
        let x = (randn(&dev, seed, shape, 1.5) + 0.7).unwrap();
        let w = (randn(&dev, seed + 1, &[d], 0.3) + 1.0).unwrap();
        let b = randn(&dev, seed + 2, &[d], 0.2);
        for (input, out) in [
            (DType::F32, DType::BF16),
            (DType::BF16, DType::BF16),
            (DType::BF16, DType::F32),
        ] {
            let x = x.to_dtype(input).unwrap();
            for (label, v) in layouts(&[x, w.clone(), b.clone()]) {
                let what = format!("{shape:?} gain {d} {input:?} → {out:?} {label}");
                between_casts(
                    &format!("rms_norm {what}"),
                    &v[..2],
                    out,
                    &|t| kernels::rms_norm_as(&t[0], &t[1], 1e-5, out).unwrap(),
                    &|t| kernels::rms_norm(&t[0], &t[1], 1e-5).unwrap(),
                );
                between_casts(
                    &format!("layer_norm {what}"),
                    &v,
                    out,
                    &|t| kernels::layer_norm_as(&t[0], &t[1], Some(&t[2]), 1e-5, out).unwrap(),
                    &|t| kernels::layer_norm(&t[0], &t[1], Some(&t[2]), 1e-5).unwrap(),
                );
                between_casts(
                    &format!("layer_norm without bias {what}"),
                    &v[..2],
                    out,
                    &|t| kernels::layer_norm_as(&t[0], &t[1], None, 1e-6, out).unwrap(),
                    &|t| kernels::layer_norm(&t[0], &t[1], None, 1e-6).unwrap(),
                );
            }
        }
    }
}

#[test]
fn gelu_and_swiglu_on_bf16_activations_are_the_f32_kernels_between_casts() {
    let dev = gpu();
    for (i, shape) in [&[2usize, 7, 96][..], &[3, 1000], &[5, 3]]
        .into_iter()
        .enumerate()
    {
        let a = bf16(&randn(&dev, 950 + i as u64, shape, 2.0));
        let u = bf16(&randn(&dev, 960 + i as u64, shape, 1.0));
        for (label, v) in layouts(&[a, u]) {
            between_casts(
                &format!("gelu {shape:?} {label}"),
                &v[..1],
                DType::BF16,
                &|t| kernels::gelu_erf(&t[0]).unwrap(),
                &|t| kernels::gelu_erf(&t[0]).unwrap(),
            );
            between_casts(
                &format!("swiglu {shape:?} {label}"),
                &v,
                DType::BF16,
                &|t| kernels::swiglu(&t[0], &t[1]).unwrap(),
                &|t| kernels::swiglu(&t[0], &t[1]).unwrap(),
            );
        }
    }
}

#[test]
fn rope_on_bf16_activations_is_the_f32_kernel_between_casts() {
    let dev = gpu();
    // (B, H, T, head_dim, offset, max_len, log-n length)
    for (i, (b, h, t, d, offset, max_len, logn_length)) in [
        (2, 3, 7, 32, 0, 16, None),
        (1, 2, 5, 8, 3, 16, Some(4)),
        (3, 4, 40, 64, 0, 64, Some(16)),
    ]
    .into_iter()
    .enumerate()
    {
        let tables = RopeTables::new(d, max_len, 10_000.0, DType::F32, &dev).unwrap();
        let x = bf16(&randn(&dev, 980 + i as u64, &[b, t, h * d], 1.0));
        let scale = PositionScale {
            scale: 0.125,
            logn_length,
        };
        for (label, v) in layouts(&[x]) {
            between_casts(
                &format!("rope {:?} {label}", (b, h, t, d, offset)),
                &v,
                DType::BF16,
                &|v| kernels::rope(&v[0], &tables, offset, scale).unwrap(),
                &|v| kernels::rope(&v[0], &tables, offset, scale).unwrap(),
            );
        }
    }
}

#[test]
fn projections_on_bf16_activations_round_once() {
    // A bf16 x into the fused projection and GELU or RoPE: the f32 op on x widened, its output
    // rounded once (not the product as well), dx rounded once, dW from the f32 gradient; the
    // products in f32 and in bf16.
    let dev = gpu();
    let tables = RopeTables::new(8, 64, 10_000.0, DType::F32, &dev).unwrap();
    let scale = PositionScale {
        scale: 0.35,
        logn_length: Some(4),
    };
    let x = bf16(&randn(&dev, 990, &[2, 7, 24], 1.0));
    let w = randn(&dev, 991, &[32, 24], 0.3);
    let bias = randn(&dev, 992, &[32], 0.5);
    for p in [Precision::F32, Precision::Bf16] {
        for (label, v) in layouts(&[x.clone(), w.clone()]) {
            between_casts(
                &format!("linear_gelu {p} {label}"),
                &v,
                DType::BF16,
                &|t| kernels::linear_gelu_in(&t[0], &t[1], p).unwrap(),
                &|t| kernels::linear_gelu_in(&t[0], &t[1], p).unwrap(),
            );
            between_casts(
                &format!("linear_rope {p} {label}"),
                &v,
                DType::BF16,
                &|t| kernels::linear_rope_in(&t[0], &t[1], &tables, 2, scale, p).unwrap(),
                &|t| kernels::linear_rope_in(&t[0], &t[1], &tables, 2, scale, p).unwrap(),
            );
            // The plain and scaled projections (a scale not exact in bf16: 1/√32) and the
            // biased ones (bias added in f32, the sum rounded once), as the CPU ops round.
            let ops: [(&str, &dyn Fn(&[Tensor]) -> Tensor); 4] = [
                ("linear", &|t| kernels::linear_in(&t[0], &t[1], p).unwrap()),
                ("linear_scaled", &|t| {
                    kernels::linear_scaled_in(&t[0], &t[1], 1.0 / 32f64.sqrt(), p).unwrap()
                }),
                ("linear_bias", &|t| {
                    kernels::linear_bias_in(&t[0], &t[1], &bias, p).unwrap()
                }),
                ("linear_bias_relu", &|t| {
                    kernels::linear_bias_relu_in(&t[0], &t[1], &bias, p).unwrap()
                }),
            ];
            for (what, op) in ops {
                between_casts(&format!("{what} {p} {label}"), &v, DType::BF16, op, op);
            }
        }
    }
}

#[test]
fn attention_on_bf16_activations_is_the_f32_kernel_between_casts() {
    // The forward pass: the f32 kernel's bits on q, k, v widened, the output rounded once, for
    // the fused kernels and for the longer sequences' cuBLAS path, both precisions of the
    // products, with and without a causal mask, with dropout and telemetry, contiguous and
    // strided. The backward pass reads the output as stored (rowsum(dO ∘ O)), so a bf16
    // output's rounding reaches the fused kernels' dq and dk: within bf16's rounding of the f32
    // kernel's there (as on the CPU), while dv (from the probabilities and dO alone) keeps the
    // same bits; the cuBLAS path differentiates the widened composition: the same bits.
    let dev = gpu();
    // (B, H, H_kv, T, S, d): fused (grouped heads), and too long for shared memory.
    for (shape, fused) in [((2, 4, 2, 9, 9, 16), true), ((2, 2, 1, 9, 300, 64), false)] {
        let (b, h, hkv, t, s, d) = shape;
        let q = bf16(&randn(&dev, 1000, &[b, t, h * d], 0.5));
        let k = bf16(&randn(&dev, 1001, &[b, s, hkv * d], 1.0));
        let v = bf16(&randn(&dev, 1002, &[b, s, hkv * d], 1.0));
        let causal = causal_mask(t, s - t, DType::F32, &dev).unwrap();
        let probe = randn(&dev, 1003, &[b, t, h * d], 1.0);
        let cases = [
            (Precision::F32, None, Some(&causal), false),
            (Precision::Bf16, None, Some(&causal), true),
            (Precision::Bf16, Some((0.2, 77)), Some(&causal), false),
            (Precision::F32, Some((0.2, 77)), None, false),
            (Precision::Bf16, None, None, false),
        ];
        for (precision, dropout, mask, telemetry) in cases {
            let o = AttentionOptions {
                heads: h,
                kv_heads: hkv,
                dropout,
                telemetry,
                precision,
            };
            assert_eq!(
                cuda_fuses(&[b, t, h * d], &[b, s, hkv * d], &o, true),
                fused,
                "{shape:?}"
            );
            let op = |x: &[Tensor]| kernels::attention(&x[0], &x[1], &x[2], mask, &o).unwrap().0;
            let reference = |x: &[Tensor]| {
                let wide: Vec<Tensor> = x.iter().map(|t| t.to_dtype(DType::F32).unwrap()).collect();
                op(&wide).to_dtype(DType::BF16).unwrap()
            };
            for (label, inputs) in layouts(&[q.clone(), k.clone(), v.clone()]) {
                let what = format!(
                    "attention {shape:?} {precision} dropout {dropout:?} mask {} telemetry {telemetry} {label}",
                    mask.is_some()
                );
                let (y, g) = run(&inputs, &probe, &op);
                let (y_ref, g_ref) = run(&inputs, &probe, &reference);
                assert_eq!(y.dtype(), DType::BF16, "{what}: output dtype");
                assert!(
                    same_bits(&y, &y_ref),
                    "{what}: output differs from the f32 kernel between casts"
                );
                for (i, (a, r)) in g.iter().zip(&g_ref).enumerate() {
                    assert_eq!(a.dtype(), DType::BF16, "{what}: gradient {i} dtype");
                    if fused && i < 2 {
                        assert_close(&format!("{what} gradient {i}"), a, r, 1e-2);
                    } else {
                        assert!(
                            same_bits(a, r),
                            "{what}: gradient {i} differs from the f32 kernel's between casts"
                        );
                    }
                }
                let (y2, g2) = run(&inputs, &probe, &op);
                assert!(same_bits(&y, &y2), "{what}: forward not repeatable");
                for (i, (a, r)) in g.iter().zip(&g2).enumerate() {
                    assert!(same_bits(a, r), "{what}: gradient {i} not repeatable");
                }
            }
        }
    }
}
