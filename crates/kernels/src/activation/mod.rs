//! Activations of the feed-forward block: GELU (erf form) and SwiGLU.
//!
//! On CUDA (the `activation` kernel switched on, `cuda/activation.cu`) each op and its backward
//! is one elementwise pass with the same formulas, CUDA's erff/expf in place of the CPU's
//! polynomial erf and exp. On bf16 activations (with the `bf16` kernels switched on too) the
//! kernels' `_bf16` variants read them widened, compute in f32 and round each output once.

use std::borrow::Cow;
use std::mem::MaybeUninit;
use std::sync::Mutex;

use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Layout, Result, Shape, Tensor};

use crate::cuda::{takes, Kernel};
use crate::gemm::{to_bf16, Activation, Element};
use crate::held::{Held, PendingBits, Store};
use crate::host::{cpu_storage_as, cpu_storage_like, cpu_tensor_as, cpu_values, is_host, with_data};
use crate::par::{fill, fill2, ELEMENTS_PER_TASK};
use crate::simd::{erf_and_gauss, exp_fast, mul, simd_dispatch};
use crate::Precision;

/// GELU, erf form; fused backward on CPU f32 and bf16 (candle's backward is eleven elementwise
/// passes).
/// Forward and gradient follow candle's formulas with a vectorisable erf (|error| < 1.5·10⁻⁷),
/// so they agree with `Tensor::gelu_erf` to float rounding.
///
/// When a gradient will be needed, the forward pass also stores GELU's derivative at each
/// element: erf is the expensive part of both passes and the forward has it in hand, so the
/// backward becomes one multiplication per element (for one more activation-sized buffer).
/// On CUDA (with the activation kernel switched on) the backward recomputes it instead. x may
/// also be a bf16 activation, on the CPU and (with the `bf16` kernels on too) on CUDA: computed
/// in f32 on its widened values, the output and the gradient rounded once.
pub fn gelu_erf(x: &Tensor) -> Result<Tensor> {
    gelu_erf_in(x, Precision::F32)
}

/// [`gelu_erf`] keeping its derivative as `precision` keeps it on the CPU (under bf16 rounded to
/// bf16, as the fused feed-forward op keeps it).
pub fn gelu_erf_in(x: &Tensor, precision: Precision) -> Result<Tensor> {
    let host = is_host(x);
    if !(host || takes(x, Kernel::Activation)) {
        return x.gelu_erf();
    }
    let op = GeluOp(GeluSlope::new(host && x.track_op(), precision));
    x.contiguous()?.apply_op1(op)
}

struct GeluOp(GeluSlope);

/// GELU's derivative at each element of one forward pass, kept (when a gradient will be
/// needed) for the backward pass of the same graph, in the products' precision.
///
/// Under bf16 products the derivative is kept rounded to bf16 ([`Held`]), and one recomputed
/// for the backward pass is rounded the same way, so keeping and recomputing give the same
/// bits. GELU itself is computed from its f32 input in either precision.
pub(crate) struct GeluSlope {
    slot: Option<Mutex<Option<Held<'static>>>>,
    precision: Precision,
}

impl GeluSlope {
    pub(crate) fn new(keep: bool, precision: Precision) -> Self {
        Self {
            slot: keep.then(|| Mutex::new(None)),
            precision,
        }
    }

    /// GELU of every element of `x`, keeping the derivative when asked to.
    pub(crate) fn forward(&self, x: &[f32]) -> Vec<f32> {
        if self.slot.is_none() {
            return fill(x.len(), ELEMENTS_PER_TASK, |r, y| gelu_fwd(&x[r], y));
        }
        let slope = match self.precision {
            Precision::F32 => {
                let (y, d) = fill2(x.len(), ELEMENTS_PER_TASK, |r, y, d| gelu_fwd_keep(&x[r], y, d));
                self.hold_slope(Held::F32(d.into()));
                return y;
            }
            Precision::Bf16 => PendingBits::new(x.len()),
        };
        let y = fill(x.len(), ELEMENTS_PER_TASK, |r, y| {
            // SAFETY: the elements `r` of the slope are this task's alone.
            gelu_fwd_keep_bf16(&x[r.clone()], y, unsafe { slope.piece(r) })
        });
        // SAFETY: `fill`'s pieces cover every element.
        self.hold_slope(unsafe { slope.finish() });
        y
    }

