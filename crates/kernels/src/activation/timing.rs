//! The elementwise kernels' rates, printed (not a test of anything).

use super::*;

/// Not a test: `cargo test --release -p ember-kernels --lib activation::timing -- --ignored --nocapture`.
#[test]
#[ignore]
fn print_elementwise_rates() {
    let n = 768 * 512;
    let x: Vec<f32> = (0..n).map(|i| ((i % 97) as f32 - 48.0) / 16.0).collect();
    let g: Vec<f32> = (0..n).map(|i| ((i % 89) as f32 - 44.0) / 32.0).collect();
    let time = |name: &str, f: &dyn Fn() -> usize| {
        let mut best = f64::MAX;
        for _ in 0..20 {
            let t = std::time::Instant::now();
            std::hint::black_box(f());
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!("{name:>16}: {:.3} ns/element", best / n as f64 * 1e9);
    };
    time("gelu_fwd", &|| fill(n, n, |r, y| gelu_fwd(&x[r], y)).len());
    time("gelu_fwd_keep", &|| {
        fill2(n, n, |r, y, d| gelu_fwd_keep(&x[r], y, d)).0.len()
    });
    time("gelu_bwd", &|| {
        fill(n, n, |r, y| gelu_bwd(&x[r.clone()], &g[r], y)).len()
    });
    time("mul", &|| fill(n, n, |r, y| mul(&x[r.clone()], &g[r], y)).len());
    // bf16: GELU's derivative and SwiGLU's inputs kept in 16 bits.
    let bits: Vec<u16> = x.iter().map(|&v| to_bf16(v)).collect();
    time("gelu_fwd_keep_bf16", &|| {
        let kept = PendingBits::new(n);
        // SAFETY: one piece, all of it, written.
        let y = fill(n, n, |r, y| {
            gelu_fwd_keep_bf16(&x[r.clone()], y, unsafe { kept.piece(r) })
        });
        drop(unsafe { kept.finish() });
        y.len()
    });
    time("gelu_bwd_bf16", &|| {
        fill(n, n, |r, y| gelu_bwd_bf16(&x[r.clone()], &g[r], y)).len()
    });
    time("mul_widened", &|| {
        fill(n, n, |r, y| mul_widened(&g[r.clone()], &bits[r], y)).len()
    });
    time("swiglu_fwd", &|| {
        fill(n, n, |r, y| swiglu_fwd(&x[r.clone()], &g[r], y)).len()
    });
    time("swiglu_fwd_keep_bf16", &|| {
        let (a, u) = (PendingBits::new(n), PendingBits::new(n));
        let y = fill(n, n, |r, y| {
            // SAFETY: one piece, all of it, written.
            let (ap, up) = unsafe { (a.piece(r.clone()), u.piece(r.clone())) };
            swiglu_fwd_keep_bf16(&x[r.clone()], &g[r], y, ap, up)
        });
        drop(unsafe { [a.finish(), u.finish()] });
        y.len()
    });
    time("swiglu_bwd", &|| {
        fill2(n, n, |r, da, du| {
            swiglu_bwd(&x[r.clone()], &g[r.clone()], &g[r], da, du)
        })
        .0
        .len()
    });
    time("swiglu_bwd_widened", &|| {
        fill2(n, n, |r, da, du| {
            swiglu_bwd_widened(&bits[r.clone()], &bits[r.clone()], &g[r], da, du)
        })
        .0
        .len()
    });
}
