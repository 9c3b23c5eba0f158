//! bf16 products with f32 accumulation, on AVX512_BF16's `vdpbf16ps`: the products of
//! [`Precision::Bf16`](crate::Precision).
//!
//! `vdpbf16ps` takes 32 pairs of bf16 from each operand and adds each adjacent pair's two
//! products into one of 16 f32 lanes: per lane `acc = (acc + a₁·b₁) + a₀·b₀`, each add rounded
//! to nearest even (a product of two bf16 is exact in f32), denormals flushed to zero — Intel's
//! definition, and what this Zen 4 computed on 200,000 random cases. That is twice the
//! multiply-adds of an f32 FMA per instruction. Both operands therefore come with k in pairs:
//!
//! - B (k×n) is packed into strips of [`NR`] columns: pair row q of a strip is [`NR`] u32, the
//!   low half row 2q's element and the high half row 2q+1's (zero past k and past n). A weight
//!   used for many products is packed once ([`PackedPairs`]).
//! - A (m×k) is converted into rows of pairs where its rows are contiguous (the activations of
//!   x·Wᵀ and g·W), or into panels of [`MR`] rows, pair-major, where its columns are (gᵀ in
//!   dW = gᵀ·x, whose pairs lie in two rows of g): a block of [`MC`] rows at a time, just
//!   before the block's products, where the threads split C's rows; all of it beforehand where
//!   they split its columns (every thread then reads every row).
//!
//! Rounding to bf16 is the hardware's (`vcvtne2ps2bf16`: to nearest even, a NaN stays a NaN,
//! a denormal becomes a signed zero); [`to_bf16`] is the same in scalar form, for the odd
//! strides and the tests. Unlike the f32 path, which multiplies small operands where they lie,
//! bf16 always packs both: the conversion has to read and write every element anyway.
//!
//! The kernel is the f32 one's shape (an 8×32 tile of C in sixteen registers, strips outer and
//! row tiles inner, a long k in pieces that resume from C's sums). Each element of C is one
//! chain of `vdpbf16ps` over k's pairs in order, then β·C added once: threads split C's rows or
//! columns, never k, so the bits depend on the shapes alone.

use std::arch::x86_64::*;

use super::x86::avx512::{lane_mask as lanes, start_sums, store_sums};
use super::{blocks_for, for_each_block, Operand};
use crate::par::SharedMut;

/// Rows and columns of the C tile held in registers (8 rows × two 16-lane vectors).
const MR: usize = 8;
const NR: usize = 32;

/// Pairs of k per piece of [`run`] (β = 0): a strip's piece is 32 KiB, a block's A 128 KiB.
const KQ_PIECE: usize = 256;

/// Rows and columns of C per block of [`run`] (multiples of [`MR`] and [`NR`]): 192 KiB of
/// sums. Blocks of 64–256 rows and 384–768 columns, and pieces of 128–512 pairs, measured alike
/// (thread CPU time, d 384's products).
const MC: usize = 128;
const NC: usize = 384;

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

