//! Flat splits: a way to place a component at a capacity where every one of its time sections is
//! exactly full (zero slack), as at the lower bound of a perfectly packable instance.
//!
//! A subset of the buffers whose live total is the same in every section (a *flat* subset, of
//! height `a`) can be placed in `[0, a)` on its own and the rest in `[a, capacity)`: neither part
//! ever needs the other's addresses. Each part is again zero slack, so it splits again: first in
//! time (temporal components), then by peeling (a buffer alive throughout is a flat subset of one),
//! then by another flat subset, until the parts are single buffers or admit no flat subset; those
//! go to the exact search (`search`). Instances cut from a rectangle by guillotine cuts, and many
//! real perfect packings, come apart entirely this way, and each part is small.
//!
//! Finding a flat subset goes through time: choose the part of the buffers alive in the first
//! section (its total is the height `a`; smallest first), then at each later section boundary the
//! subset's buffers that end free some bytes, and exactly that many bytes of the buffers that start
//! there must join it. Only the bytes per end step matter for what follows, so the choice at a
//! boundary is an amount per group of starting buffers with the same end (a subset sum of the
//! group), and states are cached by the amounts still alive per end step. A buffer subset with the
//! chosen amounts is found at the end.
//!
//! This is not complete: a component can be packable although none of its splits is (a split fixes
//! that its parts never share addresses). So `place` only ever reports a placement it found; when
//! it finds none, the caller's exact search goes on as before and nothing is concluded.

use alloc::collections::{BTreeMap, BTreeSet};
use alloc::vec::Vec;

use super::balance::Network;
use super::decompose::{peelable, split_components};
use super::greedy::{ComponentPlacement, Overlaps};
use super::search::{search, SearchOutcome};
use super::sections::Sections;
use super::{search_ranks, Item, OVERLAP_PAIR_LIMIT};

/// Flat subsets tried per component before it goes to the exact search whole.
const SPLIT_TRIES: usize = 4;
/// Sections (those with the fewest buffers after the chosen one) whose subset sums filter the
/// heights tried, when they have at most `FILTER_SUMS_LIMIT` sums.
const FILTER_SECTIONS: usize = 8;
/// See `FILTER_SECTIONS`.
const FILTER_SUMS_LIMIT: usize = 1 << 16;
/// The sparse-section search tries at most this many heights (the lowest); the flow search
/// (`balance`) covers components where that is not enough.
const HEIGHTS_TRIED_LIMIT: usize = 4096;
/// Filtering stops when this few heights are left.
const FILTERED_ENOUGH: usize = 16;
/// The most heights (smallest subset sums of the chosen section) considered.
const HEIGHTS_LIMIT: usize = 1 << 16;
/// The work limit of the first round of heights (it doubles every round).
const FIND_FIRST_LIMIT: u64 = 256;
/// The work limit of the first round of both flat-subset searches; it grows fourfold a round.
const FIND_FIRST_WORK: u64 = 4096;
/// The most work one round of a flat-subset search may take.
const FIND_WORK: u64 = 500_000;
/// Nodes the exact search may take on a part that does not split.
const PART_SEARCH_WORK: u64 = 50_000;
/// The most distinct subset sums kept per group.
const SUBSET_SUMS_LIMIT: usize = 1 << 12;
/// Splits nested deeper than this go to the exact search (bounds the recursion).
const DEPTH_LIMIT: u32 = 64;

/// Places `members` (indices into `items`) under `capacity`, where every section is exactly full,
/// by flat splits, spending at most `*nodes_left` nodes. Returns the placement (offsets by
/// position in `members`) if one was found, and the nodes spent.
pub(crate) fn place(
    items: &[Item],
    members: &[u32],
    capacity: u64,
    nodes_left: &mut u64,
) -> (Option<ComponentPlacement>, u64) {
    let local: Vec<Item> = members.iter().map(|&m| items[m as usize]).collect();
    let n = local.len();
    let mut splitter = Splitter {
        items: local,
        offset: alloc::vec![0; n],
        failed: BTreeSet::new(),
        nodes_left: *nodes_left,
        nodes: 0,
        depth: 0,
    };
    let all: Vec<u32> = (0..n as u32).collect();
    let placed = splitter.solve_part(all, capacity, 0);
    *nodes_left = splitter.nodes_left;
    let placement = placed.then(|| {
        let peak = (0..n).map(|l| splitter.offset[l] + splitter.items[l].size).max().unwrap_or(0);
        ComponentPlacement { offsets: splitter.offset, peak }
    });
    (placement, splitter.nodes)
}

