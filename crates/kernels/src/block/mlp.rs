//! A feed-forward sub-block as one op: pre-norm `x + dropout(act(norm(x))·W_downᵀ)`, or the
//! branch of a post-norm one, `x + dropout(act(x)·W_downᵀ)` (its norm follows the op), with act
//! GELU or ReLU of one projection, `gelu(h·W_upᵀ)`, or SwiGLU of two, `silu(h·W_gateᵀ) ⊙
//! h·W_upᵀ`; each projection with its bias where it has one (fairseq's feed-forward blocks).
//!
//! The composition is three or four ops (the norm, [`linear_gelu_in`](crate::linear_gelu_in),
//! [`linear_bias_relu_in`](crate::linear_bias_relu_in) or two [`linear_in`](crate::linear_in)s
//! and [`swiglu_in`](crate::swiglu_in), [`linear_residual_in`](crate::linear_residual_in) or a
//! biased projection and [`add_dropout`](crate::add_dropout)), and candle's backward pass
//! zero-fills and adds a gradient for each of their inputs: x twice, the normalised h once or
//! twice, the hidden activations (d_ff wide, four times the stream for GELU, three of them for
//! SwiGLU) and every parameter, per pass. As one op with x its only candle input, only x's
//! remains; the activations live inside the op from its forward to its backward pass, and the
//! parameters' gradients go to a [`GradSink`].
//!
//! The op runs the same kernels on the same operands in the same order as the composition, so
//! its output and x's gradient have the composition's bits and each parameter's gradient equals
//! it (up to the sign of an exact zero, which candle's `0 + g` makes positive: a zero gradient
//! moves no parameter either way).

use std::borrow::Cow;

use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};

use super::attention::{bias_grad, projection, Bias};
use crate::activation::{swiglu_grads, swiglu_kept, swiglu_output, GeluSlope};
use crate::bias::{relu_grad, relu_in_place};
use crate::block::{
    branch_gradient, ActivationMemory, Between, BlockNorm, GradSink, Opening, ParamGrads, SubBlock,
};
use crate::dropout::{add_dropped, DropoutOp};
use crate::gemm::{Activation, Mat, RowsOfProduct, SharedB};
use crate::held::Held;
use crate::host::{cpu_slice, cpu_tensor, is_host_f32, with_data};
use crate::linear::{project_grads_kept, project_grads_of, project_grads_shared, project_kept};
use crate::Precision;

/// A projection of a block, (out, in), and its bias (out) where it has one.
#[derive(Clone, Copy)]
pub struct BlockProjection<'a> {
    pub weight: &'a Tensor,
    pub bias: Option<&'a Tensor>,
}

impl<'a> BlockProjection<'a> {
    /// A projection without a bias.
    pub fn unbiased(weight: &'a Tensor) -> Self {
        Self { weight, bias: None }
    }
}

/// The activation between a feed-forward sub-block's projections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MlpActivation {
    /// `gelu_erf(h·upᵀ)`.
    Gelu,
    /// `relu(h·upᵀ)` (fairseq's).
    Relu,
    /// `silu(h·gateᵀ) ⊙ h·upᵀ`: the only one with a gate projection.
    Swiglu,
}

/// A feed-forward sub-block's projections — up (and SwiGLU's gate) (d_ff, D), down (D, d_ff) —
/// and its activation.
#[derive(Clone, Copy)]
pub struct MlpWeights<'a> {
    pub activation: MlpActivation,
    /// SwiGLU's gate projection (`None` for the others).
    pub gate: Option<BlockProjection<'a>>,
    pub up: BlockProjection<'a>,
    pub down: BlockProjection<'a>,
}

impl<'a> MlpWeights<'a> {
    fn projections(&self) -> impl Iterator<Item = BlockProjection<'a>> {
        self.gate.into_iter().chain([self.up, self.down])
    }
}

