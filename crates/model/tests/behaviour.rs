//! Specification: causality, padding invariance, KV-cache equivalence, rotary relativity,
//! QK-norm properties, telemetry and initialisation.

mod common;

use candle_core::{DType, Device, IndexOp, Tensor, D};
use common::*;
use ember_model::Attention;
use ember_model::Rotary;
use ember_model::{
    Arch, DecoderCache, ForwardCtx, MlpKind, Model, ModelConfig, NormKind, ParamStore, Positions, QkNorm,
    Telemetry,
};

fn eval() -> ForwardCtx<'static> {
    ForwardCtx::eval()
}

#[test]
fn changing_a_later_token_leaves_earlier_decoder_outputs_unchanged() {
    for arch in ALL_ARCHS {
        for qk in ALL_QK {
            let c = cfg(arch, qk, NormKind::Rmsnorm, MlpKind::Swiglu);
            let (model, _) = build(&c, DType::F32);
            let a = tokens(1, 8, c.vocab(), 5);
            let t = 4;
            let mut ids: Vec<u32> = a.flatten_all().unwrap().to_vec1().unwrap();
            ids[t + 1] = if ids[t + 1] == 5 { 6 } else { 5 };
            let b = Tensor::from_vec(ids, (1, 8), &Device::Cpu).unwrap();
            let (la, lb) = match &model {
                Model::Lm(m) => (m.forward(&a, eval()).unwrap(), m.forward(&b, eval()).unwrap()),
                Model::Seq2seq(m) => {
                    let src = tokens(1, 5, c.vocab(), 6);
                    (
                        m.forward(&src, None, &a, eval()).unwrap(),
                        m.forward(&src, None, &b, eval()).unwrap(),
                    )
                }
            };
            let prefix = |l: &Tensor| l.narrow(1, 0, t + 1).unwrap();
            assert!(
                max_abs_diff(&prefix(&la), &prefix(&lb)) <= 1e-6,
                "{arch:?}/{qk:?}: the past saw the future"
            );
            let later = |l: &Tensor| l.narrow(1, t + 1, 1).unwrap();
            assert!(
                max_abs_diff(&later(&la), &later(&lb)) > 1e-4,
                "{arch:?}/{qk:?}: the changed token had no effect"
            );
        }
    }
}

#[test]
fn source_padding_does_not_change_outputs_at_real_positions() {
    for qk in ALL_QK {
        for norm in ALL_NORMS {
            let c = cfg(Arch::Seq2seq, qk, norm, MlpKind::Swiglu);
            let (model, params) = build(&c, DType::F32);
            perturb(&params, 0.05, 3);
            let m = model.as_seq2seq().unwrap();
            let src = tokens(1, 5, c.vocab(), 8);
            let tgt = tokens(1, 4, c.vocab(), 9);
            let alone = m.encode(&src, None, eval()).unwrap();
            // The same sentence padded to length 9 with arbitrary (non-pad) junk that the mask hides.
            let padded_src = Tensor::cat(&[&src, &tokens(1, 4, c.vocab(), 10)], 1).unwrap();
            let padded = m
                .encode(&padded_src, Some(&lengths_mask(&[5], 9)), eval())
                .unwrap();
            let enc_diff = max_abs_diff(&alone.hidden, &padded.hidden.narrow(1, 0, 5).unwrap());
            assert!(
                enc_diff <= 1e-5,
                "{qk:?}/{norm:?}: encoder output moved by {enc_diff}"
            );
            let dec_diff = max_abs_diff(
                &m.decode(&tgt, &alone, eval()).unwrap(),
                &m.decode(&tgt, &padded, eval()).unwrap(),
            );
            assert!(
                dec_diff <= 1e-5,
                "{qk:?}/{norm:?}: decoder output moved by {dec_diff}"
            );
        }
    }
}

