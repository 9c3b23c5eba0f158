//! Rotary position embeddings (Su et al. 2021) in the "rotate half" layout of GPT-NeoX/LLaMA:
//! dimension i is paired with dimension i + d/2 and the pair is rotated by the angle
//! `position · θ^(−2i/d)`, which makes ⟨rot(q, m), rot(k, n)⟩ a function of m − n alone.
//! candle's `rotary_emb::rope` has no backward pass; this one does, and folds an output scale
//! into the same pass: the attention logit scale of the queries, optionally grown per position
//! by log-n scaling ([`PositionScale`]).
//!
//! Inputs are the projections as they come, (B, T, H·head_dim): every consecutive run of
//! head_dim elements is one head's vector at its row's position. Rotating them in place of a
//! (B, H, T, head_dim) view saves the head split and its autograd edges.
//!
//! On CUDA (the `rope` kernel switched on, `cuda/rope.cu`) one thread rotates each pair, reading
//! the tables' own device tensors, with the CPU kernel's arithmetic and so its bits.

use std::sync::Arc;

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Result, Shape, Tensor, D};

use crate::cuda::{takes, Kernel};
use crate::host::{cpu_storage_as, cpu_values, is_host};
use crate::par::{for_each_chunk, SharedMut};
use crate::simd::simd_dispatch;

/// The cos/sin tables of positions `0..max_len` for vectors of `head_dim` elements: as tensors of
/// the model's dtype and device (the unfused rotation) and as f32 half-tables (the CPU kernel).
#[derive(Clone)]
pub struct RopeTables {
    /// (max_len, head_dim): both halves of a row carry the same angles, so one broadcast
    /// multiply covers each pair.
    cos: Tensor,
    sin: Tensor,
    /// (max_len, head_dim / 2), the same angles rounded to f32 exactly as the tensors' are.
    cos_half: Arc<Vec<f32>>,
    sin_half: Arc<Vec<f32>>,
    /// (max_len,) f64 on a CUDA device: ln(p + 1) for position p, the log-n factor's numerator
    /// as the CPU computes it, for the CUDA kernel (built once with the tables; `None` off CUDA).
    ln_positions: Option<Tensor>,
    half: usize,
    max_len: usize,
}

/// ln(p + 1) for the positions `0..max_len`, as [`logn_factor`] computes it.
fn ln_positions(max_len: usize) -> Vec<f64> {
    (0..max_len).map(|p| ((p + 1) as f64).ln()).collect()
}

impl RopeTables {
    pub fn new(head_dim: usize, max_len: usize, theta: f64, dtype: DType, device: &Device) -> Result<Self> {
        let half = head_dim / 2;
        let mut cos = Vec::with_capacity(max_len * head_dim);
        let mut sin = Vec::with_capacity(max_len * head_dim);
        let (mut cos_half, mut sin_half) = (
            Vec::with_capacity(max_len * half),
            Vec::with_capacity(max_len * half),
        );
        for pos in 0..max_len {
            for _ in 0..2 {
                for i in 0..half {
                    let angle = pos as f64 * theta.powf(-2.0 * i as f64 / head_dim as f64);
                    cos.push(angle.cos());
                    sin.push(angle.sin());
                }
            }
            cos_half.extend(
                cos[pos * head_dim..pos * head_dim + half]
                    .iter()
                    .map(|&c| c as f32),
            );
            sin_half.extend(
                sin[pos * head_dim..pos * head_dim + half]
                    .iter()
                    .map(|&s| s as f32),
            );
        }
        Ok(Self {
            cos: Tensor::from_vec(cos, (max_len, head_dim), device)?.to_dtype(dtype)?,
            sin: Tensor::from_vec(sin, (max_len, head_dim), device)?.to_dtype(dtype)?,
            cos_half: Arc::new(cos_half),
            sin_half: Arc::new(sin_half),
            ln_positions: if device.is_cuda() {
                Some(Tensor::from_vec(ln_positions(max_len), max_len, device)?)
            } else {
                None
            },
            half,
            max_len,
        })
    }

    /// Positions the tables cover.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Whether the tables cover the positions `offset..offset + t`.
    pub(crate) fn covers(&self, offset: usize, t: usize) -> bool {
        offset + t <= self.max_len
    }

    /// Whether the CUDA kernel can rotate `x` with these tables: f32 tables on x's CUDA device.
    pub(crate) fn on_device_of(&self, x: &Tensor) -> bool {
        self.ln_positions.is_some()
            && self.cos.dtype() == DType::F32
            && self.cos.device().same_device(x.device())
    }
}

