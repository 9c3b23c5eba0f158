//! The attention core softmax(q·kᵀ + mask)·v with grouped-query heads, attention-probability
//! dropout and per-module telemetry, forward and backward.
//!
//! The tensors stay in the layout the projections produce: q is (B, T, H·d) and k, v are
//! (B, S, H_kv·d), the heads of a position side by side; the output is (B, T, H·d), what the
//! output projection reads. No head split, no merge, no copy — and no extra node in the autograd
//! graph, each of which costs candle a zero-filled gradient and an add in the backward pass.
//! Query head h uses KV head h / (H / H_kv).
//!
//! The work is cut into one task per (batch, KV head), which handles the query heads of its
//! group in order; tasks write disjoint rows of every output and run in parallel
//! ([`crate::par`]). Telemetry is computed from the same logits and probabilities the step uses,
//! so asking for it never changes a training step's numbers.
//!
//! On CUDA (with the attention kernel switched on) the same layout goes to `cuda/attention.cu`:
//! where a (batch, KV head)'s keys and values fit in shared memory (the translation models'
//! short sequences), fused kernels with one warp per query row compute the forward pass and,
//! recomputing the probabilities and the dropout mask, the backward pass; longer sequences take
//! cuBLAS's products with the mask, softmax and telemetry in one kernel (the fallback of the
//! `cuda` module below).

use std::sync::{Arc, Mutex};

use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, CustomOp3, DType, Device, Layout, Result, Shape, Tensor};

use crate::dropout::DropoutOp;
use crate::gemm::Blocks;
use crate::held::Held;
use crate::host::{cpu_storage, cpu_storage_as, cpu_tensor_as, cpu_values, is_host, is_host_f32, with_data};
use crate::Precision;

mod live;
mod tasks;
mod unfused;
use live::Live;
use tasks::{backward_task, forward_task, Backward, Forward, Measured};
pub use unfused::attention_unfused;

/// Converts a 0/1 key mask (B, S) (1 = real token) into an additive mask (B, 1, 1, S) that
/// broadcasts over heads and queries. Masked logits get −1e9 rather than −∞: the probabilities
/// are still exactly 0 after `exp`, but a fully masked row (an empty source) stays finite.
pub fn padding_mask(key_mask: &Tensor, dtype: DType) -> Result<Tensor> {
    let (b, s) = key_mask.dims2()?;
    let keep = key_mask.to_dtype(dtype)?;
    ((keep - 1.0)? * 1e9)?.reshape((b, 1, 1, s))
}

/// Additive causal mask (1, 1, T, offset + T) for T new queries after `offset` cached positions.
pub fn causal_mask(t: usize, offset: usize, dtype: DType, device: &Device) -> Result<Tensor> {
    let s = offset + t;
    let values: Vec<f32> = (0..t)
        .flat_map(|i| (0..s).map(move |j| if j <= offset + i { 0.0 } else { -1e9 }))
        .collect();
    Tensor::from_vec(values, (1, 1, t, s), device)?.to_dtype(dtype)
}

/// How one attention call is to be computed besides its inputs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionOptions {
    /// Query heads H (q's last dimension is H·d).
    pub heads: usize,
    /// Key/value heads H_kv, a divisor of H (k's and v's last dimension is H_kv·d).
    pub kv_heads: usize,
    /// Dropout on the probabilities: (p, the SplitMix64 state whose draws make the mask). Element
    /// (b, h, t, s) of the (B, H, T, S) probabilities uses draw 1 + its row-major index; the
    /// caller moves its generator past B·H·T·S draws.
    pub dropout: Option<(f64, u64)>,
    /// Also measure the largest |logit| and the mean entropy.
    pub telemetry: bool,
    /// The precision of the four products (q·kᵀ and P·v, and the backward pass's): their
    /// operands, the probabilities among them, are rounded as [`Precision::round`] does; the
    /// softmax, the mask and the dropout stay f32.
    pub precision: Precision,
}

