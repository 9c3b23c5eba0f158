//! Specification: every fused kernel computes what its unfused composition computes — forward
//! values and the gradients with respect to every differentiable input — to float rounding, on
//! contiguous and non-contiguous inputs of several shapes, and gives the same bits every time.

use candle_core::{DType, Device, Tensor, Var};
use ember_kernels as kernels;
use ember_kernels::RopeTables;

/// A case's reference: the op applied to its inputs, as a closure.
type Composition<'a> = Box<dyn Fn(&[Tensor]) -> Tensor + 'a>;

const TOL: f32 = 2e-5;

fn randn(seed: u64, shape: &[usize]) -> Tensor {
    // A small deterministic generator keeps the tests independent of candle's global RNG.
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|_| {
            let mut s = 0f32;
            for _ in 0..4 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                s += (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            }
            s * 1.7
        })
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

fn max_rel_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.shape(), b.shape());
    let a: Vec<f32> = a.flatten_all().unwrap().to_vec1().unwrap();
    let b: Vec<f32> = b.flatten_all().unwrap().to_vec1().unwrap();
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
    a.iter()
        .zip(&b)
        .map(|(x, y)| {
            assert!(x.is_finite() == y.is_finite(), "{x} vs {y}");
            (x - y).abs() / (scale * 0.1 + y.abs())
        })
        .fold(0f32, f32::max)
}

fn assert_close(what: &str, a: &Tensor, b: &Tensor) {
    let d = max_rel_diff(a, b);
    assert!(d < TOL, "{what}: max relative difference {d}");
}

/// A non-contiguous view with the same values as `x`: stored transposed, viewed back.
fn strided(x: &Tensor) -> Tensor {
    let r = x.rank();
    let t = x.transpose(0, r - 1).unwrap().contiguous().unwrap();
    let y = t.transpose(0, r - 1).unwrap();
    assert!(!y.is_contiguous() || x.dims()[0] == 1 || x.dims()[r - 1] == 1);
    y
}

/// A variable holding `t`'s data, and a view of it with `t`'s layout. (`Var::from_tensor` alone
/// would copy a strided view into a contiguous tensor, and a "strided" test case would test the
/// contiguous path.) The variable stores the elements in `t`'s memory order; the view permutes
/// the dimensions back (the permutation is returned to map the variable's gradient back too).
fn var_with_layout(t: &Tensor) -> ((Var, Vec<usize>), Tensor) {
    let mut order: Vec<usize> = (0..t.rank()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(t.stride()[i]));
    let var = Var::from_tensor(&t.permute(order.clone()).unwrap().contiguous().unwrap()).unwrap();
    let mut back = vec![0; order.len()];
    for (pos, &dim) in order.iter().enumerate() {
        back[dim] = pos;
    }
    let view = var.as_tensor().permute(back.clone()).unwrap();
    for i in 0..t.rank() {
        if t.dims()[i] > 1 {
            assert_eq!(
                view.stride()[i],
                t.stride()[i],
                "the view keeps the input's layout"
            );
        }
    }
    ((var, back), view)
}

/// Runs `f` on fresh variables made from `inputs` and returns the output and the gradient of
/// Σ output·probe with respect to each input.
fn run(inputs: &[Tensor], probe: &Tensor, f: &dyn Fn(&[Tensor]) -> Tensor) -> (Tensor, Vec<Tensor>) {
    let (vars, ts): (Vec<(Var, Vec<usize>)>, Vec<Tensor>) = inputs.iter().map(var_with_layout).unzip();
    let out = f(&ts);
    let loss = (&out * probe).unwrap().sum_all().unwrap();
    let grads = loss.backward().unwrap();
    let gs = vars
        .iter()
        .map(|(v, back)| {
            let g = grads.get(v.as_tensor()).expect("an input has no gradient");
            g.permute(back.clone()).unwrap()
        })
        .collect();
    (out, gs)
}

/// Fused vs unfused: forward and every gradient, plus bit-for-bit repeatability of the fused one.
fn compare(
    what: &str,
    inputs: &[Tensor],
    fused: &dyn Fn(&[Tensor]) -> Tensor,
    unfused: &dyn Fn(&[Tensor]) -> Tensor,
) {
    let probe = randn(99, fused(inputs).dims());
    let (yf, gf) = run(inputs, &probe, fused);
    let (yu, gu) = run(inputs, &probe, unfused);
    assert_close(&format!("{what} forward"), &yf, &yu);
    for (i, (a, b)) in gf.iter().zip(&gu).enumerate() {
        assert_close(&format!("{what} gradient {i}"), a, b);
    }
    let (yf2, gf2) = run(inputs, &probe, fused);
    assert_eq!(
        max_rel_diff(&yf, &yf2),
        0.0,
        "{what}: forward is not deterministic"
    );
    for (a, b) in gf.iter().zip(&gf2) {
        assert_eq!(max_rel_diff(a, b), 0.0, "{what}: backward is not deterministic");
    }
}

#[test]
fn norms_match_the_unfused_composition() {
    for (i, shape) in [vec![3, 5, 128], vec![7, 33], vec![2, 3, 4, 32], vec![1, 1, 9]]
        .into_iter()
        .enumerate()
    {
        let d = *shape.last().unwrap();
        let x = (randn(i as u64, &shape) * 3.0).unwrap().affine(1.0, 0.7).unwrap();
        let w = randn(10 + i as u64, &[d]).affine(0.3, 1.0).unwrap();
        let b = randn(20 + i as u64, &[d]);
        for (label, x) in [("contiguous", x.clone()), ("strided", strided(&x))] {
            compare(
                &format!("rms {shape:?} {label}"),
                &[x.clone(), w.clone()],
                &|t| kernels::rms_norm(&t[0], &t[1], 1e-5).unwrap(),
                &|t| kernels::rms_norm_unfused(&t[0], &t[1], 1e-5).unwrap(),
            );
            compare(
                &format!("layernorm {shape:?} {label}"),
                &[x.clone(), w.clone(), b.clone()],
                &|t| kernels::layer_norm(&t[0], &t[1], Some(&t[2]), 1e-5).unwrap(),
                &|t| kernels::layer_norm_unfused(&t[0], &t[1], Some(&t[2]), 1e-5).unwrap(),
            );
            compare(
                &format!("layernorm no bias {shape:?} {label}"),
                &[x.clone(), w.clone()],
                &|t| kernels::layer_norm(&t[0], &t[1], None, 1e-6).unwrap(),
                &|t| kernels::layer_norm_unfused(&t[0], &t[1], None, 1e-6).unwrap(),
            );
        }
    }
}

