//! Arena placement: give every buffer an offset so that buffers alive at the same step never share
//! a byte, with the lowest possible peak (or under a given capacity). `spec/placement.md` (at the
//! repository root) is the contract; `ARCHITECTURE.md` beside this crate explains the pipeline:
//! units, reductions ([`decompose`]), the greedy portfolio ([`greedy`]), then for components above
//! the lower bound the exact search ([`search`]) with flat splits ([`split`]) and window modules
//! ([`modules`]), within a deterministic node budget. The peak is proven optimal when it equals
//! the lower bound, or when the search proved every lower capacity infeasible.
//!
//! Besides the solver, the crate holds what a placement needs around it, each sharing no code with
//! the search: [`lifetime`] (buffers, the live-bytes profile, the lower bound), [`check`] (the
//! independent placement checker), [`generate`] (deterministic instance generators with known
//! optima) and, with the `fuzzing` feature, `fuzzing` (the cargo-fuzz harness and its oracles).
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

extern crate alloc;
#[cfg(any(test, feature = "std"))]
extern crate std;

mod log;

pub mod check;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod generate;
pub mod lifetime;
mod rng;

mod bounds;
mod control;
mod decompose;
mod domains;
mod fillers;
mod greedy;
#[cfg(feature = "mip")]
pub mod mip;
mod modules;
#[cfg(feature = "std")]
mod portfolio;
mod refuted;
mod repair;
mod search;
mod sections;
mod split;
mod timetree;
mod tuning;
mod twins;

use alloc::vec;
use alloc::vec::Vec;
use core::fmt;

use crate::lifetime::footprint;
use crate::log::debug_log;
use crate::tuning::*;
use control::Control;
pub use control::Progress;
use greedy::{ComponentPlacement, Overlaps};
pub use lifetime::{lower_bound, BufferLifetime};
#[cfg(feature = "std")]
pub use portfolio::solve_portfolio;
use search::SearchOutcome;
use sections::Sections;
pub use tuning::DEFAULT_BUDGET_NODES;

/// What to solve for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SolveOptions {
    /// Find a placement whose peak is at most this many bytes (still minimising the peak as far as
    /// the budget allows). `None`: only minimise.
    pub capacity: Option<u64>,
    /// Every offset is a multiple of this (0 or 1: none); a buffer occupies its size rounded up.
    pub alignment: u64,
    /// Node budget of the exact search, over the whole solve.
    pub budget_nodes: u64,
    /// How the exact search shares its rounds among its searches.
    pub mix: SearchMix,
}

impl Default for SolveOptions {
    fn default() -> Self {
        SolveOptions { capacity: None, alignment: 1, budget_nodes: DEFAULT_BUDGET_NODES, mix: SearchMix::default() }
    }
}

/// How a round of the exact search shares its nodes among its searches (`ARCHITECTURE.md`, "The
/// search mixes"): `Balanced` is the best alone, `Restarts` and `Bounds` halves for `solve_portfolio`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SearchMix {
    /// The best alone: filled instances and window modules, then the bounds searches.
    #[default]
    Balanced,
    /// `Balanced` without the bounds searches of components with slack, beside `Bounds`; a
    /// graph-free leaf's repair runs whole before the classic orders over the tree.
    Restarts,
    /// The bounds searches lead (with slack three orders, `BOUNDS_MIX_SHARE`; at zero slack one,
    /// `BOUNDS_MIX_ZERO_SLACK_SHARE`), beside `Restarts`.
    Bounds,
}

impl SearchMix {
    /// The mixes to run side by side on `threads` threads (one: `Balanced`; two: the other two).
    pub fn portfolio(threads: usize) -> &'static [SearchMix] {
        match threads {
            0 | 1 => &[SearchMix::Balanced],
            2 => &[SearchMix::Restarts, SearchMix::Bounds],
            _ => &[SearchMix::Restarts, SearchMix::Bounds, SearchMix::Balanced],
        }
    }

    /// One round of the exact search at one capacity, as data: the filled instances and modules after
    /// the first two restarts (which alone settle many leaves), then the bounds searches (in `Bounds`
    /// with slack, before them).
    fn round(self, zero_slack: bool) -> &'static [Step] {
        use Step::{Bounds, FilledAndModules, Restarts};
        if self == SearchMix::Bounds && !zero_slack {
            &[Restarts(2), Bounds, FilledAndModules, Restarts(usize::MAX)]
        } else {
            &[Restarts(2), FilledAndModules, Bounds, Restarts(usize::MAX)]
        }
    }

    /// The most nodes per buffer the repair of a graph-free leaf may spend before the classic
    /// orders over the tree (which its greedy portfolio lacked) and the whole instance's repair
    /// follow: their peak-first starts alone; `Restarts` keeps the leaf's repair whole (side by
    /// side they cover both: the orders settle some traces, a long repair of the leaf others).
    fn repair_per_buffer(self, classic_done: bool) -> u64 {
        match (self, classic_done) {
            (SearchMix::Restarts, _) | (_, true) => u64::MAX,
            _ => REPAIR_BEFORE_ORDERS_PER_BUFFER,
        }
    }

    /// A filled instance's bounds-search share (times its modules' nodes).
    fn filled_bounds_share(self) -> u64 {
        match self {
            SearchMix::Restarts => RESTARTS_FILLED_BOUNDS_SHARE,
            SearchMix::Balanced | SearchMix::Bounds => FILLED_BOUNDS_SHARE,
        }
    }

    /// The orders of a component's bounds searches and each one's share of a round (times the
    /// round's restart nodes); a filled instance takes the zero-slack orders.
    fn bounds_searches(self, zero_slack: bool) -> (&'static [bounds::Tiebreak], u64) {
        use bounds::Tiebreak::{Larger, Tighter, Wider};
        match (self, zero_slack) {
            (SearchMix::Balanced, false) => (&bounds::SLACK_TIEBREAKS, BOUNDS_SHARE),
            (SearchMix::Balanced | SearchMix::Restarts, true) => (&bounds::ZERO_SLACK_TIEBREAKS, BOUNDS_SHARE),
            (SearchMix::Restarts, false) => (&[], 0),
            (SearchMix::Bounds, false) => (&[Tighter, Wider, Larger], BOUNDS_MIX_SHARE),
            (SearchMix::Bounds, true) => (&[Larger], BOUNDS_MIX_ZERO_SLACK_SHARE),
        }
    }
}

