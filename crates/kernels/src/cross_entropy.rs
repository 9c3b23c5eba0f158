//! The loss: log-softmax, label-smoothed cross-entropy, z-loss and padding, row by row.
//!
//! [`LossRows`] is the per-row math of the fused [`crate::linear_cross_entropy`] (which makes the
//! logits itself, a block at a time); [`cross_entropy_unfused`] is the composition of candle
//! primitives it equals.

use candle_core::{bail, DType, Result, Tensor, D};

use crate::par::{for_each_chunk, rows_per_task, SharedMut};
use crate::simd::{exp_fast, max_of_wide, simd_dispatch, sum_wide};

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

/// What turns a row of logits into its losses and their gradient: the row's target, its mask
/// entry (0 at padding), label smoothing ε and the z-loss weight.
pub(crate) struct LossRows {
    pub targets: Vec<u32>,
    pub mask: Vec<f32>,
    pub smoothing: f32,
    pub z: f32,
}

impl LossRows {
    /// Checks that `targets` and `mask` have `n` entries and every target is below `vocab`.
    pub fn new(
        n: usize,
        vocab: usize,
        targets: &Tensor,
        mask: &Tensor,
        label_smoothing: f64,
        z_loss: f64,
    ) -> Result<Self> {
        let targets: Vec<u32> = targets.to_dtype(DType::U32)?.to_vec1()?;
        let mask: Vec<f32> = mask.to_dtype(DType::F32)?.to_vec1()?;
        if targets.len() != n || mask.len() != n {
            bail!(
                "linear_cross_entropy: {n} rows but {} targets and {} mask entries",
                targets.len(),
                mask.len()
            );
        }
        if let Some(&bad) = targets.iter().find(|&&t| t as usize >= vocab) {
            bail!("linear_cross_entropy: target {bad} is outside the vocabulary of {vocab}");
        }
        Ok(Self {
            targets,
            mask,
            smoothing: label_smoothing as f32,
            z: z_loss as f32,
        })
    }

    /// (objective, NLL, max, lse) of every row of `x` (N × v) into `out`, in parallel.
    pub fn forward(&self, x: &[f32], v: usize, first: usize, out: &mut [(f32, f32, f32, f32)]) {
        let ptr = SharedMut(out.as_mut_ptr());
        for_each_chunk(out.len(), rows_per_task(v), |r| {
            // SAFETY: the rows `r` belong to this task alone.
            let out = unsafe { ptr.slice(r.start, r.len()) };
            ce_forward_rows(self, &x[r.start * v..r.end * v], v, first + r.start, out);
        });
    }

    /// Replaces every row of `x` (logits of rows `first..`, N × v) by its gradient under the
    /// upstream gradient `g` (2 × all rows: objective, then NLL), in parallel; `stats` are every
    /// row's (max, lse).
    pub fn gradient_in_place(&self, x: &mut [f32], g: &[f32], v: usize, first: usize, stats: &[(f32, f32)]) {
        let ptr = SharedMut(x.as_mut_ptr());
        for_each_chunk(x.len() / v.max(1), rows_per_task(v), |r| {
            // SAFETY: the rows `r` belong to this task alone.
            let rows = unsafe { ptr.slice(r.start * v, r.len() * v) };
            ce_gradient_rows(self, rows, g, v, first + r.start, stats);
        });
    }
}

impl LossRows {
    /// [`forward`](Self::forward) and then [`gradient_in_place`](Self::gradient_in_place) under
    /// the unit upstream gradient (1 on every objective, 0 on every NLL), a row at a time: the
    /// gradient is written while the row is still in L1 and from the exponentials the losses
    /// already took, instead of reading the block again and taking them a second time.
    pub fn forward_and_unit_gradient_in_place(
        &self,
        x: &mut [f32],
        v: usize,
        first: usize,
        out: &mut [(f32, f32, f32, f32)],
    ) {
        let (rows, outs) = (SharedMut(x.as_mut_ptr()), SharedMut(out.as_mut_ptr()));
        for_each_chunk(out.len(), rows_per_task(v), |r| {
            // SAFETY: the rows `r` (of logits and of `out`) belong to this task alone.
            let (x, out) = unsafe { (rows.slice(r.start * v, r.len() * v), outs.slice(r.start, r.len())) };
            ce_forward_unit_gradient_rows(self, x, v, first + r.start, out);
        });
    }
}

