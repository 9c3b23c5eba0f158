//! Ember's PTX modules and the helpers every `cuda_fwd` uses: loading a kernel, a launch
//! geometry, and views of candle's CUDA storage. Kernels run on candle's stream for the device,
//! so they are ordered with candle's own ops and need no synchronisation.

use candle_core::cuda::cudarc::driver::{CudaSlice, CudaView, DeviceRepr, LaunchConfig};
use candle_core::cuda::{CudaDType, CudaDevice, CudaStorage};
use candle_core::op::BackpropOp;
use candle_core::{bail, Layout, Result, Shape, Storage, Tensor};

pub(crate) use candle_core::cuda::cudarc::driver::PushKernelArg;
pub(crate) use candle_core::cuda::WrapErr;

/// One compiled `cuda/NAME.cu`.
pub(crate) struct Module {
    pub(crate) name: &'static str,
    pub(crate) ptx: &'static str,
}

macro_rules! module {
    ($id:ident, $file:literal) => {
        pub(crate) const $id: Module = Module {
            name: concat!("ember-", $file),
            ptx: include_str!(concat!(env!("OUT_DIR"), "/", $file, ".ptx")),
        };
    };
}
module!(DROPOUT, "dropout");
module!(OPTIMIZER, "optimizer");
module!(SOFTMAX, "softmax");
module!(ATTENTION, "attention");
module!(NORM, "norm");
module!(CROSS_ENTROPY, "cross_entropy");
module!(ACTIVATION, "activation");
module!(ROPE, "rope");

/// An element type of the kernels' activations: f32, or bf16 (widened as it is read, computed
/// in f32 and rounded once as it is written; `ember_load`/`ember_store` in `cuda/common.cuh`).
pub(crate) trait Element: CudaDType + DeviceRepr {
    /// The type's part of a kernel's name (`f32`, `bf16`).
    const NAME: &'static str;
}
impl Element for f32 {
    const NAME: &'static str = "f32";
}
impl Element for half::bf16 {
    const NAME: &'static str = "bf16";
}

/// The kernel `base` for activations of the element types `types`, in the order of its name:
/// `base` itself when all are f32 (no allocation on the f32 path), else `base_T1_T2…`
/// (`ember_norm_fwd_f32_bf16`).
pub(crate) fn kernel_name(base: &'static str, types: &[&str]) -> std::borrow::Cow<'static, str> {
    if types.iter().all(|&t| t == "f32") {
        return base.into();
    }
    let mut name = base.to_owned();
    for t in types {
        name.push('_');
        name.push_str(t);
    }
    name.into()
}

/// Runs `$body` with the type alias `$T` bound to the element type of `$dtype` (f32 or bf16),
/// or fails naming the dtype.
macro_rules! with_element {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            candle_core::DType::F32 => {
                type $T = f32;
                $body
            }
            candle_core::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            other => candle_core::bail!("ember CUDA kernels: {other:?} elements (f32 and bf16 only)"),
        }
    };
}
pub(crate) use with_element;

/// Launches kernel `$name` (a `&str`) of module `$module` on `$dev`'s stream with geometry `$cfg` and the
/// arguments after the `;`, each a reference (`&mut` for what the kernel writes), in the order of
/// the kernel's parameters. The module is loaded once per device. Evaluates to `Result<()>`.
macro_rules! launch {
    ($dev:expr, $module:expr, $name:expr, $cfg:expr; $($arg:expr),* $(,)?) => {{
        use $crate::cuda::device::{PushKernelArg as _, WrapErr as _};
        let module = &$module;
        let func = $dev.get_or_load_custom_func(&$name, module.name, module.ptx)?;
        let mut builder = func.builder();
        // Each argument is bound first: the builder keeps pointers to them until the launch.
        $( let arg = $arg; builder.arg(arg); )*
        // SAFETY: the arguments match the kernel's parameters in number, order and type (see
        // the kernel's .cu file), and every buffer holds the elements the kernel indexes.
        unsafe { builder.launch($cfg) }.w().map(|_| ())
    }};
}
pub(crate) use launch;

