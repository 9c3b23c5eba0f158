//! Rotary position embeddings (Su et al. 2021), in the "rotate half" layout of GPT-NeoX/LLaMA:
//! dimension i is paired with dimension i + d/2 and the pair is rotated by angle
//! `position · θ^(−2i/d)`. The rotation makes ⟨rot(q, m), rot(k, n)⟩ a function of m − n alone.
//!
//! Written from narrow/cat/mul so that it has a backward pass (candle's `rotary_emb::rope`
//! has none).

use candle_core::{DType, Device, Result, Tensor, D};

use crate::kernels::{rope_scaled, RopeTables};

/// Precomputed cos/sin tables for positions `0..max_len`.
#[derive(Clone)]
pub struct Rotary {
    cos: Tensor,
    sin: Tensor,
    max_len: usize,
    /// The same angles as f32 half-tables, for the fused CPU kernel.
    tables: RopeTables,
}

impl Rotary {
    pub fn new(head_dim: usize, max_len: usize, theta: f64, dtype: DType, device: &Device) -> Result<Self> {
        let half = head_dim / 2;
        let mut cos = Vec::with_capacity(max_len * head_dim);
        let mut sin = Vec::with_capacity(max_len * head_dim);
        let (mut cos_half, mut sin_half) = (
            Vec::with_capacity(max_len * half),
            Vec::with_capacity(max_len * half),
        );
        for pos in 0..max_len {
            // Both halves of a row carry the same angles, so one broadcast multiply covers the pair.
            for _ in 0..2 {
                for i in 0..half {
                    let angle = pos as f64 * theta.powf(-2.0 * i as f64 / head_dim as f64);
                    cos.push(angle.cos());
                    sin.push(angle.sin());
                }
            }
            cos_half.extend_from_slice(&cos[pos * head_dim..pos * head_dim + half]);
            sin_half.extend_from_slice(&sin[pos * head_dim..pos * head_dim + half]);
        }
        let tables = RopeTables::new(&cos_half, &sin_half, half, max_len);
        Ok(Self {
            cos: Tensor::from_vec(cos, (max_len, head_dim), device)?.to_dtype(dtype)?,
            sin: Tensor::from_vec(sin, (max_len, head_dim), device)?.to_dtype(dtype)?,
            max_len,
            tables,
        })
    }

    /// Rotates `x` of shape (B, H, T, head_dim) whose first position is `offset`.
    pub fn apply(&self, x: &Tensor, offset: usize) -> Result<Tensor> {
        self.apply_scaled(x, offset, 1.0)
    }

    /// `scale · apply(x, offset)`, fused into one pass on CPU f32 (the logit scale of queries).
    pub fn apply_scaled(&self, x: &Tensor, offset: usize, scale: f64) -> Result<Tensor> {
        let (_, _, t, _) = x.dims4()?;
        if offset + t > self.max_len {
            candle_core::bail!(
                "sequence position {} is beyond model.max_seq_len = {}; raise max_seq_len or shorten the input",
                offset + t,
                self.max_len
            );
        }
        if let Some(y) = rope_scaled(x, &self.tables, offset, scale as f32)? {
            return Ok(y);
        }
        let rotated = self.apply_unfused(x, offset)?;
        if scale == 1.0 {
            Ok(rotated)
        } else {
            rotated.affine(scale, 0.0)
        }
    }

    /// The rotation from narrow/cat/mul (every device and dtype; the reference for the kernel).
    pub fn apply_unfused(&self, x: &Tensor, offset: usize) -> Result<Tensor> {
        let (_, _, t, d) = x.dims4()?;
        let cos = self.cos.narrow(0, offset, t)?;
        let sin = self.sin.narrow(0, offset, t)?;
        let half = d / 2;
        let x1 = x.narrow(D::Minus1, 0, half)?;
        let x2 = x.narrow(D::Minus1, half, half)?;
        let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
        x.broadcast_mul(&cos)?.add(&rotated.broadcast_mul(&sin)?)
    }
}