/// The factor a rotated vector is multiplied by: a constant `scale` (the queries' 1/√d), times,
/// with `logn_length` = m, the log-n factor max(1, ln n / ln m) of a query that sees
/// n = position + 1 keys (entropy-invariant attention; Qwen's `use_logn_attn`). Up to position m − 1 the
/// factor is exactly 1, so a model trained at length m computes the same bits with or without it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PositionScale {
    pub scale: f64,
    pub logn_length: Option<usize>,
}

impl From<f64> for PositionScale {
    fn from(scale: f64) -> Self {
        Self {
            scale,
            logn_length: None,
        }
    }
}

impl PositionScale {
    /// The factor at (0-based) `position`.
    pub fn at(&self, position: usize) -> f64 {
        self.scale * logn_factor(position, self.logn_length)
    }

    /// The factor shared by positions `offset..offset + t`, if they all have the same one.
    fn constant(&self, offset: usize, t: usize) -> Option<f64> {
        match self.logn_length {
            Some(m) if offset + t > m => None,
            _ => Some(self.scale),
        }
    }

    /// `x` (B, T, W) whose first position is `offset`, multiplied by each position's factor, from
    /// candle ops (every device and dtype): the scale of queries that are not rotated.
    pub fn apply_unfused(&self, x: &Tensor, offset: usize) -> Result<Tensor> {
        let t = x.dim(1)?;
        match self.constant(offset, t) {
            Some(1.0) => Ok(x.clone()),
            // candle's affine would round s to bf16 first.
            Some(s) if x.dtype() == DType::BF16 => {
                x.to_dtype(DType::F32)?.affine(s, 0.0)?.to_dtype(DType::BF16)
            }
            Some(s) => x.affine(s, 0.0),
            None => {
                let factors: Vec<f32> = (offset..offset + t).map(|p| self.at(p) as f32).collect();
                let factors = Tensor::from_vec(factors, (1, t, 1), x.device())?;
                match x.dtype() {
                    // A bf16 x scaled in f32 and rounded once (not by factors rounded first).
                    DType::BF16 => x
                        .to_dtype(DType::F32)?
                        .broadcast_mul(&factors)?
                        .to_dtype(DType::BF16),
                    dtype => x.broadcast_mul(&factors.to_dtype(dtype)?),
                }
            }
        }
    }
}

/// max(1, ln n / ln m) for a query at 0-based `position` (n = position + 1 keys in view) and
/// training length m = `logn_length`; 1 without log-n scaling.
pub fn logn_factor(position: usize, logn_length: Option<usize>) -> f64 {
    match logn_length {
        Some(m) if position + 1 > m && m >= 2 => ((position + 1) as f64).ln() / (m as f64).ln(),
        _ => 1.0,
    }
}

/// The rotation of x (B, T, H·head_dim) whose first position is `offset`, from narrow, cat and
/// multiply (every device and dtype; the reference for the kernel).
pub fn rope_unfused(x: &Tensor, tables: &RopeTables, offset: usize) -> Result<Tensor> {
    let (b, t, width) = x.dims3()?;
    let d = 2 * tables.half;
    let x = x.reshape((b, t, width / d, d))?;
    let cos = tables.cos.narrow(0, offset, t)?.reshape((t, 1, d))?;
    let sin = tables.sin.narrow(0, offset, t)?.reshape((t, 1, d))?;
    let x1 = x.narrow(D::Minus1, 0, tables.half)?;
    let x2 = x.narrow(D::Minus1, tables.half, tables.half)?;
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    x.broadcast_mul(&cos)?
        .add(&rotated.broadcast_mul(&sin)?)?
        .reshape((b, t, width))
}

/// `scale · rotated(x)` for x (B, T, H·head_dim) whose first position is `offset` (`scale` an
/// `f64` or a [`PositionScale`]); fused on CPU f32 or bf16 (computed in f32, the output in x's
/// dtype) and (with the rope kernel switched on and f32 tables on the same device) CUDA f32, or
/// CUDA bf16 with the `bf16` kernels switched on too (computed in f32, the output in bf16),
/// [`rope_unfused`] (then the scale) elsewhere.
pub fn rope(
    x: &Tensor,
    tables: &RopeTables,
    offset: usize,
    scale: impl Into<PositionScale>,
) -> Result<Tensor> {
    let scale = scale.into();
    let (_, t, width) = x.dims3()?;
    check_heads(tables, width)?;
    let fused = is_host(x) || (takes(x, Kernel::Rope) && tables.on_device_of(x));
    if !fused || !tables.covers(offset, t) {
        return scale.apply_unfused(&rope_unfused(x, tables, offset)?, offset);
    }
    x.contiguous()?.apply_op1(RopeOp::new(tables, offset, scale))
}

