//! The placement checker: are the offsets a valid placement of the buffers?
//!
//! A placement is valid when every buffer starts at a multiple of the alignment, buffers alive at
//! the same step never share a byte, and every buffer ends at or below the claimed peak (and the
//! capacity, if one is given); the claimed peak must equal the highest end. Zero-size buffers
//! occupy nothing. Each buffer occupies its size rounded up to the alignment (its footprint).
//!
//! The algorithm is a sweep over time with the live address ranges kept in address order: two live
//! ranges overlap only if they are neighbours in that order, so each insertion checks its two
//! neighbours. The order is fixed up front (every buffer ranked by its start address), so the live
//! set is a set of ranks, a tree of bit words ([`RankSet`]). It shares no code with `arena`.

use alloc::vec::Vec;
use core::fmt;

use crate::lifetime::BufferLifetime;

/// One reason a placement is invalid. Buffer numbers are indices into the buffer slice.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum PlacementViolation {
    /// The number of offsets differs from the number of buffers.
    WrongLength {
        /// Buffers given.
        buffers: usize,
        /// Offsets given.
        offsets: usize,
    },
    /// A buffer with an empty lifetime (`upper <= lower`).
    EmptyLifetime {
        /// The buffer.
        buffer: usize,
    },
    /// A buffer's offset is not a multiple of the alignment.
    Misaligned {
        /// The buffer.
        buffer: usize,
        /// Its offset.
        offset: u64,
    },
    /// A buffer's end (offset + footprint) does not fit in a u64.
    EndOverflows {
        /// The buffer.
        buffer: usize,
    },
    /// Two buffers alive at the same step share bytes.
    Overlap {
        /// The lower-numbered buffer.
        first: usize,
        /// The other buffer.
        second: usize,
        /// A step at which both are alive.
        step: u32,
    },
    /// A buffer ends above the capacity.
    OverCapacity {
        /// The buffer.
        buffer: usize,
        /// Its end.
        end: u64,
        /// The capacity.
        capacity: u64,
    },
    /// The claimed peak differs from the highest end of any buffer.
    PeakMismatch {
        /// What the placement claims.
        claimed: u64,
        /// What the buffers reach.
        actual: u64,
    },
}

impl fmt::Display for PlacementViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::WrongLength { buffers, offsets } => write!(f, "{offsets} offsets for {buffers} buffers"),
            Self::EmptyLifetime { buffer } => write!(f, "buffer #{buffer} has an empty lifetime"),
            Self::Misaligned { buffer, offset } => write!(f, "buffer #{buffer} at offset {offset} is not aligned"),
            Self::EndOverflows { buffer } => write!(f, "buffer #{buffer} ends past 2^64"),
            Self::Overlap { first, second, step } => {
                write!(f, "buffers #{first} and #{second} share bytes while both are alive at step {step}")
            }
            Self::OverCapacity { buffer, end, capacity } => {
                write!(f, "buffer #{buffer} ends at {end}, above the capacity {capacity}")
            }
            Self::PeakMismatch { claimed, actual } => {
                write!(f, "claimed peak {claimed} but the buffers reach {actual}")
            }
        }
    }
}

