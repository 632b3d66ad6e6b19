//! The solver's tuning constants, in one place: node budgets and allowances, size and density limits,
//! the shares of a round. Each says why in one line; a section comment names the BENCHMARKS.md section
//! that measured the values below it by its heading's start ("not measured": a bound on work or memory).
//! `ARCHITECTURE.md` beside this crate lists them in a table, with the headings whole; a test holds it equal.

// lib.rs. Not measured (bounds on time and memory) but `EXACT_SEARCH_MAX_BUFFERS` and `REPAIR_FIRST_*`:
// BENCHMARKS.md, "Exact search on 1,000-3,000 buffers".
/// The exact search's default node budget, shared by a solve's components: a few seconds at most.
pub const DEFAULT_BUDGET_NODES: u64 = 2_000_000;
/// Larger components go to `repair` alone: a search node costs time linear in the component.
pub(crate) const EXACT_SEARCH_MAX_BUFFERS: usize = 4096;
/// Larger searched components get a share of `repair` first: it settles some the search takes seconds on.
pub(crate) const REPAIR_FIRST_BUFFERS: usize = 600;
/// That share, per buffer: the repair's peak-first starts (64) and 256 of its rounds.
pub(crate) const REPAIR_FIRST_NODES_PER_BUFFER: u64 = 320;
/// A graph-free leaf's repair before the classic orders over the tree, per buffer: the starts alone.
pub(crate) const REPAIR_BEFORE_ORDERS_PER_BUFFER: u64 = 64;
/// Denser components get no overlap graph (about 8 bytes a pair), only the graph-free sweeps and repair.
pub(crate) const OVERLAP_PAIR_LIMIT: usize = 40_000_000;
/// Denser whole instances run the classic orders over a tree of lifetimes, after the leaves' search (64 MB).
pub(crate) const WHOLE_GREEDY_PAIR_LIMIT: usize = 8_000_000;
/// Shuffled tie-break orders the search restarts with, besides the three heuristic ones.
pub(crate) const SEARCH_RESTART_SHUFFLES: usize = 29;
/// First round's restart node limit per buffer (doubling a round): the searches' tail is heavy.
pub(crate) const SEARCH_FIRST_LIMIT_PER_BUFFER: u64 = 4;
/// First descent round's allowance per buffer and search (fourfold a round): the first peaks come in ms.
pub(crate) const DESCENT_FIRST_NODES_PER_BUFFER: u64 = 64;
/// Unsettled searches a descent round allows before the next round starts again from the goal.
pub(crate) const DESCENT_UNSETTLED_PROBES: u32 = 3;

// lib.rs. BENCHMARKS.md, "Nineteenth pass"; `BOUNDS_SHARE`: "Seventeenth pass"; `FILLED_BOUNDS_SHARE`: "Eighteenth
// pass"; `FILLERS_PER_BUFFER`: "Second pass"; `NEAR_PERFECT_BUFFERS_PER_FILLER`: "Fifteenth pass".
/// Tiling states per restart node with which a zero-slack search past its first round tightens its domains.
pub(crate) const TIGHTEN_PER_RESTART_NODE: u64 = 64;
/// The bounds search's nodes per node of a round's restarts: its nodes cost more and settle cores with few.
pub(crate) const BOUNDS_SHARE: u64 = 8;
/// A filled instance's bounds search's nodes per node of its window modules' search.
pub(crate) const FILLED_BOUNDS_SHARE: u64 = 4;
/// `BOUNDS_SHARE` of each bounds search of a component with slack in the `Bounds` mix (they run first).
pub(crate) const BOUNDS_MIX_SHARE: u64 = 32;
/// `FILLED_BOUNDS_SHARE` in the `Restarts` mix, which runs no bounds search on a leaf with slack.
pub(crate) const RESTARTS_FILLED_BOUNDS_SHARE: u64 = 8;
/// `BOUNDS_SHARE` at zero slack in the `Bounds` mix: small, so that the restarts (which place pinwheels) come sooner.
pub(crate) const BOUNDS_MIX_ZERO_SLACK_SHARE: u64 = 2;
/// At most one filler per this many buffers: with more, the capacity is far from zero slack.
pub(crate) const FILLERS_PER_BUFFER: usize = 4;
/// Filled instances with this many buffers per filler are near perfect: their flat splits get all the budget.
pub(crate) const NEAR_PERFECT_BUFFERS_PER_FILLER: usize = 25;

// bounds.rs and control.rs. Not measured: the budget counts work, and the stop callback is polled often.
/// Set members scanned (and buffers scanned or narrowed) per bounds search node.
pub(crate) const BOUNDS_WORK_PER_NODE: u64 = 64;
/// Components with a larger section are not bounds-searched: the rules are cubic in a section's buffers.
pub(crate) const BOUNDS_MOST_BUFFERS: usize = 128;
/// Work between two chargings to the budget inside one propagation, so a long one still polls the callback.
pub(crate) const BOUNDS_CHARGE_EVERY: u64 = 16 * BOUNDS_WORK_PER_NODE;
/// Nodes between two polls of the callback (a clock read costs a few percent at most).
pub(crate) const POLL_EVERY: u64 = 16;

