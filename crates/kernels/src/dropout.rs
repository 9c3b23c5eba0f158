//! Inverted dropout whose mask is a pure function of a SplitMix64 state: element i (in row-major
//! order) is zeroed when draw i + 1 of the generator at `state` is below p, and scaled by
//! 1/(1 − p) otherwise. Because draw i is computed directly ([`ember_rng::draw_at`]), the CPU
//! kernel vectorises and recomputes the mask in its backward pass instead of storing it; the
//! caller moves its generator past `x.elem_count()` draws.
//!
//! The residual connection `x + dropout(y)` is one pass ([`add_dropped`]) inside the op that
//! also computes y, [`linear_residual`](crate::linear_residual).
//!
//! On bf16 activations (the CPU, and CUDA with the `bf16` kernels switched on too) each element
//! is widened, masked and scaled in f32 and rounded once: the f32 op between casts, the same
//! mask. (The residual stream, and so [`add_dropout`]'s sum, stays f32.)

use std::mem::MaybeUninit;

use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor};
use ember_rng::{draw_at, SplitMix64};

use crate::cuda::{takes, Kernel};
use crate::host::{cpu_slice, cpu_storage_like, cpu_values, is_host};
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

/// Dropout with probability `p` and the mask of the generator at `state`, in x's dtype; fused on
/// CPU f32 and bf16 and (with the dropout kernel switched on) CUDA f32, and bf16 with the `bf16`
/// kernels on too; [`dropout_unfused`] elsewhere. `p ≤ 0` is the identity.
pub fn dropout(x: &Tensor, p: f64, state: u64) -> Result<Tensor> {
    if p <= 0.0 {
        return Ok(x.clone());
    }
    if !(is_host(x) || takes(x, Kernel::Dropout)) {
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

    /// (state, threshold, keep): what a CUDA kernel takes.
    #[cfg(any(test, feature = "cuda"))]
    pub(crate) fn parts(&self) -> (u64, u64, f32) {
        (self.state, self.threshold, self.keep)
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
        let y = dropout_apply(*self, &cpu_values(s, l)?);
        Ok((cpu_storage_like(y, s)?, l.shape().clone()))
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let y = cuda::dropout(*self, s, l)?;
        Ok((y, l.shape().clone()))
    }
    /// The same mask on the gradient, recomputed from the counter (on either device).
    fn bwd(&self, _x: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(g.contiguous()?.apply_op1_no_bwd(self)?))
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

/// `x + dropout(y)` as one op with its backward (dx = g, dy = the mask on g): the residual
/// connection around a dropped branch, for the CUDA path, where the branch's product is cuBLAS's
/// and only the add and the mask are Ember's, and for a branch that ends in a bias. (The CPU
/// fuses a bias-free branch into the product itself, [`linear_residual`](crate::linear_residual);
/// elsewhere this is `x + dropout(y)`.)
pub fn add_dropout(x: &Tensor, y: &Tensor, p: f64, state: u64) -> Result<Tensor> {
    match DropoutOp::new(p, state) {
        // f32 only: the stream the branch joins is f32 (module docs).
        Some(op) if takes(x, Kernel::Dropout) && is_f32_pair(x, y) && x.shape() == y.shape() => {
            x.contiguous()?.apply_op2(&y.contiguous()?, AddDropoutOp(op))
        }
        _ => x + dropout(y, p, state)?,
    }
}

fn is_f32_pair(x: &Tensor, y: &Tensor) -> bool {
    x.dtype() == DType::F32 && y.dtype() == DType::F32
}

struct AddDropoutOp(DropoutOp);

impl candle_core::CustomOp2 for AddDropoutOp {
    fn name(&self) -> &'static str {
        "ember-add-dropout"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let out = add_dropped(Some(self.0), cpu_slice(s1, l1)?, cpu_slice(s2, l2)?);
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        Ok((cuda::add_dropout(self.0, s1, l1, s2, l2)?, l1.shape().clone()))
    }
    fn bwd(
        &self,
        _x: &Tensor,
        _y: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        Ok((Some(g.clone()), Some(g.contiguous()?.apply_op1_no_bwd(&self.0)?)))
    }
}

/// The launches of `cuda/dropout.cu`.
#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::backend::BackendStorage as _;
    use candle_core::{CudaStorage, Layout, Result};

    use super::DropoutOp;
    use crate::cuda::device::{
        alloc, alloc_of, elementwise, kernel_name, launch, storage, view, view_of, with_element, Element,
        DROPOUT,
    };

    /// The mask on f32 activations, or (`ember_dropout_bf16`) on bf16 ones.
    pub(super) fn dropout(op: DropoutOp, s: &CudaStorage, l: &Layout) -> Result<CudaStorage> {
        with_element!(s.dtype(), T => {
            let (x, n) = (view_of::<T>(s, l)?, l.shape().elem_count());
            let (state, threshold, keep) = op.parts();
            let mut y = alloc_of::<T>(&s.device, n)?;
            if n > 0 {
                launch!(s.device, DROPOUT, kernel_name("ember_dropout", &[T::NAME]), elementwise(n);
                    &x, &mut y, &(n as u64), &state, &threshold, &keep)?;
            }
            Ok(storage(y, &s.device))
        })
    }

    pub(super) fn add_dropout(
        op: DropoutOp,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<CudaStorage> {
        let (x, y, n) = (view(s1, l1)?, view(s2, l2)?, l1.shape().elem_count());
        let (state, threshold, keep) = op.parts();
        let mut out = alloc(&s1.device, n)?;
        if n > 0 {
            launch!(s1.device, DROPOUT, "ember_add_dropout", elementwise(n);
                &x, &y, &mut out, &(n as u64), &state, &threshold, &keep)?;
        }
        Ok(storage(out, &s1.device))
    }
}
