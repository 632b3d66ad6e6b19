//! Harness for the checker's power: a valid planner plan with ONE corruption must be rejected.
//!
//! A case is a request from [`super::plan::request`] (planned, and checked valid first), a
//! [`Mutation`] kind and two numbers that pick its target. [`mutate`] applies the corruption only
//! where the plan's semantics (`plan/mod.rs`, `spec/validity.md`) forbid the result, and returns
//! `None` when the plan has no such target (a plan without swaps has no swap-in to drop):
//! - [`Mutation::ShiftOffset`]: a device buffer moves onto bytes of another device buffer whose
//!   live range meets its own (same first byte, or one byte shared at either end). Live ranges
//!   are taken as first touch to last touch, which the spec's live range contains, so the two
//!   are live together: an `Overlap` naming both;
//! - [`Mutation::DropWait`]: a Wait is removed, where that leaves two accesses of the same bytes
//!   on different streams, at least one a write, unordered by happens-before. The pair is found
//!   by [`unordered_conflict`], a pairwise search that shares nothing with the checker's
//!   byte-segment simulation; Waits whose removal leaves every conflict ordered (through other
//!   events) are not corruptions and are skipped. The checker must report a `Race`, a
//!   `ReadNotReady` or a `ReadClobbered` (by transitivity, some access on the path between the
//!   pair is then unordered);
//! - [`Mutation::MoveRecordAfterWait`]: an event's Record moves to just after one of its Waits,
//!   or later: `WaitBeforeRecord` at that Wait;
//! - [`Mutation::ShrinkArena`]: `totals.arena_bytes` drops by 1 to all of it: the highest device
//!   buffer leaves the arena (`OutsideArena`);
//! - [`Mutation::DropSwapIn`]: a host-to-device copy is removed, where an access reads bytes it
//!   wrote before anything else writes them, and would read another launch's data without it
//!   ([`stale_read_without`]); see the caveat below;
//! - [`Mutation::RowsPastEnd`]: one launch argument's row range ends 1 to 64 rows past its
//!   buffer: `RowsOutOfBounds` at that launch;
//! - [`Mutation::ChangeTotal`]: one of the five totals changes by a non-zero amount:
//!   `TotalMismatch` of that total;
//! - [`Mutation::SwapInOtherLayer`], [`Mutation::SwapInOtherTensor`],
//!   [`Mutation::SwapInShiftedRows`], [`Mutation::SwapInRelabelled`]: a swap-in restores other
//!   rows than its layer's backward needs, every event in place (`swap_identity.rs` says how):
//!   a `SwapSlotMismatch` or `SwapDeviceMismatch` at the swap-in, or, relabelled, a
//!   `SwappedInForOtherLayer` at the launch that reads the rows;
//! - [`Mutation::Malform`]: one of the structural rules broken, each with its own variant: a
//!   buffer's size overflows, a buffer in the wrong space, an argument naming no buffer, an event
//!   out of range, a launch with an argument too many or too few, a wrong access mark, a launch
//!   off the compute stream or on a host slot, a copy between two device buffers, on the wrong
//!   stream or of unequal sizes, an event recorded twice, a Wait whose Record is gone.
//!
//! What [`check`] asserts: the request plans and the plan passes the checker; the mutated plan
//! does not, and its violations include the [`Expected`] one.
//!
//! A dropped swap-in: a rounding buffer is one set of buffer ids shared by alternating layers, so
//! the bytes a swap-in would restore still hold layer `l + 2`'s data, written by the same buffer
//! ids and ordered before layer `l`'s backward; the stale read itself looks ready. The checker
//! rejects it through its other symptom: the host slot swapped out and never read back
//! (`HostWriteNeverRead`, rule 4b of `spec/validity.md`). [`mutate`] drops a swap-in only where
//! that changes which launch's data a later read sees (the corruption is real).
//!

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

mod swap_identity;

use arbitrary::{Arbitrary, Result, Unstructured};

use super::plan::{checked_plan, describe, request};
use crate::check::plan::Total;
use crate::check::{check_plan, PlanViolation};
use crate::plan::{Action, BufferId, Place, Plan, Region, Strategy, Stream, STREAMS};
use crate::planner::PlanRequest;

/// One kind of corruption (the module docs say what each does and why it is one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mutation {
    /// Move a device buffer onto a buffer live at the same time.
    ShiftOffset,
    /// Remove a Wait that orders two conflicting accesses.
    DropWait,
    /// Move an event's Record after one of its Waits.
    MoveRecordAfterWait,
    /// Make `totals.arena_bytes` smaller.
    ShrinkArena,
    /// Remove a host-to-device copy whose bytes are read.
    DropSwapIn,
    /// Make a launch argument's rows end past its buffer.
    RowsPastEnd,
    /// Change one total.
    ChangeTotal,
    /// Break one structural rule (rules 1 and 2 of `spec/validity.md`); `detail` picks which.
    Malform,
    /// A swap-in reads another layer's slot of the same tensor (rule 8).
    SwapInOtherLayer,
    /// A swap-in reads a slot of another tensor of the same layer (rule 8).
    SwapInOtherTensor,
    /// A swap-in restores its rows shifted (rule 8).
    SwapInShiftedRows,
    /// A swap-in reads another layer's slot and names that layer (rule 8, reading side).
    SwapInRelabelled,
    /// Remove a Wait on the collective stream, or compute's Wait for a collective, that orders
    /// two conflicting accesses (rules 4 and 5: a collective's input or output unordered).
    DropCollectiveWait,
    /// Rank 1 runs its own program: the shared one with two different collectives swapped
    /// (rule 9).
    ReorderCollectives,
    /// Rank 1 runs the shared program with one collective's first argument a row shorter or
    /// longer (rule 9).
    ResizeCollective,
    /// Rank 1 runs the shared program without one of its collectives (rule 9).
    SkipCollective,
    /// An all-gather's output or a reduce-scatter's input a row short (rule 9's sizes).
    MisSizeCollective,
    /// One context rank's program (c > 1) without one of its `ring_exchange`s (rule 9's ring).
    DropRingExchange,
    /// One `ring_exchange` of one context rank's program a row shorter, both sides (rule 9's
    /// ring: what it sends no longer meets what the next rank receives).
    ResizeRingExchange,
    /// Two data-group all-reduces of different sizes swapped in one context rank's program (rule
    /// 9: the data group's collectives in the same order everywhere).
    ReorderDataCollectives,
    /// Compute's Wait for a ring exchange before it reads the received K/V or accumulators
    /// removed (rules 4 and 5).
    DropRingWait,
}

