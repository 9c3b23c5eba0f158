//! The launches of `cuda/norm.cu`. The input x and the output may each be f32 or bf16 (the
//! op's `out`): the kernel named for the pair (`ember_norm_fwd_bf16_f32`…, plain for f32 and
//! f32); the output's gradient comes in the output's dtype and dx goes out in x's.

use candle_core::backend::BackendStorage as _;
use candle_core::cuda::cudarc::driver::LaunchConfig;
use candle_core::{bail, CudaStorage, Layout, Result, Tensor};

use super::{NormOp, NormType};
use crate::cuda::device::{
    alloc, alloc_of, elementwise, kernel_name, launch, storage, tensor, view, view_of, with_cuda,
    with_element, Element, NORM,
};

/// Threads per block of the per-vector kernels: 8 warps, one vector each.
const VECTOR_THREADS: u32 = 256;
/// At most this many blocks of those: a grid-stride loop takes the vectors beyond.
const MAX_VECTOR_BLOCKS: usize = 1 << 20;
/// Vectors per chunk of the parameter gradients' first pass (at least; more when there would
/// be over MAX_CHUNKS chunks). A function of the shapes alone, so the sums' order is too.
const PER_CHUNK: usize = 64;
const MAX_CHUNKS: usize = 1 << 16;

/// The geometry of a kernel taking one warp per vector.
fn per_vector(vectors: usize) -> LaunchConfig {
    let warps = (VECTOR_THREADS / 32) as usize;
    LaunchConfig {
        grid_dim: (vectors.div_ceil(warps).clamp(1, MAX_VECTOR_BLOCKS) as u32, 1, 1),
        block_dim: (VECTOR_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// (vectors, d) of an input of `n` elements and a gain of `d`, or the CPU kernel's error.
fn vectors(n: usize, d: usize) -> Result<(usize, u32)> {
    if d == 0 || !n.is_multiple_of(d) {
        bail!("norm: input size {n} is not a multiple of the gain size {d}");
    }
    let Ok(d32) = u32::try_from(d) else {
        bail!("norm: a gain of {d} elements is too large for the CUDA kernel");
    };
    Ok((n / d, d32))
}

fn flags(op: NormOp) -> (i32, f32) {
    ((op.kind == NormType::Layer) as i32, op.eps as f32)
}

pub(super) fn forward(
    op: NormOp,
    (xs, xl): (&CudaStorage, &Layout),
    (ws, wl): (&CudaStorage, &Layout),
    b: Option<(&CudaStorage, &Layout)>,
) -> Result<CudaStorage> {
    let (n, d) = (xl.shape().elem_count(), wl.shape().elem_count());
    let (count, d32) = vectors(n, d)?;
    let w = view(ws, wl)?;
    // Without a bias the kernel reads no `b`; the gain stands in for the pointer.
    let (b, has_bias) = match b {
        Some((bs, bl)) => {
            if bl.shape().elem_count() != d {
                bail!(
                    "norm: a bias of {} elements for a gain of {d}",
                    bl.shape().elem_count()
                );
            }
            (view(bs, bl)?, 1i32)
        }
        None => (view(ws, wl)?, 0i32),
    };
    let (layer, eps) = flags(op);
    let dev = &xs.device;
    with_element!(xs.dtype(), X => with_element!(op.out, Y => {
        let x = view_of::<X>(xs, xl)?;
        let mut y = alloc_of::<Y>(dev, n)?;
        if count > 0 {
            launch!(dev, NORM, kernel_name("ember_norm_fwd", &[X::NAME, Y::NAME]), per_vector(count);
                &x, &w, &b, &mut y, &(count as u64), &d32, &layer, &has_bias, &eps)?;
        }
        Ok(storage(y, dev))
    }))
}

/// (dx, dw, db) from x, w and the output gradient g (in the op's output dtype).
pub(super) fn backward(op: NormOp, x: &Tensor, w: &Tensor, g: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
    if g.dtype() != op.out {
        bail!("norm: a {:?} gradient for a {:?} output", g.dtype(), op.out);
    }
    with_element!(x.dtype(), X => with_element!(op.out, Y => backward_as::<X, Y>(op, x, w, g)))
}

fn backward_as<X: Element, Y: Element>(
    op: NormOp,
    x: &Tensor,
    w: &Tensor,
    g: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let types = [X::NAME, Y::NAME];
    with_cuda([x, w, g], |[(xs, xl), (ws, wl), (gs, gl)]| {
        let (n, d) = (xl.shape().elem_count(), wl.shape().elem_count());
        let (count, d32) = vectors(n, d)?;
        if gl.shape().elem_count() != n {
            bail!(
                "norm: a gradient of {:?} for an input of {:?}",
                gl.shape(),
                xl.shape()
            );
        }
        let (xv, wv, gv) = (view_of::<X>(xs, xl)?, view(ws, wl)?, view_of::<Y>(gs, gl)?);
        let (layer, eps) = flags(op);
        let dev = &xs.device;
        let mut dx = alloc_of::<X>(dev, n)?;
        let mut stats = alloc(dev, 2 * count)?;
        if count > 0 {
            launch!(dev, NORM, kernel_name("ember_norm_bwd_dx", &types), per_vector(count);
                &xv, &wv, &gv, &mut dx, &mut stats, &(count as u64), &d32, &layer, &eps)?;
        }
        let per_chunk = PER_CHUNK.max(count.div_ceil(MAX_CHUNKS));
        let chunks = count.div_ceil(per_chunk).max(1);
        let threads = d.next_multiple_of(32).min(256);
        let column_blocks = d.div_ceil(threads);
        if column_blocks > 65_535 {
            bail!("norm: a gain of {d} elements is too large for the CUDA kernel");
        }
        let (mut pw, mut pb) = (alloc(dev, chunks * d)?, alloc(dev, chunks * d)?);
        let cfg = LaunchConfig {
            grid_dim: (chunks as u32, column_blocks as u32, 1),
            block_dim: (threads as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(dev, NORM, kernel_name("ember_norm_bwd_partials", &types), cfg;
            &xv, &gv, &stats, &mut pw, &mut pb, &(count as u64), &d32, &(per_chunk as u64))?;
        let (mut dw, mut db) = (alloc(dev, d)?, alloc(dev, d)?);
        launch!(dev, NORM, "ember_norm_bwd_reduce", elementwise(d);
            &pw, &pb, &mut dw, &mut db, &(chunks as u64), &d32)?;
        Ok((
            tensor(dx, dev, xl.shape()),
            tensor(dw, dev, wl.shape()),
            tensor(db, dev, wl.shape()),
        ))
    })
}
