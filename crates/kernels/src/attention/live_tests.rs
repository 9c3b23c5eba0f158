//! Skipping the mask's dead blocks ([`super::live`]) changes no bit: the bf16 op over the live
//! blocks against the same op over every block — output, telemetry and gradients — under
//! causal masks (T a multiple of the blocks or not, after cached positions), causal with
//! padding (rows with no live key among them), a sliding window (dead keys before the live
//! ones), a mask per head, later rows seeing fewer keys, k long enough for several pieces, with
//! and without dropout, grouped-query heads, and kept or recomputed probabilities.

use candle_core::{DType, Device, Tensor};

use super::{causal_mask, padding_mask, take, AttentionOptions, AttentionTelemetry, AttnOp};
use crate::Precision;

pub(super) fn randn(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut rng = ember_rng::SplitMix64::new(seed);
    (0..n).map(|_| scale * rng.normal() as f32).collect()
}

/// A (1, 1, T, S) mask: position j is hidden from query i where `dead(i, j)`.
fn mask_of(t: usize, s: usize, dead: impl Fn(usize, usize) -> bool) -> Tensor {
    mask_with(t, s, |i, j| if dead(i, j) { -1e9 } else { 0.0 })
}

/// A (1, 1, T, S) mask of the values `value(i, j)`.
fn mask_with(t: usize, s: usize, value: impl Fn(usize, usize) -> f32) -> Tensor {
    let m: Vec<f32> = (0..t * s).map(|i| value(i / s, i % s)).collect();
    Tensor::from_vec(m, (1, 1, t, s), &Device::Cpu).unwrap()
}

/// (output, telemetry, dq, dk, dv) of the op over every block (`skip_dead` false) or the live
/// ones.
#[allow(clippy::type_complexity)]
fn run(
    dims: (usize, usize, usize, usize, usize, usize),
    mask: &Tensor,
    dropout: Option<(f64, u64)>,
    skip_dead: bool,
) -> (Vec<f32>, Option<AttentionTelemetry>, Vec<f32>, Vec<f32>, Vec<f32>) {
    let (b, t, s, h, hkv, d) = dims;
    let opts = AttentionOptions {
        heads: h,
        kv_heads: hkv,
        dropout,
        telemetry: true,
        precision: Precision::Bf16,
    };
    let mut op = AttnOp::cpu(&[b, t, h * d], &[b, s, hkv * d], Some(mask), &opts, true).unwrap();
    op.skip_dead = skip_dead;
    let q = randn(1, b * t * h * d, 0.8);
    let (k, v) = (randn(2, b * s * hkv * d, 1.0), randn(3, b * s * hkv * d, 1.0));
    let go = randn(4, b * t * h * d, 1.0);
    let o = op.forward_values(&q, &k, &v).unwrap();
    let telemetry = op.telemetry_slot().and_then(|slot| take(&slot));
    let (dq, dk, dv) = op.backward_values(&q, &k, &v, &o, &go).unwrap();
    (o, telemetry, dq, dk, dv)
}

