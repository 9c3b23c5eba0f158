//! Single-precision GEMM for the small matrices of small transformers.
//!
//! A packed GEMM (matrixmultiply, BLAS) copies both operands into kernel-shaped panels before
//! multiplying. At d_model = 128 that copy is not small: in nanoGPT's CPU shape it was 13% of a
//! training step, most of it gathering activations whose reduction dimension is the contiguous
//! one. When B fits in L2 packing buys little, so [`gemm`] multiplies in place instead: an
//! AVX-512 kernel broadcasts A's elements straight from its rows and loads B's rows as vectors,
//! keeping an 8×32 tile of C in sixteen registers. B must be row-contiguous; a transposed B (a
//! weight in x·Wᵀ, K in q·Kᵀ) is transposed into a scratch buffer first, which costs k·n copies
//! against m·k·n multiply-adds. A column-major A (gᵀ in dW = gᵀ·x, a reduction over all tokens),
//! a large B, or a CPU without AVX-512 go to matrixmultiply: for the first, its packing is a
//! plain copy and it measured faster than the in-place kernel (`timing` below).
//!
//! The kernel sums over k in order, one fused multiply-add per term, so results are the same
//! on every run.

/// An operand: `data` with element strides for rows and columns.
#[derive(Clone, Copy)]
pub(crate) struct Operand {
    pub ptr: *const f32,
    pub row_stride: usize,
    pub col_stride: usize,
}

#[cfg(test)]
impl Operand {
    /// Row-major data with `cols` columns.
    fn rows(data: &[f32], cols: usize) -> Self {
        Self {
            ptr: data.as_ptr(),
            row_stride: cols,
            col_stride: 1,
        }
    }
    /// The transpose of row-major data with `cols` columns.
    fn transposed(data: &[f32], cols: usize) -> Self {
        Self {
            ptr: data.as_ptr(),
            row_stride: 1,
            col_stride: cols,
        }
    }
}

/// Floats of B the in-place kernel may stream from L2 per row tile (1 MiB: half of this
/// machine's 2 MiB L2, leaving room for A's rows and C).
const L2_FLOATS: usize = 1 << 18;

/// `C = A·B + beta·C` for A (m×k), B (k×n) and C row-major (m×n) with row stride `ldc`.
///
/// # Safety
/// Every element of the m×k view of A and the k×n view of B is readable, `c` is valid for
/// reads and writes of the m×n view, and C does not overlap A or B.
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
    gemm_with(true, m, k, n, a, b, beta, c, ldc)
}

/// [`gemm`], with the in-place kernel allowed or not (the tests run both paths).
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_with(
    in_place: bool,
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
    #[cfg(target_arch = "x86_64")]
    if in_place
        && a.col_stride == 1
        && k * n <= L2_FLOATS
        && k > 0
        && std::is_x86_feature_detected!("avx512f")
    {
        if b.col_stride == 1 {
            avx512::gemm(m, k, n, a, b.ptr, b.row_stride, beta, c, ldc);
            return;
        }
        // B row-contiguous after a k·n transpose: worth it when m is at least a tile.
        if m >= 8 {
            let bt = transpose(k, n, b);
            avx512::gemm(m, k, n, a, bt.as_ptr(), n, beta, c, ldc);
            return;
        }
    }
    matrixmultiply::sgemm(
        m,
        k,
        n,
        1.0,
        a.ptr,
        a.row_stride as isize,
        a.col_stride as isize,
        b.ptr,
        b.row_stride as isize,
        b.col_stride as isize,
        beta,
        c,
        ldc as isize,
        1,
    )
}

/// The k×n view `b` as a row-major vector.
#[cfg(target_arch = "x86_64")]
unsafe fn transpose(k: usize, n: usize, b: Operand) -> Vec<f32> {
    let mut out: Vec<f32> = Vec::with_capacity(k * n);
    let dst = out.as_mut_ptr();
    if b.row_stride == 1 {
        // B is the transpose of a row-major n×k matrix S (row stride `col_stride`): transpose
        // S back in 8×8 register blocks, then the ragged edges element by element.
        let (k8, n8) = (k - k % 8, n - n % 8);
        for j0 in (0..n8).step_by(8) {
            for p0 in (0..k8).step_by(8) {
                avx::transpose8x8(
                    b.ptr.add(j0 * b.col_stride + p0),
                    b.col_stride,
                    dst.add(p0 * n + j0),
                    n,
                );
            }
        }
        for p in 0..k {
            let js = if p < k8 { n8..n } else { 0..n };
            for j in js {
                *dst.add(p * n + j) = *b.ptr.add(p + j * b.col_stride);
            }
        }
    } else {
        for p in 0..k {
            for j in 0..n {
                *dst.add(p * n + j) = *b.ptr.add(p * b.row_stride + j * b.col_stride);
            }
        }
    }
    // Every (p, j) with p < k, j < n was written above.
    out.set_len(k * n);
    out
}

