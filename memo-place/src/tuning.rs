//! The solver's tuning constants, in one place: node budgets and allowances, size and density
//! limits, the shares of a round. Each says why it is what it is; the measurements behind it are
//! in BENCHMARKS.md (the section named). `ARCHITECTURE.md` beside this crate lists them in a
//! table, which a test holds equal to this module.

// lib.rs

/// The default node budget of the exact search, shared by all components of one solve: a few
/// seconds at most. Not every hard instance is settled within it (BENCHMARKS.md has the rates).
pub const DEFAULT_BUDGET_NODES: u64 = 2_000_000;

/// Components with more buffers than this are placed by the greedy portfolio and the improvement
/// search for large components (`repair`): each search node costs time linear in the component,
/// so larger ones would spend the budget slowly.
pub(crate) const EXACT_SEARCH_MAX_BUFFERS: usize = 600;

/// Components whose overlap graph would have more pairs than this get no graph: the graph-free
/// sweeps, then the repair (bounds memory to about 8 bytes a pair).
pub(crate) const OVERLAP_PAIR_LIMIT: usize = 40_000_000;

/// The most overlapping pairs for which the classic orders on the whole instance use an overlap
/// graph (about 64 MB), in the greedy stage; beyond it they use a tree of lifetimes, after the
/// leaves' search.
pub(crate) const WHOLE_GREEDY_PAIR_LIMIT: usize = 8_000_000;

/// Shuffled tie-break orders the search restarts with, besides the three heuristic ones.
pub(crate) const SEARCH_RESTART_SHUFFLES: usize = 29;

/// The node limit of the first round of restarts, per buffer of the component; it doubles every
/// round. Searches on these instances either finish in about one node per buffer or wander for
/// very long (a heavy tail), so short runs under several orders beat one long run.
pub(crate) const SEARCH_FIRST_LIMIT_PER_BUFFER: u64 = 4;

/// The node allowance of each search in the first round of a component's descent, per buffer
/// (fourfold a round): small, so the first rounds lower the greedy peak within milliseconds.
pub(crate) const DESCENT_FIRST_NODES_PER_BUFFER: u64 = 64;

/// Searches a descent round may leave unsettled before the next round (with four times the
/// allowance) starts again from the goal.
pub(crate) const DESCENT_UNSETTLED_PROBES: u32 = 3;

/// A zero-slack search past its first round (a leaf's, or a filled instance's from its second
/// search) tightens its domains (`domains::Domains::tighten`) by up to this many tiling states per
/// node its restarts may take in the round. A state costs a fraction of a node, and a value dropped
/// from a domain is dropped from every later restart; the tilings stop by themselves when every
/// section is settled or given up. Pinwheel 500 seeds 2 and 4 took 1.3-1.9 s with 1 per node,
/// 0.7-1.0 s and 0.4-0.5 s with 16, the same with 64; holes 500 seed 2, through its filled
/// instances, 1.9 s with 16 and 0.85 s with 64 (BENCHMARKS.md).
pub(crate) const TIGHTEN_PER_RESTART_NODE: u64 = 64;

/// The bounds search (`bounds`) runs once a round of a leaf's restarts, after the first two, with
/// this many times the nodes of all the round's restarts: its nodes cost more (each narrows
/// every section it touches), and on the cores it settles it needs few of them or none help.
/// It goes on each round from where the last stopped. Pinwheel 300 seed 6 (whose 187-buffer core
/// no other search placed within 10 s), searched afresh each round: 1.28 s at 1, 0.71 s at 2,
/// 0.43 s at 4. Resumed (one order): holes 300 seed 6 (placed by it) 1.49 s at 4, 0.70 s at
/// 8, 0.70 s at 16; pinwheel 500 seed 6 1.18, 0.86, 0.55 s; holes 500 seed 2 (placed by a
/// filled instance's restarts after it) 0.92, 0.95, 1.02 s; MiniMalloc's D, H, I 0.45, 0.13,
/// 0.90 s at 4 and 0.46, 0.16, 0.92 s at 8 (BENCHMARKS.md).
pub(crate) const BOUNDS_SHARE: u64 = 8;

