//! The CUDA softmax and attention kernels (`cuda/softmax.cu`, `cuda/attention.cu`) against the
//! unfused candle compositions on the same GPU — values, gradients, masks, dropout, grouped-query
//! heads, telemetry, strided inputs, both attention paths (the fused kernels and, for long
//! sequences, cuBLAS around the fused softmax) — their bit-for-bit repeatability, and against the
//! CPU kernels.

use crate::common::{assert_close, compare, gpu, randn, randn_cpu, run, same_bits, strided};
use candle_core::{DType, Device, Tensor};
use ember_kernels as kernels;
use ember_kernels::AttentionOptions;
use ember_kernels::{causal_mask, cuda_fuses, padding_mask};

/// f32 kernel against f32 composition (‖a − b‖/‖b‖).
const TOL: f64 = 1e-5;

fn opts(h: usize, hkv: usize, dropout: Option<(f64, u64)>) -> AttentionOptions {
    AttentionOptions {
        heads: h,
        kv_heads: hkv,
        dropout,
        telemetry: false,
        precision: ember_kernels::Precision::F32,
    }
}

/// The masks the models build, on `dev`: causal (1, 1, T, S) where S ≥ T, padding (B, 1, 1, S)
/// with batch row 1 an empty source (every key masked) and row r losing its last r keys, and
/// both together.
fn masks(dev: &Device, b: usize, t: usize, s: usize) -> Vec<(&'static str, Option<Tensor>)> {
    let keep: Vec<f32> = (0..b * s)
        .map(|i| {
            let (row, col) = (i / s, i % s);
            if row == 1 || col + row >= s {
                0.0
            } else {
                1.0
            }
        })
        .collect();
    let keep = Tensor::from_vec(keep, (b, s), dev).unwrap();
    let padding = padding_mask(&keep, DType::F32).unwrap();
    let mut out = vec![("none", None), ("padding", Some(padding.clone()))];
    if s >= t {
        let causal = causal_mask(t, s - t, DType::F32, dev).unwrap();
        let both = causal.broadcast_add(&padding).unwrap();
        out.push(("causal", Some(causal)));
        out.push(("causal+padding", Some(both)));
    }
    out
}

/// The kernel's attention output.
fn fused(x: &[Tensor], mask: Option<&Tensor>, o: &AttentionOptions) -> Tensor {
    kernels::attention(&x[0], &x[1], &x[2], mask, o).unwrap().0
}

/// The unfused composition's (candle's matmul refuses some strided operands: it gets copies).
fn unfused(x: &[Tensor], mask: Option<&Tensor>, o: &AttentionOptions) -> Tensor {
    let [q, k, v] = [0, 1, 2].map(|i| x[i].contiguous().unwrap());
    kernels::attention_unfused(&q, &k, &v, mask, o).unwrap().0
}

/// q (B, T, H·d) and k, v (B, S, H_kv·d) on `dev`, q at the scale the models feed it.
fn qkv(
    dev: &Device,
    seed: u64,
    (b, h, hkv, t, s, d): (usize, usize, usize, usize, usize, usize),
) -> [Tensor; 3] {
    [
        randn(dev, seed, &[b, t, h * d], 0.5),
        randn(dev, seed + 1, &[b, s, hkv * d], 1.0),
        randn(dev, seed + 2, &[b, s, hkv * d], 1.0),
    ]
}

#[test]
fn softmax_matches_the_unfused_composition() {
    let dev = gpu();
    let shapes: [&[usize]; 7] = [
        &[4, 9],
        &[2, 3, 64],
        &[5, 1],
        &[3, 1000],
        &[7, 33],
        &[2, 5, 31],
        &[1, 4097],
    ];
    for (i, shape) in shapes.into_iter().enumerate() {
        let x = randn(&dev, 40 + i as u64, shape, 4.0);
        for (label, x) in [("contiguous", x.clone()), ("strided", strided(&x))] {
            compare(
                &format!("softmax {shape:?} {label}"),
                std::slice::from_ref(&x),
                &|v| kernels::softmax_rows(&v[0]).unwrap(),
                &|v| kernels::softmax_rows_unfused(&v[0]).unwrap(),
                TOL,
            );
        }
    }
}

