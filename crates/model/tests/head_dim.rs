//! Specification of `model.head_dim`: attention heads wider or narrower than d_model / n_heads
//! (Qwen3-0.6B has 16 heads of 128 over a residual width of 1024). The query and output
//! projections are n_heads·head_dim wide, the key and value projections n_kv_heads·head_dim;
//! everything else (causality, the KV cache, gradients) holds as for the default width.

mod common;

use candle_core::{DType, Device, IndexOp, Tensor};
use common::*;
use ember_model::{init_model, Arch, DecoderCache, ForwardCtx, MlpKind, ModelConfig, NormKind, QkNorm};

fn eval() -> ForwardCtx<'static> {
    ForwardCtx::eval()
}

/// d_model 16 with 4 heads of 8: the heads together are twice the residual width.
fn wide_heads(qk: QkNorm, kv_heads: usize) -> ModelConfig {
    let mut c = cfg(Arch::Lm, qk, NormKind::Rmsnorm, MlpKind::Swiglu);
    c.head_dim = Some(8);
    c.n_kv_heads = Some(kv_heads);
    c
}

#[test]
fn projections_are_as_wide_as_the_heads_together() {
    let c = wide_heads(QkNorm::Rmsnorm, 2);
    let (_, params) = build(&c, DType::F32);
    let shape = |name: &str| params.get(name).unwrap().dims().to_vec();
    let p = "decoder.layers.0.self_attn";
    assert_eq!(shape(&format!("{p}.q_proj.weight")), [4 * 8, 16]);
    assert_eq!(shape(&format!("{p}.k_proj.weight")), [2 * 8, 16]);
    assert_eq!(shape(&format!("{p}.v_proj.weight")), [2 * 8, 16]);
    assert_eq!(shape(&format!("{p}.o_proj.weight")), [16, 4 * 8]);
    assert_eq!(shape(&format!("{p}.q_norm.weight")), [8]);
    assert_eq!(c.q_width(), 32);
}

#[test]
fn the_default_width_given_explicitly_changes_no_bit() {
    let implicit = cfg(Arch::Lm, QkNorm::Rmsnorm, NormKind::Rmsnorm, MlpKind::Swiglu);
    let explicit = ModelConfig {
        head_dim: Some(implicit.d_model / implicit.n_heads),
        ..implicit.clone()
    };
    let (a, _) = build(&implicit, DType::F32);
    let (b, _) = build(&explicit, DType::F32);
    let diff = max_abs_diff(
        &logits(&a, implicit.vocab(), eval()).unwrap(),
        &logits(&b, implicit.vocab(), eval()).unwrap(),
    );
    assert_eq!(diff, 0.0);
}

#[test]
fn wide_heads_stay_causal_and_decode_with_the_cache_as_the_full_pass() {
    for qk in [QkNorm::None, QkNorm::Rmsnorm] {
        for kv_heads in [4, 2, 1] {
            let c = wide_heads(qk, kv_heads);
            let (model, params) = build(&c, DType::F32);
            perturb(&params, 0.05, 4);
            let lm = model.as_lm().unwrap();
            let ids = tokens(2, 9, c.vocab(), 11);
            let full = lm.forward(&ids, eval()).unwrap();

            // A later token changes no earlier position's logits.
            let mut changed = ids.to_vec2::<u32>().unwrap();
            changed[0][6] = 4 + (changed[0][6] + 1 - 4) % (c.vocab() as u32 - 4);
            let changed = Tensor::new(changed, &Device::Cpu).unwrap();
            let other = lm.forward(&changed, eval()).unwrap();
            let before = max_abs_diff(&full.i((.., ..6)).unwrap(), &other.i((.., ..6)).unwrap());
            assert_eq!(before, 0.0, "{qk:?}/kv={kv_heads}: earlier positions moved");

            let mut cache = DecoderCache::default();
            let mut steps = vec![];
            for (start, len) in [(0, 4), (4, 1), (5, 4)] {
                let chunk = ids.narrow(1, start, len).unwrap();
                steps.push(lm.forward_step(&chunk, &mut cache, eval()).unwrap());
            }
            let cached = Tensor::cat(&steps, 1).unwrap();
            let diff = max_abs_diff(&full, &cached);
            assert!(diff <= 1e-5, "{qk:?}/kv={kv_heads}: cache differs by {diff}");
        }
    }
}

#[test]
fn every_parameter_of_a_wide_head_model_receives_a_gradient() {
    for qk in [QkNorm::None, QkNorm::Rmsnorm, QkNorm::Layernorm, QkNorm::L2] {
        let c = wide_heads(qk, 2);
        let (model, params) = build(&c, DType::F32);
        let grads = loss(&model, c.vocab()).unwrap().backward().unwrap();
        for (name, var) in params.vars() {
            let g = grads
                .get(var.as_tensor())
                .unwrap_or_else(|| panic!("{qk:?}: {name} has no gradient"));
            let norm2 = g.sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap();
            assert!(
                norm2 > 0.0 && norm2.is_finite(),
                "{qk:?}: gradient of {name} is {norm2}"
            );
        }
    }
}

#[test]
fn head_dim_settings_that_cannot_build_a_model_name_the_key() {
    let refused = |c: ModelConfig| {
        init_model(&c, 0, DType::F32, &Device::Cpu)
            .err()
            .unwrap()
            .to_string()
    };
    let e = refused(ModelConfig {
        head_dim: Some(0),
        ..ModelConfig::tiny(Arch::Lm)
    });
    assert!(
        e.contains("model.head_dim") && e.contains("greater than 0"),
        "{e}"
    );
    let e = refused(ModelConfig {
        head_dim: Some(7),
        ..ModelConfig::tiny(Arch::Lm)
    });
    assert!(e.contains("head_dim = 7 must be even"), "{e}");
    // With the width given, d_model need not divide into the heads.
    let c = ModelConfig {
        d_model: 18,
        head_dim: Some(6),
        ..ModelConfig::tiny(Arch::Lm)
    };
    assert!(init_model(&c, 0, DType::F32, &Device::Cpu).is_ok());
}
