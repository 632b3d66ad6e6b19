//! Pinwheel splits: the cut that flat splits and temporal components cannot make.
//!
//! A zero-slack component over steps `[t0, t1)` at height `C` may be five rectangles turning
//! around a middle one: for section boundaries `x1 < x2` and heights `0 < y1 < y2 < C`,
//! *bottom* `[t0, x2) x [0, y1)`, *left* `[t0, x1) x [y1, C)`, *centre* `[x1, x2) x [y1, y2)`,
//! *right* `[x2, t1) x [0, y2)`, *top* `[x1, t1) x [y2, C)`. No straight line crosses it without
//! cutting a piece, and the generator's hardest cores are such pinwheels.
//!
//! Given `x1 < x2`, a buffer crossing `x1` is in the bottom, one crossing `x2` in the top, and
//! none may span both. The left piece is a flat subset of the buffers living before `x1` (the
//! splits' flat-subset searches, asked for heights up to `C`), the right one of those after `x2`;
//! the buffers between are shared out among bottom, centre and top by a small search. Each piece,
//! zero slack at its own height, is placed as any part is. The pairs go in rounds, four times
//! the work a round, within `PINWHEEL_WORK_PER_BUFFER`. Not complete: it only finds placements.

use alloc::vec::Vec;

use super::{Budget, Finder, Splitter};
use crate::lifetime::{live_profile, BufferLifetime};
use crate::sections::endpoints;
use crate::tuning::*;
use crate::Item;

/// An outer piece (left or right) found: its buffers (local indices, sorted) and its height.
type OuterPiece = (Vec<u32>, u64);

/// The buffers of one side of a pair (before `x1` or after `x2`) as items, and the side's window.
struct Side {
    items: Vec<Item>,
    /// The component's local index of each item.
    local: Vec<u32>,
    window: (u32, u32),
}

impl Side {
    /// Flat subsets of the side that span its whole window, with their heights (at most
    /// `SIDE_TRIES`), asked for heights up to the capacity: the side is not zero slack.
    fn outer_pieces(&self, capacity: u64, budget: &mut Budget) -> Vec<OuterPiece> {
        let mut found = Vec::new();
        // The whole side, when it is flat (the searches below find proper subsets only).
        if let Some(height) = self.flat_height() {
            let mut outer = self.local.clone();
            outer.sort_unstable();
            found.push((outer, height));
        }
        let all: Vec<u32> = (0..self.items.len() as u32).collect();
        let mut finder = Finder::new(&self.items, &all, capacity.saturating_mul(2), budget);
        for _ in 0..SIDE_TRIES {
            let Some((subset, height)) = finder.next(&self.items, budget) else { break };
            let first = subset.iter().map(|&p| self.items[p as usize].lower).min();
            let last = subset.iter().map(|&p| self.items[p as usize].upper).max();
            if (first, last) != (Some(self.window.0), Some(self.window.1)) || height >= capacity {
                continue;
            }
            let mut outer: Vec<u32> = subset.iter().map(|&p| self.local[p as usize]).collect();
            outer.sort_unstable();
            if !found.iter().any(|(known, _)| *known == outer) {
                found.push((outer, height));
            }
        }
        found
    }

    /// The side's height when its buffers hold the same total in every section of its window.
    fn flat_height(&self) -> Option<u64> {
        let buffers: Vec<BufferLifetime> = (self.items.iter().enumerate())
            .map(|(id, i)| BufferLifetime { id: id as u64, lower: i.lower, upper: i.upper, size: i.size })
            .collect();
        // Flat: one total from the window's first step to its last, and nothing after.
        match live_profile(&buffers, 1).points[..] {
            [(start, height), (end, 0)] if (start, end) == self.window && height > 0 => Some(height),
            _ => None,
        }
    }
}

impl Splitter<'_, '_> {
    /// Places `component` (zero slack at `height`) at `base` by a pinwheel split, if one is found.
    pub(super) fn pinwheel(&mut self, component: &[u32], height: u64, base: u64) -> bool {
        let work = PINWHEEL_WORK_PER_BUFFER.saturating_mul(component.len() as u64);
        self.pinwheel_rounds(component, height, base, work)
    }

