//! The dropout kernels and the optimizer's device step (sums of squares, the step's verdict,
//! AdamW in one launch) against the CPU kernels and the unfused compositions.

use candle_core::{Device, Tensor, Var};

use crate::common::*;
use ember_kernels::adamw::{adamw_step, AdamWStep, Moments};
use ember_kernels::ledger::{self, DeviceAdamW, StepLedger, Verdict};

#[test]
fn cuda_dropout_masks_are_the_cpu_masks_bit_for_bit() {
    let dev = gpu();
    for (shape, p, state) in [
        (vec![7usize], 0.5, 1u64),
        (vec![33, 129], 0.1, 0xDEAD_BEEF),
        (vec![4, 300, 128], 0.3, u64::MAX),
    ] {
        let x = randn_cpu(3, &shape, 1.0);
        let cpu = ember_kernels::dropout(&x, p, state).unwrap();
        let cuda = ember_kernels::dropout(&x.to_device(&dev).unwrap(), p, state).unwrap();
        assert!(
            same_bits(&cuda, &cpu),
            "{shape:?} p {p}: the CUDA mask differs from the CPU's"
        );
        // The reference multiplies by the mask, so a dropped negative value is -0.0 there and
        // +0.0 in the kernels: equal values, not equal bits.
        let reference = ember_kernels::dropout_unfused(&x, p, state).unwrap();
        assert_eq!(
            host(&cuda),
            host(&reference),
            "{shape:?}: differs from the unfused reference"
        );
    }
}

#[test]
fn cuda_dropout_gradients_use_the_same_mask() {
    let dev = gpu();
    for (label, x) in [
        ("contiguous", randn(&dev, 5, &[9, 70], 1.0)),
        ("strided", strided(&randn(&dev, 5, &[9, 70], 1.0))),
    ] {
        compare(
            &format!("dropout {label}"),
            &[x],
            &|t| ember_kernels::dropout(&t[0], 0.3, 42).unwrap(),
            &|t| ember_kernels::dropout_unfused(&t[0], 0.3, 42).unwrap(),
            1e-6,
        );
    }
}

#[test]
fn a_cuda_residual_branch_with_dropout_matches_the_ops_one_by_one() {
    let dev = gpu();
    let (x, h, w) = (
        randn(&dev, 1, &[3, 11, 64], 1.0),
        randn(&dev, 2, &[3, 11, 96], 1.0),
        randn(&dev, 3, &[64, 96], 0.1),
    );
    compare(
        "linear_residual p 0.2",
        &[x, h, w],
        &|t| ember_kernels::linear_residual(&t[0], &t[1], &t[2], 0.2, 7).unwrap(),
        &|t| ember_kernels::linear_residual_unfused(&t[0], &t[1], &t[2], 0.2, 7).unwrap(),
        1e-5,
    );
}

/// The host's sum of squares, clip factor and AdamW, step by step, beside the device's.
struct Twin {
    cpu: Vec<(Var, Moments)>,
    gpu: Vec<(Var, Moments)>,
    ledger: StepLedger,
    updates: i32,
}

