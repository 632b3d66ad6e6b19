//! Bi-level placement (`docs/technique.md` section 2): every device buffer of a schedule gets an offset in
//! ONE arena, every host slot an offset in the pinned host slab.
//!
//! - Lifetimes come from the instruction stream: a buffer is live from the first instruction
//!   that touches it to the last (list order). Parameters, gradients, optimizer state and the
//!   scalars persist across steps, so they are live over the whole step; inputs from the start.
//! - Level 1: each layer's forward transients and each layer's backward transients (recompute
//!   included) are placed inside their block. Blocks with the same requests (relative
//!   lifetimes and sizes) are solved once and share offsets, as MEMO reuses one layer's plan
//!   for every layer.
//! - Level 2: the whole step, with each block as one request of its level-1 peak, each rounding
//!   buffer as one request (its eleven tensors back to back), the model state as one request,
//!   and every other device buffer as itself.
//!
//! Offsets are multiples of [`ALIGNMENT`]. The two levels themselves are [`place_two_level`]
//! (module `levels`), which the C ABI's record/replay allocator uses too.

use alloc::collections::BTreeMap;
use alloc::vec::Vec;
use core::fmt;

use crate::lifetime::BufferLifetime;
use crate::plan::{Action, Buffer, BufferKind, Instruction, Place, PlacementSummary, Totals};
use crate::schedule::{Block, Phase, Schedule};
use memo_place::{SolveError, SolveOptions};

mod levels;
pub use levels::{place_two_level, Level2Request, TwoLevelPlacement};

/// Every offset, device or host, is a multiple of this: 256 bytes, the alignment `cudaMalloc`
/// and `hipMalloc` guarantee and vectorised kernels assume.
pub const ALIGNMENT: u64 = 256;

/// The placed buffers and what the placement reports.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// The schedule's buffers with their places.
    pub buffers: Vec<Buffer>,
    /// Sizes.
    pub totals: Totals,
    /// The level-1 forward block with the largest peak.
    pub level1_forward: PlacementSummary,
    /// The level-1 backward block with the largest peak.
    pub level1_backward: PlacementSummary,
    /// Level 2.
    pub level2: PlacementSummary,
    /// Distinct level-1 problems solved (blocks with equal requests share one).
    pub level1_problems: u32,
}

/// Why a schedule could not be placed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlacementError {
    /// The schedule has more instructions than a lifetime step can count (2^32 - 1).
    TooManyInstructions,
    /// A device buffer no instruction touches (a schedule bug: it would be placed nowhere).
    Unused {
        /// Its index.
        buffer: usize,
    },
    /// The arena solver failed.
    Solve(SolveError),
    /// A size sum does not fit in 64 bits.
    Overflow,
}

impl fmt::Display for PlacementError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlacementError::TooManyInstructions => f.write_str("the schedule has more than 2^32 - 1 instructions"),
            PlacementError::Unused { buffer } => {
                write!(f, "buffer #{buffer} is used by no instruction (a schedule bug; please report it)")
            }
            PlacementError::Solve(error) => write!(f, "arena placement failed: {error}"),
            PlacementError::Overflow => f.write_str("the buffers add up to more than 2^64 bytes"),
        }
    }
}

impl core::error::Error for PlacementError {}

impl From<SolveError> for PlacementError {
    fn from(error: SolveError) -> Self {
        PlacementError::Solve(error)
    }
}

/// Whether a buffer of this kind keeps its data across steps (live over the whole step).
pub fn persists_across_steps(kind: BufferKind) -> bool {
    matches!(kind, BufferKind::Parameter | BufferKind::Gradient | BufferKind::OptimizerState | BufferKind::Scalar)
}

/// `[first, last + 1)` instruction range of each buffer (`spec/validity.md`'s live-range rule),
/// `None` for untouched ones; persistent buffers span the whole step, inputs start at 0.
pub fn live_ranges(
    buffers: &[Buffer],
    instructions: &[Instruction],
) -> Result<Vec<Option<(u32, u32)>>, PlacementError> {
    let steps = u32::try_from(instructions.len()).map_err(|_| PlacementError::TooManyInstructions)?;
    if steps == u32::MAX {
        return Err(PlacementError::TooManyInstructions);
    }
    let mut ranges: Vec<Option<(u32, u32)>> = alloc::vec![None; buffers.len()];
    let mut touch = |buffer: usize, step: u32| {
        if let Some(range) = ranges.get_mut(buffer) {
            *range = Some(match *range {
                None => (step, step + 1),
                Some((first, _)) => (first, step + 1),
            });
        }
    };
    for (step, instruction) in instructions.iter().enumerate() {
        let step = step as u32;
        match &instruction.action {
            Action::Launch(launch) => launch.args.iter().for_each(|arg| touch(arg.region.buffer.index(), step)),
            Action::Copy { src, dst, .. } => {
                touch(src.buffer.index(), step);
                touch(dst.buffer.index(), step);
            }
            Action::Record(_) | Action::Wait(_) => {}
        }
    }
    for (range, buffer) in ranges.iter_mut().zip(buffers) {
        if persists_across_steps(buffer.kind) {
            *range = Some((0, steps.max(1)));
        } else if buffer.kind == BufferKind::Input {
            // Inputs hold data from the start; an untouched one is live at instruction 0 only.
            *range = Some(range.map_or((0, 1), |(_, end)| (0, end)));
        }
    }
    Ok(ranges)
}

