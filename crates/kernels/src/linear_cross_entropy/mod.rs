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
//! there (docs/performance.md, 2026-12-02). The sink's merge, after the backward pass, adds the
//! lookup's rows into it in place: dW is summed V × d as dlogitsᵀ·h, a product like every
//! projection's dW, and handed over as the buffer it was summed in. (Summed as dWᵀ = hᵀ·dlogits,
//! it took a transposed copy and candle's `index_add` another, two more vocabulary-wide
//! matrices at the end of each step; docs/performance.md, 2026-12-04.)
//!
//! The weight is packed once per call for the in-place GEMM kernel, as Wᵀ for the logits and as
//! W for dh, and every block reads it from there: matrixmultiply packed it again for each block
//! and each product (1.03–1.05× per multi30k-tiny step). dW, a reduction over the block's rows,
//! is dlogitsᵀ·h with dlogitsᵀ read column-major, as every projection's dW = gᵀ·x is: the
//! kernel that reads such an A in place in chunks of tokens where V × d is small, else the
//! packed GEMM with matrixmultiply's bits, whose own packer reads it a line at a time (under
//! matrixmultiply's, which packed the block a column at a time, rows 40 KB apart, this product
//! made a multi30k-tiny step 1.04× as long; now the step is 1.075× shorter than with dWᵀ and its
//! copies: docs/performance.md, 2026-12-04). With AVX-512, a B (the block's h) of more than 4 Mi
//! floats, which only a small vocabulary's block of over 10k rows reaches (V = 256 with d 384),
//! goes to matrixmultiply's own, slower, kernel (the same bits).
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
use crate::gemm::{sgemm_in, Mat, PackedIn};
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
    /// dh and dW (V × d) for an upstream gradient of 1 on every objective and 0 on every NLL.
    unit: Option<(Vec<f32>, Vec<f32>)>,
}

/// Where the block loop puts a gradient: the upstream gradient (2N; `None`: the unit gradient,
/// 1 on every objective and 0 on every NLL), dh (N × d), dW (V × d, made by the loop).
struct GradOut<'a> {
    g: Option<&'a [f32]>,
    dh: &'a mut [f32],
    dw: &'a mut Vec<f32>,
}

impl LinearCrossEntropyOp {
    /// For each block of rows of h (n × d): its logits against w (v × d); with `losses`, each
    /// row's (objective, NLL, max, lse) into it (and `stats` from them); with `grad`, the block's
    /// gradient under `grad.g` into dh and, summed over the blocks, into dW (zero for n = 0).
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
        // dW (V × d), summed block by block as dlogitsᵀ·h, the way every projection's dW is.
        if let Some(GradOut { dw, .. }) = grad.as_mut() {
            **dw = vec![0f32; v * d];
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
            if let Some(GradOut { g, dh, dw }) = grad.as_mut() {
                match (*g, losses.is_some()) {
                    (Some(g), _) => self.loss.gradient_in_place(block, g, v, start, stats),
                    (None, true) => {} // made with the losses above
                    (None, false) => unreachable!("the unit gradient is made with the losses"),
                }
                let block: &[f32] = block;
                // dh of the block's rows = dlogits · W; dW (+)= dlogitsᵀ · h_block.
                let dh_rows = &mut dh[start * d..(start + m) * d];
                let w_packed = w_packed.as_ref().expect("packed with the gradient");
                w_packed.product(m, Mat::rows(block, v), 0.0, dh_rows);
                let beta = if b == 0 { 0.0 } else { 1.0 };
                let (dlogits_t, h_block) = (Mat::rows(block, v).t(), Mat::rows(hb, d));
                sgemm_in(precision, v, m, d, dlogits_t, h_block, beta, dw);
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
            let (mut dh, mut dw) = (vec![0f32; n * d], Vec::new());
            let grad = GradOut {
                g: None,
                dh: &mut dh,
                dw: &mut dw,
            };
            self.run_blocks(h, w, (n, d, v), Some(&mut rows), &mut stats, Some(grad));
            Some((dh, dw))
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
        let (dh, dw) = with_data([h, w, g], |[h, w, g]| {
            if let Some(c) = uniform_objective_gradient(g, &self.loss.mask) {
                if let Some((mut dh, mut dw)) = self.take_unit_gradient() {
                    // `x·c + 0`, as candle's `affine(c, 0)` scales the composition's gradient.
                    scale_in_place(&mut dh, c);
                    scale_in_place(&mut dw, c);
                    return Ok((dh, dw));
                }
            }
            // Any other upstream gradient, or a second backward pass (whose bits are then
            // within rounding of the first's, not equal: the products are rerun on the scaled
            // gradient rather than scaled after): the blocks again, from the forward pass's
            // statistics.
            let Some(saved) = saved() else {
                bail!("linear_cross_entropy: backward without the forward pass's row statistics");
            };
            let (mut dh, mut dw) = (vec![0f32; n * d], Vec::new());
            let mut stats = saved.stats.clone();
            let grad = GradOut {
                g: Some(g),
                dh: &mut dh,
                dw: &mut dw,
            };
            self.run_blocks(h, w, (n, d, v), None, &mut stats, Some(grad));
            Ok((dh, dw))
        })?;
        let dh = cpu_tensor_as(dh, h.shape(), h.dtype())?;
        match &self.sink {
            // A buffer the sink's merge adds a tied embedding's rows into (module docs).
            Some((sink, id, w)) => {
                sink.deposit_owned(*id, w.clone(), dw);
                Ok((Some(dh), None))
            }
            None => Ok((Some(dh), Some(cpu_tensor(dw, w.shape())?))),
        }
    }
}

/// The op on CUDA tensors (module docs): the logits through cuBLAS, then `cuda/cross_entropy.cu`.
#[cfg(feature = "cuda")]
mod cuda;
