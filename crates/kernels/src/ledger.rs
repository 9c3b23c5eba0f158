//! A training step's optimizer work on a CUDA device with nothing read back between steps: each
//! gradient's sum of squares, the step's verdict (global norm, clip factor, whether the update
//! is applied, AdamW's bias corrections) and the AdamW update itself all run on the device and
//! meet in a small buffer there, the *ledger*, which the host reads only at logged steps.
//!
//! On the CPU the trainer decides each step on the host (`clip_grad_norm`, then `AdamW::step`):
//! reading a sum back costs nothing there. On a GPU each such read is a synchronisation that
//! leaves the device idle while the host catches up, and a step had one per parameter. The
//! verdict's arithmetic is `ember_finish_step` in `cuda/common.cuh`, which the CPU suite also
//! runs as C++ against the host's rules ([`crate::cuda`]'s mirror tests).
//!
//! The window slots (`W_*`) accumulate what the host's training record needs between two logged
//! steps; [`StepLedger::take_window`] reads and clears them.

use candle_core::{Device, Result, Tensor, Var};

use crate::adamw::Moments;

/// The ledger's slots (doubles), as `enum EmberLedger` in `cuda/common.cuh` numbers them.
pub const NORM: usize = 0;
pub const SCALE: usize = 1;
pub const APPLY: usize = 2;
pub const INV_BC1: usize = 3;
pub const INV_BC2: usize = 4;
pub const UPDATES: usize = 5;
pub const SKIPPED: usize = 6;
pub const W_LOSS: usize = 7;
pub const W_NLL: usize = 8;
pub const W_TOKENS: usize = 9;
pub const W_GRAD_NORM: usize = 10;
pub const W_SKIPPED: usize = 11;
pub const W_FIRST_BAD: usize = 12;
pub const W_FIRST_WHAT: usize = 13;
pub const W_FIRST_LOSS: usize = 14;
pub const W_SPIKED: usize = 15;
pub const STOPPED: usize = 16;
pub const LEN: usize = 17;

/// How a step is judged: the host's rules, handed to the device once per step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Verdict {
    /// `train.clip_grad_norm`.
    pub max_norm: Option<f64>,
    /// A loss per token above this (or NaN) marks the ledger's W_SPIKED slot; `None`: no check.
    pub spike_loss: Option<f64>,
    /// `train.on_nonfinite: stop`: from the first non-finite step on, no update is applied.
    pub stop: bool,
    pub beta1: f64,
    pub beta2: f64,
}

/// AdamW's per-parameter scalars that the host knows (the rest comes from the ledger).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceAdamW {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// 1 − lr·weight_decay, or 1 without decay.
    pub decay: f64,
}

/// The device state of the optimizer's side of a step (see the module docs).
pub struct StepLedger {
    #[cfg(feature = "cuda")]
    inner: imp::Ledger,
}

impl StepLedger {
    /// A ledger for `params` parameters on a CUDA `device`, after `updates` applied and
    /// `skipped` skipped updates (a resumed run's counts).
    pub fn new(device: &Device, params: usize, updates: u64, skipped: u64) -> Result<Self> {
        #[cfg(feature = "cuda")]
        {
            Ok(Self {
                inner: imp::Ledger::new(device, params, updates, skipped)?,
            })
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (device, params, updates, skipped);
            candle_core::bail!("the step ledger runs on a CUDA device; this build has no CUDA")
        }
    }

    /// Starts a step: the sums of squares of the previous one are cleared.
    pub fn begin_step(&mut self) -> Result<()> {
        #[cfg(feature = "cuda")]
        return self.inner.begin_step();
        #[cfg(not(feature = "cuda"))]
        unreachable!("no ledger exists without CUDA")
    }

