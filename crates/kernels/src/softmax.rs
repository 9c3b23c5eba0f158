//! Softmax over the last dimension.
//!
//! On bf16 activations (the CPU, and CUDA with the `bf16` kernels switched on too) the row is
//! read widened, computed in f32 and each probability rounded once: the forward pass is the f32
//! op between casts. The backward pass reads the rounded probabilities (the f32 op reads its
//! own) and the bf16 gradient widened, computes dx as the f32 backward pass does and rounds it
//! once: within a few bf16 roundings of the f32 op's gradient, not its bits.
//!
//! On CUDA (`cuda/softmax.cu`) one warp per row computes what the CPU kernel does, with the CPU's
//! own exponential (`ember_exp_fast` in `cuda/softmax.cuh`, checked bit for bit against
//! [`exp_fast`] by the host mirror); only the order of each row's sum differs.

use std::mem::MaybeUninit;

use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor, D};

use crate::cuda::{takes, Kernel};
use crate::host::{cpu_storage_like, cpu_tensor_as, cpu_values, is_host, with_data};
use crate::par::{fill, rows_per_task};
use crate::simd::{dot, exp_fast, max_of, sum};

/// Softmax over the last dimension from differentiable primitives (the max is detached: softmax
/// is shift-invariant, so its gradient through the max is exactly zero).
pub fn softmax_rows_unfused(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let e = x.broadcast_sub(&max)?.exp()?;
    e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
}

/// Softmax over the last dimension, in x's dtype; fused on CPU f32 and bf16 and (with the
/// softmax kernel switched on) CUDA f32, and bf16 with the `bf16` kernels on too.
pub fn softmax_rows(x: &Tensor) -> Result<Tensor> {
    if !(is_host(x) || takes(x, Kernel::Softmax)) {
        return softmax_rows_unfused(x);
    }
    x.contiguous()?.apply_op1(SoftmaxOp)
}

/// Softmax of each row of `n` elements of `block`, in place (for [`SoftmaxOp`] and the attention
/// kernel). Each row's max is subtracted first and the exponentials then run over the whole block
/// in one loop: over one row of fewer elements than a vector holds (attention's rows of a dozen
/// keys) the loop ran lane by lane, and the exponentials were most of the attention forward
/// pass's softmax.
#[inline(always)]
pub(crate) fn softmax_rows_in_place(block: &mut [f32], n: usize) {
    for row in block.chunks_exact_mut(n) {
        let max = max_of(row);
        for x in row.iter_mut() {
            *x -= max;
        }
    }
    for x in block.iter_mut() {
        *x = exp_fast(*x);
    }
    for row in block.chunks_exact_mut(n) {
        let inv = 1.0 / sum(row);
        for x in row.iter_mut() {
            *x *= inv;
        }
    }
}

struct SoftmaxOp;

impl CustomOp1 for SoftmaxOp {
    fn name(&self) -> &'static str {
        "ember-softmax"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = cpu_values(s, l)?;
        let n = l.dims().last().copied().unwrap_or(1).max(1);
        let y = fill(x.len(), rows_per_task(n) * n, |r, y| {
            for (o, &v) in y.iter_mut().zip(&x[r]) {
                o.write(v);
            }
            // SAFETY: every element of `y` was written just above.
            softmax_rows_in_place(unsafe { &mut *(y as *mut [MaybeUninit<f32>] as *mut [f32]) }, n);
        });
        Ok((cpu_storage_like(y, s)?, l.shape().clone()))
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        Ok((cuda::forward(s, l)?, l.shape().clone()))
    }
    fn bwd(&self, _x: &Tensor, res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(softmax_backward(res, g)?))
    }
}

/// The gradient of softmax over the last dimension, dx = p·(g − Σ p·g) per row, from the
/// probabilities `p` and the output's gradient `g` (on either device; no autograd), in p's dtype.
pub(crate) fn softmax_backward(p: &Tensor, g: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    {
        if p.device().is_cuda() {
            return cuda::backward(p, g);
        }
    }
    let n = p.dims().last().copied().unwrap_or(1).max(1);
    let dx = with_data([p, g], |[p, g]| {
        Ok(fill(p.len(), rows_per_task(n) * n, |r, dx| {
            for ((pr, gr), dr) in p[r.clone()]
                .chunks_exact(n)
                .zip(g[r].chunks_exact(n))
                .zip(dx.chunks_exact_mut(n))
            {
                let s = dot(pr, gr);
                for i in 0..n {
                    dr[i].write(pr[i] * (gr[i] - s));
                }
            }
        }))
    })?;
    cpu_tensor_as(dx, p.shape(), p.dtype())
}

