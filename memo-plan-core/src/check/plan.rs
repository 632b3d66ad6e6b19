//! The plan checker: is a [`Plan`] a safe program? The rules are `spec/validity.md`; the
//! semantics are those of [`crate::plan`].
//!
//! It imports only the plan's types and recomputes everything it needs from the buffers and
//! instructions; it shares no code with the solver, the lifetimes or the scheduler, so it can
//! catch their bugs. It reports every violation it finds, sorted by (instruction, buffer).
//!
//! The algorithm is one pass over the instructions in list order:
//! - *happens-before* by vector clocks over the four streams: each instruction ticks its
//!   stream's own component; `Record(e)` stores the stream's clock in `e`; `Wait(e)` joins `e`'s
//!   clock into the waiting stream's. An access `A` happens-before the current instruction iff
//!   they are on the same stream or `A`'s tick is at most what the current stream knows of `A`'s
//!   stream;
//! - *byte state* per address space (the arena and the host slab; buffers alias in the arena, so
//!   the state belongs to bytes, not buffers): an ordered map of disjoint byte segments, each
//!   with its last writer and the latest reader on each stream since that write (the latest read
//!   of a stream happens-before a write only if all of that stream's earlier reads do, so one per
//!   stream is enough). Reads of an instruction are checked and recorded before its writes.
//!
//! Live ranges and totals are recomputed separately; the overlap test sweeps the live device
//! buffers in order of their live ranges and compares each entering buffer with the live ones
//! whose bytes it meets, found in a max tree of byte ends (linear-logarithmic in buffers, plus
//! the pairs it reports).

mod checked;
mod swap;
mod violation;

#[cfg(all(test, feature = "fuzzing"))]
mod mutations;
#[cfg(test)]
mod scratch_tests;
#[cfg(all(test, feature = "fuzzing"))]
mod swap_mutations;
#[cfg(test)]
mod tests;

use alloc::boxed::Box;
use alloc::collections::BTreeMap;
use alloc::string::ToString;
use alloc::vec::Vec;

use crate::plan::scratch::{signature_shapes, ScratchSizer};
use crate::plan::shapes::{self, ArgShape, ShapeContext};
use crate::plan::{
    Access, Action, BufferId, BufferKind, CollectiveGroup, EventId, Instruction, Launch, Op, Place, Plan, Region,
    Stream, TensorRole, STREAMS,
};

pub use checked::CheckedPlan;
pub use violation::{BufferRef, ByteRange, CollectiveCall, PlanViolation, Space, Total};

/// Checks `plan` against every rule of `spec/validity.md`; returns all violations, sorted by
/// [`PlanViolation::sort_key`], or `Ok(())`. Never panics, whatever the plan holds.
pub fn check_plan(plan: &Plan) -> Result<(), Vec<PlanViolation>> {
    check_plan_counted(plan).0
}

/// [`check_plan`], and the work it did: instructions, buffers and byte segments visited, and the
/// nodes of the overlap test's tree. A count, not a time, so tests can bound how the checker's
/// work grows with the plan (linearly, up to a logarithm) on any machine.
pub fn check_plan_counted(plan: &Plan) -> (Result<(), Vec<PlanViolation>>, u64) {
    let mut violations = Vec::new();
    let mut work = 0u64;
    let extents = check_buffers(plan, &mut violations);
    work += plan.buffers.len() as u64;
    work += Simulation::new(plan, &extents, (0, 0)).run(&mut violations);
    let live = live_ranges(plan);
    work += check_overlap(plan, &extents, &live, &mut violations);
    check_totals(plan, &extents, &live, &mut violations);
    check_collective_sizes(plan, &mut violations);
    work += check_rank_programs(plan, &extents, &mut violations);
    if violations.is_empty() {
        return (Ok(()), work);
    }
    violations.sort_by_key(PlanViolation::sort_key);
    (Err(violations), work)
}

/// [`check_plan`], then rule 11's sizes against a backend's `sizer`: every launch's scratch
/// argument (0 bytes without one) holds at least the bytes `sizer` asks for the launch's shapes,
/// so no kernel writes past it. The shared program is held to the sizer for ranks 0 and `t - 1`
/// (the ranks whose shape contexts differ: the last holds the vocabulary's short shard), each
/// rank's own program for its rank. Returns every violation, sorted like [`check_plan`]'s. Never
/// panics, whatever the plan holds.
pub fn check_plan_scratch(plan: &Plan, sizer: &dyn ScratchSizer) -> Result<(), Vec<PlanViolation>> {
    let mut violations = check_plan(plan).err().unwrap_or_default();
    let ranks = plan.provenance.parallel.tensor.max(1);
    let mut shared = Vec::new();
    for rank in [0, ranks - 1] {
        if !shared.contains(&rank) && !plan.rank_programs.iter().any(|p| u64::from(p.rank) == rank) {
            shared.push(rank);
        }
    }
    for rank in shared {
        check_scratch_sizes(plan, &plan.instructions, rank, sizer, &mut violations);
    }
    let global_ranks = ranks.saturating_mul(plan.provenance.parallel.context.max(1));
    for program in plan.rank_programs.iter().filter(|p| u64::from(p.rank) < global_ranks) {
        let mut inner = Vec::new();
        check_scratch_sizes(plan, &program.instructions, u64::from(program.rank), sizer, &mut inner);
        let rank = program.rank;
        violations.extend(inner.into_iter().map(|v| PlanViolation::InRankProgram { rank, violation: Box::new(v) }));
    }
    if violations.is_empty() {
        return Ok(());
    }
    violations.sort_by_key(PlanViolation::sort_key);
    violations.dedup();
    Err(violations)
}

