//! Not tests: GEMM throughput of both paths at model shapes.

use super::*;

/// Not a test: `cargo test --release -p ember-kernels --lib gemm::timing -- --ignored --nocapture`
/// prints GFLOP/s of both paths at nanoGPT-CPU shapes.
#[test]
#[ignore]
fn print_gflops_at_model_shapes() {
    // Its "in place" and "swapped" variants are the AVX-512 kernels.
    if !crate::simd::avx512() {
        println!("no AVX-512 here");
        return;
    }
    // (m, k, n, A transposed, B transposed, what)
    let shapes = [
        (400, 128, 10000, false, true, "lce logits"),
        (400, 10000, 128, false, false, "lce dh"),
        (10000, 400, 128, true, false, "lce dW"),
        (1856, 128, 128, false, true, "m30 fwd q"),
        (1856, 128, 256, false, true, "m30 fwd fc"),
        (1856, 256, 128, false, true, "m30 fwd fc2"),
        (1856, 128, 128, false, false, "m30 dX q"),
        (1856, 256, 128, false, false, "m30 dX fc"),
        (128, 1856, 128, true, false, "m30 dW q"),
        (256, 1856, 128, true, false, "m30 dW fc"),
        (128, 1856, 256, true, false, "m30 dW fc2"),
        (768, 128, 384, false, true, "fwd x·Wᵀ qkv"),
        (768, 128, 512, false, true, "fwd x·Wᵀ fc"),
        (768, 512, 128, false, true, "fwd x·Wᵀ fc2"),
        (768, 384, 128, false, false, "dX g·W qkv"),
        (768, 512, 128, false, false, "dX g·W fc"),
        (384, 768, 128, true, false, "dW gᵀ·x qkv"),
        (512, 768, 128, true, false, "dW gᵀ·x fc"),
        (128, 768, 512, true, false, "dW gᵀ·x fc2"),
        (64, 32, 64, false, true, "attn q·kᵀ"),
        (64, 64, 32, false, false, "attn p·v"),
        (64, 64, 32, true, false, "attn pᵀ·dO"),
        (64, 32, 64, false, true, "attn dO·vᵀ"),
    ];
    for (m, k, n, a_t, b_t, what) in shapes {
        let a = vec![0.5f32; m * k];
        let b = vec![0.25f32; k * n];
        let mut c = vec![0f32; m * n];
        let (ao, bo) = super::tests::operands(&a, &b, (m, k, n), a_t, b_t);
        let mut line = format!("{what:>14} {m:>4}×{k:>4}×{n:>4}");
        let reps = (2e8 / (m * k * n) as f64).max(3.0) as usize;
        let mut ct = vec![0f32; m * n];
        let variants: &[&str] = if a_t && !b_t {
            &["in place", "packed", "swapped"]
        } else {
            &["in place", "packed"]
        };
        let mut best = vec![f64::MAX; variants.len()];
        // Round-robin, best of 9: other tenants share this machine.
        for _ in 0..9 {
            for (v, name) in variants.iter().enumerate() {
                let t = std::time::Instant::now();
                for _ in 0..reps {
                    match *name {
                        "swapped" => {
                            // Cᵀ = Bᵀ·Aᵀ with the in-place kernel (no final transpose).
                            let bt = Operand {
                                ptr: b.as_ptr(),
                                row_stride: 1,
                                col_stride: n,
                            };
                            unsafe { x86::avx512::gemm(n, k, m, bt, a.as_ptr(), m, 0.0, ct.as_mut_ptr(), m) };
                        }
                        _ => unsafe {
                            gemm_with(*name == "in place", m, k, n, ao, bo, 0.0, c.as_mut_ptr(), n)
                        },
                    }
                }
                best[v] = best[v].min(t.elapsed().as_secs_f64() / reps as f64);
            }
        }
        for (name, t) in variants.iter().zip(&best) {
            line += &format!("  {name}: {:6.1}", 2.0 * (m * k * n) as f64 / t / 1e9);
        }
        println!("{line}");
    }
}

