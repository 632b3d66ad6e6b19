//! The replay plan: what the k-th allocation request of an iteration gets, made by placing one
//! recorded iteration's trace: bi-level when the trace has block markers ([`super::blocks`]),
//! else as one instance.

use memo_place::check::check_placement;
use memo_place::lifetime::footprint;
use memo_place::{lower_bound, solve, BufferLifetime, SolveOptions};
use memo_plan_core::parse_trace;
use memo_plan_core::trace::{Trace, TraceFormat};

use super::blocks::{block_spans, place_bilevel, BlockSpan};
use crate::placement::solve_error;
use crate::status::{CapiError, MemoStatus};

/// The smallest alignment a plan may use: device pointers must be at least as aligned as
/// `cudaMalloc`'s (256 bytes), which kernels rely on. The same as the planner's alignment.
pub const MEMO_MIN_DEVICE_ALIGNMENT: u64 = 256;
// A literal, not `memo_plan_core::bilevel::ALIGNMENT`, so that cbindgen can write it into the C
// header; held to the planner's constant here.
const _: () = assert!(MEMO_MIN_DEVICE_ALIGNMENT == memo_plan_core::bilevel::ALIGNMENT);

/// The alignment plans use by default: PyTorch's caching allocator rounds every block to 512
/// bytes, so a recorded trace placed at 512 is comparable with what it reserves.
pub const MEMO_DEFAULT_REPLAY_ALIGNMENT: u64 = 512;

/// What one allocation request of an iteration gets in replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// `size` bytes at `offset` in the arena (freed within the recorded iteration).
    Arena {
        /// The request's size in bytes.
        size: u64,
        /// Its planned offset in the arena.
        offset: u64,
    },
    /// `size` bytes from the device allocator: the recorded iteration never freed this buffer, so
    /// it outlives the iteration (parameters' gradients, optimizer state, a kept loss) and has no
    /// place in a per-iteration plan.
    Device {
        /// The request's size in bytes.
        size: u64,
    },
}

impl Slot {
    /// The request size this slot expects.
    pub fn size(&self) -> u64 {
        match *self {
            Slot::Arena { size, .. } | Slot::Device { size } => size,
        }
    }
}

/// A plan for replaying one iteration's allocation requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayPlan {
    /// One slot per allocation request of size > 0, in request order.
    pub slots: Vec<Slot>,
    /// The arena the plan needs (the placement's peak), in bytes.
    pub arena_bytes: u64,
    /// The most bytes the arena buffers ever have alive at once (footprints).
    pub lower_bound: u64,
    /// Whether no placement of the arena buffers has a lower peak (proven).
    pub optimal: bool,
    /// The alignment of every offset.
    pub alignment: u64,
    /// Block instances placed at level 1 (0: the iteration was placed as one instance).
    pub block_instances: u64,
    /// Distinct level-1 problems solved for them (instances with the same key and requests
    /// share one).
    pub level1_problems: u64,
}

impl ReplayPlan {
    /// Parses MEMO's text form of one iteration's trace, with its block markers, and plans it.
    pub fn from_text(text: &[u8], options: &SolveOptions) -> Result<ReplayPlan, CapiError> {
        let trace = parse_trace(text).map_err(|e| CapiError::new(MemoStatus::InvalidTrace, e.to_string()))?;
        let spans = if trace.format == TraceFormat::MemoText { block_spans(text)? } else { Vec::new() };
        ReplayPlan::from_trace(&trace, &spans, options)
    }