/// The f32 of bf16 bits (exact).
#[cfg(test)]
pub(crate) fn from_bf16(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// The pair (lo, hi) as `vdpbf16ps` reads it: lo in the low 16 bits.
fn pair(lo: f32, hi: f32) -> u32 {
    to_bf16(lo) as u32 | (to_bf16(hi) as u32) << 16
}

/// Whether the bf16 kernel runs here: the CPU has AVX512_BF16 and [`crate::simd::unit`] is
/// AVX-512 (`EMBER_CPU_VECTOR_UNIT=avx2` turns it off like the rest of AVX-512).
pub(crate) fn supported() -> bool {
    static BF16: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    crate::simd::avx512() && *BF16.get_or_init(|| std::is_x86_feature_detected!("avx512bf16"))
}

/// u32 elements on a 64-byte boundary: a strip's pair row is then two whole cache lines, and
/// every vector load of it is aligned.
///
/// Not zeroed: the packers write every element, padding included, and zeroing first was a
/// second pass over every operand (with calloc's memset, or the kernel's page clearing for a
/// fresh mapping). The unit tests fill it with NaN pairs first, so an element a packer skipped
/// shows in the products they check.
#[derive(Default)]
struct Aligned {
    buf: Vec<std::mem::MaybeUninit<u32>>,
    skip: usize,
}

impl Aligned {
    /// Room for `len` elements, which the caller writes before anything reads them.
    fn for_writing(len: usize) -> Self {
        let mut buf: Vec<std::mem::MaybeUninit<u32>> = Vec::with_capacity(len + 16);
        #[cfg(test)]
        buf.resize(len + 16, std::mem::MaybeUninit::new(0x7fc0_7fc0));
        // SAFETY: `MaybeUninit` needs no initialisation.
        unsafe { buf.set_len(len + 16) };
        let skip = buf.as_ptr().align_offset(64).min(16);
        Self { buf, skip }
    }
    fn ptr(&self) -> *const u32 {
        self.buf[self.skip..].as_ptr().cast()
    }
    fn ptr_mut(&mut self) -> *mut u32 {
        self.buf[self.skip..].as_mut_ptr().cast()
    }
}

/// B (k×n) as bf16 pairs in strips of [`NR`] columns: strip s, pair row q starts at
/// `(s·kq + q)·NR`, kq = ⌈k/2⌉.
pub(crate) struct PackedPairs {
    data: Aligned,
    k: usize,
    n: usize,
}

impl PackedPairs {
    fn kq(&self) -> usize {
        self.k.div_ceil(2)
    }
    pub fn dims(&self) -> (usize, usize) {
        (self.k, self.n)
    }
    /// The first `len` packed elements.
    #[cfg(test)]
    pub fn as_slice(&self, len: usize) -> &[u32] {
        // SAFETY: the packers wrote every element (and the tests' buffers start filled).
        unsafe { std::slice::from_raw_parts(self.data.ptr(), len) }
    }
}

/// A converted into pairs: row r of the tile starting at row i0 (a multiple of [`MR`]), pair
/// q, lies at `(i0 / MR)·tile_stride + r·row_stride + q·q_stride`.
struct PairsA {
    data: Aligned,
    tile_stride: usize,
    row_stride: usize,
    q_stride: usize,
}

/// Converts 16 lanes of `lo` and `hi` into 16 pairs.
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn pairs16(lo: __m512, hi: __m512) -> __m512i {
    let lo: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(lo));
    let hi: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(hi));
    _mm512_or_si512(
        _mm512_cvtepu16_epi32(lo),
        _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(hi)),
    )
}

/// The 16 pairs of 32 consecutive floats at `x` (`count` ≤ 32 of them exist; zeros past it).
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn pairs_of_run(x: *const f32, count: usize) -> __m512i {
    let lo = _mm512_maskz_loadu_ps(lanes(count), x);
    let hi = _mm512_maskz_loadu_ps(lanes(count.saturating_sub(16)), x.wrapping_add(16));
    std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo))
}

