//! The backward pass from q, k and v held in bf16's 16 bits, each task packing the rows it
//! reads from their bits ([`AttnOp::backward_held`]), gives the bits of the same pass from the widened values
//! as whole f32 tensors: with grouped-query heads, T not a multiple of the blocks, the
//! probabilities kept or recomputed, and with and without dropout.

use candle_core::{DType, Device};

use super::live_tests::randn;
use super::{causal_mask, AttentionOptions, AttnOp};
use crate::gemm::Element;
use crate::held::Held;
use crate::Precision;

#[test]
fn held_bf16_values_give_the_bits_of_their_widened_f32() {
    // bf16 on any CPU: natively where it has AVX512_BF16, else emulated with its bits.
    crate::emulate_bf16_products();
    // (b, t, heads, kv heads, d): S ≤ 4d keeps the probabilities, S > 4d recomputes them.
    let cases = [(2, 96, 4, 2, 32), (1, 150, 2, 2, 16), (2, 70, 3, 1, 48)];
    for (b, t, h, hkv, d) in cases {
        for dropout in [None, Some((0.2, 5))] {
            let what = format!("(b, t, h, hkv, d) = {:?}, dropout {dropout:?}", (b, t, h, hkv, d));
            let opts = AttentionOptions {
                heads: h,
                kv_heads: hkv,
                dropout,
                telemetry: false,
                precision: Precision::Bf16,
            };
            let mask = causal_mask(t, 0, DType::F32, &Device::Cpu).unwrap();
            let held = |seed, n| Held::new(randn(seed, n, 1.0), Precision::Bf16);
            let (q, k, v) = (
                held(1, b * t * h * d),
                held(2, b * t * hkv * d),
                held(3, b * t * hkv * d),
            );
            let widened = |x: &Held| match x {
                Held::Bf16(bits) => bits.iter().map(|b| b.widen()).collect::<Vec<f32>>(),
                Held::F32(_) => panic!("bf16 held as f32"),
            };
            let (qw, kw, vw) = (widened(&q), widened(&k), widened(&v));
            let go = randn(4, b * t * h * d, 1.0);
            // A fresh op for each backward pass: the first would take the probabilities that
            // the forward pass kept.
            let op = || AttnOp::cpu(&[b, t, h * d], &[b, t, hkv * d], Some(&mask), &opts, true).unwrap();
            let (from_f32, from_held) = (op(), op());
            let o = from_f32.forward_values(&qw, &kw, &vw).unwrap();
            assert_eq!(
                from_held.forward_values(&qw, &kw, &vw).unwrap(),
                o,
                "{what}: output"
            );
            let want = from_f32.backward_values(&qw, &kw, &vw, &o, &go).unwrap();
            let got = from_held.backward_held(&q, &k, &v, &o, &go).unwrap();
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got.0), bits(&want.0), "{what}: dq");
            assert_eq!(bits(&got.1), bits(&want.1), "{what}: dk");
            assert_eq!(bits(&got.2), bits(&want.2), "{what}: dv");
        }
    }
}
