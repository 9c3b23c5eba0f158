//! bf16 products in software, for a CPU without AVX512_BF16 where the user asks for them
//! ([`BF16_ENV`]`=emulate`, or [`emulate_bf16_products`]). Each element of C is what the
//! `vdpbf16ps` kernel ([`super::bf16`]) computes, step by step: the operands rounded to bf16 as
//! the hardware rounds them ([`to_bf16`]), `acc = (acc + a₁·b₁) + a₀·b₀` over k's pairs in
//! order, each step one fused multiply-add whose result is flushed to a zero of its sign where
//! it is a denormal (Intel's definition of the instruction: "FP32 FMA with DAZ in, FTZ out"),
//! then `β·C + acc` in one fused multiply-add. The products therefore have the bits that
//! AVX512_BF16 gives them, and the rest of a step is the vector unit's, as in f32: on an
//! AVX-512 CPU without AVX512_BF16 (Skylake-X, Ice Lake) a run should give a Zen 4's bits (no
//! such CPU has run it), and on an AVX2 one those of any AVX2 machine with the emulation. AMX's
//! tiles sum in another order. Parts of a product ([`gemm_packed_parts`]) must lie as the
//! hardware kernel's must, so that what runs here runs there.
//!
//! It is not fast and cannot be: it does f32's multiplies plus the rounding and the flushing,
//! vectorised over C's columns but with no register tiling, and a run says at its start how many
//! times slower than f32 it measured it ([`emulation_slowdown`]). What it is for: checking a bf16
//! configuration, and running the bf16 tests, on a CPU that cannot run bf16 itself. Without the
//! request, bf16 products are refused there, naming the missing feature.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use super::{Mat, Operand, Part};
use crate::par::{self, SharedMut};
use crate::simd::simd_dispatch;

/// Set to `emulate` to run bf16 products in software where the CPU cannot run them itself (read
/// once per process): it has no AVX512_BF16, or `EMBER_CPU_VECTOR_UNIT` turned AVX-512 off. A
/// process that runs them natively ignores the request.
pub const BF16_ENV: &str = "EMBER_CPU_BF16";

static ASKED: AtomicBool = AtomicBool::new(false);

/// Emulates bf16 products from now on where the CPU cannot run them, as [`BF16_ENV`]`=emulate`
/// does (for tests, which cannot set the environment before their process starts).
pub fn emulate_bf16_products() {
    ASKED.store(true, Ordering::Relaxed);
}

/// Whether the user asked for the emulation ([`BF16_ENV`] or [`emulate_bf16_products`]).
pub(crate) fn asked() -> bool {
    static FROM_ENV: OnceLock<bool> = OnceLock::new();
    ASKED.load(Ordering::Relaxed)
        || *FROM_ENV.get_or_init(|| {
            let Ok(v) = std::env::var(BF16_ENV) else {
                return false;
            };
            match v.trim().to_ascii_lowercase().as_str() {
                "emulate" => true,
                "" | "native" => false,
                _ => {
                    eprintln!(
                        "warning: {BF16_ENV}={v:?} is not `emulate` (or `native`); bf16 products stay native"
                    );
                    false
                }
            }
        })
}

/// f32 → bf16 bits as `vcvtneps2bf16` rounds: to nearest even; a NaN stays a (quiet) NaN;
/// a denormal (and a zero) becomes a zero of its sign.
pub(crate) fn to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    if bits & 0x7f80_0000 == 0 {
        return ((bits >> 16) & 0x8000) as u16;
    }
    ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}

/// `x` rounded to bf16 as [`to_bf16`] rounds it, as an f32 (exact).
pub(crate) fn round(x: f32) -> f32 {
    f32::from_bits((to_bf16(x) as u32) << 16)
}

/// `x`, a denormal flushed to a zero of its sign (a zero stays itself). Written on the bits so
/// that the loops over it vectorise.
#[inline(always)]
fn flushed(x: f32) -> f32 {
    let bits = x.to_bits();
    f32::from_bits(if bits & 0x7f80_0000 == 0 {
        bits & 0x8000_0000
    } else {
        bits
    })
}

/// Where the parts of a product may start and end ([`gemm_packed_parts`]): the hardware
/// kernel's strips of 32 columns and steps of 16 pairs of k.
const PART_ALIGN: usize = 32;
#[cfg(target_arch = "x86_64")]
const _: () = assert!(PART_ALIGN == super::bf16::NR && PART_ALIGN == 2 * super::bf16::amx::KQ_STEP);

/// Columns of C summed at once: a row's sums stay in L1 while B's rows pass.
const COLUMNS: usize = 512;

/// Multiply-adds per task of a product (whole rows of C): enough to pay for a task.
const TASK_FMAS: usize = 1 << 17;

/// B (k×n) rounded to bf16 once for several products, row-major, k padded to whole pairs with a
/// row of zeros (as the hardware kernel pads its strips).
pub(crate) struct Packed {
    k: usize,
    n: usize,
    values: Vec<f32>,
}