/// One step of a round of the exact search at one capacity ([`SearchMix::round`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// The round's next restarts, this many (`usize::MAX`: the rest), up to the round's node limit.
    Restarts(usize),
    /// The component's bounds searches, each on from where it stopped, with the mix's share.
    Bounds,
    /// The filled instances' searches, then the window modules, each with the restarts' nodes.
    FilledAndModules,
}

/// A placement and what is known about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Solution {
    /// The offset of each buffer, in bytes, in input order.
    pub offsets: Vec<u64>,
    /// The arena size this placement needs: the highest offset + footprint.
    pub peak: u64,
    /// The most footprint bytes alive at once: no placement can have a lower peak.
    pub lower_bound: u64,
    /// Whether no placement has a lower peak (proven).
    pub optimal: bool,
    /// How it was found.
    pub stats: SolveStats,
}

/// How a solve went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SolveStats {
    /// Search nodes visited.
    pub nodes: u64,
    /// The peak of the greedy portfolio, before the exact search.
    pub greedy_peak: u64,
    /// Components left after the reductions (each placed on its own).
    pub components: u32,
    /// Buffers in the largest such component.
    pub largest_component: u32,
    /// Buffers placed by the reductions alone.
    pub fixed_buffers: u32,
    /// Whether the node budget ran out before every component was settled.
    pub budget_exhausted: bool,
    /// Whether the stop callback of [`solve_with`] ended the solve early.
    pub stopped: bool,
    /// Components above the lower bound too large for the exact search (`EXACT_SEARCH_MAX_BUFFERS`,
    /// `OVERLAP_PAIR_LIMIT`), left to the improvement search (`repair`), without proofs.
    pub unsearched_components: u32,
}

/// Why no placement came back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SolveError {
    /// A buffer with `upper <= lower`.
    EmptyLifetime {
        /// Its index in the input.
        buffer: usize,
    },
    /// The footprints add up to more than 2^64 bytes.
    TooLarge,
    /// No placement fits under the capacity: proven.
    ProvenInfeasible {
        /// The capacity asked for.
        capacity: u64,
        /// A proven lower bound on every placement's peak, above the capacity.
        lower_bound: u64,
    },
    /// No placement under the capacity was found within the budget or before a stop; one may exist.
    NotFoundWithinBudget {
        /// The capacity asked for.
        capacity: u64,
        /// The best peak found.
        best_peak: u64,
        /// The proven lower bound.
        lower_bound: u64,
        /// Nodes spent.
        nodes: u64,
    },
}

impl fmt::Display for SolveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::EmptyLifetime { buffer } => {
                write!(
                    f,
                    "buffer #{buffer} has an empty lifetime (upper <= lower): lifetimes are half-open [lower, upper)"
                )
            }
            Self::TooLarge => f.write_str("the buffers add up to more than 2^64 bytes"),
            Self::ProvenInfeasible { capacity, lower_bound } => write!(
                f,
                "proven infeasible: every placement needs at least {lower_bound} bytes, above the capacity {capacity}"
            ),
            Self::NotFoundWithinBudget { capacity, best_peak, lower_bound, nodes } => write!(
                f,
                "no placement under {capacity} bytes found within the limit ({nodes} nodes): best peak {best_peak}, \
                 lower bound {lower_bound}; raise the node budget, the time allowed, or the capacity"
            ),
        }
    }
}

impl core::error::Error for SolveError {}

/// A buffer in units, as the solver sees it (only non-empty buffers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Item {
    pub lower: u32,
    pub upper: u32,
    pub size: u64,
}

#[cfg(test)]
impl Item {
    /// The items of `buffers` as they are (alignment 1, none empty), in order.
    pub(crate) fn all_of(buffers: &[BufferLifetime]) -> Vec<Item> {
        buffers.iter().map(|b| Item { lower: b.lower, upper: b.upper, size: b.size }).collect()
    }
}

/// Places `buffers` (see the module docs). Deterministic: the same input and options give the same
/// offsets on every platform.
pub fn solve(buffers: &[BufferLifetime], options: &SolveOptions) -> Result<Solution, SolveError> {
    solve_with(buffers, options, &mut |_| false)
}

/// The peaks of the classic greedy orders of the literature on `buffers` under `alignment`, each
/// order with best fit then first fit: size, lifetime, start (ascending) and area, in that order
/// (8 peaks; ties as `solve` breaks them): the baselines `solve` is never worse than once it has
/// run them (a solve stopped first may not have). They need no overlap graph. `None` where `solve`
/// fails on the input (an empty lifetime, footprints past `u64`).
pub fn classic_peaks(buffers: &[BufferLifetime], alignment: u64) -> Option<Vec<u64>> {
    let alignment = alignment.max(1);
    let (items, _) = items_of(buffers, alignment).ok()?;
    let members: Vec<u32> = (0..items.len() as u32).collect();
    let mut never = |_: &Progress| false;
    let mut control = Control::new(&mut never);
    let peaks = greedy::classic_peaks(&items, &members, &mut control)?;
    Some(peaks.into_iter().map(|p| p * alignment).collect())
}

