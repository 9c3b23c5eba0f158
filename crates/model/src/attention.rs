//! Multi-head attention with grouped-query heads, switchable QK-norm, rotary positions, a KV
//! cache for incremental decoding, and opt-in telemetry.
//!
//! Queries, keys and values stay in the layout their projections produce, (B, T, heads·d): the
//! per-head norm, the rotation and the attention kernel all read it as it is, so the graph has
//! no head split or merge (each would cost a copy and an autograd edge).

use candle_core::{Result, Tensor};
use candle_nn::{Init, VarBuilder};
use ember_kernels::{
    AttentionOptions, AttentionTelemetry, AttentionWeights, BlockNorm, BlockPositions, CrossAttentionWeights,
    PositionScale,
};

use crate::config::{ModelConfig, NormKind, QkNorm};
use crate::init::ProjectionRole;
use crate::layers::{l2_normalize, AttentionStats, ForwardCtx, Linear, Norm, Residual};
use crate::rope::Rotary;

/// Keys and values of the positions decoded so far, per layer; grows by the new positions at
/// every step so each step costs O(length) instead of re-running the whole prefix.
#[derive(Clone, Default)]
pub struct KvCache {
    k: Option<Tensor>,
    v: Option<Tensor>,
}

impl KvCache {
    /// Number of cached positions.
    pub fn len(&self) -> usize {
        self.k.as_ref().and_then(|k| k.dim(1).ok()).unwrap_or(0)
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends (B, t, H_kv·d) keys and values; returns the full cached keys and values.
    fn append(&mut self, k: Tensor, v: Tensor) -> Result<(Tensor, Tensor)> {
        let (k, v) = match (&self.k, &self.v) {
            (Some(pk), Some(pv)) => (Tensor::cat(&[pk, &k], 1)?, Tensor::cat(&[pv, &v], 1)?),
            _ => (k, v),
        };
        // The cache is inference state: kept on the autograd graph, each step's cached keys
        // would hold the previous step's (and all their inputs) alive — quadratic memory.
        self.k = Some(k.detach());
        self.v = Some(v.detach());
        Ok((k, v))
    }

    /// Keeps batch rows `rows` (in that order), e.g. the surviving hypotheses of a beam search.
    pub fn select(&mut self, rows: &Tensor) -> Result<()> {
        for t in [&mut self.k, &mut self.v].into_iter().flatten() {
            *t = t.index_select(rows, 0)?.detach();
        }
        Ok(())
    }
}

/// Cross-attention keys and values of one encoded source: computed once, reused at every
/// decoding step.
#[derive(Clone)]
pub struct CrossKv {
    k: Tensor,
    v: Tensor,
}

impl CrossKv {
    pub fn select(&mut self, rows: &Tensor) -> Result<()> {
        self.k = self.k.index_select(rows, 0)?.detach();
        self.v = self.v.index_select(rows, 0)?.detach();
        Ok(())
    }
}

/// The per-head normalisation of queries and keys.
#[derive(Clone)]
enum QkNormLayer {
    /// Logits scaled by 1/√d.
    None,
    /// LayerNorm or RMSNorm over head_dim (separate gains for q and k, shared across heads);
    /// logits still scaled by 1/√d.
    Norm { q: Norm, k: Norm },
    /// Unit-length q and k; logits scaled by the learnable scalar `g` instead of 1/√d, so every
    /// logit is bounded by |g|.
    L2 { g: Tensor, eps: f64 },
}

#[derive(Clone, Copy)]
enum Side {
    Query,
    Key,
}

/// One attention module: self-attention (with rotary positions unless the model uses learned or
/// no positions) or cross-attention (never rotated).
#[derive(Clone)]
pub struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    qk_norm: QkNormLayer,
    rotary: Option<Rotary>,
    /// m of log-n scaling, in causal self-attention with `logn_attention` on.
    logn_length: Option<usize>,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    attn_dropout: f64,
    /// Parameter prefix, used to label telemetry.
    name: String,
}

