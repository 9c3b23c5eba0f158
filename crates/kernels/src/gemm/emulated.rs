//! bf16 products in software, for a CPU without AVX512_BF16 where the user asks for them
//! ([`BF16_ENV`]`=emulate`, or [`emulate_bf16_products`]). Each element of C is what the
//! `vdpbf16ps` kernel ([`super::bf16`]) computes, step by step: the operands rounded to bf16 as
//! the hardware rounds them ([`to_bf16`]), `acc = (acc + a₁·b₁) + a₀·b₀` over k's pairs in
//! order, each step one fused multiply-add whose result is flushed to a zero of its sign where
//! it is tiny ([`fma_flushed`]; Intel's definition of the instruction: "FP32 FMA with DAZ in,
//! FTZ out"),
//! then `β·C + acc` in one fused multiply-add. The products therefore have the bits that
//! AVX512_BF16 gives them, and the rest of a step is the vector unit's, as in f32: on an
//! AVX-512 CPU without AVX512_BF16 (Skylake-X, Ice Lake) a run should give a Zen 4's bits (no
//! such CPU has run it), and on an AVX2 one those of any AVX2 machine with the emulation. AMX's
//! tiles sum in another order. Parts of a product ([`gemm_packed_parts`]) must lie as the
//! hardware kernel's must, so that what runs here runs there.
//!
//! How: C in tiles of 6 rows × 16 columns whose sums stay in registers while k passes (B in
//! panels of 16 columns, A in tiles of 6 rows, both rounded as they are packed), k in blocks
//! of 192 whose sums are set aside and taken up again (one chain all the same). The flushing
//! costs more than the multiply-add it follows, and it is only needed where a sum can be a
//! denormal: where the operands' smallest magnitudes make every product a multiple of a normal
//! number, no sum can be one ([`unflushed_is_exact`]), and the tile's steps are plain fused
//! multiply-adds — the same bits. Training's values are far from that edge; operands near it
//! (magnitudes whose product is below 2⁻¹¹²) are summed flushing every step. An activation kept
//! rounded for several products ([`Rounded`]) holds bf16's 16 bits per value, as it does where
//! the CPU runs bf16 itself, so a run takes the memory here that it takes there.
//!
//! It is still slower than f32 (the rounding, the packing, and a tile smaller than the f32
//! kernels'), and a run says at its start how many times slower it measured a product
//! ([`bf16_slowdown`](super::bf16_slowdown)). What it is for: checking a bf16 configuration,
//! and running the bf16 tests, on a CPU that cannot run bf16 itself. Without the request, bf16
//! products are refused there, naming the missing feature.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::OnceLock;

use super::{Bits, Mat, Operand, Part};

mod rounded;
use crate::par::{self, SharedMut};
use crate::simd::simd_dispatch;
pub(crate) use rounded::{product, Rounded};

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
#[inline(always)]
pub(crate) fn to_bf16(x: f32) -> u16 {
    (rounded_bits(x.to_bits()) >> 16) as u16
}

/// `x` rounded to bf16 as [`to_bf16`] rounds it, as an f32 (exact): the tests' references.
#[cfg(test)]
pub(crate) fn round(x: f32) -> f32 {
    f32::from_bits(rounded_bits(x.to_bits()))
}

/// An f32's bits rounded to bf16 as [`to_bf16`] rounds them, in the high half (the low half
/// zero). Without branches, so that the loops over it vectorise.
#[inline(always)]
fn rounded_bits(bits: u32) -> u32 {
    let nan = bits & 0x7fff_ffff > 0x7f80_0000;
    let tiny = bits & 0x7f80_0000 == 0;
    let nearest = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) & 0xffff_0000;
    if nan {
        (bits | 0x0040_0000) & 0xffff_0000
    } else if tiny {
        bits & 0x8000_0000
    } else {
        nearest
    }
}

simd_dispatch!(pub(super) round_in_place => round_in_place_generic(values: &mut [f32]) -> u32);

/// The values rounded as [`round`] rounds them, in place; returns the smallest
/// [`exponent_field`] of the rounded values.
#[inline(always)]
fn round_in_place_generic(values: &mut [f32]) -> u32 {
    let mut least = 255;
    for v in values.iter_mut() {
        let bits = rounded_bits(v.to_bits());
        *v = f32::from_bits(bits);
        least = least.min(exponent_field(bits));
    }
    least
}

