//! The exact search: does a component fit under a capacity? A depth-first branch-and-bound over
//! *canonical* placements, in the style of MiniMalloc (Moffitt, ASPLOS 2023): every placement can
//! be compacted without raising the peak, each buffer at its *minimum offset* (the highest end of
//! the placed buffers it shares a step with), so the search only chooses the order:
//! - branch on the unplaced buffers by (minimum offset, rank), skipping branches out of canonical
//!   order and those dominated by a buffer that fits below;
//! - section bound: a section's unplaced buffers stack above its floor; past the capacity, cut;
//! - branching by section (`Style::by_section`): the set placed at one offset is decided one
//!   section at a time, the section with the fewest ways first;
//! - dynamic decomposition: ranges of time no unplaced buffer crosses are searched on their own;
//! - zero slack (every section of a partition exactly full): no gap may open, so a section of a
//!   *valley* (a run at one floor with higher neighbours) is filled at its floor by one of its own
//!   buffers (`fill_skyline`); a partition keeps its mode for its whole search.
//!
//! "Infeasible" is a proof; the search counts nodes and stops when its budget is spent.

use alloc::vec::Vec;
use core::ops::Range;

use crate::rng::SplitMix64;

use super::control::Control;
use super::domains::Domains;
use super::greedy::{ComponentPlacement, Overlaps};
use super::refuted::Refuted;
use super::sections::Sections;
use super::twins::Twins;
use super::Item;
use crate::tuning::*;

/// What the restarts of one search (one component, one capacity) share: the zero-slack domains,
/// the partial placements proven infeasible (a proof in one restart holds in all), the dead ends.
pub(crate) struct Shared {
    domains: Option<Domains>,
    failed: Refuted,
    /// Per section, how often a skyline search found it unfillable: among equally few candidates the
    /// most dead ends go first (weighted degree, as a tie-break), so a hard spot is met early.
    dead_ends: Vec<u32>,
}

impl Shared {
    pub(crate) fn new(items: &[Item], members: &[u32], sections: &Sections, capacity: u64) -> Shared {
        Shared {
            domains: Domains::of(items, members, sections, capacity),
            failed: Refuted::new(),
            dead_ends: alloc::vec![0; sections.len()],
        }
    }

    /// Tightens the domains by at most `work` tiling states (`Domains::tighten`); returns the
    /// states spent. Refuted states stay refuted: narrower domains drop no placement.
    pub(crate) fn tighten(
        &mut self,
        items: &[Item],
        members: &[u32],
        work: u64,
        spent: &mut dyn FnMut(u64) -> bool,
    ) -> u64 {
        self.domains.as_mut().map_or(0, |domains| domains.tighten(items, members, work, spent))
    }

    /// The zero-slack domains, if any.
    pub(crate) fn domains(&self) -> Option<&Domains> {
        self.domains.as_ref()
    }

    /// No domains (tests compare the search with and without them).
    #[cfg(test)]
    pub(crate) fn without_domains(sections: &Sections) -> Shared {
        Shared { domains: None, failed: Refuted::new(), dead_ends: alloc::vec![0; sections.len()] }
    }
}

/// What a search at one capacity found.
pub(crate) enum SearchOutcome {
    /// A placement whose peak is at most the capacity.
    Found(ComponentPlacement),
    /// Proof that no placement fits under the capacity.
    Infeasible,
    /// The node budget ran out first.
    BudgetExhausted,
}

const UNPLACED: u64 = u64::MAX;

/// How a zero-slack search breaks its ties; restarts vary it (heavy-tailed searches gain from
/// diverse runs).
#[derive(Clone, Copy)]
pub(crate) struct Style {
    /// Value order: flush and long buffers first, then the rank (`fill_skyline`); else the rank.
    pub guided: bool,
    /// Among equally low sections with equally few candidates, the rightmost (else the leftmost).
    pub rightmost: bool,
    /// The rank is the contention order (`search_ranks`' first), and each part a canonical search
    /// splits off is ranked afresh on the totals left then, as MiniMalloc re-sorts sub-problems.
    pub contention: bool,
    /// A canonical search branches on sections, not buffers (`dfs_by_section`).
    pub by_section: bool,
}

/// The restart that searches the contention order again, ranking split-off parts afresh.
pub(crate) const CONTENTION_RESTART: usize = 1;

impl Style {
    /// The style of restart `index`: the contention restart ranks parts afresh; the others are
    /// guided every other one, rightmost every other pair, and all but the first two branch by
    /// section (those two keep MiniMalloc's branching; BENCHMARKS.md, "Eighth pass").
    pub(crate) fn of_restart(index: usize) -> Style {
        if index == CONTENTION_RESTART {
            return Style { guided: false, rightmost: false, contention: true, by_section: false };
        }
        let order = if index > CONTENTION_RESTART { index - 1 } else { index };
        Style { guided: order.is_multiple_of(2), rightmost: order % 4 >= 2, contention: false, by_section: order > 0 }
    }
}

