//! The bf16 variants of the softmax, dropout, loss and optimizer kernels (`Kernel::Bf16`):
//! softmax and dropout on bf16 activations are their f32 kernels between casts; the loss reads
//! bf16 logits (bf16 products) with the bits of the widened logits' path, and a bf16 h between
//! casts; the optimizer's step reads bf16 gradients as their f32 widening. (Their arithmetic is
//! checked on the host against the CPU ops: `softmax::mirror`, `cross_entropy::cuda_mirror`,
//! `cuda::mirror`; the optimizer's bf16 step is in `dropout_optimizer.rs`, beside its twin.)

use crate::bf16_activations::{between_casts, between_casts_within, layouts};
use crate::common::*;
use candle_core::{DType, Device, Tensor};
use ember_kernels as kernels;
use ember_kernels::cuda::{set_enabled, Kernel};
use ember_kernels::Precision;

fn bf16(t: &Tensor) -> Tensor {
    t.to_dtype(DType::BF16).unwrap()
}

/// The process's kernel switch set to `kernels` until dropped, then back to every kernel (what
/// `gpu()` sets), a failing assertion included. The switch is the process's: the suite runs one
/// test at a time (`--test-threads=1`, main.rs).
struct Switched;

impl Switched {
    fn to(kernels: &[Kernel]) -> Self {
        set_enabled(kernels);
        Switched
    }
}

impl Drop for Switched {
    fn drop(&mut self) {
        set_enabled(&Kernel::ALL);
    }
}

#[test]
fn softmax_on_bf16_rows_is_the_f32_kernel_between_casts() {
    // The backward pass reads the rounded probabilities (the f32 kernel its own): the gradient
    // within a few bf16 roundings, as on the CPU.
    const GRADIENT_TOL: f64 = 1e-2;
    let dev = gpu();
    for (i, shape) in [&[3usize, 5, 7][..], &[4, 33], &[2, 3, 300], &[6, 1]]
        .into_iter()
        .enumerate()
    {
        let x = bf16(&randn(&dev, 1100 + i as u64, shape, 3.0));
        for (label, v) in layouts(&[x.clone()]) {
            between_casts_within(
                &format!("softmax {shape:?} {label}"),
                &v,
                DType::BF16,
                &|t| kernels::softmax_rows(&t[0]).unwrap(),
                &|t| kernels::softmax_rows(&t[0]).unwrap(),
                Some(GRADIENT_TOL),
            );
        }
        // Against the CPU op on the same bf16 rows: the f32 sums in another order, then one
        // rounding each.
        let cpu = kernels::softmax_rows(&x.to_device(&Device::Cpu).unwrap()).unwrap();
        let cuda = kernels::softmax_rows(&x).unwrap();
        assert_close(&format!("softmax {shape:?} against the CPU"), &cuda, &cpu, 1e-2);
    }
}

#[test]
fn dropout_on_bf16_is_the_f32_kernel_between_casts_with_the_cpu_mask() {
    let dev = gpu();
    for (shape, p, state) in [(vec![7usize], 0.5, 1u64), (vec![33, 129], 0.1, 0xDEAD_BEEF)] {
        let x = bf16(&randn(&dev, 1200, &shape, 1.0));
        for (label, v) in layouts(&[x.clone()]) {
            between_casts(
                &format!("dropout {shape:?} p {p} {label}"),
                &v,
                DType::BF16,
                &|t| kernels::dropout(&t[0], p, state).unwrap(),
                &|t| kernels::dropout(&t[0], p, state).unwrap(),
            );
        }
        let cpu = kernels::dropout(&x.to_device(&Device::Cpu).unwrap(), p, state).unwrap();
        assert!(
            same_bits(&kernels::dropout(&x, p, state).unwrap(), &cpu),
            "{shape:?}: the bf16 CUDA mask differs from the CPU's"
        );
    }
}

