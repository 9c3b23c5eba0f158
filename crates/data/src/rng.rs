//! A tiny, frozen pseudo-random generator.
//!
//! Resumed training must replay the exact batch order, and the embedded task must produce the
//! same sentences on every machine and every future build. External RNG crates are free to change
//! their streams between versions, so the data crate owns its generator: SplitMix64 (Steele,
//! Lea & Flood 2014), whose output is fully specified by the few lines below. It is not
//! cryptographic and does not need to be.

/// SplitMix64: 64 bits of state, one add and a finalising mix per output.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// The SplitMix64 finaliser: a bijective avalanche of one word.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Hashes a sequence of words into one seed, order-sensitively. Used to derive independent
/// streams from `(seed, epoch, position, ...)` without storing any generator state.
pub fn derive_seed(parts: &[u64]) -> u64 {
    let mut h = 0x6A09_E667_F3BC_C909_u64; // sqrt(2) fractional bits: an arbitrary non-zero start
    for &p in parts {
        h = mix64(h.wrapping_add(GOLDEN_GAMMA) ^ p);
    }
    h
}

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// A generator for the stream named by `parts` (see [`derive_seed`]).
    pub fn from_parts(parts: &[u64]) -> Self {
        Self::new(derive_seed(parts))
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN_GAMMA);
        mix64(self.state)
    }

    /// Uniform integer in `0..n` (Lemire's multiply-shift with rejection, so no modulo bias).
    /// Returns 0 when `n == 0` rather than panicking.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let threshold = n.wrapping_neg() % n;
        loop {
            let m = (self.next_u64() as u128) * (n as u128);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }

    /// Uniform index into a slice of length `n` (0 if empty).
    pub fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }

    /// True with probability `p` (53-bit resolution).
    pub fn chance(&mut self, p: f64) -> bool {
        let u = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        u < p
    }

    /// Picks one element uniformly. `items` must be non-empty (internal use on constant tables).
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.index(items.len())]
    }

    /// Fisher–Yates shuffle.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.index(i + 1);
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_is_frozen() {
        // Reference values of SplitMix64 seeded with 1234567 (from the published algorithm).
        let mut r = SplitMix64::new(1234567);
        assert_eq!(r.next_u64(), 6457827717110365317);
        assert_eq!(r.next_u64(), 3203168211198807973);
        assert_eq!(r.next_u64(), 9817491932198370423);
    }

    #[test]
    fn below_stays_in_range_and_handles_zero() {
        let mut r = SplitMix64::new(7);
        for n in 1..200u64 {
            for _ in 0..20 {
                assert!(r.below(n) < n);
            }
        }
        assert_eq!(r.below(0), 0);
    }

    #[test]
    fn shuffle_is_a_permutation() {
        let mut v: Vec<u32> = (0..1000).collect();
        SplitMix64::new(3).shuffle(&mut v);
        let mut s = v.clone();
        s.sort();
        assert_eq!(s, (0..1000).collect::<Vec<_>>());
        assert_ne!(v, s);
    }

    #[test]
    fn derived_seeds_differ_by_part_and_order() {
        assert_ne!(derive_seed(&[1, 2]), derive_seed(&[2, 1]));
        assert_ne!(derive_seed(&[1, 2]), derive_seed(&[1, 3]));
        assert_eq!(derive_seed(&[5, 6, 7]), derive_seed(&[5, 6, 7]));
    }
}