/// What one attention call measured (with [`AttentionOptions::telemetry`]).
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionTelemetry {
    /// Largest |q·kᵀ| over unmasked query–key pairs (q already scaled).
    pub max_logit: f32,
    /// Mean entropy (nats) of the attention distributions (before dropout).
    pub entropy: f32,
    /// The mean entropy of each query position's distributions (over batch rows and heads): T
    /// values, for seeing how focused attention stays as the context grows.
    pub entropy_by_position: Vec<f32>,
}

/// [`attention_unfused`] fused on CPU f32 tensors, its four products in `opts.precision`
/// (refused, naming the CPU feature, where this CPU cannot run bf16 products); the mask is
/// treated as a constant: it gets no gradient. q, k and v may also be bf16 activations
/// (computed on their widened values; the output in v's dtype, each gradient in its input's;
/// the backward pass reads the output as stored, so a bf16 output's rounding reaches the
/// gradients through rowsum(dO ∘ O)). On CUDA the CUDA kernels, in either precision, on f32
/// tensors or (with the `bf16` kernels switched on too) bf16 ones, the same contract; the
/// unfused form elsewhere.
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    opts: &AttentionOptions,
) -> Result<(Tensor, Option<AttentionTelemetry>)> {
    #[cfg(feature = "cuda")]
    {
        if cuda::takes(q, k, v, mask) {
            return cuda::attention(q, k, v, mask, opts);
        }
    }
    if !(is_host(q) && is_host(k) && is_host(v) && mask.is_none_or(is_host_f32)) {
        return attention_unfused(q, k, v, mask, opts);
    }
    opts.precision.check_cpu()?;
    if v.dims() != k.dims() {
        bail!(
            "attention: k {:?} and v {:?} differ in shape",
            k.shape(),
            v.shape()
        );
    }
    let op = AttnOp::cpu(q.dims(), k.dims(), mask, opts, q.track_op())?;
    let telemetry = op.telemetry_slot();
    let out = q
        .contiguous()?
        .apply_op3(&k.contiguous()?, &v.contiguous()?, op)?;
    Ok((out, telemetry.and_then(|slot| take(&slot))))
}

/// Whether a CUDA call with q of shape `q` and k, v of shape `k` runs the fused kernels (the
/// forward pass, and the backward pass too when `backward`), rather than cuBLAS's products with
/// the fused softmax: what they hold fits in shared memory. Always false in a build without CUDA.
#[doc(hidden)]
pub fn cuda_fuses(q: &[usize], k: &[usize], opts: &AttentionOptions, backward: bool) -> bool {
    #[cfg(feature = "cuda")]
    {
        AttnDims::of(q, k, opts).is_ok_and(|d| cuda::fused_fits(d, backward))
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (q, k, opts, backward);
        false
    }
}

/// The telemetry from each (B, H, T) row's largest unmasked |logit| and entropy (row-major), as
/// the CPU kernel combines its rows'.
#[cfg(any(test, feature = "cuda"))]
fn telemetry_of_rows(dims: AttnDims, row_max: &[f32], row_ent: &[f32]) -> AttentionTelemetry {
    let (mut max_logit, mut sum) = (0f32, 0f64);
    let mut by_position = vec![0f64; dims.t];
    for (r, (&m, &h)) in row_max.iter().zip(row_ent).enumerate() {
        if m > max_logit {
            max_logit = m;
        }
        sum += h as f64;
        by_position[r % dims.t] += h as f64;
    }
    let rows = (dims.b * dims.h * dims.t).max(1) as f64;
    let per_position = (dims.b * dims.h).max(1) as f64;
    AttentionTelemetry {
        max_logit,
        entropy: (sum / rows) as f32,
        entropy_by_position: by_position.iter().map(|&h| (h / per_position) as f32).collect(),
    }
}

/// Shapes of one attention call.
#[derive(Debug, Clone, Copy)]
struct AttnDims {
    b: usize,
    h: usize,
    hkv: usize,
    t: usize,
    s: usize,
    d: usize,
}

