//! Sums of equally shaped tensors, element by element in a fixed order, and the sum of squares
//! that global-norm clipping needs.
//!
//! A step split into S shares ends with S gradients per parameter to add up. S − 1 tensor
//! additions in turn make S − 1 passes over memory, each on one thread (candle's binary ops are
//! serial), and allocate a tensor each: at 16 shares of a 10 M-parameter model that pass was
//! longer than the shares' forward and backward together. Here every element's sum is taken
//! over the S inputs in one pass, chunks of elements in parallel; each element still adds its
//! terms in the same order, ((g₀ + g₁) + g₂) + …, so the result has the bits of the additions
//! in turn.

use std::mem::MaybeUninit;

use candle_core::{DType, Result, Tensor};

use crate::host::{cpu_tensor, is_host, is_host_f32, with_all_data, with_data};
use crate::par::{fill, ELEMENTS_PER_TASK};
use crate::simd::simd_dispatch;

/// `parts[0] + parts[1] + …`, added left to right for every element. All parts must have one
/// shape; an empty slice is an error.
pub fn sum_in_order(parts: &[Tensor]) -> Result<Tensor> {
    let Some(first) = parts.first() else {
        candle_core::bail!("sum_in_order: nothing to sum");
    };
    for p in &parts[1..] {
        if p.shape() != first.shape() {
            candle_core::bail!(
                "sum_in_order: shapes differ: {:?} and {:?}",
                first.shape(),
                p.shape()
            );
        }
    }
    if parts.len() == 1 {
        return Ok(first.clone());
    }
    if !parts.iter().all(is_host_f32) {
        return sum_in_order_unfused(parts);
    }
    let parts: Vec<&Tensor> = parts.iter().collect();
    let out = with_all_data(&parts, |slices| {
        Ok(fill(first.elem_count(), ELEMENTS_PER_TASK, |r, out| {
            sum_parts_into(slices, r, out)
        }))
    })?;
    cpu_tensor(out, first.shape())
}

/// Elements `r` of `slices[0] + slices[1] + …`, added left to right, into `out`.
#[inline(always)]
fn sum_parts_generic(slices: &[&[f32]], r: std::ops::Range<usize>, out: &mut [MaybeUninit<f32>]) {
    for (o, &x) in out.iter_mut().zip(&slices[0][r.clone()]) {
        o.write(x);
    }
    // SAFETY: every element was written just above, and MaybeUninit<f32> has f32's layout.
    let acc = unsafe { &mut *(out as *mut [MaybeUninit<f32>] as *mut [f32]) };
    for s in &slices[1..] {
        for (a, &x) in acc.iter_mut().zip(&s[r.clone()]) {
            *a += x;
        }
    }
}
simd_dispatch!(sum_parts_into => sum_parts_generic(
    slices: &[&[f32]], r: std::ops::Range<usize>, out: &mut [MaybeUninit<f32>]) -> ());

/// The reference: one tensor addition after another (every device and dtype).
pub fn sum_in_order_unfused(parts: &[Tensor]) -> Result<Tensor> {
    let Some((first, rest)) = parts.split_first() else {
        candle_core::bail!("sum_in_order: nothing to sum");
    };
    rest.iter().try_fold(first.clone(), |acc, p| acc + p)
}

/// Σ x² of a tensor, in f64. On the CPU, blocks of `SQUARES_PER_BLOCK` elements are summed in
/// parallel, each with eight f32 lanes, and the blocks' sums added in order in f64: the
/// blocks depend on the size alone, so the result is the same at any thread count. Tensor ops
/// in t's dtype elsewhere, widened to f64 at the end. A bf16 tensor (mixed precision's
/// gradients) is read widened to f32 first, on either device: its squares are f32's.
pub fn sum_of_squares(t: &Tensor) -> Result<f64> {
    if !is_host(t) {
        let t = match t.dtype() {
            DType::BF16 => t.to_dtype(DType::F32)?,
            _ => t.clone(),
        };
        return t.sqr()?.sum_all()?.to_dtype(DType::F64)?.to_scalar::<f64>();
    }
    with_data([t], |[data]| {
        let blocks = data.len().div_ceil(SQUARES_PER_BLOCK);
        let sums: Vec<f64> = fill(blocks, 1, |b, out| {
            let block = &data[b.start * SQUARES_PER_BLOCK..data.len().min(b.end * SQUARES_PER_BLOCK)];
            out[0].write(block_sum_of_squares(block));
        });
        Ok(sums.iter().sum())
    })
}

/// Elements per block of [`sum_of_squares`]: a fixed size, so that the sum's rounding never
/// depends on the threads.
pub const SQUARES_PER_BLOCK: usize = 1 << 16;

