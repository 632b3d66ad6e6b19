//! Harness for the plan's byte format: [`Plan::decode`], [`Plan::encode`] and [`Plan::to_json`].
//!
//! What [`check`] asserts:
//! - on any bytes, `decode` returns `Ok` or `Err`, never panics (nor allocates more than a small
//!   multiple of its input: a count it cannot back with bytes is an error before any allocation);
//! - an `Ok` plan re-encodes to exactly the bytes it came from (every accepted byte string is the
//!   one encoding of its plan), and those bytes decode to an identical plan; its JSON view is
//!   written without panicking;
//! - an `Err` displays as a message, and its byte offsets lie within the input;
//! - the same for the input *resealed* (its header's length and checksum set to match it), which
//!   is how mutated bytes get past the checksum to the body's decoder;
//! - a generated valid plan round-trips exactly (`decode(encode(p)) == p`, the same bytes again),
//!   and its encoding with a few bytes changed (resealed or not) obeys the rules above.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::fmt;

use arbitrary::{Arbitrary, Result, Unstructured};

use crate::model::{Architecture, Biases, Ffn, Hardware, Interconnect, ModelConfig, Norm, Parallelism, RopeScaling};
use crate::plan::encode::{reseal, ALPHA_BOUNDS, HEADER_BYTES};
use crate::plan::{
    Action, Arg, Buffer, BufferId, BufferKind, EventId, Instruction, Launch, Op, Place, PlacementSummary, Plan,
    PlanDecodeError, Provenance, RankProgram, Region, Strategy, Stream, TensorRole, TensorRows, Totals,
};

/// The shape of generated plans.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Buffers, at most.
    pub max_buffers: usize,
    /// Instructions, at most.
    pub max_instructions: usize,
    /// Events, at most.
    pub max_events: u32,
    /// Bytes changed in a generated plan's encoding, at most.
    pub max_mutations: usize,
}

/// The limits of the plan_decode harness.
pub const OPTIONS: Options = Options { max_buffers: 24, max_instructions: 48, max_events: 8, max_mutations: 4 };

/// One fuzz case. As in `trace_parse`, the first byte chooses: an ASCII byte (below 0x80; an
/// encoded plan starts with `M`) makes the whole input a [`PlanCase::Bytes`], so a plan file is a
/// seed as it is; a byte from 0x80 up builds a [`PlanCase::Generated`] from the bytes after it.
#[derive(Clone)]
pub enum PlanCase {
    /// Any bytes, decoded as they are and resealed.
    Bytes(Vec<u8>),
    /// A valid plan, and bytes to change in its encoding.
    Generated(Box<GeneratedPlan>),
}

/// A generated valid plan and a mutation of its encoding.
#[derive(Clone, Debug)]
pub struct GeneratedPlan {
    /// The plan.
    pub plan: Plan,
    /// `(position, xor)`: the byte at `position % len` is xored with `xor`.
    pub mutations: Vec<(u32, u8)>,
    /// Whether the mutated bytes are resealed before decoding (the resealed copy is checked too).
    pub reseal: bool,
}

/// Raw bytes print as a byte string, which reads better in a crash report than a list of numbers.
impl fmt::Debug for PlanCase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanCase::Bytes(bytes) => write!(f, "Bytes(b\"{}\")", bytes.escape_ascii()),
            PlanCase::Generated(generated) => f.debug_tuple("Generated").field(generated).finish(),
        }
    }
}

