//! A self-attention sub-block, `x + dropout(attention(q, k, v)·W_oᵀ)` with q, k, v the
//! projections of `norm(x)` (pre-norm) or of x itself (the branch of a post-norm sub-block,
//! whose norm follows the op) — q and k through QK-norm where the model has it; then q rotated
//! and scaled and k rotated where the model has rotary positions, q scaled where it has none —
//! as one op.
//!
//! The composition is six ops or more (the norm, three projections, QK-norm's two norms, the
//! attention core and the output projection with its residual add); candle's backward pass
//! zero-fills and adds a gradient for each of their inputs: x twice, the normalised h three
//! times, q, k, v, the attention output o and every parameter. As one op with x its only candle
//! input, only x's remains; the parameters' gradients go to a [`GradSink`].
//!
//! q, k and v may add biases (Qwen2's, fairseq's): each added to the product's rows and its
//! gradient summed over them as [`linear_bias`](crate::linear_bias) does, between the product
//! and what follows it (QK-norm, the rotation or scale), as the model composes them; so may the
//! output projection (fairseq's), before the residual's dropout.
//!
//! The same kernels run on the same operands in the same order as the composition — h's three
//! gradients summed as candle sums them, v's first, then k's, then q's ([`Opening::backward`]) —
//! so the output and x's gradient have the composition's bits and each parameter's gradient
//! equals it, up to the sign of an exact zero (candle's `0 + g`, and its `affine(s, 0)` against
//! the scale's `·s + 0`; a zero moves no parameter either way).

use std::borrow::Cow;

use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};

use crate::attention::{take, AttentionOptions, AttentionTelemetry, AttnOp};
use crate::bias::{add_to_rows, column_sums_of};
use crate::block::{
    branch_gradient, ActivationMemory, Between, BlockNorm, GradSink, HeldNorm, Opening, ParamGrads, SubBlock,
};
use crate::dropout::{add_dropped, DropoutOp};
use crate::gemm::{Activation, SharedB};
use crate::held::Held;
use crate::host::{cpu_slice, cpu_tensor, is_host_f32, with_data};
use crate::linear::{
    project, project_grads, project_grads_shared, project_kept, Epilogue, Plain, Rotate, Scale,
};
use crate::rope::{check_heads, PositionScale, RopeOp, RopeTables};
use crate::Precision;

/// The parameters of an attention sub-block after its opening norm: the four projections,
/// (out, in) each — queries (H·d, D), keys and values (H_kv·d, D), output (D, H·d) — their
/// biases, and QK-norm's norms over each head of q and of k, where the model has them.
#[derive(Clone, Copy)]
pub struct AttentionWeights<'a> {
    pub q: &'a Tensor,
    pub k: &'a Tensor,
    pub v: &'a Tensor,
    pub o: &'a Tensor,
    /// The biases of q's, k's and v's projections (H·d, H_kv·d, H_kv·d), each where it has one.
    pub qkv_bias: [Option<&'a Tensor>; 3],
    /// The output projection's bias (D), where it has one.
    pub o_bias: Option<&'a Tensor>,
    /// The query's and the key's per-head norm (gains of head_dim), applied before the
    /// rotation (Qwen3, OLMo 2).
    pub qk_norm: Option<[BlockNorm<'a>; 2]>,
}

/// How queries and keys learn their positions in an attention sub-block.
#[derive(Clone, Copy)]
pub enum BlockPositions<'a> {
    /// Rotary: q and k rotated from position 0, q also multiplied by its position's `scale`.
    Rotary {
        tables: &'a RopeTables,
        scale: PositionScale,
    },
    /// No rotation (the positions are in the embeddings, or nowhere): q times a constant.
    Unrotated { scale: f64 },
}

