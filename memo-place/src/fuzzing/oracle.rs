//! Independent oracles for placement, written for clarity rather than speed. They use only
//! [`BufferLifetime`] and recompute everything from the raw input; none of them calls the solver
//! ([`crate`]) or the checker ([`crate::check`]), so they can catch bugs in either.
//!
//! All sizes here are footprints: a buffer's size rounded up to the alignment. Zero-footprint
//! buffers occupy nothing; they are ignored by every oracle (their offset is not looked at).

use alloc::vec;
use alloc::vec::Vec;

use crate::lifetime::BufferLifetime;

/// The footprint of every buffer under `alignment` (0 is treated as 1), or `None` if one does
/// not fit in a `u64`.
pub fn footprints(buffers: &[BufferLifetime], alignment: u64) -> Option<Vec<u64>> {
    let alignment = alignment.max(1);
    buffers.iter().map(|b| b.size.div_ceil(alignment).checked_mul(alignment)).collect()
}

/// Whether two buffers share a step (half-open lifetimes).
fn share_a_step(a: &BufferLifetime, b: &BufferLifetime) -> bool {
    a.lower < b.upper && b.lower < a.upper
}

/// What the pairwise check found about a placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NaiveVerdict {
    /// Every offset is aligned, every end fits in a `u64`, no two buffers alive at the same step
    /// share a byte, and no buffer has an empty lifetime.
    pub valid: bool,
    /// The highest end of a buffer that occupies bytes (0 when none does), saturated at
    /// `u64::MAX`.
    pub peak: u64,
}

/// Checks a placement by comparing every pair of buffers: quadratic, and obviously right.
pub fn naive_check(buffers: &[BufferLifetime], offsets: &[u64], alignment: u64) -> NaiveVerdict {
    let alignment = u128::from(alignment.max(1));
    if buffers.len() != offsets.len() {
        return NaiveVerdict { valid: false, peak: 0 };
    }
    let mut valid = true;
    let mut peak = 0u128;
    // (start, end) in u128, so that no end overflows here.
    let mut extents: Vec<Option<(u128, u128)>> = Vec::with_capacity(buffers.len());
    for (b, &offset) in buffers.iter().zip(offsets) {
        let offset = u128::from(offset);
        let bytes = u128::from(b.size).div_ceil(alignment) * alignment;
        let end = offset + bytes;
        valid &= b.lower < b.upper && offset % alignment == 0 && end <= u128::from(u64::MAX);
        if bytes > 0 && b.lower < b.upper {
            peak = peak.max(end);
            extents.push(Some((offset, end)));
        } else {
            extents.push(None);
        }
    }
    for i in 0..buffers.len() {
        for j in i + 1..buffers.len() {
            if let (Some((start_i, end_i)), Some((start_j, end_j))) = (extents[i], extents[j]) {
                if share_a_step(&buffers[i], &buffers[j]) && start_i < end_j && start_j < end_i {
                    valid = false;
                }
            }
        }
    }
    NaiveVerdict { valid, peak: u64::try_from(peak).unwrap_or(u64::MAX) }
}

/// The lowest offset at which `size` bytes fit among the `taken` ranges (any order).
fn lowest_fit(taken: &mut [(u64, u64)], size: u64) -> u64 {
    taken.sort_unstable();
    let mut cursor = 0u64;
    for &(start, end) in taken.iter() {
        if start >= cursor && start - cursor >= size {
            return cursor;
        }
        cursor = cursor.max(end);
    }
    cursor
}

/// Places `footprint`s in `order`, each at the lowest offset that fits among the buffers placed
/// before it that share a step with it. Returns the offsets (0 for buffers not in `order`) and
/// the peak.
fn first_fit_in_order(buffers: &[BufferLifetime], footprint: &[u64], order: &[usize]) -> (Vec<u64>, u64) {
    let mut offsets = vec![0u64; buffers.len()];
    let mut placed: Vec<usize> = Vec::with_capacity(order.len());
    let mut taken: Vec<(u64, u64)> = Vec::new();
    let mut peak = 0u64;
    for &i in order {
        taken.clear();
        for &j in &placed {
            if share_a_step(&buffers[i], &buffers[j]) {
                taken.push((offsets[j], offsets[j] + footprint[j]));
            }
        }
        offsets[i] = lowest_fit(&mut taken, footprint[i]);
        peak = peak.max(offsets[i] + footprint[i]);
        placed.push(i);
    }
    (offsets, peak)
}

