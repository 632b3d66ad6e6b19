//! The placement checker: are the offsets a valid placement of the buffers?
//!
//! A placement is valid when every buffer starts at a multiple of the alignment, buffers alive at
//! the same step never share a byte, and every buffer ends at or below the claimed peak (and the
//! capacity, if one is given); the claimed peak must equal the highest end. Zero-size buffers
//! occupy nothing. Each buffer occupies its size rounded up to the alignment (its footprint).
//!
//! The algorithm is a sweep over time with the live address ranges in an ordered map: two live
//! ranges overlap only if they are neighbours in address order, so each insertion checks its two
//! neighbours. It shares no code with `arena`.

use alloc::collections::BTreeMap;
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

    // Sweep: at each step, frees first (half-open lifetimes), then allocations.
    let mut events: Vec<(u32, bool, usize)> = Vec::new(); // (step, is_alloc, buffer)
    for (index, extent) in extents.iter().enumerate() {
        if extent.is_some() {
            events.push((buffers[index].lower, true, index));
            events.push((buffers[index].upper, false, index));
        }
    }
    events.sort_unstable();
    // start -> (end, buffer) of the live ranges. Ranges with equal starts collide at once.
    let mut live: BTreeMap<(u64, usize), u64> = BTreeMap::new();
    for &(step, is_alloc, index) in &events {
        let Some((start, end)) = extents[index] else { continue };
        if !is_alloc {
            live.remove(&(start, index));
            continue;
        }
        // The live range starting at or below `start` with the highest start, and the next one.
        if let Some((&(other_start, other), &other_end)) = live.range(..=(start, usize::MAX)).next_back() {
            if other_start < end && start < other_end {
                violations.push(overlap(index, other, step));
            }
        }
        if let Some((&(other_start, other), &other_end)) = live.range((start, usize::MAX)..).next() {
            if other_start < end && start < other_end {
                violations.push(overlap(index, other, step));
            }
        }
        live.insert((start, index), end);
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
}
