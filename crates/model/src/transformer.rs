//! Transformer stacks and the two models built from them.
//!
//! Every block is `x + branch(norm(x))` and each stack ends in a final norm (pre-norm, the
//! default), or every block is `norm(x + branch(x))` with no final norm (`norm_placement:
//! post`, the original Transformer's). Parameter names (as saved in `model.safetensors`):
//!
//! ```text
//! embed.weight                                  token embedding (shared by encoder and decoder)
//! lm_head.weight                                output projection, only when tie_embeddings: false
//! encoder.layers.{i}.attn_norm.{weight,bias}    bias only for norm: layernorm with norm_bias
//! encoder.layers.{i}.self_attn.{q,k,v,o}_proj.weight
//! encoder.layers.{i}.self_attn.{q,k}_norm.{weight,bias}   qk_norm: rmsnorm | layernorm
//! encoder.layers.{i}.self_attn.qk_scale         qk_norm: l2 (the learnable g)
//! encoder.layers.{i}.mlp_norm.*, encoder.layers.{i}.mlp.{gate,up,down}_proj.weight
//! encoder.norm.*                                pre-norm only
//! encoder.embed_positions.weight                positions: learned (max_seq_len × d_model)
//! decoder.layers.{i}.{attn_norm,self_attn,cross_attn_norm,cross_attn,mlp_norm,mlp}.*
//! decoder.norm.*                                pre-norm only
//! decoder.embed_positions.weight                positions: learned
//! ```
//! A language model has the `decoder.*` stack only, without cross-attention.
//!
//! Initialisation: embeddings and projections are normal(0, init_std); the projections that
//! write into the residual stream (attention `o_proj`, MLP `down_proj`) use init_std/√R, with R
//! the number of residual branches in their stack (2 per encoder or LM layer, 3 per seq2seq
//! decoder layer), so the stream's variance at init does not grow with depth (GPT-2's rule;
//! post-norm keeps init_std there, since its norms rescale the stream after every branch).
//! Norm gains start at 1, biases at 0, and the `l2` scale g at g₀.

use candle_core::{DType, Result, Tensor};
use candle_nn::VarBuilder;
use ember_kernels::{causal_mask, padding_mask, Precision};

use crate::block::{Layer, LayerCache, Memory};
use crate::config::{Arch, ConfigError, ModelConfig};
use crate::config::{NormPlacement, Positions};
use crate::layers::{dropout, Embedding, ForwardCtx, Linear, Norm, PositionTable};
use crate::params::ParamStore;
use crate::rope::Rotary;

/// The causal mask for `t` new positions after `offset` cached ones, on `like`'s device and in its
/// dtype. A GPU keeps the masks it has used: building one is a host loop and an upload, and a
/// training step would otherwise upload the same few masks again and again (translation batches
/// take a few dozen lengths; a language model one).
fn cached_causal_mask(t: usize, offset: usize, like: &Tensor) -> Result<Tensor> {
    use std::cell::RefCell;
    /// Masks kept per thread at most: a long generation's growing shapes must not pile up.
    const KEEP: usize = 256;
    /// The masks made so far on this thread, by (t, offset, dtype).
    type Masks = RefCell<Vec<((usize, usize, DType), Tensor)>>;
    thread_local! {
        static MASKS: Masks = const { RefCell::new(Vec::new()) };
    }
    let (device, dtype) = (like.device(), like.dtype());
    if device.is_cpu() {
        return causal_mask(t, offset, dtype, device);
    }
    MASKS.with(|masks| {
        let mut masks = masks.borrow_mut();
        let key = (t, offset, dtype);
        if let Some((_, m)) = masks
            .iter()
            .find(|(k, m)| *k == key && m.device().same_device(device))
        {
            return Ok(m.clone());
        }
        let m = causal_mask(t, offset, dtype, device)?;
        if masks.len() == KEEP {
            masks.remove(0);
        }
        masks.push((key, m.clone()));
        Ok(m)
    })
}

