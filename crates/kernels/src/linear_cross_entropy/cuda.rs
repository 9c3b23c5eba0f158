//! The op on CUDA tensors (the parent module's docs): the logits through cuBLAS, then
//! `cuda/cross_entropy.cu`.

use std::sync::Mutex;

use candle_core::backend::BackendStorage;
use candle_core::cuda::cudarc::driver::CudaView;
use candle_core::op::BackpropOp;
use candle_core::{
    bail, CpuStorage, CudaStorage, CustomOp2, DType, InplaceOp1, Layout, Result, Shape, Storage, Tensor,
};

use crate::cuda::device::{
    alloc, kernel_name, launch, per_row, storage, tensor, view, with_cuda, with_element, Element,
    CROSS_ENTROPY,
};
use crate::cuda::{takes_dtype, Kernel};
use crate::Precision;

/// Threads per row: EMBER_CE_THREADS of `cuda/cross_entropy.cuh`.
const THREADS: u32 = 256;

/// [`super::linear_cross_entropy_in`] on CUDA tensors (h f32, or bf16 with the `bf16`
/// kernels on; W f32) with n, V and d all above 0; `terms` = (label smoothing, z-loss).
pub(super) fn linear_cross_entropy(
    h: &Tensor,
    w: &Tensor,
    targets: &Tensor,
    mask: &Tensor,
    (label_smoothing, z_loss): (f64, f64),
    grads: bool,
    precision: Precision,
) -> Result<Tensor> {
    let (v, d) = w.dims2()?;
    let n = h.elem_count() / d;
    if n > i32::MAX as usize || v > u32::MAX as usize {
        bail!("linear_cross_entropy: {n} rows of {v} logits are more than the CUDA kernel indexes");
    }
    let dev = h.device();
    let targets = targets
        .to_device(dev)?
        .to_dtype(DType::U32)?
        .flatten_all()?
        .contiguous()?;
    let mask = mask
        .to_device(dev)?
        .to_dtype(DType::F32)?
        .flatten_all()?
        .contiguous()?;
    if targets.elem_count() != n || mask.elem_count() != n {
        bail!(
            "linear_cross_entropy: {n} rows but {} targets and {} mask entries",
            targets.elem_count(),
            mask.elem_count()
        );
    }
    let op = DeviceLinearCrossEntropyOp {
        targets,
        mask,
        smoothing: label_smoothing as f32,
        z: z_loss as f32,
        grads,
        precision,
        bf16_logits: precision == Precision::Bf16 && takes_dtype(DType::BF16, Kernel::CrossEntropy),
        saved: Mutex::new(Saved::default()),
    };
    h.reshape((n, d))?.contiguous()?.apply_op2(&w.contiguous()?, op)
}

/// The CUDA op: targets (n, u32) and mask (n, f32) on the device, ε and z as the CPU op
/// rounds them.
struct DeviceLinearCrossEntropyOp {
    targets: Tensor,
    mask: Tensor,
    smoothing: f32,
    z: f32,
    grads: bool,
    /// The products' precision; the kernel's row math is f32 either way.
    precision: Precision,
    /// bf16 products with the `bf16` kernels on: the logits stay as cuBLAS rounds them, in
    /// bf16 (half the n × V buffer, no widening pass), the `_bf16` kernels read them, and
    /// the backward pass takes its probabilities from them (see `kept`).
    bf16_logits: bool,
    saved: Mutex<Saved>,
}

/// What the forward pass leaves for the backward pass.
#[derive(Default)]
struct Saved {
    /// (n, 2): each row's max and lse.
    stats: Option<Tensor>,
    /// (n, V), with `grads`, until a backward pass takes it: the f32 probabilities, or
    /// (`bf16_logits`) the bf16 logits, from which the gradient kernel computes each
    /// probability in f32 as the f32 forward pass would have stored it, so that the
    /// gradient (rounded once, as the products read it) has the bits of the f32 logits' path.
    kept: Option<Kept>,
}

/// A tensor the gradient kernel overwrites, and whether it holds probabilities (else logits).
struct Kept {
    x: Tensor,
    from_probs: bool,
}

