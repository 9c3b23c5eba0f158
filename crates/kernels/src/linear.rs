//! The linear map `x·Wᵀ`, forward and backward through Ember's GEMM.
//!
//! x may have any number of leading dimensions: they are folded into the rows of one product
//! inside the op, so the model needs no reshape (and its autograd node) around each projection.
//!
//! Five projections come with what follows them in the model, as one op each:
//! [`linear_gelu`] (a feed-forward block's up-projection and its activation), [`linear_rope`]
//! (a query or key projection and its rotary rotation), [`linear_scaled`] (an unrotated query
//! projection and its logit scale) and [`linear_residual`] (a branch's output projection, its
//! dropout and the residual add) and [`linear_bias`](crate::linear_bias) (a projection and its
//! bias, and with [`linear_bias_relu`](crate::linear_bias_relu) the ReLU after them). candle's
//! backward pass zero-fills a gradient buffer for every node of the graph and adds the node's
//! gradient into it; each fusion removes an activation-sized node, and with it that buffer, the
//! add, and a pass over the activation in each direction.
//!
//! Each op comes in a [`Precision`] (`*_in`; the plain names are f32): in bf16 the forward
//! product and both backward ones (dx = g·W, dW = gᵀ·x) take bf16 operands with f32 sums, and
//! the epilogues stay f32. The unfused reference of a bf16 op is the f32 composition of its
//! operands rounded by [`Precision::round`].
//!
//! On the CPU x may be an f32 or a bf16 activation; the output is in x's dtype, and so is dx
//! (the residual op's output is in its stream's). On bf16 x an op gives the bits of the f32 op
//! on x widened, its output and dx rounded once: x is rounded for the product anyway, so a bf16
//! x costs the forward pass nothing and halves what the backward pass holds. (The model's
//! tensors stay f32 on the CPU: candle's bf16 gradient adds cost more than that saves there,
//! docs/performance.md; on CUDA with every kernel on its branches are bf16,
//! [`Precision::branch_dtype`].
//! Inside the fused sub-blocks, which hold their activations themselves, what feeds only
//! products is kept rounded instead: [`project_kept`], [`project_grads_kept`].)

use std::borrow::Cow;

use candle_core::{CpuStorage, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor};

use crate::activation::GeluSlope;
use crate::cuda::{takes, takes_param, Kernel};
use crate::dropout::{add_dropout, add_dropped, dropout, dropout_apply, DropoutOp};
use crate::gemm::{product_from, product_in, AFrom, Activation, BFrom, Mat, SharedB};
use crate::host::{
    cpu_slice, cpu_storage_as, cpu_tensor, cpu_tensor_as, cpu_values, is_host, is_host_f32, with_data,
};
use crate::rope::{check_heads, rope_unfused, PositionScale, RopeOp, RopeTables};
use crate::simd::scaled;
use crate::Precision;

/// The output shape of `x·Wᵀ`: x's with its last dimension replaced by W's rows.
pub(crate) fn output_shape(x: &Shape, out_dim: usize) -> Shape {
    let mut dims = x.dims().to_vec();
    if let Some(last) = dims.last_mut() {
        *last = out_dim;
    }
    Shape::from(dims)
}

/// `x·Wᵀ` for x (…, in) and a weight (out, in), from candle's matmul.
pub fn linear_unfused(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    linear_unfused_in(x, w, Precision::F32)
}

/// [`linear_unfused`] with its product in `precision` ([`Precision::matmul`]: cuBLAS's bf16
/// GEMM on CUDA), x first cast to the weight's dtype: the product in the weight's dtype, for the
/// compositions that go on from it (a scale, GELU, a rotation, the loss) in that dtype.
pub(crate) fn linear_unfused_in(x: &Tensor, w: &Tensor, precision: Precision) -> Result<Tensor> {
    product_rows(&like_weight(x, w)?, w, precision)
}

