//! A pre-norm feed-forward sub-block, `x + dropout(gelu(norm(x)·W_upᵀ)·W_downᵀ)`, as one op.
//!
//! Today's composition is three ops (the norm, [`linear_gelu`](crate::linear_gelu),
//! [`linear_residual`](crate::linear_residual)), and candle's backward pass zero-fills and adds a
//! gradient for each of their inputs: x twice, the normalised h, the hidden u (d_ff wide, four
//! times the stream) and five parameters, per pass. As one op with x its only candle input,
//! only x's remains; h, u and GELU's slope live inside the op from its forward to its backward
//! pass, and the parameters' gradients go to a [`GradSink`].
//!
//! The op runs the same kernels on the same operands in the same order as the composition, so
//! its output and x's gradient have the composition's bits and each parameter's gradient equals
//! it (up to the sign of an exact zero, which candle's `0 + g` makes positive: a zero gradient
//! moves no parameter either way).

use std::borrow::Cow;
use std::sync::Mutex;

use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};

use crate::activation::GeluSlope;
use crate::block::GradSink;
use crate::dropout::{add_dropped, dropout_apply, DropoutOp};
use crate::host::{cpu_slice, cpu_tensor, is_host_f32, with_all_data, with_data};
use crate::linear::{project, project_grads};
use crate::norm::NormOp;
use crate::Precision;

/// The norm that opens a block's branch: its gain, its bias (LayerNorm with one) and epsilon.
#[derive(Clone, Copy)]
pub struct BlockNorm<'a> {
    pub weight: &'a Tensor,
    pub bias: Option<&'a Tensor>,
    /// RMSNorm (no bias); LayerNorm otherwise.
    pub rms: bool,
    pub eps: f64,
}

impl BlockNorm<'_> {
    /// The norm on its own, as the model runs it outside a fused block.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self.rms {
            true => crate::rms_norm(x, self.weight, self.eps),
            false => crate::layer_norm(x, self.weight, self.bias, self.eps),
        }
    }
}

/// `x + dropout(gelu_erf(norm(x)·upᵀ)·downᵀ)` with the dropout mask of
/// [`dropout`](crate::dropout) at `state` (`p ≤ 0`: none) and the products in `precision`.
///
/// With a `sink`, on CPU f32 tensors whose x carries a gradient, one op whose parameter
/// gradients go to the sink (the caller merges it after `backward()`). Otherwise — no sink, or
/// another device or dtype — the ops one by one, with the same bits.
#[allow(clippy::too_many_arguments)] // the block's parameters, its dropout and where its gradients go
pub fn mlp_block(
    x: &Tensor,
    norm: BlockNorm,
    up: &Tensor,
    down: &Tensor,
    (p, state): (f64, u64),
    precision: Precision,
    sink: Option<&GradSink>,
) -> Result<Tensor> {
    let params = [Some(norm.weight), norm.bias, Some(up), Some(down)];
    let fusable = is_host_f32(x) && x.track_op() && params.iter().flatten().all(|t| is_host_f32(t));
    let Some(sink) = sink.filter(|_| fusable) else {
        let hidden = crate::linear_gelu_in(&norm.forward(x)?, up, precision)?;
        return crate::linear_residual_in(x, &hidden, down, p, state, precision);
    };
    let d = norm.weight.elem_count();
    let (ff, up_in) = up.dims2()?;
    if x.dims().last() != Some(&d) || up_in != d || down.dims2()? != (d, ff) {
        candle_core::bail!(
            "mlp_block: input {:?}, norm {:?}, up {:?} and down {:?} do not fit",
            x.shape(),
            norm.weight.shape(),
            up.shape(),
            down.shape()
        );
    }
    precision.check_cpu()?;
    let op = MlpBlockOp {
        norm: NormOp::f32(norm.rms, norm.eps),
        norm_weight: norm.weight.contiguous()?,
        norm_bias: norm.bias.map(Tensor::contiguous).transpose()?,
        up: up.contiguous()?,
        down: down.contiguous()?,
        dropout: DropoutOp::new(p, state),
        precision,
        gelu: GeluSlope::new(true),
        kept: Mutex::new(None),
        id: sink.register(format!("the fused MLP block of input {:?}", x.shape())),
        sink: sink.clone(),
    };
    x.contiguous()?.apply_op1(op)
}

