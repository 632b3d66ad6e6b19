//! How a caller stops a solve early: a callback, polled while the search runs with the progress so
//! far, answers whether to stop. The library keeps no clock (`no_std`, deterministic).

use crate::tuning::*;

/// What a solve tells its stop callback each time it polls it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Search nodes visited so far, over the whole solve.
    pub nodes: u64,
    /// The peak of the best placement found so far, in bytes (0 before the first one).
    pub peak: u64,
    /// The best proven lower bound so far, in bytes.
    pub lower_bound: u64,
    /// Whether a component's first placement (its start-order sweep) is under way: a stop now
    /// *stacks* that component (valid at once, a poor peak), so a caller may hold a soft limit back.
    pub first_placement: bool,
}

/// The callback and what it is shown, shared by every search of one solve.
pub(crate) struct Control<'a> {
    stop: &'a mut dyn FnMut(&Progress) -> bool,
    pub(crate) progress: Progress,
    /// Nodes counted since the last poll.
    since_poll: u64,
    stopped: bool,
}

impl<'a> Control<'a> {
    pub(crate) fn new(stop: &'a mut dyn FnMut(&Progress) -> bool) -> Self {
        Control { stop, progress: Progress::default(), since_poll: 0, stopped: false }
    }

    /// Counts `count` nodes, polling the callback when enough have passed; whether to stop (sticky).
    pub(crate) fn tick(&mut self, count: u64) -> bool {
        if self.stopped {
            return true;
        }
        self.progress.nodes = self.progress.nodes.saturating_add(count);
        self.since_poll = self.since_poll.saturating_add(count);
        if self.since_poll >= POLL_EVERY {
            self.since_poll = 0;
            self.stopped = (self.stop)(&self.progress);
        }
        self.stopped
    }

    /// Polls the callback now (in work that counts no nodes: greedy orders, sweeps, graph builds).
    pub(crate) fn poll(&mut self) -> bool {
        if !self.stopped {
            self.since_poll = 0;
            self.stopped = (self.stop)(&self.progress);
        }
        self.stopped
    }

    /// Runs `first` (a component's first placement) with `progress.first_placement` set, asking the
    /// callback afresh even after an earlier stop, which still stands after it.
    pub(crate) fn first_placement<R>(&mut self, first: impl FnOnce(&mut Self) -> R) -> R {
        let stopped_before = self.stopped;
        self.stopped = false;
        self.progress.first_placement = true;
        let result = first(self);
        self.progress.first_placement = false;
        self.stopped |= stopped_before;
        result
    }

    /// Whether the callback asked to stop.
    pub(crate) fn stopped(&self) -> bool {
        self.stopped
    }
}
