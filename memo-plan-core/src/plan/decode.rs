//! The plan's byte format, reading side (`spec/plan-format.md`; [`super::encode`] writes it).
//!
//! [`Plan::decode`] takes any bytes and returns a plan or a [`PlanDecodeError`] that says what is
//! wrong, where (byte offset, buffer, instruction) and what to do about it. It never panics, never
//! allocates more than a small multiple of its input (every count is checked against the bytes
//! left, at the fewest bytes its elements can take, before anything is allocated), and runs in
//! time linear in its input.
//!
//! It checks what a reader can check in one pass: the header, the checksum, every code and tag,
//! UTF-8 names, floats that must be finite, and the structure instructions rely on (buffer and
//! event ids in range, row ranges inside their buffer, launches that match their op's
//! signature, buffer sizes that fit in 64 bits, a copy's named tensor rows that do not end
//! before they start). Whether a copy's sides agree with the rows it names is rule 8 of the
//! checker. Whether the program is *safe* (races, overlaps,
//! data read before it is written) is `check::plan`'s question, not the decoder's.

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

use super::encode::{
    action, checksum, ACCESSES, ALPHA_BOUNDS, BUFFER_MIN_BYTES, HEADER_BYTES, INSTRUCTION_MIN_BYTES, PLACE_DEVICE,
    PLACE_HOST, PLAN_MAGIC, RANK_PROGRAM_MIN_BYTES,
};
use super::{
    Access, Action, Arg, Buffer, BufferId, BufferKind, EventId, Instruction, Launch, Op, Place, PlacementSummary, Plan,
    Provenance, RankProgram, Region, Strategy, Stream, TensorRole, TensorRows, Totals, PLAN_FORMAT_VERSION,
};
use crate::model::{Architecture, Biases, Ffn, Hardware, Interconnect, ModelConfig, Norm, Parallelism, RopeScaling};

/// What to do about a plan that does not decode.
const RECREATE: &str = "re-create the plan with `memo plan`";

/// The part of an encoded plan an error is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Section {
    /// The 24-byte header.
    Header,
    /// Everything after the header, as the header's length field delimits it.
    Body,
    /// The model, layout, machine, strategy, α and solver statistics.
    Provenance,
    /// The five sizes.
    Totals,
    /// The buffer count.
    BufferCount,
    /// The buffer with this index.
    Buffer(u32),
    /// The event count.
    Events,
    /// The instruction count.
    InstructionCount,
    /// The instruction with this index.
    Instruction(u32),
    /// The rank-program count.
    RankProgramCount,
    /// The rank program with this index (its rank and instruction count).
    RankProgram(u32),
    /// Instruction `instruction` of the rank program with index `program`.
    RankInstruction {
        /// The rank program's index in the list.
        program: u32,
        /// The instruction's index in its program.
        instruction: u32,
    },
}

impl fmt::Display for Section {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Section::Header => f.write_str("the header"),
            Section::Body => f.write_str("the plan after its header"),
            Section::Provenance => f.write_str("the provenance"),
            Section::Totals => f.write_str("the totals"),
            Section::BufferCount => f.write_str("the buffer count"),
            Section::Buffer(index) => write!(f, "buffer {index}"),
            Section::Events => f.write_str("the event count"),
            Section::InstructionCount => f.write_str("the instruction count"),
            Section::Instruction(index) => write!(f, "instruction {index}"),
            Section::RankProgramCount => f.write_str("the rank-program count"),
            Section::RankProgram(index) => write!(f, "rank program {index}"),
            Section::RankInstruction { program, instruction } => {
                write!(f, "instruction {instruction} of rank program {program}")
            }
        }
    }
}

/// Which region of an instruction an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operand {
    /// A launch's argument: its position and its name in [`Op::signature`].
    Arg {
        /// Position, from 0.
        index: u8,
        /// Its name in the op's signature.
        name: &'static str,
    },
    /// A copy's source.
    Source,
    /// A copy's destination.
    Destination,
}