impl PlanCase {
    /// Whether the first byte asks for a generated plan (and consumes it if so).
    fn generated(u: &mut Unstructured<'_>) -> Result<bool> {
        match u.peek_bytes(1) {
            Some(&[tag]) if tag >= 0x80 => {
                u.bytes(1)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

impl<'a> Arbitrary<'a> for PlanCase {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        Ok(if PlanCase::generated(u)? { PlanCase::Generated(u.arbitrary()?) } else { PlanCase::Bytes(u.arbitrary()?) })
    }

    fn arbitrary_take_rest(mut u: Unstructured<'a>) -> Result<Self> {
        Ok(if PlanCase::generated(&mut u)? {
            PlanCase::Generated(u.arbitrary()?)
        } else {
            PlanCase::Bytes(u.take_rest().to_vec())
        })
    }
}

/// A `u64` that is small most of the time (so sizes and ranges look like plans), any value
/// sometimes.
fn mostly_small(u: &mut Unstructured<'_>, small: u64) -> Result<u64> {
    if u.ratio(1, 8)? {
        u.arbitrary()
    } else {
        u.int_in_range(0..=small)
    }
}

fn summary(u: &mut Unstructured<'_>) -> Result<PlacementSummary> {
    Ok(PlacementSummary {
        buffers: u.arbitrary()?,
        peak_bytes: u.arbitrary()?,
        lower_bound_bytes: u.arbitrary()?,
        optimal: u.arbitrary()?,
        nodes: u.arbitrary()?,
    })
}

/// An architecture the decoder accepts: every kind, a rotary base above 1, an epsilon in (0, 1),
/// a rescaling or none.
fn architecture(u: &mut Unstructured<'_>) -> Result<Architecture> {
    let scaling = if u.arbitrary()? {
        Some(RopeScaling {
            factor: 1.0 + f64::from(u.int_in_range(0..=64u8)?),
            low_freq_factor: 1.0,
            high_freq_factor: 1.0 + f64::from(u.int_in_range(1..=8u8)?),
            original_max_positions: u.arbitrary()?,
        })
    } else {
        None
    };
    Ok(Architecture {
        ffn: *u.choose(&Ffn::ALL)?,
        norm: *u.choose(&Norm::ALL)?,
        biases: *u.choose(&Biases::ALL)?,
        tied_embeddings: u.arbitrary()?,
        rope_theta: 2.0 + f64::from(u.arbitrary::<u32>()?),
        rope_scaling: scaling,
        norm_eps: (1.0 + f64::from(u.int_in_range(0..=1000u16)?)) * 1e-7,
    })
}

fn provenance(u: &mut Unstructured<'_>) -> Result<Provenance> {
    let model = ModelConfig {
        name: u.arbitrary()?,
        layers: u.arbitrary()?,
        hidden: u.arbitrary()?,
        heads: u.arbitrary()?,
        kv_heads: u.arbitrary()?,
        ffn_hidden: u.arbitrary()?,
        vocab: u.arbitrary()?,
        seq_len: u.arbitrary()?,
        micro_batch: u.arbitrary()?,
        architecture: architecture(u)?,
    };
    let parallel = Parallelism { tensor: u.arbitrary()?, data: u.arbitrary()?, context: 1 };
    let measured = if u.arbitrary()? {
        // Finite and above 0, as the decoder requires: from a microsecond to over an hour.
        Some(f64::from(u.int_in_range(1..=u32::MAX)?) * 1e-6)
    } else {
        None
    };
    let hardware = Hardware {
        name: u.arbitrary()?,
        device_memory_bytes: u.arbitrary()?,
        host_memory_per_node_bytes: u.arbitrary()?,
        gpus_per_node: u.arbitrary()?,
        d2h_bytes_per_s: u.arbitrary()?,
        h2d_bytes_per_s: u.arbitrary()?,
        gpus_sharing_uplink: u.arbitrary()?,
        peak_flops: u.arbitrary()?,
        achieved_flops: u.arbitrary()?,
        measured_layer_forward_s: measured,
        measured_rates: crate::model::MeasuredRates::NONE,
    };
    let alpha = match u.int_in_range(0..=3u8)? {
        0 => 0.0,
        1 => 1.0,
        2 => -0.0,
        _ => f64::from(u.arbitrary::<u32>()?) / f64::from(u32::MAX),
    };
    let interconnect = Interconnect { bytes_per_s: u.arbitrary()?, latency_ns: u.arbitrary()? };
    Ok(Provenance {
        model,
        parallel,
        hardware,
        interconnect,
        strategy: *u.choose(&Strategy::ALL)?,
        alpha,
        alpha_bound: *u.choose(&ALPHA_BOUNDS)?,
        swapped_rows: u.arbitrary()?,
        level1_forward: summary(u)?,
        level1_backward: summary(u)?,
        level2: summary(u)?,
    })
}

fn buffer(u: &mut Unstructured<'_>) -> Result<Buffer> {
    let rows = mostly_small(u, 64)?;
    let mut row_bytes = mostly_small(u, 4096)?;
    let bytes = match rows.checked_mul(row_bytes) {
        Some(bytes) => bytes,
        None => {
            row_bytes = u64::MAX / rows;
            rows * row_bytes
        }
    };
    // The buffer must end below 2^64.
    let room = u64::MAX - bytes;
    let offset = if u.ratio(1, 8)? { u.int_in_range(0..=room)? } else { u.int_in_range(0..=room.min(1 << 20))? };
    // Mostly 0 as the planner writes it; the last row of its tensor must stay below 2^64.
    let first_row = if u.ratio(1, 4)? { u.int_in_range(0..=u64::MAX - rows)? } else { 0 };
    Ok(Buffer {
        kind: *u.choose(&BufferKind::ALL)?,
        role: *u.choose(TensorRole::ALL)?,
        layer: u.arbitrary()?,
        slot: u.arbitrary()?,
        rows,
        first_row,
        row_bytes,
        place: if u.arbitrary()? { Place::Host { offset } } else { Place::Device { offset } },
    })
}

/// A region of one of `buffers` (not empty) with rows inside it.
fn region(u: &mut Unstructured<'_>, buffers: &[Buffer]) -> Result<Region> {
    let index = u.choose_index(buffers.len())?;
    let rows = buffers[index].rows;
    let start = u.int_in_range(0..=rows)?;
    let end = u.int_in_range(start..=rows)?;
    Ok(Region::rows(BufferId(index as u32), start, end))
}

fn instruction(u: &mut Unstructured<'_>, buffers: &[Buffer], events: u32) -> Result<Instruction> {
    let stream = *u.choose(&Stream::ALL)?;
    let kind = match (buffers.is_empty(), events) {
        (true, _) => 2 + u.int_in_range(0..=1u8)?,
        (false, 0) => u.int_in_range(0..=1u8)?,
        (false, _) => u.int_in_range(0..=3u8)?,
    };
    let action = match kind {
        0 => {
            let op = *u.choose(Op::ALL)?;
            let mut args = Vec::new();
            for &(_, access) in op.signature() {
                args.push(Arg { region: region(u, buffers)?, access });
            }
            // Sometimes a scratch argument (plan format 5).
            if u.ratio(1, 8)? {
                args.push(Arg { region: region(u, buffers)?, access: crate::plan::Access::Write });
            }
            Action::Launch(Launch { op, args, layer: u.arbitrary()?, flops: u.arbitrary()? })
        }
        1 => {
            let (src, dst) = (region(u, buffers)?, region(u, buffers)?);
            let start = mostly_small(u, 64)?;
            let end = start.saturating_add(mostly_small(u, 64)?);
            let tensor = TensorRows { layer: u.arbitrary()?, role: *u.choose(TensorRole::ALL)?, start, end };
            Action::Copy { src, dst, tensor }
        }
        2 => Action::Record(EventId(u.int_in_range(0..=events - 1)?)),
        _ => Action::Wait(EventId(u.int_in_range(0..=events - 1)?)),
    };
    Ok(Instruction { stream, action })
}

impl<'a> Arbitrary<'a> for GeneratedPlan {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let provenance = provenance(u)?;
        let totals = Totals {
            arena_bytes: u.arbitrary()?,
            arena_lower_bound_bytes: u.arbitrary()?,
            host_bytes: u.arbitrary()?,
            parameter_bytes: u.arbitrary()?,
            rounding_buffer_bytes: u.arbitrary()?,
        };
        let mut buffers = Vec::new();
        for _ in 0..u.int_in_range(0..=OPTIONS.max_buffers)? {
            buffers.push(buffer(u)?);
        }
        let events = u.int_in_range(0..=OPTIONS.max_events)?;
        let mut instructions = Vec::new();
        if !buffers.is_empty() || events > 0 {
            for _ in 0..u.int_in_range(0..=OPTIONS.max_instructions)? {
                instructions.push(instruction(u, &buffers, events)?);
            }
        }
        let mut rank_programs = Vec::new();
        if (!buffers.is_empty() || events > 0) && u.ratio(1, 4)? {
            for _ in 0..u.int_in_range(1..=2u8)? {
                let mut program = Vec::new();
                for _ in 0..u.int_in_range(0..=OPTIONS.max_instructions)? {
                    program.push(instruction(u, &buffers, events)?);
                }
                rank_programs.push(RankProgram { rank: u.arbitrary()?, instructions: program });
            }
        }
        let mut mutations = Vec::new();
        for _ in 0..u.int_in_range(0..=OPTIONS.max_mutations)? {
            mutations.push((u.arbitrary()?, u.arbitrary()?));
        }
        let plan = Plan { provenance, buffers, events, instructions, rank_programs, totals };
        Ok(GeneratedPlan { plan, mutations, reseal: u.arbitrary()? })
    }
}

/// Checks one case (see the module docs); panics on the first violated invariant.
pub fn check(case: PlanCase) {
    match case {
        PlanCase::Bytes(bytes) => check_bytes(&bytes),
        PlanCase::Generated(generated) => {
            let bytes = generated.plan.encode();
            match Plan::decode(&bytes) {
                Ok(decoded) => assert_eq!(decoded, generated.plan, "a valid plan did not round-trip"),
                Err(e) => panic!("a valid plan does not decode: {e}\n{:?}", generated.plan),
            }
            check_bytes(&bytes);
            let mut mutated = bytes;
            for &(position, xor) in &generated.mutations {
                let len = mutated.len();
                mutated[position as usize % len] ^= xor;
            }
            if generated.reseal {
                reseal(&mut mutated);
            }
            check_bytes(&mutated);
        }
    }
}

/// The invariants that hold for any bytes: as they are, and resealed.
pub fn check_bytes(bytes: &[u8]) {
    check_decode(bytes);
    if bytes.len() >= HEADER_BYTES {
        let mut resealed = bytes.to_vec();
        reseal(&mut resealed);
        check_decode(&resealed);
    }
}

fn check_decode(bytes: &[u8]) {
    match Plan::decode(bytes) {
        Ok(plan) => {
            let again = plan.encode();
            assert!(again == bytes, "decoded, but re-encodes to other bytes:\n{plan:?}");
            assert_eq!(Plan::decode(&again).as_ref(), Ok(&plan), "decode(encode(decode(bytes)))");
            assert!(plan.to_json().starts_with('{'));
            // What a decoded plan of arbitrary bytes promises: the checker judges it without
            // panicking (every violation printable).
            if let Err(violations) = crate::check::check_plan(&plan) {
                assert!(violations.iter().all(|v| !alloc::format!("{v}").is_empty()));
            }
        }
        Err(e) => sensible_error(&e, bytes.len() as u64),
    }
}

/// An error's offsets lie within the input, and it has a message.
fn sensible_error(e: &PlanDecodeError, len: u64) {
    let within = match *e {
        PlanDecodeError::Truncated { offset, needed, available, .. } => offset + available <= len && needed > available,
        PlanDecodeError::BadCode { offset, .. }
        | PlanDecodeError::BadUtf8 { offset, .. }
        | PlanDecodeError::BadFloat { offset, .. } => offset < len,
        PlanDecodeError::TrailingBytes { offset, count } | PlanDecodeError::UnreadBytes { offset, count } => {
            offset + count <= len && count > 0
        }
        _ => true,
    };
    assert!(within, "{e:?} in {len} bytes");
    assert!(!alloc::format!("{e}").is_empty());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::encode::tests::{edge_plan, sample_plan};

    #[test]
    fn smoke() {
        super::super::smoke(0x706c_616e_6465, 6_000, 1_500, check);
    }

    #[test]
    fn the_committed_corpus_passes() {
        super::super::run_corpus("plan_decode", check);
    }

    /// The committed seeds are today's encodings of the test plans: a format change that forgets
    /// them (or the version) fails here. `write_seed_corpus` rewrites them.
    #[test]
    fn the_seeds_are_current_encodings() {
        let folder = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/plan_decode");
        if !folder.exists() {
            std::println!("SKIP: no corpus at {}", folder.display());
            return;
        }
        for (name, plan) in [("sample.plan", sample_plan()), ("edge.plan", edge_plan())] {
            let seed = std::fs::read(folder.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(
                seed == plan.encode(),
                "{name} is stale: run `cargo test -p memo-plan-core --features fuzzing -- --ignored write_seed_corpus`"
            );
        }
    }

    /// Writes the seed corpus: the two test plans' encodings and one generated case.
    #[test]
    #[ignore = "writes fuzz/corpus/plan_decode/; run by hand after a format change"]
    fn write_seed_corpus() {
        let folder = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/plan_decode");
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::write(folder.join("sample.plan"), sample_plan().encode()).unwrap();
        std::fs::write(folder.join("edge.plan"), edge_plan().encode()).unwrap();
        let mut rng = crate::generate::SplitMix64::new(7);
        let mut generated = std::vec![0x80u8];
        generated.extend((0..1_000).map(|_| rng.next_u64() as u8));
        std::fs::write(folder.join("generated"), generated).unwrap();
    }

    /// Generated plans' JSON views parse, with one entry per buffer and instruction.
    #[test]
    fn generated_plans_json_parses() {
        super::super::smoke(0x6a73_6f6e, 300, 1_500, |case: PlanCase| {
            if let PlanCase::Generated(generated) = case {
                let text = generated.plan.to_json();
                let json: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
                assert_eq!(json["buffers"].as_array().map(Vec::len), Some(generated.plan.buffers.len()));
                assert_eq!(json["instructions"].as_array().map(Vec::len), Some(generated.plan.instructions.len()));
                assert_eq!(
                    json["provenance"]["model"]["name"].as_str(),
                    Some(generated.plan.provenance.model.name.as_str())
                );
            }
        });
    }

    #[test]
    fn a_plan_file_is_a_seed_as_it_is() {
        let bytes = sample_plan().encode();
        let case = PlanCase::arbitrary_take_rest(Unstructured::new(&bytes)).unwrap();
        assert!(matches!(&case, PlanCase::Bytes(b) if *b == bytes), "{case:?}");
        let generated = PlanCase::arbitrary_take_rest(Unstructured::new(&[0x80, 7, 7, 7])).unwrap();
        assert!(matches!(generated, PlanCase::Generated(_)), "{generated:?}");
    }
}