simd_dispatch!(pub(crate) round_into => round_into_generic(x: &[f32], out: &mut [std::mem::MaybeUninit<u16>]) -> ());

/// `out[i]` = `x[i]` rounded to bf16 as [`to_bf16`] rounds it (every element of `out` written).
#[inline(always)]
fn round_into_generic(x: &[f32], out: &mut [std::mem::MaybeUninit<u16>]) {
    assert_eq!(x.len(), out.len());
    for (o, &v) in out.iter_mut().zip(x) {
        o.write(to_bf16(v));
    }
}

simd_dispatch!(round_into_least => round_into_least_generic(x: &[f32], out: &mut [u16]) -> u32);

/// `out[i]` = `x[i]` rounded to bf16 as [`to_bf16`] rounds it; returns the smallest
/// [`exponent_field`] of the rounded values.
#[inline(always)]
fn round_into_least_generic(x: &[f32], out: &mut [u16]) -> u32 {
    assert_eq!(x.len(), out.len());
    let mut least = 255;
    for (o, &v) in out.iter_mut().zip(x) {
        let bits = rounded_bits(v.to_bits());
        *o = (bits >> 16) as u16;
        least = least.min(exponent_field(bits));
    }
    least
}

/// A value's exponent field, 255 for a zero (as for an infinity or a NaN): the smallest over
/// an operand is that of its smallest nonzero magnitude.
#[inline(always)]
fn exponent_field(bits: u32) -> u32 {
    match (bits >> 23) & 0xff {
        0 => 255,
        e => e,
    }
}

/// `x·y + s` as one step of `vdpbf16ps` or `tdpbf16ps`: a fused multiply-add whose result is
/// flushed to a zero of its sign where it is tiny, and tiny means below the smallest normal
/// (2⁻¹²⁶) once rounded to 24 bits with an unbounded exponent — x86's "tininess after
/// rounding", which both instructions follow on an AMX Xeon
/// (`a_sum_just_below_the_smallest_normal_gives_the_hardwares_bits`). A plain fused multiply-add
/// rounds onto the denormals' coarser grid instead, where an exact sum in [2⁻¹²⁶ − 2⁻¹⁵⁰,
/// 2⁻¹²⁶ − 2⁻¹⁵¹) rounds up to 2⁻¹²⁶, which the hardware flushes. That is the only result the
/// two roundings disagree on, so only there is the step taken again 2⁶⁴ times larger, where it
/// rounds with f32's full precision and is tiny below 2⁻⁶². Scaling by a power of two is exact
/// short of overflow, and a sum that cancels to 2⁻¹²⁶ cannot have terms large enough to
/// overflow: its terms are multiples of a step of at most 2⁻¹²⁶, so |x·y| stays far below 1.
/// (Where y is zero and x huge, x·2⁶⁴ is infinite and the product NaN, which is not below 2⁻⁶²:
/// t = s is kept, as it should be.) Written on the bits so that the loops over it vectorise.
#[inline(always)]
pub(in crate::gemm) fn fma_flushed(x: f32, y: f32, s: f32) -> f32 {
    const SMALLEST_NORMAL: u32 = 0x0080_0000;
    let scale = 2f32.powi(64);
    let t = x.mul_add(y, s);
    let (bits, magnitude) = (t.to_bits(), t.to_bits() & 0x7fff_ffff);
    let scaled = (x * scale).mul_add(y, s * scale).to_bits() & 0x7fff_ffff;
    let rounded_up_to_normal = (magnitude == SMALLEST_NORMAL) & (scaled < SMALLEST_NORMAL + (64 << 23));
    f32::from_bits(if magnitude < SMALLEST_NORMAL || rounded_up_to_normal {
        bits & 0x8000_0000
    } else {
        bits
    })
}

/// An element an emulated product gathers its operands from — an f32 (rounded once gathered)
/// or the bits of a bf16 kept rounded ([`Rounded`]), widened exactly — or that the feed-forward
/// activation's kernels read what they kept from (`held`).
pub(crate) trait Element: Copy {
    fn widen(self) -> f32;
}

impl Element for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

impl Element for u16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        f32::from_bits(u32::from(self) << 16)
    }
}

/// An operand's elements: (i, j) at `ptr + i·row_stride + j·col_stride`, f32 values or bf16 bits.
pub(crate) struct Lines<T> {
    ptr: *const T,
    row_stride: usize,
    col_stride: usize,
}