struct Splitter {
    items: Vec<Item>,
    offset: Vec<u64>,
    /// Components (hashed members and height) that could not be placed.
    failed: BTreeSet<u128>,
    nodes_left: u64,
    nodes: u64,
    depth: u32,
}

/// The smallest distinct subset sums of a multiset (0 included), sorted.
pub(crate) struct SubsetSums {
    sums: Vec<u64>,
    /// Whether `sums` holds every subset sum (else only the smallest ones).
    complete: bool,
}

impl SubsetSums {
    pub(crate) fn new(sizes: impl Iterator<Item = u64>) -> SubsetSums {
        Self::with_limit(sizes, SUBSET_SUMS_LIMIT)
    }

    /// The smallest `limit` distinct subset sums at most.
    fn with_limit(sizes: impl Iterator<Item = u64>, limit: usize) -> SubsetSums {
        let mut sums: Vec<u64> = alloc::vec![0];
        let mut next: Vec<u64> = Vec::new();
        let mut complete = true;
        for s in sizes {
            // Merge `sums` and `sums + s` (both sorted), without repeats, keeping the smallest
            // `limit`: the smallest sums of the whole set are among those of every prefix.
            next.clear();
            let (mut i, mut j) = (0, 0);
            while next.len() < limit && (i < sums.len() || j < sums.len()) {
                let shifted = sums.get(j).and_then(|&x| x.checked_add(s));
                let value = match (sums.get(i), shifted) {
                    (Some(&a), Some(b)) if a <= b => {
                        i += 1;
                        a
                    }
                    (_, Some(b)) => {
                        j += 1;
                        b
                    }
                    (Some(&a), None) => {
                        i += 1;
                        j = sums.len(); // the shifted ones overflow from here on
                        a
                    }
                    (None, None) => break,
                };
                if next.last() != Some(&value) {
                    next.push(value);
                }
            }
            if i < sums.len() || (j < sums.len() && sums[j].checked_add(s).is_some()) {
                complete = false;
            }
            core::mem::swap(&mut sums, &mut next);
        }
        SubsetSums { sums, complete }
    }

    /// Whether `value` may be a subset sum: `false` only when it is proven not to be.
    pub(crate) fn may_contain(&self, value: u64) -> bool {
        self.sums.binary_search(&value).is_ok() || (!self.complete && value > self.sums.last().copied().unwrap_or(0))
    }

    /// The known subset sums in `1..=most`, largest first, and `most` itself when it may be one
    /// beyond them.
    /// The known subset sums in `low..=high`, ascending.
    pub(crate) fn between(&self, low: u64, high: u64) -> &[u64] {
        let start = self.sums.partition_point(|&s| s < low);
        let end = self.sums.partition_point(|&s| s <= high);
        &self.sums[start..end.max(start)]
    }

    /// The known nonzero subset sums below `below`, largest first.
    pub(crate) fn candidates_below(&self, below: u64) -> impl Iterator<Item = u64> + '_ {
        let known = self.sums.partition_point(|&s| s < below);
        self.sums[..known].iter().rev().copied().filter(|&s| s > 0)
    }

    /// The amounts of a group of `total` bytes worth trying when at most `most` may join: the
    /// whole group, none (if `zero`), exactly `most`, then the other subset sums, largest first.
    /// Whole groups first: buffers with the same lifetime mostly lie on the same side of a split.
    fn candidates(&self, most: u64, total: u64, zero: bool) -> Vec<u64> {
        let mut out: Vec<u64> = Vec::new();
        if total <= most {
            out.push(total);
        }
        if zero {
            out.push(0);
        }
        if most < total && self.may_contain(most) {
            out.push(most);
        }
        let known = self.sums.partition_point(|&s| s <= most);
        out.extend(self.sums[..known].iter().rev().copied().filter(|&s| s > 0 && s != total && s != most));
        out
    }
}