/// Feeds `ids` one token at a time through the cache and stacks the logits.
fn incremental(model: &Model, src: Option<&Tensor>, ids: &Tensor, chunks: &[usize]) -> Tensor {
    let mut cache = DecoderCache::default();
    let mut outs = vec![];
    let mut start = 0;
    let memory = src.map(|s| model.as_seq2seq().unwrap().encode(s, None, eval()).unwrap());
    for &len in chunks {
        let step = ids.narrow(1, start, len).unwrap();
        let out = match model {
            Model::Lm(m) => m.forward_step(&step, &mut cache, eval()).unwrap(),
            Model::Seq2seq(m) => m
                .decode_step(&step, memory.as_ref().unwrap(), &mut cache, eval())
                .unwrap(),
        };
        outs.push(out);
        start += len;
    }
    assert_eq!(cache.len(), start);
    Tensor::cat(&outs, 1).unwrap()
}

/// The logits of `ids` in one pass (a seq2seq model encodes `src` first).
fn full_pass(model: &Model, ids: &Tensor, src: Option<&Tensor>) -> Tensor {
    match model {
        Model::Lm(m) => m.forward(ids, eval()).unwrap(),
        Model::Seq2seq(m) => m
            .forward(src.expect("a seq2seq model needs a source"), None, ids, eval())
            .unwrap(),
    }
}

/// Decoding `ids` in each of the `chunkings` with the KV cache gives the one-pass logits to
/// float rounding.
fn assert_cache_equals_full(
    model: &Model,
    src: Option<&Tensor>,
    ids: &Tensor,
    chunkings: &[&[usize]],
    what: &str,
) {
    let full = full_pass(model, ids, src);
    for chunks in chunkings {
        let diff = max_abs_diff(&full, &incremental(model, src, ids, chunks));
        assert!(diff <= 1e-5, "{what}/{chunks:?}: cache differs by {diff}");
    }
}

#[test]
fn kv_cache_decoding_equals_the_full_forward_pass() {
    for arch in ALL_ARCHS {
        for qk in ALL_QK {
            for kv_heads in [4, 2, 1] {
                let mut c = cfg(arch, qk, NormKind::Rmsnorm, MlpKind::Swiglu);
                c.n_kv_heads = Some(kv_heads);
                let (model, params) = build(&c, DType::F32);
                perturb(&params, 0.05, 4);
                let ids = tokens(2, 9, c.vocab(), 11);
                let src = tokens(2, 6, c.vocab(), 12);
                let src = (arch == Arch::Seq2seq).then_some(&src);
                assert_cache_equals_full(
                    &model,
                    src,
                    &ids,
                    &[&[1; 9], &[4, 1, 1, 3]],
                    &format!("{arch:?}/{qk:?}/kv={kv_heads}"),
                );
            }
        }
    }
}

#[test]
fn logn_scaling_changes_nothing_up_to_its_length_and_cached_decoding_past_it_equals_the_full_pass() {
    for arch in ALL_ARCHS {
        for qk in ALL_QK {
            let plain = cfg(arch, qk, NormKind::Rmsnorm, MlpKind::Swiglu);
            let mut logn = plain.clone();
            logn.logn_attention = true;
            logn.logn_length = Some(4);
            let (model, params) = build(&plain, DType::F32);
            perturb(&params, 0.05, 4);
            let scaled = Model::new(&logn, &params).unwrap();
            let src = tokens(2, 9, plain.vocab(), 12);
            let src = (arch == Arch::Seq2seq).then_some(&src);
            // Up to m positions: the same bits, encoder included (it is never scaled).
            let short = tokens(2, 4, plain.vocab(), 11);
            assert_eq!(
                max_abs_diff(&full_pass(&model, &short, src), &full_pass(&scaled, &short, src)),
                0.0,
                "{arch:?}/{qk:?}: log-n changed positions within its length"
            );
            // Past m it acts, and the cache agrees with the full pass.
            let ids = tokens(2, 9, plain.vocab(), 13);
            assert!(
                max_abs_diff(&full_pass(&model, &ids, src), &full_pass(&scaled, &ids, src)) > 1e-4,
                "{arch:?}/{qk:?}: log-n did nothing past its length"
            );
            assert_cache_equals_full(
                &scaled,
                src,
                &ids,
                &[&[1; 9], &[4, 1, 1, 3], &[6, 3]],
                &format!("{arch:?}/{qk:?} with log-n"),
            );
        }
    }
}

