//! Reading and making the f32 CPU tensors the fused kernels work on.

use candle_core::{bail, CpuStorage, DType, Device, Layout, Result, Shape, Storage, Tensor};

/// Whether `t` can take a fused CPU path: an f32 tensor on the CPU.
pub(crate) fn is_host_f32(t: &Tensor) -> bool {
    t.device().is_cpu() && t.dtype() == DType::F32
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

/// Runs `f` on the f32 data of `N` tensors at once, each made contiguous first: a backward
/// pass reads its inputs, its output and the output's gradient together.
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
    let slices = guards
        .iter()
        .map(|(s, l)| match &**s {
            Storage::Cpu(c) => cpu_slice(c, l),
            _ => bail!("ember kernels: expected a CPU tensor"),
        })
        .collect::<Result<Vec<_>>>()?;
    f(&slices)
}

/// A CPU tensor over `v`.
pub(crate) fn cpu_tensor(v: Vec<f32>, shape: &Shape) -> Result<Tensor> {
    Tensor::from_vec(v, shape, &Device::Cpu)
}