/// Buffers of one component that start at the same section boundary and end at the same one.
struct Group {
    end: u32,
    total: u64,
    /// Local buffers, largest first.
    members: Vec<u32>,
    sums: SubsetSums,
}

/// One direction of the flat-subset search, in steps away from the chosen section.
struct Direction {
    /// `groups[i]`: the buffers joining at step `i`, in groups by the step they leave at.
    groups: Vec<Vec<Group>>,
    /// `reach[i][g]`: the subset sums of all buffers of groups `g..` of step `i`.
    reach: Vec<Vec<SubsetSums>>,
    /// Failed states (step, amount joining, amounts alive per leaving step), hashed.
    failed: BTreeSet<u128>,
}

/// The chosen section's buffers in classes of equal (start, end) boundary, for choosing the part
/// of them in the flat subset.
struct ClassSearch<'c> {
    classes: &'c [((usize, usize), Group)],
    /// `reach[c]`: the subset sums of all buffers of classes `c..`.
    reach: &'c [SubsetSums],
    chosen_section: usize,
}

/// How one search for a flat subset ended.
enum Search {
    Found((Vec<u32>, u64)),
    /// Every candidate was refuted: more work would not help.
    None,
    OutOfWork,
}

/// What the two sweeps of a flat-subset search chose: (step, group, amount) each.
type Chosen = (Vec<(usize, usize, u64)>, Vec<(usize, usize, u64)>);

/// A flat-subset search ran out of its work allowance.
struct OutOfWork;

/// How a search for a flat subset went.
enum Found {
    Yes,
    No,
    /// Its work allowance ran out.
    OutOfWork,
}

/// Mixes one 64-bit value (SplitMix64's finaliser).
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A 128-bit hash of a flat-search state: the boundary and the amounts alive per end boundary.
fn state_key(boundary: usize, live: &BTreeMap<u32, u64>) -> u128 {
    let mut a = mix(boundary as u64 ^ 0x666C_6174_0000_0001);
    let mut b = mix((boundary as u64).wrapping_add(0x9E37_79B9_7F4A_7C15));
    for (&end, &amount) in live {
        for v in [u64::from(end), amount] {
            a = mix(a.rotate_left(23) ^ v);
            b = mix(b.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ v.wrapping_add(0x5851_F42D_4C95_7F2D));
        }
    }
    (u128::from(a) << 64) | u128::from(b)
}

/// A 128-bit hash of a component (its members, in the order given, which is sorted) and height.
fn component_key(members: &[u32], height: u64) -> u128 {
    let mut a = mix(height ^ 0x636F_6D70_0000_0001);
    let mut b = mix(height.wrapping_add(0x9E37_79B9_7F4A_7C15));
    for &m in members {
        a = mix(a.rotate_left(23) ^ u64::from(m));
        b = mix(b.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ u64::from(m).wrapping_add(0x5851_F42D_4C95_7F2D));
    }
    (u128::from(a) << 64) | u128::from(b)
}

impl Splitter {
    /// Spends `count` nodes at once (work that is not a search node, counted by its size).
    fn spend_many(&mut self, count: u64) -> bool {
        if self.nodes_left < count {
            self.nodes += self.nodes_left;
            self.nodes_left = 0;
            return false;
        }
        self.nodes_left -= count;
        self.nodes += count;
        true
    }

    fn spend(&mut self) -> bool {
        if self.nodes_left == 0 {
            return false;
        }
        self.nodes_left -= 1;
        self.nodes += 1;
        true
    }

    /// Places `part` in `[base, base + height)`, where every section of it is exactly full.
    fn solve_part(&mut self, mut part: Vec<u32>, height: u64, base: u64) -> bool {
        let items = &self.items;
        part.sort_unstable_by_key(|&l| (items[l as usize].lower, items[l as usize].upper, l));
        for range in split_components(&self.items, &part) {
            if !self.solve_component(part[range].to_vec(), height, base) {
                return false;
            }
        }
        true
    }

