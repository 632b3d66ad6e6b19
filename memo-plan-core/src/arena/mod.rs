//! Arena placement: give every buffer an offset so that buffers alive at the same step never share
//! a byte, with the lowest possible peak (or under a given capacity). `spec/placement.md` is the
//! contract; `ARCHITECTURE.md` explains the pipeline:
//!
//! 1. units: with alignment `a`, sizes become `ceil(size / a)` units and offsets multiples of `a`;
//! 2. reductions that keep optimality ([`decompose`]): temporal components and peeling;
//! 3. per component, the greedy portfolio ([`greedy`]) gives an incumbent;
//! 4. components above the lower bound go to the exact search ([`search`]), which proves a capacity
//!    infeasible or finds a placement under it, within a deterministic node budget; at a capacity
//!    where every time section is exactly full (zero slack), flat splits ([`split`]) are tried
//!    first: they cut the component into independent horizontal slabs and place it part by part;
//!    between the restarts (and in the zero-slack instances a capacity with slack is filled up
//!    to), window modules ([`modules`]) place it as smaller instances nested one inside another.
//!
//! The reported peak is proven optimal when it equals the lower bound (the most bytes ever alive
//! at once), or when the search proved every lower capacity infeasible for the component that
//! sets it.

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
mod twins;

use alloc::vec;
use alloc::vec::Vec;
use core::fmt;

use crate::lifetime::{footprint, BufferLifetime};
use crate::log::debug_log;
use control::Control;
pub use control::Progress;
use greedy::{ComponentPlacement, Overlaps};
#[cfg(feature = "std")]
pub use portfolio::solve_portfolio;
use search::SearchOutcome;
use sections::Sections;

/// The default node budget of the exact search, shared by all components of one solve: a few
/// seconds at most. Not every hard instance is settled within it (BENCHMARKS.md has the rates).
pub const DEFAULT_BUDGET_NODES: u64 = 2_000_000;

/// Components with more buffers than this are placed by the greedy portfolio and the improvement
/// search for large components (`repair`): each search node costs time linear in the component,
/// so larger ones would spend the budget slowly.
pub const EXACT_SEARCH_MAX_BUFFERS: usize = 600;

/// Components whose overlap graph would have more pairs than this use only the start-order greedy,
/// which needs no graph (bounds memory to about 8 bytes a pair).
pub const OVERLAP_PAIR_LIMIT: usize = 40_000_000;

/// The most overlapping pairs for which the classic greedy orders also run on the whole instance,
/// before the reductions (about 64 MB of graph; each order then costs well under a second).
/// Beyond it only the per-component portfolio runs.
pub const WHOLE_GREEDY_PAIR_LIMIT: usize = 8_000_000;

/// Shuffled tie-break orders the search restarts with, besides the three heuristic ones.
pub const SEARCH_RESTART_SHUFFLES: usize = 29;

/// The node limit of the first round of restarts, per buffer of the component; it doubles every
/// round. Searches on these instances either finish in about one node per buffer or wander for
/// very long (a heavy tail), so short runs under several orders beat one long run.
pub const SEARCH_FIRST_LIMIT_PER_BUFFER: u64 = 4;

/// The node allowance of each search in the first round of a component's descent, per buffer
/// (fourfold a round): small, so the first rounds lower the greedy peak within milliseconds.
pub const DESCENT_FIRST_NODES_PER_BUFFER: u64 = 64;

/// Searches a descent round may leave unsettled before the next round (with four times the
/// allowance) starts again from the goal.
pub const DESCENT_UNSETTLED_PROBES: u32 = 3;

