//! Summing CUDA gradients across ranks with NCCL (feature `nccl`): the buckets stay on the
//! device, and NCCL moves them over NVLink, PCIe or the network as it finds best.
//!
//! The communicator is built once per job: rank 0 draws NCCL's unique id, the ranks exchange it
//! over MPI (the job's launcher already connected them), and each joins with candle's own CUDA
//! stream, so the all-reduce is ordered after the backward kernels that wrote the gradients and
//! before the optimizer's, with no extra synchronisation. The all-reduce is a [`CustomOp1`]
//! without a backward (gradients are never differentiated again). Each all-reduce is followed by
//! a device synchronisation under the job's watchdog, so a peer that died or hangs ends the job
//! as with MPI instead of hanging in the stream.

use std::ffi::c_char;

use anyhow::{anyhow, bail, Context, Result};
use candle_core::cuda::cudarc::nccl::safe::{Comm, Id, ReduceOp};
use candle_core::cuda::{CudaStorage, CudaStorageSlice};
use candle_core::{CustomOp1, Device, Layout, Shape, Tensor};
use ember_distributed::World;

/// One NCCL communicator over all ranks of the job, on this rank's CUDA device.
pub struct NcclSum {
    comm: Comm,
}

impl NcclSum {
    /// Joins every rank of `world` on `device` (collective: all ranks call it together).
    pub fn new(world: &World, device: &Device) -> Result<Self> {
        let Device::Cuda(dev) = device else {
            bail!("NCCL sums CUDA tensors; this rank trains on {device:?}");
        };
        // Rank 0's id reaches every rank through MPI; the others' entries are ignored.
        let mine: Vec<u8> = if world.is_leader() {
            let id = Id::new().map_err(|e| anyhow!("creating the NCCL id: {e:?}"))?;
            id.internal().iter().map(|&c| c as u8).collect()
        } else {
            vec![0; 128]
        };
        let all = world.all_gather_bytes(&mine, "the NCCL id");
        let bytes: [u8; 128] = all[0]
            .as_slice()
            .try_into()
            .context("rank 0 sent an NCCL id that is not 128 bytes")?;
        let id = Id::uninit(bytes.map(|b| b as c_char));
        let comm = Comm::from_rank(dev.cuda_stream(), world.rank(), world.size(), id).map_err(|e| {
            anyhow!(
                "joining the NCCL communicator as rank {} of {}: {e:?} (is libnccl.so.2 on the library path, \
                 and does every rank have a GPU of its own?)",
                world.rank(),
                world.size()
            )
        })?;
        Ok(Self { comm })
    }

    /// The element-wise sum of `flat` (a 1-D f32 tensor on this rank's device) over all ranks,
    /// enqueued on candle's stream.
    pub fn sum(&self, flat: &Tensor) -> Result<Tensor> {
        Ok(flat.apply_op1_no_bwd(&AllReduce { comm: &self.comm })?)
    }
}

struct AllReduce<'a> {
    comm: &'a Comm,
}

impl CustomOp1 for AllReduce<'_> {
    fn name(&self) -> &'static str {
        "nccl-all-reduce"
    }

    fn cpu_fwd(
        &self,
        _: &candle_core::CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, Shape)> {
        candle_core::bail!("nccl-all-reduce runs on CUDA tensors only")
    }

    fn cuda_fwd(&self, storage: &CudaStorage, layout: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        let CudaStorageSlice::F32(slice) = &storage.slice else {
            candle_core::bail!("nccl-all-reduce sums f32 gradients only");
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("nccl-all-reduce needs a contiguous tensor");
        };
        let src = slice.slice(start..end);
        let dev = storage.device.clone();
        // SAFETY: every element is written by the all-reduce before anything reads it.
        let mut dst = unsafe { dev.alloc::<f32>(end - start) }?;
        self.comm
            .all_reduce(&src, &mut dst, &ReduceOp::Sum)
            .map_err(|e| candle_core::Error::Msg(format!("NCCL all-reduce: {e:?}")))?;
        Ok((CudaStorage::wrap_cuda_slice(dst, dev), layout.shape().clone()))
    }
}