/// The targets' elements (a contiguous u32 CUDA tensor).
fn with_targets<R>(t: &Tensor, f: impl FnOnce(CudaView<'_, u32>) -> Result<R>) -> Result<R> {
    let (s, l) = t.storage_and_layout();
    let Storage::Cuda(s) = &*s else {
        bail!("linear_cross_entropy: expected the targets on the CUDA device");
    };
    let Some((a, b)) = l.contiguous_offsets() else {
        bail!("linear_cross_entropy: expected contiguous targets");
    };
    f(s.as_cuda_slice::<u32>()?.slice(a..b))
}

impl CustomOp2 for DeviceLinearCrossEntropyOp {
    fn name(&self) -> &'static str {
        "ember-linear-cross-entropy-cuda"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        bail!("ember-linear-cross-entropy-cuda: CPU tensors take the CPU op")
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let (n, d) = l1.shape().dims2()?;
        let (v, _) = l2.shape().dims2()?;
        let dev = s1.device.clone();
        // h·Wᵀ as candle's own matmul makes it ((b, m, n, k) = (1, n, V, d), W read
        // transposed): the backward pass's recomputation gives the same bits. In bf16 on
        // the operands cast to bf16, the bf16 logits widened for the kernel
        // (Precision::matmul_t's product) unless the `_bf16` kernels read them as they are.
        let (lh, lw) = (Layout::contiguous((n, d)), Layout::contiguous((v, d)));
        let mut logits = match self.precision {
            Precision::F32 if s1.dtype() == DType::F32 => {
                s1.matmul(s2, (1, n, v, d), l1, &l2.transpose(0, 1)?)?
            }
            // A bf16 h (the `bf16` kernels on) into f32 products: widened first.
            Precision::F32 => {
                s1.to_dtype(l1, DType::F32)?
                    .matmul(s2, (1, n, v, d), &lh, &l2.transpose(0, 1)?)?
            }
            Precision::Bf16 => {
                let (h16, w16) = (s1.to_dtype(l1, DType::BF16)?, s2.to_dtype(l2, DType::BF16)?);
                let logits16 = h16.matmul(&w16, (1, n, v, d), &lh, &lw.transpose(0, 1)?)?;
                if self.bf16_logits {
                    logits16
                } else {
                    logits16.to_dtype(&Layout::contiguous((n, v)), DType::F32)?
                }
            }
        };
        // bf16 logits are kept as they are for the backward pass, never overwritten here.
        let write_probs = self.grads && !self.bf16_logits;
        let mut out = alloc(&dev, 2 * n)?;
        let mut stats = alloc(&dev, 2 * n)?;
        with_cuda([&self.mask], |[(ms, ml)]| {
            let mask = view(ms, ml)?;
            with_targets(&self.targets, |targets| {
                with_element!(logits.dtype(), T => {
                    let x = logits.as_cuda_slice_mut::<T>()?;
                    launch!(dev, CROSS_ENTROPY, kernel_name("ember_ce_forward", &[T::NAME]), per_row(n, THREADS);
                        x, &targets, &mask, &mut out, &mut stats, &(n as u32), &(v as u32),
                        &self.smoothing, &self.z, &(write_probs as i32))
                })
            })
        })?;
        let kept = self.grads.then(|| Kept {
            x: Tensor::from_storage(Storage::Cuda(logits), (n, v), BackpropOp::none(), false),
            from_probs: write_probs,
        });
        *self.saved.lock().unwrap_or_else(|e| e.into_inner()) = Saved {
            stats: Some(tensor(stats, &dev, &Shape::from((n, 2)))),
            kept,
        };
        Ok((storage(out, &dev), Shape::from((2, n))))
    }

    fn bwd(
        &self,
        h: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (n, _) = h.dims2()?;
        let (v, _) = w.dims2()?;
        let (stats, kept) = {
            let mut saved = self.saved.lock().unwrap_or_else(|e| e.into_inner());
            (saved.stats.clone(), saved.kept.take())
        };
        let Some(stats) = stats.filter(|s| s.dims() == [n, 2]) else {
            bail!("linear_cross_entropy: backward without the forward pass's row statistics");
        };
        let (h, w) = (h.detach(), w.detach());
        // The gradient is written over what the forward pass kept, or over the logits made
        // again as the forward pass made them.
        let (x, from_probs) = match kept {
            Some(Kept { x, from_probs }) => (x, from_probs),
            None => (self.logits_again(&h, &w)?, false),
        };
        let g = g.to_dtype(DType::F32)?.contiguous()?;
        x.inplace_op1(&GradientOp {
            op: self,
            g: &g,
            stats: &stats,
            n,
            v,
            from_probs,
        })?;
        // dh leaves in h's dtype: f32, or bf16 (rounded once) for a bf16 h.
        let (dh, dw) = match self.precision {
            Precision::F32 => {
                let h = h.to_dtype(DType::F32)?;
                (x.matmul(&w)?, x.t()?.matmul(&h)?)
            }
            Precision::Bf16 => {
                // The n × V gradient cast once for both products (cuBLAS reads its
                // transpose for dW; bf16 already from the `_bf16` kernel), their outputs
                // rounded to bf16 as Precision::matmul's.
                let bf16 = |t: &Tensor| t.to_dtype(DType::BF16);
                let (x16, w16, h16) = (bf16(&x)?, bf16(&w)?, bf16(&h)?);
                drop(x);
                let dh = x16.matmul(&w16)?;
                (dh, x16.t()?.matmul(&h16)?.to_dtype(DType::F32)?)
            }
        };
        Ok((Some(dh.to_dtype(h.dtype())?), Some(dw)))
    }
}