/// Places `schedule`'s buffers with a node budget per solve.
pub fn place(schedule: &Schedule, budget_nodes: u64) -> Result<Placement, PlacementError> {
    let buffers = &schedule.buffers;
    let ranges = live_ranges(buffers, &schedule.instructions)?;
    let options = SolveOptions { alignment: ALIGNMENT, budget_nodes, ..SolveOptions::default() };
    // The two levels see every device buffer as a lifetime; host slots and untouched buffers
    // take no part (an untouched device buffer is refused below).
    let mut lifetimes = Vec::with_capacity(buffers.len());
    for (index, (buffer, range)) in buffers.iter().zip(&ranges).enumerate() {
        let (lower, upper) = range.unwrap_or((0, 0));
        let size = buffer.bytes().ok_or(PlacementError::Overflow)?;
        lifetimes.push(BufferLifetime { id: index as u64, lower, upper, size });
    }
    let live = |index: usize| ranges[index].map(|_| index).ok_or(PlacementError::Unused { buffer: index });

    // Level 1: each block's transients; level 2: the blocks, then single buffers, then the model
    // state and each rounding buffer as groups laid back to back.
    let mut blocks: BTreeMap<Block, Vec<usize>> = BTreeMap::new();
    for (index, block) in schedule.blocks.iter().enumerate() {
        if let Some(block) = block {
            blocks.entry(*block).or_default().push(live(index)?);
        }
    }
    let mut requests: Vec<Level2Request<()>> =
        blocks.values().map(|members| Level2Request::Block { key: (), members: members.clone() }).collect();
    let mut model_state = Vec::new();
    let mut rounding: [Vec<usize>; 2] = [Vec::new(), Vec::new()];
    for (index, buffer) in buffers.iter().enumerate() {
        if schedule.blocks[index].is_some() || buffer.kind == BufferKind::HostSlot {
            continue;
        }
        match buffer.kind {
            kind if persists_across_steps(kind) => model_state.push(live(index)?),
            BufferKind::RoundingBuffer => rounding[usize::from(buffer.slot.min(1))].push(live(index)?),
            _ => requests.push(Level2Request::Group(alloc::vec![live(index)?])),
        }
    }
    requests.extend([model_state].into_iter().chain(rounding).filter(|g| !g.is_empty()).map(Level2Request::Group));
    let two_level = levels::place_two_level(&lifetimes, &requests, &options, &options)?;

    // The largest level-1 block of each phase is the one a plan reports.
    let mut level1 = [PlacementSummary::default(); 2];
    for (block, problem) in blocks.keys().zip(&two_level.problem_of) {
        let Some(summary) = problem.map(|p| two_level.level1[p]) else { continue };
        let slot = &mut level1[usize::from(block.phase == Phase::Backward)];
        if summary.peak_bytes > slot.peak_bytes {
            *slot = summary;
        }
    }
    let mut placed = buffers.clone();
    for (buffer, offset) in placed.iter_mut().zip(&two_level.offsets) {
        if let Some(offset) = *offset {
            buffer.place = Place::Device { offset };
        }
    }
    let mut host_end = 0u64;
    for buffer in placed.iter_mut().filter(|b| b.kind == BufferKind::HostSlot) {
        buffer.place = Place::Host { offset: host_end };
        let aligned = buffer.bytes().and_then(|bytes| crate::lifetime::footprint(bytes, ALIGNMENT));
        host_end = host_end.checked_add(aligned.ok_or(PlacementError::Overflow)?).ok_or(PlacementError::Overflow)?;
    }
    let totals = totals(&placed, &ranges)?;
    Ok(Placement {
        buffers: placed,
        totals,
        level1_forward: level1[0],
        level1_backward: level1[1],
        level2: two_level.level2,
        level1_problems: two_level.level1.len() as u32,
    })
}

/// The plan's totals from placed buffers and their live ranges.
fn totals(buffers: &[Buffer], ranges: &[Option<(u32, u32)>]) -> Result<Totals, PlacementError> {
    let mut totals = Totals::default();
    let mut live_events: Vec<(u32, i128)> = Vec::new();
    for (buffer, range) in buffers.iter().zip(ranges) {
        let bytes = buffer.bytes().ok_or(PlacementError::Overflow)?;
        match buffer.place {
            Place::Device { offset } => {
                let end = offset.checked_add(bytes).ok_or(PlacementError::Overflow)?;
                totals.arena_bytes = totals.arena_bytes.max(end);
                if let Some((first, end)) = *range {
                    live_events.push((first, i128::from(bytes)));
                    live_events.push((end, -i128::from(bytes)));
                }
            }
            Place::Host { offset } => {
                totals.host_bytes = totals.host_bytes.max(offset.checked_add(bytes).ok_or(PlacementError::Overflow)?);
            }
        }
        let sum = |total: u64| total.checked_add(bytes).ok_or(PlacementError::Overflow);
        match buffer.kind {
            BufferKind::Parameter | BufferKind::Gradient | BufferKind::OptimizerState => {
                totals.parameter_bytes = sum(totals.parameter_bytes)?
            }
            BufferKind::RoundingBuffer => totals.rounding_buffer_bytes = sum(totals.rounding_buffer_bytes)?,
            _ => {}
        }
    }
    // Frees before allocations at the same step: ranges are half-open.
    live_events.sort_unstable();
    let mut live = 0i128;
    for (_, delta) in live_events {
        live += delta;
        totals.arena_lower_bound_bytes = totals.arena_lower_bound_bytes.max(u64::try_from(live).unwrap_or(u64::MAX));
    }
    Ok(totals)
}
