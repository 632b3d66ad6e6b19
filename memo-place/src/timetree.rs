//! The offset ranges taken by the placed buffers that share a step with a given one, without the
//! pairwise overlap graph: a segment tree over the component's time points whose nodes keep
//! offset intervals, merged. A placed buffer's range `[offset, end)` is added at the O(log T)
//! nodes whose time range its lifetime spans (`spanning`) and at every node whose range it meets
//! on the way there (`meeting`: those, and the nodes it only partly meets, at most two a level).
//! A query for `[lower, upper)` walks the same way: a node it partly meets gives its `spanning`
//! set (those buffers span the node, so they meet the query), a node inside the query its
//! `meeting` set. Their union is exactly the union of the ranges of the placed buffers that meet
//! the query, which is all a best or first fit needs (`greedy::choose_gap`). Stacked buffers merge
//! into one interval, so on a dense trace a query reads a few intervals per node, not one per
//! overlapping buffer: the classic orders run on components of any density (`greedy::in_order`).

use alloc::collections::BTreeMap;
use alloc::vec;
use alloc::vec::Vec;

use super::Item;

/// Disjoint, non-touching offset intervals, start -> end.
type Spans = BTreeMap<u64, u64>;

pub(crate) struct TimeTree {
    /// The distinct time points of the members' lifetimes, ascending; leaf `i` is the steps
    /// `[points[i], points[i + 1])`.
    points: Vec<u32>,
    /// Per node (1-based heap order): the ranges of the buffers that span its time range.
    spanning: Vec<Spans>,
    /// Per node: the ranges of the buffers filed at it or below (that meet its time range and
    /// do not span its parent's).
    meeting: Vec<Spans>,
}

/// Adds `[start, end)` to `spans`, merging what it overlaps or touches.
fn add(spans: &mut Spans, mut start: u64, mut end: u64) {
    if let Some((&before, &before_end)) = spans.range(..=start).next_back() {
        if before_end >= start {
            start = before;
            end = end.max(before_end);
            spans.remove(&before);
        }
    }
    while let Some((&next, &next_end)) = spans.range(start..=end).next() {
        end = end.max(next_end);
        spans.remove(&next);
    }
    spans.insert(start, end);
}

impl TimeTree {
    /// An empty tree over the lifetimes of `members`.
    pub(crate) fn new(items: &[Item], members: &[u32]) -> TimeTree {
        let mut points: Vec<u32> =
            members.iter().flat_map(|&m| [items[m as usize].lower, items[m as usize].upper]).collect();
        points.sort_unstable();
        points.dedup();
        let nodes = 2 * points.len().saturating_sub(1).max(1).next_power_of_two();
        TimeTree { points, spanning: vec![Spans::new(); nodes], meeting: vec![Spans::new(); nodes] }
    }

    /// Calls `visit(node, inside)` for every node a lifetime's walk reaches: `inside` when the
    /// lifetime spans the node's time range (the walk stops there).
    fn walk(&self, item: &Item, mut visit: impl FnMut(usize, bool)) {
        let first = self.points.partition_point(|&p| p < item.lower);
        let last = self.points.partition_point(|&p| p < item.upper);
        let mut stack = vec![(1usize, 0usize, self.spanning.len() / 2)];
        while let Some((node, low, high)) = stack.pop() {
            let inside = first <= low && high <= last;
            visit(node, inside);
            if inside {
                continue;
            }
            let middle = (low + high) / 2;
            if first < middle {
                stack.push((2 * node, low, middle));
            }
            if last > middle {
                stack.push((2 * node + 1, middle, high));
            }
        }
    }

    /// Files a placed buffer with lifetime `item` at `[offset, end)`.
    pub(crate) fn insert(&mut self, item: &Item, offset: u64, end: u64) {
        let mut reached = Vec::new();
        self.walk(item, |node, inside| reached.push((node, inside)));
        for (node, inside) in reached {
            if inside {
                add(&mut self.spanning[node], offset, end);
            }
            add(&mut self.meeting[node], offset, end);
        }
    }

    /// Appends to `taken` intervals whose union is the union of the ranges of the filed buffers
    /// that share a step with `item` (unsorted; they may overlap).
    pub(crate) fn taken(&self, item: &Item, taken: &mut Vec<(u64, u64)>) {
        self.walk(item, |node, inside| {
            let spans = if inside { &self.meeting[node] } else { &self.spanning[node] };
            taken.extend(spans.iter().map(|(&start, &end)| (start, end)));
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    /// The union of intervals, as sorted disjoint non-touching intervals.
    fn union(mut intervals: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
        intervals.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::new();
        for (start, end) in intervals {
            match out.last_mut() {
                Some(last) if last.1 >= start => last.1 = last.1.max(end),
                _ => out.push((start, end)),
            }
        }
        out
    }

    #[test]
    fn gives_the_union_of_the_ranges_of_the_filed_buffers_that_meet_the_query() {
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
                let mut taken = Vec::new();
                tree.taken(item, &mut taken);
                let expected: Vec<(u64, u64)> = (0..local)
                    .filter(|&o| items[o].lower < item.upper && item.lower < items[o].upper)
                    .map(|o| (offsets[o], offsets[o] + items[o].size))
                    .collect();
                assert_eq!(union(taken), union(expected), "case {case}, buffer {local}");
                tree.insert(item, offsets[local], offsets[local] + item.size);
            }
        }
    }
}
