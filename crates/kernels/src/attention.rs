//! The attention core softmax(q·kᵀ + mask)·v with grouped-query heads, forward and backward.
//!
//! The work is done per (batch, KV head): the query heads that share a KV head are adjacent in
//! (B, H, T, d), so their rows form one (group·T)×d block and every product is one GEMM. The
//! output is written (B, T, H, d), the heads of a position side by side, so the output
//! projection reads it without a head-merge copy.

use candle_core::{bail, CpuStorage, CustomOp3, DType, Device, Layout, Result, Shape, Tensor};

use crate::gemm::{sgemm, Blocks, Mat};
use crate::host::{cpu_slice, cpu_storage, cpu_tensor, is_host_f32, with_data};
use crate::simd::{dot, simd_dispatch};
use crate::softmax::{softmax_in_place, softmax_rows_unfused};

/// An additive mask as (data, (b, h, t, s) element strides, offset).
type MaskView<'a> = Option<(&'a [f32], [usize; 4], usize)>;

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

/// softmax(q·kᵀ + mask)·v from candle primitives: q (B, H, T, d) (already scaled), k and v
/// (B, H_kv, S, d) with H a multiple of H_kv (query head h uses KV head h / (H / H_kv)), and an
/// additive mask broadcastable to (B, H, T, S). Returns (B, H, T, d).
pub fn attention_unfused(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
    let (b, h, t, d) = q.dims4()?;
    let (_, hkv, s, _) = k.dims4()?;
    let group = h / hkv;
    let logits = q
        .reshape((b, hkv, group * t, d))?
        .matmul(&k.t()?)?
        .reshape((b, h, t, s))?;
    let masked = match mask {
        Some(m) => logits.broadcast_add(m)?,
        None => logits,
    };
    let probs = softmax_rows_unfused(&masked)?;
    probs
        .reshape((b, hkv, group * t, s))?
        .matmul(v)?
        .reshape((b, h, t, d))
}

/// Fused [`attention_unfused`] on CPU f32 (the mask is treated as a constant: it gets no
/// gradient). Falls back to the unfused form elsewhere.
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
    attention_heads_last(q, k, v, mask)?.transpose(1, 2)
}

/// [`attention`] with the output laid out (B, T, H, d): the heads of each position side by side,
/// so (B, T, H·d) for the output projection is a free reshape and its gradient arrives
/// contiguous (no head-merge copy in either pass).
pub fn attention_heads_last(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
    let (b, h, t, d) = q.dims4()?;
    let (bk, hkv, s, dk) = k.dims4()?;
    if !(is_host_f32(q) && is_host_f32(k) && is_host_f32(v) && mask.is_none_or(is_host_f32)) {
        return attention_unfused(q, k, v, mask)?.transpose(1, 2);
    }
    if bk != b || dk != d || hkv == 0 || h % hkv != 0 || v.dims4()? != (b, hkv, s, d) {
        bail!(
            "attention: q {:?}, k {:?}, v {:?} do not fit together",
            q.shape(),
            k.shape(),
            v.shape()
        );
    }
    let mask = match mask {
        Some(m) => Some(m.detach().broadcast_as((b, h, t, s))?),
        None => None,
    };
    // Keeping the probabilities for the backward pass spares it a q·kᵀ product and a softmax
    // per block, for B·H·T·S floats: done when that is at most four times what q holds (S ≤ 4d),
    // so long sequences still recompute instead of storing T² per head.
    let keep = q.track_op() && s <= 4 * d;
    let op = AttnOp {
        mask,
        probs: keep.then(|| std::sync::Mutex::new(None)),
    };
    q.contiguous()?.apply_op3(&k.contiguous()?, &v.contiguous()?, op)
}

struct AttnOp {
    /// The additive mask broadcast (by strides) to (B, H, T, S).
    mask: Option<Tensor>,
    /// The forward pass's probabilities, block after block, taken by the backward pass
    /// (`None`: not kept, the backward recomputes them).
    probs: Option<std::sync::Mutex<Option<Vec<f32>>>>,
}

/// Shapes of one attention call.
#[derive(Clone, Copy)]
struct AttnDims {
    b: usize,
    h: usize,
    hkv: usize,
    t: usize,
    s: usize,
    d: usize,
}

impl AttnOp {
    /// Runs `f(mask_data, strides)`; strides are (b, h, t, s) element strides, offset included.
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

    fn forward(&self, dims: AttnDims, q: &[f32], k: &[f32], v: &[f32]) -> Result<Vec<f32>> {
        let (out, probs) =
            self.with_mask(|mask| Ok(attn_forward(dims, q, k, v, mask, self.probs.is_some())))?;
        if let (Some(slot), Some(probs)) = (&self.probs, probs) {
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(probs);
        }
        Ok(out)
    }

