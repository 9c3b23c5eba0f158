//! bf16 products with f32 accumulation, on AVX512_BF16's `vdpbf16ps`: the products of
//! [`Precision::Bf16`](crate::Precision).
//!
//! `vdpbf16ps` takes 32 pairs of bf16 from each operand and adds each adjacent pair's two
//! products into one of 16 f32 lanes: per lane `acc = (acc + a₁·b₁) + a₀·b₀`, each step one
//! fused multiply-add rounded to nearest even (a product of two bf16 is exact in f32 unless it
//! underflows), denormal inputs read as zero and a denormal result flushed to zero — Intel's
//! definition ("FP32 FMA with DAZ in, FTZ out"). The tests hold the kernel to that model
//! (`bf16_tests`) on this Zen 4 and the AMX Xeon; a product that underflows has not met the
//! hardware in them yet (`emulated_tests` has the case). That is twice the
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
//! The packers are the [`pack`] module's. Rounding to bf16 is the hardware's (`vcvtne2ps2bf16`:
//! to nearest even, a NaN stays a NaN, a denormal becomes a signed zero); [`pack::to_bf16`] is the same in scalar form, for the odd
//! strides and the tests. Unlike the f32 path, which multiplies small operands where they lie,
//! bf16 always packs both: the conversion has to read and write every element anyway.
//!
//! The kernel is the f32 one's shape (an 8×32 tile of C in sixteen registers, strips outer and
//! row tiles inner, a long k in pieces that resume from C's sums). Each element of C is one
//! chain of `vdpbf16ps` over k's pairs in order, then β·C added once: threads split C's rows or
//! columns, never k, so the bits depend on the shapes alone.
//!
//! Where the CPU has AMX the same blocks and pieces run in steps of 32×32 on its tiles instead
//! ([`amx`]; k padded to 16 pairs, A always in rows), chosen once per process
//! ([`Kernel`]) and recorded in each packed B.

use std::arch::x86_64::*;

use super::x86::avx512::{lane_mask as lanes, start_sums, store_sums};
use super::{blocks_for, for_each_block, Operand};
use crate::par::SharedMut;
use amx::TileUnit;

pub(super) mod amx;
mod pack;
mod rounded;
#[cfg(test)]
mod timing;
#[cfg(test)]
pub(super) use pack::pack_b_bits_for;
pub(super) use pack::pack_b_for;
#[cfg(test)]
pub(super) use pack::transpose16;
use pack::{convert_block, pack_a, ABlock, ASource, A_BLOCK};
#[cfg(test)]
pub(crate) use pack::{from_bf16, to_bf16};
pub(crate) use pack::{pack_b, pack_b_bits, PackedPairs};
#[cfg(test)]
pub(in crate::gemm) use rounded::pack_b_rounded as pack_b_rounded_for;
pub(crate) use rounded::Rounded;

/// Rows and columns of the C tile held in registers (8 rows × two 16-lane vectors).
pub(super) const MR: usize = 8;
pub(super) const NR: usize = 32;

/// Pairs of k per piece of [`run`] (β = 0): a strip's piece is 32 KiB, a block's A 128 KiB.
const KQ_PIECE: usize = 256;

/// Rows and columns of C per block of [`run`] (multiples of [`MR`] and [`NR`]): 192 KiB of
/// sums. Blocks of 64–256 rows and 384–768 columns, and pieces of 128–512 pairs, measured alike
/// (thread CPU time, d 384's products).
pub(super) const MC: usize = 128;
const NC: usize = 384;

/// The packed B (bytes of pairs over the columns a product runs) up to which a product wider
/// than [`NC`] takes its rows one tile step at a time on AMX ([`rows_per_block`]): three quarters
/// of a 2 MiB L2, the size on every AMX Xeon so far.
const B_IN_L2: usize = 3 << 19;

/// Whether the bf16 kernel runs here: the CPU has AVX512_BF16 and [`crate::simd::unit`] is
/// AVX-512 (`EMBER_CPU_VECTOR_UNIT=avx2` turns it off like the rest of AVX-512).
pub(crate) fn supported() -> bool {
    static BF16: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    crate::simd::avx512() && *BF16.get_or_init(|| std::is_x86_feature_detected!("avx512bf16"))
}

