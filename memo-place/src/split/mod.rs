//! Flat splits: placing a component at a capacity where every time section is exactly full
//! (zero slack). A *flat* subset (the same live total `a` in every section) can be placed in
//! `[0, a)` and the rest in `[a, capacity)`, each part zero slack again: so it splits in time, by
//! peeling, by another flat subset, as a pinwheel ([`pinwheel`]), and what is left goes to the
//! exact search (`search`), but for the whole component, left to the caller's. Two searches find
//! flat subsets, taking turns with a growing allowance, each resuming where it stopped: [`sparse`]
//! (heights from the sparsest section's subset sums) and [`flow`] (a balanced flow over the section
//! boundaries, for crowded components). Not complete: `place` only ever reports placements.

mod flow;
mod pinwheel;
mod sparse;

use alloc::collections::BTreeSet;
use alloc::vec::Vec;
use core::cell::OnceCell;

use super::control::Control;
use super::decompose::{peelable, split_components};
use super::fillers::{self, Filler};
use super::greedy::{ComponentPlacement, Overlaps};
use super::search::{search, Component, SearchOutcome, Shared, Style, CONTENTION_RESTART};
use super::sections::Sections;
use super::{search_ranks, Item};
use crate::rng::mix;
use crate::tuning::*;

/// Places `members` under `capacity`, every section exactly full, by flat splits within
/// `*nodes_left` nodes; the members from position `own` on are fillers. The placement (offsets by
/// position in `members`) if one was found, and the nodes spent.
pub(crate) fn place(
    items: &[Item],
    members: &[u32],
    own: usize,
    capacity: u64,
    nodes_left: &mut u64,
    control: &mut Control,
) -> (Option<ComponentPlacement>, u64) {
    let (placement, spent) = Splitter::new(items, members, own, *nodes_left, control).place(capacity);
    *nodes_left -= spent;
    (placement, spent)
}

/// The nodes a split search may still spend, and has spent, and the stop callback. A stop sets
/// `left` to 0 without counting the nodes as spent.
struct Budget<'b, 'c> {
    left: u64,
    spent: u64,
    control: &'b mut Control<'c>,
}

impl Budget<'_, '_> {
    fn spend(&mut self) -> bool {
        self.spend_many(1)
    }

    /// Spends `count` nodes at once (work that is not one search node, counted by its size).
    fn spend_many(&mut self, count: u64) -> bool {
        if self.control.tick(count.min(self.left)) {
            self.left = 0;
            return false;
        }
        self.record(count)
    }

    /// Takes `count` nodes that the exact search counted itself off the budget.
    fn record(&mut self, count: u64) -> bool {
        if self.left < count {
            self.spent += self.left;
            self.left = 0;
            return false;
        }
        self.left -= count;
        self.spent += count;
        true
    }

    /// Spends a node from both the budget and a search's own allowance `work`.
    fn charge(&mut self, work: &mut u64) -> bool {
        if *work == 0 || !self.spend() {
            return false;
        }
        *work -= 1;
        true
    }
}

/// How a resumable flat-subset search ended a call.
enum Step {
    /// A flat subset: its buffers (sorted) and height.
    Found((Vec<u32>, u64)),
    /// Nothing left to try.
    Done,
    /// The allowance ran out; a later call goes on.
    OutOfWork,
}

/// Attempts tried in rounds: the first `window` pending attempts, each with a work limit; those
/// that run out stay pending, and after a round the limit and the window double. Resumable.
struct Rounds<T> {
    pending: Vec<T>,
    window: usize,
    limit: u64,
    /// Position in the current round.
    cursor: usize,
    /// Attempts of the current round that ran out of work.
    unsettled: Vec<T>,
}

impl<T: Copy> Rounds<T> {
    fn new(pending: Vec<T>, window: usize, limit: u64) -> Rounds<T> {
        Rounds { pending, window, limit, cursor: 0, unsettled: Vec::new() }
    }

    /// The next attempt and its work limit, or `None` when none is left.
    fn next(&mut self) -> Option<(T, u64)> {
        if self.cursor >= self.window.min(self.pending.len()) {
            // The round is over: the unsettled ones first, then those beyond the window.
            let beyond = self.pending.split_off(self.window.min(self.pending.len()));
            self.pending = core::mem::take(&mut self.unsettled);
            self.pending.extend(beyond);
            self.cursor = 0;
            self.limit = self.limit.saturating_mul(2);
            self.window = self.window.saturating_mul(2);
            if self.pending.is_empty() {
                return None;
            }
        }
        self.cursor += 1;
        Some((self.pending[self.cursor - 1], self.limit))
    }

