//! The f32 products of CPUs without AVX-512: a packed GEMM on AVX2 and FMA that gives
//! matrixmultiply's bits, faster.
//!
//! Where Ember's AVX-512 kernels do not run, every f32 product went to matrixmultiply, whose
//! AVX2 kernel keeps an 8×8 tile of C in eight registers and makes each step's eight products
//! from one vector of A by permuting it three times, shuffles that share the FMA units' ports.
//! This kernel holds a 6×16 tile in twelve registers instead and broadcasts A's elements from
//! memory (loads, not shuffles): per step of k, two loads of B and six broadcasts feed twelve
//! multiply-adds. The operands are packed with 8×8 transposes where they lie across the
//! panels (A row-major, B transposed), and the row blocks of one product share one packed B
//! ([`PackedB`]). On one core of an AMD EPYC (Zen 3, AVX2 only), packing included, a layer's
//! products ran 1.10–1.11× (d 384) and 1.07–1.10× (d 128) matrixmultiply's speed in five
//! sittings (`gemm::timing::avx2_against_matrixmultiply_at_training_shapes`; docs/performance.md
//! has the training step). Hand-written because no crate on the registries gives
//! matrixmultiply's bits faster: the gemm crate (candle's) sums in another order.
//!
//! **The same bits as matrixmultiply's AVX2 kernel** (matrixmultiply 0.3, the version in
//! Cargo.lock, which picks that kernel on every CPU with AVX2 and FMA but without AVX-512), so
//! that no f32 result of Ember's changes with it — neither a run on an AVX2 CPU nor one made
//! with `EMBER_CPU_VECTOR_UNIT=avx2`. That kernel computes each element of C the same way,
//! whatever its tile: k is cut into blocks of [`KC`] from its start; within a block the sum is
//! one chain of fused multiply-adds in k's order starting from +0; the block's sum `s` then
//! goes into C as `c = s + β·c` (β·c rounded first, and not read at all where β is zero), with
//! β = 1 after the first block — and where its 8×8 tile is cut by C's edges, with `s + 0` in
//! place of `s` ([`Out`]). Only the tile, the packing and the loops around them differ here,
//! which no element's sum sees. The tests hold the two to the same bits at every layout, edge
//! and β, sums of −0 included. (matrixmultiply's AVX-512 kernel, which it picks on AVX-512
//! CPUs, never turns a −0 sum into +0; so before this kernel `EMBER_CPU_VECTOR_UNIT=avx2` on
//! an AVX-512 CPU could differ from an AVX2 CPU in a zero's sign.)

use std::arch::x86_64::*;

use super::packed::{copy_up_to, pack_column_major, scale, with_scratch};
use super::x86::avx::{transpose8, transpose8x8};
use super::Operand;

/// Rows of C per tile.
const MR: usize = 6;
/// Columns of C per tile: two 8-lane vectors.
const NR: usize = 16;
/// matrixmultiply's block of k (`S_KC`): where its sums restart from zero, so the bits depend on
/// it. Not a tuning knob.
const KC: usize = 256;
/// Rows of A packed at a time: 120 × 256 floats (120 KiB) stay in L2 while B's strips pass.
const MC: usize = 120;
/// Columns of B packed at a time: 256 × 1,024 floats (1 MiB), as matrixmultiply's `S_NC`.
const NC: usize = 1024;

/// Whether this kernel can run: the CPU has AVX2 and FMA (where matrixmultiply picks the AVX2
/// kernel whose bits this one gives). The products use it where the vector unit in use is AVX2
/// ([`super::f32_on_avx2`]); the tests wherever it can run.
#[cfg(test)]
pub(super) fn available() -> bool {
    std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
}

/// `C = A·B + β·C` for A (m×k) and B (k×n) at any strides and a row-major C (row stride `ldc`),
/// on the calling thread.
///
/// # Safety
/// Every element of the m×k view of A and the k×n view of B is readable, `c` is valid for
/// reads and writes of the m×n view, C does not overlap A or B, and the CPU has AVX2 and FMA.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gemm(
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
    if k == 0 {
        return scale(m, n, beta, c, ldc);
    }
    let b_len = KC.min(k) * NC.min(n).div_ceil(NR) * NR;
    with_scratch(a_len(k) + b_len, |scratch| {
        let (packed_a, packed_b) = scratch.split_at_mut(a_len(k));
        blocked(m, k, n, a, Strips::PackHere(b, packed_b), packed_a, beta, c, ldc)
    });
}