    /// Places one temporal component: peel, split, or search. Components that failed once (the
    /// same buffers at the same height, as alternative splits often meet) fail at once.
    fn solve_component(&mut self, component: Vec<u32>, height: u64, base: u64) -> bool {
        if !self.spend() {
            return false;
        }
        let key = component_key(&component, height);
        if self.failed.contains(&key) {
            return false;
        }
        let placed = self.solve_component_uncached(component, height, base);
        if !placed {
            self.failed.insert(key);
        }
        placed
    }

    fn solve_component_uncached(&mut self, component: Vec<u32>, height: u64, base: u64) -> bool {
        if let [only] = component[..] {
            self.offset[only as usize] = base;
            return self.items[only as usize].size == height;
        }
        let peeled = peelable(&self.items, &component);
        if !peeled.is_empty() {
            let mut top = base;
            for &l in &peeled {
                self.offset[l as usize] = top;
                top += self.items[l as usize].size;
            }
            let rest: Vec<u32> = component.iter().copied().filter(|l| !peeled.contains(l)).collect();
            let Some(left) = height.checked_sub(top - base) else { return false };
            return rest.is_empty() || self.solve_part(rest, left, top);
        }
        if self.depth < DEPTH_LIMIT {
            self.depth += 1;
            // One split at a time: most components take the first one found.
            let mut tried: Vec<(Vec<u32>, u64)> = Vec::new();
            while tried.len() < SPLIT_TRIES {
                let Some((lower, lower_height)) = self.next_split(&component, height, &tried) else { break };
                let upper: Vec<u32> = component.iter().copied().filter(|l| lower.binary_search(l).is_err()).collect();
                tried.push((lower.clone(), lower_height));
                if self.solve_part(lower, lower_height, base)
                    && self.solve_part(upper, height - lower_height, base + lower_height)
                {
                    self.depth -= 1;
                    return true;
                }
            }
            self.depth -= 1;
        }
        self.search_component(&component, height, base)
    }

    /// The exact search on a component that does not split (within `PART_SEARCH_WORK` nodes).
    fn search_component(&mut self, component: &[u32], height: u64, base: u64) -> bool {
        let sections = Sections::new(&self.items, component);
        if sections.totals.iter().any(|&t| t != height) {
            return false; // not zero slack after all
        }
        let Some(overlaps) = Overlaps::build(&self.items, component, OVERLAP_PAIR_LIMIT) else { return false };
        let ranks = search_ranks(&self.items, component, &sections);
        let mut work = PART_SEARCH_WORK.min(self.nodes_left);
        let mut limit = 4 * component.len() as u64;
        while work > 0 {
            for rank in &ranks {
                if work == 0 {
                    break;
                }
                let mut run = limit.min(work);
                let (outcome, used) = search(&self.items, component, &overlaps, &sections, rank, height, &mut run);
                work -= used;
                self.nodes_left -= used;
                self.nodes += used;
                match outcome {
                    SearchOutcome::Found(placement) => {
                        for (position, &l) in component.iter().enumerate() {
                            self.offset[l as usize] = base + placement.offsets[position];
                        }
                        return true;
                    }
                    SearchOutcome::Infeasible => return false,
                    SearchOutcome::BudgetExhausted => {}
                }
            }
            limit = limit.saturating_mul(2);
        }
        false
    }

    /// A flat subset of `component` not in `tried`, by the two searches in turn, each with a work
    /// limit that grows: either may be the quick one.
    fn next_split(&mut self, component: &[u32], height: u64, tried: &[(Vec<u32>, u64)]) -> Option<(Vec<u32>, u64)> {
        let mut work = FIND_FIRST_WORK;
        let (mut sparse_open, mut flow_open) = (true, true);
        while sparse_open || flow_open {
            if sparse_open {
                match self.flat_subset(component, height, tried, work) {
                    Search::Found(split) => return Some(split),
                    Search::None => sparse_open = false,
                    Search::OutOfWork => {}
                }
            }
            if flow_open {
                match self.flow_subset(component, height, tried, work) {
                    Search::Found(split) => return Some(split),
                    Search::None => flow_open = false,
                    Search::OutOfWork => {}
                }
            }
            if work >= FIND_WORK || self.nodes_left == 0 {
                break;
            }
            work = work.saturating_mul(4).min(FIND_WORK);
        }
        None
    }

