//! The byte format: round trips, the layout `spec/plan-format.md` gives, every decode error from a
//! targeted corruption, and random bytes and mutations that must never panic.

use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use alloc::{format, string::ToString};

use super::super::decode::{Operand, Section};
use super::*;
use crate::generate::SplitMix64;
use crate::model::{Architecture, Biases, Hardware, Interconnect, ModelConfig, Parallelism, RopeScaling};
use crate::plan::{
    Arg, Buffer, BufferId, EventId, Instruction, Launch, Op, PlanDecodeError, Provenance, RankProgram, Strategy,
    Stream, TensorRole, TensorRows, Totals,
};

fn summary(seed: u64) -> PlacementSummary {
    PlacementSummary {
        buffers: seed as u32,
        peak_bytes: seed * 1000,
        lower_bound_bytes: seed * 900,
        optimal: seed.is_multiple_of(2),
        nodes: seed * 7,
    }
}

fn provenance(strategy: Strategy, alpha: f64, measured: Option<f64>) -> Provenance {
    Provenance {
        model: ModelConfig {
            // Quotes, a backslash, a control character and non-ASCII: the JSON view must escape them.
            name: String::from("tiny \"gpt\" \\ \u{1} α"),
            layers: 2,
            hidden: 8,
            heads: 2,
            kv_heads: 1,
            ffn_hidden: 32,
            vocab: 16,
            seq_len: 8,
            micro_batch: 1,
            architecture: Architecture {
                biases: Biases::QkvOnly,
                rope_scaling: Some(RopeScaling {
                    factor: 8.0,
                    low_freq_factor: 1.0,
                    high_freq_factor: 4.0,
                    original_max_positions: 8192,
                }),
                ..Architecture::llama(500_000.0, 1e-6)
            },
        },
        parallel: Parallelism::new(1, 2),
        interconnect: Interconnect { bytes_per_s: 200_000_000_000, latency_ns: 5_000 },
        hardware: Hardware {
            name: String::from("test-box"),
            device_memory_bytes: 1 << 30,
            host_memory_per_node_bytes: 1 << 34,
            gpus_per_node: 8,
            d2h_bytes_per_s: 25_000_000_000,
            h2d_bytes_per_s: 24_000_000_000,
            gpus_sharing_uplink: 2,
            peak_flops: 312_000_000_000_000,
            achieved_flops: 187_200_000_000_000,
            measured_layer_forward_s: measured,
            measured_rates: crate::model::MeasuredRates::NONE,
        },
        strategy,
        alpha,
        alpha_bound: AlphaBound::HostMemory,
        swapped_rows: 3,
        level1_forward: summary(4),
        level1_backward: summary(5),
        level2: summary(6),
    }
}

fn buffer(kind: BufferKind, role: TensorRole, layer: Option<u32>, rows: u64, row_bytes: u64, place: Place) -> Buffer {
    let slot = u8::from(kind == BufferKind::RoundingBuffer);
    Buffer { kind, role, layer, slot, rows, first_row: 0, row_bytes, place }
}

fn launch(op: Op, layer: Option<u32>, flops: u64, regions: &[(u32, u64, u64)]) -> Action {
    let args = op
        .signature()
        .iter()
        .zip(regions)
        .map(|(&(_, access), &(b, start, end))| Arg { region: Region::rows(BufferId(b), start, end), access })
        .collect();
    Action::Launch(Launch { op, args, layer, flops })
}

/// Rows `[start, end)` of layer 0's input: what the sample plan's copies move.
fn layer0_input(start: u64, end: u64) -> TensorRows {
    TensorRows { layer: 0, role: TensorRole::LayerInput, start, end }
}

fn on(stream: Stream, action: Action) -> Instruction {
    Instruction { stream, action }
}