/// A filled instance's bounds search (`Filled::search`) runs after its window modules, each
/// search, with this many times their nodes, going on from where the last stopped. Holes 500 seed
/// 4 (its filled instance is the whole tiling, placed by it), at `BOUNDS_SHARE` 8: 1.89 s at 2,
/// 0.82 s at 4, 0.89 s at 8 (6.4 s before filled instances had a bounds search); holes 500 seed
/// 2 0.90, 0.95, 1.07 s at 2, 4, 8 (measured with ties to the largest; at 8 with ties to the
/// larger area, seed 4 took 0.11 s but holes 300 seed 6 0.88 s instead of 0.75 s; BENCHMARKS.md).
pub(crate) const FILLED_BOUNDS_SHARE: u64 = 4;

/// `BOUNDS_SHARE` for each of the bounds searches of a component with slack in the `Bounds` mix
/// (which run first in each round). With it, holes 500 seeds 2, 3, 6 and 9 and holes 300 seed 6
/// are placed in the first round by a leaf's bounds search, in 0.16-0.46 s (1.0-2.4 s in the
/// `Balanced` mix). Measured with the searches after the filled instances: 0.7-0.9 s at 32; at
/// 64, seed 3 took 1.24 s; at 16 seed 2 0.75 s but seed 9 1.96 s (BENCHMARKS.md).
pub(crate) const BOUNDS_MIX_SHARE: u64 = 32;

/// `FILLED_BOUNDS_SHARE` in the `Restarts` mix, which runs no bounds search on a leaf with slack.
/// Holes 500 seed 4 (whose filled instance's bounds search, ties to the larger area, places it
/// within 396,000-528,000 nodes) is then placed in the first round: 0.74 s at 4, 0.75 s at 6,
/// 0.11 s at 8, 0.11 s at 16; holes 300 seeds 1 and 2 took 0.19 s at 4, 0.25 s at 8, 0.27-0.29 s
/// at 16, holes 500 seed 2 0.90, 1.07, 1.30 s (placed sooner by `Bounds`) (BENCHMARKS.md).
pub(crate) const RESTARTS_FILLED_BOUNDS_SHARE: u64 = 8;

/// `BOUNDS_SHARE` for the bounds search of a zero-slack component in the `Bounds` mix: small, so
/// that its restarts (which place most pinwheels) come sooner than in the `Restarts` mix, where
/// the bounds search (at `BOUNDS_SHARE`) places others. Pinwheel 500 seed 2 0.84 s at 8, 0.69 s at
/// 2, 0.64 s with none; pinwheel 300 seed 6 0.19 s, 0.63 s, not within 3 s (BENCHMARKS.md).
pub(crate) const BOUNDS_MIX_ZERO_SLACK_SHARE: u64 = 2;

/// The most fillers, as a share of the component's buffers (1/`FILLERS_PER_BUFFER`): with more,
/// the capacity is far from zero slack and fillers only add choices.
pub(crate) const FILLERS_PER_BUFFER: usize = 4;

/// A filled instance with at least this many buffers per filler is *near perfect*: its flat
/// splits run once with all the budget, as a zero-slack component's do, rather than with each
/// round's allowance (their own work limits bound them). Perfect packings with a few pieces
/// deleted (the holes sets: 29-127 buffers per filler) often split at once then: holes 500 seed 5
/// in 0.08 s, 4.5 s by rounds. On MiniMalloc's A-K, I (6-7), J (4) and K (13-16) stay below, where
/// splitting every filled instance first had cost them 2.7-28x their time; A, B and C (17-33) have
/// near-perfect filled instances but are placed with the same nodes (BENCHMARKS.md).
pub(crate) const NEAR_PERFECT_BUFFERS_PER_FILLER: usize = 25;

// bounds.rs

/// Work units per search node: a node's propagation scans many sections, and the budget counts
/// what is spent, so every this many set members scanned (and buffers scanned to choose, to
/// check the intervals, and per buffer of a section narrowed) count as one node. Uncounted, those
/// scans made a node of a search with slack (few members in the sets) cost about 10x the time of
/// one at zero slack (BENCHMARKS.md).
pub(crate) const BOUNDS_WORK_PER_NODE: u64 = 64;

/// Components with a section of more buffers than this are not searched (nothing is settled):
/// the rules' scans are cubic in a section's buffers, about 8 M set members at this size, some
/// milliseconds, between two polls of the stop callback. The cores the search settles have
/// sections of a few dozen.
pub(crate) const BOUNDS_MOST_BUFFERS: usize = 128;