/// The op of [`mlp_block`]: its parameters, and what its forward pass keeps for its backward.
struct MlpBlockOp {
    norm: NormOp,
    norm_weight: Tensor,
    norm_bias: Option<Tensor>,
    up: Tensor,
    down: Tensor,
    dropout: Option<DropoutOp>,
    precision: Precision,
    /// GELU's derivative at each hidden element, from the forward pass.
    gelu: GeluSlope,
    /// The forward pass's normalised input h and hidden u = gelu(h·upᵀ), taken by the backward
    /// pass (a second backward pass recomputes them).
    kept: Mutex<Option<(Vec<f32>, Vec<f32>)>>,
    sink: GradSink,
    /// This op's entry in the sink.
    id: u64,
}

impl MlpBlockOp {
    /// (rows, d, d_ff) for an input of `x`'s size.
    fn dims(&self, x: &[f32]) -> Result<(usize, usize, usize)> {
        let (ff, d) = self.up.dims2()?;
        Ok((x.len() / d.max(1), d, ff))
    }

    /// (h, u): the normalised input and the hidden activation, GELU's slope kept in `gelu`.
    fn hidden(&self, x: &[f32], gelu: &GeluSlope) -> Result<(Vec<f32>, Vec<f32>)> {
        let (rows, d, ff) = self.dims(x)?;
        let norm_params: Vec<&Tensor> = [Some(&self.norm_weight), self.norm_bias.as_ref()]
            .into_iter()
            .flatten()
            .collect();
        let h = with_all_data(&norm_params, |p| self.norm.forward(x, p[0], p.get(1).copied()))?;
        let u = with_data([&self.up], |[up]| {
            Ok(gelu.forward(&project(&h, up, (rows, d, ff), self.precision)))
        })?;
        Ok((h, u))
    }
}

impl CustomOp1 for MlpBlockOp {
    fn name(&self) -> &'static str {
        "ember-mlp-block"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = cpu_slice(s, l)?;
        let (rows, d, ff) = self.dims(x)?;
        let (h, u) = self.hidden(x, &self.gelu)?;
        let branch = with_data([&self.down], |[down]| {
            Ok(project(&u, down, (rows, ff, d), self.precision))
        })?;
        *self.kept.lock().unwrap_or_else(|e| e.into_inner()) = Some((h, u));
        Ok((
            CpuStorage::F32(add_dropped(self.dropout, x, &branch)),
            l.shape().clone(),
        ))
    }

    /// The composition's backward passes in its order: the down projection, GELU, the up
    /// projection, the norm, and x's two gradients (the residual's g and the norm's) summed.
    fn bwd(&self, x: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner()).take();
        let norm_weight = &self.norm_weight;
        let (dx, grads) = with_data(
            [x, g, &self.up, &self.down, norm_weight],
            |[xs, gs, up, down, w]| {
                let (rows, d, ff) = self.dims(xs)?;
                let (h, u) = match kept {
                    Some(kept) => kept,
                    None => self.hidden(xs, &GeluSlope::new(false))?,
                };
                let g_branch = match self.dropout {
                    Some(mask) => Cow::Owned(dropout_apply(mask, gs)),
                    None => Cow::Borrowed(gs),
                };
                let (du, d_down) = project_grads(&u, down, &g_branch, (rows, ff, d), self.precision);
                drop(u);
                let recompute = || Ok(Cow::Owned(project(&h, up, (rows, d, ff), self.precision)));
                let d_product = self.gelu.backward(&du, recompute)?;
                drop(du);
                let (dh, d_up) = project_grads(&h, up, &d_product, (rows, d, ff), self.precision);
                drop((h, d_product));
                let (dx, dw, db) = self.norm.backward_adding(xs, w, &dh, Some(gs));
                let mut grads = vec![
                    (self.down.clone(), cpu_tensor(d_down, self.down.shape())?),
                    (self.up.clone(), cpu_tensor(d_up, self.up.shape())?),
                    (norm_weight.clone(), cpu_tensor(dw, norm_weight.shape())?),
                ];
                if let Some(b) = &self.norm_bias {
                    grads.push((b.clone(), cpu_tensor(db, b.shape())?));
                }
                Ok((dx, grads))
            },
        )?;
        self.sink.deposit(self.id, grads);
        Ok(Some(cpu_tensor(dx, x.shape())?))
    }
}