impl DeviceLinearCrossEntropyOp {
    /// The logits of the forward pass made again, with its bits and dtype.
    fn logits_again(&self, h: &Tensor, w: &Tensor) -> Result<Tensor> {
        match self.precision {
            Precision::F32 => h.to_dtype(DType::F32)?.matmul(&w.t()?),
            Precision::Bf16 if self.bf16_logits => {
                h.to_dtype(DType::BF16)?.matmul(&w.to_dtype(DType::BF16)?.t()?)
            }
            Precision::Bf16 => self.precision.matmul_t(&h.to_dtype(DType::F32)?, w),
        }
    }
}

/// Logits (or the forward pass's probabilities) of the op's n × V rows replaced in place by
/// their gradient under the upstream gradient `g` (2 × n: objectives, then NLLs); f32, or
/// bf16 logits (`ember_ce_backward_bf16`, each gradient rounded once).
struct GradientOp<'a> {
    op: &'a DeviceLinearCrossEntropyOp,
    g: &'a Tensor,
    stats: &'a Tensor,
    n: usize,
    v: usize,
    from_probs: bool,
}

impl InplaceOp1 for GradientOp<'_> {
    fn name(&self) -> &'static str {
        "ember-cross-entropy-gradient"
    }

    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout) -> Result<()> {
        bail!("ember-cross-entropy-gradient: CPU tensors take the CPU op")
    }

    fn cuda_fwd(&self, s: &mut CudaStorage, l: &Layout) -> Result<()> {
        let (n, v) = (self.n, self.v);
        let Some((a, b)) = l.contiguous_offsets().filter(|&(a, b)| b - a == n * v) else {
            bail!("ember-cross-entropy-gradient: expected {n} × {v} contiguous logits");
        };
        if self.g.elem_count() != 2 * n {
            bail!("ember-cross-entropy-gradient: expected a gradient of 2 × {n}");
        }
        let dev = s.device.clone();
        with_element!(s.dtype(), T => {
            let x = s.as_cuda_slice_mut::<T>()?;
            with_cuda(
                [self.g, self.stats, &self.op.mask],
                |[(gs, gl), (ss, sl), (ms, ml)]| {
                    let (g, stats, mask) = (view(gs, gl)?, view(ss, sl)?, view(ms, ml)?);
                    with_targets(&self.op.targets, |targets| {
                        let mut x = x.slice_mut(a..b);
                        launch!(dev, CROSS_ENTROPY, kernel_name("ember_ce_backward", &[T::NAME]),
                            per_row(n, THREADS);
                            &mut x, &g, &stats, &targets, &mask, &(n as u32), &(v as u32),
                            &self.op.smoothing, &self.op.z, &(self.from_probs as i32))
                    })
                },
            )
        })
    }
}