/// [`solve`], stopped when `stop` says so: it is polled every 16 search nodes and every 2,048
/// buffers of greedy work, with the progress so far; once it returns `true` the solve ends with the
/// best placement found (`stats.stopped`) or, with a capacity not met, with
/// [`SolveError::NotFoundWithinBudget`]. Inside each component's first placement (the start-order
/// sweep) it is asked afresh even after a stop, with [`Progress::first_placement`] set; a stop
/// there stacks the component's buffers instead, so there is always a placement. The library
/// keeps no clock. Deterministic as long as `stop` never returns `true`.
pub fn solve_with(
    buffers: &[BufferLifetime],
    options: &SolveOptions,
    stop: &mut dyn FnMut(&Progress) -> bool,
) -> Result<Solution, SolveError> {
    solve_nested(buffers, options, stop, 0)
}

/// [`solve_with`] for a part of a larger instance, `depth` modules deep (`modules`).
fn solve_nested(
    buffers: &[BufferLifetime],
    options: &SolveOptions,
    stop: &mut dyn FnMut(&Progress) -> bool,
    depth: u32,
) -> Result<Solution, SolveError> {
    let mut control = Control::new(stop);
    let alignment = options.alignment.max(1);
    let (items, buffer_of) = items_of(buffers, alignment)?;
    let capacity_units = options.capacity.map(|c| c / alignment);
    let reduced = decompose::decompose(&items);
    let GreedyStage {
        mut leaves,
        whole,
        classic_done,
        lower_bound_units,
        greedy_peak_units,
        mut offsets_units,
        mut peak_units,
    } = greedy_stage(&items, &reduced, &mut control);
    control.progress.peak = greedy_peak_units * alignment;
    control.progress.lower_bound = lower_bound_units * alignment;
    if let Some(capacity) = options.capacity.filter(|_| capacity_units.is_some_and(|c| lower_bound_units > c)) {
        return Err(SolveError::ProvenInfeasible { capacity, lower_bound: lower_bound_units * alignment });
    }
    // Improve the leaves that set the peak, highest first, down to what the whole arena needs.
    let mut nodes_left = options.budget_nodes;
    let mut nodes = 0u64;
    let mut budget_exhausted = false;
    let mut unsearched_components = 0;
    let mut order: Vec<usize> = (0..leaves.len()).collect();
    order.sort_unstable_by_key(|&i| (core::cmp::Reverse(leaves[i].base + leaves[i].best.peak), i));
    let mut target = lower_bound_units;
    for (k, &i) in order.iter().enumerate() {
        // The arena's peak apart from this leaf, for the progress shown.
        let others = order.get(k + 1).map_or(target, |&j| target.max(leaves[j].base + leaves[j].best.peak));
        let shown = Shown { others, whole: whole.as_ref().map_or(u64::MAX, |w| w.peak), alignment };
        let leaf = &mut leaves[i];
        let members = &reduced.leaves[i].items;
        if leaf.base + leaf.best.peak > target {
            let goal = target - leaf.base;
            let capacity_goal = capacity_units.map(|c| c - leaf.base);
            let mut budget = Budget {
                nodes_left: &mut nodes_left,
                nodes: &mut nodes,
                control: &mut control,
                shown,
                depth,
                mix: options.mix,
                repair_per_buffer: options.mix.repair_per_buffer(classic_done),
            };
            match leaf.improve(&items, members, goal, capacity_goal, &mut budget) {
                Improvement::Settled => {}
                Improvement::BudgetExhausted => budget_exhausted |= !control.stopped(),
                Improvement::TooLarge => unsearched_components += 1,
            }
        }
        target = target.max(leaf.base + leaf.best.peak);
        if capacity_units.is_some_and(|c| leaf.base + leaf.proven_lower > c) {
            break; // proven infeasible under the capacity: the other leaves cannot change that
        }
    }

    let proven_lower_units = place_leaves(&leaves, &reduced, &mut offsets_units, &mut peak_units);
    let whole = if classic_done || peak_units == lower_bound_units {
        whole // at the lower bound already, no order can do better
    } else {
        let current = (offsets_units.as_slice(), peak_units);
        late_classic(&items, current, lower_bound_units, (&mut nodes_left, &mut nodes), &mut control)
    };
    if let Some(placement) = whole.filter(|placement| placement.peak < peak_units) {
        peak_units = placement.peak;
        offsets_units = placement.offsets;
    }
    let lower_bound = lower_bound_units * alignment;
    let peak = peak_units * alignment;
    if let Some(capacity) = options.capacity.filter(|&c| peak > c) {
        return Err(if proven_lower_units * alignment > capacity {
            SolveError::ProvenInfeasible { capacity, lower_bound: proven_lower_units * alignment }
        } else {
            SolveError::NotFoundWithinBudget { capacity, best_peak: peak, lower_bound, nodes }
        });
    }
    Ok(Solution {
        offsets: in_bytes(&offsets_units, &buffer_of, buffers.len(), alignment),
        peak,
        lower_bound,
        optimal: peak_units == proven_lower_units,
        stats: SolveStats {
            nodes,
            greedy_peak: greedy_peak_units * alignment,
            components: leaves.len() as u32,
            largest_component: reduced.leaves.iter().map(|l| l.items.len() as u32).max().unwrap_or(0),
            fixed_buffers: reduced.fixed.len() as u32,
            budget_exhausted,
            stopped: control.stopped(),
            unsearched_components,
        },
    })
}

/// The pair limit of a graph `solve_nested` builds: 0 where a test asks for the graph-free paths.
fn pair_limit(limit: usize) -> usize {
    #[cfg(test)]
    if tests::GRAPH_FREE.with(core::cell::Cell::get) {
        return 0;
    }
    limit
}

