//! The one seeded PRNG of Keel's test tooling: SplitMix64.
//!
//! Owns [`Rng`]. A fault plan's `probability` rules draw from it, and so do the test kit's
//! crash schedules and `keel soak`'s workload and kill delays, which also build the fault
//! plans they play: one generator, so a seed means the same thing everywhere. Tiny,
//! well-distributed and fully determined by its seed; not for anything secret.

/// SplitMix64's increment (the golden gamma).
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// A deterministic generator: the same seed gives the same draws, on every machine.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator for a schedule's `seed` (the test kit's, `keel soak`'s): the seed mixed
    /// with the gamma first, so small consecutive seeds start far apart.
    pub fn new(seed: u64) -> Self {
        Self::from_state(seed ^ GAMMA)
    }

    /// A generator that starts at `state` itself: a fault plan's `seed` is its generator's
    /// state, which is what the recorded plans in `fixtures/` were written against.
    pub fn from_state(state: u64) -> Self {
        Self { state }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GAMMA);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` ≥ 1; `0` is taken as `1`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// True with probability `p`: never for `p` ≤ 0, always for `p` ≥ 1.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// A uniform draw in `[0, 1)`, from the top 53 bits so every value is an exact f64.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_and_the_two_seedings_differ_only_by_the_gamma() {
        let draws = |mut rng: Rng| (0..4).map(|_| rng.next_u64()).collect::<Vec<_>>();
        assert_eq!(draws(Rng::new(7)), draws(Rng::new(7)));
        assert_eq!(draws(Rng::new(7)), draws(Rng::from_state(7 ^ GAMMA)));
        assert_ne!(draws(Rng::new(7)), draws(Rng::from_state(7)));
    }

    #[test]
    fn splitmix64_from_zero_is_the_reference_sequence() {
        // The published first outputs of SplitMix64 seeded with 0.
        let mut rng = Rng::from_state(0);
        assert_eq!(rng.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(rng.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn chance_bounds_are_exact() {
        let mut rng = Rng::new(1);
        assert!((0..1_000).all(|_| !rng.chance(0.0)));
        assert!((0..1_000).all(|_| rng.chance(1.0)));
        assert!((0..1_000).all(|_| rng.below(3) < 3));
    }
}