    /// (dq, dk, dv), from the kept probabilities or recomputing them; `o` is the forward
    /// output, `go` its gradient.
    #[allow(clippy::type_complexity)]
    fn backward(
        &self,
        dims: AttnDims,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        o: &[f32],
        go: &[f32],
    ) -> Result<(Vec<f32>, Vec<f32>, Vec<f32>)> {
        let kept = self
            .probs
            .as_ref()
            .and_then(|slot| slot.lock().unwrap_or_else(|e| e.into_inner()).take())
            .filter(|p| p.len() == dims.b * dims.h * dims.t * dims.s);
        self.with_mask(|mask| Ok(attn_backward(dims, q, k, v, o, go, mask, kept.as_deref())))
    }
}

impl AttnDims {
    fn group(&self) -> usize {
        self.h / self.hkv
    }
    /// Element range of the query (and output) block of KV head `kh` in batch `bi`.
    fn q_block(&self, bi: usize, kh: usize) -> std::ops::Range<usize> {
        let first = bi * self.h + kh * self.group();
        first * self.t * self.d..(first + self.group()) * self.t * self.d
    }
    /// Offset of row (batch `bi`, position `ti`, query head `hq`) in a (B, T, H, d) tensor.
    fn bthd_row(&self, bi: usize, ti: usize, hq: usize) -> usize {
        ((bi * self.t + ti) * self.h + hq) * self.d
    }
    /// Element range of the key (and value) block of KV head `kh` in batch `bi`.
    fn kv_block(&self, bi: usize, kh: usize) -> std::ops::Range<usize> {
        let kv = bi * self.hkv + kh;
        kv * self.s * self.d..(kv + 1) * self.s * self.d
    }
}

/// Probabilities of one block: `p` holds q·kᵀ for the (group·T) query rows of KV head `kh`;
/// adds the mask and takes the softmax of each row in place.
#[inline(always)]
fn softmax_block(dims: AttnDims, p: &mut [f32], mask: MaskView<'_>, bi: usize, kh: usize) {
    let (t, s) = (dims.t, dims.s);
    for (r, row) in p.chunks_exact_mut(s).enumerate() {
        if let Some((m, st, off)) = mask {
            let hi = kh * dims.group() + r / t;
            let base = off + bi * st[0] + hi * st[1] + (r % t) * st[2];
            if st[3] == 1 {
                for (x, &mv) in row.iter_mut().zip(&m[base..base + s]) {
                    *x += mv;
                }
            } else {
                for (si, x) in row.iter_mut().enumerate() {
                    *x += m[base + si * st[3]];
                }
            }
        }
        softmax_in_place(row);
    }
}

