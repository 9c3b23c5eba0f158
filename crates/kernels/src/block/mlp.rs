//! A pre-norm feed-forward sub-block as one op: `x + dropout(act(norm(x))·W_downᵀ)`, with act
//! GELU of one projection, `gelu(h·W_upᵀ)`, or SwiGLU of two, `silu(h·W_gateᵀ) ⊙ h·W_upᵀ`.
//!
//! The composition is three or four ops (the norm, [`linear_gelu_in`](crate::linear_gelu_in) or
//! two [`linear_in`](crate::linear_in)s and [`swiglu_in`](crate::swiglu_in),
//! [`linear_residual_in`](crate::linear_residual_in)), and candle's backward pass zero-fills and adds a
//! gradient for each of their inputs: x twice, the normalised h once or twice, the hidden
//! activations (d_ff wide, four times the stream for GELU, three of them for SwiGLU) and every
//! parameter, per pass. As one op with x its only candle input, only x's remains; the
//! activations live inside the op from its forward to its backward pass, and the parameters'
//! gradients go to a [`GradSink`].
//!
//! The op runs the same kernels on the same operands in the same order as the composition, so
//! its output and x's gradient have the composition's bits and each parameter's gradient equals
//! it (up to the sign of an exact zero, which candle's `0 + g` makes positive: a zero gradient
//! moves no parameter either way).

use std::borrow::Cow;

use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};

use crate::activation::{swiglu_grads, swiglu_kept, swiglu_output, GeluSlope};
use crate::block::{branch_gradient, ActivationMemory, Between, BlockNorm, GradSink, HeldNorm, SubBlock};
use crate::dropout::{add_dropped, DropoutOp};
use crate::gemm::{Activation, SharedB};
use crate::held::Held;
use crate::host::{cpu_slice, cpu_tensor, is_host_f32, with_data};
use crate::linear::{project_grads_kept, project_grads_of, project_grads_shared, project_kept};
use crate::simd::add_in_place;
use crate::Precision;

/// A feed-forward sub-block's projections, (out, in) each: up (and gate) (d_ff, D), down (D, d_ff).
#[derive(Clone, Copy)]
pub enum MlpWeights<'a> {
    /// `gelu_erf(h·upᵀ)·downᵀ`.
    Gelu { up: &'a Tensor, down: &'a Tensor },
    /// `(silu(h·gateᵀ) ⊙ h·upᵀ)·downᵀ`.
    Swiglu {
        gate: &'a Tensor,
        up: &'a Tensor,
        down: &'a Tensor,
    },
}

impl<'a> MlpWeights<'a> {
    fn gate(&self) -> Option<&'a Tensor> {
        match self {
            MlpWeights::Gelu { .. } => None,
            MlpWeights::Swiglu { gate, .. } => Some(gate),
        }
    }
    fn up(&self) -> &'a Tensor {
        match self {
            MlpWeights::Gelu { up, .. } | MlpWeights::Swiglu { up, .. } => up,
        }
    }
    fn down(&self) -> &'a Tensor {
        match self {
            MlpWeights::Gelu { down, .. } | MlpWeights::Swiglu { down, .. } => down,
        }
    }
}

/// `x + dropout(act(norm(x))·downᵀ)` for the activation of `w`, its products in `precision`, as
/// one op whose parameter gradients go to `sink` (the caller merges it after `backward()`) and
/// which keeps its activations for the backward pass or recomputes them there (as `memory`
/// says for [`SubBlock::FeedForward`]).
/// `dropout` reserves the residual's mask, (p, the state of [`dropout`](crate::dropout); `p ≤
/// 0`: none), and is called only when the op runs.
///
/// `None` where the op does not run — tensors off the CPU or not f32, or an x that carries no
/// gradient (its parameters would get none) —: the caller runs the ops one by one.
pub fn mlp_block(
    x: &Tensor,
    norm: BlockNorm,
    w: MlpWeights,
    precision: Precision,
    memory: ActivationMemory,
    sink: &GradSink,
    dropout: impl FnOnce() -> (f64, u64),
) -> Result<Option<Tensor>> {
    let params = [
        Some(norm.weight),
        norm.bias,
        w.gate(),
        Some(w.up()),
        Some(w.down()),
    ];
    if !(is_host_f32(x) && x.track_op() && params.iter().flatten().all(|t| is_host_f32(t))) {
        return Ok(None);
    }
    let d = norm.weight.elem_count();
    let (ff, up_in) = w.up().dims2()?;
    let gate_fits = w
        .gate()
        .is_none_or(|g| g.dims2().is_ok_and(|dims| dims == (ff, d)));
    if x.dims().last() != Some(&d) || up_in != d || w.down().dims2()? != (d, ff) || !gate_fits {
        candle_core::bail!(
            "mlp_block: input {:?}, norm {:?}, gate {:?}, up {:?} and down {:?} do not fit",
            x.shape(),
            norm.weight.shape(),
            w.gate().map(Tensor::shape),
            w.up().shape(),
            w.down().shape()
        );
    }
    precision.check_cpu()?;
    let (p, state) = dropout();
    let keep = !memory.recomputes(SubBlock::FeedForward);
    let op = MlpBlockOp {
        norm: HeldNorm::new(norm)?,
        gate: w.gate().map(Tensor::contiguous).transpose()?,
        up: w.up().contiguous()?,
        down: w.down().contiguous()?,
        dropout: DropoutOp::new(p, state),
        precision,
        gelu: GeluSlope::new(keep, precision),
        // Last, once nothing above can fail: it registers what the op owes the sink.
        between: Between::new(memory, SubBlock::FeedForward, sink, "the fused MLP block"),
    };
    Ok(Some(x.contiguous()?.apply_op1(op)?))
}