    /// The boundary pairs in rounds, each side's searches with `SIDE_FIRST_WORK` nodes a pair,
    /// four times more each round, while the component's share lasts.
    fn pinwheel_rounds(&mut self, component: &[u32], height: u64, base: u64, work: u64) -> bool {
        let items = &self.items;
        let points = endpoints(items, component);
        let (Some(&t0), Some(&t1)) = (points.first(), points.last()) else { return false };
        let inner: Vec<u32> = points.iter().copied().filter(|&p| t0 < p && p < t1).collect();
        // For each inner boundary, the latest end and the earliest start of a buffer crossing it.
        let reach: Vec<(u32, u32)> = inner
            .iter()
            .map(|&x| {
                let crossing = component.iter().map(|&l| &items[l as usize]).filter(|i| i.lower < x && x < i.upper);
                crossing.fold((x, x), |(latest, earliest), i| (latest.max(i.upper), earliest.min(i.lower)))
            })
            .collect();
        let mut pairs = Vec::new();
        for a in 0..inner.len() {
            for b in a + 1..inner.len() {
                // A buffer spanning both boundaries fits no pinwheel of them.
                if reach[a].0 <= inner[b] && inner[a] <= reach[b].1 {
                    pairs.push((a, b));
                }
            }
        }
        let mut side_work = SIDE_FIRST_WORK;
        let mut spent = 0u64;
        while self.budget.left > 0 && side_work <= FIND_WORK {
            // A side depends on its boundary alone: its outer pieces are found once a round.
            let mut lefts: Vec<Option<Vec<OuterPiece>>> = alloc::vec![None; inner.len()];
            let mut rights: Vec<Option<Vec<OuterPiece>>> = alloc::vec![None; inner.len()];
            for &(a, b) in &pairs {
                if self.budget.left == 0 || spent >= work {
                    return false;
                }
                let (x1, x2) = (inner[a], inner[b]);
                let before = self.budget.spent;
                if lefts[a].is_none() {
                    let side = self.side(component, (t0, x1));
                    lefts[a] = Some(self.within(side_work, |s| side.outer_pieces(height, &mut s.budget)));
                }
                if lefts[a].as_ref().is_some_and(Vec::is_empty) {
                    spent += self.budget.spent - before;
                    continue;
                }
                if rights[b].is_none() {
                    let side = self.side(component, (x2, t1));
                    rights[b] = Some(self.within(side_work, |s| side.outer_pieces(height, &mut s.budget)));
                }
                spent += self.budget.spent - before;
                let (Some(left), Some(right)) = (&lefts[a], &rights[b]) else { continue };
                if self.pinwheel_at(component, (height, base), (x1, x2), (left, right)) {
                    return true;
                }
            }
            side_work *= 4;
        }
        false
    }

    /// Tries the pinwheels of `component` with boundaries `x1 < x2` (no buffer spans both).
    fn pinwheel_at(
        &mut self,
        component: &[u32],
        (height, base): (u64, u64),
        (x1, x2): (u32, u32),
        (lefts, rights): (&[OuterPiece], &[OuterPiece]),
    ) -> bool {
        let items = &self.items;
        let middle: Vec<u32> = component
            .iter()
            .copied()
            .filter(|&l| items[l as usize].lower >= x1 && items[l as usize].upper <= x2)
            .collect();
        for (left, left_height) in lefts {
            let y1 = height - left_height;
            for (right, y2) in rights {
                if y1 >= *y2 {
                    continue;
                }
                let Some(shares) = self.share_middle(component, &middle, height, (x1, x2), (y1, *y2)) else { continue };
                if self.place_pinwheel(component, (height, base), (x1, x2), (left, y1), (right, *y2), &shares) {
                    return true;
                }
            }
        }
        false
    }

    /// The buffers of `component` living within `window`.
    fn side(&self, component: &[u32], window: (u32, u32)) -> Side {
        let mut side = Side { items: Vec::new(), local: Vec::new(), window };
        for &l in component {
            let item = self.items[l as usize];
            if window.0 <= item.lower && item.upper <= window.1 {
                side.items.push(item);
                side.local.push(l);
            }
        }
        side
    }