#[test]
fn norms_over_each_head_of_a_projection_match_the_unfused_composition() {
    // QK-norm: a gain of head_dim over a (B, T, H·head_dim) projection normalises every head.
    let (b, t, h, d) = (2, 5, 4, 16);
    let x = (randn(25, &[b, t, h * d]) * 2.0)
        .unwrap()
        .affine(1.0, 0.3)
        .unwrap();
    let w = randn(26, &[d]).affine(0.3, 1.0).unwrap();
    let bias = randn(27, &[d]);
    compare(
        "rms per head",
        &[x.clone(), w.clone()],
        &|t| kernels::rms_norm(&t[0], &t[1], 1e-5).unwrap(),
        &|t| kernels::rms_norm_unfused(&t[0], &t[1], 1e-5).unwrap(),
    );
    compare(
        "layernorm per head",
        &[x, w, bias],
        &|t| kernels::layer_norm(&t[0], &t[1], Some(&t[2]), 1e-5).unwrap(),
        &|t| kernels::layer_norm_unfused(&t[0], &t[1], Some(&t[2]), 1e-5).unwrap(),
    );
}

#[test]
fn f64_falls_back_to_the_unfused_composition() {
    let x = randn(1, &[4, 16]).to_dtype(DType::F64).unwrap();
    let w = randn(2, &[16]).to_dtype(DType::F64).unwrap();
    let a = kernels::rms_norm(&x, &w, 1e-5).unwrap();
    let b = kernels::rms_norm_unfused(&x, &w, 1e-5).unwrap();
    assert_eq!(a.to_vec2::<f64>().unwrap(), b.to_vec2::<f64>().unwrap());
}

#[test]
fn rope_matches_the_unfused_rotation() {
    for (i, (b, h, t, d, offset)) in [(2, 3, 7, 32, 0), (1, 2, 5, 8, 3), (3, 1, 1, 6, 9)]
        .into_iter()
        .enumerate()
    {
        let tables = RopeTables::new(d, 16, 10_000.0, DType::F32, &Device::Cpu).unwrap();
        // The projection's layout (B, T, H·d), as attention hands it over.
        let x = randn(30 + i as u64, &[b, t, h * d]);
        for (label, x) in [("contiguous", x.clone()), ("strided", strided(&x))] {
            for scale in [1.0, 0.125] {
                compare(
                    &format!("rope {:?} {label} scale {scale}", (b, h, t, d, offset)),
                    std::slice::from_ref(&x),
                    &|v| kernels::rope(&v[0], &tables, offset, scale).unwrap(),
                    &|v| {
                        kernels::rope_unfused(&v[0], &tables, offset)
                            .unwrap()
                            .affine(scale, 0.0)
                            .unwrap()
                    },
                );
            }
        }
    }
}

/// The log-n factor written out: a query at 0-based position p sees n = p + 1 keys and is
/// scaled by ln n / ln m once n > m.
fn logn_by_hand(position: usize, m: usize) -> f64 {
    let n = (position + 1) as f64;
    if n > m as f64 {
        n.ln() / (m as f64).ln()
    } else {
        1.0
    }
}

#[test]
fn rope_with_logn_scaling_matches_rotation_times_the_per_position_factor() {
    // Positions 0..12 after `offset`, training length m = 4 or 7: both sides of m, and a window
    // entirely past it.
    for (i, (b, h, t, d, offset, m)) in [(2, 3, 12, 8, 0, 4), (1, 2, 5, 6, 7, 4), (2, 1, 9, 4, 3, 7)]
        .into_iter()
        .enumerate()
    {
        let tables = RopeTables::new(d, 32, 10_000.0, DType::F32, &Device::Cpu).unwrap();
        let x = randn(130 + i as u64, &[b, t, h * d]);
        let scale = kernels::PositionScale {
            scale: 0.25,
            logn_length: Some(m),
        };
        let factors: Vec<f32> = (offset..offset + t)
            .map(|p| (0.25 * logn_by_hand(p, m)) as f32)
            .collect();
        let factors = Tensor::from_vec(factors, (1, t, 1), &Device::Cpu).unwrap();
        for (label, x) in [("contiguous", x.clone()), ("strided", strided(&x))] {
            compare(
                &format!("rope logn {:?} {label}", (b, h, t, d, offset, m)),
                std::slice::from_ref(&x),
                &|v| kernels::rope(&v[0], &tables, offset, scale).unwrap(),
                &|v| {
                    kernels::rope_unfused(&v[0], &tables, offset)
                        .unwrap()
                        .broadcast_mul(&factors)
                        .unwrap()
                },
            );
        }
        // The unfused path (what CUDA takes) applies the same factors.
        let unfused = kernels::rope(&x.to_dtype(DType::F64).unwrap(), &tables_f64(d), offset, scale).unwrap();
        let by_hand = kernels::rope_unfused(&x, &tables, offset)
            .unwrap()
            .broadcast_mul(&factors)
            .unwrap();
        assert_close(
            "rope logn, unfused path",
            &unfused.to_dtype(DType::F32).unwrap(),
            &by_hand,
        );
    }
}

fn tables_f64(d: usize) -> RopeTables {
    RopeTables::new(d, 32, 10_000.0, DType::F64, &Device::Cpu).unwrap()
}

#[test]
fn logn_scaling_is_exactly_a_no_op_up_to_the_training_length() {
    let m = 16;
    assert_eq!(kernels::logn_factor(m - 1, Some(m)), 1.0);
    assert!(kernels::logn_factor(m, Some(m)) > 1.0);
    assert_eq!(kernels::logn_factor(10_000, None), 1.0);
    assert!(
        (kernels::logn_factor(255, Some(16)) - 2.0).abs() < 1e-12,
        "ln 256 / ln 16 = 2"
    );
    let tables = RopeTables::new(8, 64, 10_000.0, DType::F32, &Device::Cpu).unwrap();
    let x = randn(140, &[2, m, 3 * 8]);
    let plain = kernels::rope(&x, &tables, 0, 0.125).unwrap();
    let scaled = kernels::rope(
        &x,
        &tables,
        0,
        kernels::PositionScale {
            scale: 0.125,
            logn_length: Some(m),
        },
    )
    .unwrap();
    let bits = |t: &Tensor| -> Vec<u32> {
        t.flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect()
    };
    assert_eq!(bits(&plain), bits(&scaled), "positions 0..m: the same bits");
}