simd_dispatch!(ce_forward_unit_gradient_rows => ce_forward_unit_gradient_rows_generic(
    op: &LossRows, x: &mut [f32], v: usize, first: usize, out: &mut [(f32, f32, f32, f32)]) -> ());

/// For the rows of `x` (the first being row `first`): (objective, NLL, max, lse) of each, then
/// the row replaced by its gradient under a unit objective gradient: p·w_p − w_unif/V, minus
/// w_nll at the target, with p = exp(x − max)/Σ from the losses' own exponentials.
#[inline(always)]
fn ce_forward_unit_gradient_rows_generic(
    op: &LossRows,
    x: &mut [f32],
    v: usize,
    first: usize,
    out: &mut [(f32, f32, f32, f32)],
) {
    let mut scratch = vec![0f32; v];
    let uniform = 1.0 / v as f32;
    for (r, (row, o)) in x.chunks_exact_mut(v).zip(out.iter_mut()).enumerate() {
        let i = first + r;
        let (max, total) = ce_row_stats(row, &mut scratch);
        let lse = total.ln();
        let (obj, nll) = row_losses(op, row, i, max, lse);
        let mask = op.mask[i];
        *o = (obj * mask, nll * mask, max, lse);
        if mask == 0.0 {
            row.fill(0.0);
            continue;
        }
        // The gradient pass's weights for g_obj = mask and g_nll = 0.
        let (w_nll, w_unif, w_p) = gradient_weights(op, mask, 0.0, max, lse);
        let scale = w_p / total;
        let offset = w_unif * uniform;
        for (x, &e) in row.iter_mut().zip(scratch.iter()) {
            *x = e * scale - offset;
        }
        row[op.targets[i] as usize] -= w_nll;
    }
}

/// (objective, NLL) of row `i` of the logits, unmasked, given its max and lse.
#[inline(always)]
fn row_losses(op: &LossRows, row: &[f32], i: usize, max: f32, lse: f32) -> (f32, f32) {
    let v = row.len();
    let nll = -((row[op.targets[i] as usize] - max) - lse);
    let mut obj = nll;
    if op.smoothing > 0.0 {
        // mean_v(−log p) = lse − mean_v(shifted)
        let mean_lp = (sum_wide(row) / v as f32 - max) - lse;
        obj = nll * (1.0 - op.smoothing) + (-mean_lp) * op.smoothing;
    }
    if op.z > 0.0 {
        let log_z = lse + max;
        obj += log_z * log_z * op.z;
    }
    (obj, nll)
}

/// The weights of a row's gradient under upstream gradients `g_obj` (masked objective) and
/// `g_nll`: (w_nll, w_unif, w_p), the gradient being p·w_p − w_unif/V, minus w_nll at the target.
/// d/dl of each term: nll → p − onehot; mean(−log p) → p − 1/V; log²Z → 2·logZ·p.
#[inline(always)]
fn gradient_weights(op: &LossRows, g_obj: f32, g_nll: f32, max: f32, lse: f32) -> (f32, f32, f32) {
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
    (w_nll, w_unif, w_nll + w_unif + w_z)
}

/// (max, Σ exp(row − max)) of one row; `scratch` (same length) receives exp(row − max).
#[inline(always)]
fn ce_row_stats(row: &[f32], scratch: &mut [f32]) -> (f32, f32) {
    let max = max_of_wide(row);
    // Exponentials first, then the sum: a fused loop with a reduction does not vectorise.
    for (e, &x) in scratch.iter_mut().zip(row) {
        *e = exp_fast(x - max);
    }
    (max, sum_wide(scratch))
}

