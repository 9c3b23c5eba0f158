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
        let r: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(src.add(i * src_stride)));
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
        let out = [
            _mm256_permute2f128_ps::<0x20>(u0, u4),
            _mm256_permute2f128_ps::<0x20>(u1, u5),
            _mm256_permute2f128_ps::<0x20>(u2, u6),
            _mm256_permute2f128_ps::<0x20>(u3, u7),
            _mm256_permute2f128_ps::<0x31>(u0, u4),
            _mm256_permute2f128_ps::<0x31>(u1, u5),
            _mm256_permute2f128_ps::<0x31>(u2, u6),
            _mm256_permute2f128_ps::<0x31>(u3, u7),
        ];
        for (i, v) in out.into_iter().enumerate() {
            _mm256_storeu_ps(dst.add(i * dst_stride), v);
        }
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
                };
                match rows {
                    8 => tile::<8>(t),
                    7 => tile::<7>(t),
                    6 => tile::<6>(t),
                    5 => tile::<5>(t),
                    4 => tile::<4>(t),
                    3 => tile::<3>(t),
                    2 => tile::<2>(t),
                    _ => tile::<1>(t),
                }
            }
        }
    }

    /// The first `lanes` (≤ 16) lanes.
    #[inline(always)]
    fn lane_mask(lanes: usize) -> __mmask16 {
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
    }

    /// C[0..R, 0..32] = A[0..R, :]·B[:, 0..32] + beta·C, masked to the columns that exist.
    /// Masked-off lanes are neither loaded nor stored (AVX-512 masks suppress the access), so a
    /// strip at the right edge never touches memory past it.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn tile<const R: usize>(t: Tile) {
        let mut lo = [_mm512_setzero_ps(); R];
        let mut hi = [_mm512_setzero_ps(); R];
        // One base pointer per row and a shared offset: the broadcasts' addresses then do not
        // depend on each other (a pointer stepped row by row made a serial chain of adds that
        // was longer than the FMAs it fed).
        let rows: [*const f32; R] = std::array::from_fn(|i| t.a.wrapping_add(i * t.rsa));
        let mut b = t.b;
        let mut offset = 0;
        for _ in 0..t.k {
            let b_lo = _mm512_maskz_loadu_ps(t.lo, b);
            let b_hi = _mm512_maskz_loadu_ps(t.hi, b.wrapping_add(16));
            for i in 0..R {
                let av = _mm512_set1_ps(*rows[i].add(offset));
                lo[i] = _mm512_fmadd_ps(av, b_lo, lo[i]);
                hi[i] = _mm512_fmadd_ps(av, b_hi, hi[i]);
            }
            offset += t.csa;
            b = b.wrapping_add(t.ldb);
        }
        for i in 0..R {
            let c_lo = t.c.add(i * t.ldc);
            let c_hi = c_lo.wrapping_add(16);
            let (mut r_lo, mut r_hi) = (lo[i], hi[i]);
            if t.beta != 0.0 {
                let beta = _mm512_set1_ps(t.beta);
                r_lo = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(t.lo, c_lo), r_lo);
                r_hi = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(t.hi, c_hi), r_hi);
            }
            _mm512_mask_storeu_ps(c_lo, t.lo, r_lo);
            _mm512_mask_storeu_ps(c_hi, t.hi, r_hi);
        }
    }
}
