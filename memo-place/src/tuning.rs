//! The solver's tuning constants, in one place: node budgets and allowances, size and density
//! limits, the shares of a round. Each says why it is what it is; the measurements behind it are
//! in BENCHMARKS.md (the section named). `ARCHITECTURE.md` beside this crate lists them in a
//! table, which a test holds equal to this module.

// lib.rs

/// The default node budget of the exact search, shared by all components of one solve: a few
/// seconds at most.
pub const DEFAULT_BUDGET_NODES: u64 = 2_000_000;

/// Components with more buffers than this are placed by the greedy portfolio and the improvement
/// search for large components (`repair`): each search node costs time linear in the component, so
/// larger ones would spend the budget slowly. Measured: BENCHMARKS.md, "Earlier: the skyline search
/// alone (2026-12-02, load 3-5)".
pub(crate) const EXACT_SEARCH_MAX_BUFFERS: usize = 4096;

/// Components with more buffers than this get a share of the improvement search (`repair`)
/// before the exact search: on operator graphs of 1,000-3,000 buffers it reaches the lower bound
/// on some the exact search does not settle in seconds. Measured: BENCHMARKS.md, "Exact search on
/// 1,000-3,000 buffers".
pub(crate) const REPAIR_FIRST_BUFFERS: usize = 600;

/// That share, in nodes per buffer: the peak-first starts (64) and 256 rounds.
pub(crate) const REPAIR_FIRST_NODES_PER_BUFFER: u64 = 320;

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
/// round. Searches on these instances either finish in about one node per buffer or wander for very
/// long (a heavy tail), so short runs under several orders beat one long run.
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
/// section is settled or given up. Measured: BENCHMARKS.md, "Nineteenth pass: search mixes side by
/// side (`solve_portfolio`, `memo solve --threads`)".
pub(crate) const TIGHTEN_PER_RESTART_NODE: u64 = 64;

/// The bounds search (`bounds`) runs once a round of a leaf's restarts, after the first two, with
/// this many times the nodes of all the round's restarts: its nodes cost more (each narrows every
/// section it touches), and on the cores it settles it needs few of them or none help. It goes on
/// each round from where the last stopped. Measured: BENCHMARKS.md, "Seventeenth pass: the bounds
/// search".
pub(crate) const BOUNDS_SHARE: u64 = 8;

/// A filled instance's bounds search (`Filled::search`) runs after its window modules, each search,
/// with this many times their nodes, going on from where the last stopped. Measured: BENCHMARKS.md,
/// "Eighteenth pass: the bounds search resumed, in filled instances, in two orders".
pub(crate) const FILLED_BOUNDS_SHARE: u64 = 4;

/// `BOUNDS_SHARE` for each of the bounds searches of a component with slack in the `Bounds` mix
/// (which run first in each round). Measured: BENCHMARKS.md, "Nineteenth pass: search mixes side by
/// side (`solve_portfolio`, `memo solve --threads`)".
pub(crate) const BOUNDS_MIX_SHARE: u64 = 32;

/// `FILLED_BOUNDS_SHARE` in the `Restarts` mix, which runs no bounds search on a leaf with slack.
/// Measured: BENCHMARKS.md, "Nineteenth pass: search mixes side by side (`solve_portfolio`, `memo
/// solve --threads`)".
pub(crate) const RESTARTS_FILLED_BOUNDS_SHARE: u64 = 8;

/// `BOUNDS_SHARE` for the bounds search of a zero-slack component in the `Bounds` mix: small, so
/// that its restarts (which place most pinwheels) come sooner than in the `Restarts` mix, where the
/// bounds search (at `BOUNDS_SHARE`) places others. Measured: BENCHMARKS.md, "Nineteenth pass:
/// search mixes side by side (`solve_portfolio`, `memo solve --threads`)".
pub(crate) const BOUNDS_MIX_ZERO_SLACK_SHARE: u64 = 2;

/// The most fillers, as a share of the component's buffers (1/`FILLERS_PER_BUFFER`): with more, the
/// capacity is far from zero slack and fillers only add choices. Measured: BENCHMARKS.md, "Second
/// pass: look-ahead, filled search, large-neighbourhood repair (branch issue19b)".
pub(crate) const FILLERS_PER_BUFFER: usize = 4;

/// A filled instance with at least this many buffers per filler is *near perfect*: its flat splits
/// run once with all the budget, as a zero-slack component's do, rather than with each round's
/// allowance (their own work limits bound them). Measured: BENCHMARKS.md, "Fifteenth pass: near-
/// perfect filled instances; section tilings tighten the domains".
pub(crate) const NEAR_PERFECT_BUFFERS_PER_FILLER: usize = 25;

