//! The attention core from candle primitives: the reference the fused kernels are tested
//! against, and the form that runs where they do not (other dtypes, or with the CUDA kernel
//! switched off; on CUDA in bf16 its products are cuBLAS's bf16 GEMMs: [`Precision::matmul`]).

use candle_core::{DType, Result, Tensor, D};

use super::{AttentionOptions, AttentionTelemetry, AttnDims};
use crate::softmax::softmax_rows_unfused;
use crate::Precision;

/// softmax(q·kᵀ + mask)·v (with dropout on the probabilities) from candle primitives, for q
/// (B, T, H·d) already scaled, k and v (B, S, H_kv·d) and an additive mask broadcastable to
/// (B, H, T, S); returns (B, T, H·d) and the telemetry when asked. The reference for the kernel:
/// in [`Precision::Bf16`] q, k, v and the (dropped-out) probabilities are rounded before their
/// products, which candle then computes in f32 (on the CPU; on CUDA cuBLAS computes them in
/// bf16 with f32 sums and rounds their outputs too).
pub fn attention_unfused(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    opts: &AttentionOptions,
) -> Result<(Tensor, Option<AttentionTelemetry>)> {
    let dims = AttnDims::of(q.dims(), k.dims(), opts)?;
    let precision = opts.precision;
    let (logits, vh) = logits_by_head(q, k, v, dims, precision)?;
    let masked = match mask {
        Some(m) => logits.broadcast_add(m)?,
        None => logits.clone(),
    };
    let probs = softmax_rows_unfused(&masked)?;
    let telemetry = if opts.telemetry {
        Some(telemetry_unfused(&logits, mask, &probs)?)
    } else {
        None
    };
    let probs = match opts.dropout {
        // The fused mask where one runs (CPU, or CUDA with the dropout kernel on): the same
        // mask as [`crate::dropout_unfused`], without drawing it on the host and uploading it.
        Some((p, state)) if p > 0.0 => crate::dropout::dropout(&probs, p, state)?,
        _ => probs,
    };
    Ok((output_of_heads(&probs, &vh, dims, precision)?, telemetry))
}

/// q·kᵀ for every head as (B, H, T, S), query head h against KV head h / (H / H_kv), and v
/// split into its heads (B, H_kv, S, d) for [`output_of_heads`]: the heads split so that each
/// head's rows are contiguous, as candle's matmul needs.
pub(super) fn logits_by_head(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    dims: AttnDims,
    precision: Precision,
) -> Result<(Tensor, Tensor)> {
    let AttnDims { b, h, hkv, t, s, d } = dims;
    let heads = |x: &Tensor, len: usize, n: usize| x.reshape((b, len, n, d))?.transpose(1, 2);
    let (qh, kh, vh) = (
        heads(q, t, h)?,
        heads(k, s, hkv)?.contiguous()?,
        heads(v, s, hkv)?.contiguous()?,
    );
    let grouped = qh.contiguous()?.reshape((b, hkv, (h / hkv) * t, d))?;
    let logits = precision.matmul_t(&grouped, &kh)?.reshape((b, h, t, s))?;
    Ok((logits, vh))
}

/// The probabilities (B, H, T, S) times v's heads (from [`logits_by_head`]), the heads merged
/// back into (B, T, H·d).
pub(super) fn output_of_heads(
    probs: &Tensor,
    vh: &Tensor,
    dims: AttnDims,
    precision: Precision,
) -> Result<Tensor> {
    let AttnDims { b, h, hkv, t, s, d } = dims;
    precision
        .matmul(&probs.reshape((b, hkv, (h / hkv) * t, s))?, vh)?
        .reshape((b, h, t, d))?
        .transpose(1, 2)?
        .reshape((b, t, h * d))
}

/// Max |logit| over unmasked pairs and mean entropy of the rows, off the autograd graph.
fn telemetry_unfused(logits: &Tensor, mask: Option<&Tensor>, probs: &Tensor) -> Result<AttentionTelemetry> {
    let abs = logits.detach().to_dtype(DType::F32)?.abs()?;
    let abs = match mask {
        // Masked entries carry −1e9; keep only entries whose mask is 0.
        Some(m) => abs.broadcast_mul(&m.ge(-1.0)?.to_dtype(DType::F32)?)?,
        None => abs,
    };
    let probs = probs.detach().to_dtype(DType::F32)?;
    // (B, H, T): the entropy of every row.
    let rows = probs
        .clamp(1e-30f32, 1f32)?
        .log()?
        .mul(&probs)?
        .sum(D::Minus1)?
        .neg()?;
    let (b, h, t) = rows.dims3()?;
    Ok(AttentionTelemetry {
        max_logit: abs.max_all()?.to_scalar::<f32>()?,
        entropy: rows.mean_all()?.to_scalar::<f32>()?,
        entropy_by_position: rows.reshape((b * h, t))?.mean(0)?.to_vec1::<f32>()?,
    })
}