/// A small valid plan built by hand: buffers of every kind, on the device and the host, an
/// empty one; launches with and without a layer, a swap-out and a swap-in ordered by events.
pub(crate) fn sample_plan() -> Plan {
    use BufferKind as K;
    use TensorRole as R;
    let device = |offset| Place::Device { offset };
    let buffers = vec![
        buffer(K::Input, R::Tokens, None, 8, 4, device(0)),
        buffer(K::Input, R::Targets, None, 8, 4, device(32)),
        buffer(K::Parameter, R::Embedding, None, 16, 16, device(64)),
        buffer(K::Parameter, R::QueryWeight, Some(0), 8, 16, device(320)),
        buffer(K::Gradient, R::QueryWeight, Some(0), 8, 16, device(448)),
        buffer(K::OptimizerState, R::QueryWeight, Some(0), 8, 48, device(576)),
        buffer(K::RoundingBuffer, R::LayerInput, None, 8, 16, device(960)),
        buffer(K::Skeletal, R::Query, Some(1), 8, 16, device(1088)),
        buffer(K::Transient, R::LogitsChunk, None, 8, 32, device(1216)),
        buffer(K::CrossLayer, R::LayerOutput, Some(1), 8, 16, device(1472)),
        buffer(K::HostSlot, R::LayerInput, Some(0), 8, 16, Place::Host { offset: 0 }),
        buffer(K::Scalar, R::Loss, None, 1, 4, device(1600)),
        buffer(K::Transient, R::PartialSum, Some(1), 0, 16, device(1604)),
    ];
    let instructions = vec![
        on(Stream::Compute, launch(Op::Embedding, None, 0, &[(0, 0, 8), (2, 0, 16), (6, 0, 8)])),
        on(Stream::Compute, launch(Op::Linear, Some(0), 2048, &[(6, 0, 8), (3, 0, 8), (3, 0, 1), (7, 0, 8)])),
        on(Stream::Compute, Action::Record(EventId(0))),
        on(Stream::DeviceToHost, Action::Wait(EventId(0))),
        on(
            Stream::DeviceToHost,
            Action::Copy {
                src: Region::rows(BufferId(6), 0, 4),
                dst: Region::rows(BufferId(10), 0, 4),
                tensor: layer0_input(0, 4),
            },
        ),
        on(Stream::DeviceToHost, Action::Record(EventId(1))),
        on(Stream::HostToDevice, Action::Wait(EventId(1))),
        on(
            Stream::HostToDevice,
            Action::Copy {
                src: Region::rows(BufferId(10), 0, 4),
                dst: Region::rows(BufferId(6), 0, 4),
                tensor: layer0_input(0, 4),
            },
        ),
        on(Stream::Compute, launch(Op::Zero, None, 0, &[(11, 0, 1)])),
        on(Stream::Compute, launch(Op::CrossEntropy, None, 0, &[(8, 0, 8), (1, 0, 8), (11, 0, 1)])),
    ];
    Plan {
        provenance: provenance(Strategy::Memo, 0.47, Some(0.0123)),
        buffers,
        events: 2,
        instructions,
        rank_programs: Vec::new(),
        totals: Totals {
            arena_bytes: 1604,
            arena_lower_bound_bytes: 1500,
            host_bytes: 128,
            parameter_bytes: 1024,
            rounding_buffer_bytes: 128,
        },
    }
}

/// A plan with no buffers or instructions and extreme values in every field that has them.
pub(crate) fn edge_plan() -> Plan {
    let mut plan = sample_plan();
    plan.provenance = provenance(Strategy::KeepAll, -0.0, None);
    plan.provenance.model.name = String::new();
    plan.provenance.model.layers = u32::MAX;
    plan.provenance.swapped_rows = u64::MAX;
    plan.provenance.alpha_bound = AlphaBound::Forced;
    plan.provenance.level2 = PlacementSummary { buffers: u32::MAX, peak_bytes: u64::MAX, optimal: true, ..summary(0) };
    plan.buffers.clear();
    plan.instructions.clear();
    plan.rank_programs = vec![RankProgram { rank: u32::MAX, instructions: Vec::new() }];
    plan.events = u32::MAX;
    plan.totals.arena_bytes = u64::MAX;
    plan
}

/// Where the fields `spec/plan-format.md` lays out start, computed from that layout.
#[derive(Debug)]
struct Layout {
    model_name: usize,
    kv_heads: usize,
    architecture: usize,
    hardware_name: usize,
    measured_tag: usize,
    strategy: usize,
    alpha: usize,
    alpha_bound: usize,
    optimal_flag: usize,
    buffer_count: usize,
    buffers: Vec<usize>,
    events: usize,
    instructions: Vec<usize>,
    rank_programs: usize,
    end: usize,
}

fn layout(plan: &Plan) -> Layout {
    let p = &plan.provenance;
    let model_name = HEADER_BYTES;
    // The name, layers, the seven sizes (kv_heads after heads), then the architecture: FFN, norm
    // and bias codes and the tied flag (a byte each), the rotary base and epsilon (f64 each), the
    // rope scaling tag and, when present, its three f64 and a u64; then t, d and c.
    let scaling = if p.model.architecture.rope_scaling.is_some() { 4 * 8 } else { 0 };
    let architecture = 4 + 2 * 8 + 1 + scaling;
    let kv_heads = model_name + 4 + p.model.name.len() + 4 + 2 * 8;
    let hardware_name = model_name + 4 + p.model.name.len() + 4 + 7 * 8 + architecture + 3 * 8;
    let measured_tag = hardware_name + 4 + p.hardware.name.len() + 8 * 8;
    // The measured time, then the interconnect (bandwidth and latency, u64 each).
    let strategy = measured_tag + 1 + if p.hardware.measured_layer_forward_s.is_some() { 8 } else { 0 } + 16;
    let alpha = strategy + 1;
    let alpha_bound = alpha + 8;
    let summaries = alpha_bound + 1 + 8;
    let optimal_flag = summaries + 4 + 8 + 8;
    let buffer_count = summaries + 3 * 29 + 5 * 8;
    let mut at = buffer_count + 4;
    let mut buffers = Vec::new();
    for b in &plan.buffers {
        buffers.push(at);
        at += BUFFER_MIN_BYTES + if b.layer.is_some() { 4 } else { 0 };
    }
    let events = at;
    at += 8;
    let size = |instruction: &Instruction| {
        2 + match &instruction.action {
            Action::Launch(l) => 2 + 1 + if l.layer.is_some() { 4 } else { 0 } + 8 + 1 + 21 * l.args.len(),
            // Two regions, then the tensor rows: layer 4, role 2, start and end 8 each.
            Action::Copy { .. } => 40 + 22,
            Action::Record(_) | Action::Wait(_) => 4,
        }
    };
    let mut instructions = Vec::new();
    for instruction in &plan.instructions {
        instructions.push(at);
        at += size(instruction);
    }
    // The rank programs: a count, then per program its rank, a count and its instructions.
    let rank_programs = at;
    at += 4;
    for program in &plan.rank_programs {
        at += 8 + program.instructions.iter().map(size).sum::<usize>();
    }
    Layout {
        model_name,
        kv_heads,
        architecture: kv_heads + 5 * 8,
        hardware_name,
        measured_tag,
        strategy,
        alpha,
        alpha_bound,
        optimal_flag,
        buffer_count,
        buffers,
        events,
        instructions,
        rank_programs,
        end: at,
    }
}