/// What to solve for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SolveOptions {
    /// Find a placement whose peak is at most this many bytes (the peak is still minimised as far
    /// as the budget allows). `None`: only minimise.
    pub capacity: Option<u64>,
    /// Every offset is a multiple of this (0 or 1: no alignment); every buffer occupies its size
    /// rounded up to it.
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
/// search mixes"). `Balanced` is the best alone; `Restarts` and `Bounds` split its work between
/// them, each placing some instances in a fraction of the time the other takes, so a solve with
/// cores to spare runs them side by side (`solve_portfolio`, with the `std` feature;
/// `SearchMix::portfolio`). Each alone is deterministic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SearchMix {
    /// The best alone. In each round a component's filled instances and window modules come
    /// first, then its bounds searches (with slack two, ties to the largest and to the narrowest
    /// interval; at zero slack one, ties to the larger area), each with `BOUNDS_SHARE` times the
    /// round's restart nodes.
    #[default]
    Balanced,
    /// `Balanced` without the bounds searches of components with slack, beside `Bounds` (which
    /// runs those first): the restarts and the filled instances come sooner, and a filled
    /// instance's bounds search gets `RESTARTS_FILLED_BOUNDS_SHARE`.
    Restarts,
    /// The bounds searches lead, beside `Restarts`: with slack three (ties to the narrowest
    /// interval, the wider, the largest), before the filled instances and modules in each round,
    /// each with `BOUNDS_MIX_SHARE` times the round's restart nodes; at zero slack one (ties to
    /// the largest) with `BOUNDS_MIX_ZERO_SLACK_SHARE`, so the restarts there come sooner.
    Bounds,
}

impl SearchMix {
    /// The mixes to run side by side on `threads` threads: one thread, `Balanced`; two,
    /// `Restarts` and `Bounds`; more, all three.
    pub fn portfolio(threads: usize) -> &'static [SearchMix] {
        match threads {
            0 | 1 => &[SearchMix::Balanced],
            2 => &[SearchMix::Restarts, SearchMix::Bounds],
            _ => &[SearchMix::Restarts, SearchMix::Bounds, SearchMix::Balanced],
        }
    }

    /// Whether a component's bounds searches run before its filled instances and window modules
    /// in a round, not after them.
    fn bounds_lead(self, zero_slack: bool) -> bool {
        self == SearchMix::Bounds && !zero_slack
    }

    /// A filled instance's bounds-search share (times its modules' nodes): `Restarts` gives its
    /// filled instances the time `Balanced` gives the leaf's bounds searches.
    fn filled_bounds_share(self) -> u64 {
        match self {
            SearchMix::Restarts => RESTARTS_FILLED_BOUNDS_SHARE,
            SearchMix::Balanced | SearchMix::Bounds => FILLED_BOUNDS_SHARE,
        }
    }

    /// The orders of a component's bounds searches (one search each; none, none run), and each
    /// one's share of a round (times the round's restart nodes). A filled instance takes the
    /// zero-slack orders.
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
    /// Whether the stop callback of [`solve_with`] ended the solve early (the placement is the best
    /// found by then).
    pub stopped: bool,
    /// Components above the lower bound that were too large for the exact search
    /// (`EXACT_SEARCH_MAX_BUFFERS`, `OVERLAP_PAIR_LIMIT`): the improvement search for large
    /// components (`repair`) lowers their greedy placement instead, without proofs.
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
    /// No placement under the capacity was found before the node budget ran out or the stop
    /// callback of [`solve_with`] stopped the solve; one may exist.
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
    /// The items of `buffers` as they are (alignment 1, none empty), in order: tests build their
    /// components straight from generated buffers.
    pub(crate) fn all_of(buffers: &[BufferLifetime]) -> Vec<Item> {
        buffers.iter().map(|b| Item { lower: b.lower, upper: b.upper, size: b.size }).collect()
    }
}

/// Places `buffers` (see the module docs). Deterministic: the same input and options give the same
/// offsets on every platform.
pub fn solve(buffers: &[BufferLifetime], options: &SolveOptions) -> Result<Solution, SolveError> {
    solve_with(buffers, options, &mut |_| false)
}