struct Search<'a, 'c> {
    size: Vec<u64>,
    /// Each buffer's lifetime in steps (the contention order's second key).
    length: Vec<u32>,
    /// Each buffer's section range `[start, end)`.
    sections_of: Vec<(u32, u32)>,
    /// The buffers of each section, in compressed rows, the first `unplaced_in[s]` of row `s`
    /// unplaced (a placement swaps the buffer to the end of that prefix; undoing lengthens it).
    section_row: Vec<usize>,
    section_members: Vec<u32>,
    unplaced_in: Vec<u32>,
    /// Where each buffer sits in the rows of its sections: `slot[slot_base[b] + k]` is its index
    /// in `section_members` for its `k`-th section.
    slot: Vec<u32>,
    slot_base: Vec<u32>,
    rank: Vec<u32>,
    style: Style,
    overlaps: &'a Overlaps,
    /// The caller's stop callback, polled as nodes are counted.
    control: &'a mut Control<'c>,
    offset: Vec<u64>,
    /// The offset of each buffer on the last path that placed it; on success, the placement.
    solution: Vec<u64>,
    min_offset: Vec<u64>,
    /// `excluded_at[b] == min_offset[b]`: a section search decided that `b` sits above its minimum
    /// offset; a placement that raises the minimum offset lifts the mark with it.
    excluded_at: Vec<u64>,
    /// The lowest offset each buffer can still take: its minimum offset, plus one if excluded.
    lowest: Vec<u64>,
    floor: Vec<u64>,
    total: Vec<u64>,
    /// `cuts[b]`: unplaced buffers spanning both section `b` and section `b + 1`.
    cuts: Vec<u32>,
    capacity: u64,
    nodes_left: u64,
    nodes: u64,
    /// Random 128-bit keys of the buffers and sections; `state_key` is the XOR of the placed
    /// buffers' keys and `key(section) * (floor + 1)`: at zero slack the placed set and the floors
    /// determine the subproblem, whatever the order that reached it.
    keys: Vec<u128>,
    section_keys: Vec<u128>,
    state_key: u128,
    /// Partial placements (with the section range searched) proven infeasible, shared by the
    /// restarts at one capacity (`Shared`); a full cache stops growing.
    failed: &'a mut Refuted,
    /// Dead ends per section (`Shared::dead_ends`).
    dead_ends: &'a mut [u32],
    /// Section searches excluding buffers from their minimum offsets on the current path: their
    /// exclusions are not in `state_key`, so a failure found under one is not recorded.
    exclusions_in_scope: u32,
    /// Sections whose floor a placement must recompute (`section_mark == mark`).
    dirty: Vec<u32>,
    section_mark: Vec<u32>,
    mark: u32,
    /// Vectors returned by finished nodes, for the next ones to reuse (a node allocates nothing).
    lists: Vec<Vec<u32>>,
    candidate_lists: Vec<Vec<(u64, u32, u32)>>,
    undos: Vec<Undo>,
    /// Scratch of `valley_coverable`: which boundaries of a valley its buffers reach.
    reach: Vec<bool>,
    /// Scratch of `dirty_sections_fit`: (lowest offset, size) of a section's buffers above its floor.
    stack: Vec<(u64, u64)>,
    /// Zero-slack offset domains (`domains`), when the whole search is at zero slack.
    domains: Option<&'a Domains>,
    /// Scratch of `dfs_by_section`: candidates per section (zero between nodes), sections counted.
    section_candidates: Vec<u32>,
    counted: Vec<u32>,
    /// Twins (buffers over exactly the same sections), in groups: `stacked_out_of_order` orders them.
    twins: Twins,
}

/// The contention order's key, largest first: (unplaced total, length, size).
type ContentionKey = core::cmp::Reverse<(u64, u32, u64)>;

/// Undo records of one placement.
#[derive(Default)]
struct Undo {
    offsets: Vec<(u32, u64)>,
    floors: Vec<(u32, u64)>,
    /// `excluded_at` values replaced by a section search's exclusion.
    excluded: Vec<(u32, u64)>,
}

/// What the skyline search is given about one component: its buffers (`members`, indices into
/// `items`), their overlap graph and sections.
#[derive(Clone, Copy)]
pub(crate) struct Component<'a> {
    pub items: &'a [Item],
    pub members: &'a [u32],
    pub overlaps: &'a Overlaps,
    pub sections: &'a Sections,
}

