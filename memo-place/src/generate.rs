//! Deterministic instance generators for tests, benchmarks and fuzzing. They draw from the
//! crate's own [`SplitMix64`] (`rng`), so the same seed gives the same instance on every platform
//! and dependency version.

use alloc::vec::Vec;

use crate::lifetime::BufferLifetime;
pub use crate::rng::SplitMix64;

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
        if !guillotine_cut(&mut rng, &mut pieces, index) {
            stuck += 1;
        }
    }
    rng.shuffle(&mut pieces);
    pieces
}

/// Cuts `pieces[index]` in two by a straight line across time or across space (a coin picks when
/// both fit), the left or lower part in place and the other pushed; `false` when the piece is one
/// step long and one byte tall. The generators' draws go through here, so a generator's instances
/// depend on the seed alone.
fn guillotine_cut(rng: &mut SplitMix64, pieces: &mut Vec<(u32, u32, u64, u64)>, index: usize) -> bool {
    let (t0, t1, a0, a1) = pieces[index];
    let cut_time = match (t1 - t0 >= 2, a1 - a0 >= 2) {
        (false, false) => return false,
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
    true
}

/// A perfect packing that no guillotine cut takes apart: the rectangle `steps x height` cut
/// recursively, each piece either by a guillotine cut or into a *pinwheel* (four pieces turning
/// around a fifth in the middle; no straight line crosses a pinwheel without cutting a piece), a
/// pinwheel chosen when the piece is big enough in both directions and a coin says so (half the
/// time). Like [`known_optimum`]: `height` bytes alive at every step, so the lower bound and the
/// optimum are both `height`; shuffled, ids 0.. in order. Flat splits (horizontal slabs) cannot
/// settle these: the exact search has to.
pub fn non_guillotine(seed: u64, buffers: usize, steps: u32, height: u64) -> Vec<BufferLifetime> {
    pieces_to_buffers(&tiling(seed, buffers, steps, height))
}

/// The tiling's own placement of [`non_guillotine`]`(seed, buffers, steps, height)` (its peak is
/// `height`).
pub fn non_guillotine_offsets(seed: u64, buffers: usize, steps: u32, height: u64) -> Vec<u64> {
    tiling(seed, buffers, steps, height).iter().map(|&(_, _, a0, _)| a0).collect()
}

/// A packing with holes: [`non_guillotine`] with `buffers + holes` pieces, of which `holes`
/// (chosen at random, never all) are deleted. Some steps then have fewer than `height` bytes
/// alive, so the lower bound may be below the optimum; the tiling's placement of the rest (see
/// [`with_holes_offsets`]) still fits in `height`, the best peak known. Shuffled, ids 0.. in order.
pub fn with_holes(seed: u64, buffers: usize, holes: usize, steps: u32, height: u64) -> Vec<BufferLifetime> {
    pieces_to_buffers(&holed(seed, buffers, holes, steps, height))
}

/// The tiling's placement of [`with_holes`]`(seed, buffers, holes, steps, height)`: peak at most
/// `height`.
pub fn with_holes_offsets(seed: u64, buffers: usize, holes: usize, steps: u32, height: u64) -> Vec<u64> {
    holed(seed, buffers, holes, steps, height).iter().map(|&(_, _, a0, _)| a0).collect()
}

fn holed(seed: u64, buffers: usize, holes: usize, steps: u32, height: u64) -> Vec<(u32, u32, u64, u64)> {
    let mut pieces = tiling(seed, buffers + holes, steps, height);
    // The tiling is shuffled already: deleting its first pieces deletes random ones. Keep at
    // least one.
    let keep_from = holes.min(pieces.len().saturating_sub(1));
    pieces.drain(..keep_from);
    pieces
}

fn pieces_to_buffers(pieces: &[(u32, u32, u64, u64)]) -> Vec<BufferLifetime> {
    pieces
        .iter()
        .enumerate()
        .map(|(id, &(t0, t1, a0, a1))| BufferLifetime { id: id as u64, lower: t0, upper: t1, size: a1 - a0 })
        .collect()
}

/// The pieces `(t0, t1, a0, a1)` of a tiling of `steps x height` into about `buffers` pieces (a
/// pinwheel adds four at once, so the count may pass `buffers` by up to three), shuffled. Half the
/// cuts of pieces at least 3 x 3 are pinwheels.
fn tiling(seed: u64, buffers: usize, steps: u32, height: u64) -> Vec<(u32, u32, u64, u64)> {
    let mut rng = SplitMix64::new(seed ^ 0x7069_6E77_6865_656C);
    let mut pieces: Vec<(u32, u32, u64, u64)> = alloc::vec![(0, steps, 0, height)];
    let mut stuck = 0;
    while pieces.len() < buffers && stuck < 64 * buffers + 64 {
        let index = rng.below(pieces.len() as u64) as usize;
        let (t0, t1, a0, a1) = pieces[index];
        let (long, tall) = (t1 - t0, a1 - a0);
        if long >= 3 && tall >= 3 && pieces.len() + 4 <= buffers + 3 && rng.below(2) == 0 {
            // Two inner time points and two inner heights; the centre is [x1, x2) x [y1, y2).
            let x1 = t0 + 1 + rng.below(u64::from(long - 2)) as u32;
            let x2 = x1 + 1 + rng.below(u64::from(t1 - x1 - 1)) as u32;
            let y1 = a0 + 1 + rng.below(tall - 2);
            let y2 = y1 + 1 + rng.below(a1 - y1 - 1);
            pieces[index] = (t0, x2, a0, y1); // bottom, from the left edge
            pieces.push((x2, t1, a0, y2)); // right, from the bottom
            pieces.push((x1, t1, y2, a1)); // top, to the right edge
            pieces.push((t0, x1, y1, a1)); // left, to the top
            pieces.push((x1, x2, y1, y2)); // centre
            continue;
        }
        if !guillotine_cut(&mut rng, &mut pieces, index) {
            stuck += 1;
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

/// The shape of a generated operator graph ([`operator_graph`]).
#[derive(Clone, Copy, Debug)]
pub struct GraphShape {
    /// Blocks (layers) of the model; the second half also takes long skip connections from the
    /// mirrored block of the first half (U-Net style).
    pub blocks: u32,
    /// Forward operators per block.
    pub ops_per_block: u32,
    /// The typical activation, in bytes; sizes reach 8 times it and go down to 4 bytes.
    pub activation_bytes: u64,
}

/// A trace shaped like the memory of a real model's training step, taken operator by operator (as
/// a framework's allocator sees it), less regular than [`training_step`]: each forward operator
/// reads the previous output and, often, a few earlier ones (fan-out), and each block's first one
/// also the previous block's first (a residual) or a mirrored block's output (a long skip);
/// inputs are kept for the backward pass half the time; the backward pass creates a gradient per
/// forward output (alive from its first consumer's backward to its own) and weight gradients kept
/// to the optimizer step; operators take workspaces for one step; weights live throughout. Sizes
/// run from 4 bytes to 8 activations, log-uniform within their kind. About 3.3 buffers per forward
/// operator; buffers in malloc order.
pub fn operator_graph(seed: u64, shape: GraphShape) -> Vec<BufferLifetime> {
    let mut rng = SplitMix64::new(seed ^ 0x6F70_6772_6170_6800);
    let act = shape.activation_bytes.max(1024);
    let ops = shape.blocks.max(1) * shape.ops_per_block.max(1);
    let per_block = shape.ops_per_block.max(1);
    let backward_step = |j: u32| 2 * ops - j; // forward j at step j, loss at `ops`
    let end = 2 * ops + 2; // the optimizer step
    let mut out: Vec<(u32, u32, u64)> = Vec::new(); // (lower, upper, size)
    for _ in 0..shape.blocks.max(1) * 2 {
        let size = log_uniform(&mut rng, act / 16, act * 2);
        out.push((0, end, size)); // weights
    }
    // Per forward operator: its output's buffer, and the last forward consumer.
    let mut output: Vec<usize> = Vec::with_capacity(ops as usize);
    let mut last_consumer: Vec<u32> = Vec::with_capacity(ops as usize);
    for j in 0..ops {
        let (block, k) = (j / per_block, j % per_block);
        let mut inputs: Vec<u32> = Vec::new();
        if j > 0 {
            inputs.push(j - 1);
        }
        for back in 2..6 {
            if j >= back && rng.below(10) < 2 {
                inputs.push(j - back);
            }
        }
        if k == 0 && block > 0 {
            inputs.push(j - per_block); // residual
            let mirrored = shape.blocks - 1 - block;
            if block >= shape.blocks / 2 && mirrored < block && rng.below(2) == 0 {
                inputs.push(mirrored * per_block + per_block - 1); // long skip
            }
        }
        for &i in &inputs {
            let buffer = output[i as usize];
            last_consumer[i as usize] = last_consumer[i as usize].max(j);
            out[buffer].1 = out[buffer].1.max(j + 1);
            if rng.below(2) == 0 {
                out[buffer].1 = out[buffer].1.max(backward_step(j) + 1); // saved for backward
            }
        }
        let size = operator_size(&mut rng, act);
        output.push(out.len());
        last_consumer.push(j);
        out.push((j, j + 1, size));
        if rng.below(2) == 0 {
            let size = log_uniform(&mut rng, 4, act);
            out.push((j, j + 1, size)); // workspace
        }
    }
    let last = output[ops as usize - 1];
    out[last].1 = out[last].1.max(ops + 1); // the loss reads the last output
    for j in (0..ops).rev() {
        let step = backward_step(j);
        // The gradient of j's output: from the backward of its last consumer to j's own.
        let from = if last_consumer[j as usize] > j { backward_step(last_consumer[j as usize]) } else { ops };
        let size = out[output[j as usize]].2;
        out.push((from, step + 1, size));
        if rng.below(2) == 0 {
            let size = log_uniform(&mut rng, 4, act);
            out.push((step, step + 1, size)); // workspace
        }
        if rng.below(10) < 3 {
            let size = log_uniform(&mut rng, act / 64, act);
            out.push((step, end, size)); // weight gradient, to the optimizer
        }
    }
    let mut buffers: Vec<BufferLifetime> =
        out.into_iter().map(|(lower, upper, size)| BufferLifetime { id: 0, lower, upper, size }).collect();
    // Malloc order: by start step, the order pushed within a step.
    buffers.sort_by_key(|b| b.lower);
    for (id, b) in buffers.iter_mut().enumerate() {
        b.id = id as u64;
    }
    buffers
}

/// The shape of a generated pipelined training step ([`pipelined_graph`]).
#[derive(Clone, Copy, Debug)]
pub struct PipelineShape {
    /// The graph of one micro-batch.
    pub graph: GraphShape,
    /// Micro-batches in flight together.
    pub micro_batches: u32,
    /// How many of its own operator steps each micro-batch starts after the previous one.
    pub stagger: u32,
}

/// Several micro-batches of [`operator_graph`] in flight at once, as pipeline-parallel training
/// runs them: micro-batch `m` is the graph of seed `seed + m` with its activations scaled by a
/// factor drawn from 1/2 to 2 (sequence lengths differ), started `m * stagger` of its steps after
/// the first, and the micro-batches' steps interleaved one by one; the weights (alive throughout)
/// are kept once. Lifetimes of different micro-batches then cross at every step and sizes mix, so
/// the allocation order leaves gaps a later buffer does not fit: the greedy orders end several
/// percent above the lower bound here, as on real traces (BENCHMARKS.md), where a single
/// [`operator_graph`] leaves them within half a percent. Buffers in malloc order, ids 0.. .
pub fn pipelined_graph(seed: u64, shape: PipelineShape) -> Vec<BufferLifetime> {
    let count = shape.micro_batches.max(1);
    let mut rng = SplitMix64::new(seed ^ 0x7069_7065_6C69_6E65);
    let global =
        |m: u32, t: u32| (t.saturating_add(m.saturating_mul(shape.stagger))).saturating_mul(count).saturating_add(m);
    let mut out: Vec<BufferLifetime> = Vec::new();
    for m in 0..count {
        let scale = rng.between(512, 2048);
        let graph = GraphShape {
            activation_bytes: (shape.graph.activation_bytes.max(1024) / 1024).saturating_mul(scale),
            ..shape.graph
        };
        let buffers = operator_graph(seed.wrapping_add(u64::from(m)), graph);
        let end = buffers.iter().map(|b| b.upper).max().unwrap_or(0);
        for b in buffers {
            let throughout = b.lower == 0 && b.upper == end;
            if throughout && m > 0 {
                continue; // weights: one copy, the first micro-batch's
            }
            let (lower, upper) =
                if throughout { (0, global(count - 1, end)) } else { (global(m, b.lower), global(m, b.upper - 1) + 1) };
            out.push(BufferLifetime { id: 0, lower, upper, size: b.size });
        }
    }
    out.sort_by_key(|b| b.lower);
    for (id, b) in out.iter_mut().enumerate() {
        b.id = id as u64;
    }
    out
}

/// An operator's output size: a full activation most often, the MLP's 4x, attention-sized
/// pieces up to 8x, per-head and per-chunk pieces, and scalars and statistics from 4 bytes.
fn operator_size(rng: &mut SplitMix64, act: u64) -> u64 {
    match rng.below(20) {
        0..=6 => log_uniform(rng, act / 2, act * 2),
        7..=8 => act * 4,
        9 => log_uniform(rng, act * 2, act * 8),
        10..=14 => log_uniform(rng, 64 << 10, act / 8),
        _ => log_uniform(rng, 4, 64 << 10),
    }
}

/// A value in `[low, high]` (`low >= 1`), uniform in its power-of-two range, the range uniform on a
/// log scale, rounded to 256 bytes from 4 KiB on (as allocators round).
fn log_uniform(rng: &mut SplitMix64, low: u64, high: u64) -> u64 {
    let low = low.max(1);
    let high = high.max(low);
    let (lo_bits, hi_bits) = (63 - low.leading_zeros(), 63 - high.leading_zeros());
    let bits = lo_bits + rng.below(u64::from(hi_bits - lo_bits + 1)) as u32;
    let value = (1u64 << bits) + rng.below(1u64 << bits);
    let value = value.clamp(low, high);
    if value >= 4096 {
        value / 256 * 256
    } else {
        value
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
    fn non_guillotine_tilings_are_perfect_and_their_witness_fits() {
        for seed in 0..10 {
            let buffers = non_guillotine(seed, 300, 1200, 1 << 20);
            assert!((300..=303).contains(&buffers.len()), "{}", buffers.len());
            let area: u64 = buffers.iter().map(|b| u64::from(b.upper - b.lower) * b.size).sum();
            assert_eq!(area, 1200 << 20);
            assert_eq!(lower_bound(&buffers, 1), 1 << 20);
            let offsets = non_guillotine_offsets(seed, 300, 1200, 1 << 20);
            crate::check::check_placement(&buffers, &offsets, 1, 1 << 20, Some(1 << 20)).unwrap();
        }
    }

    #[test]
    fn packings_with_holes_fit_their_witness() {
        for seed in 0..10 {
            let buffers = with_holes(seed, 300, 12, 1200, 1 << 20);
            let offsets = with_holes_offsets(seed, 300, 12, 1200, 1 << 20);
            let peak = buffers.iter().zip(&offsets).map(|(b, o)| o + b.size).max().unwrap();
            crate::check::check_placement(&buffers, &offsets, 1, peak, Some(1 << 20)).unwrap();
            assert!(lower_bound(&buffers, 1) <= 1 << 20);
        }
    }

    #[test]
    fn operator_graphs_are_deterministic_and_well_formed() {
        let shape = GraphShape { blocks: 24, ops_per_block: 80, activation_bytes: 1 << 28 };
        let a = operator_graph(1, shape);
        assert_eq!(a, operator_graph(1, shape));
        assert!(a.iter().all(|b| b.lower < b.upper && b.size >= 1));
        assert!(a.iter().any(|b| b.size < 64) && a.iter().any(|b| b.size >= 1 << 30));
        assert!((5_000..8_000).contains(&a.len()), "{}", a.len());
    }

    #[test]
    fn pipelined_graphs_are_deterministic_and_well_formed() {
        let graph = GraphShape { blocks: 2, ops_per_block: 20, activation_bytes: 1 << 28 };
        let shape = PipelineShape { graph, micro_batches: 4, stagger: 5 };
        let a = pipelined_graph(3, shape);
        assert_eq!(a, pipelined_graph(3, shape));
        assert!(a.iter().all(|b| b.lower < b.upper && b.size >= 1));
        assert!(a.iter().enumerate().all(|(i, b)| b.id == i as u64));
        assert!(a.windows(2).all(|w| w[0].lower <= w[1].lower), "malloc order");
        // The weights (4 per block pair, alive throughout) once, not once per micro-batch.
        let end = a.iter().map(|b| b.upper).max().unwrap();
        assert_eq!(a.iter().filter(|b| b.lower == 0 && b.upper == end).count(), 4);
        // Every micro-batch's other buffers, interleaved: each residue class of the steps is one
        // micro-batch, and all four are present.
        for m in 0..4 {
            assert!(a.iter().any(|b| b.lower % 4 == m && b.upper < end), "micro-batch {m}");
        }
        let one = operator_graph(3, graph).len();
        assert!(a.len() > 3 * one && a.len() < 5 * one, "{} vs {one}", a.len());
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