fn round_trip(plan: &Plan) -> Vec<u8> {
    let bytes = plan.encode();
    let decoded = Plan::decode(&bytes).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(&decoded, plan);
    assert_eq!(decoded.encode(), bytes, "re-encoding gave other bytes");
    bytes
}

#[test]
fn round_trips() {
    let bytes = round_trip(&sample_plan());
    assert_eq!(layout(&sample_plan()).end, bytes.len(), "spec layout vs encoder");
    let edge = round_trip(&edge_plan());
    assert_eq!(layout(&edge_plan()).end, edge.len());
    let decoded = Plan::decode(&edge).unwrap();
    assert_eq!(decoded.provenance.alpha.to_bits(), (-0.0f64).to_bits(), "floats keep their bits");
}

/// Per-rank programs round-trip, sit where the spec says, and a count that announces more than
/// there are is refused naming the rank program.
#[test]
fn rank_programs_round_trip() {
    let mut plan = sample_plan();
    // Rank 1 runs its own program (here: the first two instructions of the shared one).
    plan.rank_programs = vec![RankProgram { rank: 1, instructions: plan.instructions[..2].to_vec() }];
    let bytes = round_trip(&plan);
    let at = layout(&plan);
    assert_eq!(at.end, bytes.len(), "spec layout vs encoder");
    assert_eq!(plan.program(1), &plan.instructions[..2]);
    assert_eq!(plan.program(0), &plan.instructions[..]);
    let mut more = bytes.clone();
    put_u32(&mut more, at.rank_programs, 2);
    reseal(&mut more);
    let error = decode_err(&more);
    assert!(matches!(error, PlanDecodeError::Truncated { section: Section::RankProgram(1), .. }), "{error:?}");
    // One fewer announced than there are: bytes left over inside the checksummed body.
    let mut fewer = bytes.clone();
    put_u32(&mut fewer, at.rank_programs, 0);
    reseal(&mut fewer);
    let offset = at.rank_programs as u64 + 4;
    assert!(matches!(decode_err(&fewer), PlanDecodeError::UnreadBytes { offset: o, .. } if o == offset));
    // A rank program's instruction naming a buffer that does not exist names the program.
    let mut bad = bytes.clone();
    let first = at.rank_programs + 4 + 8;
    // The program's first instruction is the sample's first: a launch whose first region's buffer
    // id sits after stream, action, op, layer tag (+ layer), flops and the argument count.
    let Action::Launch(launch) = &plan.instructions[0].action else { panic!("the sample starts with a launch") };
    let region = first + 2 + 2 + 1 + if launch.layer.is_some() { 4 } else { 0 } + 8 + 1;
    put_u32(&mut bad, region, 999);
    reseal(&mut bad);
    let error = decode_err(&bad);
    assert!(matches!(error, PlanDecodeError::BufferOutOfRange { instruction: 0, buffer: 999, .. }), "{error:?}");
}

#[test]
fn same_plan_same_bytes() {
    assert_eq!(sample_plan().encode(), sample_plan().encode());
    assert_ne!(sample_plan().encode(), edge_plan().encode());
}

#[test]
fn header_fields_sit_where_the_spec_says() {
    let bytes = sample_plan().encode();
    assert_eq!(&bytes[..8], b"MEMOPLAN");
    assert_eq!(u16::from_le_bytes([bytes[header::VERSION], bytes[header::VERSION + 1]]), PLAN_FORMAT_VERSION);
    assert_eq!(&bytes[header::FLAGS..header::FLAGS + 2], &[0, 0]);
    let length = u64::from_le_bytes(bytes[header::LENGTH..header::LENGTH + 8].try_into().unwrap());
    assert_eq!(length, bytes.len() as u64);
    let stored = u32::from_le_bytes(bytes[header::CHECKSUM..header::CHECKSUM + 4].try_into().unwrap());
    // CRC-32 of "123456789" is 0xcbf43926 (the standard check value): it is the IEEE CRC-32.
    assert_eq!(checksum(b"123456789"), 0xcbf4_3926);
    assert_eq!(stored, checksum(&bytes[HEADER_BYTES..]));
}