/// An error building a model: a bad configuration or a parameter problem (e.g. a checkpoint
/// of another shape).
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("invalid model configuration: {0}")]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Candle(#[from] candle_core::Error),
}

/// Incremental-decoding state of a decoder: per layer, the growing self-attention cache and
/// the cross-attention keys/values of the source (computed on the first step).
#[derive(Clone, Default)]
pub struct DecoderCache {
    layers: Vec<LayerCache>,
}

impl DecoderCache {
    /// Positions decoded so far.
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, |l| l.self_kv.len())
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Keeps batch rows `rows` in every layer's caches.
    pub fn select(&mut self, rows: &Tensor) -> Result<()> {
        for layer in &mut self.layers {
            layer.self_kv.select(rows)?;
            if let Some(kv) = &mut layer.cross_kv {
                kv.select(rows)?;
            }
        }
        Ok(())
    }
}

/// Number of residual branches per layer → init std of the residual output projections
/// (pre-norm's depth scaling; post-norm keeps `init_std`).
fn residual_std(cfg: &ModelConfig, layers: usize, branches_per_layer: usize) -> f64 {
    match cfg.norm_placement {
        NormPlacement::Pre => cfg.init_std / ((layers * branches_per_layer) as f64).sqrt(),
        NormPlacement::Post => cfg.init_std,
    }
}

/// The position table of a stack, when the model adds one to its embeddings.
fn position_table(vb: &VarBuilder, cfg: &ModelConfig) -> Result<Option<PositionTable>> {
    match cfg.positions {
        Positions::Learned => Ok(Some(PositionTable::learned(
            vb.pp("embed_positions"),
            cfg.max_seq_len,
            cfg.d_model,
            cfg.init_std,
        )?)),
        Positions::Sinusoidal => Ok(Some(PositionTable::sinusoidal(
            cfg.max_seq_len,
            cfg.d_model,
            vb.dtype(),
            vb.device(),
        )?)),
        Positions::Rope | Positions::None => Ok(None),
    }
}

/// The final norm of a pre-norm stack (a post-norm stack's last block ends in its own norm).
fn final_norm(vb: &VarBuilder, cfg: &ModelConfig) -> Result<Option<Norm>> {
    match cfg.norm_placement {
        NormPlacement::Pre => Ok(Some(Norm::new(
            vb.pp("norm"),
            cfg.norm,
            cfg.d_model,
            cfg.norm_eps,
            cfg.norm_bias,
        )?)),
        NormPlacement::Post => Ok(None),
    }
}

/// `x` through the final norm, when the stack has one.
fn finish(norm: &Option<Norm>, x: Tensor) -> Result<Tensor> {
    match norm {
        Some(norm) => norm.forward(&x),
        None => Ok(x),
    }
}

/// The encoder stack of a seq2seq model.
struct Encoder {
    positions: Option<PositionTable>,
    layers: Vec<Layer>,
    norm: Option<Norm>,
}

impl Encoder {
    fn new(vb: VarBuilder, cfg: &ModelConfig, rotary: Option<&Rotary>) -> Result<Self> {
        let n = cfg.encoder_layers();
        let out_std = residual_std(cfg, n, 2);
        // The encoder's queries see the whole source: no log-n scaling.
        let layers = (0..n)
            .map(|i| Layer::new(vb.pp(format!("layers.{i}")), cfg, rotary, None, out_std, false))
            .collect::<Result<_>>()?;
        Ok(Self {
            positions: position_table(&vb, cfg)?,
            layers,
            norm: final_norm(&vb, cfg)?,
        })
    }

    fn forward(&self, x: &Tensor, mask: Option<&Tensor>, ctx: ForwardCtx) -> Result<Tensor> {
        let mut x = x.clone();
        for layer in &self.layers {
            x = layer.forward(&x, mask, None, None, ctx)?;
        }
        finish(&self.norm, x)
    }
}

/// The decoder stack: the whole of a language model, the target side of a seq2seq model.
struct Decoder {
    positions: Option<PositionTable>,
    layers: Vec<Layer>,
    norm: Option<Norm>,
}

