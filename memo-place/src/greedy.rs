//! The greedy portfolio: several buffer orderings, each placed buffer by buffer at a gap among the
//! buffers already placed that share a step with it (the tightest gap that fits, or the lowest);
//! the lowest peak wins (ties go to the earlier entry of the portfolio, so the result is
//! deterministic).
//!
//! The orderings are the ones that work well on allocation traces: highest contention (most bytes
//! alive during the buffer's lifetime) first, largest first, longest first, largest area first,
//! most conflicts first, and the order of start steps as a program allocates; and the classic
//! orders (`classic_order`), which `solve` also runs on the whole instance. The start order runs
//! as a sweep that needs no overlap graph (the free gaps in ordered sets, O(n log n)), so it also
//! serves components too dense to build one for, with its time-reversed and first-fit variants.

use alloc::collections::BTreeMap;
use alloc::vec;
use alloc::vec::Vec;

use super::control::Control;
use super::sections::Sections;
use super::timetree::TimeTree;
use super::Item;
use crate::rng::SplitMix64;
use crate::tuning::*;

/// The overlap graph of a component, in compressed rows over local indices (positions in the
/// component's member list).
pub(crate) struct Overlaps {
    row_start: Vec<usize>,
    neighbours: Vec<u32>,
}

impl Overlaps {
    /// The number of overlapping pairs, in O(n log n) without building anything: each buffer, in
    /// start order, overlaps the earlier-starting ones that have not ended by its start.
    pub(crate) fn pair_count(items: &[Item], members: &[u32]) -> u64 {
        let mut lowers: Vec<u32> = members.iter().map(|&m| items[m as usize].lower).collect();
        let mut uppers: Vec<u32> = members.iter().map(|&m| items[m as usize].upper).collect();
        lowers.sort_unstable();
        uppers.sort_unstable();
        let mut pairs = 0u64;
        for (position, &lower) in lowers.iter().enumerate() {
            // Earlier in start order (ties: any fixed order counts each pair once), minus those
            // ended by this start (an end <= start means no shared step).
            let ended = uppers.partition_point(|&u| u <= lower);
            pairs += (position as u64).saturating_sub(ended as u64);
        }
        pairs
    }

    /// Builds the graph, or `None` if it would have more than `pair_limit` pairs (counted first,
    /// so a graph too large costs no memory).
    pub(crate) fn build(items: &[Item], members: &[u32], pair_limit: usize) -> Option<Overlaps> {
        Self::build_polled(items, members, pair_limit, None)
    }

    /// [`Overlaps::build`], polling `control` every [`GREEDY_POLL_EVERY`] buffers and every
    /// [`PAIRS_PER_POLL`] pairs (a graph of tens of millions of pairs takes a large share of a
    /// second to build); `None` also when it stopped the build, or had stopped the solve already.
    pub(crate) fn build_polled(
        items: &[Item],
        members: &[u32],
        pair_limit: usize,
        mut control: Option<&mut Control>,
    ) -> Option<Overlaps> {
        let mut stop = |at: usize, every: usize| -> bool {
            control.as_deref_mut().is_some_and(|c| if at % every == every - 1 { c.poll() } else { c.stopped() })
        };
        // Polled before anything, so a stopped solve skips even the count.
        if stop(0, 1) || Self::pair_count(items, members) > pair_limit as u64 {
            return None;
        }
        let mut by_lower: Vec<u32> = (0..members.len() as u32).collect();
        by_lower.sort_unstable_by_key(|&l| (items[members[l as usize] as usize].lower, l));
        let mut pairs: Vec<(u32, u32)> = Vec::new();
        let mut active: Vec<u32> = Vec::new();
        for (position, &local) in by_lower.iter().enumerate() {
            if stop(position, GREEDY_POLL_EVERY) {
                return None;
            }
            let item = &items[members[local as usize] as usize];
            active.retain(|&other| items[members[other as usize] as usize].upper > item.lower);
            if pairs.len() + active.len() > pair_limit {
                return None;
            }
            pairs.extend(active.iter().map(|&other| (other, local)));
            active.push(local);
        }
        let mut degree = vec![0usize; members.len() + 1];
        for (chunk, part) in pairs.chunks(PAIRS_PER_POLL).enumerate() {
            if chunk > 0 && stop(chunk, 1) {
                return None;
            }
            for &(a, b) in part {
                degree[a as usize] += 1;
                degree[b as usize] += 1;
            }
        }
        let mut row_start = Vec::with_capacity(members.len() + 1);
        let mut total = 0;
        for d in &degree[..members.len()] {
            row_start.push(total);
            total += d;
        }
        row_start.push(total);
        let mut fill = row_start.clone();
        let mut neighbours = vec![0u32; total];
        for (chunk, part) in pairs.chunks(PAIRS_PER_POLL).enumerate() {
            if chunk > 0 && stop(chunk, 1) {
                return None;
            }
            for &(a, b) in part {
                neighbours[fill[a as usize]] = b;
                fill[a as usize] += 1;
                neighbours[fill[b as usize]] = a;
                fill[b as usize] += 1;
            }
        }
        for l in 0..members.len() {
            if stop(l, GREEDY_POLL_EVERY) {
                return None;
            }
            neighbours[row_start[l]..row_start[l + 1]].sort_unstable();
        }
        Some(Overlaps { row_start, neighbours })
    }