/// `x + dropout(attention(q, k, v)·oᵀ)` for x (B, T, D): q, k and v the projections of
/// `norm(x)` (or of x, `norm` `None`: a post-norm branch, whose norm the caller applies to the
/// output) through QK-norm (with it) and `positions`; the attention core as
/// [`attention`](crate::attention) computes it with `mask` and the options `options` gives (its
/// telemetry returned); then the residual's dropout, (p, the state of
/// [`dropout`](crate::dropout)) from `residual` — as one op whose parameter gradients go to
/// `sink` (the caller merges it after `backward()`), which keeps its activations for the
/// backward pass or recomputes them there (as `memory` says for [`SubBlock::Attention`]).
/// `options` and then `residual` are called only when the op runs, so a caller reserving
/// dropout masks in them reserves them in the composition's order, and only once.
///
/// `None` where the op does not run — tensors off the CPU or not f32, positions past the rotary
/// tables, or an x that carries no gradient (its parameters would get none) —: the caller runs
/// the ops one by one.
#[allow(clippy::too_many_arguments)] // the sub-block's parts, its dropout and where its gradients go
pub fn attention_block(
    x: &Tensor,
    norm: Option<BlockNorm>,
    w: AttentionWeights,
    positions: BlockPositions,
    mask: Option<&Tensor>,
    memory: ActivationMemory,
    sink: &GradSink,
    options: impl FnOnce() -> AttentionOptions,
    residual: impl FnOnce() -> (f64, u64),
) -> Result<Option<(Tensor, Option<AttentionTelemetry>)>> {
    let qk_params = w.qk_norm.iter().flatten().flat_map(|n| [Some(n.weight), n.bias]);
    let params: Vec<Option<&Tensor>> = Opening::params(norm)
        .into_iter()
        .chain([Some(w.q), Some(w.k), Some(w.v), Some(w.o), w.o_bias])
        .chain(w.qkv_bias)
        .chain(qk_params)
        .collect();
    let (b, t, _) = x.dims3()?;
    let runs = is_host_f32(x)
        && x.track_op()
        && params.iter().flatten().all(|p| is_host_f32(p))
        && mask.is_none_or(is_host_f32)
        && match positions {
            BlockPositions::Rotary { tables, .. } => tables.covers(0, t),
            BlockPositions::Unrotated { .. } => true,
        };
    if !runs {
        return Ok(None);
    }
    let opts = options();
    let residual = residual();
    let precision = opts.precision;
    precision.check_cpu()?;
    let (q_width, kv_width) = check_shapes(x, norm, &w)?;
    if let BlockPositions::Rotary { tables, .. } = positions {
        check_heads(tables, q_width)?;
        check_heads(tables, kv_width)?;
    }
    let qk_norm = match w.qk_norm {
        Some([q, k]) => Some([HeldNorm::new(q)?, HeldNorm::new(k)?]),
        None => None,
    };
    let parts = Parts {
        opening: Opening::new(norm)?,
        qk_norm,
        proj: Projections {
            q: w.q.contiguous()?,
            k: w.k.contiguous()?,
            v: w.v.contiguous()?,
            o: w.o.contiguous()?,
            o_bias: Bias::of(w.o_bias)?,
            bias: {
                let [q, k, v] = w.qkv_bias.map(Bias::of);
                [q?, k?, v?]
            },
        },
        attn: AttnOp::cpu(&[b, t, q_width], &[b, t, kv_width], mask, &opts, true)?,
        residual: DropoutOp::new(residual.0, residual.1),
        precision,
        between: Between::new(memory, SubBlock::Attention, sink, "the fused attention block"),
    };
    let x = x.contiguous()?;
    let out = match positions {
        BlockPositions::Rotary { tables, scale } => {
            let query = Rotate(RopeOp::new(tables, 0, scale));
            let key = Rotate(RopeOp::new(tables, 0, 1.0.into()));
            apply_taking_telemetry(&x, AttentionBlockOp { parts, query, key })?
        }
        BlockPositions::Unrotated { scale } => {
            let (query, key) = (Scale(scale as f32), Plain);
            apply_taking_telemetry(&x, AttentionBlockOp { parts, query, key })?
        }
    };
    Ok(Some(out))
}

