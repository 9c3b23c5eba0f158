//! The CUDA linear cross-entropy (`ember_kernels::linear_cross_entropy` on f32 CUDA tensors: the
//! logits through cuBLAS, then `cuda/cross_entropy.cu`) against the unfused composition on the
//! same GPU — both output rows, dh and dW, with and without the forward pass's prepared
//! probabilities — against itself (bits), and against the CPU kernel.

use crate::common::*;
use candle_core::{DType, Device, Tensor, Var};
use ember_kernels::{linear_cross_entropy, linear_cross_entropy_unfused};

/// Targets spread over the vocabulary (the first and last logits among them), every third row
/// padding (mask 0).
fn targets_and_mask(dev: &Device, n: usize, vocab: usize, salt: usize) -> (Tensor, Tensor) {
    let targets: Vec<u32> = (0..n)
        .map(|j| if j == 1 { vocab - 1 } else { (j * 7919 + salt) % vocab } as u32)
        .collect();
    let mask: Vec<f32> = (0..n).map(|j| if j % 3 == 2 { 0.0 } else { 1.0 }).collect();
    (
        Tensor::new(targets.as_slice(), dev).unwrap(),
        Tensor::new(mask.as_slice(), dev).unwrap(),
    )
}

/// (hidden-state shape, vocabulary): one row; a vocabulary not a multiple of 32 over a batch of
/// (B, T, d) states; 10k vocabularies with few and with ~4,000 rows.
const SHAPES: [(&[usize], usize); 4] = [
    (&[1, 64], 1000),
    (&[3, 13, 48], 1003),
    (&[300, 64], 10_000),
    (&[4000, 128], 10_000),
];

const SETTINGS: [(f64, f64); 4] = [(0.0, 0.0), (0.1, 0.0), (0.0, 1e-4), (0.1, 1e-4)];

#[test]
fn linear_cross_entropy_matches_the_composition_on_the_gpu() {
    // Random upstream gradients on both rows (per-token weights, the NLL row too): the backward
    // pass from the forward pass's probabilities (`grads`) and from logits made again.
    let dev = gpu();
    for (i, (shape, vocab)) in SHAPES.into_iter().enumerate() {
        let d = shape[shape.len() - 1];
        let n: usize = shape[..shape.len() - 1].iter().product();
        let h = randn(&dev, 10 + i as u64, shape, 1.0);
        let w = randn(&dev, 20 + i as u64, &[vocab, d], 0.3);
        let (targets, mask) = targets_and_mask(&dev, n, vocab, i);
        for (eps, z) in SETTINGS {
            for grads in [false, true] {
                for (label, h) in [("contiguous", h.clone()), ("strided", strided(&h))] {
                    compare(
                        &format!(
                            "linear cross-entropy {shape:?} x {vocab} eps {eps} z {z} grads {grads} {label}"
                        ),
                        &[h, w.clone()],
                        &|t| linear_cross_entropy(&t[0], &t[1], &targets, &mask, eps, z, grads).unwrap(),
                        &|t| linear_cross_entropy_unfused(&t[0], &t[1], &targets, &mask, eps, z).unwrap(),
                        1e-5,
                    );
                }
            }
        }
    }
}

/// What the trainer does (crates/trainer/src/step/loss.rs): the objective row summed and divided by
/// the token count, the NLL row summed off the graph. Returns (objective, NLL, dh, dW).
fn trainer_step(h: &Tensor, w: &Tensor, targets: &Tensor, mask: &Tensor, fused: bool) -> [Tensor; 4] {
    let (hv, wv) = (Var::from_tensor(h).unwrap(), Var::from_tensor(w).unwrap());
    let per_token = if fused {
        linear_cross_entropy(hv.as_tensor(), wv.as_tensor(), targets, mask, 0.1, 1e-4, true)
    } else {
        linear_cross_entropy_unfused(hv.as_tensor(), wv.as_tensor(), targets, mask, 0.1, 1e-4)
    }
    .unwrap();
    let objective = per_token.get(0).unwrap().sum_all().unwrap();
    let nll = per_token.get(1).unwrap().detach().sum_all().unwrap();
    let tokens = mask.sum_all().unwrap().to_scalar::<f32>().unwrap() as f64;
    let g = (&objective / tokens).unwrap().backward().unwrap();
    [
        objective,
        nll,
        g.get(hv.as_tensor()).unwrap().clone(),
        g.get(wv.as_tensor()).unwrap().clone(),
    ]
}

#[test]
fn the_trainers_gradient_matches_the_composition_on_the_gpu() {
    let dev = gpu();
    for (i, (shape, vocab)) in SHAPES.into_iter().enumerate() {
        let d = shape[shape.len() - 1];
        let n: usize = shape[..shape.len() - 1].iter().product();
        let h = randn(&dev, 30 + i as u64, shape, 1.0);
        let w = randn(&dev, 40 + i as u64, &[vocab, d], 0.3);
        let (targets, mask) = targets_and_mask(&dev, n, vocab, i);
        let fused = trainer_step(&h, &w, &targets, &mask, true);
        let unfused = trainer_step(&h, &w, &targets, &mask, false);
        for (what, a, b) in [("objective", 0, 0), ("NLL", 1, 1), ("dh", 2, 2), ("dW", 3, 3)] {
            assert_close(
                &format!("{shape:?} x {vocab}: {what}"),
                &fused[a],
                &unfused[b],
                1e-5,
            );
        }
        // Padding rows (every third) get exactly no gradient.
        if n > 2 {
            let dh = fused[2].reshape((n, d)).unwrap();
            let row = host(&dh.get(2).unwrap());
            assert!(
                row.iter().all(|&x| x == 0.0),
                "{shape:?} x {vocab}: a padding row has a gradient"
            );
        }
        let again = trainer_step(&h, &w, &targets, &mask, true);
        for (a, b) in fused.iter().zip(&again) {
            assert!(
                same_bits(a, b),
                "{shape:?} x {vocab}: the trainer's step is not deterministic"
            );
        }
    }
}