/// Work (set members scanned) between two chargings to the budget inside one propagation, so
/// the stop callback is polled while a long propagation runs.
pub(crate) const BOUNDS_CHARGE_EVERY: u64 = 16 * BOUNDS_WORK_PER_NODE;

// control.rs

/// Nodes between two polls of the callback. A node costs from about a microsecond to milliseconds
/// (a placement updates the floors of every section its neighbours span), so polls are frequent:
/// a clock-reading callback costs tens of nanoseconds, a few percent at most.
pub(crate) const POLL_EVERY: u64 = 16;

// domains.rs

/// Sections per buffer whose subset sums are intersected (the sparsest ones).
pub(crate) const DOMAIN_SECTIONS: usize = 4;

/// The most other buffers a section may have for its subset sums to be enumerated (2^12 sums).
pub(crate) const DOMAIN_MOST_OTHERS: usize = 12;

/// Domains with more values than this are dropped (they prune little and cost memory).
pub(crate) const DOMAIN_MOST_VALUES: usize = 1 << 14;

/// Sections with more buffers than this are not tiled (`Tiler`: a set of placed buffers is one
/// 64-bit mask, and the mask of all ones marks an empty slot of `MaskTable`).
pub(crate) const TILING_MOST_BUFFERS: usize = 63;

/// Domains with at most this many values are listed by offset for the tilings (`Tiler`), the
/// larger ones asked one by one.
pub(crate) const TILING_LISTED_VALUES: usize = 64;

/// Sections with more buffers than this whose domains are not listed (none, or more than
/// `TILING_LISTED_VALUES` values) are not tiled: nearly every order of them tiles, so the tilings
/// are too many to list and narrow nothing.
pub(crate) const TILING_MOST_UNLISTED: usize = 12;

/// The states one section's tiling may visit before it is given up (nothing concluded from it),
/// in the first round of tilings; each round after allows four times as many, up to
/// `TILING_SECTION_WORK`.
pub(crate) const TILING_FIRST_SECTION_WORK: u64 = 1024;

/// The most states one section's tiling may visit.
pub(crate) const TILING_SECTION_WORK: u64 = 65536;

/// The states the tilings may visit when the domains are made, per buffer of the component; the
/// searches that go on longer tighten them further (`Domains::tighten`).
pub(crate) const TILING_FIRST_WORK_PER_BUFFER: u64 = 64;

// fillers.rs

/// The most fillers open at once for [`fewest`]: each change of the slack considers every subset
/// of the open ones, so this bounds its branching (`2^OPEN_MOST`).
pub(crate) const OPEN_MOST: usize = 10;

// greedy.rs

/// The most offset intervals a classic order over a tree of lifetimes (no overlap graph) may read;
/// an order past it is dropped: on a dense trace an order costs about a second per 2^26 intervals.
pub(crate) const CLASSIC_TREE_WORK: usize = 1 << 26;

/// Buffers a greedy order or sweep places (or an overlap graph build visits) between two polls of
/// the stop callback: an order over a large component takes up to seconds, longer than a time
/// limit may be passed by; 2,048 buffers of a 100k-buffer sweep take about 3 ms.
pub(crate) const GREEDY_POLL_EVERY: usize = 2048;

/// Overlapping pairs an overlap graph build files between two polls of the stop callback.
pub(crate) const PAIRS_PER_POLL: usize = 1 << 20;

// modules.rs

/// Modules are looked for only in components of at most this many sections: the scan over every
/// range of sections takes time quadratic in their number (a million steps at this size).
pub(crate) const MODULE_MOST_SECTIONS: usize = 1024;

/// Modules nested deeper than this are not looked for (each level solves smaller instances, so
/// this bounds the recursion's stack, not its reach on the instances measured).
pub(crate) const MODULE_DEPTH_LIMIT: u32 = 8;

/// Modules are used only where the rest (the buffers outside them, and one stand-in each) keeps
/// at most this share of the component's buffers, in percent. Otherwise the rest is nearly the
/// component itself, as hard, and solving it again is a restart with fewer nodes: on MiniMalloc's
/// D and I (modules holding 9-12 of 226-229 and 101-111 of 417-430 buffers of their filled
/// instances) that cost 47% and 39% more nodes, while the modules that placed a pinwheel or holed instance held 90% or
/// more of its buffers (BENCHMARKS.md).
pub(crate) const MODULE_REST_MOST_PERCENT: usize = 50;

