//! The fused kernels' algorithm (`cuda/attention.cuh`, run row by row on the host by
//! `cuda/attention_mirror.cpp`) against this module's CPU kernel: indices, GQA heads, mask
//! strides, the dropout counter, telemetry, the backward pass's formulas, and in bf16 which
//! operands the products round.

use candle_core::{DType, Device, Tensor, Var};

use super::*;

extern "C" {
    fn ember_mirror_attn_factor(state: u64, threshold: u64, keep: f32, idx: u64) -> f32;
    fn ember_mirror_attn_prob_index(
        b: u64,
        h: u64,
        t: u64,
        s: u64,
        heads: u64,
        queries: u64,
        keys: u64,
    ) -> u64;
    fn ember_mirror_attention_fwd(
        q: *const f32,
        k: *const f32,
        v: *const f32,
        mask: *const f32,
        b: u32,
        h: u32,
        hkv: u32,
        t: u32,
        s: u32,
        d: u32,
        has_mask: i32,
        ms_b: u64,
        ms_h: u64,
        ms_t: u64,
        ms_s: u64,
        has_dropout: i32,
        state: u64,
        threshold: u64,
        keep: f32,
        round: i32,
        out: *mut f32,
        row_max: *mut f32,
        row_ent: *mut f32,
    );
    fn ember_mirror_attention_bwd(
        q: *const f32,
        k: *const f32,
        v: *const f32,
        o: *const f32,
        go: *const f32,
        mask: *const f32,
        b: u32,
        h: u32,
        hkv: u32,
        t: u32,
        s: u32,
        d: u32,
        has_mask: i32,
        ms_b: u64,
        ms_h: u64,
        ms_t: u64,
        ms_s: u64,
        has_dropout: i32,
        state: u64,
        threshold: u64,
        keep: f32,
        round: i32,
        dq: *mut f32,
        dk: *mut f32,
        dv: *mut f32,
    );
}

fn random(shape: &[usize], seed: u64, scale: f32) -> Tensor {
    let mut rng = ember_rng::SplitMix64::new(seed);
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rng.normal() as f32 * scale).collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

