//! Specification: every parameter of every model variant learns, and the gradients are right.

mod common;

use candle_core::DType;
use common::*;

#[test]
fn every_parameter_receives_a_nonzero_gradient_in_every_variant() {
    let mut checked = 0;
    for arch in ALL_ARCHS {
        for qk in ALL_QK {
            for norm in ALL_NORMS {
                for mlp in ALL_MLPS {
                    for tie in [true, false] {
                        let mut c = cfg(arch, qk, norm, mlp);
                        c.tie_embeddings = tie;
                        let (model, params) = build(&c, DType::F32);
                        let grads = loss(&model, c.vocab()).unwrap().backward().unwrap();
                        for (name, var) in params.vars() {
                            let g = grads.get(var.as_tensor()).unwrap_or_else(|| {
                                panic!("{arch:?}/{qk:?}/{norm:?}/{mlp:?}/tie={tie}: {name} has no gradient")
                            });
                            let norm2 = g.sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap();
                            assert!(
                                norm2 > 0.0 && norm2.is_finite(),
                                "{arch:?}/{qk:?}/{norm:?}/{mlp:?}/tie={tie}: gradient of {name} is {norm2}"
                            );
                        }
                        checked += 1;
                    }
                }
            }
        }
    }
    assert_eq!(checked, 2 * 4 * 2 * ALL_MLPS.len() * 2);
}

/// Every gradient comes back contiguous, also on the unfused path (f64 here, CUDA in practice)
/// where a matmul's weight gradient is a transposed view: CUDA's `index_add` (the tied
/// embedding's gradient) refuses views. Guards the vendored candle backward patch.
#[test]
fn gradients_are_contiguous_on_the_unfused_path() {
    for arch in ALL_ARCHS {
        let mut c = cfg(arch, ALL_QK[1], ALL_NORMS[0], ALL_MLPS[0]);
        c.tie_embeddings = true;
        let (model, params) = build(&c, DType::F64);
        let grads = loss(&model, c.vocab()).unwrap().backward().unwrap();
        for (name, var) in params.vars() {
            let g = grads.get(var.as_tensor()).expect("a gradient");
            assert!(
                g.is_contiguous(),
                "{arch:?}: the gradient of {name} is a strided view"
            );
        }
    }
}

#[test]
fn gradients_match_finite_differences_for_every_qk_norm() {
    for qk in ALL_QK {
        // seq2seq covers encoder, causal decoder and cross-attention; the LM run uses the other
        // norm and MLP so that every layer kind is checked.
        let mut s2s = cfg(
            ember_model::Arch::Seq2seq,
            qk,
            ember_model::NormKind::Rmsnorm,
            ember_model::MlpKind::Swiglu,
        );
        s2s.n_kv_heads = Some(2);
        check_against_finite_differences(&s2s);
        let lm = cfg(
            ember_model::Arch::Lm,
            qk,
            ember_model::NormKind::Layernorm,
            ember_model::MlpKind::Gelu,
        );
        check_against_finite_differences(&lm);
    }
}

#[test]
fn learned_and_no_positions_train_every_parameter_and_match_finite_differences() {
    for positions in [ember_model::Positions::Learned, ember_model::Positions::None] {
        for arch in ALL_ARCHS {
            for qk in [ember_model::QkNorm::None, ember_model::QkNorm::Rmsnorm] {
                let mut c = cfg(
                    arch,
                    qk,
                    ember_model::NormKind::Layernorm,
                    ember_model::MlpKind::Gelu,
                );
                c.positions = positions;
                let (model, params) = build(&c, DType::F32);
                let names: Vec<String> = params.vars().into_iter().map(|(n, _)| n).collect();
                let tables = names
                    .iter()
                    .filter(|n| n.ends_with("embed_positions.weight"))
                    .count();
                let expected = match (positions, arch) {
                    (ember_model::Positions::Learned, ember_model::Arch::Seq2seq) => 2,
                    (ember_model::Positions::Learned, ember_model::Arch::Lm) => 1,
                    _ => 0,
                };
                assert_eq!(tables, expected, "{positions:?}/{arch:?}: {names:?}");
                let grads = loss(&model, c.vocab()).unwrap().backward().unwrap();
                for (name, var) in params.vars() {
                    let g = grads
                        .get(var.as_tensor())
                        .unwrap_or_else(|| panic!("{positions:?}/{arch:?}/{qk:?}: {name} has no gradient"));
                    let norm2 = g.sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap();
                    assert!(norm2 > 0.0 && norm2.is_finite(), "{positions:?}/{arch:?}: {name}");
                }
                check_against_finite_differences(&c);
            }
        }
    }
}

#[test]
fn bias_free_layernorm_models_match_finite_differences() {
    // nanoGPT's block (bias-free LayerNorm, GELU, learned positions), in both architectures.
    for arch in ALL_ARCHS {
        let mut c = cfg(
            arch,
            ember_model::QkNorm::None,
            ember_model::NormKind::Layernorm,
            ember_model::MlpKind::Gelu,
        );
        c.norm_bias = false;
        c.positions = ember_model::Positions::Learned;
        check_against_finite_differences(&c);
    }
}

/// `qkv_bias` (Qwen2's biases on the q, k and v projections): one bias per projection and
/// layer, each learning with autograd's gradient equal to the finite difference, and at zero
/// (their initial value) the model's output is the same as without them.
#[test]
fn qkv_biases_learn_match_finite_differences_and_start_as_no_bias() {
    use ember_model::{Arch, MlpKind, NormKind};
    for qk in ALL_QK {
        let mut plain = cfg(Arch::Lm, qk, NormKind::Rmsnorm, MlpKind::Swiglu);
        plain.n_kv_heads = Some(2);
        let biased = ember_model::ModelConfig {
            qkv_bias: true,
            ..plain.clone()
        };
        let (model, params) = build(&biased, DType::F32);
        let biases: Vec<(String, candle_core::Var)> = params
            .vars()
            .into_iter()
            .filter(|(n, _)| n.ends_with("_proj.bias"))
            .collect();
        assert_eq!(biases.len(), 3 * biased.decoder_layers(), "{qk:?}");
        let grads = loss(&model, biased.vocab()).unwrap().backward().unwrap();
        for (name, var) in &biases {
            let g = grads.get(var.as_tensor()).expect("a gradient");
            let norm2 = g.sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap();
            assert!(
                norm2 > 0.0 && norm2.is_finite(),
                "{qk:?}: gradient of {name} is {norm2}"
            );
        }

        // Zero biases change nothing: the plain model's weights in the biased one, in f64.
        let (plain_model, plain_params) = build(&plain, DType::F64);
        let (biased_model, biased_params) = build(&biased, DType::F64);
        for (name, var) in plain_params.vars() {
            biased_params.get(&name).unwrap().set(var.as_tensor()).unwrap();
        }
        let (a, b) = (
            loss(&plain_model, plain.vocab())
                .unwrap()
                .to_scalar::<f64>()
                .unwrap(),
            loss(&biased_model, biased.vocab())
                .unwrap()
                .to_scalar::<f64>()
                .unwrap(),
        );
        assert!((a - b).abs() <= 1e-12 * a.abs().max(1.0), "{qk:?}: {a} vs {b}");

        check_against_finite_differences(&biased);
    }
    // Without a rotation a key bias would be dead weight: refused.
    let mut c = ember_model::ModelConfig::tiny(Arch::Seq2seq);
    c.qkv_bias = true;
    assert!(c.validate().unwrap_err().to_string().contains("qkv_bias"));
}
