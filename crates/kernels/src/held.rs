//! What the feed-forward block's activation keeps from its forward pass for the elementwise
//! arithmetic of its backward pass — SwiGLU's two projections, GELU's derivative — in the
//! products' [`Precision`]: f32 as it is, or under bf16 products rounded to bf16 and held in
//! its 16 bits.
//!
//! Under bf16 the activation reads its projections rounded to bf16 (the values cuBLAS's bf16
//! products hand on, and PyTorch's autocast too), and what it keeps is those values or a
//! derivative rounded once: half the memory of f32, for one rounding of the kind every product
//! already makes of its operands. A backward pass widens them a task's piece at a time, so the
//! f32 values never go to memory whole.

use std::borrow::Cow;
use std::mem::MaybeUninit;
use std::ops::Range;

use crate::gemm::{round_bf16_in_place, round_into_bf16, Element};
use crate::par::{fill, ELEMENTS_PER_TASK};
use crate::simd::simd_dispatch;
use crate::Precision;

/// Values kept for a backward pass: f32, or bf16's bits.
pub(crate) enum Held<'a> {
    F32(Cow<'a, [f32]>),
    /// Rounded to nearest even as the products round their operands (denormals flushed).
    Bf16(Vec<u16>),
}

impl<'a> Held<'a> {
    /// `values` held as `precision` holds an activation.
    pub(crate) fn new(values: impl Into<Cow<'a, [f32]>>, precision: Precision) -> Self {
        let values = values.into();
        match precision {
            Precision::F32 => Held::F32(values),
            Precision::Bf16 => Held::Bf16(fill(values.len(), ELEMENTS_PER_TASK, |r, out| {
                round_into_bf16(&values[r], out)
            })),
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Held::F32(v) => v.len(),
            Held::Bf16(bits) => bits.len(),
        }
    }

    /// The elements `r`, as f32 (bf16's widened exactly).
    pub(crate) fn piece(&self, r: Range<usize>) -> Cow<'_, [f32]> {
        match self {
            Held::F32(v) => Cow::Borrowed(&v[r]),
            Held::Bf16(bits) => {
                let mut out = Vec::with_capacity(r.len());
                widen_into(&bits[r.clone()], &mut out.spare_capacity_mut()[..r.len()]);
                // SAFETY: `widen_into` wrote the first r.len() elements.
                unsafe { out.set_len(r.len()) };
                Cow::Owned(out)
            }
        }
    }
}

/// `x` as an activation of `precision` is: itself for f32; rounded to bf16 (as f32 values) for
/// bf16.
pub(crate) fn as_activation(x: &[f32], precision: Precision) -> Cow<'_, [f32]> {
    match precision {
        Precision::F32 => Cow::Borrowed(x),
        Precision::Bf16 => {
            let mut rounded = x.to_vec();
            round_bf16_in_place(&mut rounded);
            Cow::Owned(rounded)
        }
    }
}

#[inline(always)]
fn widen_into_generic(bits: &[u16], out: &mut [MaybeUninit<f32>]) {
    for (o, &b) in out.iter_mut().zip(bits) {
        o.write(b.widen());
    }
}
simd_dispatch!(widen_into => widen_into_generic(bits: &[u16], out: &mut [MaybeUninit<f32>]) -> ());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_holds_what_a_bf16_activation_holds_in_two_bytes() {
        let x: Vec<f32> = (0..40_000)
            .map(|i| (i as f32 * 0.37).sin() * 3.0 + 1e-3)
            .collect();
        let held = Held::new(&x[..], Precision::Bf16);
        let Held::Bf16(bits) = &held else {
            panic!("bf16 held as f32")
        };
        assert_eq!(bits.len(), x.len());
        let whole = held.piece(0..x.len());
        let rounded = as_activation(&x, Precision::Bf16);
        for i in 0..x.len() {
            let expected = half::bf16::from_f32(x[i]).to_f32();
            assert_eq!(whole[i].to_bits(), expected.to_bits(), "element {i}");
            assert_eq!(rounded[i].to_bits(), expected.to_bits(), "element {i}");
        }
        assert_eq!(&held.piece(17_000..17_005)[..], &whole[17_000..17_005]);
    }

    #[test]
    fn f32_holds_the_values_themselves() {
        let x = [1.0f32 + f32::EPSILON, -2.5e-40, 3.0];
        let held = Held::new(&x[..], Precision::F32);
        assert!(matches!(held, Held::F32(Cow::Borrowed(_))));
        assert_eq!(&held.piece(0..3)[..], &x[..]);
        assert_eq!(&as_activation(&x, Precision::F32)[..], &x[..]);
    }
}