/// [`solve`], stopped early when `stop` says so: it is polled every 16 search nodes, between greedy
/// orders, and every 2,048 buffers inside greedy orders, sweeps, overlap-graph builds and the
/// repair's starts and rounds (a few milliseconds apart on 100k buffers), with the progress so
/// far, and once it returns `true` the solve ends with the best placement found by then
/// (`stats.stopped`), or, with a capacity not met yet, with [`SolveError::NotFoundWithinBudget`].
/// The first placement of each component (the start-order sweep, O(n log n)) comes before any
/// other. Inside it the callback is asked afresh even after a stop, with
/// [`Progress::first_placement`] set (so a caller may let it finish past a soft limit); a stop
/// there (only a component of 2,048 buffers or more polls there) stacks that component's buffers
/// one above the other instead, so there is a placement however early the
/// stop comes, at once, if a poor one then. A caller puts a time limit or an interrupt here; the
/// library keeps no clock. Deterministic as long as `stop` never returns `true`.
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
    // Non-empty buffers become items; `item_of[i]` maps an item back to its buffer.
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
    let capacity_units = options.capacity.map(|c| c / alignment);

    let reduced = decompose::decompose(&items);
    let mut offsets_units = vec![0u64; items.len()];
    let mut peak_units = 0u64;
    for &(item, offset) in &reduced.fixed {
        offsets_units[item as usize] = offset;
        peak_units = peak_units.max(offset + items[item as usize].size);
    }

    // Each leaf component: its sections, graph, greedy incumbent and proven lower bound.
    let mut leaves: Vec<LeafState> = reduced
        .leaves
        .iter()
        .map(|leaf| {
            let sections = Sections::new(&items, &leaf.items);
            let proven_lower = sections.lower_bound();
            let first = greedy::first_placement(&items, &leaf.items, &mut control);
            if first.peak <= proven_lower {
                // At the lower bound: no other order can do better (only a strictly lower peak
                // replaces the first placement), so neither the overlap graph (quadratic in the
                // component's buffers, up to `OVERLAP_PAIR_LIMIT` pairs) nor the orders are made.
                return LeafState { base: leaf.base, sections, overlaps: None, best: first, proven_lower };
            }
            let overlaps = Overlaps::build_polled(&items, &leaf.items, OVERLAP_PAIR_LIMIT, Some(&mut control));
            let best = greedy::best_greedy(&items, &leaf.items, first, overlaps.as_ref(), &sections, &mut control);
            LeafState { base: leaf.base, sections, overlaps, best, proven_lower }
        })
        .collect();
    let lower_bound_units =
        leaves.iter().map(|l| l.base + l.proven_lower).chain(core::iter::once(peak_units)).max().unwrap_or(0);
    let mut greedy_peak_units = leaves.iter().map(|l| l.base + l.best.peak).fold(peak_units, u64::max);
    // The classic orders on the whole instance, ties in input order: the reductions keep the
    // optimum, not every greedy result, so a whole-instance order can beat the per-component
    // portfolio; with them, the answer is never worse than any classic order. Only a strictly
    // lower peak is taken, so at the lower bound they are not run (nor their graph built).
    let all: Vec<u32> = (0..items.len() as u32).collect();
    let whole = if greedy_peak_units > lower_bound_units {
        Overlaps::build_polled(&items, &all, WHOLE_GREEDY_PAIR_LIMIT, Some(&mut control))
            .and_then(|graph| greedy::best_classic(&items, &all, &graph, &mut control))
            .filter(|placement| placement.peak < greedy_peak_units)
    } else {
        None
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

    control.progress.peak = greedy_peak_units * alignment;
    control.progress.lower_bound = lower_bound_units * alignment;

    if let Some(capacity) = capacity_units {
        if lower_bound_units > capacity {
            return Err(SolveError::ProvenInfeasible {
                capacity: options.capacity.unwrap_or(0),
                lower_bound: lower_bound_units * alignment,
            });
        }
    }

    // Improve the leaves that set the peak, highest first. `target` is the peak the whole arena
    // needs anyway; a leaf need not go below it.
    let mut nodes_left = options.budget_nodes;
    let mut nodes = 0u64;
    let mut budget_exhausted = false;
    let mut unsearched_components = 0;
    let mut order: Vec<usize> = (0..leaves.len()).collect();
    order.sort_unstable_by_key(|&i| (core::cmp::Reverse(leaves[i].base + leaves[i].best.peak), i));
    let mut target = lower_bound_units;
    for (k, &i) in order.iter().enumerate() {
        // The arena's peak apart from this leaf: the leaves done so far (in `target`) and the
        // highest of those still to come (the next in `order`), for the progress shown.
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

    let mut proven_lower_units = peak_units;
    for (leaf, members) in leaves.iter().zip(&reduced.leaves) {
        for (local, &item) in members.items.iter().enumerate() {
            offsets_units[item as usize] = leaf.base + leaf.best.offsets[local];
        }
        peak_units = peak_units.max(leaf.base + leaf.best.peak);
        proven_lower_units = proven_lower_units.max(leaf.base + leaf.proven_lower);
    }

    if let Some(placement) = whole.filter(|placement| placement.peak < peak_units) {
        peak_units = placement.peak;
        offsets_units = placement.offsets;
    }
    let lower_bound = lower_bound_units * alignment;
    let peak = peak_units * alignment;
    if let Some(capacity) = options.capacity {
        if peak > capacity {
            return Err(if proven_lower_units * alignment > capacity {
                SolveError::ProvenInfeasible { capacity, lower_bound: proven_lower_units * alignment }
            } else {
                SolveError::NotFoundWithinBudget { capacity, best_peak: peak, lower_bound, nodes }
            });
        }
    }
    let mut offsets = vec![0u64; buffers.len()];
    for (item, &buffer) in buffer_of.iter().enumerate() {
        offsets[buffer] = offsets_units[item] * alignment;
    }
    Ok(Solution {
        offsets,
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
}

impl Budget<'_, '_> {
    /// Places a zero-slack component (`items`, `members`, its sections) under `capacity` through
    /// `modules`, its window modules, with at most `allowance` of the nodes left; charges the
    /// nodes spent.
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

    /// Runs a component's bounds searches (`searches`: one per order of `tiebreaks`, made at the
    /// first call; none when the component has a crowded section) on from where they stopped,
    /// each with at most `allowance` of the nodes left, narrowing to `domains`; the first settled
    /// outcome, else `BudgetExhausted`. Charges the nodes spent.
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

    /// Tightens a zero-slack search's domains (`search::Shared::tighten`) with at most
    /// `allowance` of the nodes left, one state of a tiling counted as a node; the stop callback
    /// is polled after each section tiled.
    fn tighten(&mut self, shared: &mut search::Shared, (items, members): (&[Item], &[u32]), allowance: u64) {
        let allowance = allowance.min(*self.nodes_left);
        let control = &mut *self.control;
        let spent = shared.tighten(items, members, allowance, &mut |spent| control.tick(spent));
        *self.nodes_left -= spent;
        *self.nodes += spent;
    }
}

/// A zero-slack search past its first round (a leaf's, or a filled instance's from its second
/// search) tightens its domains (`domains::Domains::tighten`) by up to this many tiling states per
/// node its restarts may take in the round. A state costs a fraction of a node, and a value dropped
/// from a domain is dropped from every later restart; the tilings stop by themselves when every
/// section is settled or given up. Pinwheel 500 seeds 2 and 4 took 1.3-1.9 s with 1 per node,
/// 0.7-1.0 s and 0.4-0.5 s with 16, the same with 64; holes 500 seed 2, through its filled
/// instances, 1.9 s with 16 and 0.85 s with 64 (BENCHMARKS.md).
pub const TIGHTEN_PER_RESTART_NODE: u64 = 64;

/// The bounds search (`bounds`) runs once a round of a leaf's restarts, after the first two, with
/// this many times the nodes of all the round's restarts: its nodes cost more (each narrows
/// every section it touches), and on the cores it settles it needs few of them or none help.
/// It goes on each round from where the last stopped. Pinwheel 300 seed 6 (whose 187-buffer core
/// no other search placed within 10 s), searched afresh each round: 1.28 s at 1, 0.71 s at 2,
/// 0.43 s at 4. Resumed (one order): holes 300 seed 6 (placed by it) 1.49 s at 4, 0.70 s at
/// 8, 0.70 s at 16; pinwheel 500 seed 6 1.18, 0.86, 0.55 s; holes 500 seed 2 (placed by a
/// filled instance's restarts after it) 0.92, 0.95, 1.02 s; MiniMalloc's D, H, I 0.45, 0.13,
/// 0.90 s at 4 and 0.46, 0.16, 0.92 s at 8 (BENCHMARKS.md).
pub const BOUNDS_SHARE: u64 = 8;

/// A filled instance's bounds search (`Filled::search`) runs after its window modules, each
/// search, with this many times their nodes, going on from where the last stopped. Holes 500 seed
/// 4 (its filled instance is the whole tiling, placed by it), at `BOUNDS_SHARE` 8: 1.89 s at 2,
/// 0.82 s at 4, 0.89 s at 8 (6.4 s before filled instances had a bounds search); holes 500 seed
/// 2 0.90, 0.95, 1.07 s at 2, 4, 8 (measured with ties to the largest; at 8 with ties to the
/// larger area, seed 4 took 0.11 s but holes 300 seed 6 0.88 s instead of 0.75 s; BENCHMARKS.md).
pub const FILLED_BOUNDS_SHARE: u64 = 4;

/// `BOUNDS_SHARE` for each of the bounds searches of a component with slack in the `Bounds` mix
/// (which run first in each round). With it, holes 500 seeds 2, 3, 6 and 9 and holes 300 seed 6
/// are placed in the first round by a leaf's bounds search, in 0.16-0.46 s (1.0-2.4 s in the
/// `Balanced` mix). Measured with the searches after the filled instances: 0.7-0.9 s at 32; at
/// 64, seed 3 took 1.24 s; at 16 seed 2 0.75 s but seed 9 1.96 s (BENCHMARKS.md).
pub const BOUNDS_MIX_SHARE: u64 = 32;

/// `FILLED_BOUNDS_SHARE` in the `Restarts` mix, which runs no bounds search on a leaf with slack.
/// Holes 500 seed 4 (whose filled instance's bounds search, ties to the larger area, places it
/// within 396,000-528,000 nodes) is then placed in the first round: 0.74 s at 4, 0.75 s at 6,
/// 0.11 s at 8, 0.11 s at 16; holes 300 seeds 1 and 2 took 0.19 s at 4, 0.25 s at 8, 0.27-0.29 s
/// at 16, holes 500 seed 2 0.90, 1.07, 1.30 s (placed sooner by `Bounds`) (BENCHMARKS.md).
pub const RESTARTS_FILLED_BOUNDS_SHARE: u64 = 8;

/// `BOUNDS_SHARE` for the bounds search of a zero-slack component in the `Bounds` mix: small, so
/// that its restarts (which place most pinwheels) come sooner than in the `Restarts` mix, where
/// the bounds search (at `BOUNDS_SHARE`) places others. Pinwheel 500 seed 2 0.84 s at 8, 0.69 s at
/// 2, 0.64 s with none; pinwheel 300 seed 6 0.19 s, 0.63 s, not within 3 s (BENCHMARKS.md).
pub const BOUNDS_MIX_ZERO_SLACK_SHARE: u64 = 2;

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
    /// One capacity, searched under each tie-break order in turn with a node limit that doubles
    /// every round (deterministic restarts), until one run finds a placement or proves there is
    /// none, or the budget is spent. Any one run's "infeasible" is a proof: each run is complete.
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
            // Zero slack: try flat splits first (they settle perfect packings part by part). They
            // only ever find placements; without one the restarts below go on, unchanged.
            let (placement, used) =
                split::place(items, members, members.len(), capacity, budget.nodes_left, budget.control);
            *budget.nodes += used;
            if let Some(placement) = placement {
                return SearchOutcome::Found(placement);
            }
        }
        // Each shape of fillers once (the two often cut a profile alike), `Runs` first: of the
        // twenty holes instances, with one thread, that saved 0.13-1.7 s on four (holes 500 seed
        // 7: 2.08 to 0.37 s) and cost 0.46 s on one (holes 500 seed 2) (BENCHMARKS.md).
        let nesting = (budget.depth, budget.mix);
        let runs = Filled::new(items, members, &self.sections, capacity, fillers::Shape::Runs, nesting);
        let nested = Filled::new(items, members, &self.sections, capacity, fillers::Shape::Nested, nesting)
            .filter(|nested| runs.as_ref().is_none_or(|runs| runs.items != nested.items));
        let mut filled: Vec<Filled> = runs.into_iter().chain(nested).collect();
        let mut shared = search::Shared::new(items, members, &self.sections, capacity);
        let mut limit = SEARCH_FIRST_LIMIT_PER_BUFFER * members.len() as u64;
        // Modules at zero slack only (and in the filled instances, zero slack by making): with slack
        // their parts cost canonical nodes and placed nothing more within a second on the sets
        // measured (MiniMalloc's H took 3x the nodes). Kept across the rounds: a module placed in
        // one is not placed again.
        let mut modules = modules::Modules::new(zero_slack, budget.depth, budget.mix);
        // The bounds searches, made at their first turn and resumed each round after.
        let mut bounds: Option<Vec<bounds::Bounds>> = None;
        let (tiebreaks, bounds_share) = budget.mix.bounds_searches(zero_slack);
        let bounds_lead = budget.mix.bounds_lead(zero_slack);
        let first_limit = limit;
        loop {
            if limit > first_limit {
                // A search that goes on past its first round tightens its domains (see
                // `TIGHTEN_PER_RESTART_NODE`): cheap instances never pay for it, hard ones in
                // proportion.
                let allowance = limit.saturating_mul(ranks.len() as u64).saturating_mul(TIGHTEN_PER_RESTART_NODE);
                budget.tighten(&mut shared, (items, members), allowance);
            }
            for (index, rank) in ranks.iter().enumerate() {
                // The filled searches after the first two restarts of a round: they take as many
                // nodes as all the restarts, and searching them first cost MiniMalloc's J and K
                // 40x their time, and I 2x (which those restarts settle). At zero slack (no
                // fillers) the modules there instead, with as many nodes as the round's restarts.
                // Then the bounds searches (the mix's orders), each on from where it stopped, with
                // the mix's share (`BOUNDS_SHARE`, `BOUNDS_MIX_SHARE`) times that; in the `Bounds`
                // mix, with slack, they come first instead.
                if index == 2 {
                    let allowance = limit.saturating_mul(ranks.len() as u64);
                    let component = (items, members, &self.sections);
                    // Two turns: the bounds searches', and the filled instances' and modules'.
                    for bounds_turn in if bounds_lead { [true, false] } else { [false, true] } {
                        if bounds_turn {
                            let allowance = allowance.saturating_mul(bounds_share);
                            let domains = shared.domains();
                            match budget.run_bounds(&mut bounds, tiebreaks, component, domains, capacity, allowance) {
                                SearchOutcome::BudgetExhausted => continue,
                                settled => return settled,
                            }
                        }
                        for filled in &mut filled {
                            if let Some(placement) = filled.search(capacity, limit, budget) {
                                return SearchOutcome::Found(placement);
                            }
                        }
                        if let Some(placement) = budget.place_by_modules(&mut modules, component, capacity, allowance) {
                            return SearchOutcome::Found(placement);
                        }
                    }
                }
                if *budget.nodes_left == 0 || budget.control.stopped() {
                    return SearchOutcome::BudgetExhausted;
                }
                let mut run_budget = limit.min(*budget.nodes_left);
                let (outcome, used) = search::search(
                    items,
                    members,
                    overlaps,
                    &self.sections,
                    rank,
                    search::Style::of_restart(index),
                    &mut shared,
                    capacity,
                    &mut run_budget,
                    budget.control,
                );
                *budget.nodes_left -= used;
                *budget.nodes += used;
                match outcome {
                    SearchOutcome::BudgetExhausted => {}
                    settled => return settled,
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
        let Some(overlaps) = self.overlaps.as_ref().filter(|_| members.len() <= EXACT_SEARCH_MAX_BUFFERS) else {
            // Too large for the exact search: window repairs lower the greedy peak instead.
            let peak = self.best.peak;
            let spent = repair::repair(items, members, &mut self.best, goal, budget.nodes_left, budget.control);
            *budget.nodes += spent;
            if self.best.peak < peak {
                let shown = budget.shown;
                budget.control.progress.peak =
                    shown.others.max(self.base + self.best.peak).min(shown.whole) * shown.alignment;
            }
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

/// A component with slack at a capacity, made zero slack by *fillers*: extra buffers whose live
/// totals make up each section's slack exactly (the slack profile cut into intervals, see `new`). A placement
/// of the filled component, fillers dropped, is a placement of the component; the zero-slack
/// machinery (flat splits, the skyline search and its look-ahead) then applies. Not complete:
/// where the free space of a placement is not shaped like the fillers there is no such placement,
/// so this only ever finds placements; the canonical search keeps every proof.
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
    /// Whether its flat splits still run each search with the round's allowance; `false` once a
    /// *near-perfect* instance's have run with all the budget (`NEAR_PERFECT_BUFFERS_PER_FILLER`).
    splits_pending: bool,
    /// Few fillers: the component is a perfect packing with a few pieces missing.
    near_perfect: bool,
    /// Whether `search` ran before (its later runs tighten the domains).
    searched: bool,
    /// The filled instance's bounds searches, made at their first turn and resumed after.
    bounds: Option<Vec<bounds::Bounds>>,
}

/// The most fillers, as a share of the component's buffers (1/`FILLERS_PER_BUFFER`): with more,
/// the capacity is far from zero slack and fillers only add choices.
pub const FILLERS_PER_BUFFER: usize = 4;

/// A filled instance with at least this many buffers per filler is *near perfect*: its flat
/// splits run once with all the budget, as a zero-slack component's do, rather than with each
/// round's allowance (their own work limits bound them). Perfect packings with a few pieces
/// deleted (the holes sets: 29-127 buffers per filler) often split at once then: holes 500 seed 5
/// in 0.08 s, 4.5 s by rounds. On MiniMalloc's A-K, I (6-7), J (4) and K (13-16) stay below, where
/// splitting every filled instance first had cost them 2.7-28x their time; A, B and C (17-33) have
/// near-perfect filled instances but are placed with the same nodes (BENCHMARKS.md).
pub const NEAR_PERFECT_BUFFERS_PER_FILLER: usize = 25;

impl Filled {
    /// The filled instance of a component `depth` modules deep in a solve with search mix `mix`;
    /// `None` when the component needs no fillers (zero slack already) or more than one per
    /// `FILLERS_PER_BUFFER` of its buffers.
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

    /// Flat splits (a near-perfect instance's with all the budget, the first time only), then
    /// window modules, then the skyline search under each tie-break order, each with `limit`
    /// nodes; the placement of the component's own buffers if one is found.
    fn search(&mut self, capacity: u64, limit: u64, budget: &mut Budget) -> Option<ComponentPlacement> {
        let own = |placement: ComponentPlacement| {
            let offsets: Vec<u64> = placement.offsets[..self.own].to_vec();
            let peak = offsets.iter().zip(&self.items).map(|(o, item)| o + item.size).max().unwrap_or(0);
            ComponentPlacement { offsets, peak }
        };
        if self.splits_pending {
            // A near-perfect instance's splits once with all the budget (their own work limits
            // bound them), the others' again each round with its allowance.
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
        // Then its bounds searches, each on from where it stopped, with the mix's share
        // (`FILLED_BOUNDS_SHARE`, `RESTARTS_FILLED_BOUNDS_SHARE`) times that. (Their
        // "infeasible" holds for these fillers only.)
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
            let (outcome, used) = search::search(
                &self.items,
                &self.members,
                &self.overlaps,
                &self.sections,
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

/// Keeps what a search of a leaf (at `base`) at `capacity` settled: a better placement, or a
/// higher proven bound; and shows it to the stop callback.
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

/// The tie-break orders the restarts cycle through: buffers in the most contended sections
/// first, then longer, then larger (MiniMalloc's best-performing preorder), twice (the second
/// time, at `search::CONTENTION_RESTART`, each part the search splits off is ranked afresh so);
/// largest first; longest first; then fixed-seed shuffles. Each is a rank per buffer (lower rank
/// tried first).
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
    let mut rng = crate::generate::SplitMix64::new(0x5EED);
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