    /// GELU of every element of `x` (rows × cols) as an activation for products in the
    /// precision: in bf16 its output and derivative are rounded as they are made, a block of
    /// rows at a time, so neither goes to memory in f32 ([`Activation::rounded_with`]); the same
    /// values as [`Self::forward`]'s.
    pub(crate) fn forward_kept(&self, x: &[f32], (rows, cols): (usize, usize)) -> Activation {
        if self.precision == Precision::F32 {
            return Activation::F32(self.forward(x));
        }
        assert_eq!(
            x.len(),
            rows * cols,
            "GELU: {} elements are not {rows}×{cols}",
            x.len()
        );
        let elements = |r: std::ops::Range<usize>| r.start * cols..r.end * cols;
        if self.slot.is_none() {
            return Activation::rounded_with(rows, cols, |r, out| gelu_fwd(&x[elements(r)], out));
        }
        let slope = PendingBits::new(x.len());
        let y = Activation::rounded_with(rows, cols, |r, out| {
            let e = elements(r);
            // SAFETY: the rows `r` of the slope are this block's alone.
            gelu_fwd_keep_bf16(&x[e.clone()], out, unsafe { slope.piece(e) })
        });
        // SAFETY: the blocks cover every row.
        self.hold_slope(unsafe { slope.finish() });
        y
    }

    /// [`Self::forward_kept`] in bf16 of a rows × cols input made a block of rows at a time
    /// by `make(rows, out)` (`out`: the block's values to write, row-major), GELU taken of each
    /// block while it is in cache: the input never goes to memory whole, as the product
    /// feeding GELU would send it ([`crate::gemm::RowsOfProduct`]). The same values as
    /// [`Self::forward_kept`]'s of the whole input.
    pub(crate) fn forward_kept_made(
        &self,
        (rows, cols): (usize, usize),
        make: impl Fn(std::ops::Range<usize>, &mut [f32]) + Sync + Send,
    ) -> Activation {
        assert_eq!(
            self.precision,
            Precision::Bf16,
            "GELU: blocks of its input are bf16's"
        );
        let slope = self.slot.is_some().then(|| PendingBits::new(rows * cols));
        let y = Activation::rounded_with(rows, cols, |r, out| {
            let e = r.start * cols..r.end * cols;
            // Taken out, not borrowed, while `make` runs (it could run parallel tasks, and this
            // thread another block meanwhile).
            let mut input = MADE.with(|m| std::mem::take(&mut *m.borrow_mut()));
            input.resize(input.len().max(e.len()), 0.0);
            make(r, &mut input[..e.len()]);
            match &slope {
                // SAFETY: the rows `r` of the slope are this block's alone.
                Some(slope) => gelu_fwd_keep_bf16(&input[..e.len()], out, unsafe { slope.piece(e) }),
                None => gelu_fwd(&input[..e.len()], out),
            }
            MADE.with(|m| *m.borrow_mut() = input);
        });
        if let Some(slope) = slope {
            // SAFETY: the blocks cover every row.
            self.hold_slope(unsafe { slope.finish() });
        }
        y
    }

    /// Keeps the derivative for the backward pass.
    fn hold_slope(&self, slope: Held<'static>) {
        if let Some(slot) = &self.slot {
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(slope);
        }
    }