/// Searches for a placement of the members with peak at most `capacity` (units), spending at most
/// `*nodes_left` nodes; `rank` breaks ties between equal minimum offsets (lower first). Returns the
/// outcome and the nodes spent; a stop through `control` ends it as `BudgetExhausted`.
pub(crate) fn search(
    component: Component<'_>,
    rank: &[u32],
    style: Style,
    shared: &mut Shared,
    capacity: u64,
    nodes_left: &mut u64,
    control: &mut Control,
) -> (SearchOutcome, u64) {
    let Component { items, members, overlaps, sections } = component;
    if shared.domains.as_ref().is_some_and(Domains::refuted) {
        return (SearchOutcome::Infeasible, 0); // a section no tiling fills (`domains`)
    }
    let n = members.len();
    let section_count = sections.len();
    let rows = sections.rows(items, members);
    let mut cuts = alloc::vec![0u32; section_count.saturating_sub(1)];
    for &(start, end) in &rows.spans {
        for b in start..end.saturating_sub(1) {
            cuts[b as usize] += 1;
        }
    }
    let size: Vec<u64> = members.iter().map(|&m| items[m as usize].size).collect();
    let twins = Twins::new(&rows.spans, &size);
    let unplaced_in: Vec<u32> = rows.row.windows(2).map(|w| (w[1] - w[0]) as u32).collect();
    let mut slot_base = Vec::with_capacity(n);
    let mut slots = 0u32;
    for &(start, end) in &rows.spans {
        slot_base.push(slots);
        slots += end - start;
    }
    let mut slot = alloc::vec![0u32; slots as usize];
    for s in 0..section_count {
        for index in rows.row[s]..rows.row[s + 1] {
            let m = rows.held[index] as usize;
            slot[(slot_base[m] + s as u32 - rows.spans[m].0) as usize] = index as u32;
        }
    }
    let mut state = Search {
        size,
        length: members.iter().map(|&m| items[m as usize].upper - items[m as usize].lower).collect(),
        sections_of: rows.spans,
        section_row: rows.row,
        section_members: rows.held,
        unplaced_in,
        slot,
        slot_base,
        rank: rank.to_vec(),
        style,
        overlaps,
        control,
        offset: alloc::vec![UNPLACED; n],
        solution: alloc::vec![0; n],
        min_offset: alloc::vec![0; n],
        excluded_at: alloc::vec![UNPLACED; n],
        lowest: alloc::vec![0; n],
        floor: alloc::vec![0; section_count],
        total: sections.totals.clone(),
        cuts,
        capacity,
        nodes_left: *nodes_left,
        nodes: 0,
        keys: random_keys(0x6D65_6D6F, n),
        section_keys: random_keys(0x666C_6F6F, section_count),
        state_key: 0,
        failed: &mut shared.failed,
        dead_ends: &mut shared.dead_ends,
        exclusions_in_scope: 0,
        dirty: Vec::new(),
        section_mark: alloc::vec![0; section_count],
        mark: 0,
        lists: Vec::new(),
        candidate_lists: Vec::new(),
        undos: Vec::new(),
        reach: Vec::new(),
        stack: Vec::new(),
        domains: shared.domains.as_ref(),
        section_candidates: alloc::vec![0; section_count],
        counted: Vec::new(),
        twins,
    };
    if state.total.iter().any(|&t| t > capacity) {
        return (SearchOutcome::Infeasible, 0);
    }
    state.state_key = state.section_keys.iter().fold(0, |key, &k| key ^ k); // all floors 0
    let unplaced: Vec<u32> = (0..n as u32).collect();
    let outcome = state.search_partition(&unplaced, 0..section_count);
    *nodes_left = state.nodes_left;
    let result = match outcome {
        Dfs::Found => {
            let peak = (0..n).map(|l| state.solution[l] + state.size[l]).max().unwrap_or(0);
            SearchOutcome::Found(ComponentPlacement { offsets: state.solution, peak })
        }
        Dfs::Infeasible => SearchOutcome::Infeasible,
        Dfs::Exhausted => SearchOutcome::BudgetExhausted,
    };
    (result, state.nodes)
}

fn random_keys(seed: u64, count: usize) -> Vec<u128> {
    let mut rng = SplitMix64::new(seed);
    (0..count).map(|_| (u128::from(rng.next_u64()) << 64) | u128::from(rng.next_u64())).collect()
}

enum Dfs {
    Found,
    Infeasible,
    Exhausted,
}

impl Search<'_, '_> {
    /// Starts the search of a partition: zero slack when every unfinished section is full.
    fn search_partition(&mut self, unplaced: &[u32], sections: Range<usize>) -> Dfs {
        let zero_slack = sections.clone().all(|s| self.total[s] == 0 || self.floor[s] + self.total[s] == self.capacity);
        if zero_slack {
            // The bound by levels over every section once; later only where a placement lifted one.
            self.dirty.clear();
            self.dirty.extend(sections.clone().map(|s| s as u32));
            if !self.dirty_sections_fit(&sections, 0) {
                return Dfs::Infeasible;
            }
            self.fill_skyline(unplaced, sections)
        } else if self.style.contention {
            let saved = self.rank_by_contention(unplaced);
            let outcome = self.dfs(unplaced, sections, (0, 0));
            for (&local, rank) in unplaced.iter().zip(saved) {
                self.rank[local as usize] = rank;
            }
            outcome
        } else {
            self.dfs(unplaced, sections, (0, 0))
        }
    }

    /// Ranks `unplaced` in the contention order on the unplaced totals as they are now, reusing
    /// their ranks' values; returns the ranks it replaced, in the same order.
    fn rank_by_contention(&mut self, unplaced: &[u32]) -> Vec<u32> {
        let saved: Vec<u32> = unplaced.iter().map(|&l| self.rank[l as usize]).collect();
        let mut values = saved.clone();
        values.sort_unstable();
        let mut order: Vec<(ContentionKey, u32, u32)> = unplaced
            .iter()
            .map(|&l| {
                let (start, end) = self.sections_of[l as usize];
                let total = self.total[start as usize..end as usize].iter().copied().max().unwrap_or(0);
                let key = (total, self.length[l as usize], self.size[l as usize]);
                (core::cmp::Reverse(key), self.rank[l as usize], l)
            })
            .collect();
        order.sort_unstable();
        for (&(_, _, local), value) in order.iter().zip(values) {
            self.rank[local as usize] = value;
        }
        saved
    }

    /// Counts one node against the budget; `false` when it is spent or a stop was asked for.
    fn count_node(&mut self) -> bool {
        if self.nodes_left == 0 || self.control.tick(1) {
            return false;
        }
        self.nodes_left -= 1;
        self.nodes += 1;
        true
    }

    /// The zero-slack search: fill a lowest section at its floor.
    fn fill_skyline(&mut self, unplaced: &[u32], sections: Range<usize>) -> Dfs {
        if unplaced.is_empty() {
            return Dfs::Found;
        }
        let memo_key = Refuted::fingerprint(self.state_key, sections.start as u32, sections.end as u32);
        if self.failed.contains(memo_key) {
            return Dfs::Infeasible;
        }
        let outcome = self.fill_skyline_uncached(unplaced, sections);
        if matches!(outcome, Dfs::Infeasible) && self.exclusions_in_scope == 0 {
            self.failed.insert(memo_key);
        }
        outcome
    }

