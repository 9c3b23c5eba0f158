//! Multi-head attention with grouped-query heads, switchable QK-norm, rotary positions, a KV
//! cache for incremental decoding, and opt-in telemetry.

use candle_core::{DType, Result, Tensor, D};
use candle_nn::{Init, VarBuilder};

use crate::config::{ModelConfig, NormKind, QkNorm};
use crate::layers::{dropout, l2_normalize, AttentionStats, ForwardCtx, Linear, Norm};
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
        self.k.as_ref().and_then(|k| k.dim(2).ok()).unwrap_or(0)
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends (B, H_kv, t, d) keys and values; returns the full cached keys and values.
    fn append(&mut self, k: Tensor, v: Tensor) -> Result<(Tensor, Tensor)> {
        let (k, v) = match (&self.k, &self.v) {
            (Some(pk), Some(pv)) => (Tensor::cat(&[pk, &k], 2)?, Tensor::cat(&[pv, &v], 2)?),
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

/// One attention module: self-attention (with rotary positions) or cross-attention (without).
#[derive(Clone)]
pub struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    qk_norm: QkNormLayer,
    rotary: Option<Rotary>,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    attn_dropout: f64,
    dropout: f64,
    /// Parameter prefix, used to label telemetry.
    name: String,
}

impl Attention {
    /// `rotary` is `Some` for self-attention; cross-attention compares positions of two
    /// different sequences, where relative position has no meaning. `out_std` is the init std of
    /// the output projection (scaled down for the residual stream).
    pub fn new(vb: VarBuilder, cfg: &ModelConfig, rotary: Option<Rotary>, out_std: f64) -> Result<Self> {
        let (d, hd, h, kv) = (cfg.d_model, cfg.head_dim(), cfg.n_heads, cfg.kv_heads());
        let std = cfg.init_std;
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
        Ok(Self {
            q_proj: Linear::new(vb.pp("q_proj"), d, h * hd, std)?,
            k_proj: Linear::new(vb.pp("k_proj"), d, kv * hd, std)?,
            v_proj: Linear::new(vb.pp("v_proj"), d, kv * hd, std)?,
            o_proj: Linear::new(vb.pp("o_proj"), h * hd, d, out_std)?,
            qk_norm,
            rotary,
            n_heads: h,
            n_kv_heads: kv,
            head_dim: hd,
            attn_dropout: cfg.attn_dropout,
            dropout: cfg.dropout,
            name: vb.prefix(),
        })
    }

    /// (B, T, heads·d) → (B, heads, T, d).
    fn split_heads(&self, x: &Tensor, heads: usize) -> Result<Tensor> {
        self.heads_view(x, heads)?.contiguous()
    }

    /// (B, T, heads·d) viewed as (B, heads, T, d), without copying: the rotation kernel reads
    /// this layout directly and writes (B, heads, T, d).
    fn heads_view(&self, x: &Tensor, heads: usize) -> Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        x.reshape((b, t, heads, self.head_dim))?.transpose(1, 2)
    }

    /// QK-norm of per-head queries or keys (B, H, T, d), over d.
    fn normalize(&self, x: &Tensor, side: Side) -> Result<Tensor> {
        match (&self.qk_norm, side) {
            (QkNormLayer::None, _) => Ok(x.clone()),
            (QkNormLayer::Norm { q, .. }, Side::Query) => q.forward(x),
            (QkNormLayer::Norm { k, .. }, Side::Key) => k.forward(x),
            (QkNormLayer::L2 { eps, .. }, _) => l2_normalize(x, *eps),
        }
    }

    /// Queries: project, normalise, rotate, and fold in the logit scale (cheaper on q than on
    /// the T×S logits).
    fn queries(&self, x: &Tensor, offset: usize) -> Result<Tensor> {
        let q = self.heads_view(&self.q_proj.forward(x)?, self.n_heads)?;
        let q = self.normalize(&q, Side::Query)?;
        // QK-norm comes before the rotation (Qwen3, OLMo 2): rotating first would let the
        // norm's gains act on position-mixed coordinates.
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        match (&self.qk_norm, &self.rotary) {
            (QkNormLayer::L2 { g, .. }, Some(rotary)) => rotary.apply(&q, offset)?.broadcast_mul(g),
            (QkNormLayer::L2 { g, .. }, None) => q.broadcast_mul(g),
            // Rotation and logit scale in one pass.
            (_, Some(rotary)) => rotary.apply_scaled(&q, offset, scale),
            (_, None) => q.affine(scale, 0.0),
        }
    }

    fn keys_values(&self, x: &Tensor, offset: usize) -> Result<(Tensor, Tensor)> {
        let k = self.heads_view(&self.k_proj.forward(x)?, self.n_kv_heads)?;
        let v = self.split_heads(&self.v_proj.forward(x)?, self.n_kv_heads)?;
        let k = self.normalize(&k, Side::Key)?;
        let k = match &self.rotary {
            Some(rotary) => rotary.apply(&k, offset)?,
            // Without a rotation nothing has copied the head view yet.
            None => k.contiguous()?,
        };
        Ok((k, v))
    }

    /// Self-attention over `x` (B, T, D). `mask` is additive and broadcasts to (B, H, T, S).
    /// With a cache, `x` holds the positions after the cached ones and is appended to the cache.
    pub fn forward_self(
        &self,
        x: &Tensor,
        mask: Option<&Tensor>,
        cache: Option<&mut KvCache>,
        ctx: ForwardCtx,
    ) -> Result<Tensor> {
        let offset = cache.as_ref().map_or(0, |c| c.len());
        let q = self.queries(x, offset)?;
        let (k, v) = self.keys_values(x, offset)?;
        let (k, v) = match cache {
            Some(cache) => cache.append(k, v)?,
            None => (k, v),
        };
        self.attend(&q, &k, &v, mask, ctx)
    }

    /// Keys and values of an encoder output (B, S, D), for [`forward_cross`](Self::forward_cross).
    pub fn cross_kv(&self, memory: &Tensor) -> Result<CrossKv> {
        let (k, v) = self.keys_values(memory, 0)?;
        Ok(CrossKv { k, v })
    }

    /// Cross-attention of `x` (B, T, D) to precomputed encoder keys and values.
    pub fn forward_cross(
        &self,
        x: &Tensor,
        kv: &CrossKv,
        mask: Option<&Tensor>,
        ctx: ForwardCtx,
    ) -> Result<Tensor> {
        let q = self.queries(x, 0)?;
        self.attend(&q, &kv.k, &kv.v, mask, ctx)
    }

    /// softmax(q·kᵀ + mask)·v for scaled queries (B, H, T, d) and keys/values (B, H_kv, S, d),
    /// then the output projection.
    fn attend(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
        ctx: ForwardCtx,
    ) -> Result<Tensor> {
        let (b, h, t, d) = q.dims4()?;
        let training_dropout = ctx.dropout.is_some() && self.attn_dropout > 0.0;
        if ctx.telemetry.is_none() && !training_dropout {
            // The fused kernel (CPU f32; the same composition as below elsewhere).
            let out = ember_kernels::attention_heads_last(q, k, v, mask)?.reshape((b, t, h * d))?;
            return dropout(&self.o_proj.forward(&out)?, self.dropout, ctx);
        }
        let s = k.dim(2)?;
        let group = h / self.n_kv_heads;
        // Grouped-query attention without copying K/V per query head: the `group` query heads
        // that share a KV head are stacked along the time axis of one matmul.
        let logits = q
            .reshape((b, self.n_kv_heads, group * t, d))?
            .matmul(&k.t()?)?
            .reshape((b, h, t, s))?;
        let masked = match mask {
            Some(m) => logits.broadcast_add(m)?,
            None => logits.clone(),
        };
        let probs = ember_kernels::softmax_rows(&masked)?;
        if let Some(telemetry) = ctx.telemetry {
            telemetry.record(self.stats(&logits, mask, &probs)?);
        }
        let probs = dropout(&probs, self.attn_dropout, ctx)?;
        let out = probs
            .reshape((b, self.n_kv_heads, group * t, s))?
            .matmul(v)?
            .reshape((b, h, t, d))?
            .transpose(1, 2)?
            .reshape((b, t, h * d))?;
        dropout(&self.o_proj.forward(&out)?, self.dropout, ctx)
    }

    /// Max |logit| over unmasked pairs and mean entropy of the attention rows, off the autograd graph.
    fn stats(&self, logits: &Tensor, mask: Option<&Tensor>, probs: &Tensor) -> Result<AttentionStats> {
        let logits = logits.detach().to_dtype(DType::F32)?;
        let abs = logits.abs()?;
        let abs = match mask {
            // Masked entries carry −1e9; keep only entries whose mask is 0.
            Some(m) => abs.broadcast_mul(&m.ge(-1.0)?.to_dtype(DType::F32)?)?,
            None => abs,
        };
        let probs = probs.detach().to_dtype(DType::F32)?;
        let entropy = probs
            .clamp(1e-30f32, 1f32)?
            .log()?
            .mul(&probs)?
            .sum(D::Minus1)?
            .neg()?
            .mean_all()?;
        Ok(AttentionStats {
            module: self.name.clone(),
            max_logit: abs.max_all()?.to_scalar::<f32>()?,
            entropy: entropy.to_scalar::<f32>()?,
        })
    }

    /// Per-head queries and keys of `x` (B, T, D) right after QK-norm, before rotation and
    /// scaling: (B, H, T, d) and (B, H_kv, T, d). For inspecting what the norm does.
    pub fn normalized_qk(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        let q = self.split_heads(&self.q_proj.forward(x)?, self.n_heads)?;
        let k = self.split_heads(&self.k_proj.forward(x)?, self.n_kv_heads)?;
        Ok((self.normalize(&q, Side::Query)?, self.normalize(&k, Side::Key)?))
    }

    /// The learnable logit scale g of the `l2` variant.
    pub fn l2_scale(&self) -> Option<&Tensor> {
        match &self.qk_norm {
            QkNormLayer::L2 { g, .. } => Some(g),
            _ => None,
        }
    }
}