/// Rule 11's sizes over one program for one rank; launches whose signature arguments do not all
/// lie inside their buffers are left to rule 1.
fn check_scratch_sizes(
    plan: &Plan,
    instructions: &[Instruction],
    rank: u64,
    sizer: &dyn ScratchSizer,
    out: &mut Vec<PlanViolation>,
) {
    let t = plan.provenance.parallel.tensor.max(1);
    let ctx = ShapeContext::for_ranks(&plan.provenance.model, &plan.provenance.parallel, rank % t, rank / t);
    for (index, instruction) in instructions.iter().enumerate() {
        let Action::Launch(launch) = &instruction.action else { continue };
        // A launch whose arguments are out of the plan is another rule's violation.
        let Some(shapes) = signature_shapes(plan, launch) else { continue };
        let needed = sizer.scratch_bytes(launch.op, &shapes, &ctx);
        let found = launch.scratch().map_or(0, |arg| region_bytes(plan, &arg.region));
        if found < needed {
            out.push(PlanViolation::ScratchTooSmall { instruction: index, op: launch.op, needed, found });
        }
    }
}

/// Rule 11's structure: what is wrong with `arg` as the launch's scratch argument (`scratch`:
/// it is the one past the signature) or, at a signature position, with a scratch buffer there.
fn scratch_problem(scratch: bool, arg: &crate::plan::Arg, resolved: Option<Resolved>) -> Option<&'static str> {
    let buffer = resolved.map(|r| r.buffer.buffer);
    if !scratch {
        return buffer
            .filter(|b| b.role == TensorRole::Scratch)
            .map(|_| "uses a scratch buffer as an argument of its signature");
    }
    if arg.access != Access::Write {
        return Some("reads its scratch argument (a scratch is written by its launch only)");
    }
    let buffer = buffer?;
    if buffer.role != TensorRole::Scratch {
        Some("has an argument past its signature that is not a scratch buffer")
    } else if buffer.kind != BufferKind::Transient {
        Some("has a scratch buffer that is not a transient")
    } else if arg.region.start != 0 || arg.region.end != buffer.rows {
        Some("uses part of its scratch buffer (a scratch argument is the whole buffer)")
    } else {
        None
    }
}

/// Where a buffer's bytes are: its space, first byte, size and end (`None` when its size
/// overflows).
#[derive(Clone, Copy)]
struct Extent {
    space: Space,
    start: u64,
    bytes: u64,
    end: u128,
}

fn buffer_ref(plan: &Plan, id: BufferId) -> Option<BufferRef> {
    plan.buffer(id).map(|&buffer| BufferRef { id, buffer })
}

fn id_of(index: usize) -> BufferId {
    BufferId(u32::try_from(index).unwrap_or(u32::MAX))
}

/// Rule 1 for buffers (size, kind vs place) and rule 6's "inside the arena / host slab".
fn check_buffers(plan: &Plan, out: &mut Vec<PlanViolation>) -> Vec<Option<Extent>> {
    let mut extents = Vec::with_capacity(plan.buffers.len());
    for (index, &buffer) in plan.buffers.iter().enumerate() {
        let this = BufferRef { id: id_of(index), buffer };
        let (space, start) = match buffer.place {
            Place::Device { offset } => (Space::Arena, offset),
            Place::Host { offset } => (Space::HostSlab, offset),
        };
        if (buffer.kind == BufferKind::HostSlot) != (space == Space::HostSlab) {
            out.push(PlanViolation::PlaceMismatch { buffer: this });
        }
        let Some(bytes) = buffer.bytes() else {
            out.push(PlanViolation::SizeOverflow { buffer: this });
            extents.push(None);
            continue;
        };
        let end = u128::from(start) + u128::from(bytes);
        if bytes > 0 {
            match space {
                Space::Arena if end > u128::from(plan.totals.arena_bytes) => {
                    out.push(PlanViolation::OutsideArena { buffer: this, end, arena_bytes: plan.totals.arena_bytes })
                }
                Space::HostSlab if end > u128::from(plan.totals.host_bytes) => {
                    out.push(PlanViolation::OutsideHostSlab { buffer: this, end, host_bytes: plan.totals.host_bytes })
                }
                _ => {}
            }
        }
        extents.push(Some(Extent { space, start, bytes, end }));
    }
    extents
}

/// One access of bytes: who made it, and its tick on its stream.
#[derive(Clone, Copy, Debug)]
struct Touch {
    instruction: usize,
    buffer: BufferId,
    stream: Stream,
    tick: u64,
}

impl Touch {
    /// Whether this access happens-before an instruction on `stream` whose clock is `clock`.
    fn happens_before(&self, stream: Stream, clock: &[u64; STREAMS]) -> bool {
        self.stream == stream || self.tick <= clock[self.stream.index()]
    }
}

/// The state of a run of bytes.
#[derive(Clone, Copy, Debug, Default)]
struct Cell {
    writer: Option<Touch>,
    readers: [Option<Touch>; STREAMS],
}

/// One address space: disjoint segments `start -> (end, cell)` covering `[0, u64::MAX)`.
struct Bytes {
    segments: BTreeMap<u64, (u64, Cell)>,
}

impl Bytes {
    fn new() -> Self {
        let mut segments = BTreeMap::new();
        segments.insert(0, (u64::MAX, Cell::default()));
        Bytes { segments }
    }

    /// Makes `at` a segment boundary.
    fn split(&mut self, at: u64) {
        let Some((&start, &(end, cell))) = self.segments.range(..=at).next_back() else { return };
        if start < at && at < end {
            self.segments.insert(start, (at, cell));
            self.segments.insert(at, (end, cell));
        }
    }

    /// The segments of `[start, end)`, split so they lie inside it.
    fn range_mut(&mut self, start: u64, end: u64) -> impl Iterator<Item = (&u64, &mut (u64, Cell))> {
        self.split(start);
        self.split(end);
        self.segments.range_mut(start..end)
    }
}

/// A launch argument or copy side, resolved: the buffer, its space, and the bytes it selects
/// (`None` when the rows are out of bounds or the bytes leave 64-bit addresses).
#[derive(Clone, Copy)]
struct Resolved {
    buffer: BufferRef,
    space: Space,
    bytes: Option<ByteRange>,
}

/// What went wrong on some bytes of one access, before it becomes a [`PlanViolation`].
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Problem {
    Unwritten,
    Clobbered,
    NotReady,
    RaceWithRead,
    RaceWithWrite,
    SwappedInForOtherLayer,
}