    fn fill_skyline_uncached(&mut self, unplaced: &[u32], sections: Range<usize>) -> Dfs {
        if !self.count_node() {
            return Dfs::Exhausted;
        }
        let (section, fill) = match self.fill_choice(sections.clone()) {
            Ok(choice) => choice,
            Err(outcome) => return outcome,
        };
        let candidates = self.fill_candidates(section, fill, sections.clone());
        let mut undo = self.undos.pop().unwrap_or_default();
        let mut outcome = Dfs::Infeasible;
        for (index, &(_, _, local)) in candidates.iter().enumerate() {
            if candidates[..index].iter().any(|&(_, _, earlier)| self.shape(earlier) == self.shape(local)) {
                continue; // an identical buffer was tried here: the same subtree
            }
            if fill + self.size[local as usize] > self.capacity {
                continue;
            }
            // A buffer directly on its twin may swap places with it: only the larger below is searched.
            if self.stacked_out_of_order(local, fill) {
                continue;
            }
            outcome = self.branch((local, fill), unplaced, sections.clone(), None, 0, &mut undo);
            if !matches!(outcome, Dfs::Infeasible) {
                break; // found, or the budget is spent
            }
        }
        if matches!(outcome, Dfs::Infeasible) {
            self.dead_ends[section] = self.dead_ends[section].saturating_add(1);
        }
        self.candidate_lists.push(candidates);
        self.undos.push(undo);
        outcome
    }

    /// The section to fill and its floor: in a *valley* (a run at one floor with higher neighbours
    /// or the partition's edge) whatever fills a section at its floor lies inside it. Fail first:
    /// the fewest such buffers over every valley, then the most dead ends, then the lower floor.
    /// `Err(Found)` when all is placed, `Err(Infeasible)` at a section no buffer can fill.
    fn fill_choice(&mut self, sections: Range<usize>) -> Result<(usize, u64), Dfs> {
        let Some(lowest) = sections.clone().filter(|&s| self.total[s] > 0).map(|s| self.floor[s]).min() else {
            return Err(Dfs::Found);
        };
        // (count, dead ends reversed, floor, section or its reverse when the rightmost wins ties)
        let mut chosen: Option<(usize, u32, u64, usize)> = None;
        let mut run_start = sections.start;
        while run_start < sections.end {
            if self.total[run_start] == 0 {
                run_start += 1; // done: a wall, whatever its floor
                continue;
            }
            let floor = self.floor[run_start];
            let mut run_end = run_start + 1;
            while run_end < sections.end && self.total[run_end] > 0 && self.floor[run_end] == floor {
                run_end += 1;
            }
            let (a, b) = (run_start, run_end);
            run_start = run_end;
            let higher = |s: usize| self.total[s] == 0 || self.floor[s] > floor;
            if !(a == sections.start || higher(a - 1)) || !(b == sections.end || higher(b)) {
                continue; // not a valley
            }
            for section in a..b {
                if floor != lowest && self.row_len(section) > LEVELS_MOST_BUFFERS {
                    continue;
                }
                // Counted only as far as it matters: past the fewest so far, this section loses.
                let enough = chosen.map_or(usize::MAX, |(fewest, ..)| fewest + 1);
                let count = self
                    .members_of(section)
                    .iter()
                    .filter(|&&m| {
                        self.lowest(m as usize) == floor
                            && self.allows(m, floor)
                            && !self.stacked_out_of_order(m, floor)
                    })
                    .take(enough)
                    .count();
                if count == 0 {
                    self.dead_ends[section] = self.dead_ends[section].saturating_add(1);
                    return Err(Dfs::Infeasible);
                }
                let key = if self.style.rightmost { usize::MAX - section } else { section };
                let candidate = (count, u32::MAX - self.dead_ends[section], floor, key);
                if chosen.is_none_or(|best| candidate < best) {
                    chosen = Some(candidate);
                }
            }
        }
        let Some((_, _, fill, key)) = chosen else {
            return Err(Dfs::Found);
        };
        Ok((if self.style.rightmost { usize::MAX - key } else { key }, fill))
    }

    /// The buffers that can fill `section` at `fill`, in value order: no larger twin left unplaced
    /// first, then (guided) flush with a neighbouring floor, then the longer, then by rank.
    fn fill_candidates(&mut self, section: usize, fill: u64, sections: Range<usize>) -> Vec<(u64, u32, u32)> {
        let mut candidates = self.candidate_lists.pop().unwrap_or_default();
        let flush_or_long = |m: u32| {
            let (ms, me) = self.sections_of[m as usize];
            let top = fill + self.size[m as usize];
            let left = (ms as usize > sections.start).then(|| self.floor[ms as usize - 1]);
            let right = ((me as usize) < sections.end).then(|| self.floor[me as usize]);
            (left != Some(top) && right != Some(top), u32::MAX - (me - ms))
        };
        let flush_or_long = |m: u32| if self.style.guided { flush_or_long(m) } else { (false, 0) };
        let larger_twin_left = |m: u32| {
            let l = m as usize;
            self.twins
                .of(l)
                .take_while(|&t| self.size[t as usize] > self.size[l])
                .any(|t| self.offset[t as usize] == UNPLACED)
        };
        // The keys packed into one word (most significant first), so a node allocates nothing.
        let value_order = |m: u32| {
            let (not_flush, shorter) = flush_or_long(m);
            u64::from(larger_twin_left(m)) << 33 | u64::from(not_flush) << 32 | u64::from(shorter)
        };
        candidates.clear();
        candidates.extend(
            self.members_of(section)
                .iter()
                .filter(|&&m| self.lowest(m as usize) == fill && self.allows(m, fill))
                .map(|&m| (value_order(m), self.rank[m as usize], m)),
        );
        candidates.sort_unstable();
        candidates
    }

    /// What makes two buffers interchangeable: their section range and size.
    fn shape(&self, local: u32) -> ((u32, u32), u64) {
        (self.sections_of[local as usize], self.size[local as usize])
    }

