//! Specification of the ops on bf16 activations (what a model keeping its branches' activations
//! in bf16 runs: on CUDA with every kernel on, and in ember-model's `bf16_branches` tests on the
//! CPU; CPU training keeps f32 ones, see ember-trainer's `setup::precision`): an op computes on
//! their exact f32 widening
//! and rounds its output, and the gradient of each bf16 input, once. So it gives the bits of the
//! same op on f32 inputs between candle's casts (`to_dtype`, whose backward pass rounds the
//! gradient the same way), for the products in f32 and in bf16, on contiguous and strided
//! inputs. Attention is the one exception in the backward pass: it reads its own (rounded)
//! output there, so its gradients are within a tolerance rather than the same bits.

#[path = "common/mod.rs"]
mod common;

use candle_core::{DType, Device, Tensor};
use common::{assert_close, every_precision, randn_cpu, run, same_bits, strided};
use ember_kernels::{self as kernels, RopeTables};

fn randn(seed: u64, shape: &[usize]) -> Tensor {
    randn_cpu(seed, shape, 1.0)
}

fn bf16(t: &Tensor) -> Tensor {
    t.to_dtype(DType::BF16).unwrap()
}

fn widened(t: &Tensor) -> Tensor {
    t.to_dtype(DType::F32).unwrap()
}

/// `op` on `inputs` against `reference` (the f32 op) on them widened, its output cast to
/// `out`: the output in `out`, and each gradient in its input's dtype; the same bits for the
/// output, and for the gradients unless `gradient_tol` gives a tolerance.
fn check(
    what: &str,
    inputs: &[Tensor],
    out: DType,
    op: &dyn Fn(&[Tensor]) -> Tensor,
    reference: &dyn Fn(&[Tensor]) -> Tensor,
    gradient_tol: Option<f64>,
) {
    let probe = randn(99, op(inputs).dims());
    check_under(what, inputs, out, op, reference, gradient_tol, &probe);
}

/// [`check`] of an op that is its own reference: on bf16 inputs, the same op on them widened.
fn between_casts(what: &str, inputs: &[Tensor], out: DType, op: &dyn Fn(&[Tensor]) -> Tensor) {
    check(what, inputs, out, op, op, None);
}

/// [`check`] under the upstream gradient `probe`.
fn check_under(
    what: &str,
    inputs: &[Tensor],
    out: DType,
    op: &dyn Fn(&[Tensor]) -> Tensor,
    reference: &dyn Fn(&[Tensor]) -> Tensor,
    gradient_tol: Option<f64>,
    probe: &Tensor,
) {
    let (y, g) = run(inputs, probe, op);
    let f32_op_between_casts = |ts: &[Tensor]| {
        let wide: Vec<Tensor> = ts.iter().map(widened).collect();
        reference(&wide).to_dtype(out).unwrap()
    };
    let (y_ref, g_ref) = run(inputs, probe, &f32_op_between_casts);
    assert_eq!(y.dtype(), out, "{what}: output dtype");
    assert!(
        same_bits(&y, &y_ref),
        "{what}: output differs from the f32 op between casts"
    );
    for (i, ((a, b), input)) in g.iter().zip(&g_ref).zip(inputs).enumerate() {
        assert_eq!(a.dtype(), input.dtype(), "{what}: gradient {i} dtype");
        match gradient_tol {
            None => assert!(same_bits(a, b), "{what}: gradient {i} differs from the f32 op's"),
            Some(tol) => assert_close(&format!("{what} gradient {i}"), a, b, tol),
        }
    }
}

