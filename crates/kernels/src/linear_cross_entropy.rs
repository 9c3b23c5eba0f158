//! The output projection and the loss in one op: the logits `h·Wᵀ` are made a block of rows at a
//! time, turned into losses (and, in training, gradients) while the block is in cache, and never
//! stored whole.
//!
//! Why: with multi30k-tiny's 10k vocabulary and ~3,600 target tokens a step, the logits are a
//! 144 MB tensor that the projection writes and the loss reads; in the backward pass the loss
//! writes a gradient as large, candle's autograd zero-fills another and adds the two into a third
//! before the projection's backward reads it twice. That traffic, not the products, was most of
//! what a step spends outside its GEMMs. Here the memory a step touches for the loss is one
//! block of logits, dh (N × d) and dW (V × d).
//!
//! Gradients are computed in the forward pass, in training (`grads: true`), for the upstream
//! gradient the trainer's loss sends back: the same constant c on every token's objective (the
//! objective summed, divided by the batch's tokens) and none on the NLL row (reported, detached).
//! The forward pass keeps dh and dW for c = 1 and the backward pass scales them by c. Any other
//! upstream gradient — per-token weights, a gradient through the NLL row, or a forward pass
//! without `grads` — is handled exactly by recomputing the logits block by block in the backward
//! pass: the op's gradient is always the unfused composition's, only the cost differs.
//!
//! With a [`GradSink`] ([`linear_cross_entropy_to_sink`], the trainer's), W's gradient leaves
//! through the sink instead of candle's graph, as the fused blocks' parameters' do. candle
//! would zero-fill a V × d gradient for W, add this one into it and, where the embedding is
//! tied, add the lookup's later: three vocabulary-wide matrices at once at the start of the
//! backward pass, when every activation is still held. Fine-tuning SmolLM2-135M's shape peaked
//! there (docs/performance.md, 2026-12-02). The sink's merge, after the backward pass, adds it to
//! the lookup's. dW is summed as dWᵀ (below) and handed over as its transpose, a view: the copy
//! that lays it out V × d is made at that merge too, not in the forward pass beside the others.
//!
//! The weight is packed once per call for the in-place GEMM kernel, as Wᵀ for the logits and as
//! W for dh, and every block reads it from there: matrixmultiply packed it again for each block
//! and each product (1.03–1.05× per multi30k-tiny step). dW, a reduction over the block's rows,
//! stays with matrixmultiply, summed as dWᵀ = hᵀ·dlogits and transposed once (see above for
//! when): as dlogitsᵀ·h, matrixmultiply packed the block a column at a time, rows 40 KB apart
//! (1.04× per step).
//!
//! In bf16 ([`linear_cross_entropy_in`]) the three products take bf16 operands with f32 sums
//! (the weight packed once per call as pairs, dlogits rounded as the products read them); the
//! logits themselves, the loss's row math and every gradient stay f32 (dh in h's dtype).
//!
//! h may be a bf16 activation, with the products in either precision: it is read widened and
//! dh is rounded once, so the op is the f32 op between casts (W, the losses and dW stay f32).
//!
//! Blocks have a fixed number of rows for a given vocabulary size, and every product and row
//! op inside a block splits its work as the other kernels do ([`crate::par`]): the bits do not
//! depend on the thread count. They do differ from the unfused composition's in the last place
//! (dW is summed block by block).
//!
//! **On CUDA** (f32 W; h f32, or bf16 with the `bf16` kernels on too; with
//! [`Kernel::CrossEntropy`](crate::cuda::Kernel) switched on) the logits
//! are one cuBLAS product (candle's own), made whole — the GPU has the memory, and a product per
//! block would run far below its speed — and one kernel (`cuda/cross_entropy.cu`, a block per
//! row) turns them into the losses and each row's (max, lse). The targets and mask stay on the
//! device: nothing is read back, so a target outside the vocabulary is not refused up front as
//! on the CPU but makes its row's losses NaN. With `grads` the kernel then overwrites the logits
//! with the probabilities exp(x − max − lse), which the backward pass turns in place into the
//! gradient of the logits for whatever upstream gradient arrives, objective and NLL rows alike
//! (it cannot look at that gradient without a round trip to the host, as the CPU op does to use
//! dh and dW prepared for the trainer's); dh = dlogits·W and dW = dlogitsᵀ·h are two more cuBLAS
//! products. The probabilities serve one backward pass; another one, or one after a forward pass
//! without `grads`, recomputes the logits (the same cuBLAS product, so the same bits). In bf16
//! the three products are cuBLAS's bf16 GEMMs with f32 compute on operands cast to bf16, their
//! outputs rounded to bf16 ([`Precision::matmul`]'s, as under PyTorch's autocast); the logits
//! are widened to f32 for the kernel, and the loss, the probabilities and the gradient of the
//! logits stay f32. With the `bf16` kernels switched on too, the logits stay bf16 (half the
//! n × V buffer, no widening pass): the `_bf16` kernels read them, the forward pass keeps them
//! instead of probabilities, and the backward pass computes each probability from its logit in
//! f32 and rounds the gradient once, as the products read it — the same bits as the widened
//! path (but for a NaN's payload: candle's CUDA cast makes every NaN its canonical one, the
//! kernel keeps the sign and payload as the CPU's cast does). A bf16 h (with them on) is read as
//! in f32 and dh leaves in bf16.

