//! What [`super::check_plan`] reports: [`PlanViolation`], one variant per rule of
//! `spec/validity.md`, each carrying the ids (instruction, buffer, event, byte range) that find it.

use alloc::boxed::Box;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

use crate::plan::{Access, Buffer, BufferId, EventId, Op, Stream, TensorRows};

/// One collective as rule 9 compares it across ranks: the op and the bytes of each argument.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CollectiveCall {
    /// The op.
    pub op: Op,
    /// Bytes of each argument, in signature order.
    pub bytes: Vec<u64>,
}

impl fmt::Display for CollectiveCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} of", self.op.name())?;
        for (index, bytes) in self.bytes.iter().enumerate() {
            let separator = if index == 0 { " " } else { " and " };
            write!(f, "{separator}{bytes}")?;
        }
        f.write_str(" bytes")
    }
}

/// A buffer named in a report: its id and a copy of its description, so a violation prints the
/// tensor ("#7 layer 3 fc1_out (transient)") without the plan at hand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferRef {
    /// Its index in `Plan::buffers`.
    pub id: BufferId,
    /// The buffer as the plan has it.
    pub buffer: Buffer,
}

impl fmt::Display for BufferRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{} {}", self.id.0, self.buffer)
    }
}

/// One of the two address spaces a plan places buffers in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Space {
    /// The one device arena.
    Arena,
    /// The pinned host slab.
    HostSlab,
}

impl Space {
    /// `arena` or `host slab`.
    pub fn name(self) -> &'static str {
        match self {
            Space::Arena => "arena",
            Space::HostSlab => "host slab",
        }
    }
}

/// Bytes `[start, end)` of one address space. Where a violation concerns several byte ranges of
/// one argument, this is the smallest range spanning them all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteRange {
    /// Which space.
    pub space: Space,
    /// The first byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
}

impl fmt::Display for ByteRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} bytes [{}, {})", self.space.name(), self.start, self.end)
    }
}

/// One of the totals a plan claims ([`crate::plan::Totals`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Total {
    /// `arena_bytes`: the highest end of a device buffer.
    ArenaBytes,
    /// `arena_lower_bound_bytes`: the most bytes of device buffers live at one instruction.
    ArenaLowerBoundBytes,
    /// `host_bytes`: the highest end of a host slot.
    HostBytes,
    /// `parameter_bytes`: parameters, gradients and optimizer state.
    ParameterBytes,
    /// `rounding_buffer_bytes`: the rounding buffers' tensors.
    RoundingBufferBytes,
}

impl Total {
    /// The field's name in `Totals`.
    pub fn name(self) -> &'static str {
        match self {
            Total::ArenaBytes => "arena_bytes",
            Total::ArenaLowerBoundBytes => "arena_lower_bound_bytes",
            Total::HostBytes => "host_bytes",
            Total::ParameterBytes => "parameter_bytes",
            Total::RoundingBufferBytes => "rounding_buffer_bytes",
        }
    }
}