/// Changing the format (a field, its order or size, a code) without bumping
/// `PLAN_FORMAT_VERSION` breaks every plan file written before: this pins the sample plan's
/// encoding, so such a change fails here first. Bump the version, update `spec/plan-format.md`,
/// the numbers here and the seeds in `fuzz/corpus/plan_decode/`.
///
/// Version 4 (from version 3's 1340 bytes): `kv_heads` after `heads` (8 bytes) and the
/// architecture after `micro_batch` (4 code/flag bytes, two f64, the rope scaling tag and its
/// 3 f64 and u64: 53 bytes) make the sample 61 bytes longer. Version 6: the context-parallel
/// degree after `d` (8 bytes).
#[test]
fn format_version_6_is_pinned() {
    assert_eq!(PLAN_FORMAT_VERSION, 6);
    let plan = sample_plan();
    let bytes = plan.encode();
    assert_eq!((bytes.len(), checksum(&bytes[HEADER_BYTES..])), (1340 + 8 + 53 + 8, 0xc50d_e2ad));
    // The new provenance fields sit where the spec's layout puts them.
    let at = layout(&plan);
    let u64_at = |offset: usize| u64::from_le_bytes(bytes[offset..offset + 8].try_into().unwrap());
    assert_eq!((u64_at(at.kv_heads - 8), u64_at(at.kv_heads), u64_at(at.kv_heads + 8)), (2, 1, 32));
    let a = at.architecture;
    // SwiGLU 1, RMSNorm 1, biases on Q/K/V only 1, untied 0.
    assert_eq!(&bytes[a..a + 4], &[1, 1, 1, 0]);
    assert_eq!(f64::from_bits(u64_at(a + 4)), 500_000.0);
    assert_eq!(f64::from_bits(u64_at(a + 12)), 1e-6);
    assert_eq!(bytes[a + 20], 1, "rope scaling present");
    let scaling = [u64_at(a + 21), u64_at(a + 29), u64_at(a + 37)].map(f64::from_bits);
    assert_eq!((scaling, u64_at(a + 45)), ([8.0, 1.0, 4.0], 8192));
    // Then the parallel layout: t 1, d 2, c 1.
    assert_eq!((u64_at(a + 53), u64_at(a + 61), u64_at(a + 69)), (1, 2, 1));
}

#[test]
fn codes_are_the_index_in_all() {
    for (index, kind) in BufferKind::ALL.iter().enumerate() {
        assert_eq!(usize::from(buffer_kind_code(*kind)), index, "{kind:?}");
    }
    for (index, bound) in ALPHA_BOUNDS.iter().enumerate() {
        assert_eq!(usize::from(alpha_bound_code(*bound)), index, "{bound:?}");
    }
    for (index, access) in ACCESSES.iter().enumerate() {
        assert_eq!(usize::from(access_code(*access)), index, "{access:?}");
    }
    for (index, stream) in Stream::ALL.iter().enumerate() {
        assert_eq!(stream.index(), index);
    }
    for strategy in Strategy::ALL {
        assert_eq!(Strategy::from_code(strategy.code()), Some(strategy));
    }
    assert!(Op::ALL.iter().enumerate().all(|(i, op)| usize::from(op.code()) == i));
    assert!(TensorRole::ALL.iter().enumerate().all(|(i, role)| usize::from(role.code()) == i));
}

/// The sample plan's encoding with `edit` applied and the header resealed.
fn patched(edit: impl FnOnce(&mut Vec<u8>, &Layout)) -> Vec<u8> {
    let plan = sample_plan();
    let mut bytes = plan.encode();
    edit(&mut bytes, &layout(&plan));
    reseal(&mut bytes);
    bytes
}

fn decode_err(bytes: &[u8]) -> PlanDecodeError {
    let error = Plan::decode(bytes).expect_err("decoded");
    assert!(!error.to_string().is_empty());
    error
}