/// x·Wᵀ in `precision` on x as it is given, in [`Precision::matmul`]'s output dtype (x's).
fn product_rows(x: &Tensor, w: &Tensor, precision: Precision) -> Result<Tensor> {
    let (out_dim, in_dim) = w.dims2()?;
    let rows = x.elem_count() / in_dim.max(1);
    precision
        .matmul_t(&x.reshape((rows, in_dim))?, w)?
        .reshape(output_shape(x.shape(), out_dim))
}

/// `x·Wᵀ` for x (…, in) and a weight (out, in) through the crate's GEMM on CPU f32, forward and
/// backward (dx = g·W, dW = gᵀ·x) without materialising a transpose. Falls back to
/// [`linear_unfused`] elsewhere.
pub fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    linear_in(x, w, Precision::F32)
}

/// [`linear`] with its products in `precision` (the unfused fallback on its rounded operands).
pub fn linear_in(x: &Tensor, w: &Tensor, precision: Precision) -> Result<Tensor> {
    check_fit("linear", x, w)?;
    if !fused(x, w) {
        return product_rows(&product_input(x, w, precision)?, w, precision)?.to_dtype(x.dtype());
    }
    project_op(x, w, Plain, precision)
}

/// Whether x·Wᵀ takes the fused op: an f32 or bf16 x and an f32 weight on the CPU.
fn fused(x: &Tensor, w: &Tensor) -> bool {
    is_host(x) && is_host_f32(w)
}

/// x in the weight's dtype, for the unfused compositions (a no-op when it is already).
fn like_weight(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    x.to_dtype(w.dtype())
}

/// x as a plain unfused product ([`linear_in`]'s) reads it: [`like_weight`], but a bf16 x under
/// bf16 products on CUDA as it is, which cuBLAS reads directly (its output then bf16 too):
/// widened, it would be rounded straight back, the copies kept alive for the backward pass.
fn product_input(x: &Tensor, w: &Tensor, precision: Precision) -> Result<Tensor> {
    if precision == Precision::Bf16 && x.device().is_cuda() && x.dtype() == DType::BF16 {
        return Ok(x.clone());
    }
    like_weight(x, w)
}

/// x widened to f32 for a product in `precision` whose output an f32 kernel takes next, unless
/// the products are bf16 (cuBLAS rounds the product to bf16 whatever x is: a bf16 x stays).
pub(crate) fn wide_unless_bf16(x: &Tensor, precision: Precision) -> Result<Tensor> {
    match precision {
        Precision::Bf16 => Ok(x.clone()),
        Precision::F32 => x.to_dtype(DType::F32),
    }
}

/// x·Wᵀ and `epilogue` as one op on CPU tensors, its products in `precision` (refused,
/// naming the CPU feature, where this CPU cannot run them), its output in x's dtype.
fn project_op<E: Epilogue + 'static>(
    x: &Tensor,
    w: &Tensor,
    epilogue: E,
    precision: Precision,
) -> Result<Tensor> {
    precision.check_cpu()?;
    x.contiguous()?.apply_op2(
        &w.contiguous()?,
        ProjectionOp {
            epilogue,
            precision,
            out: x.dtype(),
        },
    )
}

/// An error unless x's last dimension is the weight's input dimension.
pub(crate) fn check_fit(op: &str, x: &Tensor, w: &Tensor) -> Result<()> {
    let (_, w_in) = w.dims2()?;
    if x.dims().last() != Some(&w_in) {
        candle_core::bail!(
            "{op}: input {:?} does not fit a weight {:?}",
            x.shape(),
            w.shape()
        );
    }
    Ok(())
}

/// (rows, in, out) of x·Wᵀ, from the shapes of x (…, in) and W (out × in).
pub(crate) fn dims(x: &Shape, w: &Shape) -> Result<(usize, usize, usize)> {
    let (out_dim, in_dim) = w.dims2()?;
    Ok((x.elem_count() / in_dim.max(1), in_dim, out_dim))
}