/// (H·d, H_kv·d): the widths of q and of k and v, once x (B, T, D), the norm and the weights are
/// found to fit together.
fn check_shapes(x: &Tensor, norm: Option<BlockNorm>, w: &AttentionWeights) -> Result<(usize, usize)> {
    let d = x.dims3()?.2;
    let (q_width, kv_width) = (w.q.dims2()?.0, w.k.dims2()?.0);
    let [q_bias, k_bias, v_bias] = w.qkv_bias.map(|b| b.map(Tensor::dims));
    if [w.q.dims2()?.1, w.k.dims2()?.1, w.v.dims2()?.1, w.o.dims2()?.0] != [d; 4]
        || w.v.dims2()?.0 != kv_width
        || w.o.dims2()?.1 != q_width
        || !Opening::fits(norm, d)
        || q_bias.is_some_and(|dims| dims != [q_width])
        || w.o_bias.is_some_and(|b| b.dims() != [d])
        || [k_bias, v_bias].iter().flatten().any(|dims| *dims != [kv_width])
    {
        candle_core::bail!(
            "attention_block: input {:?}, norm {:?}, projections q {:?}, k {:?}, v {:?}, o {:?}, \
             q, k, v biases {:?} and o's {:?} do not fit",
            x.shape(),
            norm.map(|n| n.weight.shape()),
            w.q.shape(),
            w.k.shape(),
            w.v.shape(),
            w.o.shape(),
            [q_bias, k_bias, v_bias],
            w.o_bias.map(Tensor::shape)
        );
    }
    Ok((q_width, kv_width))
}

/// Applies the op to x, and takes what its attention core measured.
fn apply_taking_telemetry<Q: Epilogue + 'static, K: Epilogue + 'static>(
    x: &Tensor,
    op: AttentionBlockOp<Q, K>,
) -> Result<(Tensor, Option<AttentionTelemetry>)> {
    let slot = op.parts.attn.telemetry_slot();
    let out = x.apply_op1(op)?;
    Ok((out, slot.as_deref().and_then(take)))
}

/// The four projections, (out, in) each, and their biases.
struct Projections {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    o_bias: Option<Bias>,
    bias: [Option<Bias>; 3],
}

impl Projections {
    /// q's, k's and v's biases, each where it has one.
    fn biases(&self) -> [Option<&Bias>; 3] {
        self.bias.each_ref().map(Option::as_ref)
    }
}

/// A projection's bias: the parameter, and its values (a row's worth, read once a pass).
pub(super) struct Bias {
    param: Tensor,
    pub(super) values: Vec<f32>,
}

impl Bias {
    pub(super) fn of(bias: Option<&Tensor>) -> Result<Option<Self>> {
        let Some(param) = bias else {
            return Ok(None);
        };
        let values = with_data([param], |[b]| Ok(b.to_vec()))?;
        Ok(Some(Self {
            param: param.clone(),
            values,
        }))
    }
}

/// `h·wᵀ` for rows × d → rows × out (`d`), plus the bias on every row where there is one.
pub(super) fn projection(
    h: &Activation,
    w: &[f32],
    bias: Option<&Bias>,
    d: (usize, usize, usize),
) -> Vec<f32> {
    let mut y = project_kept(h, w, d);
    if let Some(bias) = bias {
        add_to_rows(&mut y, &bias.values);
    }
    y
}

/// The residual branch before its dropout: attention's output `o` through the output
/// projection `wo` (d = (rows, H·d, D)), its products in `precision`, and its bias if it has one.
pub(super) fn output_projection(
    o: &[f32],
    wo: &[f32],
    bias: Option<&Bias>,
    d: (usize, usize, usize),
    precision: Precision,
) -> Vec<f32> {
    let mut branch = project(o, wo, d, precision);
    if let Some(bias) = bias {
        add_to_rows(&mut branch, &bias.values);
    }
    branch
}

/// The bias's gradient for the gradient `g` at its projection's output (rows of `width`).
pub(super) fn bias_grad(bias: Option<&Bias>, g: &[f32], width: usize) -> Result<ParamGrads> {
    match bias {
        Some(bias) => Ok(vec![(
            bias.param.clone(),
            cpu_tensor(column_sums_of(g, width), bias.param.shape())?,
        )]),
        None => Ok(Vec::new()),
    }
}

/// What an attention sub-block op holds whatever its positions.
struct Parts {
    opening: Opening,
    /// QK-norm's query and key norms.
    qk_norm: Option<[HeldNorm; 2]>,
    proj: Projections,
    attn: AttnOp,
    residual: Option<DropoutOp>,
    precision: Precision,
    /// What the forward pass keeps (the attention core its probabilities with it).
    between: Between<Kept>,
}

impl Parts {
    /// QK-norm's query and key norms, each `None` without QK-norm.
    fn qk_norms(&self) -> [Option<&HeldNorm>; 2] {
        match &self.qk_norm {
            Some([q, k]) => [Some(q), Some(k)],
            None => [None, None],
        }
    }
}