simd_dispatch!(ce_forward_rows => ce_forward_rows_generic(
    op: &LossRows, x: &[f32], v: usize, first: usize, out: &mut [(f32, f32, f32, f32)]) -> ());

/// For the rows of `x` (the first being row `first`): (objective, NLL, max, lse) of each.
#[inline(always)]
fn ce_forward_rows_generic(
    op: &LossRows,
    x: &[f32],
    v: usize,
    first: usize,
    out: &mut [(f32, f32, f32, f32)],
) {
    let mut scratch = vec![0f32; v];
    for (r, (row, o)) in x.chunks_exact(v).zip(out.iter_mut()).enumerate() {
        let i = first + r;
        let (max, total) = ce_row_stats(row, &mut scratch);
        let lse = total.ln();
        let (obj, nll) = row_losses(op, row, i, max, lse);
        *o = (obj * op.mask[i], nll * op.mask[i], max, lse);
    }
}

simd_dispatch!(ce_gradient_rows => ce_gradient_rows_generic(
    op: &LossRows, rows: &mut [f32], g: &[f32], v: usize, first: usize, stats: &[(f32, f32)]) -> ());

/// Replaces the logits in `rows` (the first being row `first`) by their gradient.
#[inline(always)]
fn ce_gradient_rows_generic(
    op: &LossRows,
    rows: &mut [f32],
    g: &[f32],
    v: usize,
    first: usize,
    stats: &[(f32, f32)],
) {
    let n = g.len() / 2;
    let uniform = 1.0 / v as f32;
    for (r, row) in rows.chunks_exact_mut(v).enumerate() {
        let i = first + r;
        let (g_obj, g_nll) = (g[i] * op.mask[i], g[n + i] * op.mask[i]);
        if g_obj == 0.0 && g_nll == 0.0 {
            row.fill(0.0);
            continue;
        }
        let (max, lse) = stats[i];
        let (w_nll, w_unif, w_p) = gradient_weights(op, g_obj, g_nll, max, lse);
        let shift = max + lse;
        let offset = w_unif * uniform;
        for x in row.iter_mut() {
            *x = exp_fast(*x - shift) * w_p - offset;
        }
        row[op.targets[i] as usize] -= w_nll;
    }
}

/// The (2, n) output of the per-row losses: objectives, then NLLs.
pub(crate) fn loss_output(rows: &[(f32, f32, f32, f32)]) -> Vec<f32> {
    let n = rows.len();
    let mut out = vec![0f32; 2 * n];
    let (objective, nll) = out.split_at_mut(n);
    for ((o, l), &(obj, row_nll, _, _)) in objective.iter_mut().zip(nll.iter_mut()).zip(rows) {
        *o = obj;
        *l = row_nll;
    }
    out
}

/// The CUDA kernels' row math (`cuda/cross_entropy.cuh`, compiled for the host by
/// `cuda/cross_entropy_mirror.cpp`, whose rows run the kernels' lane loops and block reduction)
/// against this module's CPU kernel: what the GPU computes for a row is checked on every machine.
#[cfg(test)]
mod cuda_mirror {
    use super::*;

    extern "C" {
        #[allow(clippy::too_many_arguments)]
        fn ember_mirror_ce_row_losses(
            x_t: f32,
            row_sum: f32,
            v: u32,
            max: f32,
            lse: f32,
            eps: f32,
            z: f32,
            objective: *mut f32,
            nll: *mut f32,
        );
        #[allow(clippy::too_many_arguments)]
        fn ember_mirror_ce_forward_row(
            x: *const f32,
            v: u32,
            target: u32,
            mask: f32,
            eps: f32,
            z: f32,
            out: *mut f32,
            probs: *mut f32,
        );
        #[allow(clippy::too_many_arguments)]
        fn ember_mirror_ce_gradient_row(
            x: *mut f32,
            v: u32,
            target: u32,
            g_obj: f32,
            g_nll: f32,
            mask: f32,
            max: f32,
            lse: f32,
            eps: f32,
            z: f32,
            from_probs: i32,
        );
    }