    /// Shares out `middle` (the buffers within `[x1, x2)`) so that the bottom is `y1` high in every
    /// section there and the top `height - y2`: per buffer, 0 bottom, 1 centre, 2 top. A
    /// depth-first search, largest buffers first, within `MIDDLE_WORK` nodes.
    fn share_middle(
        &mut self,
        component: &[u32],
        middle: &[u32],
        height: u64,
        (x1, x2): (u32, u32),
        (y1, y2): (u64, u64),
    ) -> Option<Vec<u8>> {
        let items = &self.items;
        let mut points: Vec<u32> = alloc::vec![x1, x2];
        points.extend(middle.iter().flat_map(|&l| [items[l as usize].lower, items[l as usize].upper]));
        points.extend(
            component
                .iter()
                .map(|&l| &items[l as usize])
                .flat_map(|i| [i.lower, i.upper])
                .filter(|&p| x1 < p && p < x2),
        );
        points.sort_unstable();
        points.dedup();
        let sections = points.len() - 1;
        let section_of = |t: u32| points.partition_point(|&p| p < t);
        // Room left per section in the bottom, centre and top once the crossing buffers are in.
        let mut room = alloc::vec![[y1, y2 - y1, height - y2]; sections];
        for &l in component {
            let i = &items[l as usize];
            let piece = if i.lower < x1 && i.upper > x1 {
                0
            } else if i.lower < x2 && i.upper > x2 {
                2
            } else {
                continue;
            };
            for r in &mut room[section_of(i.lower.max(x1))..section_of(i.upper.min(x2))] {
                r[piece] = r[piece].checked_sub(i.size)?;
            }
        }
        // By start, the largest first among equal starts.
        let mut order: Vec<u32> = middle.to_vec();
        order.sort_unstable_by_key(|&l| (items[l as usize].lower, core::cmp::Reverse(items[l as usize].size), l));
        let spans: Vec<(usize, usize, u64)> = order
            .iter()
            .map(|&l| {
                (section_of(items[l as usize].lower), section_of(items[l as usize].upper), items[l as usize].size)
            })
            .collect();
        let mut choice = alloc::vec![0u8; order.len()];
        let mut work = MIDDLE_WORK;
        // Sections before the first middle buffer's start take no share: their rooms are full.
        let first = spans.first().map_or(sections, |span| span.0);
        if room[..first].iter().any(|r| *r != [0; 3])
            || !share(&spans, 0, &mut room, &mut choice, &mut work, &mut self.budget)
        {
            return None;
        }
        let mut shares = alloc::vec![0u8; self.items.len()];
        for (k, &l) in order.iter().enumerate() {
            shares[l as usize] = choice[k];
        }
        Some(shares)
    }

    /// Places the five pieces; `shares[l]` puts a middle buffer in the bottom, centre or top.
    fn place_pinwheel(
        &mut self,
        component: &[u32],
        (height, base): (u64, u64),
        (x1, x2): (u32, u32),
        (left, y1): (&[u32], u64),
        (right, y2): (&[u32], u64),
        shares: &[u8],
    ) -> bool {
        let (mut bottom, mut centre, mut top) = (Vec::new(), Vec::new(), Vec::new());
        for &l in component {
            if left.binary_search(&l).is_ok() || right.binary_search(&l).is_ok() {
                continue;
            }
            let i = &self.items[l as usize];
            let piece = if i.lower >= x1 && i.upper <= x2 {
                shares[l as usize]
            } else if i.upper <= x2 {
                0 // before `x1`, or crossing it
            } else {
                2 // after `x2`, or crossing it
            };
            [&mut bottom, &mut centre, &mut top][usize::from(piece)].push(l);
        }
        self.solve_part(bottom, y1, base)
            && self.solve_part(left.to_vec(), height - y1, base + y1)
            && self.solve_part(centre, y2 - y1, base + y1)
            && self.solve_part(right.to_vec(), y2, base)
            && self.solve_part(top, height - y2, base + y2)
    }
}

/// The search of `Splitter::share_middle`: buffer `k` onwards (by start) into the pieces with room
/// for it; the sections before the next buffer's start must then have their rooms used up.
fn share(
    spans: &[(usize, usize, u64)],
    k: usize,
    room: &mut [[u64; 3]],
    choice: &mut [u8],
    work: &mut u64,
    budget: &mut Budget,
) -> bool {
    let Some(&(start, end, size)) = spans.get(k) else {
        return room.iter().all(|r| *r == [0; 3]);
    };
    if !budget.charge(work) {
        return false;
    }
    let complete = start..spans.get(k + 1).map_or(start, |next| next.0);
    for piece in 0..3 {
        if room[start..end].iter().all(|r| r[piece] >= size) {
            room[start..end].iter_mut().for_each(|r| r[piece] -= size);
            choice[k] = piece as u8;
            if room[complete.clone()].iter().all(|r| *r == [0; 3]) && share(spans, k + 1, room, choice, work, budget) {
                return true;
            }
            room[start..end].iter_mut().for_each(|r| r[piece] += size);
        }
    }
    false
}