// portfolio.rs

/// A worker takes the lock and asks the caller's callback at one of this many of its polls (a
/// poll comes every 16 nodes, a few microseconds apart in the bounds search); at the others it
/// only reads whether another worker settled the solve. A stop then waits for up to 128 nodes.
pub(crate) const POLLS_PER_SHARED_POLL: u32 = 8;

// refuted.rs

/// The most fingerprints kept (16 bytes each, in a table at most twice that size: 32 MiB). A
/// full set stops growing; what it holds stays valid.
pub(crate) const REFUTED_MOST: usize = 1 << 20;

/// Slots in a new table (it doubles when half full).
pub(crate) const REFUTED_FIRST_SLOTS: usize = 1 << 10;

// repair.rs

/// The most rounds for one component (each costs one node per buffer of the node budget, and
/// polls the stop callback).
pub(crate) const REPAIR_MOST_ROUNDS: u32 = 4096;

/// Steps tried by the peak-first starts.
pub(crate) const PEAK_FIRST_STEPS: usize = 8;

// search.rs

/// Sections with more buffers than this skip the section bound by levels (`dirty_sections_fit`)
/// and, in higher valleys, the count of fills (`fill_skyline`).
pub(crate) const LEVELS_MOST_BUFFERS: usize = 48;

// split/flow.rs

/// The attempts (a seed edge with one flow) tried in the first round, and the work limit of each;
/// both double every round.
pub(crate) const FLOW_FIRST_WINDOW: usize = 16;

/// See `FLOW_FIRST_WINDOW`.
pub(crate) const FLOW_FIRST_LIMIT_PER_ATTEMPT: u64 = 512;

// split/mod.rs

/// Flat subsets tried per component before it goes to the exact search whole.
pub(crate) const SPLIT_TRIES: usize = 4;

/// The work allowance of each search in the first round of a component; it grows fourfold a
/// round, up to `FIND_WORK`.
pub(crate) const FIND_FIRST_WORK: u64 = 2048;

/// The largest work allowance of one round.
pub(crate) const FIND_WORK: u64 = 262_144;

/// Nodes the parts with fillers cut anew (`Splitter::refill`) may take in all, per buffer of the
/// component.
pub(crate) const REFILL_WORK_PER_BUFFER: u64 = 4096;

/// The nodes each set of fillers of a part cut anew may take in the first round, per buffer of the
/// part; four times more each round.
pub(crate) const REFILL_FIRST_WORK_PER_BUFFER: u64 = 256;

/// The most sets of fillers a part is tried with when cut anew.
pub(crate) const REFILL_VARIANTS: usize = 8;

/// Steps the search for a part's sets of fewest fillers may take (`fillers::fewest`).
pub(crate) const REFILL_FEWEST_WORK: u64 = 1 << 16;

/// Nodes the exact search may take on a part that does not split.
pub(crate) const PART_SEARCH_WORK: u64 = 50_000;

/// The most distinct subset sums kept per group of buffers.
pub(crate) const SUBSET_SUMS_LIMIT: usize = 1 << 12;

/// Splits nested deeper than this go to the exact search (bounds the recursion).
pub(crate) const SPLIT_DEPTH_LIMIT: u32 = 64;

/// Subset-sum entries merged per node charged.
pub(crate) const SUMS_PER_NODE: u64 = 64;

/// Nodes one subset-sum witness (`pick`) may take.
pub(crate) const PICK_WORK: u64 = 10_000;

/// The largest bitset of a group's subset sums (`Group::has_amount`): 512 KiB.
pub(crate) const ALL_SUMS_MOST_BITS: u64 = 1 << 22;

// split/pinwheel.rs

/// Flat subsets taken from each side's searches per boundary pair.
pub(crate) const SIDE_TRIES: usize = 8;

/// Nodes each side's flat-subset searches may take per pair in the first round over the pairs;
/// four times more each round.
pub(crate) const SIDE_FIRST_WORK: u64 = 512;

/// Nodes the search sharing out the buffers between the two boundaries may take per try.
pub(crate) const MIDDLE_WORK: u64 = 4096;