impl Decoder {
    /// Target embeddings of `ids` whose first position is `offset` (with this stack's learned
    /// positions, when it has them).
    fn embed(&self, io: &TokenIo, ids: &Tensor, offset: usize, ctx: ForwardCtx) -> Result<Tensor> {
        io.embed(ids, self.positions.as_ref(), offset, ctx)
    }

    fn new(vb: VarBuilder, cfg: &ModelConfig, rotary: Option<&Rotary>, cross: bool) -> Result<Self> {
        let n = cfg.decoder_layers();
        let out_std = residual_std(cfg, n, if cross { 3 } else { 2 });
        // Self-attention here is causal: a query at position i sees i + 1 keys, which is what
        // log-n scaling grows the logits by. (The encoder's queries see the whole source.)
        let logn = cfg.logn_train_length();
        let layers = (0..n)
            .map(|i| Layer::new(vb.pp(format!("layers.{i}")), cfg, rotary, logn, out_std, cross))
            .collect::<Result<_>>()?;
        Ok(Self {
            positions: position_table(&vb, cfg)?,
            layers,
            norm: final_norm(&vb, cfg)?,
        })
    }

    /// Runs the stack over embedded targets `x` (B, T, D). With a cache, `x` holds the positions
    /// after the cached ones.
    fn forward(
        &self,
        x: &Tensor,
        memory: Option<&Memory>,
        cache: Option<&mut DecoderCache>,
        ctx: ForwardCtx,
    ) -> Result<Tensor> {
        let t = x.dim(1)?;
        let offset = cache.as_ref().map_or(0, |c| c.len());
        // A single new position may attend to everything cached: no mask needed.
        let mask = if t > 1 {
            Some(cached_causal_mask(t, offset, x)?)
        } else {
            None
        };
        let mut x = x.clone();
        match cache {
            Some(cache) => {
                cache.layers.resize_with(self.layers.len(), LayerCache::default);
                for (layer, lc) in self.layers.iter().zip(cache.layers.iter_mut()) {
                    x = layer.forward(&x, mask.as_ref(), memory, Some(lc), ctx)?;
                }
            }
            None => {
                for layer in &self.layers {
                    x = layer.forward(&x, mask.as_ref(), memory, None, ctx)?;
                }
            }
        }
        finish(&self.norm, x)
    }
}

/// Embedding in, logits out, and the precision of every product between: shared by both models.
struct TokenIo {
    embed: Embedding,
    lm_head: Linear,
    /// √d_model with `scale_embeddings`, else 1.
    embed_scale: f64,
    dropout: f64,
    precision: Precision,
}

impl TokenIo {
    fn new(vb: &VarBuilder, cfg: &ModelConfig) -> Result<Self> {
        let embed = Embedding::new(vb.pp("embed"), cfg.vocab(), cfg.d_model, cfg.init_std)?;
        let lm_head = if cfg.tie_embeddings {
            Linear::from_weight(embed.weight().clone())
        } else {
            Linear::new(vb.pp("lm_head"), cfg.d_model, cfg.vocab(), cfg.init_std)?
        };
        Ok(Self {
            embed,
            lm_head,
            embed_scale: if cfg.scale_embeddings {
                (cfg.d_model as f64).sqrt()
            } else {
                1.0
            },
            dropout: cfg.dropout,
            precision: Precision::F32,
        })
    }
    /// The logits `h·Wᵀ` of hidden states h (…, D).
    fn logits(&self, h: &Tensor) -> Result<Tensor> {
        let ctx = ForwardCtx::eval().in_precision(self.precision);
        self.lm_head.forward(h, ctx)
    }