use std::sync::{Arc, Mutex};

use candle_core::{bail, CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

use crate::block::GradSink;
use crate::cross_entropy::{cross_entropy_unfused, loss_output, LossRows};
use crate::gemm::{sgemm_in, transposed, Mat, PackedIn};
use crate::host::{cpu_slice, cpu_tensor, cpu_tensor_as, cpu_values, is_host, is_host_f32, with_data};
use crate::linear::linear_unfused_in;
use crate::simd::scale_in_place;
use crate::Precision;

/// Logits a block holds: 4 Mi floats (16 MiB), so that a block of a 10k vocabulary has ~400 rows
/// (enough for the products to run at full speed) and a small vocabulary takes every row at once.
const BLOCK_FLOATS: usize = 1 << 22;

/// Rows per block for a vocabulary of `v`: a multiple of 8 (the GEMM's row tile), at least 8.
fn block_rows(v: usize) -> usize {
    ((BLOCK_FLOATS / v.max(1)) / 8 * 8).max(8)
}

/// The unfused composition [`linear_cross_entropy`] equals: `crate::cross_entropy`'s
/// (2, N) per-token losses of the logits `h·Wᵀ`, h (…, d) folded into N rows.
pub fn linear_cross_entropy_unfused(
    h: &Tensor,
    w: &Tensor,
    targets: &Tensor,
    mask: &Tensor,
    label_smoothing: f64,
    z_loss: f64,
) -> Result<Tensor> {
    linear_cross_entropy_unfused_in(h, w, targets, mask, (label_smoothing, z_loss), Precision::F32)
}

/// [`linear_cross_entropy_unfused`] with its product in `precision` ([`Precision::matmul`]).
fn linear_cross_entropy_unfused_in(
    h: &Tensor,
    w: &Tensor,
    targets: &Tensor,
    mask: &Tensor,
    (label_smoothing, z_loss): (f64, f64),
    precision: Precision,
) -> Result<Tensor> {
    let (_, d) = w.dims2()?;
    let logits = linear_unfused_in(&h.reshape(((), d))?, w, precision)?;
    cross_entropy_unfused(&logits, targets, mask, label_smoothing, z_loss)
}

/// Per-token losses (2, N) — row 0 the training objective, row 1 the NLL, both masked, as
/// `crate::cross_entropy` gives them — of the logits `h·Wᵀ` for hidden states h (…, d) folded
/// into N rows and an output weight W (V, d). `grads`: the caller will call backward with the
/// trainer's upstream gradient (see the module docs); without it the forward pass computes the
/// losses only. On CUDA tensors with the cross-entropy kernel switched on (W f32; h f32, or bf16
/// with the `bf16` kernels on too) this is the CUDA op (module docs); on the CPU, for an f32 W
/// and an f32 or bf16 h, the fused CPU op; on anything else [`linear_cross_entropy_unfused`].
pub fn linear_cross_entropy(
    h: &Tensor,
    w: &Tensor,
    targets: &Tensor,
    mask: &Tensor,
    label_smoothing: f64,
    z_loss: f64,
    grads: bool,
) -> Result<Tensor> {
    linear_cross_entropy_in(
        h,
        w,
        targets,
        mask,
        label_smoothing,
        z_loss,
        grads,
        Precision::F32,
    )
}

/// [`linear_cross_entropy`] with its products in `precision` (the unfused fallback on the
/// rounded operands).
#[allow(clippy::too_many_arguments)]
pub fn linear_cross_entropy_in(
    h: &Tensor,
    w: &Tensor,
    targets: &Tensor,
    mask: &Tensor,
    label_smoothing: f64,
    z_loss: f64,
    grads: bool,
    precision: Precision,
) -> Result<Tensor> {
    let backward = if grads { Backward::Graph } else { Backward::None };
    fused_or_not(
        h,
        w,
        targets,
        mask,
        (label_smoothing, z_loss),
        backward,
        precision,
    )
}

/// [`linear_cross_entropy_in`] for a training pass (`grads`) whose caller merges `sink` after
/// the backward pass (as the trainer does for the fused blocks): on the CPU, W's gradient goes
/// to the sink instead of candle's graph (module docs), where W is a variable. Elsewhere (CUDA,
/// the unfused composition, a W made by another op) the gradient takes the graph as without a
/// sink.
#[allow(clippy::too_many_arguments)]
pub fn linear_cross_entropy_to_sink(
    h: &Tensor,
    w: &Tensor,
    targets: &Tensor,
    mask: &Tensor,
    label_smoothing: f64,
    z_loss: f64,
    precision: Precision,
    sink: &GradSink,
) -> Result<Tensor> {
    let backward = match w.is_variable() {
        true => Backward::Sink(sink),
        false => Backward::Graph,
    };
    fused_or_not(
        h,
        w,
        targets,
        mask,
        (label_smoothing, z_loss),
        backward,
        precision,
    )
}

/// Whether a backward pass follows the forward pass, and where W's gradient goes.
#[derive(Clone, Copy)]
enum Backward<'a> {
    None,
    Graph,
    Sink(&'a GradSink),
}

/// The CUDA op, the CPU op or the composition, whichever takes the operands.
fn fused_or_not(
    h: &Tensor,
    w: &Tensor,
    targets: &Tensor,
    mask: &Tensor,
    (label_smoothing, z_loss): (f64, f64),
    backward: Backward,
    precision: Precision,
) -> Result<Tensor> {
    let grads = !matches!(backward, Backward::None);
    let (v, d) = w.dims2()?;
    if h.dims().last() != Some(&d) {
        bail!(
            "linear_cross_entropy: hidden states {:?} do not fit an output weight {:?}",
            h.shape(),
            w.shape()
        );
    }
    let n = h.elem_count() / d.max(1);
    // Empty products (no rows, vocabulary or width) stay with the composition.
    #[cfg(feature = "cuda")]
    if crate::cuda::takes(h, crate::cuda::Kernel::CrossEntropy)
        && crate::cuda::takes_param(w, crate::cuda::Kernel::CrossEntropy)
        && n > 0
        && v > 0
        && d > 0
    {
        let terms = (label_smoothing, z_loss);
        return cuda::linear_cross_entropy(h, w, targets, mask, terms, grads, precision);
    }
    if !(is_host(h) && is_host_f32(w)) {
        let terms = (label_smoothing, z_loss);
        return linear_cross_entropy_unfused_in(h, w, targets, mask, terms, precision);
    }
    precision.check_cpu()?;
    let loss = LossRows::new(n, v, targets, mask, label_smoothing, z_loss)?;
    let (h, w_in) = (h.reshape((n, d))?.contiguous()?, w.contiguous()?);
    // Registered last, once nothing before the op can fail and leave the sink owed.
    let sink = match backward {
        Backward::Sink(sink) => Some((
            sink.clone(),
            sink.register("the fused output projection and loss"),
            w.clone(),
        )),
        _ => None,
    };
    let op = LinearCrossEntropyOp {
        loss,
        grads,
        precision,
        saved: Mutex::new(None),
        sink,
    };
    h.apply_op2(&w_in, op)
}

struct LinearCrossEntropyOp {
    loss: LossRows,
    grads: bool,
    precision: Precision,
    saved: Mutex<Option<Arc<Saved>>>,
    /// Where W's gradient goes instead of the graph: the sink, this op's id in it, and W (the
    /// variable, as the caller's gradient store knows it).
    sink: Option<(GradSink, u64, Tensor)>,
}

/// What the forward pass leaves for the backward pass.
struct Saved {
    /// (max, lse) of every row of the logits.
    stats: Vec<(f32, f32)>,
    /// dh and dWᵀ (d × V) for an upstream gradient of 1 on every objective and 0 on every NLL.
    unit: Option<(Vec<f32>, Vec<f32>)>,
}

/// Where the block loop puts a gradient: the upstream gradient (2N; `None`: the unit gradient,
/// 1 on every objective and 0 on every NLL), dh (N × d), dWᵀ (d × V, made by the loop).
struct GradOut<'a> {
    g: Option<&'a [f32]>,
    dh: &'a mut [f32],
    dwt: &'a mut Vec<f32>,
}