/// ‖a − b‖ / ‖b‖.
fn rel(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

#[test]
fn the_device_dropout_element_is_the_cpu_kernels() {
    let dims = AttnDims {
        b: 2,
        h: 3,
        hkv: 1,
        t: 5,
        s: 7,
        d: 4,
    };
    let op = DropoutOp::new(0.3, 0xABCD).unwrap();
    let (state, threshold, keep) = op.parts();
    let mut dropped = 0;
    for b in 0..dims.b {
        for h in 0..dims.h {
            for t in 0..dims.t {
                for s in 0..dims.s {
                    let idx = unsafe {
                        ember_mirror_attn_prob_index(
                            b as u64,
                            h as u64,
                            t as u64,
                            s as u64,
                            dims.h as u64,
                            dims.t as u64,
                            dims.s as u64,
                        )
                    };
                    assert_eq!(idx as usize, dims.probs_block(b, h) + t * dims.s + s);
                    let f = unsafe { ember_mirror_attn_factor(state, threshold, keep, idx) };
                    assert_eq!(
                        f.to_bits(),
                        op.factor(idx as usize).to_bits(),
                        "({b}, {h}, {t}, {s})"
                    );
                    dropped += (f == 0.0) as usize;
                }
            }
        }
    }
    assert!(dropped > 0 && dropped < dims.b * dims.h * dims.t * dims.s);
}

/// The mask as the kernels take it: its elements from the broadcast view's first, and the
/// view's (b, h, t, s) strides.
fn mask_parts(mask: Option<&Tensor>, dims: AttnDims) -> (Vec<f32>, [u64; 4], bool) {
    match mask {
        None => (vec![0.0], [0; 4], false),
        Some(m) => {
            let m = m.broadcast_as((dims.b, dims.h, dims.t, dims.s)).unwrap();
            let (st, l) = m.storage_and_layout();
            let data = cpu_storage(&st).unwrap()[l.start_offset()..].to_vec();
            let s = l.stride();
            (data, [s[0] as u64, s[1] as u64, s[2] as u64, s[3] as u64], true)
        }
    }
}

#[test]
fn the_fused_kernels_algorithm_is_the_cpu_kernels() {
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
        let seed = 10 * i as u64;
        let q = random(&[b, t, h * d], seed + 1, 0.5);
        let k = random(&[b, s, hkv * d], seed + 2, 1.0);
        let v = random(&[b, s, hkv * d], seed + 3, 1.0);
        let probe = random(&[b, t, h * d], seed + 4, 1.0);
        // Row 1 of the padding mask is an empty source; the others lose their last `row` keys.
        let keep: Vec<f32> = (0..b * s)
            .map(|j| {
                let (row, col) = (j / s, j % s);
                if row == 1 || col + row >= s {
                    0.0
                } else {
                    1.0
                }
            })
            .collect();
        let padding =
            padding_mask(&Tensor::from_vec(keep, (b, s), &Device::Cpu).unwrap(), DType::F32).unwrap();
        let causal = causal_mask(t, s - t, DType::F32, &Device::Cpu).unwrap();
        for (mask_name, mask) in [
            ("none", None),
            ("causal", Some(causal)),
            ("padding", Some(padding)),
        ] {
            // The f32 kernel's output and gradients, for the bf16 pass after it.
            let mut f32_results: Vec<Vec<f32>> = Vec::new();
            for (dropout, precision) in [None, Some((0.3, 17 + i as u64))]
                .into_iter()
                .flat_map(|dropout| [Precision::F32, Precision::Bf16].map(|p| (dropout, p)))
            {
                // bf16 on any CPU: natively where it has AVX512_BF16, else emulated with its bits.
                crate::emulate_bf16_products();
                let what = format!(
                    "{:?} mask {mask_name} dropout {dropout:?} {precision}",
                    (b, h, hkv, t, s, d)
                );
                let opts = AttentionOptions {
                    heads: h,
                    kv_heads: hkv,
                    dropout,
                    telemetry: true,
                    precision,
                };
                let round = (precision == Precision::Bf16) as i32;
                let dims = AttnDims::of(q.dims(), k.dims(), &opts).unwrap();
                // The CPU kernel, forward and gradients.
                let vars = [&q, &k, &v].map(|x| Var::from_tensor(x).unwrap());
                let (out, measured) = attention(
                    vars[0].as_tensor(),
                    vars[1].as_tensor(),
                    vars[2].as_tensor(),
                    mask.as_ref(),
                    &opts,
                )
                .unwrap();
                let grads = (&out * &probe).unwrap().sum_all().unwrap().backward().unwrap();
                let g = vars.each_ref().map(|x| values(grads.get(x.as_tensor()).unwrap()));
                let measured = measured.unwrap();

                let (mv, ms, has_mask) = mask_parts(mask.as_ref(), dims);
                let (has_dropout, state, threshold, keep) = match dims_dropout(&opts) {
                    Some(op) => {
                        let (s, th, k) = op.parts();
                        (1, s, th, k)
                    }
                    None => (0, 0, 0, 1.0),
                };
                let (qv, kv, vv, pv) = (values(&q), values(&k), values(&v), values(&probe));
                let rows = b * h * t;
                let (mut o, mut row_max, mut row_ent) = (
                    vec![f32::NAN; qv.len()],
                    vec![f32::NAN; rows],
                    vec![f32::NAN; rows],
                );
                let (mut dq, mut dk, mut dv) = (
                    vec![f32::NAN; qv.len()],
                    vec![f32::NAN; kv.len()],
                    vec![f32::NAN; vv.len()],
                );
                unsafe {
                    ember_mirror_attention_fwd(
                        qv.as_ptr(),
                        kv.as_ptr(),
                        vv.as_ptr(),
                        mv.as_ptr(),
                        b as u32,
                        h as u32,
                        hkv as u32,
                        t as u32,
                        s as u32,
                        d as u32,
                        has_mask as i32,
                        ms[0],
                        ms[1],
                        ms[2],
                        ms[3],
                        has_dropout,
                        state,
                        threshold,
                        keep,
                        round,
                        o.as_mut_ptr(),
                        row_max.as_mut_ptr(),
                        row_ent.as_mut_ptr(),
                    );
                    ember_mirror_attention_bwd(
                        qv.as_ptr(),
                        kv.as_ptr(),
                        vv.as_ptr(),
                        o.as_ptr(),
                        pv.as_ptr(),
                        mv.as_ptr(),
                        b as u32,
                        h as u32,
                        hkv as u32,
                        t as u32,
                        s as u32,
                        d as u32,
                        has_mask as i32,
                        ms[0],
                        ms[1],
                        ms[2],
                        ms[3],
                        has_dropout,
                        state,
                        threshold,
                        keep,
                        round,
                        dq.as_mut_ptr(),
                        dk.as_mut_ptr(),
                        dv.as_mut_ptr(),
                    );
                }
                // The same arithmetic but for the order of sums (rows, products): f32 rounding. (In
                // bf16 a probability or dS that the two orders leave an ulp apart could round to
                // neighbouring bf16 values, 2⁻⁸ apart; these inputs have none: within 6e-8.)
                let tol = 1e-5;
                let results = [
                    ("output", &o, values(&out)),
                    ("dq", &dq, g[0].clone()),
                    ("dk", &dk, g[1].clone()),
                    ("dv", &dv, g[2].clone()),
                ];
                for (name, mirror, cpu) in &results {
                    let e = rel(mirror, cpu);
                    assert!(e < tol, "{what}: {name} {e:e}");
                }
                // bf16 rounds what the f32 kernel does not: each result is far from f32's.
                match precision {
                    Precision::F32 => f32_results = results.map(|(_, _, cpu)| cpu).to_vec(),
                    Precision::Bf16 => {
                        for ((name, mirror, _), f32_cpu) in results.iter().zip(&f32_results) {
                            let e = rel(mirror, f32_cpu);
                            assert!(e > 10.0 * tol, "{what}: {name} within {e:e} of f32's");
                        }
                    }
                }
                let m = telemetry_of_rows(dims, &row_max, &row_ent);
                assert!(
                    (m.max_logit - measured.max_logit).abs() <= 1e-5 * measured.max_logit.abs(),
                    "{what}: max logit {} vs {}",
                    m.max_logit,
                    measured.max_logit
                );
                assert!(
                    (m.entropy - measured.entropy).abs() <= 1e-5,
                    "{what}: entropy {} vs {}",
                    m.entropy,
                    measured.entropy
                );
                assert_eq!(m.entropy_by_position.len(), t);
                for (p, (x, y)) in m
                    .entropy_by_position
                    .iter()
                    .zip(&measured.entropy_by_position)
                    .enumerate()
                {
                    assert!(
                        (x - y).abs() <= 1e-5,
                        "{what}: entropy at position {p}: {x} vs {y}"
                    );
                }
            }
        }
    }
}

fn dims_dropout(opts: &AttentionOptions) -> Option<DropoutOp> {
    opts.dropout.and_then(|(p, state)| DropoutOp::new(p, state))
}