/// Threads per block of the elementwise kernels.
const BLOCK: u32 = 256;
/// At most this many blocks: the kernels loop over their elements with a grid stride, so a
/// fixed grid that fills the GPU several times over serves every size.
const MAX_BLOCKS: usize = 4096;

/// The geometry of an elementwise kernel over `n` elements (a grid-stride loop).
pub(crate) fn elementwise(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(BLOCK as usize).clamp(1, MAX_BLOCKS) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One block of `threads` per row, `rows` of them.
pub(crate) fn per_row(rows: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.max(1) as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The f32 elements of a contiguous CUDA storage.
pub(crate) fn view<'a>(s: &'a CudaStorage, l: &Layout) -> Result<CudaView<'a, f32>> {
    view_of::<f32>(s, l)
}

/// The `T` elements of a contiguous CUDA storage (an error unless it holds `T`).
pub(crate) fn view_of<'a, T: Element>(s: &'a CudaStorage, l: &Layout) -> Result<CudaView<'a, T>> {
    let Some((a, b)) = l.contiguous_offsets() else {
        bail!("ember CUDA kernels: expected a contiguous tensor");
    };
    Ok(s.as_cuda_slice::<T>()?.slice(a..b))
}

/// Uninitialised device memory for `n` f32 (the kernel writes every element).
pub(crate) fn alloc(dev: &CudaDevice, n: usize) -> Result<CudaSlice<f32>> {
    alloc_of::<f32>(dev, n)
}

/// Uninitialised device memory for `n` elements of `T` (the kernel writes every element).
pub(crate) fn alloc_of<T: Element>(dev: &CudaDevice, n: usize) -> Result<CudaSlice<T>> {
    // SAFETY: every kernel that fills such a buffer writes each of its elements.
    unsafe { dev.alloc::<T>(n.max(1)) }
}

/// `y` as candle storage.
pub(crate) fn storage<T: Element>(y: CudaSlice<T>, dev: &CudaDevice) -> CudaStorage {
    CudaStorage::wrap_cuda_slice(y, dev.clone())
}

/// A tensor of `shape` over `y`, outside the autograd graph (what a backward pass returns).
pub(crate) fn tensor<T: Element>(y: CudaSlice<T>, dev: &CudaDevice, shape: &Shape) -> Tensor {
    Tensor::from_storage(
        Storage::Cuda(storage(y, dev)),
        shape.clone(),
        BackpropOp::none(),
        false,
    )
}

/// Runs `f` on the CUDA storage and layout of each of `N` tensors, made contiguous first.
pub(crate) fn with_cuda<const N: usize, R>(
    tensors: [&Tensor; N],
    f: impl FnOnce([(&CudaStorage, &Layout); N]) -> Result<R>,
) -> Result<R> {
    let contiguous = tensors
        .iter()
        .map(|t| t.contiguous())
        .collect::<Result<Vec<_>>>()?;
    let guards: Vec<_> = contiguous.iter().map(|t| t.storage_and_layout()).collect();
    let mut parts = Vec::with_capacity(N);
    for (s, l) in &guards {
        match &**s {
            Storage::Cuda(c) => parts.push((c, *l)),
            _ => bail!("ember CUDA kernels: expected a CUDA tensor"),
        }
    }
    let parts: [(&CudaStorage, &Layout); N] = match parts.try_into() {
        Ok(p) => p,
        Err(_) => unreachable!("one part per tensor"),
    };
    f(parts)
}

/// Copies the elements of `t` (an f32 CUDA tensor of the slice's size) into `dst`.
pub(crate) fn copy_into(t: &Tensor, dst: &mut CudaSlice<f32>) -> Result<()> {
    let t = t.to_dtype(candle_core::DType::F32)?;
    with_cuda([&t], |[(s, l)]| {
        let src = view(s, l)?;
        if src.len() > dst.len() {
            bail!(
                "ember CUDA kernels: {} elements do not fit a buffer of {}",
                src.len(),
                dst.len()
            );
        }
        let mut dst = dst.slice_mut(..src.len());
        s.device.cuda_stream().memcpy_dtod(&src, &mut dst).w()
    })
}
