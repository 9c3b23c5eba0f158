//! One block of a stack: self-attention, cross-attention (seq2seq decoder layers only) and the
//! MLP, each a residual branch around its norm; in training, sub-blocks run as one op each where
//! they can (`ember_kernels::attention_block`, `cross_attention_block`, `mlp_block`: a pre-norm
//! sub-block whole, a post-norm one's residual branch with its norm after it), and the ops one
//! by one otherwise. A decoder block's cross-attention reads the
//! encoded source, a [`Memory`].

use candle_core::{Result, Tensor};
use candle_nn::VarBuilder;
use ember_kernels::SubBlock;

use crate::attention::{Attention, CrossKv, KvCache};
use crate::config::{ModelConfig, NormPlacement};
use crate::layers::{ForwardCtx, Mlp, Norm, Residual};
use crate::rope::Rotary;

/// An encoded source: the encoder's output and the mask of its real positions.
#[derive(Clone)]
pub struct Memory {
    /// (B, S, D).
    pub hidden: Tensor,
    /// Additive key mask (B, 1, 1, S), or `None` when the batch has no padding.
    pub mask: Option<Tensor>,
}

impl Memory {
    /// Keeps batch rows `rows` (beam search expanding or pruning hypotheses).
    pub fn select(&self, rows: &Tensor) -> Result<Self> {
        Ok(Self {
            hidden: self.hidden.index_select(rows, 0)?,
            mask: self.mask.as_ref().map(|m| m.index_select(rows, 0)).transpose()?,
        })
    }
}

/// One layer's incremental-decoding state: its self-attention cache, and the cross-attention
/// keys/values of the source (computed on the first step).
#[derive(Clone, Default)]
pub(crate) struct LayerCache {
    pub(crate) self_kv: KvCache,
    pub(crate) cross_kv: Option<CrossKv>,
}

/// One block: self-attention, cross-attention (seq2seq decoder layers only), MLP — each
/// `x + branch(norm(x))` (pre-norm) or `norm(x + branch(x))` (post-norm). Encoder layers and
/// decoder layers differ only in the cross-attention and in the mask they are given (padding
/// vs causal).
pub(crate) struct Layer {
    attn_norm: Norm,
    self_attn: Attention,
    cross: Option<(Norm, Attention)>,
    mlp_norm: Norm,
    mlp: Mlp,
    /// Dropout on each branch's output, applied in the residual add.
    dropout: f64,
    placement: NormPlacement,
}

impl Layer {
    pub(crate) fn new(
        vb: VarBuilder,
        cfg: &ModelConfig,
        rotary: Option<&Rotary>,
        logn_length: Option<usize>,
        out_std: f64,
        cross: bool,
    ) -> Result<Self> {
        let norm = |name: &str| Norm::new(vb.pp(name), cfg.norm, cfg.d_model, cfg.norm_eps, cfg.norm_bias);
        let cross = if cross {
            Some((
                norm("cross_attn_norm")?,
                Attention::new(vb.pp("cross_attn"), cfg, None, None, out_std)?,
            ))
        } else {
            None
        };
        Ok(Self {
            attn_norm: norm("attn_norm")?,
            self_attn: Attention::new(vb.pp("self_attn"), cfg, rotary.cloned(), logn_length, out_std)?,
            cross,
            mlp_norm: norm("mlp_norm")?,
            mlp: Mlp::new(vb.pp("mlp"), cfg, out_std)?,
            dropout: cfg.dropout,
            placement: cfg.norm_placement,
        })
    }

