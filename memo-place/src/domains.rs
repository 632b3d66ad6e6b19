//! Offset domains at zero slack: where each buffer *can* sit when every section is exactly full.
//! A buffer's offset is then, in every section it spans, a subset sum of the section's other
//! buffers: the intersection of those sums (over its sparsest `DOMAIN_SECTIONS`, each of at most
//! `DOMAIN_MOST_OTHERS` others) is its domain, and the skyline search drops a buffer whose domain
//! lacks the floor. Every domain holds every offset of any zero-slack placement, so the search
//! stays exact; a buffer without a small domain is unrestricted (`None`).

use alloc::vec::Vec;

use super::sections::{Rows, Sections};
use super::Item;
use crate::tuning::*;

/// The offset domain of each buffer (local index), sorted; `None`: any offset.
pub(crate) struct Domains {
    values: Vec<Option<Vec<u64>>>,
    /// Some section has no tiling with offsets from the domains: no zero-slack placement exists.
    refuted: bool,
    /// Where the tilings stand, resumed by each `tighten`.
    tightening: Tightening,
}

/// The sections still to tile (`Domains::tighten`), in rounds by a work limit per section.
struct Tightening {
    rows: Rows,
    capacity: u64,
    /// The sections of this round still to tile, in order from `at`; `queued` marks them.
    queue: Vec<usize>,
    at: usize,
    queued: Vec<bool>,
    /// Sections given up in this round, for the next.
    given_up: Vec<usize>,
    /// The work limit per section in this round.
    limit: u64,
}

impl Domains {
    /// The domains of `members` at `capacity`; `None` unless it is zero slack and some are found.
    pub(crate) fn of(items: &[Item], members: &[u32], sections: &Sections, capacity: u64) -> Option<Domains> {
        if sections.totals.iter().any(|&t| t != capacity) {
            return None;
        }
        let rows = sections.rows(items, members);
        let (mut sums, mut scratch) = (Vec::new(), Vec::new());
        let mut chosen: Vec<(usize, usize)> = Vec::new(); // (others, section)
        let values: Vec<Option<Vec<u64>>> = members
            .iter()
            .enumerate()
            .map(|(l, &m)| {
                let size = items[m as usize].size;
                let (start, end) = rows.spans[l];
                // The sparsest sections, and the span's first and last (they differ most).
                chosen.clear();
                chosen.extend(
                    (start as usize..end as usize)
                        .map(|s| (rows.of(s).len() - 1, s))
                        .filter(|&(others, _)| others <= DOMAIN_MOST_OTHERS),
                );
                chosen.sort_unstable();
                chosen.truncate(DOMAIN_SECTIONS);
                for edge in [start as usize, end as usize - 1] {
                    let others = rows.of(edge).len() - 1;
                    if others <= DOMAIN_MOST_OTHERS && !chosen.contains(&(others, edge)) {
                        chosen.push((others, edge));
                    }
                }
                let highest = capacity.checked_sub(size)?;
                let mut domain: Option<Vec<u64>> = None;
                for &(_, s) in &chosen {
                    let limit = domain.as_ref().and_then(|d| d.last().copied()).unwrap_or(highest);
                    let others = rows
                        .of(s)
                        .iter()
                        .filter(|&&o| o as usize != l)
                        .map(|&o| items[members[o as usize] as usize].size);
                    subset_sums(others, limit, &mut sums, &mut scratch);
                    domain = Some(match domain {
                        None => sums.clone(),
                        Some(d) => intersect(&d, &sums),
                    });
                }
                domain.filter(|d| d.len() <= DOMAIN_MOST_VALUES)
            })
            .collect();
        if values.iter().all(Option::is_none) {
            return None;
        }
        // Sparsest sections first: their tilings are fewest, and narrow the others' domains.
        let mut queue: Vec<usize> = (0..sections.len()).filter(|&s| rows.of(s).len() <= TILING_MOST_BUFFERS).collect();
        queue.sort_by_key(|&s| (rows.of(s).len(), s));
        let mut queued = alloc::vec![false; sections.len()];
        for &s in &queue {
            queued[s] = true;
        }
        let tightening =
            Tightening { rows, capacity, queue, at: 0, queued, given_up: Vec::new(), limit: TILING_FIRST_SECTION_WORK };
        let mut domains = Domains { values, refuted: false, tightening };
        domains
            .tighten(items, members, TILING_FIRST_WORK_PER_BUFFER.saturating_mul(members.len() as u64), &mut |_| false);
        Some(domains)
    }

