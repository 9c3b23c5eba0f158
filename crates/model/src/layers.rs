//! The building blocks: linear maps, embeddings, norms, feed-forward blocks, dropout, and the
//! per-pass context that carries dropout randomness and telemetry.
//!
//! Every op here has a backward pass in candle 0.11. candle's own fused norm and softmax ops
//! (and `RmsNorm`/`LayerNorm::forward`) silently drop gradients, so the forms below call
//! Ember's kernels (the `ember-kernels` crate: hand-written backward passes) or differentiable
//! primitives.

use std::sync::Mutex;

use candle_core::{DType, Device, Result, Tensor, D};
use candle_nn::{Init, VarBuilder};

use ember_kernels::{
    ActivationMemory, BlockNorm, BlockProjection, GradSink, MlpActivation, MlpWeights, Precision,
};
use ember_rng::SplitMix64;

use crate::config::{MlpKind, ModelConfig, NormKind};
use crate::init::ProjectionRole;

/// What one forward pass needs besides its inputs.
#[derive(Clone, Copy, Default)]
pub struct ForwardCtx<'a> {
    /// Present in training: dropout is active and draws its masks from here.
    pub dropout: Option<&'a DropoutRng>,
    /// Present when the caller wants per-layer attention statistics.
    pub telemetry: Option<&'a Telemetry>,
    /// The precision of the pass's products: the model's own ([`crate::Model::set_precision`]),
    /// set by its entry points, so no caller passes it.
    pub(crate) precision: Precision,
    /// Present when the caller merges fused ops' parameter gradients into the pass's
    /// `GradStore` after `backward()` ([`GradSink::merge_into`]); only then do layers run
    /// their sub-blocks as one op each (`ember_kernels::attention_block`,
    /// `cross_attention_block`, `mlp_block`), and
    /// the token embedding's lookup leaves its weight's gradient there too
    /// (`ember_kernels::embedding_to_sink`).
    pub grad_sink: Option<&'a GradSink>,
    /// What the sink's fused sub-blocks keep for the backward pass:
    /// [`with_activations`](Self::with_activations).
    pub(crate) activations: ActivationMemory,
    /// The dtype of pre-norm branches' activations, where it is not the precision's own
    /// ([`Precision::branch_dtype`]): [`with_branch_dtype`](Self::with_branch_dtype).
    branch_dtype: Option<DType>,
}

impl<'a> ForwardCtx<'a> {
    /// Inference: no dropout, no telemetry.
    pub fn eval() -> Self {
        Self::default()
    }
    pub fn train(dropout: &'a DropoutRng) -> Self {
        Self {
            dropout: Some(dropout),
            ..Self::default()
        }
    }
    pub fn with_telemetry(mut self, telemetry: &'a Telemetry) -> Self {
        self.telemetry = Some(telemetry);
        self
    }
    /// Fused sub-blocks whose parameter gradients go to `sink`: the caller must merge it after
    /// `backward()`.
    pub fn with_grad_sink(mut self, sink: &'a GradSink) -> Self {
        self.grad_sink = Some(sink);
        self
    }
    /// Fused sub-blocks of the kinds `memory` names keep only their inputs and compute their
    /// activations again in the backward pass (`train.activations: recompute`, or
    /// `recompute_attention`); with a gradient sink only, and every sub-block of those kinds
    /// must then run as one op, or the pass fails naming the one that does not
    /// ([`ModelConfig::unfused_sub_blocks`] says so before any pass).
    pub fn with_activations(mut self, memory: ActivationMemory) -> Self {
        self.activations = memory;
        self
    }
    /// The dropout of a branch's output written into a residual stream of `elems` elements:
    /// (p, the state of its mask), the mask reserved from the pass's generator in training
    /// passes, (0, 0) otherwise. Every residual branch, fused or not, reserves through here.
    pub(crate) fn residual_dropout(&self, p: f64, elems: usize) -> (f64, u64) {
        match self.dropout {
            Some(rng) if p > 0.0 => (p, rng.reserve(elems)),
            _ => (0.0, 0),
        }
    }
    /// The same pass with its products in `precision`.
    pub(crate) fn in_precision(mut self, precision: Precision) -> Self {
        self.precision = precision;
        self
    }
    /// Pre-norm branches' activations in `dtype` (bf16 turns an f32 stream's branches bf16;
    /// f32 keeps them), in place of what the precision chooses ([`Precision::branch_dtype`]):
    /// the model tests run the bf16 branches of bf16 products on CUDA on the CPU this way,
    /// whose ops take bf16 activations with the contract of the CUDA kernels' bf16 variants.
    /// Passes without a gradient sink only (a sink's fused sub-blocks take the f32 stream).
    pub fn with_branch_dtype(mut self, dtype: DType) -> Self {
        self.branch_dtype = Some(dtype);
        self
    }
    /// The dtype of the activations of a pre-norm branch on the stream `x`: the norm writes it
    /// and the ops up to the branch's output projection keep it. Only an f32 stream's branches
    /// turn bf16; any other stream's (an f64 model's) keep its dtype.
    pub(crate) fn branch_dtype_of(&self, x: &Tensor) -> DType {
        let chosen = self
            .branch_dtype
            .unwrap_or_else(|| self.precision.branch_dtype(x.device()));
        match chosen {
            DType::BF16 if x.dtype() == DType::F32 => DType::BF16,
            _ => x.dtype(),
        }
    }
}