impl Mutation {
    /// Every kind.
    pub const ALL: [Mutation; 21] = [
        Mutation::ShiftOffset,
        Mutation::DropWait,
        Mutation::MoveRecordAfterWait,
        Mutation::ShrinkArena,
        Mutation::DropSwapIn,
        Mutation::RowsPastEnd,
        Mutation::ChangeTotal,
        Mutation::Malform,
        Mutation::SwapInOtherLayer,
        Mutation::SwapInOtherTensor,
        Mutation::SwapInShiftedRows,
        Mutation::SwapInRelabelled,
        Mutation::DropCollectiveWait,
        Mutation::ReorderCollectives,
        Mutation::ResizeCollective,
        Mutation::SkipCollective,
        Mutation::MisSizeCollective,
        Mutation::DropRingExchange,
        Mutation::ResizeRingExchange,
        Mutation::ReorderDataCollectives,
        Mutation::DropRingWait,
    ];

    /// The context-parallel kinds (rules 4, 5 and 9 at `c > 1`, `spec/context-parallel.md`).
    pub const CONTEXT: [Mutation; 4] = [
        Mutation::DropRingExchange,
        Mutation::ResizeRingExchange,
        Mutation::ReorderDataCollectives,
        Mutation::DropRingWait,
    ];

    /// The collective kinds (rules 4, 5 and 9 at `t > 1`).
    pub const COLLECTIVE: [Mutation; 5] = [
        Mutation::DropCollectiveWait,
        Mutation::ReorderCollectives,
        Mutation::ResizeCollective,
        Mutation::SkipCollective,
        Mutation::MisSizeCollective,
    ];

    /// The swap-identity kinds (rule 8 of `spec/validity.md`).
    pub const SWAP_IDENTITY: [Mutation; 4] = [
        Mutation::SwapInOtherLayer,
        Mutation::SwapInOtherTensor,
        Mutation::SwapInShiftedRows,
        Mutation::SwapInRelabelled,
    ];

    /// A short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Mutation::ShiftOffset => "shift_offset",
            Mutation::DropWait => "drop_wait",
            Mutation::MoveRecordAfterWait => "move_record_after_wait",
            Mutation::ShrinkArena => "shrink_arena",
            Mutation::DropSwapIn => "drop_swap_in",
            Mutation::RowsPastEnd => "rows_past_end",
            Mutation::ChangeTotal => "change_total",
            Mutation::Malform => "malform",
            Mutation::SwapInOtherLayer => "swap_in_other_layer",
            Mutation::SwapInOtherTensor => "swap_in_other_tensor",
            Mutation::SwapInShiftedRows => "swap_in_shifted_rows",
            Mutation::SwapInRelabelled => "swap_in_relabelled",
            Mutation::DropCollectiveWait => "drop_collective_wait",
            Mutation::ReorderCollectives => "reorder_collectives",
            Mutation::ResizeCollective => "resize_collective",
            Mutation::SkipCollective => "skip_collective",
            Mutation::MisSizeCollective => "mis_size_collective",
            Mutation::DropRingExchange => "drop_ring_exchange",
            Mutation::ResizeRingExchange => "resize_ring_exchange",
            Mutation::ReorderDataCollectives => "reorder_data_collectives",
            Mutation::DropRingWait => "drop_ring_wait",
        }
    }
}

/// One fuzz case.
#[derive(Clone, Debug)]
pub struct MutateCase {
    /// What to plan.
    pub request: PlanRequest,
    /// The corruption.
    pub mutation: Mutation,
    /// Picks the target: an index into the kind's candidates, modulo their number.
    pub target: u32,
    /// Picks how: a shift, a row count, an amount; each kind reduces it to its own range.
    pub detail: u64,
}

impl<'a> Arbitrary<'a> for MutateCase {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let mutation = *u.choose(&Mutation::ALL)?;
        let target = u.arbitrary()?;
        let detail: u64 = u.arbitrary()?;
        let mut request = request(u)?;
        let needs_events = match mutation {
            Mutation::DropWait | Mutation::MoveRecordAfterWait | Mutation::DropSwapIn => true,
            // Another layer's slot needs two swapped layers: four layers at least.
            Mutation::SwapInOtherLayer | Mutation::SwapInRelabelled => {
                request.model.layers = request.model.layers.max(4);
                true
            }
            Mutation::SwapInOtherTensor | Mutation::SwapInShiftedRows => true,
            // The structural corruptions of events and copies.
            Mutation::Malform => matches!(detail % 13, 3 | 8..=12),
            _ => false,
        };
        if Mutation::COLLECTIVE.contains(&mutation) && request.parallel.tensor == 1 {
            // Collectives come with t > 1: double what t must divide (hidden stays heads * d;
            // the key/value heads double with the query heads, so 2 divides them too).
            let m = &mut request.model;
            request.parallel.tensor = 2;
            (m.heads, m.hidden, m.ffn_hidden, m.seq_len) = (2 * m.heads, 2 * m.hidden, 2 * m.ffn_hidden, 2 * m.seq_len);
            m.kv_heads *= 2;
            // A measured layer time was drawn for the other shape.
            request.hardware.measured_layer_forward_s = None;
            // The drawn nodes held d groups of the old t: one group alone, without context
            // parallelism, sits anywhere (a group of c ranks of the new t may outgrow a node).
            (request.parallel.data, request.parallel.context, request.nodes.count) = (1, 1, 1);
        }
        if Mutation::CONTEXT.contains(&mutation) && request.parallel.context == 1 {
            // The ring comes with c > 1: two context ranks of one tensor-parallel rank each (t = 1
            // divides every width), on one node, with a link for the ring; the sequence rounded
            // up to the 2 c t chunks.
            request.parallel = crate::model::Parallelism::new(1, 1).with_context(2);
            request.nodes.count = 1;
            // A one-GPU machine gets a second GPU in its node for the second context rank.
            request.hardware.gpus_per_node = request.hardware.gpus_per_node.max(2);
            request.model.seq_len = request.model.seq_len.next_multiple_of(4);
            if request.interconnect.bytes_per_s == 0 {
                request.interconnect = crate::model::Interconnect { bytes_per_s: 100_000_000_000, latency_ns: 5_000 };
            }
            // A measured layer time was drawn for the other shape.
            request.hardware.measured_layer_forward_s = None;
        }
        if needs_events {
            // Events and swap-ins come with swapping: layers 0 .. n-3 of memo and full-swap plans.
            request.model.layers = request.model.layers.max(3);
            request.strategy = match request.strategy {
                Strategy::KeepAll => Strategy::Memo,
                Strategy::FullRecompute => Strategy::FullSwap,
                other => other,
            };
        }
        Ok(MutateCase { request, mutation, target, detail })
    }
}

