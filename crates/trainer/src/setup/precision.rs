//! `train.precision`, resolved once per run into the [`Precision`] the model's products take
//! ([`Model::set_precision`](ember_model::Model::set_precision)); nothing else in the trainer
//! looks at it.
//!
//! `bf16` is mixed precision: the weights, the AdamW moments and the gradients stay f32 (and are
//! checkpointed as in f32), and the operands of the matrix products — forward and backward — are
//! rounded to bf16, with f32 sums. The activations between candle's ops stay f32 on the CPU
//! (on CUDA with every kernel family on, below, the pre-norm branches' are bf16): Ember's CPU ops
//! take bf16 activations in and out, but candle zero-fills and adds every bf16 node's gradient
//! with its own slow bf16 arithmetic, which measured 0.67–0.93× the step for a few hundred MiB
//! saved (docs/performance.md). Inside the fused sub-block ops, which candle does not see, the
//! CPU keeps in bf16 what only products read (the normalised inputs, GELU's hidden activation,
//! attention's q, k and v), SwiGLU's two projections (which it reads rounded; its output is made
//! again from them in the backward pass, in f32 too) and GELU's derivative; attention keeps only
//! the live blocks of its probabilities (a causal mask's upper triangle is exact zeros, which
//! bf16 skips).
//!
//! On a CPU with AMX the products' steps run on its tiles (`tdpbf16ps`), once a start-up check
//! has held them to their emulator (ember-kernels' `gemm::bf16::amx`); `EMBER_CPU_VECTOR_UNIT=avx512`
//! keeps them off. They have run on an Intel Xeon with AMX (docs/results/bf16/).
//!
//! A CPU without AVX512_BF16 is refused before any work, naming the feature: an emulation does
//! f32's multiply-adds plus the rounding, so it can only be slower than f32, with worse numerics.
//! Unless the user asks for that emulation (`EMBER_CPU_BF16=emulate`, [`ember_kernels::BF16_ENV`]):
//! then the products run in software with the bits of AVX512_BF16's `vdpbf16ps` (for checking a
//! bf16 run before it goes to a machine that has it, and for the tests), and the run says at its
//! start how many times slower than f32 a product measured on this machine ([`products_note`],
//! which says so too where native bf16 products measure slower than f32's: an AMX Xeon's
//! `vdpbf16ps` with the tiles turned off did).
//!
//! On CUDA the products are cuBLAS's bf16 GEMMs with f32 compute (tensor cores) on operands cast
//! to bf16, their outputs rounded to bf16 as under PyTorch's autocast
//! ([`Precision::matmul`]); attention's fused kernel rounds its four products' operands to bf16
//! and sums in f32, as the CPU kernel does (longer sequences: those GEMMs around its softmax
//! kernel), and Ember's other CUDA kernels take the f32 activations. Every kernel family also
//! has bf16 variants, off by default as no GPU has run them (the `bf16` family of
//! `EMBER_CUDA_KERNELS`). With every family on (`EMBER_CUDA_KERNELS=all`) a bf16 run on CUDA
//! keeps the activations of its pre-norm branches in bf16 — from the norm's output up to the
//! branch's output projection, which writes the f32 residual stream — as PyTorch's autocast
//! does (`Precision::branch_dtype`; on the CPU the model tests run that path through
//! `ForwardCtx::with_branch_dtype`), and the output layer's bf16 logits stay bf16 for the loss,
//! with the bits of the widened path. Unverified on a GPU so far: no device has run it.

use anyhow::{bail, Result};
use ember_kernels::Precision;

use crate::config::RunConfig;

/// What the products of `cfg`'s run compute in and on, for reports: e.g. `bf16 products on
/// AVX512_BF16 (vdpbf16ps), f32 sums` on this CPU, `f32 products on cuBLAS` on a GPU.
pub fn describe_products(cfg: &RunConfig) -> String {
    match cfg.train.precision {
        _ if !cfg.device.starts_with("cuda") => cfg.train.precision.cpu_products(),
        Precision::F32 => "f32 products on cuBLAS".into(),
        Precision::Bf16 => "bf16 products on cuBLAS (f32 compute, bf16 outputs)".into(),
    }
}

/// The precision of a training run's (or a benchmark's) products, or an error naming what this
/// machine lacks to run `train.precision`.
pub fn for_training(cfg: &RunConfig) -> Result<Precision> {
    let precision = cfg.train.precision;
    if precision == Precision::F32 {
        return Ok(precision);
    }
    if cfg.device.starts_with("cuda") {
        return Ok(precision);
    }
    if let Some(missing) = precision.missing_cpu_feature() {
        bail!(
            "train.precision: {precision}: its matrix products need {missing}. Train with \
             train.precision: f32 (the default) here, or on a CPU with AVX512_BF16 (AMD Zen 4 \
             and later, Intel Cooper Lake, Sapphire Rapids and later). To check a bf16 run on \
             this machine anyway, set {env}=emulate: the products then run in software with \
             AVX512_BF16's bits, slower than f32 (an emulation does f32's multiply-adds plus \
             the rounding).",
            env = ember_kernels::BF16_ENV
        );
    }
    Ok(precision)
}

