//! The AdamW update of one parameter (Loshchilov & Hutter 2019, with bias correction).
//!
//! On the CPU the moments of an f32 parameter are plain buffers and the update is one in-place
//! pass over (θ, g, m, v); the tensor form ([`adamw_step_unfused`], the reference) is a dozen
//! passes and allocations per parameter. The gradient may be bf16 (mixed precision's gradients,
//! on the CPU and, with the `bf16` kernels on too, on CUDA): it is widened exactly as it is read
//! and the update is f32's, so θ and the moments stay f32 and take the bits of the f32 update
//! of the widened gradient. The trainer's optimizer owns the schedule, the decay
//! decisions and the checkpointed state; this module owns the arithmetic.

use std::sync::Mutex;

use candle_core::{CpuStorage, Device, InplaceOp2, Layout, Result, Shape, Tensor, Var};

#[cfg(feature = "cuda")]
use crate::cuda::{takes_param, Kernel};
use crate::host::{is_host, is_host_f32, widen};
use crate::par::{self, SharedMut};
use crate::simd::simd_dispatch;

/// The scalars of one update of one parameter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWStep {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// θ is multiplied by this before the update: 1 − lr·weight_decay, or 1 without decay.
    pub decay: f64,
    /// 1 − β₁ᵗ and 1 − β₂ᵗ at update number t.
    pub bias_correction1: f64,
    pub bias_correction2: f64,
    /// Every gradient is multiplied by this first (the clipping factor).
    pub grad_scale: f64,
}

/// AdamW's first and second moment estimates of one parameter.
pub enum Moments {
    /// f32 parameters on the CPU: plain buffers the fused pass updates in place.
    Host { m: Vec<f32>, v: Vec<f32> },
    /// Everything else (CUDA without the optimizer kernel, f64): tensors, updated with tensor ops.
    Tensors { m: Tensor, v: Tensor },
    /// f32 parameters on a CUDA device with the optimizer kernel switched on: device buffers that
    /// [`StepLedger::adamw`](crate::ledger::StepLedger::adamw) updates in place.
    #[cfg(feature = "cuda")]
    Device {
        m: candle_core::cuda::cudarc::driver::CudaSlice<f32>,
        v: candle_core::cuda::cudarc::driver::CudaSlice<f32>,
        dev: candle_core::CudaDevice,
    },
}

impl Moments {
    /// Zero moments shaped like `param`.
    pub fn zeros(param: &Var) -> Result<Self> {
        #[cfg(feature = "cuda")]
        // f32 parameters only (the kernel's θ and moments are f32; the gradient may be bf16).
        if takes_param(param, Kernel::Optimizer) {
            if let Device::Cuda(dev) = param.device() {
                use candle_core::cuda::WrapErr;
                let stream = dev.cuda_stream();
                let n = param.elem_count().max(1);
                return Ok(Moments::Device {
                    m: stream.alloc_zeros::<f32>(n).w()?,
                    v: stream.alloc_zeros::<f32>(n).w()?,
                    dev: dev.clone(),
                });
            }
        }
        Ok(if is_host_f32(param) {
            Moments::Host {
                m: vec![0.0; param.elem_count()],
                v: vec![0.0; param.elem_count()],
            }
        } else {
            let zeros = param.zeros_like()?;
            Moments::Tensors {
                m: zeros.clone(),
                v: zeros,
            }
        })
    }

    /// The moments as tensors of `shape` (copies of the host buffers).
    pub fn tensors(&self, shape: &Shape) -> Result<(Tensor, Tensor)> {
        match self {
            Moments::Host { m, v } => Ok((
                Tensor::from_slice(m, shape, &Device::Cpu)?,
                Tensor::from_slice(v, shape, &Device::Cpu)?,
            )),
            Moments::Tensors { m, v } => Ok((m.clone(), v.clone())),
            #[cfg(feature = "cuda")]
            Moments::Device { m, v, dev } => {
                let copy = |s: &candle_core::cuda::cudarc::driver::CudaSlice<f32>| -> Result<Tensor> {
                    use candle_core::cuda::WrapErr;
                    let n = shape.elem_count();
                    let c = dev.cuda_stream().clone_dtod(&s.slice(..n)).w()?;
                    Ok(crate::cuda::device::tensor(c, dev, shape))
                };
                Ok((copy(m)?, copy(v)?))
            }
        }
    }

    /// Replaces the moments (a restored checkpoint, or the tensor update's result).
    pub fn store(&mut self, new_m: Tensor, new_v: Tensor) -> Result<()> {
        match self {
            Moments::Host { m, v } => {
                *m = new_m.flatten_all()?.to_vec1()?;
                *v = new_v.flatten_all()?.to_vec1()?;
            }
            Moments::Tensors { m, v } => {
                *m = new_m;
                *v = new_v;
            }
            #[cfg(feature = "cuda")]
            Moments::Device { m, v, .. } => {
                crate::cuda::device::copy_into(&new_m, m)?;
                crate::cuda::device::copy_into(&new_v, v)?;
            }
        }
        Ok(())
    }
}