/// `x + dropout(act(h)·downᵀ)` for h = `norm(x)` (pre-norm) or x itself (`norm` `None`: a
/// post-norm branch, whose norm the caller applies to the output) and the activation of `w`,
/// its products in `precision`, as one op whose parameter gradients go to `sink` (the caller
/// merges it after `backward()`) and which keeps its activations for the backward pass or
/// recomputes them there (as `memory` says for [`SubBlock::FeedForward`]).
/// `dropout` reserves the residual's mask, (p, the state of [`dropout`](crate::dropout); `p ≤
/// 0`: none), and is called only when the op runs.
///
/// `None` where the op does not run — tensors off the CPU or not f32, or an x that carries no
/// gradient (its parameters would get none) —: the caller runs the ops one by one.
pub fn mlp_block(
    x: &Tensor,
    norm: Option<BlockNorm>,
    w: MlpWeights,
    precision: Precision,
    memory: ActivationMemory,
    sink: &GradSink,
    dropout: impl FnOnce() -> (f64, u64),
) -> Result<Option<Tensor>> {
    let mut params = Opening::params(norm).into_iter().flatten();
    let mut projections = w.projections().flat_map(|p| [Some(p.weight), p.bias]).flatten();
    if !(is_host_f32(x) && x.track_op() && params.all(is_host_f32) && projections.all(is_host_f32)) {
        return Ok(None);
    }
    let d = *x.dims().last().unwrap_or(&0);
    let (ff, up_in) = w.up.weight.dims2()?;
    let fits = |p: BlockProjection, dims: (usize, usize)| {
        p.weight.dims2().is_ok_and(|w| w == dims) && p.bias.is_none_or(|b| b.dims() == [dims.0])
    };
    let gate_fits = match (w.activation, w.gate) {
        (MlpActivation::Swiglu, Some(gate)) => fits(gate, (ff, d)),
        (MlpActivation::Swiglu, None) => false,
        (_, gate) => gate.is_none(),
    };
    if !(Opening::fits(norm, d) && up_in == d && fits(w.up, (ff, d)) && fits(w.down, (d, ff)) && gate_fits) {
        let shapes = |p: Option<BlockProjection>| {
            p.map(|p| (p.weight.dims().to_vec(), p.bias.map(|b| b.dims().to_vec())))
        };
        candle_core::bail!(
            "mlp_block: input {:?}, norm {:?}, {:?} with gate {:?}, up {:?} and down {:?} (weight, \
             bias) do not fit",
            x.shape(),
            norm.map(|n| n.weight.shape()),
            w.activation,
            shapes(w.gate),
            shapes(Some(w.up)),
            shapes(Some(w.down))
        );
    }
    precision.check_cpu()?;
    let (p, state) = dropout();
    let keep = !memory.recomputes(SubBlock::FeedForward);
    let op = MlpBlockOp {
        opening: Opening::new(norm)?,
        activation: w.activation,
        gate: w.gate.map(Projection::of).transpose()?,
        up: Projection::of(w.up)?,
        down: Projection::of(w.down)?,
        dropout: DropoutOp::new(p, state),
        precision,
        gelu: GeluSlope::new(keep, precision),
        // Last, once nothing above can fail: it registers what the op owes the sink.
        between: Between::new(memory, SubBlock::FeedForward, sink, "the fused MLP block"),
    };
    Ok(Some(x.contiguous()?.apply_op1(op)?))
}

/// A projection inside the op: its weight, and its bias where it has one.
struct Projection {
    weight: Tensor,
    bias: Option<Bias>,
}

impl Projection {
    fn of(p: BlockProjection) -> Result<Self> {
        Ok(Self {
            weight: p.weight.contiguous()?,
            bias: Bias::of(p.bias)?,
        })
    }

    /// The weight's gradient `dw`, and the bias's for the gradient `g` at the output (rows of
    /// `width`).
    fn grads(&self, dw: Vec<f32>, g: &[f32], width: usize) -> Result<ParamGrads> {
        let mut grads = vec![(self.weight.clone(), cpu_tensor(dw, self.weight.shape())?)];
        grads.extend(bias_grad(self.bias.as_ref(), g, width)?);
        Ok(grads)
    }
}

/// The op of [`mlp_block`]: its parameters, and what its forward pass keeps for its backward.
struct MlpBlockOp {
    opening: Opening,
    activation: MlpActivation,
    /// SwiGLU's gate projection (`None` for the others).
    gate: Option<Projection>,
    up: Projection,
    down: Projection,
    dropout: Option<DropoutOp>,
    precision: Precision,
    /// GELU's derivative at each hidden element, from a forward pass that keeps its
    /// activations (nothing otherwise).
    gelu: GeluSlope,
    /// What the forward pass keeps (GELU's derivative with it).
    between: Between<Hidden>,
}