/// One way a plan breaks the rules of `spec/validity.md`. `instruction` fields are indices into
/// `Plan::instructions`; the rule each variant enforces is in that file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanViolation {
    /// `rows * row_bytes` of a buffer does not fit in 64 bits.
    SizeOverflow {
        /// The buffer.
        buffer: BufferRef,
    },
    /// A host slot placed in the arena, or another kind placed in the host slab.
    PlaceMismatch {
        /// The buffer.
        buffer: BufferRef,
    },
    /// A device buffer ends past `totals.arena_bytes`.
    OutsideArena {
        /// The buffer.
        buffer: BufferRef,
        /// Its end, `offset + bytes` (may exceed 64 bits).
        end: u128,
        /// `totals.arena_bytes`.
        arena_bytes: u64,
    },
    /// A host slot ends past `totals.host_bytes`.
    OutsideHostSlab {
        /// The buffer.
        buffer: BufferRef,
        /// Its end, `offset + bytes` (may exceed 64 bits).
        end: u128,
        /// `totals.host_bytes`.
        host_bytes: u64,
    },
    /// Two device buffers live at the same instruction share arena bytes.
    Overlap {
        /// The first instruction at which both are live.
        instruction: usize,
        /// The lower-numbered buffer.
        first: BufferRef,
        /// The other buffer.
        second: BufferRef,
        /// The bytes both occupy.
        bytes: ByteRange,
    },
    /// An instruction names a buffer id past the end of `Plan::buffers`.
    NoSuchBuffer {
        /// The instruction.
        instruction: usize,
        /// The id it names.
        buffer: BufferId,
        /// `Plan::buffers.len()`.
        buffers: usize,
    },
    /// A Record or Wait names an event id not below `Plan::events`.
    NoSuchEvent {
        /// The instruction.
        instruction: usize,
        /// The id it names.
        event: EventId,
        /// `Plan::events`.
        events: u32,
    },
    /// A launch has a different number of arguments than its op's signature.
    WrongArgCount {
        /// The instruction.
        instruction: usize,
        /// The op.
        op: Op,
        /// `op.signature().len()`.
        expected: usize,
        /// Arguments given.
        found: usize,
    },
    /// A launch argument's access differs from the op's signature at its position.
    WrongAccess {
        /// The instruction.
        instruction: usize,
        /// The op.
        op: Op,
        /// The argument's position.
        arg: usize,
        /// The argument's buffer, when the id exists.
        buffer: Option<BufferRef>,
        /// What the signature says.
        expected: Access,
        /// What the argument says.
        found: Access,
    },
    /// A row range with `start > end` or `end > rows`.
    RowsOutOfBounds {
        /// The instruction.
        instruction: usize,
        /// The buffer.
        buffer: BufferRef,
        /// The range's first row.
        start: u64,
        /// The range's end.
        end: u64,
    },
    /// A launch on another stream than its op's ([`Op::stream`]).
    LaunchWrongStream {
        /// The instruction.
        instruction: usize,
        /// The op.
        op: Op,
        /// The stream it is on.
        stream: Stream,
        /// The op's stream: collective for the collectives, compute for every other op.
        expected: Stream,
    },
    /// A launch argument in the host slab.
    LaunchOnHost {
        /// The instruction.
        instruction: usize,
        /// The op.
        op: Op,
        /// The host buffer.
        buffer: BufferRef,
    },
    /// A copy whose source and destination are both on the device or both on the host.
    CopyNotHostDevice {
        /// The instruction.
        instruction: usize,
        /// The source.
        src: BufferRef,
        /// The destination.
        dst: BufferRef,
    },
    /// A device-to-host copy off the d2h stream, or a host-to-device copy off the h2d stream.
    CopyWrongStream {
        /// The instruction.
        instruction: usize,
        /// The stream it is on.
        stream: Stream,
        /// The stream its direction needs.
        expected: Stream,
    },
    /// A copy whose source and destination ranges hold different byte counts.
    CopySizeMismatch {
        /// The instruction.
        instruction: usize,
        /// The source.
        src: BufferRef,
        /// Bytes of the source range.
        src_bytes: u64,
        /// The destination.
        dst: BufferRef,
        /// Bytes of the destination range.
        dst_bytes: u64,
    },
    /// A swap copy whose host slot holds other rows than the copy names: another layer's, another
    /// tensor's, or other rows of the same tensor (rule 8).
    SwapSlotMismatch {
        /// The copy.
        instruction: usize,
        /// What the copy names.
        tensor: TensorRows,
        /// Its host slot.
        slot: BufferRef,
        /// Whether the slot is the copy's source (a swap-in) rather than its destination.
        swap_in: bool,
        /// The tensor rows the copied range of the slot holds; `None` when the slot names no layer
        /// or its rows pass 2^64.
        holds: Option<TensorRows>,
    },
    /// A swap copy whose device side is not the tensor rows it names: a buffer of another tensor
    /// or of another layer, or other rows (rule 8).
    SwapDeviceMismatch {
        /// The copy.
        instruction: usize,
        /// What the copy names.
        tensor: TensorRows,
        /// Its device side.
        device: BufferRef,
        /// Whether the device side is the copy's destination (a swap-in).
        swap_in: bool,
        /// The device range's first row.
        start: u64,
        /// One past its last row.
        end: u64,
    },
    /// A launch of one layer (or a swap-out naming one) reads bytes whose last write was a
    /// swap-in of another layer's rows (rule 8): the rows restored are not the ones it needs.
    SwappedInForOtherLayer {
        /// The reading instruction.
        instruction: usize,
        /// Its layer (the launch's, or the layer a copy names).
        layer: u32,
        /// The buffer read.
        buffer: BufferRef,
        /// The bytes.
        bytes: ByteRange,
        /// The swap-in that wrote them.
        swap_in: usize,
        /// What that swap-in names.
        tensor: TensorRows,
    },
    /// An event recorded a second time.
    DoubleRecord {
        /// The second (or later) Record.
        instruction: usize,
        /// The event.
        event: EventId,
        /// The first Record.
        first: usize,
    },
    /// A Wait on an event no instruction records.
    WaitUnrecorded {
        /// The Wait.
        instruction: usize,
        /// The event.
        event: EventId,
    },
    /// A Wait on an event first recorded later in list order.
    WaitBeforeRecord {
        /// The Wait.
        instruction: usize,
        /// The event.
        event: EventId,
        /// The first Record of it.
        record: usize,
    },
    /// A read of bytes no instruction has written, of a buffer that holds nothing before the step.
    ReadUnwritten {
        /// The reading instruction.
        instruction: usize,
        /// The buffer read.
        buffer: BufferRef,
        /// The unwritten bytes.
        bytes: ByteRange,
    },
    /// Bytes of the host slab written and never read afterwards: data swapped out that never
    /// comes back (a swap-in is missing, so the backward reads whatever its rounding buffer holds).
    HostWriteNeverRead {
        /// The instruction that wrote them last.
        instruction: usize,
        /// The host slot written.
        buffer: BufferRef,
        /// The bytes never read.
        bytes: ByteRange,
    },
    /// A read of bytes whose last write was to another buffer (they alias and the other one
    /// overwrote this one's data).
    ReadClobbered {
        /// The reading instruction.
        instruction: usize,
        /// The buffer read.
        buffer: BufferRef,
        /// The clobbered bytes.
        bytes: ByteRange,
        /// The instruction that last wrote them.
        writer: usize,
        /// The buffer it wrote.
        writer_buffer: BufferRef,
    },
    /// A read of bytes whose last write (to the same buffer) does not happen-before the read.
    ReadNotReady {
        /// The reading instruction.
        instruction: usize,
        /// Its stream.
        stream: Stream,
        /// The buffer read.
        buffer: BufferRef,
        /// The bytes.
        bytes: ByteRange,
        /// The instruction that last wrote them.
        writer: usize,
        /// Its stream.
        writer_stream: Stream,
    },
    /// A write to bytes that an earlier access on another stream may still be touching (no
    /// Record/Wait chain orders it before the write).
    Race {
        /// The writing instruction.
        instruction: usize,
        /// Its stream.
        stream: Stream,
        /// The buffer written.
        buffer: BufferRef,
        /// The bytes both touch.
        bytes: ByteRange,
        /// The earlier, unordered instruction.
        other: usize,
        /// Its stream.
        other_stream: Stream,
        /// The buffer it touched.
        other_buffer: BufferRef,
        /// Whether it read or wrote them.
        other_access: Access,
    },
    /// A total that differs from what the buffers and instructions give.
    TotalMismatch {
        /// Which total.
        total: Total,
        /// What the plan claims.
        claimed: u64,
        /// What the checker computes.
        actual: u128,
    },
    /// The claimed lower bound is above the claimed arena size.
    LowerBoundAboveArena {
        /// `totals.arena_lower_bound_bytes`.
        lower_bound: u64,
        /// `totals.arena_bytes`.
        arena_bytes: u64,
    },
    /// A rank program for a global rank outside `0..c*t`, or not after the previous one's rank.
    BadRank {
        /// Its index in `Plan::rank_programs`.
        program: usize,
        /// Its rank.
        rank: u32,
        /// `c * t` (`t` without context parallelism).
        ranks: u64,
        /// The previous program's rank, when this one does not come after it.
        previous: Option<u32>,
    },
    /// A violation of rank `rank`'s own program (its instruction indices are that program's).
    InRankProgram {
        /// The rank.
        rank: u32,
        /// What is wrong there.
        violation: Box<PlanViolation>,
    },
    /// A collective whose sizes disagree with the group size: an all-gather's output is not `t`
    /// times its input, a reduce-scatter's input not `t` times its output (rule 9).
    CollectiveSize {
        /// The instruction.
        instruction: usize,
        /// The op.
        op: Op,
        /// `t`.
        ranks: u64,
        /// Bytes of its input `x`.
        input_bytes: u64,
        /// Bytes of its output `y`.
        output_bytes: u64,
    },
    /// A launch whose argument shapes break its op's shape rule in the op table
    /// (`plan::shapes::check`, with the model of the provenance and the program's rank): the
    /// kernel would read or write other bytes than the plan placed (rule 10).
    LaunchShape {
        /// The instruction.
        instruction: usize,
        /// The op.
        op: Op,
        /// The op table's error: the argument and what it needs.
        problem: String,
    },
    /// A launch's argument past its signature that is not a scratch argument: the whole of a
    /// device [`TensorRole::Scratch`](crate::plan::TensorRole::Scratch) transient, written; or
    /// a scratch buffer used as one of a signature's arguments (rule 11).
    BadScratch {
        /// The instruction.
        instruction: usize,
        /// The op.
        op: Op,
        /// The buffer, if it exists.
        buffer: Option<BufferRef>,
        /// What is wrong.
        problem: &'static str,
    },
    /// A launch whose scratch (0 without a scratch argument) is smaller than the backend's
    /// sizer asks for its shapes ([`crate::check::check_plan_scratch`], rule 11): its kernels
    /// would write past it.
    ScratchTooSmall {
        /// The instruction.
        instruction: usize,
        /// The op.
        op: Op,
        /// Bytes the sizer asks.
        needed: u64,
        /// Bytes of the launch's scratch.
        found: u64,
    },
    /// Rank `rank` issues another collective than rank 0 at position `position` of their
    /// collective sequences (another op or other sizes), or one of them has no collective there
    /// (rule 9: every rank issues the same collectives in the same order with the same sizes).
    CollectiveMismatch {
        /// The rank whose program differs from rank 0's.
        rank: u32,
        /// The position in the sequence of collectives, from 0.
        position: usize,
        /// The instruction in rank `rank`'s program, if it has a collective there.
        instruction: Option<usize>,
        /// Rank 0's collective there.
        expected: Option<CollectiveCall>,
        /// Rank `rank`'s.
        found: Option<CollectiveCall>,
    },
    /// The `exchange`-th `ring_exchange` (from 0) of context rank `sender` sends other bytes than
    /// the `exchange`-th of the next context rank `receiver` (`sender + 1 mod c`, same
    /// tensor-parallel rank) receives, or one of them has no such exchange (rule 9's ring: each
    /// send must meet its receive, or the ring deadlocks or delivers the wrong bytes).
    RingExchangeMismatch {
        /// The sending context rank.
        sender: u32,
        /// The receiving context rank, `sender + 1 mod c`.
        receiver: u32,
        /// The tensor-parallel rank of both.
        tensor_rank: u32,
        /// The exchange's number in each program's sequence of ring exchanges, from 0.
        exchange: usize,
        /// The bytes of the sender's `x`, if it has that exchange.
        sent: Option<u64>,
        /// The bytes of the receiver's `y`, if it has that exchange.
        received: Option<u64>,
    },
}