/// Not a test: `cargo test --release -p ember-kernels --lib gemm::timing::bf16 -- --ignored
/// --nocapture` times the bf16 products (packing included; emulated where the CPU has no
/// AVX512_BF16) against the f32 ones the ops run today, at the products of a training step: nanoGPT's standard Shakespeare shape (d 384,
/// d_ff 1536, 256 × 16 tokens in two shares of 2,048 rows, vocabulary 65) and shakespeare-char's
/// d 128 (64 × 12 tokens, two shares of 384 rows), at 1 and 2 threads. Alternating pairs (f32
/// then bf16, 9 pairs): the median of each and the median and range of the per-pair ratios
/// (f32 time ÷ bf16 time); the last line of each shape set weighs every product by how often
/// a layer runs it. One thread is timed by the thread's own CPU time (this machine is shared:
/// time spent descheduled is not the kernel's), two by the wall clock.
#[cfg(target_arch = "x86_64")]
#[test]
#[ignore]
fn bf16_against_f32_at_training_shapes() {
    use crate::Precision;
    if !super::bf16::supported() {
        println!("no AVX512_BF16 here: bf16 products emulated (the emulation against f32)");
        super::emulate_bf16_products();
    }
    for threads in [1, 2] {
        let clock = if threads == 1 {
            thread_cpu_secs
        } else {
            || std::time::UNIX_EPOCH.elapsed().map_or(0.0, |d| d.as_secs_f64())
        };
        crate::par::set_threads(threads).unwrap();
        for (name, shapes) in shape_sets() {
            println!("{name}, {threads} thread(s): f32 ms, bf16 ms (medians), f32 ÷ bf16 median (range)");
            let (mut total_f32, mut total_bf16) = (0.0, 0.0);
            for (m, k, n, a_t, b_t, what, count) in shapes {
                let a = super::tests::values(m * k, 1);
                let b = super::tests::values(k * n, 2);
                let view = |data: &'static [f32], rows: usize, cols: usize, t: bool| {
                    let m = Mat::rows(data, if t { rows } else { cols });
                    if t {
                        m.t()
                    } else {
                        m
                    }
                };
                let (a, b): (&'static [f32], &'static [f32]) = (a.leak(), b.leak());
                let (av, bv) = (view(a, m, k, a_t), view(b, k, n, b_t));
                let reps = (1e9 / (m * k * n) as f64).clamp(1.0, 500.0) as usize;
                let time = |bf16: bool| {
                    let precision = if bf16 { Precision::Bf16 } else { Precision::F32 };
                    let t = clock();
                    for _ in 0..reps {
                        std::hint::black_box(super::product_in(precision, m, k, n, av, bv));
                    }
                    (clock() - t) / reps as f64
                };
                let p = nine_pairs(time);
                total_f32 += p.first * count as f64;
                total_bf16 += p.second * count as f64;
                p.print(what, (m, k, n), "bf16");
            }
            println!(
                "  {:>18} layer: {:.3} ms f32, {:.3} ms bf16, {:.2}×",
                "all",
                total_f32 * 1e3,
                total_bf16 * 1e3,
                total_f32 / total_bf16
            );
        }
    }
    crate::par::set_threads(1).unwrap();
}