/// The pass over the instructions: rules 1 (instructions), 2, 3, 4 and 5.
struct Simulation<'p> {
    plan: &'p Plan,
    extents: &'p [Option<Extent>],
    /// Each stream's vector clock.
    clocks: [[u64; STREAMS]; STREAMS],
    /// Event -> (the Record, the recording stream's clock). A map, not a vector: `plan.events`
    /// may be any u32.
    recorded: BTreeMap<u32, (usize, [u64; STREAMS])>,
    /// Event -> its first Record in list order.
    first_record: BTreeMap<u32, usize>,
    arena: Bytes,
    host: Bytes,
    /// What the op table's shape rules need of the model, for the program's rank (rule 10).
    shape_context: ShapeContext,
    /// Instructions and byte segments visited.
    work: u64,
}

impl<'p> Simulation<'p> {
    /// `rank`: the program's (context rank, tensor-parallel rank), for its shape context.
    fn new(plan: &'p Plan, extents: &'p [Option<Extent>], rank: (u64, u64)) -> Self {
        let mut first_record = BTreeMap::new();
        for (index, instruction) in plan.instructions.iter().enumerate() {
            if let Action::Record(event) = instruction.action {
                first_record.entry(event.0).or_insert(index);
            }
        }
        Simulation {
            plan,
            extents,
            clocks: [[0; STREAMS]; STREAMS],
            recorded: BTreeMap::new(),
            first_record,
            arena: Bytes::new(),
            host: Bytes::new(),
            shape_context: ShapeContext::for_ranks(&plan.provenance.model, &plan.provenance.parallel, rank.1, rank.0),
            work: 0,
        }
    }

    /// Runs the pass; returns its work (instructions and byte segments visited).
    fn run(mut self, out: &mut Vec<PlanViolation>) -> u64 {
        let plan = self.plan;
        self.work += plan.instructions.len() as u64;
        for (index, instruction) in plan.instructions.iter().enumerate() {
            let stream = instruction.stream;
            let s = stream.index();
            self.clocks[s][s] = self.clocks[s][s].saturating_add(1);
            match &instruction.action {
                Action::Launch(launch) => self.launch(index, stream, launch, out),
                Action::Copy { src: src_region, dst: dst_region, tensor } => {
                    let src = self.resolve(index, *src_region, out);
                    let dst = self.resolve(index, *dst_region, out);
                    if let (Some(src), Some(dst)) = (src, dst) {
                        self.check_copy(index, stream, src, dst, out);
                        swap::check_copy_identity(index, *tensor, (src, *src_region), (dst, *dst_region), out);
                    }
                    if let Some(src) = src {
                        self.read(index, stream, src, Some(tensor.layer), out);
                    }
                    if let Some(dst) = dst {
                        self.write(index, stream, dst, out);
                    }
                }
                Action::Record(event) => {
                    if self.event_exists(index, *event, out) {
                        if let Some(&(first, _)) = self.recorded.get(&event.0) {
                            out.push(PlanViolation::DoubleRecord { instruction: index, event: *event, first });
                        } else {
                            self.recorded.insert(event.0, (index, self.clocks[s]));
                        }
                    }
                }
                Action::Wait(event) => {
                    if self.event_exists(index, *event, out) {
                        if let Some(&(_, clock)) = self.recorded.get(&event.0) {
                            for (mine, theirs) in self.clocks[s].iter_mut().zip(clock) {
                                *mine = (*mine).max(theirs);
                            }
                        } else if let Some(&record) = self.first_record.get(&event.0) {
                            out.push(PlanViolation::WaitBeforeRecord { instruction: index, event: *event, record });
                        } else {
                            out.push(PlanViolation::WaitUnrecorded { instruction: index, event: *event });
                        }
                    }
                }
            }
        }
        self.dead_host_writes(out);
        self.work.saturating_add(self.host.segments.len() as u64)
    }

    /// Rule 4b: host-slab bytes whose last write nothing reads afterwards. Swapped-out data exists
    /// only to come back; one violation per (writer, host slot), over the bytes never read.
    fn dead_host_writes(&self, out: &mut Vec<PlanViolation>) {
        let mut dead: BTreeMap<(usize, BufferId), (u64, u64)> = BTreeMap::new();
        for (&start, &(end, cell)) in &self.host.segments {
            let Some(writer) = cell.writer else { continue };
            if cell.readers.iter().all(Option::is_none) {
                let range = dead.entry((writer.instruction, writer.buffer)).or_insert((start, end));
                *range = (range.0.min(start), range.1.max(end));
            }
        }
        for ((instruction, id), (start, end)) in dead {
            if let Some(buffer) = buffer_ref(self.plan, id) {
                let bytes = ByteRange { space: Space::HostSlab, start, end };
                out.push(PlanViolation::HostWriteNeverRead { instruction, buffer, bytes });
            }
        }
    }