// bounds.rs

/// Work units per search node: a node's propagation scans many sections, and the budget counts what
/// is spent, so every this many set members scanned (and buffers scanned to choose, to check the
/// intervals, and per buffer of a section narrowed) count as one node.
pub(crate) const BOUNDS_WORK_PER_NODE: u64 = 64;

/// Components with a section of more buffers than this are not searched (nothing is settled): the
/// rules' scans are cubic in a section's buffers, about 8 M set members at this size, some
/// milliseconds, between two polls of the stop callback. The cores the search settles have sections
/// of a few dozen.
pub(crate) const BOUNDS_MOST_BUFFERS: usize = 128;

/// Work (set members scanned) between two chargings to the budget inside one propagation, so the
/// stop callback is polled while a long propagation runs.
pub(crate) const BOUNDS_CHARGE_EVERY: u64 = 16 * BOUNDS_WORK_PER_NODE;

// control.rs

/// Nodes between two polls of the callback. A node costs from about a microsecond to milliseconds
/// (a placement updates the floors of every section its neighbours span), so polls are frequent: a
/// clock-reading callback costs tens of nanoseconds, a few percent at most.
pub(crate) const POLL_EVERY: u64 = 16;

// domains.rs

/// Sections per buffer whose subset sums are intersected (the sparsest ones). Measured:
/// BENCHMARKS.md, "Fifth pass: the section bound by levels, zero-slack domains, shared refutations
/// (search)".
pub(crate) const DOMAIN_SECTIONS: usize = 4;

/// The most other buffers a section may have for its subset sums to be enumerated (2^12 sums).
/// Measured: BENCHMARKS.md, "Fifth pass: the section bound by levels, zero-slack domains, shared
/// refutations (search)".
pub(crate) const DOMAIN_MOST_OTHERS: usize = 12;

/// Domains with more values than this are dropped (they prune little and cost memory). Measured:
/// BENCHMARKS.md, "Fifth pass: the section bound by levels, zero-slack domains, shared refutations
/// (search)".
pub(crate) const DOMAIN_MOST_VALUES: usize = 1 << 14;

/// Sections with more buffers than this are not tiled (`Tiler`: a set of placed buffers is one
/// 64-bit mask, and the mask of all ones marks an empty slot of `MaskTable`). Measured:
/// BENCHMARKS.md, "Fifteenth pass: near-perfect filled instances; section tilings tighten the
/// domains".
pub(crate) const TILING_MOST_BUFFERS: usize = 63;

/// Domains with at most this many values are listed by offset for the tilings (`Tiler`), the larger
/// ones asked one by one. Measured: BENCHMARKS.md, "Fifteenth pass: near-perfect filled instances;
/// section tilings tighten the domains".
pub(crate) const TILING_LISTED_VALUES: usize = 64;

/// Sections with more buffers than this whose domains are not listed (none, or more than
/// `TILING_LISTED_VALUES` values) are not tiled: nearly every order of them tiles, so the tilings
/// are too many to list and narrow nothing. Measured: BENCHMARKS.md, "Fifteenth pass: near-perfect
/// filled instances; section tilings tighten the domains".
pub(crate) const TILING_MOST_UNLISTED: usize = 12;

/// The states one section's tiling may visit before it is given up (nothing concluded from it), in
/// the first round of tilings; each round after allows four times as many, up to
/// `TILING_SECTION_WORK`. Measured: BENCHMARKS.md, "Fifteenth pass: near-perfect filled instances;
/// section tilings tighten the domains".
pub(crate) const TILING_FIRST_SECTION_WORK: u64 = 1024;

/// The most states one section's tiling may visit. Measured: BENCHMARKS.md, "Fifteenth pass: near-
/// perfect filled instances; section tilings tighten the domains".
pub(crate) const TILING_SECTION_WORK: u64 = 65536;

/// The states the tilings may visit when the domains are made, per buffer of the component; the
/// searches that go on longer tighten them further (`Domains::tighten`). Measured: BENCHMARKS.md,
/// "Fifteenth pass: near-perfect filled instances; section tilings tighten the domains".
pub(crate) const TILING_FIRST_WORK_PER_BUFFER: u64 = 64;

// fillers.rs

/// The most fillers open at once for [`fewest`]: each change of the slack considers every subset of
/// the open ones, so this bounds its branching (`2^OPEN_MOST`). Measured: BENCHMARKS.md, "Twenty-
/// first pass: fillers cut anew where a part fails (60 of 60 at 1 s)".
pub(crate) const OPEN_MOST: usize = 10;

