//! Flat subsets as balanced flows, for components whose every section holds many buffers. Each
//! lifetime class is an edge from its start boundary to its end carrying a subset sum of its sizes;
//! a flat subset is a flow balanced at every inner boundary, its value the height. The search fixes
//! the flow of one edge crossing the sparsest section and balances the touched boundary with the
//! fewest undecided edges, whole groups or none first, until all are. Attempts (a seed edge with a
//! flow) go in [`Rounds`]; a seed whose every attempt was refuted is left out later. No proofs.

use alloc::vec::Vec;

use super::{pick, Budget, Rounds, Step, SubsetSums, SUMS_PER_NODE};
use crate::sections::endpoints;
use crate::tuning::*;
use crate::Item;

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
struct Network {
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
    fn new(items: &[Item], component: &[u32]) -> Network {
        let points = endpoints(items, component);
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
}

/// The search of one component, resumable: attempts (a seed edge and its flow) in [`Rounds`].
pub(super) struct Search {
    network: Network,
    height: u64,
    /// Attempts (seed edge, flow) not settled yet: each seed's whole group first, then its sums.
    attempts: Rounds<(usize, u64)>,
    /// Per edge: attempts not refuted yet, and whether all were, so later attempts leave it out.
    open_attempts: Vec<usize>,
    excluded: Vec<bool>,
    /// The flows and touched marks every attempt starts from (excluded edges carry none).
    amount: Vec<Option<u64>>,
    is_touched: Vec<bool>,
}

impl Search {
    /// The search of `component` (full height `height`).
    pub(super) fn new(items: &[Item], component: &[u32], height: u64, budget: &mut Budget) -> Search {
        let network = Network::new(items, component);
        budget.spend_many(network.edges.iter().map(|edge| edge.sums.cost).sum::<u64>() / SUMS_PER_NODE);
        let mut pending: Vec<(usize, u64)> = network.seeds.iter().map(|&e| (e, network.edges[e].total)).collect();
        let mut open_attempts = alloc::vec![0usize; network.edges.len()];
        for &e in &network.seeds {
            let edge = &network.edges[e];
            open_attempts[e] += 1;
            for &amount in edge.sums.between(1, edge.total.saturating_sub(1)).iter().rev() {
                pending.push((e, amount));
                open_attempts[e] += 1;
            }
        }
        let excluded = alloc::vec![false; network.edges.len()];
        let amount = alloc::vec![None; network.edges.len()];
        let is_touched = alloc::vec![false; network.at.len()];
        let attempts = Rounds::new(pending, FLOW_FIRST_WINDOW, FLOW_FIRST_LIMIT_PER_ATTEMPT);
        Search { network, height, attempts, open_attempts, excluded, amount, is_touched }
    }

    /// Goes on with the pending attempts for at most `work` nodes.
    pub(super) fn run(&mut self, items: &[Item], budget: &mut Budget, work: u64) -> Step {
        let mut total = work;
        loop {
            if total == 0 {
                return Step::OutOfWork;
            }
            let Some(((seed, amount), limit)) = self.attempts.next() else { return Step::Done };
            if self.excluded[seed] {
                continue;
            }
            // Every attempt costs a node, however soon it is refuted.
            if !budget.charge(&mut total) {
                self.attempts.unsettled((seed, amount));
                return Step::OutOfWork;
            }
            let mut attempt_work = limit.min(total);
            let before = attempt_work;
            let mut state = Propagation {
                network: &self.network,
                amount: core::mem::take(&mut self.amount),
                touched: Vec::new(),
                is_touched: core::mem::take(&mut self.is_touched),
                budget: &mut *budget,
                work: &mut attempt_work,
                found: None,
            };
            state.set(seed, amount);
            let outcome = state.propagate(self.height);
            state.unset(seed, 0);
            let found = state.found.take();
            self.amount = core::mem::take(&mut state.amount);
            self.is_touched = core::mem::take(&mut state.is_touched);
            total -= before - attempt_work;
            match (outcome, found) {
                (Balance::Found, Some((flows, value))) => {
                    let mut lower = Vec::new();
                    let realised =
                        flows.iter().all(|&(e, a)| pick(items, &self.network.edges[e].members, a, &mut lower, budget));
                    if realised {
                        lower.sort_unstable();
                        return Step::Found((lower, value));
                    }
                }
                (Balance::Found, None) => {}
                (Balance::Impossible, _) => {
                    self.open_attempts[seed] -= 1;
                    if self.open_attempts[seed] == 0 {
                        // No flat subset uses this edge: later attempts leave it out.
                        self.excluded[seed] = true;
                        self.amount[seed] = Some(0);
                    }
                }
                (Balance::OutOfWork, _) => self.attempts.unsettled((seed, amount)),
            }
        }
    }
}

/// One attempt: flows decided so far, the boundaries they touch, and the first complete flow.
struct Propagation<'a, 'b, 'c> {
    network: &'a Network,
    amount: Vec<Option<u64>>,
    /// Boundaries touched by a decided nonzero flow, in order (undone by truncation).
    touched: Vec<usize>,
    is_touched: Vec<bool>,
    budget: &'a mut Budget<'b, 'c>,
    work: &'a mut u64,
    /// The first complete proper flow: (edge, flow) for every edge with flow, and its value.
    found: Option<(Vec<(usize, u64)>, u64)>,
}

impl Propagation<'_, '_, '_> {
    fn spend(&mut self) -> bool {
        self.budget.charge(self.work)
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
    fn propagate(&mut self, height: u64) -> Balance {
        // The touched inner boundary with the fewest undecided edges (an unbalanced complete one fails).
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
            self.found = Some((flows, value));
            return Balance::Found;
        };
        if !self.spend() {
            return Balance::OutOfWork;
        }
        let open: Vec<(usize, bool)> =
            self.network.at[node].iter().copied().filter(|&(e, _)| self.amount[e].is_none()).collect();
        // The open starting edges must carry what the decided ending ones bring in excess.
        let need = self.imbalance(node);
        self.assign(height, &open, 0, need)
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
    fn assign(&mut self, height: u64, open: &[(usize, bool)], i: usize, need: i128) -> Balance {
        let Some(&(e, starts)) = open.get(i) else {
            return if need == 0 { self.propagate(height) } else { Balance::Impossible };
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
        // The amounts that leave the rest settleable: `need - signed` within [-most_in, most_out].
        let (low, high) = if starts { (need - most_out, need + most_in) } else { (-need - most_in, most_out - need) };
        let low = low.max(0);
        let high = high.min(i128::from(edge.total));
        if low > high {
            return Balance::Impossible;
        }
        let (low, high) = (low as u64, high as u64);
        // The settling amount, none, all; then the other sums in range, largest first.
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
            let outcome = self.assign(height, open, i + 1, rest);
            self.unset(e, mark);
            match outcome {
                Balance::Impossible => {}
                settled => return settled,
            }
        }
        Balance::Impossible
    }
}