impl Attention {
    /// `rotary` is `Some` for self-attention with rotary positions; cross-attention compares
    /// positions of two different sequences, where relative position has no meaning.
    /// `logn_length` is m of log-n scaling for causal self-attention (`None`: no log-n).
    /// `out_std` is the init std of the output projection (scaled down for the residual stream).
    pub fn new(
        vb: VarBuilder,
        cfg: &ModelConfig,
        rotary: Option<Rotary>,
        logn_length: Option<usize>,
        out_std: f64,
    ) -> Result<Self> {
        let (d, hd, h, kv) = (cfg.d_model, cfg.head_dim(), cfg.n_heads, cfg.kv_heads());
        let std = cfg.init_std;
        let proj =
            |name: &str, role, dims, std, bias| Linear::projection(vb.pp(name), cfg, role, dims, std, bias);
        let qk_norm = match cfg.qk_norm {
            QkNorm::None => QkNormLayer::None,
            QkNorm::Rmsnorm => QkNormLayer::Norm {
                q: Norm::new(vb.pp("q_norm"), NormKind::Rmsnorm, hd, cfg.norm_eps, false)?,
                k: Norm::new(vb.pp("k_norm"), NormKind::Rmsnorm, hd, cfg.norm_eps, false)?,
            },
            QkNorm::Layernorm => QkNormLayer::Norm {
                q: Norm::new(vb.pp("q_norm"), NormKind::Layernorm, hd, cfg.norm_eps, true)?,
                // Without rotation a key bias adds q·b to every logit of a query alike, which the
                // softmax cancels: the parameter would be dead weight with an exactly-zero
                // gradient. With rotary positions it varies per key position and does matter.
                k: Norm::new(
                    vb.pp("k_norm"),
                    NormKind::Layernorm,
                    hd,
                    cfg.norm_eps,
                    rotary.is_some(),
                )?,
            },
            QkNorm::L2 => QkNormLayer::L2 {
                g: vb.get_with_hints(1, "qk_scale", Init::Const(cfg.l2_init_scale()))?,
                eps: cfg.norm_eps,
            },
        };
        let (in_bias, k_bias) = (cfg.query_value_bias(), cfg.key_bias(rotary.is_some()));
        Ok(Self {
            q_proj: proj("q_proj", ProjectionRole::AttentionIn, (d, h * hd), std, in_bias)?,
            k_proj: proj("k_proj", ProjectionRole::AttentionIn, (d, kv * hd), std, k_bias)?,
            v_proj: proj("v_proj", ProjectionRole::AttentionIn, (d, kv * hd), std, in_bias)?,
            o_proj: proj(
                "o_proj",
                ProjectionRole::AttentionOut,
                (h * hd, d),
                out_std,
                cfg.proj_bias,
            )?,
            qk_norm,
            rotary,
            logn_length,
            n_heads: h,
            n_kv_heads: kv,
            head_dim: hd,
            attn_dropout: cfg.attn_dropout,
            name: vb.prefix(),
        })
    }

    /// QK-norm of per-head queries or keys (B, T, heads·d), over each head's d.
    fn normalize(&self, x: &Tensor, side: Side) -> Result<Tensor> {
        match (&self.qk_norm, side) {
            (QkNormLayer::None, _) => Ok(x.clone()),
            (QkNormLayer::Norm { q, .. }, Side::Query) => q.forward(x),
            (QkNormLayer::Norm { k, .. }, Side::Key) => k.forward(x),
            // In the parameters' dtype (candle's ops on a bf16 branch would sum the squares in
            // bf16); the query and key are cast back to the branch's dtype once scaled.
            (QkNormLayer::L2 { eps, g }, _) => l2_normalize(&x.to_dtype(g.dtype())?, self.head_dim, *eps),
        }
    }