/// x·Wᵀ of contiguous x (rows × in) and W (out × in).
pub(crate) fn project(
    x: &[f32],
    w: &[f32],
    (rows, in_dim, out_dim): (usize, usize, usize),
    precision: Precision,
) -> Vec<f32> {
    product_in(
        precision,
        rows,
        in_dim,
        out_dim,
        Mat::rows(x, in_dim),
        Mat::rows(w, in_dim).t(),
    )
}

/// dx = g·W and dW = gᵀ·x of x·Wᵀ for contiguous x (rows × in), W (out × in) and the gradient
/// g (rows × out) of the product. In bf16, g is rounded once for both products.
pub(crate) fn project_grads(
    x: &[f32],
    w: &[f32],
    g: &[f32],
    (rows, in_dim, out_dim): (usize, usize, usize),
    precision: Precision,
) -> (Vec<f32>, Vec<f32>) {
    match precision {
        Precision::F32 => {
            let dx = product_in(
                precision,
                rows,
                out_dim,
                in_dim,
                Mat::rows(g, out_dim),
                Mat::rows(w, in_dim),
            );
            let dw = product_in(
                precision,
                out_dim,
                rows,
                in_dim,
                Mat::rows(g, out_dim).t(),
                Mat::rows(x, in_dim),
            );
            (dx, dw)
        }
        Precision::Bf16 => grads_from(BFrom::View(Mat::rows(x, in_dim)), w, g, (rows, in_dim, out_dim)),
    }
}

/// x·Wᵀ for x kept as an [`Activation`] (rows × in) and W (out × in), in x's precision.
pub(crate) fn project_kept(
    x: &Activation,
    w: &[f32],
    (rows, in_dim, out_dim): (usize, usize, usize),
) -> Vec<f32> {
    let w_t = BFrom::View(Mat::rows(w, in_dim).t());
    product_from(rows, in_dim, out_dim, AFrom::Rows(x), w_t)
}

/// [`project_grads`] for x kept as an [`Activation`], in x's precision (x packed as dW's B
/// for this one projection).
pub(crate) fn project_grads_kept(
    x: &Activation,
    w: &[f32],
    g: &[f32],
    dims: (usize, usize, usize),
) -> (Vec<f32>, Vec<f32>) {
    project_grads_shared(&SharedB::new(x), w, g, dims)
}

/// [`project_grads`] for an x that several projections read, as [`SharedB`] packed it once for
/// their dW products.
pub(crate) fn project_grads_shared(
    x: &SharedB,
    w: &[f32],
    g: &[f32],
    dims: (usize, usize, usize),
) -> (Vec<f32>, Vec<f32>) {
    match x {
        SharedB::F32(x) => project_grads(x, w, g, dims, Precision::F32),
        #[cfg(target_arch = "x86_64")]
        SharedB::Packed(x) => grads_from(BFrom::Packed(x), w, g, dims),
        SharedB::Kept(x) => grads_from(BFrom::Rows(x), w, g, dims),
    }
}

/// [`project_grads_kept`] for a gradient kept as an [`Activation`] as well (made rounded, in
/// bf16: GELU's backward pass rounds it as it makes it).
pub(crate) fn project_grads_of(
    x: &Activation,
    w: &[f32],
    g: &Activation,
    dims: (usize, usize, usize),
) -> (Vec<f32>, Vec<f32>) {
    match (x, g) {
        (Activation::F32(x), Activation::F32(g)) => project_grads(x, w, g, dims, Precision::F32),
        #[allow(unreachable_patterns)]
        _ => grads_of(BFrom::Rows(x), w, g, dims),
    }
}

/// The bf16 [`project_grads`] for dW's B = x as given: g rounded once, read in rows by dx = g·W
/// and transposed by dW = gᵀ·x.
fn grads_from(x: BFrom<'_>, w: &[f32], g: &[f32], dims: (usize, usize, usize)) -> (Vec<f32>, Vec<f32>) {
    let (rows, _, out_dim) = dims;
    grads_of(x, w, &Activation::rounded(rows, out_dim, g), dims)
}

