//! A cross-attention sub-block, `x + dropout(attention(q, k, v)·W_oᵀ)` with q the projection of
//! `norm(x)` (pre-norm) or of x itself (the branch of a post-norm sub-block, whose norm follows
//! the op) — through QK-norm where the model has it, then scaled — and k, v given (a seq2seq
//! decoder's keys and values of the encoder output), as one op; the output projection with its
//! bias where it has one (fairseq's).
//!
//! The composition is the norm, q's projection (and its bias, and QK-norm's norm), the scale,
//! the attention core and the output projection with its residual add; candle's backward pass
//! zero-fills and adds a gradient for each of their inputs: x twice, h, q, the attention output
//! o and every parameter. As one op with x, k and v its candle inputs, only theirs remain; the
//! parameters' gradients go to a [`GradSink`].
//!
//! k and v stay inputs (not projections made inside) because the encoder output they come from
//! feeds every decoder layer: candle adds its gradients one projection at a time across the
//! layers, and summing a layer's two inside the op would change the order of those sums and so
//! the encoder's bits. k's and v's gradients here are the attention core's, as in the
//! composition.
//!
//! The same kernels run on the same operands in the same order as the composition, so the
//! output and the gradients of x, k and v have its bits and each parameter's gradient equals it,
//! up to the sign of an exact zero (see [`attention_block`](super::attention_block)).

use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor};

use super::attention::{back_through_norm, bias_grad, output_projection, projection, through_norm, Bias};
use crate::attention::{take, AttentionOptions, AttentionTelemetry, AttnOp};
use crate::block::{
    branch_gradient, ActivationMemory, Between, BlockNorm, GradSink, HeldNorm, Opening, SubBlock,
};
use crate::dropout::{add_dropped, DropoutOp};
use crate::gemm::Activation;
use crate::held::Held;
use crate::host::{cpu_slice, cpu_tensor, is_host_f32, with_data};
use crate::linear::{project_grads, project_grads_kept, Epilogue, Scale};
use crate::Precision;

/// The parameters of a cross-attention sub-block after its opening norm: the query projection
/// (H·d, D) and the output projection (D, H·d), each with its bias where it has one, and
/// QK-norm's norm over each head of q, where the model has it (the keys' norm belongs to
/// whoever made k).
#[derive(Clone, Copy)]
pub struct CrossAttentionWeights<'a> {
    pub q: &'a Tensor,
    pub o: &'a Tensor,
    pub q_bias: Option<&'a Tensor>,
    pub o_bias: Option<&'a Tensor>,
    pub q_norm: Option<BlockNorm<'a>>,
}