    /// Whether some section has no tiling with offsets from the domains: no placement, a proof.
    pub(crate) fn refuted(&self) -> bool {
        self.refuted
    }

    /// Keeps in each domain only the offsets some *tiling* of a section uses (its buffers stacked
    /// from 0 to the capacity without a gap at offsets of their domains), as every zero-slack
    /// placement tiles every section; a section with no tiling refutes the capacity. Sections are
    /// tiled again when their domains change, in rounds of a state limit (fourfold a round), within
    /// `work` states, telling `spent` after each section (it answers whether to stop); returns the
    /// states spent, and the next call goes on (BENCHMARKS.md, "Fifteenth pass").
    pub(crate) fn tighten(
        &mut self,
        items: &[Item],
        members: &[u32],
        work: u64,
        spent: &mut dyn FnMut(u64) -> bool,
    ) -> u64 {
        let mut work_left = work;
        while work_left > 0 && !self.refuted {
            let t = &mut self.tightening;
            if t.at == t.queue.len() {
                // The round is over: the sections given up go again with a larger limit.
                if t.given_up.is_empty() || t.limit >= TILING_SECTION_WORK {
                    break;
                }
                t.limit = t.limit.saturating_mul(4).min(TILING_SECTION_WORK);
                t.given_up.sort_unstable_by_key(|&s| (t.rows.of(s).len(), s));
                t.given_up.dedup();
                t.queue = core::mem::take(&mut t.given_up);
                t.at = 0;
                for &s in &t.queue {
                    t.queued[s] = true;
                }
            }
            if work_left < t.limit {
                break; // not enough left for this section: the next call begins with it
            }
            let section = t.queue[t.at];
            t.at += 1;
            t.queued[section] = false;
            let (capacity, limit) = (t.capacity, t.limit);
            let held = self.tightening.rows.of(section);
            let Some(mut tiler) = Tiler::new(self, items, members, held, capacity, limit) else {
                continue; // too many buffers nearly free (`TILING_MOST_UNLISTED`)
            };
            let tiled = tiler.tile(0, 0);
            work_left -= tiler.work;
            if spent(tiler.work) {
                // Stopped: this section's outcome still holds, the rest waits.
                work_left = 0;
            }
            if tiler.work >= tiler.work_limit {
                self.tightening.given_up.push(section); // nothing concluded yet
                continue;
            }
            if !tiled {
                self.refuted = true;
                break;
            }
            let used = tiler.used;
            let t = &mut self.tightening;
            for (position, mut used) in used.into_iter().enumerate() {
                let l = t.rows.of(section)[position] as usize;
                used.sort_unstable();
                used.dedup();
                let narrower = match &self.values[l] {
                    Some(domain) => used.len() < domain.len(),
                    None => used.len() <= DOMAIN_MOST_VALUES,
                };
                if narrower {
                    self.values[l] = Some(used);
                    // The buffer's other sections may narrow further.
                    let (start, end) = t.rows.spans[l];
                    for other in start as usize..end as usize {
                        if !t.queued[other] && t.rows.of(other).len() <= TILING_MOST_BUFFERS {
                            t.queued[other] = true;
                            t.queue.push(other);
                        }
                    }
                }
            }
        }
        work - work_left
    }

    /// Whether buffer `l` may sit at `offset`.
    pub(crate) fn allows(&self, l: usize, offset: u64) -> bool {
        match &self.values[l] {
            None => true,
            Some(d) => d.binary_search(&offset).is_ok(),
        }
    }

    /// The highest offset at or below `to` that buffer `l` may take (`None`: none).
    pub(crate) fn highest_to(&self, l: usize, to: u64) -> Option<u64> {
        match &self.values[l] {
            None => Some(to),
            Some(d) => d[..d.partition_point(|&v| v <= to)].last().copied(),
        }
    }

    /// The lowest offset at or above `from` that buffer `l` may take (`u64::MAX`: none).
    pub(crate) fn lowest_from(&self, l: usize, from: u64) -> u64 {
        match &self.values[l] {
            None => from,
            Some(d) => d.get(d.partition_point(|&v| v < from)).copied().unwrap_or(u64::MAX),
        }
    }
}