    /// Puts `attempts` next in the current round, except those tried in this round already.
    fn put_next(&mut self, attempts: Vec<T>)
    where
        T: Ord,
    {
        let mut tried: Vec<T> = self.pending[..self.cursor].to_vec();
        tried.extend(self.unsettled.iter().copied());
        tried.sort_unstable();
        let front: Vec<T> = attempts.into_iter().filter(|a| tried.binary_search(a).is_err()).collect();
        let mut fresh = front.clone();
        fresh.sort_unstable();
        let rest: Vec<T> = self.pending.split_off(self.cursor);
        self.window = self.window.saturating_add(front.len());
        self.pending.extend(front);
        self.pending.extend(rest.into_iter().filter(|a| fresh.binary_search(a).is_err()));
    }

    /// The attempt last returned ran out of work: it stays for the next round.
    fn unsettled(&mut self, attempt: T) {
        self.unsettled.push(attempt);
    }
}

/// The smallest distinct subset sums of a multiset (0 included), sorted; their complements
/// (`total` minus each) are subset sums too, so the largest sums are known as well.
#[derive(Clone)]
struct SubsetSums {
    sums: Vec<u64>,
    /// Whether `sums` holds every subset sum (else only the smallest ones).
    complete: bool,
    /// The sum of all sizes (saturating; the solver keeps footprints below 2^64).
    total: u64,
    /// Entries merged to compute them: the work, charged in nodes by `SUMS_PER_NODE`.
    cost: u64,
}

impl SubsetSums {
    fn new(sizes: impl Iterator<Item = u64>) -> SubsetSums {
        Self::with_limit(sizes, SUBSET_SUMS_LIMIT)
    }

    /// The smallest `limit` distinct subset sums at most.
    fn with_limit(sizes: impl Iterator<Item = u64>, limit: usize) -> SubsetSums {
        let mut sums = SubsetSums { sums: alloc::vec![0], complete: true, total: 0, cost: 0 };
        sums.add(sizes, limit);
        sums
    }

    /// The distinct subset sums up to `bound` (at most the smallest `limit`).
    fn up_to(sizes: impl Iterator<Item = u64>, bound: u64, limit: usize) -> SubsetSums {
        let mut sums = SubsetSums { sums: alloc::vec![0], complete: true, total: 0, cost: 0 };
        sums.add_bounded(sizes, limit, bound);
        sums
    }

    /// These sums with more sizes added, keeping at most `limit`.
    fn add(&mut self, sizes: impl Iterator<Item = u64>, limit: usize) {
        self.add_bounded(sizes, limit, u64::MAX);
    }

    /// These sums with more sizes added, at most `limit`, none above `bound` (`complete` up to it).
    fn add_bounded(&mut self, sizes: impl Iterator<Item = u64>, limit: usize, bound: u64) {
        let sums = &mut self.sums;
        let mut next: Vec<u64> = Vec::new();
        for s in sizes {
            self.total = self.total.saturating_add(s);
            // Merge `sums` and `sums + s` without repeats, keeping the smallest `limit`.
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
                if value > bound {
                    // Both runs are sorted: everything left is above the bound too.
                    i = sums.len();
                    j = sums.len();
                    break;
                }
                if next.last() != Some(&value) {
                    next.push(value);
                }
            }
            if i < sums.len() || (j < sums.len() && sums[j].checked_add(s).is_some()) {
                self.complete = false;
            }
            self.cost += (i + j) as u64;
            core::mem::swap(sums, &mut next);
        }
    }

    /// Sums up to this are all in `sums` (the ones not there are no subset sums).
    fn exact_to(&self) -> u64 {
        if self.complete {
            u64::MAX
        } else {
            self.sums.last().copied().unwrap_or(0)
        }
    }

    /// Whether `value` is a known subset sum: stored, or the complement of a stored one.
    fn is_known(&self, value: u64) -> bool {
        self.sums.binary_search(&value).is_ok()
            || (self.has_complements()
                && self.total.checked_sub(value).is_some_and(|c| self.sums.binary_search(&c).is_ok()))
    }

    /// Whether complements (`total` minus a known sum) can be trusted: not if `total` saturated.
    fn has_complements(&self) -> bool {
        self.total < u64::MAX
    }

    /// Whether `value` may be a subset sum: `false` only when it is proven not to be.
    fn may_contain(&self, value: u64) -> bool {
        let exact = self.exact_to();
        if value <= exact {
            return self.sums.binary_search(&value).is_ok();
        }
        if !self.has_complements() {
            return true; // incomplete (`exact` is below `value`)
        }
        match self.total.checked_sub(value) {
            None => false,
            Some(complement) if complement <= exact => self.sums.binary_search(&complement).is_ok(),
            Some(_) => true,
        }
    }

    /// The known subset sums in `low..=high`, ascending.
    fn between(&self, low: u64, high: u64) -> &[u64] {
        let start = self.sums.partition_point(|&s| s < low);
        let end = self.sums.partition_point(|&s| s <= high);
        &self.sums[start..end.max(start)]
    }
}