/// The launches of `cuda/softmax.cu`, and the warp-per-row geometry the attention kernels share.
#[cfg(feature = "cuda")]
pub(crate) mod cuda {
    use candle_core::backend::BackendStorage as _;
    use candle_core::cuda::cudarc::driver::LaunchConfig;
    use candle_core::{bail, CudaStorage, Layout, Result, Tensor};

    use crate::cuda::device::{
        alloc_of, kernel_name, launch, storage, tensor, view_of, with_cuda, with_element, Element, SOFTMAX,
    };

    /// Warps (rows at once) per block of the warp-per-row kernels.
    const WARPS: u32 = 8;
    /// At most this many blocks: the kernels stride over the rows, so a grid that fills the GPU
    /// many times over serves any row count.
    const MAX_BLOCKS: usize = 1 << 16;

    /// The geometry of a kernel with one warp per row over `rows` rows.
    pub(crate) fn warp_rows(rows: usize) -> LaunchConfig {
        let blocks = rows.div_ceil(WARPS as usize).clamp(1, MAX_BLOCKS) as u32;
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (WARPS * 32, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// (rows, row width) of a tensor seen as rows over its last dimension.
    fn rows_of(dims: &[usize], total: usize) -> Result<(usize, u32)> {
        let n = dims.last().copied().unwrap_or(1).max(1);
        let Ok(width) = u32::try_from(n) else {
            bail!("ember softmax: rows of {n} elements are too wide for the kernel");
        };
        Ok((total / n, width))
    }

    /// Softmax of f32 rows, or (`_bf16`) of bf16 ones.
    pub(super) fn forward(s: &CudaStorage, l: &Layout) -> Result<CudaStorage> {
        with_element!(s.dtype(), T => {
            let (x, total) = (view_of::<T>(s, l)?, l.shape().elem_count());
            let (rows, n) = rows_of(l.dims(), total)?;
            let mut y = alloc_of::<T>(&s.device, total)?;
            if rows > 0 {
                launch!(s.device, SOFTMAX, kernel_name("ember_softmax_fwd", &[T::NAME]), warp_rows(rows);
                    &x, &mut y, &(rows as u64), &n)?;
            }
            Ok(storage(y, &s.device))
        })
    }

    pub(super) fn backward(p: &Tensor, g: &Tensor) -> Result<Tensor> {
        if p.shape() != g.shape() {
            bail!(
                "ember softmax backward: probabilities {:?} and gradient {:?} differ in shape",
                p.shape(),
                g.shape()
            );
        }
        // The kernel takes one dtype, the probabilities' (the CPU widens each as it reads it).
        let g = &g.to_dtype(p.dtype())?;
        with_cuda([p, g], |[(sp, lp), (sg, lg)]| {
            with_element!(sp.dtype(), T => {
                let (pv, gv, total) = (view_of::<T>(sp, lp)?, view_of::<T>(sg, lg)?, lp.shape().elem_count());
                let (rows, n) = rows_of(lp.dims(), total)?;
                let mut dx = alloc_of::<T>(&sp.device, total)?;
                if rows > 0 {
                    launch!(sp.device, SOFTMAX, kernel_name("ember_softmax_bwd", &[T::NAME]), warp_rows(rows);
                        &pv, &gv, &mut dx, &(rows as u64), &n)?;
                }
                Ok(tensor(dx, &sp.device, lp.shape()))
            })
        })
    }
}

/// The device's softmax arithmetic (`cuda/softmax.cuh`, compiled for the host by
/// `cuda/softmax_mirror.cpp`) against this module's CPU kernel.
#[cfg(test)]
mod mirror {
    use candle_core::{Device, Tensor};

    extern "C" {
        fn ember_mirror_softmax_rows(x: *const f32, y: *mut f32, rows: u64, n: u32);
        fn ember_mirror_softmax_rows_bwd(p: *const f32, g: *const f32, dx: *mut f32, rows: u64, n: u32);
        fn ember_mirror_softmax_rows_bf16(x: *const u16, y: *mut u16, rows: u64, n: u32);
        fn ember_mirror_softmax_rows_bwd_bf16(p: *const u16, g: *const u16, dx: *mut u16, rows: u64, n: u32);
    }

    /// bf16's bits of each value (candle's rounding), and the values they stand for.
    fn bf16_bits(v: &[f32]) -> Vec<u16> {
        v.iter().map(|&x| half::bf16::from_f32(x).to_bits()).collect()
    }

    fn widened(v: &[u16]) -> Vec<f32> {
        v.iter().map(|&b| f32::from_bits((b as u32) << 16)).collect()
    }

    #[test]
    fn the_bf16_softmax_rows_are_the_f32_rows_between_casts_bit_for_bit() {
        for (rows, n) in [(3, 1), (4, 7), (5, 32), (3, 33), (2, 300)] {
            let mut x = bf16_bits(&random(rows * n, 7 + n as u64, 4.0));
            x[0] = half::bf16::from_f32(-1e9).to_bits();
            let (mut y16, mut y) = (vec![0u16; rows * n], vec![f32::NAN; rows * n]);
            unsafe {
                ember_mirror_softmax_rows_bf16(x.as_ptr(), y16.as_mut_ptr(), rows as u64, n as u32);
                ember_mirror_softmax_rows(widened(&x).as_ptr(), y.as_mut_ptr(), rows as u64, n as u32);
            }
            assert_eq!(y16, bf16_bits(&y), "forward ({rows}, {n})");

            let g = bf16_bits(&random(rows * n, 200 + n as u64, 1.0));
            let (mut d16, mut d) = (vec![0u16; rows * n], vec![f32::NAN; rows * n]);
            let (p, gw) = (widened(&y16), widened(&g));
            unsafe {
                ember_mirror_softmax_rows_bwd_bf16(
                    y16.as_ptr(),
                    g.as_ptr(),
                    d16.as_mut_ptr(),
                    rows as u64,
                    n as u32,
                );
                ember_mirror_softmax_rows_bwd(p.as_ptr(), gw.as_ptr(), d.as_mut_ptr(), rows as u64, n as u32);
            }
            assert_eq!(d16, bf16_bits(&d), "backward ({rows}, {n})");
        }
    }

    fn random(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut rng = ember_rng::SplitMix64::new(seed);
        (0..n).map(|_| rng.normal() as f32 * scale).collect()
    }

    /// max |a − b| / max |b|.
    fn rel(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-30);
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max) / scale
    }

