//! What the GPU suite's files share (`tests/gpu_*.rs`, built with `--features cuda`; the bf16 suite
//! `tests/bf16.rs` uses the host half): the device,
//! random inputs drawn on the host, and the comparison of a CUDA kernel with the unfused candle
//! composition on the same GPU — forward values and every input's gradient, contiguous and
//! strided inputs — plus bit-for-bit repeatability of the kernel.
//!
//! These tests need a GPU: without one they fail, saying so, rather than pass unrun.
#![allow(dead_code)]

use candle_core::{Device, Tensor, Var};
use ember_kernels::cuda::{set_enabled, Kernel};

/// CUDA device 0, with every kernel switched on (the references are the `*_unfused` functions,
/// which never consult the switch).
pub fn gpu() -> Device {
    set_enabled(&Kernel::ALL);
    Device::new_cuda(0).expect("the GPU suite needs a CUDA GPU (device 0); none could be opened")
}

/// Normal-ish values from a small deterministic generator, on the host, times `scale`.
pub fn randn_cpu(seed: u64, shape: &[usize], scale: f32) -> Tensor {
    let mut rng = ember_rng::SplitMix64::new(seed ^ 0x5EED);
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rng.normal() as f32 * scale).collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

/// [`randn_cpu`] on `dev`.
pub fn randn(dev: &Device, seed: u64, shape: &[usize], scale: f32) -> Tensor {
    randn_cpu(seed, shape, scale).to_device(dev).unwrap()
}

/// The values of `t` on the host, flattened.
pub fn host(t: &Tensor) -> Vec<f32> {
    t.to_device(&Device::Cpu)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_dtype(candle_core::DType::F32)
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// ‖a − b‖ / ‖b‖ over every element (NaN where either holds a non-finite value).
pub fn rel_error(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.shape(), b.shape());
    let (a, b) = (host(a), host(b));
    let (mut num, mut den) = (0f64, 0f64);
    for (x, y) in a.iter().zip(&b) {
        if !x.is_finite() || !y.is_finite() {
            return f64::NAN;
        }
        num += ((x - y) as f64).powi(2);
        den += (*y as f64).powi(2);
    }
    (num / den.max(1e-30)).sqrt()
}

/// Asserts ‖a − b‖/‖b‖ < `tol` (f32 kernels against f32 compositions: 1e-5 unless stated).
pub fn assert_close(what: &str, a: &Tensor, b: &Tensor, tol: f64) {
    let e = rel_error(a, b);
    assert!(e < tol, "{what}: relative error {e:e} (tolerance {tol:e})");
}

/// Whether two tensors hold the same bits.
pub fn same_bits(a: &Tensor, b: &Tensor) -> bool {
    let (a, b) = (host(a), host(b));
    a.len() == b.len() && a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// A non-contiguous view of `x`'s values: stored with its first and last dimensions swapped,
/// viewed back (a strided input for the kernels' `.contiguous()` path).
pub fn strided(x: &Tensor) -> Tensor {
    let r = x.rank();
    x.transpose(0, r - 1)
        .unwrap()
        .contiguous()
        .unwrap()
        .transpose(0, r - 1)
        .unwrap()
}

/// The output of `f` on variables made from `inputs`, and the gradient of Σ output·probe with
/// respect to each input.
pub fn run(inputs: &[Tensor], probe: &Tensor, f: &dyn Fn(&[Tensor]) -> Tensor) -> (Tensor, Vec<Tensor>) {
    let vars: Vec<Var> = inputs.iter().map(|t| Var::from_tensor(t).unwrap()).collect();
    let ts: Vec<Tensor> = vars
        .iter()
        .zip(inputs)
        .map(|(v, t)| {
            if t.is_contiguous() {
                v.as_tensor().clone()
            } else {
                // The same values through a strided view of the variable.
                strided(v.as_tensor())
            }
        })
        .collect();
    let out = f(&ts);
    // A bf16 output is widened first (its gradient is then bf16's rounding of the probe).
    let loss = (out.to_dtype(probe.dtype()).unwrap() * probe)
        .unwrap()
        .sum_all()
        .unwrap();
    let grads = loss.backward().unwrap();
    let gs = vars
        .iter()
        .map(|v| {
            grads
                .get(v.as_tensor())
                .expect("an input has no gradient")
                .clone()
        })
        .collect();
    (out, gs)
}

/// The kernel (`fused`) against the composition (`unfused`) on the GPU: forward and every
/// gradient within `tol`, and the kernel's forward and gradients the same bits on a second run.
pub fn compare(
    what: &str,
    inputs: &[Tensor],
    fused: &dyn Fn(&[Tensor]) -> Tensor,
    unfused: &dyn Fn(&[Tensor]) -> Tensor,
    tol: f64,
) {
    let dev = inputs[0].device().clone();
    let probe = randn(&dev, 99, fused(inputs).dims(), 1.0);
    let (yf, gf) = run(inputs, &probe, fused);
    let (yu, gu) = run(inputs, &probe, unfused);
    assert_close(&format!("{what} forward"), &yf, &yu, tol);
    for (i, (a, b)) in gf.iter().zip(&gu).enumerate() {
        assert_close(&format!("{what} gradient {i}"), a, b, tol);
    }
    let (yf2, gf2) = run(inputs, &probe, fused);
    assert!(
        same_bits(&yf, &yf2),
        "{what}: the kernel's forward is not deterministic"
    );
    for (i, (a, b)) in gf.iter().zip(&gf2).enumerate() {
        assert!(
            same_bits(a, b),
            "{what}: the kernel's gradient {i} is not deterministic"
        );
    }
}

/// Every precision, bf16 on any CPU: natively where it has AVX512_BF16, else emulated with the
/// same bits (`ember_kernels::emulate_bf16_products`), so that the bf16 specifications run on
/// every machine, CI's included.
pub fn every_precision() -> [ember_kernels::Precision; 2] {
    ember_kernels::emulate_bf16_products();
    [ember_kernels::Precision::F32, ember_kernels::Precision::Bf16]
}
