//! The CUDA path: the launches of `cuda/attention.cu`, and for sequences whose keys and values
//! do not fit the fused kernels' shared memory, cuBLAS's products around one kernel for the
//! mask, the softmax and the telemetry.
//!
//! In bf16 ([`Precision::Bf16`]) the fused kernels round their products' operands to bf16 and
//! sum in f32, the CPU kernel's arithmetic (their `round` argument); the longer sequences' path
//! takes cuBLAS's bf16 GEMMs ([`Precision::matmul`], whose outputs are rounded to bf16 too)
//! around the same f32 softmax kernel.
//!
//! q, k and v may also be bf16 activations (with the `bf16` kernels switched on): the fused
//! kernels' `_bf16` variants widen them as they read them and round the output (and dq, dk, dv)
//! once; the longer sequences' path runs on them widened to f32, its output rounded back.

use std::sync::{Arc, Mutex};

use candle_core::backend::BackendStorage as _;
use candle_core::cuda::cudarc::driver::{CudaSlice, CudaView, LaunchConfig};
use candle_core::cuda::{CudaDevice, CudaStorage};
use candle_core::{bail, CpuStorage, CustomOp1, DType, Layout, Result, Shape, Storage, Tensor};

use super::unfused::{logits_by_head, output_of_heads};
use super::{telemetry_of_rows, AttentionOptions, AttentionTelemetry, AttnDims, AttnOp};
use crate::cuda::device::{
    alloc, alloc_of, kernel_name, launch, storage, tensor, view, view_of, with_cuda, with_element, Element,
    WrapErr, ATTENTION,
};
use crate::cuda::{takes as kernel_on, Kernel};
use crate::dropout::DropoutOp;
use crate::softmax::cuda::warp_rows;
use crate::Precision;

/// Warps of a forward block, and the query rows it handles (`ember_attn_fwd`).
const FWD_WARPS: u32 = 4;
const FWD_ROWS: u32 = 32;
/// Warps of a backward block: the query rows of one round (`ember_attn_bwd`).
const BWD_WARPS: u32 = 8;
/// Dynamic shared memory a block may have without opting in to more.
const SHARED: usize = 48 * 1024;

type Slot = Arc<Mutex<Option<AttentionTelemetry>>>;

/// Whether a call takes the CUDA kernels: q, k and v of one dtype (f32, or bf16 with the
/// `bf16` kernels on too) and an f32 mask, all on q's CUDA device, with the attention kernel
/// switched on (in either precision of the products).
pub(super) fn takes(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> bool {
    let here = |t: &Tensor| kernel_on(t, Kernel::Attention) && t.device().same_device(q.device());
    let one_dtype = k.dtype() == q.dtype() && v.dtype() == q.dtype();
    one_dtype && here(q) && here(k) && here(v) && mask.is_none_or(|m| m.dtype() == DType::F32 && here(m))
}

/// Bytes of `ember_attn_fwd`'s shared memory (the layout in attention.cu).
fn fwd_shared(d: AttnDims) -> usize {
    let kp = d.d | 1;
    4 * (d.s * kp + d.s * d.d + FWD_WARPS as usize * (d.d + d.s))
}

/// Bytes of `ember_attn_bwd`'s shared memory (the layout in attention.cu).
fn bwd_shared(d: AttnDims) -> usize {
    let kp = d.d | 1;
    4 * (2 * d.s * kp + 2 * d.s * d.d + BWD_WARPS as usize * 2 * (d.d + d.s))
}

/// The kernels take H, H_kv, T, S and d as 32-bit scalars.
fn fits_u32(d: AttnDims) -> bool {
    [d.h, d.hkv, d.t, d.s, d.d]
        .iter()
        .all(|&x| x <= u32::MAX as usize)
}

/// Whether the fused kernels serve shapes `d`: the forward pass (and the backward pass when
/// `backward`) fits in shared memory, and the grid in its limits.
pub(super) fn fused_fits(d: AttnDims, backward: bool) -> bool {
    fits_u32(d)
        && d.b.saturating_mul(d.h) <= i32::MAX as usize
        && d.t.div_ceil(FWD_ROWS as usize) <= 65_535
        && fwd_shared(d) <= SHARED
        && (!backward || bwd_shared(d) <= SHARED)
}

/// [`super::attention`] on CUDA: the fused kernels where they fit (the backward pass's too
/// when a gradient may be asked for), else [`fallback`].
pub(super) fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    opts: &AttentionOptions,
) -> Result<(Tensor, Option<AttentionTelemetry>)> {
    let dims = AttnDims::of(q.dims(), k.dims(), opts)?;
    if v.dims() != k.dims() {
        bail!(
            "attention: k {:?} and v {:?} differ in shape",
            k.shape(),
            v.shape()
        );
    }
    if !fits_u32(dims) {
        bail!("attention: {dims:?} is beyond the CUDA kernels' 32-bit sizes");
    }
    let mask = match mask {
        Some(m) => Some(m.detach().broadcast_as((dims.b, dims.h, dims.t, dims.s))?),
        None => None,
    };
    let dropout = opts.dropout.and_then(|(p, state)| DropoutOp::new(p, state));
    let backward = q.track_op() || k.track_op() || v.track_op();
    let telemetry: Option<Slot> = opts.telemetry.then(|| Arc::new(Mutex::new(None)));
    let out = if fused_fits(dims, backward) {
        let op = AttnOp {
            dims,
            precision: opts.precision,
            mask,
            dropout,
            telemetry: telemetry.clone(),
            probs: None,
            // The CPU tasks' setting: the CUDA kernels compute every block.
            skip_dead: false,
            live: std::sync::OnceLock::new(),
        };
        q.contiguous()?
            .apply_op3(&k.contiguous()?, &v.contiguous()?, op)?
    } else if q.dtype() == DType::F32 {
        fallback(q, k, v, mask, dims, opts, telemetry.clone())?
    } else {
        // cuBLAS's products and the f32 softmax kernel on the widened activations.
        let wide = |t: &Tensor| t.to_dtype(DType::F32);
        fallback(
            &wide(q)?,
            &wide(k)?,
            &wide(v)?,
            mask,
            dims,
            opts,
            telemetry.clone(),
        )?
        .to_dtype(q.dtype())?
    };
    let telemetry = telemetry.and_then(|t| t.lock().unwrap_or_else(|e| e.into_inner()).take());
    Ok((out, telemetry))
}

