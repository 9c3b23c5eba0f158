//! The rotary position tables of a model, and the check that keeps positions inside them.
//! The rotation itself is Ember's kernel ([`ember_kernels::rope`]).

use candle_core::{DType, Device, Result, Tensor};
use ember_kernels::{PositionScale, Precision, RopeTables};

/// Rotary embeddings for positions `0..max_len` (`model.max_seq_len`).
#[derive(Clone)]
pub struct Rotary {
    tables: RopeTables,
}

impl Rotary {
    pub fn new(head_dim: usize, max_len: usize, theta: f64, dtype: DType, device: &Device) -> Result<Self> {
        Ok(Self {
            tables: RopeTables::new(head_dim, max_len, theta, dtype, device)?,
        })
    }

    /// Rotates keys `x` of shape (B, T, H·head_dim) whose first position is `offset`.
    pub fn apply(&self, x: &Tensor, offset: usize) -> Result<Tensor> {
        self.apply_scaled(x, offset, 1.0.into())
    }

    /// Rotates queries and multiplies them by their position's factor (the logit scale, times
    /// the log-n factor where that is on), in one pass.
    pub fn apply_scaled(&self, x: &Tensor, offset: usize, scale: PositionScale) -> Result<Tensor> {
        self.check_positions(offset, x.dim(1)?)?;
        ember_kernels::rope(x, &self.tables, offset, scale)
    }

    /// Projects `x` (B, T, D) by `weight` (out, D) and rotates and scales the projection as
    /// [`apply_scaled`](Self::apply_scaled) does, in one op, the product in `precision`: for
    /// queries and keys that go from their projection straight to the rotation (no QK-norm
    /// between).
    pub fn project_scaled(
        &self,
        x: &Tensor,
        weight: &Tensor,
        offset: usize,
        scale: PositionScale,
        precision: Precision,
    ) -> Result<Tensor> {
        self.check_positions(offset, x.dim(1)?)?;
        ember_kernels::linear_rope_in(x, weight, &self.tables, offset, scale, precision)
    }

    /// The tables, for an op that rotates inside itself.
    pub(crate) fn tables(&self) -> &RopeTables {
        &self.tables
    }

    /// An error unless positions `offset..offset + t` are inside the tables.
    pub(crate) fn check_positions(&self, offset: usize, t: usize) -> Result<()> {
        if offset + t > self.tables.max_len() {
            candle_core::bail!(
                "sequence position {} is beyond model.max_seq_len = {}; raise max_seq_len or shorten the input",
                offset + t,
                self.tables.max_len()
            );
        }
        Ok(())
    }
}
