//! Inverted dropout whose mask is a pure function of a SplitMix64 state: element i (in row-major
//! order) is zeroed when draw i + 1 of the generator at `state` is below p, and scaled by
//! 1/(1 − p) otherwise. Because draw i is computed directly ([`ember_rng::draw_at`]), the CPU
//! kernel vectorises and recomputes the mask in its backward pass instead of storing it; the
//! caller moves its generator past `x.elem_count()` draws.
//!
//! The residual connection `x + dropout(y)` is one pass ([`add_dropped`]) inside the op that
//! also computes y, [`linear_residual`](crate::linear_residual).

use std::mem::MaybeUninit;

use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};
use ember_rng::{draw_at, SplitMix64};

use crate::host::{cpu_slice, cpu_tensor, is_host_f32, with_data};
use crate::par::{fill, ELEMENTS_PER_TASK};
use crate::simd::{add, simd_dispatch};

/// The mask drawn one uniform at a time from a generator at `state`, uploaded and multiplied
/// (every device and dtype; the reference for the kernel).
pub fn dropout_unfused(x: &Tensor, p: f64, state: u64) -> Result<Tensor> {
    let mut rng = SplitMix64::new(state);
    let keep = 1.0 / (1.0 - p);
    let mask: Vec<f32> = (0..x.elem_count())
        .map(|_| if rng.uniform() < p { 0.0 } else { keep as f32 })
        .collect();
    let mask = Tensor::from_vec(mask, x.shape(), x.device())?.to_dtype(x.dtype())?;
    x.mul(&mask)
}

/// Dropout with probability `p` and the mask of the generator at `state`; fused on CPU f32,
/// [`dropout_unfused`] elsewhere. `p ≤ 0` is the identity.
pub fn dropout(x: &Tensor, p: f64, state: u64) -> Result<Tensor> {
    if p <= 0.0 {
        return Ok(x.clone());
    }
    if !is_host_f32(x) {
        return dropout_unfused(x, p, state);
    }
    let Some(op) = DropoutOp::new(p, state) else {
        return Ok(x.clone());
    };
    x.contiguous()?.apply_op1(op)
}

/// The inverted-dropout mask of the generator at `state`: element i is dropped when draw i + 1
/// is, otherwise scaled by `keep` = 1/(1 − p). Also the mask of attention-probability dropout.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DropoutOp {
    state: u64,
    threshold: u64,
    keep: f32,
}

impl DropoutOp {
    /// `None` for p ≤ 0 (the identity).
    pub(crate) fn new(p: f64, state: u64) -> Option<Self> {
        (p > 0.0).then(|| Self {
            state,
            // uniform = (z >> 11)·2⁻⁵³ < p  ⟺  z >> 11 < ⌈p·2⁵³⌉ (an exact integer comparison).
            threshold: (p * (1u64 << 53) as f64).ceil() as u64,
            keep: (1.0 / (1.0 - p)) as f32,
        })
    }

    /// Whether the element with row-major index `i` is dropped.
    #[inline(always)]
    pub(crate) fn dropped(&self, i: usize) -> bool {
        (draw_at(self.state, i as u64 + 1) >> 11) < self.threshold
    }

    /// The mask's factor (0 or 1/(1 − p)) of element `i`.
    #[inline(always)]
    pub(crate) fn factor(&self, i: usize) -> f32 {
        if self.dropped(i) {
            0.0
        } else {
            self.keep
        }
    }
}

/// `x[i] · mask[first + i]` for the mask of [`dropout`], into `y`.
#[inline(always)]
fn dropout_generic(op: DropoutOp, x: &[f32], first: usize, y: &mut [MaybeUninit<f32>]) {
    for (i, (y, &v)) in y.iter_mut().zip(x).enumerate() {
        // A select, not v · factor: 0 · v would keep −0.0 and NaN of dropped elements.
        y.write(if op.dropped(first + i) { 0.0 } else { v * op.keep });
    }
}
simd_dispatch!(dropout_into => dropout_generic(op: DropoutOp, x: &[f32], first: usize, y: &mut [MaybeUninit<f32>]) -> ());

/// The masked copy of `x`, in parallel pieces.
pub(crate) fn dropout_apply(op: DropoutOp, x: &[f32]) -> Vec<f32> {
    fill(x.len(), ELEMENTS_PER_TASK, |r, y| {
        dropout_into(op, &x[r.clone()], r.start, y)
    })
}

impl CustomOp1 for DropoutOp {
    fn name(&self) -> &'static str {
        "ember-dropout"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        Ok((
            CpuStorage::F32(dropout_apply(*self, cpu_slice(s, l)?)),
            l.shape().clone(),
        ))
    }
    fn bwd(&self, x: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        let dx = with_data([g], |[g]| Ok(dropout_apply(*self, g)))?;
        Ok(Some(cpu_tensor(dx, x.shape())?))
    }
}

/// `x[i] + y[i] · mask[first + i]` into `out`.
#[inline(always)]
fn add_dropout_generic(op: DropoutOp, x: &[f32], y: &[f32], first: usize, out: &mut [MaybeUninit<f32>]) {
    for (i, ((o, &x), &y)) in out.iter_mut().zip(x).zip(y).enumerate() {
        // As dropout_generic, then the add: the same two roundings as the ops one by one.
        let dropped = if op.dropped(first + i) { 0.0 } else { y * op.keep };
        o.write(x + dropped);
    }
}
simd_dispatch!(add_dropout_into => add_dropout_generic(
    op: DropoutOp, x: &[f32], y: &[f32], first: usize, out: &mut [MaybeUninit<f32>]) -> ());

/// `x + y` with y masked by `mask` (`None`: unmasked), in parallel pieces.
pub(crate) fn add_dropped(mask: Option<DropoutOp>, x: &[f32], y: &[f32]) -> Vec<f32> {
    fill(x.len(), ELEMENTS_PER_TASK, |r, out| match mask {
        Some(op) => add_dropout_into(op, &x[r.clone()], &y[r.clone()], r.start, out),
        None => add(&x[r.clone()], &y[r], out),
    })
}
