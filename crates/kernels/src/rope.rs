//! Rotary position embeddings (Su et al. 2021) in the "rotate half" layout of GPT-NeoX/LLaMA:
//! dimension i is paired with dimension i + d/2 and the pair is rotated by the angle
//! `position · θ^(−2i/d)`, which makes ⟨rot(q, m), rot(k, n)⟩ a function of m − n alone.
//! candle's `rotary_emb::rope` has no backward pass; this one does, and folds an output scale
//! into the same pass: the attention logit scale of the queries, optionally grown per position
//! by log-n scaling ([`PositionScale`]).
//!
//! Inputs are the projections as they come, (B, T, H·head_dim): every consecutive run of
//! head_dim elements is one head's vector at its row's position. Rotating them in place of a
//! (B, H, T, head_dim) view saves the head split and its autograd edges.

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Result, Shape, Tensor, D};

use crate::host::{cpu_slice, cpu_tensor, is_host_f32, with_data};
use crate::par::{for_each_chunk, SharedMut};
use crate::simd::simd_dispatch;

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

    /// Whether the tables cover the positions `offset..offset + t`.
    pub(crate) fn covers(&self, offset: usize, t: usize) -> bool {
        offset + t <= self.max_len
    }
}

/// The factor a rotated vector is multiplied by: a constant `scale` (the queries' 1/√d), times,
/// with `logn_length` = m, the log-n factor max(1, ln n / ln m) of a query that sees
/// n = position + 1 keys (entropy-invariant attention; Qwen's `use_logn_attn`). Up to position m − 1 the
/// factor is exactly 1, so a model trained at length m computes the same bits with or without it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PositionScale {
    pub scale: f64,
    pub logn_length: Option<usize>,
}

impl From<f64> for PositionScale {
    fn from(scale: f64) -> Self {
        Self {
            scale,
            logn_length: None,
        }
    }
}

impl PositionScale {
    /// The factor at (0-based) `position`.
    pub fn at(&self, position: usize) -> f64 {
        self.scale * logn_factor(position, self.logn_length)
    }

    /// The factor shared by positions `offset..offset + t`, if they all have the same one.
    fn constant(&self, offset: usize, t: usize) -> Option<f64> {
        match self.logn_length {
            Some(m) if offset + t > m => None,
            _ => Some(self.scale),
        }
    }

    /// `x` (B, T, W) whose first position is `offset`, multiplied by each position's factor, from
    /// candle ops (every device and dtype): the scale of queries that are not rotated.
    pub fn apply_unfused(&self, x: &Tensor, offset: usize) -> Result<Tensor> {
        let t = x.dim(1)?;
        match self.constant(offset, t) {
            Some(1.0) => Ok(x.clone()),
            Some(s) => x.affine(s, 0.0),
            None => {
                let factors: Vec<f32> = (offset..offset + t).map(|p| self.at(p) as f32).collect();
                let factors = Tensor::from_vec(factors, (1, t, 1), x.device())?.to_dtype(x.dtype())?;
                x.broadcast_mul(&factors)
            }
        }
    }
}

/// max(1, ln n / ln m) for a query at 0-based `position` (n = position + 1 keys in view) and
/// training length m = `logn_length`; 1 without log-n scaling.
pub fn logn_factor(position: usize, logn_length: Option<usize>) -> f64 {
    match logn_length {
        Some(m) if position + 1 > m && m >= 2 => ((position + 1) as f64).ln() / (m as f64).ln(),
        _ => 1.0,
    }
}

/// The rotation of x (B, T, H·head_dim) whose first position is `offset`, from narrow, cat and
/// multiply (every device and dtype; the reference for the kernel).
pub fn rope_unfused(x: &Tensor, tables: &RopeTables, offset: usize) -> Result<Tensor> {
    let (b, t, width) = x.dims3()?;
    let d = 2 * tables.half;
    let x = x.reshape((b, t, width / d, d))?;
    let cos = tables.cos.narrow(0, offset, t)?.reshape((t, 1, d))?;
    let sin = tables.sin.narrow(0, offset, t)?.reshape((t, 1, d))?;
    let x1 = x.narrow(D::Minus1, 0, tables.half)?;
    let x2 = x.narrow(D::Minus1, tables.half, tables.half)?;
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    x.broadcast_mul(&cos)?
        .add(&rotated.broadcast_mul(&sin)?)?
        .reshape((b, t, width))
}