/// Writes each leaf's best placement into `offsets_units` (above its base) and raises `peak_units`
/// to it; returns the highest proven lower bound over the leaves and `peak_units` as given (the
/// peeled buffers').
fn place_leaves(
    leaves: &[LeafState],
    reduced: &decompose::Decomposition,
    offsets_units: &mut [u64],
    peak_units: &mut u64,
) -> u64 {
    let mut proven_lower_units = *peak_units;
    for (leaf, members) in leaves.iter().zip(&reduced.leaves) {
        for (local, &item) in members.items.iter().enumerate() {
            offsets_units[item as usize] = leaf.base + leaf.best.offsets[local];
        }
        *peak_units = (*peak_units).max(leaf.base + leaf.best.peak);
        proven_lower_units = proven_lower_units.max(leaf.base + leaf.proven_lower);
    }
    proven_lower_units
}

/// Each buffer's offset in bytes: its item's in `offsets_units`, 0 for a buffer of no bytes.
fn in_bytes(offsets_units: &[u64], buffer_of: &[usize], buffers: usize, alignment: u64) -> Vec<u64> {
    let mut offsets = vec![0u64; buffers];
    for (item, &buffer) in buffer_of.iter().enumerate() {
        offsets[buffer] = offsets_units[item] * alignment;
    }
    offsets
}

/// Non-empty buffers as items, sizes in alignment units, and `buffer_of[i]`, the buffer of item `i`.
fn items_of(buffers: &[BufferLifetime], alignment: u64) -> Result<(Vec<Item>, Vec<usize>), SolveError> {
    let mut items: Vec<Item> = Vec::new();
    let mut buffer_of: Vec<usize> = Vec::new();
    let mut total: u64 = 0;
    for (index, b) in buffers.iter().enumerate() {
        if b.upper <= b.lower {
            return Err(SolveError::EmptyLifetime { buffer: index });
        }
        let bytes = footprint(b.size, alignment).ok_or(SolveError::TooLarge)?;
        total = total.checked_add(bytes).ok_or(SolveError::TooLarge)?;
        if bytes > 0 {
            items.push(Item { lower: b.lower, upper: b.upper, size: bytes / alignment });
            buffer_of.push(index);
        }
    }
    Ok((items, buffer_of))
}

/// What the greedy stage leaves for the search: each leaf with its incumbent, the classic orders'
/// best on the whole instance where it beat the leaves', the lower bound and the greedy peak (units).
struct GreedyStage {
    leaves: Vec<LeafState>,
    whole: Option<ComponentPlacement>,
    /// Whether the classic orders ran on the whole instance (over its graph).
    classic_done: bool,
    lower_bound_units: u64,
    greedy_peak_units: u64,
    /// The peeled buffers' offsets (the others' are 0 until the leaves are placed), and their peak.
    offsets_units: Vec<u64>,
    peak_units: u64,
}

/// The greedy stage: per leaf its sections, graph (if not too dense), greedy incumbent and proven
/// lower bound; then the classic orders on the whole instance.
fn greedy_stage(items: &[Item], reduced: &decompose::Decomposition, control: &mut Control) -> GreedyStage {
    let mut offsets_units = vec![0u64; items.len()];
    let mut peak_units = 0u64;
    for &(item, offset) in &reduced.fixed {
        offsets_units[item as usize] = offset;
        peak_units = peak_units.max(offset + items[item as usize].size);
    }
    // Each leaf component: its sections, graph, greedy incumbent and proven lower bound.
    let leaves: Vec<LeafState> = reduced
        .leaves
        .iter()
        .map(|leaf| {
            let sections = Sections::new(items, &leaf.items);
            let proven_lower = sections.lower_bound();
            let first = greedy::first_placement(items, &leaf.items, control);
            if first.peak <= proven_lower {
                // At the lower bound: no other order can do better (only a strictly lower peak
                // replaces the first placement), so neither the overlap graph (quadratic in the
                // component's buffers, up to `OVERLAP_PAIR_LIMIT` pairs) nor the orders are made.
                return LeafState { base: leaf.base, sections, overlaps: None, best: first, proven_lower };
            }
            let overlaps =
                Overlaps::build_polled(items, &leaf.items, pair_limit(OVERLAP_PAIR_LIMIT), Some(&mut *control));
            let best = greedy::best_greedy(items, &leaf.items, first, overlaps.as_ref(), &sections, control);
            LeafState { base: leaf.base, sections, overlaps, best, proven_lower }
        })
        .collect();
    let lower_bound_units =
        leaves.iter().map(|l| l.base + l.proven_lower).chain(core::iter::once(peak_units)).max().unwrap_or(0);
    let mut greedy_peak_units = leaves.iter().map(|l| l.base + l.best.peak).fold(peak_units, u64::max);
    // The classic orders on the whole instance, ties in input order: the reductions keep the
    // optimum, not every greedy result, so a whole-instance order can beat the per-component
    // portfolio; with them, the answer is never worse than any classic order. Here over the
    // overlap graph, up to `WHOLE_GREEDY_PAIR_LIMIT` pairs; beyond, after the leaves are improved
    // (`late_classic`).
    // Only a strictly lower peak is taken, so at the lower bound they are not run (nor their
    // graph built, nor the late orders).
    let all: Vec<u32> = (0..items.len() as u32).collect();
    let (whole, classic_done) = if greedy_peak_units > lower_bound_units {
        let graph = Overlaps::build_polled(items, &all, pair_limit(WHOLE_GREEDY_PAIR_LIMIT), Some(&mut *control));
        let classic_done = graph.is_some();
        let whole = graph
            .and_then(|graph| greedy::best_classic(items, &all, Some(&graph), &mut { u64::MAX }, control))
            .filter(|placement| placement.peak < greedy_peak_units);
        (whole, classic_done)
    } else {
        (None, true)
    };
    if let Some(placement) = &whole {
        greedy_peak_units = placement.peak;
    }
    debug_log!(
        "solve: {} items, {} leaves, lower bound {} units, greedy {} units",
        items.len(),
        leaves.len(),
        lower_bound_units,
        greedy_peak_units
    );
    GreedyStage { leaves, whole, classic_done, lower_bound_units, greedy_peak_units, offsets_units, peak_units }
}