/// [`grads_from`] for g already rounded.
fn grads_of(
    x: BFrom<'_>,
    w: &[f32],
    g: &Activation,
    (rows, in_dim, out_dim): (usize, usize, usize),
) -> (Vec<f32>, Vec<f32>) {
    let dx = product_from(
        rows,
        out_dim,
        in_dim,
        AFrom::Rows(g),
        BFrom::View(Mat::rows(w, in_dim)),
    );
    let dw = product_from(out_dim, rows, in_dim, AFrom::Transposed(g), x);
    (dx, dw)
}

/// What a projection op does with x·Wᵀ before handing it on, and with the gradient on the way
/// back: nothing ([`Plain`]), GELU ([`Gelu`]), a constant factor ([`Scale`]) or the rotary
/// rotation ([`Rotate`]). The op runs the product and its epilogue in one node of the graph.
pub(crate) trait Epilogue: Send + Sync {
    const NAME: &'static str;
    /// The op's output from the product `p` of an input of shape `x`.
    fn forward(&self, p: Vec<f32>, x: &Shape, out_dim: usize) -> Result<Vec<f32>>;
    /// The gradient at the product from the gradient `g` at the output; `p()` recomputes the
    /// product where the epilogue needs it.
    fn backward<'g>(
        &self,
        g: &'g [f32],
        x: &Shape,
        out_dim: usize,
        p: impl FnOnce() -> Vec<f32>,
    ) -> Result<Cow<'g, [f32]>>;
}

/// The product itself.
pub(crate) struct Plain;

impl Epilogue for Plain {
    const NAME: &'static str = "ember-linear";
    fn forward(&self, p: Vec<f32>, _x: &Shape, _out_dim: usize) -> Result<Vec<f32>> {
        Ok(p)
    }
    fn backward<'g>(
        &self,
        g: &'g [f32],
        _: &Shape,
        _: usize,
        _: impl FnOnce() -> Vec<f32>,
    ) -> Result<Cow<'g, [f32]>> {
        Ok(Cow::Borrowed(g))
    }
}

/// GELU of the product, keeping its derivative for the backward pass.
struct Gelu(GeluSlope);

impl Epilogue for Gelu {
    const NAME: &'static str = "ember-linear-gelu";
    fn forward(&self, p: Vec<f32>, _x: &Shape, _out_dim: usize) -> Result<Vec<f32>> {
        Ok(self.0.forward(&p))
    }
    fn backward<'g>(
        &self,
        g: &'g [f32],
        _: &Shape,
        _: usize,
        p: impl FnOnce() -> Vec<f32>,
    ) -> Result<Cow<'g, [f32]>> {
        Ok(Cow::Owned(self.0.backward(g, || Ok(Cow::Owned(p())))?))
    }
}

/// The product times a constant, as candle's `affine(scale, 0)` computes it.
pub(crate) struct Scale(pub(crate) f32);

impl Epilogue for Scale {
    const NAME: &'static str = "ember-linear-scaled";
    fn forward(&self, p: Vec<f32>, _x: &Shape, _out_dim: usize) -> Result<Vec<f32>> {
        Ok(scaled(&p, self.0))
    }
    /// The same factor: candle's affine backward is `g·scale + 0` too.
    fn backward<'g>(
        &self,
        g: &'g [f32],
        _: &Shape,
        _: usize,
        _: impl FnOnce() -> Vec<f32>,
    ) -> Result<Cow<'g, [f32]>> {
        Ok(Cow::Owned(scaled(g, self.0)))
    }
}

/// The product rotated (and scaled) per position; x is (B, T, in).
pub(crate) struct Rotate(pub(crate) RopeOp);

