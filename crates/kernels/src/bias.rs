//! `y + b`, a bias added to every row, with its backward: dy = g and db the column sums of g.
//!
//! Candle's `broadcast_add` sums the bias gradient with its generic strided reduction, which
//! made a model with fairseq's biases (`model.proj_bias`) 1.43× slower per step:
//! `configs/multi30k-tiny-wu.yaml` took 561 ms a step against 391 without its biases, all of it
//! in the backward pass (655 against 298 ms; `ember bench`, 2 threads). Here the column sums
//! run down the rows in order, each column's terms added first row to last, so the result does
//! not depend on the thread count. CPU f32 only; every other device and dtype takes
//! `broadcast_add`.

use std::mem::MaybeUninit;

use candle_core::{CpuStorage, Layout, Result, Shape, Tensor, D};

use crate::host::{cpu_slice, cpu_tensor, is_host_f32, with_data};
use crate::par::{fill, rows_per_task};

/// `y + b` over y's last dimension (`b` of shape (C,), `y` of shape (…, C)).
pub fn add_bias(y: &Tensor, b: &Tensor) -> Result<Tensor> {
    let fused = is_host_f32(y)
        && is_host_f32(b)
        && b.rank() == 1
        && b.dim(0)? > 0
        && y.dim(D::Minus1)? == b.dim(0)?;
    match fused {
        true => y.contiguous()?.apply_op2(&b.contiguous()?, AddBiasOp),
        false => add_bias_unfused(y, b),
    }
}

/// The reference: candle's broadcast add.
pub fn add_bias_unfused(y: &Tensor, b: &Tensor) -> Result<Tensor> {
    y.broadcast_add(b)
}

struct AddBiasOp;

impl candle_core::CustomOp2 for AddBiasOp {
    fn name(&self) -> &'static str {
        "ember-add-bias"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (y, b) = (cpu_slice(s1, l1)?, cpu_slice(s2, l2)?);
        // Whole rows per task, so that every row meets the bias from its first column.
        let chunk = rows_per_task(b.len()) * b.len();
        let out = fill(y.len(), chunk, |r, out: &mut [MaybeUninit<f32>]| {
            for (row, out) in y[r].chunks_exact(b.len()).zip(out.chunks_exact_mut(b.len())) {
                for ((o, &y), &b) in out.iter_mut().zip(row).zip(b) {
                    o.write(y + b);
                }
            }
        });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
    fn bwd(
        &self,
        _y: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        Ok((Some(g.clone()), Some(column_sums(g, b.dim(0)?)?)))
    }
}

/// Σ over the rows of `g` viewed as (rows, c), each column summed from the first row to the last.
/// (`g` is the gradient of the op's CPU f32 output.)
fn column_sums(g: &Tensor, c: usize) -> Result<Tensor> {
    let g = g.contiguous()?;
    let sums = with_data([&g], |[g]| {
        let mut acc = vec![0f32; c];
        for row in g.chunks_exact(c) {
            for (a, &x) in acc.iter_mut().zip(row) {
                *a += x;
            }
        }
        Ok(acc)
    })?;
    cpu_tensor(sums, &Shape::from(c))
}