impl Twin {
    fn new(dev: &Device, shapes: &[Vec<usize>]) -> Self {
        let make = |d: &Device| -> Vec<(Var, Moments)> {
            shapes
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let v = Var::from_tensor(&randn(d, 100 + i as u64, s, 0.5)).unwrap();
                    let m = Moments::zeros(&v).unwrap();
                    (v, m)
                })
                .collect()
        };
        let gpu = make(dev);
        assert!(
            gpu.iter().all(|(_, m)| matches!(m, Moments::Device { .. })),
            "with the optimizer kernel on, CUDA moments live in device buffers"
        );
        Self {
            cpu: make(&Device::Cpu),
            ledger: StepLedger::new(dev, shapes.len(), 0, 0).unwrap(),
            gpu,
            updates: 0,
        }
    }

    /// One step with gradients `grads` (host tensors, one per parameter) and learning rate `lr`
    /// on both; returns the device ledger.
    fn step(&mut self, grads: &[Tensor], lr: f64, max_norm: f64, step: u64) -> [f64; ledger::LEN] {
        let dev = self.gpu[0].0.device().clone();
        // Host: the trainer's rules (optim::clip_grad_norm, AdamW::step).
        let squares: Vec<f64> = grads
            .iter()
            .map(|g| ember_kernels::sum_of_squares(g).unwrap())
            .collect();
        let norm = squares.iter().sum::<f64>().sqrt();
        let finite = squares.iter().all(|s| s.is_finite());
        let scale = if finite && norm > max_norm {
            max_norm / (norm + 1e-6)
        } else {
            1.0
        };
        if finite {
            self.updates += 1;
            let t = self.updates;
            for ((v, m), g) in self.cpu.iter_mut().zip(grads) {
                let c = AdamWStep {
                    lr,
                    beta1: 0.9,
                    beta2: 0.98,
                    eps: 1e-8,
                    decay: 1.0 - lr * 0.01,
                    bias_correction1: 1.0 - 0.9f64.powi(t),
                    bias_correction2: 1.0 - 0.98f64.powi(t),
                    grad_scale: scale,
                };
                adamw_step(v, g, m, &c).unwrap();
            }
        }
        // Device: the ledger's.
        self.ledger.begin_step().unwrap();
        for (slot, g) in grads.iter().enumerate() {
            self.ledger
                .sum_of_squares(slot, &g.to_device(&dev).unwrap())
                .unwrap();
        }
        let objective = Tensor::new(123.0f64, &dev).unwrap();
        let nll = Tensor::new(100.0f64, &dev).unwrap();
        let verdict = Verdict {
            max_norm: Some(max_norm),
            spike_loss: None,
            stop: false,
            beta1: 0.9,
            beta2: 0.98,
        };
        self.ledger
            .finish_step(&objective, &nll, 50, &verdict, step)
            .unwrap();
        for ((v, m), g) in self.gpu.iter_mut().zip(grads) {
            let c = DeviceAdamW {
                lr,
                beta1: 0.9,
                beta2: 0.98,
                eps: 1e-8,
                decay: 1.0 - lr * 0.01,
            };
            self.ledger.adamw(v, &g.to_device(&dev).unwrap(), m, &c).unwrap();
        }
        let l = self.ledger.read().unwrap();
        assert!(
            (l[ledger::NORM] - norm).abs() <= 1e-5 * norm.max(1.0) || !finite,
            "device norm {} vs host {norm}",
            l[ledger::NORM]
        );
        l
    }

    fn assert_same(&self, what: &str) {
        for (i, ((c, cm), (g, gm))) in self.cpu.iter().zip(&self.gpu).enumerate() {
            assert_close(&format!("{what}: θ{i}"), g.as_tensor(), c.as_tensor(), 1e-6);
            let shape = c.shape();
            let ((m1, v1), (m2, v2)) = (cm.tensors(shape).unwrap(), gm.tensors(shape).unwrap());
            assert_close(&format!("{what}: m{i}"), &m2, &m1, 1e-6);
            assert_close(&format!("{what}: v{i}"), &v2, &v1, 1e-6);
        }
    }
}

