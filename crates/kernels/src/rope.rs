//! Rotary position embeddings (Su et al. 2021) in the "rotate half" layout of GPT-NeoX/LLaMA:
//! dimension i is paired with dimension i + d/2 and the pair is rotated by the angle
//! `position · θ^(−2i/d)`, which makes ⟨rot(q, m), rot(k, n)⟩ a function of m − n alone.
//! candle's `rotary_emb::rope` has no backward pass; this one does, and folds an output scale
//! (the attention logit scale of the queries) into the same pass.

use std::sync::Arc;

use candle_core::{bail, CpuStorage, CustomOp1, DType, Device, Layout, Result, Shape, Tensor, D};

use crate::gemm::Blocks;
use crate::host::{cpu_tensor, is_host_f32, with_data};

/// The cos/sin tables of positions `0..max_len` for vectors of `head_dim` elements: as tensors of
/// the model's dtype and device (the unfused rotation) and as f32 half-tables (the CPU kernel).
#[derive(Clone)]
pub struct RopeTables {
    /// (max_len, head_dim): both halves of a row carry the same angles, so one broadcast
    /// multiply covers each pair.
    cos: Tensor,
    sin: Tensor,
    /// (max_len, head_dim / 2), the same angles rounded to f32 exactly as the tensors' are.
    cos_half: Arc<Vec<f32>>,
    sin_half: Arc<Vec<f32>>,
    half: usize,
    max_len: usize,
}

impl RopeTables {
    pub fn new(head_dim: usize, max_len: usize, theta: f64, dtype: DType, device: &Device) -> Result<Self> {
        let half = head_dim / 2;
        let mut cos = Vec::with_capacity(max_len * head_dim);
        let mut sin = Vec::with_capacity(max_len * head_dim);
        let (mut cos_half, mut sin_half) = (
            Vec::with_capacity(max_len * half),
            Vec::with_capacity(max_len * half),
        );
        for pos in 0..max_len {
            for _ in 0..2 {
                for i in 0..half {
                    let angle = pos as f64 * theta.powf(-2.0 * i as f64 / head_dim as f64);
                    cos.push(angle.cos());
                    sin.push(angle.sin());
                }
            }
            cos_half.extend(
                cos[pos * head_dim..pos * head_dim + half]
                    .iter()
                    .map(|&c| c as f32),
            );
            sin_half.extend(
                sin[pos * head_dim..pos * head_dim + half]
                    .iter()
                    .map(|&s| s as f32),
            );
        }
        Ok(Self {
            cos: Tensor::from_vec(cos, (max_len, head_dim), device)?.to_dtype(dtype)?,
            sin: Tensor::from_vec(sin, (max_len, head_dim), device)?.to_dtype(dtype)?,
            cos_half: Arc::new(cos_half),
            sin_half: Arc::new(sin_half),
            half,
            max_len,
        })
    }

    /// Positions the tables cover.
    pub fn max_len(&self) -> usize {
        self.max_len
    }
}

/// The rotation of x (B, H, T, head_dim) whose first position is `offset`, from narrow, cat and
/// multiply (every device and dtype; the reference for the kernel).
pub fn rope_unfused(x: &Tensor, tables: &RopeTables, offset: usize) -> Result<Tensor> {
    let (_, _, t, d) = x.dims4()?;
    let cos = tables.cos.narrow(0, offset, t)?;
    let sin = tables.sin.narrow(0, offset, t)?;
    let half = d / 2;
    let x1 = x.narrow(D::Minus1, 0, half)?;
    let x2 = x.narrow(D::Minus1, half, half)?;
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    x.broadcast_mul(&cos)?.add(&rotated.broadcast_mul(&sin)?)
}