    /// The local indices of the members overlapping `local` in time, ascending.
    pub(crate) fn of(&self, local: usize) -> &[u32] {
        &self.neighbours[self.row_start[local]..self.row_start[local + 1]]
    }

    /// The number of neighbours of `local`.
    pub(crate) fn degree(&self, local: usize) -> usize {
        self.row_start[local + 1] - self.row_start[local]
    }
}

/// Where a greedy run puts each buffer among the gaps that fit it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Fit {
    /// The smallest gap that fits (ties: the lowest).
    Best,
    /// The lowest gap that fits.
    First,
}

/// A placement of one component, offsets relative to its base, in units.
#[derive(Clone, Debug)]
pub(crate) struct ComponentPlacement {
    pub offsets: Vec<u64>,
    pub peak: u64,
}

/// Runs the portfolio on one component and returns the best placement found, starting with
/// [`first_placement`] (so there is always one); `control` is polled before each further order
/// and every [`GREEDY_POLL_EVERY`] buffers inside it (a large component takes seconds over all of
/// them), and a stop drops the order under way and keeps the best so far.
pub(crate) fn best_greedy(
    items: &[Item],
    members: &[u32],
    first: ComponentPlacement,
    overlaps: Option<&Overlaps>,
    sections: &Sections,
    control: &mut Control,
) -> ComponentPlacement {
    let mut best = first;
    // Only a strictly lower peak replaces the best so far, so once it is at the lower bound the
    // orders left cannot change the answer (each costs a pass over the overlap graph).
    let lower_bound = sections.lower_bound();
    let settled = |best: &ComponentPlacement| best.peak <= lower_bound;
    if settled(&best) {
        return best;
    }
    let Some(overlaps) = overlaps else {
        // Too dense for a graph: the other sweeps that need none, time reversed (by end, latest
        // first) and first fit, each O(n log n).
        for (reversed, fit) in [(true, Fit::Best), (false, Fit::First), (true, Fit::First)] {
            if control.poll() {
                break;
            }
            match sweep(items, members, reversed, fit, Some(&mut *control)) {
                Some(candidate) if candidate.peak < best.peak => best = candidate,
                Some(_) => {}
                None => break,
            }
            if settled(&best) {
                break;
            }
        }
        return best;
    };
    let n = members.len();
    let item = |l: usize| &items[members[l] as usize];
    let length = |l: usize| u64::from(item(l).upper - item(l).lower);
    let contention: Vec<u64> = (0..n).map(|l| sections.max_total_over(item(l))).collect();

    type Key<'k> = &'k dyn Fn(usize) -> (u128, u64, u64);
    let orders: [(Key, &[Fit]); 10] = [
        (&|l| (u128::from(contention[l]), item(l).size, length(l)), &[Fit::Best, Fit::First]),
        (&|l| (u128::from(item(l).size), length(l), 0), &[Fit::Best, Fit::First]),
        (&|l| (u128::from(length(l)), item(l).size, 0), &[Fit::Best, Fit::First]),
        (&|l| (u128::from(contention[l]), length(l), item(l).size), &[Fit::Best, Fit::First]),
        // Start order, as a program allocates (larger first among equal starts), first fit.
        (&|l| (u128::from(u32::MAX - item(l).lower), item(l).size, 0), &[Fit::First]),
        (&|l| (u128::from(item(l).size) * u128::from(length(l)), item(l).size, 0), &[Fit::Best]),
        (&|l| (overlaps.degree(l) as u128, item(l).size, 0), &[Fit::Best]),
        // The classic orders not among the above (see `classic_order`).
        (&|l| (u128::from(item(l).size), u64::from(u32::MAX - item(l).lower), 0), &[Fit::Best, Fit::First]),
        (&|l| (u128::from(u32::MAX - item(l).lower), item(l).size, 0), &[Fit::Best]),
        (&|l| (u128::from(item(l).size) * u128::from(length(l)), item(l).size, 0), &[Fit::First]),
    ];
    // Each order is sorted only when its turn comes, so a stop skips the sorting too.
    for (key, fits) in orders {
        if control.poll() {
            break;
        }
        let mut ordering: Vec<u32> = (0..n as u32).collect();
        // Descending keys, then the local index: a total order.
        ordering.sort_unstable_by(|&a, &b| key(b as usize).cmp(&key(a as usize)).then(a.cmp(&b)));
        for &fit in fits {
            if control.poll() {
                return best;
            }
            match in_order(items, members, Some(overlaps), &ordering, fit, control) {
                Some(candidate) if candidate.peak < best.peak => best = candidate,
                Some(_) => {}
                None => return best,
            }
            if settled(&best) {
                return best;
            }
        }
    }
    best
}

/// How many classic orders there are ([`classic_order`]).
const CLASSIC_ORDERS: usize = 4;

