//! Specification: a training pass whose pre-norm branches keep their activations in bf16 — what
//! bf16 products on CUDA run with every kernel family on (`Precision::branch_dtype`), here on
//! the CPU through `ForwardCtx::with_branch_dtype`, whose ops read and write bf16 activations as
//! the CUDA kernels do — is the f32 pass to bf16's rounding, in every architecture, norm,
//! position scheme, QK-norm and MLP, with biases, grouped heads and dropout: the logits within a
//! few bf16 roundings, every parameter's gradient present, finite and close. It really runs in
//! bf16 (the logits are not the f32 pass's bits), and where there is no pre-norm branch
//! (post-norm) nothing changes.

mod common;

use std::collections::BTreeMap;

use candle_core::{DType, Tensor};
use common::*;
use ember_model::{
    Arch, DecoderCache, DropoutRng, ForwardCtx, MlpKind, Model, ModelConfig, NormKind, NormPlacement,
    ParamStore, Positions, QkNorm,
};

/// The logits and every parameter's gradient of one training pass (dropout on) with the
/// branches' activations in `branch`.
fn pass(
    model: &Model,
    params: &ParamStore,
    vocab: usize,
    branch: DType,
) -> (Tensor, BTreeMap<String, Tensor>) {
    let rng = DropoutRng::new(7);
    let ctx = ForwardCtx::train(&rng).with_branch_dtype(branch);
    let logits = logits(model, vocab, ctx).unwrap();
    assert_eq!(
        logits.dtype(),
        DType::F32,
        "the logits leave the final norm in f32"
    );
    let weights = random(logits.dims(), DType::F32, 99);
    let grads = (&logits * weights)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let grads = params
        .vars()
        .into_iter()
        .map(|(name, var)| {
            let g = grads
                .get(var.as_tensor())
                .unwrap_or_else(|| panic!("{name} has no gradient"));
            assert_eq!(g.dtype(), DType::F32, "{name}'s gradient is not f32");
            (name, g.clone())
        })
        .collect();
    (logits, grads)
}

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

/// ‖a − b‖ / ‖b‖.
fn relative(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (values(a), values(b));
    let num: f64 = a.iter().zip(&b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

/// cos(a, b), their directions' agreement.
fn cosine(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (values(a), values(b));
    let dot: f64 = a.iter().zip(&b).map(|(x, y)| (*x as f64) * (*y as f64)).sum();
    let norm = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (norm(&a) * norm(&b)).max(1e-30)
}

/// How far from the f32 pass's a bf16-branch gradient of `c` may lie (‖Δg‖/‖g‖ over every
/// parameter): a few bf16 roundings (2⁻⁹ ≈ 0.002 each) compounded over the layers for smooth
/// activations; more where the model amplifies them. ReLU's kink switches a unit's gradient
/// whose input's rounding crosses 0, and L2 QK-norm's logits g·q̂·k̂ (g ≈ 10) scale the
/// rounding of q̂ and k̂ by g before the softmax.
fn gradient_tolerance(c: &ModelConfig) -> f64 {
    match (c.qk_norm, c.mlp) {
        (QkNorm::L2, _) => 0.15,
        (_, MlpKind::Relu) => 0.08,
        _ => 0.02,
    }
}

/// bf16 branches against f32 ones for `c`; `pre_norm`: whether it has branches to change.
fn check(what: &str, c: &ModelConfig, pre_norm: bool) {
    const LOGITS_TOL: f64 = 3e-2;
    // Each parameter's gradient keeps its direction; its size may move more than the whole's
    // (a gain's or a bias's gradient is a sum that mostly cancels). A scalar's (L2's g) may even
    // change sign: only its finiteness is held.
    const MIN_COSINE: f64 = 0.95;
    let (model, params) = build(c, DType::F32);
    perturb(&params, 0.05, 3);
    let (l32, g32) = pass(&model, &params, c.vocab(), DType::F32);
    let (l16, g16) = pass(&model, &params, c.vocab(), DType::BF16);
    let same = values(&l16) == values(&l32);
    if !pre_norm {
        assert!(same, "{what}: no pre-norm branch, yet the logits changed");
        return;
    }
    assert!(
        !same,
        "{what}: bf16 branches gave the f32 pass's logits: not run in bf16"
    );
    let e = relative(&l16, &l32);
    assert!(e < LOGITS_TOL, "{what}: logits {e:e} from the f32 pass's");
    let flat = |g: &BTreeMap<String, Tensor>| {
        let all: Vec<Tensor> = g.values().map(|t| t.flatten_all().unwrap()).collect();
        Tensor::cat(&all, 0).unwrap()
    };
    let (e, tol) = (relative(&flat(&g16), &flat(&g32)), gradient_tolerance(c));
    assert!(
        e < tol,
        "{what}: the gradient {e:e} from the f32 pass's (within {tol})"
    );
    for (name, g) in &g32 {
        let b = &g16[name];
        assert!(
            values(b).iter().all(|x| x.is_finite()),
            "{what}: {name}'s gradient is not finite"
        );
        if g.elem_count() > 1 {
            let cos = cosine(b, g);
            assert!(
                cos > MIN_COSINE,
                "{what}: {name}'s gradient at cos {cos:.3} to the f32 pass's"
            );
        }
    }
}

#[test]
fn bf16_branches_train_as_f32_ones_to_bf16s_rounding() {
    let mut checked = 0;
    for arch in ALL_ARCHS {
        for qk in ALL_QK {
            for (mlp, norm, positions) in [
                (MlpKind::Swiglu, NormKind::Rmsnorm, Positions::Rope),
                (MlpKind::Gelu, NormKind::Layernorm, Positions::Learned),
                (MlpKind::Relu, NormKind::Layernorm, Positions::None),
            ] {
                let mut c = cfg(arch, qk, norm, mlp);
                (c.positions, c.dropout, c.attn_dropout) = (positions, 0.1, 0.1);
                check(
                    &format!("{arch:?}/{qk:?}/{mlp:?}/{norm:?}/{positions:?}"),
                    &c,
                    true,
                );
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 24);
}

#[test]
fn bf16_branches_with_biases_grouped_heads_and_log_n_train_as_f32_ones() {
    let lm = |f: &dyn Fn(&mut ModelConfig)| {
        let mut c = cfg(Arch::Lm, QkNorm::Layernorm, NormKind::Layernorm, MlpKind::Gelu);
        c.dropout = 0.1;
        f(&mut c);
        c
    };
    let cases = [
        ("projection biases", lm(&|c| c.proj_bias = true)),
        (
            "qkv biases, relu",
            lm(&|c| (c.qkv_bias, c.mlp) = (true, MlpKind::Relu)),
        ),
        (
            "swiglu with biases, l2",
            lm(&|c| (c.mlp, c.proj_bias, c.qk_norm) = (MlpKind::Swiglu, true, QkNorm::L2)),
        ),
        (
            "grouped heads, log-n",
            lm(&|c| (c.n_kv_heads, c.logn_attention, c.positions) = (Some(2), true, Positions::Rope)),
        ),
    ];
    for (what, c) in cases {
        check(what, &c, true);
    }
    let mut post = cfg(Arch::Seq2seq, QkNorm::Rmsnorm, NormKind::Layernorm, MlpKind::Relu);
    post.norm_placement = NormPlacement::Post;
    check("post-norm", &post, false);
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