impl AttnDims {
    fn of(q: &[usize], k: &[usize], opts: &AttentionOptions) -> Result<Self> {
        let (&[b, t, qw], &[bk, s, kw]) = (q, k) else {
            bail!("attention: expected q (B, T, H·d) and k, v (B, S, H_kv·d), got {q:?} and {k:?}");
        };
        let (h, hkv) = (opts.heads, opts.kv_heads);
        if h == 0 || hkv == 0 || h % hkv != 0 || qw % h != 0 || bk != b || kw != qw / h * hkv {
            bail!("attention: q {q:?} and k {k:?} do not fit {h} query and {hkv} key/value heads");
        }
        Ok(Self {
            b,
            h,
            hkv,
            t,
            s,
            d: qw / h,
        })
    }
    fn group(&self) -> usize {
        self.h / self.hkv
    }
    /// Offset of row (batch `bi`, position `ti`, query head `hq`) of q, o and their gradients.
    fn q_row(&self, bi: usize, ti: usize, hq: usize) -> usize {
        ((bi * self.t + ti) * self.h + hq) * self.d
    }
    /// Offset of row (batch `bi`, position `si`, KV head `kh`) of k, v and their gradients.
    fn kv_row(&self, bi: usize, si: usize, kh: usize) -> usize {
        ((bi * self.s + si) * self.hkv + kh) * self.d
    }
    /// Offset of head `hq`'s (T, S) probabilities in (B, H, T, S).
    fn probs_block(&self, bi: usize, hq: usize) -> usize {
        (bi * self.h + hq) * self.t * self.s
    }
}

pub(crate) struct AttnOp {
    dims: AttnDims,
    precision: Precision,
    /// The additive mask broadcast (by strides) to (B, H, T, S).
    mask: Option<Tensor>,
    dropout: Option<DropoutOp>,
    /// Filled by the forward pass when telemetry was asked for (the caller holds a clone).
    telemetry: Option<TelemetrySlot>,
    /// The forward pass's probabilities, taken by the backward pass, which recomputes them
    /// where they are not there (`None`: never kept; an empty slot: not kept by this forward
    /// pass, [`Self::forward_values_with`]): the blocks the tasks compute ([`Self::live`]),
    /// all of (B, H, T, S) in f32, the live blocks alone in bf16 — the dead ones hold exact
    /// zeros, which the backward pass writes again: a causal mask's take 44% of T = S = 256.
    /// (f32 could store its live blocks alone too, for the same bits: that measured a step up
    /// to 1.1× as long at nanoGPT's standard shape for 7% of its heap, docs/performance.md.)
    probs: Option<Mutex<Option<Vec<f32>>>>,
    /// Whether the tasks skip the mask's dead blocks ([`Self::live`]).
    skip_dead: bool,
    /// The live blocks, found by the first pass and kept for the backward pass (the mask does
    /// not change between them).
    live: std::sync::OnceLock<Live>,
}

/// An additive mask as (data, (b, h, t, s) element strides, offset).
type MaskView<'a> = Option<(&'a [f32], [usize; 4], usize)>;

/// Where an attention op leaves its telemetry.
pub(crate) type TelemetrySlot = Arc<Mutex<Option<AttentionTelemetry>>>;

/// What a mutex-guarded slot holds, taken out (a poisoned lock still gives its value).
pub(crate) fn take<T>(slot: &Mutex<Option<T>>) -> Option<T> {
    slot.lock().unwrap_or_else(|e| e.into_inner()).take()
}

impl AttnOp {
    /// The CPU op for q of shape `q` and k, v of shape `k`; it keeps its probabilities for a
    /// backward pass (`backward`) where they are small enough.
    pub(crate) fn cpu(
        q: &[usize],
        k: &[usize],
        mask: Option<&Tensor>,
        opts: &AttentionOptions,
        backward: bool,
    ) -> Result<Self> {
        let dims = AttnDims::of(q, k, opts)?;
        let mask = match mask {
            Some(m) => Some(m.detach().broadcast_as((dims.b, dims.h, dims.t, dims.s))?),
            None => None,
        };
        // Keeping the probabilities for the backward pass spares it a q·kᵀ product and a
        // softmax per head, for at most B·H·T·S floats (a mask's dead blocks are not kept):
        // done when that is at most four times what q holds (S ≤ 4d), so long sequences still
        // recompute instead of storing T² per head.
        let keep = backward && dims.s <= 4 * dims.d;
        Ok(Self {
            dims,
            precision: opts.precision,
            mask,
            dropout: opts.dropout.and_then(|(p, state)| DropoutOp::new(p, state)),
            telemetry: opts.telemetry.then(|| Arc::new(Mutex::new(None))),
            probs: keep.then(|| Mutex::new(None)),
            skip_dead: opts.precision == Precision::Bf16,
            live: std::sync::OnceLock::new(),
        })
    }

