//! The f32 products of AVX-512 CPUs that the in-place kernel does not take (a B too large for
//! L2 — the feed-forward projections — and dW = gᵀ·x with a large C): matrixmultiply's bits,
//! faster.
//!
//! These went to matrixmultiply, whose AVX-512 kernel keeps a 16×16 tile of C in sixteen
//! registers: each step of k loads one vector of B for sixteen broadcasts of A, seventeen loads
//! for sixteen multiply-adds, and every task packs both operands. Here a 12×32 tile keeps 24
//! sums in registers, so each step's two loads of B and twelve broadcasts feed 24
//! multiply-adds; each block of B's rows is packed once into 32-column strips (by all threads,
//! a range of strips each) and shared by the tasks; and a row-major A is read where it lies
//! ([`blocked`] says when A is packed). On one core of the AMX Xeon, at nanoGPT's standard
//! shape, a layer's products ran 1.12× matrixmultiply's speed
//! (`gemm::timing::avx512_order_against_matrixmultiply_at_training_shapes`), and the f32
//! training step 1.10× faster on 2 threads (docs/performance.md, thirty-sixth session).
//! Hand-written because no crate gives matrixmultiply's bits faster (the gemm crate sums in
//! another order), and the f32 bits must not change.
//!
//! **The same bits as matrixmultiply's AVX-512 kernel** (matrixmultiply 0.3, the version in
//! Cargo.lock, which picks it on every CPU with AVX-512F). That kernel computes each element of
//! C the same way whatever its tile: k is cut into blocks of [`KC`] from its start; within a
//! block the sum is one chain of fused multiply-adds in k's order from +0; the block's sum `s`
//! then goes into C as `c = s + round(β·c)`, with β = 1 after the first block, and as `c = s`
//! (C not read) where β is zero; its tiles cut by C's edges go through a buffer by the same
//! rule. So [`tile`] does the same, with C scaled first where β is neither 0 nor 1 ([`gemm`]).
//! The tests hold the two to the same bits at every layout, stride, edge and β, sums of −0
//! included, and fail with any other block of k. One difference is left: where both a sum and
//! C's value are NaN, matrixmultiply's edge tiles keep C's NaN (`c += s`) and its whole tiles
//! the sum's, as this kernel does everywhere; a run with a NaN there has diverged already.

use std::arch::x86_64::*;

use super::packed::{pack_column_major, scale, with_scratch};
use super::x86::avx512;
use super::{blocks_for, for_each_block, pack_strips_into, Operand, SharedMut, Strips};

/// matrixmultiply's block of k (`S_KC`): where its sums restart from zero, so the bits depend on
/// it. Not a tuning knob; and matrixmultiply must be built with its default (its build reads
/// `MATMUL_SGEMM_KC` from the environment), which `(13, 257, 33)` in the tests would catch.
const KC: usize = 256;

/// Elements of B up to which a product runs here (16 MiB); a larger B (a wide vocabulary's
/// weight in dh = dlogits·W) stays with matrixmultiply, as before: its speed here is not
/// measured in training.
pub(super) const MAX_B_FLOATS: usize = 1 << 22;