/// What the checker must report about a mutated plan: one of these violations at least.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expected {
    /// An `Overlap` naming these two buffers (in either order).
    Overlap(BufferId, BufferId),
    /// A `Race`, `ReadNotReady` or `ReadClobbered` (the conflict [`unordered_conflict`] found is
    /// between instructions `.0` and `.1` of the mutated plan).
    Unordered(usize, usize),
    /// A `WaitBeforeRecord` at this Wait.
    WaitBeforeRecord(usize),
    /// An `OutsideArena` (and a `TotalMismatch` of `arena_bytes`).
    OutsideArena,
    /// A `RowsOutOfBounds` at this instruction.
    RowsOutOfBounds(usize),
    /// A `TotalMismatch` of this total.
    TotalMismatch(Total),
    /// A read that sees other data than in the valid plan: instruction `.0` of the mutated plan
    /// reads what launch `.1` computed (`None`: bytes no instruction wrote). The checker is not
    /// required to see it (module docs).
    StaleRead(usize, Option<usize>),
    /// A violation of this name ([`PlanViolation::name`]) at this instruction (`None`: one
    /// without an instruction).
    Variant(&'static str, Option<usize>),
    /// A `SwapSlotMismatch` or `SwapDeviceMismatch` at this copy.
    SwapIdentity(usize),
}

impl Expected {
    /// Whether `violations` contain what this expects.
    pub fn found_in(&self, violations: &[PlanViolation]) -> bool {
        violations.iter().any(|v| match (self, v) {
            (Expected::Overlap(a, b), PlanViolation::Overlap { first, second, .. }) => {
                (first.id, second.id) == (*a, *b) || (first.id, second.id) == (*b, *a)
            }
            (
                Expected::Unordered(..),
                PlanViolation::Race { .. } | PlanViolation::ReadNotReady { .. } | PlanViolation::ReadClobbered { .. },
            ) => true,
            (Expected::WaitBeforeRecord(at), PlanViolation::WaitBeforeRecord { instruction, .. }) => instruction == at,
            (Expected::OutsideArena, PlanViolation::OutsideArena { .. }) => {
                violations.iter().any(|v| matches!(v, PlanViolation::TotalMismatch { total: Total::ArenaBytes, .. }))
            }
            (Expected::RowsOutOfBounds(at), PlanViolation::RowsOutOfBounds { instruction, .. }) => instruction == at,
            (Expected::TotalMismatch(want), PlanViolation::TotalMismatch { total, .. }) => total == want,
            (Expected::Variant(name, at), v) => v.name() == *name && v.instruction() == *at,
            (
                Expected::SwapIdentity(at),
                PlanViolation::SwapSlotMismatch { instruction, .. }
                | PlanViolation::SwapDeviceMismatch { instruction, .. },
            ) => instruction == at,
            (
                Expected::StaleRead(..),
                PlanViolation::HostWriteNeverRead { .. }
                | PlanViolation::Race { .. }
                | PlanViolation::ReadNotReady { .. }
                | PlanViolation::ReadClobbered { .. },
            ) => true,
            _ => false,
        })
    }
}

/// A corruption as applied.
#[derive(Clone, Debug)]
pub struct Applied {
    /// The kind.
    pub mutation: Mutation,
    /// What was changed, in words, for messages.
    pub what: String,
    /// What the checker must report.
    pub expected: Expected,
}

/// Applies `mutation` to a copy of the valid `plan`, its target chosen by `target` and `detail`
/// among those where the result is forbidden; `None` when the plan has no such target.
pub fn mutate(plan: &Plan, mutation: Mutation, target: u32, detail: u64) -> Option<(Plan, Applied)> {
    let mut out = plan.clone();
    let (what, expected) = match mutation {
        Mutation::ShiftOffset => shift_offset(&mut out, target, detail)?,
        Mutation::DropWait => drop_wait(&mut out, target)?,
        Mutation::MoveRecordAfterWait => move_record_after_wait(&mut out, target, detail)?,
        Mutation::ShrinkArena => {
            let arena = out.totals.arena_bytes;
            if arena == 0 {
                return None;
            }
            out.totals.arena_bytes = arena - (1 + detail % arena);
            (format!("arena_bytes {arena} -> {}", out.totals.arena_bytes), Expected::OutsideArena)
        }
        Mutation::DropSwapIn => drop_swap_in(&mut out, target)?,
        Mutation::RowsPastEnd => rows_past_end(&mut out, target, detail)?,
        Mutation::Malform => malform(&mut out, target as usize, detail)?,
        Mutation::SwapInOtherLayer
        | Mutation::SwapInOtherTensor
        | Mutation::SwapInShiftedRows
        | Mutation::SwapInRelabelled => swap_identity::swap_identity(&mut out, mutation, target, detail)?,
        Mutation::DropCollectiveWait => drop_collective_wait(&mut out, target)?,
        Mutation::ReorderCollectives | Mutation::ResizeCollective | Mutation::SkipCollective => {
            rank_program(&mut out, mutation, target, detail)?
        }
        Mutation::MisSizeCollective => mis_size_collective(&mut out, target)?,
        Mutation::DropRingExchange | Mutation::ResizeRingExchange | Mutation::ReorderDataCollectives => {
            context_program(&mut out, mutation, target, detail)?
        }
        Mutation::DropRingWait => drop_ring_wait(&mut out, target)?,
        Mutation::ChangeTotal => {
            let totals = &mut out.totals;
            let (total, field) = match target % 5 {
                0 => (Total::ArenaBytes, &mut totals.arena_bytes),
                1 => (Total::ArenaLowerBoundBytes, &mut totals.arena_lower_bound_bytes),
                2 => (Total::HostBytes, &mut totals.host_bytes),
                3 => (Total::ParameterBytes, &mut totals.parameter_bytes),
                _ => (Total::RoundingBufferBytes, &mut totals.rounding_buffer_bytes),
            };
            // Any non-zero change: a small step either way, or any other value.
            let old = *field;
            *field = match detail % 4 {
                0 => old.wrapping_add(1 + (detail >> 2) % 4096),
                1 => old.wrapping_sub(1 + (detail >> 2) % 4096),
                _ => old ^ (detail >> 2).max(1),
            };
            (format!("{} {old} -> {}", total.name(), *field), Expected::TotalMismatch(total))
        }
    };
    Some((out, Applied { mutation, what, expected }))
}