/// The `k`-th of the classic orders of the literature, each run with best fit and first fit: size
/// descending (then start ascending), lifetime descending (then size descending), start ascending
/// (then size descending), area descending (then size descending); remaining ties by index.
/// `solve` runs them on the whole instance too (before any reduction), so its answer is never
/// worse than any of them.
fn classic_order(items: &[Item], members: &[u32], k: usize) -> Vec<u32> {
    let n = members.len();
    let item = |l: usize| &items[members[l] as usize];
    let length = |l: usize| u64::from(item(l).upper - item(l).lower);
    let keys: [&dyn Fn(usize) -> (u128, u64); CLASSIC_ORDERS] = [
        &|l| (u128::from(item(l).size), u64::from(u32::MAX - item(l).lower)),
        &|l| (u128::from(length(l)), item(l).size),
        &|l| (u128::from(u32::MAX - item(l).lower), item(l).size),
        &|l| (u128::from(item(l).size) * u128::from(length(l)), item(l).size),
    ];
    let key = keys[k];
    let mut o: Vec<u32> = (0..n as u32).collect();
    // Descending keys, then the index: a total order.
    o.sort_unstable_by(|&a, &b| key(b as usize).cmp(&key(a as usize)).then(a.cmp(&b)));
    o
}

/// The best of the classic orders ([`classic_order`], first fit, then best fit) on `members`, or
/// `None` if `control` stopped it before the first finished. Each order costs `members.len()`
/// nodes from `nodes_left` and starts only while they are left.
pub(crate) fn best_classic(
    items: &[Item],
    members: &[u32],
    overlaps: Option<&Overlaps>,
    nodes_left: &mut u64,
    control: &mut Control,
) -> Option<ComponentPlacement> {
    let cost = members.len() as u64;
    let mut best: Option<ComponentPlacement> = None;
    for k in 0..CLASSIC_ORDERS {
        if control.poll() || *nodes_left < cost {
            return best;
        }
        // Sorted only when its turn comes, so a stop skips the sorting too.
        let ordering = classic_order(items, members, k);
        for fit in [Fit::First, Fit::Best] {
            if control.poll() || *nodes_left < cost {
                return best;
            }
            *nodes_left -= cost;
            match in_order(items, members, overlaps, &ordering, fit, control) {
                Some(candidate) if best.as_ref().is_none_or(|b| candidate.peak < b.peak) => best = Some(candidate),
                Some(_) => {}
                None => return best, // stopped
            }
        }
    }
    best
}

/// The peak of every classic order ([`classic_order`]) with best fit, then first fit, each over a
/// tree of lifetimes ([`in_order`] without a graph); `None` if `control` stopped one.
pub(crate) fn classic_peaks(items: &[Item], members: &[u32], control: &mut Control) -> Option<Vec<u64>> {
    let mut peaks = Vec::with_capacity(2 * CLASSIC_ORDERS);
    for k in 0..CLASSIC_ORDERS {
        let ordering = classic_order(items, members, k);
        for fit in [Fit::Best, Fit::First] {
            peaks.push(in_order(items, members, None, &ordering, fit, control)?.peak);
        }
    }
    Some(peaks)
}

/// Places members in `order`, each at a gap among its already placed neighbours (from the overlap
/// graph when there is one, else from a [`TimeTree`] of the placed ranges, which gives their
/// union: the same gaps); `None` if `control` stopped it first.
pub(crate) fn in_order(
    items: &[Item],
    members: &[u32],
    overlaps: Option<&Overlaps>,
    order: &[u32],
    fit: Fit,
    control: &mut Control,
) -> Option<ComponentPlacement> {
    const UNPLACED: u64 = u64::MAX;
    let mut offsets = vec![UNPLACED; members.len()];
    let mut peak = 0;
    let mut taken: Vec<(u64, u64)> = Vec::new();
    let mut tree = if overlaps.is_none() { Some(TimeTree::new(items, members)) } else { None };
    // Neighbours looked at since the last poll: on a dense component a few buffers take as long as
    // thousands on a sparse one.
    let mut work = 0;
    for (placed, &local) in order.iter().enumerate() {
        if (placed % GREEDY_POLL_EVERY == GREEDY_POLL_EVERY - 1 || work > PAIRS_PER_POLL) && control.poll() {
            return None;
        }
        if work > PAIRS_PER_POLL {
            work = 0;
        }
        let item = &items[members[local as usize] as usize];
        let offset = match (overlaps, tree.as_mut()) {
            (Some(graph), _) => {
                taken.clear();
                for &other in graph.of(local as usize) {
                    let offset = offsets[other as usize];
                    if offset != UNPLACED {
                        taken.push((offset, offset + items[members[other as usize] as usize].size));
                    }
                }
                work += taken.len();
                taken.sort_unstable();
                choose_gap(&taken, item.size, fit)
            }
            (None, Some(tree)) => {
                let (offset, read) = tree.fit(item, item.size, fit);
                work += read;
                tree.insert(item, offset, offset + item.size);
                offset
            }
            (None, None) => unreachable!("a tree is built whenever there is no graph"),
        };
        offsets[local as usize] = offset;
        peak = peak.max(offset + item.size);
    }
    Some(ComponentPlacement { offsets, peak })
}