/// The tilings of one section and the offsets they use (`None` past `TILING_MOST_UNLISTED`).
struct Tiler<'d> {
    domains: &'d Domains,
    /// The section's buffers (local indices), by position.
    held: &'d [u32],
    /// Per position, its size.
    size: Vec<u64>,
    /// Every (offset, position) a small domain allows, sorted.
    starts: Vec<(u64, u32)>,
    /// The positions whose buffers have no domain or a large one, as a mask (asked one by one).
    unlisted: u64,
    capacity: u64,
    /// Per position, the offsets it takes in some tiling found.
    used: Vec<Vec<u64>>,
    /// Sets of placed buffers (masks) already searched, and whether a tiling goes on from them.
    seen: MaskTable,
    work: u64,
    work_limit: u64,
}

impl<'d> Tiler<'d> {
    fn new(
        domains: &'d Domains,
        items: &[Item],
        members: &[u32],
        held: &'d [u32],
        capacity: u64,
        work_limit: u64,
    ) -> Option<Tiler<'d>> {
        let listed = |l: u32| domains.values[l as usize].as_ref().filter(|d| d.len() <= TILING_LISTED_VALUES);
        let unlisted =
            held.iter().enumerate().filter(|&(_, &l)| listed(l).is_none()).fold(0u64, |m, (p, _)| m | 1 << p);
        if unlisted.count_ones() as usize > TILING_MOST_UNLISTED {
            return None;
        }
        let size = held.iter().map(|&l| items[members[l as usize] as usize].size).collect();
        let mut starts: Vec<(u64, u32)> = Vec::new();
        for (position, &l) in held.iter().enumerate() {
            starts.extend(listed(l).into_iter().flatten().map(|&v| (v, position as u32)));
        }
        starts.sort_unstable();
        let used = alloc::vec![Vec::new(); held.len()];
        let seen = MaskTable::new();
        Some(Tiler { domains, held, size, starts, unlisted, capacity, used, seen, work: 0, work_limit })
    }

    /// Whether the buffers not in `placed` (total `offset`) tile `[offset, capacity)`, recording the
    /// offsets used; `false` also at the work limit.
    fn tile(&mut self, placed: u64, offset: u64) -> bool {
        if offset == self.capacity {
            return true; // zero slack: every buffer is placed exactly here
        }
        if let Some(live) = self.seen.get(placed) {
            return live;
        }
        if self.work >= self.work_limit {
            return false;
        }
        self.work += 1;
        let first = self.starts.partition_point(|&(v, _)| v < offset);
        let here = self.starts[first..].iter().take_while(|&&(v, _)| v == offset).map(|&(_, p)| p);
        let mut candidates = 0u64;
        for position in here {
            candidates |= 1 << position;
        }
        let mut unlisted = self.unlisted & !placed;
        while unlisted != 0 {
            let position = unlisted.trailing_zeros() as usize;
            unlisted &= unlisted - 1;
            if self.domains.allows(self.held[position] as usize, offset) {
                candidates |= 1 << position;
            }
        }
        candidates &= !placed;
        let mut any = false;
        while candidates != 0 {
            let position = candidates.trailing_zeros() as usize;
            candidates &= candidates - 1;
            let Some(top) = offset.checked_add(self.size[position]).filter(|&t| t <= self.capacity) else { continue };
            if self.tile(placed | 1 << position, top) {
                self.used[position].push(offset);
                any = true;
            }
            if self.work >= self.work_limit {
                return false;
            }
        }
        self.seen.insert(placed, any);
        any
    }
}

/// A set of 64-bit masks with one bit of value, by open addressing (`u64::MAX`, which no mask of
/// at most 63 positions is, marks an empty slot).
struct MaskTable {
    slots: Vec<(u64, bool)>,
    len: usize,
}

impl MaskTable {
    fn new() -> MaskTable {
        MaskTable { slots: alloc::vec![(u64::MAX, false); 64], len: 0 }
    }