/// A forward pass's normalised input h (kept for products only: rounded in bf16; `None` where
/// it is x itself, [`Opening::kept`]), q, k and v as attention reads them (its products alone
/// read them: held in bf16 where those are, [`Held`]), its output o, and q's and k's
/// projections before QK-norm (empty without it).
struct Kept {
    h: Option<Activation>,
    q: Held<'static>,
    k: Held<'static>,
    v: Held<'static>,
    o: Vec<f32>,
    q_raw: Vec<f32>,
    k_raw: Vec<f32>,
}

/// A query's or key's projection through QK-norm's `norm` (where there is one): (what the
/// epilogue takes, the projection kept for the norm's backward pass).
pub(super) fn through_norm(norm: Option<&HeldNorm>, product: Vec<f32>) -> Result<(Vec<f32>, Vec<f32>)> {
    match norm {
        Some(norm) => Ok((norm.forward(&product)?, product)),
        None => Ok((product, Vec::new())),
    }
}

/// The gradient at a query's or key's projection from the gradient `g` at QK-norm's output
/// (`raw`: the projection), and the norm's parameter gradients.
pub(super) fn back_through_norm<'g>(
    norm: Option<&HeldNorm>,
    raw: &[f32],
    g: Cow<'g, [f32]>,
) -> Result<(Cow<'g, [f32]>, ParamGrads)> {
    match norm {
        Some(norm) => {
            let (dx, grads) = norm.backward(raw, &g, None)?;
            Ok((Cow::Owned(dx), grads))
        }
        None => Ok((g, Vec::new())),
    }
}

/// The op of [`attention_block`], with the query's and key's epilogues (rotation, scale).
struct AttentionBlockOp<Q, K> {
    parts: Parts,
    query: Q,
    key: K,
}

impl<Q: Epilogue, K: Epilogue> AttentionBlockOp<Q, K> {
    /// (rows, D, H·d, H_kv·d) for x.
    fn dims(&self, x: &Shape) -> Result<(usize, usize, usize, usize)> {
        let (q_width, d) = self.parts.proj.q.dims2()?;
        let kv_width = self.parts.proj.k.dims2()?.0;
        Ok((x.elem_count() / d.max(1), d, q_width, kv_width))
    }

    /// The activations of x (B, T, D) up to the attention core's output, in the `forward` pass
    /// or recomputed for the backward pass. The core keeps its probabilities where the
    /// activations are kept (a recomputation's are), and measures in the forward pass alone.
    fn activations(&self, x: &[f32], shape: &Shape, forward: bool) -> Result<Kept> {
        let p = &self.parts;
        let (rows, d, q_width, kv_width) = self.dims(shape)?;
        let h = p.opening.forward_kept(x, d, p.precision)?;
        let [q_norm, k_norm] = p.qk_norms();
        let [q_bias, k_bias, v_bias] = p.proj.biases();
        let (q, k, v, q_raw, k_raw) = with_data([&p.proj.q, &p.proj.k, &p.proj.v], |[wq, wk, wv]| {
            let (q, q_raw) = through_norm(q_norm, projection(&h, wq, q_bias, (rows, d, q_width)))?;
            let (k, k_raw) = through_norm(k_norm, projection(&h, wk, k_bias, (rows, d, kv_width)))?;
            let q = self.query.forward(q, shape, q_width)?;
            let k = self.key.forward(k, shape, kv_width)?;
            let v = projection(&h, wv, v_bias, (rows, d, kv_width));
            Ok((q, k, v, q_raw, k_raw))
        })?;
        let keep_probs = !forward || p.between.keeps();
        let o = p.attn.forward_values_with(&q, &k, &v, keep_probs, forward)?;
        let precision = p.between.holds_in(p.precision, forward);
        let [q, k, v] = [q, k, v].map(|values| Held::new(values, precision));
        Ok(Kept {
            h: p.opening.kept(h),
            q,
            k,
            v,
            o,
            q_raw,
            k_raw,
        })
    }
}

