//! Flat subsets from the sparsest section.
//!
//! A flat subset's height `a` is a subset sum of every section: the sums of the sparsest (the
//! *chosen* section), filtered by the next sparsest, are the candidate heights, lowest first. For a
//! height, the search chooses an amount per lifetime class of the chosen section, then sweeps right:
//! at each boundary the bytes of the subset's buffers ending there are made up by buffers starting
//! there, chosen as an amount per group with the same end; failed states (step, amounts alive per
//! end) are cached. The sweep left is the same in reversed time. Heights go in [`Rounds`], resumably;
//! where the chosen section has too many sums, heights of whole lifetime classes go next
//! (`whole_class_heights`).

use alloc::collections::{BTreeMap, BTreeSet};
use alloc::vec::Vec;

use super::{hash, pick, Budget, Group, Rounds, Step, SubsetSums, SUBSET_SUMS_LIMIT, SUMS_PER_NODE};
use crate::sections::endpoints;
use crate::tuning::*;
use crate::Item;

/// One sweep direction away from the chosen section, in steps.
struct Direction {
    /// `groups[i]`: the buffers joining at step `i`, in groups by the step they leave at.
    groups: Vec<Vec<Group>>,
    /// `reach[i][g]`: the subset sums of all buffers of groups `g..` of step `i`.
    reach: Vec<Vec<SubsetSums>>,
    /// Failed states (step, amount joining, amounts alive per leaving step), hashed.
    failed: BTreeSet<u128>,
}

impl Direction {
    /// The direction from `(joining step, leaving step, buffer)` entries over `steps` steps.
    fn new(items: &[Item], entries: &[(usize, usize, u32)], steps: usize) -> Direction {
        let mut by_step: Vec<BTreeMap<usize, Vec<u32>>> = alloc::vec![BTreeMap::new(); steps];
        for &(joins, leaves, l) in entries {
            if let Some(slot) = by_step.get_mut(joins) {
                slot.entry(leaves).or_default().push(l);
            }
        }
        let groups: Vec<Vec<Group>> = by_step
            .into_iter()
            .map(|ends| ends.into_iter().map(|(leaves, members)| Group::new(items, leaves as u32, members)).collect())
            .collect();
        let reach = groups.iter().map(|groups: &Vec<Group>| suffix_sums(items, groups)).collect();
        Direction { groups, reach, failed: BTreeSet::new() }
    }

    /// From step `i` on, the bytes freed at a step are made up by buffers joining there, recording
    /// (step, group, amount) in `chosen`.
    fn sweep(
        &mut self,
        mut i: usize,
        mut live: BTreeMap<u32, u64>,
        chosen: &mut Vec<(usize, usize, u64)>,
        budget: &mut Budget,
        work: &mut u64,
    ) -> Sweep {
        loop {
            if i + 1 >= self.groups.len() {
                return Sweep::Found; // the last step: everything alive leaves here
            }
            let needed = live.remove(&(i as u32)).unwrap_or(0);
            if needed == 0 {
                i += 1; // nothing joins here
                continue;
            }
            let key = hash(
                [i as u64, needed].into_iter().chain(live.iter().flat_map(|(&end, &amount)| [u64::from(end), amount])),
            );
            if self.failed.contains(&key) {
                return Sweep::Impossible;
            }
            let outcome = self.amounts((i, 0), needed, live, chosen, budget, work);
            if matches!(outcome, Sweep::Impossible) {
                self.failed.insert(key);
            }
            return outcome;
        }
    }

    /// At step `i`, chooses amounts of groups `g..` adding up to `needed` into `live`, then sweeps on.
    fn amounts(
        &mut self,
        (i, g): (usize, usize),
        needed: u64,
        live: BTreeMap<u32, u64>,
        chosen: &mut Vec<(usize, usize, u64)>,
        budget: &mut Budget,
        work: &mut u64,
    ) -> Sweep {
        let count = self.groups[i].len();
        if g == count {
            return if needed > 0 { Sweep::Impossible } else { self.sweep(i + 1, live, chosen, budget, work) };
        }
        let (end, candidates) = {
            let group = &self.groups[i][g];
            (group.end, group.candidates(needed, g + 1 < count || needed == 0, &self.reach[i][g + 1]))
        };
        for amount in candidates {
            if amount > needed || (g + 1 == count && amount != needed) {
                continue;
            }
            if !self.reach[i][g + 1].may_contain(needed - amount) {
                continue; // the later groups cannot make up the rest
            }
            if !budget.charge(work) {
                return Sweep::OutOfWork;
            }
            match self.groups[i][g].has_amount(amount, budget, work) {
                Some(true) => {}
                Some(false) => continue,
                None => return Sweep::OutOfWork,
            }
            let mut next = live.clone();
            if amount > 0 {
                *next.entry(end).or_default() += amount;
                chosen.push((i, g, amount));
            }
            let outcome = self.amounts((i, g + 1), needed - amount, next, chosen, budget, work);
            if amount > 0 && !matches!(outcome, Sweep::Found) {
                chosen.pop();
            }
            match outcome {
                Sweep::Impossible => {}
                settled => return settled,
            }
        }
        Sweep::Impossible
    }
}