/// Floats of a packed block of A for a product over k.
fn a_len(k: usize) -> usize {
    MC.div_ceil(MR) * MR * KC.min(k)
}

/// B (k×n) packed whole, for the row blocks of one product to share, where each block packed all
/// of B for itself, as matrixmultiply does: 1.018–1.027× a training step (docs/performance.md).
pub(super) struct PackedB {
    strips: Vec<f32>,
    k: usize,
    n: usize,
}

impl PackedB {
    /// B's k×n view packed as [`gemm`] packs it block by block, the blocks side by side, in
    /// parallel tasks.
    ///
    /// # Safety
    /// Every element of B's k×n view is readable, and the CPU has AVX2 and FMA.
    pub(super) unsafe fn new(k: usize, n: usize, b: Operand) -> Self {
        let mut strips = vec![0f32; k * n.div_ceil(NR) * NR];
        let out = crate::par::SharedMut(strips.as_mut_ptr());
        let blocks: Vec<(usize, usize)> = (0..n)
            .step_by(NC)
            .flat_map(|j0| (0..k).step_by(KC).map(move |p0| (j0, p0)))
            .collect();
        crate::par::for_each(blocks.len(), |i| {
            let (j0, p0) = blocks[i];
            let (kc, nc) = (KC.min(k - p0), NC.min(n - j0));
            let len = kc * nc.div_ceil(NR) * NR;
            // SAFETY: each block's strips lie in a part of `strips` of their own.
            let block = std::slice::from_raw_parts_mut(out.at(block_offset(k, n, j0, p0)), len);
            pack_b(kc, nc, b.skip_rows(p0).skip_cols(j0), block);
        });
        Self { strips, k, n }
    }
}

/// Where the block of B's columns from `j0` and rows from `p0` starts in a [`PackedB`]: the
/// column blocks one after another, each all of k's blocks in order.
fn block_offset(k: usize, n: usize, j0: usize, p0: usize) -> usize {
    j0 * k + NC.min(n - j0).div_ceil(NR) * NR * p0
}

/// [`gemm`] with B packed beforehand: `C = A·B + β·C` for A (m×k) and a row-major C.
///
/// # Safety
/// As [`gemm`], for the k and n that `b` was packed with.
pub(super) unsafe fn gemm_packed(m: usize, a: Operand, b: &PackedB, beta: f32, c: *mut f32, ldc: usize) {
    if m == 0 || b.n == 0 {
        return;
    }
    if b.k == 0 {
        return scale(m, b.n, beta, c, ldc);
    }
    with_scratch(a_len(b.k), |packed_a| {
        blocked(m, b.k, b.n, a, Strips::Packed(b), packed_a, beta, c, ldc)
    });
}

/// Where [`blocked`] finds B's strips: packed beforehand, or packed block by block as it goes
/// into a buffer of its own.
enum Strips<'a> {
    Packed(&'a PackedB),
    PackHere(Operand, &'a mut [f32]),
}

/// [`gemm`]'s loops around the tiles: B's blocks of [`NC`] columns, then k's blocks of [`KC`]
/// (each B block packed), then A's blocks of [`MC`] rows (packed), then the tiles, a strip of
/// B at a time against each panel of A.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn blocked(
    m: usize,
    k: usize,
    n: usize,
    a: Operand,
    mut strips: Strips<'_>,
    packed_a: &mut [f32],
    beta: f32,
    c: *mut f32,
    ldc: usize,
) {
    for j0 in (0..n).step_by(NC) {
        let nc = NC.min(n - j0);
        for p0 in (0..k).step_by(KC) {
            let kc = KC.min(k - p0);
            let beta = if p0 == 0 { beta } else { 1.0 };
            let packed_b = match &mut strips {
                Strips::Packed(b) => b.strips.as_ptr().add(block_offset(k, n, j0, p0)),
                Strips::PackHere(b, buffer) => {
                    pack_b(kc, nc, b.skip_rows(p0).skip_cols(j0), buffer);
                    buffer.as_ptr()
                }
            };
            for i0 in (0..m).step_by(MC) {
                let mc = MC.min(m - i0);
                pack_a(mc, kc, a.skip_rows(i0).skip_cols(p0), packed_a);
                for (s, j) in (0..nc).step_by(NR).enumerate() {
                    let strip = packed_b.add(s * NR * kc);
                    for (q, i) in (0..mc).step_by(MR).enumerate() {
                        let panel = packed_a.as_ptr().add(q * MR * kc);
                        let (rows, cols) = (MR.min(mc - i), NR.min(nc - j));
                        let out = Out {
                            c: c.add((i0 + i) * ldc + j0 + j),
                            ldc,
                            rows,
                            cols,
                            plain_rows: (m / 8 * 8).saturating_sub(i0 + i).min(rows),
                            plain_cols: (n / 8 * 8).saturating_sub(j0 + j).min(cols),
                        };
                        tile(kc, panel, strip, beta, out);
                    }
                }
            }
        }
    }
}

