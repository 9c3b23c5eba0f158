//! The token embedding's lookup for a training pass whose weight's gradient goes to a
//! [`GradSink`] ([`embedding_to_sink`]).
//!
//! candle's `index_select` has its backward pass zero-fill a vocabulary × d gradient and add the
//! looked-up rows' gradients into it: with a tied embedding, on top of the output projection's
//! gradient of the same weight. As one op whose backward pass deposits the rows and their
//! gradients in the sink, that happens at the merge instead (`block/sink.rs`), in `index_add`'s
//! order (in place where the merge holds the weight's gradient itself): the same bits.

use candle_core::{bail, CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor};

use crate::block::GradSink;
use crate::host::{cpu_slice, is_host_f32};

/// The rows `ids` (any shape, u32) of `weight` (V × d), shaped `ids`' dims × d, whose backward
/// pass deposits the rows' gradients in `sink` for the caller to merge after `backward()`.
///
/// `None` where the op does not run — a weight that is no f32 CPU variable (the sink could not
/// name it in the caller's gradient store), or ids that are not u32 on the CPU —: the caller
/// looks the rows up with `index_select`.
pub fn embedding_to_sink(weight: &Tensor, ids: &Tensor, sink: &GradSink) -> Result<Option<Tensor>> {
    let takes = is_host_f32(weight) && weight.is_variable() && weight.is_contiguous();
    if !(takes && ids.device().is_cpu() && ids.dtype() == DType::U32) {
        return Ok(None);
    }
    let (vocab, d) = weight.dims2()?;
    let flat = ids.flatten_all()?;
    let rows: Vec<u32> = flat.to_vec1()?;
    if let Some(bad) = rows.iter().find(|&&r| r as usize >= vocab) {
        bail!("embedding: token id {bad} is outside the vocabulary of {vocab}");
    }
    let op = EmbeddingOp {
        rows,
        ids: flat,
        id: sink.register("the token embedding's lookup"),
        sink: sink.clone(),
        d,
    };
    let mut dims = ids.dims().to_vec();
    dims.push(d);
    Ok(Some(weight.apply_op1(op)?.reshape(dims)?))
}

/// The op of [`embedding_to_sink`].
struct EmbeddingOp {
    /// The ids, as the forward pass reads them and as the merge adds the rows' gradients.
    rows: Vec<u32>,
    ids: Tensor,
    sink: GradSink,
    /// This op's entry in the sink.
    id: u64,
    d: usize,
}

impl CustomOp1 for EmbeddingOp {
    fn name(&self) -> &'static str {
        "ember-embedding"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let weight = cpu_slice(s, l)?;
        let d = self.d;
        let mut out = Vec::with_capacity(self.rows.len() * d);
        for &r in &self.rows {
            out.extend_from_slice(&weight[r as usize * d..(r as usize + 1) * d]);
        }
        Ok((CpuStorage::F32(out), Shape::from((self.rows.len(), d))))
    }

    fn bwd(&self, weight: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        self.sink
            .deposit_rows(self.id, weight.clone(), self.ids.clone(), g.clone());
        Ok(None)
    }
}