    /// A flat subset of `component` (full height `height`), as (buffers, sorted, and height),
    /// of a height not in `tried`, within `work` nodes.
    ///
    /// The search starts from the section with the fewest buffers: a flat subset of height `a`
    /// holds buffers of exactly `a` bytes there, and given which, the rest of the subset is found
    /// by sweeping right from that section (the subset's buffers that end free bytes that starting
    /// ones must make up) and, independently, left (the same with time reversed).
    fn flat_subset(&mut self, component: &[u32], height: u64, tried: &[(Vec<u32>, u64)], work: u64) -> Search {
        let mut points: Vec<u32> =
            component.iter().flat_map(|&l| [self.items[l as usize].lower, self.items[l as usize].upper]).collect();
        points.sort_unstable();
        points.dedup();
        let sections = points.len().saturating_sub(1);
        let boundary = |t: u32| points.partition_point(|&p| p < t);
        let span: Vec<(usize, usize, u32)> = component
            .iter()
            .map(|&l| (boundary(self.items[l as usize].lower), boundary(self.items[l as usize].upper), l))
            .collect();
        let mut alive: Vec<Vec<u32>> = alloc::vec![Vec::new(); sections];
        for &(start, end, l) in &span {
            for section in start..end {
                alive[section].push(l);
            }
        }
        let mut sparse: Vec<usize> = (0..sections).collect();
        sparse.sort_unstable_by_key(|&section| (alive[section].len(), section));
        let Some(&chosen_section) = sparse.first() else { return Search::None };
        let items = self.items.clone();
        let sizes = |members: &[u32]| members.iter().map(|&l| items[l as usize].size).collect::<Vec<u64>>();
        // Heights to try: a flat subset's height is a subset sum of the buffers alive in every
        // section; those of the chosen section (all known when few), filtered by the next
        // sparsest sections. A flat subset's complement is flat, so heights up to half suffice.
        let base = SubsetSums::with_limit(sizes(&alive[chosen_section]).into_iter(), HEIGHTS_LIMIT);
        let mut heights: Vec<u64> = base
            .sums
            .iter()
            .copied()
            .filter(|&a| a > 0 && a <= height / 2 && tried.iter().all(|&(_, h)| h != a))
            .collect();
        for &section in sparse.iter().skip(1).take(FILTER_SECTIONS) {
            if heights.len() <= FILTERED_ENOUGH {
                break;
            }
            let section_sizes = sizes(&alive[section]);
            let filter = SubsetSums::with_limit(section_sizes.into_iter(), FILTER_SUMS_LIMIT);
            if !self.spend_many(filter.sums.len() as u64 / 64) {
                return Search::OutOfWork;
            }
            if filter.complete {
                heights.retain(|a| filter.sums.binary_search(a).is_ok());
            }
        }
        // Sections this full allow nearly every height: only the lowest are tried (thin slabs are
        // the usual first cut), and the flow search does the rest.
        heights.truncate(HEIGHTS_TRIED_LIMIT);
        // The chosen section's buffers, in classes of equal (start, end).
        let mut classes: BTreeMap<(usize, usize), Vec<u32>> = BTreeMap::new();
        for &(start, end, l) in &span {
            if start <= chosen_section && chosen_section < end {
                classes.entry((start, end)).or_default().push(l);
            }
        }
        let classes: Vec<((usize, usize), Group)> =
            classes.into_iter().map(|(key, members)| (key, self.group(key.1 as u32, members))).collect();
        let class_reach: Vec<SubsetSums> = (0..=classes.len())
            .map(|c| SubsetSums::new(classes[c..].iter().flat_map(|(_, g)| sizes(&g.members))))
            .collect();
        // Right of the chosen section: step i is boundary chosen + 1 + i; buffers join at their
        // start and leave at their end. Left of it: step i is boundary chosen - i; time reversed.
        let right_entries: Vec<(usize, usize, u32)> = span
            .iter()
            .filter(|&&(start, _, _)| start > chosen_section)
            .map(|&(start, end, l)| (start - chosen_section - 1, end - chosen_section - 1, l))
            .collect();
        let left_entries: Vec<(usize, usize, u32)> = span
            .iter()
            .filter(|&&(_, end, _)| end <= chosen_section)
            .map(|&(start, end, l)| (chosen_section - end, chosen_section - start, l))
            .collect();
        let mut right = self.direction(&right_entries, sections - chosen_section);
        let mut left = self.direction(&left_entries, chosen_section + 1);

        // Heights are tried in rounds, each with a work limit that doubles: refuting a wrong
        // height can take long, and the right one is usually quick.
        let mut total_work = work;
        let mut limit = FIND_FIRST_LIMIT;
        let mut pending = heights;
        let mut amounts: Vec<u64> = alloc::vec![0; classes.len()];
        while !pending.is_empty() && total_work > 0 {
            let mut unsettled = Vec::new();
            for &lower_height in &pending {
                if total_work == 0 {
                    break;
                }
                let mut work = limit.min(total_work);
                let before = work;
                // Each height costs a node at least, however soon it is refuted.
                if !self.spend() {
                    return Search::OutOfWork;
                }
                work -= 1;
                amounts.fill(0);
                let search = ClassSearch { classes: &classes, reach: &class_reach, chosen_section };
                let outcome =
                    self.class_amounts(&search, 0, lower_height, &mut amounts, &mut right, &mut left, &mut work);
                total_work -= before - work;
                match outcome {
                    Ok(Some((right_chosen, left_chosen))) => {
                        let mut lower = Vec::new();
                        let mut ok = true;
                        for (c, (_, group)) in classes.iter().enumerate() {
                            ok &= self.pick_into(&group.members, amounts[c], &mut lower);
                        }
                        for &(step, g, amount) in &right_chosen {
                            ok &= self.pick_into(&right.groups[step][g].members, amount, &mut lower);
                        }
                        for &(step, g, amount) in &left_chosen {
                            ok &= self.pick_into(&left.groups[step][g].members, amount, &mut lower);
                        }
                        if ok {
                            lower.sort_unstable();
                            return Search::Found((lower, lower_height));
                        }
                    }
                    Ok(None) => {}
                    Err(OutOfWork) => unsettled.push(lower_height),
                }
            }
            pending = unsettled;
            limit = limit.saturating_mul(2);
        }
        if pending.is_empty() {
            Search::None
        } else {
            Search::OutOfWork
        }
    }

