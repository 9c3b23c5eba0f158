//! The GPU suite of the kernels: every CUDA kernel against the unfused candle composition on the
//! same GPU (values and gradients, contiguous and strided inputs), bit-for-bit repeatability,
//! and the CUDA results against the CPU kernels'. One test binary (one CUDA context to start, one
//! executable to carry to a GPU machine):
//!
//!     cargo test --release --features cuda -p ember-kernels --test gpu -- --test-threads=1
//!
//! One test at a time: the kernel switch is the process's, and a test may set it for a while
//! (`bf16_loss_and_optimizer`). Built without a GPU; run on one (without one every test fails,
//! saying so).
#![cfg(feature = "cuda")]

#[path = "../common/mod.rs"]
mod common;

mod attention;
mod bf16;
mod bf16_activations;
mod bf16_loss_and_optimizer;
mod cross_entropy;
mod dropout_optimizer;
mod norm_activation_rope;