impl fmt::Display for Operand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Operand::Arg { index, name } => write!(f, "argument {index} (`{name}`)"),
            Operand::Source => f.write_str("the copy's source"),
            Operand::Destination => f.write_str("the copy's destination"),
        }
    }
}

/// Why bytes are not a plan. Offsets are bytes from the start of the encoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanDecodeError {
    /// The bytes do not start with `MEMOPLAN`.
    BadMagic {
        /// The first bytes found (up to 8).
        found: [u8; 8],
        /// How many of `found` there were.
        len: usize,
    },
    /// The header's format version is not [`PLAN_FORMAT_VERSION`].
    UnsupportedVersion {
        /// The version in the file.
        found: u16,
        /// The one version this build reads.
        supported: u16,
    },
    /// The bytes end before a field does.
    Truncated {
        /// Where.
        section: Section,
        /// The field's first byte.
        offset: u64,
        /// Bytes the field (or the elements a count announces) needs.
        needed: u64,
        /// Bytes there are from `offset` on.
        available: u64,
    },
    /// The CRC-32 of the bytes after the header differs from the header's.
    ChecksumMismatch {
        /// The checksum in the header.
        stored: u32,
        /// The checksum of the bytes.
        computed: u32,
    },
    /// A code, tag or header field with a value the format does not define.
    BadCode {
        /// What the field is.
        what: &'static str,
        /// Its value.
        value: u64,
        /// Its first byte.
        offset: u64,
        /// Where.
        at: Section,
    },
    /// A name that is not UTF-8.
    BadUtf8 {
        /// Which name.
        what: &'static str,
        /// The first byte of its length field.
        offset: u64,
    },
    /// A float outside the values it may take.
    BadFloat {
        /// Which field.
        what: &'static str,
        /// Its bit pattern.
        bits: u64,
        /// Its first byte.
        offset: u64,
        /// What it must be.
        expected: &'static str,
    },
    /// Bytes left over after the plan.
    TrailingBytes {
        /// The first byte after the plan.
        offset: u64,
        /// How many bytes follow it.
        count: u64,
    },
    /// Bytes the header's length covers (and the checksum vouches for) after the last
    /// instruction: the counts and the length disagree.
    UnreadBytes {
        /// The first byte after the last instruction.
        offset: u64,
        /// How many bytes follow it, up to the declared length.
        count: u64,
    },
    /// A buffer whose bytes (`rows * row_bytes`), or whose end (`offset + bytes`), does not fit
    /// in 64 bits.
    BufferTooLarge {
        /// The buffer's index.
        buffer: u32,
        /// Its rows.
        rows: u64,
        /// Its bytes per row.
        row_bytes: u64,
        /// Its offset in the arena or the host slab.
        offset: u64,
    },
    /// A buffer whose last row of its tensor (`first_row + rows`) does not fit in 64 bits.
    FirstRowTooLarge {
        /// The buffer's index.
        buffer: u32,
        /// The row of its tensor that its row 0 holds.
        first_row: u64,
        /// Its rows.
        rows: u64,
    },
    /// A copy naming tensor rows `[start, end)` with `end < start`.
    BadTensorRows {
        /// The instruction's index.
        instruction: u32,
        /// First row named.
        start: u64,
        /// One past the last row named.
        end: u64,
    },
    /// An instruction names a buffer the plan does not have.
    BufferOutOfRange {
        /// The instruction's index.
        instruction: u32,
        /// Which of its regions.
        operand: Operand,
        /// The id named.
        buffer: u32,
        /// The plan's buffer count.
        buffers: u32,
    },
    /// A row range with `end < start` or `end > rows`.
    BadRowRange {
        /// The instruction's index.
        instruction: u32,
        /// Which of its regions.
        operand: Operand,
        /// The buffer.
        buffer: u32,
        /// First row.
        start: u64,
        /// One past the last row.
        end: u64,
        /// The buffer's rows.
        rows: u64,
    },
    /// A record or wait of an event `>= Plan::events`.
    EventOutOfRange {
        /// The instruction's index.
        instruction: u32,
        /// `"record"` or `"wait"`.
        action: &'static str,
        /// The event named.
        event: u32,
        /// The plan's event count.
        events: u32,
    },
    /// A launch with another number of arguments than its op's signature.
    ArgumentCount {
        /// The instruction's index.
        instruction: u32,
        /// The op.
        op: Op,
        /// Arguments in the file.
        found: u8,
        /// Arguments of [`Op::signature`].
        expected: u8,
    },
    /// A launch argument whose access differs from its op's signature.
    ArgumentAccess {
        /// The instruction's index.
        instruction: u32,
        /// The op.
        op: Op,
        /// The argument.
        operand: Operand,
        /// The access in the file.
        found: Access,
        /// The access in [`Op::signature`].
        expected: Access,
    },
}