    /// A flat subset found as a balanced flow (`balance`), for components whose sections all hold
    /// many buffers.
    /// (The first one not in `tried`.)
    fn flow_subset(&mut self, component: &[u32], height: u64, tried: &[(Vec<u32>, u64)], work: u64) -> Search {
        let network = Network::new(&self.items, component);
        let (flows, spent, complete) = network.flat_subsets(height, tried.len() + 1, work, &mut self.nodes_left);
        self.nodes += spent;
        for (flow, lower_height) in flows {
            let mut lower = Vec::new();
            let mut ok = true;
            for (e, amount) in flow {
                ok &= self.pick_into(network.members(e), amount, &mut lower);
            }
            lower.sort_unstable();
            if ok && !tried.iter().any(|(other, h)| *h == lower_height && *other == lower) {
                return Search::Found((lower, lower_height));
            }
        }
        if complete {
            Search::None
        } else {
            Search::OutOfWork
        }
    }

    /// A group of buffers ending (in its sweep) at step `end`.
    fn group(&self, end: u32, mut members: Vec<u32>) -> Group {
        members.sort_unstable_by_key(|&l| (core::cmp::Reverse(self.items[l as usize].size), l));
        let sums = SubsetSums::new(members.iter().map(|&l| self.items[l as usize].size));
        let total = members.iter().map(|&l| self.items[l as usize].size).sum();
        Group { end, total, members, sums }
    }