/// The random stream dropout masks are drawn from. Seed it per step (e.g. from the run seed
/// and step number) and resumed runs draw exactly the masks an uninterrupted run would.
pub struct DropoutRng(Mutex<SplitMix64>);

impl DropoutRng {
    pub fn new(seed: u64) -> Self {
        Self(Mutex::new(SplitMix64::new(seed)))
    }

    /// Inverted dropout: zero each element with probability `p`, scale survivors by 1/(1−p).
    pub fn apply(&self, x: &Tensor, p: f64) -> Result<Tensor> {
        if p <= 0.0 {
            return Ok(x.clone());
        }
        ember_kernels::dropout(x, p, self.reserve(x.elem_count()))
    }

    /// The state whose next `n` draws are this mask's, moving the stream past them exactly as
    /// n calls of `uniform` would (for the kernels that draw a mask themselves).
    pub fn reserve(&self, n: usize) -> u64 {
        let mut rng = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let state = rng.state();
        rng.skip(n as u64);
        state
    }
}

/// Dropout with probability `p` in training passes; the identity otherwise.
pub(crate) fn dropout(x: &Tensor, p: f64, ctx: ForwardCtx) -> Result<Tensor> {
    match ctx.dropout {
        Some(rng) if p > 0.0 => rng.apply(x, p),
        _ => Ok(x.clone()),
    }
}

/// Where a branch of a block writes: into the residual stream `stream`, after dropout with
/// probability `dropout` in training passes. The branch's output projection takes it, so that
/// projection, dropout and add are one op ([`Linear::forward_residual`]).
#[derive(Clone, Copy)]
pub struct Residual<'a> {
    pub stream: &'a Tensor,
    pub dropout: f64,
}

/// Attention statistics of one attention module in one forward pass.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AttentionStats {
    /// Parameter prefix of the module, e.g. `decoder.layers.0.self_attn`.
    pub module: String,
    /// Largest |pre-softmax logit| over unmasked query–key pairs. Unbounded logit growth is the
    /// instability QK-norm is meant to prevent (Dehghani et al. 2023; Wortsman et al. 2023).
    pub max_logit: f32,
    /// Mean entropy (nats) of the attention distributions; collapse towards 0 is the other symptom.
    pub entropy: f32,
    /// Mean entropy of each query position's distributions (T values), for evaluation by
    /// context length; not logged.
    #[serde(skip)]
    pub entropy_by_position: Vec<f32>,
}

/// Collects [`AttentionStats`] from every attention module during a forward pass.
#[derive(Default)]
pub struct Telemetry(Mutex<Vec<AttentionStats>>);

impl Telemetry {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn record(&self, stats: AttentionStats) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(stats);
    }
    /// The statistics recorded so far, in forward order; clears the collector.
    pub fn take(&self) -> Vec<AttentionStats> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// The sinusoidal position embeddings of positions `0..max_len` (max_len × dim, f32), in
/// fairseq's layout: the first half of each row holds sin(p·ωᵢ), the second cos(p·ωᵢ), with
/// ωᵢ = 10000^(−i / (dim/2 − 1)); a last column of zeros when `dim` is odd. Computed in f64.
pub fn sinusoids(max_len: usize, dim: usize, device: &Device) -> Result<Tensor> {
    let half = dim / 2;
    let step = 10_000f64.ln() / (half.max(2) - 1) as f64;
    let mut table = vec![0f32; max_len * dim];
    if dim > 0 {
        for (p, row) in table.chunks_mut(dim).enumerate() {
            for i in 0..half {
                let angle = p as f64 * (-(i as f64) * step).exp();
                row[i] = angle.sin() as f32;
                row[half + i] = angle.cos() as f32;
            }
        }
    }
    Tensor::from_vec(table, (max_len, dim), device)
}

