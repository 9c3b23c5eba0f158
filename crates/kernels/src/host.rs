//! Reading and making the CPU tensors the fused kernels work on.
//!
//! The kernels compute in f32. Activations may also come as bf16: those are widened to f32 as
//! an op reads them (exactly), and an op's bf16 output or gradient is rounded once, as candle's
//! `to_dtype` rounds. So an op on bf16 activations gives the bits of the f32 op between those casts.

use std::borrow::Cow;

use candle_core::backend::BackendStorage as _;
use candle_core::{bail, CpuStorage, DType, Device, Layout, Result, Shape, Storage, Tensor};
use half::bf16;

/// Whether `t` can take a fused CPU path: an f32 tensor on the CPU.
pub(crate) fn is_host_f32(t: &Tensor) -> bool {
    t.device().is_cpu() && t.dtype() == DType::F32
}

/// Whether `t` can be an activation of a fused CPU path: an f32 or bf16 tensor on the CPU.
pub(crate) fn is_host(t: &Tensor) -> bool {
    t.device().is_cpu() && matches!(t.dtype(), DType::F32 | DType::BF16)
}

/// bf16 values widened to f32 (exact: a bf16 is the top half of an f32).
pub(crate) fn widen(v: &[bf16]) -> Vec<f32> {
    v.iter()
        .map(|h| f32::from_bits((h.to_bits() as u32) << 16))
        .collect()
}

/// The values of a contiguous CPU tensor's storage as f32: borrowed when it holds f32, widened
/// when it holds bf16.
pub(crate) fn cpu_values<'a>(s: &'a CpuStorage, l: &Layout) -> Result<Cow<'a, [f32]>> {
    let Some((a, b)) = l.contiguous_offsets() else {
        bail!("ember kernels: expected a contiguous tensor")
    };
    match s {
        CpuStorage::F32(v) => Ok(Cow::Borrowed(&v[a..b])),
        CpuStorage::BF16(v) => Ok(Cow::Owned(widen(&v[a..b]))),
        _ => bail!("ember kernels: expected f32 or bf16 storage"),
    }
}

/// `v` as the storage of an op's output in `dtype`: f32 as it is, bf16 rounded to nearest even
/// (candle's `to_dtype`).
pub(crate) fn cpu_storage_as(v: Vec<f32>, dtype: DType) -> Result<CpuStorage> {
    match dtype {
        DType::F32 => Ok(CpuStorage::F32(v)),
        DType::BF16 => Ok(CpuStorage::BF16(v.into_iter().map(bf16::from_f32).collect())),
        other => bail!("ember kernels: outputs are f32 or bf16, not {other:?}"),
    }
}

/// `v` as the storage of an op's output in the dtype of its input's storage `like` (an
/// elementwise or row op's output is in its input's dtype).
pub(crate) fn cpu_storage_like(v: Vec<f32>, like: &CpuStorage) -> Result<CpuStorage> {
    cpu_storage_as(v, like.dtype())
}

/// A CPU tensor over `v` in `dtype` (rounded as [`cpu_storage_as`] rounds): a gradient in the
/// dtype of what it is the gradient of.
pub(crate) fn cpu_tensor_as(v: Vec<f32>, shape: &Shape, dtype: DType) -> Result<Tensor> {
    match dtype {
        DType::F32 => cpu_tensor(v, shape),
        _ => cpu_tensor(v, shape)?.to_dtype(dtype),
    }
}

/// The f32 elements of a contiguous CPU tensor's storage.
pub(crate) fn cpu_slice<'a>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [f32]> {
    let v = match s {
        CpuStorage::F32(v) => v,
        _ => bail!("ember kernels: expected f32 storage"),
    };
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&v[a..b]),
        None => bail!("ember kernels: expected a contiguous tensor"),
    }
}

/// All f32 elements of a CPU tensor's storage, whatever its layout (the caller indexes it with
/// the layout's strides and offset).
pub(crate) fn cpu_storage(s: &Storage) -> Result<&[f32]> {
    match s {
        Storage::Cpu(CpuStorage::F32(v)) => Ok(v),
        _ => bail!("ember kernels: expected an f32 CPU tensor"),
    }
}

/// Runs `f` on the f32 values of `N` tensors at once (bf16 ones widened), each made contiguous
/// first: a backward pass reads its inputs, its output and the output's gradient together.
pub(crate) fn with_data<const N: usize, R>(
    tensors: [&Tensor; N],
    f: impl FnOnce([&[f32]; N]) -> Result<R>,
) -> Result<R> {
    with_all_data(&tensors, |slices| f(std::array::from_fn(|i| slices[i])))
}

/// [`with_data`] for any number of tensors.
pub(crate) fn with_all_data<R>(tensors: &[&Tensor], f: impl FnOnce(&[&[f32]]) -> Result<R>) -> Result<R> {
    let contiguous = tensors
        .iter()
        .map(|t| t.contiguous())
        .collect::<Result<Vec<_>>>()?;
    let guards: Vec<_> = contiguous.iter().map(|t| t.storage_and_layout()).collect();
    let values = guards
        .iter()
        .map(|(s, l)| match &**s {
            Storage::Cpu(c) => cpu_values(c, l),
            _ => bail!("ember kernels: expected a CPU tensor"),
        })
        .collect::<Result<Vec<_>>>()?;
    let slices: Vec<&[f32]> = values.iter().map(|v| &**v).collect();
    f(&slices)
}

/// A CPU tensor over `v`.
pub(crate) fn cpu_tensor(v: Vec<f32>, shape: &Shape) -> Result<Tensor> {
    Tensor::from_vec(v, shape, &Device::Cpu)
}