    /// Rule 1 for a launch, then its reads and its writes (rules 4 and 5).
    fn launch(&mut self, index: usize, stream: Stream, launch: &Launch, out: &mut Vec<PlanViolation>) {
        let expected = launch.op.stream();
        if stream != expected {
            out.push(PlanViolation::LaunchWrongStream { instruction: index, op: launch.op, stream, expected });
        }
        let signature = launch.op.signature();
        // One argument past the signature is the launch's scratch (rule 11).
        if launch.args.len() != signature.len() && launch.args.len() != signature.len() + 1 {
            out.push(PlanViolation::WrongArgCount {
                instruction: index,
                op: launch.op,
                expected: signature.len(),
                found: launch.args.len(),
            });
        }
        let mut accesses = Vec::with_capacity(launch.args.len());
        let mut shapes = Vec::with_capacity(launch.args.len());
        for (position, arg) in launch.args.iter().enumerate() {
            let resolved = self.resolve(index, arg.region, out);
            // Only arguments inside their buffers (rule 1 reports the others).
            if let Some(r) =
                resolved.filter(|r| arg.region.start <= arg.region.end && arg.region.end <= r.buffer.buffer.rows)
            {
                let rows = arg.region.end - arg.region.start;
                if position < signature.len() {
                    shapes.push(ArgShape { first_row: arg.region.start, rows, row_bytes: r.buffer.buffer.row_bytes });
                }
            }
            if let Some(problem) = scratch_problem(position == signature.len(), arg, resolved) {
                let buffer = resolved.map(|r| r.buffer);
                out.push(PlanViolation::BadScratch { instruction: index, op: launch.op, buffer, problem });
            }
            // The op's semantics decide what the runtime does; the arg's own mark
            // only counts past the end of the signature.
            let access = match signature.get(position) {
                Some(&(_, expected)) if expected != arg.access => {
                    out.push(PlanViolation::WrongAccess {
                        instruction: index,
                        op: launch.op,
                        arg: position,
                        buffer: resolved.map(|r| r.buffer),
                        expected,
                        found: arg.access,
                    });
                    expected
                }
                Some(&(_, expected)) => expected,
                None => arg.access,
            };
            if let Some(resolved) = resolved {
                if resolved.space == Space::HostSlab {
                    out.push(PlanViolation::LaunchOnHost {
                        instruction: index,
                        op: launch.op,
                        buffer: resolved.buffer,
                    });
                }
                accesses.push((resolved, access));
            }
        }
        // Rule 10, where every argument resolved and the count is the signature's (else rules 1
        // and 2 have said what is wrong).
        if shapes.len() == signature.len() && launch.args.len() >= signature.len() {
            if let Err(error) = shapes::check(launch.op, &shapes, &self.shape_context) {
                out.push(PlanViolation::LaunchShape { instruction: index, op: launch.op, problem: error.to_string() });
            }
        }
        for &(resolved, access) in &accesses {
            if access.reads() {
                self.read(index, stream, resolved, launch.layer, out);
            }
        }
        for &(resolved, access) in &accesses {
            if access.writes() {
                self.write(index, stream, resolved, out);
            }
        }
    }

    fn event_exists(&self, instruction: usize, event: EventId, out: &mut Vec<PlanViolation>) -> bool {
        let exists = event.0 < self.plan.events;
        if !exists {
            out.push(PlanViolation::NoSuchEvent { instruction, event, events: self.plan.events });
        }
        exists
    }

    /// Checks the region's buffer id and rows; `None` when the buffer does not exist.
    fn resolve(&self, instruction: usize, region: Region, out: &mut Vec<PlanViolation>) -> Option<Resolved> {
        let Some(buffer) = buffer_ref(self.plan, region.buffer) else {
            out.push(PlanViolation::NoSuchBuffer {
                instruction,
                buffer: region.buffer,
                buffers: self.plan.buffers.len(),
            });
            return None;
        };
        let space = match buffer.buffer.place {
            Place::Device { .. } => Space::Arena,
            Place::Host { .. } => Space::HostSlab,
        };
        let mut resolved = Resolved { buffer, space, bytes: None };
        if region.start > region.end || region.end > buffer.buffer.rows {
            out.push(PlanViolation::RowsOutOfBounds { instruction, buffer, start: region.start, end: region.end });
            return Some(resolved);
        }
        if let Some(Some(extent)) = self.extents.get(region.buffer.index()) {
            // In bounds and the size fits, so these products fit in u64; the sums may not.
            let row_bytes = u128::from(buffer.buffer.row_bytes);
            let start = u128::from(extent.start) + u128::from(region.start) * row_bytes;
            let end = u128::from(extent.start) + u128::from(region.end) * row_bytes;
            if let (Ok(start), Ok(end)) = (u64::try_from(start), u64::try_from(end)) {
                resolved.bytes = Some(ByteRange { space, start, end });
            }
        }
        Some(resolved)
    }

    /// Rule 1 for copies: host <-> device, on the stream of its direction, equal byte counts.
    fn check_copy(
        &self,
        instruction: usize,
        stream: Stream,
        src: Resolved,
        dst: Resolved,
        out: &mut Vec<PlanViolation>,
    ) {
        match (src.space, dst.space) {
            (Space::Arena, Space::HostSlab) | (Space::HostSlab, Space::Arena) => {
                let expected = if src.space == Space::Arena { Stream::DeviceToHost } else { Stream::HostToDevice };
                if stream != expected {
                    out.push(PlanViolation::CopyWrongStream { instruction, stream, expected });
                }
            }
            _ => out.push(PlanViolation::CopyNotHostDevice { instruction, src: src.buffer, dst: dst.buffer }),
        }
        if let (Some(s), Some(d)) = (src.bytes, dst.bytes) {
            let (src_bytes, dst_bytes) = (s.end - s.start, d.end - d.start);
            if src_bytes != dst_bytes {
                out.push(PlanViolation::CopySizeMismatch {
                    instruction,
                    src: src.buffer,
                    src_bytes,
                    dst: dst.buffer,
                    dst_bytes,
                });
            }
        }
    }

    fn space(&mut self, space: Space) -> &mut Bytes {
        match space {
            Space::Arena => &mut self.arena,
            Space::HostSlab => &mut self.host,
        }
    }

    /// Rule 4: the bytes read hold this buffer's data, written before the read; and rule 8's
    /// reading side: a reader of layer `layer` does not read rows a swap-in restored for another
    /// layer.
    fn read(
        &mut self,
        instruction: usize,
        stream: Stream,
        target: Resolved,
        layer: Option<u32>,
        out: &mut Vec<PlanViolation>,
    ) {
        let Some(range) = target.bytes.filter(|r| r.start < r.end) else { return };
        let clock = self.clocks[stream.index()];
        let me = Touch { instruction, buffer: target.buffer.id, stream, tick: clock[stream.index()] };
        let initialised = target.buffer.buffer.kind.initialised_before_step();
        let plan = self.plan;
        let swapped_in_for_other = |writer: &Touch| match (layer, plan.instructions.get(writer.instruction)) {
            (Some(layer), Some(i)) if i.stream == Stream::HostToDevice => {
                matches!(&i.action, Action::Copy { tensor, .. } if tensor.layer != layer)
            }
            _ => false,
        };
        let mut found = Findings::default();
        let mut visited = 0u64;
        for (&start, (end, cell)) in self.space(range.space).range_mut(range.start, range.end) {
            visited += 1;
            match cell.writer {
                None if !initialised => found.add(Problem::Unwritten, None, start, *end),
                None => {}
                Some(writer) if writer.buffer != me.buffer => found.add(Problem::Clobbered, Some(writer), start, *end),
                Some(writer) if !writer.happens_before(stream, &clock) => {
                    found.add(Problem::NotReady, Some(writer), start, *end)
                }
                Some(writer) if swapped_in_for_other(&writer) => {
                    found.add(Problem::SwappedInForOtherLayer, Some(writer), start, *end)
                }
                Some(_) => {}
            }
            cell.readers[stream.index()] = Some(me);
        }
        self.work = self.work.saturating_add(visited);
        found.report(self.plan, me, target.buffer, range.space, layer, out);
    }