/// A forward pass's activations: the branch's input h (normalised x, or x; `None` where it is x
/// itself, [`Opening::kept`], which the backward pass restores), SwiGLU's two
/// projections (`None` for the others), the hidden activation the down projection reads, and
/// where ReLU's input was ≥ 0 (ReLU's only). h and the hidden activation feed only products,
/// so in bf16 they are kept rounded ([`Activation`]): half the memory, and each product reads
/// them without converting. SwiGLU reads its projections as bf16 activations are and keeps
/// them so ([`Held`]).
///
/// SwiGLU's hidden activation is not kept for the backward pass (`None` there): it is made again
/// from the two projections, which are kept anyway — one elementwise pass for a d_ff-wide
/// activation's memory (the same values: [`swiglu_output`]). GELU and ReLU keep theirs, since
/// they keep no input to make it from.
struct Hidden {
    h: Option<Activation>,
    swiglu: Option<[Held<'static>; 2]>,
    hidden: Option<Activation>,
    relu_passes: Vec<bool>,
}

impl MlpBlockOp {
    /// (rows, d, d_ff) for an input of `x`'s size.
    fn dims(&self, x: &[f32]) -> Result<(usize, usize, usize)> {
        let (ff, d) = self.up.weight.dims2()?;
        Ok((x.len() / d.max(1), d, ff))
    }

    /// The activations of x, GELU's slope kept in `gelu`.
    fn hidden(&self, x: &[f32], gelu: &GeluSlope) -> Result<Hidden> {
        let (rows, d, ff) = self.dims(x)?;
        let h = self.opening.forward_kept(x, d, self.precision)?;
        let product = |p: &Projection| {
            with_data([&p.weight], |[w]| {
                Ok(projection(&h, w, p.bias.as_ref(), (rows, d, ff)))
            })
        };
        let (hidden, swiglu, relu_passes) = match (self.activation, &self.gate) {
            (MlpActivation::Gelu, _) => (self.up_gelu(&h, gelu, (rows, d, ff))?, None, Vec::new()),
            (MlpActivation::Relu, _) => {
                let mut hidden = product(&self.up)?;
                let passes = relu_in_place(&mut hidden, true).expect("asked for");
                let hidden = match self.precision {
                    Precision::F32 => Activation::F32(hidden),
                    Precision::Bf16 => Activation::rounded(rows, ff, &hidden),
                };
                (hidden, None, passes)
            }
            (MlpActivation::Swiglu, gate) => {
                let gate = gate.as_ref().expect("SwiGLU has a gate (checked)");
                let (gate, up) = (product(gate)?, product(&self.up)?);
                let (hidden, kept) = swiglu_kept(gate, up, (rows, ff), self.precision);
                (hidden, Some(kept), Vec::new())
            }
        };
        Ok(Hidden {
            hidden: Some(hidden),
            swiglu,
            relu_passes,
            h: self.opening.kept(h),
        })
    }

    /// GELU of the up projection of h (d = (rows, width, d_ff)). In bf16 on the CPU's kernel
    /// the product is made a block of rows at a time and GELU taken of each block in cache
    /// ([`GeluSlope::forward_kept_made`]): its f32 output (4·d_ff bytes a row) never goes to
    /// memory and back. The same bits either way.
    fn up_gelu(
        &self,
        h: &Activation,
        gelu: &GeluSlope,
        (rows, width, ff): (usize, usize, usize),
    ) -> Result<Activation> {
        let up = &self.up;
        with_data([&up.weight], |[w]| {
            let Some(product) = RowsOfProduct::new(h, width, ff, Mat::rows(w, width).t()) else {
                return Ok(
                    gelu.forward_kept(&projection(h, w, up.bias.as_ref(), (rows, width, ff)), (rows, ff))
                );
            };
            Ok(gelu.forward_kept_made((rows, ff), |r, out| {
                product.rows_into(r, out);
                if let Some(bias) = &up.bias {
                    // `add_to_rows`'s sums, a block at a time.
                    for row in out.chunks_exact_mut(ff) {
                        for (y, &b) in row.iter_mut().zip(&bias.values) {
                            *y += b;
                        }
                    }
                }
            }))
        })
    }