/// The update from tensor ops (every device and dtype; the reference for the fused pass).
pub fn adamw_step_unfused(param: &Var, g: &Tensor, moments: &mut Moments, c: &AdamWStep) -> Result<()> {
    let (m, v) = moments.tensors(param.shape())?;
    // A bf16 gradient of an f32 parameter, widened (exact).
    let g = g.to_dtype(param.dtype())?;
    let g = if c.grad_scale == 1.0 {
        g
    } else {
        (g * c.grad_scale)?
    };
    let m = ((&m * c.beta1)? + (&g * (1.0 - c.beta1))?)?;
    let v = ((&v * c.beta2)? + (g.sqr()? * (1.0 - c.beta2))?)?;
    let denom = ((&v / c.bias_correction2)?.sqrt()? + c.eps)?;
    let update = ((&m / c.bias_correction1)? / denom)?;
    let theta = param.as_tensor().detach();
    let decayed = if c.decay != 1.0 { (theta * c.decay)? } else { theta };
    param.set(&(decayed - (update * c.lr)?)?)?;
    moments.store(m, v)
}

/// One AdamW update of `param` with gradient `g` (in the parameter's dtype, or bf16 for an f32
/// parameter): a single in-place pass for an f32 CPU parameter with host moments,
/// [`adamw_step_unfused`] otherwise.
pub fn adamw_step(param: &Var, g: &Tensor, moments: &mut Moments, c: &AdamWStep) -> Result<()> {
    let Moments::Host { m, v } = moments else {
        return adamw_step_unfused(param, g, moments, c);
    };
    if !is_host(g) {
        return adamw_step_unfused(param, g, moments, c);
    }
    let update = AdamWUpdate {
        moments: Mutex::new((m.as_mut_slice(), v.as_mut_slice())),
        c: UpdateConsts {
            grad_scale: c.grad_scale as f32,
            beta1: c.beta1 as f32,
            one_minus_beta1: (1.0 - c.beta1) as f32,
            beta2: c.beta2 as f32,
            one_minus_beta2: (1.0 - c.beta2) as f32,
            inv_bc1: (1.0 / c.bias_correction1) as f32,
            inv_bc2: (1.0 / c.bias_correction2) as f32,
            eps: c.eps as f32,
            decay: c.decay as f32,
            lr: c.lr as f32,
        },
    };
    param.as_tensor().inplace_op2(&g.contiguous()?, &update)
}

/// The scalars of one AdamW update, rounded to f32 once.
#[derive(Clone, Copy)]
struct UpdateConsts {
    grad_scale: f32,
    beta1: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    inv_bc1: f32,
    inv_bc2: f32,
    eps: f32,
    decay: f32,
    lr: f32,
}

/// AdamW for one f32 CPU parameter in a single pass over (θ, g, m, v), in place. The arithmetic
/// is the tensor path's, operation for operation (the trainer's optimizer tests hold the two
/// together).
struct AdamWUpdate<'a> {
    // `InplaceOp2::cpu_fwd` takes `&self`; the moments are written through this lock.
    moments: Mutex<(&'a mut [f32], &'a mut [f32])>,
    c: UpdateConsts,
}

impl InplaceOp2 for AdamWUpdate<'_> {
    fn name(&self) -> &'static str {
        "ember-adamw"
    }

    fn cpu_fwd(&self, theta: &mut CpuStorage, l1: &Layout, g: &CpuStorage, l2: &Layout) -> Result<()> {
        let CpuStorage::F32(theta) = theta else {
            candle_core::bail!("ember-adamw: expected an f32 parameter");
        };
        let (Some((t0, t1)), Some((g0, g1))) = (l1.contiguous_offsets(), l2.contiguous_offsets()) else {
            candle_core::bail!("ember-adamw: expected a contiguous parameter and gradient");
        };
        let g = match g {
            CpuStorage::F32(g) => Gradient::F32(&g[g0..g1]),
            CpuStorage::BF16(g) => Gradient::Bf16(&g[g0..g1]),
            _ => candle_core::bail!("ember-adamw: expected an f32 or bf16 gradient"),
        };
        let mut guard = self.moments.lock().unwrap_or_else(|e| e.into_inner());
        let (m, v) = &mut *guard;
        let theta = &mut theta[t0..t1];
        if theta.len() != g.len() || m.len() != g.len() || v.len() != g.len() {
            candle_core::bail!("ember-adamw: parameter, gradient and moments differ in size");
        }
        let c = self.c;
        // Elementwise, so chunks in parallel give the same bits as one pass.
        let (tp, mp, vp) = (
            SharedMut(theta.as_mut_ptr()),
            SharedMut(m.as_mut_ptr()),
            SharedMut(v.as_mut_ptr()),
        );
        par::for_each_chunk(g.len(), par::ELEMENTS_PER_TASK, |r| {
            // SAFETY: the elements `r` of θ, m and v belong to this task alone.
            let (theta, m, v) = unsafe {
                (
                    tp.slice(r.start, r.len()),
                    mp.slice(r.start, r.len()),
                    vp.slice(r.start, r.len()),
                )
            };
            match g {
                Gradient::F32(g) => update(theta, &g[r], m, v, c),
                Gradient::Bf16(g) => update(theta, &widen(&g[r]), m, v, c),
            }
        });
        Ok(())
    }
}