    /// Queries (B, T, H·d): project, normalise, rotate, and fold in the logit scale (cheaper on
    /// q than on the T×S logits).
    fn queries(&self, x: &Tensor, offset: usize, ctx: ForwardCtx) -> Result<Tensor> {
        // The logit scale (1/√d; for `l2`, g afterwards) and the log-n factor of each position.
        let scale = PositionScale {
            scale: match self.qk_norm {
                QkNormLayer::L2 { .. } => 1.0,
                _ => 1.0 / (self.head_dim as f64).sqrt(),
            },
            logn_length: self.logn_length,
        };
        // QK-norm comes before the rotation (Qwen3, OLMo 2): rotating first would let the
        // norm's gains act on position-mixed coordinates. Rotation and scale are one pass where
        // there is a rotation, and one op with the projection where there is no norm between
        // (so is a constant scale without a rotation: cross-attention's queries); a bias comes
        // between the projection and the rest.
        let fused = !self.q_proj.has_bias();
        let q = match (&self.qk_norm, &self.rotary) {
            (QkNormLayer::None, Some(rotary)) if fused => {
                rotary.project_scaled(x, self.q_proj.weight(), offset, scale, ctx.precision)?
            }
            (QkNormLayer::None, None) if fused && scale.logn_length.is_none() => {
                ember_kernels::linear_scaled_in(x, self.q_proj.weight(), scale.scale, ctx.precision)?
            }
            (_, Some(rotary)) => {
                rotary.apply_scaled(&self.project_normalized(x, Side::Query, ctx)?, offset, scale)?
            }
            (_, None) => scale.apply_unfused(&self.project_normalized(x, Side::Query, ctx)?, offset)?,
        };
        match &self.qk_norm {
            QkNormLayer::L2 { g, .. } => q.broadcast_mul(g)?.to_dtype(x.dtype()),
            _ => Ok(q),
        }
    }

    /// Keys and values (B, S, H_kv·d), the keys normalised and rotated.
    fn keys_values(&self, x: &Tensor, offset: usize, ctx: ForwardCtx) -> Result<(Tensor, Tensor)> {
        let k = match (&self.qk_norm, &self.rotary) {
            (QkNormLayer::None, Some(rotary)) if !self.k_proj.has_bias() => {
                rotary.project_scaled(x, self.k_proj.weight(), offset, 1.0.into(), ctx.precision)?
            }
            (_, Some(rotary)) => rotary.apply(&self.project_normalized(x, Side::Key, ctx)?, offset)?,
            (_, None) => self.project_normalized(x, Side::Key, ctx)?,
        };
        // (An L2-normalised key comes back in f32.)
        Ok((k.to_dtype(x.dtype())?, self.v_proj.forward(x, ctx)?))
    }

    /// The query or key projection of `x` (plus its bias, if any), QK-normed.
    fn project_normalized(&self, x: &Tensor, side: Side, ctx: ForwardCtx) -> Result<Tensor> {
        let proj = match side {
            Side::Query => &self.q_proj,
            Side::Key => &self.k_proj,
        };
        self.normalize(&proj.forward(x, ctx)?, side)
    }

    /// Self-attention over `x` (B, T, D), written into the residual stream `to`. `mask` is
    /// additive and broadcasts to (B, H, T, S). With a cache, `x` holds the positions after the
    /// cached ones and is appended to the cache.
    pub fn forward_self(
        &self,
        x: &Tensor,
        to: Residual,
        mask: Option<&Tensor>,
        cache: Option<&mut KvCache>,
        ctx: ForwardCtx,
    ) -> Result<Tensor> {
        let offset = cache.as_ref().map_or(0, |c| c.len());
        let q = self.queries(x, offset, ctx)?;
        let (k, v) = self.keys_values(x, offset, ctx)?;
        let (k, v) = match cache {
            Some(cache) => cache.append(k, v)?,
            None => (k, v),
        };
        self.attend(&q, &k, &v, mask, to, ctx)
    }

    /// Keys and values of an encoder output (B, S, D), for [`forward_cross`](Self::forward_cross),
    /// in `memory`'s dtype (the caller's: the queries').
    pub fn cross_kv(&self, memory: &Tensor, ctx: ForwardCtx) -> Result<CrossKv> {
        let (k, v) = self.keys_values(memory, 0, ctx)?;
        Ok(CrossKv { k, v })
    }

    /// Cross-attention of `x` (B, T, D) to precomputed encoder keys and values, written into
    /// the residual stream `to`.
    pub fn forward_cross(
        &self,
        x: &Tensor,
        kv: &CrossKv,
        to: Residual,
        mask: Option<&Tensor>,
        ctx: ForwardCtx,
    ) -> Result<Tensor> {
        let q = self.queries(x, 0, ctx)?;
        self.attend(&q, &kv.k, &kv.v, mask, to, ctx)
    }