    /// One sweep direction from `(near step, far step, buffer)` entries over `steps` steps.
    fn direction(&self, entries: &[(usize, usize, u32)], steps: usize) -> Direction {
        let mut by_near: Vec<BTreeMap<usize, Vec<u32>>> = alloc::vec![BTreeMap::new(); steps];
        for &(near, far, l) in entries {
            if let Some(slot) = by_near.get_mut(near) {
                slot.entry(far).or_default().push(l);
            }
        }
        let groups: Vec<Vec<Group>> = by_near
            .into_iter()
            .map(|ends| ends.into_iter().map(|(far, members)| self.group(far as u32, members)).collect())
            .collect();
        let reach = groups
            .iter()
            .map(|groups| {
                (0..=groups.len())
                    .map(|g| {
                        SubsetSums::new(
                            groups[g..].iter().flat_map(|x| x.members.iter().map(|&l| self.items[l as usize].size)),
                        )
                    })
                    .collect()
            })
            .collect();
        Direction { groups, reach, failed: BTreeSet::new() }
    }

    /// Chooses amounts of the chosen section's classes `c..` adding up to `needed`, then sweeps
    /// both ways; returns what each sweep chose, if both complete.
    #[allow(clippy::too_many_arguments)]
    fn class_amounts(
        &mut self,
        search: &ClassSearch<'_>,
        c: usize,
        needed: u64,
        amounts: &mut [u64],
        right: &mut Direction,
        left: &mut Direction,
        work: &mut u64,
    ) -> Result<Option<Chosen>, OutOfWork> {
        if c == search.classes.len() {
            if needed > 0 {
                return Ok(None);
            }
            let mut right_live: BTreeMap<u32, u64> = BTreeMap::new();
            let mut left_live: BTreeMap<u32, u64> = BTreeMap::new();
            for (((start, end), _), &amount) in search.classes.iter().zip(amounts.iter()) {
                if amount > 0 {
                    *right_live.entry((end - search.chosen_section - 1) as u32).or_default() += amount;
                    *left_live.entry((search.chosen_section - *start) as u32).or_default() += amount;
                }
            }
            let mut right_chosen = Vec::new();
            match self.next_step(right, 0, right_live, &mut right_chosen, work) {
                Found::Yes => {}
                Found::No => return Ok(None),
                Found::OutOfWork => return Err(OutOfWork),
            }
            let mut left_chosen = Vec::new();
            return match self.next_step(left, 0, left_live, &mut left_chosen, work) {
                Found::Yes => Ok(Some((right_chosen, left_chosen))),
                Found::No => Ok(None),
                Found::OutOfWork => Err(OutOfWork),
            };
        }
        if *work == 0 || !self.spend() {
            return Err(OutOfWork);
        }
        *work -= 1;
        let group = &search.classes[c].1;
        let candidates = group.sums.candidates(needed, group.total, true);
        for amount in candidates {
            if amount > needed || !search.reach[c + 1].may_contain(needed - amount) {
                continue;
            }
            if *work == 0 || !self.spend() {
                return Err(OutOfWork);
            }
            *work -= 1;
            amounts[c] = amount;
            if let Some(found) = self.class_amounts(search, c + 1, needed - amount, amounts, right, left, work)? {
                return Ok(Some(found));
            }
        }
        amounts[c] = 0;
        Ok(None)
    }

    /// At step `i` of a sweep, chooses amounts of its groups `g..` adding up to `needed` (bytes
    /// that must join the subset there), adds them to `live` (amount alive per far step), then
    /// goes on to the next step. `chosen` records (step, group, amount) on the way.
    #[allow(clippy::too_many_arguments)]
    fn amounts(
        &mut self,
        direction: &mut Direction,
        i: usize,
        g: usize,
        needed: u64,
        live: BTreeMap<u32, u64>,
        chosen: &mut Vec<(usize, usize, u64)>,
        work: &mut u64,
    ) -> Found {
        let count = direction.groups[i].len();
        if g == count {
            if needed > 0 {
                return Found::No;
            }
            return self.next_step(direction, i + 1, live, chosen, work);
        }
        if *work == 0 || !self.spend() {
            return Found::OutOfWork;
        }
        *work -= 1;
        let (end, candidates) = {
            let group = &direction.groups[i][g];
            (group.end, group.sums.candidates(needed, group.total, g + 1 < count || needed == 0))
        };
        for amount in candidates {
            if amount > needed || (g + 1 == count && amount != needed) {
                continue;
            }
            if !direction.reach[i][g + 1].may_contain(needed - amount) {
                continue; // the later groups cannot make up the rest
            }
            if *work == 0 || !self.spend() {
                return Found::OutOfWork;
            }
            *work -= 1;
            let mut next = live.clone();
            if amount > 0 {
                *next.entry(end).or_default() += amount;
                chosen.push((i, g, amount));
            }
            let outcome = self.amounts(direction, i, g + 1, needed - amount, next, chosen, work);
            if amount > 0 && !matches!(outcome, Found::Yes) {
                chosen.pop();
            }
            match outcome {
                Found::No => {}
                settled => return settled,
            }
        }
        Found::No
    }