    /// Token embeddings of `ids` (B, T) (times √d_model with `scale_embeddings`), plus the
    /// positions `offset..offset + T` of the stack they feed when it has a table, then dropout.
    fn embed(
        &self,
        ids: &Tensor,
        positions: Option<&PositionTable>,
        offset: usize,
        ctx: ForwardCtx,
    ) -> Result<Tensor> {
        let x = self.embed.forward(ids, ctx)?;
        let x = if self.embed_scale == 1.0 {
            x
        } else {
            (x * self.embed_scale)?
        };
        let x = match positions {
            Some(p) => p.add(&x, offset)?,
            None => x,
        };
        dropout(&x, self.dropout, ctx)
    }
}

/// A decoder-only language model.
pub struct LanguageModel {
    io: TokenIo,
    decoder: Decoder,
}

impl LanguageModel {
    fn new(vb: VarBuilder, cfg: &ModelConfig, rotary: Option<&Rotary>) -> Result<Self> {
        Ok(Self {
            io: TokenIo::new(&vb, cfg)?,
            decoder: Decoder::new(vb.pp("decoder"), cfg, rotary, false)?,
        })
    }

    /// Final hidden states (B, T, D) for token ids (B, T).
    pub fn hidden(&self, tokens: &Tensor, ctx: ForwardCtx) -> Result<Tensor> {
        let ctx = ctx.in_precision(self.io.precision);
        self.decoder
            .forward(&self.embed(tokens, 0, ctx)?, None, None, ctx)
    }

    /// The output projection's weight (V, D): logits are `hidden · Wᵀ`.
    pub fn output_weight(&self) -> &Tensor {
        self.io.lm_head.weight()
    }

    /// Next-token logits (B, T, V) for token ids (B, T).
    pub fn forward(&self, tokens: &Tensor, ctx: ForwardCtx) -> Result<Tensor> {
        self.io.logits(&self.hidden(tokens, ctx)?)
    }

    /// Logits for `tokens` (B, t) that follow the positions already in `cache`; extends the cache.
    pub fn forward_step(&self, tokens: &Tensor, cache: &mut DecoderCache, ctx: ForwardCtx) -> Result<Tensor> {
        let ctx = ctx.in_precision(self.io.precision);
        let h = self
            .decoder
            .forward(&self.embed(tokens, cache.len(), ctx)?, None, Some(cache), ctx)?;
        self.io.logits(&h)
    }

    fn embed(&self, tokens: &Tensor, offset: usize, ctx: ForwardCtx) -> Result<Tensor> {
        self.decoder.embed(&self.io, tokens, offset, ctx)
    }
}

/// An encoder–decoder translation model.
pub struct Seq2Seq {
    io: TokenIo,
    encoder: Encoder,
    decoder: Decoder,
}

impl Seq2Seq {
    fn new(vb: VarBuilder, cfg: &ModelConfig, rotary: Option<&Rotary>) -> Result<Self> {
        Ok(Self {
            io: TokenIo::new(&vb, cfg)?,
            encoder: Encoder::new(vb.pp("encoder"), cfg, rotary)?,
            decoder: Decoder::new(vb.pp("decoder"), cfg, rotary, true)?,
        })
    }

    /// Encodes source ids (B, S); `src_mask` (B, S) is 1 at real tokens, 0 at padding.
    pub fn encode(&self, src: &Tensor, src_mask: Option<&Tensor>, ctx: ForwardCtx) -> Result<Memory> {
        let ctx = ctx.in_precision(self.io.precision);
        let x = self.io.embed(src, self.encoder.positions.as_ref(), 0, ctx)?;
        let mask = src_mask.map(|m| padding_mask(m, x.dtype())).transpose()?;
        let hidden = self.encoder.forward(&x, mask.as_ref(), ctx)?;
        Ok(Memory { hidden, mask })
    }

    /// Final decoder hidden states (B, T, D) for teacher-forced target inputs (B, T).
    pub fn decode_hidden(&self, tgt_in: &Tensor, memory: &Memory, ctx: ForwardCtx) -> Result<Tensor> {
        let ctx = ctx.in_precision(self.io.precision);
        self.decoder
            .forward(&self.target_embed(tgt_in, 0, ctx)?, Some(memory), None, ctx)
    }