#[test]
fn learned_and_no_positions_decode_with_the_cache_as_the_full_pass_and_stay_causal() {
    use ember_model::Positions;
    for positions in [Positions::Learned, Positions::None] {
        for arch in ALL_ARCHS {
            for logn in [false, true] {
                let mut c = cfg(arch, QkNorm::Rmsnorm, NormKind::Rmsnorm, MlpKind::Swiglu);
                c.positions = positions;
                c.logn_attention = logn;
                c.logn_length = logn.then_some(4);
                let (model, params) = build(&c, DType::F32);
                perturb(&params, 0.05, 5);
                let ids = tokens(2, 9, c.vocab(), 21);
                let src = tokens(2, 6, c.vocab(), 22);
                let src = (arch == Arch::Seq2seq).then_some(&src);
                assert_cache_equals_full(
                    &model,
                    src,
                    &ids,
                    &[&[1; 9], &[4, 1, 1, 3]],
                    &format!("{positions:?}/{arch:?}/logn={logn}"),
                );
                // Changing token 6 leaves the outputs at positions 0..=5 as they were.
                let mut changed: Vec<u32> = ids.flatten_all().unwrap().to_vec1().unwrap();
                changed[6] = if changed[6] == 5 { 6 } else { 5 };
                let changed = Tensor::from_vec(changed, (2, 9), &Device::Cpu).unwrap();
                let prefix = |ids: &Tensor| full_pass(&model, ids, src).narrow(1, 0, 6).unwrap();
                assert_eq!(max_abs_diff(&prefix(&ids), &prefix(&changed)), 0.0);
            }
        }
    }
    // A learned table ends at max_seq_len; rotary and no positions go on.
    let mut c = cfg(Arch::Lm, QkNorm::None, NormKind::Rmsnorm, MlpKind::Swiglu);
    c.positions = Positions::Learned;
    c.max_seq_len = 8;
    let (model, _) = build(&c, DType::F32);
    let err = model
        .as_lm()
        .unwrap()
        .forward(&tokens(1, 9, c.vocab(), 3), eval())
        .expect_err("9 positions do not fit a table of 8");
    assert!(err.to_string().contains("model.max_seq_len = 8"), "{err}");
}

#[test]
fn logn_settings_that_cannot_work_are_config_errors() {
    let mut c = cfg(Arch::Lm, QkNorm::None, NormKind::Rmsnorm, MlpKind::Swiglu);
    c.logn_length = Some(8);
    let e = c.validate().unwrap_err();
    assert_eq!(e.key, "model.logn_length");
    assert!(e.message.contains("logn_attention: true"), "{e}");
    c.logn_attention = true;
    c.logn_length = Some(1);
    let e = c.validate().unwrap_err();
    assert!(e.message.contains("at least 2"), "{e}");
    c.logn_length = None;
    assert_eq!(c.logn_train_length(), Some(c.max_seq_len));
    c.validate().unwrap();
}

#[test]
fn reordering_the_cache_follows_the_selected_rows() {
    let c = cfg(Arch::Lm, QkNorm::Rmsnorm, NormKind::Rmsnorm, MlpKind::Swiglu);
    let (model, _) = build(&c, DType::F32);
    let m = model.as_lm().unwrap();
    let ids = tokens(2, 5, c.vocab(), 13);
    let mut cache = DecoderCache::default();
    m.forward_step(&ids.narrow(1, 0, 4).unwrap(), &mut cache, eval())
        .unwrap();
    cache
        .select(&Tensor::new(&[1u32, 1, 0], &Device::Cpu).unwrap())
        .unwrap();
    let last = ids.narrow(1, 4, 1).unwrap().contiguous().unwrap();
    let reordered_last = last
        .index_select(&Tensor::new(&[1u32, 1, 0], &Device::Cpu).unwrap(), 0)
        .unwrap();
    let stepped = m.forward_step(&reordered_last, &mut cache, eval()).unwrap();
    let full = m
        .forward(&ids, eval())
        .unwrap()
        .narrow(1, 4, 1)
        .unwrap()
        .contiguous()
        .unwrap();
    let expected = full
        .index_select(&Tensor::new(&[1u32, 1, 0], &Device::Cpu).unwrap(), 0)
        .unwrap();
    assert!(max_abs_diff(&stepped, &expected) <= 1e-5);
}

