//! Buffer lifetimes and what follows from them alone: the live-bytes profile over time and its
//! maximum, which is a lower bound on the arena of any placement. (Temporal components are split
//! where the solver needs them, in `decompose`.)
//!
//! Time is a sequence of integer steps. A buffer is alive over the half-open range
//! `[lower, upper)`; two buffers conflict when their ranges intersect. Sizes are bytes; with an
//! alignment `a`, a buffer occupies its *footprint*, its size rounded up to a multiple of `a`.

use alloc::vec::Vec;

/// One buffer of a trace: `size` bytes alive over the half-open step range `[lower, upper)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct BufferLifetime {
    /// The id the trace gave this buffer (ids may repeat in MEMO traces once a buffer is freed).
    pub id: u64,
    /// First step at which the buffer is alive.
    pub lower: u32,
    /// First step at which the buffer is no longer alive (`upper > lower`).
    pub upper: u32,
    /// Size in bytes.
    pub size: u64,
}

impl BufferLifetime {
    /// Whether the two lifetimes share at least one step.
    pub fn overlaps_in_time(&self, other: &BufferLifetime) -> bool {
        self.lower < other.upper && other.lower < self.upper
    }
}

/// `size` rounded up to a multiple of `alignment` (`alignment` 0 is treated as 1), or `None` if
/// that does not fit in a `u64`.
pub fn footprint(size: u64, alignment: u64) -> Option<u64> {
    let alignment = alignment.max(1);
    size.div_ceil(alignment).checked_mul(alignment)
}

/// The live bytes of a set of buffers over time, as change points.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LiveProfile {
    /// `(step, live bytes from this step on)`, strictly increasing in step, one entry per step at
    /// which the live bytes change. Live bytes are 0 before the first entry.
    pub points: Vec<(u32, u64)>,
}

impl LiveProfile {
    /// The maximum of the live bytes over time (0 for no buffers).
    pub fn max_live_bytes(&self) -> u64 {
        self.points.iter().map(|&(_, live)| live).max().unwrap_or(0)
    }

    /// The first step at which the live bytes reach their maximum, if any buffer is alive ever.
    pub fn peak_step(&self) -> Option<u32> {
        let max = self.max_live_bytes();
        if max == 0 {
            return None;
        }
        self.points.iter().find(|&&(_, live)| live == max).map(|&(step, _)| step)
    }
}

/// The live-bytes profile of `buffers`, counting each buffer's footprint under `alignment`.
/// Sums saturate at `u64::MAX` (only reachable with sizes that no arena can hold).
pub fn live_profile(buffers: &[BufferLifetime], alignment: u64) -> LiveProfile {
    // Each buffer adds its footprint at `lower` and removes it at `upper`; sorting the events by
    // step and summing gives the profile. u128 keeps the running sum exact.
    let mut events: Vec<(u32, i128)> = Vec::with_capacity(buffers.len() * 2);
    for b in buffers {
        if b.upper <= b.lower {
            continue;
        }
        let bytes = footprint(b.size, alignment).map_or(u64::MAX as i128, |f| f as i128);
        if bytes == 0 {
            continue;
        }
        events.push((b.lower, bytes));
        events.push((b.upper, -bytes));
    }
    events.sort_unstable();
    let mut points: Vec<(u32, u64)> = Vec::new();
    let mut live: i128 = 0;
    let mut i = 0;
    while i < events.len() {
        let step = events[i].0;
        while i < events.len() && events[i].0 == step {
            live += events[i].1;
            i += 1;
        }
        let clamped = u64::try_from(live.max(0)).unwrap_or(u64::MAX);
        match points.last_mut() {
            Some(last) if last.1 == clamped => {}
            _ => points.push((step, clamped)),
        }
    }
    LiveProfile { points }
}

/// The lower bound on the arena of any placement of `buffers`: the maximum over time of the live
/// footprints. A placement whose peak equals it is optimal and has zero fragmentation.
pub fn lower_bound(buffers: &[BufferLifetime], alignment: u64) -> u64 {
    live_profile(buffers, alignment).max_live_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buf(id: u64, lower: u32, upper: u32, size: u64) -> BufferLifetime {
        BufferLifetime { id, lower, upper, size }
    }

    #[test]
    fn lower_bound_is_max_of_live_bytes() {
        let buffers = [buf(0, 0, 2, 10), buf(1, 1, 3, 5), buf(2, 2, 4, 7)];
        // steps: 0 -> 10, 1 -> 15, 2 -> 12, 3 -> 7
        let profile = live_profile(&buffers, 1);
        assert_eq!(profile.points, [(0, 10), (1, 15), (2, 12), (3, 7), (4, 0)]);
        assert_eq!(lower_bound(&buffers, 1), 15);
        assert_eq!(profile.peak_step(), Some(1));
    }

    #[test]
    fn alignment_rounds_each_buffer_up() {
        let buffers = [buf(0, 0, 2, 10), buf(1, 1, 3, 5)];
        assert_eq!(lower_bound(&buffers, 8), 16 + 8);
        assert_eq!(footprint(u64::MAX, 2), None);
        assert_eq!(footprint(0, 64), Some(0));
    }

    #[test]
    fn buffer_freed_at_a_step_does_not_overlap_one_allocated_then() {
        let a = buf(0, 0, 5, 1);
        let b = buf(1, 5, 6, 1);
        assert!(!a.overlaps_in_time(&b));
        assert_eq!(lower_bound(&[a, b], 1), 1);
    }
}