impl Epilogue for Rotate {
    const NAME: &'static str = "ember-linear-rope";
    fn forward(&self, p: Vec<f32>, x: &Shape, out_dim: usize) -> Result<Vec<f32>> {
        Ok(self.0.run(&p, x.dims3()?.1, out_dim))
    }
    /// The transposed rotation.
    fn backward<'g>(
        &self,
        g: &'g [f32],
        x: &Shape,
        out_dim: usize,
        _: impl FnOnce() -> Vec<f32>,
    ) -> Result<Cow<'g, [f32]>> {
        Ok(Cow::Owned(self.0.transpose().run(g, x.dims3()?.1, out_dim)))
    }
}

/// x·Wᵀ and its epilogue as one op, the products in a precision.
struct ProjectionOp<E> {
    epilogue: E,
    precision: Precision,
    /// The output's dtype: x's.
    out: DType,
}

impl<E: Epilogue> CustomOp2 for ProjectionOp<E> {
    fn name(&self) -> &'static str {
        E::NAME
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let dims = dims(l1.shape(), l2.shape())?;
        let p = project(&cpu_values(s1, l1)?, cpu_slice(s2, l2)?, dims, self.precision);
        let y = self.epilogue.forward(p, l1.shape(), dims.2)?;
        Ok((cpu_storage_as(y, self.out)?, output_shape(l1.shape(), dims.2)))
    }
    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let dims = dims(x.shape(), w.shape())?;
        let precision = self.precision;
        let (dx, dw) = with_data([x, w, g], |[xs, ws, gs]| {
            let recompute = || project(xs, ws, dims, precision);
            let g_product = self.epilogue.backward(gs, x.shape(), dims.2, recompute)?;
            Ok(project_grads(xs, ws, &g_product, dims, precision))
        })?;
        Ok((
            Some(cpu_tensor_as(dx, x.shape(), x.dtype())?),
            Some(cpu_tensor(dw, w.shape())?),
        ))
    }
}

/// `gelu_erf(x·Wᵀ)` from candle's ops.
pub fn linear_gelu_unfused(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    linear_unfused(x, w)?.gelu_erf()
}

/// `gelu_erf(x·Wᵀ)` for x (…, in) and a weight (out, in): [`linear`] and
/// [`gelu_erf`](crate::gelu_erf) as one op on CPU f32, with the same bits; the GELU keeps its
/// derivative for the backward pass as the standalone op does (in f32). On CUDA with the activation
/// kernel switched on and an f32 weight, [`linear`] (cuBLAS) then the GELU kernel, on x widened
/// to f32 if it is a bf16 activation under f32 products (with the `bf16` kernels on too; the
/// output rounded back once; under bf16 products cuBLAS's bf16 product itself, through the
/// kernel's bf16 variant, the same bits); [`linear_gelu_unfused`] elsewhere.
pub fn linear_gelu(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    linear_gelu_in(x, w, Precision::F32)
}

/// [`linear_gelu`] with its products in `precision`; under bf16 the derivative GELU keeps is
/// rounded to bf16, as [`gelu_erf_in`](crate::gelu_erf_in) keeps it.
pub fn linear_gelu_in(x: &Tensor, w: &Tensor, precision: Precision) -> Result<Tensor> {
    check_fit("linear_gelu", x, w)?;
    if takes(x, Kernel::Activation) && takes_param(w, Kernel::Activation) {
        // A bf16 x (the `bf16` kernels on) under f32 products is widened first and GELU's
        // output rounded once, not its input as well; under bf16 products cuBLAS rounds the
        // product to bf16 itself (the precision's contract), so the GELU kernel's bf16 variant
        // reads it as it is, with the same bits. An f32 x passes through the casts untouched.
        let y = crate::activation::gelu_erf(&linear_in(&wide_unless_bf16(x, precision)?, w, precision)?)?;
        return y.to_dtype(x.dtype());
    }
    if !fused(x, w) {
        return linear_unfused_in(x, w, precision)?
            .gelu_erf()?
            .to_dtype(x.dtype());
    }
    let gelu = Gelu(GeluSlope::new(x.track_op() || w.track_op(), precision));
    project_op(x, w, gelu, precision)
}