    /// The gradient at GELU's input for the gradient `g` at its output: from the kept
    /// derivative, or — when none was kept, or an earlier backward pass through the same graph
    /// took it — recomputed from the forward pass's input, `input()` (in bf16 rounded as a kept
    /// one is, so both give the same bits).
    pub(crate) fn backward<'a>(
        &self,
        g: &[f32],
        input: impl FnOnce() -> Result<Cow<'a, [f32]>>,
    ) -> Result<Vec<f32>> {
        self.backward_into(g, input, |len, f| {
            fill(len, ELEMENTS_PER_TASK, |r, out| f(r, out))
        })
    }

    /// [`Self::backward`]'s gradient (rows × cols) as an activation for products in the
    /// precision: in bf16 each block of rows is rounded as it is made, so the f32 gradient
    /// never goes to memory (it feeds only the two products of the projection before GELU);
    /// the same values.
    pub(crate) fn backward_kept<'a>(
        &self,
        g: &[f32],
        (rows, cols): (usize, usize),
        input: impl FnOnce() -> Result<Cow<'a, [f32]>>,
    ) -> Result<Activation> {
        if self.precision == Precision::F32 {
            return Ok(Activation::F32(self.backward(g, input)?));
        }
        assert_eq!(
            g.len(),
            rows * cols,
            "GELU: {} gradient elements are not {rows}×{cols}",
            g.len()
        );
        self.backward_into(g, input, |_, f| {
            Activation::rounded_with(rows, cols, |r, out| f(r.start * cols..r.end * cols, out))
        })
    }

    /// The gradient at GELU's input, made by `write(len, piece)`, which calls `piece` for each
    /// range of elements it writes.
    fn backward_into<'a, T>(
        &self,
        g: &[f32],
        input: impl FnOnce() -> Result<Cow<'a, [f32]>>,
        write: impl FnOnce(usize, &(dyn Fn(std::ops::Range<usize>, &mut [MaybeUninit<f32>]) + Sync)) -> T,
    ) -> Result<T> {
        Ok(match self.take_slope() {
            Some(Held::F32(d)) if d.len() == g.len() => {
                write(g.len(), &|r, out| mul(&g[r.clone()], &d[r], out))
            }
            Some(Held::Bf16(d)) if d.len() == g.len() => {
                write(g.len(), &|r, out| mul_widened(&g[r.clone()], &d[r], out))
            }
            _ => {
                let x = input()?;
                write(g.len(), &|r, out| match self.precision {
                    Precision::F32 => gelu_bwd(&x[r.clone()], &g[r], out),
                    Precision::Bf16 => gelu_bwd_bf16(&x[r.clone()], &g[r], out),
                })
            }
        })
    }

    /// The kept derivative, taken out (`None`: none kept, or already taken).
    fn take_slope(&self) -> Option<Held<'static>> {
        self.slot
            .as_ref()
            .and_then(|slot| slot.lock().unwrap_or_else(|e| e.into_inner()).take())
    }
}

thread_local! {
    /// [`GeluSlope::forward_kept_made`]'s block of input, kept from block to block on this
    /// thread.
    static MADE: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

// The loops below write into the output's uninitialised elements instead of `map().collect()`
// (collect's fold is not inlined into the AVX2 copy, which would leave the arithmetic
// unvectorised) or a zeroed vector (a memset per call that every element then overwrites).
#[inline(always)]
fn gelu_fwd_generic(x: &[f32], y: &mut [MaybeUninit<f32>]) {
    for (y, &v) in y.iter_mut().zip(x) {
        y.write((erf_and_gauss(v * std::f32::consts::FRAC_1_SQRT_2).0 + 1.) * 0.5 * v);
    }
}
simd_dispatch!(gelu_fwd => gelu_fwd_generic(x: &[f32], y: &mut [MaybeUninit<f32>]) -> ());

/// d/dx gelu_erf(x) = 0.5 + 0.398942·x·e^(−x²/2) + 0.5·erf(x/√2), as candle writes it; the erf
/// of x/√2 comes with e^(−x²/2) for free.
#[inline(always)]
fn gelu_derivative(v: f32) -> (f32, f32) {
    let (erf, e) = erf_and_gauss(v * std::f32::consts::FRAC_1_SQRT_2);
    ((erf + 1.) * 0.5 * v, 0.5 + 0.398942 * e * v + 0.5 * erf)
}

/// GELU and its derivative at each element, the derivative kept as `T` keeps it (f32 as it is,
/// bf16's bits rounded as it is made).
#[inline(always)]
fn gelu_fwd_keep_generic<T: Store>(x: &[f32], y: &mut [MaybeUninit<f32>], d: &mut [MaybeUninit<T>]) {
    for ((y, d), &v) in y.iter_mut().zip(d.iter_mut()).zip(x) {
        let (value, slope) = gelu_derivative(v);
        y.write(value);
        d.write(T::store(slope));
    }
}
simd_dispatch!(gelu_fwd_keep => gelu_fwd_keep_generic(
    x: &[f32], y: &mut [MaybeUninit<f32>], d: &mut [MaybeUninit<f32>]) -> ());
simd_dispatch!(gelu_fwd_keep_bf16 => gelu_fwd_keep_generic(
    x: &[f32], y: &mut [MaybeUninit<f32>], d: &mut [MaybeUninit<u16>]) -> ());

/// The gradient at GELU's input from its recomputed derivative, kept as `T` would keep it (so
/// that recomputing gives a kept derivative's bits).
#[inline(always)]
fn gelu_bwd_generic<T: Store>(x: &[f32], g: &[f32], dx: &mut [MaybeUninit<f32>]) {
    for ((d, &v), &g) in dx.iter_mut().zip(x).zip(g) {
        d.write(g * T::store(gelu_derivative(v).1).widen());
    }
}
#[inline(always)]
fn gelu_bwd_f32_generic(x: &[f32], g: &[f32], dx: &mut [MaybeUninit<f32>]) {
    gelu_bwd_generic::<f32>(x, g, dx)
}
#[inline(always)]
fn gelu_bwd_bf16_generic(x: &[f32], g: &[f32], dx: &mut [MaybeUninit<f32>]) {
    gelu_bwd_generic::<u16>(x, g, dx)
}
simd_dispatch!(gelu_bwd => gelu_bwd_f32_generic(x: &[f32], g: &[f32], dx: &mut [MaybeUninit<f32>]) -> ());
simd_dispatch!(gelu_bwd_bf16 => gelu_bwd_bf16_generic(x: &[f32], g: &[f32], dx: &mut [MaybeUninit<f32>]) -> ());

#[inline(always)]
fn mul_widened_generic(g: &[f32], d: &[u16], out: &mut [MaybeUninit<f32>]) {
    for ((o, &g), &d) in out.iter_mut().zip(g).zip(d) {
        o.write(g * d.widen());
    }
}
simd_dispatch!(mul_widened => mul_widened_generic(g: &[f32], d: &[u16], out: &mut [MaybeUninit<f32>]) -> ());

impl CustomOp1 for GeluOp {
    fn name(&self) -> &'static str {
        "ember-gelu-erf"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let y = self.0.forward(&cpu_values(s, l)?);
        Ok((cpu_storage_like(y, s)?, l.shape().clone()))
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        Ok((cuda::gelu(s, l)?, l.shape().clone()))
    }
    fn bwd(&self, x: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        #[cfg(feature = "cuda")]
        if x.device().is_cuda() {
            return Ok(Some(cuda::gelu_bwd(x, g)?));
        }
        let dx = with_data([x, g], |[x, g]| self.0.backward(g, || Ok(Cow::Borrowed(x))))?;
        Ok(Some(cpu_tensor_as(dx, x.shape(), x.dtype())?))
    }
}