    /// softmax(q·kᵀ + mask)·v for scaled queries (B, T, H·d) and keys/values (B, S, H_kv·d),
    /// then the output projection into the residual stream.
    fn attend(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
        to: Residual,
        ctx: ForwardCtx,
    ) -> Result<Tensor> {
        let (b, t, _) = q.dims3()?;
        let opts = self.options(b, t, k.dim(1)?, ctx);
        let (out, measured) = ember_kernels::attention(q, k, v, mask, &opts)?;
        self.record(measured, ctx);
        self.o_proj.forward_residual(&out, to, ctx)
    }

    /// The attention core's options for B × T queries and S keys; reserves the probabilities'
    /// dropout mask (B·H·T·S draws) in training passes.
    fn options(&self, b: usize, t: usize, s: usize, ctx: ForwardCtx) -> AttentionOptions {
        let dropout = match ctx.dropout {
            Some(rng) if self.attn_dropout > 0.0 => {
                Some((self.attn_dropout, rng.reserve(b * self.n_heads * t * s)))
            }
            _ => None,
        };
        AttentionOptions {
            heads: self.n_heads,
            kv_heads: self.n_kv_heads,
            dropout,
            telemetry: ctx.telemetry.is_some(),
            precision: ctx.precision,
        }
    }

    /// Hands what the attention core measured to the pass's telemetry, labelled with this module.
    fn record(&self, measured: Option<AttentionTelemetry>, ctx: ForwardCtx) {
        if let (
            Some(telemetry),
            Some(AttentionTelemetry {
                max_logit,
                entropy,
                entropy_by_position,
            }),
        ) = (ctx.telemetry, measured)
        {
            telemetry.record(AttentionStats {
                module: self.name.clone(),
                max_logit,
                entropy,
                entropy_by_position,
            });
        }
    }

    /// Self-attention over `x` (B, T, D) written back into `x`, opened by `norm` (pre-norm) or
    /// reading x itself (`None`: a post-norm branch, whose norm the caller applies to the
    /// output), as one op (`ember_kernels::attention_block`) whose parameters' gradients go to
    /// the pass's sink; `None` where the pass has no sink, the module is not one the op covers
    /// (L2 QK-norm, log-n scaling without rotary positions) or the op does not run (off the
    /// CPU, not f32): the caller then runs [`forward_self`](Self::forward_self).
    /// Its dropout masks are reserved as `forward_self` reserves them, and only when the op
    /// runs, so fused and unfused passes draw the same ones.
    pub(crate) fn forward_self_fused(
        &self,
        norm: Option<&Norm>,
        x: &Tensor,
        mask: Option<&Tensor>,
        dropout: f64,
        ctx: ForwardCtx,
    ) -> Result<Option<Tensor>> {
        let (Some(sink), Some(qk_norm)) = (ctx.grad_sink, self.block_qk_norm()) else {
            return Ok(None);
        };
        let (b, t, _) = x.dims3()?;
        let scale = PositionScale {
            scale: 1.0 / (self.head_dim as f64).sqrt(),
            logn_length: self.logn_length,
        };
        let positions = match &self.rotary {
            Some(rotary) => {
                rotary.check_positions(0, t)?;
                BlockPositions::Rotary {
                    tables: rotary.tables(),
                    scale,
                }
            }
            None if scale.logn_length.is_none() => BlockPositions::Unrotated { scale: scale.scale },
            None => return Ok(None),
        };
        let weights = AttentionWeights {
            q: self.q_proj.weight(),
            k: self.k_proj.weight(),
            v: self.v_proj.weight(),
            o: self.o_proj.weight(),
            qkv_bias: [&self.q_proj, &self.k_proj, &self.v_proj].map(Linear::bias),
            o_bias: self.o_proj.bias(),
            qk_norm,
        };
        let options = || self.options(b, t, t, ctx);
        let residual = || ctx.residual_dropout(dropout, x.elem_count());
        let norm = norm.map(Norm::as_block_norm);
        let memory = ctx.activations;
        let block = ember_kernels::attention_block(
            x, norm, weights, positions, mask, memory, sink, options, residual,
        )?;
        Ok(self.recorded(block, ctx))
    }