/// Buffers that join a sweep at one step and leave it at one step (`end`), and their subset sums.
#[derive(Clone)]
struct Group {
    end: u32,
    total: u64,
    /// Local buffers, largest first.
    members: Vec<u32>,
    /// Their sizes, in the same order.
    sizes: Vec<u64>,
    sums: SubsetSums,
    /// Every subset sum, as a bitset over `0..=total`, built when first needed (see `has_amount`).
    all_sums: OnceCell<Option<Vec<u64>>>,
}

impl Group {
    fn new(items: &[Item], end: u32, mut members: Vec<u32>) -> Group {
        members.sort_unstable_by_key(|&l| (core::cmp::Reverse(items[l as usize].size), l));
        let sizes: Vec<u64> = members.iter().map(|&l| items[l as usize].size).collect();
        let sums = SubsetSums::new(sizes.iter().copied());
        let total = sizes.iter().sum();
        Group { end, total, members, sizes, sums, all_sums: OnceCell::new() }
    }

    /// The amounts worth trying when `most` must be made up by this group and the later ones
    /// (`later`: their subset sums): the whole group, none (if `zero`), exactly `most`, the group's
    /// other known sums, largest first; for a crowded group, last, `most` less each of the later
    /// groups' sums (a cut through a stack of one lifetime takes an amount from its middle).
    /// Amounts that are not known sums are checked by callers with `has_amount`.
    fn candidates(&self, most: u64, zero: bool, later: &SubsetSums) -> Vec<u64> {
        let mut out: Vec<u64> = Vec::new();
        if self.total <= most {
            out.push(self.total);
        }
        if zero {
            out.push(0);
        }
        // Not when `most` is 0: that is "none" again.
        if 0 < most && most < self.total && self.sums.may_contain(most) {
            out.push(most);
        }
        out.extend(self.sums.between(1, most).iter().rev().copied().filter(|&a| a != most && a < self.total));
        if !self.sums.complete && later.complete {
            let mut seen: BTreeSet<u64> = out.iter().copied().collect();
            let middle: Vec<u64> =
                later.between(1, most).iter().map(|&r| most - r).filter(|&a| a < self.total).collect();
            out.extend(middle.into_iter().filter(|&a| seen.insert(a)));
        }
        out
    }

    /// Whether some of the group's buffers add up to `amount`; `None` when out of work: checked
    /// against all the group's sums (a bitset up to `ALL_SUMS_MOST_BITS`, else a bounded search),
    /// so that a sweep never goes on with an amount `pick` cannot realise.
    fn has_amount(&self, amount: u64, budget: &mut Budget, work: &mut u64) -> Option<bool> {
        if amount > self.total {
            return Some(false);
        }
        if self.sums.complete || self.sums.is_known(amount) {
            return Some(self.sums.is_known(amount));
        }
        let all = self.all_sums.get_or_init(|| {
            let bits = self.total.checked_add(1).filter(|&b| b <= ALL_SUMS_MOST_BITS)?;
            let (all, cost) = all_subset_sums(&self.sizes, bits as usize);
            budget.spend_many(cost / SUMS_PER_NODE);
            Some(all)
        });
        match all {
            Some(all) => Some(all[(amount / 64) as usize] >> (amount % 64) & 1 == 1),
            None => witness(&self.sizes, amount, budget, work),
        }
    }
}

/// Every subset sum of `sizes` below `bits`, as a bitset; also the work, in words shifted.
fn all_subset_sums(sizes: &[u64], bits: usize) -> (Vec<u64>, u64) {
    let words = bits.div_ceil(64).max(1);
    let mut all = alloc::vec![0u64; words];
    all[0] = 1;
    let mut top = 0; // the highest word with a bit set
    let mut cost = 0;
    for &size in sizes {
        let Ok(shift) = usize::try_from(size / 64) else { continue };
        if shift >= words {
            continue; // every sum with it is out of range
        }
        let offset = (size % 64) as u32;
        top = (top + shift + 1).min(words - 1);
        // From the top down, so every word read is still the one before this size.
        for w in (shift..=top).rev() {
            let mut moved = all[w - shift] << offset;
            if offset > 0 && w > shift {
                moved |= all[w - shift - 1] >> (64 - offset);
            }
            all[w] |= moved;
        }
        cost += (top + 1 - shift) as u64;
    }
    (all, cost)
}