/// `silu(gate) · up` from candle primitives.
pub fn swiglu_unfused(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    gate.silu()?.mul(up)
}

/// `silu(gate) · up` in one pass with a fused backward on CPU f32 and (with the activation
/// kernel switched on) CUDA f32. gate and up may also be bf16 activations, on the CPU and (with
/// the `bf16` kernels switched on too) on CUDA: computed in f32 on their widened values, the
/// output and both gradients rounded once to bf16.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    swiglu_in(gate, up, Precision::F32)
}

/// [`swiglu`] reading gate and up as activations of `precision` are: under bf16 rounded to
/// bf16 (the projections' outputs as cuBLAS's bf16 products give them; on CUDA they are
/// already), as the fused feed-forward block reads and keeps them. Where the op does not run
/// on the CPU (inputs of two dtypes) the composition reads them through candle's casts, whose
/// backward pass rounds the gradients too.
pub fn swiglu_in(gate: &Tensor, up: &Tensor, precision: Precision) -> Result<Tensor> {
    let fused = gate.dtype() == up.dtype()
        && ((is_host(gate) && is_host(up))
            || (takes(gate, Kernel::Activation) && takes(up, Kernel::Activation)));
    if !fused || gate.shape() != up.shape() {
        if gate.device().is_cuda() {
            // Rounded already by the projections' bf16 products.
            return swiglu_unfused(gate, up);
        }
        let [gate, up] = [gate, up].map(|t| precision.round(t));
        return swiglu_unfused(&gate?, &up?);
    }
    let op = SwigluOp {
        out: gate.dtype(),
        precision,
    };
    gate.contiguous()?.apply_op2(&up.contiguous()?, op)
}

struct SwigluOp {
    /// The output's dtype: the inputs'.
    out: DType,
    /// What the inputs are read as (CPU: rounded to bf16 under bf16).
    precision: Precision,
}

