//! The CUDA half of the kernels: which ones a run uses, and (with the `cuda` feature) the
//! compiled modules and the launch helpers the ops' `cuda_fwd` halves share.
//!
//! Each kernel lives in `crates/kernels/cuda/NAME.cu` (compiled to PTX at build time, see
//! `build.rs`), its per-element arithmetic in `cuda/common.cuh`, which the CPU test suite also
//! compiles as plain C++ and compares with the Rust kernels (`mirror`). The op that launches a
//! kernel is the CPU kernel's own custom op: its `cuda_fwd` beside its `cpu_fwd`, in the op's
//! module.
//!
//! **The switch.** A kernel runs only when it is switched on; otherwise a CUDA tensor takes the
//! unfused reference (candle's own ops), as before any kernel was written. The default is the
//! kernels that passed the GPU suite on a real GPU ([`Kernel::VERIFIED`]: today all but the
//! bf16 variants, [`Kernel::Bf16`]);
//! `EMBER_CUDA_KERNELS` overrides it for a process: `all`, `none`, `verified`, or a
//! comma-separated list of names ([`Kernel::name`]). A new kernel family starts outside the
//! verified set. Tests and benchmarks set it in code with [`set_enabled`].

use std::sync::atomic::{AtomicU32, Ordering};

use candle_core::{DType, Tensor};

#[cfg(feature = "cuda")]
pub(crate) mod device;
#[cfg(test)]
mod mirror;

/// A CUDA kernel family that can be switched on or off on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// Dropout alone, on a residual branch, and on attention probabilities: the mask computed
    /// on the device from the SplitMix64 counter, never uploaded or stored.
    Dropout,
    /// The AdamW update of one parameter in one launch, and the gradient's sum of squares, the
    /// clip factor and the non-finite flag on the device.
    Optimizer,
    /// Softmax over the last dimension, forward and backward.
    Softmax,
    /// The attention core softmax(q·kᵀ + mask)·v with its probability dropout and telemetry.
    Attention,
    /// RMSNorm and LayerNorm (the residual stream's and QK-norm's), forward and backward.
    Norm,
    /// Label-smoothed cross-entropy with z-loss and padding, forward and backward.
    CrossEntropy,
    /// GELU and SwiGLU, forward and backward.
    Activation,
    /// Rotary position embeddings with the log-n factor, forward and backward.
    Rope,
    /// The bf16 variants of every family's kernels: bf16 activations (and their gradients), or
    /// for the optimizer bf16 gradients, read and written, widened exactly and computed as in
    /// f32, each output rounded once ([`Kernel::reads_bf16`]). Used together with the op's own
    /// family: a bf16 CUDA tensor takes the op's kernel only while both are on.
    Bf16,
}

impl Kernel {
    pub const ALL: [Kernel; 9] = [
        Kernel::Dropout,
        Kernel::Optimizer,
        Kernel::Softmax,
        Kernel::Attention,
        Kernel::Norm,
        Kernel::CrossEntropy,
        Kernel::Activation,
        Kernel::Rope,
        Kernel::Bf16,
    ];

    /// The kernels that passed the GPU suite (`cargo test --release --features cuda`) on a real
    /// GPU, and so are on by default. A kernel joins only on a GPU result: all eight passed on an
    /// H100 (CUDA 13.0, driver 580) at `4d4adce`, `scripts/gpu-check.sh`,
    /// docs/performance-raw/2026-11-26-gpu/. The bf16 variants, written since, have run on no
    /// GPU yet: their arithmetic is checked on the host (the mirrors), their launches are not.
    pub const VERIFIED: [Kernel; 8] = Kernel::all_but_bf16();

    /// [`Kernel::ALL`] without [`Kernel::Bf16`] (the last).
    const fn all_but_bf16() -> [Kernel; 8] {
        let mut out = [Kernel::Dropout; 8];
        let mut i = 0;
        while i < out.len() {
            out[i] = Kernel::ALL[i];
            i += 1;
        }
        assert!(matches!(Kernel::ALL[8], Kernel::Bf16));
        out
    }

    pub fn name(self) -> &'static str {
        match self {
            Kernel::Dropout => "dropout",
            Kernel::Optimizer => "optimizer",
            Kernel::Softmax => "softmax",
            Kernel::Attention => "attention",
            Kernel::Norm => "norm",
            Kernel::CrossEntropy => "cross_entropy",
            Kernel::Activation => "activation",
            Kernel::Rope => "rope",
            Kernel::Bf16 => "bf16",
        }
    }

    /// Whether this family has bf16 variants (taken with [`Kernel::Bf16`] switched on): every
    /// family does. Softmax, dropout and the loss read and write bf16 activations (the loss's
    /// losses and statistics stay f32); the optimizer reads bf16 gradients into f32 θ and moments.
    pub fn reads_bf16(self) -> bool {
        self != Kernel::Bf16
    }

    fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

/// A list of kernels as `EMBER_CUDA_KERNELS` writes it: `all`, `none`, `verified`, or names
/// separated by commas.
pub fn parse(spec: &str) -> Result<Vec<Kernel>, String> {
    match spec.trim() {
        "all" => return Ok(Kernel::ALL.to_vec()),
        "none" | "" => return Ok(vec![]),
        "verified" => return Ok(Kernel::VERIFIED.to_vec()),
        _ => {}
    }
    spec.split(',')
        .map(|name| {
            let name = name.trim();
            Kernel::ALL.into_iter().find(|k| k.name() == name).ok_or_else(|| {
                let known: Vec<&str> = Kernel::ALL.iter().map(|k| k.name()).collect();
                format!(
                    "EMBER_CUDA_KERNELS: unknown kernel {name:?}; expected all, none, verified or a \
                         comma-separated list of {}",
                    known.join(", ")
                )
            })
        })
        .collect()
}