/// Σ x² of a block in eight f32 lanes, then in f64; compiled for AVX-512 or AVX2 where the CPU
/// has it (the lanes' arithmetic is the same at any width).
#[inline(always)]
fn block_sum_of_squares_generic(data: &[f32]) -> f64 {
    let mut lanes = [0f32; 8];
    let chunks = data.chunks_exact(8);
    let tail: f64 = chunks.remainder().iter().map(|&x| (x * x) as f64).sum();
    for chunk in chunks {
        for i in 0..8 {
            lanes[i] += chunk[i] * chunk[i];
        }
    }
    lanes.iter().map(|&x| x as f64).sum::<f64>() + tail
}

simd_dispatch!(block_sum_of_squares => block_sum_of_squares_generic(data: &[f32]) -> f64);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::par;
    use candle_core::Device;

    fn random(n: usize, seed: u64) -> Tensor {
        // Values of mixed magnitude, so that the order of the additions shows in the bits.
        let mut s = seed;
        let v: Vec<f32> = (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let u = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                u * 10f32.powi(((s >> 20) % 7) as i32 - 3)
            })
            .collect();
        Tensor::from_vec(v, n, &Device::Cpu).unwrap()
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        t.flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    }

    #[test]
    fn the_sum_has_the_bits_of_the_additions_in_turn_at_any_thread_count() {
        let n = 3 * ELEMENTS_PER_TASK + 17;
        let parts: Vec<Tensor> = (0..5).map(|s| random(n, s)).collect();
        let expected = bits(&sum_in_order_unfused(&parts).unwrap());
        for threads in [1, 3] {
            par::set_threads(threads).unwrap();
            assert_eq!(
                bits(&sum_in_order(&parts).unwrap()),
                expected,
                "{threads} threads"
            );
        }
        par::set_threads(1).unwrap();
    }

    #[test]
    fn one_part_is_itself_and_no_parts_or_unequal_shapes_are_errors() {
        let a = random(10, 1);
        assert_eq!(bits(&sum_in_order(std::slice::from_ref(&a)).unwrap()), bits(&a));
        assert!(sum_in_order(&[]).is_err());
        let err = sum_in_order(&[a, random(11, 2)]).unwrap_err().to_string();
        assert!(err.contains("shapes differ"), "{err}");
    }

    #[test]
    fn sum_of_squares_matches_f64_and_not_the_threads() {
        let t = random(2 * SQUARES_PER_BLOCK + 5, 7);
        let exact: f64 = t
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .map(|&x| (x as f64) * (x as f64))
            .sum();
        let mut seen = vec![];
        for threads in [1, 3] {
            par::set_threads(threads).unwrap();
            seen.push(sum_of_squares(&t).unwrap().to_bits());
        }
        par::set_threads(1).unwrap();
        assert_eq!(seen[0], seen[1]);
        let got = f64::from_bits(seen[0]);
        assert!((got - exact).abs() <= 1e-5 * exact, "{got} vs {exact}");
    }

    #[test]
    fn the_sum_of_squares_of_a_bf16_tensor_is_its_f32_widenings() {
        let t = random(SQUARES_PER_BLOCK + 9, 8).to_dtype(DType::BF16).unwrap();
        let widened = t.to_dtype(DType::F32).unwrap();
        assert_eq!(
            sum_of_squares(&t).unwrap().to_bits(),
            sum_of_squares(&widened).unwrap().to_bits()
        );
    }

    /// Not a test: `CANDLE_NUM_THREADS=1 cargo test --release -p ember-kernels --lib
    /// sum::tests::print -- --ignored --nocapture` prints the time to sum 16 shares' gradients of
    /// a 2.6 M-parameter model (multi30k-tiny) by candle's additions in turn and by
    /// [`sum_in_order`] at 1 and 2 threads. (candle's ops run on one thread when a step is split
    /// into shares; CANDLE_NUM_THREADS=1 times them so.)
    #[test]
    #[ignore]
    fn print_the_time_to_sum_16_shares() {
        let parts: Vec<Tensor> = (0..16).map(|s| random(2_600_000, s)).collect();
        for threads in [1, 2] {
            par::set_threads(threads).unwrap();
            let mut best = [f64::MAX; 2];
            // Alternating, best of 7: other tenants share this machine.
            for _ in 0..7 {
                for (i, f) in [sum_in_order_unfused, sum_in_order].iter().enumerate() {
                    let t = std::time::Instant::now();
                    std::hint::black_box(f(&parts).unwrap());
                    best[i] = best[i].min(t.elapsed().as_secs_f64() * 1e3);
                }
            }
            println!(
                "{threads} thread(s): additions in turn {:.1} ms, sum_in_order {:.1} ms ({:.2}x)",
                best[0],
                best[1],
                best[0] / best[1]
            );
        }
        par::set_threads(1).unwrap();
    }
}