/// Products of a training step: (m, k, n, A transposed, B transposed, what, times per layer).
type Shapes = [(usize, usize, usize, bool, bool, &'static str, usize); 12];

/// A training step's products for `m` rows of a model of width `d` and MLP width `d_ff` over
/// a vocabulary of 65 (Shakespeare's characters): (m, k, n, A transposed, B transposed, what,
/// times per layer).
fn training_shapes(m: usize, d: usize, d_ff: usize) -> Shapes {
    [
        (m, d, d, false, true, "fwd x·Wᵀ q/k/v/o", 4),
        (m, d, d_ff, false, true, "fwd x·Wᵀ up", 1),
        (m, d_ff, d, false, true, "fwd x·Wᵀ down", 1),
        (m, d, d, false, false, "dX g·W q/k/v/o", 4),
        (m, d_ff, d, false, false, "dX g·W up", 1),
        (m, d, d_ff, false, false, "dX g·W down", 1),
        (d, m, d, true, false, "dW gᵀ·x q/k/v/o", 4),
        (d_ff, m, d, true, false, "dW gᵀ·x up", 1),
        (d, m, d_ff, true, false, "dW gᵀ·x down", 1),
        (m, d, 65, false, true, "logits h·Wᵀ", 0),
        (m, 65, d, false, false, "dh dlogits·W", 0),
        (65, m, d, true, false, "dW dlogitsᵀ·h", 0),
    ]
}

/// nanoGPT's standard Shakespeare shape (d 384, d_ff 1536, 256 × 16 tokens in two shares of
/// 2,048 rows) and shakespeare-char's d 128 (d_ff 512, 64 × 12 tokens, two shares of 384 rows).
fn shape_sets() -> [(&'static str, Shapes); 2] {
    [
        ("d 384, 2,048 rows", training_shapes(2048, 384, 1536)),
        ("d 128, 384 rows", training_shapes(384, 128, 512)),
    ]
}

/// Not a test: `cargo test --release -p ember-kernels --lib gemm::timing::avx2 -- --ignored
/// --nocapture` times Ember's AVX2 kernel against matrixmultiply's (the same bits), on one
/// thread, at the products of a training step ([`against_matrixmultiply`]).
#[cfg(target_arch = "x86_64")]
#[test]
#[ignore]
fn avx2_against_matrixmultiply_at_training_shapes() {
    if on_one_thread(super::avx2::available(), "AVX2 with FMA") {
        against_matrixmultiply(super::avx2::gemm);
    }
}

/// Not a test: `cargo test --release -p ember-kernels --lib gemm::timing::avx512_order --
/// --ignored --nocapture` times the products in matrixmultiply's order on Ember's AVX-512
/// kernel against matrixmultiply's own AVX-512 kernel (the same bits), on one thread, at the
/// products of a training step ([`against_matrixmultiply`]).
#[cfg(target_arch = "x86_64")]
#[test]
#[ignore]
fn avx512_order_against_matrixmultiply_at_training_shapes() {
    /// [`super::matrixmultiply_order::gemm`] with a plain pointer to C.
    #[allow(clippy::too_many_arguments)]
    unsafe fn in_its_order(
        m: usize,
        k: usize,
        n: usize,
        a: super::Operand,
        b: super::Operand,
        beta: f32,
        c: *mut f32,
        ldc: usize,
    ) {
        let c = crate::par::SharedMut(c);
        super::matrixmultiply_order::gemm(m, k, n, a, b, beta, c, ldc)
    }
    if on_one_thread(crate::simd::avx512(), "AVX-512 unit in use") {
        against_matrixmultiply(in_its_order);
    }
}

/// A packed product with matrixmultiply's bits: `(m, k, n, A, B, β, C, ldc)`.
#[cfg(target_arch = "x86_64")]
type Product = unsafe fn(usize, usize, usize, super::Operand, super::Operand, f32, *mut f32, usize);

/// `own` against matrixmultiply, on one thread (its CPU time), packing included, at the
/// products of a training step ([`shape_sets`], one share's rows). Alternating pairs
/// (matrixmultiply then Ember, 9 pairs): the median of each, the median and range of the
/// per-pair ratios (matrixmultiply's time ÷ Ember's), and a layer's products weighed by how
/// often a layer runs each.
#[cfg(target_arch = "x86_64")]
fn against_matrixmultiply(own: Product) {
    for (name, shapes) in shape_sets() {
        println!("{name}: matrixmultiply ms, Ember ms (medians), matrixmultiply ÷ Ember median (range)");
        let (mut total_mm, mut total_own) = (0.0, 0.0);
        for (m, k, n, a_t, b_t, what, count) in shapes {
            let (a, b) = (super::tests::values(m * k, 1), super::tests::values(k * n, 2));
            let (ao, bo) = super::tests::operands(&a, &b, (m, k, n), a_t, b_t);
            let mut c = vec![0f32; m * n];
            let reps = (1e9 / (m * k * n) as f64).clamp(1.0, 500.0) as usize;
            let time = |ours: bool| {
                let t = thread_cpu_secs();
                for _ in 0..reps {
                    // SAFETY: the operands and C hold these shapes.
                    unsafe {
                        if ours {
                            own(m, k, n, ao, bo, 0.0, c.as_mut_ptr(), n);
                        } else {
                            super::by_matrixmultiply(m, k, n, ao, bo, 0.0, c.as_mut_ptr(), n);
                        }
                    }
                }
                (thread_cpu_secs() - t) / reps as f64
            };
            let p = nine_pairs(time);
            total_mm += p.first * count as f64;
            total_own += p.second * count as f64;
            p.print(what, (m, k, n), "Ember");
        }
        println!(
            "  {:>18} layer: {:.3} ms matrixmultiply, {:.3} ms Ember, {:.2}×",
            "all",
            total_mm * 1e3,
            total_own * 1e3,
            total_mm / total_own
        );
    }
}

/// Two timings of the same work, alternated: their medians and the median and range of the
/// per-pair ratios (first ÷ second).
struct Paired {
    first: f64,
    second: f64,
    ratio: f64,
    lowest: f64,
    highest: f64,
}

impl Paired {
    /// A product's line: both medians in ms, the ratio and its range, and the second's GFLOP/s.
    fn print(&self, what: &str, (m, k, n): (usize, usize, usize), second: &str) {
        println!(
            "  {what:>18} {m:>4}×{k:>4}×{n:>4}: {:7.3} {:7.3}  {:.2}× ({:.2}–{:.2})  {second} {:5.1} GFLOP/s",
            self.first * 1e3,
            self.second * 1e3,
            self.ratio,
            self.lowest,
            self.highest,
            2.0 * (m * k * n) as f64 / self.second / 1e9
        );
    }
}

/// Nine pairs of `time(false)` then `time(true)`: other tenants of a shared machine slow both
/// alike.
fn nine_pairs(mut time: impl FnMut(bool) -> f64) -> Paired {
    let (mut firsts, mut seconds, mut ratios) = (vec![], vec![], vec![]);
    for _ in 0..9 {
        let (x, y) = (time(false), time(true));
        firsts.push(x);
        seconds.push(y);
        ratios.push(x / y);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (first, second, ratio) = (median(&mut firsts), median(&mut seconds), median(&mut ratios));
    Paired {
        first,
        second,
        ratio,
        lowest: ratios[0],
        highest: ratios[ratios.len() - 1],
    }
}

/// Whether a timing test runs here: where the CPU lacks what it times (`available` false) it
/// says so, naming `missing`, and the test returns; else the kernels are set to one thread.
pub(crate) fn on_one_thread(available: bool, missing: &str) -> bool {
    if !available {
        println!("no {missing} here");
        return false;
    }
    crate::par::set_threads(1).unwrap();
    true
}

/// Seconds of CPU time this thread has run.
pub(crate) fn thread_cpu_secs() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer for the call.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}