/// The classic orders on the whole instance when it has too many pairs for a graph: over a tree
/// of lifetimes, after the leaves' search (on a dense trace the orders take seconds; the leaves'
/// repair had a share first, `Budget::repair_per_buffer`), each charged a node per buffer and
/// stopped with the solve. Then `repair` goes on over the whole instance, towards `goal`, from the
/// best of them or from `current` (the leaves' placement) if none beats it, with the nodes left.
fn late_classic(
    items: &[Item],
    (offsets, peak): (&[u64], u64),
    goal: u64,
    (nodes_left, nodes): (&mut u64, &mut u64),
    control: &mut Control,
) -> Option<ComponentPlacement> {
    if control.stopped() {
        return None;
    }
    let all: Vec<u32> = (0..items.len() as u32).collect();
    let before = *nodes_left;
    let classic = greedy::best_classic(items, &all, None, nodes_left, control);
    *nodes += before - *nodes_left;
    let current = || ComponentPlacement { offsets: offsets.to_vec(), peak };
    let mut best = classic.filter(|c| c.peak < peak).unwrap_or_else(current);
    *nodes += repair::repair(items, &all, &mut best, goal, nodes_left, control);
    Some(best)
}

/// How improving one component ended.
enum Improvement {
    /// It reached its goal, or the search proved its best peak optimal.
    Settled,
    /// The node budget ran out.
    BudgetExhausted,
    /// It is too large for the exact search.
    TooLarge,
}

/// What the exact search of one leaf may spend, and what it shows the stop callback.
struct Budget<'a, 'c> {
    /// Nodes left over the whole solve.
    nodes_left: &'a mut u64,
    /// Nodes spent over the whole solve.
    nodes: &'a mut u64,
    control: &'a mut Control<'c>,
    shown: Shown,
    /// How many modules deep this solve is (`modules`): 0 for the caller's instance.
    depth: u32,
    /// The solve's search mix.
    mix: SearchMix,
    /// The most nodes per buffer `repair` may spend on a graph-free leaf: all when it is the last
    /// word, a share when the classic orders over the tree and more repair follow.
    repair_per_buffer: u64,
}

impl Budget<'_, '_> {
    /// Places a zero-slack component by its window modules within `allowance`; charges the nodes.
    fn place_by_modules(
        &mut self,
        modules: &mut modules::Modules,
        (items, members, sections): (&[Item], &[u32], &Sections),
        capacity: u64,
        allowance: u64,
    ) -> Option<ComponentPlacement> {
        let mut allowance = allowance.min(*self.nodes_left);
        let (placement, used) = modules.place(items, members, sections, capacity, &mut allowance, self.control);
        *self.nodes_left -= used;
        *self.nodes += used;
        placement
    }

    /// Runs a component's bounds searches (one per order of `tiebreaks`, made at the first call;
    /// none with a crowded section) on from where they stopped, each with at most `allowance`
    /// nodes; the first settled outcome, else `BudgetExhausted`. Charges the nodes spent.
    fn run_bounds(
        &mut self,
        searches: &mut Option<Vec<bounds::Bounds>>,
        tiebreaks: &[bounds::Tiebreak],
        component: (&[Item], &[u32], &Sections),
        domains: Option<&domains::Domains>,
        capacity: u64,
        allowance: u64,
    ) -> SearchOutcome {
        if tiebreaks.is_empty() {
            return SearchOutcome::BudgetExhausted; // none in this mix
        }
        let searches = searches.get_or_insert_with(|| bounds::Bounds::new(component, capacity, tiebreaks));
        for search in searches {
            let mut run_budget = allowance.min(*self.nodes_left);
            let (outcome, used) = search.run(domains, &mut run_budget, self.control);
            *self.nodes_left -= used;
            *self.nodes += used;
            if !matches!(outcome, SearchOutcome::BudgetExhausted) {
                return outcome;
            }
        }
        SearchOutcome::BudgetExhausted
    }

    /// Tightens a zero-slack search's domains within `allowance`, a tiling state counted as a node.
    fn tighten(&mut self, shared: &mut search::Shared, (items, members): (&[Item], &[u32]), allowance: u64) {
        let allowance = allowance.min(*self.nodes_left);
        let control = &mut *self.control;
        let spent = shared.tighten(items, members, allowance, &mut |spent| control.tick(spent));
        *self.nodes_left -= spent;
        *self.nodes += spent;
    }
}

/// How a leaf's new peak becomes the arena's, for the progress shown.
#[derive(Clone, Copy)]
struct Shown {
    /// The highest peak of the other leaves and the reductions (units).
    others: u64,
    /// The peak of the whole-instance greedy placement, if it beat the leaves' (units).
    whole: u64,
    alignment: u64,
}

/// One component being improved.
struct LeafState {
    base: u64,
    sections: Sections,
    overlaps: Option<Overlaps>,
    best: ComponentPlacement,
    /// No placement of this component has a lower peak (units, relative to `base`).
    proven_lower: u64,
}

impl LeafState {
    /// Lowers the best peak with `repair` (the improvement search), spending at most `most` of
    /// the nodes left, and shows a lower peak to the stop callback.
    fn repair(&mut self, items: &[Item], members: &[u32], goal: u64, most: u64, budget: &mut Budget) {
        let mut share = (*budget.nodes_left).min(most);
        let given = share;
        let peak = self.best.peak;
        repair::repair(items, members, &mut self.best, goal, &mut share, budget.control);
        *budget.nodes_left -= given - share;
        *budget.nodes += given - share;
        if self.best.peak < peak {
            let shown = budget.shown;
            budget.control.progress.peak =
                shown.others.max(self.base + self.best.peak).min(shown.whole) * shown.alignment;
        }
    }