    /// Whether buffer `local`'s zero-slack domain has `offset` (always, without domains).
    fn allows(&self, local: u32, offset: u64) -> bool {
        self.domains.as_ref().is_none_or(|d| d.allows(local as usize, offset))
    }

    /// Whether placing `local` at `fill` would put it directly on a smaller twin: with every
    /// section of its range at the floor `fill`, a placed twin whose top is `fill` lies under it.
    fn stacked_out_of_order(&self, local: u32, fill: u64) -> bool {
        let l = local as usize;
        self.twins.highest_placed(l).is_some_and(|t| {
            let t = t as usize;
            self.size[t] < self.size[l] && self.offset[t] + self.size[t] == fill
        })
    }

    /// Searches the partition of the `unplaced` buffers over `sections`, continuing a canonical
    /// order whose last placement was `last` (offset, rank). Leaves the state as found.
    fn dfs(&mut self, unplaced: &[u32], sections: Range<usize>, last: (u64, u32)) -> Dfs {
        if self.style.by_section {
            return self.dfs_by_section(unplaced, sections, last.0);
        }
        if unplaced.is_empty() {
            return Dfs::Found;
        }
        if !self.count_node() {
            return Dfs::Exhausted;
        }
        let mut min_height = u64::MAX;
        for &l in unplaced {
            let end = self.min_offset[l as usize] + self.size[l as usize];
            if end > self.capacity {
                return Dfs::Infeasible; // minimum offsets only grow deeper down
            }
            min_height = min_height.min(end);
        }
        // Only the branches in canonical order and not dominated (a buffer fits under them) are
        // sorted.
        let mut candidates = self.candidate_lists.pop().unwrap_or_default();
        candidates.clear();
        candidates.extend(
            unplaced
                .iter()
                .map(|&l| (self.min_offset[l as usize], self.rank[l as usize], l))
                .filter(|&(offset, rank, _)| offset < min_height && (offset, rank) >= last),
        );
        candidates.sort_unstable();
        // Placements only lower totals: a branch whose offset plus this fits needs no scan.
        let max_total = self.total[sections.clone()].iter().copied().max().unwrap_or(0);
        let mut undo = self.undos.pop().unwrap_or_default();
        let mut outcome = Dfs::Infeasible;
        for &(offset, rank, local) in &candidates {
            outcome =
                self.branch((local, offset), unplaced, sections.clone(), Some((offset, rank)), max_total, &mut undo);
            if !matches!(outcome, Dfs::Infeasible) {
                break; // found, or the budget is spent
            }
        }
        self.candidate_lists.push(candidates);
        self.undos.push(undo);
        outcome
    }

    /// The canonical search, branching on sections: the buffers at one offset share no step, so
    /// which go there is decided section by section, the section with the fewest ways first
    /// (each of its buffers, or none, which only its slack allows). Bounds are as in `dfs`.
    fn dfs_by_section(&mut self, unplaced: &[u32], sections: Range<usize>, level: u64) -> Dfs {
        if unplaced.is_empty() {
            return Dfs::Found;
        }
        if !self.count_node() {
            return Dfs::Exhausted;
        }
        let mut min_height = u64::MAX;
        let mut at = u64::MAX;
        for &l in unplaced {
            let l = l as usize;
            if self.lowest(l) + self.size[l] > self.capacity {
                return Dfs::Infeasible;
            }
            min_height = min_height.min(self.min_offset[l] + self.size[l]);
            let offset = self.min_offset[l];
            if offset >= level && self.excluded_at[l] != offset {
                at = at.min(offset);
            }
        }
        // Dominance: at or above the lowest end some buffer reaches, that buffer fits under.
        if at >= min_height {
            return Dfs::Infeasible;
        }
        let max_total = self.total[sections.clone()].iter().copied().max().unwrap_or(0);
        if at > level && at + max_total > self.capacity && !self.sections_fit(sections.clone(), at) {
            return Dfs::Infeasible; // everything left goes at `at` or above
        }
        // The section with the fewest ways (ties to the leftmost, or the rightmost by style).
        let mut counted = core::mem::take(&mut self.counted);
        counted.clear();
        for &l in unplaced {
            if self.may_sit_at(l as usize, at) {
                let (s0, s1) = self.sections_of[l as usize];
                for s in s0..s1 {
                    if self.section_candidates[s as usize] == 0 {
                        counted.push(s);
                    }
                    self.section_candidates[s as usize] += 1;
                }
            }
        }
        let none_allowed = |search: &Self, s: usize| at + 1 + search.total[s] <= search.capacity;
        let mut chosen = (usize::MAX, usize::MAX);
        for &s in &counted {
            let s = s as usize;
            let ways = self.section_candidates[s] as usize + usize::from(none_allowed(self, s));
            let key = if self.style.rightmost { usize::MAX - s } else { s };
            chosen = chosen.min((ways, key));
        }
        for &s in &counted {
            self.section_candidates[s as usize] = 0;
        }
        self.counted = counted;
        let section = if self.style.rightmost { usize::MAX - chosen.1 } else { chosen.1 };
        let mut candidates = self.candidate_lists.pop().unwrap_or_default();
        candidates.clear();
        candidates.extend(
            self.members_of(section)
                .iter()
                .filter(|&&m| self.may_sit_at(m as usize, at))
                .map(|&m| (self.rank[m as usize] as u64, m, 0)),
        );
        candidates.sort_unstable();
        let mut undo = self.undos.pop().unwrap_or_default();
        let mut outcome = Dfs::Infeasible;
        for k in 0..candidates.len() {
            let local = candidates[k].1;
            if candidates[..k].iter().any(|&(_, other, _)| self.shape(other) == self.shape(local)) {
                continue; // an identical buffer was tried here: the same subtree
            }
            outcome = self.branch((local, at), unplaced, sections.clone(), Some((at, 0)), max_total, &mut undo);
            if !matches!(outcome, Dfs::Infeasible) {
                break; // found, or the budget is spent
            }
        }
        if matches!(outcome, Dfs::Infeasible) && none_allowed(self, section) {
            outcome = self.exclude_and_search(&candidates, at, unplaced, sections, &mut undo);
        }
        self.candidate_lists.push(candidates);
        self.undos.push(undo);
        outcome
    }

