//! RMSNorm and LayerNorm over the last dimension (the residual-stream norms and QK-norm).

use candle_core::{bail, CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor, D};

use crate::host::{cpu_slice, cpu_tensor, is_host_f32, with_data};
use crate::simd::{dot, simd_dispatch, sum};

#[derive(Clone, Copy, Debug, PartialEq)]
enum NormType {
    Rms,
    Layer,
}

/// `x / sqrt(mean(x²) + eps) · w`, from differentiable primitives.
pub fn rms_norm_unfused(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    x.broadcast_mul(&(ms + eps)?.sqrt()?.recip()?)?.broadcast_mul(w)
}

/// `(x − mean) / sqrt(var + eps) · w (+ b)`, from differentiable primitives.
pub fn layer_norm_unfused(x: &Tensor, w: &Tensor, b: Option<&Tensor>, eps: f64) -> Result<Tensor> {
    let centred = x.broadcast_sub(&x.mean_keepdim(D::Minus1)?)?;
    let var = centred.sqr()?.mean_keepdim(D::Minus1)?;
    let scaled = centred
        .broadcast_mul(&(var + eps)?.sqrt()?.recip()?)?
        .broadcast_mul(w)?;
    match b {
        Some(b) => scaled.broadcast_add(b),
        None => Ok(scaled),
    }
}

/// RMSNorm over the last dimension with gain `w`; fused on CPU f32.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    if !(is_host_f32(x) && is_host_f32(w)) {
        return rms_norm_unfused(x, w, eps);
    }
    x.contiguous()?.apply_op2(
        &w.contiguous()?,
        NormOp {
            kind: NormType::Rms,
            eps,
        },
    )
}

/// LayerNorm over the last dimension with gain `w` and optional bias `b`; fused on CPU f32.
pub fn layer_norm(x: &Tensor, w: &Tensor, b: Option<&Tensor>, eps: f64) -> Result<Tensor> {
    if !(is_host_f32(x) && is_host_f32(w) && b.is_none_or(is_host_f32)) {
        return layer_norm_unfused(x, w, b, eps);
    }
    let op = NormOp {
        kind: NormType::Layer,
        eps,
    };
    match b {
        Some(b) => x.contiguous()?.apply_op3(&w.contiguous()?, &b.contiguous()?, op),
        None => x.contiguous()?.apply_op2(&w.contiguous()?, op),
    }
}

#[derive(Clone, Copy)]
struct NormOp {
    kind: NormType,
    eps: f64,
}

impl NormOp {
    /// Per-row (shift, 1/σ): mean (LayerNorm) or 0 (RMSNorm), and the reciprocal scale.
    #[inline(always)]
    fn stats(&self, row: &[f32]) -> (f32, f32) {
        let d = row.len() as f32;
        let mean = match self.kind {
            NormType::Rms => 0.0,
            NormType::Layer => sum(row) / d,
        };
        let mut acc = [0f32; 8];
        let c = row.chunks_exact(8);
        let rem = c.remainder();
        for x in c {
            for i in 0..8 {
                let v = x[i] - mean;
                acc[i] += v * v;
            }
        }
        let mut tail = 0f32;
        for x in rem {
            tail += (x - mean) * (x - mean);
        }
        let ss = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
        let var = ss / d;
        (mean, 1.0 / (var + self.eps as f32).sqrt())
    }

