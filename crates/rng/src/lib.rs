//! Ember's one pseudo-random generator: SplitMix64 (Steele, Lea & Flood 2014).
//!
//! Exact reproducibility — bit-identical resume, paired ablations, the embedded task's sentences
//! on every machine and every future build — must not hinge on the internals of an external
//! crate, whose streams may change between versions. SplitMix64 is fully specified by the few
//! lines below: 64 bits of state that step by a constant, and a finalising mix per output. It
//! passes BigCrush; it is not cryptographic and does not need to be.
//!
//! Because the state only steps by a constant, draw i of a generator is
//! [`mix64`]`(state + i·`[`GAMMA`]`)`: the dropout kernels compute any draw directly, and a
//! generator is moved past n draws in O(1) ([`SplitMix64::skip`]).
//!
//! ```
//! use ember_rng::SplitMix64;
//! let (mut a, mut b) = (SplitMix64::new(42), SplitMix64::new(42));
//! assert_eq!(a.next_u64(), b.next_u64()); // one seed, one stream, on every machine
//! b.skip(99); // 99 draws further on, without drawing them
//! for _ in 0..99 {
//!     a.next_u64();
//! }
//! assert_eq!(a.next_u64(), b.next_u64());
//! assert!((0.0..1.0).contains(&a.uniform()));
//! ```

/// The constant SplitMix64's state steps by on every draw (the golden ratio in 64 bits).
pub const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// The SplitMix64 finaliser: a bijective avalanche of one word, i.e. the output for a state.
#[inline(always)]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Draw `i` (counting from 1) of a generator whose state is `state`, without stepping it.
#[inline(always)]
pub fn draw_at(state: u64, i: u64) -> u64 {
    mix64(state.wrapping_add(i.wrapping_mul(GAMMA)))
}

/// FNV-1a, 64-bit: a stable hash of a name (std's hasher is not stable across releases).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Hashes a sequence of words into one seed, order-sensitively. Used to derive independent
/// streams from `(seed, epoch, position, ...)` without storing any generator state.
pub fn derive_seed(parts: &[u64]) -> u64 {
    let mut h = 0x6A09_E667_F3BC_C909_u64; // sqrt(2) fractional bits: an arbitrary non-zero start
    for &p in parts {
        h = mix64(h.wrapping_add(GAMMA) ^ p);
    }
    h
}

/// SplitMix64: 64 bits of state, one add and a finalising mix per output, trivially serialisable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose state is `seed` (its first draw is `mix64(seed + GAMMA)`).
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// A generator for one named stream under a seed (e.g. a parameter's initial values):
    /// streams for different names are independent, and the stream for a name never depends on
    /// which other names exist.
    pub fn for_stream(seed: u64, name: &str) -> Self {
        let mut s = Self::new(seed ^ fnv1a64(name.as_bytes()));
        s.next_u64(); // decorrelate nearby seeds before first use
        s
    }

    /// A generator for the stream named by `parts` (see [`derive_seed`]).
    pub fn from_parts(parts: &[u64]) -> Self {
        Self::new(derive_seed(parts))
    }

    /// The current state: draw i after it is [`draw_at`]`(state, i)`.
    pub fn state(&self) -> u64 {
        self.state
    }

    /// Moves past `n` draws, exactly as `n` calls of [`next_u64`](Self::next_u64) would.
    pub fn skip(&mut self, n: u64) {
        self.state = self.state.wrapping_add(n.wrapping_mul(GAMMA));
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GAMMA);
        mix64(self.state)
    }

    /// Uniform in [0, 1) with 53 bits of precision.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Standard normal by the Box–Muller transform.
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform(); // (0, 1], keeps ln finite
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
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

    /// Pinned from the generator as it stood before the model and data crates shared it.
    const FROZEN_NAMED: u64 = 15146679580277642971;
    const FROZEN_NORMAL: u64 = 4607078604814668328;

    #[test]
    fn named_streams_and_normals_are_frozen() {
        // Initial weights come from these streams: changing them changes every result.
        let mut r = SplitMix64::for_stream(42, "decoder.layers.0.self_attn.q_proj.weight");
        assert_eq!(r.next_u64(), FROZEN_NAMED);
        let mut r = SplitMix64::new(7);
        assert_eq!(r.normal().to_bits(), FROZEN_NORMAL);
    }

    #[test]
    fn draws_can_be_computed_directly_and_skipped() {
        let mut a = SplitMix64::new(99);
        let direct: Vec<u64> = (1..=5).map(|i| draw_at(a.state(), i)).collect();
        let stepped: Vec<u64> = (0..5).map(|_| a.next_u64()).collect();
        assert_eq!(direct, stepped);
        let (mut b, mut c) = (SplitMix64::new(3), SplitMix64::new(3));
        b.skip(1000);
        for _ in 0..1000 {
            c.next_u64();
        }
        assert_eq!(b, c);
    }

    #[test]
    fn streams_are_reproducible_and_distinct() {
        let a: Vec<u64> = (0..4)
            .map(|_| SplitMix64::for_stream(7, "w").next_u64())
            .collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        assert_ne!(
            SplitMix64::for_stream(7, "w").next_u64(),
            SplitMix64::for_stream(7, "v").next_u64()
        );
    }

    #[test]
    fn normal_has_unit_moments() {
        let mut r = SplitMix64::new(1);
        let xs: Vec<f64> = (0..200_000).map(|_| r.normal()).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.01, "var {var}");
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
