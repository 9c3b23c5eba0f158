//! Not tests: where a bf16 product's time goes on AMX, and what the tiles can do at best.
//! Each prints its figures; run one with `cargo test --release -p ember-kernels --lib
//! gemm::bf16::timing::NAME -- --ignored --nocapture`. One thread, timed by its own CPU time.

use super::amx::{self, TileUnit};
use super::pack::{pack_a, ASource};
use super::{pack_b_for, run, Kernel, NR};
use crate::gemm::tests::{operands, values};
use crate::gemm::timing::{on_one_thread, thread_cpu_secs};
use crate::par::SharedMut;

/// A buffer of `len` u32 or f32 whose first element starts `skew` elements past a cache line.
struct Lined<T> {
    buf: Vec<T>,
    start: usize,
}

impl<T: Copy> Lined<T> {
    fn new(len: usize, fill: T, skew: usize) -> Self {
        let buf = vec![fill; len + 16 + skew];
        let start = buf.as_ptr().align_offset(64) + skew;
        Self { buf, start }
    }
    fn ptr(&self) -> *const T {
        self.buf[self.start..].as_ptr()
    }
    fn ptr_mut(&mut self) -> *mut T {
        self.buf[self.start..].as_mut_ptr()
    }
}

/// Seconds of this thread's CPU time per call of `f`, over `reps` calls.
fn per_call(reps: usize, mut f: impl FnMut()) -> f64 {
    let t = thread_cpu_secs();
    for _ in 0..reps {
        f();
    }
    (thread_cpu_secs() - t) / reps as f64
}

/// The bf16 products of nanoGPT's standard shape (a share of 2,048 rows) on AMX, part by part:
/// B's packing, A's conversion into rows of pairs, the tiles' steps over the converted operands
/// (with C on a cache line, and 16 bytes past one as glibc aligns it), and the whole product as
/// the ops call it. GFLOP/s are the product's flops over each part's time: best of 7 rounds,
/// the parts alternating within a round.
#[test]
#[ignore]
fn amx_product_parts_at_the_standard_shape() {
    if !on_one_thread(amx::available(), "AMX") {
        return;
    }
    // (m, k, n, A transposed, B transposed, what)
    let shapes = [
        (2048, 384, 384, false, true, "fwd x·Wᵀ q/k/v/o"),
        (2048, 384, 1536, false, true, "fwd x·Wᵀ up"),
        (2048, 1536, 384, false, true, "fwd x·Wᵀ down"),
        (2048, 384, 384, false, false, "dX g·W q/k/v/o"),
        (2048, 1536, 384, false, false, "dX g·W up"),
        (384, 2048, 384, true, false, "dW gᵀ·x q/k/v/o"),
        (1536, 2048, 384, true, false, "dW gᵀ·x up"),
        (384, 2048, 1536, true, false, "dW gᵀ·x down"),
    ];
    println!("GFLOP/s: pack B, convert A, steps (C on a line), steps (C 16 bytes past), whole");
    for (m, k, n, a_t, b_t, what) in shapes {
        let (a, b) = (values(m * k, 1), values(k * n, 2));
        let (mut lined, mut skewed) = (Lined::new(m * n, 0f32, 0), Lined::new(m * n, 0f32, 4));
        let (ao, bo) = operands(&a, &b, (m, k, n), a_t, b_t);
        let reps = (2e9 / (m * k * n) as f64).clamp(2.0, 100.0) as usize;
        let mut best = [f64::MAX; 5];
        let time = |best: &mut f64, f: &mut dyn FnMut()| *best = best.min(per_call(reps, f));
        for _ in 0..7 {
            // SAFETY: the operands and C hold these shapes; AMX's state was granted.
            unsafe {
                time(&mut best[0], &mut || {
                    std::hint::black_box(pack_b_for(Kernel::Amx, k, n, bo));
                });
                time(&mut best[1], &mut || {
                    std::hint::black_box(pack_a(Kernel::Amx, m, k, ao));
                });
                let (pa, pb) = (pack_a(Kernel::Amx, m, k, ao), pack_b_for(Kernel::Amx, k, n, bo));
                for (part, c) in [(2, lined.ptr_mut()), (3, skewed.ptr_mut())] {
                    time(&mut best[part], &mut || {
                        run(
                            ASource::Packed(&pa),
                            &pb,
                            0..m,
                            0..n,
                            pb.pairs(),
                            0.0,
                            SharedMut(c),
                            n,
                        )
                    });
                }
                let c = lined.ptr_mut();
                time(&mut best[4], &mut || {
                    super::gemm_with(Kernel::Amx, m, k, n, ao, bo, 0.0, c, n)
                });
            }
        }
        let gflops = best.map(|t| format!("{:6.0}", 2.0 * (m * k * n) as f64 / t / 1e9));
        println!("  {what:>18} {m:>4}×{k:>4}×{n:>4}: {}", gflops.join(" "));
    }
}

