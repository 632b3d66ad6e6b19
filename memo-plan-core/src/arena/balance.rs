//! Flat subsets as balanced flows: the second way `split` looks for them, for components where
//! every section holds many buffers (so the heights a flat subset could have are too many to try).
//!
//! Read each buffer as an edge from its start boundary to its end boundary carrying its size. A
//! flat subset is then a flow from the first boundary to the last: at every boundary in between,
//! the bytes of the subset's buffers that end there equal those of its buffers that start there.
//! Buffers with the same start and end are one edge whose flow is any subset sum of their sizes.
//! The search fixes the flow on one edge that crosses the sparsest section (every flat subset
//! crosses it) and propagates: it picks the touched boundary with the fewest undecided edges and
//! chooses flows for them that balance it, until every touched boundary is balanced. The flow's
//! value (what leaves the first boundary) is the height. Edges are tried with their whole group or
//! none first: buffers with one lifetime mostly lie on one side of a cut.

use alloc::vec::Vec;

use super::split::SubsetSums;
use super::Item;

/// One edge: the buffers with the same (start, end) boundaries.
struct Edge {
    start: usize,
    end: usize,
    /// Local buffers, largest first.
    members: Vec<u32>,
    total: u64,
    sums: SubsetSums,
}

/// A component as a flow network.
pub(crate) struct Network {
    edges: Vec<Edge>,
    /// The edges at each boundary: (edge, whether it starts there).
    at: Vec<Vec<(usize, bool)>>,
    /// The first and last boundary: no balance is needed there.
    last: usize,
    /// Edges crossing the section with the fewest buffers, smallest first: the seeds.
    seeds: Vec<usize>,
}

/// How a propagation ended.
enum Balance {
    Found,
    Impossible,
    OutOfWork,
}

impl Network {
    /// The network of `component` (local indices into `items`).
    pub(crate) fn new(items: &[Item], component: &[u32]) -> Network {
        let mut points: Vec<u32> =
            component.iter().flat_map(|&l| [items[l as usize].lower, items[l as usize].upper]).collect();
        points.sort_unstable();
        points.dedup();
        let boundary = |t: u32| points.partition_point(|&p| p < t);
        let mut keyed: Vec<(usize, usize, u32)> = component
            .iter()
            .map(|&l| (boundary(items[l as usize].lower), boundary(items[l as usize].upper), l))
            .collect();
        keyed.sort_unstable_by_key(|&(start, end, l)| (start, end, core::cmp::Reverse(items[l as usize].size), l));
        let mut edges: Vec<Edge> = Vec::new();
        for chunk in keyed.chunk_by(|a, b| (a.0, a.1) == (b.0, b.1)) {
            let members: Vec<u32> = chunk.iter().map(|&(_, _, l)| l).collect();
            let sizes = || members.iter().map(|&l| items[l as usize].size);
            edges.push(Edge {
                start: chunk[0].0,
                end: chunk[0].1,
                total: sizes().sum(),
                sums: SubsetSums::new(sizes()),
                members,
            });
        }
        let last = points.len().saturating_sub(1);
        let mut at: Vec<Vec<(usize, bool)>> = alloc::vec![Vec::new(); points.len()];
        let mut crossing = alloc::vec![0usize; last];
        for (e, edge) in edges.iter().enumerate() {
            at[edge.start].push((e, true));
            at[edge.end].push((e, false));
            for count in &mut crossing[edge.start..edge.end] {
                *count += edge.members.len();
            }
        }
        let sparsest = (0..last).min_by_key(|&s| (crossing[s], s)).unwrap_or(0);
        let mut seeds: Vec<usize> =
            (0..edges.len()).filter(|&e| edges[e].start <= sparsest && sparsest < edges[e].end).collect();
        seeds.sort_unstable_by_key(|&e| (edges[e].total, e));
        Network { edges, at, last, seeds }
    }