impl LinearCrossEntropyOp {
    /// For each block of rows of h (n × d): its logits against w (v × d); with `losses`, each
    /// row's (objective, NLL, max, lse) into it (and `stats` from them); with `grad`, the block's
    /// gradient under `grad.g` into dh and, summed over the blocks, into dWᵀ (zero for n = 0).
    /// The unit gradient is made with the losses, row by row, so it needs `losses`; any other
    /// needs the `stats` of an earlier pass.
    fn run_blocks(
        &self,
        h: &[f32],
        w: &[f32],
        (n, d, v): (usize, usize, usize),
        mut losses: Option<&mut [(f32, f32, f32, f32)]>,
        stats: &mut [(f32, f32)],
        mut grad: Option<GradOut<'_>>,
    ) {
        let rows = block_rows(v);
        // The block of logits is this thread's, kept from call to call: a fresh 16 MiB vector
        // each call was a zero-fill and 4,096 page faults. Every block's product (β = 0) writes
        // all of its elements before anything reads them.
        let mut logits = LOGITS.with(|l| std::mem::take(&mut *l.borrow_mut()));
        if logits.len() < rows.min(n) * v {
            logits = vec![0f32; rows.min(n) * v];
        }
        // Wᵀ (for the logits) and, with a gradient, W (for dh) packed once for every block.
        let precision = self.precision;
        let wt_packed = PackedIn::new(precision, d, v, Mat::rows(w, d).t());
        let w_packed = grad
            .as_ref()
            .map(|_| PackedIn::new(precision, v, d, Mat::rows(w, d)));
        // dWᵀ (d × V), summed block by block as hᵀ·dlogits: matrixmultiply then packs the block
        // in its own row order (dlogitsᵀ·h read it a column at a time, 40 KB apart).
        if let Some(GradOut { dwt, .. }) = grad.as_mut() {
            **dwt = vec![0f32; d * v];
        }
        for (b, start) in (0..n).step_by(rows).enumerate() {
            let m = rows.min(n - start);
            let block = &mut logits[..m * v];
            let hb = &h[start * d..(start + m) * d];
            wt_packed.product(m, Mat::rows(hb, d), 0.0, block);
            if let Some(losses) = losses.as_deref_mut() {
                let out = &mut losses[start..start + m];
                if matches!(grad, Some(GradOut { g: None, .. })) {
                    self.loss.forward_and_unit_gradient_in_place(block, v, start, out);
                } else {
                    self.loss.forward(block, v, start, out);
                }
                for (s, &(_, _, max, lse)) in stats[start..start + m].iter_mut().zip(out.iter()) {
                    *s = (max, lse);
                }
            }
            if let Some(GradOut { g, dh, dwt }) = grad.as_mut() {
                match (*g, losses.is_some()) {
                    (Some(g), _) => self.loss.gradient_in_place(block, g, v, start, stats),
                    (None, true) => {} // made with the losses above
                    (None, false) => unreachable!("the unit gradient is made with the losses"),
                }
                let block: &[f32] = block;
                // dh of the block's rows = dlogits · W; dWᵀ (+)= h_blockᵀ · dlogits.
                let dh_rows = &mut dh[start * d..(start + m) * d];
                let w_packed = w_packed.as_ref().expect("packed with the gradient");
                w_packed.product(m, Mat::rows(block, v), 0.0, dh_rows);
                let beta = if b == 0 { 0.0 } else { 1.0 };
                let (h_t, dlogits) = (Mat::rows(hb, d).t(), Mat::rows(block, v));
                sgemm_in(precision, d, m, v, h_t, dlogits, beta, dwt);
            }
        }
        LOGITS.with(|l| *l.borrow_mut() = logits);
    }
}