#[inline(always)]
fn swiglu_fwd_generic<T: Element>(a: &[T], u: &[T], y: &mut [MaybeUninit<f32>]) {
    for ((y, &a), &u) in y.iter_mut().zip(a).zip(u) {
        let (a, u) = (a.widen(), u.widen());
        y.write((a / (1.0 + exp_fast(-a))) * u);
    }
}
simd_dispatch!(swiglu_fwd => swiglu_fwd_generic(a: &[f32], u: &[f32], y: &mut [MaybeUninit<f32>]) -> ());
simd_dispatch!(swiglu_fwd_widened => swiglu_fwd_generic(a: &[u16], u: &[u16], y: &mut [MaybeUninit<f32>]) -> ());

/// SwiGLU reading a and u as bf16 activations (rounded as they are read), keeping their bits.
#[inline(always)]
fn swiglu_fwd_keep_bf16_generic(
    a: &[f32],
    u: &[f32],
    y: &mut [MaybeUninit<f32>],
    a_kept: &mut [MaybeUninit<u16>],
    u_kept: &mut [MaybeUninit<u16>],
) {
    for i in 0..a.len().min(y.len()).min(a_kept.len()).min(u_kept.len()) {
        let (a_bits, u_bits) = (to_bf16(a[i]), to_bf16(u[i]));
        a_kept[i].write(a_bits);
        u_kept[i].write(u_bits);
        let (a, u) = (a_bits.widen(), u_bits.widen());
        y[i].write((a / (1.0 + exp_fast(-a))) * u);
    }
}
simd_dispatch!(swiglu_fwd_keep_bf16 => swiglu_fwd_keep_bf16_generic(
    a: &[f32], u: &[f32], y: &mut [MaybeUninit<f32>], a_kept: &mut [MaybeUninit<u16>],
    u_kept: &mut [MaybeUninit<u16>]) -> ());

#[inline(always)]
fn swiglu_bwd_generic<T: Element>(
    a: &[T],
    u: &[T],
    g: &[f32],
    da: &mut [MaybeUninit<f32>],
    du: &mut [MaybeUninit<f32>],
) {
    for i in 0..a.len().min(da.len()).min(du.len()) {
        let (a, u) = (a[i].widen(), u[i].widen());
        let sig = 1.0 / (1.0 + exp_fast(-a));
        let silu = a * sig;
        du[i].write(g[i] * silu);
        // d/da silu = σ(a)·(1 − silu(a)) + silu(a)
        da[i].write(g[i] * u * (sig * (1.0 - silu) + silu));
    }
}
simd_dispatch!(swiglu_bwd => swiglu_bwd_generic(
    a: &[f32], u: &[f32], g: &[f32], da: &mut [MaybeUninit<f32>], du: &mut [MaybeUninit<f32>]) -> ());
simd_dispatch!(swiglu_bwd_widened => swiglu_bwd_generic(
    a: &[u16], u: &[u16], g: &[f32], da: &mut [MaybeUninit<f32>], du: &mut [MaybeUninit<f32>]) -> ());

/// `silu(a)·u` of every element, in parallel pieces.
pub(crate) fn swiglu_values(a: &Held, u: &Held) -> Vec<f32> {
    fill(a.len(), ELEMENTS_PER_TASK, |r, y| match (a, u) {
        (Held::Bf16(a), Held::Bf16(u)) => swiglu_fwd_widened(&a[r.clone()], &u[r], y),
        (Held::F32(a), Held::F32(u)) => swiglu_fwd(&a[r.clone()], &u[r], y),
        _ => unreachable!("SwiGLU: a and u held in two precisions"),
    })
}