    /// Flat subsets (flow per edge, height) with height below `height`, up to `most` of them,
    /// within `work` nodes (also taken from `nodes_left`); and whether the search was complete
    /// (did not run out of work).
    pub(crate) fn flat_subsets(
        &self,
        height: u64,
        most: usize,
        work: u64,
        nodes_left: &mut u64,
    ) -> (Vec<(Vec<(usize, u64)>, u64)>, u64, bool) {
        let mut state = Propagation {
            network: self,
            amount: alloc::vec![None; self.edges.len()],
            touched: Vec::new(),
            is_touched: alloc::vec![false; self.at.len()],
            work,
            nodes_left: *nodes_left,
            spent: 0,
        };
        let mut found: Vec<(Vec<(usize, u64)>, u64)> = Vec::new();
        let mut complete = true;
        'seeds: for &seed in &self.seeds {
            let edge = &self.edges[seed];
            let mut candidates: Vec<u64> = alloc::vec![edge.total];
            candidates.extend(edge.sums.candidates_below(edge.total));
            let mut exhaustive = true;
            for amount in candidates {
                if found.len() >= most {
                    break 'seeds;
                }
                if state.work == 0 {
                    complete = false;
                    break 'seeds;
                }
                let mark = state.touched.len();
                state.set(seed, amount);
                match state.propagate(height, &mut found) {
                    Balance::Found | Balance::Impossible => {}
                    Balance::OutOfWork => {
                        exhaustive = false;
                        complete = false;
                    }
                }
                state.unset(seed, mark);
            }
            if exhaustive {
                // No flat subset of the wanted kind uses this edge: later seeds leave it out.
                state.amount[seed] = Some(0);
            }
        }
        *nodes_left = state.nodes_left;
        (found, state.spent, complete)
    }

    /// The buffers of edge `e` given a flow (for realising a found subset).
    pub(crate) fn members(&self, e: usize) -> &[u32] {
        &self.edges[e].members
    }
}

struct Propagation<'n> {
    network: &'n Network,
    amount: Vec<Option<u64>>,
    /// Boundaries touched by a decided nonzero flow, in order (undone by truncation).
    touched: Vec<usize>,
    is_touched: Vec<bool>,
    work: u64,
    nodes_left: u64,
    spent: u64,
}

