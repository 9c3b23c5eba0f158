//! The precision of the matrix products, chosen by the caller of each op: f32 throughout, or
//! bf16 operands with f32 sums (mixed precision, `train.precision: bf16`).
//!
//! Only the products change, and what the fused sub-blocks keep for their backward pass (the
//! feed-forward activation's values, attention's q, k and v: `held`). Everything
//! else an op computes — norm statistics, softmax, the loss, every elementwise op — stays f32,
//! and so do its inputs and outputs (but for a model whose branches keep bf16 activations,
//! [`Precision::branch_dtype`]). SwiGLU reads its two projections rounded to bf16, as cuBLAS's
//! bf16 products hand them on; on the CPU it keeps those bf16 values for the backward pass in
//! 16 bits, and GELU keeps its derivative rounded to bf16 (`held`; CUDA's GELU recomputes its
//! derivative in f32). On the CPU the operands are rounded
//! to bf16 as the product packs them ([`crate::gemm`]'s `bf16` module); on CUDA the
//! projections' products are cuBLAS's bf16 GEMMs, which also round their outputs
//! ([`Precision::matmul`]), and attention's fused kernel rounds its operands as the CPU does.

use candle_core::{DType, Device, Result, Tensor};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What a product's operands are rounded to before they are multiplied; the sums are f32
/// either way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// f32 operands: every bit as before mixed precision existed.
    #[default]
    F32,
    /// bf16 operands (8 bits of mantissa), f32 sums: on the CPU AVX512_BF16's `vdpbf16ps`, or
    /// AMX's `tdpbf16ps` where the CPU has it.
    Bf16,
}

impl Precision {
    /// The precisions this process can run the products in on the CPU (f32 always; bf16 where
    /// [`missing_cpu_feature`](Self::missing_cpu_feature) names nothing).
    pub fn on_this_cpu() -> Vec<Precision> {
        [Precision::F32, Precision::Bf16]
            .into_iter()
            .filter(|p| p.missing_cpu_feature().is_none())
            .collect()
    }