/// The op of [`mlp_block`]: its parameters, and what its forward pass keeps for its backward.
struct MlpBlockOp {
    norm: HeldNorm,
    /// SwiGLU's gate projection (`None`: GELU).
    gate: Option<Tensor>,
    up: Tensor,
    down: Tensor,
    dropout: Option<DropoutOp>,
    precision: Precision,
    /// GELU's derivative at each hidden element, from a forward pass that keeps its
    /// activations (nothing otherwise).
    gelu: GeluSlope,
    /// What the forward pass keeps (GELU's derivative with it).
    between: Between<Hidden>,
}

/// A forward pass's activations: the normalised input h, SwiGLU's two projections (`None` for
/// GELU), and the hidden activation the down projection reads. h and the hidden activation feed
/// only products, so in bf16 they are kept rounded ([`Activation`]): half the memory, and each
/// product reads them without converting. SwiGLU reads its projections as bf16 activations are
/// and keeps them so ([`Held`]).
///
/// SwiGLU's hidden activation is not kept for the backward pass (`None` there): it is made again
/// from the two projections, which are kept anyway — one elementwise pass for a d_ff-wide
/// activation's memory (the same values: [`swiglu_output`]). GELU keeps its hidden activation,
/// since it keeps no input to make it from.
struct Hidden {
    h: Activation,
    swiglu: Option<[Held<'static>; 2]>,
    hidden: Option<Activation>,
}

impl MlpBlockOp {
    /// (rows, d, d_ff) for an input of `x`'s size.
    fn dims(&self, x: &[f32]) -> Result<(usize, usize, usize)> {
        let (ff, d) = self.up.dims2()?;
        Ok((x.len() / d.max(1), d, ff))
    }

    /// The activations of x, GELU's slope kept in `gelu`.
    fn hidden(&self, x: &[f32], gelu: &GeluSlope) -> Result<Hidden> {
        let (rows, d, ff) = self.dims(x)?;
        let h = self.norm.forward_kept(x, self.precision)?;
        let product = |w: &Tensor| with_data([w], |[w]| Ok(project_kept(&h, w, (rows, d, ff))));
        Ok(match &self.gate {
            None => Hidden {
                hidden: Some(gelu.forward_kept(&product(&self.up)?, (rows, ff))),
                swiglu: None,
                h,
            },
            Some(gate) => {
                let (gate, up) = (product(gate)?, product(&self.up)?);
                let (hidden, kept) = swiglu_kept(gate, up, (rows, ff), self.precision);
                Hidden {
                    hidden: Some(hidden),
                    swiglu: Some(kept),
                    h,
                }
            }
        })
    }

    /// The gradients at h of the activation's projections, and their weights' gradients (the
    /// gate's first), for the gradient `dh_act` at the hidden activation (`gelu`: where GELU's
    /// derivative was kept with `a`).
    fn projection_grads(
        &self,
        a: Hidden,
        gelu: &GeluSlope,
        dh_act: &[f32],
        d: (usize, usize, usize),
    ) -> Result<(Vec<f32>, Vec<Vec<f32>>)> {
        let Hidden { h, swiglu, .. } = a;
        with_data([&self.up], |[w_up]| match (&self.gate, swiglu) {
            (Some(_), None) => unreachable!("SwiGLU's forward pass keeps both projections"),
            (Some(w_gate), Some([gate, up])) => with_data([w_gate], |[w_gate]| {
                let (d_gate_product, d_up_product) = swiglu_grads(&gate, &up, dh_act);
                drop((gate, up));
                // candle reaches h through the up projection first, then the gate's; h is
                // dW's B for both, packed once in bf16.
                let h_b = SharedB::new(&h);
                let (mut dh, d_up) = project_grads_shared(&h_b, w_up, &d_up_product, d);
                let (dh_gate, d_gate) = project_grads_shared(&h_b, w_gate, &d_gate_product, d);
                add_in_place(&mut dh, &dh_gate);
                Ok((dh, vec![d_gate, d_up]))
            }),
            (None, _) => {
                let recompute = || Ok(Cow::Owned(project_kept(&h, w_up, d)));
                let (rows, _, ff) = d;
                let d_product = gelu.backward_kept(dh_act, (rows, ff), recompute)?;
                let (dh, d_up) = project_grads_of(&h, w_up, &d_product, d);
                Ok((dh, vec![d_up]))
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
        let branch = with_data([&self.down], |[down]| {
            Ok(project_kept(&hidden, down, (rows, ff, d)))
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
    /// its projections, the norm, and x's two gradients (the residual's g and the norm's)
    /// summed.
    fn bwd(&self, x: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        let kept = self.between.take();
        let (dx, grads) = with_data([x, g, &self.down], |[xs, gs, down]| {
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
                (None, None) => unreachable!("GELU's forward pass keeps its hidden activation"),
            };
            let (d_hidden, d_down) = project_grads_kept(&hidden, down, &g_branch, (rows, ff, d));
            drop(hidden);
            let (dh, d_in) = self.projection_grads(kept, gelu, &d_hidden, (rows, d, ff))?;
            drop(d_hidden);
            let (dx, norm_grads) = self.norm.backward(xs, &dh, Some(gs))?;
            let mut grads = vec![(self.down.clone(), cpu_tensor(d_down, self.down.shape())?)];
            for (param, grad) in self.gate.iter().chain([&self.up]).zip(d_in) {
                grads.push((param.clone(), cpu_tensor(grad, param.shape())?));
            }
            grads.extend(norm_grads);
            Ok((dx, grads))
        })?;
        self.between.deposit(grads);
        Ok(Some(cpu_tensor(dx, x.shape())?))
    }
}
