//! Specification: given a gradient sink, blocks run their self-attention, cross-attention (a
//! seq2seq decoder's) and MLP (GELU, ReLU or SwiGLU) sub-blocks as one op each
//! (`ember_kernels::attention_block`, `cross_attention_block`, `mlp_block`; a post-norm
//! sub-block's residual branch as the op, its norm after it), and a training pass is the same
//! as without one — logits and loss bit for bit, every parameter's gradient equal once the sink
//! is merged, the same dropout masks, the same attention telemetry — in every architecture,
//! norm and its placement, position scheme, QK-norm, MLP and precision, with or without biases
//! (Qwen2's on q, k and v; fairseq's on every projection). Sub-blocks the ops do not cover (L2
//! QK-norm, log-n scaling without rotary positions: attention sub-blocks alone) run as before
//! and train the same. Sub-blocks that recompute their activations in the backward pass (all,
//! or the attention sub-blocks alone) train the same bits too, in every model whose config says
//! all those sub-blocks run as one op; a pass of any other model that asks for it fails naming
//! the sub-block that cannot.

mod common;

use std::collections::BTreeMap;

use candle_core::{DType, Tensor};
use common::*;
use ember_kernels::{ActivationMemory, GradSink, Precision};
use ember_model::{
    Arch, AttentionStats, DropoutRng, ForwardCtx, MlpKind, Model, ModelConfig, NormKind, NormPlacement,
    Positions, QkNorm, Telemetry,
};

/// One training pass: logits, loss and every parameter's gradient by name, and whether the
/// forward pass left anything in the sink (with `fused`).
struct Pass {
    logits: Tensor,
    loss: Tensor,
    grads: BTreeMap<String, Tensor>,
    used_sink: bool,
    /// What the forward pass's ops owed the sink.
    owing: Vec<&'static str>,
    telemetry: Vec<AttentionStats>,
}

/// A pass with the sub-blocks fused (`Some`: keeping or recomputing their activations) or not.
fn pass(
    model: &Model,
    params: &ember_model::ParamStore,
    vocab: usize,
    fused: Option<ActivationMemory>,
) -> candle_core::Result<Pass> {
    let rng = DropoutRng::new(42);
    let sink = GradSink::new();
    let collector = Telemetry::new();
    let mut ctx = ForwardCtx::train(&rng).with_telemetry(&collector);
    if let Some(memory) = fused {
        ctx = ctx.with_grad_sink(&sink).with_activations(memory);
    }
    let logits = logits(model, vocab, ctx)?;
    let weights = random(logits.dims(), logits.dtype(), 99);
    let loss = (&logits * weights).unwrap().sum_all().unwrap();
    // The token embedding's lookup uses the sink in every model: only the blocks tell.
    let owing = sink.owing();
    let used_sink = owing.iter().any(|what| what.contains("block"));
    let mut store = loss.backward().unwrap();
    sink.merge_into(&mut store).unwrap();
    let grads = params
        .vars()
        .into_iter()
        .map(|(name, var)| {
            let g = store
                .get(var.as_tensor())
                .unwrap_or_else(|| panic!("{name} has no gradient"));
            (name, g.clone())
        })
        .collect();
    Ok(Pass {
        logits,
        loss,
        grads,
        used_sink,
        owing,
        telemetry: collector.take(),
    })
}

fn bits(t: &Tensor) -> Vec<u32> {
    let v: Vec<f32> = t
        .flatten_all()
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec1()
        .unwrap();
    v.iter().map(|x| x.to_bits()).collect()
}

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

/// Fused (keeping their activations, and recomputing them — all, or the attention sub-blocks'
/// alone — where the config allows it) against unfused for `c`, which the op covers when
/// `covered`; the pass that keeps them.
fn check(what: &str, c: &ModelConfig, precision: Precision, covered: bool) -> Pass {
    let (mut model, params) = build(c, DType::F32);
    perturb(&params, 0.05, 3);
    model.set_precision(precision);
    let unfused = pass(&model, &params, c.vocab(), None).unwrap();
    let keeping = pass(&model, &params, c.vocab(), Some(ActivationMemory::Keep)).unwrap();
    same_pass(what, &keeping, &unfused, covered);
    if covered && c.arch == Arch::Seq2seq && c.qk_norm != QkNorm::L2 {
        let cross = keeping
            .owing
            .iter()
            .filter(|w| w.contains("cross-attention"))
            .count();
        assert_eq!(
            cross,
            c.decoder_layers(),
            "{what}: cross-attention ops {:?}",
            keeping.owing
        );
    }
    for memory in [ActivationMemory::Recompute, ActivationMemory::RecomputeAttention] {
        let recomputing = pass(&model, &params, c.vocab(), Some(memory));
        let reasons = c.unfused_sub_blocks(memory);
        match recomputing {
            Ok(fused) if reasons.is_empty() => {
                same_pass(&format!("{what}, {memory}"), &fused, &unfused, true)
            }
            Ok(_) => panic!("{what}: {memory} ran where the config says {reasons:?}"),
            Err(e) => {
                let e = e.to_string();
                assert!(!reasons.is_empty(), "{what}: {memory} failed: {e}");
                assert!(
                    e.contains(&format!("train.activations: {memory}:"))
                        && e.contains("does not run as one op"),
                    "{what}: {e}"
                );
            }
        }
    }
    keeping
}