    fn random(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut rng = ember_rng::SplitMix64::new(seed);
        (0..n).map(|_| rng.normal() as f32 * scale).collect()
    }

    /// One row's loss parameters, as the CPU op holds them.
    fn one_row(target: usize, mask: f32, eps: f32, z: f32) -> LossRows {
        LossRows {
            targets: vec![target as u32],
            mask: vec![mask],
            smoothing: eps,
            z,
        }
    }

    /// The device's (mask·objective, mask·NLL, max, lse) of a row, and its probabilities.
    fn device_forward(row: &[f32], op: &LossRows) -> ([f32; 4], Vec<f32>) {
        let (mut out, mut probs) = ([0f32; 4], vec![0f32; row.len()]);
        unsafe {
            ember_mirror_ce_forward_row(
                row.as_ptr(),
                row.len() as u32,
                op.targets[0],
                op.mask[0],
                op.smoothing,
                op.z,
                out.as_mut_ptr(),
                probs.as_mut_ptr(),
            )
        };
        (out, probs)
    }

    /// The device's gradient of a row (`x`: its logits, or with `from_probs` its probabilities).
    fn device_gradient(
        x: &[f32],
        op: &LossRows,
        g: [f32; 2],
        stats: (f32, f32),
        from_probs: bool,
    ) -> Vec<f32> {
        let mut x = x.to_vec();
        unsafe {
            ember_mirror_ce_gradient_row(
                x.as_mut_ptr(),
                x.len() as u32,
                op.targets[0],
                g[0],
                g[1],
                op.mask[0],
                stats.0,
                stats.1,
                op.smoothing,
                op.z,
                from_probs as i32,
            )
        };
        x
    }