    /// Rule 5: every earlier access of the bytes on another stream happens-before the write.
    fn write(&mut self, instruction: usize, stream: Stream, target: Resolved, out: &mut Vec<PlanViolation>) {
        let Some(range) = target.bytes.filter(|r| r.start < r.end) else { return };
        let clock = self.clocks[stream.index()];
        let me = Touch { instruction, buffer: target.buffer.id, stream, tick: clock[stream.index()] };
        let mut found = Findings::default();
        let mut visited = 0u64;
        for (&start, (end, cell)) in self.space(range.space).range_mut(range.start, range.end) {
            visited += 1;
            if let Some(writer) = cell.writer.filter(|w| !w.happens_before(stream, &clock)) {
                found.add(Problem::RaceWithWrite, Some(writer), start, *end);
            }
            for reader in cell.readers.iter().flatten().filter(|r| !r.happens_before(stream, &clock)) {
                found.add(Problem::RaceWithRead, Some(*reader), start, *end);
            }
            *cell = Cell { writer: Some(me), readers: [None; STREAMS] };
        }
        self.work = self.work.saturating_add(visited);
        found.report(self.plan, me, target.buffer, range.space, None, out);
    }
}

/// The problems of one access, merged per (problem, other instruction) into spanning ranges. A
/// map, so an access over bytes written by thousands of instructions stays linear-logarithmic.
#[derive(Default)]
struct Findings {
    /// (problem, other instruction) -> (the other access, first byte, end).
    items: BTreeMap<(Problem, Option<usize>), Finding>,
}

/// The other access of a finding and the bytes `[start, end)` spanning it.
type Finding = (Option<Touch>, u64, u64);

impl Findings {
    fn add(&mut self, problem: Problem, other: Option<Touch>, start: u64, end: u64) {
        let item = self.items.entry((problem, other.map(|o| o.instruction))).or_insert((other, start, end));
        item.1 = item.1.min(start);
        item.2 = item.2.max(end);
    }

    /// `layer`: the reader's layer, for [`Problem::SwappedInForOtherLayer`].
    fn report(
        self,
        plan: &Plan,
        me: Touch,
        buffer: BufferRef,
        space: Space,
        layer: Option<u32>,
        out: &mut Vec<PlanViolation>,
    ) {
        let instruction = me.instruction;
        for ((problem, _), (other, start, end)) in self.items {
            let bytes = ByteRange { space, start, end };
            let other_ref = other.and_then(|o| buffer_ref(plan, o.buffer));
            let swap_in = other.and_then(|o| match plan.instructions.get(o.instruction).map(|i| &i.action) {
                Some(Action::Copy { tensor, .. }) => Some((o.instruction, *tensor)),
                _ => None,
            });
            if let (Problem::SwappedInForOtherLayer, Some(layer), Some((swap_in, tensor))) = (problem, layer, swap_in) {
                out.push(PlanViolation::SwappedInForOtherLayer { instruction, layer, buffer, bytes, swap_in, tensor });
                continue;
            }
            out.push(match (problem, other, other_ref) {
                (Problem::Clobbered, Some(w), Some(writer_buffer)) => {
                    PlanViolation::ReadClobbered { instruction, buffer, bytes, writer: w.instruction, writer_buffer }
                }
                (Problem::NotReady, Some(w), _) => PlanViolation::ReadNotReady {
                    instruction,
                    stream: me.stream,
                    buffer,
                    bytes,
                    writer: w.instruction,
                    writer_stream: w.stream,
                },
                (Problem::RaceWithRead | Problem::RaceWithWrite, Some(o), Some(other_buffer)) => PlanViolation::Race {
                    instruction,
                    stream: me.stream,
                    buffer,
                    bytes,
                    other: o.instruction,
                    other_stream: o.stream,
                    other_buffer,
                    other_access: if problem == Problem::RaceWithRead { Access::Read } else { Access::Write },
                },
                // Unwritten, and (unreachable) findings whose other party is missing.
                _ => PlanViolation::ReadUnwritten { instruction, buffer, bytes },
            });
        }
    }
}

/// Each buffer's live range `[first, last]` in instruction indices (rule 6): from its first
/// touch (0 if it holds data before the step) to its last touch; the kinds that persist across
/// steps (parameters, gradients, optimizer state, scalars) span the whole step. `None`: never touched and empty before the step, or a plan
/// without instructions.
fn live_ranges(plan: &Plan) -> Vec<Option<(usize, usize)>> {
    let mut touched: Vec<Option<(usize, usize)>> = alloc::vec![None; plan.buffers.len()];
    let mut touch = |region: &Region, index: usize| {
        if let Some(slot) = touched.get_mut(region.buffer.index()) {
            *slot = Some(slot.map_or((index, index), |(first, last)| (first.min(index), last.max(index))));
        }
    };
    for (index, instruction) in plan.instructions.iter().enumerate() {
        match &instruction.action {
            Action::Launch(launch) => launch.args.iter().for_each(|arg| touch(&arg.region, index)),
            Action::Copy { src, dst, .. } => {
                touch(src, index);
                touch(dst, index);
            }
            Action::Record(_) | Action::Wait(_) => {}
        }
    }
    let Some(last_instruction) = plan.instructions.len().checked_sub(1) else {
        return alloc::vec![None; plan.buffers.len()];
    };
    plan.buffers
        .iter()
        .zip(touched)
        .map(|(buffer, touched)| {
            // These keep their bytes across steps: the arena holds them over the whole step.
            let persists = matches!(
                buffer.kind,
                BufferKind::Parameter | BufferKind::OptimizerState | BufferKind::Gradient | BufferKind::Scalar
            );
            if persists {
                return Some((0, last_instruction));
            }
            let (first, last) = match (touched, buffer.kind.initialised_before_step()) {
                (Some((_, last)), true) => (0, last),
                (None, true) => (0, 0),
                (Some(range), false) => range,
                (None, false) => return None,
            };
            Some((first, last))
        })
        .collect()
}