    /// The norm a sub-block's op opens its branch with: `norm` for pre-norm, none for post-norm
    /// (whose norm [`Self::closing`] applies to the op's output).
    fn opening<'a>(&self, norm: &'a Norm) -> Option<&'a Norm> {
        match self.placement {
            NormPlacement::Pre => Some(norm),
            NormPlacement::Post => None,
        }
    }

    /// A sub-block's output from its op's, `out` (`x + branch`): itself for pre-norm, its norm
    /// for post-norm.
    fn closing(&self, norm: &Norm, out: Tensor) -> Result<Tensor> {
        match self.placement {
            NormPlacement::Pre => Ok(out),
            NormPlacement::Post => norm.forward(&out),
        }
    }

    /// One residual branch around `norm`: `branch` gets its input and the stream to write into.
    fn sublayer(
        &self,
        norm: &Norm,
        x: &Tensor,
        ctx: ForwardCtx,
        branch: impl FnOnce(&Tensor, Residual) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let into = Residual {
            stream: x,
            dropout: self.dropout,
        };
        match self.placement {
            NormPlacement::Pre => branch(&norm.forward_as(x, ctx.branch_dtype_of(x))?, into),
            NormPlacement::Post => norm.forward(&branch(x, into)?),
        }
    }

    pub(crate) fn forward(
        &self,
        x: &Tensor,
        self_mask: Option<&Tensor>,
        memory: Option<&Memory>,
        cache: Option<&mut LayerCache>,
        ctx: ForwardCtx,
    ) -> Result<Tensor> {
        let (self_kv, cross_kv) = match cache {
            Some(c) => (Some(&mut c.self_kv), Some(&mut c.cross_kv)),
            None => (None, None),
        };
        let fused = match &self_kv {
            None => {
                let (norm, dropout) = (self.opening(&self.attn_norm), self.dropout);
                self.self_attn
                    .forward_self_fused(norm, x, self_mask, dropout, ctx)?
                    .map(|out| self.closing(&self.attn_norm, out))
                    .transpose()?
            }
            Some(_) => None,
        };
        let recomputing = |sub| ctx.grad_sink.is_some() && ctx.activations.recomputes(sub);
        if recomputing(SubBlock::Attention) && fused.is_none() {
            return refuse_unfused(ctx, "self-attention");
        }
        let x = match fused {
            Some(x) => x,
            None => self.sublayer(&self.attn_norm, x, ctx, |h, into| {
                self.self_attn.forward_self(h, into, self_mask, self_kv, ctx)
            })?,
        };
        let x = match (&self.cross, memory) {
            (Some(cross), Some(memory)) => {
                let recomputing = recomputing(SubBlock::Attention);
                self.cross_sublayer(cross, &x, memory, cross_kv, recomputing, ctx)?
            }
            (Some(_), None) => candle_core::bail!("a seq2seq decoder needs the encoder output"),
            (None, _) => x,
        };
        let norm = self.opening(&self.mlp_norm);
        if let Some(out) = self.mlp.forward_fused(norm, &x, self.dropout, ctx)? {
            return self.closing(&self.mlp_norm, out);
        }
        if recomputing(SubBlock::FeedForward) {
            return refuse_unfused(ctx, "feed-forward sub-block");
        }
        self.sublayer(&self.mlp_norm, &x, ctx, |h, into| self.mlp.forward(h, into, ctx))
    }

    /// The cross-attention sub-block over `x`, attending to `memory`: as one op in a training
    /// pass where the op runs, else op by op (`recomputing`: refused then), the keys and values
    /// kept in the cache's `slot` where decoding keeps them.
    fn cross_sublayer(
        &self,
        (norm, attn): &(Norm, Attention),
        x: &Tensor,
        memory: &Memory,
        slot: Option<&mut Option<CrossKv>>,
        recomputing: bool,
        ctx: ForwardCtx,
    ) -> Result<Tensor> {
        let mask = memory.mask.as_ref();
        // Keys and values in the branch's dtype: a bf16 branch's from the f32 encoder output
        // rounded once (what bf16 products read of it anyway).
        let kv_as = |dtype| attn.cross_kv(&memory.hidden.to_dtype(dtype)?, ctx);
        if let Some(slot) = slot {
            return self.sublayer(norm, x, ctx, |h, into| {
                if slot.is_none() {
                    *slot = Some(kv_as(h.dtype())?);
                }
                let kv = slot.as_ref().expect("filled above");
                attn.forward_cross(h, kv, into, mask, ctx)
            });
        }
        // Made before the op is tried, in the dtype of the branch's input (the norm's under
        // pre-norm, x's under post-norm), and reused op by op where it does not run.
        let kv = match self.placement {
            NormPlacement::Pre => kv_as(ctx.branch_dtype_of(x))?,
            NormPlacement::Post => kv_as(x.dtype())?,
        };
        let opening = self.opening(norm);
        if let Some(out) = attn.forward_cross_fused(opening, x, &kv, mask, self.dropout, ctx)? {
            return self.closing(norm, out);
        }
        if recomputing {
            return refuse_unfused(ctx, "cross-attention");
        }
        self.sublayer(norm, x, ctx, |h, into| {
            attn.forward_cross(h, &kv, into, mask, ctx)
        })
    }
}

/// A sub-block that is not one op would keep its activations: the user asked for less. Runs
/// refuse such a model before any pass, naming why (`ModelConfig::unfused_sub_blocks`); this
/// guards a pass that was not told.
fn refuse_unfused<T>(ctx: ForwardCtx, what: &str) -> Result<T> {
    candle_core::bail!(
        "train.activations: {}: this model's {what} does not run as one op, so it cannot \
         recompute its activations. Set train.activations: keep.",
        ctx.activations
    )
}