/// Whether some of `sizes` (largest first) add up to `amount`, within `PICK_WORK` nodes; `None`
/// when the budget or the allowance `work` ran out first.
fn witness(sizes: &[u64], amount: u64, budget: &mut Budget, work: &mut u64) -> Option<bool> {
    let mut local = PICK_WORK.min(*work);
    let start = local;
    let mut picked = Vec::new();
    let found = pick_from(sizes, 0, amount, &mut picked, budget, &mut local);
    *work -= start - local;
    if found {
        Some(true)
    } else if budget.left == 0 || (local == 0 && start < PICK_WORK) {
        None // stopped by the budget or the caller's allowance, not by `PICK_WORK`
    } else {
        Some(false)
    }
}

/// Adds members of `members` (largest first) adding up to `amount` to `out`; `false` if none was
/// found within `PICK_WORK` nodes.
fn pick(items: &[Item], members: &[u32], amount: u64, out: &mut Vec<u32>, budget: &mut Budget) -> bool {
    let sizes: Vec<u64> = members.iter().map(|&l| items[l as usize].size).collect();
    let mut picked = Vec::new();
    let mut work = PICK_WORK;
    let ok = pick_from(&sizes, 0, amount, &mut picked, budget, &mut work);
    out.extend(picked.into_iter().map(|i| members[i]));
    ok
}

/// Depth-first: positions of `sizes[from..]` (largest first) adding up to `amount`, into `picked`.
fn pick_from(
    sizes: &[u64],
    from: usize,
    amount: u64,
    picked: &mut Vec<usize>,
    budget: &mut Budget,
    work: &mut u64,
) -> bool {
    if amount == 0 {
        return true;
    }
    if !budget.charge(work) {
        return false;
    }
    let mut previous: Option<u64> = None;
    for i in from..sizes.len() {
        let size = sizes[i];
        if size > amount || previous == Some(size) {
            continue; // too large, or an equal size was tried at this position
        }
        previous = Some(size);
        picked.push(i);
        if pick_from(sizes, i + 1, amount - size, picked, budget, work) {
            return true;
        }
        picked.pop();
        if *work == 0 {
            return false;
        }
    }
    false
}

/// A 128-bit hash of a sequence of values.
fn hash(values: impl Iterator<Item = u64>) -> u128 {
    let mut a = 0x666C_6174_0000_0001u64;
    let mut b = 0x9E37_79B9_7F4A_7C15u64;
    for v in values {
        a = mix(a.rotate_left(23) ^ v);
        b = mix(b.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ v.wrapping_add(0x5851_F42D_4C95_7F2D));
    }
    (u128::from(a) << 64) | u128::from(b)
}

struct Splitter<'b, 'c> {
    /// The component's buffers, then its fillers, then the fillers of parts cut anew (appended).
    items: Vec<Item>,
    offset: Vec<u64>,
    /// Components (hashed members and height) that could not be placed.
    failed: BTreeSet<u128>,
    budget: Budget<'b, 'c>,
    depth: u32,
    /// Items from this index on are fillers.
    own: usize,
    /// The number of buffers and fillers `place` was given.
    whole: usize,
    /// Nodes the parts whose fillers are cut anew may still take (`refill`).
    refill_work: u64,
    /// Whether a part with fillers cut anew is being placed (its own parts are not cut anew).
    refilling: bool,
}

impl<'b, 'c> Splitter<'b, 'c> {
    /// A splitter of `members`, the first `own` of them buffers and the rest fillers.
    fn new(items: &[Item], members: &[u32], own: usize, nodes_left: u64, control: &'b mut Control<'c>) -> Self {
        let local: Vec<Item> = members.iter().map(|&m| items[m as usize]).collect();
        let n = local.len();
        Splitter {
            items: local,
            offset: alloc::vec![0; n],
            failed: BTreeSet::new(),
            budget: Budget { left: nodes_left, spent: 0, control },
            depth: 0,
            own,
            whole: n,
            refill_work: REFILL_WORK_PER_BUFFER.saturating_mul(n as u64),
            refilling: false,
        }
    }

    /// [`place`] with this splitter: the placement if one was found, and the nodes spent.
    fn place(mut self, capacity: u64) -> (Option<ComponentPlacement>, u64) {
        let (n, own) = (self.whole, self.own.min(self.whole));
        let placed = self.solve_part((0..n as u32).collect(), capacity, 0);
        // Not `budget.left`: a stop zeroes it without spending the nodes.
        let spent = self.budget.spent;
        let placement = placed.then(|| {
            let peak = (0..own).map(|l| self.offset[l] + self.items[l].size).max().unwrap_or(0);
            self.offset.truncate(n); // fillers of parts cut anew are not the caller's
            ComponentPlacement { offsets: self.offset, peak }
        });
        (placement, spent)
    }
}

impl Splitter<'_, '_> {
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