#[test]
fn softmax_handles_masked_and_huge_logits_and_empty_tensors() {
    let dev = gpu();
    let x = Tensor::new(&[[0f32, -1e9, -88., 88.], [-1e9, -1e9, -1e9, -1e9]], &dev).unwrap();
    let p = crate::common::host(&kernels::softmax_rows(&x).unwrap());
    assert_eq!(p[1], 0.0);
    assert!(p.iter().all(|v| v.is_finite()), "{p:?}");
    assert!((p[3] - 1.0).abs() < 1e-6, "{p:?}");
    assert!(p[4..].iter().all(|&v| v == 0.25), "{p:?}");
    // No rows: a view of none of another tensor's (no zero-sized allocation).
    let empty = randn(&dev, 1, &[3, 5], 1.0).narrow(0, 0, 0).unwrap();
    assert_eq!(kernels::softmax_rows(&empty).unwrap().dims(), &[0, 5]);
}

#[test]
fn softmax_on_the_gpu_is_the_cpu_kernel_to_rounding() {
    let dev = gpu();
    for (i, shape) in [[37usize, 129], [64, 8], [3, 2000]].into_iter().enumerate() {
        let x = randn_cpu(70 + i as u64, &shape, 5.0);
        let probe = randn_cpu(80 + i as u64, &shape, 1.0);
        let f = |v: &[Tensor]| kernels::softmax_rows(&v[0]).unwrap();
        let (yc, gc) = run(std::slice::from_ref(&x), &probe, &f);
        let (yg, gg) = run(&[x.to_device(&dev).unwrap()], &probe.to_device(&dev).unwrap(), &f);
        assert!(yg.device().is_cuda() && yc.device().is_cpu());
        assert_close(&format!("softmax {shape:?} GPU vs CPU"), &yg, &yc, TOL);
        assert_close(
            &format!("softmax {shape:?} GPU vs CPU gradient"),
            &gg[0],
            &gc[0],
            TOL,
        );
    }
}

/// Every mask, contiguous and strided inputs, dropout on and off, for each shape, on whichever
/// path `cuda_fuses` says the shape takes with gradients (asserted to be `fused`).
fn attention_cases(shapes: &[(usize, usize, usize, usize, usize, usize)], fused_path: bool, seed: u64) {
    let dev = gpu();
    for (i, &shape) in shapes.iter().enumerate() {
        let (b, h, hkv, t, s, d) = shape;
        let o = opts(h, hkv, None);
        assert_eq!(
            cuda_fuses(&[b, t, h * d], &[b, s, hkv * d], &o, true),
            fused_path,
            "{shape:?}: not the path this test is for"
        );
        let [q, k, v] = qkv(&dev, seed + 10 * i as u64, shape);
        for (mask_name, mask) in masks(&dev, b, t, s) {
            for (label, q, v, dropout) in [
                ("contiguous", q.clone(), v.clone(), None),
                ("strided", strided(&q), strided(&v), None),
                ("dropout", q.clone(), v.clone(), Some((0.3, 11 + i as u64))),
                ("strided dropout", strided(&q), strided(&v), Some((0.1, 5))),
            ] {
                let o = opts(h, hkv, dropout);
                compare(
                    &format!("attention {shape:?} mask {mask_name} {label}"),
                    &[q, k.clone(), v],
                    &|x| fused(x, mask.as_ref(), &o),
                    &|x| unfused(x, mask.as_ref(), &o),
                    TOL,
                );
            }
        }
    }
}

#[test]
fn fused_attention_matches_the_unfused_composition() {
    // (B, H, H_kv, T, S, d): plain, GQA groups of 2 and 3, odd sizes, one query (decoding), more
    // keys than queries, more queries than keys (cross-attention), rows wider than a warp.
    attention_cases(
        &[
            (2, 4, 4, 8, 8, 32),
            (3, 4, 2, 5, 7, 16),
            (2, 6, 2, 9, 9, 7),
            (2, 3, 1, 1, 6, 8),
            (2, 4, 2, 6, 21, 4),
            (3, 4, 4, 23, 11, 32),
            (2, 4, 2, 40, 45, 32),
        ],
        true,
        100,
    );
}