/// A table of position embeddings added to a stack's token embeddings: learned (GPT-2's
/// `wpe`, a parameter) or the fixed sinusoids of Vaswani et al. (a constant).
#[derive(Clone)]
pub struct PositionTable {
    table: Tensor,
    max_len: usize,
}

impl PositionTable {
    /// A learned `max_len` × `dim` table, initialised (and named `weight`) like the token embedding.
    pub fn learned(vb: VarBuilder, max_len: usize, dim: usize, std: f64) -> Result<Self> {
        let table = Embedding::new(vb, max_len, dim, std)?.weight().clone();
        Ok(Self { table, max_len })
    }

    /// The fixed table of [`sinusoids`], stored in `dtype`.
    pub fn sinusoidal(max_len: usize, dim: usize, dtype: DType, device: &Device) -> Result<Self> {
        let table = sinusoids(max_len, dim, device)?.to_dtype(dtype)?;
        Ok(Self { table, max_len })
    }

    /// `x` (B, T, D) plus the embeddings of positions `offset..offset + T`.
    pub fn add(&self, x: &Tensor, offset: usize) -> Result<Tensor> {
        let t = x.dim(1)?;
        if offset + t > self.max_len {
            candle_core::bail!(
                "sequence position {} is beyond model.max_seq_len = {}, the length of the \
                 position table; raise max_seq_len (and retrain, for learned positions) or \
                 shorten the input",
                offset + t,
                self.max_len
            );
        }
        x.broadcast_add(&self.table.narrow(0, offset, t)?)
    }
}

/// `y = x Wᵀ`, plus a bias where the model has one (most modern LMs have none).
#[derive(Clone)]
pub struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
}

impl Linear {
    /// A weight of shape (out, in) drawn from normal(0, std).
    pub fn new(vb: VarBuilder, in_dim: usize, out_dim: usize, std: f64) -> Result<Self> {
        let init = Init::Randn {
            mean: 0.0,
            stdev: std,
        };
        Self::with_init(vb, in_dim, out_dim, init)
    }

    /// A weight of shape (out, in) drawn from `init`.
    pub fn with_init(vb: VarBuilder, in_dim: usize, out_dim: usize, init: Init) -> Result<Self> {
        let weight = vb.get_with_hints((out_dim, in_dim), "weight", init)?;
        Ok(Self { weight, bias: None })
    }

    /// The projection in `role` of `cfg`'s model, its weight (and, with `bias`, its bias) drawn
    /// as its `init_scheme` says (`normal_std` under `normal`).
    pub(crate) fn projection(
        vb: VarBuilder,
        cfg: &ModelConfig,
        role: ProjectionRole,
        (in_dim, out_dim): (usize, usize),
        normal_std: f64,
        bias: bool,
    ) -> Result<Self> {
        let init = cfg.init_scheme.projection(role, in_dim, out_dim, normal_std);
        let bias = match bias {
            true => Some(vb.get_with_hints(out_dim, "bias", cfg.init_scheme.bias(role, in_dim))?),
            false => None,
        };
        Ok(Self {
            bias,
            ..Self::with_init(vb, in_dim, out_dim, init)?
        })
    }