/// `dst[c·16 + r] = src[r][c]` for a 16×16 block of u32 (rows `r` of `src` are vectors).
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn transpose16(src: [__m512i; 16]) -> [__m512i; 16] {
    // Four stages: 32-bit and 64-bit interleaves within 128-bit lanes, then 128-bit blocks.
    let mut t = [_mm512_setzero_si512(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_epi32(src[2 * i], src[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(src[2 * i], src[2 * i + 1]);
    }
    let mut u = [_mm512_setzero_si512(); 16];
    for i in 0..4 {
        for j in 0..2 {
            let (x, y) = (t[4 * i + j], t[4 * i + j + 2]);
            u[4 * i + j] = _mm512_unpacklo_epi64(x, y);
            u[4 * i + j + 2] = _mm512_unpackhi_epi64(x, y);
        }
    }
    // u[4g + s] holds, in its 128-bit lane L, rows 4g..4g+4 at column 4L + COLUMN[s]; the
    // last two stages gather lane L of the four groups.
    let mut v = [_mm512_setzero_si512(); 16];
    for i in 0..2 {
        for s in 0..4 {
            let (x, y) = (u[8 * i + s], u[8 * i + 4 + s]);
            v[8 * i + s] = _mm512_shuffle_i32x4::<0x88>(x, y);
            v[8 * i + 4 + s] = _mm512_shuffle_i32x4::<0xdd>(x, y);
        }
    }
    let mut out = [_mm512_setzero_si512(); 16];
    for s in 0..4 {
        for h in 0..2 {
            let (x, y) = (v[4 * h + s], v[8 + 4 * h + s]);
            out[COLUMN[s] + 4 * h] = _mm512_shuffle_i32x4::<0x88>(x, y);
            out[COLUMN[s] + 8 + 4 * h] = _mm512_shuffle_i32x4::<0xdd>(x, y);
        }
    }
    out
}

/// The column (within a 128-bit lane) that stage two's vector `s` holds.
const COLUMN: [usize; 4] = [0, 2, 1, 3];

/// Packs B (k×n, any strides) into strips of bf16 pairs, a strip per task.
///
/// # Safety
/// Every element of B's k×n view is readable; the CPU has AVX512_BF16.
pub(crate) unsafe fn pack_b(k: usize, n: usize, b: Operand) -> PackedPairs {
    let (kq, strips) = (k.div_ceil(2), n.div_ceil(NR));
    let mut data = Aligned::for_writing(strips * kq * NR);
    let out = SharedMut(data.ptr_mut());
    pack_tasks(k * n, strips, 1, |range| {
        for s in range {
            // SAFETY: strip s (NR·kq elements from its start) is this task's alone.
            unsafe { pack_strip(k, n, b, s, out.at(s * kq * NR)) }
        }
    });
    PackedPairs { data, k, n }
}

/// Strip `s` of [`pack_b`] into `out`.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn pack_strip(k: usize, n: usize, b: Operand, s: usize, out: *mut u32) {
    let kq = k.div_ceil(2);
    let (rs, cs) = (b.row_stride, b.col_stride);
    for half in 0..2 {
        let j0 = s * NR + half * 16;
        if j0 >= n {
            // The last strip's empty half: zeros, as every element past n.
            for q in 0..kq {
                _mm512_store_si512(out.add(q * NR + half * 16).cast(), _mm512_setzero_si512());
            }
            break;
        }
        let cols = 16.min(n - j0);
        if cs == 1 {
            // Rows 2q and 2q+1 lie along j: 16 columns of both make 16 pairs.
            for q in 0..kq {
                let r0 = b.ptr.add(2 * q * rs + j0);
                let lo = _mm512_maskz_loadu_ps(lanes(cols), r0);
                let hi = if 2 * q + 1 < k {
                    _mm512_maskz_loadu_ps(lanes(cols), r0.add(rs))
                } else {
                    _mm512_setzero_ps()
                };
                _mm512_store_si512(out.add(q * NR + half * 16).cast(), pairs16(lo, hi));
            }
        } else if rs == 1 {
            // Column j (a row of W in x·Wᵀ) holds its pairs one after another: 16 columns of
            // 16 pairs are converted as 16 vectors and transposed into 16 pair rows.
            for q0 in (0..kq).step_by(16) {
                let count = 32.min(k - 2 * q0);
                let mut block = [_mm512_setzero_si512(); 16];
                for (c, v) in block.iter_mut().enumerate().take(cols) {
                    *v = pairs_of_run(b.ptr.add((j0 + c) * cs + 2 * q0), count);
                }
                let rows = transpose16(block);
                for (t, row) in rows.iter().enumerate().take(16.min(kq - q0)) {
                    _mm512_store_si512(out.add((q0 + t) * NR + half * 16).cast(), *row);
                }
            }
        } else {
            for q in 0..kq {
                for j in 0..cols {
                    let at = |p: usize| {
                        if p < k {
                            *b.ptr.add(p * rs + (j0 + j) * cs)
                        } else {
                            0.0
                        }
                    };
                    *out.add(q * NR + half * 16 + j) = pair(at(2 * q), at(2 * q + 1));
                }
                for j in cols..16 {
                    *out.add(q * NR + half * 16 + j) = 0;
                }
            }
        }
    }
}

/// Elements from which an operand is packed by parallel tasks: below, waking the pool's threads
/// costs more than the packing. With every pack in parallel tasks, d 128's products at 2 threads
/// measured 1.04× f32 per layer (0.43–1.74× per product); packed like this, 1.49× and 1.60× in two
/// runs (`gemm::timing` on a loaded machine, docs/performance-raw/2026-11-29-bf16).
const PAR_MIN_PACK: usize = 1 << 16;

/// `task` over `0..len` in pieces of `chunk`, as parallel tasks when the operand has at least
/// [`PAR_MIN_PACK`] elements, else in turn on this thread. Each piece writes its own part of the
/// packed operand, so the bits are the same either way.
fn pack_tasks(
    elements: usize,
    len: usize,
    chunk: usize,
    task: impl Fn(std::ops::Range<usize>) + Sync + Send,
) {
    if elements >= PAR_MIN_PACK {
        crate::par::for_each_chunk(len, chunk, task);
    } else {
        task(0..len);
    }
}

/// Converts A (m×k, any strides) into pairs, in parallel pieces.
///
/// # Safety
/// Every element of A's m×k view is readable; the CPU has AVX512_BF16.
unsafe fn pack_a(m: usize, k: usize, a: Operand) -> PairsA {
    let kq = k.div_ceil(2);
    let tiles = m.div_ceil(MR);
    if a.col_stride != 1 && a.row_stride == 1 {
        // Columns 2q and 2q+1 of A (rows of g) lie along i: panels of MR rows, pair-major,
        // two panels (16 rows) at a time.
        let mut data = Aligned::for_writing(tiles * MR * kq);
        let out = SharedMut(data.ptr_mut());
        pack_tasks(m * k, tiles.div_ceil(2), 64, |panel_pairs| {
            for pp in panel_pairs {
                // SAFETY: panels 2pp and 2pp+1 are this task's alone.
                unsafe { pack_panels(m, k, a, 2 * pp * MR, out.at(2 * pp * MR * kq)) }
            }
        });
        return PairsA {
            data,
            tile_stride: MR * kq,
            row_stride: 1,
            q_stride: MR,
        };
    }
    // Rows of pairs, each row converted where it lies.
    let mut data = Aligned::for_writing(m * kq);
    let out = SharedMut(data.ptr_mut());
    pack_tasks(m * k, m, crate::par::rows_per_task(k), |rows| {
        for i in rows {
            // SAFETY: row i is this task's alone.
            unsafe { pack_row(k, a.skip_rows(i), out.at(i * kq)) }
        }
    });
    PairsA {
        data,
        tile_stride: MR * kq,
        row_stride: kq,
        q_stride: 1,
    }
}

/// The panels of A's rows `i0..i0 + 16` (those that exist) for a column-major A into `out`.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn pack_panels(m: usize, k: usize, a: Operand, i0: usize, out: *mut u32) {
    let (kq, cs) = (k.div_ceil(2), a.col_stride);
    let mask = lanes(m - i0);
    for q in 0..kq {
        let c0 = a.ptr.add(2 * q * cs + i0);
        let lo = _mm512_maskz_loadu_ps(mask, c0);
        let hi = if 2 * q + 1 < k {
            _mm512_maskz_loadu_ps(mask, c0.add(cs))
        } else {
            _mm512_setzero_ps()
        };
        let p = pairs16(lo, hi);
        _mm256_storeu_si256(out.add(q * MR).cast(), _mm512_castsi512_si256(p));
        if i0 + MR < m {
            // The second panel starts MR·kq further on.
            let next = out.add(MR * kq + q * MR);
            _mm256_storeu_si256(next.cast(), _mm512_extracti64x4_epi64::<1>(p));
        }
    }
}

/// The first row of `a` (k elements) as pairs into `out`.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn pack_row(k: usize, a: Operand, out: *mut u32) {
    let (kq, row, cs) = (k.div_ceil(2), a.ptr, a.col_stride);
    if cs == 1 {
        for q0 in (0..kq).step_by(16) {
            let p = pairs_of_run(row.add(2 * q0), 32.min(k - 2 * q0));
            _mm512_mask_storeu_epi32(out.add(q0).cast(), lanes(kq - q0), p);
        }
    } else {
        for q in 0..kq {
            let at = |p: usize| if p < k { *row.add(p * cs) } else { 0.0 };
            *out.add(q) = pair(at(2 * q), at(2 * q + 1));
        }
    }
}