impl Packed {
    /// B's k×n view, rounded.
    ///
    /// # Safety
    /// Every element of B's k×n view is readable.
    pub(crate) unsafe fn new(k: usize, n: usize, b: Operand) -> Self {
        let len = k
            .next_multiple_of(2)
            .checked_mul(n)
            .expect("emulated bf16 product: B too large");
        let mut values = vec![0f32; len];
        for (p, row) in values.chunks_exact_mut(n.max(1)).take(k).enumerate() {
            for (j, v) in row.iter_mut().enumerate() {
                *v = round(element(&b, p, j));
            }
        }
        Self { k, n, values }
    }

    /// A row-major matrix's view, rounded.
    pub(crate) fn of(k: usize, n: usize, b: Mat<'_>) -> Self {
        assert!(b.fits(k, n), "sgemm: operand out of bounds");
        // SAFETY: B's k×n view is in bounds (asserted).
        unsafe { Self::new(k, n, b.operand()) }
    }

    pub(crate) fn dims(&self) -> (usize, usize) {
        (self.k, self.n)
    }
}

/// `C = A·B + beta·C` for A (m×k), B (k×n) and C's rows `ldc` apart, in bf16 as the `vdpbf16ps`
/// kernel computes it.
///
/// # Safety
/// As [`super::gemm`]: the operands' views are readable, C's m×n elements writable (readable for
/// β ≠ 0) and touched by no one else meanwhile.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm(
    m: usize,
    k: usize,
    n: usize,
    a: Operand,
    b: Operand,
    beta: f32,
    c: *mut f32,
    ldc: usize,
) {
    gemm_packed(m, a, &Packed::new(k, n, b), beta, c, ldc)
}

/// [`gemm`] with B rounded beforehand.
///
/// # Safety
/// As [`gemm`].
pub(crate) unsafe fn gemm_packed(m: usize, a: Operand, b: &Packed, beta: f32, c: *mut f32, ldc: usize) {
    let part = (0..m, 0..b.n, 0..b.k);
    gemm_packed_parts(a, b, std::slice::from_ref(&part), beta, c, ldc)
}

/// `C = A·B + beta·C` over parts of C, each its rows × columns over k's elements `ks` alone
/// (see [`super::PartsOf::products`]), B rounded beforehand. As for the hardware kernel, a
/// part's `ks` is empty (its sum is zero: β·C) or starts on a multiple of [`PART_ALIGN`] and
/// ends on one or at k, and its columns start on one; so its pairs are the whole product's.
///
/// # Safety
/// A's rows of every part × `ks` are readable; C's parts, rows `ldc` apart from `c`, are
/// writable (readable for β ≠ 0) and touched by no one else meanwhile.
pub(crate) unsafe fn gemm_packed_parts(
    a: Operand,
    b: &Packed,
    parts: &[Part],
    beta: f32,
    c: *mut f32,
    ldc: usize,
) {
    let c = SharedMut(c);
    for (rows, cols, ks) in parts.iter().filter(|(r, c, _)| !r.is_empty() && !c.is_empty()) {
        assert!(
            (ks.is_empty() || ks.start.is_multiple_of(PART_ALIGN))
                && ks.start <= ks.end
                && (ks.end == b.k || (ks.end < b.k && ks.end.is_multiple_of(PART_ALIGN)))
                && cols.start.is_multiple_of(PART_ALIGN)
                && cols.start <= cols.end
                && cols.end <= b.n,
            "bf16 product part: rows {rows:?}, k {ks:?} of {} or columns {cols:?} of {} off the blocks",
            b.k,
            b.n
        );
        let ks = if ks.is_empty() { 0..0 } else { ks.clone() };
        let pairs = ks.len().div_ceil(2);
        // B's rows from ks.start, the padding row included where ks ends at an odd k.
        let b_rows = &b.values[ks.start * b.n..(ks.start + 2 * pairs) * b.n];
        let per_task = (TASK_FMAS / (ks.len() * cols.len()).max(1)).max(1);
        par::for_each_chunk(rows.len(), per_task, |chunk| {
            let mut a_row = vec![0f32; 2 * pairs];
            let mut acc = vec![0f32; cols.len().min(COLUMNS)];
            for i in chunk.start + rows.start..chunk.end + rows.start {
                for (p, v) in ks.clone().zip(a_row.iter_mut()) {
                    *v = round(element(&a, i, p));
                }
                for j0 in cols.clone().step_by(COLUMNS) {
                    let acc = &mut acc[..COLUMNS.min(cols.end - j0)];
                    pair_sums(&a_row, b_rows, b.n, j0, acc);
                    // Row i's columns of this part are this task's alone (tasks split the part's
                    // rows; the caller keeps parts apart); C is read only for β ≠ 0 (it may be
                    // uninitialised otherwise), so it is reached through raw pointers.
                    for (j, &s) in acc.iter().enumerate() {
                        let out = c.at(i * ldc + j0 + j);
                        *out = if beta != 0.0 { beta.mul_add(*out, s) } else { s };
                    }
                }
            }
        });
    }
}

