//! Whole sub-blocks of a transformer layer as one op each, their parameters' gradients handed
//! to a [`GradSink`] instead of through candle's graph.
//!
//! Each op of a composition costs candle's backward pass a zero-filled gradient buffer per input
//! and an add into it; at nanoGPT's standard shape these were 14% of the bf16 step
//! (docs/performance.md, twelfth session). A sub-block op's candle inputs are the residual
//! stream alone (self-attention, the feed-forward block) or with the keys and values it reads
//! (a decoder's cross-attention), so the buffers of its inner activations and parameters go.

use std::borrow::Cow;
use std::sync::Mutex;

use candle_core::{Result, Tensor};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::attention::take;
use crate::dropout::{dropout_apply, DropoutOp};
use crate::gemm::Activation;

use crate::host::{cpu_tensor, with_all_data, with_data};
use crate::norm::NormOp;
use crate::simd::add_in_place;
use crate::Precision;

mod attention;
mod cross_attention;
mod mlp;
mod sink;

pub use attention::{attention_block, AttentionWeights, BlockPositions};
pub use cross_attention::{cross_attention_block, CrossAttentionWeights};
pub use mlp::{mlp_block, BlockProjection, MlpActivation, MlpWeights};
pub use sink::GradSink;

/// What a sub-block op holds from its forward pass to its backward pass (`train.activations`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ActivationMemory {
    /// Every activation the backward pass reads, held from the forward pass: the fastest.
    #[default]
    Keep,
    /// Each sub-block's input alone (held for any op; a post-norm sub-block's caller holds the
    /// op's output too, its norm's input): the backward pass computes the rest
    /// again with the same kernels on the same operands, so the gradients have `keep`'s bits.
    /// Most of a step's activation memory, for about one more forward pass of the sub-blocks.
    Recompute,
    /// The attention sub-blocks recompute as `recompute` does, the feed-forward ones keep:
    /// the same bits again. Where the attention sub-blocks hold most of the activations per
    /// unit of compute (many heads and long rows against a narrow feed-forward block), most of
    /// `recompute`'s saving for a fraction of its time.
    RecomputeAttention,
}

/// The two kinds of sub-block of a transformer layer, as [`ActivationMemory`] treats them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubBlock {
    /// Self-attention (and a decoder's cross-attention).
    Attention,
    /// The feed-forward block (MLP).
    FeedForward,
}

impl ActivationMemory {
    /// Every setting, `keep` first.
    pub const ALL: [ActivationMemory; 3] = [
        ActivationMemory::Keep,
        ActivationMemory::Recompute,
        ActivationMemory::RecomputeAttention,
    ];

    /// Whether sub-blocks of kind `sub` compute their activations again in the backward pass.
    pub fn recomputes(self, sub: SubBlock) -> bool {
        match self {
            ActivationMemory::Keep => false,
            ActivationMemory::Recompute => true,
            ActivationMemory::RecomputeAttention => sub == SubBlock::Attention,
        }
    }

    /// The value as a config spells it.
    pub fn name(self) -> &'static str {
        match self {
            ActivationMemory::Keep => "keep",
            ActivationMemory::Recompute => "recompute",
            ActivationMemory::RecomputeAttention => "recompute_attention",
        }
    }
}

impl std::fmt::Display for ActivationMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The norm that opens a block's branch: its gain, its bias (LayerNorm with one) and epsilon.
#[derive(Clone, Copy)]
pub struct BlockNorm<'a> {
    pub weight: &'a Tensor,
    pub bias: Option<&'a Tensor>,
    /// RMSNorm (which takes no bias: the ops refuse one); LayerNorm otherwise.
    pub rms: bool,
    pub eps: f64,
}

/// The gradient at a residual branch's output for the gradient `g` at the block's output: g
/// through the branch's dropout mask, or g itself without dropout.
pub(crate) fn branch_gradient(mask: Option<DropoutOp>, g: &[f32]) -> Cow<'_, [f32]> {
    match mask {
        Some(mask) => Cow::Owned(dropout_apply(mask, g)),
        None => Cow::Borrowed(g),
    }
}

/// (parameter, gradient) pairs, as a block op deposits them in its sink.
pub(crate) type ParamGrads = Vec<(Tensor, Tensor)>;