impl<T> Clone for Lines<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Lines<T> {}

// SAFETY: an operand is only read, by tasks of a parallel region its owner outlives.
unsafe impl<T> Send for Lines<T> {}
unsafe impl<T> Sync for Lines<T> {}

impl From<Operand> for Lines<f32> {
    fn from(o: Operand) -> Self {
        Self {
            ptr: o.ptr,
            row_stride: o.row_stride,
            col_stride: o.col_stride,
        }
    }
}

impl From<Bits<'_>> for Lines<u16> {
    fn from(b: Bits<'_>) -> Self {
        Self {
            ptr: b.data.as_ptr(),
            row_stride: b.row_stride,
            col_stride: b.col_stride,
        }
    }
}

/// Where the parts of a product may start and end ([`gemm_packed_parts`]): the hardware
/// kernel's strips of 32 columns and steps of 16 pairs of k.
const PART_ALIGN: usize = 32;
#[cfg(target_arch = "x86_64")]
const _: () = assert!(PART_ALIGN == super::bf16::NR && PART_ALIGN == 2 * super::bf16::amx::KQ_STEP);

/// Columns of C in a panel of B and in a tile of sums (one cache line of each of B's rows; two
/// AVX2 registers, one AVX-512 register, per row of the tile).
const NR: usize = 16;
/// Rows of C in a tile of sums: 6 × 16 sums fill twelve of AVX2's sixteen registers, leaving
/// room for B's two vectors and A's broadcast.
const MR: usize = 6;
/// k's elements a tile sums before its sums are set aside for the next block of k (an even
/// number, so that blocks keep k's pairs whole): a tile of A (6 × 192) and a panel of B
/// (192 × 16) then fit in L1 together. Setting the sums aside and taking them up again changes
/// no bit: each element's sum is still one chain of steps in k's order.
pub(super) const KC: usize = 192;
/// Rows of C whose packed A (a block of k at a time, 72 KiB) a task keeps while B's panels pass:
/// each panel of B, read from L1, serves all of them.
const BLOCK_ROWS: usize = 16 * MR;
const _: () = assert!(PART_ALIGN.is_multiple_of(NR) && KC.is_multiple_of(2));

/// Multiply-adds per task of a product (whole tiles of rows of C): enough to pay for a task.
const TASK_FMAS: usize = 1 << 17;

/// Whether sums of products of operands whose smallest nonzero magnitudes have exponent fields
/// `a` and `b` ([`exponent_field`]) can never be denormal, so that flushing them changes
/// nothing. A rounded operand is a bf16 number: an integer times 2^(e − 127 − 7) for its
/// exponent field e, never a denormal. So every product is a multiple of q = 2^(a + b − 268),
/// every sum of them rounds to a multiple of q (exactly where f32's spacing there is at most q,
/// onto f32's coarser grid otherwise), and a nonzero multiple of q is no denormal when
/// q ≥ 2^−126, the smallest normal: a + b ≥ 142. Below that a sum can cancel to a denormal (at
/// a + b = 141, to 2^−127), and the sums are flushed step by step.
pub(crate) fn unflushed_is_exact(a: u32, b: u32) -> bool {
    a + b >= 142
}

/// B (k×n) rounded to bf16 once for several products, in panels of [`NR`] columns, each k
/// (padded to whole pairs) rows of NR values: k is padded as the hardware kernel pads its strips,
/// with a row of zeros, and n with columns of zeros that no sum is written from. The values are
/// bf16's bits, half the memory of f32's (a large B, the output layer's weight, is packed
/// beside the activations), widened a block of k at a time as the tiles read them.
pub(crate) struct Packed {
    k: usize,
    n: usize,
    /// Rows of a panel: k padded to whole pairs.
    rows: usize,
    bits: Vec<u16>,
    /// The smallest [`exponent_field`] of the values.
    exponent: u32,
}