/// Checks a placement; returns every violation found, sorted, or `Ok(())`.
pub fn check_placement(
    buffers: &[BufferLifetime],
    offsets: &[u64],
    alignment: u64,
    claimed_peak: u64,
    capacity: Option<u64>,
) -> Result<(), Vec<PlacementViolation>> {
    let mut violations = Vec::new();
    if buffers.len() != offsets.len() {
        violations.push(PlacementViolation::WrongLength { buffers: buffers.len(), offsets: offsets.len() });
        return Err(violations);
    }
    let alignment = alignment.max(1);
    // (start, end) of each buffer's bytes, or None when it occupies nothing.
    let mut extents: Vec<Option<(u64, u64)>> = Vec::with_capacity(buffers.len());
    let mut actual_peak = 0u64;
    for (index, (b, &offset)) in buffers.iter().zip(offsets).enumerate() {
        if b.upper <= b.lower {
            violations.push(PlacementViolation::EmptyLifetime { buffer: index });
        }
        if offset % alignment != 0 {
            violations.push(PlacementViolation::Misaligned { buffer: index, offset });
        }
        let bytes = (b.size as u128).div_ceil(alignment as u128) * alignment as u128;
        let end = offset as u128 + bytes;
        if end > u64::MAX as u128 {
            violations.push(PlacementViolation::EndOverflows { buffer: index });
            extents.push(None);
            continue;
        }
        let end = end as u64;
        if bytes == 0 || b.upper <= b.lower {
            extents.push(None);
            continue;
        }
        actual_peak = actual_peak.max(end);
        if let Some(capacity) = capacity {
            if end > capacity {
                violations.push(PlacementViolation::OverCapacity { buffer: index, end, capacity });
            }
        }
        extents.push(Some((offset, end)));
    }
    if actual_peak != claimed_peak {
        violations.push(PlacementViolation::PeakMismatch { claimed: claimed_peak, actual: actual_peak });
    }

    // Sweep: at each step, frees first (half-open lifetimes), then allocations. Each event is one
    // integer, (step, is_alloc, buffer) from the high bits down, so events sort as plain numbers
    // (about twice as fast as tuples on 100k buffers).
    let event = |step: u32, is_alloc: bool, index: usize| {
        (u128::from(step) << 65) | (u128::from(is_alloc) << 64) | index as u128
    };
    let mut events: Vec<u128> = Vec::with_capacity(2 * buffers.len());
    for (index, extent) in extents.iter().enumerate() {
        if extent.is_some() {
            events.push(event(buffers[index].lower, true, index));
            events.push(event(buffers[index].upper, false, index));
        }
    }
    events.sort_unstable();
    // Address order: buffers by (start, index); `by_rank[r]` is the buffer of rank `r`.
    let mut by_rank: Vec<u128> = (extents.iter().enumerate())
        .filter_map(|(index, extent)| extent.map(|(start, _)| (u128::from(start) << 64) | index as u128))
        .collect();
    by_rank.sort_unstable();
    let by_rank: Vec<usize> = by_rank.iter().map(|&packed| packed as u64 as usize).collect();
    let mut rank = alloc::vec![0usize; buffers.len()];
    for (r, &index) in by_rank.iter().enumerate() {
        rank[index] = r;
    }
    let mut live = RankSet::new(by_rank.len());
    for &packed in &events {
        let (step, is_alloc, index) = ((packed >> 65) as u32, (packed >> 64) & 1 == 1, packed as u64 as usize);
        let Some((start, end)) = extents[index] else { continue };
        if !is_alloc {
            live.remove(rank[index]);
            continue;
        }
        // The live neighbours in address order (a live range of equal start is one of them).
        for other in [live.before(rank[index]), live.after(rank[index])].into_iter().flatten() {
            let other = by_rank[other];
            let Some((other_start, other_end)) = extents[other] else { continue };
            if other_start < end && start < other_end {
                violations.push(overlap(index, other, step));
            }
        }
        live.insert(rank[index]);
    }
    if violations.is_empty() {
        Ok(())
    } else {
        violations.sort_unstable();
        violations.dedup();
        Err(violations)
    }
}

fn overlap(a: usize, b: usize, step: u32) -> PlacementViolation {
    PlacementViolation::Overlap { first: a.min(b), second: a.max(b), step }
}

/// A set of ranks `0..n` with the nearest member below or above any rank: bit words in levels,
/// a bit of level `k + 1` set when word of level `k` it stands for is not zero. Each operation
/// touches one word a level (three levels for 262,144 ranks); an ordered map took 3x longer on
/// 100k buffers.
struct RankSet {
    levels: Vec<Vec<u64>>,
}

impl RankSet {
    fn new(n: usize) -> RankSet {
        let mut levels = Vec::new();
        let mut bits = n.max(1);
        loop {
            let words = bits.div_ceil(64);
            levels.push(alloc::vec![0u64; words]);
            if words == 1 {
                return RankSet { levels };
            }
            bits = words;
        }
    }

