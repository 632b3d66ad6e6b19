//! The offset ranges taken by the placed buffers that share a step with a given one, without the
//! pairwise overlap graph: a segment tree over the component's time points whose nodes keep
//! offset intervals, merged. A placed buffer's range `[offset, end)` is added at the O(log T)
//! nodes whose time range its lifetime spans (`spanning`) and at every node whose range it meets
//! on the way there (`meeting`: those, and the nodes it only partly meets, at most two a level).
//! A query for `[lower, upper)` walks the same way: a node it partly meets gives its `spanning`
//! set (those buffers span the node, so they meet the query), a node inside the query its
//! `meeting` set. Their union is exactly the union of the ranges of the placed buffers that meet
//! the query, which is all a best or first fit needs. Stacked buffers merge into one interval, so
//! on a dense trace a query reads a few sorted runs per node, not one range per overlapping
//! buffer: the classic orders run on components of any density (`greedy::in_order`).
//!
//! The sets are sorted vectors (a query reads them in order; an insertion moves the tail), and a
//! fit never sorts them together: a first fit leapfrogs from offset 0 (each set lifts the
//! candidate past its interval in the way, until none is), and a best fit walks the union's
//! gaps with one cursor per set, skipping the sets' intervals it has passed.

use alloc::vec;
use alloc::vec::Vec;

use super::greedy::Fit;
use super::sections::endpoints;
use super::Item;

/// The most nodes one walk reaches: four a level (two it partly meets, two inside it), a level
/// per bit of a node index.
const WALK_MOST_NODES: usize = 4 * usize::BITS as usize;

/// Sets of a query with at most this many intervals are merged into one before the fit.
const SMALL_SET: usize = 32;

/// Disjoint, non-touching offset intervals `(start, end)`, ascending.
type Spans = Vec<(u64, u64)>;

pub(crate) struct TimeTree {
    /// The distinct time points of the members' lifetimes, ascending; leaf `i` is the steps
    /// `[points[i], points[i + 1])`.
    points: Vec<u32>,
    /// Per node (1-based heap order): the ranges of the buffers that span its time range.
    spanning: Vec<Spans>,
    /// Per node: the ranges of the buffers filed at it or below (that meet its time range and
    /// do not span its parent's).
    meeting: Vec<Spans>,
    /// A query's sets of at most `SMALL_SET` intervals, merged (kept to reuse its memory).
    small: Spans,
}

/// Adds `[start, end)` to `spans`, merging what it overlaps or touches.
fn add(spans: &mut Spans, start: u64, end: u64) {
    // The intervals from the first ending at or after `start` to the last starting at or before
    // `end` touch the new one: they merge with it into one.
    let first = spans.partition_point(|&(_, e)| e < start);
    let last = spans.partition_point(|&(s, _)| s <= end);
    if first == last {
        spans.insert(first, (start, end));
        return;
    }
    let merged = (start.min(spans[first].0), end.max(spans[last - 1].1));
    spans[first] = merged;
    spans.drain(first + 1..last);
}

/// The sets of one query with a cursor each: the first interval of the set that ends above the
/// candidate offset. Candidates only rise during a query, so cursors only move forward (galloping:
/// a query passes over many short intervals of a set at once).
struct Cursors<'a> {
    sets: &'a [&'a [(u64, u64)]],
    at: [usize; WALK_MOST_NODES],
}

impl Cursors<'_> {
    /// Moves set `i`'s cursor to its first interval ending above `x`.
    fn advance(&mut self, i: usize, x: u64) -> usize {
        let set = self.sets[i];
        let mut low = self.at[i];
        if low < set.len() && set[low].1 <= x {
            let mut step = 1;
            while low + step < set.len() && set[low + step].1 <= x {
                low += step;
                step *= 2;
            }
            let high = (low + step).min(set.len());
            low += 1 + set[low + 1..high].partition_point(|&(_, e)| e <= x);
        }
        self.at[i] = low;
        low
    }

    /// The lowest `y >= x` such that `[y, y + size)` meets no interval of any set: each set lifts
    /// the candidate past its intervals in the way, until none is.
    fn first_free(&mut self, mut x: u64, size: u64) -> u64 {
        loop {
            let before = x;
            for i in 0..self.sets.len() {
                let mut k = self.advance(i, x);
                let set = self.sets[i];
                while k < set.len() && set[k].0 < x + size {
                    x = set[k].1;
                    k += 1;
                }
                self.at[i] = k;
            }
            if x == before {
                return x;
            }
        }
    }

    /// Where the union's free gap from `x` ends (after [`Cursors::first_free`] gave `x`): the
    /// lowest start of the intervals at the cursors.
    fn gap_end(&self) -> u64 {
        self.sets.iter().zip(&self.at).filter_map(|(set, &k)| set.get(k)).map(|&(s, _)| s).min().unwrap_or(u64::MAX)
    }
}

