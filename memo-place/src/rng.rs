//! The crate's random numbers: SplitMix64, for the search's shuffled restarts and the repair's
//! noise (and, re-exported by [`crate::generate`], for the instance generators). Its own, so the
//! same seed gives the same placements on every platform and dependency version.

/// SplitMix64 (Steele, Lea, Flood 2014): tiny, fast, and fully specified.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// The state's increment per draw (the golden ratio's fraction of 2^64).
    const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The generator seeded with `seed` after `draws` draws, in O(1): the state only counts, so
    /// a long sequence can be drawn in blocks on several threads with the same values.
    pub fn jumped(seed: u64, draws: u64) -> Self {
        SplitMix64(seed.wrapping_add(draws.wrapping_mul(Self::GAMMA)))
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(Self::GAMMA);
        mix(self.0)
    }

    /// A value in `[0, n)` (`n > 0`), by multiply-shift (bias below 2^-32 for the sizes used here).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// A value in `[low, high]`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high - low + 1)
    }

    /// Shuffles a slice (Fisher-Yates).
    pub fn shuffle<T>(&mut self, slice: &mut [T]) {
        for i in (1..slice.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            slice.swap(i, j);
        }
    }
}

/// SplitMix64's finaliser: mixes one 64-bit value into one that looks random.
#[inline]
pub(crate) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