    /// The last branch of `dfs_by_section`: none of `candidates` sits at `at`; searches on at the
    /// same offset with them excluded there.
    fn exclude_and_search(
        &mut self,
        candidates: &[(u64, u32, u32)],
        at: u64,
        unplaced: &[u32],
        sections: Range<usize>,
        undo: &mut Undo,
    ) -> Dfs {
        undo.excluded.clear();
        undo.floors.clear();
        for &(_, local, _) in candidates {
            undo.excluded.push((local, self.excluded_at[local as usize]));
            self.excluded_at[local as usize] = at;
            self.lowest[local as usize] = at + 1;
        }
        self.mark_dirty(candidates.iter().map(|&(_, local, _)| local));
        self.raise_dirty_floors(&mut undo.floors);
        let fits = self.raised_floors_fit(undo, &sections)
            && self.dirty_level_floors_fit(&sections, at)
            && self.dirty_sections_fit(&sections, at);
        let outcome = if fits {
            self.exclusions_in_scope += 1;
            let outcome = self.dfs_by_section(unplaced, sections, at);
            self.exclusions_in_scope -= 1;
            outcome
        } else {
            Dfs::Infeasible
        };
        for &(s, previous) in undo.floors.iter().rev() {
            self.set_floor(s as usize, previous);
        }
        for &(local, previous) in undo.excluded.iter().rev() {
            self.excluded_at[local as usize] = previous;
            self.lowest[local as usize] = at + u64::from(previous == at);
        }
        outcome
    }

    /// The section bound at offset `at` of a section search on the `dirty` sections: a section
    /// with no buffer that may sit at `at` has its unplaced total above `at`.
    fn dirty_level_floors_fit(&self, sections: &Range<usize>, at: u64) -> bool {
        self.dirty.iter().all(|&s| {
            let s = s as usize;
            let total = self.total[s];
            if !sections.contains(&s) || total == 0 || at + 1 + total <= self.capacity {
                return true;
            }
            self.members_of(s).iter().any(|&m| self.may_sit_at(m as usize, at))
        })
    }

    /// Whether buffer `m` may sit at `at`: its minimum offset is `at` and it is not excluded there.
    fn may_sit_at(&self, m: usize, at: u64) -> bool {
        self.min_offset[m] == at && self.excluded_at[m] != at
    }

    /// One branch: places `local` at `offset`, applies the section bound, searches on, undoes.
    /// `last` is the canonical order's new last placement, `None` in zero-slack mode; `max_total`
    /// the partition's largest unplaced total before this placement.
    fn branch(
        &mut self,
        (local, offset): (u32, u64),
        unplaced: &[u32],
        sections: Range<usize>,
        last: Option<(u64, u32)>,
        max_total: u64,
        undo: &mut Undo,
    ) -> Dfs {
        undo.offsets.clear();
        undo.floors.clear();
        self.place(local, offset, undo);
        let monotonic_from = last.map_or(0, |(offset, _)| offset);
        let fits = self.raised_floors_fit(undo, &sections)
            && (monotonic_from + max_total <= self.capacity || self.sections_fit(sections.clone(), monotonic_from))
            && (last.is_some() || self.valleys_coverable(local, &sections))
            && (last.is_none() || !self.style.by_section || self.dirty_level_floors_fit(&sections, monotonic_from))
            && self.placement_levels_fit(undo, &sections, last.is_none(), monotonic_from);
        let outcome = if fits {
            let mut rest = self.lists.pop().unwrap_or_default();
            rest.clear();
            // Two block copies around `local`, not a filter.
            let at = unplaced.iter().position(|&l| l == local).unwrap_or(unplaced.len());
            rest.extend_from_slice(&unplaced[..at]);
            rest.extend_from_slice(unplaced.get(at + 1..).unwrap_or(&[]));
            let outcome = self.continue_after(local, &rest, sections, last);
            self.lists.push(rest);
            outcome
        } else {
            Dfs::Infeasible
        };
        self.unplace(local, undo);
        outcome
    }

    /// After placing `local`: split the partition where no unplaced buffer crosses a section
    /// boundary and search the parts one by one, or continue as one part.
    fn continue_after(&mut self, local: u32, rest: &[u32], sections: Range<usize>, last: Option<(u64, u32)>) -> Dfs {
        let (start, end) = self.sections_of[local as usize];
        let mut cut_points: Vec<usize> = Vec::new();
        for b in start as usize..(end as usize).saturating_sub(1) {
            if self.cuts[b] == 0 && sections.contains(&(b + 1)) {
                cut_points.push(b + 1);
            }
        }
        if cut_points.is_empty() {
            return match last {
                Some(last) => self.dfs(rest, sections, last),
                None => self.fill_skyline(rest, sections),
            };
        }
        cut_points.push(sections.end);
        let mut part_start = sections.start;
        for &part_end in &cut_points {
            let part: Vec<u32> = rest
                .iter()
                .copied()
                .filter(|&l| {
                    let (s, e) = self.sections_of[l as usize];
                    (s as usize) < part_end && part_start < e as usize
                })
                .collect();
            if !part.is_empty() {
                match self.search_partition(&part, part_start..part_end) {
                    Dfs::Found => {}
                    failed => return failed,
                }
            }
            part_start = part_end;
        }
        Dfs::Found
    }

