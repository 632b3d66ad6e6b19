//! The exact search: does a component fit under a capacity? A depth-first branch-and-bound over
//! *canonical* placements, in the style of MiniMalloc (Moffitt, ASPLOS 2023).
//!
//! Every placement can be compacted (each buffer dropped until it rests on a buffer it shares a
//! step with, or on 0) without raising the peak. Listed by (offset, rank), a compacted placement
//! puts each buffer at its *minimum offset*: the highest end among the buffers placed before it
//! that share a step with it. So the search only chooses the order:
//! - each node branches on the unplaced buffers, in order of (minimum offset, rank), and places
//!   the chosen one at its minimum offset;
//! - canonical order: a branch whose (offset, rank) is below the previous placement's is skipped
//!   (that placement is reached through another order);
//! - dominance: a branch at or above the lowest end any unplaced buffer could reach is skipped
//!   (that buffer fits under it, and putting it first is no worse);
//! - section bound: in every time section, the unplaced buffers stack above both the section's
//!   floor and the current offset; if they would pass the capacity, the node is cut. A section's
//!   floor is the highest end placed in it, raised to the lowest minimum offset of its unplaced
//!   buffers (space below that can never be used again);
//! - branching by section (`Style::by_section`, most restarts): the buffers placed at one offset
//!   share no step, so the set that goes there is decided one section at a time, the section
//!   with the fewest ways first (one of its buffers there, or none of them, which only its slack
//!   allows); a section with no slack is filled before any free choice is made. Exact like the
//!   order above; on MiniMalloc's D and H, 4x fewer nodes and 10x less time (BENCHMARKS.md);
//! - dynamic decomposition: when the buffers placed so far cut time into ranges that no unplaced
//!   buffer crosses, the ranges are independent: each is searched on its own, and one failing
//!   fails the node without re-enumerating the others.
//!
//! - zero slack: when a partition's unplaced buffers exactly fill every one of its sections up to
//!   the capacity (as at the lower bound of a perfectly packable instance), no gap may ever open.
//!   Every section of a *valley* (a run of sections at one floor whose neighbours are higher;
//!   the lowest run is one) must be filled at its floor by one of its own buffers whose minimum
//!   offset is that floor, lying inside the valley; the partition branches only on those, for
//!   the valley section with the fewest (a skyline search; ties to the section where the
//!   restarts so far met the most dead ends, then to the lower floor), with
//!   identical buffers tried once, and *twins* (buffers over the same sections) stacked directly
//!   only larger below; the value order tries first buffers with no larger twin left unplaced.
//!   (Only a valley may be chosen: the buffer filling a section next to a lower one may have to
//!   wait for buffers below it.) A partition keeps its mode for its whole search, so the
//!   canonical-order argument is never mixed with this one.
//!
//! The search is exact: "infeasible" is a proof. It counts nodes and stops when its budget is
//! spent, reporting that honestly rather than guessing.

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

/// What the restarts of one search (one component, one capacity) share: the zero-slack offset
/// domains, the partial placements proven infeasible (a proof in one restart holds in all:
/// infeasibility is a property of the placement, not of the order that reached it), and where
/// the skyline searches met their dead ends (`dead_ends`).
pub(crate) struct Shared {
    domains: Option<Domains>,
    failed: Refuted,
    /// Per section, how often a skyline search found it unfillable: no buffer could fill it at
    /// its floor, or every one that could led to a refuted state. Among the sections with the
    /// fewest candidates the search fills the one with the most dead ends first, so later nodes
    /// and later restarts meet a known hard spot early, where a refutation is cheap, rather than
    /// under many unrelated choices made before it (the weighted-degree heuristic of constraint
    /// solvers, as a tie-break). Orders only: no proof depends on it.
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

    /// Tightens the zero-slack domains by at most `work` states of section tilings
    /// (`Domains::tighten`, which tells `spent` as it goes); returns the states spent (0 without
    /// domains). The refuted states stay refuted: narrower domains only drop placements that
    /// never existed.
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
    /// Among equally low sections with equally few candidates, the rightmost (else the
    /// leftmost). At 1M nodes this settled pinwheel 300 seed 9 and 500 seed 1 besides.
    pub rightmost: bool,
    /// The rank is the contention order (largest unplaced total over a buffer's sections, then
    /// longer, then larger: `search_ranks`' first): each part a canonical search splits off is
    /// ranked afresh by it on the totals left then, as MiniMalloc re-sorts each sub-problem.
    pub contention: bool,
    /// A canonical search branches on sections, not buffers (`dfs_by_section`): at the current
    /// offset, the section with the fewest ways to be filled there (one of its buffers, or none).
    pub by_section: bool,
}