/// Heights up to `height / 2` that sum whole lifetime classes in nearly every one of up to
/// `WHOLE_FILTER_SECTIONS` sections spread over time (fewest misses first, at most
/// `WHOLE_HEIGHTS_LIMIT`), and the work spent: in a crowded component the lowest heights are
/// mostly coincidences, while a slab of a perfect packing mostly takes whole classes.
fn whole_class_heights(
    items: &[Item],
    span: &[(usize, usize, u32)],
    sections: usize,
    by_crowding: &[usize],
    height: u64,
) -> (Vec<u64>, u64) {
    let class_totals = |section: usize| {
        let mut totals: BTreeMap<(usize, usize), u64> = BTreeMap::new();
        for &(start, end, l) in span {
            if start <= section && section < end {
                *totals.entry((start, end)).or_default() += items[l as usize].size;
            }
        }
        totals.into_values().collect::<Vec<u64>>()
    };
    // One section per window of time (the sparsest), so the sections share few classes.
    let rank: Vec<usize> = {
        let mut rank = alloc::vec![0; sections];
        for (position, &section) in by_crowding.iter().enumerate() {
            rank[section] = position;
        }
        rank
    };
    let windows = WHOLE_FILTER_SECTIONS.min(sections);
    let mut considered: Vec<usize> = (0..windows)
        .filter_map(|w| (w * sections / windows..(w + 1) * sections / windows).min_by_key(|&section| rank[section]))
        .collect();
    considered.sort_unstable_by_key(|&section| rank[section]);
    let mut cost = (span.len() * considered.len()) as u64;
    // Sections with many classes are left out: their sums are too many to list (and say little).
    let mut sums: Vec<SubsetSums> = considered
        .iter()
        .filter_map(|&section| {
            let totals = class_totals(section);
            if totals.len() > WHOLE_MOST_CLASSES {
                return None;
            }
            let sums = SubsetSums::up_to(totals.into_iter(), height / 2, 1 << WHOLE_MOST_CLASSES);
            cost += sums.cost;
            Some(sums)
        })
        .collect();
    if sums.len() < WHOLE_LEAST_FILTERS {
        return (Vec::new(), cost);
    }
    let tolerance = sums.len() / WHOLE_TOLERANCE_SHARE;
    // The candidates come from the section with the fewest sums (the fewest to check).
    sums.sort_by_key(|s| s.sums.len());
    // Candidates: one section's sums, scored by the sections that cannot make them of whole classes.
    let mut scored: Vec<(usize, u64)> = Vec::new();
    for &a in sums[0].between(1, height / 2) {
        let mut misses = 0;
        for other in &sums[1..] {
            cost += CHECK_COST;
            if !other.may_contain(a) {
                misses += 1;
                if misses > tolerance {
                    break;
                }
            }
        }
        if misses <= tolerance {
            scored.push((misses, a));
        }
    }
    scored.sort_unstable();
    let mut heights: Vec<u64> = scored.into_iter().map(|(_, a)| a).collect();
    heights.truncate(WHOLE_HEIGHTS_LIMIT);
    (heights, cost)
}

/// `sums[g]`: the subset sums of the buffers of `groups[g..]` (built from the back).
fn suffix_sums(items: &[Item], groups: &[Group]) -> Vec<SubsetSums> {
    let mut sums: Vec<SubsetSums> = alloc::vec![SubsetSums::new(core::iter::empty())];
    for group in groups.iter().rev() {
        let mut next = sums[sums.len() - 1].clone();
        next.add(group.members.iter().map(|&l| items[l as usize].size), SUBSET_SUMS_LIMIT);
        sums.push(next);
    }
    sums.reverse();
    sums
}

/// How a sweep (or the whole search for one height) ended.
enum Sweep {
    Found,
    Impossible,
    OutOfWork,
}

