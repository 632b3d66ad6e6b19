//! The bounds search: a constraint-programming search over offset intervals `[lo, hi]`, for the
//! cores the skyline search cannot settle (it never checks what a placement does to the buffers'
//! upper ends). Each section is a *disjunctive resource*, on which the classic scheduling rules
//! narrow the intervals, each also run upside down so that both ends narrow: detectable
//! precedences, not-last, overload and edge-finding (the rules of CP-SAT's no-overlap constraint).
//! What narrows in one section is carried to the buffer's others until nothing narrows or an
//! interval empties. The search fixes the buffer with the lowest `lo` (ties by `Tiebreak`) at `lo`,
//! or on failure excludes it, depth-first; complete, so "infeasible" is a proof. The rules' work
//! counts as nodes, and a search goes on each run where the last stopped.

use alloc::vec::Vec;

use super::control::Control;
use super::domains::Domains;
use super::greedy::ComponentPlacement;
use super::search::SearchOutcome;
use super::sections::{Rows, Sections};
use super::Item;
use crate::tuning::*;

/// One buffer of the section being narrowed: its interval and size, as read or upside down.
#[derive(Clone, Copy)]
struct Task {
    lo: u64,
    hi: u64,
    size: u64,
    buffer: u32,
}

/// Which of the unfixed buffers with the lowest `lo` the search fixes first.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Tiebreak {
    /// The larger (the smaller first, CP-SAT's default, leans on conflict learning we lack).
    Larger,
    /// The one with the narrower interval (`hi - lo`): the fewest places left.
    Tighter,
    /// The one with the larger area: its size times the sections it spans.
    LargerArea,
    /// The one spanning more sections.
    Wider,
}

/// The bounds searches of a component with slack in the `Balanced` mix, side by side: each places
/// instances the other does not (BENCHMARKS.md, "Eighteenth pass").
pub(crate) const SLACK_TIEBREAKS: [Tiebreak; 2] = [Tiebreak::Larger, Tiebreak::Tighter];

/// The bounds search of a zero-slack component in the `Balanced` and `Restarts` mixes: ties to the
/// larger area; more orders placed no more (BENCHMARKS.md, "Eighteenth pass").
pub(crate) const ZERO_SLACK_TIEBREAKS: [Tiebreak; 1] = [Tiebreak::LargerArea];

/// A decision: `buffer` fixed at `value` (first branch) or kept off it; `trail` its length before.
#[derive(Clone, Copy)]
struct Decision {
    buffer: u32,
    value: u64,
    first: bool,
    trail: usize,
}

/// The bounds search of one component at one capacity, kept between runs: each run goes on from
/// where the last stopped, so a search given a budget round by round does no work twice.
#[derive(Clone)]
pub(crate) struct Bounds {
    tiebreak: Tiebreak,
    rows: Rows,
    size: Vec<u64>,
    capacity: u64,
    lo: Vec<u64>,
    hi: Vec<u64>,
    /// (buffer, lo, hi) before each change, for undoing.
    trail: Vec<(u32, u64, u64)>,
    /// The decisions taken, the latest last.
    stack: Vec<Decision>,
    /// Whether the intervals were narrowed to the domains and every section queued (first run).
    started: bool,
    /// The outcome of a propagation whose node the budget could not pay for, for the next run.
    pending: Option<bool>,
    queue: Vec<usize>,
    queued: Vec<bool>,
    /// Scratch of a section's narrowing.
    tasks: Vec<Task>,
    by_hi: Vec<u32>,
    set: Vec<(u64, u64)>,
    narrowed: Vec<u64>,
    /// Scratch of `edge_finding`: the set `Θ`, sorted by `lo`.
    theta: Vec<(u64, u64)>,
    /// Set members scanned so far, and how many of them are charged to the budget already.
    work: u64,
    charged: u64,
    /// The current run's budget left and nodes spent.
    nodes_left: u64,
    nodes: u64,
}