    /// Places one temporal component (peel, split, or search); one that failed before fails at once.
    fn solve_component(&mut self, component: Vec<u32>, height: u64, base: u64) -> bool {
        if !self.budget.spend() {
            return false;
        }
        let key = hash(core::iter::once(height).chain(component.iter().map(|&m| u64::from(m))));
        if self.failed.contains(&key) {
            return false;
        }
        // A part with fillers (not the whole component) may be placed with its fillers cut anew.
        let refillable = self.own < self.whole
            && !self.refilling
            && self.refill_work > 0
            && !self.is_whole(&component)
            && component.iter().any(|&l| l as usize >= self.own);
        let kept = refillable.then(|| component.clone());
        let mut placed = self.solve_component_uncached(component, height, base);
        if let (false, Some(component)) = (placed, kept) {
            placed = self.refill(&component, height, base);
        }
        // A failure is final unless the budget ran out meanwhile.
        if !placed && self.budget.left > 0 {
            self.failed.insert(key);
        }
        placed
    }

    /// Places `component` with its fillers cut anew: each other set of the fewest fillers its slack
    /// takes (`fillers::fewest`) in turn, while `refill_work` lasts (the caller's fillers come from
    /// the whole profile, which often does not say where the holes are).
    fn refill(&mut self, component: &[u32], height: u64, base: u64) -> bool {
        let sections = Sections::new(&self.items, component);
        let mut slack = alloc::vec![0u64; sections.len()];
        let mut current = Vec::new();
        let mut own = Vec::new();
        for &l in component {
            let item = self.items[l as usize];
            if (l as usize) < self.own {
                own.push(l);
                continue;
            }
            let range = sections.range_of(&item);
            current.push(Filler { first: range.start, end: range.end, height: item.size });
            slack[range].iter_mut().for_each(|s| *s += item.size);
        }
        current.sort_unstable();
        // Each set's fillers appended as new items, so no failure cached for one is taken for another.
        let mut parts: Vec<Vec<u32>> = fillers::fewest(&slack, REFILL_VARIANTS, REFILL_FEWEST_WORK)
            .into_iter()
            .filter(|variant| *variant != current)
            .map(|variant| {
                let mut part = own.clone();
                for f in &variant {
                    let (lower, upper) = sections.steps(f.first, f.end - f.first);
                    part.push(self.items.len() as u32);
                    self.items.push(Item { lower, upper, size: f.height });
                    self.offset.push(0);
                }
                part
            })
            .collect();
        // The sets take turns, four times the allowance a round; a set that fails within it leaves.
        let mut allowance = REFILL_FIRST_WORK_PER_BUFFER.saturating_mul(component.len() as u64);
        while !parts.is_empty() {
            let mut index = 0;
            while index < parts.len() {
                if self.refill_work == 0 || self.budget.left == 0 {
                    return false;
                }
                let nodes = allowance.min(self.refill_work);
                let spent_before = self.budget.spent;
                self.refilling = true;
                let part = parts[index].clone();
                let placed = self.within(nodes, |s| s.solve_part(part, height, base));
                self.refilling = false;
                let spent = self.budget.spent - spent_before;
                self.refill_work = self.refill_work.saturating_sub(spent);
                if placed {
                    return true;
                }
                if spent < nodes {
                    parts.remove(index);
                } else {
                    index += 1;
                }
            }
            allowance = allowance.saturating_mul(4);
        }
        false
    }

    /// Runs `f` with at most `nodes` of the budget, the rest given back unless a stop came.
    fn within<R>(&mut self, nodes: u64, f: impl FnOnce(&mut Self) -> R) -> R {
        let held_back = self.budget.left.saturating_sub(nodes);
        self.budget.left -= held_back;
        let result = f(self);
        if !self.budget.control.stopped() {
            self.budget.left += held_back;
        }
        result
    }