/// What a product's steps run on: `vdpbf16ps` on 8×32 tiles of C in vector registers, or AMX's
/// tiles ([`amx`]), on the hardware or on its emulator (the tests and the start-up check).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kernel {
    Avx512,
    Amx,
    AmxEmulated,
    /// The emulator with one wrong instruction ([`amx::Faulty`]): the start-up check's
    /// tests.
    #[cfg(test)]
    AmxFaulty,
}

impl Kernel {
    /// AMX where [`amx::available`], else `vdpbf16ps`.
    fn detect() -> Self {
        if amx::available() {
            Kernel::Amx
        } else {
            Kernel::Avx512
        }
    }
    fn tiles(self) -> bool {
        self != Kernel::Avx512
    }
    /// Pairs of k from one row (of A) or pair row (of B's strip) to the next: AMX's tiles span
    /// 16 pairs, so their operands are padded with zero pairs to a multiple of 16.
    pub(in crate::gemm) fn kq_stride(self, k: usize) -> usize {
        let kq = k.div_ceil(2);
        if self.tiles() {
            kq.next_multiple_of(amx::KQ_STEP)
        } else {
            kq
        }
    }
    /// Rows a converted block of `rows` rows of A holds: whole 32-row steps for the tiles, pairs
    /// of 8-row panels (the panel packer writes two at a time) for `vdpbf16ps`.
    fn padded_rows(self, rows: usize) -> usize {
        if self.tiles() {
            rows.next_multiple_of(amx::ROWS)
        } else {
            rows.next_multiple_of(2 * MR)
        }
    }
    /// Rows of C per step, to which the threads' row blocks are aligned.
    fn rows_per_step(self) -> usize {
        if self.tiles() {
            amx::ROWS
        } else {
            MR
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
    gemm_with(Kernel::detect(), m, k, n, a, b, beta, c, ldc);
}

/// [`gemm`] on `kernel`'s steps.
///
/// # Safety
/// As [`gemm`]; for [`Kernel::Amx`], the tile state was granted ([`amx::available`]).
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gemm_with(
    kernel: Kernel,
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
    let b = pack_b_for(kernel, k, n, b);
    gemm_packed(m, a, &b, beta, c, ldc);
}

/// `C = A·B` for a B packed beforehand, on the calling thread alone (no task of the thread
/// pool): for AMX's start-up check.
///
/// # Safety
/// As [`gemm_packed`].
pub(super) unsafe fn product_on_this_thread(m: usize, a: Operand, b: &PackedPairs, c: *mut f32, ldc: usize) {
    run(
        ASource::Rows(a),
        b,
        0..m,
        0..b.n,
        b.pairs(),
        0.0,
        SharedMut(c),
        ldc,
    );
}

/// A of a product whose B was packed beforehand: f32 (any strides, converted as the products
/// read it), or a matrix [`Rounded`] beforehand, read in rows (x·Wᵀ, g·W) or as its transpose
/// (gᵀ in dW = gᵀ·x).
#[derive(Clone, Copy)]
pub(crate) enum AInput<'a> {
    F32(Operand),
    Rows(&'a Rounded),
    Transposed(&'a Rounded),
}

/// [`gemm`] with B packed beforehand, on the steps it was packed for.
///
/// # Safety
/// As [`gemm`], for A's m×k view with k the packed B's.
pub(crate) unsafe fn gemm_packed(m: usize, a: Operand, b: &PackedPairs, beta: f32, c: *mut f32, ldc: usize) {
    gemm_packed_from(m, AInput::F32(a), b, beta, c, ldc)
}

/// [`gemm_packed`] for any [`AInput`]; a rounded A is m×k (rows) or k×m (transposed).
///
/// # Safety
/// As [`gemm_packed`].
pub(crate) unsafe fn gemm_packed_from(
    m: usize,
    a: AInput<'_>,
    b: &PackedPairs,
    beta: f32,
    c: *mut f32,
    ldc: usize,
) {
    let (k, n) = (b.k, b.n);
    match a {
        AInput::F32(_) => {}
        AInput::Rows(r) => assert_eq!(r.dims(), (m, k), "bf16 product: A does not fit B"),
        AInput::Transposed(r) => assert_eq!(r.dims(), (k, m), "bf16 product: Aᵀ does not fit B"),
    }
    if m == 0 || n == 0 {
        return;
    }
    let c = SharedMut(c);
    let align = b.kernel.rows_per_step();
    // C's rows where there are more of them than columns, else its columns (a strip apiece at
    // least): one chain of sums per element either way.
    if m >= n {
        // Each task converts its own rows of A, a block at a time, just before the block's
        // products read them (`ASource::Rows`), or reads them where they were rounded.
        let source = match a {
            AInput::F32(a) => ASource::Rows(a),
            AInput::Rows(r) => ASource::Rounded(r),
            AInput::Transposed(r) => ASource::Transposed(r),
        };
        for_each_block(m, blocks_for(m, k, n, m, align), align, |rows| {
            // SAFETY: each task writes C's rows `rows` only.
            unsafe { run(source, b, rows, 0..n, b.pairs(), beta, c, ldc) }
        });
    } else {
        // Every task reads all of A's rows: converted once, beforehand.
        let packed;
        let source = match a {
            AInput::F32(a) => {
                packed = pack_a(b.kernel, m, k, a);
                ASource::Packed(&packed)
            }
            AInput::Rows(r) => ASource::Rounded(r),
            AInput::Transposed(r) => {
                packed = rounded::pack_transposed(b.kernel, r);
                ASource::Packed(&packed)
            }
        };
        for_each_block(n, blocks_for(m, k, n, n, NR), NR, |cols| {
            // SAFETY: each task writes C's columns `cols` only.
            unsafe { run(source, b, 0..m, cols, b.pairs(), beta, c, ldc) }
        });
    }
}

/// Rows `rows` of `C = A·B`, for an A rounded beforehand (read in place) and a B packed for it,
/// into `c` (the first of those rows; rows `ldc` apart), on the calling thread: for an op that
/// consumes a product a block of rows at a time while the block is in cache. Each element is
/// the chain over k that a whole product gives it ([`gemm_packed_from`]), so the bits are the
/// same.
///
/// # Safety
/// `c` has room for `rows.len()` rows of `ldc` ≥ n floats that no one else touches meanwhile;
/// the CPU has AVX512_BF16.
pub(crate) unsafe fn rows_of_product(
    a: &Rounded,
    b: &PackedPairs,
    rows: std::ops::Range<usize>,
    c: *mut f32,
    ldc: usize,
) {
    let (m, k) = a.dims();
    assert!(
        k == b.k && rows.end <= m && rows.start.is_multiple_of(b.kernel.rows_per_step()) && ldc >= b.n,
        "bf16 product rows {rows:?} of {m}×{k} · {}×{} (row stride {ldc}) off the blocks",
        b.k,
        b.n
    );
    if rows.is_empty() || b.n == 0 {
        return;
    }
    // `run` addresses C's rows from the product's first row.
    let c = SharedMut(c.wrapping_sub(rows.start * ldc));
    run(ASource::Rounded(a), b, rows, 0..b.n, b.pairs(), 0.0, c, ldc)
}

/// Parts of `C = A·B + beta·C` with B packed beforehand, on this thread: for each of `parts`,
/// C's rows × columns over k's elements `ks` alone, for an f32 A (m×k, any strides) whose other
/// columns are known to be zero in those rows — attention's causal blocks, where a block of
/// queries sees the keys up to its diagonal only. Each element is the chain over those pairs,
/// which has the bits of the chain over all of k (a zero pair adds an exact zero).
///
/// Each part has columns from a multiple of [`NR`] and `ks` from a multiple of 32 to one or to
/// k (or empty: β·C); its rows go in blocks of [`MC`], as a whole product's do.
///
/// # Safety
/// A's rows of every part × k are readable; C's parts, rows `ldc` apart from `c` (element
/// (0, 0)), are writable and touched by no one else meanwhile; the CPU has AVX512_BF16.
pub(crate) unsafe fn gemm_packed_parts(
    a: Operand,
    b: &PackedPairs,
    parts: &[(
        std::ops::Range<usize>,
        std::ops::Range<usize>,
        std::ops::Range<usize>,
    )],
    beta: f32,
    c: *mut f32,
    ldc: usize,
) {
    // Checked and cut into blocks before the tiles are configured (a failed check then leaves
    // their state and the A buffer as they were).
    let parts: Vec<Part> = parts
        .iter()
        .filter(|(rows, cols, _)| !rows.is_empty() && !cols.is_empty())
        .flat_map(|(rows, cols, ks)| {
            assert!(
                (ks.start.is_multiple_of(2 * amx::KQ_STEP) || ks.is_empty())
                    && ks.start <= ks.end
                    && (ks.end == b.k || (ks.end < b.k && ks.end.is_multiple_of(2 * amx::KQ_STEP)))
                    && cols.start.is_multiple_of(NR)
                    && cols.start <= cols.end
                    && cols.end <= b.n,
                "bf16 product part: rows {rows:?}, k {ks:?} of {} or columns {cols:?} of {} off the blocks",
                b.k,
                b.n
            );
            // An empty sum is β·C, as `run_parts` gives it (0 + β·C).
            let pairs = match ks.is_empty() {
                true => 0..0,
                false => ks.start / 2..if ks.end == b.k { b.kq_stride() } else { ks.end / 2 },
            };
            rows.clone().step_by(MC).map(move |ic| Part {
                rows: ic..rows.end.min(ic + MC),
                cols: cols.clone(),
                pairs: pairs.clone(),
            })
        })
        .collect();
    run_parts(ASource::Rows(a), b, parts, beta, SharedMut(c), ldc);
}

/// B rounded beforehand (k×n, read along its rows: x in dW = gᵀ·x) packed into strips for
/// this CPU's steps.
pub(crate) fn pack_b_rounded(b: &Rounded) -> PackedPairs {
    rounded::pack_b_rounded(Kernel::detect(), b)
}

/// The tiles of C's `rows` × `cols` (both starting at a tile boundary), in blocks of [`MC`]
/// rows × [`NC`] columns whose sums stay in L2 while k passes in pieces of [`KQ_PIECE`] pairs
/// (each tile after the first piece resuming from the sums C holds); within a piece, strips,
/// then the block's row tiles, so a strip's piece stays in L1 while the tiles pass. Without
/// the blocks — pieces over all of C, as the f32 kernel takes them — C went to memory and back
/// once per piece, and the kernel ran at a third of its speed at d 384. A row block's pairs
/// are converted (with [`ASource::Rows`]) before its first product.
///
/// k runs over B's pair rows `pairs` only (all of them, [`PackedPairs::pairs`], but for a
/// part of a product whose other pairs of A are known to be zero: attention's causal blocks).
/// Each element is then the chain over those pairs alone — the same bits as over all of them,
/// since a zero pair adds an exact zero — and the first piece starts the sums (β applied)
/// wherever the range starts.
#[allow(clippy::too_many_arguments)]
unsafe fn run(
    a: ASource<'_>,
    b: &PackedPairs,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    pairs: std::ops::Range<usize>,
    beta: f32,
    c: SharedMut<f32>,
    ldc: usize,
) {
    let mc = rows_per_block(b, cols.len(), pairs.len());
    let parts = rows.clone().step_by(mc).map(move |ic| Part {
        rows: ic..rows.end.min(ic + mc),
        cols: cols.clone(),
        pairs: pairs.clone(),
    });
    run_parts(a, b, parts, beta, c, ldc)
}

/// Rows of C per block of [`run`]: [`MC`], but one tile step (32 rows) on AMX for a product
/// wider than a block's [`NC`] columns whose packed B fits in L2 (the MLP's up projection x·Wᵀ
/// and the down projection's dX = g·W at d_ff 1,536). A block's rows of A then stay in L1 while
/// B's strips, contiguous, stream through from L2, where at 128 rows the strips stayed and A's
/// 128 rows — tile loads of 16 rows apart — came from L2 for every strip (an inference: the
/// development VM has no cache counters). Same bits: the blocks
/// only order the tiles. Measured with `gemm::bf16::timing::amx_product_parts_at_the_standard_shape`
/// (medians of 6 alternating rounds, one thread; docs/performance.md, 2026-11-30): x·Wᵀ at
/// 2048×384×1536 992 → 1,236 GFLOP/s in its tile steps, the products of n ≤ 384 within ±3%;
/// dW = gᵀ·x (k 2,048, B 6 MiB at n 1,536) fell to 554 from 922 at 32 rows, hence the bound on B.
/// The standard shape's bf16 step: 1.070× (8 pairs).
fn rows_per_block(b: &PackedPairs, cols: usize, pairs: usize) -> usize {
    let b_bytes = cols * pairs * 4;
    if b.kernel.tiles() && cols > NC && b_bytes <= B_IN_L2 {
        amx::ROWS
    } else {
        MC
    }
}

/// A block of C for [`run_parts`]: its rows (at most [`MC`]), its columns (from a multiple of
/// [`NR`]) and the pairs of k its sums run over.
pub(super) struct Part {
    pub(super) rows: std::ops::Range<usize>,
    pub(super) cols: std::ops::Range<usize>,
    pub(super) pairs: std::ops::Range<usize>,
}

/// [`run`] over blocks of C that each have their own columns and pairs of k, under one
/// configuration of the tiles and one A buffer: attention's causal blocks, 32 rows each, would
/// otherwise configure and release the tiles per block (eight times a head's product at T = 256).
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn run_parts(
    a: ASource<'_>,
    b: &PackedPairs,
    parts: impl IntoIterator<Item = Part>,
    beta: f32,
    c: SharedMut<f32>,
    ldc: usize,
) {
    let mut buf = A_BLOCK.with(|b| std::mem::take(&mut *b.borrow_mut()));
    let mut unit = match b.kernel {
        Kernel::Avx512 => Unit::Vectors,
        Kernel::Amx => {
            let mut hardware = amx::Hardware;
            hardware.configure();
            Unit::Tiles(hardware)
        }
        Kernel::AmxEmulated => Unit::Emulated(Box::new(amx::Emulated::new())),
        #[cfg(test)]
        Kernel::AmxFaulty => Unit::Faulty(Box::new(amx::Faulty(amx::Emulated::new()))),
    };
    let kq = b.kq_stride();
    for Part { rows, cols, pairs } in parts {
        debug_assert!(pairs.end <= kq && pairs.start <= pairs.end && rows.len() <= MC);
        // With β ≠ 0 in one piece: β·C is added once, after the whole chain.
        let piece = if beta == 0.0 { KQ_PIECE } else { pairs.len().max(1) };
        let (ic, ic_end) = (rows.start, rows.end);
        // The block's pair q is A's pair `q + first`: a block converted here holds the range's
        // pairs alone; the others hold all of A's.
        let (block, first) = match a {
            ASource::Packed(p) => (
                ABlock {
                    ptr: p.data.ptr().add((ic / MR) * p.tile_stride),
                    tile_stride: p.tile_stride,
                    row_stride: p.row_stride,
                    q_stride: p.q_stride,
                },
                0,
            ),
            ASource::Rows(a) => {
                let k = b.k.min(2 * pairs.end).saturating_sub(2 * pairs.start);
                let a = a.skip_cols(2 * pairs.start);
                (convert_block(b.kernel, k, a, ic..ic_end, &mut buf), pairs.start)
            }
            ASource::Rounded(r) => (
                ABlock {
                    ptr: r.pairs().add(ic * r.row_stride()),
                    tile_stride: MR * r.row_stride(),
                    row_stride: r.row_stride(),
                    q_stride: 1,
                },
                0,
            ),
            ASource::Transposed(r) => (rounded::convert_transposed(b.kernel, r, ic..ic_end, &mut buf), 0),
        };
        for jc in cols.clone().step_by(NC) {
            let jc_end = cols.end.min(jc + NC);
            for q0 in (pairs.start..pairs.end.max(pairs.start + 1)).step_by(piece) {
                // Whether the strip before asked for this one's first step's lines.
                let mut asked = false;
                for j0 in (jc..jc_end).step_by(NR) {
                    // The next strip's first step, where it is a whole one.
                    let next = match j0 + 2 * NR <= jc_end && ic_end - ic >= amx::ROWS {
                        true => c.at(ic * ldc + j0 + NR),
                        false => std::ptr::null_mut(),
                    };
                    let p = Piece {
                        block: &block,
                        rows: ic..ic_end,
                        qa: q0 - first,
                        resume: q0 > pairs.start,
                        kq: piece.min(pairs.end.saturating_sub(q0)),
                        strip: b.data.ptr().add((j0 / NR) * kq * NR + q0 * NR),
                        c: c.at(ic * ldc + j0),
                        ldc,
                        width: NR.min(jc_end - j0),
                        beta,
                        next,
                        asked,
                    };
                    asked = !next.is_null();
                    match &mut unit {
                        Unit::Vectors => piece_on_vectors(p),
                        Unit::Tiles(tiles) => piece_on_tiles(tiles, p),
                        Unit::Emulated(tiles) => piece_on_tiles(&mut **tiles, p),
                        #[cfg(test)]
                        Unit::Faulty(tiles) => piece_on_tiles(&mut **tiles, p),
                    }
                }
            }
        }
    }
    if let Unit::Tiles(tiles) = &mut unit {
        tiles.release();
    }
    A_BLOCK.with(|b| *b.borrow_mut() = buf);
}

/// What a [`run`] computes its pieces on ([`Kernel`]'s choice, with the tiles' state).
enum Unit {
    Vectors,
    Tiles(amx::Hardware),
    // Boxed: the emulated tile registers are 8 KiB.
    Emulated(Box<amx::Emulated>),
    #[cfg(test)]
    Faulty(Box<amx::Faulty>),
}

/// A piece of a block's products: C's `rows` (of the block; `c` is its first row's) ×
/// `width` columns of one strip, over the `kq` pairs from `q0` (resuming from C's sums after
/// the first piece).
struct Piece<'a> {
    block: &'a ABlock,
    rows: std::ops::Range<usize>,
    /// The block's pair where the piece starts.
    qa: usize,
    /// The sums start from C's (a piece after the first; β not applied).
    resume: bool,
    kq: usize,
    /// The strip's pair row q0.
    strip: *const u32,
    c: *mut f32,
    ldc: usize,
    width: usize,
    beta: f32,
    /// Where the piece after this one stores its first step's sums, where that step is a whole
    /// 32 × 32 (else null).
    next: *mut f32,
    /// Whether the piece before asked for this one's first step's lines.
    asked: bool,
}

/// A [`Piece`] as 8×32 tiles of C in vector registers (`vdpbf16ps`).
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn piece_on_vectors(p: Piece<'_>) {
    let block = p.block;
    for i0 in p.rows.clone().step_by(MR) {
        let r = i0 - p.rows.start;
        let t = Tile {
            kq: p.kq,
            a: block
                .ptr
                .add((r / MR) * block.tile_stride + p.qa * block.q_stride),
            rsa: block.row_stride,
            qsa: block.q_stride,
            b: p.strip,
            c: p.c.add(r * p.ldc),
            ldc: p.ldc,
            lo: lanes(p.width),
            hi: lanes(p.width.saturating_sub(16)),
            beta: p.beta,
            resume: p.resume,
        };
        run_tile(MR.min(p.rows.end - i0), p.width > 16, t);
    }
}

/// A [`Piece`] as 32×32 steps on AMX's tiles ([`amx::step`]); the block holds rows of
/// pairs, zero past k and past its last row.
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn piece_on_tiles<U: amx::TileUnit>(unit: &mut U, p: Piece<'_>) {
    // Whether the step before asked for this one's lines (its `next`).
    let mut asked = p.asked;
    for i0 in p.rows.clone().step_by(amx::ROWS) {
        let r = i0 - p.rows.start;
        // The next row step, or the next piece's first, where it is a whole one.
        let next = match (i0 + amx::ROWS < p.rows.end, i0 + 2 * amx::ROWS <= p.rows.end) {
            (true, true) if p.width == NR => p.c.add((r + amx::ROWS) * p.ldc),
            (true, _) => std::ptr::null_mut(),
            (false, _) => p.next,
        };
        let step = amx::Step {
            kq: p.kq,
            a: p.block.ptr.add(r * p.block.row_stride + p.qa),
            lda: p.block.row_stride,
            b: p.strip,
            c: p.c.add(r * p.ldc),
            ldc: p.ldc,
            rows: amx::ROWS.min(p.rows.end - i0),
            width: p.width,
            beta: p.beta,
            resume: p.resume,
            next,
            asked,
        };
        asked = !next.is_null();
        amx::step(unit, step);
    }
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