/// A's `mc` × `kc` view as panels of [`MR`] rows, each `kc` steps of [`MR`] elements (rows past
/// `mc` zero).
// Not inlined, so that a profile tells the packing from the products.
#[inline(never)]
#[target_feature(enable = "avx2,fma")]
unsafe fn pack_a(mc: usize, kc: usize, a: Operand, out: &mut [f32]) {
    if a.row_stride == 1 {
        return pack_column_major::<MR>(mc, kc, a, out);
    }
    for (q, i) in (0..mc).step_by(MR).enumerate() {
        let panel = &mut out[q * MR * kc..(q + 1) * MR * kc];
        let rows = MR.min(mc - i);
        if rows < MR {
            panel.fill(0.0);
        }
        // Each step's six elements from six rows at once: the panel is written in order.
        let row = |r: usize| a.ptr.add((i + r.min(rows - 1)) * a.row_stride);
        let rows_at: [*const f32; MR] = std::array::from_fn(row);
        let mut p = 0;
        if rows == MR && a.col_stride == 1 {
            // A row-major (activations): eight steps at a time, through a transpose.
            while p + 8 <= kc {
                let eight: [__m256; 8] = std::array::from_fn(|r| match rows_at.get(r) {
                    Some(at) => _mm256_loadu_ps(at.add(p)),
                    None => _mm256_setzero_ps(),
                });
                for (step, v) in transpose8(eight).into_iter().enumerate() {
                    let at = panel.as_mut_ptr().add((p + step) * MR);
                    _mm_storeu_ps(at, _mm256_castps256_ps128(v));
                    _mm_storel_epi64(at.add(4).cast(), _mm_castps_si128(_mm256_extractf128_ps::<1>(v)));
                }
                p += 8;
            }
        }
        for p in p..kc {
            let step = panel.as_mut_ptr().add(p * MR);
            for (r, at) in rows_at.iter().enumerate().take(rows) {
                *step.add(r) = *at.add(p * a.col_stride);
            }
        }
    }
}

/// B's `kc` × `nc` view as strips of [`NR`] columns, each `kc` rows of [`NR`] elements
/// (columns past `nc` zero).
// Not inlined, so that a profile tells the packing from the products.
#[inline(never)]
#[target_feature(enable = "avx2,fma")]
unsafe fn pack_b(kc: usize, nc: usize, b: Operand, out: &mut [f32]) {
    for (s, j) in (0..nc).step_by(NR).enumerate() {
        let strip = &mut out[s * NR * kc..(s + 1) * NR * kc];
        let cols = NR.min(nc - j);
        if cols < NR {
            strip.fill(0.0);
        }
        let b = b.skip_cols(j);
        if b.col_stride == 1 {
            for p in 0..kc {
                let row = b.ptr.add(p * b.row_stride);
                copy_up_to::<NR>(row, strip.as_mut_ptr().add(p * NR), cols);
            }
            continue;
        }
        let mut p = 0;
        if cols == NR && b.row_stride == 1 {
            // B transposed (a weight in x·Wᵀ): its columns are rows, 8 × 8 blocks transposed.
            while p + 8 <= kc {
                for half in 0..2 {
                    let from = b.ptr.add(half * 8 * b.col_stride + p);
                    let to = strip.as_mut_ptr().add(p * NR + half * 8);
                    transpose8x8(from, b.col_stride, to, NR);
                }
                p += 8;
            }
        }
        for col in 0..cols {
            let column = b.ptr.add(col * b.col_stride);
            for p in p..kc {
                *strip.get_unchecked_mut(p * NR + col) = *column.add(p * b.row_stride);
            }
        }
    }
}

