//! Deterministic instance generators for tests, benchmarks and fuzzing. They use their own
//! SplitMix64, so the same seed gives the same instance on every platform and dependency version.

use alloc::vec::Vec;

use crate::lifetime::BufferLifetime;

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
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(Self::GAMMA);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
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

/// An instance whose optimum is known: the rectangle `steps x height` (time x bytes) cut by random
/// guillotine cuts into `buffers` pieces, each piece a buffer. The pieces tile the rectangle, so
/// `height` bytes are alive at every step: the lower bound and the optimum are both `height`.
/// Buffers come in shuffled order with ids 0.. in that order. Needs `steps * height >= buffers`.
pub fn known_optimum(seed: u64, buffers: usize, steps: u32, height: u64) -> Vec<BufferLifetime> {
    guillotine(seed, buffers, steps, height)
        .iter()
        .enumerate()
        .map(|(id, &(t0, t1, a0, a1))| BufferLifetime { id: id as u64, lower: t0, upper: t1, size: a1 - a0 })
        .collect()
}

/// The generator's own placement of [`known_optimum`]`(seed, buffers, steps, height)`: each
/// buffer's offset in the tiling, in buffer order. Its peak is `height`, so it witnesses that the
/// optimum is `height` (tests check it with the placement checker).
pub fn known_optimum_offsets(seed: u64, buffers: usize, steps: u32, height: u64) -> Vec<u64> {
    guillotine(seed, buffers, steps, height).iter().map(|&(_, _, a0, _)| a0).collect()
}

/// The pieces `(t0, t1, a0, a1)` of [`known_optimum`], in its buffer order.
fn guillotine(seed: u64, buffers: usize, steps: u32, height: u64) -> Vec<(u32, u32, u64, u64)> {
    let mut rng = SplitMix64::new(seed);
    // (t0, t1, a0, a1) pieces.
    let mut pieces: Vec<(u32, u32, u64, u64)> = alloc::vec![(0, steps, 0, height)];
    let mut stuck = 0;
    while pieces.len() < buffers && stuck < 64 * buffers + 64 {
        let index = rng.below(pieces.len() as u64) as usize;
        let (t0, t1, a0, a1) = pieces[index];
        let can_time = t1 - t0 >= 2;
        let can_space = a1 - a0 >= 2;
        let cut_time = match (can_time, can_space) {
            (false, false) => {
                stuck += 1;
                continue;
            }
            (true, false) => true,
            (false, true) => false,
            (true, true) => rng.below(2) == 0,
        };
        if cut_time {
            let t = t0 + 1 + rng.below(u64::from(t1 - t0 - 1)) as u32;
            pieces[index] = (t0, t, a0, a1);
            pieces.push((t, t1, a0, a1));
        } else {
            let a = a0 + 1 + rng.below(a1 - a0 - 1);
            pieces[index] = (t0, t1, a0, a);
            pieces.push((t0, t1, a, a1));
        }
    }
    rng.shuffle(&mut pieces);
    pieces
}

/// The shape of a generated training step.
#[derive(Clone, Copy, Debug)]
pub struct StepShape {
    /// Transformer layers.
    pub layers: u32,
    /// Transient requests (mallocs) per layer, forward and backward together.
    pub transients_per_layer: u32,
    /// Skeletal tensors per layer (made in its forward, freed in its backward).
    pub skeletal_per_layer: u32,
    /// The activation size of the model, in bytes (tokens x hidden x 2 per GPU): most tensors are
    /// a small multiple or fraction of it.
    pub activation_bytes: u64,
}