/// An error unless a last dimension of `width` holds whole heads of the tables' head_dim.
pub(crate) fn check_heads(tables: &RopeTables, width: usize) -> Result<()> {
    let d = 2 * tables.half;
    if d == 0 || !width.is_multiple_of(d) {
        candle_core::bail!("rope: the last dimension {width} is not a multiple of head_dim {d}");
    }
    Ok(())
}

/// The rotation (and scale) of the positions `offset..` by the tables' angles; also run by
/// [`linear_rope`](crate::linear_rope) on its projection.
#[derive(Clone)]
pub(crate) struct RopeOp {
    tables: RopeTables,
    offset: usize,
    scale: PositionScale,
    /// Rotate by the negative angles (the transpose: the backward pass).
    inverse: bool,
}

/// Positions per parallel task.
const ROWS_PER_TASK: usize = 64;

impl RopeOp {
    pub(crate) fn new(tables: &RopeTables, offset: usize, scale: PositionScale) -> Self {
        Self {
            tables: tables.clone(),
            offset,
            scale,
            inverse: false,
        }
    }

    /// The transposed rotation, which takes the output's gradient to the input's.
    pub(crate) fn transpose(&self) -> Self {
        Self {
            inverse: !self.inverse,
            ..self.clone()
        }
    }

    /// Rotates x (B, T, W) into a new vector of the same layout.
    pub(crate) fn run(&self, x: &[f32], t: usize, width: usize) -> Vec<f32> {
        if width == 0 {
            return Vec::new();
        }
        let mut y: Vec<f32> = Vec::with_capacity(x.len());
        let out = SharedMut(y.as_mut_ptr());
        let positions = x.len() / width;
        for_each_chunk(positions, ROWS_PER_TASK, |rows| {
            // SAFETY: the positions `rows` of the output belong to this task alone.
            let y = unsafe { out.slice(rows.start * width, rows.len() * width) };
            let x = &x[rows.start * width..rows.end * width];
            rotate_rows(self, rows.start, t, width, x, y);
        });
        // SAFETY: the tasks wrote every position's row.
        unsafe { y.set_len(x.len()) };
        y
    }
}

/// Rotates the rows of `x` (positions `first..`, `width` elements each, t positions to a
/// sequence) into `y`, with `op`'s angles, direction and scale.
#[inline(always)]
fn rotate_rows_generic(op: &RopeOp, first: usize, t: usize, width: usize, x: &[f32], y: &mut [f32]) {
    let half = op.tables.half;
    let d = 2 * half;
    let sign = if op.inverse { -1.0 } else { 1.0 };
    for (r, (xr, yr)) in (first..).zip(x.chunks_exact(width).zip(y.chunks_exact_mut(width))) {
        let pos = op.offset + r % t;
        // The scale is linear in x, so the backward pass applies the same factor.
        let scale = op.scale.at(pos) as f32;
        let cos = &op.tables.cos_half[pos * half..(pos + 1) * half];
        let sin = &op.tables.sin_half[pos * half..(pos + 1) * half];
        for (xh, yh) in xr.chunks_exact(d).zip(yr.chunks_exact_mut(d)) {
            let (x1, x2) = xh.split_at(half);
            let (y1, y2) = yh.split_at_mut(half);
            for i in 0..half {
                let s = sin[i] * sign;
                y1[i] = (x1[i] * cos[i] - x2[i] * s) * scale;
                y2[i] = (x2[i] * cos[i] + x1[i] * s) * scale;
            }
        }
    }
}
simd_dispatch!(rotate_rows => rotate_rows_generic(
    op: &RopeOp, first: usize, t: usize, width: usize, x: &[f32], y: &mut [f32]) -> ());

impl CustomOp1 for RopeOp {
    fn name(&self) -> &'static str {
        "ember-rope"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (_, t, width) = l.shape().dims3()?;
        // A bf16 activation (or its gradient) is rotated in f32 and rounded back once.
        let y = self.run(&cpu_values(s, l)?, t, width);
        Ok((cpu_storage_as(y, s.dtype())?, l.shape().clone()))
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        Ok((cuda::rotate(self, s, l)?, l.shape().clone()))
    }
    /// The inverse rotation of the gradient (on either device).
    fn bwd(&self, _x: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(g.contiguous()?.apply_op1_no_bwd(&self.transpose())?))
    }
}