/// The offset for a buffer of `size` among the `taken` ranges (sorted by start): the gap `fit`
/// chooses, or the top of the highest range when no gap fits.
pub(crate) fn choose_gap(taken: &[(u64, u64)], size: u64, fit: Fit) -> u64 {
    let mut cursor = 0u64;
    let mut chosen: Option<(u64, u64)> = None; // (gap size, offset)
    for &(start, end) in taken {
        if start > cursor {
            let gap = start - cursor;
            if gap >= size {
                match fit {
                    Fit::First => return cursor,
                    Fit::Best => {
                        if chosen.is_none_or(|(best_gap, _)| gap < best_gap) {
                            chosen = Some((gap, cursor));
                        }
                    }
                }
            }
        }
        cursor = cursor.max(end);
    }
    chosen.map_or(cursor, |(_, offset)| offset)
}

/// The first placement of a component, the online order: by start step (frees before allocations
/// at the same step, larger first among equal starts), each buffer at the best-fitting gap among
/// the buffers alive then. Needs no overlap graph, and no scan of the live buffers: the buffers
/// alive at a start step all share that step, so their ranges are disjoint, and the free gaps
/// between them are kept in a set by (size, offset) (best fit: the first of at least the size),
/// updated as buffers end. O(n log n). Polls `control` every [`GREEDY_POLL_EVERY`] buffers like
/// every other sweep, with `Progress::first_placement` set (and asking afresh even after an
/// earlier stop: `Control::first_placement`); stopped before its end (a time limit
/// shorter than the sweep of a large component), it gives [`stacked`] instead: a poor placement,
/// but one that costs nothing, so a solve can end when it is told to however large its input.
pub(crate) fn first_placement(items: &[Item], members: &[u32], control: &mut Control) -> ComponentPlacement {
    control
        .first_placement(|control| sweep_forward(items, members, Fit::Best, None, None, u32::MAX, Some(control)))
        .unwrap_or_else(|| stacked(items, members))
}

/// The start-order sweep of [`first_placement`], never stopped.
#[cfg(test)]
pub(crate) fn by_start(items: &[Item], members: &[u32]) -> ComponentPlacement {
    match sweep_forward(items, members, Fit::Best, None, None, u32::MAX, None) {
        Some(placement) => placement,
        None => unreachable!("a sweep without a stop callback always completes"),
    }
}

/// Every buffer at its own offset, one above the other in member order: valid whatever the
/// lifetimes (no two buffers share an offset range), with the sum of the sizes as its peak.
pub(crate) fn stacked(items: &[Item], members: &[u32]) -> ComponentPlacement {
    let mut peak = 0u64;
    let offsets = members
        .iter()
        .map(|&m| {
            let offset = peak;
            peak += items[m as usize].size;
            offset
        })
        .collect();
    ComponentPlacement { offsets, peak }
}

/// The start-order sweep of [`first_placement`] with a choice of fit, or over reversed time (buffers by
/// end, latest first: a placement valid backwards in time is valid forwards); polls `control`
/// every [`GREEDY_POLL_EVERY`] buffers, `None` if it stopped the sweep.
fn sweep(
    items: &[Item],
    members: &[u32],
    reversed: bool,
    fit: Fit,
    control: Option<&mut Control>,
) -> Option<ComponentPlacement> {
    if !reversed {
        return sweep_forward(items, members, fit, None, None, u32::MAX, control);
    }
    // Time t becomes u32::MAX - t: lifetimes [lower, upper) become [MAX - upper, MAX - lower).
    let mirrored: Vec<Item> = members
        .iter()
        .map(|&m| {
            let item = &items[m as usize];
            Item { lower: u32::MAX - item.upper, upper: u32::MAX - item.lower, size: item.size }
        })
        .collect();
    let identity: Vec<u32> = (0..members.len() as u32).collect();
    sweep_forward(&mirrored, &identity, fit, None, None, u32::MAX, control)
}

/// The forward best-fit sweep with `noise` that keeps the offsets `kept` (a valid placement of
/// `members`) of every buffer starting before step `from`. With noise, each best-fit choice passes
/// over the tightest fitting gap for the next one with probability 1/8 (repeatedly), so every run
/// differs a little (`repair`'s rounds; 1/4 and 1/16 did as well on the pipelined graphs, 1/2 found
/// nothing better than the plain sweep); the noise only touches the buffers starting up to step
/// `noise_until` (the later ones get the plain best fit). Polls `control` every
/// [`GREEDY_POLL_EVERY`] buffers; `None` if it stopped the sweep.
pub(crate) fn sweep_from(
    items: &[Item],
    members: &[u32],
    noise: &mut SplitMix64,
    kept: &[u64],
    from: u32,
    noise_until: u32,
    control: &mut Control,
) -> Option<ComponentPlacement> {
    sweep_forward(items, members, Fit::Best, Some(noise), Some((kept, from)), noise_until, Some(control))
}