    /// One capacity, searched under each tie-break order in turn with a node limit that doubles
    /// every round, until a run settles it or the budget is spent; each run is complete.
    fn search_with_restarts(
        &self,
        items: &[Item],
        members: &[u32],
        overlaps: &Overlaps,
        ranks: &[Vec<u32>],
        capacity: u64,
        budget: &mut Budget,
    ) -> SearchOutcome {
        let zero_slack = self.sections.totals.iter().all(|&t| t == capacity);
        if zero_slack {
            // Zero slack: flat splits first; they only ever find placements.
            let (placement, used) =
                split::place(items, members, members.len(), capacity, budget.nodes_left, budget.control);
            *budget.nodes += used;
            if let Some(placement) = placement {
                return SearchOutcome::Found(placement);
            }
        }
        // Each shape of fillers once, `Runs` first (BENCHMARKS.md, "Twenty-first pass").
        let nesting = (budget.depth, budget.mix);
        let runs = Filled::new(items, members, &self.sections, capacity, fillers::Shape::Runs, nesting);
        let nested = Filled::new(items, members, &self.sections, capacity, fillers::Shape::Nested, nesting)
            .filter(|nested| runs.as_ref().is_none_or(|runs| runs.items != nested.items));
        let mut filled: Vec<Filled> = runs.into_iter().chain(nested).collect();
        let mut shared = search::Shared::new(items, members, &self.sections, capacity);
        let mut limit = SEARCH_FIRST_LIMIT_PER_BUFFER * members.len() as u64;
        // Modules at zero slack only (with slack their canonical parts placed nothing more;
        // BENCHMARKS.md, "Fourteenth pass"), kept across the rounds.
        let mut modules = modules::Modules::new(zero_slack, budget.depth, budget.mix);
        // The bounds searches, made at their first turn and resumed each round after.
        let mut bounds: Option<Vec<bounds::Bounds>> = None;
        let (tiebreaks, bounds_share) = budget.mix.bounds_searches(zero_slack);
        let first_limit = limit;
        loop {
            if limit > first_limit {
                // Past its first round a search tightens its domains (`TIGHTEN_PER_RESTART_NODE`).
                let allowance = limit.saturating_mul(ranks.len() as u64).saturating_mul(TIGHTEN_PER_RESTART_NODE);
                budget.tighten(&mut shared, (items, members), allowance);
            }
            let mut restarts = ranks.iter().enumerate();
            let allowance = limit.saturating_mul(ranks.len() as u64);
            let component = (items, members, &self.sections);
            for &step in budget.mix.round(zero_slack) {
                let settled = match step {
                    Step::Restarts(count) => restarts.by_ref().take(count).find_map(|(index, rank)| {
                        if *budget.nodes_left == 0 || budget.control.stopped() {
                            return Some(SearchOutcome::BudgetExhausted);
                        }
                        let component = search::Component { items, members, overlaps, sections: &self.sections };
                        let style = search::Style::of_restart(index);
                        let mut run_budget = limit.min(*budget.nodes_left);
                        let (outcome, used) = search::search(
                            component,
                            rank,
                            style,
                            &mut shared,
                            capacity,
                            &mut run_budget,
                            budget.control,
                        );
                        *budget.nodes_left -= used;
                        *budget.nodes += used;
                        (!matches!(outcome, SearchOutcome::BudgetExhausted)).then_some(outcome)
                    }),
                    Step::Bounds => {
                        let allowance = allowance.saturating_mul(bounds_share);
                        let domains = shared.domains();
                        match budget.run_bounds(&mut bounds, tiebreaks, component, domains, capacity, allowance) {
                            SearchOutcome::BudgetExhausted => None,
                            settled => Some(settled),
                        }
                    }
                    Step::FilledAndModules => filled
                        .iter_mut()
                        .find_map(|filled| filled.search(capacity, limit, budget))
                        .or_else(|| budget.place_by_modules(&mut modules, component, capacity, allowance))
                        .map(SearchOutcome::Found),
                };
                if let Some(settled) = settled {
                    return settled;
                }
            }
            limit = limit.saturating_mul(2);
        }
    }