/// `fused` trains as `unfused` (and used the sink where `covered`).
fn same_pass(what: &str, fused: &Pass, unfused: &Pass, covered: bool) {
    assert_eq!(
        fused.used_sink, covered,
        "{what}: the sink was used: {}",
        fused.used_sink
    );
    assert_eq!(
        bits(&fused.logits),
        bits(&unfused.logits),
        "{what}: the logits differ"
    );
    assert_eq!(bits(&fused.loss), bits(&unfused.loss), "{what}: the loss differs");
    assert!(!unfused.telemetry.is_empty(), "{what}: no telemetry");
    assert_eq!(
        fused.telemetry, unfused.telemetry,
        "{what}: the telemetry differs"
    );
    for (name, g) in &unfused.grads {
        // `==`, not bits: the sign of an exact zero may differ, which moves no parameter.
        assert!(
            values(&fused.grads[name]) == values(g),
            "{what}: {name}'s gradient differs"
        );
    }
}

#[test]
fn fused_sub_blocks_train_the_same_bits_as_their_ops_one_by_one() {
    let mut checked = 0;
    for arch in ALL_ARCHS {
        for norm in ALL_NORMS {
            let positions = [
                (Positions::Rope, true, false),
                (Positions::Rope, true, true),
                (Positions::Learned, false, false),
                (Positions::None, true, false),
            ];
            for (positions, norm_bias, logn) in positions {
                for precision in every_precision() {
                    // SwiGLU with the learned positions, GELU with the others.
                    let mlp = if positions == Positions::Learned {
                        MlpKind::Swiglu
                    } else {
                        MlpKind::Gelu
                    };
                    // QK layernorm with log-n, QK rmsnorm with the learned positions.
                    let qk = match (positions, logn) {
                        (_, true) => QkNorm::Layernorm,
                        (Positions::Learned, _) => QkNorm::Rmsnorm,
                        _ => QkNorm::None,
                    };
                    let mut c = cfg(arch, qk, norm, mlp);
                    (c.positions, c.norm_bias, c.dropout, c.attn_dropout) = (positions, norm_bias, 0.1, 0.1);
                    (c.logn_attention, c.n_kv_heads) = (logn, logn.then_some(2));
                    let what = format!(
                        "{arch:?}/{norm:?}/{positions:?}/{mlp:?}/{qk:?}/norm bias {norm_bias}/log-n {logn}/{precision:?}"
                    );
                    check(&what, &c, precision, true);
                    checked += 1;
                }
            }
        }
    }
    assert!(checked >= 16);
}

/// A language model of `cfg`'s kind with LayerNorm, QK layernorm, GELU and dropout, changed by
/// `f`.
fn lm(f: &dyn Fn(&mut ModelConfig)) -> ModelConfig {
    let mut c = cfg(Arch::Lm, QkNorm::Layernorm, NormKind::Layernorm, MlpKind::Gelu);
    c.dropout = 0.1;
    f(&mut c);
    c
}

/// A seq2seq model likewise, with attention dropout too.
fn seq2seq(f: &dyn Fn(&mut ModelConfig)) -> ModelConfig {
    let mut c = cfg(
        Arch::Seq2seq,
        QkNorm::Layernorm,
        NormKind::Layernorm,
        MlpKind::Gelu,
    );
    (c.dropout, c.attn_dropout) = (0.1, 0.1);
    f(&mut c);
    c
}

/// fairseq's Transformer (`configs/multi30k-tiny-wu.yaml`'s): post-norm LayerNorm, sinusoidal
/// positions, a ReLU MLP and biases on every projection.
fn fairseq(c: &mut ModelConfig) {
    (c.norm_placement, c.positions, c.mlp) = (NormPlacement::Post, Positions::Sinusoidal, MlpKind::Relu);
    (c.proj_bias, c.qk_norm) = (true, QkNorm::None);
}

/// How many of the ops a pass ran are named by `what` ("attention block", "MLP block").
fn ops_of(pass: &Pass, what: &str) -> usize {
    pass.owing.iter().filter(|w| w.contains(what)).count()
}

/// How many sub-block ops a pass of `c` runs where every sub-block is one.
fn sub_blocks(c: &ModelConfig) -> usize {
    2 * c.encoder_layers() + c.decoder_layers() * if c.arch == Arch::Seq2seq { 3 } else { 2 }
}