/// `scale · (x·Wᵀ)` from candle's ops (every device and dtype).
pub fn linear_scaled_unfused(x: &Tensor, w: &Tensor, scale: f64) -> Result<Tensor> {
    linear_unfused(x, w)?.affine(scale, 0.0)
}

/// `scale · (x·Wᵀ)` for x (…, in) and a weight (out, in): a projection and a constant factor
/// (cross-attention's queries and their 1/√d) as one op on CPU f32, with the bits of
/// [`linear`] then candle's `affine`; [`linear_scaled_unfused`] elsewhere. Saves the factor's
/// own pass each way and its autograd edge.
pub fn linear_scaled(x: &Tensor, w: &Tensor, scale: f64) -> Result<Tensor> {
    linear_scaled_in(x, w, scale, Precision::F32)
}

/// [`linear_scaled`] with its products in `precision`.
pub fn linear_scaled_in(x: &Tensor, w: &Tensor, scale: f64, precision: Precision) -> Result<Tensor> {
    check_fit("linear_scaled", x, w)?;
    if !fused(x, w) {
        let out = linear_unfused_in(x, w, precision)?.affine(scale, 0.0)?;
        return out.to_dtype(x.dtype());
    }
    project_op(x, w, Scale(scale as f32), precision)
}

/// `scale · rotated(x·Wᵀ)` from candle's ops (every device and dtype).
pub fn linear_rope_unfused(
    x: &Tensor,
    w: &Tensor,
    tables: &RopeTables,
    offset: usize,
    scale: impl Into<PositionScale>,
) -> Result<Tensor> {
    linear_rope_unfused_in(x, w, tables, offset, scale.into(), Precision::F32)
}

/// [`linear_rope_unfused`] with its product in `precision` ([`linear_unfused_in`]).
fn linear_rope_unfused_in(
    x: &Tensor,
    w: &Tensor,
    tables: &RopeTables,
    offset: usize,
    scale: PositionScale,
    precision: Precision,
) -> Result<Tensor> {
    let rotated = rope_unfused(&linear_unfused_in(x, w, precision)?, tables, offset)?;
    scale.apply_unfused(&rotated, offset)
}

/// `scale · rotated(x·Wᵀ)` for x (B, T, in) whose first position is `offset` and a weight
/// (out, in) of whole heads: a query or key projection and its rotation as one op on CPU f32,
/// with the bits of [`linear`] then [`rope`](crate::rope). On CUDA with the rope kernel
/// switched on (an f32 weight, and f32 tables on the same device), [`linear`] (cuBLAS) then the
/// rope kernel, on x widened to f32 if it is a bf16 activation under f32 products (with the
/// `bf16` kernels on too; the output rounded back once; under bf16 products cuBLAS's bf16
/// product itself, through the kernel's bf16 variant, the same bits);
/// [`linear_rope_unfused`] elsewhere.
pub fn linear_rope(
    x: &Tensor,
    w: &Tensor,
    tables: &RopeTables,
    offset: usize,
    scale: impl Into<PositionScale>,
) -> Result<Tensor> {
    linear_rope_in(x, w, tables, offset, scale, Precision::F32)
}

/// [`linear_rope`] with its products in `precision`.
pub fn linear_rope_in(
    x: &Tensor,
    w: &Tensor,
    tables: &RopeTables,
    offset: usize,
    scale: impl Into<PositionScale>,
    precision: Precision,
) -> Result<Tensor> {
    check_fit("linear_rope", x, w)?;
    let (_, t, _) = x.dims3()?;
    check_heads(tables, w.dims2()?.0)?;
    let cuda = takes(x, Kernel::Rope) && takes_param(w, Kernel::Rope);
    if cuda && tables.on_device_of(x) && tables.covers(offset, t) {
        // As in linear_gelu_in: a bf16 x widened under f32 products, one rounding of the
        // rotated output.
        let projected = linear_in(&wide_unless_bf16(x, precision)?, w, precision)?;
        return crate::rope::rope(&projected, tables, offset, scale)?.to_dtype(x.dtype());
    }
    if !(fused(x, w) && tables.covers(offset, t)) {
        let out = linear_rope_unfused_in(x, w, tables, offset, scale.into(), precision)?;
        return out.to_dtype(x.dtype());
    }
    let rotate = Rotate(RopeOp::new(tables, offset, scale.into()));
    project_op(x, w, rotate, precision)
}