/// The restart that searches the contention order again (`search_ranks` lists it twice), ranking
/// split-off parts afresh (`Style::contention`). Only a canonical search splits parts that way.
pub(crate) const CONTENTION_RESTART: usize = 1;

impl Style {
    /// The style of restart `index` of a leaf's search: the contention restart ranks parts afresh;
    /// the others, counted without it, are guided every other one and rightmost every other pair,
    /// and all but the first two branch by section (those two keep MiniMalloc's branching, which
    /// settled its F, G, J and K in under 2,000 nodes each, and its I).
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
    /// The buffers of each section, in compressed rows, each row's unplaced buffers first: the
    /// first `unplaced_in[s]` of row `s` (a placement swaps the buffer to the end of that prefix
    /// and shortens it; placements are undone last first, so undoing only lengthens it again).
    /// Every scan of a section's unplaced buffers reads the prefix alone (testing each buffer of
    /// the row for being placed was the hottest line of the bound by levels; BENCHMARKS.md).
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
    /// `excluded_at[b] == min_offset[b]`: a section search decided that `b` does not sit at its
    /// minimum offset (`dfs_by_section`'s last branch), so it sits higher. A placement that
    /// raises the minimum offset lifts the mark with it.
    excluded_at: Vec<u64>,
    /// The lowest offset each buffer can still take: its minimum offset, plus one where that is
    /// excluded (kept with both, as the skyline search reads it for every buffer it counts).
    lowest: Vec<u64>,
    floor: Vec<u64>,
    total: Vec<u64>,
    /// `cuts[b]`: unplaced buffers spanning both section `b` and section `b + 1`.
    cuts: Vec<u32>,
    capacity: u64,
    nodes_left: u64,
    nodes: u64,
    /// Random 128-bit keys of the buffers and sections. `state_key` is the XOR of the keys of the
    /// placed buffers and of `key(section) * (floor + 1)` over the sections. In zero-slack mode
    /// the placed set and the floors determine everything the rest of the search sees (every
    /// section is filled solidly up to its floor), so equal keys mean equal subproblems, however
    /// the placed buffers were ordered.
    keys: Vec<u128>,
    section_keys: Vec<u128>,
    state_key: u128,
    /// Partial placements (with the section range searched) proven infeasible: a skyline search
    /// reaches the same one through many orders, and every restart at the same capacity reaches
    /// it again (`Shared`). Bounded; a full cache stops growing.
    failed: &'a mut Refuted,
    /// Dead ends per section (`Shared::dead_ends`).
    dead_ends: &'a mut [u32],
    /// Section searches excluding buffers from their minimum offsets (`exclude_and_search`) on
    /// the current path. Their exclusions are not in `state_key`, so a failure found under one is
    /// not recorded (it may hinge on the exclusion); failures recorded without them still hold
    /// under them (an exclusion only takes choices away).
    exclusions_in_scope: u32,
    /// Sections whose floor a placement must recompute, each once (`section_mark` == `mark`
    /// marks them); kept between placements so no placement allocates.
    dirty: Vec<u32>,
    section_mark: Vec<u32>,
    mark: u32,
    /// Vectors returned by finished nodes, for the next ones to reuse: after the first descent a
    /// node allocates nothing.
    lists: Vec<Vec<u32>>,
    candidate_lists: Vec<Vec<(u64, u32, u32)>>,
    undos: Vec<Undo>,
    /// Scratch of `valley_coverable`: which boundaries of a valley its buffers reach.
    reach: Vec<bool>,
    /// Scratch of `dirty_sections_fit`: (lowest offset, size) of a section's buffers above its
    /// floor.
    stack: Vec<(u64, u64)>,
    /// Zero-slack offset domains (`domains`), when the whole search is at zero slack.
    domains: Option<&'a Domains>,
    /// Scratch of `dfs_by_section`: candidates per section (zero between nodes), and the sections
    /// counted.
    section_candidates: Vec<u32>,
    counted: Vec<u32>,
    /// The buffers over exactly the same sections as each other, in groups, with each group's
    /// highest placed member: `stacked_out_of_order` orders them.
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

/// Searches for a placement of the component's members with peak at most `capacity` (units),
/// spending at most `*nodes_left` nodes (decremented by what is used). `rank` orders ties between
/// buffers with the same minimum offset (a static preference: lower rank first). Returns the
/// outcome and the nodes spent; a stop asked for through `control` ends it as `BudgetExhausted`.
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
    /// Starts the search of a partition, choosing its mode: zero slack when every section that
    /// still has unplaced buffers is exactly full, canonical otherwise.
    fn search_partition(&mut self, unplaced: &[u32], sections: Range<usize>) -> Dfs {
        let zero_slack = sections.clone().all(|s| self.total[s] == 0 || self.floor[s] + self.total[s] == self.capacity);
        if zero_slack {
            // The bound by levels over every section once: from here on each placement rechecks
            // only the sections where it raised a buffer above the floor (`branch`).
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
    /// their ranks' values (so ranks stay distinct); returns the ranks it replaced, in the same
    /// order. On the whole instance this is the static order; on a part split off deeper, the
    /// buffers placed since no longer count, and on MiniMalloc's I that settled it (BENCHMARKS.md).
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

    /// Counts one node against the budget; `false` when the budget is spent or a stop was asked
    /// for (the node is not searched).
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
        // The sections of a *valley* (a run at one floor whose neighbours are higher, or the
        // partition's edge; the lowest run is one): whatever fills one of them at that floor lies
        // inside the valley (past a higher neighbour it would overlap what is placed there), so
        // every buffer below it is placed already and it can be placed now, at its minimum
        // offset, which must equal the floor. Branch on the section with the fewest such buffers
        // over every valley (fail first: a forced fill anywhere is taken before a choice at the
        // lowest floor; then the section with more dead ends, `Shared::dead_ends`; then the
        // lower floor; stacks out of order not counted); if one has none,
        // the partition cannot be completed. Crowded sections of higher valleys are not counted
        // (on MiniMalloc's dense J that cost 1.8x the time; BENCHMARKS.md).
        let Some(lowest) = sections.clone().filter(|&s| self.total[s] > 0).map(|s| self.floor[s]).min() else {
            return Dfs::Found;
        };
        // (count, dead ends reversed, floor, section); `key` is the section, or its reverse when
        // the rightmost wins ties.
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
                    return Dfs::Infeasible;
                }
                let key = if self.style.rightmost { usize::MAX - section } else { section };
                let candidate = (count, u32::MAX - self.dead_ends[section], floor, key);
                if chosen.is_none_or(|best| candidate < best) {
                    chosen = Some(candidate);
                }
            }
        }
        let Some((_, _, fill, key)) = chosen else {
            return Dfs::Found;
        };
        let section = if self.style.rightmost { usize::MAX - key } else { key };
        let mut candidates = self.candidate_lists.pop().unwrap_or_default();
        // Value order: a buffer whose top is flush with the floor next to it first, then longer
        // ones, then by rank. In the tilings measured (BENCHMARKS.md), the buffer that a solution
        // puts here was the flush one whenever there was one, and otherwise almost always the
        // longest; the static rank alone sent restarts astray early.
        let flush_or_long = |m: u32| {
            let (ms, me) = self.sections_of[m as usize];
            let top = fill + self.size[m as usize];
            let left = (ms as usize > sections.start).then(|| self.floor[ms as usize - 1]);
            let right = ((me as usize) < sections.end).then(|| self.floor[me as usize]);
            (left != Some(top) && right != Some(top), u32::MAX - (me - ms))
        };
        let flush_or_long = |m: u32| if self.style.guided { flush_or_long(m) } else { (false, 0) };
        // Before all that, a buffer with no larger twin left unplaced: twins stacked directly go
        // larger below (`stacked_out_of_order`), so a smaller one placed first waits for
        // something else to separate it from the larger ones, which often fails far deeper.
        let larger_twin_left = |m: u32| {
            let l = m as usize;
            self.twins
                .of(l)
                .take_while(|&t| self.size[t as usize] > self.size[l])
                .any(|t| self.offset[t as usize] == UNPLACED)
        };
        // The three keys packed into one word (most significant first), so the candidates share
        // the canonical search's pooled lists and a node allocates nothing.
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
        let mut undo = self.undos.pop().unwrap_or_default();
        let mut outcome = Dfs::Infeasible;
        for (index, &(_, _, local)) in candidates.iter().enumerate() {
            if candidates[..index].iter().any(|&(_, _, earlier)| self.shape(earlier) == self.shape(local)) {
                continue; // an identical buffer was tried here: the same subtree
            }
            if fill + self.size[local as usize] > self.capacity {
                continue;
            }
            // Stacks over one range: a buffer directly on its twin (a buffer over the same
            // sections, whose top is this floor) can swap places with it, so only one order is
            // searched: the larger below. Sorting every such stack so turns any placement into
            // one this allows; equal sizes are identical shapes, left to the rule above.
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

    /// What makes two buffers interchangeable: their section range and size.
    fn shape(&self, local: u32) -> ((u32, u32), u64) {
        (self.sections_of[local as usize], self.size[local as usize])
    }

    /// Whether buffer `local`'s zero-slack domain has `offset` (always, without domains).
    fn allows(&self, local: u32, offset: u64) -> bool {
        self.domains.as_ref().is_none_or(|d| d.allows(local as usize, offset))
    }

    /// Whether placing `local` at `fill` would put it directly on a smaller twin (a buffer over
    /// exactly the same sections): the stack order `fill_skyline` does not search. With every
    /// section of its range at the floor `fill`, a placed twin whose top is `fill` lies directly
    /// under it (and is the highest of its placed twins).
    fn stacked_out_of_order(&self, local: u32, fill: u64) -> bool {
        let l = local as usize;
        self.twins.highest_placed(l).is_some_and(|t| {
            let t = t as usize;
            self.size[t] < self.size[l] && self.offset[t] + self.size[t] == fill
        })
    }

    /// Searches the partition made of the `unplaced` buffers over `sections`, continuing a
    /// canonical order whose last placement was `last` (offset, rank). Leaves the state as found.
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
        // Only the branches that are in canonical order and not dominated (a branch at or above
        // the lowest end any unplaced buffer reaches has that buffer fit under it); sorting just
        // those, not every unplaced buffer, was most of a node's cost.
        let mut candidates = self.candidate_lists.pop().unwrap_or_default();
        candidates.clear();
        candidates.extend(
            unplaced
                .iter()
                .map(|&l| (self.min_offset[l as usize], self.rank[l as usize], l))
                .filter(|&(offset, rank, _)| offset < min_height && (offset, rank) >= last),
        );
        candidates.sort_unstable();
        // The largest unplaced total of the partition: placements only lower totals, so a branch
        // whose offset plus this fits every section needs no scan of them (`branch`).
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

    /// The canonical search, branching on sections. A canonical placement puts its buffers in
    /// rising offsets, each at its minimum offset; the buffers at one offset share no step, so
    /// which of them go there is a set, decided section by section: at the current offset (the
    /// lowest minimum offset of the buffers that may still sit at `level` or above), take the
    /// section whose buffers there (unplaced, not excluded) offer the fewest ways to fill it:
    /// each of them, or none (excluded from that offset, all of them: the section then waits for
    /// something higher, which only its slack allows). Each set is reached once. A section whose
    /// slack is spent has no "none", so fill-first: a forced section is settled before any free
    /// choice, as the zero-slack skyline search does. Dominance and the section bounds are as in
    /// `dfs`.
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
        // Dominance: at or above the lowest end some buffer reaches, that buffer fits under (the
        // branch that puts it there is searched already). No offset left is the same.
        if at >= min_height {
            return Dfs::Infeasible;
        }
        let max_total = self.total[sections.clone()].iter().copied().max().unwrap_or(0);
        if at > level && at + max_total > self.capacity && !self.sections_fit(sections.clone(), at) {
            return Dfs::Infeasible; // everything left goes at `at` or above
        }
        // Candidates per section; the section with the fewest ways (ties to the leftmost, or the
        // rightmost by style).
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

    /// The last branch of `dfs_by_section`: none of `candidates` (a section's buffers that could
    /// sit at `at`) sits there. Marks them, raises the floors of their sections, applies the
    /// section bounds, searches on at the same offset, and undoes the marks.
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

    /// The section bound at offset `at` of a section search, on the `dirty` sections: every
    /// unplaced buffer of a section sits at `at` (if it may: its minimum offset is `at` and it is
    /// not excluded there) or above it (a buffer whose minimum offset is below `at` waits for a
    /// placement at `at` or above to raise it), so a section without such a buffer at `at` has its
    /// unplaced total above `at`. (A section whose slack is spent needs one.)
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

    /// Whether buffer `m` may sit at `at` in a section search: its minimum offset is `at` and it
    /// was not excluded there.
    fn may_sit_at(&self, m: usize, at: u64) -> bool {
        self.min_offset[m] == at && self.excluded_at[m] != at
    }

    /// One branch: places `local` at `offset`, applies the section bound, searches on, and undoes
    /// the placement. `last` is the canonical order's new last placement (later placements of the
    /// partition never go below its offset), or `None` in zero-slack mode (no such promise).
    /// `max_total`: the partition's largest unplaced total before this placement.
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
            // Two block copies around `local` (copying element by element through a filter took
            // about 8% of the skyline search's time on 500 buffers).
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

    /// After placing `local`: split the partition where its placement left no unplaced buffer
    /// crossing a section boundary, and search the parts one by one; or continue as one part, in
    /// its mode (`last` is the canonical order's last placement, `None` in zero-slack mode).
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

    /// Lists in `dirty` the sections of `buffers` (whose lowest offsets rose), each once
    /// (neighbours share most of their sections, and recomputing one per neighbour was most of
    /// a placement's cost).
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

    /// Raises the floor of each `dirty` section to the lowest offset its unplaced buffers can
    /// take, recording the floors replaced in `floors`.
    fn raise_dirty_floors(&mut self, floors: &mut Vec<(u32, u64)>) {
        let dirty = core::mem::take(&mut self.dirty);
        for &s in &dirty {
            let s = s as usize;
            // The lowest offset of the unplaced members, or `None` as soon as one is at or below
            // the floor (then the floor stays: most sections end the scan early).
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

    /// The lowest offset buffer `m` can still take: its minimum offset, or above it where a
    /// section search excluded that.
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

    /// The section bound on the sections whose floor this placement raised (`undo.floors`): every
    /// other section passed it before (at every node all sections of the partition have
    /// floor + unplaced total within the capacity) and its total can only have fallen. Checking
    /// only these, not the whole partition, was most of a branch's cost.
    fn raised_floors_fit(&self, undo: &Undo, sections: &Range<usize>) -> bool {
        undo.floors.iter().all(|&(s, _)| {
            let s = s as usize;
            !sections.contains(&s) || self.total[s] == 0 || self.floor[s] + self.total[s] <= self.capacity
        })
    }

    /// Zero-slack look-ahead after placing `local`: every *valley* next to or under it (a maximal
    /// run of sections at one floor whose neighbours are higher, or the partition's edge) must be
    /// exactly covered at that floor by unplaced buffers lying inside it. At zero slack no gap may
    /// open, so each section of a valley gets a buffer starting at its floor; such a buffer's
    /// sections must all be at that floor when it is placed, and floors only rise, so it cannot
    /// reach past the valley's higher neighbours. The buffers starting at the floor therefore
    /// tile the valley in time. Only the runs `local` touched can have changed: other runs keep
    /// their floors, neighbours and buffers (`local` lay inside the lowest run).
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
            // Sections with nothing left to place are walls, whatever their floor (a part split
            // off a canonical search may hold some below the capacity, left under gaps).
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

    /// The section bound by levels, on the sections whose buffers' minimum offsets this placement
    /// raised (`dirty`): in a section, the unplaced buffers that cannot sit below a level `z`
    /// (their minimum offset, or the lowest offset their domain allows, is at least `z`) all lie
    /// between `z` and the capacity, so for every such level their sizes must fit there. The
    /// plain bound is the floor's level, and every level at or below the floor passes with it, so
    /// only the buffers above the floor are sorted. Sections of more than `LEVELS_MOST_BUFFERS`
    /// buffers are left to the plain bound (their sort cost more than it pruned: BENCHMARKS.md).
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

    /// The level of unplaced buffer `m` in the bound by levels: its lowest offset, at least
    /// `from`, raised to the next value its domain allows.
    fn level(&self, m: usize, from: u64) -> u64 {
        let lowest = self.lowest(m).max(from);
        self.domains.map_or(lowest, |d| d.lowest_from(m, lowest))
    }

    /// The bound by levels after a placement. In zero-slack mode only on the dirty sections where
    /// the placement raised a buffer's level (its lowest offset, raised to its domain) above the
    /// floor: in the others the bound sees the levels it passed with before, less any buffer now
    /// at or below the floor or placed (every section passed when the partition's search began,
    /// `search_partition`, and every node since). In canonical mode the offset bound `from`
    /// rises with the order, so every dirty section is checked.
    fn placement_levels_fit(&mut self, undo: &Undo, sections: &Range<usize>, zero_slack: bool, from: u64) -> bool {
        if zero_slack {
            self.keep_dirty_raised_above_floor(undo);
        }
        self.dirty_sections_fit(sections, from)
    }

    /// Keeps in `dirty` the sections where a buffer `undo` raised now has its level above the
    /// floor.
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

    /// The section bound over the partition's sections: the unplaced buffers of every section
    /// stack above its floor and above `offset` (later placements in this partition never go
    /// lower, by the canonical order).
    fn sections_fit(&self, sections: Range<usize>, offset: u64) -> bool {
        self.floor[sections.clone()]
            .iter()
            .zip(&self.total[sections])
            .all(|(&floor, &total)| total == 0 || floor.max(offset) + total <= self.capacity)
    }
}