#[test]
fn fused_attention_matches_at_the_translation_and_quickstart_shapes() {
    // Multi30k (many sentences, T and S in the tens, d = 32, H = 4; self- and cross-attention),
    // and the quickstart's short causal sequences.
    attention_cases(
        &[
            (128, 4, 4, 37, 41, 32),
            (96, 4, 4, 29, 18, 32),
            (16, 4, 4, 16, 16, 32),
        ],
        true,
        200,
    );
}

#[test]
fn long_sequences_take_cublas_around_the_fused_softmax_and_match() {
    // S beyond what a block's shared memory holds (the backward's, or the forward's too).
    attention_cases(
        &[
            (2, 4, 2, 20, 120, 32),
            (2, 2, 1, 9, 300, 64),
            (3, 4, 4, 100, 100, 48),
        ],
        false,
        300,
    );
}

#[test]
fn tiny_shakespeare_attention_takes_the_fallback_and_matches() {
    let dev = gpu();
    let shape = (64, 6, 6, 256, 256, 64);
    let (b, h, hkv, t, s, d) = shape;
    assert!(!cuda_fuses(
        &[b, t, h * d],
        &[b, s, hkv * d],
        &opts(h, hkv, None),
        true
    ));
    let [q, k, v] = qkv(&dev, 400, shape);
    let causal = causal_mask(t, 0, DType::F32, &dev).unwrap();
    for dropout in [None, Some((0.2, 77))] {
        let o = opts(h, hkv, dropout);
        compare(
            &format!("attention {shape:?} causal dropout {dropout:?}"),
            &[q.clone(), k.clone(), v.clone()],
            &|x| fused(x, Some(&causal), &o),
            &|x| unfused(x, Some(&causal), &o),
            TOL,
        );
    }
}

#[test]
fn the_fused_forward_serves_inference_where_only_the_backward_does_not_fit() {
    let dev = gpu();
    let shape = (4, 4, 2, 20, 120, 32);
    let (b, h, hkv, t, s, d) = shape;
    let o = opts(h, hkv, None);
    let (qd, kd) = ([b, t, h * d], [b, s, hkv * d]);
    assert!(cuda_fuses(&qd, &kd, &o, false) && !cuda_fuses(&qd, &kd, &o, true));
    let x = qkv(&dev, 500, shape);
    for (mask_name, mask) in masks(&dev, b, t, s) {
        // Plain tensors (no gradient): the fused forward kernel.
        let (a, r) = (fused(&x, mask.as_ref(), &o), unfused(&x, mask.as_ref(), &o));
        assert_close(&format!("inference {shape:?} mask {mask_name}"), &a, &r, TOL);
        assert!(same_bits(&a, &fused(&x, mask.as_ref(), &o)));
    }
}

#[test]
fn a_strided_mask_is_read_through_its_strides() {
    // An anti-causal mask as the transpose of a causal one: (1, 1, T, T) with strides (…, 1, T),
    // on the fused path and on the fallback.
    let dev = gpu();
    for (i, (shape, fused_path)) in [((3, 4, 2, 13, 13, 16), true), ((2, 2, 1, 150, 150, 64), false)]
        .into_iter()
        .enumerate()
    {
        let (b, h, hkv, t, s, d) = shape;
        assert_eq!(
            cuda_fuses(&[b, t, h * d], &[b, s, hkv * d], &opts(h, hkv, None), true),
            fused_path
        );
        let mask = causal_mask(t, 0, DType::F32, &dev)
            .unwrap()
            .transpose(2, 3)
            .unwrap();
        assert!(!mask.is_contiguous());
        let x = qkv(&dev, 600 + 10 * i as u64, shape);
        for dropout in [None, Some((0.3, 9))] {
            let o = opts(h, hkv, dropout);
            compare(
                &format!("attention {shape:?} strided mask dropout {dropout:?}"),
                &x,
                &|x| fused(x, Some(&mask), &o),
                &|x| unfused(x, Some(&mask), &o),
                TOL,
            );
        }
    }
}