// domains.rs. BENCHMARKS.md, "Fifth pass" (the domains) and "Fifteenth pass" (the tilings).
/// Sections per buffer (the sparsest) whose subset sums are intersected.
pub(crate) const DOMAIN_SECTIONS: usize = 4;
/// The most other buffers of a section whose subset sums are enumerated (2^12 sums).
pub(crate) const DOMAIN_MOST_OTHERS: usize = 12;
/// Larger domains are dropped: they prune little and cost memory.
pub(crate) const DOMAIN_MOST_VALUES: usize = 1 << 14;
/// Larger sections are not tiled: a set placed is a 64-bit mask, all ones an empty `MaskTable` slot.
pub(crate) const TILING_MOST_BUFFERS: usize = 63;
/// Domains of at most this many values are listed by offset for the tilings, larger ones asked one by one.
pub(crate) const TILING_LISTED_VALUES: usize = 64;
/// Sections with more unlisted domains are not tiled: nearly every order tiles them, narrowing nothing.
pub(crate) const TILING_MOST_UNLISTED: usize = 12;
/// States a section's tiling may visit in the first round (fourfold a round, up to `TILING_SECTION_WORK`).
pub(crate) const TILING_FIRST_SECTION_WORK: u64 = 1024;
/// The most states one section's tiling may visit.
pub(crate) const TILING_SECTION_WORK: u64 = 65536;
/// Tiling states per buffer when the domains are made; longer searches tighten them further.
pub(crate) const TILING_FIRST_WORK_PER_BUFFER: u64 = 64;

// fillers.rs. Measured: BENCHMARKS.md, "Twenty-first pass: fillers cut anew where a part fails (60 of 60 at 1 s)".
/// The most fillers open at once for [`fewest`]: it branches over their subsets (`2^OPEN_MOST`).
pub(crate) const OPEN_MOST: usize = 10;

// greedy.rs. BENCHMARKS.md, "`memo solve --time-limit` on 100k buffers".
/// Buffers placed between two polls of the callback: 2,048 of a 100k-buffer sweep take about 3 ms.
pub(crate) const GREEDY_POLL_EVERY: usize = 2048;
/// Overlapping pairs an overlap graph build files between two polls of the stop callback.
pub(crate) const PAIRS_PER_POLL: usize = 1 << 20;

// modules.rs. Measured: BENCHMARKS.md, "Fourteenth pass: window modules".
/// Larger components are not scanned for modules: the scan is quadratic in their sections.
pub(crate) const MODULE_MOST_SECTIONS: usize = 1024;
/// Modules nested deeper are not looked for: this bounds the recursion's stack.
pub(crate) const MODULE_DEPTH_LIMIT: u32 = 8;
/// Modules are used only where the rest keeps at most this share (percent) of the component's buffers.
pub(crate) const MODULE_REST_MOST_PERCENT: usize = 50;

// portfolio.rs. Measured: BENCHMARKS.md, "Nineteenth pass: search mixes side by side".
/// A worker asks the caller's callback, under the lock, at one of this many of its polls.
#[cfg(feature = "std")]
pub(crate) const POLLS_PER_SHARED_POLL: u32 = 8;

// refuted.rs. Measured: BENCHMARKS.md, "Fifth pass: the section bound by levels, zero-slack domains, ...".
/// The most fingerprints kept (16 bytes each, in a table at most twice that size: 32 MiB).
pub(crate) const REFUTED_MOST: usize = 1 << 20;
/// Slots in a new table (it doubles when half full).
pub(crate) const REFUTED_FIRST_SLOTS: usize = 1 << 10;

// repair.rs. Measured: BENCHMARKS.md, "Second pass" (rounds) and "Third pass" (peak-first starts).
/// The most rounds for one component (each costs one node per buffer).
pub(crate) const REPAIR_MOST_ROUNDS: u32 = 4096;
/// Steps tried by the peak-first starts.
pub(crate) const PEAK_FIRST_STEPS: usize = 8;

// search.rs. Measured: BENCHMARKS.md, "Fifth pass: the section bound by levels, zero-slack domains, ...".
/// Larger sections skip the bound by levels and, in higher valleys, the count of fills: their sort cost more.
pub(crate) const LEVELS_MOST_BUFFERS: usize = 48;