/// An arena buffer with bytes and a live range `[first, last]`: bytes `[start, end)`.
#[derive(Clone, Copy)]
struct LiveDevice {
    first: usize,
    last: usize,
    start: u64,
    end: u128,
    index: usize,
}

fn live_device_buffers(extents: &[Option<Extent>], live: &[Option<(usize, usize)>]) -> Vec<LiveDevice> {
    extents
        .iter()
        .zip(live)
        .enumerate()
        .filter_map(|(index, (extent, live))| {
            let (extent, (first, last)) = ((*extent)?, (*live)?);
            (extent.space == Space::Arena && extent.bytes > 0).then_some(LiveDevice {
                first,
                last,
                start: extent.start,
                end: extent.end,
                index,
            })
        })
        .collect()
}

/// Rule 6: device buffers live at the same instruction share no arena bytes. Every overlapping
/// pair is reported once, at the later live range's first instruction (ties: the higher index).
///
/// A sweep over the instructions: buffers enter in order of their first instruction and leave
/// once an entering one starts after their last. Each entering buffer is compared only with the
/// live ones whose bytes it meets, found in an [`EndTree`] over the buffers sorted by first byte:
/// O((buffers + pairs reported) log buffers), where comparing each with every buffer that starts
/// inside its live range was quadratic in layers (the model state is live over the whole step).
fn check_overlap(
    plan: &Plan,
    extents: &[Option<Extent>],
    live: &[Option<(usize, usize)>],
    out: &mut Vec<PlanViolation>,
) -> u64 {
    let items = live_device_buffers(extents, live);
    // Entering order: (first instruction, index); leaving order: last instruction.
    let mut entering: Vec<usize> = (0..items.len()).collect();
    entering.sort_unstable_by_key(|&i| (items[i].first, items[i].index));
    let mut leaving = entering.clone();
    leaving.sort_unstable_by_key(|&i| items[i].last);
    // Each item's slot among the items sorted by first byte.
    let mut by_start: Vec<usize> = (0..items.len()).collect();
    by_start.sort_unstable_by_key(|&i| (items[i].start, items[i].index));
    let mut slot = alloc::vec![0usize; items.len()];
    for (position, &i) in by_start.iter().enumerate() {
        slot[i] = position;
    }
    let mut tree = EndTree::new(items.len());
    let mut left = 0;
    let mut met = Vec::new();
    for &i in &entering {
        let b = items[i];
        while let Some(&gone) = leaving.get(left).filter(|&&gone| items[gone].last < b.first) {
            tree.set(slot[gone], 0);
            left += 1;
        }
        // The live buffers starting below b's end, then those of them ending above b's start.
        let below = by_start.partition_point(|&j| u128::from(items[j].start) < b.end);
        met.clear();
        tree.collect_above(below, u128::from(b.start), &mut met);
        met.sort_unstable();
        for &position in &met {
            let a = items[by_start[position]];
            let (start, end) = (a.start.max(b.start), a.end.min(b.end));
            let (low, high) = (a.index.min(b.index), a.index.max(b.index));
            let (Some(first), Some(second)) = (buffer_ref(plan, id_of(low)), buffer_ref(plan, id_of(high))) else {
                continue;
            };
            out.push(PlanViolation::Overlap {
                instruction: b.first,
                first,
                second,
                bytes: ByteRange { space: Space::Arena, start, end: u64::try_from(end).unwrap_or(u64::MAX) },
            });
        }
        tree.set(slot[i], b.end);
    }
    (items.len() as u64).saturating_add(tree.visited)
}

/// A max tree over slots: each slot holds the end of a live buffer's bytes, or 0 when the slot's
/// buffer is not live (a live buffer has bytes, so its end is above 0).
struct EndTree {
    /// Leaves at `leaves..2 * leaves`; node `n`'s children at `2n` and `2n + 1`.
    max: Vec<u128>,
    leaves: usize,
    /// Nodes visited by [`EndTree::collect_above`] so far (the checker's work count).
    visited: u64,
}

impl EndTree {
    fn new(slots: usize) -> Self {
        let leaves = slots.max(1).next_power_of_two();
        EndTree { max: alloc::vec![0; 2 * leaves], leaves, visited: 0 }
    }

    fn set(&mut self, slot: usize, end: u128) {
        let mut node = self.leaves + slot;
        if let Some(leaf) = self.max.get_mut(node) {
            *leaf = end;
        }
        while node > 1 {
            node /= 2;
            self.max[node] = self.max[2 * node].max(self.max[2 * node + 1]);
        }
    }

    /// Pushes every slot below `below` whose end is above `start` (any order). Visits only
    /// subtrees that hold one: O((1 + found) log slots).
    fn collect_above(&mut self, below: usize, start: u128, found: &mut Vec<usize>) {
        // (node, first slot it covers, slots it covers)
        let mut stack = alloc::vec![(1usize, 0usize, self.leaves)];
        while let Some((node, first, width)) = stack.pop() {
            self.visited += 1;
            if first >= below || self.max[node] <= start {
                continue;
            }
            if width == 1 {
                found.push(first);
                continue;
            }
            let half = width / 2;
            stack.push((2 * node + 1, first + half, half));
            stack.push((2 * node, first, half));
        }
    }
}

