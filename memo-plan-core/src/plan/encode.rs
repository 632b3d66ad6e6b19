//! The plan's byte format, writing side (`spec/plan-format.md` is the contract; [`super::decode`]
//! reads it back).
//!
//! Little-endian, versioned ([`PLAN_FORMAT_VERSION`]), CRC-32 checksummed. Every value has exactly
//! one encoding (booleans and option tags are 0 or 1, floats are their bit patterns, no padding,
//! no maps), so the same plan always gives the same bytes and every byte string the decoder
//! accepts is the encoding of the plan it decodes to.

use alloc::vec::Vec;

use super::{Access, Action, BufferKind, Instruction, Place, PlacementSummary, Plan, Region, PLAN_FORMAT_VERSION};
use crate::swap::AlphaBound;

/// The first 8 bytes of every encoded plan.
pub const PLAN_MAGIC: [u8; 8] = *b"MEMOPLAN";

/// Bytes of the header: magic (8), version (u16), flags (u16), checksum (u32), total length (u64).
pub const HEADER_BYTES: usize = 24;

/// Where the header's fields start.
pub mod header {
    /// The format version, u16.
    pub const VERSION: usize = 8;
    /// Flags, u16; 0 (no version defines any yet).
    pub const FLAGS: usize = 10;
    /// CRC-32 of bytes `[HEADER_BYTES, length)`, u32.
    pub const CHECKSUM: usize = 12;
    /// The total length of the encoding, header included, u64.
    pub const LENGTH: usize = 16;
}

/// The fewest bytes one buffer record takes (its layer absent): kind 1, role 2, layer tag 1,
/// slot 1, rows 8, first row 8, row bytes 8, place 1, offset 8. The decoder checks
/// `count * this` against the bytes left before it allocates.
pub const BUFFER_MIN_BYTES: usize = 38;

/// The fewest bytes one instruction record takes: stream 1, action 1, event 4 (a record or wait;
/// a launch or copy takes more).
pub const INSTRUCTION_MIN_BYTES: usize = 6;

/// The fewest bytes one rank program takes: its rank (u32) and its instruction count (u32).
pub const RANK_PROGRAM_MIN_BYTES: usize = 8;

/// Action codes.
pub mod action {
    /// [`Action::Launch`](crate::plan::Action::Launch).
    pub const LAUNCH: u8 = 0;
    /// [`Action::Copy`](crate::plan::Action::Copy).
    pub const COPY: u8 = 1;
    /// [`Action::Record`](crate::plan::Action::Record).
    pub const RECORD: u8 = 2;
    /// [`Action::Wait`](crate::plan::Action::Wait).
    pub const WAIT: u8 = 3;
}

/// Place codes: [`Place::Device`] 0, [`Place::Host`] 1.
pub const PLACE_DEVICE: u8 = 0;
/// See [`PLACE_DEVICE`].
pub const PLACE_HOST: u8 = 1;

/// Every [`AlphaBound`], in code order.
pub const ALPHA_BOUNDS: [AlphaBound; 4] =
    [AlphaBound::Bandwidth, AlphaBound::HostMemory, AlphaBound::None, AlphaBound::Forced];

/// The byte-format code of an [`AlphaBound`]: its index in [`ALPHA_BOUNDS`].
pub fn alpha_bound_code(bound: AlphaBound) -> u8 {
    match bound {
        AlphaBound::Bandwidth => 0,
        AlphaBound::HostMemory => 1,
        AlphaBound::None => 2,
        AlphaBound::Forced => 3,
    }
}

/// The name the JSON view gives an [`AlphaBound`].
pub fn alpha_bound_name(bound: AlphaBound) -> &'static str {
    match bound {
        AlphaBound::Bandwidth => "bandwidth",
        AlphaBound::HostMemory => "host_memory",
        AlphaBound::None => "none",
        AlphaBound::Forced => "forced",
    }
}

/// The byte-format code of a [`BufferKind`]: its index in [`BufferKind::ALL`].
pub fn buffer_kind_code(kind: BufferKind) -> u8 {
    // `ALL` lists the variants in declaration order (a unit test holds it to that).
    kind as u8
}

/// The byte-format code of an [`Access`].
pub fn access_code(access: Access) -> u8 {
    match access {
        Access::Read => 0,
        Access::Write => 1,
        Access::ReadWrite => 2,
    }
}

/// Every [`Access`], in code order.
pub const ACCESSES: [Access; 3] = [Access::Read, Access::Write, Access::ReadWrite];