/// The arguments of `ember_rope` (cuda/rope.cu) after the buffers: (pairs, half, heads, t,
/// offset, stride, scale, logn_length, ln m, sign).
#[cfg(any(test, feature = "cuda"))]
type RopeArgs = (u64, u32, u32, u32, u64, u32, f64, u64, f64, f32);

#[cfg(any(test, feature = "cuda"))]
impl RopeOp {
    /// [`RopeArgs`] for `elems` elements of x (B, t, width) and tables of `stride` columns.
    fn kernel_args(&self, elems: usize, t: usize, width: usize, stride: usize) -> Result<RopeArgs> {
        let half = self.tables.half.max(1);
        let narrow = |v: usize| {
            u32::try_from(v)
                .map_err(|_| candle_core::Error::Msg(format!("rope: {v} is too large for the CUDA kernel")))
        };
        let m = self.scale.logn_length.unwrap_or(0);
        Ok((
            (elems / (2 * half) * half) as u64,
            narrow(half)?,
            narrow(width / (2 * half))?,
            narrow(t)?,
            self.offset as u64,
            narrow(stride)?,
            self.scale.scale,
            m as u64,
            (m as f64).ln(),
            if self.inverse { -1.0 } else { 1.0 },
        ))
    }
}

/// The launch of `cuda/rope.cu`.
#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::backend::BackendStorage as _;
    use candle_core::{bail, CudaStorage, Layout, Result};

    use super::{check_heads, RopeOp};
    use crate::cuda::device::{
        alloc_of, elementwise, kernel_name, launch, storage, view, view_of, with_cuda, with_element, Element,
        ROPE,
    };

    pub(super) fn rotate(op: &RopeOp, s: &CudaStorage, l: &Layout) -> Result<CudaStorage> {
        let (_, t, width) = l.shape().dims3()?;
        let tables = &op.tables;
        check_heads(tables, width)?;
        let Some(ln) = &tables.ln_positions else {
            bail!("rope: the tables are not on a CUDA device");
        };
        if !tables.covers(op.offset, t) {
            bail!(
                "rope: positions {}..{} beyond the tables' {}",
                op.offset,
                op.offset + t,
                tables.max_len
            );
        }
        let n = l.shape().elem_count();
        with_cuda([&tables.cos, &tables.sin, ln], |[(cs, cl), (ss, sl), (ls, ll)]| {
            let (pairs, half, heads, t, offset, stride, scale, logn_length, ln_m, sign) =
                op.kernel_args(n, t, width, cl.shape().dims2()?.1)?;
            let (cos, sin) = (view(cs, cl)?, view(ss, sl)?);
            let Some((a, b)) = ll.contiguous_offsets() else {
                bail!("rope: expected a contiguous log table");
            };
            let ln_pos = ls.as_cuda_slice::<f64>()?.slice(a..b);
            // x and y: f32, or bf16 activations (ember_rope_bf16; the tables stay f32).
            with_element!(s.dtype(), T => {
                let x = view_of::<T>(s, l)?;
                let mut y = alloc_of::<T>(&s.device, n)?;
                if pairs > 0 {
                    launch!(s.device, ROPE, kernel_name("ember_rope", &[T::NAME]), elementwise(pairs as usize);
                        &x, &cos, &sin, &ln_pos, &mut y, &pairs, &half, &heads, &t, &offset, &stride, &scale,
                        &logn_length, &ln_m, &sign)?;
                }
                Ok(storage(y, &s.device))
            })
        })
    }
}

/// The CUDA kernel's body (`cuda/rope.cuh`, run on the host by `cuda/rope_mirror.cpp`) against
/// this CPU kernel: the same index arithmetic, tables and roundings, so the same bits.
#[cfg(test)]
mod mirror {
    use candle_core::{DType, Device};

    use super::*;

    /// The mirror of `ember_rope` over elements of `$t` (f32, or u16 for bf16).
    macro_rules! rope_mirror {
        ($name:ident, $t:ty) => {
            extern "C" {
                #[allow(clippy::too_many_arguments)]
                fn $name(
                    x: *const $t,
                    cos: *const f32,
                    sin: *const f32,
                    ln_pos: *const f64,
                    y: *mut $t,
                    pairs: u64,
                    half: u32,
                    heads: u32,
                    t: u32,
                    offset: u64,
                    stride: u32,
                    scale: f64,
                    logn_length: u64,
                    ln_m: f64,
                    sign: f32,
                );
            }
        };
    }
    rope_mirror!(ember_mirror_rope, f32);
    rope_mirror!(ember_mirror_rope_bf16, u16);