#[test]
fn attention_telemetry_matches_the_unfused_measurement_and_changes_nothing() {
    let dev = gpu();
    // The fused path and the fallback.
    for (shape, fused_path) in [((2, 4, 4, 6, 6, 8), true), ((2, 4, 2, 7, 300, 64), false)] {
        let (b, h, hkv, t, s, d) = shape;
        let plain = opts(h, hkv, None);
        assert_eq!(
            cuda_fuses(&[b, t, h * d], &[b, s, hkv * d], &plain, false),
            fused_path
        );
        let [q, k, v] = qkv(&dev, 700, shape);
        let q = (q * 4.0).unwrap();
        let measured_opts = AttentionOptions {
            telemetry: true,
            ..plain
        };
        for (mask_name, mask) in masks(&dev, b, t, s) {
            let what = format!("{shape:?} mask {mask_name}");
            let (y, none) = kernels::attention(&q, &k, &v, mask.as_ref(), &plain).unwrap();
            let (y_measured, ours) = kernels::attention(&q, &k, &v, mask.as_ref(), &measured_opts).unwrap();
            let (_, reference) =
                kernels::attention_unfused(&q, &k, &v, mask.as_ref(), &measured_opts).unwrap();
            assert!(none.is_none(), "{what}: telemetry without asking");
            assert!(same_bits(&y, &y_measured), "{what}: telemetry changed the output");
            let (ours, reference) = (ours.unwrap(), reference.unwrap());
            assert!(
                (ours.max_logit - reference.max_logit).abs() <= 1e-5 * reference.max_logit.abs(),
                "{what}: max logit {} vs {}",
                ours.max_logit,
                reference.max_logit
            );
            assert!(
                (ours.entropy - reference.entropy).abs() <= 1e-4,
                "{what}: entropy {} vs {}",
                ours.entropy,
                reference.entropy
            );
            assert_eq!(ours.entropy_by_position.len(), t, "{what}");
            for (p, (a, r)) in ours
                .entropy_by_position
                .iter()
                .zip(&reference.entropy_by_position)
                .enumerate()
            {
                assert!(
                    (a - r).abs() <= 1e-4,
                    "{what}: entropy at position {p}: {a} vs {r}"
                );
            }
        }
    }
}

#[test]
fn attention_on_the_gpu_is_the_cpu_kernel_to_rounding() {
    let dev = gpu();
    // The fused path (with GQA) and the fallback, with masks and dropout: the same dropout mask
    // on both devices, so the results agree to rounding.
    for (i, shape) in [(3, 4, 2, 5, 7, 16), (4, 4, 4, 31, 33, 32), (2, 2, 1, 9, 300, 64)]
        .into_iter()
        .enumerate()
    {
        let (b, h, hkv, t, s, d) = shape;
        let q = randn_cpu(800 + i as u64, &[b, t, h * d], 0.5);
        let k = randn_cpu(810 + i as u64, &[b, s, hkv * d], 1.0);
        let v = randn_cpu(820 + i as u64, &[b, s, hkv * d], 1.0);
        let probe = randn_cpu(830 + i as u64, &[b, t, h * d], 1.0);
        for (mask_name, mask) in masks(&Device::Cpu, b, t, s) {
            for dropout in [None, Some((0.25, 3 + i as u64))] {
                let o = opts(h, hkv, dropout);
                let what = format!("{shape:?} mask {mask_name} dropout {dropout:?}");
                let (yc, gc) = run(&[q.clone(), k.clone(), v.clone()], &probe, &|x| {
                    fused(x, mask.as_ref(), &o)
                });
                let on_gpu = |t: &Tensor| t.to_device(&dev).unwrap();
                let mask_gpu = mask.as_ref().map(on_gpu);
                let (yg, gg) = run(&[on_gpu(&q), on_gpu(&k), on_gpu(&v)], &on_gpu(&probe), &|x| {
                    fused(x, mask_gpu.as_ref(), &o)
                });
                assert!(yg.device().is_cuda() && yc.device().is_cpu());
                assert_close(&format!("{what}: GPU vs CPU"), &yg, &yc, TOL);
                for (j, (a, c)) in gg.iter().zip(&gc).enumerate() {
                    assert_close(&format!("{what}: GPU vs CPU gradient {j}"), a, c, TOL);
                }
            }
        }
    }
}