/// `scale · rotated(x)` for x (B, H, T, head_dim) whose first position is `offset`; fused on CPU
/// f32, [`rope_unfused`] (then the scale) elsewhere.
pub fn rope(x: &Tensor, tables: &RopeTables, offset: usize, scale: f64) -> Result<Tensor> {
    let (_, _, t, d) = x.dims4()?;
    if !is_host_f32(x) || d != 2 * tables.half || offset + t > tables.max_len {
        let rotated = rope_unfused(x, tables, offset)?;
        return if scale == 1.0 {
            Ok(rotated)
        } else {
            rotated.affine(scale, 0.0)
        };
    }
    let op = RopeOp {
        tables: tables.clone(),
        offset,
        scale: scale as f32,
        inverse: false,
    };
    // The kernel reads any layout whose last dimension is contiguous: in particular the
    // (B, T, H, d) projection output viewed as (B, H, T, d), which saves the head-split copy.
    let x = if x.stride()[3] == 1 {
        x.clone()
    } else {
        x.contiguous()?
    };
    x.apply_op1(op)
}

#[derive(Clone)]
struct RopeOp {
    tables: RopeTables,
    offset: usize,
    scale: f32,
    /// Rotate by the negative angles (the transpose: the backward pass).
    inverse: bool,
}

impl RopeOp {
    /// Rotates every row of d elements: row (b, h, t) of `x` starts at `src(b, h, t)` and goes to
    /// row `dst(b, h, t)` of the output.
    #[inline(always)]
    fn run(
        &self,
        x: &[f32],
        dims: [usize; 3],
        src: impl Fn(usize, usize, usize) -> usize,
        dst: impl Fn(usize, usize, usize) -> usize,
    ) -> Vec<f32> {
        let half = self.tables.half;
        let d = 2 * half;
        let [b, h, t] = dims;
        let sign = if self.inverse { -1.0 } else { 1.0 };
        let mut y = Blocks::new(b * h * t * d);
        for bi in 0..b {
            for hi in 0..h {
                for ti in 0..t {
                    let pos = self.offset + ti;
                    let cos = &self.tables.cos_half[pos * half..(pos + 1) * half];
                    let sin = &self.tables.sin_half[pos * half..(pos + 1) * half];
                    let (x1, x2) = x[src(bi, hi, ti)..][..d].split_at(half);
                    let (y1, y2) = y.row(dst(bi, hi, ti) * d, d).split_at_mut(half);
                    for i in 0..half {
                        let s = sin[i] * sign;
                        y1[i].write((x1[i] * cos[i] - x2[i] * s) * self.scale);
                        y2[i].write((x2[i] * cos[i] + x1[i] * s) * self.scale);
                    }
                }
            }
        }
        y.finish()
    }
}

impl CustomOp1 for RopeOp {
    fn name(&self) -> &'static str {
        "ember-rope"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let data = match s {
            CpuStorage::F32(v) => v.as_slice(),
            _ => bail!("ember kernels: expected f32 storage"),
        };
        let (b, h, t, _) = l.shape().dims4()?;
        let (st, off) = (l.stride(), l.start_offset());
        if st[3] != 1 {
            bail!("ember-rope: the last dimension must be contiguous");
        }
        let y = self.run(
            data,
            [b, h, t],
            |bi, hi, ti| off + bi * st[0] + hi * st[1] + ti * st[2],
            |bi, hi, ti| (bi * h + hi) * t + ti,
        );
        Ok((CpuStorage::F32(y), l.shape().clone()))
    }
    /// The inverse rotation of the gradient, written in (B, T, H, d) order and returned as its
    /// (B, H, T, d) view: when the input was the head-split view of a projection, the
    /// gradient then reaches the projection's backward already contiguous (no copy).
    fn bwd(&self, _x: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        let op = RopeOp {
            inverse: !self.inverse,
            ..self.clone()
        };
        let (b, h, t, d) = g.dims4()?;
        let dx = with_data([g], |[g]| {
            Ok(op.run(
                g,
                [b, h, t],
                |bi, hi, ti| ((bi * h + hi) * t + ti) * d,
                |bi, hi, ti| (bi * t + ti) * h + hi,
            ))
        })?;
        Ok(Some(cpu_tensor(dx, &Shape::from((b, t, h, d)))?.transpose(1, 2)?))
    }
}