impl Packed {
    /// B's k×n view, rounded.
    ///
    /// # Safety
    /// Every element of B's k×n view is readable.
    pub(crate) unsafe fn new<T: Element>(k: usize, n: usize, b: Lines<T>) -> Self {
        let rows = k.next_multiple_of(2);
        let panels = n.div_ceil(NR);
        let len = panels
            .checked_mul(rows * NR)
            .expect("emulated bf16 product: B too large");
        let mut bits = vec![0u16; len];
        let exponent = AtomicU32::new(255);
        let shared = SharedMut(bits.as_mut_ptr());
        par::for_each_chunk(panels, 1, |panel| {
            let j0 = panel.start * NR;
            let cols = NR.min(n - j0);
            // The panel's f32 values, gathered in scratch of this thread's (no allocation per
            // panel: at small shapes the packing is a tenth of a product).
            let mut values = SCRATCH.with(|s| std::mem::take(&mut *s.borrow_mut()));
            values.resize(rows * NR, 0.0);
            if cols < NR || rows > k {
                // The padding (columns past `cols`, the row past an odd k) is zero.
                values.fill(0.0);
            }
            // SAFETY: the panel's columns of B's k×n view are readable.
            unsafe { gather_panel(&mut values, &b, k, j0..j0 + cols) };
            // SAFETY: each task writes its own panel, in bounds of `bits`.
            let out = unsafe { shared.slice(panel.start * rows * NR, rows * NR) };
            exponent.fetch_min(round_into_least(&values, out), Ordering::Relaxed);
            SCRATCH.with(|s| *s.borrow_mut() = values);
        });
        Self {
            k,
            n,
            rows,
            bits,
            exponent: exponent.into_inner(),
        }
    }

    /// A row-major matrix's view, rounded.
    pub(crate) fn of(k: usize, n: usize, b: Mat<'_>) -> Self {
        assert!(b.fits(k, n), "sgemm: operand out of bounds");
        // SAFETY: B's k×n view is in bounds (asserted).
        unsafe { Self::new(k, n, b.operand().into()) }
    }

    /// B's k×n view of bf16 bits ([`Bits`]), which round to themselves.
    pub(crate) fn of_bits(k: usize, n: usize, b: Bits<'_>) -> Self {
        assert!(b.fits(k, n), "sgemm: operand out of bounds");
        // SAFETY: B's k×n view is in bounds (asserted).
        unsafe { Self::new(k, n, b.into()) }
    }

    pub(crate) fn dims(&self) -> (usize, usize) {
        (self.k, self.n)
    }

    /// `len` rows (an even number) from row `p0` of the panel from column `j0` (a multiple of
    /// NR), widened into `out` (at least `len` rows).
    fn panel_into<'o>(&self, j0: usize, p0: usize, len: usize, out: &'o mut [[f32; NR]]) -> &'o [[f32; NR]] {
        let at = (j0 / NR * self.rows + p0) * NR;
        let out = &mut out[..len];
        widen_into(out.as_flattened_mut(), &self.bits[at..at + len * NR]);
        out
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
    gemm_packed(m, a, &Packed::new(k, n, b.into()), beta, c, ldc)
}

/// [`gemm`] with B rounded beforehand.
///
/// # Safety
/// As [`gemm`].
pub(crate) unsafe fn gemm_packed(m: usize, a: Operand, b: &Packed, beta: f32, c: *mut f32, ldc: usize) {
    let part = (0..m, 0..b.n, 0..b.k);
    gemm_packed_parts(a.into(), b, std::slice::from_ref(&part), beta, c, ldc)
}

/// `C = A·B + beta·C` over parts of C, each its rows × columns over k's elements `ks` alone
/// (see [`super::PartsOf::products`]), B rounded beforehand. As for the hardware kernel, a
/// part's `ks` is empty (its sum is zero: β·C) or starts on a multiple of [`PART_ALIGN`] and
/// ends on one or at k, and its columns start on one; so its pairs are the whole product's.
///
/// # Safety
/// A's rows of every part × `ks` are readable; C's parts, rows `ldc` apart from `c`, are
/// writable (readable for β ≠ 0) and touched by no one else meanwhile.
pub(crate) unsafe fn gemm_packed_parts<T: Element>(
    a: Lines<T>,
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
        // Tasks of whole blocks of rows where there are rows enough for every thread to have
        // two: each task passes all of B's panels once per block.
        let per_task = (TASK_FMAS / (ks.len() * cols.len()).max(1))
            .max(BLOCK_ROWS.min(rows.len().div_ceil(2 * par::threads())))
            .max(1)
            .next_multiple_of(MR);
        par::for_each_chunk(rows.len(), per_task, |chunk| {
            let rows = rows.start + chunk.start..rows.start + chunk.end;
            let tiles = chunk.len().min(BLOCK_ROWS).div_ceil(MR);
            let mut sums = vec![[[0f32; NR]; MR]; tiles * cols.len().div_ceil(NR)];
            for i0 in rows.clone().step_by(BLOCK_ROWS) {
                let block = i0..rows.end.min(i0 + BLOCK_ROWS);
                sum_block(&a, b, block.clone(), cols.clone(), ks.clone(), &mut sums);
                write_block(&sums, block, cols.clone(), beta, c, ldc);
            }
        });
    }
}