#[cfg(target_arch = "x86_64")]
mod avx {
    use std::arch::x86_64::*;

    /// dst[c·dst_stride + r] = src[r·src_stride + c] for an 8×8 block (AVX shuffles).
    #[inline]
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn transpose8x8(src: *const f32, src_stride: usize, dst: *mut f32, dst_stride: usize) {
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
mod avx512 {
    use super::Operand;
    use std::arch::x86_64::*;

    /// Rows and columns of the C tile held in registers (8 rows × two 16-lane vectors).
    const MR: usize = 8;
    const NR: usize = 32;

    /// Row tiles outer, column strips inner: A's MR rows stay in L1 while B streams from L2.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn gemm(
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values in [−1, 1).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// A (m×k) and B (k×n) over `a` and `b`, each stored transposed (column-major) or not.
    pub(super) fn operands(
        a: &[f32],
        b: &[f32],
        (m, k, n): (usize, usize, usize),
        a_t: bool,
        b_t: bool,
    ) -> (Operand, Operand) {
        let ao = if a_t {
            Operand::transposed(a, m)
        } else {
            Operand::rows(a, k)
        };
        let bo = if b_t {
            Operand::transposed(b, k)
        } else {
            Operand::rows(b, n)
        };
        (ao, bo)
    }

    /// Every path (in place, transposed B, strided A, β ∈ {0, 1, ½}, ragged edges; the
    /// matrixmultiply fallback too) against a plain f64 triple loop.
    #[test]
    fn gemm_matches_the_definition_for_every_layout_and_edge() {
        let sizes = [1usize, 3, 8, 9, 16, 17, 31, 32, 33, 70];
        let mut checked = 0;
        for in_place in [true, false] {
            for &m in &sizes {
                for &k in &[1usize, 5, 32, 129] {
                    for &n in &sizes {
                        for (case, (a_t, b_t, beta)) in [
                            (false, false, 0.0f32),
                            (false, true, 1.0),
                            (true, false, 0.5),
                            (true, true, 0.0),
                        ]
                        .into_iter()
                        .enumerate()
                        {
                            let a = values(m * k, (m * 31 + k * 7 + n) as u64);
                            let b = values(k * n, (n * 17 + k + case) as u64);
                            let c0 = values(m * n, 99);
                            let (ao, bo) = operands(&a, &b, (m, k, n), a_t, b_t);
                            let mut c = c0.clone();
                            unsafe { gemm_with(in_place, m, k, n, ao, bo, beta, c.as_mut_ptr(), n) };
                            for i in 0..m {
                                for j in 0..n {
                                    let mut want = beta as f64 * c0[i * n + j] as f64;
                                    for p in 0..k {
                                        let av = a[if a_t { p * m + i } else { i * k + p }] as f64;
                                        let bv = b[if b_t { j * k + p } else { p * n + j }] as f64;
                                        want += av * bv;
                                    }
                                    let got = c[i * n + j] as f64;
                                    assert!(
                                        (got - want).abs() <= 1e-5 * (1.0 + want.abs()) * (k as f64).sqrt(),
                                        "m={m} k={k} n={n} case={case}: C[{i},{j}] = {got}, want {want}"
                                    );
                                }
                            }
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(checked, 2 * 10 * 4 * 10 * 4);
    }

    #[test]
    fn a_b_too_large_for_l2_takes_the_packed_path_and_agrees() {
        let (m, k, n) = (9, 600, 500);
        assert!(k * n > L2_FLOATS);
        let a = values(m * k, 3);
        let b = values(k * n, 4);
        let ao = Operand::rows(&a, k);
        let bo = Operand::rows(&b, n);
        let mut c = vec![0f32; m * n];
        unsafe { gemm(m, k, n, ao, bo, 0.0, c.as_mut_ptr(), n) };
        for (i, j) in [(0, 0), (4, 250), (8, 499)] {
            let want: f64 = (0..k).map(|p| a[i * k + p] as f64 * b[p * n + j] as f64).sum();
            assert!((c[i * n + j] as f64 - want).abs() < 1e-4, "C[{i},{j}]");
        }
    }

    #[test]
    fn a_b_with_no_unit_stride_is_copied_element_by_element_and_agrees() {
        // B (k×n) = every other element of a row-major n×2k buffer, read transposed: neither
        // of its strides is 1.
        let (m, k, n) = (9, 11, 13);
        let a = values(m * k, 7);
        let raw = values(n * 2 * k, 8);
        let bo = Operand {
            ptr: raw.as_ptr(),
            row_stride: 2,
            col_stride: 2 * k,
        };
        let ao = Operand::rows(&a, k);
        let mut c = vec![0f32; m * n];
        unsafe { gemm(m, k, n, ao, bo, 0.0, c.as_mut_ptr(), n) };
        for i in 0..m {
            for j in 0..n {
                let want: f64 = (0..k)
                    .map(|p| a[i * k + p] as f64 * raw[2 * p + 2 * k * j] as f64)
                    .sum();
                assert!((c[i * n + j] as f64 - want).abs() < 1e-5, "C[{i},{j}]");
            }
        }
    }

    #[test]
    fn gemm_writes_only_inside_its_view_of_c() {
        // C is a 5×20 window (row stride 24) inside a larger buffer; the rest must stay put.
        let (m, k, n, ldc) = (5, 7, 20, 24);
        let a = values(m * k, 1);
        let b = values(k * n, 2);
        let mut c = vec![7.0f32; m * ldc + 16];
        let ao = Operand::rows(&a, k);
        let bo = Operand::rows(&b, n);
        unsafe { gemm(m, k, n, ao, bo, 0.0, c.as_mut_ptr(), ldc) };
        for (idx, &v) in c.iter().enumerate() {
            let (i, j) = (idx / ldc, idx % ldc);
            if i >= m || j >= n {
                assert_eq!(v, 7.0, "wrote outside the view at {idx}");
            }
        }
    }

    #[test]
    fn gemm_is_bitwise_repeatable() {
        let (m, k, n) = (37, 129, 45);
        let a = values(m * k, 5);
        let b = values(k * n, 6);
        let ao = Operand::rows(&a, k);
        let bo = Operand::transposed(&b, k);
        let run = || {
            let mut c = vec![0f32; m * n];
            unsafe { gemm(m, k, n, ao, bo, 0.0, c.as_mut_ptr(), n) };
            c
        };
        assert_eq!(run(), run());
    }
}

#[cfg(test)]
mod timing {
    use super::*;

    /// Not a test: `cargo test --release -p ember-model --lib gemm::timing -- --ignored --nocapture`
    /// prints GFLOP/s of both paths at nanoGPT-CPU shapes.
    #[test]
    #[ignore]
    fn print_gflops_at_model_shapes() {
        // (m, k, n, A transposed, B transposed, what)
        let shapes = [
            (768, 128, 384, false, true, "fwd x·Wᵀ qkv"),
            (768, 128, 512, false, true, "fwd x·Wᵀ fc"),
            (768, 512, 128, false, true, "fwd x·Wᵀ fc2"),
            (768, 384, 128, false, false, "dX g·W qkv"),
            (768, 512, 128, false, false, "dX g·W fc"),
            (384, 768, 128, true, false, "dW gᵀ·x qkv"),
            (512, 768, 128, true, false, "dW gᵀ·x fc"),
            (128, 768, 512, true, false, "dW gᵀ·x fc2"),
            (64, 32, 64, false, true, "attn q·kᵀ"),
            (64, 64, 32, false, false, "attn p·v"),
            (64, 64, 32, true, false, "attn pᵀ·dO"),
            (64, 32, 64, false, true, "attn dO·vᵀ"),
        ];
        for (m, k, n, a_t, b_t, what) in shapes {
            let a = vec![0.5f32; m * k];
            let b = vec![0.25f32; k * n];
            let mut c = vec![0f32; m * n];
            let (ao, bo) = super::tests::operands(&a, &b, (m, k, n), a_t, b_t);
            let mut line = format!("{what:>14} {m:>4}×{k:>4}×{n:>4}");
            let reps = (2e8 / (m * k * n) as f64).max(3.0) as usize;
            let mut ct = vec![0f32; m * n];
            let variants: &[&str] = if a_t && !b_t {
                &["in place", "packed", "swapped"]
            } else {
                &["in place", "packed"]
            };
            let mut best = vec![f64::MAX; variants.len()];
            // Round-robin, best of 9: other tenants share this machine.
            for _ in 0..9 {
                for (v, name) in variants.iter().enumerate() {
                    let t = std::time::Instant::now();
                    for _ in 0..reps {
                        match *name {
                            "swapped" => {
                                // Cᵀ = Bᵀ·Aᵀ with the in-place kernel (no final transpose).
                                let bt = Operand {
                                    ptr: b.as_ptr(),
                                    row_stride: 1,
                                    col_stride: n,
                                };
                                unsafe { avx512::gemm(n, k, m, bt, a.as_ptr(), m, 0.0, ct.as_mut_ptr(), m) };
                            }
                            _ => unsafe {
                                gemm_with(*name == "in place", m, k, n, ao, bo, 0.0, c.as_mut_ptr(), n)
                            },
                        }
                    }
                    best[v] = best[v].min(t.elapsed().as_secs_f64() / reps as f64);
                }
            }
            for (name, t) in variants.iter().zip(&best) {
                line += &format!("  {name}: {:6.1}", 2.0 * (m * k * n) as f64 / t / 1e9);
            }
            println!("{line}");
        }
    }
}