/// `C = A·B + β·C` with matrixmultiply's bits, for A (m×k) and B (k×n) at any strides and a
/// row-major C (row stride `ldc`), cut into parallel tasks over C's rows (or, where C is wide,
/// its columns).
///
/// # Safety
/// Every element of the m×k view of A and the k×n view of B is readable, `c` is valid for
/// reads and writes of the m×n view, C does not overlap A or B, and the CPU has AVX-512F.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gemm(
    m: usize,
    k: usize,
    n: usize,
    a: Operand,
    b: Operand,
    beta: f32,
    c: SharedMut<f32>,
    ldc: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    if (beta != 0.0 && beta != 1.0) || k == 0 {
        // round(β·c) once (zeros where β is zero), then β = 1: matrixmultiply's first block
        // adds its sum to that, and where k is zero it is all of C.
        scale(m, n, beta, c.at(0), ldc);
        if k == 0 {
            return;
        }
    }
    let beta = if beta == 0.0 { 0.0 } else { 1.0 };
    // B's blocks of k packed a round at a time, each round's by all the tasks, then its tiles:
    // all of B in one round, or one block a round ([`packs_all_of_b_first`]), at most 256 × n
    // floats packed at once then (the whole B, dW's activations, was 12 MiB at the standard
    // shape, and showed in the heap's peak where the activations are recomputed).
    let round = if packs_all_of_b_first() { k } else { KC.min(k) };
    let (strip, columns) = (avx512::STRIP, n.div_ceil(avx512::STRIP) * avx512::STRIP);
    let buffer = Strips::zeroed(round, n);
    let strips = SharedMut(buffer.as_ptr().cast_mut());
    for r0 in (0..k).step_by(round) {
        // The round's blocks: (first row of k, rows, where its strips start in the buffer).
        let blocks: Vec<(usize, usize, usize)> = (r0..k.min(r0 + round))
            .step_by(KC)
            .map(|p0| (p0, KC.min(k - p0), (p0 - r0) * columns))
            .collect();
        // matrixmultiply's first block adds its sum to C by β, the later ones by 1.
        let beta = |p0: usize| if p0 == 0 { beta } else { 1.0 };
        // The strips packed in parallel, a range of them a task (packing on one thread left
        // the other idle). A shorter last block leaves an earlier block's values past n in
        // its last strip: lanes that the tiles compute but never store.
        for_each_block(n, blocks_for(m, k, n, n, strip), strip, |r| {
            for &(p0, kc, at) in &blocks {
                // SAFETY: each task writes its own strips of each block (r.start is a multiple
                // of 32), inside the buffer's round × n's strips.
                let b = b.skip_rows(p0).skip_cols(r.start);
                pack_strips_into(kc, r.len(), b, strips.at(at + r.start * kc));
            }
        });
        if m >= n {
            for_each_block(m, blocks_for(m, k, n, m, 8), 8, |r| {
                for &(p0, kc, at) in &blocks {
                    // SAFETY: each task writes C's rows `r` only.
                    let (a, c) = (a.skip_cols(p0).skip_rows(r.start), c.at(r.start * ldc));
                    blocked(r.len(), kc, n, a, strips.at(at), beta(p0), c, ldc);
                }
            });
        } else {
            for_each_block(n, blocks_for(m, k, n, n, strip), strip, |r| {
                for &(p0, kc, at) in &blocks {
                    // SAFETY: each task writes C's columns `r` only; its strips of a block start
                    // at strip r.start / 32 (r.start is a multiple of 32), each kc × 32 floats.
                    let (b, c) = (strips.at(at + r.start * kc), c.at(r.start));
                    blocked(m, kc, r.len(), a.skip_cols(p0), b, beta(p0), c, ldc);
                }
            });
        }
    }
}

/// Whether a product packs all of B's blocks of k before any tile runs: where its tasks have the
/// pool to themselves (it was called from outside the pool, as a step of one share calls it)
/// and there is more than one thread. Packing a block at a time, the threads meet twice for
/// every block of 256 rows of k (the strips packed by all, then the tiles), hundreds of
/// products a step, and SmolLM2's f32 step at one share lost there what its products gain on
/// one core; all of B first, they meet twice a product, and that step ran 1.028× and 1.068×
/// faster in two sittings (docs/performance.md, thirty-seventh session). Inside a share's
/// task, with another share running beside it, a block at a time keeps the packed block in L2
/// while its tiles run (all of B first was 0.971× at nanoGPT's standard shape, 2.3% more heap).
fn packs_all_of_b_first() -> bool {
    crate::par::threads() > 1 && rayon::current_thread_index().is_none()
}

/// Rows of C per tile: twelve rows of two 16-lane vectors in 24 registers, so that each step's
/// two loads of B feed 24 multiply-adds (matrixmultiply's 16×16 tile feeds 16 from one load
/// and sixteen broadcasts: this tile ran 1.05–1.17× its speed at training shapes).
const MR: usize = 12;
/// Columns of C per tile: a strip.
const NR: usize = avx512::STRIP;
/// Rows of a column-major A packed at a time: 96 × 256 floats (96 KiB) stay in L2 while B's
/// strips pass.
const MC: usize = 96;