    /// A linear map that shares an existing weight (tied embeddings).
    pub fn from_weight(weight: Tensor) -> Self {
        Self { weight, bias: None }
    }

    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The bias the map adds, if any.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// The weight and bias, for an op that runs the map inside itself.
    pub(crate) fn as_block_projection(&self) -> BlockProjection<'_> {
        BlockProjection {
            weight: &self.weight,
            bias: self.bias.as_ref(),
        }
    }

    /// Whether the map adds a bias (the fused projections that rotate or scale their output
    /// take none).
    pub fn has_bias(&self) -> bool {
        self.bias.is_some()
    }

    /// (…, in) → (…, out): all leading dimensions are rows of one product.
    pub fn forward(&self, x: &Tensor, ctx: ForwardCtx) -> Result<Tensor> {
        match &self.bias {
            Some(b) => ember_kernels::linear_bias_in(x, &self.weight, b, ctx.precision),
            None => ember_kernels::linear_in(x, &self.weight, ctx.precision),
        }
    }

    /// `gelu_erf(x·Wᵀ + b)`: one op without a bias.
    pub fn forward_gelu(&self, x: &Tensor, ctx: ForwardCtx) -> Result<Tensor> {
        match &self.bias {
            Some(_) => ember_kernels::gelu_erf_in(&self.forward(x, ctx)?, ctx.precision),
            None => ember_kernels::linear_gelu_in(x, &self.weight, ctx.precision),
        }
    }

    /// `relu(x·Wᵀ + b)`: one op with a bias.
    pub fn forward_relu(&self, x: &Tensor, ctx: ForwardCtx) -> Result<Tensor> {
        match &self.bias {
            Some(b) => ember_kernels::linear_bias_relu_in(x, &self.weight, b, ctx.precision),
            None => self.forward(x, ctx)?.relu(),
        }
    }

    /// `to.stream + dropout(h·Wᵀ + b)`: the projection that ends a branch, written into the
    /// residual stream (dropout in training passes only); one op without a bias.
    pub fn forward_residual(&self, h: &Tensor, to: Residual, ctx: ForwardCtx) -> Result<Tensor> {
        let (p, state) = ctx.residual_dropout(to.dropout, to.stream.elem_count());
        if self.bias.is_none() {
            return ember_kernels::linear_residual_in(to.stream, h, &self.weight, p, state, ctx.precision);
        }
        // A bf16 branch's output joins the stream in its dtype (widened, exact).
        let y = self.forward(h, ctx)?.to_dtype(to.stream.dtype())?;
        ember_kernels::add_dropout(to.stream, &y, p, state)
    }
}

/// Token embedding table.
#[derive(Clone)]
pub struct Embedding {
    weight: Tensor,
    dim: usize,
}

impl Embedding {
    pub fn new(vb: VarBuilder, vocab: usize, dim: usize, std: f64) -> Result<Self> {
        let weight = vb.get_with_hints(
            (vocab, dim),
            "weight",
            Init::Randn {
                mean: 0.0,
                stdev: std,
            },
        )?;
        Ok(Self { weight, dim })
    }
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }
    /// (B, T) token ids → (B, T, dim). In a pass with a gradient sink the weight's gradient
    /// goes there ([`ember_kernels::embedding_to_sink`]: candle would hold a vocabulary-wide
    /// gradient of it while the activations are still held).
    pub fn forward(&self, ids: &Tensor, ctx: ForwardCtx) -> Result<Tensor> {
        if let Some(sink) = ctx.grad_sink {
            if let Some(x) = ember_kernels::embedding_to_sink(&self.weight, ids, sink)? {
                return Ok(x);
            }
        }
        let mut dims = ids.dims().to_vec();
        let flat = ids.flatten_all()?;
        let out = self.weight.index_select(&flat, 0)?;
        dims.push(self.dim);
        out.reshape(dims)
    }
}

/// RMSNorm or LayerNorm over vectors of `dim` elements along the last dimension (the whole of it
/// for the residual stream, one head of a projection for QK-norm).
#[derive(Clone)]
pub struct Norm {
    weight: Tensor,
    bias: Option<Tensor>,
    kind: NormKind,
    eps: f64,
}

impl Norm {
    /// A norm over vectors of size `dim`: gain initialised to 1 and, for LayerNorm, a bias
    /// initialised to 0 unless `with_bias` is false.
    pub fn new(vb: VarBuilder, kind: NormKind, dim: usize, eps: f64, with_bias: bool) -> Result<Self> {
        let weight = vb.get_with_hints(dim, "weight", Init::Const(1.0))?;
        let bias = match kind {
            NormKind::Layernorm if with_bias => Some(vb.get_with_hints(dim, "bias", Init::Const(0.0))?),
            _ => None,
        };
        Ok(Self {
            weight,
            bias,
            kind,
            eps,
        })
    }

    /// The norm's parameters, for an op that runs it inside itself.
    pub(crate) fn as_block_norm(&self) -> BlockNorm<'_> {
        BlockNorm {
            weight: &self.weight,
            bias: self.bias.as_ref(),
            rms: self.kind == NormKind::Rmsnorm,
            eps: self.eps,
        }
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // Fused on CPU f32 (one pass, hand-written backward); the unfused composition elsewhere.
        match self.kind {
            NormKind::Rmsnorm => ember_kernels::rms_norm(x, &self.weight, self.eps),
            NormKind::Layernorm => ember_kernels::layer_norm(x, &self.weight, self.bias.as_ref(), self.eps),
        }
    }

    /// [`forward`](Self::forward) with its output in `out` (a bf16 branch's activations from
    /// an f32 stream: computed in f32, rounded once).
    pub fn forward_as(&self, x: &Tensor, out: DType) -> Result<Tensor> {
        if out == x.dtype() {
            return self.forward(x);
        }
        match self.kind {
            NormKind::Rmsnorm => ember_kernels::rms_norm_as(x, &self.weight, self.eps, out),
            NormKind::Layernorm => {
                ember_kernels::layer_norm_as(x, &self.weight, self.bias.as_ref(), self.eps, out)
            }
        }
    }
}