#[test]
fn softmax_matches_the_unfused_composition() {
    for (i, shape) in [vec![4, 9], vec![2, 3, 64], vec![5, 1]].into_iter().enumerate() {
        let x = (randn(40 + i as u64, &shape) * 4.0).unwrap();
        for (label, x) in [("contiguous", x.clone()), ("strided", strided(&x))] {
            compare(
                &format!("softmax {shape:?} {label}"),
                std::slice::from_ref(&x),
                &|v| kernels::softmax_rows(&v[0]).unwrap(),
                &|v| kernels::softmax_rows_unfused(&v[0]).unwrap(),
            );
        }
    }
}

/// Causal (1, 1, T, S) and padding (B, 1, 1, S) masks as the model builds them, the padding one
/// with one batch row fully masked.
fn masks(b: usize, t: usize, s: usize) -> Vec<(&'static str, Option<Tensor>)> {
    let causal = kernels::causal_mask(t, s - t, DType::F32, &Device::Cpu).unwrap();
    let keep: Vec<f32> = (0..b * s)
        .map(|i| {
            let (row, col) = (i / s, i % s);
            // Row 1 is an empty source (every key masked); other rows lose their last `row` keys.
            if row == 1 || col + row >= s {
                0.0
            } else {
                1.0
            }
        })
        .collect();
    let keep = Tensor::from_vec(keep, (b, s), &Device::Cpu).unwrap();
    let padding = kernels::padding_mask(&keep, DType::F32).unwrap();
    let both = causal.broadcast_add(&padding).unwrap();
    vec![
        ("none", None),
        ("causal", Some(causal)),
        ("padding", Some(padding)),
        ("causal+padding", Some(both)),
    ]
}

fn attn_opts(h: usize, hkv: usize, dropout: Option<(f64, u64)>) -> kernels::AttentionOptions {
    kernels::AttentionOptions {
        heads: h,
        kv_heads: hkv,
        dropout,
        telemetry: false,
        precision: kernels::Precision::F32,
    }
}

#[test]
fn attention_matches_the_unfused_composition() {
    // (B, H, H_kv, T, S, d): plain, GQA groups of 2 and 3, odd sizes, one query (decoding),
    // and S > 4d, where the backward recomputes the probabilities instead of keeping them.
    for (i, (b, h, hkv, t, s, d)) in [
        (2, 4, 4, 8, 8, 32),
        (3, 4, 2, 5, 7, 16),
        (2, 6, 2, 9, 9, 7),
        (2, 3, 1, 1, 6, 8),
        (2, 4, 2, 6, 21, 4),
    ]
    .into_iter()
    .enumerate()
    {
        // The projections' layout: q (B, T, H·d), k and v (B, S, H_kv·d).
        let q = (randn(50 + i as u64, &[b, t, h * d]) * 0.5).unwrap();
        let k = randn(60 + i as u64, &[b, s, hkv * d]);
        let v = randn(70 + i as u64, &[b, s, hkv * d]);
        for (mask_name, mask) in masks(b, t, s) {
            for (label, q, v, dropout) in [
                ("contiguous", q.clone(), v.clone(), None),
                ("strided", strided(&q), strided(&v), None),
                ("dropout", q.clone(), v.clone(), Some((0.3, 11 + i as u64))),
            ] {
                let name = format!("attention {:?} mask {mask_name} {label}", (b, h, hkv, t, s, d));
                let opts = attn_opts(h, hkv, dropout);
                compare(
                    &name,
                    &[q.clone(), k.clone(), v],
                    &|x| {
                        kernels::attention(&x[0], &x[1], &x[2], mask.as_ref(), &opts)
                            .unwrap()
                            .0
                    },
                    &|x| {
                        // candle's matmul refuses some strided operands; the reference copies.
                        let [q, k, v] = [0, 1, 2].map(|i| x[i].contiguous().unwrap());
                        kernels::attention_unfused(&q, &k, &v, mask.as_ref(), &opts)
                            .unwrap()
                            .0
                    },
                );
            }
        }
    }
}

#[test]
fn attention_telemetry_matches_the_unfused_measurement_and_changes_nothing() {
    let (b, h, t, d) = (2, 4, 6, 8);
    let q = (randn(83, &[b, t, h * d]) * 2.0).unwrap();
    let k = randn(84, &[b, t, h * d]);
    let v = randn(85, &[b, t, h * d]);
    for (mask_name, mask) in masks(b, t, t) {
        let plain = attn_opts(h, h, None);
        let measured = kernels::AttentionOptions {
            telemetry: true,
            ..plain
        };
        let (y, none) = kernels::attention(&q, &k, &v, mask.as_ref(), &plain).unwrap();
        let (y_measured, fused) = kernels::attention(&q, &k, &v, mask.as_ref(), &measured).unwrap();
        let (_, unfused) = kernels::attention_unfused(&q, &k, &v, mask.as_ref(), &measured).unwrap();
        assert!(none.is_none());
        assert_eq!(
            max_rel_diff(&y, &y_measured),
            0.0,
            "{mask_name}: telemetry changed the output"
        );
        let (fused, unfused) = (fused.unwrap(), unfused.unwrap());
        assert!(
            (fused.max_logit - unfused.max_logit).abs() <= 1e-5 * unfused.max_logit.abs(),
            "{mask_name}: max logit {} vs {}",
            fused.max_logit,
            unfused.max_logit
        );
        assert!(
            (fused.entropy - unfused.entropy).abs() <= 1e-4,
            "{mask_name}: entropy {} vs {}",
            fused.entropy,
            unfused.entropy
        );
    }
}

#[test]
fn attention_with_huge_logits_does_not_skip_keys_it_needs() {
    // |q·k| far beyond the skip bound: the kernel must compute every masked logit, as unfused.
    let (b, h, t, d) = (1, 2, 4, 8);
    let q = (randn(80, &[b, t, h * d]) * 1e4).unwrap();
    let k = (randn(81, &[b, t, h * d]) * 1e3).unwrap();
    let v = randn(82, &[b, t, h * d]);
    let mask = kernels::causal_mask(t, 0, DType::F32, &Device::Cpu).unwrap();
    let opts = attn_opts(h, h, None);
    let a = kernels::attention(&q, &k, &v, Some(&mask), &opts).unwrap().0;
    let u = kernels::attention_unfused(&q, &k, &v, Some(&mask), &opts)
        .unwrap()
        .0;
    assert_close("huge logits", &a, &u);
}