impl PlanViolation {
    /// The variant's name in `spec/validity.md` (snake case), for tests, JSON and tables.
    pub fn name(&self) -> &'static str {
        match self {
            Self::SizeOverflow { .. } => "size_overflow",
            Self::PlaceMismatch { .. } => "place_mismatch",
            Self::OutsideArena { .. } => "outside_arena",
            Self::OutsideHostSlab { .. } => "outside_host_slab",
            Self::Overlap { .. } => "overlap",
            Self::NoSuchBuffer { .. } => "no_such_buffer",
            Self::NoSuchEvent { .. } => "no_such_event",
            Self::WrongArgCount { .. } => "wrong_arg_count",
            Self::LaunchShape { .. } => "launch_shape",
            Self::WrongAccess { .. } => "wrong_access",
            Self::RowsOutOfBounds { .. } => "rows_out_of_bounds",
            Self::LaunchWrongStream { .. } => "launch_wrong_stream",
            Self::LaunchOnHost { .. } => "launch_on_host",
            Self::CopyNotHostDevice { .. } => "copy_not_host_device",
            Self::CopyWrongStream { .. } => "copy_wrong_stream",
            Self::CopySizeMismatch { .. } => "copy_size_mismatch",
            Self::SwapSlotMismatch { .. } => "swap_slot_mismatch",
            Self::SwapDeviceMismatch { .. } => "swap_device_mismatch",
            Self::SwappedInForOtherLayer { .. } => "swapped_in_for_other_layer",
            Self::DoubleRecord { .. } => "double_record",
            Self::WaitUnrecorded { .. } => "wait_unrecorded",
            Self::WaitBeforeRecord { .. } => "wait_before_record",
            Self::ReadUnwritten { .. } => "read_unwritten",
            Self::HostWriteNeverRead { .. } => "host_write_never_read",
            Self::ReadClobbered { .. } => "read_clobbered",
            Self::ReadNotReady { .. } => "read_not_ready",
            Self::Race { .. } => "race",
            Self::TotalMismatch { .. } => "total_mismatch",
            Self::LowerBoundAboveArena { .. } => "lower_bound_above_arena",
            Self::BadRank { .. } => "bad_rank",
            Self::InRankProgram { .. } => "in_rank_program",
            Self::CollectiveSize { .. } => "collective_size",
            Self::CollectiveMismatch { .. } => "collective_mismatch",
            Self::RingExchangeMismatch { .. } => "ring_exchange_mismatch",
            Self::BadScratch { .. } => "bad_scratch",
            Self::ScratchTooSmall { .. } => "scratch_too_small",
        }
    }

    /// The instruction the violation is at, if any (buffer-level and totals violations have none).
    pub fn instruction(&self) -> Option<usize> {
        match *self {
            Self::SizeOverflow { .. }
            | Self::PlaceMismatch { .. }
            | Self::OutsideArena { .. }
            | Self::OutsideHostSlab { .. }
            | Self::TotalMismatch { .. }
            | Self::LowerBoundAboveArena { .. }
            | Self::BadRank { .. }
            | Self::InRankProgram { .. }
            | Self::CollectiveMismatch { .. }
            | Self::RingExchangeMismatch { .. } => None,
            Self::CollectiveSize { instruction, .. }
            | Self::LaunchShape { instruction, .. }
            | Self::BadScratch { instruction, .. }
            | Self::ScratchTooSmall { instruction, .. }
            | Self::Overlap { instruction, .. }
            | Self::NoSuchBuffer { instruction, .. }
            | Self::NoSuchEvent { instruction, .. }
            | Self::WrongArgCount { instruction, .. }
            | Self::WrongAccess { instruction, .. }
            | Self::RowsOutOfBounds { instruction, .. }
            | Self::LaunchWrongStream { instruction, .. }
            | Self::LaunchOnHost { instruction, .. }
            | Self::CopyNotHostDevice { instruction, .. }
            | Self::CopyWrongStream { instruction, .. }
            | Self::CopySizeMismatch { instruction, .. }
            | Self::SwapSlotMismatch { instruction, .. }
            | Self::SwapDeviceMismatch { instruction, .. }
            | Self::SwappedInForOtherLayer { instruction, .. }
            | Self::DoubleRecord { instruction, .. }
            | Self::WaitUnrecorded { instruction, .. }
            | Self::WaitBeforeRecord { instruction, .. }
            | Self::ReadUnwritten { instruction, .. }
            | Self::HostWriteNeverRead { instruction, .. }
            | Self::ReadClobbered { instruction, .. }
            | Self::ReadNotReady { instruction, .. }
            | Self::Race { instruction, .. } => Some(instruction),
        }
    }

    /// The (first) buffer the violation names, if any.
    pub fn buffer(&self) -> Option<BufferId> {
        match self {
            Self::SizeOverflow { buffer }
            | Self::PlaceMismatch { buffer }
            | Self::OutsideArena { buffer, .. }
            | Self::OutsideHostSlab { buffer, .. }
            | Self::RowsOutOfBounds { buffer, .. }
            | Self::LaunchOnHost { buffer, .. }
            | Self::ReadUnwritten { buffer, .. }
            | Self::SwappedInForOtherLayer { buffer, .. }
            | Self::HostWriteNeverRead { buffer, .. }
            | Self::ReadClobbered { buffer, .. }
            | Self::ReadNotReady { buffer, .. }
            | Self::Race { buffer, .. } => Some(buffer.id),
            Self::Overlap { first, .. } => Some(first.id),
            Self::SwapSlotMismatch { slot, .. } => Some(slot.id),
            Self::SwapDeviceMismatch { device, .. } => Some(device.id),
            Self::CopyNotHostDevice { src, .. } | Self::CopySizeMismatch { src, .. } => Some(src.id),
            Self::WrongAccess { buffer, .. } | Self::BadScratch { buffer, .. } => buffer.map(|b| b.id),
            Self::NoSuchBuffer { buffer, .. } => Some(*buffer),
            Self::NoSuchEvent { .. }
            | Self::WrongArgCount { .. }
            | Self::LaunchWrongStream { .. }
            | Self::CopyWrongStream { .. }
            | Self::DoubleRecord { .. }
            | Self::WaitUnrecorded { .. }
            | Self::WaitBeforeRecord { .. }
            | Self::TotalMismatch { .. }
            | Self::LowerBoundAboveArena { .. }
            | Self::BadRank { .. }
            | Self::InRankProgram { .. }
            | Self::CollectiveSize { .. }
            | Self::LaunchShape { .. }
            | Self::ScratchTooSmall { .. }
            | Self::CollectiveMismatch { .. }
            | Self::RingExchangeMismatch { .. } => None,
        }
    }

    /// The violation itself: inside [`PlanViolation::InRankProgram`], the one it wraps.
    pub fn innermost(&self) -> &PlanViolation {
        match self {
            Self::InRankProgram { violation, .. } => violation.innermost(),
            other => other,
        }
    }

    /// The report order: plan-level and buffer-level violations first, then by instruction, then
    /// by buffer (`None` before any id). [`super::check_plan`] sorts stably by it.
    pub fn sort_key(&self) -> (Option<usize>, Option<BufferId>) {
        (self.instruction(), self.buffer())
    }
}