/// Each buffer's first and last touching instruction, or `None` if no instruction touches it.
fn touch_ranges(plan: &Plan) -> Vec<Option<(usize, usize)>> {
    let mut ranges: Vec<Option<(usize, usize)>> = alloc::vec![None; plan.buffers.len()];
    for (index, instruction) in plan.instructions.iter().enumerate() {
        for region in regions(&instruction.action) {
            if let Some(range) = ranges.get_mut(region.buffer.index()) {
                *range = Some(range.map_or((index, index), |(first, _)| (first, index)));
            }
        }
    }
    ranges
}

/// The regions an action touches: a launch's arguments, a copy's source then destination.
fn regions(action: &Action) -> Vec<Region> {
    match action {
        Action::Launch(launch) => launch.args.iter().map(|arg| arg.region).collect(),
        Action::Copy { src, dst, .. } => alloc::vec![*src, *dst],
        Action::Record(_) | Action::Wait(_) => Vec::new(),
    }
}

/// Device buffers that occupy bytes and are touched: (id, offset, bytes, first, last).
fn touched_device_buffers(plan: &Plan) -> Vec<(BufferId, u64, u64, usize, usize)> {
    let ranges = touch_ranges(plan);
    plan.buffers
        .iter()
        .zip(ranges)
        .enumerate()
        .filter_map(|(index, (buffer, range))| {
            let Place::Device { offset } = buffer.place else { return None };
            let bytes = buffer.bytes().filter(|&b| b > 0)?;
            let (first, last) = range?;
            Some((BufferId(index as u32), offset, bytes, first, last))
        })
        .collect()
}

fn shift_offset(plan: &mut Plan, target: u32, detail: u64) -> Option<(String, Expected)> {
    let buffers = touched_device_buffers(plan);
    if buffers.is_empty() {
        return None;
    }
    // The first buffer from the target on (cyclically) that has a partner live with it.
    for step in 0..buffers.len() {
        let (moved, _, bytes, first, last) = buffers[(target as usize + step) % buffers.len()];
        let partners: Vec<_> =
            buffers.iter().filter(|b| b.0 != moved && b.3 <= last && first <= b.4).copied().collect();
        if partners.is_empty() {
            continue;
        }
        let (partner, start, partner_bytes, ..) = partners[(detail % partners.len() as u64) as usize];
        // Same first byte; on the partner's last byte; ending on the partner's first byte.
        let offset = match (detail >> 32) % 3 {
            1 => start.saturating_add(partner_bytes - 1),
            2 if start + 1 >= bytes => start + 1 - bytes,
            _ => start,
        };
        let buffer = &mut plan.buffers[moved.index()];
        let old = buffer.place;
        buffer.place = Place::Device { offset };
        let what = format!("buffer #{} {old:?} -> offset {offset}, onto #{}", moved.0, partner.0);
        return Some((what, Expected::Overlap(moved, partner)));
    }
    None
}

fn drop_wait(plan: &mut Plan, target: u32) -> Option<(String, Expected)> {
    let waits: Vec<usize> =
        (0..plan.instructions.len()).filter(|&i| matches!(plan.instructions[i].action, Action::Wait(_))).collect();
    drop_one_of(plan, &waits, target)
}

/// Removes the first of `waits` from the target on (cyclically) whose removal leaves two
/// conflicting accesses unordered.
fn drop_one_of(plan: &mut Plan, waits: &[usize], target: u32) -> Option<(String, Expected)> {
    for step in 0..waits.len() {
        let at = waits[(target as usize + step) % waits.len()];
        let mut candidate = plan.clone();
        let removed = candidate.instructions.remove(at);
        if let Some((a, b)) = unordered_conflict(&candidate, at) {
            *plan = candidate;
            let what = format!("dropped instruction {at} ({:?} on {})", removed.action, removed.stream.name());
            return Some((what, Expected::Unordered(a, b)));
        }
    }
    None
}

/// A Wait on the collective stream, or a Wait of another stream on an event the collective stream
/// recorded, whose removal leaves two conflicting accesses unordered.
fn drop_collective_wait(plan: &mut Plan, target: u32) -> Option<(String, Expected)> {
    let recorded_on_collective = |event: crate::plan::EventId| {
        plan.instructions.iter().any(|i| i.stream == Stream::Collective && i.action == Action::Record(event))
    };
    let waits: Vec<usize> = (0..plan.instructions.len())
        .filter(|&i| match plan.instructions[i].action {
            Action::Wait(event) => plan.instructions[i].stream == Stream::Collective || recorded_on_collective(event),
            _ => false,
        })
        .collect();
    drop_one_of(plan, &waits, target)
}

/// The collective launches of `plan`'s shared program, by instruction index.
fn collective_launches(plan: &Plan) -> Vec<usize> {
    indices(plan, |a| matches!(a, Action::Launch(l) if l.op.is_collective()))
}