/// The inputs as they are and as strided views.
fn layouts(inputs: &[Tensor]) -> [(&'static str, Vec<Tensor>); 2] {
    [
        ("contiguous", inputs.to_vec()),
        ("strided", inputs.iter().map(strided).collect()),
    ]
}

/// RMSNorm and LayerNorm read an f32 or bf16 input and write their output in the dtype asked
/// for: a residual-stream norm (f32 in, bf16 out) and QK-norm on a bf16 projection (bf16 in,
/// either out).
#[test]
fn norms_read_and_write_bf16_between_casts() {
    let gain = randn(1, &[16]).affine(0.3, 1.0).unwrap();
    let bias = (randn(2, &[16]) * 0.1).unwrap();
    let eps = 1e-5;
    for (what, x) in [
        ("stream", randn(3, &[2, 9, 16])),
        ("per head", randn(4, &[2, 5, 64])),
    ] {
        for (input, out) in [
            (DType::F32, DType::BF16),
            (DType::BF16, DType::BF16),
            (DType::BF16, DType::F32),
        ] {
            let x = x.to_dtype(input).unwrap();
            for (label, v) in layouts(&[x.clone(), gain.clone(), bias.clone()]) {
                let what = format!("{what} {input:?} → {out:?} {label}");
                check(
                    &format!("rms_norm {what}"),
                    &v[..2],
                    out,
                    &|t| kernels::rms_norm_as(&t[0], &t[1], eps, out).unwrap(),
                    &|t| kernels::rms_norm(&t[0], &t[1], eps).unwrap(),
                    None,
                );
                check(
                    &format!("layer_norm {what}"),
                    &v,
                    out,
                    &|t| kernels::layer_norm_as(&t[0], &t[1], Some(&t[2]), eps, out).unwrap(),
                    &|t| kernels::layer_norm(&t[0], &t[1], Some(&t[2]), eps).unwrap(),
                    None,
                );
            }
        }
    }
}

/// Every projection reads a bf16 x and writes its output (and dx) in bf16; the weight and its
/// gradient stay f32, and so does the residual op's stream and output.
#[test]
fn projections_read_and_write_bf16_between_casts() {
    let tables = RopeTables::new(8, 64, 10_000.0, DType::F32, &Device::Cpu).unwrap();
    let logn = kernels::PositionScale {
        scale: 0.35,
        logn_length: Some(4),
    };
    let x = bf16(&randn(10, &[2, 7, 24]));
    let w = randn(11, &[32, 24]);
    let stream = randn(12, &[2, 7, 32]);
    for precision in every_precision() {
        for (label, v) in layouts(&[x.clone(), w.clone(), stream.clone()]) {
            let what = |op: &str| format!("{op} {precision} {label}");
            let xw = [v[0].clone(), v[1].clone()];
            let bf = DType::BF16;
            between_casts(&what("linear"), &xw, bf, &|t| {
                kernels::linear_in(&t[0], &t[1], precision).unwrap()
            });
            between_casts(&what("linear_gelu"), &xw, bf, &|t| {
                kernels::linear_gelu_in(&t[0], &t[1], precision).unwrap()
            });
            between_casts(&what("linear_scaled"), &xw, bf, &|t| {
                kernels::linear_scaled_in(&t[0], &t[1], -0.3, precision).unwrap()
            });
            for scale in [kernels::PositionScale::from(1.0), logn] {
                between_casts(&what(&format!("linear_rope {scale:?}")), &xw, bf, &|t| {
                    kernels::linear_rope_in(&t[0], &t[1], &tables, 3, scale, precision).unwrap()
                });
            }
            for p in [0.0, 0.3] {
                let (stream, h, w) = (v[2].clone(), v[0].clone(), v[1].clone());
                between_casts(
                    &what(&format!("linear_residual p={p}")),
                    &[stream, h, w],
                    DType::F32,
                    &|t| kernels::linear_residual_in(&t[0], &t[1], &t[2], p, 7, precision).unwrap(),
                );
            }
        }
    }
}

/// A biased projection (and its ReLU) reads a bf16 x and writes its output rounded once, after
/// the add; GELU and the bias add keep bf16 activations bf16. The weight, the bias and their
/// gradients stay f32.
#[test]
fn biased_projections_gelu_and_the_bias_add_read_and_write_bf16_between_casts() {
    let x = bf16(&randn(70, &[2, 7, 24]));
    let w = randn(71, &[32, 24]);
    let b = (randn(72, &[32]) * 0.5).unwrap();
    let y = bf16(&randn(73, &[2, 7, 32]));
    for precision in every_precision() {
        for (label, v) in layouts(&[x.clone(), w.clone(), b.clone()]) {
            let what = |op: &str| format!("{op} {precision} {label}");
            between_casts(&what("linear_bias"), &v, DType::BF16, &|t| {
                kernels::linear_bias_in(&t[0], &t[1], &t[2], precision).unwrap()
            });
            between_casts(&what("linear_bias_relu"), &v, DType::BF16, &|t| {
                kernels::linear_bias_relu_in(&t[0], &t[1], &t[2], precision).unwrap()
            });
        }
    }
    for (label, v) in layouts(&[y.clone(), b.clone()]) {
        between_casts(&format!("add_bias {label}"), &v, DType::BF16, &|t| {
            kernels::add_bias(&t[0], &t[1]).unwrap()
        });
        between_casts(&format!("gelu_erf {label}"), &v[..1], DType::BF16, &|t| {
            kernels::gelu_erf(&t[0]).unwrap()
        });
    }
}

/// SwiGLU and the rotary rotation keep bf16 activations bf16.
#[test]
fn swiglu_and_rope_read_and_write_bf16_between_casts() {
    let tables = RopeTables::new(8, 64, 10_000.0, DType::F32, &Device::Cpu).unwrap();
    let gate = bf16(&randn(20, &[2, 7, 48]));
    let up = bf16(&randn(21, &[2, 7, 48]));
    for (label, v) in layouts(&[gate, up]) {
        between_casts(&format!("swiglu {label}"), &v, DType::BF16, &|t| {
            kernels::swiglu(&t[0], &t[1]).unwrap()
        });
        between_casts(&format!("rope {label}"), &v[..1], DType::BF16, &|t| {
            kernels::rope(&t[0], &tables, 5, 0.5).unwrap()
        });
    }
}

/// Attention reads bf16 (or mixed) q, k and v and writes its output in v's dtype: the bits of
/// the f32 op between casts. Its backward pass reads that rounded output (D = rowsum(dO ∘ O)),
/// where the f32 op reads its own: the gradients are within a tolerance of bf16's rounding.
#[test]
fn attention_reads_bf16_and_writes_in_the_values_dtype() {
    // A relative error of a few bf16 roundings (2⁻⁹) of the output, through D.
    const GRADIENT_TOL: f64 = 1e-2;
    let mask = kernels::causal_mask(9, 0, DType::F32, &Device::Cpu).unwrap();
    for precision in every_precision() {
        for dropout in [None, Some((0.2, 11))] {
            let opts = kernels::AttentionOptions {
                heads: 4,
                kv_heads: 2,
                dropout,
                telemetry: false,
                precision,
            };
            let q = (randn(30, &[2, 9, 32]) * 0.5).unwrap();
            let k = randn(31, &[2, 9, 16]);
            let v = randn(32, &[2, 9, 16]);
            // All bf16 (no QK-norm), and f32 queries and keys beside bf16 values (`l2`).
            for (mix, inputs) in [
                ("bf16", [bf16(&q), bf16(&k), bf16(&v)]),
                ("f32 q, k", [q, k, bf16(&v)]),
            ] {
                for (label, t) in layouts(&inputs) {
                    check(
                        &format!("attention {mix} {precision} dropout {dropout:?} {label}"),
                        &t,
                        DType::BF16,
                        &|x| {
                            kernels::attention(&x[0], &x[1], &x[2], Some(&mask), &opts)
                                .unwrap()
                                .0
                        },
                        &|x| {
                            kernels::attention(&x[0], &x[1], &x[2], Some(&mask), &opts)
                                .unwrap()
                                .0
                        },
                        Some(GRADIENT_TOL),
                    );
                }
            }
        }
    }
}

/// Softmax keeps bf16 rows bf16: the forward pass the f32 op's bits between casts. Its backward
/// pass reads the rounded probabilities (dx = p·(g − Σ p·g)), where the f32 op reads its own: the
/// gradient within a tolerance of bf16's rounding, as attention's.
#[test]
fn softmax_reads_and_writes_bf16_between_casts() {
    const GRADIENT_TOL: f64 = 1e-2;
    // Rows narrower than a vector, wider than several, and a masked-out (−1e9) column.
    for (seed, shape) in [(40, [3, 5, 7]), (41, [2, 3, 70])] {
        let mut x = (randn(seed, &shape) * 3.0).unwrap();
        x = x
            .slice_assign(
                &[0..1, 0..1, 0..1],
                &Tensor::full(-1e9f32, (1, 1, 1), &Device::Cpu).unwrap(),
            )
            .unwrap();
        for (label, v) in layouts(&[bf16(&x)]) {
            check(
                &format!("softmax {shape:?} {label}"),
                &v,
                DType::BF16,
                &|t| kernels::softmax_rows(&t[0]).unwrap(),
                &|t| kernels::softmax_rows(&t[0]).unwrap(),
                Some(GRADIENT_TOL),
            );
        }
    }
}

/// Dropout keeps bf16 activations bf16, with the f32 op's mask: the same bits between casts,
/// forward and backward.
#[test]
fn dropout_reads_and_writes_bf16_between_casts() {
    let x = bf16(&randn(50, &[4, 9, 33]));
    for p in [0.1, 0.5] {
        for (label, v) in layouts(std::slice::from_ref(&x)) {
            between_casts(&format!("dropout p={p} {label}"), &v, DType::BF16, &|t| {
                kernels::dropout(&t[0], p, 17).unwrap()
            });
        }
    }
    // The fused op is the unfused mask's, on bf16 as on f32 (equal values: the unfused product
    // keeps −0 where a negative element is dropped, the kernel writes +0).
    let values = |t: Tensor| -> Vec<f32> { widened(&t).flatten_all().unwrap().to_vec1().unwrap() };
    let fused = values(kernels::dropout(&x, 0.3, 5).unwrap());
    let unfused = values(
        kernels::dropout_unfused(&widened(&x), 0.3, 5)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap(),
    );
    assert_eq!(fused, unfused, "dropout on bf16 is not the unfused mask's");
}

/// The output layer and loss read a bf16 h (the final norm's output) and send dh back in bf16;
/// W, the losses and dW stay f32: the f32 op between casts, for the trainer's gradient (made in
/// the forward pass) and any other (the blocks rerun in the backward pass).
#[test]
fn the_output_layer_and_loss_read_a_bf16_h_between_casts() {
    let h = bf16(&randn(60, &[2, 6, 24]));
    let w = (randn(61, &[37, 24]) * 0.3).unwrap();
    let targets = Tensor::from_vec((0..12u32).map(|i| i * 5 % 37).collect(), 12, &Device::Cpu).unwrap();
    let mask = Tensor::from_vec(
        (0..12).map(|i| if i % 5 == 4 { 0f32 } else { 1.0 }).collect(),
        12,
        &Device::Cpu,
    )
    .unwrap();
    for precision in every_precision() {
        for (eps, z) in [(0.0, 0.0), (0.1, 1e-4)] {
            for grads in [true, false] {
                for (label, v) in layouts(&[h.clone(), w.clone()]) {
                    let loss = |t: &[Tensor]| {
                        kernels::linear_cross_entropy_in(
                            &t[0], &t[1], &targets, &mask, eps, z, grads, precision,
                        )
                        .unwrap()
                    };
                    // The trainer's upstream gradient (the dh and dW the forward pass made,
                    // scaled) and a random one (the blocks rerun).
                    let trainers = Tensor::cat(
                        &[
                            &Tensor::full(0.25f32, (1, 12), &Device::Cpu).unwrap(),
                            &Tensor::zeros((1, 12), DType::F32, &Device::Cpu).unwrap(),
                        ],
                        0,
                    )
                    .unwrap();
                    for (upstream, probe) in [("trainer's", trainers), ("random", randn(62, &[2, 12]))] {
                        check_under(
                            &format!("linear_cross_entropy {precision} ε={eps} z={z} grads={grads} {upstream} {label}"),
                            &v,
                            DType::F32,
                            &loss,
                            &loss,
                            None,
                            &probe,
                        );
                    }
                }
            }
        }
    }
}

/// The log-n scaling of queries without a rotation (QK-norm with learned positions) scales a
/// bf16 x in f32 and rounds once, not by factors rounded to bf16 first.
#[test]
fn position_scaling_reads_and_writes_bf16_between_casts() {
    let x = bf16(&randn(80, &[2, 9, 16]));
    // Per position (log-n), and one constant not exact in bf16 (1/√32).
    for (scale, label) in [(0.3, Some(3)), (1.0 / 32f64.sqrt(), None)].map(|(scale, logn_length)| {
        (
            kernels::PositionScale { scale, logn_length },
            format!("{logn_length:?}"),
        )
    }) {
        for (layout, v) in layouts(std::slice::from_ref(&x)) {
            let label = format!("{label} {layout}");
            between_casts(&format!("apply_unfused {label}"), &v, DType::BF16, &|t| {
                scale.apply_unfused(&t[0], 2).unwrap()
            });
        }
    }
}