/// `x + dropout(attention(q, k, v)·oᵀ)` for x (B, T, D) and k, v (B, S, H_kv·d): q the
/// projection of `norm(x)` (or of x, `norm` `None`: a post-norm branch, whose norm the caller
/// applies to the output) through QK-norm's query norm (with it), times `scale`; the attention
/// core as [`attention`](crate::attention) computes it with `mask` and the options `options`
/// gives (its telemetry returned); then the residual's dropout, (p, the state of
/// [`dropout`](crate::dropout)) from `residual` — as one op whose parameter gradients go to
/// `sink` (the caller merges it after `backward()`), whose x, k and v get theirs through
/// candle, and which keeps its activations for the backward pass or recomputes them there (as
/// `memory` says for [`SubBlock::Attention`]). `options` and then `residual` are called only
/// when the op runs.
///
/// `None` where the op does not run — tensors off the CPU or not f32, or an x that carries no
/// gradient —: the caller runs the ops one by one.
#[allow(clippy::too_many_arguments)] // the sub-block's parts, its dropout and where its gradients go
pub fn cross_attention_block(
    x: &Tensor,
    norm: Option<BlockNorm>,
    w: CrossAttentionWeights,
    (k, v): (&Tensor, &Tensor),
    scale: f64,
    mask: Option<&Tensor>,
    memory: ActivationMemory,
    sink: &GradSink,
    options: impl FnOnce() -> AttentionOptions,
    residual: impl FnOnce() -> (f64, u64),
) -> Result<Option<(Tensor, Option<AttentionTelemetry>)>> {
    let q_norm_params = w.q_norm.iter().flat_map(|n| [Some(n.weight), n.bias]);
    let params: Vec<Option<&Tensor>> = Opening::params(norm)
        .into_iter()
        .chain([Some(w.q), Some(w.o), w.q_bias, w.o_bias])
        .chain(q_norm_params)
        .collect();
    let runs = [x, k, v].iter().all(|t| is_host_f32(t))
        && x.track_op()
        && params.iter().flatten().all(|p| is_host_f32(p))
        && mask.is_none_or(is_host_f32);
    if !runs {
        return Ok(None);
    }
    let (b, t, d) = x.dims3()?;
    let q_width = w.q.dims2()?.0;
    let (kb, s, kv_width) = k.dims3()?;
    if w.q.dims2()?.1 != d
        || w.o.dims2()? != (d, q_width)
        || !Opening::fits(norm, d)
        || w.q_bias.is_some_and(|bias| bias.dims() != [q_width])
        || w.o_bias.is_some_and(|bias| bias.dims() != [d])
        || kb != b
        || v.dims() != k.dims()
    {
        candle_core::bail!(
            "cross_attention_block: input {:?}, norm {:?}, keys {:?}, values {:?}, projections q \
             {:?} and o {:?} and their biases {:?} do not fit",
            x.shape(),
            norm.map(|n| n.weight.shape()),
            k.shape(),
            v.shape(),
            w.q.shape(),
            w.o.shape(),
            [w.q_bias, w.o_bias].map(|b| b.map(Tensor::shape))
        );
    }
    let opts = options();
    let residual = residual();
    let precision = opts.precision;
    precision.check_cpu()?;
    let op = CrossAttentionBlockOp {
        opening: Opening::new(norm)?,
        q_norm: w.q_norm.map(HeldNorm::new).transpose()?,
        q: w.q.contiguous()?,
        q_bias: Bias::of(w.q_bias)?,
        o: w.o.contiguous()?,
        o_bias: Bias::of(w.o_bias)?,
        scale: Scale(scale as f32),
        attn: AttnOp::cpu(&[b, t, q_width], &[b, s, kv_width], mask, &opts, true)?,
        residual: DropoutOp::new(residual.0, residual.1),
        precision,
        between: Between::new(
            memory,
            SubBlock::Attention,
            sink,
            "the fused cross-attention block",
        ),
    };
    let slot = op.attn.telemetry_slot();
    let out = x
        .contiguous()?
        .apply_op3(&k.contiguous()?, &v.contiguous()?, op)?;
    Ok(Some((out, slot.as_deref().and_then(take))))
}

/// The op of [`cross_attention_block`].
struct CrossAttentionBlockOp {
    opening: Opening,
    /// QK-norm's query norm.
    q_norm: Option<HeldNorm>,
    q: Tensor,
    q_bias: Option<Bias>,
    o: Tensor,
    o_bias: Option<Bias>,
    /// The logit scale, folded into q.
    scale: Scale,
    attn: AttnOp,
    residual: Option<DropoutOp>,
    precision: Precision,
    /// What the forward pass keeps (the attention core its probabilities with it).
    between: Between<Kept>,
}

/// A forward pass's normalised input h (kept for products only: rounded in bf16; `None` where
/// it is x itself, [`Opening::kept`]), q as attention reads it (its products alone: held in
/// bf16 where those are, [`Held`]), its output o, and q's projection before QK-norm (empty
/// without it).
struct Kept {
    h: Option<Activation>,
    q: Held<'static>,
    o: Vec<f32>,
    q_raw: Vec<f32>,
}

impl CrossAttentionBlockOp {
    /// (rows, D, H·d) for x.
    fn dims(&self, x: &Shape) -> Result<(usize, usize, usize)> {
        let (q_width, d) = self.q.dims2()?;
        Ok((x.elem_count() / d.max(1), d, q_width))
    }