thread_local! {
    /// [`LinearCrossEntropyOp::run_blocks`]' block of logits, between calls on this thread.
    static LOGITS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The common value of the objective's upstream gradient over the rows that count (mask ≠ 0),
/// when the NLL row gets none: the case the forward pass prepared for.
fn uniform_objective_gradient(g: &[f32], mask: &[f32]) -> Option<f32> {
    let n = mask.len();
    if g[n..].iter().any(|&x| x != 0.0) {
        return None;
    }
    let mut counted = g[..n]
        .iter()
        .zip(mask)
        .filter(|&(_, &m)| m != 0.0)
        .map(|(&x, _)| x);
    let first = counted.next().unwrap_or(0.0);
    counted.all(|x| x == first).then_some(first)
}

impl LinearCrossEntropyOp {
    /// The unit gradient the forward pass made, handed over when nothing else holds the saved
    /// state: scaled in place it is the gradient, where a copy would keep a second dW (the
    /// vocabulary × d matrix, 108 MiB for SmolLM2) alive for the rest of the backward pass.
    /// The statistics stay, so a second backward pass recomputes from them.
    fn take_unit_gradient(&self) -> Option<(Vec<f32>, Vec<f32>)> {
        let mut saved = self.saved.lock().unwrap_or_else(|e| e.into_inner());
        Arc::get_mut(saved.as_mut()?)?.unit.take()
    }
}

impl CustomOp2 for LinearCrossEntropyOp {
    fn name(&self) -> &'static str {
        "ember-linear-cross-entropy"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (n, d) = l1.shape().dims2()?;
        let (v, _) = l2.shape().dims2()?;
        // h may be a bf16 activation, read widened (exact); dh then leaves rounded once.
        let (h, w) = (cpu_values(s1, l1)?, cpu_slice(s2, l2)?);
        let h: &[f32] = &h;
        let mut rows = vec![(0f32, 0f32, 0f32, 0f32); n];
        let mut stats = vec![(0f32, 0f32); n];
        let unit = if self.grads {
            let (mut dh, mut dwt) = (vec![0f32; n * d], Vec::new());
            let grad = GradOut {
                g: None,
                dh: &mut dh,
                dwt: &mut dwt,
            };
            self.run_blocks(h, w, (n, d, v), Some(&mut rows), &mut stats, Some(grad));
            Some((dh, dwt))
        } else {
            self.run_blocks(h, w, (n, d, v), Some(&mut rows), &mut stats, None);
            None
        };
        *self.saved.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(Saved { stats, unit }));
        Ok((CpuStorage::F32(loss_output(&rows)), Shape::from((2, n))))
    }

    fn bwd(
        &self,
        h: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (n, d) = h.dims2()?;
        let (v, _) = w.dims2()?;
        let saved = || self.saved.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if saved().is_none_or(|s| s.stats.len() != n) {
            bail!("linear_cross_entropy: backward without the forward pass's row statistics");
        }
        let (dh, dwt) = with_data([h, w, g], |[h, w, g]| {
            if let Some(c) = uniform_objective_gradient(g, &self.loss.mask) {
                if let Some((mut dh, mut dwt)) = self.take_unit_gradient() {
                    // `x·c + 0`, as candle's `affine(c, 0)` scales the composition's gradient.
                    scale_in_place(&mut dh, c);
                    scale_in_place(&mut dwt, c);
                    return Ok((dh, dwt));
                }
            }
            // Any other upstream gradient, or a second backward pass (whose bits are then
            // within rounding of the first's, not equal: the products are rerun on the scaled
            // gradient rather than scaled after): the blocks again, from the forward pass's
            // statistics.
            let Some(saved) = saved() else {
                bail!("linear_cross_entropy: backward without the forward pass's row statistics");
            };
            let (mut dh, mut dwt) = (vec![0f32; n * d], Vec::new());
            let mut stats = saved.stats.clone();
            let grad = GradOut {
                g: Some(g),
                dh: &mut dh,
                dwt: &mut dwt,
            };
            self.run_blocks(h, w, (n, d, v), None, &mut stats, Some(grad));
            Ok((dh, dwt))
        })?;
        let dh = cpu_tensor_as(dh, h.shape(), h.dtype())?;
        match &self.sink {
            // The transpose as a view; the sink's merge lays it out (module docs).
            Some((sink, id, w)) => {
                let dw = cpu_tensor(dwt, &(d, v).into())?.t()?;
                sink.deposit(*id, [(w.clone(), dw)]);
                Ok((Some(dh), None))
            }
            None => Ok((Some(dh), Some(cpu_tensor(transposed(d, v, &dwt), w.shape())?))),
        }
    }
}

/// The op on CUDA tensors (module docs): the logits through cuBLAS, then `cuda/cross_entropy.cu`.
#[cfg(feature = "cuda")]
mod cuda {
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

        fn cpu_fwd(
            &self,
            _: &CpuStorage,
            _: &Layout,
            _: &CpuStorage,
            _: &Layout,
        ) -> Result<(CpuStorage, Shape)> {
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
}
