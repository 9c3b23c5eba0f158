//! Specification: a training pass whose pre-norm branches keep their activations in bf16 — what
//! bf16 products on CUDA run with every kernel family on (`Precision::branch_dtype`), here on
//! the CPU through `ForwardCtx::with_branch_dtype`, whose ops read and write bf16 activations as
//! the CUDA kernels do — is the f32 pass to bf16's rounding, in every architecture, norm,
//! position scheme, QK-norm and MLP, with biases, grouped heads and dropout: the logits within a
//! few bf16 roundings, every parameter's gradient present, finite and close. It really runs in
//! bf16 (the logits are not the f32 pass's bits), and where there is no pre-norm branch
//! (post-norm) nothing changes.

mod common;

use candle_core::{DType, Device, Tensor};
use common::branches::*;
use common::*;
use ember_model::{DecoderCache, ForwardCtx, MlpKind, Model, ModelConfig, NormKind, Positions, QkNorm};

/// bf16 branches against f32 ones for `c` on the CPU; `pre_norm`: whether it has branches to
/// change.
fn check(what: &str, c: &ModelConfig, pre_norm: bool) {
    let (model, params) = build(c, DType::F32);
    perturb(&params, 0.05, 3);
    let f32_branches = training_pass(&model, &params, c.vocab(), &Device::Cpu, |ctx| {
        ctx.with_branch_dtype(DType::F32)
    });
    let bf16_branches = training_pass(&model, &params, c.vocab(), &Device::Cpu, |ctx| {
        ctx.with_branch_dtype(DType::BF16)
    });
    assert_branches_close(what, c, &bf16_branches, &f32_branches, pre_norm);
}

#[test]
fn bf16_branches_train_as_f32_ones_to_bf16s_rounding() {
    let configs = branch_configs();
    assert_eq!(configs.len(), 29);
    for (what, c, pre_norm) in configs {
        check(&what, &c, pre_norm);
    }
}

/// The logits of `tokens` (1, T) one position at a time through the cache, stacked (1, T, V).
fn stepwise(model: &Model, tokens: &Tensor, vocab: usize, ctx: ForwardCtx) -> Tensor {
    let mut cache = DecoderCache::default();
    let t = tokens.dim(1).unwrap();
    let memory = match model {
        Model::Seq2seq(m) => Some(m.encode(&common::tokens(1, 6, vocab, 2), None, ctx).unwrap()),
        Model::Lm(_) => None,
    };
    let steps: Vec<Tensor> = (0..t)
        .map(|i| {
            let token = tokens.narrow(1, i, 1).unwrap();
            match (model, &memory) {
                (Model::Lm(m), _) => m.forward_step(&token, &mut cache, ctx).unwrap(),
                (Model::Seq2seq(m), Some(memory)) => m.decode_step(&token, memory, &mut cache, ctx).unwrap(),
                _ => unreachable!(),
            }
        })
        .collect();
    Tensor::cat(&steps, 1).unwrap()
}

#[test]
fn incremental_decoding_with_bf16_branches_reads_its_bf16_cache_as_the_full_pass_does() {
    // The cached keys and values (and a translator's cross-attention ones) are bf16; a position's
    // logits from the cache are the full pass's to f32 rounding of the products' other shapes,
    // not bf16's (the same values are rounded in both).
    for arch in ALL_ARCHS {
        let mut c = cfg(arch, QkNorm::Rmsnorm, NormKind::Rmsnorm, MlpKind::Swiglu);
        (c.positions, c.n_kv_heads) = (Positions::Rope, Some(2));
        let (model, params) = build(&c, DType::F32);
        perturb(&params, 0.05, 3);
        let ctx = ForwardCtx::eval().with_branch_dtype(DType::BF16);
        let vocab = c.vocab();
        let tokens = common::tokens(1, 5, vocab, 4);
        let full = match &model {
            Model::Lm(m) => m.forward(&tokens, ctx).unwrap(),
            Model::Seq2seq(m) => {
                let memory = m.encode(&common::tokens(1, 6, vocab, 2), None, ctx).unwrap();
                m.decode(&tokens, &memory, ctx).unwrap()
            }
        };
        let steps = stepwise(&model, &tokens, vocab, ctx);
        let e = relative(&steps, &full);
        assert!(e < 1e-2, "{arch:?}: stepwise logits {e:e} from the full pass's");
        let f32_full = match &model {
            Model::Lm(m) => m.forward(&tokens, ForwardCtx::eval()).unwrap(),
            Model::Seq2seq(m) => {
                let memory = m
                    .encode(&common::tokens(1, 6, vocab, 2), None, ForwardCtx::eval())
                    .unwrap();
                m.decode(&tokens, &memory, ForwardCtx::eval()).unwrap()
            }
        };
        assert!(values(&full) != values(&f32_full), "{arch:?}: not run in bf16");
    }
}
