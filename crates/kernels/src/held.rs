//! What a sub-block keeps from its forward pass for its backward pass, in the products'
//! [`Precision`]: f32 as it is, or under bf16 products rounded to bf16 and held in its 16 bits.
//! The feed-forward activation's values (SwiGLU's two projections, GELU's derivative) and the
//! attention core's q, k and v are held so.
//!
//! Under bf16, SwiGLU reads its projections rounded to bf16 (the values cuBLAS's bf16 products
//! hand on, and PyTorch's autocast too) and keeps those; GELU keeps its derivative rounded once.
//! Half the memory of f32, for one rounding of the kind every product already makes of its
//! operands. The kernels round as they write ([`Store`]) and widen as they read
//! ([`Element::widen`]), so no f32 copy is made.
//!
//! The attention core reads q, k and v only through its products, which round them: held
//! rounded, and packed for its backward pass's products from the bits themselves
//! ([`crate::attention`]), they give the same bits as the f32 values did, for half their memory.

use std::borrow::Cow;
use std::mem::MaybeUninit;
use std::ops::Range;

use crate::gemm::{round_into_bf16, to_bf16, Element};
use crate::par::{fill, SharedMut, ELEMENTS_PER_TASK};
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
}

/// How a value is kept for a backward pass: an f32 as it is, bf16's bits rounded as the
/// products round their operands. Read back with [`Element::widen`].
pub(crate) trait Store: Element {
    fn store(v: f32) -> Self;
}

impl Store for f32 {
    #[inline(always)]
    fn store(v: f32) -> f32 {
        v
    }
}

impl Store for u16 {
    #[inline(always)]
    fn store(v: f32) -> u16 {
        to_bf16(v)
    }
}

/// bf16 values being written a piece at a time by parallel tasks, then held.
pub(crate) struct PendingBits {
    bits: Vec<u16>,
    len: usize,
    at: SharedMut<MaybeUninit<u16>>,
}

impl PendingBits {
    pub(crate) fn new(len: usize) -> Self {
        let mut bits = Vec::<u16>::with_capacity(len);
        let at = SharedMut(bits.as_mut_ptr().cast::<MaybeUninit<u16>>());
        Self { bits, len, at }
    }

    /// The elements `r`, to be written.
    ///
    /// # Safety
    /// `r` lies within the length given to [`PendingBits::new`], and no other piece in use
    /// overlaps it.
    #[allow(clippy::mut_from_ref)] // disjoint pieces, written by parallel tasks
    pub(crate) unsafe fn piece(&self, r: Range<usize>) -> &mut [MaybeUninit<u16>] {
        self.at.slice(r.start, r.len())
    }

    /// The values, held.
    ///
    /// # Safety
    /// Pieces covering every element were written.
    pub(crate) unsafe fn finish(mut self) -> Held<'static> {
        self.bits.set_len(self.len);
        Held::Bf16(self.bits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_holds_what_a_bf16_activation_holds_in_two_bytes() {
        let x: Vec<f32> = (0..40_000)
            .map(|i| (i as f32 * 0.37).sin() * 3.0 + 1e-3)
            .collect();
        let Held::Bf16(bits) = Held::new(&x[..], Precision::Bf16) else {
            panic!("bf16 held as f32")
        };
        assert_eq!(bits.len(), x.len());
        for (i, (&v, &b)) in x.iter().zip(&bits).enumerate() {
            let expected = half::bf16::from_f32(v);
            assert_eq!(b, expected.to_bits(), "element {i}");
            assert_eq!(b.widen().to_bits(), expected.to_f32().to_bits(), "element {i}");
        }
    }

    #[test]
    fn bf16_values_widened_round_back_to_their_own_bits() {
        let mut x: Vec<f32> = (0..40_000).map(|i| (i as f32 * 0.61).cos() * 50.0).collect();
        x.extend([0.0, -0.0, 1e-40, -3e-39, f32::MAX, f32::INFINITY, -f32::INFINITY]);
        let Held::Bf16(bits) = Held::new(&x[..], Precision::Bf16) else {
            panic!("bf16 held as f32")
        };
        for (i, &b) in bits.iter().enumerate() {
            assert_eq!(to_bf16(b.widen()), b, "element {i} rounds again to other bits");
        }
    }

    #[test]
    fn f32_holds_the_values_themselves() {
        let x = [1.0f32 + f32::EPSILON, -2.5e-40, 3.0];
        let held = Held::new(&x[..], Precision::F32);
        assert!(matches!(&held, Held::F32(Cow::Borrowed(v)) if v[..] == x[..]));
        assert_eq!(held.len(), 3);
    }
}