/// A count as the format writes it: `u32`, saturated. Only a plan with more than 2^32 - 1
/// buffers, instructions or name bytes (hundreds of GiB in memory) saturates; the encoder then
/// writes that many elements, so the bytes stay self-consistent (and such a plan's ids could not
/// be written anyway: [`super::BufferId`] is a `u32`).
fn count(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

/// Appends little-endian fields to a byte vector.
struct Writer {
    bytes: Vec<u8>,
}

impl Writer {
    fn u8(&mut self, value: u8) {
        self.bytes.push(value);
    }

    fn u16(&mut self, value: u16) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    fn u32(&mut self, value: u32) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    fn u64(&mut self, value: u64) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    fn bool(&mut self, value: bool) {
        self.u8(u8::from(value));
    }

    fn f64(&mut self, value: f64) {
        self.u64(value.to_bits());
    }

    fn option_u32(&mut self, value: Option<u32>) {
        match value {
            None => self.u8(0),
            Some(v) => {
                self.u8(1);
                self.u32(v);
            }
        }
    }

    fn option_f64(&mut self, value: Option<f64>) {
        match value {
            None => self.u8(0),
            Some(v) => {
                self.u8(1);
                self.f64(v);
            }
        }
    }

    /// A string: u32 byte length, then its UTF-8 bytes (cut at a character boundary in the
    /// impossible case of a name over 4 GiB).
    fn str(&mut self, value: &str) {
        let mut len = (count(value.len()) as usize).min(value.len());
        while !value.is_char_boundary(len) {
            len -= 1;
        }
        self.u32(count(len));
        self.bytes.extend_from_slice(&value.as_bytes()[..len]);
    }

    fn summary(&mut self, summary: &PlacementSummary) {
        self.u32(summary.buffers);
        self.u64(summary.peak_bytes);
        self.u64(summary.lower_bound_bytes);
        self.bool(summary.optimal);
        self.u64(summary.nodes);
    }

    fn region(&mut self, region: &Region) {
        self.u32(region.buffer.0);
        self.u64(region.start);
        self.u64(region.end);
    }

    fn instruction(&mut self, instruction: &Instruction) {
        // Stream indices are 0..4.
        self.u8(instruction.stream.index() as u8);
        match &instruction.action {
            Action::Launch(launch) => {
                self.u8(action::LAUNCH);
                self.u16(launch.op.code());
                self.option_u32(launch.layer);
                self.u64(launch.flops);
                let args = launch.args.len().min(usize::from(u8::MAX));
                self.u8(args as u8);
                for arg in &launch.args[..args] {
                    self.region(&arg.region);
                    self.u8(access_code(arg.access));
                }
            }
            Action::Copy { src, dst, tensor } => {
                self.u8(action::COPY);
                self.region(src);
                self.region(dst);
                self.u32(tensor.layer);
                self.u16(tensor.role.code());
                self.u64(tensor.start);
                self.u64(tensor.end);
            }
            Action::Record(event) => {
                self.u8(action::RECORD);
                self.u32(event.0);
            }
            Action::Wait(event) => {
                self.u8(action::WAIT);
                self.u32(event.0);
            }
        }
    }
}

impl Plan {
    /// The plan as bytes (`spec/plan-format.md`): deterministic, the same plan gives the same
    /// bytes on every platform. [`Plan::decode`] reads them back.
    ///
    /// Encoding never fails. The decoder checks what encoding does not: a plan whose launches
    /// do not match their op's signature, or whose ids or row ranges are out of range, encodes,
    /// but its bytes do not decode.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer { bytes: Vec::with_capacity(self.encoded_len_estimate()) };
        w.bytes.extend_from_slice(&PLAN_MAGIC);
        w.u16(PLAN_FORMAT_VERSION);
        w.u16(0); // flags
        w.u32(0); // checksum, filled in below
        w.u64(0); // length, filled in below

        let p = &self.provenance;
        let m = &p.model;
        w.str(&m.name);
        w.u32(m.layers);
        for value in [m.hidden, m.heads, m.kv_heads, m.ffn_hidden, m.vocab, m.seq_len, m.micro_batch] {
            w.u64(value);
        }
        let a = &m.architecture;
        w.u8(a.ffn as u8);
        w.u8(a.norm as u8);
        w.u8(a.biases as u8);
        w.bool(a.tied_embeddings);
        w.f64(a.rope_theta);
        w.f64(a.norm_eps);
        w.bool(a.rope_scaling.is_some());
        if let Some(scaling) = a.rope_scaling {
            w.f64(scaling.factor);
            w.f64(scaling.low_freq_factor);
            w.f64(scaling.high_freq_factor);
            w.u64(scaling.original_max_positions);
        }
        w.u64(p.parallel.tensor);
        w.u64(p.parallel.data);
        // Version 6: the context-parallel degree, so a decoded plan knows its layout (the
        // rank programs of c > 1 are keyed `context_rank * t + tensor_rank`).
        w.u64(p.parallel.context);
        let h = &p.hardware;
        w.str(&h.name);
        for value in [
            h.device_memory_bytes,
            h.host_memory_per_node_bytes,
            h.gpus_per_node,
            h.d2h_bytes_per_s,
            h.h2d_bytes_per_s,
            h.gpus_sharing_uplink,
            h.peak_flops,
            h.achieved_flops,
        ] {
            w.u64(value);
        }
        w.option_f64(h.measured_layer_forward_s);
        w.u64(p.interconnect.bytes_per_s);
        w.u64(p.interconnect.latency_ns);
        w.u8(p.strategy.code());
        w.f64(p.alpha);
        w.u8(alpha_bound_code(p.alpha_bound));
        w.u64(p.swapped_rows);
        w.summary(&p.level1_forward);
        w.summary(&p.level1_backward);
        w.summary(&p.level2);

        let t = &self.totals;
        for value in
            [t.arena_bytes, t.arena_lower_bound_bytes, t.host_bytes, t.parameter_bytes, t.rounding_buffer_bytes]
        {
            w.u64(value);
        }

        let buffers = count(self.buffers.len());
        w.u32(buffers);
        for buffer in &self.buffers[..buffers as usize] {
            w.u8(buffer_kind_code(buffer.kind));
            w.u16(buffer.role.code());
            w.option_u32(buffer.layer);
            w.u8(buffer.slot);
            w.u64(buffer.rows);
            w.u64(buffer.first_row);
            w.u64(buffer.row_bytes);
            let (place, offset) = match buffer.place {
                Place::Device { offset } => (PLACE_DEVICE, offset),
                Place::Host { offset } => (PLACE_HOST, offset),
            };
            w.u8(place);
            w.u64(offset);
        }

        w.u32(self.events);

        let instructions = count(self.instructions.len());
        w.u32(instructions);
        for instruction in &self.instructions[..instructions as usize] {
            w.instruction(instruction);
        }

        let programs = count(self.rank_programs.len());
        w.u32(programs);
        for program in &self.rank_programs[..programs as usize] {
            w.u32(program.rank);
            let instructions = count(program.instructions.len());
            w.u32(instructions);
            for instruction in &program.instructions[..instructions as usize] {
                w.instruction(instruction);
            }
        }

        let mut bytes = w.bytes;
        let length = bytes.len() as u64;
        bytes[header::LENGTH..header::LENGTH + 8].copy_from_slice(&length.to_le_bytes());
        let checksum = checksum(&bytes[HEADER_BYTES..]);
        bytes[header::CHECKSUM..header::CHECKSUM + 4].copy_from_slice(&checksum.to_le_bytes());
        bytes
    }

    /// About the encoded size, so that [`Plan::encode`] allocates once.
    fn encoded_len_estimate(&self) -> usize {
        let names = self.provenance.model.name.len() + self.provenance.hardware.name.len();
        HEADER_BYTES
            .saturating_add(400)
            .saturating_add(names)
            .saturating_add(self.buffers.len().saturating_mul(BUFFER_MIN_BYTES + 4))
            .saturating_add(self.instructions.len().saturating_mul(60))
            .saturating_add(self.rank_programs.iter().map(|p| p.instructions.len().saturating_mul(60)).sum::<usize>())
    }
}

/// The checksum of an encoding: CRC-32 (IEEE 802.3, as zlib and PNG) of the bytes after the
/// header.
pub fn checksum(bytes_after_header: &[u8]) -> u32 {
    crc32fast::hash(bytes_after_header)
}

/// Sets the header's length and checksum to those of `bytes` as they are, so that a test or a
/// fuzz harness can change the body and still reach the body's decoder. Does nothing to bytes
/// shorter than the header.
#[cfg(any(test, feature = "fuzzing"))]
pub fn reseal(bytes: &mut [u8]) {
    if bytes.len() < HEADER_BYTES {
        return;
    }
    let length = bytes.len() as u64;
    bytes[header::LENGTH..header::LENGTH + 8].copy_from_slice(&length.to_le_bytes());
    let checksum = checksum(&bytes[HEADER_BYTES..]);
    bytes[header::CHECKSUM..header::CHECKSUM + 4].copy_from_slice(&checksum.to_le_bytes());
}

#[cfg(test)]
pub(crate) mod tests;