/// The switched-on kernels as bits, with [`UNSET`] until first read.
static ENABLED: AtomicU32 = AtomicU32::new(UNSET);
const UNSET: u32 = 1 << 31;

fn bits(kernels: &[Kernel]) -> u32 {
    kernels.iter().fold(0, |b, k| b | k.bit())
}

/// The kernels switched on: `EMBER_CUDA_KERNELS`, or [`Kernel::VERIFIED`] when it is unset. A
/// value that does not parse is an error the trainer reports at set-up ([`check_env`]); here it
/// falls back to the verified set.
fn enabled_bits() -> u32 {
    let b = ENABLED.load(Ordering::Relaxed);
    if b != UNSET {
        return b;
    }
    let from_env = std::env::var("EMBER_CUDA_KERNELS")
        .ok()
        .and_then(|s| parse(&s).ok())
        .unwrap_or_else(|| Kernel::VERIFIED.to_vec());
    let b = bits(&from_env);
    // A concurrent first read computes the same value.
    ENABLED.store(b, Ordering::Relaxed);
    b
}

/// Whether kernel `k` is switched on.
pub fn enabled(k: Kernel) -> bool {
    enabled_bits() & k.bit() != 0
}

/// Switches exactly `kernels` on for the rest of the process (tests, benchmarks).
pub fn set_enabled(kernels: &[Kernel]) {
    ENABLED.store(bits(kernels), Ordering::Relaxed);
}

/// The switched-on kernels, for logs and reports.
pub fn enabled_kernels() -> Vec<Kernel> {
    Kernel::ALL.into_iter().filter(|&k| enabled(k)).collect()
}

/// An error naming the variable when `EMBER_CUDA_KERNELS` is set to something that does not parse.
pub fn check_env() -> Result<(), String> {
    match std::env::var("EMBER_CUDA_KERNELS") {
        Ok(s) => parse(&s).map(|_| ()),
        Err(_) => Ok(()),
    }
}

/// Whether `t` takes kernel `k`'s CUDA path: a CUDA tensor (in a build with the `cuda`
/// feature) while `k` is switched on, of f32 or (for a family with bf16 variants, while
/// [`Kernel::Bf16`] is on too) bf16.
pub(crate) fn takes(t: &Tensor, k: Kernel) -> bool {
    cfg!(feature = "cuda") && t.device().is_cuda() && takes_dtype(t.dtype(), k)
}

/// Whether `t` can be a parameter (a weight, gain or bias) of kernel `k`'s CUDA path: as
/// [`takes`], and f32 whatever the activations are (the kernels read f32 parameters only).
pub(crate) fn takes_param(t: &Tensor, k: Kernel) -> bool {
    t.dtype() == DType::F32 && takes(t, k)
}

/// Whether kernel `k` reads and writes activations of `dtype` now (switched on, and of f32 or
/// bf16 as [`takes`] says).
pub(crate) fn takes_dtype(dtype: DType, k: Kernel) -> bool {
    enabled(k)
        && match dtype {
            DType::F32 => true,
            DType::BF16 => k.reads_bf16() && enabled(Kernel::Bf16),
            _ => false,
        }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_switch_parses_names_and_refuses_unknown_ones_by_name() {
        assert_eq!(parse("all").unwrap(), Kernel::ALL.to_vec());
        assert_eq!(parse("none").unwrap(), vec![]);
        assert_eq!(parse("verified").unwrap(), Kernel::VERIFIED.to_vec());
        assert_eq!(
            parse("optimizer, dropout").unwrap(),
            vec![Kernel::Optimizer, Kernel::Dropout]
        );
        let err = parse("dropout,flash").unwrap_err();
        assert!(
            err.contains("EMBER_CUDA_KERNELS") && err.contains("\"flash\""),
            "{err}"
        );
    }

    #[test]
    fn bf16_activations_take_a_kernel_only_with_its_family_and_the_bf16_variants_on() {
        // The switch is the process's; nothing else in this test binary reads it (no CUDA here).
        let before = enabled_kernels();
        set_enabled(&[Kernel::Norm, Kernel::Softmax]);
        assert!(takes_dtype(DType::F32, Kernel::Norm));
        assert!(!takes_dtype(DType::BF16, Kernel::Norm), "bf16 variants off");
        set_enabled(&[Kernel::Norm, Kernel::Softmax, Kernel::Bf16]);
        assert!(takes_dtype(DType::BF16, Kernel::Norm));
        assert!(takes_dtype(DType::BF16, Kernel::Softmax));
        assert!(!takes_dtype(DType::BF16, Kernel::Rope), "rope switched off");
        assert!(
            Kernel::ALL.iter().all(|&k| k.reads_bf16() == (k != Kernel::Bf16)),
            "every family has bf16 variants"
        );
        assert!(!takes_dtype(DType::F16, Kernel::Norm));
        assert!(
            !Kernel::VERIFIED.contains(&Kernel::Bf16),
            "no GPU has run the bf16 variants"
        );
        set_enabled(&before);
    }

    #[test]
    fn a_cpu_tensor_never_takes_a_cuda_kernel() {
        let t = Tensor::zeros(4, DType::F32, &candle_core::Device::Cpu).unwrap();
        assert!(!takes(&t, Kernel::Dropout));
    }
}
