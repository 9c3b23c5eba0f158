//! Operands rounded to bf16 once ([`Rounded`]) give every product the bits it gives from the
//! f32 values they were rounded from: as A in rows, as a transposed A and as B, on `vdpbf16ps`
//! and on the emulated tiles, at ragged edges, β ≠ 0 and thread counts that split C's rows or
//! its columns. And products over parts of k give the whole product's bits where A's other
//! pairs are zero.

use super::bf16::{
    gemm_packed_from, gemm_packed_parts, gemm_with, pack_b_for, pack_b_rounded_for, rows_of_product,
    supported, AInput, Kernel, Rounded,
};
use super::bf16_tests::{round, same_bits};
use super::tests::{operands, values};

/// The rounded values are the packers' rounding of each element.
#[test]
fn rounded_values_are_the_packers_rounding() {
    if !supported() {
        return;
    }
    for (rows, cols) in [(1usize, 1usize), (3, 5), (33, 64), (70, 129)] {
        let mut x = values(rows * cols, (rows + cols) as u64);
        x[0] = 1.0 + 2f32.powi(-8); // a tie: to even
        x[rows * cols - 1] = 1e-40; // a denormal: to zero
        let got = Rounded::new(rows, cols, &x).to_f32();
        let want: Vec<f32> = x.iter().map(|&v| round(v)).collect();
        assert!(same_bits(&got, &want), "{rows}×{cols}");
    }
}

/// B packed from its rounded rows is the strips packed from its f32 rows, padding included.
#[test]
fn strips_from_rounded_rows_are_the_strips_from_f32_rows() {
    if !supported() {
        return;
    }
    for kernel in [Kernel::Avx512, Kernel::AmxEmulated] {
        // n = 300: strips packed four at a time, the last group of two partly past n.
        for (k, n) in [
            (1usize, 1usize),
            (2, 31),
            (33, 32),
            (64, 70),
            (129, 17),
            (65, 300),
        ] {
            let b = values(k * n, (k * 3 + n) as u64);
            let (_, bo) = operands(&[], &b, (0, k, n), false, false);
            let from_f32 = unsafe { pack_b_for(kernel, k, n, bo) };
            let from_rounded = pack_b_rounded_for(kernel, &Rounded::new(k, n, &b));
            let len = n.div_ceil(32) * kernel_kq(kernel, k) * 32;
            assert_eq!(
                from_f32.as_slice(len),
                from_rounded.as_slice(len),
                "{kernel:?} k={k} n={n}"
            );
        }
    }
}

fn kernel_kq(kernel: Kernel, k: usize) -> usize {
    let kq = k.div_ceil(2);
    if kernel == Kernel::Avx512 {
        kq
    } else {
        kq.next_multiple_of(16)
    }
}

/// x·Wᵀ with x rounded (A in rows), and dW = gᵀ·x with g and x rounded (A transposed, B in
/// rows): the bits of the same products from the f32 values, at every β, split by rows (m ≥ n)
/// and by columns (m < n), at 1 and 3 threads (the largest shape packs in parallel tasks).
#[test]
fn products_of_rounded_operands_give_the_bits_of_the_f32_ones() {
    if !supported() {
        return;
    }
    let shapes = [
        (1usize, 1usize, 1usize),
        (7, 33, 17),
        (33, 64, 70),
        (65, 129, 33),
        (300, 96, 40),
        (37, 200, 500),
        (300, 300, 600),
    ];
    for kernel in [Kernel::Avx512, Kernel::AmxEmulated] {
        for threads in [1, 3] {
            crate::par::set_threads(threads).unwrap();
            for (case, &(m, k, n)) in shapes.iter().enumerate() {
                let beta = [0.0f32, 1.0, 0.5][case % 3];
                let c0 = values(m * n, 7);
                let a = values(m * k, (m + 2 * k) as u64);
                let b = values(k * n, (k + 3 * n) as u64);
                // A in rows against a transposed f32 B (a weight in x·Wᵀ).
                let (ao, bo) = operands(&a, &b, (m, k, n), false, true);
                let mut want = c0.clone();
                unsafe { gemm_with(kernel, m, k, n, ao, bo, beta, want.as_mut_ptr(), n) };
                let packed = unsafe { pack_b_for(kernel, k, n, bo) };
                let ra = Rounded::new(m, k, &a);
                let mut got = c0.clone();
                unsafe { gemm_packed_from(m, AInput::Rows(&ra), &packed, beta, got.as_mut_ptr(), n) };
                assert!(
                    same_bits(&got, &want),
                    "{kernel:?} rows m={m} k={k} n={n} β={beta}"
                );
                // Aᵀ from the rounded g (k×m) and B from the rounded x (k×n).
                let (ao, bo) = operands(&a, &b, (m, k, n), true, false);
                let mut want = c0.clone();
                unsafe { gemm_with(kernel, m, k, n, ao, bo, beta, want.as_mut_ptr(), n) };
                let (rg, rx) = (Rounded::new(k, m, &a), Rounded::new(k, n, &b));
                let packed = pack_b_rounded_for(kernel, &rx);
                let mut got = c0.clone();
                unsafe { gemm_packed_from(m, AInput::Transposed(&rg), &packed, beta, got.as_mut_ptr(), n) };
                assert!(
                    same_bits(&got, &want),
                    "{kernel:?} transposed m={m} k={k} n={n} β={beta}"
                );
            }
            crate::par::set_threads(1).unwrap();
        }
    }
}