/// Runs `f` on the mask's elements from its first (`None` without a mask) and its (b, h, t,
/// s) strides, 0 along a broadcast dimension.
fn with_mask<R>(
    mask: Option<&Tensor>,
    f: impl FnOnce(Option<&CudaView<'_, f32>>, [u64; 4]) -> Result<R>,
) -> Result<R> {
    let Some(m) = mask else {
        return f(None, [0; 4]);
    };
    let (st, l) = m.storage_and_layout();
    let Storage::Cuda(c) = &*st else {
        bail!("attention: the mask is not on the CUDA device");
    };
    let data = c.as_cuda_slice::<f32>()?.slice(l.start_offset()..);
    let s = l.stride();
    f(Some(&data), [s[0] as u64, s[1] as u64, s[2] as u64, s[3] as u64])
}

/// The kernels' `round`: 1 where the products' operands are rounded to bf16.
fn rounds(op: &AttnOp) -> i32 {
    (op.precision == Precision::Bf16) as i32
}

/// (dropout on, state, threshold, keep) as the kernels take them.
fn dropout_args(d: Option<DropoutOp>) -> (i32, u64, u64, f32) {
    match d {
        Some(op) => {
            let (state, threshold, keep) = op.parts();
            (1, state, threshold, keep)
        }
        None => (0, 0, 0, 1.0),
    }
}

/// The per-row telemetry buffers: `rows` floats each when measuring, else a placeholder the
/// kernel never touches.
fn telemetry_buffers(
    dev: &CudaDevice,
    measure: bool,
    rows: usize,
) -> Result<(CudaSlice<f32>, CudaSlice<f32>)> {
    let n = if measure { rows } else { 1 };
    Ok((alloc(dev, n)?, alloc(dev, n)?))
}

/// Reads the rows' measurements back (a synchronisation: only on steps that log) into `slot`.
fn record(
    slot: &Slot,
    dev: &CudaDevice,
    dims: AttnDims,
    row_max: &CudaSlice<f32>,
    row_ent: &CudaSlice<f32>,
) -> Result<()> {
    let rows = dims.b * dims.h * dims.t;
    let measured = if rows == 0 {
        telemetry_of_rows(dims, &[], &[])
    } else {
        let stream = dev.cuda_stream();
        let (m, h) = (stream.clone_dtoh(row_max).w()?, stream.clone_dtoh(row_ent).w()?);
        telemetry_of_rows(dims, &m[..rows], &h[..rows])
    };
    *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(measured);
    Ok(())
}

/// `ember_attn_fwd` (`_bf16` for bf16 activations) on q, k, v (contiguous, the projections'
/// layout): the output (B, T, H·d) in their dtype.
pub(super) fn forward(
    op: &AttnOp,
    s1: &CudaStorage,
    l1: &Layout,
    s2: &CudaStorage,
    l2: &Layout,
    s3: &CudaStorage,
    l3: &Layout,
) -> Result<CudaStorage> {
    let d = op.dims;
    if !fused_fits(d, false) {
        bail!("ember attention: the fused forward pass does not fit {d:?}");
    }
    with_element!(s1.dtype(), E => forward_as::<E>(op, (s1, l1), (s2, l2), (s3, l3)))
}

fn forward_as<E: Element>(
    op: &AttnOp,
    (s1, l1): (&CudaStorage, &Layout),
    (s2, l2): (&CudaStorage, &Layout),
    (s3, l3): (&CudaStorage, &Layout),
) -> Result<CudaStorage> {
    let d = op.dims;
    let dev = &s1.device;
    let (q, k, v) = (
        view_of::<E>(s1, l1)?,
        view_of::<E>(s2, l2)?,
        view_of::<E>(s3, l3)?,
    );
    // Where there is no mask the kernel reads none; q's address stands in for the pointer.
    // SAFETY: an empty view, never read.
    let no_mask = unsafe { q.transmute::<f32>(0) }.expect("an empty view fits any buffer");
    let mut out = alloc_of::<E>(dev, q.len())?;
    let rows = d.b * d.h * d.t;
    let measure = op.telemetry.is_some();
    let (mut row_max, mut row_ent) = telemetry_buffers(dev, measure, rows)?;
    let (has_dropout, state, threshold, keep) = dropout_args(op.dropout);
    if rows > 0 {
        let cfg = LaunchConfig {
            grid_dim: ((d.b * d.h) as u32, d.t.div_ceil(FWD_ROWS as usize) as u32, 1),
            block_dim: (FWD_WARPS * 32, 1, 1),
            shared_mem_bytes: fwd_shared(d) as u32,
        };
        with_mask(op.mask.as_ref(), |mask, ms| {
            launch!(dev, ATTENTION, kernel_name("ember_attn_fwd", &[E::NAME]), cfg;
                &q, &k, &v, mask.unwrap_or(&no_mask), &mut out, &mut row_max, &mut row_ent,
                &(d.h as u32), &(d.hkv as u32), &(d.t as u32), &(d.s as u32), &(d.d as u32),
                &FWD_ROWS, &(mask.is_some() as i32), &ms[0], &ms[1], &ms[2], &ms[3],
                &has_dropout, &state, &threshold, &keep, &(measure as i32), &rounds(op))
        })?;
    }
    if let Some(slot) = &op.telemetry {
        record(slot, dev, d, &row_max, &row_ent)?;
    }
    Ok(storage(out, dev))
}

/// `ember_attn_bwd` (`_bf16` for bf16 activations): (dq, dk, dv) from q, k, v, the forward
/// output `o` and its gradient `go`, all of one dtype.
pub(super) fn backward(
    op: &AttnOp,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    o: &Tensor,
    go: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let d = op.dims;
    if !fused_fits(d, true) {
        bail!("ember attention: the fused backward pass does not fit {d:?}");
    }
    if [k, v, o, go].iter().any(|t| t.dtype() != q.dtype()) {
        bail!("ember attention backward: q, k, v, the output and its gradient differ in dtype");
    }
    with_element!(q.dtype(), E => backward_as::<E>(op, q, k, v, o, go))
}

fn backward_as<E: Element>(
    op: &AttnOp,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    o: &Tensor,
    go: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let d = op.dims;
    let (has_dropout, state, threshold, keep) = dropout_args(op.dropout);
    with_cuda(
        [q, k, v, o, go],
        |[(sq, lq), (sk, lk), (sv, lv), (so, lo), (sg, lg)]| {
            let dev = &sq.device;
            let (qv, kv, vv) = (
                view_of::<E>(sq, lq)?,
                view_of::<E>(sk, lk)?,
                view_of::<E>(sv, lv)?,
            );
            let (ov, gv) = (view_of::<E>(so, lo)?, view_of::<E>(sg, lg)?);
            if ov.len() != qv.len() || gv.len() != qv.len() {
                bail!("ember attention backward: the output or its gradient is not q's size");
            }
            // SAFETY: an empty view, never read (the kernel reads no mask without one).
            let no_mask = unsafe { qv.transmute::<f32>(0) }.expect("an empty view fits any buffer");
            let mut dq = alloc_of::<E>(dev, qv.len())?;
            let mut dk = alloc_of::<E>(dev, kv.len())?;
            let mut dv = alloc_of::<E>(dev, vv.len())?;
            if d.b * d.hkv > 0 {
                let cfg = LaunchConfig {
                    grid_dim: ((d.b * d.hkv) as u32, 1, 1),
                    block_dim: (BWD_WARPS * 32, 1, 1),
                    shared_mem_bytes: bwd_shared(d) as u32,
                };
                with_mask(op.mask.as_ref(), |mask, ms| {
                    launch!(dev, ATTENTION, kernel_name("ember_attn_bwd", &[E::NAME]), cfg;
                        &qv, &kv, &vv, &ov, &gv, mask.unwrap_or(&no_mask), &mut dq, &mut dk, &mut dv,
                        &(d.h as u32), &(d.hkv as u32), &(d.t as u32), &(d.s as u32), &(d.d as u32),
                        &(mask.is_some() as i32), &ms[0], &ms[1], &ms[2], &ms[3],
                        &has_dropout, &state, &threshold, &keep, &rounds(op))
                })?;
            }
            Ok((
                tensor(dq, dev, lq.shape()),
                tensor(dk, dev, lk.shape()),
                tensor(dv, dev, lv.shape()),
            ))
        },
    )
}

/// For sequences too long for the fused kernels: the heads split for cuBLAS (candle's
/// matmul needs each head's rows contiguous), q·kᵀ, [`MaskedSoftmax`] (the mask, softmax and
/// telemetry in one kernel), the dropout kernel, the product with v and the heads merged
/// back, the products in `opts.precision`; candle's autograd differentiates it. `mask` is
/// broadcast to (B, H, T, S).
fn fallback(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<Tensor>,
    dims: AttnDims,
    opts: &AttentionOptions,
    telemetry: Option<Slot>,
) -> Result<Tensor> {
    let (logits, vh) = logits_by_head(q, k, v, dims, opts.precision)?;
    let probs = logits.contiguous()?.apply_op1(MaskedSoftmax {
        dims,
        mask,
        telemetry,
    })?;
    let probs = match opts.dropout {
        // The same counter mask as the fused kernels and the CPU's.
        Some((p, state)) if p > 0.0 => crate::dropout::dropout(&probs, p, state)?,
        _ => probs,
    };
    output_of_heads(&probs, &vh, dims, opts.precision)
}

/// softmax(logits + mask) over contiguous (B, H, T, S) logits, measuring the telemetry when
/// asked (`ember_attn_softmax`); its backward pass is softmax's (the mask is a constant).
struct MaskedSoftmax {
    dims: AttnDims,
    /// The additive mask broadcast (by strides) to (B, H, T, S).
    mask: Option<Tensor>,
    telemetry: Option<Slot>,
}

impl CustomOp1 for MaskedSoftmax {
    fn name(&self) -> &'static str {
        "ember-attention-softmax"
    }
    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        bail!("ember-attention-softmax is the CUDA path's; the CPU kernel fuses the whole attention core")
    }
    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
        let d = self.dims;
        let dev = &s.device;
        let x = view(s, l)?;
        let rows = d.b * d.h * d.t;
        if x.len() != rows * d.s {
            bail!(
                "ember-attention-softmax: logits {:?} are not {d:?}'s (B, H, T, S)",
                l.shape()
            );
        }
        let mut y = alloc(dev, x.len())?;
        let measure = self.telemetry.is_some();
        let (mut row_max, mut row_ent) = telemetry_buffers(dev, measure, rows)?;
        if rows > 0 {
            with_mask(self.mask.as_ref(), |mask, ms| {
                launch!(dev, ATTENTION, "ember_attn_softmax", warp_rows(rows);
                    &x, &mut y, mask.unwrap_or(&x), &mut row_max, &mut row_ent, &(rows as u64),
                    &(d.h as u32), &(d.t as u32), &(d.s as u32), &(mask.is_some() as i32),
                    &ms[0], &ms[1], &ms[2], &ms[3], &(measure as i32))
            })?;
        }
        if let Some(slot) = &self.telemetry {
            record(slot, dev, d, &row_max, &row_ent)?;
        }
        Ok((storage(y, dev), l.shape().clone()))
    }
    fn bwd(&self, _x: &Tensor, res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(crate::softmax::softmax_backward(res, g)?))
    }
}