/// What rule 9 compares of a collective launch: its op and the bytes of each argument.
fn collective_call(plan: &Plan, at: usize) -> Option<(crate::plan::Op, Vec<u64>)> {
    let Action::Launch(launch) = &plan.instructions.get(at)?.action else { return None };
    let bytes = launch
        .args
        .iter()
        .map(|a| {
            let row = plan.buffers.get(a.region.buffer.index()).map_or(0, |b| b.row_bytes);
            (a.region.end - a.region.start).saturating_mul(row)
        })
        .collect();
    Some((launch.op, bytes))
}

/// Gives rank 1 its own program: the shared one with two different collectives swapped, one
/// collective's first argument a row shorter (or longer), or a collective left out.
fn rank_program(plan: &mut Plan, mutation: Mutation, target: u32, detail: u64) -> Option<(String, Expected)> {
    if plan.provenance.parallel.tensor < 2 {
        return None;
    }
    let launches = collective_launches(plan);
    if launches.is_empty() {
        return None;
    }
    let first = target as usize % launches.len();
    let at = launches[first];
    let mut program = plan.instructions.clone();
    let what = match mutation {
        Mutation::ReorderCollectives => {
            let call = collective_call(plan, at)?;
            let other =
                launches[first..].iter().copied().find(|&o| collective_call(plan, o).as_ref() != Some(&call))?;
            program.swap(at, other);
            format!("rank 1 runs instructions {at} and {other} (two collectives) in the other order")
        }
        Mutation::ResizeCollective => {
            let Action::Launch(launch) = &mut program[at].action else { return None };
            let region = &mut launch.args.first_mut()?.region;
            let rows = plan.buffers.get(region.buffer.index())?.rows;
            let grow = (detail.is_multiple_of(2) && region.end < rows) || region.end == region.start;
            if grow {
                if region.end >= rows {
                    return None;
                }
                region.end += 1;
            } else {
                region.end -= 1;
            }
            format!("rank 1's collective at instruction {at} a row {}", if grow { "longer" } else { "shorter" })
        }
        _ => {
            program.remove(at);
            format!("rank 1 skips the collective at instruction {at}")
        }
    };
    plan.rank_programs = alloc::vec![crate::plan::RankProgram { rank: 1, instructions: program }];
    Some((what, Expected::Variant("collective_mismatch", None)))
}

/// Changes one context rank's program of a `c > 1` plan (`target` picks the context rank, and
/// with `detail` what): drops its `n`-th `ring_exchange`, shrinks both sides of one by a row, or
/// swaps two of its data-group all-reduces of different sizes. The program is context rank 0's
/// (the shared one) or a rank program's; `None` without a ring.
fn context_program(plan: &mut Plan, mutation: Mutation, target: u32, detail: u64) -> Option<(String, Expected)> {
    if plan.provenance.parallel.context < 2 || plan.rank_programs.is_empty() {
        return None;
    }
    let programs = plan.rank_programs.len() + 1;
    let which = target as usize % programs;
    let view = Plan { instructions: plan.program_at(which).to_vec(), rank_programs: Vec::new(), ..plan.clone() };
    let wanted = |op: crate::plan::Op| indices(&view, move |a| matches!(a, Action::Launch(l) if l.op == op));
    let mut program = view.instructions.clone();
    let (what, expected) = match mutation {
        Mutation::DropRingExchange | Mutation::ResizeRingExchange => {
            let exchanges = wanted(crate::plan::Op::RingExchange);
            if exchanges.is_empty() {
                return None;
            }
            let n = (detail % exchanges.len() as u64) as usize;
            let at = exchanges[n];
            if mutation == Mutation::DropRingExchange {
                program.remove(at);
                (format!("program {which} without its ring exchange {n} (instruction {at})"), "ring_exchange_mismatch")
            } else {
                let Action::Launch(launch) = &mut program[at].action else { return None };
                for arg in &mut launch.args {
                    if arg.region.end == arg.region.start {
                        return None;
                    }
                    arg.region.end -= 1;
                }
                (
                    format!("program {which}'s ring exchange {n} (instruction {at}) a row shorter"),
                    "ring_exchange_mismatch",
                )
            }
        }
        _ => {
            let mut reduces = wanted(crate::plan::Op::DataAllReduceSumBf16);
            reduces.extend(wanted(crate::plan::Op::DataAllReduceSumF32));
            reduces.sort_unstable();
            if reduces.is_empty() {
                return None;
            }
            let first = (detail % reduces.len() as u64) as usize;
            let at = reduces[first];
            let call = collective_call(&view, at)?;
            let other = reduces.iter().copied().find(|&o| collective_call(&view, o).as_ref() != Some(&call))?;
            program.swap(at, other);
            (
                format!("program {which} runs its data all-reduces {at} and {other} in the other order"),
                "collective_mismatch",
            )
        }
    };
    match which.checked_sub(1) {
        None => plan.instructions = program,
        Some(index) => plan.rank_programs[index].instructions = program,
    }
    Some((what, Expected::Variant(expected, None)))
}

/// Removes a compute Wait for an event the collective stream recorded right after a
/// `ring_exchange` (the received K/V or accumulators are read next), whose removal leaves two
/// conflicting accesses unordered.
fn drop_ring_wait(plan: &mut Plan, target: u32) -> Option<(String, Expected)> {
    let after_exchange = |event: crate::plan::EventId| {
        plan.instructions.windows(2).any(|pair| {
            pair[1].stream == Stream::Collective
                && pair[1].action == Action::Record(event)
                && matches!(&pair[0].action, Action::Launch(l) if l.op == crate::plan::Op::RingExchange)
        })
    };
    let waits: Vec<usize> = (0..plan.instructions.len())
        .filter(|&i| match plan.instructions[i].action {
            Action::Wait(event) => plan.instructions[i].stream == Stream::Compute && after_exchange(event),
            _ => false,
        })
        .collect();
    drop_one_of(plan, &waits, target)
}