impl fmt::Display for PlanViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::SizeOverflow { buffer } => write!(
                f,
                "buffer {buffer}: {} rows of {} bytes overflow 64 bits; the plan is corrupt",
                buffer.buffer.rows, buffer.buffer.row_bytes
            ),
            Self::PlaceMismatch { buffer } => write!(
                f,
                "buffer {buffer} is placed in the {}; host slots belong in the host slab and every other kind \
                 in the arena",
                if matches!(buffer.buffer.place, crate::plan::Place::Host { .. }) { "host slab" } else { "arena" }
            ),
            Self::OutsideArena { buffer, end, arena_bytes } => write!(
                f,
                "buffer {buffer} ends at arena byte {end}, past the arena's {arena_bytes} bytes (totals.arena_bytes)"
            ),
            Self::OutsideHostSlab { buffer, end, host_bytes } => write!(
                f,
                "buffer {buffer} ends at host byte {end}, past the host slab's {host_bytes} bytes (totals.host_bytes)"
            ),
            Self::Overlap { instruction, first, second, bytes } => write!(
                f,
                "instruction {instruction}: buffers {first} and {second} are both live and share {bytes}; give \
                 them disjoint offsets or lifetimes"
            ),
            Self::NoSuchBuffer { instruction, buffer, buffers } => {
                write!(f, "instruction {instruction}: buffer #{} does not exist (the plan has {buffers})", buffer.0)
            }
            Self::NoSuchEvent { instruction, event, events } => {
                write!(f, "instruction {instruction}: event {} does not exist (the plan has {events})", event.0)
            }
            Self::WrongArgCount { instruction, op, expected, found } => write!(
                f,
                "instruction {instruction}: {} takes {expected} arguments, the launch gives {found}",
                op.name()
            ),
            Self::WrongAccess { instruction, op, arg, buffer, expected, found } => {
                write!(f, "instruction {instruction}: argument {arg} of {} ", op.name())?;
                if let Some(buffer) = buffer {
                    write!(f, "({buffer}) ")?;
                }
                write!(f, "is marked {}, the op's signature says {}", found.name(), expected.name())
            }
            Self::RowsOutOfBounds { instruction, buffer, start, end } => write!(
                f,
                "instruction {instruction}: rows [{start}, {end}) of buffer {buffer} are not within its {} rows",
                buffer.buffer.rows
            ),
            Self::LaunchWrongStream { instruction, op, stream, expected } => write!(
                f,
                "instruction {instruction}: {} is launched on the {} stream; it runs on the {} stream (collectives \
                 on the collective stream, every other kernel on the compute stream)",
                op.name(),
                stream.name(),
                expected.name()
            ),
            Self::LaunchOnHost { instruction, op, buffer } => write!(
                f,
                "instruction {instruction}: {} takes buffer {buffer}, which is in the host slab; kernels read and \
                 write the arena only",
                op.name()
            ),
            Self::CopyNotHostDevice { instruction, src, dst } => {
                write!(f, "instruction {instruction}: copy from {src} to {dst} does not go between host and device")
            }
            Self::CopyWrongStream { instruction, stream, expected } => write!(
                f,
                "instruction {instruction}: copy on the {} stream goes the way of the {} stream",
                stream.name(),
                expected.name()
            ),
            Self::CopySizeMismatch { instruction, src, src_bytes, dst, dst_bytes } => write!(
                f,
                "instruction {instruction}: copy reads {src_bytes} bytes of {src} but writes {dst_bytes} bytes of \
                 {dst}; the row ranges must hold the same bytes"
            ),
            Self::SwapSlotMismatch { instruction, tensor, slot, swap_in, holds } => {
                let (what, side) = if *swap_in { ("swap-in", "reads") } else { ("swap-out", "writes") };
                write!(f, "instruction {instruction}: {what} of {tensor} {side} host slot {slot}, whose rows there ")?;
                match holds {
                    Some(holds) => write!(f, "hold {holds}")?,
                    None => f.write_str("hold no layer's tensor rows")?,
                }
                f.write_str(" (another layer's, tensor's or rows' slot); a swap copies rows only to and from the slot holding them")
            }
            Self::SwapDeviceMismatch { instruction, tensor, device, swap_in, start, end } => write!(
                f,
                "instruction {instruction}: {} of {tensor} {} rows [{start}, {end}) of {device}, which are not those \
                 rows of that tensor",
                if *swap_in { "swap-in" } else { "swap-out" },
                if *swap_in { "writes" } else { "reads" }
            ),
            Self::SwappedInForOtherLayer { instruction, layer, buffer, bytes, swap_in, tensor } => write!(
                f,
                "instruction {instruction} (layer {layer}): reads {bytes} of buffer {buffer}, which swap-in instruction \
                 {swap_in} restored with {tensor}: another layer's rows"
            ),
            Self::DoubleRecord { instruction, event, first } => write!(
                f,
                "instruction {instruction}: event {} is recorded again (first at instruction {first}); record each \
                 event once",
                event.0
            ),
            Self::WaitUnrecorded { instruction, event } => write!(
                f,
                "instruction {instruction}: waits on event {}, which no instruction records (unrecorded event)",
                event.0
            ),
            Self::WaitBeforeRecord { instruction, event, record } => write!(
                f,
                "instruction {instruction}: waits on event {} before instruction {record} records it (wait before \
                 record)",
                event.0
            ),
            Self::ReadUnwritten { instruction, buffer, bytes } => write!(
                f,
                "instruction {instruction}: reads {bytes} of buffer {buffer}, which nothing has written (read of \
                 unwritten data)"
            ),
            Self::HostWriteNeverRead { instruction, buffer, bytes } => write!(
                f,
                "instruction {instruction}: writes {bytes} of host slot {buffer}, which nothing reads afterwards \
                 (swapped out, never swapped back: a swap-in is missing)"
            ),
            Self::ReadClobbered { instruction, buffer, bytes, writer, writer_buffer } => write!(
                f,
                "instruction {instruction}: reads {bytes} of buffer {buffer}, last written by instruction {writer} \
                 to another buffer, {writer_buffer} (clobbered)"
            ),
            Self::ReadNotReady { instruction, stream, buffer, bytes, writer, writer_stream } => write!(
                f,
                "instruction {instruction} ({}): reads {bytes} of buffer {buffer} before instruction {writer} ({}) \
                 that writes them is known to be done (data not ready); add a Record after the write and a Wait \
                 before the read",
                stream.name(),
                writer_stream.name()
            ),
            Self::Race { instruction, stream, buffer, bytes, other, other_stream, other_buffer, other_access } => {
                write!(
                    f,
                    "instruction {instruction} ({}): writes {bytes} of buffer {buffer} while instruction {other} ({}) \
                     may still {} them as {other_buffer} (race); add a Record after it and a Wait before the write",
                    stream.name(),
                    other_stream.name(),
                    if other_access.writes() { "write" } else { "read" }
                )
            }
            Self::TotalMismatch { total, claimed, actual } => {
                write!(f, "totals.{} is {claimed} but the plan gives {actual}", total.name())
            }
            Self::LowerBoundAboveArena { lower_bound, arena_bytes } => {
                write!(f, "totals.arena_lower_bound_bytes {lower_bound} is above totals.arena_bytes {arena_bytes}")
            }
            Self::BadRank { program, rank, ranks, previous } => match previous {
                Some(previous) => write!(
                    f,
                    "rank program {program} is for rank {rank}, not after the previous program's rank {previous}; \
                     list each rank once, in increasing order"
                ),
                None => write!(
                    f,
                    "rank program {program} is for rank {rank}, but the group has {ranks} rank(s) (c x t = {ranks}; \
                     global rank = context rank x t + tensor-parallel rank)"
                ),
            },
            Self::InRankProgram { rank, violation } => write!(f, "in rank {rank}'s own program: {violation}"),
            Self::BadScratch { instruction, op, buffer, problem } => {
                write!(f, "instruction {instruction}: {} ", op.name())?;
                if let Some(buffer) = buffer {
                    write!(f, "({buffer}) ")?;
                }
                write!(
                    f,
                    "{problem} (a launch's scratch is one argument past its signature, the whole of a device \
                     scratch transient, written, and used by no other argument: spec/validity.md rule 11)"
                )
            }
            Self::ScratchTooSmall { instruction, op, needed, found } => write!(
                f,
                "instruction {instruction}: {} needs {needed} bytes of scratch for its shapes on this backend, \
                 the launch has {found} (plan it with the backend's scratch sizer: spec/validity.md rule 11)",
                op.name()
            ),
            Self::LaunchShape { instruction, op: _, problem } => write!(
                f,
                "instruction {instruction}: {problem} (the launch's shapes break the op table for this model, \
                 spec/plan-format.md \"The ops\"; the plan is corrupt or was made for another model)"
            ),
            Self::CollectiveSize { instruction, op, ranks, input_bytes, output_bytes } => {
                let (expected, what) = match op {
                    Op::AllGather => ("its output t times its input", "output"),
                    _ => ("its input t times its output", "input"),
                };
                write!(
                    f,
                    "instruction {instruction}: {} takes {input_bytes} bytes in and gives {output_bytes} bytes out; \
                     with t = {ranks} ranks it needs {expected} (its {what} is wrong)",
                    op.name()
                )
            }
            Self::CollectiveMismatch { rank, position, instruction, expected, found } => {
                write!(f, "collective {position} of rank {rank}")?;
                if let Some(instruction) = instruction {
                    write!(f, " (its instruction {instruction})")?;
                }
                match (expected, found) {
                    (Some(e), Some(x)) => write!(f, " is {x}, but rank 0's is {e}"),
                    (Some(e), None) => write!(f, " is missing: rank 0 issues {e} there"),
                    (None, Some(x)) => write!(f, " is {x}, but rank 0 issues no collective there"),
                    (None, None) => f.write_str(" differs from rank 0's"),
                }?;
                f.write_str(
                    "; every rank must issue the same collectives in the same order with the same sizes, or the \
                     group deadlocks or mixes data",
                )
            }
            Self::RingExchangeMismatch { sender, receiver, tensor_rank, exchange, sent, received } => {
                write!(
                    f,
                    "ring exchange {exchange} from context rank {sender} to context rank {receiver} (tensor-parallel \
                     rank {tensor_rank}): "
                )?;
                match (sent, received) {
                    (Some(s), Some(r)) => write!(f, "{sender} sends {s} bytes, {receiver} receives {r} bytes"),
                    (Some(s), None) => write!(f, "{sender} sends {s} bytes, but {receiver} has no exchange {exchange}"),
                    (None, Some(r)) => {
                        write!(f, "{receiver} receives {r} bytes, but {sender} has no exchange {exchange}")
                    }
                    (None, None) => f.write_str("missing on both"),
                }?;
                f.write_str("; each ring send must meet a receive of the same bytes, or the ring deadlocks")
            }
        }
    }
}

impl core::error::Error for PlanViolation {}