/// The sums of C's rows `block` (at most [`BLOCK_ROWS`]) × `cols` over k's elements `ks`, into
/// `sums`: tile t of MR rows and panel j of NR columns at `sums[t * panels + j]`.
fn sum_block<T: Element>(
    a: &Lines<T>,
    b: &Packed,
    block: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    ks: std::ops::Range<usize>,
    sums: &mut [[[f32; NR]; MR]],
) {
    let tiles = block.len().div_ceil(MR);
    let panels = cols.len().div_ceil(NR);
    // k's elements, padded to whole pairs (the padding element where ks ends at an odd k).
    let depth = ks.len().next_multiple_of(2);
    let mut a_block = vec![0f32; tiles * MR * KC.min(depth)];
    // Whether every block of k so far gave each tile no denormal to flush: only then are its
    // sums multiples of a normal number, and the next block's can skip the flushing too.
    let mut exact = [true; BLOCK_ROWS / MR];
    // A block of k of one panel of B, widened once for every tile of the block (in L1).
    let mut b_block = vec![[0f32; NR]; KC.min(depth)];
    sums[..tiles * panels].fill([[0.0; NR]; MR]);
    for k0 in (0..depth).step_by(KC) {
        let kc = KC.min(depth - k0);
        let ks_block = ks.start + k0..ks.end.min(ks.start + k0 + kc);
        for (t, tile) in a_block.chunks_exact_mut(MR * kc).take(tiles).enumerate() {
            let i0 = block.start + t * MR;
            // SAFETY: the rows of the block × ks are A's to read (the caller's contract).
            unsafe { gather_tile(tile, a, i0..block.end.min(i0 + MR), ks_block.clone()) };
            exact[t] &= unflushed_is_exact(round_in_place(tile), b.exponent);
        }
        for (j, j0) in cols.clone().step_by(NR).enumerate() {
            let panel = b.panel_into(j0, ks.start + k0, kc, &mut b_block);
            for (t, tile) in a_block.chunks_exact(MR * kc).take(tiles).enumerate() {
                let tile = tile.as_chunks().0;
                let s = &mut sums[t * panels + j];
                if exact[t] {
                    tile_sums(tile, panel, s)
                } else {
                    tile_sums_flushed(tile, panel, s)
                }
            }
        }
    }
}

/// A's rows `rows` (at most MR) × k's elements `ks` into a tile of k-steps of MR values: rows
/// past `rows` and steps past `ks` zero. Along A's lines, whichever way they lie.
///
/// # Safety
/// A's `rows` × `ks` are readable.
unsafe fn gather_tile<T: Element>(
    tile: &mut [f32],
    a: &Lines<T>,
    rows: std::ops::Range<usize>,
    ks: std::ops::Range<usize>,
) {
    if rows.len() < MR || ks.len() < tile.len() / MR {
        tile.fill(0.0);
    }
    if a.row_stride == 1 {
        // Aᵀ row-major: each step's MR values lie side by side.
        for (step, kk) in tile.chunks_exact_mut(MR).zip(ks) {
            let line = std::slice::from_raw_parts(a.ptr.add(kk * a.col_stride + rows.start), rows.len());
            widen_into(&mut step[..rows.len()], line);
        }
    } else {
        for (r, i) in rows.enumerate() {
            let at = a.ptr.add(i * a.row_stride + ks.start * a.col_stride);
            for (p, step) in tile.chunks_exact_mut(MR).take(ks.len()).enumerate() {
                step[r] = (*at.add(p * a.col_stride)).widen();
            }
        }
    }
}