    /// Whether `component` is the whole one `place` was given.
    fn is_whole(&self, component: &[u32]) -> bool {
        !self.refilling && component.len() == self.whole
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
        if self.depth < SPLIT_DEPTH_LIMIT {
            self.depth += 1;
            // One split at a time: most components take the first one found.
            let mut finder = Finder::new(&self.items, &component, height, &mut self.budget);
            for _ in 0..SPLIT_TRIES {
                let Some((lower, lower_height)) = finder.next(&self.items, &mut self.budget) else { break };
                let upper: Vec<u32> = component.iter().copied().filter(|l| lower.binary_search(l).is_err()).collect();
                if self.solve_part(lower, lower_height, base)
                    && self.solve_part(upper, height - lower_height, base + lower_height)
                {
                    self.depth -= 1;
                    return true;
                }
            }
            // No flat split placed it: a pinwheel may.
            if self.pinwheel(&component, height, base) {
                self.depth -= 1;
                return true;
            }
            self.depth -= 1;
        }
        if self.is_whole(&component) {
            // Nothing split off: the caller's search takes the whole (BENCHMARKS.md, "Ninth pass").
            return false;
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
        let mut shared = Shared::new(&self.items, component, &sections, height);
        let mut work = PART_SEARCH_WORK.min(self.budget.left);
        let mut limit = 4 * component.len() as u64;
        while work > 0 {
            for (index, rank) in ranks.iter().enumerate() {
                if index == CONTENTION_RESTART {
                    continue; // zero slack: no canonical part to rank afresh, the same search again
                }
                let order = if index > CONTENTION_RESTART { index - 1 } else { index };
                if work == 0 {
                    break;
                }
                let mut run = limit.min(work);
                let (outcome, used) = search(
                    Component { items: &self.items, members: component, overlaps: &overlaps, sections: &sections },
                    rank,
                    // The rank alone: the guided value order settled fewer pinwheels here.
                    Style { guided: false, rightmost: order % 2 == 1, contention: false, by_section: false },
                    &mut shared,
                    height,
                    &mut run,
                    self.budget.control,
                );
                work -= used;
                self.budget.record(used);
                if self.budget.control.stopped() {
                    self.budget.left = 0;
                    return false;
                }
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
}

/// Both flat-subset searches of one component, taking turns, each going on where it stopped.
struct Finder {
    sparse: Option<sparse::Search>,
    flow: Option<flow::Search>,
    work: u64,
    /// Subsets returned already (the two searches may find the same one).
    returned: Vec<Vec<u32>>,
}

impl Finder {
    fn new(items: &[Item], component: &[u32], height: u64, budget: &mut Budget) -> Finder {
        Finder {
            sparse: sparse::Search::new(items, component, height, budget),
            flow: Some(flow::Search::new(items, component, height, budget)),
            work: FIND_FIRST_WORK,
            returned: Vec::new(),
        }
    }

    /// The next flat subset (buffers sorted, height), if one is found within the rounds left.
    fn next(&mut self, items: &[Item], budget: &mut Budget) -> Option<(Vec<u32>, u64)> {
        loop {
            for sparse_turn in [true, false] {
                loop {
                    let step = if sparse_turn {
                        self.sparse.as_mut().map(|s| s.run(items, budget, self.work))
                    } else {
                        self.flow.as_mut().map(|s| s.run(items, budget, self.work))
                    };
                    match step {
                        Some(Step::Found((lower, height))) => {
                            if !self.returned.contains(&lower) {
                                self.returned.push(lower.clone());
                                return Some((lower, height));
                            }
                            // Found by the other search already: go on with this one.
                        }
                        Some(Step::Done) => {
                            if sparse_turn {
                                self.sparse = None;
                            } else {
                                self.flow = None;
                            }
                            break;
                        }
                        Some(Step::OutOfWork) | None => break,
                    }
                }
            }
            if (self.sparse.is_none() && self.flow.is_none()) || budget.left == 0 || self.work >= FIND_WORK {
                return None;
            }
            self.work = (self.work * 4).min(FIND_WORK);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Progress;

    fn two_slabs() -> [Item; 4] {
        // Two slabs, 3 and 5 high, each cut in time at a different step: the component is one
        // (the cuts overlap) and its only flat subsets are the slabs.
        [
            Item { lower: 0, upper: 2, size: 3 },
            Item { lower: 2, upper: 4, size: 3 },
            Item { lower: 0, upper: 3, size: 5 },
            Item { lower: 3, upper: 4, size: 5 },
        ]
    }

    #[test]
    fn finds_the_flat_subsets_of_two_slabs() {
        let items = two_slabs();
        let mut never = |_: &Progress| false;
        let mut control = Control::new(&mut never);
        let mut budget = Budget { left: 1000, spent: 0, control: &mut control };
        let mut sparse = sparse::Search::new(&items, &[0, 1, 2, 3], 8, &mut budget).expect("candidate heights");
        assert!(matches!(sparse.run(&items, &mut budget, 1000), Step::Found((lower, 3)) if lower == [0, 1]));
        let mut flow = flow::Search::new(&items, &[0, 1, 2, 3], 8, &mut budget);
        let mut found = Vec::new();
        while let Step::Found(split) = flow.run(&items, &mut budget, 1000) {
            found.push(split);
        }
        found.sort_unstable();
        assert_eq!(found, [(alloc::vec![0, 1], 3), (alloc::vec![2, 3], 5)]);
    }

    #[test]
    fn places_two_slabs() {
        let items = two_slabs();
        let mut budget = 1000;
        let mut never = |_: &Progress| false;
        let (placement, _) = place(&items, &[0, 1, 2, 3], 4, 8, &mut budget, &mut Control::new(&mut never));
        let placement = placement.expect("two slabs stack");
        assert_eq!(placement.peak, 8);
        assert_eq!(placement.offsets, [0, 0, 3, 3]);
    }

    /// The generator's non-guillotine tilings (cut by guillotine cuts and pinwheels, recursively)
    /// come apart entirely into temporal components, flat splits and pinwheel splits, small ones
    /// at once: every one of these is placed by `place` alone, at its height, validly.
    #[test]
    fn pinwheel_tilings_come_apart() {
        for seed in 0..16u64 {
            let (count, height) = (30 + 5 * seed as usize, [64, 1 << 10, 1 << 20][seed as usize % 3]);
            let buffers = crate::generate::non_guillotine(seed, count, 2 * count as u32, height);
            let items = Item::all_of(&buffers);
            let members: Vec<u32> = (0..items.len() as u32).collect();
            let mut never = |_: &Progress| false;
            let (placement, _) =
                place(&items, &members, members.len(), height, &mut 2_000_000, &mut Control::new(&mut never));
            let placement = placement.unwrap_or_else(|| panic!("seed {seed}: not placed"));
            crate::check::check_placement(&buffers, &placement.offsets, 1, height, Some(height))
                .unwrap_or_else(|v| panic!("seed {seed}: {v:?}"));
        }
    }

    /// The pinwheel: five pieces tiling a 3 x 3 square with no cut through it, so no flat subset
    /// exists; the split search must report none. The pinwheel split places it (boundaries 1 and
    /// 2, heights 1 and 2), alone and under a buffer alive throughout (peeled off).
    #[test]
    fn a_pinwheel_has_no_flat_subset_and_is_still_placed() {
        let mut items = alloc::vec![
            Item { lower: 0, upper: 2, size: 1 }, // bottom left, tall in time
            Item { lower: 2, upper: 3, size: 2 }, // bottom right
            Item { lower: 1, upper: 3, size: 1 }, // top right
            Item { lower: 0, upper: 1, size: 2 }, // top left
            Item { lower: 1, upper: 2, size: 1 }, // the centre
        ];
        let members = [0, 1, 2, 3, 4];
        let mut never = |_: &Progress| false;
        let mut control = Control::new(&mut never);
        let mut budget = Budget { left: 100_000, spent: 0, control: &mut control };
        let mut finder = Finder::new(&items, &members, 3, &mut budget);
        assert_eq!(finder.next(&items, &mut budget), None);
        let mut never = |_: &Progress| false;
        let (placement, _) = place(&items, &members, members.len(), 3, &mut 100_000, &mut Control::new(&mut never));
        let placement = placement.expect("a pinwheel split places it");
        assert_eq!(placement.peak, 3);
        for (a, b) in (0..5).flat_map(|a| (a + 1..5).map(move |b| (a, b))) {
            let (x, y) = (&items[a], &items[b]);
            let live_together = x.lower < y.upper && y.lower < x.upper;
            let (ox, oy) = (placement.offsets[a], placement.offsets[b]);
            let apart = ox + x.size <= oy || oy + y.size <= ox;
            assert!(!live_together || apart, "pieces {a} and {b} overlap: {:?}", placement.offsets);
        }
        items.push(Item { lower: 0, upper: 3, size: 1 });
        let (placement, _) = place(&items, &[0, 1, 2, 3, 4, 5], 6, 4, &mut 100_000, &mut Control::new(&mut never));
        let placement = placement.expect("the pinwheel under the peeled buffer is placed");
        assert_eq!(placement.peak, 4);
        assert_eq!(placement.offsets[5], 0, "peeled to the bottom");
    }

    /// Packings with holes, filled by one sweep's fillers (`fillers::shaped`), which are not
    /// their holes here: no split places them with those fillers, but a part that fails is placed
    /// with another set of the fewest fillers its slack takes (`Splitter::refill`), validly. (Over
    /// 200 such instances of 60-300 buffers, the parts cut anew raised those the splits place from
    /// 122 to 148 with `Runs` fillers and from 149 to 167 with `Nested`: BENCHMARKS.md.)
    #[test]
    fn parts_with_the_wrong_fillers_are_cut_anew() {
        use crate::fillers::{shaped, Shape};
        let height = 1u64 << 20;
        for (count, seed, shape) in [(60, 18, Shape::Runs), (100, 10, Shape::Nested), (100, 21, Shape::Runs)] {
            let buffers = crate::generate::with_holes(seed, count, count / 25 + 2, 4 * count as u32, height);
            let mut items = Item::all_of(&buffers);
            let own = items.len();
            let all: Vec<u32> = (0..own as u32).collect();
            let sections = Sections::new(&items, &all);
            let slack: Vec<u64> = sections.totals.iter().map(|&total| height - total).collect();
            for filler in shaped(&slack, shape, own).expect("few fillers") {
                let (lower, upper) = sections.steps(filler.first, filler.end - filler.first);
                items.push(Item { lower, upper, size: filler.height });
            }
            let members: Vec<u32> = (0..items.len() as u32).collect();
            let mut never = |_: &Progress| false;
            let mut place_with = |refills: bool| {
                let mut control = Control::new(&mut never);
                let mut splitter = Splitter::new(&items, &members, own, 2_000_000, &mut control);
                if !refills {
                    splitter.refill_work = 0;
                }
                splitter.place(height).0
            };
            assert!(place_with(false).is_none(), "{count} buffers, seed {seed}: placed with the sweep's fillers");
            let placement = place_with(true)
                .unwrap_or_else(|| panic!("{count} buffers, seed {seed}: not placed with fillers cut anew"));
            assert_eq!(placement.peak, height);
            crate::check::check_placement(&buffers, &placement.offsets[..own], 1, height, Some(height))
                .unwrap_or_else(|v| panic!("{count} buffers, seed {seed}: {v:?}"));
        }
    }

    #[test]
    fn rounds_put_new_attempts_next_but_not_those_tried() {
        let mut rounds = Rounds::new(alloc::vec![1u64, 2, 3, 4], 2, 10);
        assert_eq!(rounds.next(), Some((1, 10)));
        rounds.put_next(alloc::vec![3, 5, 1]);
        let order: Vec<u64> = core::iter::from_fn(|| rounds.next()).map(|(a, _)| a).take(4).collect();
        assert_eq!(order, [3, 5, 2, 4]);
    }

    /// A crowded group (more subset sums than are kept) offers an amount from the middle of its
    /// sums when the later groups can make up the rest, and it is checked exactly: a sweep once
    /// went on with amounts no subset makes, and dropped the height when `pick` failed.
    #[test]
    fn a_crowded_group_offers_middle_amounts_and_checks_them() {
        // Sizes 2, 4, ..., 2^14: its sums are the even numbers up to 32,766, 16,384 of them.
        let items: Vec<Item> = (1..=14).map(|k| Item { lower: 0, upper: 1, size: 1 << k }).collect();
        let group = Group::new(&items, 1, (0..14).collect());
        assert!(!group.sums.complete);
        let later = SubsetSums::new([7u64].into_iter());
        // 16,000 is neither among the 4,096 smallest sums (up to 8,190) nor their complements.
        assert!(!group.sums.is_known(16_000) && group.sums.may_contain(16_001));
        let candidates = group.candidates(16_007, true, &later);
        assert!(candidates.contains(&16_000), "16,007 less the later group's 7");
        let mut never = |_: &Progress| false;
        let mut control = Control::new(&mut never);
        let mut budget = Budget { left: 1_000_000, spent: 0, control: &mut control };
        let mut work = 1_000_000;
        assert_eq!(group.has_amount(16_000, &mut budget, &mut work), Some(true));
        assert_eq!(group.has_amount(16_001, &mut budget, &mut work), Some(false));
        assert_eq!(group.has_amount(1 << 15, &mut budget, &mut work), Some(false));
    }

    /// With nothing left to make up, "none" is offered once: offering it again as "exactly what
    /// is needed" doubled the work of a sweep for every later group.
    #[test]
    fn nothing_needed_is_offered_once() {
        let items = [Item { lower: 0, upper: 1, size: 3 }, Item { lower: 0, upper: 1, size: 5 }];
        let group = Group::new(&items, 1, alloc::vec![0, 1]);
        assert_eq!(group.candidates(0, true, &SubsetSums::new(core::iter::empty())), [0]);
    }

    #[test]
    fn all_subset_sums_as_a_bitset() {
        let set = |all: &[u64], bits: usize| -> Vec<u64> {
            (0..bits).filter(|&a| all[a / 64] >> (a % 64) & 1 == 1).map(|a| a as u64).collect()
        };
        let (all, _) = all_subset_sums(&[5, 1, 3], 70);
        assert_eq!(set(&all, 70), [0, 1, 3, 4, 5, 6, 8, 9]);
        // Across words, and cut at `bits`.
        let (wide, _) = all_subset_sums(&[60, 3, 70, 500], 200);
        assert_eq!(set(&wide, 200), [0, 3, 60, 63, 70, 73, 130, 133]);
    }

    #[test]
    fn subset_sums_keep_the_smallest() {
        let all = SubsetSums::new([5u64, 1, 3].into_iter());
        assert!(all.complete);
        assert_eq!(all.sums, [0, 1, 3, 4, 5, 6, 8, 9]);
        let some = SubsetSums::with_limit([5u64, 1, 3].into_iter(), 4);
        assert!(!some.complete);
        assert_eq!(some.sums, [0, 1, 3, 4]);
        // 7 is no subset sum: its complement 9 - 7 = 2 is known not to be one.
        assert!(some.may_contain(5) && !some.may_contain(7) && !some.may_contain(2));
    }
}
