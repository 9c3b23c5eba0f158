//! A tiny, version-proof random generator for initialisation and dropout.
//!
//! Exact reproducibility (bit-identical resume, paired ablations) must not hinge on the
//! internals of an external crate's generator, so Ember uses SplitMix64 (Steele et al. 2014),
//! whose whole definition is the dozen lines below.

/// The constant SplitMix64's state steps by on every draw.
pub const SPLITMIX_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output for a given state: the i-th draw (counting from 1) of a generator at
/// state s is `splitmix64_output(s + i·SPLITMIX_GAMMA)`, which lets the dropout kernel compute
/// any draw directly.
#[inline(always)]
pub fn splitmix64_output(state: u64) -> u64 {
    let mut z = state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// SplitMix64: 64 bits of state, passes BigCrush, trivially serialisable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitMix64 {
    pub state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// A generator for one named stream under a seed: streams for different names are
    /// independent, and the stream for a name never depends on which other names exist.
    pub fn for_stream(seed: u64, name: &str) -> Self {
        let mut s = Self::new(seed ^ fnv1a64(name.as_bytes()));
        s.next_u64(); // decorrelate nearby seeds before first use
        s
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(SPLITMIX_GAMMA);
        splitmix64_output(self.state)
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
}

/// FNV-1a, 64-bit: a stable hash of a parameter name (std's hasher is not stable across releases).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