/// The members' positions by start step, larger first among equal starts, then by position (a
/// total order: the sweep is deterministic).
fn start_order(items: &[Item], members: &[u32]) -> Vec<u32> {
    let mut order: Vec<u32> = (0..members.len() as u32).collect();
    order.sort_unstable_by(|&a, &b| {
        let (x, y) = (&items[members[a as usize] as usize], &items[members[b as usize] as usize]);
        x.lower.cmp(&y.lower).then(y.size.cmp(&x.size)).then(a.cmp(&b))
    });
    order
}

/// The live state of a forward sweep: the ranges alive (offset -> end), the free gaps between
/// them below the highest end, as (size, offset) for best fit and, for first fit only, by offset;
/// and the ends to come (step, offset), earliest first.
struct Live {
    ranges: BTreeMap<u64, u64>,
    gaps: alloc::collections::BTreeSet<(u64, u64)>,
    by_offset: Option<GapTree>,
    ending: alloc::collections::BinaryHeap<core::cmp::Reverse<(u32, u64)>>,
}

impl Live {
    fn new(fit: Fit) -> Live {
        Live {
            ranges: BTreeMap::new(),
            gaps: alloc::collections::BTreeSet::new(),
            by_offset: (fit == Fit::First).then(GapTree::new),
            ending: alloc::collections::BinaryHeap::new(),
        }
    }

    fn open_gap(&mut self, offset: u64, size: u64) {
        self.gaps.insert((size, offset));
        if let Some(tree) = &mut self.by_offset {
            tree.insert(offset, size);
        }
    }

    fn close_gap(&mut self, offset: u64, size: u64) {
        self.gaps.remove(&(size, offset));
        if let Some(tree) = &mut self.by_offset {
            tree.remove(offset);
        }
    }

    /// A range `[offset, end)` alive until step `upper`.
    fn add(&mut self, offset: u64, end: u64, upper: u32) {
        self.ranges.insert(offset, end);
        self.ending.push(core::cmp::Reverse((upper, offset)));
    }

    /// Ends every range whose buffer ends by step `step`, merging the gaps around it.
    fn end_until(&mut self, step: u32) {
        while let Some(&core::cmp::Reverse((upper, offset))) = self.ending.peek() {
            if upper > step {
                break;
            }
            self.ending.pop();
            let end = self.ranges.remove(&offset).unwrap_or(offset);
            let below = self.ranges.range(..offset).next_back().map_or(0, |(_, &e)| e);
            let above = self.ranges.range(end..).next().map(|(&start, _)| start);
            if below < offset {
                self.close_gap(below, offset - below);
            }
            if let Some(above) = above {
                if end < above {
                    self.close_gap(end, above - end);
                }
                self.open_gap(below, above - below);
            }
        }
    }

    /// The live state at step `from` of a placement whose buffers starting before it keep
    /// `kept` (the first `count` of `order`); records their offsets in `offsets`, returns their peak.
    fn keep(
        &mut self,
        (items, members): (&[Item], &[u32]),
        order: &[u32],
        kept: &[u64],
        from: u32,
        offsets: &mut [u64],
    ) -> u64 {
        let mut peak = 0;
        let mut live: Vec<(u64, u64, u32)> = Vec::new();
        for &local in order.iter().take_while(|&&l| items[members[l as usize] as usize].lower < from) {
            let item = &items[members[local as usize] as usize];
            let offset = kept[local as usize];
            offsets[local as usize] = offset;
            peak = peak.max(offset + item.size);
            if item.upper > from {
                live.push((offset, offset + item.size, item.upper));
            }
        }
        live.sort_unstable();
        let mut cursor = 0;
        for &(offset, end, upper) in &live {
            if offset > cursor {
                self.open_gap(cursor, offset - cursor);
            }
            cursor = cursor.max(end);
            self.add(offset, end, upper);
        }
        peak
    }

    /// The gap for a buffer of `size`: best fit (with `noise`, passing over the tightest with
    /// probability 1/8, repeatedly) or first fit; `None` if none fits.
    fn choose(&self, size: u64, noise: Option<&mut SplitMix64>) -> Option<(u64, u64)> {
        if let Some(tree) = &self.by_offset {
            return tree.first_fit(size);
        }
        let mut fitting = self.gaps.range((size, 0)..);
        let mut chosen = fitting.next().copied();
        if let Some(rng) = noise {
            while chosen.is_some() && rng.below(8) == 0 {
                match fitting.next() {
                    Some(&next) => chosen = Some(next),
                    None => break,
                }
            }
        }
        chosen
    }
}