impl Bounds {
    /// The searches of the component under `capacity`, one per order of `tiebreaks`; none when a
    /// section holds more than `BOUNDS_MOST_BUFFERS` buffers.
    pub(crate) fn new(
        (items, members, sections): (&[Item], &[u32], &Sections),
        capacity: u64,
        tiebreaks: &[Tiebreak],
    ) -> Vec<Bounds> {
        let rows = sections.rows(items, members);
        if (0..sections.len()).any(|s| rows.of(s).len() > BOUNDS_MOST_BUFFERS) {
            return Vec::new();
        }
        let size: Vec<u64> = members.iter().map(|&m| items[m as usize].size).collect();
        let fresh = Bounds {
            tiebreak: Tiebreak::Larger,
            rows,
            capacity,
            lo: alloc::vec![0; size.len()],
            // A buffer larger than the capacity: the first run answers `Infeasible`.
            hi: size.iter().map(|&s| capacity.saturating_sub(s)).collect(),
            size,
            trail: Vec::new(),
            stack: Vec::new(),
            started: false,
            pending: None,
            queue: Vec::new(),
            queued: alloc::vec![false; sections.len()],
            tasks: Vec::new(),
            by_hi: Vec::new(),
            set: Vec::new(),
            narrowed: Vec::new(),
            theta: Vec::new(),
            work: 0,
            charged: 0,
            nodes_left: 0,
            nodes: 0,
        };
        tiebreaks.iter().map(|&tiebreak| Bounds { tiebreak, ..fresh.clone() }).collect()
    }

    /// Searches on from where the last run stopped within `*nodes_left` nodes, narrowing to the
    /// zero-slack `domains` (they may have tightened since); the outcome and the nodes spent.
    pub(crate) fn run(
        &mut self,
        domains: Option<&Domains>,
        nodes_left: &mut u64,
        control: &mut Control,
    ) -> (SearchOutcome, u64) {
        self.nodes_left = *nodes_left;
        self.nodes = 0;
        let outcome = self.search(domains, control);
        *nodes_left = self.nodes_left;
        (outcome, self.nodes)
    }

    /// Charges `decisions` nodes and the work not charged yet; `false` when spent or stopped.
    fn charge(&mut self, decisions: u64, control: &mut Control) -> bool {
        let units = (self.work - self.charged) / BOUNDS_WORK_PER_NODE;
        self.charged += units * BOUNDS_WORK_PER_NODE;
        let fresh = decisions + units;
        let paid = fresh.min(self.nodes_left);
        self.nodes_left -= paid;
        self.nodes += paid;
        paid == fresh && !control.tick(fresh)
    }

    fn search(&mut self, domains: Option<&Domains>, control: &mut Control) -> SearchOutcome {
        if !self.started {
            if self.size.iter().any(|&s| s > self.capacity) {
                return SearchOutcome::Infeasible;
            }
            if let Some(domains) = domains {
                for l in 0..self.lo.len() {
                    let (lo, hi) = (domains.lowest_from(l, 0), domains.highest_to(l, self.hi[l]));
                    match hi.filter(|&hi| lo <= hi) {
                        Some(hi) => (self.lo[l], self.hi[l]) = (lo, hi),
                        None => return SearchOutcome::Infeasible,
                    }
                }
            }
            for s in 0..self.queued.len() {
                self.queue_section(s);
            }
            self.started = true;
        }
        loop {
            // The budget: one node a decision, plus the propagation's work.
            let consistent = match self.pending.take() {
                Some(consistent) => consistent, // its node was charged in the run before
                None => {
                    let Some(consistent) = self.propagate(domains, control) else {
                        return SearchOutcome::BudgetExhausted;
                    };
                    if !self.charge(1, control) {
                        self.pending = Some(consistent);
                        return SearchOutcome::BudgetExhausted;
                    }
                    consistent
                }
            };
            if consistent {
                let Some(b) = self.choose() else {
                    let offsets = self.lo.clone();
                    let peak = offsets.iter().zip(&self.size).map(|(o, s)| o + s).max().unwrap_or(0);
                    return SearchOutcome::Found(ComponentPlacement { offsets, peak });
                };
                let value = self.lo[b];
                self.stack.push(Decision { buffer: b as u32, value, first: true, trail: self.trail.len() });
                self.set_bounds(b, value, value);
                continue;
            }
            // A conflict: back to the latest first branch, and take its second.
            loop {
                let Some(decision) = self.stack.pop() else {
                    return SearchOutcome::Infeasible;
                };
                self.undo_to(decision.trail);
                if decision.first {
                    let b = decision.buffer as usize;
                    self.stack.push(Decision { first: false, ..decision });
                    let above = decision.value + 1;
                    let lo = domains.map_or(above, |d| d.lowest_from(b, above));
                    self.set_bounds(b, lo, self.hi[b]);
                    break;
                }
            }
        }
    }

    /// The unfixed buffer with the lowest `lo`, ties by `Tiebreak`, then to the lower index.
    fn choose(&mut self) -> Option<usize> {
        self.work += self.lo.len() as u64;
        (0..self.lo.len()).filter(|&l| self.lo[l] < self.hi[l]).min_by_key(|&l| (self.lo[l], self.tie_key(l), l))
    }