#[test]
fn the_device_step_matches_the_host_step_and_skips_what_the_host_skips() {
    let dev = gpu();
    let shapes = vec![vec![300, 128], vec![128], vec![7, 13], vec![1]];
    let mut twin = Twin::new(&dev, &shapes);
    let grads = |seed: u64, scale: f32| -> Vec<Tensor> {
        shapes
            .iter()
            .enumerate()
            .map(|(i, s)| randn_cpu(seed * 10 + i as u64, s, scale))
            .collect()
    };
    // Clipped (norm ≫ 1) and unclipped steps.
    for (step, scale) in [(1u64, 3.0f32), (2, 0.001), (3, 1.0)] {
        let l = twin.step(&grads(step, scale), 1e-2, 1.0, step);
        assert_eq!(l[ledger::APPLY], 1.0);
        assert_eq!(l[ledger::UPDATES], step as f64);
        twin.assert_same(&format!("step {step}"));
    }
    // A gradient with a NaN: the device holds the update back, counts it and names the parameter.
    let mut bad = grads(4, 1.0);
    bad[2] = Tensor::new(&[f32::NAN; 91], &Device::Cpu)
        .unwrap()
        .reshape((7, 13))
        .unwrap();
    let before: Vec<Vec<f32>> = twin.gpu.iter().map(|(v, _)| host(v.as_tensor())).collect();
    let l = twin.step(&bad, 1e-2, 1.0, 4);
    assert_eq!(
        (l[ledger::APPLY], l[ledger::SKIPPED], l[ledger::W_SKIPPED]),
        (0.0, 1.0, 1.0)
    );
    assert_eq!((l[ledger::W_FIRST_BAD], l[ledger::W_FIRST_WHAT]), (4.0, 2.0));
    assert_eq!(l[ledger::UPDATES], 3.0);
    for ((v, _), b) in twin.gpu.iter().zip(&before) {
        assert_eq!(&host(v.as_tensor()), b, "a skipped step changes no weight");
    }
    twin.assert_same("after the skipped step");
    // And the next step resumes with the bias corrections of update 4.
    let l = twin.step(&grads(5, 1.0), 1e-2, 1.0, 5);
    assert_eq!(l[ledger::UPDATES], 4.0);
    twin.assert_same("step 5");
    // The window: reading it clears its sums.
    let w = twin.ledger.take_window().unwrap();
    assert_eq!(w[ledger::W_TOKENS], 250.0);
    assert_eq!(twin.ledger.read().unwrap()[ledger::W_TOKENS], 0.0);
}

#[test]
fn the_device_step_reads_bf16_gradients_as_their_f32_widening() {
    // Mixed precision's gradients, read by `ember_sum_squares_bf16` and `ember_adamw_bf16` (the
    // `bf16` kernels on): the host's step on the same bf16 gradients to rounding, and the device's
    // own step on their f32 widening bit for bit.
    let dev = gpu();
    let shapes = vec![vec![300, 128], vec![128], vec![7, 13]];
    let (mut twin16, mut twin32) = (Twin::new(&dev, &shapes), Twin::new(&dev, &shapes));
    for (step, scale) in [(1u64, 3.0f32), (2, 0.5)] {
        let grads: Vec<Tensor> = shapes
            .iter()
            .enumerate()
            .map(|(i, s)| {
                randn_cpu(step * 10 + i as u64, s, scale)
                    .to_dtype(candle_core::DType::BF16)
                    .unwrap()
            })
            .collect();
        let widened: Vec<Tensor> = grads
            .iter()
            .map(|g| g.to_dtype(candle_core::DType::F32).unwrap())
            .collect();
        let (l16, l32) = (
            twin16.step(&grads, 1e-2, 1.0, step),
            twin32.step(&widened, 1e-2, 1.0, step),
        );
        assert_eq!(
            l16[ledger::NORM].to_bits(),
            l32[ledger::NORM].to_bits(),
            "step {step}: norm"
        );
        twin16.assert_same(&format!("bf16 gradients, step {step}"));
        for (i, ((a, _), (b, _))) in twin16.gpu.iter().zip(&twin32.gpu).enumerate() {
            assert!(
                same_bits(a.as_tensor(), b.as_tensor()),
                "step {step}: θ{i} from bf16 gradients differs from their widening's"
            );
        }
    }
}

#[test]
fn device_moments_survive_a_checkpoint_round_trip() {
    let dev = gpu();
    let v = Var::from_tensor(&randn(&dev, 1, &[5, 9], 1.0)).unwrap();
    let mut m = Moments::zeros(&v).unwrap();
    let (a, b) = (
        randn(&dev, 2, &[5, 9], 1.0),
        randn(&dev, 3, &[5, 9], 1.0).abs().unwrap(),
    );
    m.store(a.clone(), b.clone()).unwrap();
    let (ma, mb) = m.tensors(v.shape()).unwrap();
    assert!(same_bits(&ma, &a) && same_bits(&mb, &b));
}
