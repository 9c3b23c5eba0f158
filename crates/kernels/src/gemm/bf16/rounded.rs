//! A matrix rounded to bf16 once and read by several products where it lies ([`Rounded`]).
//!
//! Every product converts its f32 operands to bf16 pairs as it packs them, so an activation
//! that feeds several products is converted once per product: the normalised input of
//! attention's q, k and v projections three times forward and three times more as the B of
//! their weights' gradients, a gradient twice (dx = g·W reads its rows, dW = gᵀ·x its columns).
//! Rounded once, with the packers' own rounding, the products read the same bf16 values — the
//! same bits of C — from half the bytes:
//!
//! - as A in rows (x·Wᵀ, g·W): the rows are laid out as the tiles read A (pairs of k, padded
//!   with zero pairs to a multiple of 16 and with zero rows to a multiple of 32), so the
//!   products read them with no conversion at all, on AMX and on `vdpbf16ps` alike;
//! - as B in dW = gᵀ·x (x's rows along k): a strip's pair row q is rows 2q and 2q+1
//!   interleaved, 16 bits at a time ([`pack_b_rounded`]), with no conversion;
//! - as the column-major A of dW = gᵀ·x: 16 columns of two rows interleaved into pairs and
//!   transposed in blocks of 16 × 16 as the f32 packer does, from half the bytes.
//!
//! Only AVX-512F and VL instructions beyond AVX512_BF16's rounding: 16 bf16 are read in whole
//! 32-bit words and widened into the halves of 16 pairs (`vpmovzxwd`), so no AVX512BW is needed.

use std::arch::x86_64::*;

use super::pack::{
    block_buffer, pack_rows_for_tiles, pack_tasks, transpose16, ABlock, Aligned, PackedPairs, PairsA,
};
use super::{amx, Kernel, MR, NR};
use crate::gemm::x86::avx512::lane_mask as lanes;
use crate::gemm::Operand;
use crate::par::SharedMut;

/// A rows × cols matrix rounded to bf16 (to nearest even, as the packers round), row r's pairs
/// from `r·stride` on: pairs of columns, zero past the last column up to `stride` (a multiple
/// of 16 pairs) and zero rows up to a multiple of 32.
pub(crate) struct Rounded {
    data: Aligned,
    rows: usize,
    cols: usize,
}

impl Rounded {
    /// Pairs per row: the tiles' padding of k (which the vectors' kernel ignores, reading a
    /// row's pairs from its start), so every product reads these rows in place.
    fn stride(cols: usize) -> usize {
        cols.div_ceil(2).next_multiple_of(amx::KQ_STEP)
    }

    /// `x` (rows × cols, row-major) rounded, in parallel blocks of 32 rows.
    ///
    /// # Panics
    /// If `x` holds fewer than rows × cols elements, or the CPU has no AVX512_BF16.
    pub(crate) fn new(rows: usize, cols: usize, x: &[f32]) -> Self {
        assert!(
            x.len() >= rows * cols,
            "Rounded: {rows}×{cols} from {} elements",
            x.len()
        );
        let source = Operand {
            ptr: x.as_ptr(),
            row_stride: cols,
            col_stride: 1,
        };
        // SAFETY: x's rows that exist are in bounds (asserted).
        Self::in_blocks(rows, cols, |block, out| unsafe {
            pack_rows_for_tiles(cols, source, block, out.0, out.1)
        })
    }

    /// A rows × cols matrix made a block of 32 rows at a time by `fill(rows, out)` (`out`:
    /// `rows.len()·cols` floats to write, row-major, scratch of this thread's that stays in its caches),
    /// each block rounded as it is made, so the f32 values never travel to memory and back.
    ///
    /// # Panics
    /// If the CPU has no AVX512_BF16.
    pub(crate) fn from_rows_with(
        rows: usize,
        cols: usize,
        fill: impl Fn(std::ops::Range<usize>, &mut [std::mem::MaybeUninit<f32>]) + Sync + Send,
    ) -> Self {
        Self::in_blocks(rows, cols, |block, out| {
            // Taken out, not borrowed, while `fill` runs: a `fill` that ran parallel tasks could
            // have this thread pick up another block of the same matrix meanwhile.
            let mut scratch = SCRATCH.with(|s| std::mem::take(&mut *s.borrow_mut()));
            scratch.resize(amx::ROWS * cols, 0.0);
            let made = &mut scratch[..block.len() * cols];
            // SAFETY: f32 and MaybeUninit<f32> share a layout; `fill` writes only values, so
            // the scratch stays initialised.
            fill(block.clone(), unsafe {
                &mut *(made as *mut [f32] as *mut [std::mem::MaybeUninit<f32>])
            });
            let source = Operand {
                ptr: made.as_ptr(),
                row_stride: cols,
                col_stride: 1,
            };
            // SAFETY: the scratch holds the block's rows.
            unsafe { pack_rows_for_tiles(cols, source, 0..block.len(), out.0, out.1) };
            SCRATCH.with(|s| *s.borrow_mut() = scratch);
        })
    }

