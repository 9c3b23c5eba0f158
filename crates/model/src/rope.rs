//! The rotary position tables of a model, and the check that keeps positions inside them.
//! The rotation itself is Ember's kernel ([`ember_kernels::rope`]).

use candle_core::{DType, Device, Result, Tensor};
use ember_kernels::{PositionScale, RopeTables};

/// Rotary embeddings for positions `0..max_len` (`model.max_seq_len`), and the log-n training
/// length of the queries they rotate (causal self-attention only).
#[derive(Clone)]
pub struct Rotary {
    tables: RopeTables,
    logn_length: Option<usize>,
}

impl Rotary {
    pub fn new(head_dim: usize, max_len: usize, theta: f64, dtype: DType, device: &Device) -> Result<Self> {
        Ok(Self {
            tables: RopeTables::new(head_dim, max_len, theta, dtype, device)?,
            logn_length: None,
        })
    }

    /// The same rotation, with queries also scaled by log-n past training length `m` (`None`:
    /// not scaled). For causal self-attention, where a query at position i sees i + 1 keys.
    pub fn with_logn(&self, m: Option<usize>) -> Self {
        Self {
            tables: self.tables.clone(),
            logn_length: m,
        }
    }

    /// Rotates keys `x` of shape (B, T, H·head_dim) whose first position is `offset`.
    pub fn apply(&self, x: &Tensor, offset: usize) -> Result<Tensor> {
        self.rotate(x, offset, 1.0.into())
    }

    /// Rotates queries and multiplies them by `scale` (the logit scale) and the log-n factor of
    /// their position, in one pass.
    pub fn apply_query(&self, x: &Tensor, offset: usize, scale: f64) -> Result<Tensor> {
        let scale = PositionScale {
            scale,
            logn_length: self.logn_length,
        };
        self.rotate(x, offset, scale)
    }

    fn rotate(&self, x: &Tensor, offset: usize, scale: PositionScale) -> Result<Tensor> {
        let t = x.dim(1)?;
        if offset + t > self.tables.max_len() {
            candle_core::bail!(
                "sequence position {} is beyond model.max_seq_len = {}; raise max_seq_len or shorten the input",
                offset + t,
                self.tables.max_len()
            );
        }
        ember_kernels::rope(x, &self.tables, offset, scale)
    }
}