/// Divides each vector of `d` elements along the last dimension by its L2 norm.
pub fn l2_normalize(x: &Tensor, d: usize, eps: f64) -> Result<Tensor> {
    let mut dims = x.dims().to_vec();
    let last = dims.pop().unwrap_or(d);
    dims.extend([last / d.max(1), d]);
    let v = x.reshape(dims)?;
    let norm = (v.sqr()?.sum_keepdim(D::Minus1)? + eps)?.sqrt()?;
    v.broadcast_div(&norm)?.reshape(x.shape())
}

/// The feed-forward block.
#[derive(Clone)]
pub struct Mlp {
    kind: MlpKind,
    gate: Option<Linear>,
    up: Linear,
    down: Linear,
}

impl Mlp {
    /// `cfg`'s MLP; `down_std` is the (smaller) normal init std of the projection back into the
    /// residual stream.
    pub fn new(vb: VarBuilder, cfg: &ModelConfig, down_std: f64) -> Result<Self> {
        let (d, ff, std) = (cfg.d_model, cfg.d_ff, cfg.init_std);
        let role = ProjectionRole::Mlp;
        let proj =
            |name: &str, dims, std| Linear::projection(vb.pp(name), cfg, role, dims, std, cfg.proj_bias);
        let gate = match cfg.mlp {
            MlpKind::Swiglu => Some(proj("gate_proj", (d, ff), std)?),
            MlpKind::Gelu | MlpKind::Relu => None,
        };
        Ok(Self {
            kind: cfg.mlp,
            gate,
            up: proj("up_proj", (d, ff), std)?,
            down: proj("down_proj", (ff, d), down_std)?,
        })
    }

    /// This block written into the stream `x` as one op (`ember_kernels::mlp_block`), opened
    /// by `norm` (pre-norm) or reading x itself (`None`: a post-norm branch, whose norm the
    /// caller applies to the output), its parameters' gradients going to the pass's sink;
    /// `None` where the pass has no sink or the op does not run (off the CPU, not f32): the
    /// caller then runs [`forward`](Self::forward). Its dropout mask is reserved as
    /// [`Linear::forward_residual`] reserves it, and only when the op runs, so the fused and
    /// unfused passes draw the same masks.
    pub(crate) fn forward_fused(
        &self,
        norm: Option<&Norm>,
        x: &Tensor,
        dropout: f64,
        ctx: ForwardCtx,
    ) -> Result<Option<Tensor>> {
        let Some(sink) = ctx.grad_sink else {
            return Ok(None);
        };
        let activation = match self.kind {
            MlpKind::Gelu => MlpActivation::Gelu,
            MlpKind::Relu => MlpActivation::Relu,
            MlpKind::Swiglu => MlpActivation::Swiglu,
        };
        let weights = MlpWeights {
            activation,
            gate: self.gate.as_ref().map(Linear::as_block_projection),
            up: self.up.as_block_projection(),
            down: self.down.as_block_projection(),
        };
        let mask = || ctx.residual_dropout(dropout, x.elem_count());
        let (norm, memory) = (norm.map(Norm::as_block_norm), ctx.activations);
        ember_kernels::mlp_block(x, norm, weights, ctx.precision, memory, sink, mask)
    }

    /// The block of `x` written into the residual stream `to`.
    pub fn forward(&self, x: &Tensor, to: Residual, ctx: ForwardCtx) -> Result<Tensor> {
        let hidden = match (&self.gate, self.kind) {
            (Some(gate), _) => {
                ember_kernels::swiglu_in(&gate.forward(x, ctx)?, &self.up.forward(x, ctx)?, ctx.precision)?
            }
            (None, MlpKind::Relu) => self.up.forward_relu(x, ctx)?,
            (None, _) => self.up.forward_gelu(x, ctx)?,
        };
        self.down.forward_residual(&hidden, to, ctx)
    }
}