#[test]
fn rotary_dot_products_depend_only_on_relative_position() {
    let d = 16;
    let rotary = Rotary::new(d, 128, 10_000.0, DType::F64, &Device::Cpu).unwrap();
    let q = random(&[1, 1, d], DType::F64, 1); // (batch, time, heads · head_dim)
    let k = random(&[1, 1, d], DType::F64, 2);
    let dot = |m: usize, n: usize| {
        let a = rotary.apply(&q, m).unwrap();
        let b = rotary.apply(&k, n).unwrap();
        (a * b).unwrap().sum_all().unwrap().to_scalar::<f64>().unwrap()
    };
    for (m, n) in [(0, 0), (3, 1), (1, 3), (10, 2)] {
        for shift in [1, 7, 50] {
            assert!(
                (dot(m, n) - dot(m + shift, n + shift)).abs() < 1e-9,
                "({m},{n}) shifted by {shift}"
            );
        }
    }
    // ... and it does depend on the offset itself: positions are not ignored.
    assert!((dot(0, 0) - dot(5, 0)).abs() > 1e-3);
    // Rotation preserves length.
    let r = rotary.apply(&q, 17).unwrap();
    let len = |t: &Tensor| t.sqr().unwrap().sum_all().unwrap().to_scalar::<f64>().unwrap();
    assert!((len(&r) - len(&q)).abs() < 1e-9);
}

#[test]
fn rotary_refuses_positions_beyond_max_seq_len() {
    let rotary = Rotary::new(8, 4, 10_000.0, DType::F32, &Device::Cpu).unwrap();
    let err = rotary
        .apply(&random(&[1, 3, 8], DType::F32, 1), 2)
        .unwrap_err()
        .to_string();
    assert!(err.contains("max_seq_len"), "{err}");
}

fn attention_module(qk: QkNorm) -> (Attention, ModelConfig) {
    let mut c = ModelConfig::tiny(Arch::Lm);
    c.qk_norm = qk;
    let params = ParamStore::new(5, DType::F32, &Device::Cpu);
    let attn = Attention::new(params.var_builder().pp("attn"), &c, None, None, c.init_std).unwrap();
    (attn, c)
}

#[test]
fn rmsnorm_and_layernorm_qk_norm_give_unit_scale_heads() {
    for qk in [QkNorm::Rmsnorm, QkNorm::Layernorm] {
        let (attn, c) = attention_module(qk);
        // Inputs far from unit scale, to see the norm at work.
        let x = (random(&[2, 5, c.d_model], DType::F32, 3) * 37.0).unwrap();
        let (q, k) = attn.normalized_qk(&x).unwrap();
        for (which, t) in [("q", q), ("k", k)] {
            assert_eq!(t.dim(D::Minus1).unwrap(), c.head_dim());
            let mean = t.mean_keepdim(D::Minus1).unwrap();
            let rms = t.sqr().unwrap().mean_keepdim(D::Minus1).unwrap().sqrt().unwrap();
            let centred_rms = t
                .broadcast_sub(&mean)
                .unwrap()
                .sqr()
                .unwrap()
                .mean_keepdim(D::Minus1)
                .unwrap()
                .sqrt()
                .unwrap();
            let ones = rms.ones_like().unwrap();
            match qk {
                QkNorm::Rmsnorm => assert!(max_abs_diff(&rms, &ones) < 1e-4, "{which}: rms ≠ 1"),
                _ => {
                    assert!(
                        max_abs_diff(&mean, &mean.zeros_like().unwrap()) < 1e-5,
                        "{which}: mean ≠ 0"
                    );
                    assert!(max_abs_diff(&centred_rms, &ones) < 1e-4, "{which}: std ≠ 1");
                }
            }
        }
    }
}