/// [`swiglu_values`] of the projections a and u (rows × cols each) as an activation for
/// products in `precision`, and a and u as the backward pass reads them ([`Held`]). In bf16
/// SwiGLU reads a and u rounded as bf16 activations are, keeps their bits, and rounds its
/// output as it makes each block of rows (the down projection is all that reads it): a and u
/// are read once, and no f32 values are written.
pub(crate) fn swiglu_kept(
    a: Vec<f32>,
    u: Vec<f32>,
    (rows, cols): (usize, usize),
    precision: Precision,
) -> (Activation, [Held<'static>; 2]) {
    if precision == Precision::F32 {
        let [a, u] = [a, u].map(|v| Held::F32(v.into()));
        return (Activation::F32(swiglu_values(&a, &u)), [a, u]);
    }
    let len = rows * cols;
    assert!(
        a.len() == len && u.len() == len,
        "SwiGLU: {} and {} elements are not {rows}×{cols}",
        a.len(),
        u.len()
    );
    let (a_kept, u_kept) = (PendingBits::new(len), PendingBits::new(len));
    let y = Activation::rounded_with(rows, cols, |r, out| {
        let e = r.start * cols..r.end * cols;
        // SAFETY: the rows `r` of both are this block's alone.
        let (a_piece, u_piece) = unsafe { (a_kept.piece(e.clone()), u_kept.piece(e.clone())) };
        swiglu_fwd_keep_bf16(&a[e.clone()], &u[e], out, a_piece, u_piece)
    });
    // SAFETY: the blocks cover every row, and each wrote its elements of both.
    (y, unsafe { [a_kept.finish(), u_kept.finish()] })
}

/// SwiGLU's output from its projections as [`swiglu_kept`] held them, as the activation
/// `swiglu_kept` returned (rows × cols): the same values, made again for a backward pass that
/// did not keep them (they cost a pass over the elements; kept, as much memory as a projection).
pub(crate) fn swiglu_output(a: &Held, u: &Held, (rows, cols): (usize, usize)) -> Activation {
    match (a, u) {
        (Held::F32(_), Held::F32(_)) => Activation::F32(swiglu_values(a, u)),
        (Held::Bf16(a), Held::Bf16(u)) => {
            assert!(
                a.len() == rows * cols && u.len() == rows * cols,
                "SwiGLU: {} and {} elements are not {rows}×{cols}",
                a.len(),
                u.len()
            );
            Activation::rounded_with(rows, cols, |r, out| {
                let e = r.start * cols..r.end * cols;
                swiglu_fwd_widened(&a[e.clone()], &u[e], out)
            })
        }
        _ => unreachable!("SwiGLU: a and u held in two precisions"),
    }
}

/// The gradients at a and u of `silu(a)·u` for the gradient g at its output.
pub(crate) fn swiglu_grads(a: &Held, u: &Held, g: &[f32]) -> (Vec<f32>, Vec<f32>) {
    fill2(a.len(), ELEMENTS_PER_TASK, |r, da, du| match (a, u) {
        (Held::Bf16(a), Held::Bf16(u)) => swiglu_bwd_widened(&a[r.clone()], &u[r.clone()], &g[r], da, du),
        (Held::F32(a), Held::F32(u)) => swiglu_bwd(&a[r.clone()], &u[r.clone()], &g[r], da, du),
        _ => unreachable!("SwiGLU: a and u held in two precisions"),
    })
}

impl CustomOp2 for SwigluOp {
    fn name(&self) -> &'static str {
        "ember-swiglu"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let held = |s, l| Ok::<_, candle_core::Error>(Held::new(cpu_values(s, l)?, self.precision));
        let (a, u) = (held(s1, l1)?, held(s2, l2)?);
        Ok((
            cpu_storage_as(swiglu_values(&a, &u), self.out)?,
            l1.shape().clone(),
        ))
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        Ok((cuda::swiglu(s1, l1, s2, l2)?, l1.shape().clone()))
    }
    fn bwd(
        &self,
        a: &Tensor,
        u: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        #[cfg(feature = "cuda")]
        if a.device().is_cuda() {
            let (da, du) = cuda::swiglu_bwd(a, u, g)?;
            return Ok((Some(da), Some(du)));
        }
        let (da, du) = with_data([a, u, g], |[a, u, g]| {
            let [a, u] = [a, u].map(|v| Held::new(v, self.precision));
            Ok(swiglu_grads(&a, &u, g))
        })?;
        Ok((
            Some(cpu_tensor_as(da, a.shape(), a.dtype())?),
            Some(cpu_tensor_as(du, u.shape(), u.dtype())?),
        ))
    }
}