/// Targets spread over the vocabulary, every third row padding.
fn targets_and_mask(n: usize, vocab: usize) -> (Tensor, Tensor) {
    let targets: Vec<u32> = (0..n).map(|j| ((j * 7919 + 3) % vocab) as u32).collect();
    let mask: Vec<f32> = (0..n).map(|j| if j % 3 == 2 { 0.0 } else { 1.0 }).collect();
    (
        Tensor::new(targets.as_slice(), &Device::Cpu).unwrap(),
        Tensor::new(mask.as_slice(), &Device::Cpu).unwrap(),
    )
}

#[test]
fn the_loss_on_bf16_logits_has_the_bits_of_the_widened_logits() {
    // Under bf16 products the logits are cuBLAS's bf16 outputs either way. With the `bf16`
    // kernels on they stay bf16 (half the n × V buffer): the losses are the same f32 row math
    // on the same values, and the backward pass computes each probability from its logit in
    // f32 as the f32 forward pass stores it, so the gradient of the logits, rounded once for
    // the products, is the same. So: the same bits for the losses, dh and dW, whatever the
    // upstream gradient, from the kept logits and from logits made again.
    let dev = gpu();
    for (i, (shape, vocab)) in [(&[3usize, 13, 48][..], 1003usize), (&[300, 64], 10_000)]
        .into_iter()
        .enumerate()
    {
        let d = shape[shape.len() - 1];
        let n: usize = shape[..shape.len() - 1].iter().product();
        let h = randn(&dev, 1300 + i as u64, shape, 1.0);
        let w = randn(&dev, 1310 + i as u64, &[vocab, d], 0.3);
        let (targets, mask) = targets_and_mask(n, vocab);
        let trainers = Tensor::cat(
            &[
                &Tensor::full(0.01f32, (1, n), &dev).unwrap(),
                &Tensor::zeros((1, n), DType::F32, &dev).unwrap(),
            ],
            0,
        )
        .unwrap();
        for (upstream, probe) in [
            ("trainer's", trainers),
            ("random", randn(&dev, 1320, &[2, n], 1.0)),
        ] {
            for grads in [true, false] {
                let loss = |t: &[Tensor]| {
                    kernels::linear_cross_entropy_in(
                        &t[0],
                        &t[1],
                        &targets,
                        &mask,
                        0.1,
                        1e-4,
                        grads,
                        Precision::Bf16,
                    )
                    .unwrap()
                };
                let inputs = [h.clone(), w.clone()];
                let (y16, g16) = run(&inputs, &probe, &loss);
                let (y, g) = {
                    let _verified = Switched::to(&Kernel::VERIFIED);
                    run(&inputs, &probe, &loss)
                };
                let what = format!("{shape:?} x {vocab} {upstream} grads {grads}");
                assert!(same_bits(&y16, &y), "{what}: losses");
                assert!(same_bits(&g16[0], &g[0]), "{what}: dh");
                assert!(same_bits(&g16[1], &g[1]), "{what}: dW");
            }
        }
    }
}

#[test]
fn the_loss_reads_a_bf16_h_between_casts() {
    // h bf16 (a final norm's bf16 output), W f32: the losses and dW f32, dh bf16 rounded once.
    let dev = gpu();
    let (n, d, vocab) = (39, 48, 1003);
    let h = bf16(&randn(&dev, 1400, &[3, 13, d], 1.0));
    let w = randn(&dev, 1401, &[vocab, d], 0.3);
    let (targets, mask) = targets_and_mask(n, vocab);
    for precision in [Precision::F32, Precision::Bf16] {
        for grads in [true, false] {
            for (label, v) in layouts(&[h.clone(), w.clone()]) {
                let loss = |t: &[Tensor]| {
                    kernels::linear_cross_entropy_in(
                        &t[0], &t[1], &targets, &mask, 0.1, 0.0, grads, precision,
                    )
                    .unwrap()
                };
                between_casts(
                    &format!("linear_cross_entropy {precision} grads {grads} {label}"),
                    &v,
                    DType::F32,
                    &loss,
                    &loss,
                );
            }
        }
    }
}