    /// Buffer `l`'s rank under the search's `Tiebreak`, the lowest first.
    fn tie_key(&self, l: usize) -> u64 {
        let (start, end) = self.rows.spans[l];
        let span = u64::from(end - start);
        match self.tiebreak {
            Tiebreak::Larger => u64::MAX - self.size[l],
            Tiebreak::Tighter => self.hi[l] - self.lo[l],
            Tiebreak::LargerArea => u64::MAX - self.size[l].saturating_mul(span),
            Tiebreak::Wider => u64::MAX - span,
        }
    }

    /// Sets a buffer's interval (on the trail) and queues its sections.
    fn set_bounds(&mut self, l: usize, lo: u64, hi: u64) {
        self.trail.push((l as u32, self.lo[l], self.hi[l]));
        self.lo[l] = lo;
        self.hi[l] = hi;
        let (start, end) = self.rows.spans[l];
        for s in start as usize..end as usize {
            self.queue_section(s);
        }
    }

    fn queue_section(&mut self, s: usize) {
        if !self.queued[s] && self.rows.of(s).len() >= 2 {
            self.queued[s] = true;
            self.queue.push(s);
        }
    }

    fn undo_to(&mut self, mark: usize) {
        while self.trail.len() > mark {
            let Some((l, lo, hi)) = self.trail.pop() else { break };
            self.lo[l as usize] = lo;
            self.hi[l as usize] = hi;
        }
        self.clear_queue();
    }

    /// Narrows the queued sections until nothing narrows: `Some(false)` when an interval empties,
    /// `None` when out of budget or stopped.
    fn propagate(&mut self, domains: Option<&Domains>, control: &mut Control) -> Option<bool> {
        self.work += self.lo.len() as u64;
        if (0..self.lo.len()).any(|l| self.lo[l] > self.hi[l]) {
            self.clear_queue();
            return Some(false);
        }
        while let Some(section) = self.queue.pop() {
            if self.work - self.charged >= BOUNDS_CHARGE_EVERY && !self.charge(0, control) {
                self.queued[section] = true;
                self.queue.push(section);
                return None;
            }
            self.queued[section] = false;
            self.tasks.clear();
            for &l in self.rows.of(section) {
                let l = l as usize;
                self.tasks.push(Task { lo: self.lo[l], hi: self.hi[l], size: self.size[l], buffer: l as u32 });
            }
            if !self.narrow_section() {
                self.clear_queue();
                return Some(false);
            }
            for k in 0..self.tasks.len() {
                let task = self.tasks[k];
                let l = task.buffer as usize;
                let (lo, hi) = match domains {
                    Some(d) => (d.lowest_from(l, task.lo), d.highest_to(l, task.hi)),
                    None => (task.lo, Some(task.hi)),
                };
                let Some(hi) = hi.filter(|&hi| lo <= hi) else {
                    self.clear_queue();
                    return Some(false);
                };
                if lo != self.lo[l] || hi != self.hi[l] {
                    self.set_bounds(l, lo, hi);
                }
            }
        }
        Some(true)
    }

    fn clear_queue(&mut self) {
        for &s in &self.queue {
            self.queued[s] = false;
        }
        self.queue.clear();
    }

    /// The rules on `tasks`, then upside down; `false` when an interval empties.
    fn narrow_section(&mut self) -> bool {
        if !self.narrow_highs() || !self.edge_finding() {
            return false;
        }
        let capacity = self.capacity;
        let mirror = |task: &mut Task| {
            let (lo, hi) = (task.lo, task.hi);
            task.lo = capacity - task.size - hi;
            task.hi = capacity - task.size - lo;
        };
        self.tasks.iter_mut().for_each(mirror);
        let narrowed = self.narrow_highs() && self.edge_finding();
        self.tasks.iter_mut().for_each(mirror);
        narrowed
    }

