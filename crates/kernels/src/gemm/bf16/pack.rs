//! The bf16 products' operands, rounded to bf16 and laid out in pairs of k: B in strips of
//! [`NR`] columns ([`PackedPairs`], packed once where one weight serves many products), A in
//! rows of pairs or panels of [`MR`] rows, all of it beforehand ([`pack_a`]) or a block at a time
//! on the thread that multiplies it ([`convert_block`]). The layouts are `super`'s module doc's.

use std::arch::x86_64::*;

use super::amx;
use super::{Kernel, MR, NR};
use crate::gemm::x86::avx512::lane_mask as lanes;
use crate::gemm::{Bits, Operand};
use crate::par::SharedMut;

pub(crate) use crate::gemm::emulated::to_bf16;

/// The f32 of bf16 bits (exact).
#[cfg(test)]
pub(crate) fn from_bf16(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// The pair (lo, hi) as `vdpbf16ps` reads it: lo in the low 16 bits.
pub(super) fn pair(lo: f32, hi: f32) -> u32 {
    to_bf16(lo) as u32 | (to_bf16(hi) as u32) << 16
}

/// u32 elements on a 64-byte boundary: a strip's pair row is then two whole cache lines, and
/// every vector load of it is aligned.
///
/// Not zeroed: the packers write every element, padding included, and zeroing first was a
/// second pass over every operand (with calloc's memset, or the kernel's page clearing for a
/// fresh mapping). The unit tests fill it with NaN pairs first, so an element a packer skipped
/// shows in the products they check.
#[derive(Default)]
pub(super) struct Aligned {
    pub(super) buf: Vec<std::mem::MaybeUninit<u32>>,
    pub(super) skip: usize,
}

impl Aligned {
    /// Room for `len` elements, which the caller writes before anything reads them.
    pub(super) fn for_writing(len: usize) -> Self {
        let mut buf: Vec<std::mem::MaybeUninit<u32>> = Vec::with_capacity(len + 16);
        #[cfg(test)]
        buf.resize(len + 16, std::mem::MaybeUninit::new(0x7fc0_7fc0));
        // SAFETY: `MaybeUninit` needs no initialisation.
        unsafe { buf.set_len(len + 16) };
        let skip = buf.as_ptr().align_offset(64).min(16);
        Self { buf, skip }
    }
    pub(super) fn ptr(&self) -> *const u32 {
        self.buf[self.skip..].as_ptr().cast()
    }
    pub(super) fn ptr_mut(&mut self) -> *mut u32 {
        self.buf[self.skip..].as_mut_ptr().cast()
    }
}

/// B (k×n) as bf16 pairs in strips of [`NR`] columns: strip s, pair row q starts at
/// `(s·kq_stride + q)·NR`, kq_stride = ⌈k/2⌉ (rounded up to 16 for AMX, the pairs past k zero),
/// for the kernel it was packed for.
pub(crate) struct PackedPairs {
    pub(super) data: Aligned,
    pub(super) k: usize,
    pub(super) n: usize,
    pub(super) kernel: Kernel,
}

impl PackedPairs {
    pub(super) fn kq_stride(&self) -> usize {
        self.kernel.kq_stride(self.k)
    }

    /// All of B's pair rows, padding included: the range a whole product runs over.
    pub(super) fn pairs(&self) -> std::ops::Range<usize> {
        0..self.kq_stride()
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
pub(super) struct PairsA {
    pub(super) data: Aligned,
    pub(super) tile_stride: usize,
    pub(super) row_stride: usize,
    pub(super) q_stride: usize,
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
pub(super) unsafe fn pairs_of_run(x: *const f32, count: usize) -> __m512i {
    let lo = _mm512_maskz_loadu_ps(lanes(count), x);
    let hi = _mm512_maskz_loadu_ps(lanes(count.saturating_sub(16)), x.wrapping_add(16));
    std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo))
}

/// `dst[c·16 + r] = src[r][c]` for a 16×16 block of u32 (rows `r` of `src` are vectors).
#[inline]
#[target_feature(enable = "avx512f")]
pub(in crate::gemm) unsafe fn transpose16(src: [__m512i; 16]) -> [__m512i; 16] {
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
    pack_b_for(Kernel::detect(), k, n, b)
}

/// [`pack_b`] for `kernel`'s steps.
///
/// # Safety
/// As [`pack_b`].
pub(in crate::gemm) unsafe fn pack_b_for(kernel: Kernel, k: usize, n: usize, b: Operand) -> PackedPairs {
    // SAFETY: `pack_strip` writes strip s's ⌈k/2⌉ pair rows from B's readable k×n view.
    unsafe { pack_strips_with(kernel, k, n, |s, strip| pack_strip(k, n, b, s, strip)) }
}

/// B (k×n) held as bf16 bits ([`Bits`]) packed as [`pack_b`] packs its values: the same pairs,
/// since rounding the widened bits gives them back. Held activations (attention's q, k and v)
/// are packed so without being widened first.
///
/// # Safety
/// Every element of B's k×n view is inside its data; the CPU has AVX512_BF16.
pub(crate) unsafe fn pack_b_bits(k: usize, n: usize, b: Bits<'_>) -> PackedPairs {
    pack_b_bits_for(Kernel::detect(), k, n, b)
}

/// [`pack_b_bits`] for `kernel`'s steps.
///
/// # Safety
/// As [`pack_b_bits`].
pub(in crate::gemm) unsafe fn pack_b_bits_for(
    kernel: Kernel,
    k: usize,
    n: usize,
    b: Bits<'_>,
) -> PackedPairs {
    // SAFETY: `pack_strip_bits` writes strip s's ⌈k/2⌉ pair rows from B's k×n view.
    unsafe { pack_strips_with(kernel, k, n, |s, strip| pack_strip_bits(k, n, b, s, strip)) }
}

/// B's strips for `kernel`, each packed by `strip(s, out)` in parallel tasks, the pair rows past
/// k up to the kernel's stride zeroed.
///
/// # Safety
/// `strip(s, out)` writes strip s's ⌈k/2⌉ pair rows of [`NR`] u32 at `out` (room for the
/// kernel's stride of them) and nothing else.
unsafe fn pack_strips_with(
    kernel: Kernel,
    k: usize,
    n: usize,
    strip: impl Fn(usize, *mut u32) + Sync + Send,
) -> PackedPairs {
    let (kq, strips) = (kernel.kq_stride(k), n.div_ceil(NR));
    let mut data = Aligned::for_writing(strips * kq * NR);
    let out = SharedMut(data.ptr_mut());
    pack_tasks(k * n, strips, 1, |range| {
        for s in range {
            // SAFETY: strip s (NR·kq elements from its start) is this task's alone.
            unsafe {
                let at = out.at(s * kq * NR);
                strip(s, at);
                // The pair rows past k that AMX's tiles read.
                std::ptr::write_bytes(at.add(k.div_ceil(2) * NR), 0, (kq - k.div_ceil(2)) * NR);
            }
        }
    });
    PackedPairs { data, k, n, kernel }
}

/// Strip `s` of [`pack_b_bits`] into `out`: the bits moved into pairs, nothing rounded. A
/// whole strip of contiguous rows (k or q in attention's dq = dS·k and dk = dSᵀ·q) interleaves
/// two rows' 32 columns; contiguous columns (kᵀ and vᵀ in dP = dO·vᵀ) are already pairs along k,
/// 16 columns of 16 pairs transposed as [`pack_strip`] does; the rest goes element by element.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn pack_strip_bits(k: usize, n: usize, b: Bits<'_>, s: usize, out: *mut u32) {
    let (kq, rs, cs, j0) = (k.div_ceil(2), b.row_stride, b.col_stride, s * NR);
    let at = b.data.as_ptr();
    if cs == 1 && j0 + NR <= n {
        let load = |row: *const u16| {
            (
                _mm512_cvtepu16_epi32(_mm256_loadu_si256(row.cast())),
                _mm512_cvtepu16_epi32(_mm256_loadu_si256(row.add(16).cast())),
            )
        };
        for q in 0..kq {
            let first = load(at.add(2 * q * rs + j0));
            let second = match 2 * q + 1 < k {
                true => load(at.add((2 * q + 1) * rs + j0)),
                false => (_mm512_setzero_si512(), _mm512_setzero_si512()),
            };
            let pairs = |lo: __m512i, hi: __m512i| _mm512_or_si512(lo, _mm512_slli_epi32::<16>(hi));
            _mm512_store_si512(out.add(q * NR).cast(), pairs(first.0, second.0));
            _mm512_store_si512(out.add(q * NR + 16).cast(), pairs(first.1, second.1));
        }
        return;
    }
    // Pair q of column j: rows 2q and 2q+1 (zero past k and past n).
    let pair = |q: usize, j: usize| -> u32 {
        let bits = |p: usize| match p < k && j < n {
            true => *at.add(p * rs + j * cs) as u32,
            false => 0,
        };
        bits(2 * q) | bits(2 * q + 1) << 16
    };
    for half in 0..2 {
        let jh = j0 + half * 16;
        for q0 in (0..kq).step_by(16) {
            let mut block = [_mm512_setzero_si512(); 16];
            for (c, v) in block.iter_mut().enumerate() {
                *v = if rs == 1 && jh + c < n && 2 * q0 + 32 <= k {
                    // Column jh + c's 16 pairs from q0 are its 32 bits in a row.
                    _mm512_loadu_si512(at.add((jh + c) * cs + 2 * q0).cast())
                } else {
                    let lanes: [u32; 16] = std::array::from_fn(|t| pair(q0 + t, jh + c));
                    _mm512_loadu_si512(lanes.as_ptr().cast())
                };
            }
            let rows = transpose16(block);
            for (t, row) in rows.iter().enumerate().take(16.min(kq - q0)) {
                _mm512_store_si512(out.add((q0 + t) * NR + half * 16).cast(), *row);
            }
        }
    }
}

/// Strip `s` of [`pack_b`] into `out`.
#[target_feature(enable = "avx512f,avx512bf16")]
pub(super) unsafe fn pack_strip(k: usize, n: usize, b: Operand, s: usize, out: *mut u32) {
    let kq = k.div_ceil(2);
    let (rs, cs) = (b.row_stride, b.col_stride);
    if cs == 1 {
        pack_strip_from_rows(k, n, b, s, out);
        return;
    }
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
        if rs == 1 {
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

/// Pair rows ahead of the one being packed whose B rows [`pack_strip_from_rows`] prefetches.
const PREFETCH_PAIRS_AHEAD: usize = 24;

/// [`pack_strip`] for a B whose rows are contiguous (the activation x in dW = gᵀ·x, W in
/// dX = g·W): rows 2q and 2q+1 lie along j, so the strip's 32 columns of both make its pair row
/// q. Both 16-column halves are taken in one walk down the rows, a row's 32 columns being two
/// neighbouring cache lines; and the rows ahead are prefetched, because consecutive rows lie n
/// floats apart (6 KiB at n = 1,536), beyond what the hardware prefetcher follows, so that each
/// row's lines were a miss waited for (the loads held most of the packer's samples). On AMX,
/// where the products are 2.9× faster than on `vdpbf16ps` and B's packing was 10% of nanoGPT's
/// standard shape's bf16 step, this made the step 1.038× faster (docs/performance.md); 24 pair
/// rows ahead measured 1.033× faster than 8.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn pack_strip_from_rows(k: usize, n: usize, b: Operand, s: usize, out: *mut u32) {
    let (kq, rs, j0) = (k.div_ceil(2), b.row_stride, s * NR);
    // Columns of each half that exist (none of the high half in a last strip of ≤ 16).
    let (lo_mask, hi_mask) = (lanes(n - j0), lanes(n.saturating_sub(j0 + 16)));
    let load = |row: *const f32| {
        (
            _mm512_maskz_loadu_ps(lo_mask, row),
            _mm512_maskz_loadu_ps(hi_mask, row.wrapping_add(16)),
        )
    };
    for q in 0..kq {
        let ahead = 2 * (q + PREFETCH_PAIRS_AHEAD);
        for r in ahead..k.min(ahead + 2) {
            let row = b.ptr.wrapping_add(r * rs + j0).cast::<i8>();
            _mm_prefetch::<_MM_HINT_T0>(row);
            _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(64));
        }
        let first = load(b.ptr.add(2 * q * rs + j0));
        let second = if 2 * q + 1 < k {
            load(b.ptr.add((2 * q + 1) * rs + j0))
        } else {
            (_mm512_setzero_ps(), _mm512_setzero_ps())
        };
        _mm512_store_si512(out.add(q * NR).cast(), pairs16(first.0, second.0));
        _mm512_store_si512(out.add(q * NR + 16).cast(), pairs16(first.1, second.1));
    }
}

/// Elements from which an operand is packed by parallel tasks: below, waking the pool's threads
/// costs more than the packing. With every pack in parallel tasks, d 128's products at 2 threads
/// measured 1.04× f32 per layer (0.43–1.74× per product); packed like this, 1.49× and 1.60× in two
/// runs (`gemm::timing` on a loaded machine, docs/performance-raw/2026-11-29-bf16).
pub(super) const PAR_MIN_PACK: usize = 1 << 16;

/// `task` over `0..len` in pieces of `chunk`, as parallel tasks when the operand has at least
/// [`PAR_MIN_PACK`] elements, else in turn on this thread. Each piece writes its own part of the
/// packed operand, so the bits are the same either way.
pub(super) fn pack_tasks(
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
pub(super) unsafe fn pack_a(kernel: Kernel, m: usize, k: usize, a: Operand) -> PairsA {
    let kq = kernel.kq_stride(k);
    if kernel.tiles() {
        // Rows of pairs (AMX reads no panels), in blocks of 32 rows.
        let mut data = Aligned::for_writing(kernel.padded_rows(m) * kq);
        let out = SharedMut(data.ptr_mut());
        let blocks = m.div_ceil(amx::ROWS);
        pack_tasks(m * k, blocks, 1, |range| {
            for blk in range {
                let i0 = blk * amx::ROWS;
                // SAFETY: these 32 rows are this task's alone.
                unsafe { pack_rows_for_tiles(k, a, i0..m.min(i0 + amx::ROWS), out.at(i0 * kq), kq) }
            }
        });
        return PairsA {
            data,
            tile_stride: MR * kq,
            row_stride: kq,
            q_stride: 1,
        };
    }
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

/// Pair q of a column-major A's rows `i0..i0 + 16` (those in `mask`; zeros elsewhere and past
/// k): columns 2q and 2q+1 lie along i, 16 rows of each make 16 pairs.
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn column_pairs(k: usize, a: Operand, i0: usize, mask: __mmask16, q: usize) -> __m512i {
    let c0 = a.ptr.add(2 * q * a.col_stride + i0);
    let lo = _mm512_maskz_loadu_ps(mask, c0);
    let hi = if 2 * q + 1 < k {
        _mm512_maskz_loadu_ps(mask, c0.add(a.col_stride))
    } else {
        _mm512_setzero_ps()
    };
    pairs16(lo, hi)
}

/// The panels of A's rows `i0..i0 + 16` (those that exist) for a column-major A into `out`.
#[target_feature(enable = "avx512f,avx512bf16")]
pub(super) unsafe fn pack_panels(m: usize, k: usize, a: Operand, i0: usize, out: *mut u32) {
    let kq = k.div_ceil(2);
    let mask = lanes(m - i0);
    for q in 0..kq {
        let p = column_pairs(k, a, i0, mask, q);
        _mm256_storeu_si256(out.add(q * MR).cast(), _mm512_castsi512_si256(p));
        if i0 + MR < m {
            // The second panel starts MR·kq further on.
            let next = out.add(MR * kq + q * MR);
            _mm256_storeu_si256(next.cast(), _mm512_extracti64x4_epi64::<1>(p));
        }
    }
}

/// A's `rows` (m×k, any strides) as rows of pairs for AMX's tiles into `out`: row i − rows.start
/// at `out + (i − rows.start)·kq_stride`, zero pairs from ⌈k/2⌉ to `kq_stride` (a multiple of
/// [`amx::KQ_STEP`]), and zero rows after the last one up to a multiple of [`amx::ROWS`]. A
/// column-major A (gᵀ) is converted 16 rows × 16 pairs at a time and transposed into rows.
///
/// # Safety
/// A's rows `rows` × k are readable; `out` has room for `rows.len()` rounded up to
/// [`amx::ROWS`], times `kq_stride`; the CPU has AVX512_BF16.
#[target_feature(enable = "avx512f,avx512bf16")]
pub(super) unsafe fn pack_rows_for_tiles(
    k: usize,
    a: Operand,
    rows: std::ops::Range<usize>,
    out: *mut u32,
    kq_stride: usize,
) {
    let kq = k.div_ceil(2);
    let padded = rows.len().next_multiple_of(amx::ROWS);
    if a.col_stride != 1 && a.row_stride == 1 {
        for r0 in (0..padded).step_by(16) {
            let mask = lanes(rows.len().saturating_sub(r0));
            for q0 in (0..kq_stride).step_by(16) {
                let mut block = [_mm512_setzero_si512(); 16];
                for (t, v) in block.iter_mut().enumerate() {
                    if q0 + t < kq && mask != 0 {
                        *v = column_pairs(k, a, rows.start + r0, mask, q0 + t);
                    }
                }
                for (r, row) in transpose16(block).iter().enumerate() {
                    _mm512_storeu_si512(out.add((r0 + r) * kq_stride + q0).cast(), *row);
                }
            }
        }
        return;
    }
    for r in 0..padded {
        let row = out.add(r * kq_stride);
        let written = if r < rows.len() {
            pack_row(k, a.skip_rows(rows.start + r), row);
            kq
        } else {
            0
        };
        for q in written..kq_stride {
            *row.add(q) = 0;
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

/// Where [`super::run`] finds A's pairs.
#[derive(Clone, Copy)]
pub(super) enum ASource<'a> {
    /// Converted beforehand, all of it.
    Packed(&'a PairsA),
    /// A rounded beforehand, read in rows where it lies.
    Rounded(&'a super::Rounded),
    /// The transpose of a matrix rounded beforehand, each block converted as [`Self::Rows`]'.
    Transposed(&'a super::Rounded),
    /// A itself (m×k, any strides): each block of [`super::MC`] rows is converted into this thread's
    /// buffer as its turn comes. The block's pairs (128 rows × k: 192 KiB at k = 384, 1 MiB at
    /// k = 2,048) are then read from L2 (or close to it) by all of its products, where A
    /// converted all at once went out to L3 or memory and came back.
    Rows(Operand),
}

/// A block of A's pairs: row r of the tile starting at the block's row `i` (a multiple of
/// [`MR`] from the block's start), pair q, at `ptr + (i / MR)·tile_stride + r·row_stride +
/// q·q_stride`.
pub(super) struct ABlock {
    pub(super) ptr: *const u32,
    pub(super) tile_stride: usize,
    pub(super) row_stride: usize,
    pub(super) q_stride: usize,
}

thread_local! {
    /// [`ASource::Rows`]' block buffer, kept from product to product on this thread.
    pub(super) static A_BLOCK: std::cell::RefCell<Aligned> = std::cell::RefCell::new(Aligned::default());
}

/// Room in `buf` (grown as needed) for a block of `rows` rows of A converted for `kernel`, with
/// `kq` pairs a row.
pub(super) fn block_buffer(kernel: Kernel, rows: usize, kq: usize, buf: &mut Aligned) -> *mut u32 {
    let len = kernel.padded_rows(rows) * kq;
    if buf.buf.len() < len + 16 {
        *buf = Aligned::for_writing(len);
    }
    let out = buf.ptr_mut();
    // The tests' NaN pairs for every block, not only a fresh buffer: a reused one holds the
    // last product's pairs, which would hide an element this block's packers skipped.
    #[cfg(test)]
    // SAFETY: the buffer holds `len` elements.
    unsafe {
        std::slice::from_raw_parts_mut(out, len).fill(0x7fc0_7fc0)
    };
    out
}

/// Rows `rows` of A (m×k, any strides) converted into `buf` (grown as needed), laid out as
/// [`pack_a`] lays out the whole of A.
///
/// # Safety
/// Every element of A's rows `rows` × k is readable; the CPU has AVX512_BF16.
pub(super) unsafe fn convert_block(
    kernel: Kernel,
    k: usize,
    a: Operand,
    rows: std::ops::Range<usize>,
    buf: &mut Aligned,
) -> ABlock {
    let kq = kernel.kq_stride(k);
    let out = block_buffer(kernel, rows.len(), kq, buf);
    if kernel.tiles() {
        pack_rows_for_tiles(k, a, rows, out, kq);
        return ABlock {
            ptr: out,
            tile_stride: MR * kq,
            row_stride: kq,
            q_stride: 1,
        };
    }
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