/// The tiles' ceiling: `tdpbf16ps` alone (four chains), with the step's four tile loads from
/// L1 (64-byte rows on cache lines, and 16 bytes past them), the loads alone, and whole 32×32
/// steps over k of 32–192 pairs with both operands in L1.
#[test]
#[ignore]
fn amx_tiles_in_l1() {
    if !amx::available() {
        println!("no AMX here");
        return;
    }
    let mut unit = amx::Hardware;
    let per_dot = 2.0 * 16.0 * 16.0 * 32.0;
    for skew in [0, 4] {
        let (a, b) = (
            Lined::new(4 * 512, 0x3f80_3f80u32, skew),
            Lined::new(4 * 512, 0x3f80_3f80u32, skew),
        );
        for (name, loads, dots) in [
            ("dots", false, true),
            ("loads and dots", true, true),
            ("loads", true, false),
        ] {
            let reps = 200_000;
            let mut best = f64::MAX;
            for _ in 0..5 {
                // SAFETY: every load reads inside `a` and `b`; AMX's state was granted.
                unsafe {
                    unit.configure();
                    unit.zero::<0>();
                    unit.zero::<1>();
                    unit.zero::<2>();
                    unit.zero::<3>();
                    unit.load::<4>(a.ptr(), 64);
                    unit.load::<5>(a.ptr(), 64);
                    unit.load::<6>(b.ptr(), 128);
                    unit.load::<7>(b.ptr(), 128);
                    let mut r = 0;
                    let t = per_call(reps, || {
                        let o = (r % 4) * 256;
                        r += 1;
                        if loads {
                            unit.load::<4>(a.ptr().add(o), 64);
                            unit.load::<5>(a.ptr().add(o + 256), 64);
                            unit.load::<6>(b.ptr().add(o), 128);
                            unit.load::<7>(b.ptr().add(o + 16), 128);
                        }
                        if dots {
                            unit.dot::<0, 4, 6>();
                            unit.dot::<1, 4, 7>();
                            unit.dot::<2, 5, 6>();
                            unit.dot::<3, 5, 7>();
                        }
                    });
                    best = best.min(t);
                    unit.release();
                }
            }
            let rate = if dots {
                format!("{:.0} GFLOP/s", 4.0 * per_dot / best / 1e9)
            } else {
                String::new()
            };
            println!(
                "{name:>15}, rows {:>2} bytes past a line: {:5.1} ns per 4 {rate}",
                skew * 4,
                best * 1e9
            );
        }
    }
    for kq in [32usize, 96, 192] {
        let (a, b) = (
            Lined::new(32 * kq, 0x3f80_3f80u32, 0),
            Lined::new(kq * NR, 0x3f80_3f80u32, 0),
        );
        let mut c = Lined::new(32 * NR, 0f32, 0);
        let reps = 20_000;
        let mut best = f64::MAX;
        for _ in 0..5 {
            // SAFETY: the operands and C hold these shapes; AMX's state was granted.
            unsafe {
                unit.configure();
                let t = per_call(reps, || {
                    let step = amx::Step {
                        kq,
                        a: a.ptr(),
                        lda: kq,
                        b: b.ptr(),
                        c: c.ptr_mut(),
                        ldc: NR,
                        rows: 32,
                        width: 32,
                        beta: 0.0,
                        resume: false,
                        next: std::ptr::null(),
                        asked: false,
                    };
                    amx::step(&mut unit, step);
                });
                best = best.min(t);
                unit.release();
            }
        }
        println!(
            "a step over {kq:>3} pairs in L1: {:.0} GFLOP/s",
            2.0 * 32.0 * 32.0 * 2.0 * kq as f64 / best / 1e9
        );
    }
}

/// dW's operands from matrices rounded beforehand at the standard shape (a share of 2,048
/// rows): g's transpose as A ([`super::rounded::pack_transposed`]) and x's strips as B
/// ([`super::rounded::pack_b_rounded`]), in GB/s of bf16 read; several matrices in turn, so
/// that each is read from beyond L2 as in training. Best of 7 rounds.
#[test]
#[ignore]
fn amx_weight_grad_operands() {
    if !on_one_thread(amx::available(), "AMX") {
        return;
    }
    println!(
        "GB/s of bf16 read: transposed A, strips of B, transposed A in blocks of {} rows",
        super::MC
    );
    for cols in [384, 1536] {
        let rows = 2048;
        let made: Vec<super::Rounded> = (0..8)
            .map(|i| super::Rounded::new(rows, cols, &values(rows * cols, i)))
            .collect();
        let (mut transposed, mut strips, mut blocks) = (0f64, 0f64, 0f64);
        let mut buf = super::pack::Aligned::default();
        for _ in 0..7 {
            let mut i = 0;
            let t = per_call(16, || {
                std::hint::black_box(super::rounded::pack_transposed(Kernel::Amx, &made[i % 8]));
                i += 1;
            });
            transposed = transposed.max((rows * cols * 2) as f64 / t / 1e9);
            let t = per_call(16, || {
                std::hint::black_box(super::rounded::pack_b_rounded(Kernel::Amx, &made[i % 8]));
                i += 1;
            });
            strips = strips.max((rows * cols * 2) as f64 / t / 1e9);
            let t = per_call(16, || {
                for ic in (0..cols).step_by(super::MC) {
                    // SAFETY: the rows are g's columns; AMX (checked above) implies AVX-512.
                    let rows_of_a = ic..cols.min(ic + super::MC);
                    std::hint::black_box(unsafe {
                        super::rounded::convert_transposed(Kernel::Amx, &made[i % 8], rows_of_a, &mut buf)
                    });
                }
                i += 1;
            });
            blocks = blocks.max((rows * cols * 2) as f64 / t / 1e9);
        }
        println!("    {rows}×{cols:>4}: {transposed:7.1} {strips:7.1} {blocks:7.1}");
    }
}