impl Propagation<'_> {
    fn spend(&mut self) -> bool {
        if self.work == 0 || self.nodes_left == 0 {
            self.work = 0;
            return false;
        }
        self.work -= 1;
        self.nodes_left -= 1;
        self.spent += 1;
        true
    }

    fn touch(&mut self, node: usize) {
        if !self.is_touched[node] {
            self.is_touched[node] = true;
            self.touched.push(node);
        }
    }

    fn set(&mut self, e: usize, amount: u64) {
        self.amount[e] = Some(amount);
        if amount > 0 {
            let (start, end) = (self.network.edges[e].start, self.network.edges[e].end);
            self.touch(start);
            self.touch(end);
        }
    }

    /// Undoes `set(e, ..)` and every touch since `mark`.
    fn unset(&mut self, e: usize, mark: usize) {
        self.amount[e] = None;
        for &node in &self.touched[mark..] {
            self.is_touched[node] = false;
        }
        self.touched.truncate(mark);
    }

    /// Balances the touched boundaries; records the first complete proper flow in `found`.
    fn propagate(&mut self, height: u64, found: &mut Vec<(Vec<(usize, u64)>, u64)>) -> Balance {
        // The touched inner boundary with the fewest undecided edges; an unbalanced complete one
        // fails the branch.
        let mut chosen: Option<(usize, usize)> = None;
        for &node in &self.touched {
            if node == 0 || node == self.network.last {
                continue;
            }
            let undecided = self.network.at[node].iter().filter(|&&(e, _)| self.amount[e].is_none()).count();
            if undecided == 0 {
                if self.imbalance(node) != 0 {
                    return Balance::Impossible;
                }
                continue;
            }
            if chosen.is_none_or(|(count, _)| undecided < count) {
                chosen = Some((undecided, node));
            }
        }
        let Some((_, node)) = chosen else {
            let value: u64 = self.network.at[0].iter().map(|&(e, _)| self.amount[e].unwrap_or(0)).sum();
            if value == 0 || value >= height {
                return Balance::Impossible; // empty, or everything: not a split
            }
            let flows: Vec<(usize, u64)> =
                (0..self.amount.len()).filter_map(|e| self.amount[e].filter(|&a| a > 0).map(|a| (e, a))).collect();
            found.push((flows, value));
            return Balance::Found;
        };
        if !self.spend() {
            return Balance::OutOfWork;
        }
        let open: Vec<(usize, bool)> =
            self.network.at[node].iter().copied().filter(|&(e, _)| self.amount[e].is_none()).collect();
        // The open starting edges must carry what the decided ending ones bring in excess.
        let need = self.imbalance(node);
        self.assign(height, &open, 0, need, found)
    }

    /// Bytes ending at `node` minus bytes starting there, over decided edges.
    fn imbalance(&self, node: usize) -> i128 {
        self.network.at[node]
            .iter()
            .map(|&(e, starts)| {
                let amount = i128::from(self.amount[e].unwrap_or(0));
                if starts {
                    -amount
                } else {
                    amount
                }
            })
            .sum()
    }

    /// Chooses flows for `open[i..]` (edges at one boundary) so that starting ones carry `need`
    /// more than ending ones, then propagates.
    fn assign(
        &mut self,
        height: u64,
        open: &[(usize, bool)],
        i: usize,
        need: i128,
        found: &mut Vec<(Vec<(usize, u64)>, u64)>,
    ) -> Balance {
        let Some(&(e, starts)) = open.get(i) else {
            return if need == 0 { self.propagate(height, found) } else { Balance::Impossible };
        };
        // What the later edges can still contribute.
        let (mut most_out, mut most_in) = (0i128, 0i128);
        for &(other, other_starts) in &open[i + 1..] {
            let total = i128::from(self.network.edges[other].total);
            if other_starts {
                most_out += total;
            } else {
                most_in += total;
            }
        }
        let edge = &self.network.edges[e];
        // The amounts that leave the rest settleable by the later edges: `need - signed` within
        // [-most_in, most_out].
        let (low, high) = if starts { (need - most_out, need + most_in) } else { (-need - most_in, most_out - need) };
        let low = low.max(0);
        let high = high.min(i128::from(edge.total));
        if low > high {
            return Balance::Impossible;
        }
        let (low, high) = (low as u64, high as u64);
        // First the amount that would settle the boundary alone, none, all; then the other sums
        // in range, largest first (the last edge can only take the settling one).
        let exact = if starts { need } else { -need };
        let mut first: Vec<u64> = Vec::new();
        if (i128::from(low)..=i128::from(high)).contains(&exact) {
            first.push(exact as u64);
        }
        if i + 1 < open.len() {
            for amount in [0, edge.total] {
                if (low..=high).contains(&amount) && !first.contains(&amount) {
                    first.push(amount);
                }
            }
        }
        let in_range = if i + 1 < open.len() { edge.sums.between(low, high) } else { &[] };
        let candidates = first.clone().into_iter().chain(in_range.iter().rev().copied().filter(|s| !first.contains(s)));
        for amount in candidates {
            if amount > 0 && amount < edge.total && !edge.sums.may_contain(amount) {
                continue;
            }
            if !self.spend() {
                return Balance::OutOfWork;
            }
            let signed = if starts { i128::from(amount) } else { -i128::from(amount) };
            let rest = need - signed;
            let mark = self.touched.len();
            self.set(e, amount);
            let outcome = self.assign(height, open, i + 1, rest, found);
            self.unset(e, mark);
            match outcome {
                Balance::Impossible => {}
                settled => return settled,
            }
        }
        Balance::Impossible
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_slabs_balance() {
        let items = [
            Item { lower: 0, upper: 2, size: 3 },
            Item { lower: 2, upper: 4, size: 3 },
            Item { lower: 0, upper: 3, size: 5 },
            Item { lower: 3, upper: 4, size: 5 },
        ];
        let network = Network::new(&items, &[0, 1, 2, 3]);
        let mut nodes = 1000;
        let (found, _, _) = network.flat_subsets(8, 4, 1000, &mut nodes);
        assert_eq!(found.len(), 2, "{:?}", found);
    }
}