// split/flow.rs and split/mod.rs. Measured: BENCHMARKS.md, "Before: flat splits alone (commit fd29ddb, ...)"; the
// `REFILL_*` ones: "Twenty-first pass: fillers cut anew where a part fails".
/// The flow attempts tried in the first round (doubling a round).
pub(crate) const FLOW_FIRST_WINDOW: usize = 16;
/// The work limit of each flow attempt in the first round (doubling a round).
pub(crate) const FLOW_FIRST_LIMIT_PER_ATTEMPT: u64 = 512;
/// Flat subsets tried per component before it goes to the exact search whole.
pub(crate) const SPLIT_TRIES: usize = 4;
/// Each flat-subset search's work in a component's first round (fourfold a round, up to `FIND_WORK`).
pub(crate) const FIND_FIRST_WORK: u64 = 2048;
/// The largest work allowance of one round.
pub(crate) const FIND_WORK: u64 = 262_144;
/// Nodes per buffer of the component that the parts cut anew with other fillers may take in all.
pub(crate) const REFILL_WORK_PER_BUFFER: u64 = 4096;
/// Nodes per buffer of a part for each set of fillers in the first round (fourfold a round).
pub(crate) const REFILL_FIRST_WORK_PER_BUFFER: u64 = 256;
/// The most sets of fillers a part is tried with when cut anew.
pub(crate) const REFILL_VARIANTS: usize = 8;
/// Steps the search for a part's sets of fewest fillers may take (`fillers::fewest`).
pub(crate) const REFILL_FEWEST_WORK: u64 = 1 << 16;
/// Nodes the exact search may take on a part that does not split.
pub(crate) const PART_SEARCH_WORK: u64 = 50_000;
/// The most distinct subset sums kept per group of buffers.
pub(crate) const SUBSET_SUMS_LIMIT: usize = 1 << 12;
/// Splits nested deeper go to the exact search (bounds the recursion).
pub(crate) const SPLIT_DEPTH_LIMIT: u32 = 64;
/// Subset-sum entries merged per node charged.
pub(crate) const SUMS_PER_NODE: u64 = 64;
/// Nodes one subset-sum witness (`pick`) may take.
pub(crate) const PICK_WORK: u64 = 10_000;
/// The largest bitset of a group's subset sums (`Group::has_amount`): 512 KiB.
pub(crate) const ALL_SUMS_MOST_BITS: u64 = 1 << 22;

// split/pinwheel.rs. Measured: BENCHMARKS.md, "Twentieth pass: pinwheel splits (59 of 60 at 1 s)".
/// Flat subsets taken from each side's searches per boundary pair.
pub(crate) const SIDE_TRIES: usize = 8;
/// Nodes of each side's searches per pair in the first round over the pairs (fourfold a round).
pub(crate) const SIDE_FIRST_WORK: u64 = 512;
/// Nodes per try of the search sharing out the buffers between the two boundaries.
pub(crate) const MIDDLE_WORK: u64 = 4096;
/// Nodes per buffer for all the outer pieces' searches: a component that is no pinwheel leaves the rest.
pub(crate) const PINWHEEL_WORK_PER_BUFFER: u64 = 2048;

// split/sparse.rs. Measured: BENCHMARKS.md, "Before: flat splits alone (commit fd29ddb, ...)"; the `WHOLE_*` ones:
// "Now: flat splits with whole-class heights".
/// Sections (the sparsest after the chosen one) whose subset sums filter the heights.
pub(crate) const FILTER_SECTIONS: usize = 8;
/// A filtering section's sums must all be known within this many.
pub(crate) const FILTER_SUMS_LIMIT: usize = 1 << 16;
/// Larger sections filter nothing (their sums are too many to be known).
pub(crate) const FILTER_MOST_BUFFERS: usize = 16;
/// Filtering stops when this few heights are left.
pub(crate) const FILTERED_ENOUGH: usize = 16;
/// The most subset sums of the chosen section computed (the smallest).
pub(crate) const HEIGHTS_LIMIT: usize = 1 << 16;
/// The most heights tried (the lowest): crowded sections allow nearly any; the flow search covers them.
pub(crate) const HEIGHTS_TRIED_LIMIT: usize = 4096;
/// Time windows whose sparsest sections' sums of whole lifetime classes filter the heights put next.
pub(crate) const WHOLE_FILTER_SECTIONS: usize = 16;
/// Sections with more lifetime classes do not filter whole-class heights.
pub(crate) const WHOLE_MOST_CLASSES: usize = 18;
/// At least this many sections must filter whole-class heights, else there are none.
pub(crate) const WHOLE_LEAST_FILTERS: usize = 4;
/// Up to one in this many filtering sections may miss a whole-class height (fewest misses first).
pub(crate) const WHOLE_TOLERANCE_SHARE: usize = 4;
/// The work (subset-sum entries) of checking one height against one section by binary search.
pub(crate) const CHECK_COST: u64 = 8;
/// The most whole-class heights put next.
pub(crate) const WHOLE_HEIGHTS_LIMIT: usize = 1024;
/// The heights tried in the first round, lowest first (doubling a round).
pub(crate) const SPARSE_FIRST_WINDOW: usize = 64;
/// The work limit of each height in the first round (doubling a round).
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
