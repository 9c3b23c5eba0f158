//! The loss: log-softmax, label-smoothed cross-entropy, z-loss and padding in one pass.

use std::sync::Arc;

use candle_core::{bail, CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor, D};

use crate::host::{cpu_slice, cpu_tensor, is_host_f32, with_data};
use crate::par::{for_each_chunk, rows_per_task, SharedMut};
use crate::simd::{exp_fast, max_of, simd_dispatch, sum};

/// Per-token losses of logits (N, V) as a (2, N) tensor: row 0 is the training objective
/// mask·[(1−ε)·nll + ε·mean_v(−log p) + z·(log Z)²], row 1 is mask·nll. The smoothing and z
/// terms are left out when ε or z is 0, as in the unfused form.
pub fn cross_entropy_unfused(
    logits: &Tensor,
    targets: &Tensor,
    mask: &Tensor,
    label_smoothing: f64,
    z_loss: f64,
) -> Result<Tensor> {
    let max = logits.max_keepdim(D::Minus1)?.detach();
    let shifted = logits.broadcast_sub(&max)?;
    let lse = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    let log_probs = shifted.broadcast_sub(&lse)?;
    let nll = log_probs.gather(&targets.unsqueeze(1)?, 1)?.squeeze(1)?.neg()?;
    let mut per_token = if label_smoothing > 0.0 {
        let uniform = log_probs.mean(D::Minus1)?.neg()?;
        ((&nll * (1.0 - label_smoothing))? + (uniform * label_smoothing)?)?
    } else {
        nll.clone()
    };
    if z_loss > 0.0 {
        let log_z = (lse + &max)?.squeeze(1)?;
        per_token = (per_token + (log_z.sqr()? * z_loss)?)?;
    }
    Tensor::stack(&[(per_token * mask)?, (nll * mask)?], 0)
}

/// Fused [`cross_entropy_unfused`] for f32 CPU logits; `targets` (N) integer ids and `mask` (N)
/// are constants (no gradient).
pub fn cross_entropy(
    logits: &Tensor,
    targets: &Tensor,
    mask: &Tensor,
    label_smoothing: f64,
    z_loss: f64,
) -> Result<Tensor> {
    if !is_host_f32(logits) {
        return cross_entropy_unfused(logits, targets, mask, label_smoothing, z_loss);
    }
    let (n, vocab) = logits.dims2()?;
    let targets: Vec<u32> = targets.to_dtype(DType::U32)?.to_vec1()?;
    let mask: Vec<f32> = mask.to_dtype(DType::F32)?.to_vec1()?;
    if targets.len() != n || mask.len() != n {
        bail!(
            "cross_entropy: {n} rows but {} targets and {} mask entries",
            targets.len(),
            mask.len()
        );
    }
    if let Some(&bad) = targets.iter().find(|&&t| t as usize >= vocab) {
        bail!("cross_entropy: target {bad} is outside the vocabulary of {vocab}");
    }
    let op = CrossEntropyOp {
        targets: Arc::new(targets),
        mask: Arc::new(mask),
        smoothing: label_smoothing as f32,
        z: z_loss as f32,
        row_stats: std::sync::Mutex::new(None),
    };
    logits.contiguous()?.apply_op1(op)
}

/// (max, log Σ exp(x − max)) of every row of the logits.
type RowStats = Arc<Vec<(f32, f32)>>;

struct CrossEntropyOp {
    targets: Arc<Vec<u32>>,
    mask: Arc<Vec<f32>>,
    smoothing: f32,
    z: f32,
    /// (max, log Σ exp(x − max)) of every row, saved by the forward pass for the backward.
    row_stats: std::sync::Mutex<Option<RowStats>>,
}

/// (max, lse of shifted logits) of one row; `scratch` (same length) receives exp(row − max).
#[inline(always)]
fn ce_row_stats(row: &[f32], scratch: &mut [f32]) -> (f32, f32) {
    let max = max_of(row);
    // Exponentials first, then the sum: a fused loop with a reduction does not vectorise.
    for (e, &x) in scratch.iter_mut().zip(row) {
        *e = exp_fast(x - max);
    }
    (max, sum(scratch).ln())
}

simd_dispatch!(ce_forward_rows => ce_forward_rows_generic(
    op: &CrossEntropyOp, x: &[f32], v: usize, first: usize, out: &mut [(f32, f32, f32, f32)]) -> ());