    /// Cross-attention of `x` (B, T, D) to the encoder's keys and values `kv`, written back
    /// into `x`, opened by `norm` (pre-norm) or reading x itself (`None`: a post-norm branch,
    /// whose norm the caller applies to the output), as one op
    /// (`ember_kernels::cross_attention_block`) whose parameters' gradients go to the pass's
    /// sink (k's and v's go back through candle to the projections that made them); `None`
    /// where the pass has no sink, the module is not one the op covers (L2 QK-norm) or the op
    /// does not run (x, k, v or a parameter off the CPU or not f32): the caller then runs
    /// [`forward_cross`](Self::forward_cross). Its dropout masks are reserved as
    /// `forward_cross` reserves them, and only when the op runs.
    pub(crate) fn forward_cross_fused(
        &self,
        norm: Option<&Norm>,
        x: &Tensor,
        kv: &CrossKv,
        mask: Option<&Tensor>,
        dropout: f64,
        ctx: ForwardCtx,
    ) -> Result<Option<Tensor>> {
        let (Some(sink), Some(qk_norm)) = (ctx.grad_sink, self.block_qk_norm()) else {
            return Ok(None);
        };
        let ((b, t, _), s) = (x.dims3()?, kv.k.dim(1)?);
        let weights = CrossAttentionWeights {
            q: self.q_proj.weight(),
            o: self.o_proj.weight(),
            q_bias: self.q_proj.bias(),
            o_bias: self.o_proj.bias(),
            q_norm: qk_norm.map(|[q, _]| q),
        };
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        let options = || self.options(b, t, s, ctx);
        let residual = || ctx.residual_dropout(dropout, x.elem_count());
        let block = ember_kernels::cross_attention_block(
            x,
            norm.map(Norm::as_block_norm),
            weights,
            (&kv.k, &kv.v),
            scale,
            mask,
            ctx.activations,
            sink,
            options,
            residual,
        )?;
        Ok(self.recorded(block, ctx))
    }

    /// A block op's output (where it ran), what its attention core measured handed to the
    /// pass's telemetry.
    fn recorded(
        &self,
        block: Option<(Tensor, Option<AttentionTelemetry>)>,
        ctx: ForwardCtx,
    ) -> Option<Tensor> {
        block.map(|(out, measured)| {
            self.record(measured, ctx);
            out
        })
    }

    /// QK-norm's query and key norms as a block op takes them (`Some(None)` without QK-norm);
    /// `None` where the module is not one the block ops cover: L2 QK-norm.
    fn block_qk_norm(&self) -> Option<Option<[BlockNorm<'_>; 2]>> {
        match &self.qk_norm {
            QkNormLayer::None => Some(None),
            QkNormLayer::Norm { q, k } => Some(Some([q.as_block_norm(), k.as_block_norm()])),
            QkNormLayer::L2 { .. } => None,
        }
    }

    /// Per-head queries and keys of `x` (B, T, D) right after QK-norm, before rotation and
    /// scaling: (B, H, T, d) and (B, H_kv, T, d). For inspecting what the norm does.
    pub fn normalized_qk(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        let heads = |t: &Tensor, n: usize| -> Result<Tensor> {
            let (b, len, _) = t.dims3()?;
            t.reshape((b, len, n, self.head_dim))?
                .transpose(1, 2)?
                .contiguous()
        };
        let q = self.project_normalized(x, Side::Query, ForwardCtx::eval())?;
        let k = self.project_normalized(x, Side::Key, ForwardCtx::eval())?;
        Ok((heads(&q, self.n_heads)?, heads(&k, self.n_kv_heads)?))
    }

    /// The learnable logit scale g of the `l2` variant.
    pub fn l2_scale(&self) -> Option<&Tensor> {
        match &self.qk_norm {
            QkNormLayer::L2 { g, .. } => Some(g),
            _ => None,
        }
    }
}