/// An all-gather's output, or a reduce-scatter's input, one row short.
fn mis_size_collective(plan: &mut Plan, target: u32) -> Option<(String, Expected)> {
    let candidates = indices(
        plan,
        |a| matches!(a, Action::Launch(l) if matches!(l.op, crate::plan::Op::AllGather | crate::plan::Op::ReduceScatter)),
    );
    if candidates.is_empty() {
        return None;
    }
    let at = candidates[target as usize % candidates.len()];
    let Action::Launch(launch) = &mut plan.instructions[at].action else { return None };
    let index = if launch.op == crate::plan::Op::AllGather { 1 } else { 0 };
    let region = &mut launch.args.get_mut(index)?.region;
    if region.end == region.start {
        return None;
    }
    region.end -= 1;
    Some((
        format!("collective at instruction {at}: argument {index} a row short"),
        Expected::Variant("collective_size", Some(at)),
    ))
}

fn move_record_after_wait(plan: &mut Plan, target: u32, detail: u64) -> Option<(String, Expected)> {
    // (record, wait) pairs: every Wait whose event's Record comes before it.
    let mut pairs = Vec::new();
    for (wait, instruction) in plan.instructions.iter().enumerate() {
        let Action::Wait(event) = instruction.action else { continue };
        let record = plan.instructions[..wait].iter().position(|i| i.action == Action::Record(event));
        if let Some(record) = record {
            pairs.push((record, wait));
        }
    }
    if pairs.is_empty() {
        return None;
    }
    let (record, wait) = pairs[target as usize % pairs.len()];
    let moved = plan.instructions.remove(record);
    // The Wait is now at `wait - 1`; the Record goes anywhere after it.
    let after = wait - 1;
    let to = after + 1 + (detail % (plan.instructions.len() - after) as u64) as usize;
    plan.instructions.insert(to, moved);
    Some((
        format!("moved the Record at {record} to {to}, after its Wait (now at {after})"),
        Expected::WaitBeforeRecord(after),
    ))
}

fn drop_swap_in(plan: &mut Plan, target: u32) -> Option<(String, Expected)> {
    let copies: Vec<usize> = (0..plan.instructions.len())
        .filter(|&i| {
            let instruction = &plan.instructions[i];
            instruction.stream == Stream::HostToDevice && matches!(instruction.action, Action::Copy { .. })
        })
        .collect();
    for step in 0..copies.len() {
        let at = copies[(target as usize + step) % copies.len()];
        let Some((reader, writer)) = stale_read_without(plan, at) else { continue };
        plan.instructions.remove(at);
        let what = format!("dropped the swap-in at {at}; instruction {reader} now reads data from {writer:?}");
        return Some((what, Expected::StaleRead(reader, writer)));
    }
    None
}

fn rows_past_end(plan: &mut Plan, target: u32, detail: u64) -> Option<(String, Expected)> {
    let args: Vec<(usize, usize)> = plan
        .instructions
        .iter()
        .enumerate()
        .filter_map(|(i, instruction)| match &instruction.action {
            Action::Launch(launch) => Some((0..launch.args.len()).map(move |a| (i, a))),
            _ => None,
        })
        .flatten()
        .collect();
    if args.is_empty() {
        return None;
    }
    let (at, arg) = args[target as usize % args.len()];
    let Action::Launch(launch) = &mut plan.instructions[at].action else { return None };
    let region = &mut launch.args[arg].region;
    let rows = plan.buffers.get(region.buffer.index())?.rows;
    let old = *region;
    region.end = rows.checked_add(1 + detail % 64)?;
    if detail & (1 << 32) != 0 {
        // Move the start past the end of the buffer as well.
        region.start = region.end;
    }
    Some((
        format!(
            "instruction {at} argument {arg}: rows {}..{} -> {}..{} of {rows}",
            old.start, old.end, region.start, region.end
        ),
        Expected::RowsOutOfBounds(at),
    ))
}

/// Instruction indices where `keep` holds.
fn indices(plan: &Plan, keep: impl Fn(&Action) -> bool) -> Vec<usize> {
    (0..plan.instructions.len()).filter(|&i| keep(&plan.instructions[i].action)).collect()
}