#[test]
fn a_second_backward_pass_recomputes_the_same_gradient() {
    // The first backward pass turns the forward pass's probabilities into the gradient; a second
    // one makes the logits again with the same product: the same bits.
    let dev = gpu();
    let h = Var::from_tensor(&randn(&dev, 50, &[257, 64], 1.0)).unwrap();
    let w = Var::from_tensor(&randn(&dev, 51, &[1003, 64], 0.3)).unwrap();
    let (targets, mask) = targets_and_mask(&dev, 257, 1003, 5);
    let per_token =
        linear_cross_entropy(h.as_tensor(), w.as_tensor(), &targets, &mask, 0.1, 1e-4, true).unwrap();
    let probe = randn(&dev, 52, &[2, 257], 1.0);
    let loss = (&per_token * &probe).unwrap().sum_all().unwrap();
    let first = loss.backward().unwrap();
    let second = loss.backward().unwrap();
    for v in [&h, &w] {
        let (a, b) = (
            first.get(v.as_tensor()).unwrap(),
            second.get(v.as_tensor()).unwrap(),
        );
        assert!(
            same_bits(a, b),
            "the recomputed gradient differs from the prepared one"
        );
    }
}

#[test]
fn linear_cross_entropy_on_the_gpu_matches_the_cpu_kernel() {
    // Another GEMM and other summation orders: equal to rounding (1e-5).
    let dev = gpu();
    for (i, (shape, vocab)) in SHAPES[..3].iter().copied().enumerate() {
        let d = shape[shape.len() - 1];
        let n: usize = shape[..shape.len() - 1].iter().product();
        let h = randn_cpu(60 + i as u64, shape, 1.0);
        let w = randn_cpu(70 + i as u64, &[vocab, d], 0.3);
        let (targets, mask) = targets_and_mask(&Device::Cpu, n, vocab, i);
        let probe = randn_cpu(80 + i as u64, &[2, n], 1.0);
        for (eps, z) in SETTINGS {
            for grads in [false, true] {
                let on = |dev: &Device| {
                    let inputs = [h.to_device(dev).unwrap(), w.to_device(dev).unwrap()];
                    let (targets, mask) = (targets.to_device(dev).unwrap(), mask.to_device(dev).unwrap());
                    run(&inputs, &probe.to_device(dev).unwrap(), &|t| {
                        linear_cross_entropy(&t[0], &t[1], &targets, &mask, eps, z, grads).unwrap()
                    })
                };
                let (y_gpu, g_gpu) = on(&dev);
                let (y_cpu, g_cpu) = on(&Device::Cpu);
                let what = format!("{shape:?} x {vocab} eps {eps} z {z} grads {grads}");
                assert_close(&format!("{what}: losses"), &y_gpu, &y_cpu, 1e-5);
                assert_close(&format!("{what}: dh"), &g_gpu[0], &g_cpu[0], 1e-5);
                assert_close(&format!("{what}: dW"), &g_gpu[1], &g_cpu[1], 1e-5);
            }
        }
    }
}

#[test]
fn a_target_outside_the_vocabulary_makes_its_row_nan_on_the_gpu() {
    // The device cannot refuse it without reading the targets back: its row's losses are NaN,
    // the other rows' are untouched.
    let dev = gpu();
    let h = randn(&dev, 90, &[4, 16], 1.0);
    let w = randn(&dev, 91, &[37, 16], 0.3);
    let targets = Tensor::new(&[3u32, 37, 0, 36], &dev).unwrap();
    let mask = Tensor::ones(4, DType::F32, &dev).unwrap();
    let y = host(&linear_cross_entropy(&h, &w, &targets, &mask, 0.1, 1e-4, false).unwrap());
    for (j, &x) in y.iter().enumerate() {
        assert_eq!(x.is_nan(), j % 4 == 1, "element {j} of {y:?}");
    }
}

/// Not a test: milliseconds per trainer step (forward and backward) of the kernel and of the
/// composition, and how far apart they are, at a multi30k-like size.
/// `cargo test --release --features cuda -p ember-kernels --test gpu_cross_entropy -- --ignored --nocapture`
#[test]
#[ignore]
fn print_step_times() {
    let dev = gpu();
    for (n, d, vocab) in [(4096, 512, 10_000), (4096, 512, 32_000)] {
        let h = randn(&dev, 100, &[n, d], 1.0);
        let w = randn(&dev, 101, &[vocab, d], 0.05);
        let (targets, mask) = targets_and_mask(&dev, n, vocab, 0);
        for fused in [true, false] {
            let step = || trainer_step(&h, &w, &targets, &mask, fused);
            step();
            dev.synchronize().unwrap();
            let start = std::time::Instant::now();
            let reps = 20;
            for _ in 0..reps {
                step();
            }
            dev.synchronize().unwrap();
            let ms = start.elapsed().as_secs_f64() * 1e3 / reps as f64;
            println!(
                "{n} x {d} -> {vocab}: {} {ms:.2} ms per step",
                if fused { "kernel" } else { "composition" }
            );
        }
        let (a, b) = (
            trainer_step(&h, &w, &targets, &mask, true),
            trainer_step(&h, &w, &targets, &mask, false),
        );
        for (what, i) in [("objective", 0), ("dh", 2), ("dW", 3)] {
            println!("  {what}: relative difference {:e}", rel_error(&a[i], &b[i]));
        }
    }
}