    /// Overload checking and edge-finding, narrowing every task's `lo`: for each `e`, the set
    /// `Θ` of tasks that must end by `e` must fit before it (else no placement), and a task `b`
    /// that cannot end by `e` together with `Θ` lies above all of `Θ`: `lo(b) >= ect(Θ)`.
    fn edge_finding(&mut self) -> bool {
        self.by_hi.clear();
        self.by_hi.extend(0..self.tasks.len() as u32);
        let tasks = &self.tasks;
        self.by_hi.sort_unstable_by_key(|&k| tasks[k as usize].hi + tasks[k as usize].size);
        self.narrowed.clear();
        self.narrowed.extend(self.tasks.iter().map(|t| t.lo));
        let mut theta = core::mem::take(&mut self.theta);
        theta.clear();
        let mut next = 0;
        while next < self.by_hi.len() {
            let first = self.by_hi[next] as usize;
            let e = self.tasks[first].hi + self.tasks[first].size;
            while next < self.by_hi.len() {
                let k = self.by_hi[next] as usize;
                let task = self.tasks[k];
                if task.hi + task.size != e {
                    break;
                }
                next += 1;
                let at = theta.partition_point(|&(lo, _)| lo <= task.lo);
                theta.insert(at, (task.lo, task.size));
            }
            self.set.clone_from(&theta);
            let ect = self.earliest_end();
            if ect > e {
                self.theta = theta;
                return false; // overload: Θ cannot all end by `e`
            }
            for index in next..self.by_hi.len() {
                let k = self.by_hi[index];
                let task = self.tasks[k as usize];
                if task.lo >= ect {
                    continue;
                }
                self.set.clone_from(&theta);
                let at = self.set.partition_point(|&(lo, _)| lo <= task.lo);
                self.set.insert(at, (task.lo, task.size));
                if self.earliest_end() > e {
                    let lo = &mut self.narrowed[k as usize];
                    *lo = (*lo).max(ect);
                }
            }
        }
        self.theta = theta;
        for (task, &lo) in self.tasks.iter_mut().zip(&self.narrowed) {
            if lo > task.hi {
                return false;
            }
            task.lo = lo;
        }
        true
    }

    /// Detectable precedences and not-last, narrowing every task's `hi` against the intervals as
    /// read; `false` when an interval empties.
    fn narrow_highs(&mut self) -> bool {
        self.by_hi.clear();
        self.by_hi.extend(0..self.tasks.len() as u32);
        let tasks = &self.tasks;
        self.by_hi.sort_unstable_by_key(|&k| tasks[k as usize].hi);
        self.narrowed.clear();
        for b in 0..self.tasks.len() {
            let Task { lo: lo_b, hi: hi_b, size: size_b, .. } = self.tasks[b];
            let mut narrowed = hi_b;
            // Detectable precedences, upside down.
            self.set.clear();
            self.work += self.tasks.len() as u64;
            for (k, task) in self.tasks.iter().enumerate() {
                if k != b && task.lo + task.size > hi_b {
                    self.set.push((task.hi + task.size, task.size));
                }
            }
            if !self.set.is_empty() {
                let start = self.latest_start();
                match start.checked_sub(size_b).filter(|&end| end >= lo_b) {
                    Some(end) => narrowed = narrowed.min(end),
                    None => return false,
                }
            }
            // Not-last: the tasks with `hi` at most `h`, for each `h` from the lowest.
            self.set.clear();
            let mut next = 0;
            while next < self.by_hi.len() {
                let h = self.tasks[self.by_hi[next] as usize].hi;
                if h.saturating_sub(size_b) >= narrowed {
                    break; // no narrowing from here on: `h` only grows
                }
                while next < self.by_hi.len() && self.tasks[self.by_hi[next] as usize].hi == h {
                    let k = self.by_hi[next] as usize;
                    next += 1;
                    if k != b {
                        let task = self.tasks[k];
                        let at = self.set.partition_point(|&(lo, _)| lo <= task.lo);
                        self.set.insert(at, (task.lo, task.size));
                    }
                }
                if self.earliest_end() > hi_b {
                    match h.checked_sub(size_b).filter(|&end| end >= lo_b) {
                        Some(end) => narrowed = narrowed.min(end),
                        None => return false,
                    }
                    break;
                }
            }
            self.narrowed.push(narrowed);
        }
        for (task, &hi) in self.tasks.iter_mut().zip(&self.narrowed) {
            task.hi = hi;
        }
        true
    }

    /// The earliest the tasks of `set` ((lo, size), sorted by `lo`) can all be done.
    fn earliest_end(&mut self) -> u64 {
        self.work += self.set.len() as u64;
        let mut above = 0u64;
        let mut end = 0u64;
        for &(lo, size) in self.set.iter().rev() {
            above += size;
            end = end.max(lo + above);
        }
        end
    }

    /// The latest the tasks of `set` ((latest end, size), any order) can all start.
    fn latest_start(&mut self) -> u64 {
        self.work += self.set.len() as u64;
        self.set.sort_unstable();
        let mut below = 0u64;
        let mut start = u64::MAX;
        for &(end, size) in &self.set {
            below += size;
            start = start.min(end.saturating_sub(below));
        }
        start
    }
}
