//! The GEMM against its definition, on every path and layout.

use super::*;

/// Operands over the tests' slices, which must outlive them.
impl Operand {
    /// `data` with the element strides of its rows and columns.
    pub(super) fn strided(data: &[f32], row_stride: usize, col_stride: usize) -> Self {
        Self {
            ptr: data.as_ptr(),
            row_stride,
            col_stride,
        }
    }
    /// Row-major data with `cols` columns.
    pub(super) fn rows(data: &[f32], cols: usize) -> Self {
        Self::strided(data, cols, 1)
    }
    /// The transpose of row-major data with `cols` columns.
    pub(super) fn transposed(data: &[f32], cols: usize) -> Self {
        Self::strided(data, 1, cols)
    }
}

/// `x` (rows × cols, row-major) transposed: cols × rows, row-major; through the GEMM's 8×8 AVX
/// transpose where the CPU has AVX.
pub(super) fn transposed(rows: usize, cols: usize, x: &[f32]) -> Vec<f32> {
    // xᵀ: the cols × rows view of x, its strides swapped.
    let view = Mat::rows(x, cols).t();
    assert!(view.fits(cols, rows), "transpose: out of bounds");
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx") {
        // SAFETY: the view is in bounds (asserted) and the CPU has AVX.
        return unsafe { transpose(cols, rows, view.operand()) };
    }
    (0..cols * rows)
        .map(|i| x[(i % rows) * cols + i / rows])
        .collect()
}