    extern "C" {
        fn ember_mirror_rope_factor(scale: f64, position: u64, logn_length: u64, ln_n: f64, ln_m: f64)
            -> f32;
    }

    fn host(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1().unwrap()
    }

    #[test]
    fn the_device_factor_is_the_cpu_factor_bit_for_bit() {
        let ln = ln_positions(300);
        for logn_length in [None, Some(1), Some(2), Some(7), Some(16), Some(256)] {
            for scale in [1.0, 0.125, 1.0 / 24f64.sqrt()] {
                let s = PositionScale { scale, logn_length };
                let m = logn_length.unwrap_or(0);
                for (p, &ln_p) in ln.iter().enumerate().take(300) {
                    let f =
                        unsafe { ember_mirror_rope_factor(scale, p as u64, m as u64, ln_p, (m as f64).ln()) };
                    assert_eq!(f.to_bits(), (s.at(p) as f32).to_bits(), "{s:?} at {p}");
                }
            }
        }
    }

    #[test]
    fn the_device_rotation_is_the_cpu_rotation_bit_for_bit() {
        // (B, H, T, head_dim, offset, max_len, log-n length): one position, positions past the
        // training length, an empty batch.
        let cases = [
            (2, 3, 7, 32, 0, 16, None),
            (1, 2, 5, 8, 3, 16, Some(4)),
            (3, 1, 1, 6, 9, 16, None),
            (2, 1, 9, 4, 3, 32, Some(7)),
            (1, 2, 6, 2, 2, 8, Some(2)),
            (0, 2, 3, 8, 0, 8, None),
        ];
        for (i, (b, h, t, head_dim, offset, max_len, logn_length)) in cases.into_iter().enumerate() {
            let tables = RopeTables::new(head_dim, max_len, 10_000.0, DType::F32, &Device::Cpu).unwrap();
            let (cos, sin, ln) = (host(&tables.cos), host(&tables.sin), ln_positions(max_len));
            let width = h * head_dim;
            let mut rng = ember_rng::SplitMix64::new(i as u64);
            let x: Vec<f32> = (0..b * t * width).map(|_| rng.normal() as f32).collect();
            for scale in [1.0, 0.125] {
                for inverse in [false, true] {
                    let op = RopeOp::new(&tables, offset, PositionScale { scale, logn_length });
                    let op = if inverse { op.transpose() } else { op };
                    let cpu = op.run(&x, t, width);
                    let (pairs, half, heads, tt, off, stride, sc, m, ln_m, sign) =
                        op.kernel_args(x.len(), t, width, head_dim).unwrap();
                    assert_eq!(pairs as usize * 2, x.len());
                    // The kernel body over x into y, f32 or bf16.
                    macro_rules! mirror {
                        ($f:ident, $x:expr, $y:expr) => {
                            unsafe {
                                $f(
                                    $x.as_ptr(),
                                    cos.as_ptr(),
                                    sin.as_ptr(),
                                    ln.as_ptr(),
                                    $y.as_mut_ptr(),
                                    pairs,
                                    half,
                                    heads,
                                    tt,
                                    off,
                                    stride,
                                    sc,
                                    m,
                                    ln_m,
                                    sign,
                                )
                            }
                        };
                    }
                    let mut y = vec![f32::NAN; x.len()];
                    mirror!(ember_mirror_rope, x, y);
                    assert_eq!(y.len(), cpu.len());
                    for (j, (a, c)) in y.iter().zip(&cpu).enumerate() {
                        assert_eq!(
                            a.to_bits(),
                            c.to_bits(),
                            "case {i} scale {scale} inverse {inverse}, element {j}: {a} vs {c}"
                        );
                    }
                    // ember_rope_bf16: x in bf16, the CPU op's rotation of its widened values
                    // (as cpu_fwd computes on a bf16 tensor), each output rounded once.
                    let x16: Vec<u16> = x.iter().map(|&v| half::bf16::from_f32(v).to_bits()).collect();
                    let wide: Vec<f32> = x16.iter().map(|&h| f32::from_bits((h as u32) << 16)).collect();
                    let want: Vec<u16> = op
                        .run(&wide, t, width)
                        .into_iter()
                        .map(|v| half::bf16::from_f32(v).to_bits())
                        .collect();
                    let mut y16 = vec![u16::MAX; x.len()];
                    mirror!(ember_mirror_rope_bf16, x16, y16);
                    assert_eq!(y16, want, "case {i} scale {scale} inverse {inverse}: bf16");
                }
            }
        }
    }
}