/// The search of one component, resumable.
pub(super) struct Search {
    /// The chosen section's buffers in classes of equal (start, end) boundary.
    classes: Vec<((usize, usize), Group)>,
    /// `class_reach[c]`: the subset sums of all buffers of classes `c..`.
    class_reach: Vec<SubsetSums>,
    chosen_section: usize,
    right: Direction,
    left: Direction,
    /// The heights not settled yet.
    heights: Rounds<u64>,
    /// What `whole_class_heights` needs, until it has run.
    deferred: Option<Deferred>,
    height: u64,
    /// Calls of `run` so far.
    runs: u32,
}

/// The inputs of `whole_class_heights`, kept until the first allowance found no split.
struct Deferred {
    span: Vec<(usize, usize, u32)>,
    sections: usize,
    by_crowding: Vec<usize>,
}

impl Search {
    /// The search of `component` (full height `height`), or `None` without a candidate height.
    pub(super) fn new(items: &[Item], component: &[u32], height: u64, budget: &mut Budget) -> Option<Search> {
        let points = endpoints(items, component);
        let sections = points.len().checked_sub(1).filter(|&s| s > 0)?;
        let boundary = |t: u32| points.partition_point(|&p| p < t);
        let span: Vec<(usize, usize, u32)> = component
            .iter()
            .map(|&l| (boundary(items[l as usize].lower), boundary(items[l as usize].upper), l))
            .collect();
        let mut alive: Vec<Vec<u64>> = alloc::vec![Vec::new(); sections];
        for &(start, end, l) in &span {
            for sizes in &mut alive[start..end] {
                sizes.push(items[l as usize].size);
            }
        }
        let mut by_crowding: Vec<usize> = (0..sections).collect();
        by_crowding.sort_unstable_by_key(|&section| (alive[section].len(), section));
        let chosen_section = by_crowding[0];
        // A flat subset's complement is flat too, so heights up to half suffice.
        let base = SubsetSums::with_limit(alive[chosen_section].iter().copied(), HEIGHTS_LIMIT);
        let mut heights: Vec<u64> = base.sums.iter().copied().filter(|&a| a > 0 && a <= height / 2).collect();
        let mut cost = base.cost;
        for &section in by_crowding.iter().skip(1).take(FILTER_SECTIONS) {
            if heights.len() <= FILTERED_ENOUGH || alive[section].len() > FILTER_MOST_BUFFERS {
                break; // enough, or the sections left are too crowded to have few sums
            }
            let filter = SubsetSums::with_limit(alive[section].iter().copied(), FILTER_SUMS_LIMIT);
            cost += filter.cost;
            if filter.complete {
                heights.retain(|a| filter.sums.binary_search(a).is_ok());
            }
        }
        // Heights of whole lifetime classes go next when the lowest found no split (`run`).
        let truncated = heights.len() > HEIGHTS_TRIED_LIMIT || !base.complete;
        heights.truncate(HEIGHTS_TRIED_LIMIT);
        let deferred = truncated.then(|| Deferred { span: span.clone(), sections, by_crowding: by_crowding.clone() });
        if heights.is_empty() {
            return None;
        }
        let mut classes: BTreeMap<(usize, usize), Vec<u32>> = BTreeMap::new();
        for &(start, end, l) in &span {
            if start <= chosen_section && chosen_section < end {
                classes.entry((start, end)).or_default().push(l);
            }
        }
        let classes: Vec<((usize, usize), Group)> =
            classes.into_iter().map(|(key, members)| (key, Group::new(items, key.1 as u32, members))).collect();
        let class_groups: Vec<Group> = classes.iter().map(|(_, g)| g.clone()).collect();
        let class_reach = suffix_sums(items, &class_groups);
        // Right of the chosen section, step i is boundary chosen + 1 + i; left, chosen - i, reversed.
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
        let right = Direction::new(items, &right_entries, sections - chosen_section);
        let left = Direction::new(items, &left_entries, chosen_section + 1);
        for direction in [&right, &left] {
            cost += direction.reach.iter().flatten().map(|sums| sums.cost).sum::<u64>();
            cost += direction.groups.iter().flatten().map(|group| group.sums.cost).sum::<u64>();
        }
        cost += class_reach.iter().map(|sums| sums.cost).sum::<u64>();
        if !budget.spend_many(cost / SUMS_PER_NODE) {
            return None;
        }
        Some(Search {
            deferred,
            height,
            runs: 0,
            right,
            left,
            classes,
            class_reach,
            chosen_section,
            heights: Rounds::new(heights, SPARSE_FIRST_WINDOW, SPARSE_FIRST_LIMIT_PER_HEIGHT),
        })
    }