/// A matrix made block by block and rounded as it comes holds the rounding of what was made,
/// for row counts on both sides of a block's 32 and at several threads.
#[test]
fn a_matrix_rounded_as_it_is_made_is_the_rounding_of_what_was_made() {
    if !supported() {
        return;
    }
    for threads in [1, 3] {
        crate::par::set_threads(threads).unwrap();
        // 300 × 300 is past the size from which the blocks run as parallel tasks.
        for (rows, cols) in [(1usize, 3usize), (31, 40), (33, 17), (100, 129), (300, 300)] {
            let x = values(rows * cols, (rows * cols) as u64);
            let made = Rounded::from_rows_with(rows, cols, |r, out| {
                for (o, &v) in out.iter_mut().zip(&x[r.start * cols..r.end * cols]) {
                    o.write(v);
                }
            });
            let want = Rounded::new(rows, cols, &x);
            assert!(
                same_bits(&made.to_f32(), &want.to_f32()),
                "{rows}×{cols} at {threads} threads"
            );
            // The padding as well: both feed the same products.
            let len = rows.next_multiple_of(32) * cols.div_ceil(2).next_multiple_of(16);
            assert_eq!(made.pairs_slice(len), want.pairs_slice(len), "{rows}×{cols}");
        }
        crate::par::set_threads(1).unwrap();
    }
}

/// Parts of a product over the pairs of k where A is not zero ([`gemm_packed_parts`]:
/// attention's causal blocks) give the whole product's bits there: prefixes of k (P·v), suffixes
/// (dSᵀ·q), empty ranges, column prefixes (q·kᵀ), A in rows or columns, β = 0 and 1, on
/// `vdpbf16ps` and the emulated tiles.
#[test]
fn parts_over_the_nonzero_pairs_are_the_whole_products_bits() {
    if !supported() {
        return;
    }
    // (rows, columns, k): the rows of a part see A's columns `k` only. The second k is long
    // enough for several pieces (512 of k each), which parts start and end inside.
    let short = [
        (0..32, 0..70, 0..32),
        (32..64, 0..64, 0..64),
        (64..96, 32..70, 32..96),
        (96..100, 0..70, 64..64),
    ];
    let long = [
        (0..32, 0..70, 0..1024),
        (32..64, 0..70, 544..1101),
        (64..96, 0..40, 256..768),
    ];
    for (kernel, (k, parts)) in [Kernel::Avx512, Kernel::AmxEmulated]
        .into_iter()
        .flat_map(|kernel| [(kernel, (96usize, &short[..])), (kernel, (1101, &long[..]))])
    {
        let (m, n) = (100usize, 70usize);
        for a_t in [false, true] {
            let mut a = values(m * k, 3);
            for (rows, _, ks) in parts {
                for i in rows.clone() {
                    for p in (0..k).filter(|p| !ks.contains(p)) {
                        a[if a_t { p * m + i } else { i * k + p }] = 0.0;
                    }
                }
            }
            let b = values(k * n, 4);
            let (ao, bo) = operands(&a, &b, (m, k, n), a_t, false);
            let packed = unsafe { pack_b_for(kernel, k, n, bo) };
            for beta in [0.0f32, 1.0] {
                let start = values(m * n, 5);
                let mut whole = start.clone();
                unsafe { gemm_packed_from(m, AInput::F32(ao), &packed, beta, whole.as_mut_ptr(), n) };
                let mut parted = start.clone();
                unsafe { gemm_packed_parts(ao, &packed, parts, beta, parted.as_mut_ptr(), n) };
                for i in 0..m {
                    for j in 0..n {
                        let part = parts.iter().find(|(r, c, _)| r.contains(&i) && c.contains(&j));
                        let want = if part.is_some() {
                            whole[i * n + j]
                        } else {
                            start[i * n + j]
                        };
                        assert_eq!(
                            parted[i * n + j].to_bits(),
                            want.to_bits(),
                            "{kernel:?} k {k} Aᵀ {a_t} β {beta}: ({i}, {j}) in {:?}",
                            part.map(|p| &p.2)
                        );
                    }
                }
            }
        }
    }
}

/// A product made a block of 32 rows at a time ([`rows_of_product`]) has the whole product's
/// bits, with a long k in pieces and a last block of fewer rows, on `vdpbf16ps`, the emulated
/// tiles and (where the CPU has them) AMX's.
#[test]
fn a_product_by_blocks_of_rows_is_the_whole_product() {
    if !supported() {
        return;
    }
    let mut kernels = vec![Kernel::Avx512, Kernel::AmxEmulated];
    if super::bf16::amx::available() {
        kernels.push(Kernel::Amx);
    }
    for kernel in kernels {
        for (m, k, n) in [
            (1usize, 3usize, 5usize),
            (70, 50, 45),
            (96, 600, 33),
            (33, 64, 300),
        ] {
            let (a, b) = (values(m * k, (m + k) as u64), values(k * n, (k + n) as u64));
            let a = Rounded::new(m, k, &a);
            let (_, bo) = operands(&[], &b, (0, k, n), false, false);
            let b = unsafe { pack_b_for(kernel, k, n, bo) };
            let mut whole = vec![0f32; m * n];
            // SAFETY: the operands and C hold these shapes.
            unsafe { gemm_packed_from(m, AInput::Rows(&a), &b, 0.0, whole.as_mut_ptr(), n) };
            let mut by_blocks = vec![f32::NAN; m * n];
            for r0 in (0..m).step_by(32) {
                let rows = r0..m.min(r0 + 32);
                // SAFETY: the block's rows of C are in bounds.
                unsafe { rows_of_product(&a, &b, rows, by_blocks[r0 * n..].as_mut_ptr(), n) };
            }
            assert!(same_bits(&by_blocks, &whole), "{kernel:?} {m}×{k}×{n}");
        }
    }
}
