//! Specification on a GPU: under bf16 products (`train.precision: bf16`) with every kernel
//! family on, their bf16 variants included, a model on CUDA keeps its pre-norm branches'
//! activations in bf16 (`Precision::branch_dtype`), and a training pass is its f32-branch pass
//! to bf16's rounding in every architecture, QK-norm, MLP, norm and position scheme, with
//! biases, grouped heads, log-n scaling and dropout; post-norm is unchanged. What
//! `bf16_branches.rs` holds on the CPU, here through the CUDA kernels and cuBLAS:
//!
//!     cargo test --release --features cuda -p ember-model --test gpu_bf16_branches -- --test-threads=1
//!
//! Built without a GPU; run on one (without one every test fails, saying so).
#![cfg(feature = "cuda")]

mod common;

use candle_core::{DType, Device};
use common::branches::*;
use common::perturb;
use ember_kernels::cuda::{set_enabled, Kernel};
use ember_kernels::Precision;
use ember_model::{init_model, ModelConfig};

/// CUDA device 0 with every kernel family switched on (the process's switch: one test at a time).
fn gpu() -> Device {
    set_enabled(&Kernel::ALL);
    Device::new_cuda(0).expect("this test needs a CUDA GPU (device 0); none could be opened")
}

#[test]
fn bf16_products_take_bf16_branches_only_with_every_kernel_on() {
    let dev = gpu();
    assert_eq!(Precision::Bf16.branch_dtype(&dev), DType::BF16);
    assert_eq!(Precision::F32.branch_dtype(&dev), DType::F32);
    assert_eq!(Precision::Bf16.branch_dtype(&Device::Cpu), DType::F32);
    set_enabled(&Kernel::VERIFIED);
    let verified = Precision::Bf16.branch_dtype(&dev);
    set_enabled(&Kernel::ALL);
    assert_eq!(
        verified,
        DType::F32,
        "without the bf16 variants the branches stay f32"
    );
}

/// The pass of `c` on the GPU in bf16 products with the precision's own branches (bf16) against
/// the same with f32 branches.
fn check(what: &str, c: &ModelConfig, pre_norm: bool) {
    let dev = gpu();
    let (mut model, params) = init_model(c, 1234, DType::F32, &dev).expect("valid test config");
    perturb(&params, 0.05, 3);
    model.set_precision(Precision::Bf16);
    let bf16 = training_pass(&model, &params, c.vocab(), &dev, |ctx| ctx);
    let f32 = training_pass(&model, &params, c.vocab(), &dev, |ctx| {
        ctx.with_branch_dtype(DType::F32)
    });
    assert_branches_close(what, c, &bf16, &f32, pre_norm);
}

#[test]
fn bf16_branches_on_cuda_train_as_f32_branches_to_bf16s_rounding() {
    for (what, c, pre_norm) in branch_configs() {
        check(&what, &c, pre_norm);
    }
}