    /// Where the forward pass leaves what it measured (with telemetry asked for): the caller
    /// keeps a clone, and takes the measurement out after the pass.
    pub(crate) fn telemetry_slot(&self) -> Option<TelemetrySlot> {
        self.telemetry.clone()
    }

    /// The output (B, T, H·d) of q, k and v, with the telemetry and the probabilities kept
    /// where asked for.
    pub(crate) fn forward_values(&self, q: &[f32], k: &[f32], v: &[f32]) -> Result<Vec<f32>> {
        self.forward_values_with(q, k, v, true, true)
    }

    /// [`Self::forward_values`], keeping the probabilities only if `keep_probs` too and
    /// measuring only if `measure` too: a sub-block that recomputes its activations in the
    /// backward pass keeps none in its forward pass, and measures nothing again in the backward
    /// pass.
    pub(crate) fn forward_values_with(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        keep_probs: bool,
        measure: bool,
    ) -> Result<Vec<f32>> {
        let dims = self.dims;
        let measure = measure && self.telemetry.is_some();
        let out = Blocks::new(q.len());
        let (per_task, kept) = self.with_mask(|mask| {
            let live = self.live(mask);
            let kept_at = live.kept_offsets(dims);
            let kept = (keep_probs && self.probs.is_some()).then(|| Blocks::new(kept_at[dims.b * dims.h]));
            let task = Forward {
                dims,
                precision: self.precision,
                q,
                k,
                v,
                mask,
                live,
                dropout: self.dropout,
                out: &out,
                kept: kept.as_ref(),
                kept_at: &kept_at,
                measure,
            };
            let per_task: Vec<Mutex<Measured>> = (0..dims.b * dims.hkv).map(|_| Mutex::default()).collect();
            crate::par::for_each(per_task.len(), |i| {
                let m = forward_task(&task, i / dims.hkv, i % dims.hkv);
                *per_task[i].lock().unwrap_or_else(|e| e.into_inner()) = m;
            });
            Ok((per_task, kept))
        })?;
        // Combined in task order, whichever thread ran which task.
        let measured = per_task
            .into_iter()
            .map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()))
            .fold(Measured::default(), |mut acc, m| {
                acc.max_abs = acc.max_abs.max(m.max_abs);
                acc.entropy_sum += m.entropy_sum;
                acc.by_position.resize(m.by_position.len(), 0.0);
                for (a, x) in acc.by_position.iter_mut().zip(&m.by_position) {
                    *a += x;
                }
                acc
            });
        if let Some(slot) = self.telemetry.as_ref().filter(|_| measure) {
            let rows = (dims.b * dims.h * dims.t).max(1) as f64;
            let per_position = (dims.b * dims.h).max(1) as f64;
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(AttentionTelemetry {
                max_logit: measured.max_abs,
                entropy: (measured.entropy_sum / rows) as f32,
                entropy_by_position: measured
                    .by_position
                    .iter()
                    .map(|&h| (h / per_position) as f32)
                    .collect(),
            });
        }
        if let (Some(slot), Some(kept)) = (&self.probs, kept) {
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(kept.finish());
        }
        Ok(out.finish())
    }

    /// The gradients (dq, dk, dv) from q, k, v, the output o and its gradient go.
    pub(crate) fn backward_values(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        o: &[f32],
        go: &[f32],
    ) -> Result<(Vec<f32>, Vec<f32>, Vec<f32>)> {
        let [q, k, v] = [q, k, v].map(|x| Held::F32(x.into()));
        self.backward_held(&q, &k, &v, o, go)
    }

    /// [`Self::backward_values`] for q, k and v as a sub-block holds them: each task packs the
    /// rows it reads of bf16-held values for its products from their bits ([`tasks`]), the
    /// pairs the products would round from a widened copy of the whole tensors, with no copy.
    pub(crate) fn backward_held(
        &self,
        q: &Held<'_>,
        k: &Held<'_>,
        v: &Held<'_>,
        o: &[f32],
        go: &[f32],
    ) -> Result<(Vec<f32>, Vec<f32>, Vec<f32>)> {
        let dims = self.dims;
        let kept = self.probs.as_ref().and_then(take);
        let (dq, dk, dv) = (Blocks::new(q.len()), Blocks::new(k.len()), Blocks::new(v.len()));
        self.with_mask(|mask| {
            let live = self.live(mask);
            let kept_at = live.kept_offsets(dims);
            let kept = kept.filter(|p| p.len() == kept_at[dims.b * dims.h]);
            let task = Backward {
                dims,
                precision: self.precision,
                q,
                k,
                v,
                o,
                go,
                mask,
                live,
                dropout: self.dropout,
                kept: kept.as_deref(),
                kept_at: &kept_at,
                dq: &dq,
                dk: &dk,
                dv: &dv,
            };
            crate::par::for_each(dims.b * dims.hkv, |i| {
                backward_task(&task, i / dims.hkv, i % dims.hkv)
            });
            Ok(())
        })?;
        Ok((dq.finish(), dk.finish(), dv.finish()))
    }

    /// The live blocks of the probabilities under `mask`, skipped in bf16 only: there every
    /// product is one chain over k per element, so leaving out the dead (exactly zero) terms
    /// keeps the bits, and the causal half of the work goes. f32's kernels sum long k in
    /// chunks whose boundaries would move with a block's start (dk and dv begin at its first
    /// live query row), so f32 runs every block whole, as before.
    fn live(&self, mask: MaskView<'_>) -> &Live {
        self.live
            .get_or_init(|| Live::of(self.dims, mask, self.skip_dead))
    }

    /// Runs `f` with the mask's data and strides.
    fn with_mask<R>(&self, f: impl FnOnce(MaskView<'_>) -> Result<R>) -> Result<R> {
        match &self.mask {
            None => f(None),
            Some(m) => {
                let (st, l) = m.storage_and_layout();
                let data = cpu_storage(&st)?;
                let s = l.stride();
                f(Some((data, [s[0], s[1], s[2], s[3]], l.start_offset())))
            }
        }
    }
}