/// Element (r, c) of an operand (taking it whole, so that closures capture the `Sync` operand
/// rather than its raw pointer).
///
/// # Safety
/// The element is readable.
unsafe fn element(x: &Operand, r: usize, c: usize) -> f32 {
    *x.ptr.add(r * x.row_stride + c * x.col_stride)
}

simd_dispatch!(pair_sums => pair_sums_generic(a: &[f32], b: &[f32], ldb: usize, j0: usize, acc: &mut [f32]) -> ());

/// `acc[j] = Σ over the pairs q of a: (acc + a[2q+1]·b[2q+1][j0 + j]) + a[2q]·b[2q][j0 + j]`,
/// from zero, each step a fused multiply-add flushed as `vdpbf16ps` flushes its results (the
/// operands are rounded already, and a rounded operand is never a denormal).
#[inline(always)]
fn pair_sums_generic(a: &[f32], b: &[f32], ldb: usize, j0: usize, acc: &mut [f32]) {
    acc.fill(0.0);
    let w = acc.len();
    for (q, a) in a.chunks_exact(2).enumerate() {
        let (a0, a1) = (a[0], a[1]);
        let b0 = &b[2 * q * ldb + j0..][..w];
        let b1 = &b[(2 * q + 1) * ldb + j0..][..w];
        for ((s, &x0), &x1) in acc.iter_mut().zip(b0).zip(b1) {
            let odd = flushed(a1.mul_add(x1, *s));
            *s = flushed(a0.mul_add(x0, odd));
        }
    }
}

/// A rows × cols activation rounded to bf16 for emulated products, held in f32 (whose values
/// the rounding makes exact), row-major.
pub(crate) struct Rounded {
    rows: usize,
    cols: usize,
    values: Vec<f32>,
}

impl Rounded {
    /// `x` (rows × cols, row-major) rounded.
    pub(crate) fn new(rows: usize, cols: usize, x: &[f32]) -> Self {
        let len = rows.checked_mul(cols).expect("Rounded: too many elements");
        assert!(x.len() >= len, "Rounded: {rows}×{cols} from {} elements", x.len());
        let values = x[..len].iter().map(|&v| round(v)).collect();
        Self { rows, cols, values }
    }

    /// A rows × cols matrix made in blocks of rows by `fill(rows, out)` and rounded as it is made.
    pub(crate) fn from_rows_with(
        rows: usize,
        cols: usize,
        fill: impl Fn(std::ops::Range<usize>, &mut [std::mem::MaybeUninit<f32>]) + Sync + Send,
    ) -> Self {
        let values = match cols {
            0 => Vec::new(),
            _ => par::fill(
                rows.checked_mul(cols).expect("Rounded: too many elements"),
                par::rows_per_task(cols) * cols,
                |range, out| {
                    let first = range.start / cols;
                    fill(first..first + range.len() / cols, out);
                    for v in out.iter_mut() {
                        // SAFETY: `fill` wrote every element of its block.
                        let x = unsafe { v.assume_init() };
                        v.write(round(x));
                    }
                },
            ),
        };
        Self { rows, cols, values }
    }

    pub(crate) fn dims(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// The values as a rows × cols matrix (`transposed`: its transpose, cols × rows), checked
    /// against the shape a product reads it as.
    pub(crate) fn as_mat(&self, (rows, cols): (usize, usize), transposed: bool) -> Mat<'_> {
        let want = if transposed { (cols, rows) } else { (rows, cols) };
        assert_eq!(
            self.dims(),
            want,
            "emulated bf16 product: an operand of another shape"
        );
        let m = Mat::rows(&self.values, self.cols);
        if transposed {
            m.t()
        } else {
            m
        }
    }
}

/// How many times longer a product takes emulated than in f32 on this machine, measured now:
/// the median of three alternating pairs of a 256 × 256 × 256 product (on the kernels' threads).
pub fn emulation_slowdown() -> f64 {
    let (m, k, n) = (256, 256, 256);
    let a: Vec<f32> = (0..m * k)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0)
        .collect();
    let b: Vec<f32> = (0..k * n).map(|i| ((i * 53 % 97) as f32 - 48.0) / 64.0).collect();
    let mut c = vec![0f32; m * n];
    let (am, bm) = (Mat::rows(&a, k), Mat::rows(&b, n));
    let mut timed = |emulated: bool| {
        let start = std::time::Instant::now();
        if emulated {
            // SAFETY: the operands and C hold their m×k, k×n and m×n elements.
            unsafe { gemm(m, k, n, am.operand(), bm.operand(), 0.0, c.as_mut_ptr(), n) }
        } else {
            super::sgemm(m, k, n, am, bm, 0.0, &mut c);
        }
        start.elapsed().as_secs_f64()
    };
    timed(false);
    timed(true);
    let mut ratios: Vec<f64> = (0..3)
        .map(|_| {
            let f32_time = timed(false);
            timed(true) / f32_time.max(1e-9)
        })
        .collect();
    ratios.sort_by(f64::total_cmp);
    ratios[1]
}