/// What a sub-block op carries from its forward pass to its backward pass: whether it keeps its
/// activations `K` (else the backward pass recomputes them), the slot they wait in, and its
/// entry in the sink its parameters' gradients go to.
pub(crate) struct Between<K> {
    keep: bool,
    /// The forward pass's activations, taken by the backward pass (which recomputes them where
    /// they were not kept, or were taken by a backward pass before).
    kept: Mutex<Option<K>>,
    sink: GradSink,
    /// This op's entry in the sink.
    id: u64,
}

impl<K> Between<K> {
    /// For an op of kind `sub` under `memory`, owing `sink` its gradients as `what` (made once
    /// nothing else of the op can fail: the sink refuses to merge while an op owes it).
    pub(crate) fn new(memory: ActivationMemory, sub: SubBlock, sink: &GradSink, what: &'static str) -> Self {
        Self {
            keep: !memory.recomputes(sub),
            kept: Mutex::new(None),
            id: sink.register(what),
            sink: sink.clone(),
        }
    }

    /// Whether the forward pass keeps its activations.
    pub(crate) fn keeps(&self) -> bool {
        self.keep
    }

    /// What a pass holds the values it makes in, under products in `precision`: that
    /// precision for a `forward` pass that keeps them for the backward pass ([`Held`]), f32
    /// for one that does not or for a recomputation, which uses them at once.
    ///
    /// [`Held`]: crate::held::Held
    pub(crate) fn holds_in(&self, precision: Precision, forward: bool) -> Precision {
        if forward && self.keep {
            precision
        } else {
            Precision::F32
        }
    }

    /// Holds a forward pass's activations for the backward pass, where they are kept.
    pub(crate) fn hold(&self, kept: K) {
        if self.keep {
            *self.kept.lock().unwrap_or_else(|e| e.into_inner()) = Some(kept);
        }
    }

    /// The activations held for this backward pass, taken (`None`: recompute them).
    pub(crate) fn take(&self) -> Option<K> {
        take(&self.kept)
    }

    /// Hands the parameters' gradients to the sink.
    pub(crate) fn deposit(&self, grads: ParamGrads) {
        self.sink.deposit(self.id, grads);
    }
}

/// A norm inside a block op: its kind, epsilon and parameters.
pub(crate) struct HeldNorm {
    op: NormOp,
    weight: Tensor,
    bias: Option<Tensor>,
}

impl HeldNorm {
    pub(crate) fn new(norm: BlockNorm) -> Result<Self> {
        if norm.rms && norm.bias.is_some() {
            candle_core::bail!("a block's RMSNorm takes no bias (LayerNorm does)");
        }
        Ok(Self {
            op: NormOp::f32(norm.rms, norm.eps),
            weight: norm.weight.contiguous()?,
            bias: norm.bias.map(Tensor::contiguous).transpose()?,
        })
    }

    fn params(&self) -> Vec<&Tensor> {
        std::iter::once(&self.weight).chain(&self.bias).collect()
    }

    /// The normalised vectors of x.
    pub(crate) fn forward(&self, x: &[f32]) -> Result<Vec<f32>> {
        with_all_data(&self.params(), |p| self.op.forward(x, p[0], p.get(1).copied()))
    }

    /// The normalised vectors of x kept for products in `precision` (they feed nothing else):
    /// in bf16 each block of rows is rounded as the norm makes it, so the f32 vectors never go
    /// to memory; the values [`Self::forward`] gives.
    pub(crate) fn forward_kept(&self, x: &[f32], precision: Precision) -> Result<Activation> {
        if precision == Precision::F32 {
            return Ok(Activation::F32(self.forward(x)?));
        }
        with_all_data(&self.params(), |p| {
            let (w, b) = (p[0], p.get(1).copied());
            let d = NormOp::row_width(x, w)?;
            Ok(Activation::rounded_with(x.len() / d, d, |rows, out| {
                self.op.forward_into(&x[rows.start * d..rows.end * d], w, b, out)
            }))
        })
    }