#[test]
fn l2_qk_norm_bounds_every_logit_by_the_scale() {
    let mut c = cfg(Arch::Seq2seq, QkNorm::L2, NormKind::Rmsnorm, MlpKind::Swiglu);
    c.qk_norm_init_scale = Some(3.5);
    let (model, params) = build(&c, DType::F32);
    perturb(&params, 0.5, 8); // large weights: logits would be large without the bound
    let telemetry = Telemetry::new();
    logits(&model, c.vocab(), ForwardCtx::eval().with_telemetry(&telemetry)).unwrap();
    let stats = telemetry.take();
    assert_eq!(stats.len(), 2 + 2 * 2, "one record per attention module");
    for s in &stats {
        let g = params.get(&format!("{}.qk_scale", s.module)).unwrap();
        let g = g.as_tensor().i(0).unwrap().to_scalar::<f32>().unwrap().abs();
        assert!(
            s.max_logit <= g * (1.0 + 1e-5),
            "{}: logit {} above |g| = {g}",
            s.module,
            s.max_logit
        );
        assert!(s.max_logit > 0.0);
    }
}

#[test]
fn l2_scale_starts_at_log2_of_l_squared_minus_l() {
    let mut c = cfg(Arch::Lm, QkNorm::L2, NormKind::Rmsnorm, MlpKind::Swiglu);
    c.qk_norm_length = Some(20);
    let (_, params) = build(&c, DType::F32);
    let g = params.get("decoder.layers.0.self_attn.qk_scale").unwrap();
    let g = g.as_tensor().i(0).unwrap().to_scalar::<f32>().unwrap();
    assert!((g as f64 - (380f64).log2()).abs() < 1e-5, "g0 = {g}");
}

#[test]
fn telemetry_reports_finite_logits_and_entropy_per_attention_module() {
    for arch in ALL_ARCHS {
        let c = cfg(arch, QkNorm::None, NormKind::Rmsnorm, MlpKind::Swiglu);
        let (model, _) = build(&c, DType::F32);
        let telemetry = Telemetry::new();
        logits(&model, c.vocab(), ForwardCtx::eval().with_telemetry(&telemetry)).unwrap();
        let stats = telemetry.take();
        let expected = match arch {
            Arch::Lm => 2,
            Arch::Seq2seq => 2 + 2 * 2,
        };
        assert_eq!(stats.len(), expected);
        for s in stats {
            assert!(s.max_logit.is_finite() && s.max_logit >= 0.0, "{s:?}");
            // Entropy of a distribution over at most 7 keys lies in [0, ln 7].
            assert!(s.entropy >= 0.0 && s.entropy <= (7f32).ln() + 1e-4, "{s:?}");
        }
        assert!(telemetry.take().is_empty(), "take() clears the collector");
    }
}

#[test]
fn the_same_seed_gives_the_same_shared_parameters_with_or_without_qk_norm() {
    let base = cfg(Arch::Seq2seq, QkNorm::None, NormKind::Rmsnorm, MlpKind::Swiglu);
    let (_, a) = build(&base, DType::F32);
    let (_, b) = build(
        &cfg(
            Arch::Seq2seq,
            QkNorm::Layernorm,
            NormKind::Rmsnorm,
            MlpKind::Swiglu,
        ),
        DType::F32,
    );
    let (_, a2) = build(&base, DType::F32);
    assert!(b.names().len() > a.names().len());
    for (name, var) in a.vars() {
        let other = b.get(&name).unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!(
            max_abs_diff(var.as_tensor(), other.as_tensor()),
            0.0,
            "{name} differs"
        );
        assert_eq!(
            max_abs_diff(var.as_tensor(), a2.get(&name).unwrap().as_tensor()),
            0.0
        );
    }
    let (_, other_seed) = ember_model::init_model(&base, 999, DType::F32, &Device::Cpu).unwrap();
    let w = "decoder.layers.0.self_attn.q_proj.weight";
    assert!(
        max_abs_diff(
            a.get(w).unwrap().as_tensor(),
            other_seed.get(w).unwrap().as_tensor()
        ) > 0.0
    );
}