/// One structural corruption, chosen by `detail % 13`, its target by `target`.
fn malform(plan: &mut Plan, target: usize, detail: u64) -> Option<(String, Expected)> {
    let small = (detail >> 8) % 1000;
    let one_of = |items: &[usize]| (!items.is_empty()).then(|| items[target % items.len()]);
    let is_launch = |a: &Action| matches!(a, Action::Launch(_));
    let is_copy = |a: &Action| matches!(a, Action::Copy { .. });
    let (what, name, at) = match detail % 13 {
        0 => {
            let big: Vec<usize> = (0..plan.buffers.len()).filter(|&b| plan.buffers[b].rows >= 2).collect();
            let b = one_of(&big)?;
            plan.buffers[b].row_bytes = u64::MAX;
            (format!("buffer #{b} row_bytes -> u64::MAX"), "size_overflow", None)
        }
        1 => {
            let b = one_of(&(0..plan.buffers.len()).collect::<Vec<_>>())?;
            let place = &mut plan.buffers[b].place;
            *place = match *place {
                Place::Device { offset } => Place::Host { offset },
                Place::Host { offset } => Place::Device { offset },
            };
            (format!("buffer #{b} moved to the other space"), "place_mismatch", None)
        }
        2 => {
            let at = one_of(&indices(plan, |a| is_launch(a) || is_copy(a)))?;
            let id = BufferId(u32::try_from(plan.buffers.len() as u64 + small).ok()?);
            match &mut plan.instructions[at].action {
                Action::Launch(launch) => launch.args.first_mut()?.region.buffer = id,
                Action::Copy { src, .. } => src.buffer = id,
                _ => return None,
            }
            (format!("instruction {at} names buffer #{}", id.0), "no_such_buffer", Some(at))
        }
        3 => {
            let at = one_of(&indices(plan, |a| matches!(a, Action::Record(_) | Action::Wait(_))))?;
            let event = crate::plan::EventId(plan.events.checked_add(small as u32)?);
            match &mut plan.instructions[at].action {
                Action::Record(e) | Action::Wait(e) => *e = event,
                _ => return None,
            }
            (format!("instruction {at} names event {}", event.0), "no_such_event", Some(at))
        }
        4..=7 => {
            let at = one_of(&indices(plan, is_launch))?;
            let has_host = plan.buffers.iter().position(|b| matches!(b.place, Place::Host { .. }));
            let instruction = &mut plan.instructions[at];
            let Action::Launch(launch) = &mut instruction.action else { return None };
            let arg = target / 7 % launch.args.len().max(1);
            match detail % 13 {
                4 if small.is_multiple_of(2) && !launch.args.is_empty() => {
                    launch.args.pop();
                    (format!("instruction {at} lost its last argument"), "wrong_arg_count", Some(at))
                }
                4 => {
                    // Two more: one past the signature is a scratch (rule 11), two are too many.
                    let extra = *launch.args.first()?;
                    launch.args.extend([extra, extra]);
                    (format!("instruction {at} got two arguments more"), "wrong_arg_count", Some(at))
                }
                5 => {
                    use crate::plan::Access;
                    let access = &mut launch.args.get_mut(arg)?.access;
                    let all = [Access::Read, Access::Write, Access::ReadWrite];
                    let now = all.iter().position(|a| a == access)?;
                    *access = all[(now + 1 + small as usize % 2) % 3];
                    (format!("instruction {at} argument {arg} marked {}", access.name()), "wrong_access", Some(at))
                }
                6 => {
                    // Any stream but the op's own: a kernel off compute, or a collective off its stream.
                    let own = launch.op.stream().index();
                    instruction.stream = Stream::ALL[(own + 1 + small as usize % 3) % Stream::ALL.len()];
                    (
                        format!("instruction {at} moved to {}", instruction.stream.name()),
                        "launch_wrong_stream",
                        Some(at),
                    )
                }
                _ => {
                    let host = has_host?;
                    let region = &mut launch.args.get_mut(arg)?.region;
                    *region = Region::rows(BufferId(host as u32), 0, 0);
                    (format!("instruction {at} argument {arg} -> host slot #{host}"), "launch_on_host", Some(at))
                }
            }
        }
        8..=10 => {
            let at = one_of(&indices(plan, is_copy))?;
            let instruction = &mut plan.instructions[at];
            let Action::Copy { src, dst, .. } = &mut instruction.action else { return None };
            let to_host = instruction.stream == Stream::DeviceToHost;
            match detail % 13 {
                8 => {
                    // The host side becomes the device side: a device-to-device copy.
                    if to_host {
                        *dst = *src;
                    } else {
                        *src = *dst;
                    }
                    (format!("copy {at} between two device regions"), "copy_not_host_device", Some(at))
                }
                9 => {
                    let others = if to_host {
                        [Stream::Compute, Stream::HostToDevice, Stream::Collective]
                    } else {
                        [Stream::Compute, Stream::DeviceToHost, Stream::Collective]
                    };
                    instruction.stream = others[small as usize % 3];
                    (format!("copy {at} moved to {}", instruction.stream.name()), "copy_wrong_stream", Some(at))
                }
                _ => {
                    let row_bytes = plan.buffers.get(dst.buffer.index())?.row_bytes;
                    if dst.end == dst.start || row_bytes == 0 {
                        return None;
                    }
                    dst.end -= 1;
                    (format!("copy {at} writes one row less"), "copy_size_mismatch", Some(at))
                }
            }
        }
        11 => {
            let at = one_of(&indices(plan, |a| matches!(a, Action::Record(_))))?;
            let again = plan.instructions[at].clone();
            let to = at + 1 + (small as usize % (plan.instructions.len() - at));
            plan.instructions.insert(to, again);
            (format!("the Record at {at} again at {to}"), "double_record", Some(to))
        }
        _ => {
            // A Record some Wait follows; without it, that Wait waits for nothing.
            let records = indices(plan, |a| matches!(a, Action::Record(_)));
            let waited: Vec<(usize, usize)> = records
                .into_iter()
                .filter_map(|r| {
                    let event = plan.instructions[r].action.clone();
                    let Action::Record(e) = event else { return None };
                    let wait = plan.instructions.iter().position(|i| i.action == Action::Wait(e))?;
                    Some((r, wait))
                })
                .collect();
            let (record, wait) = *waited.get(target % waited.len().max(1))?;
            plan.instructions.remove(record);
            let at = if wait > record { wait - 1 } else { wait };
            (format!("removed the Record at {record}"), "wait_unrecorded", Some(at))
        }
    };
    Some((what, Expected::Variant(name, at)))
}

/// One access of a byte range: instruction, stream, space (0 arena, 1 host slab), bytes, whether
/// it writes, and its tick on its stream.
#[derive(Clone, Copy, Debug)]
struct Access {
    instruction: usize,
    stream: usize,
    space: u8,
    start: u128,
    end: u128,
    writes: bool,
    tick: u64,
}

/// Every non-empty access of `plan` in list order (reads of an instruction before its writes),
/// and each instruction's knowledge of the four streams (vector clock after its own tick).
///
/// Written from the semantics in `plan/mod.rs` alone: every instruction ticks its stream; a
/// Record stores its stream's clock in the event (first Record only); a Wait joins the event's
/// clock into its stream's if the event was recorded earlier in list order.
fn accesses(plan: &Plan) -> (Vec<Access>, Vec<[u64; STREAMS]>) {
    let mut clocks = [[0u64; STREAMS]; STREAMS];
    let mut events: Vec<Option<[u64; STREAMS]>> = alloc::vec![None; plan.events as usize];
    let mut out = Vec::new();
    let mut knowledge = Vec::with_capacity(plan.instructions.len());
    for (index, instruction) in plan.instructions.iter().enumerate() {
        let s = instruction.stream.index();
        clocks[s][s] += 1;
        let tick = clocks[s][s];
        let mut push = |region: &Region, writes: bool| {
            let Some(buffer) = plan.buffers.get(region.buffer.index()) else { return };
            let (space, offset) = match buffer.place {
                Place::Device { offset } => (0, offset),
                Place::Host { offset } => (1, offset),
            };
            let row = u128::from(buffer.row_bytes);
            let start = u128::from(offset) + u128::from(region.start) * row;
            let end = u128::from(offset) + u128::from(region.end) * row;
            if start < end {
                out.push(Access { instruction: index, stream: s, space, start, end, writes, tick });
            }
        };
        match &instruction.action {
            Action::Launch(launch) => {
                let signature = launch.op.signature();
                for (position, arg) in launch.args.iter().enumerate() {
                    let access = signature.get(position).map_or(arg.access, |&(_, access)| access);
                    if access.reads() {
                        push(&arg.region, false);
                    }
                }
                for (position, arg) in launch.args.iter().enumerate() {
                    let access = signature.get(position).map_or(arg.access, |&(_, access)| access);
                    if access.writes() {
                        push(&arg.region, true);
                    }
                }
            }
            Action::Copy { src, dst, .. } => {
                push(src, false);
                push(dst, true);
            }
            Action::Record(event) => {
                if let Some(slot @ None) = events.get_mut(event.0 as usize) {
                    *slot = Some(clocks[s]);
                }
            }
            Action::Wait(event) => {
                if let Some(Some(recorded)) = events.get(event.0 as usize) {
                    for (mine, theirs) in clocks[s].iter_mut().zip(recorded) {
                        *mine = (*mine).max(*theirs);
                    }
                }
            }
        }
        knowledge.push(clocks[s]);
    }
    (out, knowledge)
}