impl<Q: Epilogue, K: Epilogue> CustomOp1 for AttentionBlockOp<Q, K> {
    fn name(&self) -> &'static str {
        "ember-attention-block"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let p = &self.parts;
        let x = cpu_slice(s, l)?;
        let (rows, d, q_width, _) = self.dims(l.shape())?;
        let kept = self.activations(x, l.shape(), true)?;
        let branch = with_data([&p.proj.o], |[wo]| {
            let o_bias = p.proj.o_bias.as_ref();
            Ok(output_projection(
                &kept.o,
                wo,
                o_bias,
                (rows, q_width, d),
                p.precision,
            ))
        })?;
        p.between.hold(kept);
        Ok((
            CpuStorage::F32(add_dropped(p.residual, x, &branch)),
            l.shape().clone(),
        ))
    }

    /// The composition's backward passes in its order: the output projection, the attention
    /// core, v's, k's and q's projections (through QK-norm; h's gradient summed in that order),
    /// the norm, and x's gradients (the residual's g and the branch's) summed
    /// ([`Opening::backward`]).
    fn bwd(&self, x: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        let p = &self.parts;
        let kept = p.between.take();
        let shape = x.shape();
        let (rows, d, q_width, kv_width) = self.dims(shape)?;
        let tensors = [x, g, &p.proj.q, &p.proj.k, &p.proj.v, &p.proj.o];
        let (dx, grads) = with_data(tensors, |[xs, gs, wq, wk, wv, wo]| {
            let Kept {
                h,
                q,
                k,
                v,
                o,
                q_raw,
                k_raw,
            } = match kept {
                Some(kept) => kept,
                None => self.activations(xs, shape, false)?,
            };
            let h = p.opening.restored(h, xs, d, p.precision)?;
            let g_branch = branch_gradient(p.residual, gs);
            let o_bias_grads = bias_grad(p.proj.o_bias.as_ref(), &g_branch, d)?;
            let (d_o, d_wo) = project_grads(&o, wo, &g_branch, (rows, q_width, d), p.precision);
            let (dq, dk, dv) = p.attn.backward_held(&q, &k, &v, &o, &d_o)?;
            drop((o, d_o, v));
            let [q_bias, k_bias, v_bias] = p.proj.biases();
            // h is dW's B for all three projections: packed once in bf16.
            let h_b = SharedB::new(&h);
            let v_bias_grads = bias_grad(v_bias, &dv, kv_width)?;
            let (dh_v, d_wv) = project_grads_shared(&h_b, wv, &dv, (rows, d, kv_width));
            // The epilogues here (rotation, scale, none) never recompute what they took.
            let [q_norm, k_norm] = p.qk_norms();
            let recompute_k = || projection(&h, wk, k_bias, (rows, d, kv_width));
            let dk = self.key.backward(&dk, shape, kv_width, recompute_k)?;
            let (dk, k_norm_grads) = back_through_norm(k_norm, &k_raw, dk)?;
            let k_bias_grads = bias_grad(k_bias, &dk, kv_width)?;
            let (dh_k, d_wk) = project_grads_shared(&h_b, wk, &dk, (rows, d, kv_width));
            let recompute_q = || projection(&h, wq, q_bias, (rows, d, q_width));
            let dq = self.query.backward(&dq, shape, q_width, recompute_q)?;
            let (dq, q_norm_grads) = back_through_norm(q_norm, &q_raw, dq)?;
            let q_bias_grads = bias_grad(q_bias, &dq, q_width)?;
            let (dh_q, d_wq) = project_grads_shared(&h_b, wq, &dq, (rows, d, q_width));
            drop(h_b);
            drop((h, q, k));
            // h's three gradients summed as candle sums them: v's, then k's, then q's.
            let (dx, norm_grads) = p.opening.backward(xs, vec![dh_v, dh_k, dh_q], gs)?;
            let Projections {
                q: pq,
                k: pk,
                v: pv,
                o: po,
                ..
            } = &p.proj;
            let mut grads = vec![];
            for (param, grad) in [pq, pk, pv, po].into_iter().zip([d_wq, d_wk, d_wv, d_wo]) {
                grads.push((param.clone(), cpu_tensor(grad, param.shape())?));
            }
            grads.extend(norm_grads.into_iter().chain(q_norm_grads).chain(k_norm_grads));
            grads.extend(q_bias_grads.into_iter().chain(k_bias_grads).chain(v_bias_grads));
            grads.extend(o_bias_grads);
            Ok((dx, grads))
        })?;
        p.between.deposit(grads);
        Ok(Some(cpu_tensor(dx, shape)?))
    }
}