    /// x's gradient for the gradient g at the output (plus `residual`, a gradient that reaches x
    /// around the norm, added as candle adds it), and each parameter's.
    pub(crate) fn backward(
        &self,
        x: &[f32],
        g: &[f32],
        residual: Option<&[f32]>,
    ) -> Result<(Vec<f32>, ParamGrads)> {
        let (dx, dw, db) = with_data([&self.weight], |[w]| {
            Ok(self.op.backward_adding(x, w, g, residual))
        })?;
        let mut grads = vec![(self.weight.clone(), cpu_tensor(dw, self.weight.shape())?)];
        if let Some(b) = &self.bias {
            grads.push((b.clone(), cpu_tensor(db, b.shape())?));
        }
        Ok((dx, grads))
    }
}

/// What opens a sub-block's branch: the norm of x (pre-norm), or x itself (post-norm, whose
/// norm comes after the op: the caller applies it to the op's output, `norm(x + branch(x))`).
pub(crate) struct Opening(Option<HeldNorm>);

impl Opening {
    /// The branch's opening for `norm` (`None`: post-norm, the branch reads x).
    pub(crate) fn new(norm: Option<BlockNorm>) -> Result<Self> {
        Ok(Self(norm.map(HeldNorm::new).transpose()?))
    }

    /// The norm's gain and bias (nothing for x itself).
    pub(crate) fn params(norm: Option<BlockNorm<'_>>) -> [Option<&Tensor>; 2] {
        match norm {
            Some(norm) => [Some(norm.weight), norm.bias],
            None => [None, None],
        }
    }

    /// Whether the norm (where there is one) takes vectors of `d`.
    pub(crate) fn fits(norm: Option<BlockNorm>, d: usize) -> bool {
        norm.is_none_or(|norm| norm.weight.elem_count() == d)
    }

    /// The branch's input h of x (rows of `d`), kept for products in `precision` (it feeds
    /// nothing else): the norm's ([`HeldNorm::forward_kept`]), or x's own values, rounded in
    /// bf16 as each product would round them.
    pub(crate) fn forward_kept(&self, x: &[f32], d: usize, precision: Precision) -> Result<Activation> {
        match (&self.0, precision) {
            (Some(norm), _) => norm.forward_kept(x, precision),
            (None, Precision::F32) => Ok(Activation::F32(x.to_vec())),
            (None, Precision::Bf16) => Ok(Activation::rounded(x.len() / d.max(1), d, x)),
        }
    }

    /// What of h a forward pass keeps for the backward pass: the norm's output, or nothing
    /// where h is x itself (a post-norm branch), which the backward pass is given anyway — in
    /// bf16 it rounds x again, one elementwise pass for the 16 bits a value it does not hold.
    pub(crate) fn kept(&self, h: Activation) -> Option<Activation> {
        self.0.as_ref().map(|_| h)
    }

    /// h for the backward pass: the one [`Self::kept`] kept, or x's own values again (rounded
    /// in bf16 to the same bits as the forward pass's).
    pub(crate) fn restored(
        &self,
        kept: Option<Activation>,
        x: &[f32],
        d: usize,
        precision: Precision,
    ) -> Result<Activation> {
        match kept {
            Some(h) => Ok(h),
            None => self.forward_kept(x, d, precision),
        }
    }

    /// x's gradient from the gradients `dh` at h (in the order candle reaches h through the
    /// branch's products) and `g`, the residual's: the sum of dh through the norm with g added,
    /// or, for x itself, g then each of dh added in turn — the order in which candle sums x's
    /// gradients when x feeds the residual add (the last op, so the first to send one back)
    /// and the projections directly. And the norm's parameter gradients.
    pub(crate) fn backward(&self, x: &[f32], dh: Vec<Vec<f32>>, g: &[f32]) -> Result<(Vec<f32>, ParamGrads)> {
        let mut dh = dh.into_iter();
        match &self.0 {
            Some(norm) => {
                let mut sum = dh.next().expect("a branch reads h");
                for more in dh {
                    add_in_place(&mut sum, &more);
                }
                norm.backward(x, &sum, Some(g))
            }
            None => {
                let mut dx = g.to_vec();
                for more in dh {
                    add_in_place(&mut dx, &more);
                }
                Ok((dx, Vec::new()))
            }
        }
    }
}