    /// Plans one iteration's trace: buffers it frees go into one arena, placed by the solver
    /// (minimising the peak, or under `options.capacity`): bi-level over the block instances
    /// `spans` (request spans, disjoint, in order) when there are any, as one instance when not;
    /// buffers it never frees get device slots; zero-size buffers get no slot (zero-size requests
    /// get NULL and take no position). A bi-level solve that misses the capacity is retried flat,
    /// whose failure is the one reported (bi-level placement is a restriction: its failure
    /// proves nothing).
    pub fn from_trace(trace: &Trace, spans: &[BlockSpan], options: &SolveOptions) -> Result<ReplayPlan, CapiError> {
        if trace.format != TraceFormat::MemoText {
            return Err(CapiError::new(
                MemoStatus::InvalidTrace,
                "replay needs a trace in MEMO's malloc/free text form: the CSV form does not say in which order the requests came",
            ));
        }
        let alignment = options.alignment;
        if alignment < MEMO_MIN_DEVICE_ALIGNMENT || !alignment.is_power_of_two() {
            return Err(CapiError::new(
                MemoStatus::InvalidArgument,
                format!(
                    "alignment {alignment}: the allocator hands out device pointers, so offsets must be aligned to a power of two of at least {MEMO_MIN_DEVICE_ALIGNMENT} bytes (default {MEMO_DEFAULT_REPLAY_ALIGNMENT})"
                ),
            ));
        }
        // The text form lists buffers in the order of their mallocs: the request order.
        let mut slots = Vec::with_capacity(trace.buffers.len());
        let mut arena_buffers: Vec<BufferLifetime> = Vec::new();
        let mut arena_slot: Vec<usize> = Vec::new();
        for buffer in trace.buffers.iter().filter(|b| b.size > 0) {
            // A buffer lives to the end of a text trace exactly when it was never freed.
            if buffer.upper == trace.steps {
                slots.push(Slot::Device { size: buffer.size });
            } else {
                arena_slot.push(slots.len());
                arena_buffers.push(*buffer);
                slots.push(Slot::Arena { size: buffer.size, offset: 0 });
            }
        }
        let bilevel = if spans.is_empty() { None } else { place_bilevel(&arena_buffers, spans, options).ok() };
        let (offsets, peak, optimal, block_instances, level1_problems, lower) = match bilevel {
            Some(placed) => {
                let lower = lower_bound(&arena_buffers, alignment);
                (placed.offsets, placed.peak, placed.peak == lower, placed.instances, placed.level1_problems, lower)
            }
            None => {
                let solution = solve(&arena_buffers, options).map_err(|e| solve_error(&e))?;
                (solution.offsets, solution.peak, solution.optimal, 0, 0, solution.lower_bound)
            }
        };
        // The solver's answer is checked independently before anything is handed out from it.
        check_placement(&arena_buffers, &offsets, alignment, peak, options.capacity).map_err(|violations| {
            let first = violations.first().map(ToString::to_string).unwrap_or_default();
            CapiError::new(
                MemoStatus::Internal,
                format!("the planned placement failed the checker (a bug, please report it): {first}"),
            )
        })?;
        for (&slot, &offset) in arena_slot.iter().zip(&offsets) {
            if let Slot::Arena { size, .. } = slots[slot] {
                slots[slot] = Slot::Arena { size, offset };
            }
        }
        Ok(ReplayPlan {
            slots,
            arena_bytes: peak,
            lower_bound: lower,
            optimal,
            alignment,
            block_instances,
            level1_problems,
        })
    }

    /// The bytes a slot of `size` occupies in the arena.
    pub fn footprint(&self, size: u64) -> u64 {
        // Sizes in a plan passed the solver, which refuses footprints past 2^64.
        footprint(size, self.alignment).unwrap_or(u64::MAX)
    }
}

/// Solver options for a replay plan: `alignment` 0 or 1 ("none", which device pointers cannot
/// have) means [`MEMO_DEFAULT_REPLAY_ALIGNMENT`].
pub fn replay_solve_options(capacity: Option<u64>, alignment: u64, budget_nodes: u64) -> SolveOptions {
    SolveOptions {
        capacity,
        alignment: if alignment <= 1 { MEMO_DEFAULT_REPLAY_ALIGNMENT } else { alignment },
        budget_nodes,
        ..SolveOptions::default()
    }
}