    /// Lowers the component's peak towards `goal` with the exact search. A capacity asked for and
    /// not met yet is searched first, with all the budget it takes, and so is a zero-slack goal.
    /// Then rounds, each with a node
    /// allowance per search four times the last: the goal, then capacities between the proven
    /// lower bound and the best peak by bisection, moving up towards the best peak after each one
    /// the allowance did not settle (at most `DESCENT_UNSETTLED_PROBES` a round). So the best peak
    /// falls steadily from the greedy one however hard the goal is, and a stopped solve keeps it.
    fn improve(
        &mut self,
        items: &[Item],
        members: &[u32],
        goal: u64,
        capacity: Option<u64>,
        budget: &mut Budget,
    ) -> Improvement {
        if budget.control.stopped() {
            return Improvement::BudgetExhausted; // a stopped solve improves nothing more
        }
        let searchable = self.overlaps.is_some() && members.len() <= EXACT_SEARCH_MAX_BUFFERS;
        if searchable && members.len() > REPAIR_FIRST_BUFFERS {
            // A large leaf: the repair's first starts and rounds often reach the goal in
            // milliseconds where the exact search takes seconds, and sometimes where it does not.
            self.repair(items, members, goal, REPAIR_FIRST_NODES_PER_BUFFER * members.len() as u64, budget);
            if self.best.peak <= goal {
                return Improvement::Settled;
            }
        }
        let Some(overlaps) = self.overlaps.as_ref().filter(|_| members.len() <= EXACT_SEARCH_MAX_BUFFERS) else {
            // Too large for the exact search: `repair` lowers the greedy peak instead (graph-free,
            // only a share when the classic orders, which its greedy portfolio lacked, follow).
            let per_buffer = if self.overlaps.is_some() { u64::MAX } else { budget.repair_per_buffer };
            self.repair(items, members, goal, per_buffer.saturating_mul(members.len() as u64), budget);
            return Improvement::TooLarge;
        };
        let ranks = search_ranks(items, members, &self.sections);
        // A goal at which every section is exactly full (a perfect packing's) is searched first with
        // all the budget, like a capacity: flat splits settle those whole, and cut into rounds
        // they would start over each time.
        let zero_slack_goal = Some(goal).filter(|&g| self.sections.totals.iter().all(|&t| t == g));
        // A capacity asked for and proven too small is the answer: lowering the peak above it
        // only spends the budget (a module's part proven infeasible would spend its whole
        // allowance so).
        let refuted = |proven_lower: u64| capacity.is_some_and(|c| proven_lower > c);
        for probe in [capacity, zero_slack_goal] {
            if refuted(self.proven_lower) {
                return Improvement::Settled;
            }
            if let Some(capacity) = probe.map(|c| c.max(self.proven_lower)).filter(|&c| c < self.best.peak) {
                match self.search_with_restarts(items, members, overlaps, &ranks, capacity, budget) {
                    SearchOutcome::BudgetExhausted => return Improvement::BudgetExhausted,
                    outcome => record(&mut self.best, &mut self.proven_lower, self.base, outcome, capacity, budget),
                }
            }
        }
        if refuted(self.proven_lower) {
            return Improvement::Settled;
        }
        let mut allowance = DESCENT_FIRST_NODES_PER_BUFFER.saturating_mul(members.len() as u64);
        loop {
            if self.proven_lower >= self.best.peak || self.best.peak <= goal {
                return Improvement::Settled;
            }
            let mut unsettled = 0;
            // The lowest capacity not yet refuted nor left unsettled in this round.
            let mut floor = self.proven_lower;
            let mut next = goal.max(self.proven_lower);
            while unsettled < DESCENT_UNSETTLED_PROBES && next < self.best.peak {
                let mut allowed = (*budget.nodes_left).min(allowance);
                let before = allowed;
                let outcome = {
                    let mut bounded = Budget {
                        nodes_left: &mut allowed,
                        nodes: &mut *budget.nodes,
                        control: &mut *budget.control,
                        shown: budget.shown,
                        depth: budget.depth,
                        mix: budget.mix,
                        repair_per_buffer: budget.repair_per_buffer,
                    };
                    self.search_with_restarts(items, members, overlaps, &ranks, next, &mut bounded)
                };
                *budget.nodes_left -= before - allowed;
                match outcome {
                    SearchOutcome::BudgetExhausted => {
                        if *budget.nodes_left == 0 || budget.control.stopped() {
                            return Improvement::BudgetExhausted;
                        }
                        unsettled += 1;
                        floor = floor.max(next + 1);
                    }
                    SearchOutcome::Infeasible => {
                        record(&mut self.best, &mut self.proven_lower, self.base, outcome, next, budget);
                        floor = floor.max(self.proven_lower);
                    }
                    found => record(&mut self.best, &mut self.proven_lower, self.base, found, next, budget),
                }
                if self.best.peak <= goal || floor >= self.best.peak {
                    break;
                }
                next = floor + (self.best.peak - 1 - floor) / 2;
            }
            allowance = allowance.saturating_mul(4);
        }
    }
}

/// A component with slack at a capacity, made zero slack by *fillers* (`fillers`): a placement of
/// the filled component, fillers dropped, places the component. Not complete: it only ever finds
/// placements; the canonical search keeps every proof.
struct Filled {
    items: Vec<Item>,
    members: Vec<u32>,
    /// How many of `items` are the component's own (the rest are fillers).
    own: usize,
    sections: Sections,
    overlaps: Overlaps,
    ranks: Vec<Vec<u32>>,
    shared: search::Shared,
    /// The filled instance's window modules (it has zero slack), kept across its searches.
    modules: modules::Modules,
    /// Whether its flat splits still run with each search's allowance (not after a near-perfect
    /// instance's ran with all the budget).
    splits_pending: bool,
    /// Few fillers: the component is a perfect packing with a few pieces missing.
    near_perfect: bool,
    /// Whether `search` ran before (its later runs tighten the domains).
    searched: bool,
    /// The filled instance's bounds searches, made at their first turn and resumed after.
    bounds: Option<Vec<bounds::Bounds>>,
}

impl Filled {
    /// The filled instance of a component `depth` modules deep; `None` when it needs no fillers or
    /// more than one per `FILLERS_PER_BUFFER` of its buffers.
    fn new(
        items: &[Item],
        members: &[u32],
        sections: &Sections,
        capacity: u64,
        shape: fillers::Shape,
        (depth, mix): (u32, SearchMix),
    ) -> Option<Filled> {
        let mut filled: Vec<Item> = members.iter().map(|&m| items[m as usize]).collect();
        let own = filled.len();
        let slack: Vec<u64> = sections.totals.iter().map(|&total| capacity.saturating_sub(total)).collect();
        let fillers = fillers::shaped(&slack, shape, own / FILLERS_PER_BUFFER + 1)?;
        filled.extend(fillers.iter().map(|f| {
            let (lower, upper) = sections.steps(f.first, f.end - f.first);
            Item { lower, upper, size: f.height }
        }));
        if filled.len() == own {
            return None; // zero slack already: searched as it is
        }
        let all: Vec<u32> = (0..filled.len() as u32).collect();
        let sections = Sections::new(&filled, &all);
        let overlaps = Overlaps::build(&filled, &all, OVERLAP_PAIR_LIMIT)?;
        let ranks = search_ranks(&filled, &all, &sections);
        let shared = search::Shared::new(&filled, &all, &sections, capacity);
        let modules = modules::Modules::new(true, depth, mix);
        let near_perfect = (filled.len() - own) * NEAR_PERFECT_BUFFERS_PER_FILLER <= own;
        Some(Filled {
            items: filled,
            members: all,
            own,
            sections,
            overlaps,
            ranks,
            shared,
            modules,
            splits_pending: true,
            near_perfect,
            searched: false,
            bounds: None,
        })
    }