/// `x + dropout(h·Wᵀ)` from the ops one by one (every device and dtype).
pub fn linear_residual_unfused(x: &Tensor, h: &Tensor, w: &Tensor, p: f64, state: u64) -> Result<Tensor> {
    x + dropout(&linear(h, w)?, p, state)?
}

/// `x + dropout(h·Wᵀ)`, a residual connection whose branch ends in the projection
/// h (…, in) · W (out, in)ᵀ, with the dropout mask of [`dropout`] (`p ≤ 0`: no dropout) — one
/// op on CPU f32 with the bits of the ops one by one, [`linear_residual_unfused`] elsewhere.
pub fn linear_residual(x: &Tensor, h: &Tensor, w: &Tensor, p: f64, state: u64) -> Result<Tensor> {
    linear_residual_in(x, h, w, p, state, Precision::F32)
}

/// [`linear_residual`] with its products in `precision`.
pub fn linear_residual_in(
    x: &Tensor,
    h: &Tensor,
    w: &Tensor,
    p: f64,
    state: u64,
    precision: Precision,
) -> Result<Tensor> {
    check_fit("linear_residual", h, w)?;
    let (out_dim, _) = w.dims2()?;
    if x.shape() != &output_shape(h.shape(), out_dim) {
        candle_core::bail!(
            "linear_residual: the residual {:?} does not fit the projection of {:?} by {:?}",
            x.shape(),
            h.shape(),
            w.shape()
        );
    }
    if !(is_host_f32(x) && fused(h, w)) {
        // In the stream's dtype (a bf16 branch's product under bf16 products widened, exact).
        let y = linear_in(&product_input(h, w, precision)?, w, precision)?.to_dtype(x.dtype())?;
        if p > 0.0 && takes(x, Kernel::Dropout) {
            // The product is cuBLAS's; the mask and the add one pass of Ember's.
            return add_dropout(x, &y, p, state);
        }
        return x + dropout(&y, p, state)?;
    }
    precision.check_cpu()?;
    x.contiguous()?.apply_op3(
        &h.contiguous()?,
        &w.contiguous()?,
        LinearResidualOp {
            dropout: DropoutOp::new(p, state),
            precision,
        },
    )
}

/// The op of [`linear_residual`]; `dropout` `None`: no dropout.
struct LinearResidualOp {
    dropout: Option<DropoutOp>,
    precision: Precision,
}

impl CustomOp3 for LinearResidualOp {
    fn name(&self) -> &'static str {
        "ember-linear-residual"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let branch = project(
            &cpu_values(s2, l2)?,
            cpu_slice(s3, l3)?,
            dims(l2.shape(), l3.shape())?,
            self.precision,
        );
        let out = add_dropped(self.dropout, cpu_slice(s1, l1)?, &branch);
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
    fn bwd(
        &self,
        _x: &Tensor,
        h: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let dims = dims(h.shape(), w.shape())?;
        let (dh, dw) = with_data([h, w, g], |[hs, ws, gs]| {
            Ok(match self.dropout {
                Some(mask) => project_grads(hs, ws, &dropout_apply(mask, gs), dims, self.precision),
                None => project_grads(hs, ws, gs, dims, self.precision),
            })
        })?;
        Ok((
            Some(g.clone()),
            Some(cpu_tensor_as(dh, h.shape(), h.dtype())?),
            Some(cpu_tensor(dw, w.shape())?),
        ))
    }
}