simd_dispatch!(attn_forward => attn_forward_generic(
    dims: AttnDims, q: &[f32], k: &[f32], v: &[f32], mask: MaskView<'_>, keep: bool) -> (Vec<f32>, Option<Vec<f32>>));

/// The output and, with `keep`, the probabilities of every block (in block order).
#[inline(always)]
fn attn_forward_generic(
    dims: AttnDims,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: MaskView<'_>,
    keep: bool,
) -> (Vec<f32>, Option<Vec<f32>>) {
    let AttnDims { b, hkv, t, s, d, .. } = dims;
    let rows = dims.group() * t;
    let block = rows * s;
    let mut out = Blocks::new(q.len());
    let mut kept = keep.then(|| Blocks::new(b * hkv * block));
    let mut scratch = if keep { Vec::new() } else { vec![0f32; block] };
    for bi in 0..b {
        for kh in 0..hkv {
            let (qr, kvr) = (dims.q_block(bi, kh), dims.kv_block(bi, kh));
            let (qm, km) = (Mat::rows(&q[qr.clone()], d), Mat::transposed(&k[kvr.clone()], d));
            let p: &mut [f32] = match &mut kept {
                Some(all) => all.product((bi * hkv + kh) * block, rows, d, s, qm, km),
                None => {
                    sgemm(rows, d, s, qm, km, 0.0, &mut scratch);
                    &mut scratch
                }
            };
            softmax_block(dims, p, mask, bi, kh);
            // Output rows go to (B, T, H, d): head `hq`'s rows are H·d apart.
            for gi in 0..dims.group() {
                let hq = kh * dims.group() + gi;
                let p_head = Mat::rows(&p[gi * t * s..(gi + 1) * t * s], s);
                out.product_ld(
                    dims.bthd_row(bi, 0, hq),
                    dims.h * d,
                    t,
                    s,
                    d,
                    p_head,
                    Mat::rows(&v[kvr.clone()], d),
                );
            }
        }
    }
    (out.finish(), kept.map(Blocks::finish))
}

simd_dispatch!(attn_backward => attn_backward_generic(
    dims: AttnDims, q: &[f32], k: &[f32], v: &[f32], o: &[f32], go: &[f32], mask: MaskView<'_>,
    kept: Option<&[f32]>) -> (Vec<f32>, Vec<f32>, Vec<f32>));

/// With P the probabilities and δ_r = ⟨go_r, o_r⟩: dS = P ⊙ (go·vᵀ − δ), dq = dS·k,
/// dk = dSᵀ·q, dv = Pᵀ·go (the query heads of a group summed in a fixed order). o and go are
/// (B, T, H, d); P comes from the forward pass when kept, else it is recomputed per block.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attn_backward_generic(
    dims: AttnDims,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    o: &[f32],
    go: &[f32],
    mask: MaskView<'_>,
    kept: Option<&[f32]>,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let AttnDims { b, hkv, t, s, d, .. } = dims;
    let rows = dims.group() * t;
    let mut dq = Blocks::new(q.len());
    let mut dk = Blocks::new(k.len());
    let mut dv = Blocks::new(v.len());
    let block = rows * s;
    let mut scratch = vec![0f32; if kept.is_some() { 0 } else { block }];
    let mut ds = vec![0f32; block];
    let (h, group) = (dims.h, dims.group());
    for bi in 0..b {
        for kh in 0..hkv {
            let (qr, kvr) = (dims.q_block(bi, kh), dims.kv_block(bi, kh));
            let qb = &q[qr.clone()];
            let (kb, vb) = (&k[kvr.clone()], &v[kvr.clone()]);
            let p: &[f32] = match kept {
                Some(all) => &all[(bi * hkv + kh) * block..][..block],
                None => {
                    sgemm(
                        rows,
                        d,
                        s,
                        Mat::rows(qb, d),
                        Mat::transposed(kb, d),
                        0.0,
                        &mut scratch,
                    );
                    softmax_block(dims, &mut scratch, mask, bi, kh);
                    &scratch
                }
            };
            // o and its gradient are (B, T, H, d): head hq's rows are H·d apart.
            let grad_rows = |hq: usize| Mat {
                data: &go[dims.bthd_row(bi, 0, hq)..],
                row_stride: h * d,
                col_stride: 1,
            };
            for gi in 0..group {
                let hq = kh * group + gi;
                let ds_head = &mut ds[gi * t * s..(gi + 1) * t * s];
                sgemm(t, d, s, grad_rows(hq), Mat::transposed(vb, d), 0.0, ds_head);
                for ti in 0..t {
                    let row = dims.bthd_row(bi, ti, hq);
                    let delta = dot(&go[row..row + d], &o[row..row + d]);
                    let r = gi * t + ti;
                    let (pr, dr) = (&p[r * s..(r + 1) * s], &mut ds[r * s..(r + 1) * s]);
                    for (x, &pv) in dr.iter_mut().zip(pr) {
                        *x = pv * (*x - delta);
                    }
                }
            }
            dq.product(qr.start, rows, s, d, Mat::rows(&ds, s), Mat::rows(kb, d));
            dk.product(kvr.start, s, rows, d, Mat::transposed(&ds, s), Mat::rows(qb, d));
            // dV = Σ over the group's heads of Pᵀ·dO (the first writes, the rest add).
            let dv_block = dv.product(
                kvr.start,
                s,
                t,
                d,
                Mat::transposed(&p[..t * s], s),
                grad_rows(kh * group),
            );
            for gi in 1..group {
                let p_head = Mat::transposed(&p[gi * t * s..(gi + 1) * t * s], s);
                sgemm(s, t, d, p_head, grad_rows(kh * group + gi), 1.0, dv_block);
            }
        }
    }
    (dq.finish(), dk.finish(), dv.finish())
}

fn attn_dims(lq: &Layout, lk: &Layout) -> Result<AttnDims> {
    let (qd, kd) = (lq.dims(), lk.dims());
    if qd.len() != 4 || kd.len() != 4 {
        bail!("attention: expected rank-4 q and k");
    }
    Ok(AttnDims {
        b: qd[0],
        h: qd[1],
        t: qd[2],
        d: qd[3],
        hkv: kd[1],
        s: kd[2],
    })
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
        let dims = attn_dims(l1, l2)?;
        let out = self.forward(dims, cpu_slice(s1, l1)?, cpu_slice(s2, l2)?, cpu_slice(s3, l3)?)?;
        Ok((
            CpuStorage::F32(out),
            Shape::from((dims.b, dims.t, dims.h, dims.d)),
        ))
    }
    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let dims = attn_dims(q.layout(), k.layout())?;
        let (dq, dk, dv) = with_data([q, k, v, res, g], |[q, k, v, o, go]| {
            self.backward(dims, q, k, v, o, go)
        })?;
        Ok((
            Some(cpu_tensor(dq, q.shape())?),
            Some(cpu_tensor(dk, k.shape())?),
            Some(cpu_tensor(dv, v.shape())?),
        ))
    }
}