/// Deterministic values in [−1, 1).
pub(super) fn values(n: usize, seed: u64) -> Vec<f32> {
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

/// C = A·B + β·C by matrixmultiply: the reference for the kernels that give its bits.
#[cfg(target_arch = "x86_64")]
pub(super) fn by_matrixmultiply(
    (m, k, n): (usize, usize, usize),
    a: Operand,
    b: Operand,
    beta: f32,
    c: &mut [f32],
    ldc: usize,
) {
    // SAFETY: the callers' operands hold these shapes and C is exclusively borrowed.
    unsafe { super::by_matrixmultiply(m, k, n, a, b, beta, c.as_mut_ptr(), ldc) }
}

/// Whether two results are the same bits, element by element.
#[cfg(target_arch = "x86_64")]
pub(super) fn same_bits(x: &[f32], y: &[f32]) -> bool {
    x.iter().zip(y).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// A product with matrixmultiply's bits, `(shape, A, B, β, C, ldc)`, for A and B with neither
/// stride one (every other element of a wider buffer): A read at a stride, B gathered element
/// by element; a tile, a strip and k's blocks ragged, at β zero, one and neither, and large
/// enough to be cut into tasks.
#[cfg(target_arch = "x86_64")]
pub(super) fn at_strides_gives_matrixmultiplys_bits(
    product: impl Fn((usize, usize, usize), Operand, Operand, f32, &mut [f32], usize),
) {
    for (m, k, n) in [(19, 300, 21), (140, 520, 75)] {
        let (a, b) = (values(2 * m * k, 4), values(2 * k * n, 5));
        let ao = Operand::strided(&a, 2 * k, 2);
        let bo = Operand::strided(&b, 2, 2 * k);
        for beta in [0.0, 1.0, 0.5] {
            let c0 = values(m * n, 6);
            let (mut want, mut got) = (c0.clone(), c0);
            by_matrixmultiply((m, k, n), ao, bo, beta, &mut want, n);
            product((m, k, n), ao, bo, beta, &mut got, n);
            assert!(same_bits(&want, &got), "({m}, {k}, {n}), β {beta}");
        }
    }
}

/// A product with matrixmultiply's bits, `(shape, A, B, β, C, ldc)`, on 1 and 2 threads at
/// shapes the callers cut into tasks over C's rows or its columns, C inside a wider buffer:
/// matrixmultiply's bits each time.
#[cfg(target_arch = "x86_64")]
pub(super) fn on_threads_gives_matrixmultiplys_bits(
    product: impl Fn((usize, usize, usize), Operand, Operand, f32, &mut [f32], usize),
) {
    // Cut into tasks over rows and over columns; B as it lies and transposed (packed through
    // the transposes by both threads); β one, zero and neither.
    for (m, k, n, a_t, b_t, beta) in [
        (300, 520, 70, true, false, 1.0),
        (200, 90, 1500, false, false, 1.0),
        (97, 700, 40, false, false, 1.0),
        (150, 300, 600, false, true, 0.5),
        (260, 280, 50, true, true, 0.0),
    ] {
        let (a, b) = (values(m * k, 12), values(k * n, 13));
        let ldc = n + 5;
        let (ao, bo) = operands(&a, &b, (m, k, n), a_t, b_t);
        let c0 = values(m * ldc, 14);
        let mut want = c0.clone();
        by_matrixmultiply((m, k, n), ao, bo, beta, &mut want, ldc);
        for threads in [1, 2] {
            crate::par::set_threads(threads).unwrap();
            let mut got = c0.clone();
            product((m, k, n), ao, bo, beta, &mut got, ldc);
            crate::par::set_threads(1).unwrap();
            let what = format!("({m}, {k}, {n}), A transposed {a_t}, B transposed {b_t}, β {beta}");
            assert!(same_bits(&want, &got), "{what} on {threads} threads");
        }
    }
}

/// B (k×n) over `b` as a [`Mat`], stored transposed or not.
pub(super) fn b_view(b: &[f32], (k, n): (usize, usize), b_t: bool) -> Mat<'_> {
    let (_, bo) = operands(&[], b, (0, k, n), false, b_t);
    Mat {
        data: b,
        row_stride: bo.row_stride,
        col_stride: bo.col_stride,
    }
}

/// (A transposed, B transposed, β) of the layout tests: each operand as it lies and transposed,
/// β zero, one and neither.
pub(super) const LAYOUTS: [(bool, bool, f32); 4] = [
    (false, false, 0.0),
    (false, true, 1.0),
    (true, false, 0.5),
    (true, true, 0.0),
];

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
                    for (case, (a_t, b_t, beta)) in LAYOUTS.into_iter().enumerate() {
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
    let bo = Operand::strided(&raw, 2, 2 * k);
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

/// From [`STRIPS_MIN_ROWS`] rows, B is packed into zero-padded strips first: every layout,
/// ragged edge and β gives the same bits as the kernel reading B where it lies, and nothing
/// outside C's view is written.
#[cfg(target_arch = "x86_64")]
#[test]
fn packed_strips_give_the_bits_of_the_unpacked_kernel() {
    if !std::is_x86_feature_detected!("avx512f") {
        return;
    }
    let m = STRIPS_MIN_ROWS + 9;
    for &k in &[1usize, 5, 129] {
        for &n in &[1usize, 20, 32, 33, 70] {
            for (b_t, beta) in [(false, 0.0f32), (true, 0.0), (false, 0.5), (true, 1.0)] {
                let ldc = n + 3;
                let a = values(m * k, (k * 3 + n) as u64);
                let b = values(k * n, (k + n * 5) as u64);
                let c0 = values(m * ldc + 8, 11);
                let (ao, bo) = operands(&a, &b, (m, k, n), false, b_t);
                let mut strips = c0.clone();
                unsafe { gemm(m, k, n, ao, bo, beta, strips.as_mut_ptr(), ldc) };
                // The unpacked kernel on a row-major copy of B.
                let rows: Vec<f32> = (0..k * n)
                    .map(|i| if b_t { b[(i % n) * k + i / n] } else { b[i] })
                    .collect();
                let mut direct = c0.clone();
                unsafe { x86::avx512::gemm(m, k, n, ao, rows.as_ptr(), n, beta, direct.as_mut_ptr(), ldc) };
                assert!(
                    strips
                        .iter()
                        .zip(&direct)
                        .all(|(x, y)| x.to_bits() == y.to_bits()),
                    "k={k} n={n} b_t={b_t} beta={beta}: packed strips changed the bits"
                );
                for (idx, (&got, &before)) in strips.iter().zip(&c0).enumerate() {
                    if idx / ldc >= m || idx % ldc >= n {
                        assert_eq!(got.to_bits(), before.to_bits(), "wrote outside the view at {idx}");
                    }
                }
            }
        }
    }
}

/// B packed once and used for products with several A (the output layer's blocks) gives the
/// bits of the in-place kernel, for B as it lies and transposed, at any β, with a short k and
/// with one long enough to be taken in pieces.
#[cfg(target_arch = "x86_64")]
#[test]
fn a_b_packed_once_serves_every_product_with_the_same_bits() {
    // The kernels' own test, which EMBER_CPU_VECTOR_UNIT can turn off, as it turns the packs off.
    if !crate::simd::avx512() {
        return;
    }
    for ((k, n), b_t) in [(37, 70), (1500, 40)]
        .into_iter()
        .flat_map(|s| [(s, false), (s, true)])
    {
        let b = values(k * n, 21);
        let view = b_view(&b, (k, n), b_t);
        let packed = PackedB::new(k, n, view).expect("AVX-512 packs");
        let rows: Vec<f32> = (0..k * n)
            .map(|i| if b_t { b[(i % n) * k + i / n] } else { b[i] })
            .collect();
        for (m, beta) in [(1usize, 0.0f32), (9, 1.0), (STRIPS_MIN_ROWS + 3, 0.0), (300, 0.5)] {
            let a = values(m * k, m as u64);
            let c0 = values(m * n, 5);
            let mut got = c0.clone();
            sgemm_packed(m, Mat::rows(&a, k), &packed, beta, &mut got);
            let mut want = c0.clone();
            unsafe {
                x86::avx512::gemm(
                    m,
                    k,
                    n,
                    Operand::rows(&a, k),
                    rows.as_ptr(),
                    n,
                    beta,
                    want.as_mut_ptr(),
                    n,
                )
            };
            assert!(
                got.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()),
                "k={k} m={m} beta={beta} b_t={b_t}: a packed B changed the bits"
            );
        }
    }
}

#[test]
fn transposed_is_the_transpose_at_every_size() {
    for (rows, cols) in [(1usize, 1usize), (1, 5), (8, 8), (13, 37), (40, 17)] {
        let x = values(rows * cols, (rows * 100 + cols) as u64);
        let t = transposed(rows, cols, &x);
        assert_eq!(t.len(), rows * cols);
        for r in 0..rows {
            for c in 0..cols {
                assert_eq!(
                    t[c * rows + r].to_bits(),
                    x[r * cols + c].to_bits(),
                    "{rows}x{cols} at ({r}, {c})"
                );
            }
        }
    }
}

/// A column-major A (dW = gᵀ·x) over several chunks of k, ragged edges and β ≠ 0: the f64
/// definition to rounding, the same bits at 1, 2 and 3 threads (the chunks are fixed by k, not
/// by the threads), and nothing written outside C's view.
#[cfg(target_arch = "x86_64")]
#[test]
fn a_column_major_a_is_summed_in_chunks_of_k_independent_of_the_threads() {
    if !std::is_x86_feature_detected!("avx512f") {
        return;
    }
    for (m, k, n) in [
        (37, 2 * K_CHUNK + 37, 45),
        (128, K_CHUNK, 128),
        (9, K_CHUNK + 1, 70),
        (70, 3 * K_CHUNK + 5, 20),
        (24, 7 * K_CHUNK, 24),
    ] {
        let ldc = n + 3;
        let a = values(m * k, (m + k) as u64);
        let b = values(k * n, (k + n) as u64);
        let c0 = values(m * ldc, 7);
        let (ao, bo) = operands(&a, &b, (m, k, n), true, false);
        let run = |threads: usize| {
            crate::par::set_threads(threads).unwrap();
            let mut c = c0.clone();
            unsafe { gemm(m, k, n, ao, bo, 0.5, c.as_mut_ptr(), ldc) };
            crate::par::set_threads(1).unwrap();
            c
        };
        let c = run(1);
        for threads in [2, 3] {
            assert_eq!(
                c,
                run(threads),
                "m={m} k={k} n={n}: the bits differ at {threads} threads"
            );
        }
        for i in 0..m {
            for j in 0..ldc {
                let got = c[i * ldc + j] as f64;
                if j >= n {
                    assert_eq!(
                        got,
                        c0[i * ldc + j] as f64,
                        "wrote outside the view at ({i}, {j})"
                    );
                    continue;
                }
                let dot: f64 = (0..k).map(|p| a[p * m + i] as f64 * b[p * n + j] as f64).sum();
                let want = 0.5 * c0[i * ldc + j] as f64 + dot;
                assert!(
                    (got - want).abs() <= 1e-5 * (1.0 + want.abs()) * (k as f64).sqrt(),
                    "m={m} k={k} n={n}: C[{i},{j}] = {got}, want {want}"
                );
            }
        }
    }
}

/// The output layer's dW is summed as dlogitsᵀ·h (V × d) where it was summed as hᵀ·dlogits
/// (d × V) and transposed: each element is the same sum over the tokens either way, so the two
/// give the same bits, in each precision and block after block (β 0, then 1). Shapes: a wide
/// vocabulary; a small one whose V × d is read in place in chunks of tokens; and V 256 at d 384
/// over 10,968 rows, whose h is too large for Ember's packed kernel (matrixmultiply's own then).
#[test]
fn a_product_and_the_transpose_of_its_transposes_give_the_same_bits() {
    // bf16 emulated where the CPU has no bf16 products (AVX512_BF16's bits).
    crate::emulate_bf16_products();
    for precision in [Precision::F32, Precision::Bf16] {
        for (v, m, d) in [(300, 40, 72), (65, 200, 128), (256, 10_968, 384)] {
            let blocks = [values(m * v, 7), values(m * v, 8)];
            let hs = [values(m * d, 9), values(m * d, 10)];
            let (mut dw, mut dwt) = (vec![0f32; v * d], vec![0f32; d * v]);
            for (b, (dlogits, h)) in blocks.iter().zip(&hs).enumerate() {
                let beta = if b == 0 { 0.0 } else { 1.0 };
                let (dlogits, h) = (Mat::rows(dlogits, v), Mat::rows(h, d));
                sgemm_in(precision, v, m, d, dlogits.t(), h, beta, &mut dw);
                sgemm_in(precision, d, m, v, h.t(), dlogits, beta, &mut dwt);
            }
            let bits = |x: &[f32]| x.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert!(
                bits(&dw) == bits(&transposed(d, v, &dwt)),
                "{precision:?}, V {v}, {m} rows, d {d}: dW and (dWᵀ)ᵀ differ"
            );
        }
    }
}