    /// The output projection's weight (V, D): logits are `hidden · Wᵀ`.
    pub fn output_weight(&self) -> &Tensor {
        self.io.lm_head.weight()
    }

    /// Logits (B, T, V) for teacher-forced target inputs (B, T).
    pub fn decode(&self, tgt_in: &Tensor, memory: &Memory, ctx: ForwardCtx) -> Result<Tensor> {
        self.io.logits(&self.decode_hidden(tgt_in, memory, ctx)?)
    }

    /// Encode then decode: logits (B, T, V).
    pub fn forward(
        &self,
        src: &Tensor,
        src_mask: Option<&Tensor>,
        tgt_in: &Tensor,
        ctx: ForwardCtx,
    ) -> Result<Tensor> {
        let memory = self.encode(src, src_mask, ctx)?;
        self.decode(tgt_in, &memory, ctx)
    }

    /// Logits for target tokens (B, t) following the positions in `cache`; extends the cache.
    pub fn decode_step(
        &self,
        tokens: &Tensor,
        memory: &Memory,
        cache: &mut DecoderCache,
        ctx: ForwardCtx,
    ) -> Result<Tensor> {
        let ctx = ctx.in_precision(self.io.precision);
        let h = self.decoder.forward(
            &self.target_embed(tokens, cache.len(), ctx)?,
            Some(memory),
            Some(cache),
            ctx,
        )?;
        self.io.logits(&h)
    }

    fn target_embed(&self, tokens: &Tensor, offset: usize, ctx: ForwardCtx) -> Result<Tensor> {
        self.decoder.embed(&self.io, tokens, offset, ctx)
    }
}

/// Either architecture, as the configuration says.
pub enum Model {
    Lm(LanguageModel),
    Seq2seq(Seq2Seq),
}

impl Model {
    /// Validates `cfg` and builds the model, creating (or, from a loaded store, looking up)
    /// its parameters in `params`.
    pub fn new(cfg: &ModelConfig, params: &ParamStore) -> std::result::Result<Self, ModelError> {
        cfg.validate()?;
        let vb = params.var_builder();
        let rotary = match cfg.positions {
            Positions::Rope => Some(Rotary::new(
                cfg.head_dim(),
                cfg.max_seq_len,
                cfg.rope_theta,
                params.dtype(),
                params.device(),
            )?),
            Positions::Learned | Positions::Sinusoidal | Positions::None => None,
        };
        Ok(match cfg.arch {
            Arch::Lm => Model::Lm(LanguageModel::new(vb, cfg, rotary.as_ref())?),
            Arch::Seq2seq => Model::Seq2seq(Seq2Seq::new(vb, cfg, rotary.as_ref())?),
        })
    }

    /// The precision of the model's products from now on (f32 when built): every forward pass,
    /// training or inference, takes it from here.
    pub fn set_precision(&mut self, precision: Precision) {
        match self {
            Model::Lm(m) => m.io.precision = precision,
            Model::Seq2seq(m) => m.io.precision = precision,
        }
    }

    /// The precision of the model's products.
    pub fn precision(&self) -> Precision {
        match self {
            Model::Lm(m) => m.io.precision,
            Model::Seq2seq(m) => m.io.precision,
        }
    }

    pub fn as_lm(&self) -> Option<&LanguageModel> {
        match self {
            Model::Lm(m) => Some(m),
            Model::Seq2seq(_) => None,
        }
    }
    pub fn as_seq2seq(&self) -> Option<&Seq2Seq> {
        match self {
            Model::Seq2seq(m) => Some(m),
            Model::Lm(_) => None,
        }
    }
}

/// Builds a model with freshly initialised parameters: the usual start of a training run.
pub fn init_model(
    cfg: &ModelConfig,
    seed: u64,
    dtype: DType,
    device: &candle_core::Device,
) -> std::result::Result<(Model, ParamStore), ModelError> {
    let params = ParamStore::new(seed, dtype, device);
    let model = Model::new(cfg, &params)?;
    Ok((model, params))
}