// greedy.rs

/// Buffers a greedy order or sweep places (or an overlap graph build visits) between two polls of
/// the stop callback: an order over a large component takes up to seconds, longer than a time limit
/// may be passed by; 2,048 buffers of a 100k-buffer sweep take about 3 ms. Measured: BENCHMARKS.md,
/// "`memo solve --time-limit` on 100k buffers (fourth pass)".
pub(crate) const GREEDY_POLL_EVERY: usize = 2048;

/// Overlapping pairs an overlap graph build files between two polls of the stop callback.
pub(crate) const PAIRS_PER_POLL: usize = 1 << 20;

// modules.rs

/// Modules are looked for only in components of at most this many sections: the scan over every
/// range of sections takes time quadratic in their number (a million steps at this size). Measured:
/// BENCHMARKS.md, "Fourteenth pass: window modules".
pub(crate) const MODULE_MOST_SECTIONS: usize = 1024;

/// Modules nested deeper than this are not looked for (each level solves smaller instances, so this
/// bounds the recursion's stack, not its reach on the instances measured). Measured: BENCHMARKS.md,
/// "Fourteenth pass: window modules".
pub(crate) const MODULE_DEPTH_LIMIT: u32 = 8;

/// Modules are used only where the rest (the buffers outside them, and one stand-in each) keeps at
/// most this share of the component's buffers, in percent. Measured: BENCHMARKS.md, "Fourteenth
/// pass: window modules".
pub(crate) const MODULE_REST_MOST_PERCENT: usize = 50;

// portfolio.rs

/// A worker takes the lock and asks the caller's callback at one of this many of its polls (a poll
/// comes every 16 nodes, a few microseconds apart in the bounds search); at the others it only
/// reads whether another worker settled the solve. A stop then waits for up to 128 nodes. Measured:
/// BENCHMARKS.md, "Nineteenth pass: search mixes side by side (`solve_portfolio`, `memo solve
/// --threads`)".
#[cfg(feature = "std")]
pub(crate) const POLLS_PER_SHARED_POLL: u32 = 8;

// refuted.rs

/// The most fingerprints kept (16 bytes each, in a table at most twice that size: 32 MiB). A full
/// set stops growing; what it holds stays valid. Measured: BENCHMARKS.md, "Fifth pass: the section
/// bound by levels, zero-slack domains, shared refutations (search)".
pub(crate) const REFUTED_MOST: usize = 1 << 20;

/// Slots in a new table (it doubles when half full). Measured: BENCHMARKS.md, "Fifth pass: the
/// section bound by levels, zero-slack domains, shared refutations (search)".
pub(crate) const REFUTED_FIRST_SLOTS: usize = 1 << 10;

// repair.rs

/// The most rounds for one component (each costs one node per buffer of the node budget, and polls
/// the stop callback). Measured: BENCHMARKS.md, "Second pass: look-ahead, filled search, large-
/// neighbourhood repair (branch issue19b)".
pub(crate) const REPAIR_MOST_ROUNDS: u32 = 4096;

/// Steps tried by the peak-first starts. Measured: BENCHMARKS.md, "Third pass: peak-first starts
/// for large leaves (branch issue19c)".
pub(crate) const PEAK_FIRST_STEPS: usize = 8;

// search.rs

/// Sections with more buffers than this skip the section bound by levels (`dirty_sections_fit`)
/// and, in higher valleys, the count of fills (`fill_skyline`). Measured: BENCHMARKS.md, "Fifth
/// pass: the section bound by levels, zero-slack domains, shared refutations (search)".
pub(crate) const LEVELS_MOST_BUFFERS: usize = 48;

// split/flow.rs

/// The attempts (a seed edge with one flow) tried in the first round, and the work limit of each;
/// both double every round. Measured: BENCHMARKS.md, "Before: flat splits alone (commit fd29ddb,
/// rebuilt and run at 08:48 UTC, same load)".
pub(crate) const FLOW_FIRST_WINDOW: usize = 16;

/// See `FLOW_FIRST_WINDOW`. Measured: BENCHMARKS.md, "Before: flat splits alone (commit fd29ddb,
/// rebuilt and run at 08:48 UTC, same load)".
pub(crate) const FLOW_FIRST_LIMIT_PER_ATTEMPT: u64 = 512;

// split/mod.rs

/// Flat subsets tried per component before it goes to the exact search whole. Measured:
/// BENCHMARKS.md, "Before: flat splits alone (commit fd29ddb, rebuilt and run at 08:48 UTC, same
/// load)".
pub(crate) const SPLIT_TRIES: usize = 4;