/// Targets and a mask (every third row padding) for `n` rows of a `vocab`-word output.
fn targets_and_mask(n: usize, vocab: usize, salt: usize) -> (Tensor, Tensor) {
    let targets: Vec<u32> = (0..n).map(|j| ((j * 7 + salt) % vocab) as u32).collect();
    let mask: Vec<f32> = (0..n).map(|j| if j % 3 == 2 { 0.0 } else { 1.0 }).collect();
    (
        Tensor::new(targets.as_slice(), &Device::Cpu).unwrap(),
        Tensor::new(mask.as_slice(), &Device::Cpu).unwrap(),
    )
}

/// The largest |element| of `t`.
fn max_abs(t: &Tensor) -> f32 {
    t.abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

#[test]
fn activations_match_the_unfused_composition() {
    for (i, shape) in [vec![3, 5, 64], vec![7, 9], vec![1, 13]].into_iter().enumerate() {
        let a = (randn(100 + i as u64, &shape) * 3.0).unwrap();
        let u = randn(110 + i as u64, &shape);
        for (label, a) in [("contiguous", a.clone()), ("strided", strided(&a))] {
            compare(
                &format!("gelu {shape:?} {label}"),
                std::slice::from_ref(&a),
                &|x| kernels::gelu_erf(&x[0]).unwrap(),
                &|x| x[0].gelu_erf().unwrap(),
            );
            compare(
                &format!("swiglu {shape:?} {label}"),
                &[a.clone(), strided(&u)],
                &|x| kernels::swiglu(&x[0], &x[1]).unwrap(),
                &|x| kernels::swiglu_unfused(&x[0], &x[1]).unwrap(),
            );
        }
    }
}

/// A bias added to every row: the forward pass has the bits of candle's broadcast add, and the
/// bias gradient is each column's sum taken down the rows in order (held to an f64 sum).
#[test]
fn a_bias_add_matches_the_broadcast_add() {
    for (i, shape) in [vec![3, 5, 64], vec![7, 9], vec![1, 1, 13], vec![40, 33, 128]]
        .into_iter()
        .enumerate()
    {
        let y = randn(200 + i as u64, &shape);
        let b = randn(210 + i as u64, &[shape[shape.len() - 1]]);
        for (label, y) in [("contiguous", y.clone()), ("strided", strided(&y))] {
            compare(
                &format!("bias {shape:?} {label}"),
                &[y.clone(), b.clone()],
                &|x| kernels::add_bias(&x[0], &x[1]).unwrap(),
                &|x| kernels::add_bias_unfused(&x[0], &x[1]).unwrap(),
            );
            let fused = kernels::add_bias(&y, &b).unwrap();
            assert_eq!(
                max_rel_diff(&fused, &y.broadcast_add(&b).unwrap()),
                0.0,
                "bias {shape:?} {label}: one f32 add per element, as candle's"
            );
        }
        let probe = randn(220 + i as u64, &shape);
        let (_, grads) = run(&[y.clone(), b.clone()], &probe, &|x| {
            kernels::add_bias(&x[0], &x[1]).unwrap()
        });
        let c = b.dim(0).unwrap();
        let g: Vec<f32> = probe.flatten_all().unwrap().to_vec1().unwrap();
        let by_hand: Vec<f64> = (0..c)
            .map(|j| g.iter().skip(j).step_by(c).map(|&v| v as f64).sum())
            .collect();
        let db: Vec<f32> = grads[1].to_vec1().unwrap();
        for (j, (&got, &want)) in db.iter().zip(&by_hand).enumerate() {
            assert!(
                (got as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "column {j}: {got} vs {want}"
            );
        }
        assert_eq!(
            max_rel_diff(&grads[0], &probe),
            0.0,
            "dy is the incoming gradient itself"
        );
    }
}

#[test]
fn linear_matches_matmul_by_the_transposed_weight() {
    for (i, (rows, in_dim, out_dim)) in [(1, 1, 1), (7, 13, 5), (64, 128, 384), (3, 33, 65), (130, 8, 17)]
        .into_iter()
        .enumerate()
    {
        let x = randn(300 + i as u64, &[rows, in_dim]);
        let w = randn(310 + i as u64, &[out_dim, in_dim]);
        for (label, x, w) in [
            ("contiguous", x.clone(), w.clone()),
            ("strided", strided(&x), strided(&w)),
        ] {
            compare(
                &format!("linear {:?} {label}", (rows, in_dim, out_dim)),
                &[x, w],
                &|t| kernels::linear(&t[0], &t[1]).unwrap(),
                &|t| kernels::linear_unfused(&t[0], &t[1]).unwrap(),
            );
        }
    }
}

#[test]
fn linear_folds_leading_dimensions_into_rows() {
    let x = randn(320, &[2, 5, 13]);
    let w = randn(321, &[7, 13]);
    compare(
        "linear (2, 5, 13)",
        &[x, w],
        &|t| kernels::linear(&t[0], &t[1]).unwrap(),
        &|t| kernels::linear_unfused(&t[0], &t[1]).unwrap(),
    );
}

/// The flat f32 values of a tensor, for bit-for-bit comparisons.
fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

/// Whether two tensors hold the same bits, element for element.
fn same_bits(a: &Tensor, b: &Tensor) -> bool {
    a.shape() == b.shape()
        && values(a)
            .iter()
            .zip(values(b))
            .all(|(x, y)| x.to_bits() == y.to_bits())
}

#[test]
fn a_projection_then_gelu_matches_the_ops_one_by_one() {
    // Against candle's matmul and GELU, contiguous and strided, with leading dimensions; and the
    // bits of Ember's own two ops, forward and every gradient, which it replaces in the model.
    for (i, shape) in [vec![7, 13], vec![2, 5, 16], vec![130, 8]]
        .into_iter()
        .enumerate()
    {
        let in_dim = *shape.last().unwrap();
        let x = (randn(330 + i as u64, &shape) * 2.0).unwrap();
        let w = randn(340 + i as u64, &[24 + i, in_dim]);
        for (label, x, w) in [
            ("contiguous", x.clone(), w.clone()),
            ("strided", strided(&x), strided(&w)),
        ] {
            let what = format!("linear_gelu {shape:?} {label}");
            let inputs = [x, w];
            compare(
                &what,
                &inputs,
                &|t| kernels::linear_gelu(&t[0], &t[1]).unwrap(),
                &|t| kernels::linear_gelu_unfused(&t[0], &t[1]).unwrap(),
            );
            let probe = randn(99, kernels::linear_gelu(&inputs[0], &inputs[1]).unwrap().dims());
            let (y, g) = run(&inputs, &probe, &|t| kernels::linear_gelu(&t[0], &t[1]).unwrap());
            let (y2, g2) = run(&inputs, &probe, &|t| {
                kernels::gelu_erf(&kernels::linear(&t[0], &t[1]).unwrap()).unwrap()
            });
            assert!(same_bits(&y, &y2), "{what}: not the bits of linear, then GELU");
            for (n, (a, b)) in g.iter().zip(&g2).enumerate() {
                assert!(
                    same_bits(a, b),
                    "{what}: gradient {n} is not the bits of the two ops"
                );
            }
        }
    }
    let err = kernels::linear_gelu(&randn(350, &[3, 5]), &randn(351, &[4, 6])).unwrap_err();
    assert!(err.to_string().contains("does not fit"), "{err}");
}

#[test]
fn a_projection_with_a_bias_and_a_relu_matches_the_ops_one_by_one() {
    // Against candle's matmul, broadcast add (and ReLU), contiguous and strided, with leading
    // dimensions; and the bits of Ember's linear, then its bias add (then candle's ReLU),
    // forward and all three gradients (the model's biased projections took those ops before).
    for (i, shape) in [vec![7, 13], vec![2, 5, 16], vec![130, 8], vec![3, 40, 128]]
        .into_iter()
        .enumerate()
    {
        let in_dim = *shape.last().unwrap();
        let out_dim = 24 + i;
        let x = randn(700 + i as u64, &shape);
        let w = randn(710 + i as u64, &[out_dim, in_dim]);
        let b = randn(720 + i as u64, &[out_dim]);
        for (label, x, w) in [
            ("contiguous", x.clone(), w.clone()),
            ("strided", strided(&x), strided(&w)),
        ] {
            let inputs = [x, w, b.clone()];
            let probe = randn(
                98,
                kernels::linear_bias(&inputs[0], &inputs[1], &inputs[2])
                    .unwrap()
                    .dims(),
            );
            type Op = fn(&Tensor, &Tensor, &Tensor) -> candle_core::Result<Tensor>;
            type Composed<'a> = &'a dyn Fn(&[Tensor]) -> candle_core::Result<Tensor>;
            let two_ops = |t: &[Tensor]| kernels::add_bias(&kernels::linear(&t[0], &t[1])?, &t[2]);
            let cases: [(&str, Op, Op, Composed); 2] = [
                (
                    "linear_bias",
                    kernels::linear_bias,
                    kernels::linear_bias_unfused,
                    &two_ops,
                ),
                (
                    "linear_bias_relu",
                    kernels::linear_bias_relu,
                    kernels::linear_bias_relu_unfused,
                    &|t| two_ops(t)?.relu(),
                ),
            ];
            for (name, fused, unfused, one_by_one) in cases {
                let what = format!("{name} {shape:?} {label}");
                compare(&what, &inputs, &|t| fused(&t[0], &t[1], &t[2]).unwrap(), &|t| {
                    unfused(&t[0], &t[1], &t[2]).unwrap()
                });
                let (y, g) = run(&inputs, &probe, &|t| fused(&t[0], &t[1], &t[2]).unwrap());
                let (y2, g2) = run(&inputs, &probe, &|t| one_by_one(t).unwrap());
                assert!(same_bits(&y, &y2), "{what}: not the bits of the ops one by one");
                for (n, (a, b)) in g.iter().zip(&g2).enumerate() {
                    assert!(
                        same_bits(a, b),
                        "{what}: gradient {n} is not the bits of the ops one by one"
                    );
                }
            }
        }
    }
    // A sum of exactly 0 passes the ReLU's gradient, as candle's `ge(0)` mask does.
    let (x, w, b) = (
        Tensor::new(&[[1f32, -2.0]], &Device::Cpu).unwrap(),
        Tensor::new(&[[1f32, 1.0]], &Device::Cpu).unwrap(),
        Tensor::new(&[1f32], &Device::Cpu).unwrap(),
    );
    let (_, g) = run(&[x, w, b], &Tensor::new(&[[3f32]], &Device::Cpu).unwrap(), &|t| {
        kernels::linear_bias_relu(&t[0], &t[1], &t[2]).unwrap()
    });
    assert_eq!(values(&g[2]), [3.0], "the bias gradient at a sum of 0");
    let err =
        kernels::linear_bias(&randn(730, &[3, 5]), &randn(731, &[4, 5]), &randn(732, &[5])).unwrap_err();
    assert!(err.to_string().contains("does not fit"), "{err}");
}

#[test]
fn a_projection_then_a_constant_factor_matches_the_ops_one_by_one() {
    // scale · (x·Wᵀ) against candle's matmul and affine, contiguous and strided, with leading
    // dimensions; and the bits of Ember's linear, then candle's affine, forward and both
    // gradients (the model's unrotated queries took those two ops before).
    for (i, shape) in [vec![7, 13], vec![2, 5, 16], vec![130, 8]]
        .into_iter()
        .enumerate()
    {
        let in_dim = *shape.last().unwrap();
        let x = randn(360 + i as u64, &shape);
        let w = randn(365 + i as u64, &[24 + i, in_dim]);
        for scale in [0.176_776_7, -3.0] {
            for (label, x, w) in [
                ("contiguous", x.clone(), w.clone()),
                ("strided", strided(&x), strided(&w)),
            ] {
                let what = format!("linear_scaled {shape:?} {label} ×{scale}");
                let inputs = [x, w];
                compare(
                    &what,
                    &inputs,
                    &|t| kernels::linear_scaled(&t[0], &t[1], scale).unwrap(),
                    &|t| kernels::linear_scaled_unfused(&t[0], &t[1], scale).unwrap(),
                );
                let probe = randn(
                    98,
                    kernels::linear_scaled(&inputs[0], &inputs[1], scale)
                        .unwrap()
                        .dims(),
                );
                let (y, g) = run(&inputs, &probe, &|t| {
                    kernels::linear_scaled(&t[0], &t[1], scale).unwrap()
                });
                let (y2, g2) = run(&inputs, &probe, &|t| {
                    kernels::linear(&t[0], &t[1]).unwrap().affine(scale, 0.0).unwrap()
                });
                assert!(same_bits(&y, &y2), "{what}: not the bits of linear, then affine");
                for (n, (a, b)) in g.iter().zip(&g2).enumerate() {
                    assert!(
                        same_bits(a, b),
                        "{what}: gradient {n} is not the bits of the two ops"
                    );
                }
            }
        }
    }
    let err = kernels::linear_scaled(&randn(352, &[3, 5]), &randn(353, &[4, 6]), 0.5).unwrap_err();
    assert!(err.to_string().contains("does not fit"), "{err}");
}

#[test]
fn a_projection_then_the_rotation_matches_the_ops_one_by_one() {
    // scale · rotated(x·Wᵀ) against candle's matmul and the unfused rotation, contiguous and
    // strided, at an offset, with a constant scale and with log-n factors that grow past m = 4;
    // and the bits of Ember's linear, then rope, forward and both gradients.
    let tables = RopeTables::new(8, 32, 10_000.0, DType::F32, &Device::Cpu).unwrap();
    let logn = kernels::PositionScale {
        scale: 0.35,
        logn_length: Some(4),
    };
    for (i, (b, t, in_dim, heads, offset)) in [(2, 7, 16, 3, 0), (1, 12, 9, 2, 5)].into_iter().enumerate() {
        let x = randn(370 + i as u64, &[b, t, in_dim]);
        let w = randn(375 + i as u64, &[heads * 8, in_dim]);
        for scale in [kernels::PositionScale::from(1.0), logn] {
            for (label, x, w) in [
                ("contiguous", x.clone(), w.clone()),
                ("strided", strided(&x), strided(&w)),
            ] {
                let what = format!(
                    "linear_rope {:?} {label} {scale:?}",
                    (b, t, in_dim, heads, offset)
                );
                let inputs = [x, w];
                compare(
                    &what,
                    &inputs,
                    &|v| kernels::linear_rope(&v[0], &v[1], &tables, offset, scale).unwrap(),
                    &|v| kernels::linear_rope_unfused(&v[0], &v[1], &tables, offset, scale).unwrap(),
                );
                let probe = randn(99, &[b, t, heads * 8]);
                let (y, g) = run(&inputs, &probe, &|v| {
                    kernels::linear_rope(&v[0], &v[1], &tables, offset, scale).unwrap()
                });
                let (y2, g2) = run(&inputs, &probe, &|v| {
                    kernels::rope(&kernels::linear(&v[0], &v[1]).unwrap(), &tables, offset, scale).unwrap()
                });
                assert!(same_bits(&y, &y2), "{what}: not the bits of linear, then rope");
                for (n, (a, b)) in g.iter().zip(&g2).enumerate() {
                    assert!(
                        same_bits(a, b),
                        "{what}: gradient {n} is not the bits of the two ops"
                    );
                }
            }
        }
    }
    let err =
        kernels::linear_rope(&randn(380, &[1, 3, 4]), &randn(381, &[12, 4]), &tables, 0, 1.0).unwrap_err();
    assert!(err.to_string().contains("not a multiple of head_dim"), "{err}");
}

#[test]
fn a_branch_projected_into_the_residual_stream_matches_the_ops_one_by_one() {
    // x + dropout(h·Wᵀ), with dropout and without: forward and the three gradients against
    // candle's ops (f64 mask reference as for add_dropout), and bit for bit Ember's projection,
    // dropout and add one after the other.
    let h = randn(360, &[3, 20, 16]);
    let w = randn(361, &[7, 16]);
    let x = randn(362, &[3, 20, 7]);
    for p in [0.0, 0.3] {
        for (label, x, h, w) in [
            ("contiguous", x.clone(), h.clone(), w.clone()),
            ("strided", strided(&x), strided(&h), strided(&w)),
        ] {
            let what = format!("linear_residual p={p} {label}");
            let inputs = [x, h, w];
            compare(
                &what,
                &inputs,
                &|t| kernels::linear_residual(&t[0], &t[1], &t[2], p, 7).unwrap(),
                &|t| {
                    let f64 = |t: &Tensor| t.to_dtype(DType::F64).unwrap();
                    let branch = kernels::linear_unfused(&f64(&t[1]), &f64(&t[2])).unwrap();
                    let dropped = kernels::dropout_unfused(&branch, p, 7).unwrap();
                    (f64(&t[0]) + dropped).unwrap().to_dtype(DType::F32).unwrap()
                },
            );
            let probe = randn(99, inputs[0].dims());
            let fused = |t: &[Tensor]| kernels::linear_residual(&t[0], &t[1], &t[2], p, 7).unwrap();
            let one_by_one = |t: &[Tensor]| {
                let branch = kernels::linear(&t[1], &t[2]).unwrap();
                (&t[0] + kernels::dropout(&branch, p, 7).unwrap()).unwrap()
            };
            let (y, g) = run(&inputs, &probe, &fused);
            let (y2, g2) = run(&inputs, &probe, &one_by_one);
            assert!(same_bits(&y, &y2), "{what}: not the bits of the three ops");
            for (n, (a, b)) in g.iter().zip(&g2).enumerate() {
                assert!(
                    same_bits(a, b),
                    "{what}: gradient {n} is not the bits of the three ops"
                );
            }
        }
    }
    let err = kernels::linear_residual(&randn(363, &[3, 20, 8]), &h, &w, 0.3, 7).unwrap_err();
    assert!(err.to_string().contains("does not fit the projection"), "{err}");
    let err = kernels::linear_residual(&x, &randn(364, &[3, 20, 15]), &w, 0.3, 7).unwrap_err();
    assert!(err.to_string().contains("does not fit"), "{err}");
}

/// Every kernel's output and gradients at 1 thread and at 3: the bits must not differ.
#[test]
fn kernels_give_the_same_bits_at_any_thread_count() {
    // Large enough that every kernel cuts its work into several tasks.
    let (b, h, t, d) = (4, 4, 64, 32);
    let x = randn(400, &[b, t, h * d]);
    let w = randn(401, &[h * d, h * d]);
    let gain = randn(402, &[h * d]).affine(0.3, 1.0).unwrap();
    let (q, k, v) = (
        randn(403, &[b, t, h * d]),
        randn(404, &[b, t, h * d]),
        randn(405, &[b, t, h * d]),
    );
    let targets = Tensor::new(
        (0..(b * t) as u32)
            .map(|j| j % 300)
            .collect::<Vec<_>>()
            .as_slice(),
        &Device::Cpu,
    )
    .unwrap();
    let ones = Tensor::ones(b * t, DType::F32, &Device::Cpu).unwrap();
    let tables = RopeTables::new(d, t, 10_000.0, DType::F32, &Device::Cpu).unwrap();
    let mask = kernels::causal_mask(t, 0, DType::F32, &Device::Cpu).unwrap();
    let opts = attn_opts(h, h, Some((0.1, 5)));
    let cases: Vec<(&str, Vec<Tensor>, Composition<'_>)> = vec![
        (
            "linear",
            vec![x.clone(), w.clone()],
            Box::new(|t| kernels::linear(&t[0], &t[1]).unwrap()),
        ),
        (
            "linear cross-entropy",
            vec![
                x.reshape((b * t, h * d)).unwrap(),
                (randn(408, &[300, h * d]) * 0.1).unwrap(),
            ],
            Box::new(|t| {
                kernels::linear_cross_entropy(&t[0], &t[1], &targets, &ones, 0.1, 1e-4, true).unwrap()
            }),
        ),
        (
            "layernorm",
            vec![x.clone(), gain.clone(), gain],
            Box::new(|t| kernels::layer_norm(&t[0], &t[1], Some(&t[2]), 1e-5).unwrap()),
        ),
        (
            "rope",
            vec![x.clone()],
            Box::new(|t| kernels::rope(&t[0], &tables, 0, 0.25).unwrap()),
        ),
        (
            "gelu",
            vec![x.clone()],
            Box::new(|t| kernels::gelu_erf(&t[0]).unwrap()),
        ),
        (
            "linear, then GELU",
            vec![x.clone(), w.clone()],
            Box::new(|t| kernels::linear_gelu(&t[0], &t[1]).unwrap()),
        ),
        (
            "linear, then rope",
            vec![x.clone(), w.clone()],
            Box::new(|t| kernels::linear_rope(&t[0], &t[1], &tables, 0, 0.25).unwrap()),
        ),
        (
            "linear, then a constant factor",
            vec![x.clone(), w.clone()],
            Box::new(|t| kernels::linear_scaled(&t[0], &t[1], 0.3).unwrap()),
        ),
        (
            "linear into the residual stream",
            vec![q.clone(), x.clone(), w.clone()],
            Box::new(|t| kernels::linear_residual(&t[0], &t[1], &t[2], 0.2, 3).unwrap()),
        ),
        (
            "swiglu",
            vec![x.clone(), q.clone()],
            Box::new(|t| kernels::swiglu(&t[0], &t[1]).unwrap()),
        ),
        (
            "dropout",
            vec![x.clone()],
            Box::new(|t| kernels::dropout(&t[0], 0.2, 3).unwrap()),
        ),
        (
            "softmax",
            vec![x],
            Box::new(|t| kernels::softmax_rows(&t[0]).unwrap()),
        ),
        (
            "attention",
            vec![q, k, v],
            Box::new(move |t| {
                kernels::attention(&t[0], &t[1], &t[2], Some(&mask), &opts)
                    .unwrap()
                    .0
            }),
        ),
    ];
    for (name, inputs, f) in &cases {
        let probe = randn(407, f(inputs).dims());
        let mut runs = vec![];
        for threads in [1, 3] {
            kernels::par::set_threads(threads).unwrap();
            runs.push(run(inputs, &probe, f.as_ref()));
        }
        kernels::par::set_threads(1).unwrap();
        let ((y1, g1), (y3, g3)) = (&runs[0], &runs[1]);
        assert_eq!(
            max_rel_diff(y1, y3),
            0.0,
            "{name}: the output depends on the thread count"
        );
        for (i, (a, b)) in g1.iter().zip(g3).enumerate() {
            assert_eq!(
                max_rel_diff(a, b),
                0.0,
                "{name}: gradient {i} depends on the thread count"
            );
        }
    }
}

#[test]
fn linear_cross_entropy_matches_the_projection_then_the_loss() {
    // Upstream gradients drawn at random (per-token weights, some on the NLL row): the backward
    // pass recomputes the logits; with and without the forward pass's own gradients.
    for (i, (rows, d, vocab)) in [(6, 8, 11), (17, 16, 69), (3, 4, 1000)].into_iter().enumerate() {
        let h = randn(120 + i as u64, &[rows, d]);
        let w = (randn(130 + i as u64, &[vocab, d]) * 0.5).unwrap();
        let (targets, mask) = targets_and_mask(rows, vocab, i);
        for (eps, z) in [(0.0, 0.0), (0.1, 0.0), (0.0, 1e-3), (0.2, 1e-2)] {
            for grads in [false, true] {
                for (label, h) in [("contiguous", h.clone()), ("strided", strided(&h))] {
                    compare(
                        &format!(
                            "linear cross-entropy {:?} eps {eps} z {z} grads {grads} {label}",
                            (rows, d, vocab)
                        ),
                        &[h, w.clone()],
                        &|t| {
                            kernels::linear_cross_entropy(&t[0], &t[1], &targets, &mask, eps, z, grads)
                                .unwrap()
                        },
                        &|t| {
                            kernels::linear_cross_entropy_unfused(&t[0], &t[1], &targets, &mask, eps, z)
                                .unwrap()
                        },
                    );
                }
            }
        }
        // Padding rows (every third) get exactly zero gradient, here through the recomputing
        // backward (the NLL row gets a gradient too).
        let hv = Var::from_tensor(&h).unwrap();
        let out =
            kernels::linear_cross_entropy(hv.as_tensor(), &w, &targets, &mask, 0.1, 1e-3, true).unwrap();
        let g = out.sum_all().unwrap().backward().unwrap();
        assert_eq!(max_abs(&g.get(hv.as_tensor()).unwrap().get(2).unwrap()), 0.0);
    }
}

#[test]
fn linear_cross_entropy_gives_the_trainers_gradient_from_the_forward_pass() {
    // What the trainer does: the objective row summed, divided by the token count. The forward
    // pass computed dh and dW for it already; they must be the composition's. A vocabulary of 70k
    // makes blocks of 56 rows, so 150 rows (B = 3, T = 50) take three blocks. The reference is
    // the composition in f64: in f32 its own error over 70k-term sums (1.8e-5 relative on dh,
    // measured) is fifteen times the fused op's.
    for (shape, vocab) in [(vec![3, 50, 8], 70_000), (vec![2, 9, 16], 300)] {
        let d = shape[2];
        let rows = shape[0] * shape[1];
        let h = randn(140, &shape);
        let w = (randn(141, &[vocab, d]) * 0.5).unwrap();
        let (targets, mask) = targets_and_mask(rows, vocab, 3);
        let gradients = |dtype: DType| {
            let hv = Var::from_tensor(&h.to_dtype(dtype).unwrap()).unwrap();
            let wv = Var::from_tensor(&w.to_dtype(dtype).unwrap()).unwrap();
            let mask = mask.to_dtype(dtype).unwrap();
            let per_token = if dtype == DType::F32 {
                kernels::linear_cross_entropy(
                    hv.as_tensor(),
                    wv.as_tensor(),
                    &targets,
                    &mask,
                    0.1,
                    1e-4,
                    true,
                )
            } else {
                kernels::linear_cross_entropy_unfused(
                    hv.as_tensor(),
                    wv.as_tensor(),
                    &targets,
                    &mask,
                    0.1,
                    1e-4,
                )
            }
            .unwrap();
            let g = (per_token.get(0).unwrap().sum_all().unwrap() / rows as f64)
                .unwrap()
                .backward()
                .unwrap();
            let f32_of = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
            (
                f32_of(&per_token),
                f32_of(g.get(hv.as_tensor()).unwrap()),
                f32_of(g.get(wv.as_tensor()).unwrap()),
            )
        };
        let (yf, dhf, dwf) = gradients(DType::F32);
        let (yu, dhu, dwu) = gradients(DType::F64);
        assert_close(&format!("{shape:?} x {vocab}: losses"), &yf, &yu);
        assert_close(&format!("{shape:?} x {vocab}: dh"), &dhf, &dhu);
        assert_close(&format!("{shape:?} x {vocab}: dW"), &dwf, &dwu);
        // Padding rows (every third) get no gradient.
        assert_eq!(max_abs(&dhf.reshape((rows, d)).unwrap().get(2).unwrap()), 0.0);
    }
}

#[test]
fn linear_cross_entropy_gives_the_same_gradient_on_a_second_backward_pass() {
    // The first backward pass takes over the gradient the forward pass made; a second one over
    // the same graph computes it again from the saved row statistics.
    let (rows, d, vocab) = (18, 16, 300);
    let h = randn(150, &[2, 9, d]);
    let w = (randn(151, &[vocab, d]) * 0.5).unwrap();
    let (targets, mask) = targets_and_mask(rows, vocab, 3);
    let (hv, wv) = (Var::from_tensor(&h).unwrap(), Var::from_tensor(&w).unwrap());
    let per_token =
        kernels::linear_cross_entropy(hv.as_tensor(), wv.as_tensor(), &targets, &mask, 0.1, 1e-4, true)
            .unwrap();
    let loss = (per_token.get(0).unwrap().sum_all().unwrap() / rows as f64).unwrap();
    let (first, second) = (loss.backward().unwrap(), loss.backward().unwrap());
    for (what, v) in [("dh", hv.as_tensor()), ("dW", wv.as_tensor())] {
        let (a, b) = (first.get(v).unwrap(), second.get(v).unwrap());
        assert!(max_abs(a) > 0.0, "{what}: no gradient");
        assert_close(what, a, b);
    }
}

#[test]
fn linear_cross_entropy_refuses_a_weight_that_does_not_fit() {
    let (targets, mask) = targets_and_mask(4, 10, 0);
    let error_for = |weight: &[usize]| {
        kernels::linear_cross_entropy(
            &randn(1, &[4, 8]),
            &randn(2, weight),
            &targets,
            &mask,
            0.0,
            0.0,
            true,
        )
        .unwrap_err()
        .to_string()
    };
    let err = error_for(&[10, 6]);
    assert!(err.contains("do not fit"), "{err}");
    let err = error_for(&[5, 8]);
    assert!(err.contains("outside the vocabulary of 5"), "{err}");
}

#[test]
fn activations_are_exact_at_extreme_inputs() {
    // The vectorised exp/erf must saturate like the libm versions: no NaN, exact 0 and x.
    let x = Tensor::new(
        &[
            -1e4f32, -100., -20., -9., -3., -1e-3, 0., 1e-3, 3., 9., 20., 100., 1e4,
        ],
        &Device::Cpu,
    )
    .unwrap();
    let ours: Vec<f32> = kernels::gelu_erf(&x).unwrap().to_vec1().unwrap();
    let theirs: Vec<f32> = x.gelu_erf().unwrap().to_vec1().unwrap();
    for (a, b) in ours.iter().zip(&theirs) {
        assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "gelu {a} vs {b}");
    }
    let probs: Vec<f32> =
        kernels::softmax_rows(&Tensor::new(&[[0f32, -1e9, -88., 88.]], &Device::Cpu).unwrap())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
    assert_eq!(probs[1], 0.0);
    assert!(
        probs.iter().all(|p| p.is_finite()) && (probs[3] - 1.0).abs() < 1e-6,
        "{probs:?}"
    );
}

#[test]
fn dropout_kernel_draws_the_generators_mask() {
    // The fused kernel (f32) against the mask drawn one uniform at a time from the generator
    // (the f64 path), forward and gradient, contiguous and strided.
    let x = randn(120, &[3, 50, 7]);
    for (label, x) in [("contiguous", x.clone()), ("strided", strided(&x))] {
        compare(
            &format!("dropout {label}"),
            std::slice::from_ref(&x),
            &|v| kernels::dropout(&v[0], 0.3, 7).unwrap(),
            &|v| {
                let y = kernels::dropout_unfused(&v[0].to_dtype(DType::F64).unwrap(), 0.3, 7).unwrap();
                y.to_dtype(DType::F32).unwrap()
            },
        );
    }
    let ones = Tensor::ones(1000, DType::F32, &Device::Cpu).unwrap();
    let fused: Vec<f32> = kernels::dropout(&ones, 0.5, 9).unwrap().to_vec1().unwrap();
    let reference: Vec<f64> = kernels::dropout_unfused(&ones.to_dtype(DType::F64).unwrap(), 0.5, 9)
        .unwrap()
        .to_vec1()
        .unwrap();
    let dropped = fused.iter().filter(|&&v| v == 0.0).count();
    assert!(
        (400..600).contains(&dropped),
        "{dropped} of 1000 dropped at p = 0.5"
    );
    for (a, b) in fused.iter().zip(&reference) {
        assert_eq!(*a as f64, *b, "the two masks differ");
    }
}

#[test]
fn join_all_returns_every_tasks_result_in_task_order_with_or_without_a_pool() {
    let squares = || -> Vec<Box<dyn FnOnce() -> usize + Send>> {
        (0..7usize)
            .map(|i| Box::new(move || i * i) as Box<dyn FnOnce() -> usize + Send>)
            .collect()
    };
    let expected: Vec<usize> = (0..7).map(|i| i * i).collect();
    // (Another test of this binary may resize the pool meanwhile: the order holds at any size.)
    for threads in [3, 1] {
        kernels::par::set_threads(threads).unwrap();
        assert_eq!(kernels::par::join_all(squares()), expected, "{threads} threads");
    }
}