impl fmt::Display for PlanDecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanDecodeError::BadMagic { found, len } => write!(
                f,
                "not a MEMO plan: it starts with b\"{}\" where a plan starts with b\"MEMOPLAN\" \
                 (plans are written by `memo plan`)",
                found.get(..*len).unwrap_or(found).escape_ascii()
            ),
            PlanDecodeError::UnsupportedVersion { found, supported } => {
                write!(
                    f,
                    "this file was written by plan format version {found}; this build reads version {supported} only"
                )?;
                if *found == 1 {
                    // Version 1 plans lack what the checker now requires (swap identities).
                    f.write_str(
                        " (an older format: version 1 plans do not name the layer, tensor and rows of their host \
                         slots and swap copies)",
                    )?;
                } else if *found == 3 {
                    // Version 3 plans describe a GPT model only.
                    f.write_str(
                        " (an older format: version 3 plans do not carry the model's key/value heads and \
                         architecture: FFN, norm, biases, tying, rotary base and scaling, epsilon)",
                    )?;
                } else if *found == 4 {
                    // Version 4 plans keep the kernels' scratch outside the plan.
                    f.write_str(
                        " (an older format: version 4 plans carry no launch scratch, which a GPU backend's kernels \
                         then hold outside the arena)",
                    )?;
                } else if *found == 5 {
                    // Version 5 plans have no context-parallel degree (all were c = 1).
                    f.write_str(
                        " (an older format: version 5 plans do not record the context-parallel degree, and their \
                         rank programs are keyed by tensor-parallel rank only)",
                    )?;
                } else if found < supported {
                    // Version 2 plans have no collective stream, interconnect or per-rank programs.
                    f.write_str(
                        " (an older format: version 2 plans have no collective stream, no interconnect and no \
                         per-rank programs, and their t > 1 programs are not correct per-rank programs)",
                    )?;
                }
                write!(
                    f,
                    ": re-create the plan with this build's `memo plan`, or read it with a build that reads version \
                     {found}"
                )
            }
            PlanDecodeError::Truncated { section, offset, needed, available } => write!(
                f,
                "the plan is cut short in {section} at byte {offset}: {needed} bytes needed, {available} left \
                 (the file is incomplete: copy it again, or {RECREATE})"
            ),
            PlanDecodeError::ChecksumMismatch { stored, computed } => write!(
                f,
                "checksum mismatch: the header says CRC-32 {stored:#010x}, the bytes after it give \
                 {computed:#010x}: the file is damaged (copy it again, or {RECREATE})"
            ),
            PlanDecodeError::BadCode { what, value, offset, at } => write!(
                f,
                "{at}, byte {offset}: {value} is not a valid {what} (spec/plan-format.md lists the values); the \
                 file is damaged or was written by a program that does not follow the format: {RECREATE}"
            ),
            PlanDecodeError::BadUtf8 { what, offset } => write!(
                f,
                "the provenance, byte {offset}: the {what} is not UTF-8; the program that wrote it does not \
                 follow the format: {RECREATE}"
            ),
            PlanDecodeError::BadFloat { what, bits, offset, expected } => write!(
                f,
                "the provenance, byte {offset}: {what} is {} (bits {bits:#018x}), but must be {expected}: {RECREATE}",
                f64::from_bits(*bits)
            ),
            PlanDecodeError::TrailingBytes { offset, count } => write!(
                f,
                "{count} unexpected bytes after the plan, from byte {offset} on (two files joined, or \
                 garbage appended): keep the first {offset} bytes, or {RECREATE}"
            ),
            PlanDecodeError::UnreadBytes { offset, count } => write!(
                f,
                "the last instruction ends at byte {offset}, but the header's length covers {count} more bytes: \
                 the program that wrote it does not follow the format: {RECREATE}"
            ),
            PlanDecodeError::BufferTooLarge { buffer, rows, row_bytes, offset } => {
                match rows.checked_mul(*row_bytes) {
                    None => write!(f, "buffer {buffer}: {rows} rows of {row_bytes} bytes do not fit in 64 bits"),
                    Some(bytes) => write!(f, "buffer {buffer}: {bytes} bytes at offset {offset} end past 2^64"),
                }?;
                write!(f, "; {RECREATE}")
            }
            PlanDecodeError::FirstRowTooLarge { buffer, first_row, rows } => write!(
                f,
                "buffer {buffer}: {rows} rows from row {first_row} of its tensor end past row 2^64; {RECREATE}"
            ),
            PlanDecodeError::BadTensorRows { instruction, start, end } => write!(
                f,
                "instruction {instruction}: the copy names tensor rows [{start}, {end}), whose end is before its \
                 start; {RECREATE}"
            ),
            PlanDecodeError::BufferOutOfRange { instruction, operand, buffer, buffers } => write!(
                f,
                "instruction {instruction}: {operand} names buffer {buffer}, but the plan has {buffers} buffers \
                 (ids 0..{buffers}): {RECREATE}"
            ),
            PlanDecodeError::BadRowRange { instruction, operand, buffer, start, end, rows } => {
                let why =
                    if end < start { "its end is before its start" } else { "it ends past the buffer's last row" };
                write!(
                    f,
                    "instruction {instruction}: {operand} covers rows [{start}, {end}) of buffer {buffer}, which has \
                     {rows} rows: {why}; {RECREATE}"
                )
            }
            PlanDecodeError::EventOutOfRange { instruction, action, event, events } => write!(
                f,
                "instruction {instruction}: {action} of event {event}, but the plan has {events} events \
                 (ids 0..{events}): {RECREATE}"
            ),
            PlanDecodeError::ArgumentCount { instruction, op, found, expected } => {
                write!(
                    f,
                    "instruction {instruction}: a `{}` launch with {found} arguments; it takes {expected} (",
                    op.name()
                )?;
                for (index, (name, _)) in op.signature().iter().enumerate() {
                    write!(f, "{}{name}", if index > 0 { ", " } else { "" })?;
                }
                write!(f, "), and maybe one more, its scratch: {RECREATE}")
            }
            PlanDecodeError::ArgumentAccess { instruction, op, operand, found, expected } => write!(
                f,
                "instruction {instruction}: {operand} of a `{}` launch is marked {}, but `{}` accesses it as {}: \
                 {RECREATE}",
                op.name(),
                found.name(),
                op.name(),
                expected.name()
            ),
        }
    }
}