/// The work allowance of each search in the first round of a component; it grows fourfold a round,
/// up to `FIND_WORK`. Measured: BENCHMARKS.md, "Before: flat splits alone (commit fd29ddb, rebuilt
/// and run at 08:48 UTC, same load)".
pub(crate) const FIND_FIRST_WORK: u64 = 2048;

/// The largest work allowance of one round. Measured: BENCHMARKS.md, "Before: flat splits alone
/// (commit fd29ddb, rebuilt and run at 08:48 UTC, same load)".
pub(crate) const FIND_WORK: u64 = 262_144;

/// Nodes the parts with fillers cut anew (`Splitter::refill`) may take in all, per buffer of the
/// component. Measured: BENCHMARKS.md, "Twenty-first pass: fillers cut anew where a part fails (60
/// of 60 at 1 s)".
pub(crate) const REFILL_WORK_PER_BUFFER: u64 = 4096;

/// The nodes each set of fillers of a part cut anew may take in the first round, per buffer of the
/// part; four times more each round. Measured: BENCHMARKS.md, "Twenty-first pass: fillers cut anew
/// where a part fails (60 of 60 at 1 s)".
pub(crate) const REFILL_FIRST_WORK_PER_BUFFER: u64 = 256;

/// The most sets of fillers a part is tried with when cut anew. Measured: BENCHMARKS.md, "Twenty-
/// first pass: fillers cut anew where a part fails (60 of 60 at 1 s)".
pub(crate) const REFILL_VARIANTS: usize = 8;

/// Steps the search for a part's sets of fewest fillers may take (`fillers::fewest`). Measured:
/// BENCHMARKS.md, "Twenty-first pass: fillers cut anew where a part fails (60 of 60 at 1 s)".
pub(crate) const REFILL_FEWEST_WORK: u64 = 1 << 16;

/// Nodes the exact search may take on a part that does not split. Measured: BENCHMARKS.md, "Before:
/// flat splits alone (commit fd29ddb, rebuilt and run at 08:48 UTC, same load)".
pub(crate) const PART_SEARCH_WORK: u64 = 50_000;

/// The most distinct subset sums kept per group of buffers. Measured: BENCHMARKS.md, "Before: flat
/// splits alone (commit fd29ddb, rebuilt and run at 08:48 UTC, same load)".
pub(crate) const SUBSET_SUMS_LIMIT: usize = 1 << 12;

/// Splits nested deeper than this go to the exact search (bounds the recursion). Measured:
/// BENCHMARKS.md, "Before: flat splits alone (commit fd29ddb, rebuilt and run at 08:48 UTC, same
/// load)".
pub(crate) const SPLIT_DEPTH_LIMIT: u32 = 64;

/// Subset-sum entries merged per node charged. Measured: BENCHMARKS.md, "Before: flat splits alone
/// (commit fd29ddb, rebuilt and run at 08:48 UTC, same load)".
pub(crate) const SUMS_PER_NODE: u64 = 64;

/// Nodes one subset-sum witness (`pick`) may take. Measured: BENCHMARKS.md, "Before: flat splits
/// alone (commit fd29ddb, rebuilt and run at 08:48 UTC, same load)".
pub(crate) const PICK_WORK: u64 = 10_000;

/// The largest bitset of a group's subset sums (`Group::has_amount`): 512 KiB. Measured:
/// BENCHMARKS.md, "Before: flat splits alone (commit fd29ddb, rebuilt and run at 08:48 UTC, same
/// load)".
pub(crate) const ALL_SUMS_MOST_BITS: u64 = 1 << 22;

// split/pinwheel.rs

/// Flat subsets taken from each side's searches per boundary pair. Measured: BENCHMARKS.md,
/// "Twentieth pass: pinwheel splits (59 of 60 at 1 s)".
pub(crate) const SIDE_TRIES: usize = 8;

/// Nodes each side's flat-subset searches may take per pair in the first round over the pairs; four
/// times more each round. Measured: BENCHMARKS.md, "Twentieth pass: pinwheel splits (59 of 60 at 1
/// s)".
pub(crate) const SIDE_FIRST_WORK: u64 = 512;

/// Nodes the search sharing out the buffers between the two boundaries may take per try. Measured:
/// BENCHMARKS.md, "Twentieth pass: pinwheel splits (59 of 60 at 1 s)".
pub(crate) const MIDDLE_WORK: u64 = 4096;