/// `scale · rotated(x)` for x (B, T, H·head_dim) whose first position is `offset` (`scale` an
/// `f64` or a [`PositionScale`]); fused on CPU f32, [`rope_unfused`] (then the scale) elsewhere.
pub fn rope(
    x: &Tensor,
    tables: &RopeTables,
    offset: usize,
    scale: impl Into<PositionScale>,
) -> Result<Tensor> {
    let scale = scale.into();
    let (_, t, width) = x.dims3()?;
    check_heads(tables, width)?;
    if !is_host_f32(x) || !tables.covers(offset, t) {
        return scale.apply_unfused(&rope_unfused(x, tables, offset)?, offset);
    }
    x.contiguous()?.apply_op1(RopeOp::new(tables, offset, scale))
}

/// An error unless a last dimension of `width` holds whole heads of the tables' head_dim.
pub(crate) fn check_heads(tables: &RopeTables, width: usize) -> Result<()> {
    let d = 2 * tables.half;
    if d == 0 || !width.is_multiple_of(d) {
        candle_core::bail!("rope: the last dimension {width} is not a multiple of head_dim {d}");
    }
    Ok(())
}

/// The rotation (and scale) of the positions `offset..` by the tables' angles; also run by
/// [`linear_rope`](crate::linear_rope) on its projection.
#[derive(Clone)]
pub(crate) struct RopeOp {
    tables: RopeTables,
    offset: usize,
    scale: PositionScale,
    /// Rotate by the negative angles (the transpose: the backward pass).
    inverse: bool,
}

/// Positions per parallel task.
const ROWS_PER_TASK: usize = 64;

impl RopeOp {
    pub(crate) fn new(tables: &RopeTables, offset: usize, scale: PositionScale) -> Self {
        Self {
            tables: tables.clone(),
            offset,
            scale,
            inverse: false,
        }
    }

    /// The transposed rotation, which takes the output's gradient to the input's.
    pub(crate) fn transpose(&self) -> Self {
        Self {
            inverse: !self.inverse,
            ..self.clone()
        }
    }

    /// Rotates x (B, T, W) into a new vector of the same layout.
    pub(crate) fn run(&self, x: &[f32], t: usize, width: usize) -> Vec<f32> {
        if width == 0 {
            return Vec::new();
        }
        let mut y: Vec<f32> = Vec::with_capacity(x.len());
        let out = SharedMut(y.as_mut_ptr());
        let positions = x.len() / width;
        for_each_chunk(positions, ROWS_PER_TASK, |rows| {
            // SAFETY: the positions `rows` of the output belong to this task alone.
            let y = unsafe { out.slice(rows.start * width, rows.len() * width) };
            let x = &x[rows.start * width..rows.end * width];
            rotate_rows(self, rows.start, t, width, x, y);
        });
        // SAFETY: the tasks wrote every position's row.
        unsafe { y.set_len(x.len()) };
        y
    }
}

/// Rotates the rows of `x` (positions `first..`, `width` elements each, t positions to a
/// sequence) into `y`, with `op`'s angles, direction and scale.
#[inline(always)]
fn rotate_rows_generic(op: &RopeOp, first: usize, t: usize, width: usize, x: &[f32], y: &mut [f32]) {
    let half = op.tables.half;
    let d = 2 * half;
    let sign = if op.inverse { -1.0 } else { 1.0 };
    for (r, (xr, yr)) in (first..).zip(x.chunks_exact(width).zip(y.chunks_exact_mut(width))) {
        let pos = op.offset + r % t;
        // The scale is linear in x, so the backward pass applies the same factor.
        let scale = op.scale.at(pos) as f32;
        let cos = &op.tables.cos_half[pos * half..(pos + 1) * half];
        let sin = &op.tables.sin_half[pos * half..(pos + 1) * half];
        for (xh, yh) in xr.chunks_exact(d).zip(yr.chunks_exact_mut(d)) {
            let (x1, x2) = xh.split_at(half);
            let (y1, y2) = yh.split_at_mut(half);
            for i in 0..half {
                let s = sin[i] * sign;
                y1[i] = (x1[i] * cos[i] - x2[i] * s) * scale;
                y2[i] = (x2[i] * cos[i] + x1[i] * s) * scale;
            }
        }
    }
}
simd_dispatch!(rotate_rows => rotate_rows_generic(
    op: &RopeOp, first: usize, t: usize, width: usize, x: &[f32], y: &mut [f32]) -> ());

impl CustomOp1 for RopeOp {
    fn name(&self) -> &'static str {
        "ember-rope"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (_, t, width) = l.shape().dims3()?;
        let y = self.run(cpu_slice(s, l)?, t, width);
        Ok((CpuStorage::F32(y), l.shape().clone()))
    }
    /// The inverse rotation of the gradient.
    fn bwd(&self, x: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        let (_, t, width) = g.dims3()?;
        let dx = with_data([g], |[g]| Ok(self.transpose().run(g, t, width)))?;
        Ok(Some(cpu_tensor(dx, x.shape())?))
    }
}