/// `C = A·B + beta·C` in bf16 products with f32 sums, for A (m×k) and B (k×n) of any strides
/// and C row-major (m×n) with row stride `ldc`; both operands packed here.
///
/// # Safety
/// As [`super::gemm`]; the CPU has AVX512_BF16 ([`supported`]).
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
    if m == 0 || n == 0 {
        return;
    }
    let b = pack_b(k, n, b);
    gemm_packed(m, a, &b, beta, c, ldc);
}

/// [`gemm`] with B packed beforehand.
///
/// # Safety
/// As [`gemm`], for A's m×k view with k the packed B's.
pub(crate) unsafe fn gemm_packed(m: usize, a: Operand, b: &PackedPairs, beta: f32, c: *mut f32, ldc: usize) {
    let (k, n) = (b.k, b.n);
    if m == 0 || n == 0 {
        return;
    }
    let c = SharedMut(c);
    // C's rows where there are more of them than columns, else its columns (a strip apiece at
    // least): one chain of sums per element either way.
    if m >= n {
        // Each task converts its own rows of A, a block at a time, just before the block's
        // products read them (`ASource::Rows`).
        for_each_block(m, blocks_for(m, k, n, m, MR), MR, |rows| {
            // SAFETY: each task writes C's rows `rows` only.
            unsafe { run(ASource::Rows(a), b, rows, 0..n, beta, c, ldc) }
        });
    } else {
        // Every task reads all of A's rows: converted once, beforehand.
        let a = pack_a(m, k, a);
        for_each_block(n, blocks_for(m, k, n, n, NR), NR, |cols| {
            // SAFETY: each task writes C's columns `cols` only.
            unsafe { run(ASource::Packed(&a), b, 0..m, cols, beta, c, ldc) }
        });
    }
}