/// Rule 7: every total equals what the buffers and instructions give.
fn check_totals(
    plan: &Plan,
    extents: &[Option<Extent>],
    live: &[Option<(usize, usize)>],
    out: &mut Vec<PlanViolation>,
) {
    let (mut arena, mut host, mut parameters, mut rounding) = (0u128, 0u128, 0u128, 0u128);
    for (buffer, extent) in plan.buffers.iter().zip(extents) {
        let Some(extent) = extent else { continue };
        if extent.bytes > 0 {
            match extent.space {
                Space::Arena => arena = arena.max(extent.end),
                Space::HostSlab => host = host.max(extent.end),
            }
        }
        match buffer.kind {
            BufferKind::Parameter | BufferKind::Gradient | BufferKind::OptimizerState => {
                parameters += u128::from(extent.bytes)
            }
            BufferKind::RoundingBuffer => rounding += u128::from(extent.bytes),
            _ => {}
        }
    }
    // Live bytes per instruction by a difference array over the live ranges.
    // At most 2^32 buffers of under 2^64 bytes each: the sums fit in i128.
    let mut delta = alloc::vec![0i128; plan.instructions.len() + 1];
    for b in live_device_buffers(extents, live) {
        let bytes = (b.end - u128::from(b.start)) as i128;
        if let Some(d) = delta.get_mut(b.first) {
            *d += bytes;
        }
        if let Some(d) = delta.get_mut(b.last + 1) {
            *d -= bytes;
        }
    }
    let (mut running, mut lower_bound) = (0i128, 0i128);
    for d in &delta {
        running += d;
        lower_bound = lower_bound.max(running);
    }
    let totals = &plan.totals;
    let pairs = [
        (Total::ArenaBytes, totals.arena_bytes, arena),
        (Total::ArenaLowerBoundBytes, totals.arena_lower_bound_bytes, lower_bound as u128),
        (Total::HostBytes, totals.host_bytes, host),
        (Total::ParameterBytes, totals.parameter_bytes, parameters),
        (Total::RoundingBufferBytes, totals.rounding_buffer_bytes, rounding),
    ];
    for (total, claimed, actual) in pairs {
        if u128::from(claimed) != actual {
            out.push(PlanViolation::TotalMismatch { total, claimed, actual });
        }
    }
    if totals.arena_lower_bound_bytes > totals.arena_bytes {
        out.push(PlanViolation::LowerBoundAboveArena {
            lower_bound: totals.arena_lower_bound_bytes,
            arena_bytes: totals.arena_bytes,
        });
    }
}

/// Bytes of `region` of its buffer (0 when the buffer does not exist, saturated on overflow).
fn region_bytes(plan: &Plan, region: &Region) -> u64 {
    plan.buffer(region.buffer).map_or(0, |b| region.end.saturating_sub(region.start).saturating_mul(b.row_bytes))
}

/// Rule 9, one program: every all-gather's output is `t` times its input, every reduce-scatter's
/// input `t` times its output (in bytes).
fn check_collective_sizes(plan: &Plan, out: &mut Vec<PlanViolation>) {
    let ranks = plan.provenance.parallel.tensor;
    for (instruction, i) in plan.instructions.iter().enumerate() {
        let Action::Launch(launch) = &i.action else { continue };
        let (Some(x), Some(y)) = (launch.args.first(), launch.args.get(1)) else { continue };
        let (input_bytes, output_bytes) = (region_bytes(plan, &x.region), region_bytes(plan, &y.region));
        let times = |bytes: u64| u128::from(bytes) * u128::from(ranks);
        let wrong = match launch.op {
            Op::AllGather => u128::from(output_bytes) != times(input_bytes),
            Op::ReduceScatter => u128::from(input_bytes) != times(output_bytes),
            _ => false,
        };
        if wrong {
            out.push(PlanViolation::CollectiveSize { instruction, op: launch.op, ranks, input_bytes, output_bytes });
        }
    }
}

/// The collectives of the tensor-parallel group and of the data group in `program`, in issue
/// order: (instruction, what rule 9 compares). Both groups' collectives share the collective
/// stream, so their interleaving must be the same on every rank too. The ring's exchanges are
/// compared pairwise instead ([`ring_exchanges`]).
fn collectives(plan: &Plan, program: &[Instruction]) -> Vec<(usize, CollectiveCall)> {
    program
        .iter()
        .enumerate()
        .filter_map(|(index, i)| match &i.action {
            Action::Launch(launch)
                if matches!(launch.op.collective_group(), Some(CollectiveGroup::Tensor | CollectiveGroup::Data)) =>
            {
                let bytes = launch.args.iter().map(|arg| region_bytes(plan, &arg.region)).collect();
                Some((index, CollectiveCall { op: launch.op, bytes }))
            }
            _ => None,
        })
        .collect()
}

/// The `ring_exchange`s of `program` in issue order: (bytes sent, bytes received).
fn ring_exchanges(plan: &Plan, program: &[Instruction]) -> Vec<(u64, u64)> {
    program
        .iter()
        .filter_map(|i| match &i.action {
            Action::Launch(launch) if launch.op == Op::RingExchange => {
                let bytes =
                    |position: usize| launch.args.get(position).map_or(0, |arg| region_bytes(plan, &arg.region));
                Some((bytes(0), bytes(1)))
            }
            _ => None,
        })
        .collect()
}

