//! Specification of the ops in bf16 (`*_in` with `Precision::Bf16`; natively on a CPU with
//! AVX512_BF16, elsewhere emulated with its bits):
//! each is the f32 composition of its operands rounded to bf16 — forward values to f32 rounding,
//! gradients to bf16's (the backward products round the incoming gradient, where the
//! composition's casts round the gradients they pass back) — on contiguous and strided inputs; the same bits on every run and at
//! any thread count; and really in bf16 (not the f32 op's values).

#[path = "common/mod.rs"]
mod common;

use candle_core::{DType, Device, Tensor};
use common::{assert_close, compare, randn_cpu, rel_error, run, same_bits, strided};
use ember_kernels::{self as kernels, Precision, RopeTables};

const BF16: Precision = Precision::Bf16;

/// The forward pass within this of the composition (both sum exact products in f32).
const FORWARD_TOL: f64 = 2e-5;
/// The gradients within this: bf16 keeps 8 bits, so rounding the incoming gradient moves a
/// product by up to 2⁻⁹ of each term.
const GRADIENT_TOL: f64 = 6e-3;

/// bf16 products on any CPU: natively where it has AVX512_BF16, else emulated with the same bits
/// (`bf16_refused.rs` covers the refusal without the emulation).
fn bf16_everywhere() {
    kernels::emulate_bf16_products();
}

fn randn(seed: u64, shape: &[usize]) -> Tensor {
    randn_cpu(seed, shape, 1.0)
}

/// The op against its composition on rounded operands: forward and every gradient to bf16's
/// rounding and the same bits on a second run (`compare`), the forward to f32's rounding, and
/// the forward not the f32 op's (`f32_op`).
fn check(
    what: &str,
    inputs: &[Tensor],
    op: &dyn Fn(&[Tensor]) -> Tensor,
    composition: &dyn Fn(&[Tensor]) -> Tensor,
    f32_op: &dyn Fn(&[Tensor]) -> Tensor,
) {
    check_within(what, inputs, op, composition, f32_op, FORWARD_TOL)
}

/// [`check`] with the forward pass within `forward_tol` of the composition.
fn check_within(
    what: &str,
    inputs: &[Tensor],
    op: &dyn Fn(&[Tensor]) -> Tensor,
    composition: &dyn Fn(&[Tensor]) -> Tensor,
    f32_op: &dyn Fn(&[Tensor]) -> Tensor,
    forward_tol: f64,
) {
    compare(what, inputs, op, composition, GRADIENT_TOL);
    let y = op(inputs);
    assert_close(&format!("{what} forward"), &y, &composition(inputs), forward_tol);
    let e = rel_error(&y, &f32_op(inputs));
    assert!(
        e > 1e-4,
        "{what}: within {e:e} of the f32 op: not computed in bf16"
    );
}