/// The forward sweep; with `keep` = (offsets, step), the buffers starting before that step keep
/// the given offsets (a valid placement's) and only the later ones are placed by the sweep. With
/// `control`, polled every [`GREEDY_POLL_EVERY`] buffers: `None` if it stopped the sweep.
fn sweep_forward(
    items: &[Item],
    members: &[u32],
    fit: Fit,
    mut noise: Option<&mut SplitMix64>,
    keep: Option<(&[u64], u32)>,
    noise_until: u32,
    mut control: Option<&mut Control>,
) -> Option<ComponentPlacement> {
    let order = start_order(items, members);
    let mut offsets = vec![0u64; members.len()];
    let mut live = Live::new(fit);
    let mut peak = keep.map_or(0, |(kept, from)| live.keep((items, members), &order, kept, from, &mut offsets));
    for (position, &local) in order.iter().enumerate() {
        if position % GREEDY_POLL_EVERY == GREEDY_POLL_EVERY - 1 && control.as_deref_mut().is_some_and(Control::poll) {
            return None;
        }
        let item = &items[members[local as usize] as usize];
        live.end_until(item.lower);
        if keep.is_some_and(|(_, from)| item.lower < from) {
            continue; // kept, and in the live state already
        }
        let top = live.ranges.iter().next_back().map_or(0, |(_, &e)| e);
        let offset = match live.choose(item.size, noise.as_deref_mut().filter(|_| item.lower <= noise_until)) {
            Some((size, offset)) => {
                live.close_gap(offset, size);
                if size > item.size {
                    live.open_gap(offset + item.size, size - item.size);
                }
                offset
            }
            None => top,
        };
        offsets[local as usize] = offset;
        peak = peak.max(offset + item.size);
        live.add(offset, offset + item.size, item.upper);
    }
    Some(ComponentPlacement { offsets, peak })
}

/// The free gaps of a first-fit sweep by offset, each subtree knowing its largest gap: the lowest
/// gap of at least a size in O(log n) (a treap over a vector, priorities from a fixed seed, so it
/// is deterministic). A scan over the gaps by offset cost the first-fit sweeps of a 100k-buffer
/// pipelined graph thousands of gaps a buffer (0.2-0.4 s a sweep, against 0.1 s for best fit).
struct GapTree {
    nodes: Vec<GapNode>,
    /// Slots of removed nodes, reused.
    free: Vec<u32>,
    root: u32,
    priorities: SplitMix64,
}

#[derive(Clone, Copy)]
struct GapNode {
    offset: u64,
    size: u64,
    /// The largest size in this subtree.
    most: u64,
    priority: u64,
    left: u32,
    right: u32,
}

/// No node.
const NIL: u32 = u32::MAX;

impl GapTree {
    fn new() -> Self {
        GapTree { nodes: Vec::new(), free: Vec::new(), root: NIL, priorities: SplitMix64::new(0x6A95) }
    }

    fn most(&self, node: u32) -> u64 {
        if node == NIL {
            0
        } else {
            self.nodes[node as usize].most
        }
    }

    fn update(&mut self, node: u32) {
        let GapNode { size, left, right, .. } = self.nodes[node as usize];
        self.nodes[node as usize].most = size.max(self.most(left)).max(self.most(right));
    }

    /// Splits `node`'s subtree into the gaps below `offset` and those at or above it.
    fn split(&mut self, node: u32, offset: u64) -> (u32, u32) {
        if node == NIL {
            return (NIL, NIL);
        }
        if self.nodes[node as usize].offset < offset {
            let (low, high) = self.split(self.nodes[node as usize].right, offset);
            self.nodes[node as usize].right = low;
            self.update(node);
            (node, high)
        } else {
            let (low, high) = self.split(self.nodes[node as usize].left, offset);
            self.nodes[node as usize].left = high;
            self.update(node);
            (low, node)
        }
    }

    /// Joins two subtrees, every gap of `low` below every gap of `high`.
    fn merge(&mut self, low: u32, high: u32) -> u32 {
        if low == NIL {
            return high;
        }
        if high == NIL {
            return low;
        }
        if self.nodes[low as usize].priority > self.nodes[high as usize].priority {
            let right = self.merge(self.nodes[low as usize].right, high);
            self.nodes[low as usize].right = right;
            self.update(low);
            low
        } else {
            let left = self.merge(low, self.nodes[high as usize].left);
            self.nodes[high as usize].left = left;
            self.update(high);
            high
        }
    }