    /// The gradients at h of the activation's projections, in the order candle reaches h
    /// through them, and their parameters' gradients, for the gradient `dh_act` at the hidden
    /// activation of x (`gelu`: where GELU's derivative was kept with `a`).
    fn projection_grads(
        &self,
        a: Hidden,
        x: &[f32],
        gelu: &GeluSlope,
        dh_act: &[f32],
        d: (usize, usize, usize),
    ) -> Result<(Vec<Vec<f32>>, ParamGrads)> {
        let Hidden {
            h,
            swiglu,
            relu_passes,
            ..
        } = a;
        let (rows, width, ff) = d;
        let h = self.opening.restored(h, x, width, self.precision)?;
        let up = &self.up;
        with_data([&up.weight], |[w_up]| match (&self.gate, swiglu) {
            (Some(gate), Some([gate_product, up_product])) => with_data([&gate.weight], |[w_gate]| {
                let (d_gate_product, d_up_product) = swiglu_grads(&gate_product, &up_product, dh_act);
                drop((gate_product, up_product));
                // candle reaches h through the up projection first, then the gate's; h is
                // dW's B for both, packed once in bf16.
                let h_b = SharedB::new(&h);
                let (dh_up, d_up) = project_grads_shared(&h_b, w_up, &d_up_product, d);
                let (dh_gate, d_gate) = project_grads_shared(&h_b, w_gate, &d_gate_product, d);
                let mut grads = gate.grads(d_gate, &d_gate_product, ff)?;
                grads.extend(up.grads(d_up, &d_up_product, ff)?);
                Ok((vec![dh_up, dh_gate], grads))
            }),
            (Some(_), None) => unreachable!("SwiGLU's forward pass keeps both projections"),
            (None, _) => {
                let d_product = match self.activation {
                    MlpActivation::Relu => Cow::Owned(relu_grad(&relu_passes, dh_act)),
                    // Without a bias the gradient feeds products alone: made rounded in bf16.
                    MlpActivation::Gelu if up.bias.is_none() => {
                        let recompute = || Ok(Cow::Owned(project_kept(&h, w_up, d)));
                        let d_product = gelu.backward_kept(dh_act, (rows, ff), recompute)?;
                        let (dh, d_up) = project_grads_of(&h, w_up, &d_product, d);
                        // No bias here, so no gradient at up's output to sum for one.
                        return Ok((vec![dh], up.grads(d_up, &[], ff)?));
                    }
                    _ => {
                        let recompute = || Ok(Cow::Owned(projection(&h, w_up, up.bias.as_ref(), d)));
                        Cow::Owned(gelu.backward(dh_act, recompute)?)
                    }
                };
                let (dh, d_up) = project_grads_kept(&h, w_up, &d_product, d);
                Ok((vec![dh], up.grads(d_up, &d_product, ff)?))
            }
        })
    }
}

impl CustomOp1 for MlpBlockOp {
    fn name(&self) -> &'static str {
        "ember-mlp-block"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = cpu_slice(s, l)?;
        let (rows, d, ff) = self.dims(x)?;
        let mut kept = self.hidden(x, &self.gelu)?;
        let hidden = kept
            .hidden
            .take()
            .expect("a forward pass makes the hidden activation");
        let down = &self.down;
        let branch = with_data([&down.weight], |[w]| {
            Ok(projection(&hidden, w, down.bias.as_ref(), (rows, ff, d)))
        })?;
        match kept.swiglu {
            None => kept.hidden = Some(hidden),
            // Made again in the backward pass; gone before the output is made.
            Some(_) => drop(hidden),
        }
        self.between.hold(kept);
        Ok((
            CpuStorage::F32(add_dropped(self.dropout, x, &branch)),
            l.shape().clone(),
        ))
    }

    /// The composition's backward passes in its order: the down projection, the activation,
    /// its projections, the norm, and x's gradients (the residual's g and the branch's) summed
    /// ([`Opening::backward`]).
    fn bwd(&self, x: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        let kept = self.between.take();
        let (dx, grads) = with_data([x, g, &self.down.weight], |[xs, gs, w_down]| {
            let (rows, d, ff) = self.dims(xs)?;
            // Recomputed, GELU's derivative is kept for the pass below, which needs it now.
            let recomputed_gelu = GeluSlope::new(true, self.precision);
            let (mut kept, gelu) = match kept {
                Some(kept) => (kept, &self.gelu),
                None => (self.hidden(xs, &recomputed_gelu)?, &recomputed_gelu),
            };
            let g_branch = branch_gradient(self.dropout, gs);
            let hidden = match (kept.hidden.take(), &kept.swiglu) {
                (Some(hidden), _) => hidden,
                (None, Some([gate, up])) => swiglu_output(gate, up, (rows, ff)),
                (None, None) => unreachable!("GELU's and ReLU's forward passes keep their hidden activation"),
            };
            let (d_hidden, d_down) = project_grads_kept(&hidden, w_down, &g_branch, (rows, ff, d));
            drop(hidden);
            let mut grads = self.down.grads(d_down, &g_branch, d)?;
            let (dh, in_grads) = self.projection_grads(kept, xs, gelu, &d_hidden, (rows, d, ff))?;
            drop(d_hidden);
            let (dx, norm_grads) = self.opening.backward(xs, dh, gs)?;
            grads.extend(in_grads);
            grads.extend(norm_grads);
            Ok((dx, grads))
        })?;
        self.between.deposit(grads);
        Ok(Some(cpu_tensor(dx, x.shape())?))
    }
}