    /// `f32` or `bf16`, as the config spells it.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
        }
    }

    /// What this process lacks to run these products on the CPU, as a clause naming the
    /// feature (`AVX512_BF16, which this CPU does not have …`), or `None` when it can. bf16
    /// needs AVX512_BF16 with the AVX-512 unit in use (`EMBER_CPU_VECTOR_UNIT=avx2` turns it off
    /// as it turns off the rest of AVX-512), or the emulation asked for ([`crate::BF16_ENV`]).
    pub fn missing_cpu_feature(self) -> Option<String> {
        if self == Precision::F32 || crate::gemm::bf16_supported() || crate::gemm::bf16_emulated() {
            return None;
        }
        let unit = crate::vector_unit();
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx512bf16") {
            return Some(format!(
                "AVX512_BF16, which {}={} turns off on this CPU (its kernels run on {unit})",
                crate::VECTOR_UNIT_ENV,
                std::env::var(crate::VECTOR_UNIT_ENV).unwrap_or_default()
            ));
        }
        Some(format!(
            "AVX512_BF16, which this CPU does not have (its kernels run on {unit})"
        ))
    }

    /// An error naming the missing CPU feature unless this CPU runs these products: the ops
    /// refuse rather than compute in another precision or emulate it slowly unasked.
    pub(crate) fn check_cpu(self) -> Result<()> {
        match self.missing_cpu_feature() {
            None => Ok(()),
            Some(missing) => candle_core::bail!("{self} products need {missing}"),
        }
    }

    /// `x` with its values rounded as this precision rounds a product's operands: unchanged
    /// for f32; to bf16 and back for bf16 (candle's casts, differentiable: the gradient passes
    /// through, itself rounded to bf16 by the casts' backward). The unfused references of the
    /// bf16 ops are the f32 compositions of their rounded operands.
    pub fn round(self, x: &Tensor) -> Result<Tensor> {
        match self {
            Precision::F32 => Ok(x.clone()),
            Precision::Bf16 => x.to_dtype(DType::BF16)?.to_dtype(x.dtype()),
        }
    }

    /// `a·b` (candle's matmul, batched) with this precision's products, for the compositions
    /// that run where the fused ops do not. f32: candle's. bf16 on CUDA: cuBLAS's bf16 GEMM
    /// with f32 compute (tensor cores) on the operands cast to bf16, its output rounded to bf16
    /// (as under PyTorch's autocast) and cast back to a's dtype (widened for an f32 a, kept for a
    /// bf16 one); its backward products the same way.
    /// bf16 elsewhere: the f32 product of the rounded operands (the CPU ops' references).
    pub fn matmul(self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        self.matmul_by(a, b, |b| Ok(b.clone()))
    }

    /// `a·bᵀ` as [`matmul`](Self::matmul) computes `a·b`, b cast before it is transposed: a
    /// weight's bf16 copy is then a contiguous cast, and cuBLAS reads the transpose itself.
    pub fn matmul_t(self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        self.matmul_by(a, b, |b| b.t())
    }

    /// `a·view(b)`, with this precision's operands taken before the view.
    fn matmul_by(self, a: &Tensor, b: &Tensor, view: impl Fn(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
        match self {
            Precision::F32 => a.matmul(&view(b)?),
            Precision::Bf16 if a.device().is_cuda() => {
                let b16 = view(&b.to_dtype(DType::BF16)?)?;
                a.to_dtype(DType::BF16)?.matmul(&b16)?.to_dtype(a.dtype())
            }
            Precision::Bf16 => self.round(a)?.matmul(&view(&self.round(b)?)?),
        }
    }

    /// The dtype of the activations inside a pre-norm block's branches (from the norm's output
    /// up to the branch's output projection, which writes the f32 residual stream) on `device`:
    /// bf16 under bf16 products on CUDA with every kernel family switched on, their bf16
    /// variants included (`EMBER_CUDA_KERNELS=all`), so that every op a branch runs reads and
    /// writes them with f32 math (as PyTorch's autocast keeps them); f32 otherwise. Not on the
    /// CPU: candle's own bf16 gradient arithmetic there (zero-fills and adds) made a step
    /// 0.67–0.93× as fast for a few hundred MiB (docs/performance.md). Not yet run on a GPU.
    pub fn branch_dtype(self, device: &Device) -> DType {
        // (A build without the CUDA kernels has no bf16 variants to run them.)
        let every_kernel =
            || cfg!(feature = "cuda") && crate::cuda::Kernel::ALL.into_iter().all(crate::cuda::enabled);
        match self {
            Precision::Bf16 if device.is_cuda() && every_kernel() => DType::BF16,
            _ => DType::F32,
        }
    }

    /// What computes this precision's products on the CPU, for a run's record of the units its
    /// steps were computed with: `AMX` for bf16 on AMX's tiles, else the vector unit
    /// ([`crate::vector_unit`]). The two sum bf16 products in different orders.
    pub fn cpu_unit(self) -> &'static str {
        match self {
            Precision::Bf16 if crate::gemm::bf16_on_amx() => "AMX",
            _ => crate::vector_unit(),
        }
    }

    /// The instructions the CPU's products run on, for reports: e.g. `bf16 products on
    /// AVX512_BF16 (vdpbf16ps), f32 sums`.
    pub fn cpu_products(self) -> String {
        match self {
            Precision::F32 if crate::simd::avx512() => "f32 products on AVX-512 FMA".into(),
            Precision::F32 if crate::gemm::f32_on_avx2() => "f32 products on AVX2 FMA".into(),
            Precision::F32 => format!("f32 products on {} (matrixmultiply)", crate::vector_unit()),
            Precision::Bf16 if crate::gemm::bf16_on_amx() => {
                "bf16 products on AMX-BF16 (tdpbf16ps), f32 sums".into()
            }
            Precision::Bf16 if crate::gemm::bf16_emulated() => {
                "bf16 products emulated in software (vdpbf16ps's bits), f32 sums".into()
            }
            Precision::Bf16 => "bf16 products on AVX512_BF16 (vdpbf16ps), f32 sums".into(),
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