    fn home(&self, mask: u64) -> usize {
        (mask.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize & (self.slots.len() - 1)
    }

    fn get(&self, mask: u64) -> Option<bool> {
        let mut slot = self.home(mask);
        loop {
            match self.slots[slot] {
                (u64::MAX, _) => return None,
                (held, value) if held == mask => return Some(value),
                _ => slot = (slot + 1) & (self.slots.len() - 1),
            }
        }
    }

    fn insert(&mut self, mask: u64, value: bool) {
        if 2 * (self.len + 1) > self.slots.len() {
            let grown = alloc::vec![(u64::MAX, false); 2 * self.slots.len()];
            let old = core::mem::replace(&mut self.slots, grown);
            self.len = 0;
            for (held, value) in old.into_iter().filter(|&(held, _)| held != u64::MAX) {
                self.insert(held, value);
            }
        }
        let mut slot = self.home(mask);
        while self.slots[slot].0 != u64::MAX && self.slots[slot].0 != mask {
            slot = (slot + 1) & (self.slots.len() - 1);
        }
        if self.slots[slot].0 == u64::MAX {
            self.len += 1;
        }
        self.slots[slot] = (mask, value);
    }
}

/// The distinct subset sums of `sizes` up to `limit`, sorted, into `out`.
fn subset_sums(sizes: impl Iterator<Item = u64>, limit: u64, out: &mut Vec<u64>, scratch: &mut Vec<u64>) {
    out.clear();
    out.push(0);
    for size in sizes {
        // Merge `out` with `out + size` (both sorted), dropping duplicates and sums past `limit`.
        scratch.clear();
        let (mut i, mut j) = (0, 0);
        while i < out.len() || j < out.len() {
            let shifted = out.get(j).map(|&v| v.saturating_add(size)).filter(|&v| v <= limit);
            let next = match (out.get(i).copied(), shifted) {
                (Some(a), Some(b)) if a <= b => {
                    i += 1;
                    a
                }
                (_, Some(b)) => {
                    j += 1;
                    b
                }
                (Some(a), None) => {
                    i += 1;
                    j = out.len();
                    a
                }
                (None, None) => break,
            };
            if scratch.last() != Some(&next) {
                scratch.push(next);
            }
        }
        core::mem::swap(out, scratch);
    }
}

/// The values in both sorted lists.
fn intersect(a: &[u64], b: &[u64]) -> Vec<u64> {
    let (mut i, mut j) = (0, 0);
    let mut both = Vec::new();
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            core::cmp::Ordering::Less => i += 1,
            core::cmp::Ordering::Greater => j += 1,
            core::cmp::Ordering::Equal => {
                both.push(a[i]);
                i += 1;
                j += 1;
            }
        }
    }
    both
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subset_sums_are_distinct_sorted_and_capped() {
        let (mut out, mut scratch) = (Vec::new(), Vec::new());
        subset_sums([3u64, 5, 3].into_iter(), 9, &mut out, &mut scratch);
        assert_eq!(out, [0, 3, 5, 6, 8]);
    }

    #[test]
    fn a_domain_is_the_intersection_of_its_sections_sums() {
        // Steps [0, 2) and [2, 4), both full at 20: buffer 0 (size 4) lives in both; 1 and 2
        // (6, 10) in the first, 3 (16) in the second. Buffer 0 sits on a subset of {6, 10} in the
        // first ({0, 6, 10, 16}) and of {16} in the second ({0, 16}): so at 0 or 16.
        let items = [
            Item { lower: 0, upper: 4, size: 4 },
            Item { lower: 0, upper: 2, size: 6 },
            Item { lower: 0, upper: 2, size: 10 },
            Item { lower: 2, upper: 4, size: 16 },
        ];
        let members = [0, 1, 2, 3];
        let sections = Sections::new(&items, &members);
        let domains = Domains::of(&items, &members, &sections, 20).expect("zero slack at 20");
        assert!(domains.allows(0, 0) && domains.allows(0, 16));
        assert!(!domains.allows(0, 6) && !domains.allows(0, 10));
        assert_eq!(domains.lowest_from(0, 1), 16);
        assert_eq!(domains.lowest_from(0, 17), u64::MAX);
        // Buffer 1 (one section): sums of {4, 10} up to 14.
        assert!(domains.allows(1, 14) && !domains.allows(1, 6));
        // Not zero slack at 21: no domains.
        assert!(Domains::of(&items, &members, &sections, 21).is_none());
    }
}