#[test]
fn the_live_blocks_give_every_blocks_bits() {
    // bf16 on any CPU: natively where it has AVX512_BF16, else emulated with its bits.
    crate::emulate_bf16_products();
    let causal = |t, offset| causal_mask(t, offset, DType::F32, &Device::Cpu).unwrap();
    // Batch row 0 sees no key at all, row 1 its first 120: rows with no live key, and keys
    // that no query sees.
    let keys: Vec<f32> = (0..280).map(|j| f32::from((140..260).contains(&j))).collect();
    let keys = Tensor::from_vec(keys, (2, 140), &Device::Cpu).unwrap();
    let causal_padded = causal(140, 0)
        .broadcast_add(&padding_mask(&keys, DType::F32).unwrap())
        .unwrap();
    let window = mask_of(160, 160, |i, j| j > i || j + 40 < i);
    // Heads with masks of their own (a window for head 0, causal for head 1; both under one
    // KV head), and a mask whose later rows see fewer keys than its first (the first 32 rows
    // see all 160, the rest the first 32).
    let per_head = Tensor::cat(&[window.clone(), mask_of(160, 160, |i, j| j > i)], 1).unwrap();
    let shrinking = mask_of(160, 160, |i, j| i >= 32 && j >= 32);
    // (b, t, s, heads, kv heads, d), the mask: S ≤ 4d keeps the probabilities, S > 4d
    // recomputes them. Every case has the 128 keys the live blocks need.
    let cases = [
        ("causal", (2, 256, 256, 2, 1, 64), causal(256, 0)),
        (
            "causal, T not a multiple of 32",
            (1, 150, 150, 2, 2, 16),
            causal(150, 0),
        ),
        (
            "causal after 64 cached positions",
            (2, 70, 134, 2, 2, 48),
            causal(70, 64),
        ),
        ("causal and padding", (2, 140, 140, 4, 2, 48), causal_padded),
        ("sliding window", (1, 160, 160, 2, 2, 48), window),
        ("a mask per head", (2, 160, 160, 2, 1, 48), per_head),
        ("later rows seeing fewer keys", (1, 160, 160, 2, 2, 48), shrinking),
        (
            "causal after 37 cached positions",
            (1, 100, 137, 2, 2, 48),
            causal(100, 37),
        ),
        ("causal over 600 keys", (1, 600, 600, 1, 1, 160), causal(600, 0)),
    ];
    for (name, dims, mask) in cases {
        for dropout in [None, Some((0.2, 9))] {
            let whole = run(dims, &mask, dropout, false);
            let live = run(dims, &mask, dropout, true);
            let what = format!("{name} {dims:?} dropout {dropout:?}");
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&whole.0), bits(&live.0), "{what}: output");
            assert_eq!(whole.1, live.1, "{what}: telemetry");
            assert_eq!(bits(&whole.2), bits(&live.2), "{what}: dq");
            assert_eq!(bits(&whole.3), bits(&live.3), "{what}: dk");
            assert_eq!(bits(&whole.4), bits(&live.4), "{what}: dv");
        }
    }
}

/// bf16 keeps a causal mask's probabilities in their live blocks alone — 36,864 of T = S =
/// 256's 65,536 per head, in blocks of 32 rows ending at their diagonal — f32 all of them (it
/// computes every block), and in both the backward pass from them gives the bits of one that
/// recomputes them. Two query heads share each task, so the second head unfolds its blocks
/// over the first one's: under a mask per head whose second head sees fewer keys (its rows
/// from 32 on only the first 32), that head's dead columns must be zeroed again. Also with
/// dropout on the probabilities, and at T = 200 (a last block of 8 rows).
#[test]
fn the_kept_probabilities_are_the_live_blocks_alone() {
    crate::emulate_bf16_products();
    let causal = |t| causal_mask(t, 0, DType::F32, &Device::Cpu).unwrap();
    let fewer = mask_of(256, 256, |i, j| j > i || (i >= 32 && j >= 32));
    let per_head = Tensor::cat(&[causal(256), fewer], 1).unwrap();
    // (mask, dropout, kept per batch row). The second head's blocks under `per_head`: 32 × 32,
    // then 7 blocks of 32 rows × 32 keys. At T = 200: six blocks of 32 rows ending at their
    // diagonal, then 8 rows × 200.
    let cases = [
        (causal(256), None, 2 * 36_864),
        (causal(256), Some((0.2, 9)), 2 * 36_864),
        (per_head, None, 36_864 + 8 * 32 * 32),
        (causal(200), None, 2 * (32 * 32 * 21 + 8 * 200)),
    ];
    for (mask, dropout, live_per_row) in &cases {
        let t = mask.dims()[2];
        kept_probabilities_give_recomputed_bits(Precision::F32, mask, *dropout, 2 * t * t);
        kept_probabilities_give_recomputed_bits(Precision::Bf16, mask, *dropout, *live_per_row);
    }
}