/// The op's inputs as they are and as strided views.
fn layouts(inputs: &[Tensor]) -> [(&'static str, Vec<Tensor>); 2] {
    [
        ("contiguous", inputs.to_vec()),
        ("strided", inputs.iter().map(strided).collect()),
    ]
}

fn r(t: &Tensor) -> Tensor {
    BF16.round(t).unwrap()
}

#[test]
fn every_projection_in_bf16_is_the_composition_of_its_rounded_operands() {
    bf16_everywhere();
    let tables = RopeTables::new(8, 160, 10_000.0, DType::F32, &Device::Cpu).unwrap();
    let logn = kernels::PositionScale {
        scale: 0.35,
        logn_length: Some(4),
    };
    for (i, (b, t, in_dim, out_dim)) in [(2, 7, 16, 24), (1, 130, 33, 40), (3, 5, 128, 64)]
        .into_iter()
        .enumerate()
    {
        let seed = 10 * i as u64;
        let x = randn(seed, &[b, t, in_dim]);
        let w = randn(seed + 1, &[out_dim, in_dim]);
        let stream = randn(seed + 2, &[b, t, out_dim]);
        for (label, v) in layouts(&[x, w, stream]) {
            let what = |op: &str| format!("{op} {:?} {label}", (b, t, in_dim, out_dim));
            let xw = [v[0].clone(), v[1].clone()];
            check(
                &what("linear"),
                &xw,
                &|t| kernels::linear_in(&t[0], &t[1], BF16).unwrap(),
                &|t| kernels::linear_unfused(&r(&t[0]), &r(&t[1])).unwrap(),
                &|t| kernels::linear(&t[0], &t[1]).unwrap(),
            );
            check(
                &what("linear_gelu"),
                &xw,
                &|t| kernels::linear_gelu_in(&t[0], &t[1], BF16).unwrap(),
                &|t| kernels::linear_gelu_unfused(&r(&t[0]), &r(&t[1])).unwrap(),
                &|t| kernels::linear_gelu(&t[0], &t[1]).unwrap(),
            );
            check(
                &what("linear_scaled"),
                &xw,
                &|t| kernels::linear_scaled_in(&t[0], &t[1], -0.3, BF16).unwrap(),
                &|t| kernels::linear_scaled_unfused(&r(&t[0]), &r(&t[1]), -0.3).unwrap(),
                &|t| kernels::linear_scaled(&t[0], &t[1], -0.3).unwrap(),
            );
            for scale in [kernels::PositionScale::from(1.0), logn] {
                check(
                    &what(&format!("linear_rope {scale:?}")),
                    &xw,
                    &|v| kernels::linear_rope_in(&v[0], &v[1], &tables, 3, scale, BF16).unwrap(),
                    &|v| kernels::linear_rope_unfused(&r(&v[0]), &r(&v[1]), &tables, 3, scale).unwrap(),
                    &|v| kernels::linear_rope(&v[0], &v[1], &tables, 3, scale).unwrap(),
                );
            }
            for p in [0.0, 0.3] {
                check(
                    &what(&format!("linear_residual p={p}")),
                    &[v[2].clone(), v[0].clone(), v[1].clone()],
                    &|t| kernels::linear_residual_in(&t[0], &t[1], &t[2], p, 7, BF16).unwrap(),
                    &|t| kernels::linear_residual_unfused(&t[0], &r(&t[1]), &r(&t[2]), p, 7).unwrap(),
                    &|t| kernels::linear_residual(&t[0], &t[1], &t[2], p, 7).unwrap(),
                );
            }
        }
    }
}

#[test]
fn the_feed_forward_activations_keep_bf16_values() {
    // SwiGLU under bf16 reads gate and up rounded (as cuBLAS's bf16 products and autocast hand
    // them on), in both passes: the f32 op's bits on the rounded values, gradients included.
    bf16_everywhere();
    let (gate, up) = (randn(40, &[3, 50, 96]), randn(41, &[3, 50, 96]));
    let probe = randn(42, &[3, 50, 96]);
    let (y, grads) = run(&[gate.clone(), up.clone()], &probe, &|t| {
        kernels::swiglu_in(&t[0], &t[1], BF16).unwrap()
    });
    let (y_ref, grads_ref) = run(&[r(&gate), r(&up)], &probe, &|t| {
        kernels::swiglu(&t[0], &t[1]).unwrap()
    });
    assert!(
        same_bits(&y, &y_ref),
        "SwiGLU's output is not the f32 op's on rounded inputs"
    );
    for (g, g_ref) in grads.iter().zip(&grads_ref) {
        assert!(
            same_bits(g, g_ref),
            "SwiGLU's gradients are not the f32 op's on rounded inputs"
        );
    }
    assert!(
        rel_error(&y, &kernels::swiglu(&gate, &up).unwrap()) > 1e-4,
        "SwiGLU did not round"
    );

    // GELU computes from the f32 product and keeps its derivative rounded once (not the f32
    // derivative the f32 op keeps): a second backward pass through the same graph, which
    // recomputes the derivative, gives the first's bits.
    let (x, w) = (randn(43, &[2, 40, 64]), randn(44, &[160, 64]));
    let y = kernels::linear_gelu_in(&x, &w, BF16).unwrap();
    let y_ref = kernels::gelu_erf(&kernels::linear_in(&x, &w, BF16).unwrap()).unwrap();
    assert!(same_bits(&y, &y_ref), "GELU did not compute from the f32 product");
    let x = candle_core::Var::from_tensor(&x).unwrap();
    let probe = randn(45, &[2, 40, 160]);
    let loss = (kernels::linear_gelu_in(x.as_tensor(), &w, BF16).unwrap() * &probe)
        .unwrap()
        .sum_all()
        .unwrap();
    let [kept, recomputed] = [0, 1].map(|_| loss.backward().unwrap().get(x.as_tensor()).unwrap().clone());
    assert!(
        same_bits(&kept, &recomputed),
        "the recomputed derivative is not the kept one"
    );
    let f32_slope = (kernels::gelu_erf(&kernels::linear_in(x.as_tensor(), &w, BF16).unwrap()).unwrap()
        * &probe)
        .unwrap()
        .sum_all()
        .unwrap();
    let dx_f32_slope = f32_slope.backward().unwrap().get(x.as_tensor()).unwrap().clone();
    assert!(
        rel_error(&kept, &dx_f32_slope) > 1e-4,
        "GELU kept its derivative in f32"
    );
}

/// Targets and a mask (every third row padding) for `n` rows of a `vocab`-word output.
fn targets_and_mask(n: usize, vocab: usize) -> (Tensor, Tensor) {
    let targets: Vec<u32> = (0..n).map(|j| ((j * 7 + 1) % vocab) as u32).collect();
    let mask: Vec<f32> = (0..n).map(|j| if j % 3 == 2 { 0.0 } else { 1.0 }).collect();
    (
        Tensor::new(targets.as_slice(), &Device::Cpu).unwrap(),
        Tensor::new(mask.as_slice(), &Device::Cpu).unwrap(),
    )
}

#[test]
fn the_output_layer_and_loss_in_bf16_is_the_composition_of_its_rounded_operands() {
    bf16_everywhere();
    // Several blocks of rows at 70k words; the trainer's gradient made in the forward pass
    // (`grads`) and the recomputing backward (the probe puts weight on the NLL row too).
    for (rows, d, vocab) in [(17, 16, 69), (150, 8, 70_000), (40, 64, 65)] {
        let h = randn(rows as u64, &[rows, d]);
        let w = (randn(vocab as u64, &[vocab, d]) * 0.5).unwrap();
        let (targets, mask) = targets_and_mask(rows, vocab);
        for (eps, z) in [(0.0, 0.0), (0.1, 1e-3)] {
            for grads in [false, true] {
                for (label, v) in layouts(&[h.clone(), w.clone()]) {
                    check(
                        &format!(
                            "linear cross-entropy {:?} eps {eps} z {z} grads {grads} {label}",
                            (rows, d, vocab)
                        ),
                        &v,
                        &|t| {
                            kernels::linear_cross_entropy_in(
                                &t[0], &t[1], &targets, &mask, eps, z, grads, BF16,
                            )
                            .unwrap()
                        },
                        &|t| {
                            kernels::linear_cross_entropy_unfused(
                                &r(&t[0]),
                                &r(&t[1]),
                                &targets,
                                &mask,
                                eps,
                                z,
                            )
                            .unwrap()
                        },
                        &|t| {
                            kernels::linear_cross_entropy(&t[0], &t[1], &targets, &mask, eps, z, grads)
                                .unwrap()
                        },
                    );
                }
            }
        }
    }
}

/// The trainer's own use: the objective summed and divided by the tokens, through the gradient
/// the forward pass prepared; against the composition on rounded operands.
#[test]
fn the_trainers_gradient_from_the_bf16_forward_pass_is_the_compositions() {
    bf16_everywhere();
    let (rows, d, vocab) = (96, 32, 300);
    let h = randn(1, &[rows, d]);
    let w = (randn(2, &[vocab, d]) * 0.5).unwrap();
    let (targets, mask) = targets_and_mask(rows, vocab);
    let trainer = |t: &[Tensor]| {
        let per_token =
            kernels::linear_cross_entropy_in(&t[0], &t[1], &targets, &mask, 0.1, 1e-4, true, BF16).unwrap();
        (per_token.get(0).unwrap().sum_all().unwrap() / rows as f64).unwrap()
    };
    let composition = |t: &[Tensor]| {
        let per_token =
            kernels::linear_cross_entropy_unfused(&r(&t[0]), &r(&t[1]), &targets, &mask, 0.1, 1e-4).unwrap();
        (per_token.get(0).unwrap().sum_all().unwrap() / rows as f64).unwrap()
    };
    let one = Tensor::new(1f32, &Device::Cpu).unwrap();
    let (y, g) = run(&[h.clone(), w.clone()], &one, &trainer);
    let (yc, gc) = run(&[h, w], &one, &composition);
    assert_close("loss", &y, &yc, FORWARD_TOL);
    assert_close("dh", &g[0], &gc[0], GRADIENT_TOL);
    assert_close("dW", &g[1], &gc[1], GRADIENT_TOL);
}

/// Attention's forward pass within this of the composition. The probabilities are themselves
/// rounded to bf16 for P·v, and the kernel's (its own `exp`, q·kᵀ summed in pairs) and the
/// composition's (candle's) can differ in the last f32 bit; where one sits on a bf16 rounding
/// midpoint the two round it apart, which moves the output by up to about 1e-4 of its norm
/// here. Leaving P unrounded in the composition moves it by 1.6e-3, and the f32 op lies
/// 2.6e-3–3.6e-3 away.
const ATTENTION_FORWARD_TOL: f64 = 4e-4;

fn attention_opts(
    heads: usize,
    kv_heads: usize,
    dropout: Option<(f64, u64)>,
    precision: Precision,
) -> kernels::AttentionOptions {
    kernels::AttentionOptions {
        heads,
        kv_heads,
        dropout,
        telemetry: false,
        precision,
    }
}

/// A padding mask (B, 1, 1, S) hiding the last two keys of the last batch row.
fn padding_of_last_row(b: usize, s: usize) -> Tensor {
    let keep: Vec<f32> = (0..b * s)
        .map(|j| if j >= (b - 1) * s + s - 2 { 0.0 } else { 1.0 })
        .collect();
    kernels::padding_mask(&Tensor::from_vec(keep, (b, s), &Device::Cpu).unwrap(), DType::F32).unwrap()
}

/// Attention's four products in bf16 (q·kᵀ and P·v, and the backward pass's), the softmax, the
/// mask and the dropout in f32: the composition on rounded q, k, v and probabilities, with
/// grouped-query heads, padding and causal masks, dropout, and kept or recomputed probabilities
/// (S ≤ 4d keeps them).
#[test]
fn attention_in_bf16_is_the_composition_of_its_rounded_operands() {
    bf16_everywhere();
    let opts = attention_opts;
    // (b, t, s, heads, kv heads, d): self-attention, cross-attention over a longer source,
    // grouped-query heads, and S > 4d (the backward pass recomputes the probabilities).
    for (i, (b, t, s, h, hkv, d)) in [
        (2, 9, 9, 4, 4, 8),
        (2, 5, 13, 2, 2, 16),
        (1, 11, 11, 6, 2, 8),
        (1, 7, 40, 2, 1, 4),
    ]
    .into_iter()
    .enumerate()
    {
        let seed = 100 + 10 * i as u64;
        let q = (randn(seed, &[b, t, h * d]) * 0.5).unwrap();
        let k = randn(seed + 1, &[b, s, hkv * d]);
        let v = randn(seed + 2, &[b, s, hkv * d]);
        let padding = padding_of_last_row(b, s);
        let causal = (t == s).then(|| kernels::causal_mask(t, 0, DType::F32, &Device::Cpu).unwrap());
        for (mask_name, mask) in [("no mask", None), ("padding", Some(padding)), ("causal", causal)] {
            if mask_name == "causal" && mask.is_none() {
                continue;
            }
            for dropout in [None, Some((0.2, 11))] {
                let bf16 = opts(h, hkv, dropout, BF16);
                let f32 = opts(h, hkv, dropout, Precision::F32);
                for (label, inputs) in layouts(&[q.clone(), k.clone(), v.clone()]) {
                    let mask = mask.as_ref();
                    check_within(
                        &format!(
                            "attention {:?} {mask_name} dropout {dropout:?} {label}",
                            (b, t, s, h, hkv, d)
                        ),
                        &inputs,
                        &|x| kernels::attention(&x[0], &x[1], &x[2], mask, &bf16).unwrap().0,
                        &|x| {
                            kernels::attention_unfused(&x[0], &x[1], &x[2], mask, &bf16)
                                .unwrap()
                                .0
                        },
                        &|x| kernels::attention(&x[0], &x[1], &x[2], mask, &f32).unwrap().0,
                        ATTENTION_FORWARD_TOL,
                    );
                }
            }
        }
    }
}

/// A padded batch whose last row hides whole blocks of keys: with S ≥ 128 the dead blocks are
/// skipped, and with an odd T a block that no query sees is an empty part of dk's and dv's
/// products starting at an odd k. Still the composition, forward and backward.
#[test]
fn attention_in_bf16_skips_the_key_blocks_no_query_sees() {
    bf16_everywhere();
    let (b, t, s, h, d) = (2, 33, 161, 2, 8);
    let q = (randn(400, &[b, t, h * d]) * 0.5).unwrap();
    let k = randn(401, &[b, s, h * d]);
    let v = randn(402, &[b, s, h * d]);
    let keep: Vec<f32> = (0..b * s).map(|j| if j >= s + 64 { 0.0 } else { 1.0 }).collect();
    let mask =
        kernels::padding_mask(&Tensor::from_vec(keep, (b, s), &Device::Cpu).unwrap(), DType::F32).unwrap();
    let (bf16, f32) = (
        attention_opts(h, h, None, BF16),
        attention_opts(h, h, None, Precision::F32),
    );
    check_within(
        "attention with dead key blocks",
        &[q, k, v],
        &|x| {
            kernels::attention(&x[0], &x[1], &x[2], Some(&mask), &bf16)
                .unwrap()
                .0
        },
        &|x| {
            kernels::attention_unfused(&x[0], &x[1], &x[2], Some(&mask), &bf16)
                .unwrap()
                .0
        },
        &|x| {
            kernels::attention(&x[0], &x[1], &x[2], Some(&mask), &f32)
                .unwrap()
                .0
        },
        ATTENTION_FORWARD_TOL,
    );
}

/// Attention sees q, k and v only through their bf16 roundings, in the forward pass, the
/// telemetry and every backward product that reads them (dq = dS·k, dk = dSᵀ·q, dP = dO·vᵀ):
/// rounding them beforehand changes no bit of the output, the telemetry or the gradients. A
/// product left in f32 would see the difference.
#[test]
fn attention_in_bf16_sees_q_k_and_v_only_through_their_rounding() {
    bf16_everywhere();
    // Kept probabilities (S ≤ 4d), recomputed ones (S > 4d) and grouped-query heads.
    for (b, t, s, h, hkv, d) in [(2, 9, 9, 4, 4, 8), (1, 7, 40, 4, 2, 4)] {
        let inputs = [
            randn(7, &[b, t, h * d]),
            randn(8, &[b, s, hkv * d]),
            randn(9, &[b, s, hkv * d]),
        ];
        let rounded: Vec<Tensor> = inputs.iter().map(r).collect();
        let mask = padding_of_last_row(b, s);
        for dropout in [None, Some((0.2, 5))] {
            let opts = kernels::AttentionOptions {
                telemetry: true,
                ..attention_opts(h, hkv, dropout, BF16)
            };
            let telemetry = std::cell::RefCell::new(Vec::new());
            let op = |x: &[Tensor]| {
                let (y, measured) = kernels::attention(&x[0], &x[1], &x[2], Some(&mask), &opts).unwrap();
                telemetry
                    .borrow_mut()
                    .push(measured.expect("telemetry asked for"));
                y
            };
            let probe = randn(10, &[b, t, h * d]);
            let (y, g) = run(&inputs, &probe, &op);
            let (yr, gr) = run(&rounded, &probe, &op);
            let what = format!("attention {:?} dropout {dropout:?}", (b, t, s, h, hkv, d));
            assert!(same_bits(&y, &yr), "{what}: the output saw q, k or v unrounded");
            let telemetry = telemetry.into_inner();
            assert_eq!(
                telemetry[0], telemetry[1],
                "{what}: the telemetry saw them unrounded"
            );
            for (name, (a, b)) in ["dq", "dk", "dv"].iter().zip(g.iter().zip(&gr)) {
                assert!(same_bits(a, b), "{what}: {name} saw q, k or v unrounded");
            }
        }
    }
}

/// Products large enough to be cut into tasks give the same bits at 1 and 3 threads.
#[test]
fn bf16_ops_give_the_same_bits_at_any_thread_count() {
    bf16_everywhere();
    let x = randn(1, &[4, 64, 128]);
    let w = randn(2, &[384, 128]);
    let stream = randn(3, &[4, 64, 384]);
    let head = (randn(4, &[1000, 128]) * 0.5).unwrap();
    let (targets, mask) = targets_and_mask(256, 1000);
    type Op<'a> = (&'a str, Vec<Tensor>, Box<dyn Fn(&[Tensor]) -> Tensor + 'a>);
    let ops: Vec<Op> = vec![
        (
            "linear_gelu",
            vec![x.clone(), w.clone()],
            Box::new(|t| kernels::linear_gelu_in(&t[0], &t[1], BF16).unwrap()),
        ),
        (
            "linear_residual",
            vec![stream, x.clone(), w.clone()],
            Box::new(|t| kernels::linear_residual_in(&t[0], &t[1], &t[2], 0.1, 3, BF16).unwrap()),
        ),
        (
            "linear_cross_entropy",
            vec![x.reshape((256, 128)).unwrap(), head],
            Box::new(|t| {
                kernels::linear_cross_entropy_in(&t[0], &t[1], &targets, &mask, 0.1, 0.0, true, BF16).unwrap()
            }),
        ),
        (
            "attention",
            vec![x.clone(), randn(5, &[4, 64, 128]), randn(6, &[4, 64, 128])],
            Box::new(|t| {
                let opts = kernels::AttentionOptions {
                    heads: 4,
                    kv_heads: 4,
                    dropout: Some((0.1, 5)),
                    telemetry: false,
                    precision: BF16,
                };
                kernels::attention(&t[0], &t[1], &t[2], None, &opts).unwrap().0
            }),
        ),
        (
            // Heads of 256 × 16 × 256 products, cut into tasks inside attention's own tasks,
            // and S > 4d: the backward pass recomputes the probabilities.
            "attention, long sequence",
            vec![
                randn(11, &[1, 256, 32]),
                randn(12, &[1, 256, 32]),
                randn(13, &[1, 256, 32]),
            ],
            Box::new(|t| {
                let opts = kernels::AttentionOptions {
                    heads: 2,
                    kv_heads: 2,
                    dropout: None,
                    telemetry: false,
                    precision: BF16,
                };
                kernels::attention(&t[0], &t[1], &t[2], None, &opts).unwrap().0
            }),
        ),
    ];
    for (name, inputs, op) in &ops {
        let probe = randn(9, op(inputs).dims());
        let at = |threads| {
            kernels::par::set_threads(threads).unwrap();
            let out = run(inputs, &probe, op.as_ref());
            kernels::par::set_threads(1).unwrap();
            out
        };
        let (y1, g1) = at(1);
        let (y3, g3) = at(3);
        assert!(
            same_bits(&y1, &y3),
            "{name}: the output depends on the thread count"
        );
        for (i, (a, b)) in g1.iter().zip(&g3).enumerate() {
            assert!(
                same_bits(a, b),
                "{name}: gradient {i} depends on the thread count"
            );
        }
    }
}