/// A parameter's gradient as the host update reads it.
#[derive(Clone, Copy)]
enum Gradient<'a> {
    F32(&'a [f32]),
    /// Widened a task's piece at a time (exact), so the update is the f32 one.
    Bf16(&'a [half::bf16]),
}

impl Gradient<'_> {
    fn len(&self) -> usize {
        match self {
            Gradient::F32(g) => g.len(),
            Gradient::Bf16(g) => g.len(),
        }
    }
}

/// One AdamW step of the elements of θ, in place with their moments, compiled for AVX-512 or
/// AVX2 where the CPU has it ([`simd_dispatch`]; the crate's baseline is SSE2): the square root
/// and the division are correctly rounded at any width, so the bits are the same.
#[inline(always)]
fn update_generic(theta: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], c: UpdateConsts) {
    for (((t, &g), m), v) in theta.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
        let g = g * c.grad_scale;
        *m = *m * c.beta1 + g * c.one_minus_beta1;
        *v = *v * c.beta2 + (g * g) * c.one_minus_beta2;
        let denom = (*v * c.inv_bc2).sqrt() + c.eps;
        *t = *t * c.decay - (*m * c.inv_bc1) / denom * c.lr;
    }
}
simd_dispatch!(update => update_generic(
    theta: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], c: UpdateConsts) -> ());

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Tensor, Var};

    use super::{adamw_step, adamw_step_unfused, AdamWStep, Moments};

    fn step() -> AdamWStep {
        AdamWStep {
            lr: 3e-3,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            decay: 1.0 - 3e-3 * 0.1,
            bias_correction1: 1.0 - 0.9f64.powi(3),
            bias_correction2: 1.0 - 0.95f64.powi(3),
            grad_scale: 0.7,
        }
    }

    /// (θ, m, v) after three updates of an f32 parameter with `grads` by `update`.
    fn after(
        grads: &[Tensor],
        update: fn(&Var, &Tensor, &mut Moments, &AdamWStep) -> candle_core::Result<()>,
    ) -> Vec<Vec<f32>> {
        let theta: Vec<f32> = (0..1000).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01).collect();
        let var = Var::from_tensor(&Tensor::from_vec(theta, (10, 100), &Device::Cpu).unwrap()).unwrap();
        let mut moments = Moments::zeros(&var).unwrap();
        for g in grads {
            update(&var, g, &mut moments, &step()).unwrap();
        }
        let (m, v) = moments.tensors(var.shape()).unwrap();
        [var.as_tensor(), &m, &v]
            .iter()
            .map(|t| t.flatten_all().unwrap().to_vec1().unwrap())
            .collect()
    }

    #[test]
    fn a_bf16_gradient_updates_an_f32_parameter_as_its_f32_widening_does() {
        let grads: Vec<Tensor> = (0..3)
            .map(|s| {
                let g: Vec<f32> = (0..1000)
                    .map(|i| ((i * (7 + s) % 53) as f32 - 26.0) * 0.013)
                    .collect();
                Tensor::from_vec(g, (10, 100), &Device::Cpu)
                    .unwrap()
                    .to_dtype(DType::BF16)
                    .unwrap()
            })
            .collect();
        let widened: Vec<Tensor> = grads.iter().map(|g| g.to_dtype(DType::F32).unwrap()).collect();
        let reference = after(&widened, adamw_step);
        let bits = |v: &Vec<Vec<f32>>| -> Vec<Vec<u32>> {
            v.iter()
                .map(|x| x.iter().map(|f| f.to_bits()).collect())
                .collect()
        };
        // The fused pass reads the bf16 gradient itself; θ and the moments stay f32.
        assert_eq!(bits(&after(&grads, adamw_step)), bits(&reference));
        // The tensor form widens it first: the same update to f32 rounding (the two differ in
        // the order of a few operations, held together by the trainer's optimizer tests).
        for (a, b) in after(&grads, adamw_step_unfused).iter().zip(&reference) {
            for (x, y) in a.iter().zip(b) {
                assert!((x - y).abs() <= 1e-6 * y.abs().max(1e-3), "{x} against {y}");
            }
        }
    }
}