/// Where [`run`] finds A's pairs.
#[derive(Clone, Copy)]
enum ASource<'a> {
    /// Converted beforehand, all of it.
    Packed(&'a PairsA),
    /// A itself (m×k, any strides): each block of [`MC`] rows is converted into this thread's
    /// buffer as its turn comes. The block's pairs (128 rows × k: 192 KiB at k = 384, 1 MiB at
    /// k = 2,048) are then read from L2 (or close to it) by all of its products, where A
    /// converted all at once went out to L3 or memory and came back.
    Rows(Operand),
}

/// A block of A's pairs: row r of the tile starting at the block's row `i` (a multiple of
/// [`MR`] from the block's start), pair q, at `ptr + (i / MR)·tile_stride + r·row_stride +
/// q·q_stride`.
struct ABlock {
    ptr: *const u32,
    tile_stride: usize,
    row_stride: usize,
    q_stride: usize,
}

thread_local! {
    /// [`ASource::Rows`]' block buffer, kept from product to product on this thread.
    static A_BLOCK: std::cell::RefCell<Aligned> = std::cell::RefCell::new(Aligned::default());
}

/// Rows `rows` of A (m×k, any strides) converted into `buf` (grown as needed), laid out as
/// [`pack_a`] lays out the whole of A.
///
/// # Safety
/// Every element of A's rows `rows` × k is readable; the CPU has AVX512_BF16.
unsafe fn convert_block(k: usize, a: Operand, rows: std::ops::Range<usize>, buf: &mut Aligned) -> ABlock {
    let kq = k.div_ceil(2);
    let len = rows.len().div_ceil(2 * MR) * 2 * MR * kq;
    if buf.buf.len() < len + 16 {
        *buf = Aligned::for_writing(len);
    }
    let out = buf.ptr_mut();
    // The tests' NaN pairs for every block, not only a fresh buffer: a reused one holds the
    // last product's pairs, which would hide an element this block's packers skipped.
    #[cfg(test)]
    std::slice::from_raw_parts_mut(out, len).fill(0x7fc0_7fc0);
    if a.col_stride != 1 && a.row_stride == 1 {
        for i0 in rows.clone().step_by(2 * MR) {
            pack_panels(rows.end, k, a, i0, out.add((i0 - rows.start) * kq));
        }
        return ABlock {
            ptr: out,
            tile_stride: MR * kq,
            row_stride: 1,
            q_stride: MR,
        };
    }
    for i in rows.clone() {
        pack_row(k, a.skip_rows(i), out.add((i - rows.start) * kq));
    }
    ABlock {
        ptr: out,
        tile_stride: MR * kq,
        row_stride: kq,
        q_stride: 1,
    }
}