/// A trace shaped like one training step of a transformer: long-lived weights, gradients and
/// optimizer state; per layer, skeletal tensors from its forward to its backward and many
/// short-lived transients; gradients that cross from one layer's backward to the next; sizes from
/// a few bytes (scalars, statistics) to several times the activation size (gigabytes at long
/// sequences). Returns the buffers in malloc order.
pub fn training_step(seed: u64, shape: StepShape) -> Vec<BufferLifetime> {
    let mut g = StepBuilder { rng: SplitMix64::new(seed), step: 0, buffers: Vec::new() };
    let act = shape.activation_bytes.max(64);
    // Weights, gradients, optimizer state: alive for the whole step.
    let mut persistent = Vec::new();
    for _ in 0..shape.layers * 3 + 4 {
        let size = g.size_around(act / 2);
        persistent.push(g.malloc(size));
    }
    g.transient_phase(shape.transients_per_layer / 4, act); // embedding
    let mut skeletal: Vec<Vec<usize>> = Vec::new();
    for _ in 0..shape.layers {
        let mut mine = Vec::new();
        for k in 0..shape.skeletal_per_layer {
            // Interleave the skeletal mallocs with the layer's transients.
            if k % 3 == 0 {
                g.transient_phase(shape.transients_per_layer / (2 * (shape.skeletal_per_layer / 3 + 1)), act);
            }
            let size = if g.rng.below(8) == 0 { g.rng.between(64, 1 << 16) } else { g.size_around(act) };
            mine.push(g.malloc(size));
        }
        skeletal.push(mine);
    }
    g.transient_phase(shape.transients_per_layer / 2, act); // chunked classifier and loss
    let mut carried: Option<usize> = None; // the activation gradient crossing layers
    for mine in skeletal.into_iter().rev() {
        let gradient = g.malloc(act);
        if let Some(previous) = carried.take() {
            g.free(previous);
        }
        let chunk = shape.transients_per_layer / (2 * (mine.len() as u32 + 1));
        for buffer in mine {
            g.transient_phase(chunk, act);
            g.free(buffer);
        }
        g.transient_phase(chunk, act);
        carried = Some(gradient);
    }
    if let Some(previous) = carried {
        g.free(previous);
    }
    g.transient_phase(shape.transients_per_layer / 4, act); // embedding backward, optimizer
    for buffer in persistent {
        g.free(buffer);
    }
    g.buffers
}

struct StepBuilder {
    rng: SplitMix64,
    step: u32,
    buffers: Vec<BufferLifetime>,
}

impl StepBuilder {
    fn malloc(&mut self, size: u64) -> usize {
        let id = self.buffers.len() as u64;
        self.buffers.push(BufferLifetime { id, lower: self.step, upper: u32::MAX, size });
        self.step += 1;
        self.buffers.len() - 1
    }

    fn free(&mut self, buffer: usize) {
        self.buffers[buffer].upper = self.step;
        self.step += 1;
    }

    /// A size within a factor of 4 of `around`, on a 512-byte grid as allocators round.
    fn size_around(&mut self, around: u64) -> u64 {
        let low = (around / 4).max(512);
        self.rng.between(low, around.max(low) * 4) / 512 * 512 + 512
    }

    /// `count` transient mallocs, each freed a few requests later, all freed at the end.
    fn transient_phase(&mut self, count: u32, act: u64) {
        let mut live: Vec<usize> = Vec::new();
        for _ in 0..count {
            let size = match self.rng.below(10) {
                0..=2 => self.rng.between(4, 4096),              // scalars, statistics, small tensors
                3..=4 => self.rng.between(4096, act / 8 + 4096), // per-head or per-chunk pieces
                _ => self.size_around(act),                      // full activations
            };
            live.push(self.malloc(size));
            // Free some live transients: mostly the oldest, as values die shortly after use.
            while !live.is_empty() && self.rng.below(100) < 45 {
                let pick = if self.rng.below(4) == 0 { self.rng.below(live.len() as u64) as usize } else { 0 };
                let buffer = live.remove(pick);
                self.free(buffer);
            }
        }
        for buffer in live {
            self.free(buffer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifetime::lower_bound;

    #[test]
    fn a_jumped_generator_continues_the_sequence() {
        let mut one_by_one = SplitMix64::new(42);
        let drawn: Vec<u64> = (0..100).map(|_| one_by_one.next_u64()).collect();
        for skip in [0usize, 1, 37, 99] {
            let mut jumped = SplitMix64::jumped(42, skip as u64);
            assert_eq!(jumped.next_u64(), drawn[skip], "after {skip} draws");
        }
    }

    #[test]
    fn known_optimum_tiles_the_rectangle() {
        for seed in 0..20 {
            let buffers = known_optimum(seed, 100, 200, 1000);
            assert_eq!(buffers.len(), 100);
            let area: u64 = buffers.iter().map(|b| u64::from(b.upper - b.lower) * b.size).sum();
            assert_eq!(area, 200 * 1000);
            assert_eq!(lower_bound(&buffers, 1), 1000);
        }
    }

    #[test]
    fn training_step_is_deterministic_and_well_formed() {
        let shape =
            StepShape { layers: 4, transients_per_layer: 100, skeletal_per_layer: 8, activation_bytes: 1 << 26 };
        let a = training_step(7, shape);
        assert_eq!(a, training_step(7, shape));
        assert!(a.iter().all(|b| b.lower < b.upper && b.upper != u32::MAX && b.size > 0));
        assert!(a.len() > 400);
    }
}
