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
//!   floor (highest end placed in it) and the current offset; if they would pass the capacity, the
//!   node is cut.
//!
//! The search is exact: "infeasible" is a proof. It counts nodes and stops when its budget is
//! spent, reporting that honestly rather than guessing.

use alloc::vec::Vec;

use super::greedy::{ComponentPlacement, Overlaps};
use super::sections::Sections;
use super::Item;

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

struct Search<'a> {
    size: Vec<u64>,
    sections_of: Vec<(u32, u32)>,
    rank: Vec<u32>,
    overlaps: &'a Overlaps,
    offset: Vec<u64>,
    min_offset: Vec<u64>,
    floor: Vec<u64>,
    total: Vec<u64>,
    capacity: u64,
    nodes_left: u64,
    nodes: u64,
}

/// Searches for a placement of `members` with peak at most `capacity` (units), spending at most
/// `*nodes_left` nodes (decremented by what is used). `rank` orders ties between buffers with the
/// same minimum offset (a static preference: lower rank first).
pub(crate) fn search(
    items: &[Item],
    members: &[u32],
    overlaps: &Overlaps,
    sections: &Sections,
    rank: &[u32],
    capacity: u64,
    nodes_left: &mut u64,
) -> (SearchOutcome, u64) {
    let n = members.len();
    let mut state = Search {
        size: members.iter().map(|&m| items[m as usize].size).collect(),
        sections_of: members
            .iter()
            .map(|&m| {
                let r = sections.range_of(&items[m as usize]);
                (r.start as u32, r.end as u32)
            })
            .collect(),
        rank: rank.to_vec(),
        overlaps,
        offset: alloc::vec![UNPLACED; n],
        min_offset: alloc::vec![0; n],
        floor: alloc::vec![0; sections.len()],
        total: sections.totals.clone(),
        capacity,
        nodes_left: *nodes_left,
        nodes: 0,
    };
    if state.total.iter().any(|&t| t > capacity) {
        return (SearchOutcome::Infeasible, 0);
    }
    let unplaced: Vec<u32> = (0..n as u32).collect();
    let outcome = state.dfs(&unplaced, (0, 0));
    *nodes_left = state.nodes_left;
    let result = match outcome {
        Dfs::Found => {
            let peak = (0..n).map(|l| state.offset[l] + state.size[l]).max().unwrap_or(0);
            SearchOutcome::Found(ComponentPlacement { offsets: state.offset, peak })
        }
        Dfs::Infeasible => SearchOutcome::Infeasible,
        Dfs::Exhausted => SearchOutcome::BudgetExhausted,
    };
    (result, state.nodes)
}

enum Dfs {
    Found,
    Infeasible,
    Exhausted,
}

impl Search<'_> {
    fn dfs(&mut self, unplaced: &[u32], last: (u64, u32)) -> Dfs {
        if unplaced.is_empty() {
            return Dfs::Found;
        }
        if self.nodes_left == 0 {
            return Dfs::Exhausted;
        }
        self.nodes_left -= 1;
        self.nodes += 1;
        let mut candidates: Vec<(u64, u32, u32)> =
            unplaced.iter().map(|&l| (self.min_offset[l as usize], self.rank[l as usize], l)).collect();
        candidates.sort_unstable();
        let mut min_height = u64::MAX;
        for &(offset, _, l) in &candidates {
            let end = offset + self.size[l as usize];
            if end > self.capacity {
                return Dfs::Infeasible; // minimum offsets only grow deeper down
            }
            min_height = min_height.min(end);
        }
        let mut rest: Vec<u32> = Vec::with_capacity(unplaced.len() - 1);
        let mut offset_changes: Vec<(u32, u64)> = Vec::new();
        let mut floor_changes: Vec<(u32, u64)> = Vec::new();
        for &(offset, rank, local) in &candidates {
            if (offset, rank) < last {
                continue;
            }
            if offset >= min_height {
                break; // candidates are sorted by offset: every later one is dominated too
            }
            self.place(local, offset, &mut offset_changes, &mut floor_changes);
            let outcome = if self.sections_fit(offset) {
                rest.clear();
                rest.extend(unplaced.iter().copied().filter(|&l| l != local));
                self.dfs(&rest, (offset, rank))
            } else {
                Dfs::Infeasible
            };
            match outcome {
                Dfs::Found => return Dfs::Found,
                Dfs::Exhausted => {
                    self.unplace(local, &offset_changes, &floor_changes);
                    return Dfs::Exhausted;
                }
                Dfs::Infeasible => self.unplace(local, &offset_changes, &floor_changes),
            }
            offset_changes.clear();
            floor_changes.clear();
        }
        Dfs::Infeasible
    }

    fn place(
        &mut self,
        local: u32,
        offset: u64,
        offset_changes: &mut Vec<(u32, u64)>,
        floor_changes: &mut Vec<(u32, u64)>,
    ) {
        let l = local as usize;
        let end = offset + self.size[l];
        self.offset[l] = offset;
        for &other in self.overlaps.of(l) {
            let o = other as usize;
            if self.offset[o] == UNPLACED && self.min_offset[o] < end {
                offset_changes.push((other, self.min_offset[o]));
                self.min_offset[o] = end;
            }
        }
        let (start, stop) = self.sections_of[l];
        for s in start as usize..stop as usize {
            floor_changes.push((s as u32, self.floor[s]));
            self.floor[s] = end;
            self.total[s] -= self.size[l];
        }
    }

    fn unplace(&mut self, local: u32, offset_changes: &[(u32, u64)], floor_changes: &[(u32, u64)]) {
        let l = local as usize;
        self.offset[l] = UNPLACED;
        for &(other, previous) in offset_changes.iter().rev() {
            self.min_offset[other as usize] = previous;
        }
        for &(s, previous) in floor_changes.iter().rev() {
            self.floor[s as usize] = previous;
            self.total[s as usize] += self.size[l];
        }
    }

    /// The section bound: the unplaced buffers of every section stack above its floor and above
    /// `offset` (later placements never go lower, by the canonical order).
    fn sections_fit(&self, offset: u64) -> bool {
        self.floor
            .iter()
            .zip(&self.total)
            .all(|(&floor, &total)| total == 0 || floor.max(offset) + total <= self.capacity)
    }
}