    /// Moves to step `i` of a sweep: the subset's buffers leaving there free their amount, which
    /// the buffers joining there must make up. Steps with nothing to choose are passed in a loop.
    fn next_step(
        &mut self,
        direction: &mut Direction,
        mut i: usize,
        mut live: BTreeMap<u32, u64>,
        chosen: &mut Vec<(usize, usize, u64)>,
        work: &mut u64,
    ) -> Found {
        loop {
            if i + 1 >= direction.groups.len() {
                return Found::Yes; // the last step: everything alive leaves here
            }
            let needed = live.remove(&(i as u32)).unwrap_or(0);
            if needed == 0 {
                i += 1; // nothing joins here
                continue;
            }
            let key = state_key(i, &live) ^ u128::from(needed);
            if direction.failed.contains(&key) {
                return Found::No;
            }
            let outcome = self.amounts(direction, i, 0, needed, live, chosen, work);
            if matches!(outcome, Found::No) {
                direction.failed.insert(key);
            }
            return outcome;
        }
    }

    /// Adds members of `members` (largest first) adding up to `amount` to `out`; `false` if
    /// none was found.
    fn pick_into(&mut self, members: &[u32], amount: u64, out: &mut Vec<u32>) -> bool {
        let mut picked = Vec::new();
        let mut work = 10_000u32;
        let ok = self.pick(members, 0, amount, &mut picked, &mut work);
        out.extend(picked);
        ok
    }

    /// Picks members `from..` (largest first) adding up to `amount`.
    fn pick(&mut self, members: &[u32], from: usize, amount: u64, picked: &mut Vec<u32>, work: &mut u32) -> bool {
        if amount == 0 {
            return true;
        }
        if *work == 0 || !self.spend() {
            return false;
        }
        *work -= 1;
        let mut previous: Option<u64> = None;
        for i in from..members.len() {
            let size = self.items[members[i] as usize].size;
            if size > amount || previous == Some(size) {
                continue; // too large, or an equal size was tried at this position
            }
            previous = Some(size);
            picked.push(members[i]);
            if self.pick(members, i + 1, amount - size, picked, work) {
                return true;
            }
            picked.pop();
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_flat_subset_of_two_slabs() {
        // Two slabs, 3 and 5 high, each cut in time at a different step: the component is one
        // (the cuts overlap) and its only flat subsets are the slabs.
        let items = [
            Item { lower: 0, upper: 2, size: 3 },
            Item { lower: 2, upper: 4, size: 3 },
            Item { lower: 0, upper: 3, size: 5 },
            Item { lower: 3, upper: 4, size: 5 },
        ];
        let mut splitter = Splitter {
            items: items.to_vec(),
            offset: alloc::vec![0; 4],
            failed: BTreeSet::new(),
            nodes_left: 1000,
            nodes: 0,
            depth: 0,
        };
        assert_eq!(splitter.next_split(&[0, 1, 2, 3], 8, &[]), Some((alloc::vec![0, 1], 3)));
        let mut budget = 1000;
        let (placement, _) = place(&items, &[0, 1, 2, 3], 8, &mut budget);
        let placement = placement.expect("two slabs stack");
        assert_eq!(placement.peak, 8);
        assert_eq!(placement.offsets, [0, 0, 3, 3]);
    }
}