/// For the rows of `x` (the first being row `first`): (objective, NLL, max, lse) of each.
#[inline(always)]
fn ce_forward_rows_generic(
    op: &CrossEntropyOp,
    x: &[f32],
    v: usize,
    first: usize,
    out: &mut [(f32, f32, f32, f32)],
) {
    let mut scratch = vec![0f32; v];
    for (r, (row, o)) in x.chunks_exact(v).zip(out.iter_mut()).enumerate() {
        let i = first + r;
        let (max, lse) = ce_row_stats(row, &mut scratch);
        let nll = -((row[op.targets[i] as usize] - max) - lse);
        let mut obj = nll;
        if op.smoothing > 0.0 {
            // mean_v(−log p) = lse − mean_v(shifted)
            let mean_lp = (sum(row) / v as f32 - max) - lse;
            obj = nll * (1.0 - op.smoothing) + (-mean_lp) * op.smoothing;
        }
        if op.z > 0.0 {
            let log_z = lse + max;
            obj += log_z * log_z * op.z;
        }
        *o = (obj * op.mask[i], nll * op.mask[i], max, lse);
    }
}

simd_dispatch!(ce_backward_rows => ce_backward_rows_generic(
    op: &CrossEntropyOp, x: &[f32], g: &[f32], v: usize, first: usize, stats: Option<&[(f32, f32)]>,
    dx: &mut [f32]) -> ());

/// The gradient of the rows of `x` (the first being row `first`) into `dx`.
#[inline(always)]
fn ce_backward_rows_generic(
    op: &CrossEntropyOp,
    x: &[f32],
    g: &[f32],
    v: usize,
    first: usize,
    stats: Option<&[(f32, f32)]>,
    dx: &mut [f32],
) {
    let n = g.len() / 2;
    let uniform = 1.0 / v as f32;
    for (r, (row, drow)) in x.chunks_exact(v).zip(dx.chunks_exact_mut(v)).enumerate() {
        let i = first + r;
        let (g_obj, g_nll) = (g[i] * op.mask[i], g[n + i] * op.mask[i]);
        if g_obj == 0.0 && g_nll == 0.0 {
            continue; // dx starts at zero
        }
        let (max, lse) = match stats {
            Some(s) => s[i],
            None => ce_row_stats(row, drow),
        };
        // d/dl of each term: nll → p − onehot; mean(−log p) → p − 1/V; log²Z → 2·logZ·p.
        let w_nll = g_obj * (1.0 - op.smoothing.max(0.0)) + g_nll;
        let w_unif = if op.smoothing > 0.0 {
            g_obj * op.smoothing
        } else {
            0.0
        };
        let w_z = if op.z > 0.0 {
            g_obj * 2.0 * op.z * (lse + max)
        } else {
            0.0
        };
        let w_p = w_nll + w_unif + w_z;
        let shift = max + lse;
        let offset = w_unif * uniform;
        for (d, &x) in drow.iter_mut().zip(row) {
            *d = exp_fast(x - shift) * w_p - offset;
        }
        drow[op.targets[i] as usize] -= w_nll;
    }
}

impl CustomOp1 for CrossEntropyOp {
    fn name(&self) -> &'static str {
        "ember-cross-entropy"
    }
    fn cpu_fwd(&self, st: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = cpu_slice(st, l)?;
        let (n, v) = l.shape().dims2()?;
        let mut rows = vec![(0f32, 0f32, 0f32, 0f32); n];
        let ptr = SharedMut(rows.as_mut_ptr());
        for_each_chunk(n, rows_per_task(v), |r| {
            // SAFETY: the rows `r` belong to this task alone.
            let out = unsafe { ptr.slice(r.start, r.len()) };
            ce_forward_rows(self, &x[r.start * v..r.end * v], v, r.start, out);
        });
        let mut out = vec![0f32; 2 * n];
        let (objective, nll) = out.split_at_mut(n);
        for ((o, l), &(obj, row_nll, _, _)) in objective.iter_mut().zip(nll.iter_mut()).zip(&rows) {
            *o = obj;
            *l = row_nll;
        }
        let stats = rows.iter().map(|&(_, _, max, lse)| (max, lse)).collect();
        *self.row_stats.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(stats));
        Ok((CpuStorage::F32(out), Shape::from((2, n))))
    }
    fn bwd(&self, x: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        let (n, v) = x.dims2()?;
        let stats = self.row_stats.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let stats = stats.filter(|s| s.len() == n);
        let dx = with_data([x, g], |[x, g]| {
            let mut dx = vec![0f32; x.len()];
            let ptr = SharedMut(dx.as_mut_ptr());
            for_each_chunk(n, rows_per_task(v), |r| {
                // SAFETY: the rows `r` belong to this task alone.
                let out = unsafe { ptr.slice(r.start * v, r.len() * v) };
                let x = &x[r.start * v..r.end * v];
                ce_backward_rows(self, x, g, v, r.start, stats.as_ref().map(|s| s.as_slice()), out);
            });
            Ok(dx)
        })?;
        Ok(Some(cpu_tensor(dx, x.shape())?))
    }
}