    /// Rows of several lengths: shorter than a warp, than the block, not multiples of 32, a 10k
    /// vocabulary; logits of a trained model's spread, one far below the rest (exp → 0).
    fn rows() -> Vec<Vec<f32>> {
        [1usize, 5, 31, 33, 255, 257, 1000, 1003, 10_000]
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let mut row = random(v, 70 + i as u64, 3.0);
                if v > 3 {
                    row[3] = -200.0;
                }
                row
            })
            .collect()
    }

    const SETTINGS: [(f32, f32); 5] = [(0.0, 0.0), (0.1, 0.0), (0.0, 1e-4), (0.1, 1e-4), (0.2, 1.0)];

    fn same(a: f32, b: f32) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }

    #[test]
    fn the_device_row_losses_are_the_cpu_row_losses_bit_for_bit() {
        // Given the same max, lse and row sum, the losses are the same operations.
        for row in rows() {
            let v = row.len();
            let (max, total) = ce_row_stats(&row, &mut vec![0f32; v]);
            let lse = total.ln();
            for (eps, z) in SETTINGS {
                for target in [0, v / 2, v - 1] {
                    let op = one_row(target, 1.0, eps, z);
                    let (obj, nll) = row_losses(&op, &row, 0, max, lse);
                    let (mut d_obj, mut d_nll) = (0f32, 0f32);
                    unsafe {
                        ember_mirror_ce_row_losses(
                            row[target],
                            sum_wide(&row),
                            v as u32,
                            max,
                            lse,
                            eps,
                            z,
                            &mut d_obj,
                            &mut d_nll,
                        )
                    };
                    let what = format!("v {v} target {target} eps {eps} z {z}");
                    assert!(same(d_obj, obj), "{what}: objective {d_obj} vs {obj}");
                    assert!(same(d_nll, nll), "{what}: NLL {d_nll} vs {nll}");
                }
            }
        }
    }

    #[test]
    fn the_device_forward_row_is_the_cpu_forward_row_to_rounding() {
        // The sums run in another order (the block's lanes) and lse is the C library's logf:
        // equal to a few units in the last place of the loss, the max exactly.
        for row in rows() {
            let v = row.len();
            for (eps, z) in SETTINGS {
                for mask in [1.0, 0.0, 0.5] {
                    let op = one_row(v - 1, mask, eps, z);
                    let mut cpu = [(0f32, 0f32, 0f32, 0f32)];
                    ce_forward_rows_generic(&op, &row, v, 0, &mut cpu);
                    let (obj, nll, max, lse) = cpu[0];
                    let (dev, probs) = device_forward(&row, &op);
                    let what = format!("v {v} eps {eps} z {z} mask {mask}");
                    assert_eq!(dev[2].to_bits(), max.to_bits(), "{what}: max");
                    for (name, d, c) in [
                        ("objective", dev[0], obj),
                        ("NLL", dev[1], nll),
                        ("lse", dev[3], lse),
                    ] {
                        let tol = 1e-6 * c.abs().max(1.0);
                        assert!((d - c).abs() <= tol, "{what}: {name} {d} vs {c}");
                    }
                    // The probabilities sum to 1 and are exp_fast(x − max − lse) exactly.
                    let shift = dev[2] + dev[3];
                    let total: f64 = probs.iter().map(|&p| p as f64).sum();
                    assert!((total - 1.0).abs() < 1e-5, "{what}: probabilities sum to {total}");
                    for (&p, &x) in probs.iter().zip(&row) {
                        assert_eq!(p.to_bits(), exp_fast(x - shift).to_bits(), "{what}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_device_gradient_row_is_the_cpu_gradient_row_bit_for_bit() {
        // For the same (max, lse) — here the device's own — the gradient is the CPU's
        // `ce_gradient_rows` operation for operation, from the logits or from the probabilities
        // the device's forward pass left, for upstream gradients on either row, padding included.
        let gradients = [[1.0, 0.0], [0.37, 0.0], [-0.2, 1.3], [0.0, 0.8], [0.0, 0.0]];
        for row in rows() {
            let v = row.len();
            for (eps, z) in SETTINGS {
                for mask in [1.0, 0.0, 0.5] {
                    for g in gradients {
                        let op = one_row(v / 3, mask, eps, z);
                        let (dev, probs) = device_forward(&row, &op);
                        let stats = (dev[2], dev[3]);
                        let mut cpu = row.clone();
                        ce_gradient_rows_generic(&op, &mut cpu, &g, v, 0, &[stats]);
                        let from_logits = device_gradient(&row, &op, g, stats, false);
                        let from_probs = device_gradient(&probs, &op, g, stats, true);
                        let what = format!("v {v} eps {eps} z {z} mask {mask} g {g:?}");
                        for j in 0..v {
                            assert!(
                                same(from_logits[j], cpu[j]),
                                "{what}: element {j} from the logits"
                            );
                            assert!(
                                same(from_probs[j], cpu[j]),
                                "{what}: element {j} from the probabilities"
                            );
                        }
                        if mask == 0.0 || g == [0.0, 0.0] {
                            assert!(cpu.iter().all(|&x| x == 0.0), "{what}: padding has no gradient");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_device_gradient_for_the_trainer_is_the_cpu_prepared_gradient_to_rounding() {
        // The CPU op prepares the trainer's gradient (1 on the objective, 0 on the NLL) in its
        // forward pass from the exponentials the losses took (e·w_p/Σe); the device forms it
        // from exp(x − shift), shift = max + lse (its own lse) rounded once more, which moves p by
        // up to ulp(shift)/2 relative (~1e-6 for |shift| ≈ 20): ‖a − b‖/‖b‖ < 1e-5.
        for row in rows() {
            let v = row.len();
            for (eps, z) in SETTINGS {
                for mask in [1.0, 0.0] {
                    let op = one_row(v / 2, mask, eps, z);
                    let mut cpu = row.clone();
                    let mut out = [(0f32, 0f32, 0f32, 0f32)];
                    ce_forward_unit_gradient_rows_generic(&op, &mut cpu, v, 0, &mut out);
                    let (dev, probs) = device_forward(&row, &op);
                    let grad = device_gradient(&probs, &op, [1.0, 0.0], (dev[2], dev[3]), true);
                    let what = format!("v {v} eps {eps} z {z} mask {mask}");
                    if mask == 0.0 {
                        assert!(grad.iter().chain(&cpu).all(|&x| x == 0.0), "{what}");
                        continue;
                    }
                    let (mut num, mut den) = (0f64, 0f64);
                    for (&a, &b) in grad.iter().zip(&cpu) {
                        num += ((a - b) as f64).powi(2);
                        den += (b as f64).powi(2);
                    }
                    // (A row of one logit has the gradient 0 exactly.)
                    let rel = (num / den.max(1e-30)).sqrt();
                    assert!(rel < 1e-5, "{what}: relative difference {rel:e}");
                }
            }
        }
    }

    extern "C" {
        fn ember_mirror_ce_forward_row_bf16(
            x: *const u16,
            v: u32,
            target: u32,
            mask: f32,
            eps: f32,
            z: f32,
            out: *mut f32,
            probs: *mut f32,
        );
        fn ember_mirror_ce_gradient_row_bf16(
            x: *mut u16,
            v: u32,
            target: u32,
            g_obj: f32,
            g_nll: f32,
            mask: f32,
            max: f32,
            lse: f32,
            eps: f32,
            z: f32,
            from_probs: i32,
        );
    }

    #[test]
    fn the_bf16_device_rows_are_the_f32_rows_between_casts_bit_for_bit() {
        // bf16 logits (cuBLAS's bf16 products under bf16 precision) read widened: the losses,
        // (max, lse) and probabilities of the f32 row of their widened values, bit for bit; the
        // gradient, computed from the logits, that row's rounded once.
        let bits = |v: &[f32]| -> Vec<u16> { v.iter().map(|&x| half::bf16::from_f32(x).to_bits()).collect() };
        for row in rows() {
            let row16 = bits(&row);
            let wide: Vec<f32> = row16.iter().map(|&b| f32::from_bits((b as u32) << 16)).collect();
            let v = row.len();
            for (eps, z) in SETTINGS {
                for (mask, g) in [(1.0, [1.0, 0.0]), (0.5, [-0.2, 1.3]), (0.0, [1.0, 0.0])] {
                    let op = one_row(v / 3, mask, eps, z);
                    let (dev, probs) = device_forward(&wide, &op);
                    let (mut dev16, mut probs16) = ([0f32; 4], vec![0f32; v]);
                    unsafe {
                        ember_mirror_ce_forward_row_bf16(
                            row16.as_ptr(),
                            v as u32,
                            op.targets[0],
                            mask,
                            eps,
                            z,
                            dev16.as_mut_ptr(),
                            probs16.as_mut_ptr(),
                        )
                    };
                    let what = format!("v {v} eps {eps} z {z} mask {mask} g {g:?}");
                    assert!(
                        dev.iter().zip(&dev16).all(|(&a, &b)| same(a, b)),
                        "{what}: {dev:?} vs {dev16:?}"
                    );
                    assert!(
                        probs.iter().zip(&probs16).all(|(&a, &b)| same(a, b)),
                        "{what}: probabilities"
                    );
                    let f32_gradient = device_gradient(&wide, &op, g, (dev[2], dev[3]), false);
                    let mut x16 = row16.clone();
                    unsafe {
                        ember_mirror_ce_gradient_row_bf16(
                            x16.as_mut_ptr(),
                            v as u32,
                            op.targets[0],
                            g[0],
                            g[1],
                            mask,
                            dev[2],
                            dev[3],
                            eps,
                            z,
                            0,
                        )
                    };
                    assert_eq!(x16, bits(&f32_gradient), "{what}: gradient");
                }
            }
        }
    }
}