/// The offset a best-fit greedy gives `size` bytes among the `taken` ranges (any order): the
/// smallest free gap between them that fits (ties: the lowest), or the top of the highest range
/// when none does (the space above everything is not a gap).
fn tightest_fit(taken: &mut [(u64, u64)], size: u64) -> u64 {
    taken.sort_unstable();
    let mut cursor = 0u64;
    let mut best: Option<(u64, u64)> = None; // (gap, offset)
    for &(start, end) in taken.iter() {
        if start > cursor && start - cursor >= size && best.is_none_or(|(gap, _)| start - cursor < gap) {
            best = Some((start - cursor, cursor));
        }
        cursor = cursor.max(end);
    }
    best.map_or(cursor, |(_, offset)| offset)
}

/// The peaks of the classic greedy orders, each placed first fit and best fit among the earlier
/// buffers it shares a step with: size descending (ties: start ascending), lifetime descending
/// (size descending), start ascending (size descending), area descending (size descending);
/// remaining ties in input order. Zero-footprint buffers are left out. `None` if the footprints
/// add up to more than a `u64`. The solver promises never to be worse than any of these.
pub fn classic_greedy_peaks(buffers: &[BufferLifetime], alignment: u64) -> Option<Vec<u64>> {
    let footprint = footprints(buffers, alignment)?;
    footprint.iter().try_fold(0u64, |sum, &f| sum.checked_add(f))?;
    let length = |i: usize| u64::from(buffers[i].upper - buffers[i].lower);
    let keys: [&dyn Fn(usize) -> (u128, u64); 4] = [
        &|i| (u128::from(footprint[i]), u64::from(u32::MAX - buffers[i].lower)),
        &|i| (u128::from(length(i)), footprint[i]),
        &|i| (u128::from(u32::MAX - buffers[i].lower), footprint[i]),
        &|i| (u128::from(footprint[i]) * u128::from(length(i)), footprint[i]),
    ];
    let mut peaks = Vec::new();
    for key in keys {
        let mut order: Vec<usize> = (0..buffers.len()).filter(|&i| footprint[i] > 0).collect();
        order.sort_by(|&a, &b| key(b).cmp(&key(a)).then(a.cmp(&b)));
        peaks.push(first_fit_in_order(buffers, &footprint, &order).1);
        let mut offsets = vec![0u64; buffers.len()];
        let mut placed: Vec<usize> = Vec::new();
        let mut peak = 0u64;
        for &i in &order {
            let mut taken: Vec<(u64, u64)> = placed
                .iter()
                .filter(|&&j| share_a_step(&buffers[i], &buffers[j]))
                .map(|&j| (offsets[j], offsets[j] + footprint[j]))
                .collect();
            offsets[i] = tightest_fit(&mut taken, footprint[i]);
            peak = peak.max(offsets[i] + footprint[i]);
            placed.push(i);
        }
        peaks.push(peak);
    }
    Some(peaks)
}

/// The start-order first-fit greedy: buffers by `lower` (ties: input order), each at the lowest
/// offset that fits among the live ones. Returns the offsets and the peak, or `None` if the
/// footprints add up to more than a `u64`.
pub fn first_fit_by_start(buffers: &[BufferLifetime], alignment: u64) -> Option<(Vec<u64>, u64)> {
    let footprint = footprints(buffers, alignment)?;
    footprint.iter().try_fold(0u64, |sum, &f| sum.checked_add(f))?;
    let mut order: Vec<usize> = (0..buffers.len()).filter(|&i| footprint[i] > 0).collect();
    order.sort_by_key(|&i| buffers[i].lower);
    Some(first_fit_in_order(buffers, &footprint, &order))
}

/// The optimal peak, by brute force over every order of the buffers that occupy bytes, each
/// placed first-fit (the lowest offset that fits among the earlier ones it shares a step with).
///
/// Why this is exact: take an optimal placement and list its buffers by offset. Placing them
/// first-fit in that order puts each at or below its offset in the optimal placement (by
/// induction: every earlier buffer that shares a step with it ends at or below its old end,
/// which is at or below this buffer's old offset, so that offset is free), so some order reaches
/// the optimum; and every order gives a valid placement, so none goes below it.
///
/// The search is depth-first with the prefixes shared and cut when a prefix already reaches the
/// best peak found; meant for at most about 8 buffers (8! orders). `None` if the footprints add
/// up to more than a `u64`.
pub fn optimum_brute_force(buffers: &[BufferLifetime], alignment: u64) -> Option<u64> {
    let footprint = footprints(buffers, alignment)?;
    let (_, greedy_peak) = first_fit_by_start(buffers, alignment)?;
    let members: Vec<usize> = (0..buffers.len()).filter(|&i| footprint[i] > 0).collect();
    let mut search = BruteForce {
        buffers,
        footprint: &footprint,
        offsets: vec![0; buffers.len()],
        placed: Vec::with_capacity(members.len()),
        best: greedy_peak,
        live_bound: live_bound(buffers, &footprint),
    };
    let mut unplaced = members;
    search.extend(&mut unplaced, 0);
    Some(search.best)
}