    fn insert(&mut self, rank: usize) {
        let mut position = rank;
        for level in &mut self.levels {
            level[position / 64] |= 1 << (position % 64);
            position /= 64;
        }
    }

    fn remove(&mut self, rank: usize) {
        let mut position = rank;
        for level in &mut self.levels {
            let word = &mut level[position / 64];
            *word &= !(1 << (position % 64));
            if *word != 0 {
                return;
            }
            position /= 64;
        }
    }

    /// The largest member below `rank`.
    fn before(&self, rank: usize) -> Option<usize> {
        self.before_at(0, rank)
    }

    fn before_at(&self, level: usize, position: usize) -> Option<usize> {
        let word = position / 64;
        let below = self.levels[level][word] & ((1u64 << (position % 64)) - 1);
        if below != 0 {
            return Some(word * 64 + 63 - below.leading_zeros() as usize);
        }
        if level + 1 == self.levels.len() {
            return None;
        }
        let word = self.before_at(level + 1, word)?;
        Some(word * 64 + 63 - self.levels[level][word].leading_zeros() as usize)
    }

    /// The smallest member above `rank`.
    fn after(&self, rank: usize) -> Option<usize> {
        self.after_at(0, rank)
    }

    fn after_at(&self, level: usize, position: usize) -> Option<usize> {
        let word = position / 64;
        let above = self.levels[level][word] & u64::MAX.checked_shl(position as u32 % 64 + 1).unwrap_or(0);
        if above != 0 {
            return Some(word * 64 + above.trailing_zeros() as usize);
        }
        if level + 1 == self.levels.len() {
            return None;
        }
        let word = self.after_at(level + 1, word)?;
        Some(word * 64 + self.levels[level][word].trailing_zeros() as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buf(lower: u32, upper: u32, size: u64) -> BufferLifetime {
        BufferLifetime { id: 0, lower, upper, size }
    }

    #[test]
    fn accepts_a_valid_placement() {
        let buffers = [buf(0, 2, 10), buf(1, 3, 5), buf(2, 4, 10)];
        assert_eq!(check_placement(&buffers, &[0, 10, 0], 1, 15, Some(15)), Ok(()));
    }

    #[test]
    fn rejects_overlap_in_time_and_space() {
        let buffers = [buf(0, 2, 10), buf(1, 3, 5)];
        let e = check_placement(&buffers, &[0, 9], 1, 14, None).unwrap_err();
        assert_eq!(e, [PlacementViolation::Overlap { first: 0, second: 1, step: 1 }]);
    }

    /// The sweep compares each new range with its address neighbours; a long range that starts
    /// below and covers the new one is its predecessor, and must be caught.
    #[test]
    fn finds_overlap_with_a_longer_range_starting_lower() {
        // Bytes: 0 at [0, 100), 1 at [100, 110), 2 at [50, 60), all alive together: 2 overlaps 0.
        let buffers = [buf(0, 10, 100), buf(0, 10, 10), buf(0, 10, 10)];
        let e = check_placement(&buffers, &[0, 100, 50], 1, 110, None).unwrap_err();
        assert_eq!(e, [PlacementViolation::Overlap { first: 0, second: 2, step: 0 }]);
    }

    #[test]
    fn frees_before_allocs_at_the_same_step() {
        let buffers = [buf(0, 2, 10), buf(2, 3, 10)];
        assert_eq!(check_placement(&buffers, &[0, 0], 1, 10, None), Ok(()));
    }

    #[test]
    fn rejects_misalignment_capacity_and_wrong_peak() {
        let buffers = [buf(0, 2, 10), buf(0, 2, 10)];
        let e = check_placement(&buffers, &[0, 20], 8, 20, Some(20)).unwrap_err();
        assert_eq!(
            e,
            [
                PlacementViolation::Misaligned { buffer: 1, offset: 20 },
                PlacementViolation::OverCapacity { buffer: 1, end: 36, capacity: 20 },
                PlacementViolation::PeakMismatch { claimed: 20, actual: 36 },
            ]
        );
    }

    #[test]
    fn rejects_wrong_length_and_overflow() {
        assert_eq!(
            check_placement(&[buf(0, 1, 1)], &[], 1, 0, None),
            Err(alloc::vec![PlacementViolation::WrongLength { buffers: 1, offsets: 0 }])
        );
        let e = check_placement(&[buf(0, 1, 2)], &[u64::MAX], 1, 0, None).unwrap_err();
        assert!(e.contains(&PlacementViolation::EndOverflows { buffer: 0 }));
    }

    #[test]
    fn zero_size_buffers_occupy_nothing() {
        let buffers = [buf(0, 2, 0), buf(0, 2, 4)];
        assert_eq!(check_placement(&buffers, &[0, 0], 1, 4, None), Ok(()));
    }

    /// The rank set answers as an ordered set does, over sizes that need one, two and three levels
    /// of words, under random inserts and removes.
    #[test]
    fn the_rank_set_finds_the_neighbours_an_ordered_set_finds() {
        use crate::generate::SplitMix64;
        use alloc::collections::BTreeSet;
        let mut rng = SplitMix64::new(5);
        for n in [1usize, 2, 63, 64, 65, 4096, 4097, 70_000] {
            let mut set = RankSet::new(n);
            let mut reference = BTreeSet::new();
            for _ in 0..3000 {
                let rank = rng.below(n as u64) as usize;
                if rng.below(3) == 0 {
                    set.remove(rank);
                    reference.remove(&rank);
                } else {
                    set.insert(rank);
                    reference.insert(rank);
                }
                let probe = rng.below(n as u64) as usize;
                assert_eq!(set.before(probe), reference.range(..probe).next_back().copied(), "n {n}, below {probe}");
                assert_eq!(set.after(probe), reference.range(probe + 1..).next().copied(), "n {n}, above {probe}");
            }
        }
    }

    /// On random placements, dense enough that about half overlap somewhere, the checker reports an
    /// overlap exactly when some pair of buffers shares a step and a byte, and only such pairs.
    #[test]
    fn overlaps_are_found_exactly_when_a_pair_collides() {
        use crate::generate::SplitMix64;
        let mut rng = SplitMix64::new(9);
        let mut verdicts = [0usize; 2];
        for case in 0..2000 {
            let n = 2 + rng.below(12) as usize;
            let buffers: Vec<BufferLifetime> = (0..n)
                .map(|_| {
                    let lower = rng.below(20) as u32;
                    buf(lower, lower + 1 + rng.below(8) as u32, rng.below(6))
                })
                .collect();
            let offsets: Vec<u64> = (0..n).map(|_| rng.below(40)).collect();
            let peak = buffers.iter().zip(&offsets).filter(|(b, _)| b.size > 0).map(|(b, o)| o + b.size).max();
            let collides = |a: usize, b: usize| {
                let (x, y) = (&buffers[a], &buffers[b]);
                x.size > 0
                    && y.size > 0
                    && x.lower < y.upper
                    && y.lower < x.upper
                    && offsets[a] < offsets[b] + y.size
                    && offsets[b] < offsets[a] + x.size
            };
            let any = (0..n).any(|a| (a + 1..n).any(|b| collides(a, b)));
            let verdict = check_placement(&buffers, &offsets, 1, peak.unwrap_or(0), None);
            match &verdict {
                Ok(()) => assert!(!any, "case {case}: a collision was missed"),
                Err(violations) => {
                    assert!(any, "case {case}: {violations:?}");
                    for v in violations {
                        let PlacementViolation::Overlap { first, second, step } = *v else {
                            panic!("case {case}: {v:?}");
                        };
                        assert!(collides(first, second), "case {case}: {v:?}");
                        assert!((buffers[first].lower..buffers[first].upper).contains(&step), "case {case}");
                        assert!((buffers[second].lower..buffers[second].upper).contains(&step), "case {case}");
                    }
                }
            }
            verdicts[usize::from(any)] += 1;
        }
        assert!(verdicts[0] > 300 && verdicts[1] > 300, "both verdicts exercised: {verdicts:?}");
    }
}