/// Nodes a component's searches for the outer pieces may take in all, per buffer: a component that
/// is no pinwheel leaves the budget to the exact search. (The pieces of a pinwheel found are placed
/// with the budget as it is: each piece's own splits and searches are bounded.) Measured:
/// BENCHMARKS.md, "Twentieth pass: pinwheel splits (59 of 60 at 1 s)".
pub(crate) const PINWHEEL_WORK_PER_BUFFER: u64 = 2048;

// split/sparse.rs

/// Sections (the sparsest after the chosen one) whose subset sums filter the heights, when all of
/// their sums are known within `FILTER_SUMS_LIMIT`. Measured: BENCHMARKS.md, "Before: flat splits
/// alone (commit fd29ddb, rebuilt and run at 08:48 UTC, same load)".
pub(crate) const FILTER_SECTIONS: usize = 8;

/// See `FILTER_SECTIONS`. Measured: BENCHMARKS.md, "Before: flat splits alone (commit fd29ddb,
/// rebuilt and run at 08:48 UTC, same load)".
pub(crate) const FILTER_SUMS_LIMIT: usize = 1 << 16;

/// Sections with more buffers than this filter nothing (their sums are too many to be known).
/// Measured: BENCHMARKS.md, "Before: flat splits alone (commit fd29ddb, rebuilt and run at 08:48
/// UTC, same load)".
pub(crate) const FILTER_MOST_BUFFERS: usize = 16;

/// Filtering stops when this few heights are left. Measured: BENCHMARKS.md, "Before: flat splits
/// alone (commit fd29ddb, rebuilt and run at 08:48 UTC, same load)".
pub(crate) const FILTERED_ENOUGH: usize = 16;

/// The most subset sums of the chosen section computed (the smallest). Measured: BENCHMARKS.md,
/// "Before: flat splits alone (commit fd29ddb, rebuilt and run at 08:48 UTC, same load)".
pub(crate) const HEIGHTS_LIMIT: usize = 1 << 16;

/// The most heights tried (the lowest): crowded sections allow nearly every height, and the flow
/// search covers those components. Measured: BENCHMARKS.md, "Before: flat splits alone (commit
/// fd29ddb, rebuilt and run at 08:48 UTC, same load)".
pub(crate) const HEIGHTS_TRIED_LIMIT: usize = 4096;

/// Time windows whose sparsest sections' sums of whole lifetime classes filter the heights put next
/// when the first allowance found no split (`whole_class_heights`). Measured: BENCHMARKS.md, "Now:
/// flat splits with whole-class heights (commit f9292b9, 08:54 UTC)".
pub(crate) const WHOLE_FILTER_SECTIONS: usize = 16;

/// Sections with more lifetime classes than this do not filter whole-class heights. Measured:
/// BENCHMARKS.md, "Now: flat splits with whole-class heights (commit f9292b9, 08:54 UTC)".
pub(crate) const WHOLE_MOST_CLASSES: usize = 18;

/// At least this many sections must filter whole-class heights, else there are none. Measured:
/// BENCHMARKS.md, "Now: flat splits with whole-class heights (commit f9292b9, 08:54 UTC)".
pub(crate) const WHOLE_LEAST_FILTERS: usize = 4;

/// Up to one in this many filtering sections may miss a whole-class height (fewest misses first).
/// Measured: BENCHMARKS.md, "Now: flat splits with whole-class heights (commit f9292b9, 08:54
/// UTC)".
pub(crate) const WHOLE_TOLERANCE_SHARE: usize = 4;

/// The work of checking one candidate height against one section (a binary search), in subset-sum
/// entries (`SUMS_PER_NODE` make a node). Measured: BENCHMARKS.md, "Before: flat splits alone
/// (commit fd29ddb, rebuilt and run at 08:48 UTC, same load)".
pub(crate) const CHECK_COST: u64 = 8;

/// The most whole-class heights put next. Measured: BENCHMARKS.md, "Now: flat splits with whole-
/// class heights (commit f9292b9, 08:54 UTC)".
pub(crate) const WHOLE_HEIGHTS_LIMIT: usize = 1024;

/// The heights tried in the first round (lowest first), and the work limit of each; both double
/// every round. Measured: BENCHMARKS.md, "Before: flat splits alone (commit fd29ddb, rebuilt and
/// run at 08:48 UTC, same load)".
pub(crate) const SPARSE_FIRST_WINDOW: usize = 64;

/// See `SPARSE_FIRST_WINDOW`. Measured: BENCHMARKS.md, "Before: flat splits alone (commit fd29ddb,
/// rebuilt and run at 08:48 UTC, same load)".
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