/// What a bf16 run on the CPU (or a benchmark, an evaluation, a decoding) tells at its start
/// where its products are not what bf16 is for: emulated ([`ember_kernels::bf16_emulated`]), or
/// on bf16 instructions that multiply more slowly than f32 here (an AMX Xeon's `vdpbf16ps` with
/// the tiles turned off took 1.1–1.5× f32's time, 2026-12-03) — each with how many times longer
/// than f32's a product took just now ([`ember_kernels::bf16_slowdown`]: a measurement of this
/// machine, not a figure of Ember's). `None` for every other run.
pub fn products_note(cfg: &RunConfig) -> Option<String> {
    // Nothing to measure where bf16 cannot run: `for_training` refuses that run, and a
    // benchmark asks for this note before it does.
    if cfg.train.precision != Precision::Bf16
        || cfg.device.starts_with("cuda")
        || cfg.train.precision.missing_cpu_feature().is_some()
    {
        return None;
    }
    slowdown_note(
        ember_kernels::bf16_emulated(),
        &cfg.train.precision.cpu_products(),
        ember_kernels::bf16_slowdown(),
    )
}

/// Above this many times f32's time, native bf16 products are called slower: past the spread of
/// a median of three pairs of small products on a shared machine, and far above a CPU whose
/// bf16 is worth using (at training shapes AVX512_BF16 on a Zen 4 took about 0.6× f32's time,
/// AMX's tiles 0.24–0.42×: docs/performance-raw/2026-12-03-amx/products-amx-vs-f32.txt).
const SLOWER_THAN_F32: f64 = 1.1;

/// [`products_note`] for products described as `products` that took `slowdown` times f32's time.
fn slowdown_note(emulated: bool, products: &str, slowdown: f64) -> Option<String> {
    if emulated {
        return Some(format!(
            "train.precision: bf16 runs emulated ({}=emulate, where AVX512_BF16 is missing or \
             turned off): the products have AVX512_BF16's bits, but a 256×256×256 product took \
             {slowdown:.1}× as long as in f32 on this machine just now",
            ember_kernels::BF16_ENV,
        ));
    }
    (slowdown > SLOWER_THAN_F32).then(|| {
        format!(
            "train.precision: bf16: {products}, but a 256×256×256 product took \
             {slowdown:.1}× as long as in f32 on this machine just now: this CPU's bf16 \
             instructions multiply no faster than its f32 ones, so train.precision: f32 may \
             train faster here (where the CPU has AMX, {unit} must not cap it at avx512)",
            unit = ember_kernels::VECTOR_UNIT_ENV,
        )
    })
}

/// The precision to evaluate or decode a trained run in: its own where this machine runs it
/// (with the note of an emulated one), else f32, with a note saying so (the weights are f32
/// either way; only the last digits of the products differ).
pub fn for_inference(cfg: &RunConfig) -> (Precision, Option<String>) {
    match for_training(cfg) {
        Ok(p) => (p, products_note(cfg)),
        Err(e) => (
            Precision::F32,
            Some(format!(
                "this run trained with train.precision: {}; its products run in f32 here ({e})",
                cfg.train.precision
            )),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::slowdown_note;

    const VDPBF16PS: &str = "bf16 products on AVX512_BF16 (vdpbf16ps), f32 sums";

    #[test]
    fn native_bf16_products_slower_than_f32_are_told_with_the_measurement() {
        let note = slowdown_note(false, VDPBF16PS, 1.43).expect("a note");
        for said in [
            VDPBF16PS,
            "1.4× as long as in f32",
            "train.precision: f32",
            "EMBER_CPU_VECTOR_UNIT",
        ] {
            assert!(note.contains(said), "{said:?} in {note:?}");
        }
    }

    #[test]
    fn native_bf16_products_faster_than_f32_or_within_the_noise_say_nothing() {
        for slowdown in [0.3, 0.6, 1.0, 1.1] {
            assert_eq!(slowdown_note(false, VDPBF16PS, slowdown), None, "{slowdown}");
        }
    }

    #[test]
    fn emulated_products_are_told_however_fast_they_measured() {
        for slowdown in [0.9, 1.3] {
            let note = slowdown_note(true, "emulated", slowdown).expect("a note");
            assert!(
                note.contains("runs emulated") && note.contains(&format!("{slowdown:.1}×")),
                "{note}"
            );
        }
    }
}