    /// The activations of x (B, T, D) attending to k and v, in the `forward` pass or recomputed
    /// for the backward pass (as [`attention_block`](super::attention_block)'s are).
    fn activations(&self, x: &[f32], shape: &Shape, (k, v): (&[f32], &[f32]), forward: bool) -> Result<Kept> {
        let (rows, d, q_width) = self.dims(shape)?;
        let h = self.opening.forward_kept(x, d, self.precision)?;
        let (q, q_raw) = with_data([&self.q], |[wq]| {
            let product = projection(&h, wq, self.q_bias.as_ref(), (rows, d, q_width));
            through_norm(self.q_norm.as_ref(), product)
        })?;
        let q = self.scale.forward(q, shape, q_width)?;
        let keep_probs = !forward || self.between.keeps();
        let o = self.attn.forward_values_with(&q, k, v, keep_probs, forward)?;
        let q = Held::new(q, self.between.holds_in(self.precision, forward));
        Ok(Kept {
            h: self.opening.kept(h),
            q,
            o,
            q_raw,
        })
    }
}

impl CustomOp3 for CrossAttentionBlockOp {
    fn name(&self) -> &'static str {
        "ember-cross-attention-block"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let x = cpu_slice(s1, l1)?;
        let kv = (cpu_slice(s2, l2)?, cpu_slice(s3, l3)?);
        let (rows, d, q_width) = self.dims(l1.shape())?;
        let kept = self.activations(x, l1.shape(), kv, true)?;
        let branch = with_data([&self.o], |[wo]| {
            let o_bias = self.o_bias.as_ref();
            Ok(output_projection(
                &kept.o,
                wo,
                o_bias,
                (rows, q_width, d),
                self.precision,
            ))
        })?;
        self.between.hold(kept);
        Ok((
            CpuStorage::F32(add_dropped(self.residual, x, &branch)),
            l1.shape().clone(),
        ))
    }

    /// The composition's backward passes in its order: the output projection, the attention
    /// core (k's and v's gradients its own), the scale, QK-norm, q's projection, the norm, and
    /// x's two gradients (the residual's g and the branch's) summed.
    fn bwd(
        &self,
        x: &Tensor,
        k: &Tensor,
        v: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let kept = self.between.take();
        let shape = x.shape();
        let (rows, d, q_width) = self.dims(shape)?;
        let tensors = [x, k, v, g, &self.q, &self.o];
        let (dx, dk, dv, grads) = with_data(tensors, |[xs, ks, vs, gs, wq, wo]| {
            let Kept { h, q, o, q_raw } = match kept {
                Some(kept) => kept,
                None => self.activations(xs, shape, (ks, vs), false)?,
            };
            let h = self.opening.restored(h, xs, d, self.precision)?;
            let g_branch = branch_gradient(self.residual, gs);
            let o_bias_grads = bias_grad(self.o_bias.as_ref(), &g_branch, d)?;
            let (d_o, d_wo) = project_grads(&o, wo, &g_branch, (rows, q_width, d), self.precision);
            let (dq, dk, dv) = {
                let [ks, vs] = [ks, vs].map(|x| Held::F32(x.into()));
                self.attn.backward_held(&q, &ks, &vs, &o, &d_o)?
            };
            drop((o, d_o, q));
            // The scale never recomputes its product.
            let recompute_q = || projection(&h, wq, self.q_bias.as_ref(), (rows, d, q_width));
            let dq = self.scale.backward(&dq, shape, q_width, recompute_q)?;
            let (dq, q_norm_grads) = back_through_norm(self.q_norm.as_ref(), &q_raw, dq)?;
            let q_bias_grads = bias_grad(self.q_bias.as_ref(), &dq, q_width)?;
            let (dh, d_wq) = project_grads_kept(&h, wq, &dq, (rows, d, q_width));
            drop((h, dq));
            let (dx, norm_grads) = self.opening.backward(xs, vec![dh], gs)?;
            let mut grads = vec![
                (self.q.clone(), cpu_tensor(d_wq, self.q.shape())?),
                (self.o.clone(), cpu_tensor(d_wo, self.o.shape())?),
            ];
            grads.extend(norm_grads.into_iter().chain(q_norm_grads).chain(q_bias_grads));
            grads.extend(o_bias_grads);
            Ok((dx, dk, dv, grads))
        })?;
        self.between.deposit(grads);
        Ok((
            Some(cpu_tensor(dx, shape)?),
            Some(cpu_tensor(dk, k.shape())?),
            Some(cpu_tensor(dv, v.shape())?),
        ))
    }
}