    #[inline(always)]
    fn forward(&self, x: &[f32], w: &[f32], b: Option<&[f32]>) -> Result<Vec<f32>> {
        let d = w.len();
        if x.len().checked_rem(d) != Some(0) || d == 0 {
            bail!(
                "norm: input size {} is not a multiple of the gain size {d}",
                x.len()
            );
        }
        // Slices of exactly d elements, so the loops below carry no bounds checks and vectorise.
        let w = &w[..d];
        let b = b.map(|b| &b[..d]);
        let mut y = Vec::with_capacity(x.len());
        for (xr, yr) in x.chunks_exact(d).zip(y.spare_capacity_mut().chunks_exact_mut(d)) {
            let (mean, r) = self.stats(xr);
            match b {
                Some(b) => {
                    for (((y, &x), &w), &b) in yr.iter_mut().zip(xr).zip(w).zip(b) {
                        y.write((x - mean) * r * w + b);
                    }
                }
                None => {
                    for ((y, &x), &w) in yr.iter_mut().zip(xr).zip(w) {
                        y.write((x - mean) * r * w);
                    }
                }
            }
        }
        // SAFETY: x.len() is a multiple of d (checked above), so the rows cover every element.
        unsafe { y.set_len(x.len()) };
        Ok(y)
    }

    /// (dx, dw, db) from x, w and the output gradient g.
    #[inline(always)]
    fn backward(&self, x: &[f32], w: &[f32], g: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let d = w.len();
        let w = &w[..d];
        let mut dx = vec![0f32; x.len()];
        let mut dw = vec![0f32; d];
        let mut db = vec![0f32; d];
        let mut xhat = vec![0f32; d];
        let mut gx = vec![0f32; d];
        let inv_d = 1.0 / d as f32;
        for ((xr, gr), dxr) in x
            .chunks_exact(d)
            .zip(g.chunks_exact(d))
            .zip(dx.chunks_exact_mut(d))
        {
            let (mean, r) = self.stats(xr);
            for i in 0..d {
                xhat[i] = (xr[i] - mean) * r;
                gx[i] = gr[i] * w[i];
                dw[i] += gr[i] * xhat[i];
                db[i] += gr[i];
            }
            let m_gx_xhat = dot(&gx, &xhat) * inv_d;
            let m_gx = match self.kind {
                NormType::Rms => 0.0,
                NormType::Layer => sum(&gx) * inv_d,
            };
            for ((dx, &gx), &xhat) in dxr.iter_mut().zip(&gx).zip(&xhat) {
                *dx = r * (gx - m_gx - xhat * m_gx_xhat);
            }
        }
        (dx, dw, db)
    }
}

#[inline(always)]
fn norm_forward_generic(op: NormOp, x: &[f32], w: &[f32], b: Option<&[f32]>) -> Result<Vec<f32>> {
    op.forward(x, w, b)
}
simd_dispatch!(norm_forward => norm_forward_generic(
    op: NormOp, x: &[f32], w: &[f32], b: Option<&[f32]>) -> Result<Vec<f32>>);

#[inline(always)]
fn norm_backward_generic(op: NormOp, x: &[f32], w: &[f32], g: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    op.backward(x, w, g)
}
simd_dispatch!(norm_backward => norm_backward_generic(
    op: NormOp, x: &[f32], w: &[f32], g: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<f32>));

impl CustomOp2 for NormOp {
    fn name(&self) -> &'static str {
        "ember-norm"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let y = norm_forward(*self, cpu_slice(s1, l1)?, cpu_slice(s2, l2)?, None)?;
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }
    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (dx, dw, _) = with_data([x, w, g], |[x, w, g]| Ok(norm_backward(*self, x, w, g)))?;
        Ok((Some(cpu_tensor(dx, x.shape())?), Some(cpu_tensor(dw, w.shape())?)))
    }
}

impl CustomOp3 for NormOp {
    fn name(&self) -> &'static str {
        "ember-norm-bias"
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
        let y = norm_forward(
            *self,
            cpu_slice(s1, l1)?,
            cpu_slice(s2, l2)?,
            Some(cpu_slice(s3, l3)?),
        )?;
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }
    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (dx, dw, db) = with_data([x, w, g], |[x, w, g]| Ok(norm_backward(*self, x, w, g)))?;
        Ok((
            Some(cpu_tensor(dx, x.shape())?),
            Some(cpu_tensor(dw, w.shape())?),
            Some(cpu_tensor(db, b.shape())?),
        ))
    }
}