    /// Sets a section's floor, keeping `state_key` in step.
    fn set_floor(&mut self, section: usize, floor: u64) {
        let key = self.section_keys[section];
        self.state_key ^= key.wrapping_mul(u128::from(self.floor[section]) + 1);
        self.state_key ^= key.wrapping_mul(u128::from(floor) + 1);
        self.floor[section] = floor;
    }

    /// The unplaced buffers (local indices) alive in `section`.
    fn members_of(&self, section: usize) -> &[u32] {
        let start = self.section_row[section];
        &self.section_members[start..start + self.unplaced_in[section] as usize]
    }

    /// How many buffers, placed or not, are alive in `section`.
    fn row_len(&self, section: usize) -> usize {
        self.section_row[section + 1] - self.section_row[section]
    }

    fn place(&mut self, local: u32, offset: u64, undo: &mut Undo) {
        let l = local as usize;
        let end = offset + self.size[l];
        self.offset[l] = offset;
        self.twins.placed(l, &self.offset);
        self.solution[l] = offset;
        self.state_key ^= self.keys[l];
        let (start, stop) = self.sections_of[l];
        for s in start as usize..stop as usize {
            undo.floors.push((s as u32, self.floor[s]));
            self.set_floor(s, end);
            self.total[s] -= self.size[l];
            // Out of the row's unplaced prefix: swapped with its last buffer.
            let own = (self.slot_base[l] + s as u32 - start) as usize;
            let at = self.slot[own] as usize;
            self.unplaced_in[s] -= 1;
            let last = self.section_row[s] + self.unplaced_in[s] as usize;
            let other = self.section_members[last] as usize;
            self.section_members.swap(at, last);
            self.slot[(self.slot_base[other] + s as u32 - self.sections_of[other].0) as usize] = at as u32;
            self.slot[own] = last as u32;
        }
        for b in start as usize..(stop as usize).saturating_sub(1) {
            self.cuts[b] -= 1;
        }
        for &other in self.overlaps.of(l) {
            let o = other as usize;
            if self.offset[o] == UNPLACED && self.min_offset[o] < end {
                undo.offsets.push((other, self.min_offset[o]));
                self.min_offset[o] = end;
                self.lowest[o] = end; // an exclusion was below `end`: it is lifted
            }
        }
        self.mark_dirty(undo.offsets.iter().map(|&(other, _)| other));
        self.raise_dirty_floors(&mut undo.floors);
    }

    /// Lists in `dirty` the sections of `buffers` (whose lowest offsets rose), each once.
    fn mark_dirty(&mut self, buffers: impl Iterator<Item = u32>) {
        self.next_mark();
        self.dirty.clear();
        for other in buffers {
            let (s0, s1) = self.sections_of[other as usize];
            for s in s0..s1 {
                if self.section_mark[s as usize] != self.mark {
                    self.section_mark[s as usize] = self.mark;
                    self.dirty.push(s);
                }
            }
        }
    }

    /// A fresh value of `mark` (no section holds it yet).
    fn next_mark(&mut self) {
        self.mark = self.mark.wrapping_add(1);
        if self.mark == 0 {
            self.section_mark.fill(0);
            self.mark = 1;
        }
    }

    /// Raises each `dirty` section's floor to the lowest offset its unplaced buffers can take,
    /// recording the floors replaced in `floors`.
    fn raise_dirty_floors(&mut self, floors: &mut Vec<(u32, u64)>) {
        let dirty = core::mem::take(&mut self.dirty);
        for &s in &dirty {
            let s = s as usize;
            // The lowest offset of the unplaced members, or `None` once one is at or below the floor.
            let floor = self.floor[s];
            let mut lowest = u64::MAX;
            for &m in self.members_of(s) {
                lowest = lowest.min(self.lowest(m as usize));
                if lowest <= floor {
                    break;
                }
            }
            if lowest != u64::MAX && lowest > floor {
                floors.push((s as u32, floor));
                self.set_floor(s, lowest);
            }
        }
        self.dirty = dirty;
    }

    /// The lowest offset buffer `m` can still take (above its minimum offset where excluded).
    fn lowest(&self, m: usize) -> u64 {
        self.lowest[m]
    }

    fn unplace(&mut self, local: u32, undo: &Undo) {
        let l = local as usize;
        self.state_key ^= self.keys[l];
        self.twins.unplaced(l);
        self.offset[l] = UNPLACED;
        let (start, stop) = self.sections_of[l];
        for s in start as usize..stop as usize {
            self.total[s] += self.size[l];
            // Back into the prefix: placed last, so it sits just past the prefix's end.
            debug_assert_eq!(self.section_members[self.section_row[s] + self.unplaced_in[s] as usize], local);
            self.unplaced_in[s] += 1;
        }
        for b in start as usize..(stop as usize).saturating_sub(1) {
            self.cuts[b] += 1;
        }
        for &(other, previous) in undo.offsets.iter().rev() {
            self.min_offset[other as usize] = previous;
            self.lowest[other as usize] = previous + u64::from(self.excluded_at[other as usize] == previous);
        }
        for &(s, previous) in undo.floors.iter().rev() {
            self.set_floor(s as usize, previous);
        }
    }