/// The loops around the tiles for one block of k (`kc` ≤ [`KC`] steps): blocks of [`MC`] rows
/// of A, then B's strips (each `kc` × 32, packed), then the tiles down the block.
///
/// A row-major A is read where it lies: a tile's twelve rows each give one element a step, a
/// stream of whole cache lines. A column-major A (gᵀ in dW = gᵀ·x, k the tokens) would give
/// twelve floats of a new line at every step, so its block is packed first into panels of
/// [`MR`] rows, each step's twelve elements side by side (read in place it ran at 0.86–0.94×
/// matrixmultiply's speed, packed at 1.05–1.17×).
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn blocked(
    m: usize,
    kc: usize,
    n: usize,
    a: Operand,
    strips: *const f32,
    beta: f32,
    c: *mut f32,
    ldc: usize,
) {
    let pack = a.row_stride == 1 && a.col_stride != 1;
    with_scratch(if pack { MC * kc } else { 0 }, |panels| {
        for i0 in (0..m).step_by(MC) {
            let mc = MC.min(m - i0);
            let block = a.skip_rows(i0);
            if pack {
                pack_a(mc, kc, block, panels);
            }
            for j0 in (0..n).step_by(NR) {
                let cols = NR.min(n - j0);
                let strip = strips.add((j0 / NR) * kc * NR);
                for (q, i) in (0..mc).step_by(MR).enumerate() {
                    let rows = MR.min(mc - i);
                    let a = if pack {
                        Operand {
                            ptr: panels.as_ptr().add(q * MR * kc),
                            row_stride: 1,
                            col_stride: MR,
                        }
                    } else {
                        block.skip_rows(i)
                    };
                    let c = c.add((i0 + i) * ldc + j0);
                    tile(kc, a, strip, beta, Out { c, ldc, rows, cols });
                }
            }
        }
    })
}

/// A column-major A's `mc` × `kc` view as panels of [`MR`] rows, each `kc` steps of [`MR`]
/// elements (rows past `mc` zero).
// Not inlined, so that a profile tells the packing from the products.
#[inline(never)]
unsafe fn pack_a(mc: usize, kc: usize, a: Operand, out: &mut [f32]) {
    pack_column_major::<MR>(mc, kc, a, out)
}

/// Where a tile's sums go: the first `rows` × `cols` of a tile of C at `c` (row stride `ldc`).
struct Out {
    c: *mut f32,
    ldc: usize,
    rows: usize,
    cols: usize,
}

/// One tile of C: each element's chain of multiply-adds from zero over `kc` steps, then
/// `c = sum` (β 0, C not read) or `c = sum + c` (β 1). A's rows past `rows` repeat its last
/// (their sums are not stored), so that no read leaves A.
// Not inlined, so that a profile tells the packing from the products.
#[inline(never)]
#[target_feature(enable = "avx512f")]
unsafe fn tile(kc: usize, a: Operand, mut b: *const f32, beta: f32, out: Out) {
    let Out { c, ldc, rows, cols } = out;
    let mut lo = [_mm512_setzero_ps(); MR];
    let mut hi = [_mm512_setzero_ps(); MR];
    // One base pointer per row and a shared offset, as in the in-place kernel: the broadcasts'
    // addresses do not depend on each other.
    let at: [*const f32; MR] = std::array::from_fn(|r| a.ptr.add(r.min(rows - 1) * a.row_stride));
    let mut offset = 0;
    for _ in 0..kc {
        let (b_lo, b_hi) = (_mm512_loadu_ps(b), _mm512_loadu_ps(b.add(16)));
        for r in 0..MR {
            let x = _mm512_set1_ps(*at[r].add(offset));
            lo[r] = _mm512_fmadd_ps(x, b_lo, lo[r]);
            hi[r] = _mm512_fmadd_ps(x, b_hi, hi[r]);
        }
        offset += a.col_stride;
        b = b.add(NR);
    }
    let (lo_mask, hi_mask) = (
        avx512::lane_mask(cols),
        avx512::lane_mask(cols.saturating_sub(16)),
    );
    for r in 0..rows {
        // The high half's address may lie past C where the tile has 16 columns or fewer: its
        // mask is empty then, so nothing there is read or written, and `wrapping_add` keeps
        // forming the address defined.
        let (at, at_hi) = (c.add(r * ldc), c.add(r * ldc).wrapping_add(16));
        let (mut s_lo, mut s_hi) = (lo[r], hi[r]);
        if beta != 0.0 {
            // matrixmultiply's sum + round(1·c): the sum first, as its epilogue adds.
            s_lo = _mm512_add_ps(s_lo, _mm512_maskz_loadu_ps(lo_mask, at));
            s_hi = _mm512_add_ps(s_hi, _mm512_maskz_loadu_ps(hi_mask, at_hi));
        }
        _mm512_mask_storeu_ps(at, lo_mask, s_lo);
        _mm512_mask_storeu_ps(at_hi, hi_mask, s_hi);
    }
}