/// The most footprint bytes alive at one step (recomputed here step by step, not by events).
fn live_bound(buffers: &[BufferLifetime], footprint: &[u64]) -> u64 {
    buffers
        .iter()
        .map(|b| b.lower)
        .map(|step| {
            buffers
                .iter()
                .zip(footprint)
                .filter(|(other, _)| other.lower <= step && step < other.upper)
                .map(|(_, &f)| f)
                .sum()
        })
        .max()
        .unwrap_or(0)
}

struct BruteForce<'a> {
    buffers: &'a [BufferLifetime],
    footprint: &'a [u64],
    offsets: Vec<u64>,
    placed: Vec<usize>,
    /// The lowest peak of a complete order found so far (starts at the greedy's).
    best: u64,
    /// No order can go below this: stop once `best` reaches it.
    live_bound: u64,
}

impl BruteForce<'_> {
    fn extend(&mut self, unplaced: &mut Vec<usize>, peak: u64) {
        if unplaced.is_empty() {
            self.best = self.best.min(peak);
            return;
        }
        let mut taken: Vec<(u64, u64)> = Vec::new();
        for k in 0..unplaced.len() {
            if self.best <= self.live_bound {
                return;
            }
            let i = unplaced[k];
            taken.clear();
            for &j in &self.placed {
                if share_a_step(&self.buffers[i], &self.buffers[j]) {
                    taken.push((self.offsets[j], self.offsets[j] + self.footprint[j]));
                }
            }
            let offset = lowest_fit(&mut taken, self.footprint[i]);
            let new_peak = peak.max(offset + self.footprint[i]);
            if new_peak >= self.best {
                continue;
            }
            self.offsets[i] = offset;
            self.placed.push(i);
            unplaced.swap_remove(k);
            self.extend(unplaced, new_peak);
            // Undo: put `i` back where it was so the loop visits every buffer once.
            unplaced.push(i);
            let last = unplaced.len() - 1;
            unplaced.swap(k, last);
            self.placed.pop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buf(lower: u32, upper: u32, size: u64) -> BufferLifetime {
        BufferLifetime { id: 0, lower, upper, size }
    }

    #[test]
    fn naive_check_sees_overlap_alignment_and_overflow() {
        let buffers = [buf(0, 2, 10), buf(1, 3, 5)];
        assert_eq!(naive_check(&buffers, &[0, 10], 1), NaiveVerdict { valid: true, peak: 15 });
        assert!(!naive_check(&buffers, &[0, 9], 1).valid);
        assert!(!naive_check(&buffers, &[0, 12], 8).valid);
        assert!(!naive_check(&buffers, &[0, u64::MAX - 2], 1).valid);
        // Not alive together: the same bytes are fine.
        assert!(naive_check(&[buf(0, 1, 4), buf(1, 2, 4)], &[0, 0], 1).valid);
    }

    #[test]
    fn first_fit_fills_the_lowest_gap() {
        // 0 and 1 stacked; 0 dies; 2 arrives while 1 lives and fits under it.
        let buffers = [buf(0, 1, 4), buf(0, 3, 4), buf(1, 3, 3)];
        assert_eq!(first_fit_by_start(&buffers, 1), Some((vec![0, 4, 0], 8)));
    }

    #[test]
    fn brute_force_beats_the_greedy_where_order_matters() {
        // Live bytes: step 0: 3, step 1: 4, steps 2-3: 5. Start order puts `a` at 0 and `b` on
        // it, which leaves a one-byte hole under `b` that `c` (2 bytes) cannot use: peak 6. The
        // optimum puts `b` at 0, then `c` and `a` (never alive together) share bytes 2..: peak 5.
        let buffers = [buf(0, 2, 1), buf(0, 4, 2), buf(2, 4, 2), buf(1, 4, 1)];
        assert_eq!(live_bound(&buffers, &footprints(&buffers, 1).unwrap()), 5);
        assert_eq!(first_fit_by_start(&buffers, 1).map(|(_, peak)| peak), Some(6));
        assert_eq!(optimum_brute_force(&buffers, 1), Some(5));
    }

    #[test]
    fn brute_force_reaches_the_height_of_a_tiling() {
        for seed in 0..20 {
            let buffers = crate::generate::known_optimum(seed, 7, 5, 9);
            assert_eq!(optimum_brute_force(&buffers, 1), Some(9), "seed {seed}");
            // With alignment 4 every footprint is a multiple of 4: the optimum cannot be lower
            // than the aligned live bytes, and the tiling scaled by 4 shows what is reachable.
            let scaled: Vec<BufferLifetime> =
                buffers.iter().map(|b| BufferLifetime { size: b.size * 4, ..*b }).collect();
            assert_eq!(optimum_brute_force(&scaled, 4), Some(36), "seed {seed}");
        }
    }
}