    /// Adds the gap at `offset` (none there yet).
    fn insert(&mut self, offset: u64, size: u64) {
        let node = GapNode { offset, size, most: size, priority: self.priorities.next_u64(), left: NIL, right: NIL };
        let slot = match self.free.pop() {
            Some(slot) => {
                self.nodes[slot as usize] = node;
                slot
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        let (low, high) = self.split(self.root, offset);
        let low = self.merge(low, slot);
        self.root = self.merge(low, high);
    }

    /// Removes the gap at `offset`, if there is one.
    fn remove(&mut self, offset: u64) {
        let (low, rest) = self.split(self.root, offset);
        let (at, high) = self.split(rest, offset.saturating_add(1));
        if at != NIL {
            self.free.push(at);
        }
        self.root = self.merge(low, high);
    }

    /// The lowest gap of at least `size`, as (size, offset).
    fn first_fit(&self, size: u64) -> Option<(u64, u64)> {
        let mut node = self.root;
        if self.most(node) < size {
            return None;
        }
        loop {
            let GapNode { offset, size: here, left, right, .. } = self.nodes[node as usize];
            if self.most(left) >= size {
                node = left;
            } else if here >= size {
                return Some((here, offset));
            } else {
                node = right;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scan-based start order, as `by_start` was before its gap set: the reference it must match.
    /// The online order: by start step (frees before allocations at the same step, larger first among
    /// equal starts), each buffer at the best-fitting gap among the buffers alive then. Needs no
    /// overlap graph: the live ranges are kept in an ordered map.
    fn by_start_reference(items: &[Item], members: &[u32]) -> ComponentPlacement {
        let order = start_order(items, members);
        let mut offsets = vec![0u64; members.len()];
        let mut peak = 0;
        // offset -> (end, upper step) of live ranges; expired ones are dropped lazily by step.
        let mut live: BTreeMap<u64, (u64, u32)> = BTreeMap::new();
        let mut taken: Vec<(u64, u64)> = Vec::new();
        for &local in &order {
            let item = &items[members[local as usize] as usize];
            live.retain(|_, &mut (_, upper)| upper > item.lower);
            taken.clear();
            taken.extend(live.iter().map(|(&start, &(end, _))| (start, end)));
            let offset = choose_gap(&taken, item.size, Fit::Best);
            offsets[local as usize] = offset;
            peak = peak.max(offset + item.size);
            live.insert(offset, (offset + item.size, item.upper));
        }
        ComponentPlacement { offsets, peak }
    }

    /// `count` random items: starts below `steps`, lifetimes of 1 to `longest` steps, sizes of 1
    /// to `largest`.
    fn random_items(rng: &mut SplitMix64, count: usize, steps: u64, longest: u64, largest: u64) -> Vec<Item> {
        (0..count)
            .map(|_| {
                let lower = rng.below(steps) as u32;
                Item { lower, upper: lower + 1 + rng.below(longest) as u32, size: 1 + rng.below(largest) }
            })
            .collect()
    }

    #[test]
    fn by_start_matches_the_scan_it_replaced() {
        let mut rng = crate::generate::SplitMix64::new(11);
        for case in 0..300u64 {
            let count = 1 + (case % 80) as usize;
            let items = random_items(&mut rng, count, 60, 25, if case % 2 == 0 { 8 } else { 1000 });
            let members: Vec<u32> = (0..count as u32).collect();
            let (new, old) = (by_start(&items, &members), by_start_reference(&items, &members));
            assert_eq!((new.offsets, new.peak), (old.offsets, old.peak), "case {case}");
            // The other sweeps against in_order over the graph in the same order.
            let graph = Overlaps::build(&items, &members, usize::MAX).unwrap();
            let mut order: Vec<u32> = members.clone();
            order.sort_by_key(|&l| (items[l as usize].lower, core::cmp::Reverse(items[l as usize].size), l));
            let mut never = |_: &super::super::Progress| false;
            let mut control = Control::new(&mut never);
            let first = in_order(&items, &members, Some(&graph), &order, Fit::First, &mut control).unwrap();
            assert_eq!(sweep(&items, &members, false, Fit::First, None).unwrap().peak, first.peak, "case {case}");
            for fit in [Fit::Best, Fit::First] {
                let reversed = sweep(&items, &members, true, fit, None).unwrap();
                let buffers: Vec<crate::lifetime::BufferLifetime> = items
                    .iter()
                    .map(|i| crate::lifetime::BufferLifetime { id: 0, lower: i.lower, upper: i.upper, size: i.size })
                    .collect();
                crate::check::check_placement(&buffers, &reversed.offsets, 1, reversed.peak, None).unwrap();
            }
        }
    }

    /// A component's first placement is the start-order sweep unless a stop comes inside it; then
    /// the stacked placement, which the checker accepts. Components of fewer than
    /// `GREEDY_POLL_EVERY` buffers are never polled there.
    #[test]
    fn the_first_placement_is_the_sweep_or_when_stopped_the_stack() {
        let mut rng = crate::generate::SplitMix64::new(21);
        for count in [1usize, 50, GREEDY_POLL_EVERY, GREEDY_POLL_EVERY + 1, 3 * GREEDY_POLL_EVERY] {
            let items = random_items(&mut rng, count, 400, 60, 1000);
            let members: Vec<u32> = (0..count as u32).collect();
            let sweep = by_start(&items, &members);
            let mut never = |_: &super::super::Progress| false;
            let unstopped = first_placement(&items, &members, &mut Control::new(&mut never));
            assert!(unstopped.offsets == sweep.offsets && unstopped.peak == sweep.peak, "{count} buffers");

            let mut polls = 0;
            let mut at_once = |progress: &super::super::Progress| {
                assert!(progress.first_placement, "polled inside the first sweep");
                polls += 1;
                true
            };
            let mut control = Control::new(&mut at_once);
            let stopped = first_placement(&items, &members, &mut control);
            assert!(!control.progress.first_placement && control.stopped() == (count >= GREEDY_POLL_EVERY));
            // A stop that came before is asked again inside: answered "go on" there, the sweep
            // completes, and the earlier stop still stands after it.
            let mut calls = 0;
            let mut only_before = |progress: &super::super::Progress| {
                calls += 1;
                !progress.first_placement
            };
            let mut control = Control::new(&mut only_before);
            assert!(control.poll());
            let resumed = first_placement(&items, &members, &mut control);
            assert!(control.stopped() && !control.progress.first_placement);
            assert!(resumed.offsets == sweep.offsets, "{count} buffers");
            assert_eq!(calls, 1 + count / GREEDY_POLL_EVERY, "{count} buffers");
            let expected = if count >= GREEDY_POLL_EVERY { stacked(&items, &members) } else { sweep };
            assert!(stopped.offsets == expected.offsets && stopped.peak == expected.peak, "{count} buffers");
            assert_eq!(polls, usize::from(count >= GREEDY_POLL_EVERY), "{count} buffers");
            let buffers: Vec<crate::lifetime::BufferLifetime> = items
                .iter()
                .map(|i| crate::lifetime::BufferLifetime { id: 0, lower: i.lower, upper: i.upper, size: i.size })
                .collect();
            crate::check::check_placement(&buffers, &stopped.offsets, 1, stopped.peak, None).unwrap();
            if count >= GREEDY_POLL_EVERY {
                assert_eq!(stopped.peak, buffers.iter().map(|b| b.size).sum::<u64>(), "{count} buffers");
            }
        }
    }

    #[test]
    fn sweep_from_keeps_the_earlier_buffers_and_stays_valid() {
        let mut rng = crate::generate::SplitMix64::new(5);
        for case in 0..60u64 {
            let count = 2 + (case % 70) as usize;
            let items = random_items(&mut rng, count, 50, 20, 100);
            let members: Vec<u32> = (0..count as u32).collect();
            let buffers: Vec<crate::lifetime::BufferLifetime> = items
                .iter()
                .map(|i| crate::lifetime::BufferLifetime { id: 0, lower: i.lower, upper: i.upper, size: i.size })
                .collect();
            // Kept: a valid placement that is not the sweep's own (time reversed).
            let kept = sweep(&items, &members, true, Fit::First, None).unwrap();
            let from = rng.below(60) as u32;
            let until = rng.below(60) as u32;
            let mut never = |_: &super::super::Progress| false;
            let mut control = Control::new(&mut never);
            let placed = sweep_from(&items, &members, &mut rng, &kept.offsets, from, until, &mut control).unwrap();
            crate::check::check_placement(&buffers, &placed.offsets, 1, placed.peak, None).unwrap();
            for (l, item) in items.iter().enumerate() {
                if item.lower < from {
                    assert_eq!(placed.offsets[l], kept.offsets[l], "case {case}: kept buffer {l} moved");
                }
            }
            // Kept from the end of time on: the kept placement itself.
            let all = sweep_from(&items, &members, &mut rng, &kept.offsets, u32::MAX, 0, &mut control).unwrap();
            assert_eq!(all.offsets, kept.offsets);
        }
    }

    /// The gap tree answers first fit as a scan over the gaps by offset does, through random
    /// inserts and removals (gaps never overlap, as in a sweep).
    #[test]
    fn gap_tree_first_fit_matches_a_scan() {
        use alloc::collections::btree_map::Entry;
        let mut rng = SplitMix64::new(77);
        let mut tree = GapTree::new();
        let mut reference: BTreeMap<u64, u64> = BTreeMap::new(); // offset -> size
        for step in 0..20_000 {
            let slot = rng.below(512) * 16; // gaps live in disjoint 16-byte slots
            match reference.entry(slot) {
                Entry::Occupied(gap) => {
                    if rng.below(2) == 0 {
                        tree.remove(slot);
                        gap.remove();
                    }
                }
                Entry::Vacant(gap) => {
                    let size = rng.between(1, 16);
                    tree.insert(slot, size);
                    gap.insert(size);
                }
            }
            let want = rng.between(1, 17);
            let scanned = reference.iter().find(|&(_, &size)| size >= want).map(|(&o, &size)| (size, o));
            assert_eq!(tree.first_fit(want), scanned, "step {step}, size {want}");
        }
        assert!(!reference.is_empty());
    }

    #[test]
    fn pair_count_matches_the_graph() {
        let mut rng = crate::generate::SplitMix64::new(4);
        for count in [1usize, 2, 10, 200] {
            let items = random_items(&mut rng, count, 50, 20, 1);
            let members: Vec<u32> = (0..count as u32).collect();
            let graph = Overlaps::build(&items, &members, usize::MAX).unwrap();
            let degrees: usize = (0..count).map(|l| graph.degree(l)).sum();
            assert_eq!(Overlaps::pair_count(&items, &members) as usize * 2, degrees);
            let pairs = degrees / 2;
            if pairs > 0 {
                assert!(Overlaps::build(&items, &members, pairs - 1).is_none());
                assert!(Overlaps::build(&items, &members, pairs).is_some());
            }
        }
    }

    #[test]
    fn best_fit_takes_the_tightest_gap() {
        let taken = [(0, 2), (5, 6), (8, 9)]; // gaps [2,5) size 3 and [6,8) size 2
        assert_eq!(choose_gap(&taken, 2, Fit::Best), 6);
        assert_eq!(choose_gap(&taken, 2, Fit::First), 2);
        assert_eq!(choose_gap(&taken, 4, Fit::Best), 9);
        assert_eq!(choose_gap(&[(0, 5), (1, 3), (6, 7)], 1, Fit::Best), 5);
    }
}
