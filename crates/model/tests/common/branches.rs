//! A training pass with its pre-norm branches in one dtype or another, and the comparison of a
//! bf16-branch pass with an f32-branch one (`bf16_branches.rs` on the CPU, `gpu_bf16_branches.rs`
//! on CUDA).

use std::collections::BTreeMap;

use candle_core::{DType, Device, Tensor};
use ember_model::{
    Arch, DropoutRng, ForwardCtx, MlpKind, Model, ModelConfig, NormKind, NormPlacement, ParamStore,
    Positions, QkNorm,
};

use super::{cfg, logits_on, random, ALL_ARCHS, ALL_QK};

/// The configurations the bf16-branch tests run, each named and with whether it has pre-norm
/// branches: every architecture and QK-norm with three MLP, norm and position schemes; projection
/// biases, qkv biases with ReLU, L2 QK-norm with SwiGLU and biases, grouped heads with log-n
/// scaling; all with dropout; and post-norm, which has no branch to change.
pub fn branch_configs() -> Vec<(String, ModelConfig, bool)> {
    let mut out = vec![];
    for arch in ALL_ARCHS {
        for qk in ALL_QK {
            for (mlp, norm, positions) in [
                (MlpKind::Swiglu, NormKind::Rmsnorm, Positions::Rope),
                (MlpKind::Gelu, NormKind::Layernorm, Positions::Learned),
                (MlpKind::Relu, NormKind::Layernorm, Positions::None),
            ] {
                let mut c = cfg(arch, qk, norm, mlp);
                (c.positions, c.dropout, c.attn_dropout) = (positions, 0.1, 0.1);
                out.push((format!("{arch:?}/{qk:?}/{mlp:?}/{norm:?}/{positions:?}"), c, true));
            }
        }
    }
    let lm = |f: &dyn Fn(&mut ModelConfig)| {
        let mut c = cfg(Arch::Lm, QkNorm::Layernorm, NormKind::Layernorm, MlpKind::Gelu);
        c.dropout = 0.1;
        f(&mut c);
        c
    };
    out.extend(
        [
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
        ]
        .map(|(what, c)| (what.to_string(), c, true)),
    );
    let mut post = cfg(Arch::Seq2seq, QkNorm::Rmsnorm, NormKind::Layernorm, MlpKind::Relu);
    post.norm_placement = NormPlacement::Post;
    out.push(("post-norm".into(), post, false));
    out
}

/// The logits and every parameter's gradient of one pass.
pub struct Pass {
    pub logits: Tensor,
    pub grads: BTreeMap<String, Tensor>,
}

/// One training pass (dropout on) of `model` on `device`, its context made by `with` from the
/// training one, under a loss that reaches every logit with its own weight.
pub fn training_pass(
    model: &Model,
    params: &ParamStore,
    vocab: usize,
    device: &Device,
    with: impl Fn(ForwardCtx) -> ForwardCtx,
) -> Pass {
    let rng = DropoutRng::new(7);
    let logits = logits_on(model, vocab, with(ForwardCtx::train(&rng)), device).unwrap();
    assert_eq!(
        logits.dtype(),
        DType::F32,
        "the logits leave the final norm in f32"
    );
    let weights = random(logits.dims(), DType::F32, 99).to_device(device).unwrap();
    let store = (&logits * weights)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let grads = params
        .vars()
        .into_iter()
        .map(|(name, var)| {
            let g = store
                .get(var.as_tensor())
                .unwrap_or_else(|| panic!("{name} has no gradient"));
            assert_eq!(g.dtype(), DType::F32, "{name}'s gradient is not f32");
            (name, g.clone())
        })
        .collect();
    Pass { logits, grads }
}

pub fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

/// ‖a − b‖ / ‖b‖.
pub fn relative(a: &Tensor, b: &Tensor) -> f64 {
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

/// A bf16-branch pass of `c` against its f32-branch pass: the logits within a few bf16
/// roundings, the whole gradient within [`gradient_tolerance`], every tensor parameter's
/// gradient in the same direction and finite; and really in bf16 (other gradients). Without a
/// pre-norm branch (`pre_norm` false) the two are the same.
pub fn assert_branches_close(what: &str, c: &ModelConfig, bf16: &Pass, f32: &Pass, pre_norm: bool) {
    const LOGITS_TOL: f64 = 3e-2;
    // Each parameter's gradient keeps its direction; its size may move more than the whole's
    // (a gain's or a bias's gradient is a sum that mostly cancels). A scalar's (L2's g) may even
    // change sign: only its finiteness is held.
    const MIN_COSINE: f64 = 0.95;
    let flat = |g: &BTreeMap<String, Tensor>| {
        let all: Vec<Tensor> = g.values().map(|t| t.flatten_all().unwrap()).collect();
        Tensor::cat(&all, 0).unwrap()
    };
    let (g16, g32) = (flat(&bf16.grads), flat(&f32.grads));
    let same = values(&bf16.logits) == values(&f32.logits) && values(&g16) == values(&g32);
    if !pre_norm {
        assert!(same, "{what}: no pre-norm branch, yet the pass changed");
        return;
    }
    // The gradients, not only the logits: under bf16 products on CUDA cuBLAS rounds every
    // product's output to bf16 in both passes, so a forward pass can give the same logits; the
    // backward pass sums the branches' gradients in bf16.
    assert!(
        values(&g16) != values(&g32),
        "{what}: bf16 branches gave the f32 pass's gradients: not run in bf16"
    );
    let e = relative(&bf16.logits, &f32.logits);
    assert!(e < LOGITS_TOL, "{what}: logits {e:e} from the f32 pass's");
    let (e, tol) = (relative(&g16, &g32), gradient_tolerance(c));
    assert!(
        e < tol,
        "{what}: the gradient {e:e} from the f32 pass's (within {tol})"
    );
    for (name, g) in &f32.grads {
        let b = &bf16.grads[name];
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