#[test]
fn post_norm_relu_and_biased_sub_blocks_are_ops_too_and_train_the_same_bits() {
    let models = [
        ("post-norm", lm(&|c| c.norm_placement = NormPlacement::Post)),
        ("relu", lm(&|c| c.mlp = MlpKind::Relu)),
        (
            "projection biases",
            lm(&|c| (c.qk_norm, c.proj_bias) = (QkNorm::None, true)),
        ),
        (
            "swiglu with biases, rotary",
            lm(&|c| (c.mlp, c.proj_bias, c.positions) = (MlpKind::Swiglu, true, Positions::Rope)),
        ),
        (
            "post-norm rmsnorm, qk rmsnorm, gelu with biases",
            lm(&|c| {
                (c.norm_placement, c.norm, c.norm_bias) = (NormPlacement::Post, NormKind::Rmsnorm, false);
                (c.qk_norm, c.proj_bias) = (QkNorm::Rmsnorm, true);
            }),
        ),
        // x's gradient sums three terms here (the residual's, then up's, then gate's), where a
        // pre-norm block sums two at h, which either order gives.
        (
            "post-norm swiglu with biases",
            lm(&|c| (c.norm_placement, c.mlp, c.proj_bias) = (NormPlacement::Post, MlpKind::Swiglu, true)),
        ),
        ("fairseq's, causal", lm(&|c| fairseq(c))),
        (
            "seq2seq, post-norm",
            seq2seq(&|c| c.norm_placement = NormPlacement::Post),
        ),
        ("seq2seq, fairseq's", seq2seq(&|c| fairseq(c))),
        (
            "seq2seq, fairseq's with qk layernorm",
            seq2seq(&|c| (fairseq(c), c.qk_norm = QkNorm::Layernorm).1),
        ),
        (
            "fairseq's, rotary (a key bias too), qk layernorm",
            lm(&|c| {
                fairseq(c);
                (c.positions, c.qk_norm) = (Positions::Rope, QkNorm::Layernorm);
            }),
        ),
    ];
    for precision in every_precision() {
        for (what, c) in &models {
            let what = format!("{what}, {precision:?}");
            let fused = check(&what, c, precision, true);
            // Every sub-block ran as one op.
            let ops = ops_of(&fused, "block");
            assert_eq!(ops, sub_blocks(c), "{what}: ops {:?}", fused.owing);
            assert!(
                c.unfused_sub_blocks(ActivationMemory::Recompute).is_empty(),
                "{what}"
            );
        }
    }
}

#[test]
fn sub_blocks_the_ops_do_not_cover_run_as_before_and_train_the_same() {
    // L2 QK-norm's attention runs op by op; the feed-forward block is one op, whatever its
    // activation.
    for mlp in [MlpKind::Relu, MlpKind::Swiglu, MlpKind::Gelu] {
        let l2 = lm(&|c| (c.qk_norm, c.mlp) = (QkNorm::L2, mlp));
        let kept = check(&format!("{mlp:?}, l2 qk-norm"), &l2, Precision::F32, true);
        assert_eq!(ops_of(&kept, "attention block"), 0, "{mlp:?}: {:?}", kept.owing);
        assert_eq!(
            ops_of(&kept, "MLP block"),
            l2.decoder_layers(),
            "{mlp:?}: {:?}",
            kept.owing
        );
    }
    // Log-n scaling without rotary positions runs as before; the MLP sub-block is fused.
    check(
        "log-n with learned positions",
        &lm(&|c| (c.logn_attention, c.positions) = (true, Positions::Learned)),
        Precision::F32,
        true,
    );
    // Biased q, k, v (Qwen2's) are the attention op's, with or without QK-norm.
    for precision in every_precision() {
        for (what, mlp, qk) in [
            ("qkv biases, swiglu", MlpKind::Swiglu, QkNorm::None),
            ("qkv biases, gelu, qk layernorm", MlpKind::Gelu, QkNorm::Layernorm),
            ("qkv biases, relu", MlpKind::Relu, QkNorm::Rmsnorm),
        ] {
            let biased = lm(&|c| (c.qkv_bias, c.mlp, c.qk_norm) = (true, mlp, qk));
            check(&format!("{what}, {precision:?}"), &biased, precision, true);
        }
    }
    // A seq2seq decoder's cross-attention is one op with QK-norm's query norm too (the keys'
    // norm belongs to the projections of the encoder output), and with a ReLU MLP beside it.
    for precision in every_precision() {
        for (what, mlp, qk) in [
            ("seq2seq, relu, qk layernorm", MlpKind::Relu, QkNorm::Layernorm),
            ("seq2seq, relu, qk rmsnorm", MlpKind::Relu, QkNorm::Rmsnorm),
        ] {
            let c = seq2seq(&|c| (c.mlp, c.qk_norm) = (mlp, qk));
            check(&format!("{what}, {precision:?}"), &c, precision, true);
        }
    }
    // A seq2seq model with L2 QK-norm: its attention sub-blocks (cross-attention's too) run op
    // by op, post-norm or not.
    for placement in [NormPlacement::Pre, NormPlacement::Post] {
        let c = seq2seq(&|c| (c.norm_placement, c.qk_norm) = (placement, QkNorm::L2));
        let kept = check(&format!("seq2seq, l2, {placement:?}"), &c, Precision::F32, true);
        // "attention block" names the cross-attention op too.
        assert_eq!(
            ops_of(&kept, "attention block"),
            0,
            "{placement:?}: {:?}",
            kept.owing
        );
        let layers = c.encoder_layers() + c.decoder_layers();
        assert_eq!(
            ops_of(&kept, "MLP block"),
            layers,
            "{placement:?}: {:?}",
            kept.owing
        );
    }
}
