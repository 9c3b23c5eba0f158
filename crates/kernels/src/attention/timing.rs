//! Not tests: the attention core's time at nanoGPT's standard shape (one share: 8 sequences of
//! 256 positions, 6 heads of 64), causal, bf16, one thread, by its own CPU time. Run with
//! `cargo test --release -p ember-kernels --lib attention::timing -- --ignored --nocapture`.

use super::live_tests::randn;
use super::{causal_mask, AttentionOptions, AttnOp};
use crate::gemm::timing::{on_one_thread, thread_cpu_secs};
use crate::Precision;

/// Forward and backward passes of the core, medians of 15 rounds (`EMBER_TIMING_ROUNDS` sets
/// more, for a profiler), each in ms and in GFLOP/s of the live blocks' products.
#[test]
#[ignore]
fn attention_core_at_the_standard_shape() {
    if !on_one_thread(crate::gemm::bf16_supported(), "bf16 products") {
        return;
    }
    // As the binary sets glibc up: freed blocks reused, not unmapped and faulted in again.
    // SAFETY: mallopt only adjusts allocator parameters.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
    let (b, t, h, d) = (8, 256, 6, 64);
    let mask = causal_mask(t, 0, candle_core::DType::F32, &candle_core::Device::Cpu).unwrap();
    let opts = AttentionOptions {
        heads: h,
        kv_heads: h,
        dropout: None,
        telemetry: false,
        precision: Precision::Bf16,
    };
    let (q, k, v) = (
        randn(1, b * t * h * d, 0.8),
        randn(2, b * t * h * d, 1.0),
        randn(3, b * t * h * d, 1.0),
    );
    let go = randn(4, b * t * h * d, 1.0);
    let (mut fwd, mut bwd) = (vec![], vec![]);
    let rounds = std::env::var("EMBER_TIMING_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(15);
    for _ in 0..rounds {
        let op = AttnOp::cpu(&[b, t, h * d], &[b, t, h * d], Some(&mask), &opts, true).unwrap();
        let t0 = thread_cpu_secs();
        let o = op.forward_values(&q, &k, &v).unwrap();
        let t1 = thread_cpu_secs();
        let grads = op.backward_values(&q, &k, &v, &o, &go).unwrap();
        let t2 = thread_cpu_secs();
        std::hint::black_box(grads);
        fwd.push(t1 - t0);
        bwd.push(t2 - t1);
    }
    let median = |x: &mut Vec<f64>| {
        x.sort_by(f64::total_cmp);
        x[x.len() / 2]
    };
    // The live blocks: row block i sees 32·(i + 1) keys.
    let live: usize = (0..t / 32).map(|i| 32 * 32 * (i + 1)).sum();
    let flops = 2.0 * (b * h * live * d) as f64;
    let (f, g) = (median(&mut fwd), median(&mut bwd));
    println!(
        "forward {:.2} ms ({:.0} GFLOP/s of its 2 products), backward {:.2} ms ({:.0} GFLOP/s of its 4)",
        f * 1e3,
        2.0 * flops / f / 1e9,
        g * 1e3,
        4.0 * flops / g / 1e9
    );
}