impl CustomOp3 for AttnOp {
    fn name(&self) -> &'static str {
        "ember-attention"
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
        let (q, k, v) = (cpu_values(s1, l1)?, cpu_values(s2, l2)?, cpu_values(s3, l3)?);
        let out = self.forward_values(&q, &k, &v)?;
        Ok((cpu_storage_as(out, s3.dtype())?, l1.shape().clone()))
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        Ok((cuda::forward(self, s1, l1, s2, l2, s3, l3)?, l1.shape().clone()))
    }
    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        #[cfg(feature = "cuda")]
        {
            if q.device().is_cuda() {
                let (dq, dk, dv) = cuda::backward(self, q, k, v, res, g)?;
                return Ok((Some(dq), Some(dk), Some(dv)));
            }
        }
        let (dq, dk, dv) = with_data([q, k, v, res, g], |[q, k, v, o, go]| {
            self.backward_values(q, k, v, o, go)
        })?;
        Ok((
            Some(cpu_tensor_as(dq, q.shape(), q.dtype())?),
            Some(cpu_tensor_as(dk, k.shape(), k.dtype())?),
            Some(cpu_tensor_as(dv, v.shape(), v.dtype())?),
        ))
    }
}

#[cfg(feature = "cuda")]
mod cuda;

#[cfg(test)]
mod held_tests;
#[cfg(test)]
mod live_tests;
#[cfg(test)]
mod mirror;
#[cfg(test)]
mod timing;