/// Where a tile's sums go: `rows` ≤ [`MR`] × `cols` ≤ [`NR`] elements of C at `c` (row stride
/// `ldc`), of which the first `plain_rows` × `plain_cols` lie in whole 8×8 tiles of
/// matrixmultiply's.
///
/// matrixmultiply adds a tile's sums to β·C in two ways: a whole tile as `sum + β·c` in one
/// fused multiply-add, a tile cut by C's last rows or columns through a buffer written as
/// `sum + 0` first. The two differ only where a sum is −0 (products that all underflow) and
/// β·c is −0 as well: +0 from the buffer, −0 otherwise. So this tile adds +0 to its sums
/// outside `plain_rows` × `plain_cols`, where matrixmultiply's tiles were cut.
struct Out {
    c: *mut f32,
    ldc: usize,
    rows: usize,
    cols: usize,
    plain_rows: usize,
    plain_cols: usize,
}

/// One tile of C from a panel of A and a strip of B over `kc` steps: each element's chain of
/// multiply-adds from zero, then `c = sum + β·c` ([`Out`] says where, and how at the edges).
// Not inlined, so that a profile tells the packing from the products.
#[inline(never)]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile(kc: usize, mut a: *const f32, mut b: *const f32, beta: f32, out: Out) {
    let Out {
        c, ldc, rows, cols, ..
    } = out;
    // C's lines asked for now, to be in cache when the sums are done: a read or write of C
    // that misses stalls the tile otherwise, and C is read back once per block of k. (Prefetches
    // never fault; the addresses wrap rather than claim to stay inside C.)
    for r in 0..rows {
        let line = c.wrapping_add(r * ldc).cast::<i8>();
        _mm_prefetch::<_MM_HINT_T0>(line);
        _mm_prefetch::<_MM_HINT_T0>(line.wrapping_add(15 * 4));
    }
    let mut sums = [[_mm256_setzero_ps(); 2]; MR];
    // Four steps a turn: the loop's own instructions cost 1.3× in the kernel's time otherwise
    // (a scratch benchmark of this loop alone, operands in L1, one Zen 3 core: 77 against 96–100
    // GFLOP/s).
    for _ in 0..kc / 4 {
        for step in 0..4 {
            multiply_add(&mut sums, a.add(step * MR), b.add(step * NR));
        }
        a = a.add(4 * MR);
        b = b.add(4 * NR);
    }
    for _ in 0..kc % 4 {
        multiply_add(&mut sums, a, b);
        a = a.add(MR);
        b = b.add(NR);
    }
    let betas = _mm256_set1_ps(beta);
    if (rows, cols, out.plain_rows, out.plain_cols) == (MR, NR, MR, NR) {
        // All of C's tile read before any of it is written, so that the reads overlap.
        let mut old = [[_mm256_setzero_ps(); 2]; MR];
        if beta != 0.0 {
            for (r, row) in old.iter_mut().enumerate() {
                for (h, x) in row.iter_mut().enumerate() {
                    *x = _mm256_mul_ps(_mm256_loadu_ps(c.add(r * ldc + h * 8)), betas);
                }
            }
        }
        for (r, row) in sums.iter().enumerate() {
            for (h, &sum) in row.iter().enumerate() {
                _mm256_storeu_ps(c.add(r * ldc + h * 8), _mm256_add_ps(sum, old[r][h]));
            }
        }
        return;
    }
    let mut whole = [[0f32; NR]; MR];
    for (r, row) in sums.iter().enumerate() {
        _mm256_storeu_ps(whole[r].as_mut_ptr(), row[0]);
        _mm256_storeu_ps(whole[r].as_mut_ptr().add(8), row[1]);
    }
    for (r, sums) in whole.iter().enumerate().take(rows) {
        for (j, &sum) in sums.iter().enumerate().take(cols) {
            let at = c.add(r * ldc + j);
            let plain = r < out.plain_rows && j < out.plain_cols;
            let sum = if plain { sum } else { sum + 0.0 };
            *at = sum + if beta == 0.0 { 0.0 } else { *at * beta };
        }
    }
}

/// One step of k: the tile's sums plus A's [`MR`] elements at `a` times B's [`NR`] at `b`.
#[inline(always)]
unsafe fn multiply_add(sums: &mut [[__m256; 2]; MR], a: *const f32, b: *const f32) {
    let (b0, b1) = (_mm256_loadu_ps(b), _mm256_loadu_ps(b.add(8)));
    for (r, row) in sums.iter_mut().enumerate() {
        let x = _mm256_broadcast_ss(&*a.add(r));
        row[0] = _mm256_fmadd_ps(x, b0, row[0]);
        row[1] = _mm256_fmadd_ps(x, b1, row[1]);
    }
}