    /// Goes on with the pending heights for at most `work` nodes.
    pub(super) fn run(&mut self, items: &[Item], budget: &mut Budget, work: u64) -> Step {
        self.runs += 1;
        if budget.left == 0 {
            return Step::OutOfWork; // nothing to spend: not even the whole-class heights' set-up
        }
        if self.runs > 1 {
            if let Some(deferred) = self.deferred.take() {
                let (whole, cost) =
                    whole_class_heights(items, &deferred.span, deferred.sections, &deferred.by_crowding, self.height);
                if !budget.spend_many(cost / SUMS_PER_NODE) {
                    return Step::OutOfWork;
                }
                self.heights.put_next(whole);
            }
        }
        let mut total = work;
        let mut amounts: Vec<u64> = alloc::vec![0; self.classes.len()];
        loop {
            if total == 0 {
                return Step::OutOfWork;
            }
            let Some((lower_height, limit)) = self.heights.next() else { return Step::Done };
            // Each height costs a node, however soon it is refuted.
            if !budget.charge(&mut total) {
                self.heights.unsettled(lower_height);
                return Step::OutOfWork;
            }
            let mut height_work = limit.min(total);
            let before = height_work;
            amounts.fill(0);
            let outcome = self.try_height(0, lower_height, &mut amounts, budget, &mut height_work);
            total -= before - height_work;
            match outcome {
                Ok(Some((right, left))) => {
                    if let Some(lower) = self.realise(items, &amounts, &right, &left, budget) {
                        return Step::Found((lower, lower_height));
                    }
                }
                Ok(None) => {}
                Err(()) => self.heights.unsettled(lower_height),
            }
        }
    }

    /// Chooses amounts of the chosen section's classes `c..` adding up to `needed`, then sweeps
    /// both ways; what each sweep chose if both complete, `Err` when out of work.
    #[allow(clippy::type_complexity)]
    fn try_height(
        &mut self,
        c: usize,
        needed: u64,
        amounts: &mut [u64],
        budget: &mut Budget,
        work: &mut u64,
    ) -> Result<Option<(Vec<(usize, usize, u64)>, Vec<(usize, usize, u64)>)>, ()> {
        if c == self.classes.len() {
            if needed > 0 {
                return Ok(None);
            }
            let mut right_live: BTreeMap<u32, u64> = BTreeMap::new();
            let mut left_live: BTreeMap<u32, u64> = BTreeMap::new();
            for (&((start, end), _), &amount) in self.classes.iter().zip(amounts.iter()) {
                if amount > 0 {
                    *right_live.entry((end - self.chosen_section - 1) as u32).or_default() += amount;
                    *left_live.entry((self.chosen_section - start) as u32).or_default() += amount;
                }
            }
            let mut right_chosen = Vec::new();
            match self.right.sweep(0, right_live, &mut right_chosen, budget, work) {
                Sweep::Found => {}
                Sweep::Impossible => return Ok(None),
                Sweep::OutOfWork => return Err(()),
            }
            let mut left_chosen = Vec::new();
            return match self.left.sweep(0, left_live, &mut left_chosen, budget, work) {
                Sweep::Found => Ok(Some((right_chosen, left_chosen))),
                Sweep::Impossible => Ok(None),
                Sweep::OutOfWork => Err(()),
            };
        }
        let candidates = self.classes[c].1.candidates(needed, true, &self.class_reach[c + 1]);
        for amount in candidates {
            if amount > needed || !self.class_reach[c + 1].may_contain(needed - amount) {
                continue;
            }
            if !budget.charge(work) {
                return Err(());
            }
            match self.classes[c].1.has_amount(amount, budget, work) {
                Some(true) => {}
                Some(false) => continue,
                None => return Err(()),
            }
            amounts[c] = amount;
            if let Some(found) = self.try_height(c + 1, needed - amount, amounts, budget, work)? {
                return Ok(Some(found));
            }
        }
        amounts[c] = 0;
        Ok(None)
    }

    /// The buffers of the subset with the chosen amounts (sorted), if each amount has a witness.
    fn realise(
        &self,
        items: &[Item],
        amounts: &[u64],
        right: &[(usize, usize, u64)],
        left: &[(usize, usize, u64)],
        budget: &mut Budget,
    ) -> Option<Vec<u32>> {
        let mut lower = Vec::new();
        for ((_, group), &amount) in self.classes.iter().zip(amounts) {
            if !pick(items, &group.members, amount, &mut lower, budget) {
                return None;
            }
        }
        for (direction, chosen) in [(&self.right, right), (&self.left, left)] {
            for &(step, g, amount) in chosen {
                if !pick(items, &direction.groups[step][g].members, amount, &mut lower, budget) {
                    return None;
                }
            }
        }
        lower.sort_unstable();
        Some(lower)
    }
}