/// Nodes a component's searches for the outer pieces may take in all, per buffer: a component
/// that is no pinwheel leaves the budget to the exact search. (The pieces of a pinwheel found are
/// placed with the budget as it is: each piece's own splits and searches are bounded.)
pub(crate) const PINWHEEL_WORK_PER_BUFFER: u64 = 2048;

// split/sparse.rs

/// Sections (the sparsest after the chosen one) whose subset sums filter the heights, when all of
/// their sums are known within `FILTER_SUMS_LIMIT`.
pub(crate) const FILTER_SECTIONS: usize = 8;

/// See `FILTER_SECTIONS`.
pub(crate) const FILTER_SUMS_LIMIT: usize = 1 << 16;

/// Sections with more buffers than this filter nothing (their sums are too many to be known).
pub(crate) const FILTER_MOST_BUFFERS: usize = 16;

/// Filtering stops when this few heights are left.
pub(crate) const FILTERED_ENOUGH: usize = 16;

/// The most subset sums of the chosen section computed (the smallest).
pub(crate) const HEIGHTS_LIMIT: usize = 1 << 16;

/// The most heights tried (the lowest): crowded sections allow nearly every height, and the flow
/// search covers those components.
pub(crate) const HEIGHTS_TRIED_LIMIT: usize = 4096;

/// Time windows whose sparsest sections' sums of whole lifetime classes filter the heights put
/// next when the first allowance found no split (`whole_class_heights`).
pub(crate) const WHOLE_FILTER_SECTIONS: usize = 16;

/// Sections with more lifetime classes than this do not filter whole-class heights.
pub(crate) const WHOLE_MOST_CLASSES: usize = 18;

/// At least this many sections must filter whole-class heights, else there are none.
pub(crate) const WHOLE_LEAST_FILTERS: usize = 4;

/// Up to one in this many filtering sections may miss a whole-class height (fewest misses first).
pub(crate) const WHOLE_TOLERANCE_SHARE: usize = 4;

/// The work of checking one candidate height against one section (a binary search), in
/// subset-sum entries (`SUMS_PER_NODE` make a node).
pub(crate) const CHECK_COST: u64 = 8;

/// The most whole-class heights put next.
pub(crate) const WHOLE_HEIGHTS_LIMIT: usize = 1024;

/// The heights tried in the first round (lowest first), and the work limit of each; both double
/// every round.
pub(crate) const SPARSE_FIRST_WINDOW: usize = 64;

/// See `SPARSE_FIRST_WINDOW`.
pub(crate) const SPARSE_FIRST_LIMIT_PER_HEIGHT: u64 = 256;

#[cfg(test)]
mod tests {
    use alloc::string::{String, ToString};
    use alloc::vec::Vec;

    /// (name, value as written) of every `const` in this module's source.
    fn module_constants() -> Vec<(String, String)> {
        let source = include_str!("tuning.rs");
        let code = &source[..source.find("#[cfg(test)]").unwrap_or(source.len())];
        code.lines()
            .filter_map(|line| {
                let rest = line.strip_prefix("pub(crate) const ").or_else(|| line.strip_prefix("pub const "))?;
                let (name, rest) = rest.split_once(':')?;
                let (_, value) = rest.split_once(" = ")?;
                Some((name.to_string(), value.trim_end_matches(';').to_string()))
            })
            .collect()
    }

    /// (name, value) of every row of the constants table of `ARCHITECTURE.md`.
    fn table_constants() -> Vec<(String, String)> {
        let doc = include_str!("../ARCHITECTURE.md");
        let table = doc.split("## Constants, in one place").nth(1).expect("the constants section");
        let table = table.split("\n## ").next().unwrap_or(table);
        table
            .lines()
            .filter(|line| line.starts_with("| `"))
            .map(|line| {
                let cells: Vec<&str> = line.split(" | ").collect();
                (
                    cells[0].trim_start_matches("| ").trim_matches('`').to_string(),
                    cells[1].trim_matches('`').to_string(),
                )
            })
            .collect()
    }

    #[test]
    fn the_architecture_table_is_the_module() {
        let module = module_constants();
        assert!(module.len() > 50, "the module's constants were not read: {module:?}");
        assert_eq!(table_constants(), module);
    }
}