/// The tiles of C's `rows` × `cols` (both starting at a tile boundary), in blocks of [`MC`]
/// rows × [`NC`] columns whose sums stay in L2 while k passes in pieces of [`KQ_PIECE`] pairs
/// (each tile after the first piece resuming from the sums C holds); within a piece, strips,
/// then the block's row tiles, so a strip's piece stays in L1 while the tiles pass. Without
/// the blocks — pieces over all of C, as the f32 kernel takes them — C went to memory and back
/// once per piece, and the kernel ran at a third of its speed at d 384. A row block's pairs
/// are converted (with [`ASource::Rows`]) before its first product.
#[target_feature(enable = "avx512f,avx512bf16")]
#[allow(clippy::too_many_arguments)]
unsafe fn run(
    a: ASource<'_>,
    b: &PackedPairs,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    beta: f32,
    c: SharedMut<f32>,
    ldc: usize,
) {
    let mut buf = A_BLOCK.with(|b| std::mem::take(&mut *b.borrow_mut()));
    let kq = b.kq();
    // With β ≠ 0 in one piece: β·C is added once, after the whole chain.
    let piece = if beta == 0.0 { KQ_PIECE } else { kq.max(1) };
    for ic in rows.clone().step_by(MC) {
        let ic_end = rows.end.min(ic + MC);
        let block = match a {
            ASource::Packed(p) => ABlock {
                ptr: p.data.ptr().add((ic / MR) * p.tile_stride),
                tile_stride: p.tile_stride,
                row_stride: p.row_stride,
                q_stride: p.q_stride,
            },
            ASource::Rows(a) => convert_block(b.k, a, ic..ic_end, &mut buf),
        };
        for jc in cols.clone().step_by(NC) {
            let jc_end = cols.end.min(jc + NC);
            for q0 in (0..kq.max(1)).step_by(piece) {
                let kp = piece.min(kq - q0);
                for j0 in (jc..jc_end).step_by(NR) {
                    let width = NR.min(jc_end - j0);
                    let strip = b.data.ptr().add((j0 / NR) * kq * NR + q0 * NR);
                    for i0 in (ic..ic_end).step_by(MR) {
                        let t = Tile {
                            kq: kp,
                            a: block
                                .ptr
                                .add(((i0 - ic) / MR) * block.tile_stride + q0 * block.q_stride),
                            rsa: block.row_stride,
                            qsa: block.q_stride,
                            b: strip,
                            c: c.at(i0 * ldc + j0),
                            ldc,
                            lo: lanes(width),
                            hi: lanes(width.saturating_sub(16)),
                            beta,
                            resume: q0 > 0,
                        };
                        run_tile(MR.min(ic_end - i0), width > 16, t);
                    }
                }
            }
        }
    }
    A_BLOCK.with(|b| *b.borrow_mut() = buf);
}

