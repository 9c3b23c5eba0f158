//! The x86-64 halves of [`super::gemm`]: an AVX 8×8 transpose and the AVX-512 in-place kernel.

#[cfg(target_arch = "x86_64")]
pub(super) mod avx {
    use std::arch::x86_64::*;

    /// dst[c·dst_stride + r] = src[r·src_stride + c] for an 8×8 block (AVX shuffles).
    #[inline]
    #[target_feature(enable = "avx")]
    pub(in crate::gemm) unsafe fn transpose8x8(
        src: *const f32,
        src_stride: usize,
        dst: *mut f32,
        dst_stride: usize,
    ) {
        let rows: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(src.add(i * src_stride)));
        for (i, v) in transpose8(rows).into_iter().enumerate() {
            _mm256_storeu_ps(dst.add(i * dst_stride), v);
        }
    }

    /// The columns of eight 8-lane rows, as rows.
    #[inline]
    #[target_feature(enable = "avx")]
    pub(in crate::gemm) unsafe fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        [
            _mm256_permute2f128_ps::<0x20>(u0, u4),
            _mm256_permute2f128_ps::<0x20>(u1, u5),
            _mm256_permute2f128_ps::<0x20>(u2, u6),
            _mm256_permute2f128_ps::<0x20>(u3, u7),
            _mm256_permute2f128_ps::<0x31>(u0, u4),
            _mm256_permute2f128_ps::<0x31>(u1, u5),
            _mm256_permute2f128_ps::<0x31>(u2, u6),
            _mm256_permute2f128_ps::<0x31>(u3, u7),
        ]
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    use super::super::Operand;
    use std::arch::x86_64::*;

    /// Rows and columns of the C tile held in registers (8 rows × two 16-lane vectors).
    const MR: usize = 8;
    const NR: usize = 32;

    /// Row tiles outer, column strips inner: A's MR rows stay in L1 while B streams from L2.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(in crate::gemm) unsafe fn gemm(
        m: usize,
        k: usize,
        n: usize,
        a: Operand,
        b: *const f32,
        ldb: usize,
        beta: f32,
        c: *mut f32,
        ldc: usize,
    ) {
        for i0 in (0..m).step_by(MR) {
            let rows = MR.min(m - i0);
            let a_tile = a.ptr.wrapping_add(i0 * a.row_stride);
            let (rsa, csa) = (a.row_stride, a.col_stride);
            for j0 in (0..n).step_by(NR) {
                let cols = NR.min(n - j0);
                let lo = lane_mask(cols);
                let hi = lane_mask(cols.saturating_sub(16));
                let (b_strip, c_tile) = (b.wrapping_add(j0), c.add(i0 * ldc + j0));
                let t = Tile {
                    k,
                    a: a_tile,
                    rsa,
                    csa,
                    b: b_strip,
                    ldb,
                    c: c_tile,
                    ldc,
                    lo,
                    hi,
                    beta,
                    resume: false,
                };
                run_tile(rows, cols == NR, cols > 16, t);
            }
        }
    }

    /// [`gemm`] with B packed by [`super::super::pack_strips`]: strip `s` (columns `32s..32s+32`,
    /// zero beyond n) holds its k rows of 32 contiguously. Strips outer, row tiles inner: a strip
    /// (k·128 bytes) stays in L1 while A's rows pass by it, and every load of B is sequential.
    ///
    /// A long k (β = 0) is taken in pieces of [`K_PIECE`], each over every strip: the piece of
    /// A's rows then stays in L2 from one strip to the next instead of streaming from beyond it
    /// once per strip (the output layer's dh = dlogits·W reads 10k-wide rows of dlogits, four
    /// strips' worth). A tile after the first piece starts from the sums C holds, so each
    /// element is still one chain of multiply-adds in k's order: the same bits as one piece.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(in crate::gemm) unsafe fn gemm_strips(
        m: usize,
        k: usize,
        n: usize,
        a: Operand,
        strips: *const f32,
        beta: f32,
        c: *mut f32,
        ldc: usize,
    ) {
        let (rsa, csa) = (a.row_stride, a.col_stride);
        let piece = if beta == 0.0 && k > 2 * K_PIECE {
            K_PIECE
        } else {
            k.max(1)
        };
        for p0 in (0..k.max(1)).step_by(piece) {
            let kp = piece.min(k - p0);
            for j0 in (0..n).step_by(NR) {
                let cols = NR.min(n - j0);
                let lo = lane_mask(cols);
                let hi = lane_mask(cols.saturating_sub(16));
                let b_strip = strips.add((j0 / NR) * k * NR + p0 * NR);
                for i0 in (0..m).step_by(MR) {
                    let t = Tile {
                        k: kp,
                        a: a.ptr.wrapping_add(i0 * rsa + p0 * csa),
                        rsa,
                        csa,
                        b: b_strip,
                        ldb: NR,
                        c: c.add(i0 * ldc + j0),
                        ldc,
                        lo,
                        hi,
                        beta,
                        resume: p0 > 0,
                    };
                    run_tile(MR.min(m - i0), true, cols > 16, t);
                }
            }
        }
    }

    /// The piece of k [`gemm_strips`] takes at a time when k is long: 512 of a tile's A rows
    /// (a task's ~200 rows: 400 KB) and of a strip (64 KB) stay in L2 together.
    const K_PIECE: usize = 512;

    /// [`gemm`] with k cut into pieces of `kc`, one after another (β for the first, then adding
    /// to C): for a column-major A (gᵀ in dW = gᵀ·x, k the tokens) a piece's B rows and A
    /// columns stay in L1 while every tile of C passes. Each element of C is still one chain of
    /// multiply-adds in k's order per piece.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(in crate::gemm) unsafe fn gemm_k_pieces(
        m: usize,
        k: usize,
        n: usize,
        a: Operand,
        b: *const f32,
        ldb: usize,
        beta: f32,
        c: *mut f32,
        ldc: usize,
        kc: usize,
    ) {
        for p0 in (0..k).step_by(kc) {
            let beta = if p0 == 0 { beta } else { 1.0 };
            let b_piece = b.wrapping_add(p0 * ldb);
            gemm(m, kc.min(k - p0), n, a.skip_cols(p0), b_piece, ldb, beta, c, ldc);
        }
    }

    /// [`tile`] for a tile of `rows` (1..=8) rows; `full_b`: B's rows have all 32 columns
    /// (or zeros past n); `wide`: more than 16 of them exist.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn run_tile(rows: usize, full_b: bool, wide: bool, t: Tile) {
        match (full_b, wide) {
            (true, true) => run_rows::<true, true>(rows, t),
            (true, false) => run_rows::<true, false>(rows, t),
            (false, true) => run_rows::<false, true>(rows, t),
            (false, false) => run_rows::<false, false>(rows, t),
        }
    }

    #[inline(always)]
    unsafe fn run_rows<const FULL_B: bool, const WIDE: bool>(rows: usize, t: Tile) {
        match rows {
            8 => tile::<8, FULL_B, WIDE>(t),
            7 => tile::<7, FULL_B, WIDE>(t),
            6 => tile::<6, FULL_B, WIDE>(t),
            5 => tile::<5, FULL_B, WIDE>(t),
            4 => tile::<4, FULL_B, WIDE>(t),
            3 => tile::<3, FULL_B, WIDE>(t),
            2 => tile::<2, FULL_B, WIDE>(t),
            _ => tile::<1, FULL_B, WIDE>(t),
        }
    }

    /// Columns per strip of [`gemm_strips`]' packed B.
    pub(in crate::gemm) const STRIP: usize = NR;

    /// The first `lanes` (16 or more: all) lanes.
    #[inline(always)]
    pub(in crate::gemm) fn lane_mask(lanes: usize) -> __mmask16 {
        if lanes >= 16 {
            0xffff
        } else {
            ((1u32 << lanes) - 1) as __mmask16
        }
    }

    #[derive(Clone, Copy)]
    struct Tile {
        k: usize,
        a: *const f32,
        rsa: usize,
        csa: usize,
        b: *const f32,
        ldb: usize,
        c: *mut f32,
        ldc: usize,
        /// Which of the tile's 32 columns exist (low and high 16).
        lo: __mmask16,
        hi: __mmask16,
        beta: f32,
        /// The sums start from C's values (a product continued over more of k; β is not
        /// applied), not from zero.
        resume: bool,
    }

    /// C[0..R, 0..32] = A[0..R, :]·B[:, 0..32] + beta·C, masked to the columns that exist;
    /// without `WIDE`, only the first 16 columns exist and the high half is not computed at all
    /// (attention's q·kᵀ over a dozen keys spent half its multiply-adds on masked-off lanes).
    /// Masked-off lanes are neither loaded nor stored (AVX-512 masks suppress the access), so a
    /// strip at the right edge never touches memory past it. `FULL_B`: B's rows have all 32
    /// columns (packed strips are zero-padded), so its loads need no mask.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn tile<const R: usize, const FULL_B: bool, const WIDE: bool>(t: Tile) {
        let (mut lo, mut hi) = start_sums::<R, WIDE>(t.c, t.ldc, (t.lo, t.hi), t.resume);
        // One base pointer per row and a shared offset: the broadcasts' addresses then do not
        // depend on each other (a pointer stepped row by row made a serial chain of adds that
        // was longer than the FMAs it fed).
        let rows: [*const f32; R] = std::array::from_fn(|i| t.a.wrapping_add(i * t.rsa));
        let mut b = t.b;
        let mut offset = 0;
        for _ in 0..t.k {
            let b_lo = if FULL_B {
                _mm512_loadu_ps(b)
            } else {
                _mm512_maskz_loadu_ps(t.lo, b)
            };
            let b_hi = match (WIDE, FULL_B) {
                (false, _) => _mm512_setzero_ps(),
                (true, true) => _mm512_loadu_ps(b.wrapping_add(16)),
                (true, false) => _mm512_maskz_loadu_ps(t.hi, b.wrapping_add(16)),
            };
            for i in 0..R {
                let av = _mm512_set1_ps(*rows[i].add(offset));
                lo[i] = _mm512_fmadd_ps(av, b_lo, lo[i]);
                if WIDE {
                    hi[i] = _mm512_fmadd_ps(av, b_hi, hi[i]);
                }
            }
            offset += t.csa;
            b = b.wrapping_add(t.ldb);
        }
        store_sums::<R, WIDE>((lo, hi), t.c, t.ldc, (t.lo, t.hi), t.beta, t.resume);
    }

    /// A tile's sums before its first term: C's values where the product continues over more
    /// of k (`resume`), else zeros; R rows of `ldc` floats at `c`, the columns of `masks`
    /// (low and high 16; the high half only if `WIDE`). Shared with the bf16 kernel.
    #[inline(always)]
    pub(in crate::gemm) unsafe fn start_sums<const R: usize, const WIDE: bool>(
        c: *const f32,
        ldc: usize,
        (lo_mask, hi_mask): (__mmask16, __mmask16),
        resume: bool,
    ) -> ([__m512; R], [__m512; R]) {
        let mut lo = [_mm512_setzero_ps(); R];
        let mut hi = [_mm512_setzero_ps(); R];
        if resume {
            for i in 0..R {
                let c_lo = c.add(i * ldc);
                lo[i] = _mm512_maskz_loadu_ps(lo_mask, c_lo);
                if WIDE {
                    hi[i] = _mm512_maskz_loadu_ps(hi_mask, c_lo.wrapping_add(16));
                }
            }
        }
        (lo, hi)
    }

    /// Stores a tile's sums into C's columns of `masks`, plus beta·C unless the product
    /// resumed (β was applied by its first piece). Masked-off lanes are neither loaded nor
    /// stored. Shared with the bf16 kernel.
    #[inline(always)]
    pub(in crate::gemm) unsafe fn store_sums<const R: usize, const WIDE: bool>(
        (lo, hi): ([__m512; R], [__m512; R]),
        c: *mut f32,
        ldc: usize,
        (lo_mask, hi_mask): (__mmask16, __mmask16),
        beta: f32,
        resume: bool,
    ) {
        for i in 0..R {
            let c_lo = c.add(i * ldc);
            let c_hi = c_lo.wrapping_add(16);
            let (mut r_lo, mut r_hi) = (lo[i], hi[i]);
            if beta != 0.0 && !resume {
                let beta = _mm512_set1_ps(beta);
                r_lo = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(lo_mask, c_lo), r_lo);
                if WIDE {
                    r_hi = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(hi_mask, c_hi), r_hi);
                }
            }
            _mm512_mask_storeu_ps(c_lo, lo_mask, r_lo);
            if WIDE {
                _mm512_mask_storeu_ps(c_hi, hi_mask, r_hi);
            }
        }
    }
}