/// The offset `fit` chooses for a buffer of `size` among the union of `sets`: the lowest free
/// gap, or the smallest (ties: the lowest); above everything when no gap between fits.
fn choose(sets: &[&[(u64, u64)]], size: u64, fit: Fit) -> u64 {
    let top = sets.iter().filter_map(|s| s.last()).map(|&(_, e)| e).max().unwrap_or(0);
    let mut cursors = Cursors { sets, at: [0; WALK_MOST_NODES] };
    let mut x = cursors.first_free(0, size);
    if matches!(fit, Fit::First) {
        return x;
    }
    let mut chosen: Option<(u64, u64)> = None; // (gap, offset)
    while x < top {
        let end = cursors.gap_end();
        let gap = end - x;
        if chosen.is_none_or(|(best, _)| gap < best) {
            chosen = Some((gap, x));
            if gap == size {
                break; // nothing fits tighter
            }
        }
        x = cursors.first_free(end, size);
    }
    chosen.map_or(top, |(_, offset)| offset)
}

impl TimeTree {
    /// An empty tree over the lifetimes of `members`.
    pub(crate) fn new(items: &[Item], members: &[u32]) -> TimeTree {
        let points = endpoints(items, members);
        let nodes = 2 * points.len().saturating_sub(1).max(1).next_power_of_two();
        TimeTree {
            points,
            spanning: vec![Spans::new(); nodes],
            meeting: vec![Spans::new(); nodes],
            small: Spans::new(),
        }
    }

    /// Calls `visit(node, inside)` for every node a lifetime's walk reaches: `inside` when the
    /// lifetime spans the node's time range (the walk stops there).
    fn walk(&self, item: &Item, mut visit: impl FnMut(usize, bool)) {
        let first = self.points.partition_point(|&p| p < item.lower);
        let last = self.points.partition_point(|&p| p < item.upper);
        // At most two nodes wait per level, and a level per bit of a node index.
        let mut stack = [(0usize, 0usize, 0usize); 2 * usize::BITS as usize];
        stack[0] = (1, 0, self.spanning.len() / 2);
        let mut waiting = 1;
        while waiting > 0 {
            waiting -= 1;
            let (node, low, high) = stack[waiting];
            let inside = first <= low && high <= last;
            visit(node, inside);
            if inside {
                continue;
            }
            let middle = (low + high) / 2;
            if first < middle {
                stack[waiting] = (2 * node, low, middle);
                waiting += 1;
            }
            if last > middle {
                stack[waiting] = (2 * node + 1, middle, high);
                waiting += 1;
            }
        }
    }

    /// Files a placed buffer with lifetime `item` at `[offset, end)`.
    pub(crate) fn insert(&mut self, item: &Item, offset: u64, end: u64) {
        let mut reached = [(0usize, false); WALK_MOST_NODES];
        let mut count = 0;
        self.walk(item, |node, inside| {
            reached[count] = (node, inside);
            count += 1;
        });
        for &(node, inside) in &reached[..count] {
            if inside {
                add(&mut self.spanning[node], offset, end);
            }
            add(&mut self.meeting[node], offset, end);
        }
    }

    /// The offset `fit` chooses for a buffer with lifetime `item` of `size` among the ranges of the
    /// filed buffers that share a step with it (`greedy::choose_gap` over their union), and the
    /// intervals the query had to go through (its work). The sets of a few intervals (most of a
    /// walk's, near the leaves) are merged into one first: each set costs every step of the
    /// query's leapfrog a look.
    pub(crate) fn fit(&mut self, item: &Item, size: u64, fit: Fit) -> (u64, usize) {
        let mut small = core::mem::take(&mut self.small);
        small.clear();
        let mut sets: [&[(u64, u64)]; WALK_MOST_NODES] = [&[]; WALK_MOST_NODES];
        let mut large = 0;
        self.walk(item, |node, inside| {
            let set = if inside { &self.meeting[node] } else { &self.spanning[node] };
            if set.len() <= SMALL_SET {
                set.iter().for_each(|&(start, end)| add(&mut small, start, end));
            } else {
                sets[large] = set;
                large += 1;
            }
        });
        sets[large] = &small;
        let offset = choose(&sets[..=large], size, fit);
        let read = sets[..=large].iter().map(|set| set.len()).sum();
        self.small = small;
        (offset, read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::greedy::choose_gap;
    use crate::rng::SplitMix64;

    #[test]
    fn fits_as_choose_gap_does_over_the_ranges_of_the_filed_buffers_that_meet_the_query() {
        let mut rng = SplitMix64::new(3);
        for case in 0..60 {
            let n = 1 + case * 3;
            let items: Vec<Item> = (0..n)
                .map(|_| {
                    let lower = rng.below(40) as u32;
                    Item { lower, upper: lower + 1 + rng.below(20) as u32, size: 1 + rng.below(9) }
                })
                .collect();
            let members: Vec<u32> = (0..n as u32).collect();
            let offsets: Vec<u64> = (0..n).map(|_| rng.below(60)).collect();
            let mut tree = TimeTree::new(&items, &members);
            for (local, item) in items.iter().enumerate() {
                let mut taken: Vec<(u64, u64)> = (0..local)
                    .filter(|&o| items[o].lower < item.upper && item.lower < items[o].upper)
                    .map(|o| (offsets[o], offsets[o] + items[o].size))
                    .collect();
                taken.sort_unstable();
                for fit in [Fit::Best, Fit::First] {
                    for size in [1, item.size, 7] {
                        let expected = choose_gap(&taken, size, fit);
                        assert_eq!(tree.fit(item, size, fit).0, expected, "case {case}, buffer {local}, {fit:?}");
                    }
                }
                tree.insert(item, offsets[local], offsets[local] + item.size);
            }
        }
    }
}