#[derive(Clone, Copy)]
struct Tile {
    /// Pairs of k.
    kq: usize,
    /// Row 0's first pair; row r's pair q at `a + r·rsa + q·qsa`.
    a: *const u32,
    rsa: usize,
    qsa: usize,
    /// The strip's first pair row (NR u32 each, 64-byte aligned).
    b: *const u32,
    c: *mut f32,
    ldc: usize,
    /// Which of the tile's 32 columns exist (low and high 16).
    lo: __mmask16,
    hi: __mmask16,
    beta: f32,
    /// The sums start from C's values (a product continued over more of k; β not applied).
    resume: bool,
}

/// [`tile`] for a tile of `rows` (1..=8) rows; `wide`: more than 16 of its columns exist.
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn run_tile(rows: usize, wide: bool, t: Tile) {
    match wide {
        true => run_rows::<true>(rows, t),
        false => run_rows::<false>(rows, t),
    }
}

#[inline(always)]
unsafe fn run_rows<const WIDE: bool>(rows: usize, t: Tile) {
    match rows {
        8 => tile::<8, WIDE>(t),
        7 => tile::<7, WIDE>(t),
        6 => tile::<6, WIDE>(t),
        5 => tile::<5, WIDE>(t),
        4 => tile::<4, WIDE>(t),
        3 => tile::<3, WIDE>(t),
        2 => tile::<2, WIDE>(t),
        _ => tile::<1, WIDE>(t),
    }
}

/// C[0..R, 0..32] = A[0..R, :]·B[:, 0..32] + beta·C in bf16 products, masked to the columns
/// that exist (without `WIDE` only the low 16 are computed). B's strips are zero-padded, so
/// its loads need no mask; masked-off lanes of C are neither loaded nor stored.
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn tile<const R: usize, const WIDE: bool>(t: Tile) {
    let (mut lo, mut hi) = start_sums::<R, WIDE>(t.c, t.ldc, (t.lo, t.hi), t.resume);
    // One base pointer per row and a shared offset, as in the f32 kernel (independent
    // addresses for the broadcasts).
    let rows: [*const u32; R] = std::array::from_fn(|i| t.a.wrapping_add(i * t.rsa));
    let mut b = t.b;
    let mut offset = 0;
    for _ in 0..t.kq {
        let b_lo: __m512bh = std::mem::transmute(_mm512_load_si512(b.cast()));
        let b_hi: __m512bh = if WIDE {
            std::mem::transmute::<__m512i, __m512bh>(_mm512_load_si512(b.add(16).cast()))
        } else {
            std::mem::transmute::<__m512i, __m512bh>(_mm512_setzero_si512())
        };
        for i in 0..R {
            let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(*rows[i].add(offset) as i32));
            lo[i] = _mm512_dpbf16_ps(lo[i], av, b_lo);
            if WIDE {
                hi[i] = _mm512_dpbf16_ps(hi[i], av, b_hi);
            }
        }
        offset += t.qsa;
        b = b.add(NR);
    }
    store_sums::<R, WIDE>((lo, hi), t.c, t.ldc, (t.lo, t.hi), t.beta, t.resume);
}