    /// Flat splits, window modules, then the skyline search under each tie-break order, each with
    /// `limit` nodes; the placement of the component's own buffers if one is found.
    fn search(&mut self, capacity: u64, limit: u64, budget: &mut Budget) -> Option<ComponentPlacement> {
        let own = |placement: ComponentPlacement| {
            let offsets: Vec<u64> = placement.offsets[..self.own].to_vec();
            let peak = offsets.iter().zip(&self.items).map(|(o, item)| o + item.size).max().unwrap_or(0);
            ComponentPlacement { offsets, peak }
        };
        if self.splits_pending {
            // A near-perfect instance's splits once with all the budget, the others' each round.
            let allowance = if self.near_perfect { u64::MAX } else { limit.saturating_mul(self.ranks.len() as u64) };
            let mut split_budget = allowance.min(*budget.nodes_left);
            self.splits_pending = !self.near_perfect;
            let (placement, used) =
                split::place(&self.items, &self.members, self.own, capacity, &mut split_budget, budget.control);
            *budget.nodes_left -= used;
            *budget.nodes += used;
            if let Some(placement) = placement {
                return Some(own(placement));
            }
        }
        if self.searched {
            // As the component's own search does after its first round (`search_with_restarts`).
            let allowance = limit.saturating_mul(self.ranks.len() as u64).saturating_mul(TIGHTEN_PER_RESTART_NODE);
            budget.tighten(&mut self.shared, (&self.items, &self.members), allowance);
        }
        self.searched = true;
        // The filled instance has zero slack: its window modules, with as many nodes as the splits.
        let allowance = limit.saturating_mul(self.ranks.len() as u64);
        let filled = (&self.items[..], &self.members[..], &self.sections);
        if let Some(placement) = budget.place_by_modules(&mut self.modules, filled, capacity, allowance) {
            return Some(own(placement));
        }
        // Then its bounds searches (their "infeasible" holds for these fillers only).
        let allowance = allowance.saturating_mul(budget.mix.filled_bounds_share());
        let domains = self.shared.domains();
        let (tiebreaks, _) = budget.mix.bounds_searches(true);
        if let SearchOutcome::Found(placement) =
            budget.run_bounds(&mut self.bounds, tiebreaks, filled, domains, capacity, allowance)
        {
            return Some(own(placement));
        }
        for (index, rank) in self.ranks.iter().enumerate() {
            if *budget.nodes_left == 0 || budget.control.stopped() {
                return None;
            }
            let mut run_budget = limit.min(*budget.nodes_left);
            let component = search::Component {
                items: &self.items,
                members: &self.members,
                overlaps: &self.overlaps,
                sections: &self.sections,
            };
            let (outcome, used) = search::search(
                component,
                rank,
                search::Style::of_restart(index),
                &mut self.shared,
                capacity,
                &mut run_budget,
                budget.control,
            );
            *budget.nodes_left -= used;
            *budget.nodes += used;
            if let SearchOutcome::Found(placement) = outcome {
                return Some(own(placement));
            }
        }
        None
    }
}

/// Keeps what a search of a leaf at `capacity` settled (a better placement, a higher bound) and
/// shows it to the stop callback.
fn record(
    best: &mut ComponentPlacement,
    proven_lower: &mut u64,
    base: u64,
    outcome: SearchOutcome,
    capacity: u64,
    budget: &mut Budget,
) {
    match outcome {
        SearchOutcome::Found(placement) => {
            *best = placement;
            let shown = budget.shown;
            let peak = shown.others.max(base + best.peak).min(shown.whole);
            budget.control.progress.peak = peak * shown.alignment;
        }
        SearchOutcome::Infeasible => {
            *proven_lower = (*proven_lower).max(capacity + 1);
            let bound = (base + *proven_lower) * budget.shown.alignment;
            budget.control.progress.lower_bound = budget.control.progress.lower_bound.max(bound);
        }
        SearchOutcome::BudgetExhausted => {}
    }
}

/// The tie-break orders the restarts cycle through: the contention order (MiniMalloc's best
/// preorder: most contended sections, then longer, then larger) twice (the second at
/// `search::CONTENTION_RESTART`); largest first; longest first; then fixed-seed shuffles.
pub(crate) fn search_ranks(items: &[Item], members: &[u32], sections: &Sections) -> Vec<Vec<u32>> {
    let n = members.len();
    let item = |l: u32| &items[members[l as usize] as usize];
    let by_key = |key: &dyn Fn(u32) -> (u64, u64, u64)| {
        let mut order: Vec<u32> = (0..n as u32).collect();
        order.sort_unstable_by(|&a, &b| key(b).cmp(&key(a)).then(a.cmp(&b)));
        order
    };
    let mut orders = vec![
        by_key(&|l| (sections.max_total_over(item(l)), u64::from(item(l).upper - item(l).lower), item(l).size)),
        by_key(&|l| (item(l).size, u64::from(item(l).upper - item(l).lower), 0)),
        by_key(&|l| (u64::from(item(l).upper - item(l).lower), item(l).size, 0)),
    ];
    orders.insert(search::CONTENTION_RESTART, orders[0].clone());
    let mut rng = crate::rng::SplitMix64::new(0x5EED);
    for _ in 0..SEARCH_RESTART_SHUFFLES {
        let mut order: Vec<u32> = (0..n as u32).collect();
        rng.shuffle(&mut order);
        orders.push(order);
    }
    orders
        .iter()
        .map(|order| {
            let mut rank = vec![0u32; n];
            for (position, &l) in order.iter().enumerate() {
                rank[l as usize] = position as u32;
            }
            rank
        })
        .collect()
}

#[cfg(test)]
mod tests;