/// The launches of `cuda/activation.cu`: f32 activations, or bf16 ones (with the `bf16` kernels
/// switched on) through the kernels' `_bf16` variants; a gradient comes in its output's dtype,
/// which is its input's.
#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::backend::BackendStorage as _;
    use candle_core::{bail, CudaStorage, Layout, Result, Tensor};

    use crate::cuda::device::{
        alloc_of, elementwise, kernel_name, launch, storage, tensor, view_of, with_cuda, with_element,
        Element, ACTIVATION,
    };

    /// `base` for activations of `T`.
    fn name<T: Element>(base: &'static str) -> std::borrow::Cow<'static, str> {
        kernel_name(base, &[T::NAME])
    }

    /// An error unless every tensor of an op holds its first one's dtype.
    fn same_dtype(what: &str, dtypes: &[candle_core::DType]) -> Result<()> {
        if dtypes.iter().any(|d| *d != dtypes[0]) {
            bail!("{what}: inputs of dtypes {dtypes:?}; the CUDA kernel takes one dtype");
        }
        Ok(())
    }

    pub(super) fn gelu(s: &CudaStorage, l: &Layout) -> Result<CudaStorage> {
        with_element!(s.dtype(), T => {
            let (x, n) = (view_of::<T>(s, l)?, l.shape().elem_count());
            let mut y = alloc_of::<T>(&s.device, n)?;
            if n > 0 {
                launch!(s.device, ACTIVATION, name::<T>("ember_gelu_fwd"), elementwise(n); &x, &mut y, &(n as u64))?;
            }
            Ok(storage(y, &s.device))
        })
    }

    pub(super) fn gelu_bwd(x: &Tensor, g: &Tensor) -> Result<Tensor> {
        same_dtype("gelu backward", &[x.dtype(), g.dtype()])?;
        with_cuda([x, g], |[(xs, xl), (gs, gl)]| {
            let n = xl.shape().elem_count();
            if gl.shape().elem_count() != n {
                bail!(
                    "gelu: a gradient of {:?} for an input of {:?}",
                    gl.shape(),
                    xl.shape()
                );
            }
            with_element!(xs.dtype(), T => {
                let (xv, gv) = (view_of::<T>(xs, xl)?, view_of::<T>(gs, gl)?);
                let mut dx = alloc_of::<T>(&xs.device, n)?;
                if n > 0 {
                    launch!(xs.device, ACTIVATION, name::<T>("ember_gelu_bwd"), elementwise(n);
                        &xv, &gv, &mut dx, &(n as u64))?;
                }
                Ok(tensor(dx, &xs.device, xl.shape()))
            })
        })
    }

    pub(super) fn swiglu(
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<CudaStorage> {
        same_dtype("swiglu", &[s1.dtype(), s2.dtype()])?;
        let n = l1.shape().elem_count();
        if l2.shape().elem_count() != n {
            bail!("swiglu: gate {:?} and up {:?} differ", l1.shape(), l2.shape());
        }
        with_element!(s1.dtype(), T => {
            let (a, u) = (view_of::<T>(s1, l1)?, view_of::<T>(s2, l2)?);
            let mut y = alloc_of::<T>(&s1.device, n)?;
            if n > 0 {
                launch!(s1.device, ACTIVATION, name::<T>("ember_swiglu_fwd"), elementwise(n);
                    &a, &u, &mut y, &(n as u64))?;
            }
            Ok(storage(y, &s1.device))
        })
    }

    pub(super) fn swiglu_bwd(a: &Tensor, u: &Tensor, g: &Tensor) -> Result<(Tensor, Tensor)> {
        same_dtype("swiglu backward", &[a.dtype(), u.dtype(), g.dtype()])?;
        with_cuda([a, u, g], |[(as_, al), (us, ul), (gs, gl)]| {
            let n = al.shape().elem_count();
            if ul.shape().elem_count() != n || gl.shape().elem_count() != n {
                bail!(
                    "swiglu: gate {:?}, up {:?} and gradient {:?} differ",
                    al.shape(),
                    ul.shape(),
                    gl.shape()
                );
            }
            with_element!(as_.dtype(), T => {
                let (av, uv, gv) = (view_of::<T>(as_, al)?, view_of::<T>(us, ul)?, view_of::<T>(gs, gl)?);
                let dev = &as_.device;
                let (mut da, mut du) = (alloc_of::<T>(dev, n)?, alloc_of::<T>(dev, n)?);
                if n > 0 {
                    launch!(dev, ACTIVATION, name::<T>("ember_swiglu_bwd"), elementwise(n);
                        &av, &uv, &gv, &mut da, &mut du, &(n as u64))?;
                }
                Ok((tensor(da, dev, al.shape()), tensor(du, dev, ul.shape())))
            })
        })
    }
}

/// The CUDA kernels' arithmetic (`cuda/activation.cuh`, run on the host by
/// `cuda/activation_mirror.cpp`, with the C library's erff and expf) against this CPU kernel.
#[cfg(test)]
mod mirror_tests;

#[cfg(test)]
mod timing;