    /// A rows × cols matrix whose blocks of 32 rows `round(rows, (out, stride))` writes as
    /// parallel tasks: the block's rows of pairs (and zero padding) from `out`, `stride` pairs
    /// apart, as [`pack_rows_for_tiles`] writes them.
    fn in_blocks(
        rows: usize,
        cols: usize,
        round: impl Fn(std::ops::Range<usize>, (*mut u32, usize)) + Sync + Send,
    ) -> Self {
        assert!(super::supported(), "bf16 rounding needs AVX512_BF16");
        let stride = Self::stride(cols);
        let padded = rows.next_multiple_of(amx::ROWS);
        let mut data = Aligned::for_writing(padded * stride);
        let out = SharedMut(data.ptr_mut());
        pack_tasks(rows * cols, padded / amx::ROWS, 1, |range| {
            for blk in range {
                let block = blk * amx::ROWS..rows.min((blk + 1) * amx::ROWS);
                // The block's rows of the padded buffer are this task's alone.
                round(block.clone(), (out.at(block.start * stride), stride));
            }
        });
        Self { data, rows, cols }
    }

    pub(crate) fn dims(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// Row r's pairs (u32), from `r·stride`.
    pub(super) fn pairs(&self) -> *const u32 {
        self.data.ptr()
    }

    /// Pairs from one row to the next.
    pub(super) fn row_stride(&self) -> usize {
        Self::stride(self.cols)
    }

    /// Element (r, c) of the bf16 halves: `halves() + r·2·stride + c`.
    fn halves(&self) -> *const u16 {
        self.data.ptr().cast()
    }

    /// The first `len` pairs, padding included, for the tests.
    #[cfg(test)]
    pub(crate) fn pairs_slice(&self, len: usize) -> &[u32] {
        // SAFETY: the constructors write every pair of the padded rows.
        unsafe { std::slice::from_raw_parts(self.data.ptr(), len) }
    }

    /// The f32 values (exact), for the tests.
    #[cfg(test)]
    pub(crate) fn to_f32(&self) -> Vec<f32> {
        let at = |r: usize, c: usize| unsafe { *self.halves().add(r * 2 * self.row_stride() + c) };
        (0..self.rows * self.cols)
            .map(|i| super::from_bf16(at(i / self.cols, i % self.cols)))
            .collect()
    }
}

thread_local! {
    /// [`Rounded::from_rows_with`]'s f32 rows, kept from matrix to matrix on this thread.
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The `count` (≤ 16) pairs (first[j], second[j]) of the bf16 at `first` and at `second`,
/// `first`'s in the low halves (the element of the lower k, as the packers pair them), zeros
/// past `count`. Read in whole u32, so one bf16 past an odd `count` is read: a row's padding.
#[inline]
#[target_feature(enable = "avx512f,avx512vl")]
unsafe fn interleave16(first: *const u16, second: *const u16, count: usize) -> __m512i {
    let words = ((1u32 << count.div_ceil(2)) - 1) as __mmask8;
    let keep = lanes(count);
    let lo = _mm512_maskz_cvtepu16_epi32(keep, _mm256_maskz_loadu_epi32(words, first.cast()));
    let hi = _mm512_maskz_cvtepu16_epi32(keep, _mm256_maskz_loadu_epi32(words, second.cast()));
    _mm512_or_si512(lo, _mm512_slli_epi32::<16>(hi))
}

/// Pair q over k = `r`'s rows for its columns `c0..c0 + 16` (those that exist; zeros past
/// them): rows 2q and 2q+1 interleaved, zeros from pair ⌈rows/2⌉ on.
#[inline]
#[target_feature(enable = "avx512f,avx512vl")]
unsafe fn pair_of_rows(r: &Rounded, q: usize, c0: usize) -> __m512i {
    let count = r.cols.saturating_sub(c0).min(16);
    if 2 * q >= r.rows || count == 0 {
        return _mm512_setzero_si512();
    }
    // Row 2q+1 past the last row is one of the zero rows (rows are padded to 32, an even count).
    let row = |i: usize| r.halves().add(i * 2 * r.row_stride() + c0);
    interleave16(row(2 * q), row(2 * q + 1), count)
}

/// Pair rows ahead of the one being packed that [`pack_b_rounded`] prefetches (as the f32
/// packer does: rows 2·stride bf16 apart can be past the hardware prefetcher's reach).
const PREFETCH_PAIRS_AHEAD: usize = 24;

/// B = `b` (k = its rows, n = its columns) packed into strips for `kernel`'s steps, a strip per
/// task: the same pairs [`super::pack_b_for`] makes from the f32 values `b` was rounded from.
pub(crate) fn pack_b_rounded(kernel: Kernel, b: &Rounded) -> PackedPairs {
    assert!(super::supported(), "bf16 products need AVX512_BF16");
    let (k, n) = (b.rows, b.cols);
    let (kq, strips) = (kernel.kq_stride(k), n.div_ceil(NR));
    let mut data = Aligned::for_writing(strips * kq * NR);
    let out = SharedMut(data.ptr_mut());
    pack_tasks(k * n, strips, STRIPS_PER_PASS, |range| {
        // SAFETY: the strips `range` (NR·kq elements from each one's start) are this task's
        // alone; the CPU has AVX-512 (asserted through `supported`).
        unsafe { strips_from_rounded(b, range, out.at(0), kq) }
    });
    PackedPairs { data, k, n, kernel }
}

/// Strips packed together by [`strips_from_rounded`], one line of each of b's rows apiece: a
/// pass over b's rows then reads four adjacent lines of each, where a strip at a time read one
/// line of every row per pass. `gemm::bf16::timing::amx_weight_grad_operands` (bf16 read per
/// second, 2,048 rows, one thread, the two builds in turn 4 times, twice;
/// docs/performance-raw/2026-12-01-nineteenth): 6.2–7.3 → 7.2–10.1 GB/s at 384 columns,
/// 3.6–4.7 → 4.7–5.9 at 1,536; 8 strips read no faster than 4. (The f32 packer's strips of
/// contiguous rows, two at a time, read 10% slower: not done there.)
const STRIPS_PER_PASS: usize = 4;

/// Strips `strips` of B = `b` into B's strips from `out`: pair rows up to ⌈k/2⌉ from `b`'s
/// rows, zeros up to `kq`; the strips side by side, a pair row of each in turn.
#[target_feature(enable = "avx512f,avx512vl")]
unsafe fn strips_from_rounded(b: &Rounded, strips: std::ops::Range<usize>, out: *mut u32, kq: usize) {
    let j0 = strips.start * NR;
    let pairs = b.rows.div_ceil(2);
    for q in 0..pairs {
        let ahead = 2 * (q + PREFETCH_PAIRS_AHEAD);
        for r in ahead..b.rows.min(ahead + 2) {
            for line in (0..strips.len()).map(|i| j0 + i * NR) {
                _mm_prefetch::<_MM_HINT_T0>(b.halves().wrapping_add(r * 2 * b.row_stride() + line).cast());
            }
        }
        for s in strips.clone() {
            let strip = out.add(s * kq * NR);
            _mm512_store_si512(strip.add(q * NR).cast(), pair_of_rows(b, q, s * NR));
            _mm512_store_si512(strip.add(q * NR + 16).cast(), pair_of_rows(b, q, s * NR + 16));
        }
    }
    for s in strips {
        std::ptr::write_bytes(out.add(s * kq * NR + pairs * NR), 0, (kq - pairs) * NR);
    }
}

/// Pairs of k ahead of the block being transposed whose rows [`transposed_block`] prefetches
/// (16 and 64 measured alike, as did prefetching into L2 alone).
const TRANSPOSED_PAIRS_AHEAD: usize = 32;

/// A = `g`ᵀ's rows `rows` (columns of `g`; k = `g`'s rows) as [`super::pack::convert_block`]
/// lays them out for `kernel` into `out`: rows of pairs for the tiles (zero pairs to
/// `kernel.kq_stride(k)`, zero rows to a multiple of 32), or panels of [`MR`] rows, pair-major,
/// for `vdpbf16ps`.
///
/// # Safety
/// `out` has room for the layout's `padded_rows(rows.len())·kq_stride` pairs; `rows.start` is
/// `rows.end ≤ g`'s columns; AVX-512.
#[target_feature(enable = "avx512f,avx512vl")]
pub(super) unsafe fn transposed_block(
    kernel: Kernel,
    g: &Rounded,
    rows: std::ops::Range<usize>,
    out: *mut u32,
) {
    let kq = kernel.kq_stride(g.rows);
    if kernel.tiles() {
        for q0 in (0..kq).step_by(16) {
            // The lines of g's rows two blocks of pairs on (the columns `rows`, a line per 32
            // from a multiple of 32), asked for now: rows hundreds or thousands of bytes apart
            // are each a stream of their own to the hardware prefetcher, and the loads below
            // waited on every line (perf annotate: 78% of this function's samples). With the
            // loops turned round (below), `gemm::bf16::timing::amx_weight_grad_operands`
            // (the builds in turn 4 times, twice): the products' own blocks of 128 rows
            // 6.8–7.3 → 9.6–11.5 GB/s of g read at 384 columns, 3.5–4.5 → 5.9–7.5 at 1,536;
            // all of A in blocks of 32 rows 5.0–5.9 → 5.2–7.6 and 2.6–3.3 → 3.2–4.0.
            let ahead = 2 * (q0 + TRANSPOSED_PAIRS_AHEAD);
            for r in ahead..g.rows.min(ahead + 2 * 16) {
                let row = g.halves().wrapping_add(r * 2 * g.row_stride() + rows.start);
                for line in (0..rows.len()).step_by(32) {
                    _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(line).cast());
                }
            }
            // Every column block of g's 32 rows here, so each line is read whole at once.
            for r0 in (0..rows.len().next_multiple_of(amx::ROWS)).step_by(16) {
                let block: [__m512i; 16] = std::array::from_fn(|t| pair_of_rows(g, q0 + t, rows.start + r0));
                for (r, row) in transpose16(block).iter().enumerate() {
                    _mm512_storeu_si512(out.add((r0 + r) * kq + q0).cast(), *row);
                }
            }
        }
        return;
    }
    for i0 in rows.clone().step_by(2 * MR) {
        let panels = out.add((i0 - rows.start) * kq);
        for q in 0..kq {
            let p = pair_of_rows(g, q, i0);
            _mm256_storeu_si256(panels.add(q * MR).cast(), _mm512_castsi512_si256(p));
            if i0 + MR < rows.end {
                let next = panels.add(MR * kq + q * MR);
                _mm256_storeu_si256(next.cast(), _mm512_extracti64x4_epi64::<1>(p));
            }
        }
    }
}

/// A = `g`ᵀ's rows `rows` converted into `buf` (grown as needed), as
/// [`super::pack::convert_block`] converts a block of an f32 A.
///
/// # Safety
/// `rows.end ≤ g`'s columns; AVX-512.
pub(super) unsafe fn convert_transposed(
    kernel: Kernel,
    g: &Rounded,
    rows: std::ops::Range<usize>,
    buf: &mut Aligned,
) -> ABlock {
    let kq = kernel.kq_stride(g.rows);
    let out = block_buffer(kernel, rows.len(), kq, buf);
    transposed_block(kernel, g, rows, out);
    let (row_stride, q_stride) = layout(kernel, kq);
    ABlock {
        ptr: out,
        tile_stride: MR * kq,
        row_stride,
        q_stride,
    }
}

/// All of A = `g`ᵀ converted beforehand ([`transposed_block`] over blocks of 32 rows as
/// parallel tasks), for products whose threads split C's columns.
pub(super) fn pack_transposed(kernel: Kernel, g: &Rounded) -> PairsA {
    let (m, k) = (g.cols, g.rows);
    let kq = kernel.kq_stride(k);
    let padded = kernel.padded_rows(m).next_multiple_of(amx::ROWS);
    let mut data = Aligned::for_writing(padded * kq);
    let out = SharedMut(data.ptr_mut());
    pack_tasks(m * k, padded / amx::ROWS, 1, |range| {
        for blk in range {
            let i0 = blk * amx::ROWS;
            if i0 < m {
                // SAFETY: these 32 rows are this task's alone, within the buffer; AVX-512 (the
                // products' callers checked `supported`).
                unsafe { transposed_block(kernel, g, i0..m.min(i0 + amx::ROWS), out.at(i0 * kq)) }
            }
        }
    });
    let (row_stride, q_stride) = layout(kernel, kq);
    PairsA {
        data,
        tile_stride: MR * kq,
        row_stride,
        q_stride,
    }
}

/// (row stride, pair stride) of A's pairs as `kernel` reads them: rows of pairs for the tiles,
/// panels of [`MR`] rows, pair-major, for `vdpbf16ps`.
fn layout(kernel: Kernel, kq: usize) -> (usize, usize) {
    if kernel.tiles() {
        (kq, 1)
    } else {
        (1, MR)
    }
}