impl core::error::Error for PlanDecodeError {}

type Result<T> = core::result::Result<T, PlanDecodeError>;

/// Reads little-endian fields from the encoding, naming the section it is in when it runs out.
struct Reader<'a> {
    /// The encoding up to its declared end (the header included, so positions are offsets).
    bytes: &'a [u8],
    pos: usize,
    section: Section,
}

impl<'a> Reader<'a> {
    fn left(&self) -> usize {
        self.bytes.len().saturating_sub(self.pos)
    }

    fn offset(&self) -> u64 {
        self.pos as u64
    }

    fn truncated(&self, needed: u64) -> PlanDecodeError {
        PlanDecodeError::Truncated {
            section: self.section,
            offset: self.offset(),
            needed,
            available: self.left() as u64,
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).ok_or_else(|| self.truncated(n as u64))?;
        let slice = self.bytes.get(self.pos..end).ok_or_else(|| self.truncated(n as u64))?;
        self.pos = end;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut array = [0; N];
        array.copy_from_slice(self.take(N)?);
        Ok(array)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn bad_code(&self, what: &'static str, value: u64, offset: u64) -> PlanDecodeError {
        PlanDecodeError::BadCode { what, value, offset, at: self.section }
    }

    /// A one-byte code, mapped by `decode`.
    fn code8<T>(&mut self, what: &'static str, decode: impl FnOnce(u8) -> Option<T>) -> Result<T> {
        let offset = self.offset();
        let value = self.u8()?;
        decode(value).ok_or_else(|| self.bad_code(what, value.into(), offset))
    }

    /// A two-byte code, mapped by `decode`.
    fn code16<T>(&mut self, what: &'static str, decode: impl FnOnce(u16) -> Option<T>) -> Result<T> {
        let offset = self.offset();
        let value = self.u16()?;
        decode(value).ok_or_else(|| self.bad_code(what, value.into(), offset))
    }

    fn bool(&mut self, what: &'static str) -> Result<bool> {
        self.code8(what, |v| match v {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        })
    }

    /// A tag byte (0 absent, 1 present), then the value when present.
    fn option<T>(&mut self, what: &'static str, read: impl FnOnce(&mut Self) -> Result<T>) -> Result<Option<T>> {
        if self.bool(what)? {
            read(self).map(Some)
        } else {
            Ok(None)
        }
    }

    /// A u32 byte length, then that many bytes of UTF-8.
    fn string(&mut self, what: &'static str) -> Result<String> {
        let offset = self.offset();
        let len = self.u32()?;
        let bytes = self.take(len as usize)?;
        let text = core::str::from_utf8(bytes).map_err(|_| PlanDecodeError::BadUtf8 { what, offset })?;
        Ok(String::from(text))
    }

    /// A u32 count of elements of at least `min_each` bytes, checked against the bytes left.
    fn count(&mut self, min_each: usize) -> Result<u32> {
        let count = self.u32()?;
        let needed = u64::from(count) * min_each as u64;
        if needed > self.left() as u64 {
            return Err(self.truncated(needed));
        }
        Ok(count)
    }

    fn summary(&mut self) -> Result<PlacementSummary> {
        Ok(PlacementSummary {
            buffers: self.u32()?,
            peak_bytes: self.u64()?,
            lower_bound_bytes: self.u64()?,
            optimal: self.bool("optimal flag")?,
            nodes: self.u64()?,
        })
    }
}

impl Plan {
    /// Reads a plan written by [`Plan::encode`] (`spec/plan-format.md`). Any bytes are safe to
    /// give it: it returns an error naming what is wrong and where, never panics, and allocates
    /// memory proportional to the input only.
    ///
    /// A decoded plan is structurally sound (ids and row ranges in range, launches matching their
    /// signatures) but not verified: run `check::plan` on it before executing it.
    pub fn decode(bytes: &[u8]) -> core::result::Result<Plan, PlanDecodeError> {
        let body = check_header(bytes)?;
        let mut r = Reader { bytes: body, pos: HEADER_BYTES, section: Section::Provenance };
        let provenance = provenance(&mut r)?;

        r.section = Section::Totals;
        let totals = Totals {
            arena_bytes: r.u64()?,
            arena_lower_bound_bytes: r.u64()?,
            host_bytes: r.u64()?,
            parameter_bytes: r.u64()?,
            rounding_buffer_bytes: r.u64()?,
        };

        r.section = Section::BufferCount;
        let buffer_count = r.count(BUFFER_MIN_BYTES)?;
        let mut buffers = Vec::with_capacity(buffer_count as usize);
        for index in 0..buffer_count {
            r.section = Section::Buffer(index);
            buffers.push(buffer(&mut r, index)?);
        }

        r.section = Section::Events;
        let events = r.u32()?;

        r.section = Section::InstructionCount;
        let instruction_count = r.count(INSTRUCTION_MIN_BYTES)?;
        let mut instructions = Vec::with_capacity(instruction_count as usize);
        for index in 0..instruction_count {
            r.section = Section::Instruction(index);
            instructions.push(instruction(&mut r, index, &buffers, events)?);
        }

        r.section = Section::RankProgramCount;
        let program_count = r.count(RANK_PROGRAM_MIN_BYTES)?;
        let mut rank_programs = Vec::with_capacity(program_count as usize);
        for program in 0..program_count {
            r.section = Section::RankProgram(program);
            let rank = r.u32()?;
            let count = r.count(INSTRUCTION_MIN_BYTES)?;
            let mut program_instructions = Vec::with_capacity(count as usize);
            for index in 0..count {
                r.section = Section::RankInstruction { program, instruction: index };
                program_instructions.push(instruction(&mut r, index, &buffers, events)?);
            }
            rank_programs.push(RankProgram { rank, instructions: program_instructions });
        }

        if r.left() > 0 {
            return Err(PlanDecodeError::UnreadBytes { offset: r.offset(), count: r.left() as u64 });
        }
        Ok(Plan { provenance, buffers, events, instructions, rank_programs, totals })
    }
}

/// Checks magic, version, flags, length and checksum; returns the encoding up to its declared
/// end.
fn check_header(bytes: &[u8]) -> Result<&[u8]> {
    let magic_len = bytes.len().min(PLAN_MAGIC.len());
    if bytes.get(..magic_len) != PLAN_MAGIC.get(..magic_len) {
        let mut found = [0; 8];
        found[..magic_len].copy_from_slice(&bytes[..magic_len]);
        return Err(PlanDecodeError::BadMagic { found, len: magic_len });
    }
    let mut r = Reader { bytes, pos: 0, section: Section::Header };
    r.take(PLAN_MAGIC.len())?;
    // The version comes first: a later version may change everything after it.
    let version = r.u16()?;
    if version != PLAN_FORMAT_VERSION {
        return Err(PlanDecodeError::UnsupportedVersion { found: version, supported: PLAN_FORMAT_VERSION });
    }
    r.code16("header flags value (this version defines none: 0)", |flags| (flags == 0).then_some(()))?;
    let stored = r.u32()?;
    let length_offset = r.offset();
    let length = r.u64()?;
    if length < HEADER_BYTES as u64 {
        return Err(r.bad_code("total length (at least the 24 header bytes)", length, length_offset));
    }
    let actual = bytes.len() as u64;
    if length > actual {
        return Err(PlanDecodeError::Truncated {
            section: Section::Body,
            offset: actual,
            needed: length - actual,
            available: 0,
        });
    }
    // `length <= bytes.len()`, so it fits in a usize.
    let body = bytes.get(..length as usize).unwrap_or(bytes);
    let computed = checksum(body.get(HEADER_BYTES..).unwrap_or(&[]));
    if computed != stored {
        return Err(PlanDecodeError::ChecksumMismatch { stored, computed });
    }
    if length < actual {
        return Err(PlanDecodeError::TrailingBytes { offset: length, count: actual - length });
    }
    Ok(body)
}

fn provenance(r: &mut Reader<'_>) -> Result<Provenance> {
    let model = ModelConfig {
        name: r.string("model name")?,
        layers: r.u32()?,
        hidden: r.u64()?,
        heads: r.u64()?,
        kv_heads: r.u64()?,
        ffn_hidden: r.u64()?,
        vocab: r.u64()?,
        seq_len: r.u64()?,
        micro_batch: r.u64()?,
        architecture: architecture(r)?,
    };
    let parallel = Parallelism { tensor: r.u64()?, data: r.u64()?, context: r.u64()? };
    let hardware = Hardware {
        name: r.string("hardware name")?,
        device_memory_bytes: r.u64()?,
        host_memory_per_node_bytes: r.u64()?,
        gpus_per_node: r.u64()?,
        d2h_bytes_per_s: r.u64()?,
        h2d_bytes_per_s: r.u64()?,
        gpus_sharing_uplink: r.u64()?,
        peak_flops: r.u64()?,
        achieved_flops: r.u64()?,
        measured_layer_forward_s: r.option("measured layer time tag", |r| {
            float(r, "the measured layer forward time", "a finite number of seconds above 0", |s| {
                s.is_finite() && s > 0.0
            })
        })?,
        // Not in format version 4: a decoded plan is timed without measured kernel rates.
        measured_rates: crate::model::MeasuredRates::NONE,
    };
    let interconnect = Interconnect { bytes_per_s: r.u64()?, latency_ns: r.u64()? };
    let strategy = r.code8("strategy code", Strategy::from_code)?;
    let alpha = float(r, "alpha", "a number in [0, 1]", |a| (0.0..=1.0).contains(&a))?;
    let alpha_bound = r.code8("alpha bound code", |code| ALPHA_BOUNDS.get(usize::from(code)).copied())?;
    Ok(Provenance {
        model,
        parallel,
        hardware,
        interconnect,
        strategy,
        alpha,
        alpha_bound,
        swapped_rows: r.u64()?,
        level1_forward: r.summary()?,
        level1_backward: r.summary()?,
        level2: r.summary()?,
    })
}

/// The model's [`Architecture`]: FFN, norm and bias codes, tying, rotary base, epsilon, and the
/// optional rope rescaling.
fn architecture(r: &mut Reader<'_>) -> Result<Architecture> {
    let ffn = r.code8("FFN kind code", |code| Ffn::ALL.get(usize::from(code)).copied())?;
    let norm = r.code8("norm kind code", |code| Norm::ALL.get(usize::from(code)).copied())?;
    let biases = r.code8("biases code", |code| Biases::ALL.get(usize::from(code)).copied())?;
    let tied_embeddings = r.bool("tied embeddings flag")?;
    let rope_theta = float(r, "the rotary base", "a finite number above 1", |x| x.is_finite() && x > 1.0)?;
    let norm_eps = float(r, "the norm epsilon", "a number between 0 and 1", |x| x > 0.0 && x < 1.0)?;
    let positive = |x: f64| x.is_finite() && x > 0.0;
    let rope_scaling = r.option("rope scaling tag", |r| {
        Ok(RopeScaling {
            factor: float(r, "the rope scaling factor", "a finite number of at least 1", |x| {
                x.is_finite() && x >= 1.0
            })?,
            low_freq_factor: float(r, "the rope low frequency factor", "a finite number above 0", positive)?,
            high_freq_factor: float(r, "the rope high frequency factor", "a finite number above 0", positive)?,
            original_max_positions: r.u64()?,
        })
    })?;
    Ok(Architecture { ffn, norm, biases, tied_embeddings, rope_theta, rope_scaling, norm_eps })
}

/// A float by its bits; `valid` must hold (it excludes NaN, so decoded plans compare equal to
/// themselves).
fn float(r: &mut Reader<'_>, what: &'static str, expected: &'static str, valid: impl Fn(f64) -> bool) -> Result<f64> {
    let offset = r.offset();
    let bits = r.u64()?;
    let value = f64::from_bits(bits);
    if valid(value) {
        Ok(value)
    } else {
        Err(PlanDecodeError::BadFloat { what, bits, offset, expected })
    }
}

fn buffer(r: &mut Reader<'_>, index: u32) -> Result<Buffer> {
    let kind = r.code8("buffer kind code", |code| BufferKind::ALL.get(usize::from(code)).copied())?;
    let role = r.code16("tensor role code", TensorRole::from_code)?;
    let layer = r.option("layer tag", Reader::u32)?;
    let slot = r.u8()?;
    let rows = r.u64()?;
    let first_row = r.u64()?;
    let row_bytes = r.u64()?;
    let place_code = r.code8("place code", |code| (code == PLACE_DEVICE || code == PLACE_HOST).then_some(code))?;
    let offset = r.u64()?;
    let place = if place_code == PLACE_DEVICE { Place::Device { offset } } else { Place::Host { offset } };
    if rows.checked_mul(row_bytes).and_then(|bytes| bytes.checked_add(offset)).is_none() {
        return Err(PlanDecodeError::BufferTooLarge { buffer: index, rows, row_bytes, offset });
    }
    if first_row.checked_add(rows).is_none() {
        return Err(PlanDecodeError::FirstRowTooLarge { buffer: index, first_row, rows });
    }
    Ok(Buffer { kind, role, layer, slot, rows, first_row, row_bytes, place })
}

fn region(r: &mut Reader<'_>, instruction: u32, operand: Operand, buffers: &[Buffer]) -> Result<Region> {
    let buffer = r.u32()?;
    let start = r.u64()?;
    let end = r.u64()?;
    let count = buffers.len() as u32;
    let Some(b) = buffers.get(buffer as usize) else {
        return Err(PlanDecodeError::BufferOutOfRange { instruction, operand, buffer, buffers: count });
    };
    if end < start || end > b.rows {
        return Err(PlanDecodeError::BadRowRange { instruction, operand, buffer, start, end, rows: b.rows });
    }
    Ok(Region { buffer: BufferId(buffer), start, end })
}

fn instruction(r: &mut Reader<'_>, index: u32, buffers: &[Buffer], events: u32) -> Result<Instruction> {
    let stream = r.code8("stream code", |code| Stream::ALL.get(usize::from(code)).copied())?;
    let action = r.code8("action code", |code| (code <= action::WAIT).then_some(code))?;
    let action = match action {
        action::LAUNCH => {
            let op = r.code16("op code", Op::from_code)?;
            let layer = r.option("launch layer tag", Reader::u32)?;
            let flops = r.u64()?;
            let signature = op.signature();
            let found = r.u8()?;
            // The signature's arguments, then maybe the launch's scratch (written).
            if usize::from(found) != signature.len() && usize::from(found) != signature.len() + 1 {
                let expected = signature.len() as u8;
                return Err(PlanDecodeError::ArgumentCount { instruction: index, op, found, expected });
            }
            let mut args = Vec::with_capacity(usize::from(found));
            let scratch = (usize::from(found) > signature.len()).then_some(("scratch", Access::Write));
            for (position, &(name, expected)) in signature.iter().chain(scratch.as_ref()).enumerate() {
                let operand = Operand::Arg { index: position as u8, name };
                let region = region(r, index, operand, buffers)?;
                let access = r.code8("access code", |code| ACCESSES.get(usize::from(code)).copied())?;
                if access != expected {
                    return Err(PlanDecodeError::ArgumentAccess {
                        instruction: index,
                        op,
                        operand,
                        found: access,
                        expected,
                    });
                }
                args.push(Arg { region, access });
            }
            Action::Launch(Launch { op, args, layer, flops })
        }
        action::COPY => {
            let src = region(r, index, Operand::Source, buffers)?;
            let dst = region(r, index, Operand::Destination, buffers)?;
            let layer = r.u32()?;
            let role = r.code16("tensor role code", TensorRole::from_code)?;
            let (start, end) = (r.u64()?, r.u64()?);
            if end < start {
                return Err(PlanDecodeError::BadTensorRows { instruction: index, start, end });
            }
            Action::Copy { src, dst, tensor: TensorRows { layer, role, start, end } }
        }
        code => {
            let wait = code == action::WAIT;
            let event = r.u32()?;
            if event >= events {
                let action = if wait { "wait" } else { "record" };
                return Err(PlanDecodeError::EventOutOfRange { instruction: index, action, event, events });
            }
            if wait {
                Action::Wait(EventId(event))
            } else {
                Action::Record(EventId(event))
            }
        }
    };
    Ok(Instruction { stream, action })
}