#[test]
fn initialisation_follows_the_documented_scales() {
    let mut c = cfg(Arch::Lm, QkNorm::None, NormKind::Layernorm, MlpKind::Swiglu);
    c.d_model = 64;
    c.d_ff = 256;
    c.n_layers = Some(4);
    c.init_std = 0.05;
    let (_, params) = build(&c, DType::F32);
    let std = |name: &str| rms(&params, name);
    assert!((std("decoder.layers.0.mlp.up_proj.weight") - 0.05).abs() < 0.002);
    // Residual projections: init_std / sqrt(2 · n_layers).
    assert!((std("decoder.layers.0.mlp.down_proj.weight") - 0.05 / 8f64.sqrt()).abs() < 0.001);
    assert!((std("decoder.layers.3.self_attn.o_proj.weight") - 0.05 / 8f64.sqrt()).abs() < 0.001);
    assert_eq!(std("decoder.layers.0.attn_norm.weight"), 1.0);
    assert_eq!(std("decoder.layers.0.attn_norm.bias"), 0.0);
}

/// Root mean square of a parameter's entries (its standard deviation when the mean is 0).
fn rms(params: &ParamStore, name: &str) -> f64 {
    let t = params.get(name).unwrap().as_tensor().flatten_all().unwrap();
    t.sqr()
        .unwrap()
        .mean_all()
        .unwrap()
        .sqrt()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap() as f64
}

/// configs/shakespeare-char-nanogpt.yaml's model starts where nanoGPT's `GPT._init_weights`
/// starts (model.py at 3adf61e): every Linear and Embedding (tokens and positions) normal(0,
/// 0.02), the residual projections named `c_proj` (attention output, MLP down) 0.02/√(2·n_layer),
/// LayerNorm gains 1 and, with `bias=False`, no biases anywhere.
#[test]
fn the_nanogpt_shape_starts_from_nanogpts_initialisation() {
    let mut c = cfg(Arch::Lm, QkNorm::None, NormKind::Layernorm, MlpKind::Gelu);
    (c.d_model, c.n_layers, c.n_heads, c.d_ff) = (128, Some(4), 4, 512);
    (c.vocab_size, c.max_seq_len) = (Some(65), 64);
    c.positions = Positions::Learned;
    c.norm_bias = false;
    let (_, params) = build(&c, DType::F32);
    let residual = 0.02 / (2.0 * 4.0f64).sqrt();
    for (name, _) in params.vars() {
        let expected = if name.ends_with("norm.weight") {
            1.0
        } else if name.ends_with("o_proj.weight") || name.ends_with("down_proj.weight") {
            residual
        } else {
            0.02
        };
        let got = rms(&params, &name);
        assert!(
            (got / expected - 1.0).abs() < 0.03,
            "{name}: rms {got}, nanoGPT's init has std {expected}"
        );
        assert!(
            !name.ends_with(".bias"),
            "{name}: nanoGPT (bias=False) has no biases"
        );
    }
    assert!(params.get("decoder.embed_positions.weight").is_some());
    assert!(
        params.get("lm_head.weight").is_none(),
        "tied, as nanoGPT's wte/lm_head"
    );
}