/// The rank programs (`Plan::rank_programs`): keys in `0..c*t` (global ranks
/// `context_rank * t + tensor_rank`) and increasing; every rule of one program (1-6, 8, 9's sizes
/// and 10, with the program's ranks) on each, reported inside [`PlanViolation::InRankProgram`];
/// rule 9 across ranks: every rank's sequence of tensor-parallel and data-group collectives equals
/// rank 0's; and the ring: the `n`-th `ring_exchange` of each context rank sends what the `n`-th
/// of the next context rank receives.
fn check_rank_programs(plan: &Plan, extents: &[Option<Extent>], out: &mut Vec<PlanViolation>) -> u64 {
    let mut work = 0u64;
    let t = plan.provenance.parallel.tensor.max(1);
    let c = plan.provenance.parallel.context.max(1);
    let ranks = t.saturating_mul(c);
    let mut previous: Option<u32> = None;
    for (index, program) in plan.rank_programs.iter().enumerate() {
        let rank = program.rank;
        if u64::from(rank) >= ranks {
            out.push(PlanViolation::BadRank { program: index, rank, ranks, previous: None });
        } else if let Some(before) = previous.filter(|&before| rank <= before) {
            out.push(PlanViolation::BadRank { program: index, rank, ranks, previous: Some(before) });
        }
        previous = Some(rank);
        let view = Plan {
            provenance: plan.provenance.clone(),
            buffers: plan.buffers.clone(),
            events: plan.events,
            instructions: program.instructions.clone(),
            rank_programs: Vec::new(),
            totals: plan.totals,
        };
        let mut inner = Vec::new();
        let coordinates = (u64::from(rank) / t, u64::from(rank) % t);
        work = work.saturating_add(Simulation::new(&view, extents, coordinates).run(&mut inner));
        let live = live_ranges(&view);
        work = work.saturating_add(check_overlap(&view, extents, &live, &mut inner));
        check_collective_sizes(&view, &mut inner);
        inner.sort_by_key(PlanViolation::sort_key);
        out.extend(inner.into_iter().map(|v| PlanViolation::InRankProgram { rank, violation: Box::new(v) }));
    }
    // Rule 9 across ranks, against rank 0's program: each listed rank's, and the shared program
    // when rank 0 has its own and some other rank runs the shared one.
    let reference = collectives(plan, plan.program(0));
    let listed = |rank: u64| plan.rank_programs.iter().any(|p| u64::from(p.rank) == rank);
    let mut others: Vec<(u32, &[Instruction])> = plan
        .rank_programs
        .iter()
        .filter(|p| p.rank != 0 && u64::from(p.rank) < ranks)
        .map(|p| (p.rank, &p.instructions[..]))
        .collect();
    if listed(0) {
        if let Some(rank) = first_on_shared(plan, t, c) {
            others.push((rank, &plan.instructions[..]));
        }
    }
    for (rank, program) in others {
        let found = collectives(plan, program);
        let length = reference.len().max(found.len());
        if let Some(position) = (0..length).find(|&n| reference.get(n).map(|c| &c.1) != found.get(n).map(|c| &c.1)) {
            out.push(PlanViolation::CollectiveMismatch {
                rank,
                position,
                instruction: found.get(position).map(|c| c.0),
                expected: reference.get(position).map(|c| c.1.clone()),
                found: found.get(position).map(|c| c.1.clone()),
            });
        }
    }
    check_ring(plan, t, c, out);
    work
}

/// The first global rank that runs the shared program while rank 0 has its own, if any: the
/// first tensor-parallel rank of context rank 0 without an entry, else rank `k * t` of the first
/// context rank `k >= 1` without one (found in `O(entries)` steps whatever `t` and `c` claim).
fn first_on_shared(plan: &Plan, t: u64, c: u64) -> Option<u32> {
    let listed = |rank: u64| plan.rank_programs.iter().any(|p| u64::from(p.rank) == rank);
    let bound = plan.rank_programs.len() as u64 + 1;
    let rank = match (0..t.min(bound)).find(|&j| !listed(j)) {
        Some(j) => Some(j),
        None if t <= bound => (1..c.min(bound + 1)).map(|k| k.saturating_mul(t)).find(|&r| !listed(r)),
        None => None,
    };
    rank.and_then(|r| u32::try_from(r).ok())
}

/// Rule 9's ring: for each context rank `k` and tensor-parallel rank `j`, the `n`-th
/// `ring_exchange` of global rank `k*t + j` sends as many bytes as the `n`-th of `((k+1) mod c)*t
/// + j` receives, and both have the same number of exchanges. Only the pairs whose programs can
/// differ are compared: those with an entry in [`Plan::rank_programs`] on either side, and one
/// pair of the context ranks' own programs (so the work is bounded by the entries, not by `c t`).
fn check_ring(plan: &Plan, t: u64, c: u64, out: &mut Vec<PlanViolation>) {
    use alloc::collections::BTreeSet;
    let ranks = t.saturating_mul(c);
    let keys: BTreeSet<u64> = plan.rank_programs.iter().map(|p| u64::from(p.rank)).filter(|&r| r < ranks).collect();
    let before = |k: u64| if k == 0 { c - 1 } else { k - 1 };
    // The context ranks whose programs can differ from the shared one, and their predecessors.
    let mut senders: BTreeSet<u64> = BTreeSet::new();
    senders.insert(0);
    senders.insert(c - 1);
    for &key in &keys {
        let k = key / t;
        senders.insert(k);
        senders.insert(before(k));
    }
    let mut compared: BTreeSet<(u64, u64)> = BTreeSet::new();
    for &k in &senders {
        let next = (k + 1) % c;
        // The tensor-parallel ranks with an entry on either side, and the first without one.
        let mut tensor_ranks: BTreeSet<u64> =
            keys.iter().filter(|&&key| key / t == k || key / t == next).map(|&key| key % t).collect();
        if let Some(j) = (0..t.min(tensor_ranks.len() as u64 + 1)).find(|j| !tensor_ranks.contains(j)) {
            tensor_ranks.insert(j);
        }
        for j in tensor_ranks {
            let global = |context: u64| u32::try_from(context.saturating_mul(t).saturating_add(j));
            let (Ok(from), Ok(to)) = (global(k), global(next)) else { continue };
            let (sender, receiver) = (plan.program(from), plan.program(to));
            // The same pair of programs needs comparing once (their addresses say which).
            let pair = (sender.as_ptr() as u64, receiver.as_ptr() as u64);
            if !compared.insert(pair) {
                continue;
            }
            let sent = ring_exchanges(plan, sender);
            let received = ring_exchanges(plan, receiver);
            let length = sent.len().max(received.len());
            let sent_at = |n: usize| sent.get(n).map(|e| e.0);
            let received_at = |n: usize| received.get(n).map(|e| e.1);
            if let Some(exchange) = (0..length).find(|&n| sent_at(n) != received_at(n)) {
                out.push(PlanViolation::RingExchangeMismatch {
                    sender: u32::try_from(k).unwrap_or(u32::MAX),
                    receiver: u32::try_from(next).unwrap_or(u32::MAX),
                    tensor_rank: u32::try_from(j).unwrap_or(u32::MAX),
                    exchange,
                    sent: sent_at(exchange),
                    received: received_at(exchange),
                });
            }
        }
    }
}