fn put_u32(bytes: &mut [u8], at: usize, value: u32) {
    bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

fn put_u64(bytes: &mut [u8], at: usize, value: u64) {
    bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

#[test]
fn header_errors() {
    let good = sample_plan().encode();
    assert!(matches!(decode_err(b"hello world"), PlanDecodeError::BadMagic { len: 8, .. }));
    let error = decode_err(b"PK\x03\x04");
    assert!(error.to_string().contains("b\"PK\\x03\\x04\""), "{error}");

    assert_eq!(
        decode_err(&good[..5]),
        PlanDecodeError::Truncated { section: Section::Header, offset: 0, needed: 8, available: 5 }
    );
    assert!(matches!(decode_err(&[]), PlanDecodeError::Truncated { section: Section::Header, offset: 0, .. }));
    assert!(matches!(decode_err(&good[..20]), PlanDecodeError::Truncated { section: Section::Header, offset: 16, .. }));

    let mut newer = good.clone();
    newer[header::VERSION] += 1;
    let error = decode_err(&newer);
    assert_eq!(error, PlanDecodeError::UnsupportedVersion { found: 7, supported: 6 });
    assert!(error.to_string().contains("written by plan format version 7"), "{error}");
    assert!(!error.to_string().contains("older format"), "{error}");

    // Version 5 (before context parallelism) is refused whole, saying why.
    let mut older = good.clone();
    older[header::VERSION] = 5;
    let error = decode_err(&older);
    assert_eq!(error, PlanDecodeError::UnsupportedVersion { found: 5, supported: 6 });
    let message = error.to_string();
    assert!(message.contains("version 5 plans do not record the context-parallel degree"), "{message}");

    // Version 4 (before launch scratch) is refused whole, saying why.
    let mut older = good.clone();
    older[header::VERSION] = 4;
    let error = decode_err(&older);
    assert_eq!(error, PlanDecodeError::UnsupportedVersion { found: 4, supported: 6 });
    let message = error.to_string();
    assert!(message.contains("version 4 plans carry no launch scratch") && message.contains("memo plan"), "{message}");

    // Version 3 (before the model's architecture) is refused whole, saying why.
    let mut older = good.clone();
    older[header::VERSION] = 3;
    let error = decode_err(&older);
    assert_eq!(error, PlanDecodeError::UnsupportedVersion { found: 3, supported: 6 });
    let message = error.to_string();
    assert!(message.contains("written by plan format version 3; this build reads version 6 only"), "{message}");
    assert!(message.contains("key/value heads and architecture") && message.contains("memo plan"), "{message}");
    assert!(!message.contains("collective stream"), "{message}");

    // Version 2 (before the collective stream and per-rank programs) is refused whole, saying why.
    let mut older = good.clone();
    older[header::VERSION] = 2;
    let error = decode_err(&older);
    assert_eq!(error, PlanDecodeError::UnsupportedVersion { found: 2, supported: 6 });
    let message = error.to_string();
    assert!(message.contains("written by plan format version 2; this build reads version 6 only"), "{message}");
    assert!(message.contains("no collective stream") && message.contains("memo plan"), "{message}");

    // Version 1 (before swap identities) is refused whole, saying why.
    let mut older = good.clone();
    older[header::VERSION] = 1;
    let error = decode_err(&older);
    assert_eq!(error, PlanDecodeError::UnsupportedVersion { found: 1, supported: 6 });
    let message = error.to_string();
    assert!(message.contains("written by plan format version 1; this build reads version 6 only"), "{message}");
    assert!(message.contains("an older format") && message.contains("memo plan"), "{message}");

    let mut flagged = good.clone();
    flagged[header::FLAGS] = 1;
    assert!(matches!(decode_err(&flagged), PlanDecodeError::BadCode { value: 1, offset: 10, at: Section::Header, .. }));

    let mut short_length = good.clone();
    put_u64(&mut short_length, header::LENGTH, 23);
    assert!(matches!(decode_err(&short_length), PlanDecodeError::BadCode { value: 23, offset: 16, .. }));

    let len = good.len() as u64;
    assert_eq!(
        decode_err(&good[..good.len() - 1]),
        PlanDecodeError::Truncated { section: Section::Body, offset: len - 1, needed: 1, available: 0 }
    );

    let mut appended = good.clone();
    appended.extend_from_slice(b"xyz");
    let error = decode_err(&appended);
    assert_eq!(error, PlanDecodeError::TrailingBytes { offset: len, count: 3 });
    assert!(error.to_string().contains(&format!("keep the first {len} bytes")), "{error}");
}

#[test]
fn checksum_errors() {
    let good = sample_plan().encode();
    let stored = u32::from_le_bytes(good[12..16].try_into().unwrap());
    let mut flipped = good.clone();
    flipped[header::CHECKSUM + 2] ^= 0x40;
    assert_eq!(
        decode_err(&flipped),
        PlanDecodeError::ChecksumMismatch { stored: stored ^ 0x40_0000, computed: stored }
    );

    let mut body = good.clone();
    let last = body.len() - 1;
    body[last] ^= 1;
    let error = decode_err(&body);
    assert!(matches!(error, PlanDecodeError::ChecksumMismatch { stored: s, .. } if s == stored), "{error:?}");
    assert!(error.to_string().contains("re-create the plan with `memo plan`"), "{error}");
}

#[test]
fn truncated_sections_name_where() {
    let plan = sample_plan();
    let at = layout(&plan);
    // Cut inside the last instruction, header resealed: the body decoder must notice.
    let cut = at.instructions[at.instructions.len() - 1] + 3;
    let mut bytes = plan.encode();
    bytes.truncate(cut);
    reseal(&mut bytes);
    let error = decode_err(&bytes);
    assert!(matches!(error, PlanDecodeError::Truncated { section: Section::Instruction(9), .. }), "{error:?}");
    assert!(error.to_string().contains("instruction 9"), "{error}");

    // A count far beyond the bytes left is refused before anything is allocated.
    let bytes = patched(|b, at| put_u32(b, at.buffer_count, u32::MAX));
    let error = decode_err(&bytes);
    let needed = u64::from(u32::MAX) * BUFFER_MIN_BYTES as u64;
    assert!(
        matches!(error, PlanDecodeError::Truncated { section: Section::BufferCount, needed: n, .. } if n == needed),
        "{error:?}"
    );
    let bytes = patched(|b, at| put_u32(b, at.events + 4, u32::MAX));
    assert!(matches!(decode_err(&bytes), PlanDecodeError::Truncated { section: Section::InstructionCount, .. }));
    let bytes = patched(|b, at| put_u32(b, at.model_name, u32::MAX));
    assert!(matches!(decode_err(&bytes), PlanDecodeError::Truncated { section: Section::Provenance, offset: 28, .. }));

    // One instruction fewer than announced: the body ends after its last one, resealed.
    let bytes = patched(|b, at| put_u32(b, at.events + 4, 11));
    assert!(matches!(decode_err(&bytes), PlanDecodeError::Truncated { section: Section::Instruction(10), .. }));
    // No rank program announced where there is one: bytes left over inside the checksummed body
    // (`rank_programs_round_trip`); here, an instruction fewer announced than there are leaves
    // the last one to be read as the rank programs, which it is not.
    let bytes = patched(|b, at| put_u32(b, at.events + 4, 9));
    assert!(Plan::decode(&bytes).is_err());
}

/// A field's name, where it is, a value outside its table, and the section the error names.
type CodeCase = (&'static str, fn(&Layout) -> usize, u8, Section);

#[test]
fn bad_codes_name_the_field_and_offset() {
    let cases: [CodeCase; 12] = [
        ("strategy code", |at| at.strategy, 4, Section::Provenance),
        ("alpha bound code", |at| at.alpha_bound, 4, Section::Provenance),
        ("measured layer time tag", |at| at.measured_tag, 2, Section::Provenance),
        ("optimal flag", |at| at.optimal_flag, 2, Section::Provenance),
        ("buffer kind code", |at| at.buffers[3], 10, Section::Buffer(3)),
        ("tensor role code", |at| at.buffers[4] + 1, 200, Section::Buffer(4)),
        ("layer tag", |at| at.buffers[5] + 3, 7, Section::Buffer(5)),
        ("place code", |at| at.buffers[0] + 5 + 24, 2, Section::Buffer(0)),
        ("stream code", |at| at.instructions[2], 4, Section::Instruction(2)),
        ("action code", |at| at.instructions[2] + 1, 4, Section::Instruction(2)),
        ("op code", |at| at.instructions[1] + 2, 200, Section::Instruction(1)),
        // The role a copy names (after its two 20-byte regions and the layer).
        ("tensor role code", |at| at.instructions[4] + 2 + 40 + 4, 200, Section::Instruction(4)),
    ];
    for (what, offset_of, value, section) in cases {
        let mut offset = 0;
        let bytes = patched(|b, at| {
            offset = offset_of(at);
            b[offset] = value;
        });
        let error = decode_err(&bytes);
        match &error {
            PlanDecodeError::BadCode { what: w, value: v, offset: o, at } => {
                assert!(w.starts_with(what), "{what}: {error:?}");
                assert_eq!((*v, *o, *at), (u64::from(value), offset as u64, section), "{what}");
            }
            _ => panic!("{what}: {error:?}"),
        }
        assert!(error.to_string().contains(&format!("byte {offset}")), "{error}");
    }
    // The access code of the embedding launch's first argument.
    let bytes = patched(|b, at| b[at.instructions[0] + 2 + 2 + 1 + 8 + 1 + 20] = 3);
    assert!(matches!(decode_err(&bytes), PlanDecodeError::BadCode { what: "access code", value: 3, .. }));
}

#[test]
fn names_must_be_utf8() {
    let bytes = patched(|b, at| b[at.hardware_name + 4] = 0xff);
    let error = decode_err(&bytes);
    assert_eq!(
        error,
        PlanDecodeError::BadUtf8 { what: "hardware name", offset: layout(&sample_plan()).hardware_name as u64 }
    );
}

#[test]
fn floats_must_be_in_range() {
    for alpha in [f64::NAN, 1.5, -0.25, f64::INFINITY] {
        let bytes = patched(|b, at| put_u64(b, at.alpha, alpha.to_bits()));
        let error = decode_err(&bytes);
        assert!(matches!(error, PlanDecodeError::BadFloat { what: "alpha", .. }), "{alpha}: {error:?}");
        assert!(error.to_string().contains("must be a number in [0, 1]"), "{error}");
    }
    for seconds in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let bytes = patched(|b, at| put_u64(b, at.measured_tag + 1, f64::to_bits(seconds)));
        let error = decode_err(&bytes);
        assert!(
            matches!(error, PlanDecodeError::BadFloat { what: "the measured layer forward time", .. }),
            "{error:?}"
        );
    }
}

/// Structural errors, from plans that encode (the encoder writes what it is given) but must not
/// decode; the checksum is right, so only the body decoder can catch them.
#[test]
fn structural_errors() {
    let mutate = |edit: fn(&mut Plan)| {
        let mut plan = sample_plan();
        edit(&mut plan);
        decode_err(&plan.encode())
    };
    fn set_region(plan: &mut Plan, instruction: usize, arg: usize, region: Region) {
        if let Action::Launch(l) = &mut plan.instructions[instruction].action {
            l.args[arg].region = region;
        }
    }
    let error = mutate(|p| p.buffers[4].rows = u64::MAX);
    assert!(matches!(error, PlanDecodeError::BufferTooLarge { buffer: 4, rows: u64::MAX, .. }), "{error:?}");
    assert!(error.to_string().contains("do not fit in 64 bits"), "{error}");
    let error = mutate(|p| p.buffers[11].place = Place::Device { offset: u64::MAX - 3 });
    assert!(
        matches!(error, PlanDecodeError::BufferTooLarge { buffer: 11, .. }) && error.to_string().contains("end past")
    );

    let error = mutate(|p| set_region(p, 1, 1, Region::rows(BufferId(13), 0, 1)));
    let operand = Operand::Arg { index: 1, name: "weight" };
    assert_eq!(error, PlanDecodeError::BufferOutOfRange { instruction: 1, operand, buffer: 13, buffers: 13 });
    assert!(error.to_string().contains("instruction 1: argument 1 (`weight`) names buffer 13"), "{error}");

    let error = mutate(|p| {
        p.instructions[4].action = Action::Copy {
            src: Region::rows(BufferId(6), 0, 4),
            dst: Region::rows(BufferId(u32::MAX), 0, 4),
            tensor: layer0_input(0, 4),
        }
    });
    assert!(matches!(error, PlanDecodeError::BufferOutOfRange { instruction: 4, operand: Operand::Destination, .. }));

    let error = mutate(|p| set_region(p, 0, 0, Region::rows(BufferId(0), 5, 4)));
    assert!(matches!(error, PlanDecodeError::BadRowRange { instruction: 0, start: 5, end: 4, .. }), "{error:?}");
    assert!(error.to_string().contains("its end is before its start"), "{error}");
    let error = mutate(|p| {
        p.instructions[7].action = Action::Copy {
            src: Region::rows(BufferId(10), 0, 9),
            dst: Region::rows(BufferId(6), 0, 4),
            tensor: layer0_input(0, 4),
        }
    });
    assert!(matches!(error, PlanDecodeError::BadRowRange { instruction: 7, operand: Operand::Source, rows: 8, .. }));

    // Version 2's swap identities: a host slot's rows must end below 2^64, a copy's named rows
    // must not end before they start.
    let error = mutate(|p| p.buffers[10].first_row = u64::MAX - 7);
    assert_eq!(error, PlanDecodeError::FirstRowTooLarge { buffer: 10, first_row: u64::MAX - 7, rows: 8 });
    assert!(error.to_string().contains("buffer 10: 8 rows from row"), "{error}");
    let fits = sample_plan();
    let mut last_row = fits.clone();
    last_row.buffers[10].first_row = u64::MAX - 8;
    assert_eq!(Plan::decode(&last_row.encode()).map(|p| p.buffers[10].first_row), Ok(u64::MAX - 8));
    let error = mutate(|p| {
        if let Action::Copy { tensor, .. } = &mut p.instructions[7].action {
            *tensor = layer0_input(5, 4);
        }
    });
    assert_eq!(error, PlanDecodeError::BadTensorRows { instruction: 7, start: 5, end: 4 });
    assert!(error.to_string().contains("instruction 7: the copy names tensor rows [5, 4)"), "{error}");

    let error = mutate(|p| p.instructions[5].action = Action::Record(EventId(2)));
    let expected = PlanDecodeError::EventOutOfRange { instruction: 5, action: "record", event: 2, events: 2 };
    assert_eq!(error, expected);
    let error = mutate(|p| p.events = 1);
    assert!(matches!(error, PlanDecodeError::EventOutOfRange { instruction: 5, event: 1, events: 1, .. }));
    assert!(error.to_string().contains("record of event 1, but the plan has 1 events"), "{error}");

    let error = mutate(|p| {
        if let Action::Launch(l) = &mut p.instructions[1].action {
            l.args.pop();
        }
    });
    assert_eq!(error, PlanDecodeError::ArgumentCount { instruction: 1, op: Op::Linear, found: 3, expected: 4 });
    assert!(error.to_string().contains("it takes 4 (x, weight, bias, y)"), "{error}");

    let error = mutate(|p| {
        if let Action::Launch(l) = &mut p.instructions[9].action {
            l.args[0].access = Access::Write;
        }
    });
    let operand = Operand::Arg { index: 0, name: "logits" };
    let expected = PlanDecodeError::ArgumentAccess {
        instruction: 9,
        op: Op::CrossEntropy,
        operand,
        found: Access::Write,
        expected: Access::ReadWrite,
    };
    assert_eq!(error, expected);
    assert!(error.to_string().contains("is marked write, but `cross_entropy` accesses it as read_write"), "{error}");
}

/// Decoding must return, without panicking, on any bytes; an `Ok` must re-encode to the same
/// bytes (every accepted string is the canonical encoding of its plan).
fn decode_never_panics(bytes: &[u8]) {
    if let Ok(plan) = Plan::decode(bytes) {
        assert_eq!(plan.encode(), bytes);
    }
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = SplitMix64::new(0x706c_616e_0001);
    let good = sample_plan().encode();
    for case in 0..2_000 {
        let len = rng.below(200) as usize;
        let mut bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        // Half the cases start with a valid header prefix and are resealed, to reach the body.
        if case % 2 == 1 {
            let keep = bytes.len().min(HEADER_BYTES);
            bytes[..keep].copy_from_slice(&good[..keep]);
            reseal(&mut bytes);
        }
        decode_never_panics(&bytes);
    }
}

#[test]
fn single_byte_mutations_never_panic() {
    let mut rng = SplitMix64::new(0x706c_616e_0002);
    let good = sample_plan().encode();
    let mut errors = 0;
    for case in 0..2_000 {
        let mut bytes = good.clone();
        let at = rng.below(bytes.len() as u64) as usize;
        bytes[at] ^= 1 + rng.below(255) as u8;
        // Most mutations are resealed, or the checksum would catch them all.
        if case % 4 != 0 {
            reseal(&mut bytes);
        }
        decode_never_panics(&bytes);
        errors += usize::from(Plan::decode(&bytes).is_err());
    }
    // A changed byte in a checksummed, canonical encoding can still decode (a count, a size), but
    // most hit a code, an id or a range.
    assert!(errors > 1_000, "{errors}");
}

/// `spec/plan-format.md` lists every role and op with its code, and every op's arguments in
/// signature order.
#[test]
fn the_spec_lists_every_code() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../spec/plan-format.md");
    let Ok(spec) = std::fs::read_to_string(&path) else {
        std::println!("SKIP: no spec at {}", path.display());
        return;
    };
    for role in TensorRole::ALL {
        let row = format!("| {} | `{}` |", role.code(), role.name());
        assert!(spec.contains(&row), "the spec lacks the role row {row}");
    }
    for op in Op::ALL {
        let args: Vec<String> = op
            .signature()
            .iter()
            .map(|(name, access)| {
                let access = match access {
                    Access::Read => "R",
                    Access::Write => "W",
                    Access::ReadWrite => "RW",
                };
                format!("`{name}` {access}")
            })
            .collect();
        let row = format!("| {} | `{}` | {} |", op.code(), op.name(), args.join(", "));
        assert!(spec.contains(&row), "the spec lacks the op row {row}");
    }
    for kind in BufferKind::ALL {
        assert!(spec.contains(&format!("`{}` {}", kind.name(), buffer_kind_code(kind))), "{kind:?}");
    }
    for strategy in Strategy::ALL {
        assert!(spec.contains(&format!("`{}` {}", strategy.name(), strategy.code())), "{strategy:?}");
    }
    for bound in ALPHA_BOUNDS {
        assert!(spec.contains(&format!("`{}` {}", alpha_bound_name(bound), alpha_bound_code(bound))), "{bound:?}");
    }
}

/// The decoder's memory claim (`spec/plan-format.md`: at most about 14 times the input): what
/// it allocates per element, against the fewest bytes that element takes encoded.
#[test]
fn decoded_elements_are_at_most_14_times_their_encoding() {
    use core::mem::size_of;
    assert!(size_of::<Buffer>() <= 11 * BUFFER_MIN_BYTES, "{}", size_of::<Buffer>());
    // A copy (two regions and the tensor rows it names) is the largest action: 80 bytes against
    // the 6 of a record, so instructions are the 14 times.
    assert!(size_of::<Instruction>() <= 14 * INSTRUCTION_MIN_BYTES, "{}", size_of::<Instruction>());
    // A launch's arguments: one `Arg` per 21 encoded bytes.
    assert!(size_of::<Arg>() <= 11 * 21, "{}", size_of::<Arg>());
}

/// Every error says how to fix it (re-create the plan, or which version wrote it).
#[test]
fn every_error_says_what_to_do() {
    let operand = Operand::Arg { index: 2, name: "bias" };
    let errors = [
        PlanDecodeError::BadMagic { found: *b"GIF89a\0\0", len: 6 },
        PlanDecodeError::UnsupportedVersion { found: 1, supported: 2 },
        PlanDecodeError::UnsupportedVersion { found: 3, supported: 2 },
        PlanDecodeError::Truncated { section: Section::Buffer(3), offset: 200, needed: 8, available: 2 },
        PlanDecodeError::ChecksumMismatch { stored: 1, computed: 2 },
        PlanDecodeError::BadCode { what: "op code", value: 99, offset: 300, at: Section::Instruction(4) },
        PlanDecodeError::BadUtf8 { what: "model name", offset: 24 },
        PlanDecodeError::BadFloat {
            what: "alpha",
            bits: f64::NAN.to_bits(),
            offset: 90,
            expected: "a number in [0, 1]",
        },
        PlanDecodeError::TrailingBytes { offset: 1000, count: 3 },
        PlanDecodeError::UnreadBytes { offset: 900, count: 100 },
        PlanDecodeError::BufferTooLarge { buffer: 5, rows: u64::MAX, row_bytes: 2, offset: 0 },
        PlanDecodeError::FirstRowTooLarge { buffer: 5, first_row: u64::MAX, rows: 2 },
        PlanDecodeError::BadTensorRows { instruction: 7, start: 4, end: 3 },
        PlanDecodeError::BufferOutOfRange { instruction: 7, operand, buffer: 40, buffers: 12 },
        PlanDecodeError::BadRowRange { instruction: 7, operand, buffer: 3, start: 0, end: 9, rows: 8 },
        PlanDecodeError::EventOutOfRange { instruction: 8, action: "wait", event: 5, events: 2 },
        PlanDecodeError::ArgumentCount { instruction: 9, op: Op::Gelu, found: 3, expected: 2 },
        PlanDecodeError::ArgumentAccess {
            instruction: 9,
            op: Op::Gelu,
            operand: Operand::Arg { index: 1, name: "y" },
            found: Access::Read,
            expected: Access::Write,
        },
    ];
    for error in errors {
        let message = error.to_string();
        std::println!("{message}");
        assert!(message.contains("memo plan"), "{message}");
    }
}