/// Asserts that the op under `mask` (T = S from the mask; two heads of 64 over one KV head, 2
/// batch rows) keeps `kept_per_row` probabilities per batch row, and that its backward pass
/// from them has the bits of one that recomputes them.
fn kept_probabilities_give_recomputed_bits(
    precision: Precision,
    mask: &Tensor,
    dropout: Option<(f64, u64)>,
    kept_per_row: usize,
) {
    let (b, t, h, d) = (2, mask.dims()[2], 2, 64);
    let opts = AttentionOptions {
        heads: h,
        kv_heads: 1,
        dropout,
        telemetry: false,
        precision,
    };
    let q = randn(1, b * t * h * d, 0.8);
    let (k, v) = (randn(2, b * t * d, 1.0), randn(3, b * t * d, 1.0));
    let go = randn(4, b * t * h * d, 1.0);
    let grads = |keeps: bool| {
        let op = AttnOp::cpu(&[b, t, h * d], &[b, t, d], Some(mask), &opts, keeps).unwrap();
        let o = op.forward_values(&q, &k, &v).unwrap();
        let kept = op.probs.as_ref().map(|slot| {
            let kept = take(slot).expect("the forward pass keeps its probabilities");
            let len = kept.len();
            *slot.lock().unwrap() = Some(kept);
            len
        });
        let (dq, dk, dv) = op.backward_values(&q, &k, &v, &o, &go).unwrap();
        let bits = |x: Vec<f32>| x.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        (kept, [bits(o), bits(dq), bits(dk), bits(dv)])
    };
    let (kept, from_kept) = grads(true);
    let (none, recomputed) = grads(false);
    let what = format!("{precision:?}, mask {:?}, dropout {dropout:?}", mask.dims());
    assert_eq!(kept, Some(b * kept_per_row), "{what}");
    assert_eq!(none, None);
    for (part, (a, r)) in ["output", "dq", "dk", "dv"]
        .iter()
        .zip(from_kept.iter().zip(&recomputed))
    {
        assert!(
            a == r,
            "{what} {part}: kept probabilities and recomputed ones differ"
        );
    }
}

/// A mask with values between the dead and the live ones (−5e7 here) gets every block computed:
/// there a masked probability need not be exactly 0.
#[test]
fn a_mask_with_values_between_dead_and_live_is_computed_whole() {
    let mask = mask_with(160, 160, |i, j| match (j > i, j == 40) {
        (false, _) => 0.0,
        (true, false) => -1e9,
        (true, true) => -5e7,
    });
    let op = one_head(160, &mask);
    op.with_mask(|view| {
        assert_eq!(op.live(view).row_blocks(0, 0), vec![(0..160, 160)]);
        Ok(())
    })
    .unwrap();
}

/// The blocks themselves: a causal mask's row blocks end at their diagonal (rounded up to 32),
/// and its key blocks start at their first query row; below 128 keys every block is computed.
#[test]
fn a_causal_masks_live_blocks_end_at_the_diagonal() {
    let mask = causal_mask(150, 0, DType::F32, &Device::Cpu).unwrap();
    let op = one_head(150, &mask);
    op.with_mask(|view| {
        let live = op.live(view);
        let ends = [32, 64, 96, 128, 150];
        let rows: Vec<_> = (0..5).map(|b| (32 * b..ends[b], ends[b])).collect();
        assert_eq!(live.row_blocks(0, 0), rows);
        let keys: Vec<_> = (0..5).map(|b| (32 * b..ends[b], 32 * b)).collect();
        assert_eq!(live.column_blocks(0, 0), keys);
        Ok(())
    })
    .unwrap();
    // Fewer than 128 keys: every block.
    let mask = causal_mask(100, 0, DType::F32, &Device::Cpu).unwrap();
    let op = one_head(100, &mask);
    op.with_mask(|view| {
        assert_eq!(op.live(view).row_blocks(0, 0), vec![(0..100, 100)]);
        Ok(())
    })
    .unwrap();
}

/// A bf16 op of one head over T = S = `t` under `mask`.
fn one_head(t: usize, mask: &Tensor) -> AttnOp {
    let opts = AttentionOptions {
        heads: 1,
        kv_heads: 1,
        dropout: None,
        telemetry: false,
        precision: Precision::Bf16,
    };
    AttnOp::cpu(&[1, t, 8], &[1, t, 8], Some(mask), &opts, false).unwrap()
}