    /// The section bound on the sections whose floor this placement raised: the others passed it
    /// before and their totals can only have fallen.
    fn raised_floors_fit(&self, undo: &Undo, sections: &Range<usize>) -> bool {
        undo.floors.iter().all(|&(s, _)| {
            let s = s as usize;
            !sections.contains(&s) || self.total[s] == 0 || self.floor[s] + self.total[s] <= self.capacity
        })
    }

    /// Zero-slack look-ahead after placing `local`: every valley it touched must be exactly covered
    /// in time by unplaced buffers lying inside it (no gap may open, and a buffer starting at the
    /// floor cannot reach past the valley's higher neighbours).
    fn valleys_coverable(&mut self, local: u32, sections: &Range<usize>) -> bool {
        let (start, end) = self.sections_of[local as usize];
        let (start, end) = (start as usize, end as usize);
        let mut runs: [(usize, usize); 3] = [(0, 0); 3];
        for (k, probe) in [start.wrapping_sub(1), start, end].into_iter().enumerate() {
            if !sections.contains(&probe)
                || self.total[probe] == 0
                || runs[..k].iter().any(|r| (r.0..r.1).contains(&probe))
            {
                continue; // outside, filled to the capacity (a wall), or a run checked already
            }
            let floor = self.floor[probe];
            // Sections with nothing left to place are walls, whatever their floor.
            let open = |s: usize| self.total[s] > 0;
            let mut a = probe;
            while a > sections.start && open(a - 1) && self.floor[a - 1] == floor {
                a -= 1;
            }
            let mut b = probe + 1;
            while b < sections.end && open(b) && self.floor[b] == floor {
                b += 1;
            }
            runs[k] = (a, b);
            let lower_left = a > sections.start && open(a - 1) && self.floor[a - 1] < floor;
            let lower_right = b < sections.end && open(b) && self.floor[b] < floor;
            if lower_left || lower_right {
                continue; // not a valley: a buffer may yet span into the lower neighbour
            }
            if !self.valley_coverable(a, b) {
                return false;
            }
        }
        true
    }

    /// Whether sections `[a, b)` are exactly covered in time by unplaced buffers lying inside them
    /// (a path from boundary `a` to boundary `b` along the buffers' section ranges).
    fn valley_coverable(&mut self, a: usize, b: usize) -> bool {
        let mut reach = core::mem::take(&mut self.reach);
        reach.clear();
        reach.resize(b - a + 1, false);
        reach[0] = true;
        for s in a..b {
            if !reach[s - a] {
                continue;
            }
            for &m in self.members_of(s) {
                let (ms, me) = self.sections_of[m as usize];
                if ms as usize == s && me as usize <= b {
                    reach[me as usize - a] = true;
                }
            }
        }
        let covered = reach[b - a];
        self.reach = reach;
        covered
    }

    /// The section bound by levels on the `dirty` sections: the unplaced buffers that cannot sit
    /// below a level `z` lie between `z` and the capacity, for every level above the floor.
    /// Sections of more than `LEVELS_MOST_BUFFERS` buffers get the plain bound only.
    fn dirty_sections_fit(&mut self, sections: &Range<usize>, from: u64) -> bool {
        let mut stack = core::mem::take(&mut self.stack);
        let mut fits = true;
        for &s in &self.dirty {
            let s = s as usize;
            if !sections.contains(&s) || self.total[s] == 0 || self.row_len(s) > LEVELS_MOST_BUFFERS {
                continue;
            }
            stack.clear();
            for &m in self.members_of(s) {
                let m = m as usize;
                let lowest = self.level(m, from);
                if lowest > self.floor[s] {
                    stack.push((lowest.min(self.capacity + 1), self.size[m]));
                }
            }
            stack.sort_unstable_by_key(|&(level, _)| core::cmp::Reverse(level));
            let mut above = 0u64;
            fits = stack.iter().all(|&(level, size)| {
                above += size;
                level + above <= self.capacity
            });
            if !fits {
                break;
            }
        }
        self.stack = stack;
        fits
    }

    /// The level of unplaced buffer `m`: its lowest offset, at least `from`, raised to its domain.
    fn level(&self, m: usize, from: u64) -> u64 {
        let lowest = self.lowest(m).max(from);
        self.domains.map_or(lowest, |d| d.lowest_from(m, lowest))
    }

    /// The bound by levels after a placement: at zero slack only where the placement raised a
    /// buffer's level above the floor (the others passed before); in canonical mode the offset
    /// bound `from` rises, so every dirty section is checked.
    fn placement_levels_fit(&mut self, undo: &Undo, sections: &Range<usize>, zero_slack: bool, from: u64) -> bool {
        if zero_slack {
            self.keep_dirty_raised_above_floor(undo);
        }
        self.dirty_sections_fit(sections, from)
    }

    /// Keeps in `dirty` the sections where a buffer `undo` raised now lies above the floor.
    fn keep_dirty_raised_above_floor(&mut self, undo: &Undo) {
        self.next_mark();
        for &(raised, _) in &undo.offsets {
            let m = raised as usize;
            let level = self.level(m, 0);
            let (start, end) = self.sections_of[m];
            for s in start as usize..end as usize {
                if level > self.floor[s] {
                    self.section_mark[s] = self.mark;
                }
            }
        }
        let (mark, section_mark) = (self.mark, &self.section_mark);
        self.dirty.retain(|&s| section_mark[s as usize] == mark);
    }

    /// The section bound: the unplaced buffers of every section stack above its floor and above
    /// `offset` (later placements in this partition never go lower, by the canonical order).
    fn sections_fit(&self, sections: Range<usize>, offset: u64) -> bool {
        self.floor[sections.clone()]
            .iter()
            .zip(&self.total[sections])
            .all(|(&floor, &total)| total == 0 || floor.max(offset) + total <= self.capacity)
    }
}