    #[test]
    fn the_device_softmax_rows_are_the_cpu_kernels() {
        // Widths below, at and above a warp, with a masked-out column (−1e9) and large logits.
        for (rows, n) in [(3, 1), (4, 7), (5, 32), (3, 33), (2, 300)] {
            let mut x = random(rows * n, n as u64, 4.0);
            x[0] = -1e9;
            if x.len() > 2 {
                x[2] = 80.0;
            }
            let cpu = super::softmax_rows(&Tensor::from_slice(&x, (rows, n), &Device::Cpu).unwrap())
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            let mut y = vec![f32::NAN; rows * n];
            unsafe { ember_mirror_softmax_rows(x.as_ptr(), y.as_mut_ptr(), rows as u64, n as u32) };
            // The same exponentials; the sums in another order.
            assert!(rel(&y, &cpu) < 1e-6, "({rows}, {n}): {}", rel(&y, &cpu));

            let g = random(rows * n, 100 + n as u64, 1.0);
            let (pt, gt) = (
                Tensor::from_slice(&cpu, (rows, n), &Device::Cpu).unwrap(),
                Tensor::from_slice(&g, (rows, n), &Device::Cpu).unwrap(),
            );
            let cpu_dx = super::softmax_backward(&pt, &gt)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            let mut dx = vec![f32::NAN; rows * n];
            unsafe {
                ember_mirror_softmax_rows_bwd(
                    cpu.as_ptr(),
                    g.as_ptr(),
                    dx.as_mut_ptr(),
                    rows as u64,
                    n as u32,
                )
            };
            // g − Σ p·g cancels: the dot's order shows more in the difference.
            assert!(
                rel(&dx, &cpu_dx) < 1e-5,
                "backward ({rows}, {n}): {}",
                rel(&dx, &cpu_dx)
            );
        }
    }
}