/// Whether access `a` happens-before instruction `b` (on its stream, with its knowledge).
fn happens_before(a: &Access, b_stream: usize, b_knowledge: &[u64; STREAMS]) -> bool {
    a.stream == b_stream || a.tick <= b_knowledge[a.stream]
}

/// A pair of instructions `(a, b)`, `a < split <= b`, on different streams, that access common
/// bytes, at least one writing, with `a` not happening-before `b`: a data race or a read of
/// data not known to be ready, which the semantics forbid. The naive pairwise search over every
/// access; `None` if there is no such pair.
pub fn unordered_conflict(plan: &Plan, split: usize) -> Option<(usize, usize)> {
    let (all, knowledge) = accesses(plan);
    let boundary = all.partition_point(|a| a.instruction < split);
    let (before, after) = all.split_at(boundary);
    for b in after {
        let known = &knowledge[b.instruction];
        let conflict = before.iter().find(|a| {
            a.stream != b.stream
                && a.space == b.space
                && a.start < b.end
                && b.start < a.end
                && (a.writes || b.writes)
                && !happens_before(a, b.stream, known)
        });
        if let Some(a) = conflict {
            return Some((a.instruction, b.instruction));
        }
    }
    None
}

/// Where the data in byte `byte` of `space` came from just before instruction `before`: the
/// launch that computed it (following copies back to their source), or `None` when no
/// instruction wrote it (data from before the step, or nothing).
fn origin(all: &[Access], plan: &Plan, space: u8, byte: u128, before: usize) -> Option<usize> {
    let (mut space, mut byte, mut before) = (space, byte, before);
    loop {
        let w = all
            .iter()
            .rev()
            .find(|w| w.instruction < before && w.writes && w.space == space && w.start <= byte && byte < w.end)?;
        if !matches!(plan.instructions[w.instruction].action, Action::Copy { .. }) {
            return Some(w.instruction);
        }
        let source = all.iter().find(|a| a.instruction == w.instruction && !a.writes)?;
        (space, byte, before) = (source.space, source.start + (byte - w.start), w.instruction);
    }
}

/// For the copy at instruction `copy`: a later read of bytes it writes, before any other write of
/// them, whose data would come from another launch without the copy, as `(reader, writer)`: the
/// reader's index and the launch it would read instead (`None`: no instruction wrote those bytes
/// before the copy), both as indices of the plan *without* the copy. `None` when every read of the copy's bytes would see the same data without it (the
/// copy restores what is still there) or nothing reads them.
pub fn stale_read_without(plan: &Plan, copy: usize) -> Option<(usize, Option<usize>)> {
    let (all, _) = accesses(plan);
    let dst = *all.iter().find(|a| a.instruction == copy && a.writes)?;
    // The bytes still holding the copy's data; later writes cut them.
    let mut holding: Vec<(u128, u128)> = alloc::vec![(dst.start, dst.end)];
    for a in all.iter().filter(|a| a.instruction > copy && a.space == dst.space) {
        if a.writes {
            holding = holding
                .into_iter()
                .flat_map(|(s, e)| [(s, e.min(a.start)), (s.max(a.end), e)])
                .filter(|(s, e)| s < e)
                .collect();
            if holding.is_empty() {
                return None;
            }
            continue;
        }
        let Some(byte) = holding.iter().find(|(s, e)| *s < a.end && a.start < *e).map(|(s, _)| (*s).max(a.start))
        else {
            continue;
        };
        let with = origin(&all, plan, dst.space, byte, a.instruction);
        let without = origin(&all, plan, dst.space, byte, copy);
        if with != without {
            return Some((a.instruction - 1, without));
        }
    }
    None
}

/// Checks one case; the kind of corruption applied and whether the checker rejected it, or `None`
/// when the plan had no target for it. Panics when the checker accepts a corruption it must
/// reject (every kind) or misses the expected violation.
pub fn check_counted(case: MutateCase) -> Option<(Mutation, bool)> {
    let report = checked_plan(&case.request);
    let (mutated, applied) = mutate(&report.plan, case.mutation, case.target, case.detail)?;
    let rejected = match check_plan(&mutated) {
        Ok(()) => panic!(
            "the checker accepts a corrupted plan: {} ({})\n{}",
            applied.mutation.name(),
            applied.what,
            describe(&case.request)
        ),
        Err(violations) => {
            assert!(
                applied.expected.found_in(&violations),
                "the checker rejects {} ({}) but without {:?}: {}\n{}",
                applied.mutation.name(),
                applied.what,
                applied.expected,
                violations.iter().take(5).map(|v| format!("\n  {v}")).collect::<String>(),
                describe(&case.request)
            );
            true
        }
    };
    Some((applied.mutation, rejected))
}

/// Checks one case (see [`check_counted`]).
pub fn check(case: MutateCase) {
    check_counted(case);
}

#[cfg(test)]
mod tests;