#[test]
fn a_layernorm_without_bias_is_one_whose_bias_stays_at_zero() {
    for arch in ALL_ARCHS {
        let with = cfg(arch, QkNorm::Layernorm, NormKind::Layernorm, MlpKind::Gelu);
        let without = ModelConfig {
            norm_bias: false,
            ..with.clone()
        };
        let (a, with_params) = build(&with, DType::F32);
        let (b, without_params) = build(&without, DType::F32);
        let names = |p: &ParamStore| p.vars().into_iter().map(|(n, _)| n).collect::<Vec<_>>();
        let kept = names(&without_params);
        let dropped: Vec<String> = names(&with_params)
            .into_iter()
            .filter(|n| !kept.contains(n))
            .collect();
        // Each block's pre-norms and each stack's final norm lose their bias; qk-norm keeps its own.
        let blocks = match arch {
            Arch::Lm => 2 * 2,
            Arch::Seq2seq => 2 * 2 + 2 * 3,
        };
        let stacks = if arch == Arch::Lm { 1 } else { 2 };
        assert_eq!(dropped.len(), blocks + stacks, "{arch:?}: {dropped:?}");
        assert!(dropped
            .iter()
            .all(|n| n.ends_with("norm.bias") && !n.contains("q_norm")));
        assert!(kept.iter().any(|n| n.ends_with("q_norm.bias")));
        // Everything else is drawn alike (parameters are keyed by seed and name) and the biases
        // start at 0, so the two models compute the same function at initialisation.
        let diff = max_abs_diff(
            &logits(&a, with.vocab(), eval()).unwrap(),
            &logits(&b, with.vocab(), eval()).unwrap(),
        );
        assert_eq!(diff, 0.0, "{arch:?}");
    }
    // RMSNorm has no bias either way.
    let rms_cfg = cfg(Arch::Lm, QkNorm::None, NormKind::Rmsnorm, MlpKind::Gelu);
    let (_, a) = build(&rms_cfg, DType::F32);
    let (_, b) = build(
        &ModelConfig {
            norm_bias: false,
            ..rms_cfg
        },
        DType::F32,
    );
    assert_eq!(a.num_params(), b.num_params());
}

#[test]
fn tied_embeddings_save_one_vocab_by_d_matrix() {
    let mut c = cfg(Arch::Lm, QkNorm::None, NormKind::Rmsnorm, MlpKind::Swiglu);
    let (_, tied) = build(&c, DType::F32);
    c.tie_embeddings = false;
    let (_, untied) = build(&c, DType::F32);
    assert_eq!(untied.num_params() - tied.num_params(), c.vocab() * c.d_model);
    assert!(untied.get("lm_head.weight").is_some() && tied.get("lm_head.weight").is_none());
}

#[test]
fn parameters_round_trip_through_safetensors() {
    let c = cfg(Arch::Seq2seq, QkNorm::L2, NormKind::Layernorm, MlpKind::Gelu);
    let (model, params) = build(&c, DType::F32);
    let dir = std::env::temp_dir().join(format!("ember-model-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.safetensors");
    params.save(&path).unwrap();
    let loaded = ParamStore::load(&path, DType::F32, &Device::Cpu).unwrap();
    let reloaded = Model::new(&c, &loaded).unwrap();
    let a = logits(&model, c.vocab(), eval()).unwrap();
    let b = logits(&reloaded, c.vocab(), eval()).unwrap();
    assert_eq!(max_abs_diff(&a, &b), 0.0);
    // A checkpoint of another architecture is refused, naming the parameter.
    let mut other = c.clone();
    other.qk_norm = QkNorm::Rmsnorm;
    let err = Model::new(&other, &loaded)
        .err()
        .expect("must refuse")
        .to_string();
    assert!(err.contains("q_norm.weight") && err.contains("missing"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn dropout_is_active_in_training_and_reproducible_from_its_seed() {
    let mut c = cfg(Arch::Lm, QkNorm::None, NormKind::Rmsnorm, MlpKind::Swiglu);
    c.dropout = 0.3;
    c.attn_dropout = 0.2;
    let (model, _) = build(&c, DType::F32);
    let run = |seed: u64| {
        let rng = ember_model::DropoutRng::new(seed);
        logits(&model, c.vocab(), ForwardCtx::train(&rng)).unwrap()
    };
    let eval_out = logits(&model, c.vocab(), eval()).unwrap();
    assert_eq!(max_abs_diff(&run(1), &run(1)), 0.0);
    assert!(max_abs_diff(&run(1), &run(2)) > 1e-4);
    assert!(max_abs_diff(&run(1), &eval_out) > 1e-4);
    assert_eq!(
        max_abs_diff(&eval_out, &logits(&model, c.vocab(), eval()).unwrap()),
        0.0
    );
}