    /// Σ g² of parameter number `slot`'s gradient, into the ledger's partial sums.
    pub fn sum_of_squares(&mut self, slot: usize, g: &Tensor) -> Result<()> {
        #[cfg(feature = "cuda")]
        return self.inner.sum_of_squares(slot, g);
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (slot, g);
            unreachable!("no ledger exists without CUDA")
        }
    }

    /// The step's verdict from its summed losses (f64 scalars on the device), its target
    /// `tokens` and the sums of squares: see `ember_finish_step` in `cuda/common.cuh`.
    pub fn finish_step(
        &mut self,
        objective: &Tensor,
        nll: &Tensor,
        tokens: usize,
        v: &Verdict,
        step: u64,
    ) -> Result<()> {
        #[cfg(feature = "cuda")]
        return self.inner.finish_step(objective, nll, tokens, v, step);
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (objective, nll, tokens, v, step);
            unreachable!("no ledger exists without CUDA")
        }
    }

    /// AdamW on `param` in place, one launch, if the verdict applies this step's update.
    pub fn adamw(&mut self, param: &Var, g: &Tensor, moments: &mut Moments, c: &DeviceAdamW) -> Result<()> {
        #[cfg(feature = "cuda")]
        return self.inner.adamw(param, g, moments, c);
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (param, g, moments, c);
            unreachable!("no ledger exists without CUDA")
        }
    }

    /// Every slot, read back (a synchronisation: logged steps only).
    pub fn read(&self) -> Result<[f64; LEN]> {
        #[cfg(feature = "cuda")]
        return self.inner.read();
        #[cfg(not(feature = "cuda"))]
        unreachable!("no ledger exists without CUDA")
    }

    /// Every slot read back, and the window's slots (`W_*`) cleared (a logged step's upload).
    pub fn take_window(&mut self) -> Result<[f64; LEN]> {
        let slots = self.read()?;
        let mut cleared = slots;
        for s in &mut cleared[W_LOSS..=W_SPIKED] {
            *s = 0.0;
        }
        self.write(&cleared)?;
        Ok(slots)
    }

    fn write(&mut self, slots: &[f64; LEN]) -> Result<()> {
        #[cfg(feature = "cuda")]
        return self.inner.write(slots);
        #[cfg(not(feature = "cuda"))]
        {
            let _ = slots;
            unreachable!("no ledger exists without CUDA")
        }
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use candle_core::cuda::cudarc::driver::CudaSlice;
    use candle_core::cuda::{CudaDevice, CudaStorage, WrapErr};
    use candle_core::{bail, DType, Device, InplaceOp2, Layout, Result, Tensor, Var};

    use super::{DeviceAdamW, Verdict, LEN, SKIPPED, UPDATES};
    use crate::adamw::Moments;
    use candle_core::backend::BackendStorage as _;

    use crate::cuda::device::{
        elementwise, kernel_name, launch, per_row, view_of, with_cuda, with_element, Element, OPTIMIZER,
    };
    use crate::cuda::{takes_dtype, Kernel};

    /// Threads of `ember_sum_squares` (its EMBER_SQUARES_THREADS).
    const SQUARES_THREADS: u32 = 512;

    pub(super) struct Ledger {
        dev: CudaDevice,
        slots: CudaSlice<f64>,
        partials: CudaSlice<f64>,
    }

    fn cuda(device: &Device) -> Result<CudaDevice> {
        match device {
            Device::Cuda(d) => Ok(d.clone()),
            _ => bail!("the step ledger runs on a CUDA device, not {device:?}"),
        }
    }

    /// The device f64 scalar of a one-element tensor.
    fn scalar_view(t: &Tensor) -> Result<Tensor> {
        if t.elem_count() != 1 {
            bail!("the step ledger expected a scalar, got shape {:?}", t.shape());
        }
        t.to_dtype(DType::F64)?.flatten_all()?.contiguous()
    }

    impl Ledger {
        pub(super) fn new(device: &Device, params: usize, updates: u64, skipped: u64) -> Result<Self> {
            let dev = cuda(device)?;
            let stream = dev.cuda_stream();
            let mut init = [0f64; LEN];
            init[UPDATES] = updates as f64;
            init[SKIPPED] = skipped as f64;
            let slots = stream.clone_htod(&init).w()?;
            let partials = stream.alloc_zeros::<f64>(params.max(1)).w()?;
            Ok(Self { dev, slots, partials })
        }

        pub(super) fn begin_step(&mut self) -> Result<()> {
            self.dev.cuda_stream().memset_zeros(&mut self.partials).w()
        }

        pub(super) fn sum_of_squares(&mut self, slot: usize, g: &Tensor) -> Result<()> {
            if slot >= self.partials.len() {
                bail!(
                    "the step ledger has {} parameters, not {}",
                    self.partials.len(),
                    slot + 1
                );
            }
            let g = as_kernels_read(g)?;
            let partials = &mut self.partials;
            with_cuda([&g], |[(s, l)]| {
                with_element!(s.dtype(), T => {
                    let x = view_of::<T>(s, l)?;
                    let n = l.shape().elem_count() as u64;
                    launch!(s.device, OPTIMIZER, kernel_name("ember_sum_squares", &[T::NAME]),
                        per_row(1, SQUARES_THREADS); &x, &n, partials, &(slot as u32))
                })
            })
        }

        pub(super) fn finish_step(
            &mut self,
            objective: &Tensor,
            nll: &Tensor,
            tokens: usize,
            v: &Verdict,
            step: u64,
        ) -> Result<()> {
            let (objective, nll) = (scalar_view(objective)?, scalar_view(nll)?);
            let (so, lo) = objective.storage_and_layout();
            let (sn, ln) = nll.storage_and_layout();
            let (candle_core::Storage::Cuda(so), candle_core::Storage::Cuda(sn)) = (&*so, &*sn) else {
                bail!("the step ledger expected the losses on its CUDA device");
            };
            let o = so
                .as_cuda_slice::<f64>()?
                .slice(lo.start_offset()..lo.start_offset() + 1);
            let n = sn
                .as_cuda_slice::<f64>()?
                .slice(ln.start_offset()..ln.start_offset() + 1);
            let count = self.partials.len() as u32;
            launch!(self.dev, OPTIMIZER, "ember_finish_step_kernel", per_row(1, 32);
                &mut self.slots, &self.partials, &count, &o, &n, &(tokens as f64),
                &v.max_norm.unwrap_or(0.0), &v.spike_loss.unwrap_or(-1.0), &(v.stop as i32), &v.beta1,
                &v.beta2, &step)
        }

        pub(super) fn adamw(
            &mut self,
            param: &Var,
            g: &Tensor,
            moments: &mut Moments,
            c: &DeviceAdamW,
        ) -> Result<()> {
            let Moments::Device { m, v, .. } = moments else {
                bail!("the device AdamW update needs device moments (the optimizer kernel was off when they were made)");
            };
            let update = DeviceUpdate {
                moments: std::sync::Mutex::new((m, v)),
                ledger: &self.slots,
                c: *c,
            };
            let g = as_kernels_read(g)?;
            param.as_tensor().inplace_op2(&g.contiguous()?, &update)
        }

        pub(super) fn read(&self) -> Result<[f64; LEN]> {
            let v = self.dev.cuda_stream().clone_dtoh(&self.slots).w()?;
            let mut out = [0f64; LEN];
            out.copy_from_slice(&v);
            Ok(out)
        }

        pub(super) fn write(&mut self, slots: &[f64; LEN]) -> Result<()> {
            self.dev.cuda_stream().memcpy_htod(slots, &mut self.slots).w()
        }
    }

    /// A gradient as the optimizer's kernels read it: f32 (a device parameter is f32), or bf16
    /// as it is (`ember_sum_squares_bf16`, `ember_adamw_bf16`) with the `bf16` kernels on; any
    /// other dtype widened first.
    fn as_kernels_read(g: &Tensor) -> Result<Tensor> {
        match g.dtype() {
            DType::F32 => Ok(g.clone()),
            DType::BF16 if takes_dtype(DType::BF16, Kernel::Optimizer) => Ok(g.clone()),
            _ => g.to_dtype(DType::F32),
        }
    }

    /// AdamW for one f32 CUDA parameter, in place with its device moments (`ember_adamw`).
    struct DeviceUpdate<'a> {
        // `InplaceOp2::cuda_fwd` takes `&self`; the moments are written through this lock.
        moments: std::sync::Mutex<(&'a mut CudaSlice<f32>, &'a mut CudaSlice<f32>)>,
        ledger: &'a CudaSlice<f64>,
        c: DeviceAdamW,
    }

    impl InplaceOp2 for DeviceUpdate<'_> {
        fn name(&self) -> &'static str {
            "ember-adamw-device"
        }
        fn cpu_fwd(
            &self,
            _: &mut candle_core::CpuStorage,
            _: &Layout,
            _: &candle_core::CpuStorage,
            _: &Layout,
        ) -> Result<()> {
            bail!("ember-adamw-device: a CPU parameter takes the host update")
        }
        fn cuda_fwd(&self, theta: &mut CudaStorage, l1: &Layout, g: &CudaStorage, l2: &Layout) -> Result<()> {
            let (Some((t0, t1)), Some(_)) = (l1.contiguous_offsets(), l2.contiguous_offsets()) else {
                bail!("ember-adamw-device: expected a contiguous parameter and gradient");
            };
            let n = t1 - t0;
            with_element!(g.dtype(), G => {
                let gv = view_of::<G>(g, l2)?;
                let mut guard = self.moments.lock().unwrap_or_else(|e| e.into_inner());
                let (m, v) = &mut *guard;
                if gv.len() != n || m.len() != n || v.len() != n {
                    bail!("ember-adamw-device: parameter, gradient and moments differ in size");
                }
                let dev = theta.device.clone();
                let mut theta = theta.as_cuda_slice_mut::<f32>()?.slice_mut(t0..t1);
                let c = self.c;
                launch!(dev, OPTIMIZER, kernel_name("ember_adamw", &[G::NAME]), elementwise(n);
                    &mut theta, &gv, &mut **m, &mut **v, &(n as u64), self.ledger,
                    &(c.lr as f32), &(c.beta1 as f32), &((1.0 - c.beta1) as f32), &(c.beta2 as f32),
                    &((1.0 - c.beta2) as f32), &(c.eps as f32), &(c.decay as f32))
            })
        }
    }
}