/// B's columns `cols` (at most NR) × its k rows into a panel of k rows of NR values (the
/// columns past `cols` and the padding row left as they are: zero). Along B's lines, whichever
/// way they lie.
///
/// # Safety
/// B's k rows × `cols` are readable.
unsafe fn gather_panel<T: Element>(panel: &mut [f32], b: &Lines<T>, k: usize, cols: std::ops::Range<usize>) {
    let width = cols.len();
    if b.col_stride == 1 {
        for (p, row) in panel.chunks_exact_mut(NR).take(k).enumerate() {
            let line = std::slice::from_raw_parts(b.ptr.add(p * b.row_stride + cols.start), width);
            widen_into(&mut row[..width], line);
        }
    } else {
        for (j, jj) in cols.enumerate() {
            let at = b.ptr.add(jj * b.col_stride);
            for (p, row) in panel.chunks_exact_mut(NR).take(k).enumerate() {
                row[j] = (*at.add(p * b.row_stride)).widen();
            }
        }
    }
}

/// `out[i] = line[i]` widened (a copy for f32).
#[inline(always)]
fn widen_into<T: Element>(out: &mut [f32], line: &[T]) {
    for (o, &v) in out.iter_mut().zip(line) {
        *o = v.widen();
    }
}

/// `C = sums + beta·C` over the block's rows × `cols`.
fn write_block(
    sums: &[[[f32; NR]; MR]],
    block: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    beta: f32,
    c: SharedMut<f32>,
    ldc: usize,
) {
    let panels = cols.len().div_ceil(NR);
    for (r, i) in block.enumerate() {
        for (j, j0) in cols.clone().step_by(NR).enumerate() {
            let sums = &sums[r / MR * panels + j][r % MR];
            for (jj, &s) in sums[..NR.min(cols.end - j0)].iter().enumerate() {
                // Row i's columns of this part are this task's alone (tasks split the part's
                // rows; the caller keeps parts apart); C is read only for β ≠ 0 (it may be
                // uninitialised otherwise), so it is reached through raw pointers.
                let out = c.at(i * ldc + j0 + jj);
                // SAFETY: in C's part (the caller's contract).
                unsafe { *out = if beta != 0.0 { beta.mul_add(*out, s) } else { s } };
            }
        }
    }
}

simd_dispatch!(tile_sums => tile_sums_generic(a: &[[f32; MR]], b: &[[f32; NR]], sums: &mut [[f32; NR]; MR]) -> ());
simd_dispatch!(tile_sums_flushed => tile_sums_flushed_generic(a: &[[f32; MR]], b: &[[f32; NR]], sums: &mut [[f32; NR]; MR]) -> ());

/// A tile's sums where [`unflushed_is_exact`]: no step can give a denormal, so none is flushed.
#[inline(always)]
fn tile_sums_generic(a: &[[f32; MR]], b: &[[f32; NR]], sums: &mut [[f32; NR]; MR]) {
    pair_sums::<false>(a, b, sums)
}

/// A tile's sums, each step flushed.
#[inline(always)]
fn tile_sums_flushed_generic(a: &[[f32; MR]], b: &[[f32; NR]], sums: &mut [[f32; NR]; MR]) {
    pair_sums::<true>(a, b, sums)
}

/// `s[r][j] = Σ over the pairs q: (s + a[2q+1][r]·b[2q+1][j]) + a[2q][r]·b[2q][j]`, from the
/// sums given, each step a fused multiply-add, its result flushed as `vdpbf16ps` flushes its
/// results where `FLUSH` (the operands are rounded already, and a rounded operand is never a
/// denormal).
#[inline(always)]
fn pair_sums<const FLUSH: bool>(a: &[[f32; MR]], b: &[[f32; NR]], sums: &mut [[f32; NR]; MR]) {
    let step = |x: f32, y: f32, s: f32| {
        if FLUSH {
            fma_flushed(x, y, s)
        } else {
            x.mul_add(y, s)
        }
    };
    // A copy the loop keeps in registers.
    let mut s = *sums;
    for (a, b) in a.chunks_exact(2).zip(b.chunks_exact(2)) {
        for (s, (&a0, &a1)) in s.iter_mut().zip(a[0].iter().zip(&a[1])) {
            for (s, (&b0, &b1)) in s.iter_mut().zip(b[0].iter().zip(&b[1])) {
                *s = step(a0, b0, step(a1, b1, *s));
            }
        }
    }
    *sums = s;
}

thread_local! {
    /// A thread's f32 rows for [`Rounded::from_rows_with`] and panels for [`Packed::new`],
    /// rounded into the matrix as made.
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}
