//! Hand-written plans: one valid mini step, then one broken copy of it per rule, each asserting
//! the exact violations (variant and instruction) the break causes, cascades included.

use alloc::string::ToString;
use alloc::vec::Vec;

use super::*;
use crate::generate::SplitMix64;
use crate::model::{Hardware, Interconnect, ModelConfig, Parallelism};
use crate::plan::{
    Arg, Buffer, Instruction, Launch, Op, PlacementSummary, Provenance, Strategy, TensorRole, TensorRows, Totals,
};
use crate::swap::AlphaBound;

use BufferKind as K;
use Stream::{Compute as C, DeviceToHost as D, HostToDevice as H};

/// The mini step's model: rows of `h = 4` bf16 (8 bytes) and a vocabulary of 16, as its buffers
/// have them (rule 10 checks the launches against it).
fn provenance() -> Provenance {
    let mut model = ModelConfig::new("mini", 2, 4, 2, 8, 1);
    model.vocab = 16;
    Provenance {
        model,
        parallel: Parallelism::single(),
        hardware: Hardware::preset("h200x1").expect("a preset"),
        interconnect: Interconnect::UNKNOWN,
        strategy: Strategy::Memo,
        alpha: 0.5,
        alpha_bound: AlphaBound::Forced,
        swapped_rows: 4,
        level1_forward: PlacementSummary::default(),
        level1_backward: PlacementSummary::default(),
        level2: PlacementSummary::default(),
    }
}

fn buffer(kind: BufferKind, role: TensorRole, layer: Option<u32>, rows: u64, row_bytes: u64, place: Place) -> Buffer {
    Buffer { kind, role, layer, slot: 0, rows, first_row: 0, row_bytes, place }
}

fn dev(offset: u64) -> Place {
    Place::Device { offset }
}

/// A launch of `op` over `(buffer, start, end)` arguments, each marked as the signature says.
fn launch(op: Op, args: &[(u32, u64, u64)]) -> Instruction {
    let signature = op.signature();
    let args = args
        .iter()
        .enumerate()
        .map(|(i, &(b, start, end))| Arg {
            region: Region::rows(BufferId(b), start, end),
            access: signature.get(i).map_or(Access::Write, |s| s.1),
        })
        .collect();
    Instruction { stream: C, action: Action::Launch(Launch { op, args, layer: Some(0), flops: 0 }) }
}

/// A copy of layer 0's input (every copy of the mini step moves it), naming the device side's
/// rows (the source on d2h, else the destination).
fn copy(stream: Stream, src: (u32, u64, u64), dst: (u32, u64, u64)) -> Instruction {
    let (_, start, end) = if stream == D { src } else { dst };
    copy_of(stream, src, dst, TensorRows { layer: 0, role: TensorRole::LayerInput, start, end })
}

/// A copy naming `tensor`.
fn copy_of(stream: Stream, src: (u32, u64, u64), dst: (u32, u64, u64), tensor: TensorRows) -> Instruction {
    let region = |(b, s, e): (u32, u64, u64)| Region::rows(BufferId(b), s, e);
    Instruction { stream, action: Action::Copy { src: region(src), dst: region(dst), tensor } }
}

fn record(stream: Stream, event: u32) -> Instruction {
    Instruction { stream, action: Action::Record(EventId(event)) }
}

fn wait(stream: Stream, event: u32) -> Instruction {
    Instruction { stream, action: Action::Wait(EventId(event)) }
}

/// The valid mini step. Buffers (arena bytes):
/// 0 tokens [0,32) input; 1 embedding [32,160) parameter; 2 its gradient [160,288);
/// 3 its optimizer state [288,1056); 4 rounding buffer 0 layer_input [1056,1120);
/// 5 layer 0 fc2_out transient [1120,1184); 6 layer 0 layer_input host slot (host [0,64));
/// 7 a transient accumulator [1056,1060), aliasing buffer 4 after its last use.
///
/// Live ranges: 0 [0,15], 1 [0,18], 2 [0,18] (gradients persist across steps), 3 [0,18],
/// 4 [0,13], 5 [5,15], 7 [16,18]; live bytes 1120 (0-4), 1184 (5-13), 1120 (14-15), 1028 (16-18):
/// the lower bound is 1184.
fn valid_plan() -> Plan {
    let buffers = alloc::vec![
        buffer(K::Input, TensorRole::Tokens, None, 8, 4, dev(0)),
        buffer(K::Parameter, TensorRole::Embedding, None, 16, 8, dev(32)),
        buffer(K::Gradient, TensorRole::Embedding, None, 16, 8, dev(160)),
        buffer(K::OptimizerState, TensorRole::Embedding, None, 16, 48, dev(288)),
        buffer(K::RoundingBuffer, TensorRole::LayerInput, None, 8, 8, dev(1056)),
        buffer(K::Transient, TensorRole::Fc2Output, Some(0), 8, 8, dev(1120)),
        buffer(K::HostSlot, TensorRole::LayerInput, Some(0), 8, 8, Place::Host { offset: 0 }),
        buffer(K::Transient, TensorRole::GradNormSquared, None, 1, 4, dev(1056)),
    ];
    let instructions = alloc::vec![
        /* 0 */ launch(Op::Embedding, &[(0, 0, 8), (1, 0, 16), (4, 0, 8)]),
        /* 1 */ record(C, 0),
        /* 2 */ wait(D, 0),
        /* 3 */ copy(D, (4, 0, 8), (6, 0, 8)), // swap-out
        /* 4 */ record(D, 1),
        /* 5 */ launch(Op::Gelu, &[(4, 0, 8), (5, 0, 8)]), // reads alongside the swap-out
        /* 6 */ wait(C, 1),
        /* 7 */ launch(Op::Zero, &[(4, 0, 8)]), // the next layer overwrites the rounding buffer
        /* 8 */ record(C, 2),
        /* 9 */ wait(H, 2),
        /* 10 */ copy(H, (6, 0, 8), (4, 0, 8)), // swap-in
        /* 11 */ record(H, 3),
        /* 12 */ wait(C, 3),
        /* 13 */ launch(Op::Gelu, &[(4, 4, 8), (5, 4, 8)]), // a recompute over rows [4, 8)
        /* 14 */ launch(Op::Zero, &[(2, 0, 16)]),
        /* 15 */ launch(Op::EmbeddingBackward, &[(0, 0, 8), (5, 0, 8), (2, 0, 16)]),
        /* 16 */ launch(Op::Zero, &[(7, 0, 1)]),
        /* 17 */ launch(Op::GradNormSquared, &[(2, 0, 16), (7, 0, 1)]),
        /* 18 */ launch(Op::AdamW, &[(1, 0, 16), (2, 0, 16), (3, 0, 16), (7, 0, 1)]),
    ];
    Plan {
        provenance: provenance(),
        buffers,
        events: 4,
        instructions,
        rank_programs: Vec::new(),
        totals: Totals {
            arena_bytes: 1184,
            arena_lower_bound_bytes: 1184,
            host_bytes: 64,
            parameter_bytes: 128 + 128 + 768,
            rounding_buffer_bytes: 64,
        },
    }
}

/// (variant name, instruction) of each violation, in report order; empty when valid.
fn found(plan: &Plan) -> Vec<(&'static str, Option<usize>)> {
    match check_plan(plan) {
        Ok(()) => Vec::new(),
        Err(violations) => violations.iter().map(|v| (v.name(), v.instruction())).collect(),
    }
}

fn violations(plan: &Plan) -> Vec<PlanViolation> {
    check_plan(plan).err().unwrap_or_default()
}

fn args_mut(plan: &mut Plan, instruction: usize) -> &mut Vec<Arg> {
    match &mut plan.instructions[instruction].action {
        Action::Launch(launch) => &mut launch.args,
        _ => panic!("instruction {instruction} is not a launch"),
    }
}

#[test]
fn accepts_the_valid_mini_step() {
    assert_eq!(check_plan(&valid_plan()), Ok(()));
}

/// A `CheckedPlan` is the checked plan itself, unchanged; a broken plan gets none, only the
/// violations `check_plan` reports.
#[test]
fn a_checked_plan_is_made_only_from_a_plan_that_passes() {
    let checked = CheckedPlan::check(valid_plan()).expect("the valid mini step passes");
    assert_eq!(checked.as_plan(), &valid_plan());
    assert_eq!(checked.into_plan(), valid_plan());
    let mut broken = valid_plan();
    broken.instructions.swap(1, 2);
    assert_eq!(CheckedPlan::check(broken.clone()), Err(violations(&broken)));
}

#[test]
fn wrong_arg_count() {
    let mut plan = valid_plan();
    // One argument past the signature is a scratch: buffer 4 is none (rule 11).
    args_mut(&mut plan, 7).push(Arg { region: Region::rows(BufferId(4), 0, 8), access: Access::Write });
    assert_eq!(found(&plan), [("bad_scratch", Some(7))]);
    // Two are one too many.
    args_mut(&mut plan, 7).push(Arg { region: Region::rows(BufferId(4), 0, 8), access: Access::Write });
    assert_eq!(found(&plan), [("wrong_arg_count", Some(7)), ("bad_scratch", Some(7))]);
    assert!(matches!(violations(&plan)[0], PlanViolation::WrongArgCount { op: Op::Zero, expected: 1, found: 3, .. }));
}

/// The checker follows the op's signature, not the argument's mark: marking Gelu's output a
/// read reports the mark and nothing else.
#[test]
fn wrong_access() {
    let mut plan = valid_plan();
    args_mut(&mut plan, 5)[1].access = Access::Read;
    assert_eq!(found(&plan), [("wrong_access", Some(5))]);
    let v = &violations(&plan)[0];
    assert!(matches!(v, PlanViolation::WrongAccess { arg: 1, expected: Access::Write, found: Access::Read, .. }));
    assert_eq!(v.buffer(), Some(BufferId(5)));
}

/// Rule 10: the embedding's table is 15 rows where the model's vocabulary is 16.
#[test]
fn a_launch_of_the_wrong_shape() {
    let mut plan = valid_plan();
    args_mut(&mut plan, 0)[1].region.end = 15;
    assert_eq!(found(&plan), [("launch_shape", Some(0))]);
    let text = violations(&plan)[0].to_string();
    assert!(text.contains("op `embedding`, argument `embedding`") && text.contains("16 rows"), "{text}");
}

/// Rule 10 on a planned Llama-shaped step: an attention launch given `q` for its keys (as wide
/// as the queries, where the model has half as many K/V heads) is refused, at t = 1 and, with
/// replicated K/V, in every rank program at t = 4.
#[test]
fn a_grouped_attention_with_keys_as_wide_as_queries() {
    use crate::model::Architecture;
    use crate::planner::{plan as make_plan, PlanRequest};
    for tensor in [1u64, 4] {
        let mut model = ModelConfig::new("llama-ish", 2, 32, 4, 16, 1);
        model.kv_heads = 2;
        model.ffn_hidden = 88;
        model.vocab = 64;
        model.architecture = Architecture::llama(10_000.0, 1e-5);
        let mut hardware = Hardware::preset("h200x1").expect("a preset");
        hardware.gpus_per_node = 8;
        let mut request = PlanRequest::new(model, Parallelism::new(tensor, 1), hardware, Strategy::KeepAll);
        request.interconnect = Interconnect { bytes_per_s: 1_000_000_000, latency_ns: 1_000 };
        let mut plan = make_plan(&request).expect("the plan").plan;
        assert_eq!(check_plan(&plan), Ok(()), "t = {tensor}");
        let programs = plan.rank_programs.len();
        let attention = |instructions: &[Instruction]| {
            instructions
                .iter()
                .position(|i| matches!(&i.action, Action::Launch(l) if l.op == Op::Attention))
                .expect("an attention launch")
        };
        let corrupt = |instructions: &mut Vec<Instruction>| -> usize {
            let at = attention(instructions);
            if let Action::Launch(launch) = &mut instructions[at].action {
                launch.args[1].region = launch.args[0].region;
            }
            at
        };
        let at = corrupt(&mut plan.instructions);
        for program in &mut plan.rank_programs {
            corrupt(&mut program.instructions);
        }
        let found = violations(&plan);
        let shape = |v: &PlanViolation| matches!(v, PlanViolation::LaunchShape { instruction, op: Op::Attention, .. } if *instruction == at);
        assert!(found.iter().any(shape), "t = {tensor}: {found:?}");
        let wrapped = found
            .iter()
            .filter(|v| matches!(v, PlanViolation::InRankProgram { violation, .. } if matches!(**violation, PlanViolation::LaunchShape { .. })))
            .count();
        assert_eq!(wrapped, programs, "t = {tensor}: every rank program's attention is refused");
        let text = found.iter().find(|v| shape(v)).expect("found").to_string();
        assert!(text.contains("argument `k`") && text.contains("kv_heads"), "{text}");
    }
}

#[test]
fn rows_out_of_bounds() {
    let mut plan = valid_plan();
    args_mut(&mut plan, 13)[0].region.end = 9;
    assert_eq!(found(&plan), [("rows_out_of_bounds", Some(13))]);
    assert!(matches!(violations(&plan)[0], PlanViolation::RowsOutOfBounds { start: 4, end: 9, .. }));
}

/// The swap-out copies half the rows; the swap-in then reads the other half unwritten. The copy
/// names rows [0, 8) of layer 0's input, which its half of the host slot does not hold.
#[test]
fn copy_size_mismatch() {
    let mut plan = valid_plan();
    plan.instructions[3] = copy(D, (4, 0, 8), (6, 0, 4));
    assert_eq!(
        found(&plan),
        [("copy_size_mismatch", Some(3)), ("swap_slot_mismatch", Some(3)), ("read_unwritten", Some(10))]
    );
    let v = violations(&plan);
    assert!(matches!(v[0], PlanViolation::CopySizeMismatch { src_bytes: 64, dst_bytes: 32, .. }));
    let host = ByteRange { space: Space::HostSlab, start: 32, end: 64 };
    assert!(matches!(v[2], PlanViolation::ReadUnwritten { bytes, .. } if bytes == host));
}

/// A swap-out issued on the h2d stream: wrong stream, and the streams' order is lost too (the
/// h2d stream never waited for the write it copies, and the compute stream never waits for it).
#[test]
fn copy_wrong_stream() {
    let mut plan = valid_plan();
    plan.instructions[3].stream = H;
    assert_eq!(found(&plan), [("copy_wrong_stream", Some(3)), ("read_not_ready", Some(3)), ("race", Some(7))]);
    assert!(matches!(violations(&plan)[0], PlanViolation::CopyWrongStream { stream: H, expected: D, .. }));
}

#[test]
fn copy_not_host_device() {
    let mut plan = valid_plan();
    plan.instructions[3] = copy(D, (4, 0, 8), (5, 0, 8));
    assert_eq!(found(&plan), [("copy_not_host_device", Some(3)), ("race", Some(5)), ("read_unwritten", Some(10))]);
}

#[test]
fn wait_on_unrecorded_event() {
    let mut plan = valid_plan();
    plan.events = 5;
    plan.instructions[12] = wait(C, 4);
    assert_eq!(found(&plan), [("wait_unrecorded", Some(12)), ("read_not_ready", Some(13)), ("race", Some(16))]);
}

#[test]
fn wait_before_record() {
    let mut plan = valid_plan();
    plan.instructions.swap(1, 2);
    assert_eq!(found(&plan), [("wait_before_record", Some(1)), ("read_not_ready", Some(3))]);
    assert!(matches!(violations(&plan)[0], PlanViolation::WaitBeforeRecord { record: 2, .. }));
}

#[test]
fn double_record() {
    let mut plan = valid_plan();
    plan.instructions.push(record(C, 0));
    assert_eq!(found(&plan), [("double_record", Some(19))]);
    assert!(matches!(violations(&plan)[0], PlanViolation::DoubleRecord { first: 1, .. }));
}

#[test]
fn no_such_event_and_no_such_buffer() {
    let mut plan = valid_plan();
    plan.instructions.push(record(C, 9));
    plan.instructions.push(launch(Op::Zero, &[(99, 0, 1)]));
    assert_eq!(found(&plan), [("no_such_event", Some(19)), ("no_such_buffer", Some(20))]);
}

/// Without the compute stream's Wait for the swap-in, the recompute reads the rounding buffer
/// before the copy is known done, and the scalar that reuses those bytes races with the copy.
#[test]
fn read_before_ready_missing_wait() {
    let mut plan = valid_plan();
    plan.instructions.remove(12);
    assert_eq!(found(&plan), [("read_not_ready", Some(12)), ("race", Some(15))]);
    let v = violations(&plan);
    assert!(matches!(v[0], PlanViolation::ReadNotReady { stream: C, writer: 10, writer_stream: H, .. }));
    assert!(matches!(v[1], PlanViolation::Race { other: 10, other_access: Access::Write, .. }));
}

/// A Record covers only its stream's earlier instructions: recording the swap-in's event just
/// before the copy (one tick early) orders nothing about the copy.
#[test]
fn record_before_the_copy_does_not_cover_it() {
    let mut plan = valid_plan();
    plan.instructions.swap(10, 11);
    assert_eq!(found(&plan), [("read_not_ready", Some(13)), ("race", Some(16))]);
}

/// Without the Wait for the swap-out, the next layer overwrites the rounding buffer while the
/// d2h copy may still read it; the swap-in then also reads the host slot unordered.
#[test]
fn race_write_while_swap_out_reads() {
    let mut plan = valid_plan();
    plan.instructions.remove(6);
    assert_eq!(found(&plan), [("race", Some(6)), ("read_not_ready", Some(9))]);
    let v = &violations(&plan)[0];
    let expected = ByteRange { space: Space::Arena, start: 1056, end: 1120 };
    assert!(matches!(
        v,
        PlanViolation::Race { stream: C, other: 3, other_stream: D, other_access: Access::Read, bytes, .. }
            if *bytes == expected
    ));
}

/// The transient placed on the rounding buffer's bytes while both are live: an overlap, a race
/// with the swap-out, and the backward reads the transient's rows the swap-in overwrote.
#[test]
fn clobbered_by_an_aliasing_buffer() {
    let mut plan = valid_plan();
    plan.buffers[5].place = dev(1056);
    plan.totals.arena_bytes = 1120;
    // The live bytes (1184 at instructions 5-13) no longer fit the shrunken arena either.
    assert_eq!(
        found(&plan),
        [("lower_bound_above_arena", None), ("overlap", Some(5)), ("race", Some(5)), ("read_clobbered", Some(15))]
    );
    let v = violations(&plan);
    assert!(matches!(
        v[1],
        PlanViolation::Overlap {
            first: BufferRef { id: BufferId(4), .. },
            second: BufferRef { id: BufferId(5), .. },
            ..
        }
    ));
    assert!(matches!(
        v[3],
        PlanViolation::ReadClobbered { writer: 10, writer_buffer: BufferRef { id: BufferId(4), .. }, .. }
    ));
}

#[test]
fn swap_in_of_a_never_written_host_slot() {
    let mut plan = valid_plan();
    plan.instructions[3] = wait(D, 0);
    assert_eq!(found(&plan), [("read_unwritten", Some(10))]);
    assert_eq!(violations(&plan)[0].buffer(), Some(BufferId(6)));
}

/// The rows the copy at `at` names, edited.
fn rename(plan: &mut Plan, at: usize, edit: impl FnOnce(&mut TensorRows)) {
    match &mut plan.instructions[at].action {
        Action::Copy { tensor, .. } => edit(tensor),
        _ => panic!("instruction {at} is not a copy"),
    }
}

/// Rule 8: the swap-in names layer 1's input, which its slot (layer 0's) does not hold; the
/// recompute, a layer 0 launch, then reads rows restored for layer 1.
#[test]
fn swap_in_naming_another_layer() {
    let mut plan = valid_plan();
    rename(&mut plan, 10, |t| t.layer = 1);
    assert_eq!(found(&plan), [("swap_slot_mismatch", Some(10)), ("swapped_in_for_other_layer", Some(13))]);
    let v = violations(&plan);
    assert_eq!(
        v[0].to_string(),
        "instruction 10: swap-in of layer 1 layer_input rows [0, 8) reads host slot #6 layer 0 layer_input \
         (host_slot), whose rows there hold layer 0 layer_input rows [0, 8) (another layer's, tensor's or rows' \
         slot); a swap copies rows only to and from the slot holding them"
    );
    assert!(matches!(v[1], PlanViolation::SwappedInForOtherLayer { layer: 0, swap_in: 10, .. }), "{}", v[1]);
    assert!(v[1].to_string().contains("swap-in instruction 10 restored with layer 1 layer_input rows [0, 8)"));
}

/// Rule 8: the slot belongs to layer 1, so both the swap-out and the swap-in of layer 0's input
/// name rows it does not hold.
#[test]
fn copies_of_another_layers_slot() {
    let mut plan = valid_plan();
    plan.buffers[6].layer = Some(1);
    assert_eq!(found(&plan), [("swap_slot_mismatch", Some(3)), ("swap_slot_mismatch", Some(10))]);
    assert!(violations(&plan)[0].to_string().contains("swap-out of layer 0 layer_input rows [0, 8) writes host slot"));
}

/// Rule 8: a swap-in naming the queries copies the input's slot into the input's buffer: both
/// sides disagree with the name.
#[test]
fn swap_in_naming_another_tensor() {
    let mut plan = valid_plan();
    rename(&mut plan, 10, |t| t.role = TensorRole::Query);
    assert_eq!(found(&plan), [("swap_device_mismatch", Some(10)), ("swap_slot_mismatch", Some(10))]);
    let v = violations(&plan);
    assert!(v[0].to_string().contains("swap-in of layer 0 q rows [0, 8) writes rows [0, 8) of #4 rounding buffer 0"));
}

/// Rule 8: a device buffer of layer 1 (not a rounding buffer) cannot take layer 0's rows.
#[test]
fn copies_to_another_layers_device_buffer() {
    let mut plan = valid_plan();
    plan.buffers[4].layer = Some(1);
    assert_eq!(found(&plan), [("swap_device_mismatch", Some(3)), ("swap_device_mismatch", Some(10))]);
}

/// Rule 8: the slot's first half restored into the buffer's second half, named as such: the slot
/// holds rows [0, 4), not [4, 8); its second half is never read back.
#[test]
fn swap_in_with_shifted_rows() {
    let mut plan = valid_plan();
    plan.instructions[10] = copy(H, (6, 0, 4), (4, 4, 8));
    assert_eq!(found(&plan), [("host_write_never_read", Some(3)), ("swap_slot_mismatch", Some(10))]);
    let mut plan = valid_plan();
    plan.instructions[10] = copy(H, (6, 0, 4), (4, 4, 8));
    rename(&mut plan, 10, |t| (t.start, t.end) = (0, 4));
    assert_eq!(found(&plan), [("host_write_never_read", Some(3)), ("swap_device_mismatch", Some(10))]);
}

/// Rule 8, reading side: slot, swap-out and swap-in all say layer 1, consistently, but the
/// launch that reads the restored rows is layer 0's.
#[test]
fn swapped_in_for_another_layer() {
    let mut plan = valid_plan();
    plan.buffers[6].layer = Some(1);
    rename(&mut plan, 3, |t| t.layer = 1);
    rename(&mut plan, 10, |t| t.layer = 1);
    assert_eq!(found(&plan), [("swapped_in_for_other_layer", Some(13))]);
    let v = violations(&plan);
    let bytes = ByteRange { space: Space::Arena, start: 1088, end: 1120 };
    assert!(matches!(v[0], PlanViolation::SwappedInForOtherLayer { bytes: b, .. } if b == bytes), "{}", v[0]);
}

/// A host slot holding rows [4, 8) of its tensor (`first_row` 4): copies naming those rows pass,
/// and the same copies against a slot that says it holds rows [0, 4) do not.
#[test]
fn a_slot_from_its_first_row() {
    let mut plan = valid_plan();
    plan.buffers[6].rows = 4;
    plan.buffers[6].first_row = 4;
    plan.totals.host_bytes = 32;
    plan.instructions[3] = copy(D, (4, 4, 8), (6, 0, 4));
    plan.instructions[10] = copy(H, (6, 0, 4), (4, 4, 8));
    assert_eq!(found(&plan), []);
    plan.buffers[6].first_row = 0;
    assert_eq!(found(&plan), [("swap_slot_mismatch", Some(3)), ("swap_slot_mismatch", Some(10))]);
    plan.buffers[6].first_row = u64::MAX;
    assert_eq!(found(&plan), [("swap_slot_mismatch", Some(3)), ("swap_slot_mismatch", Some(10))]);
    assert!(violations(&plan)[0].to_string().contains("hold no layer's tensor rows"));
}

#[test]
fn buffer_outside_the_arena_and_the_host_slab() {
    // The rounding buffer [1056, 1120) and the transient [1120, 1184) pass 1100; the host slot
    // [0, 64) passes 32.
    let mut plan = valid_plan();
    plan.totals.arena_bytes = 1100;
    plan.totals.host_bytes = 32;
    assert_eq!(
        found(&plan),
        [
            ("total_mismatch", None),
            ("total_mismatch", None),
            ("lower_bound_above_arena", None),
            ("outside_arena", None),
            ("outside_arena", None),
            ("outside_host_slab", None),
        ]
    );
    let v = violations(&plan);
    assert!(matches!(v[3], PlanViolation::OutsideArena { end: 1120, arena_bytes: 1100, .. }));
    assert!(matches!(v[4], PlanViolation::OutsideArena { end: 1184, arena_bytes: 1100, .. }));
    assert!(matches!(v[5], PlanViolation::OutsideHostSlab { end: 64, host_bytes: 32, .. }));
    assert_eq!(v[4].buffer(), Some(BufferId(5)));
}

#[test]
fn each_total_mismatch() {
    type Field = fn(&mut Totals) -> &mut u64;
    let cases: [(Total, Field); 5] = [
        (Total::ArenaBytes, |t| &mut t.arena_bytes),
        (Total::ArenaLowerBoundBytes, |t| &mut t.arena_lower_bound_bytes),
        (Total::HostBytes, |t| &mut t.host_bytes),
        (Total::ParameterBytes, |t| &mut t.parameter_bytes),
        (Total::RoundingBufferBytes, |t| &mut t.rounding_buffer_bytes),
    ];
    for (total, field) in cases {
        let mut plan = valid_plan();
        let actual = *field(&mut plan.totals);
        // One more everywhere; one less for the lower bound, which must stay within the arena.
        let claimed = if total == Total::ArenaLowerBoundBytes { actual - 1 } else { actual + 1 };
        *field(&mut plan.totals) = claimed;
        assert_eq!(
            violations(&plan),
            [PlanViolation::TotalMismatch { total, claimed, actual: u128::from(actual) }],
            "{}",
            total.name()
        );
    }
    let mut plan = valid_plan();
    plan.totals.arena_lower_bound_bytes = 2000;
    assert_eq!(found(&plan), [("total_mismatch", None), ("lower_bound_above_arena", None)]);
}

#[test]
fn launch_wrong_stream() {
    let mut plan = valid_plan();
    plan.instructions[14].stream = D;
    assert_eq!(found(&plan), [("launch_wrong_stream", Some(14)), ("read_not_ready", Some(15)), ("race", Some(15))]);
}

#[test]
fn launch_on_host() {
    let mut plan = valid_plan();
    args_mut(&mut plan, 5)[1].region.buffer = BufferId(6);
    assert_eq!(found(&plan), [("launch_on_host", Some(5)), ("race", Some(5)), ("read_unwritten", Some(15))]);
}

#[test]
fn place_mismatch_and_size_overflow() {
    let mut plan = valid_plan();
    plan.buffers[5].kind = K::HostSlot;
    plan.buffers.push(buffer(K::Transient, TensorRole::Fc1Output, Some(1), u64::MAX, 2, dev(0)));
    assert_eq!(found(&plan), [("place_mismatch", None), ("size_overflow", None)]);
    assert_eq!(violations(&plan)[1].buffer(), Some(BufferId(8)));
}

/// A buffer no instruction touches and that holds nothing before the step has no live range:
/// it may sit on any bytes (here the tokens') without an overlap, and is not in the lower bound.
#[test]
fn unused_buffers_are_allowed() {
    let mut plan = valid_plan();
    plan.buffers.push(buffer(K::Transient, TensorRole::Fc1Output, Some(1), 8, 4, dev(0)));
    assert_eq!(check_plan(&plan), Ok(()));
}

/// Parameters, optimizer state and gradients persist across steps: a transient may not reuse a
/// gradient's bytes after the gradient's last use in the step.
#[test]
fn gradients_are_live_to_the_end_of_the_step() {
    let mut plan = valid_plan();
    plan.buffers.push(buffer(K::Transient, TensorRole::Fc1Output, Some(1), 1, 8, dev(160)));
    plan.instructions.push(launch(Op::Zero, &[(8, 0, 1)]));
    assert_eq!(found(&plan), [("overlap", Some(19))]);
}

#[test]
fn display_names_the_buffer_on_one_line() {
    let mut plan = valid_plan();
    plan.instructions.remove(6);
    for v in violations(&plan) {
        let line = v.to_string();
        assert!(!line.contains('\n'), "{line}");
        assert!(line.starts_with("instruction "), "{line}");
    }
    let race = violations(&plan)[0].to_string();
    assert!(race.contains("rounding buffer 0 layer_input"), "{race}");
    assert!(race.contains("arena bytes [1056, 1120)"), "{race}");
    let mut plan = valid_plan();
    plan.buffers[5].place = dev(1056);
    plan.totals.arena_bytes = 1120;
    let clobbered = violations(&plan)[2].to_string();
    assert!(clobbered.contains("#5 layer 0 fc2_out (transient)"), "{clobbered}");
}

/// Random plans, and random mutations of the valid one, never make the checker panic; every
/// violation prints.
#[test]
fn never_panics_on_garbage() {
    let mut rng = SplitMix64::new(0x5eed);
    let pick = |rng: &mut SplitMix64, small: u64| -> u64 {
        match rng.below(8) {
            0 => u64::MAX - rng.below(3),
            1 => rng.next_u64(),
            _ => rng.below(small),
        }
    };
    for case in 0..1500 {
        let mut plan = valid_plan();
        if case % 2 == 0 {
            plan.buffers.clear();
            plan.instructions.clear();
            plan.events = pick(&mut rng, 6) as u32;
        }
        let new_buffers = rng.below(6);
        for _ in 0..new_buffers {
            let kind = K::ALL[rng.below(K::ALL.len() as u64) as usize];
            let offset = pick(&mut rng, 2000);
            let place = if rng.below(2) == 0 { dev(offset) } else { Place::Host { offset } };
            plan.buffers.push(buffer(kind, TensorRole::Fc1Output, None, pick(&mut rng, 20), pick(&mut rng, 64), place));
        }
        let region = |rng: &mut SplitMix64| Region::rows(BufferId(pick(rng, 10) as u32), pick(rng, 20), pick(rng, 20));
        for _ in 0..rng.below(30) {
            let stream = Stream::ALL[rng.below(3) as usize];
            let action = match rng.below(4) {
                0 => {
                    let op = Op::ALL[rng.below(Op::ALL.len() as u64) as usize];
                    let args = (0..rng.below(8))
                        .map(|_| Arg {
                            region: region(&mut rng),
                            access: [Access::Read, Access::Write][rng.below(2) as usize],
                        })
                        .collect();
                    Action::Launch(Launch { op, args, layer: None, flops: 0 })
                }
                1 => {
                    let (start, end) = (pick(&mut rng, 20), pick(&mut rng, 20));
                    let tensor =
                        TensorRows { layer: pick(&mut rng, 3) as u32, role: TensorRole::LayerInput, start, end };
                    Action::Copy { src: region(&mut rng), dst: region(&mut rng), tensor }
                }
                2 => Action::Record(EventId(pick(&mut rng, 6) as u32)),
                _ => Action::Wait(EventId(pick(&mut rng, 6) as u32)),
            };
            let at = rng.below(plan.instructions.len() as u64 + 1) as usize;
            plan.instructions.insert(at, Instruction { stream, action });
        }
        if rng.below(4) == 0 {
            plan.totals.arena_bytes = pick(&mut rng, 2000);
        }
        for v in violations(&plan) {
            assert!(!v.to_string().is_empty());
        }
    }
}

/// A long chain of the shape of a real step: `parameters` parameters (live all step, at the
/// arena's bottom, 128 bytes each), then `pairs` layers, each writing a transient, swapping it
/// out to its own host slot and reusing the arena slot two layers later.
fn long_plan(parameters: u32, pairs: u32) -> Plan {
    let base = 128 * u64::from(parameters);
    let mut buffers: Vec<Buffer> = (0..parameters)
        .map(|p| buffer(K::Parameter, TensorRole::Fc1Weight, None, 16, 8, dev(128 * u64::from(p))))
        .collect();
    let mut instructions = Vec::new();
    let mut events = 0;
    let row = 64u64;
    for layer in 0..pairs {
        let slot = base + u64::from(layer % 2) * row * 8;
        let t = buffers.len() as u32;
        buffers.push(buffer(K::Transient, TensorRole::Fc1Output, Some(layer), 8, row, dev(slot)));
        buffers.push(buffer(
            K::HostSlot,
            TensorRole::Fc1Output,
            Some(layer),
            8,
            row,
            Place::Host { offset: u64::from(layer) * row * 8 },
        ));
        if layer >= 2 {
            instructions.push(wait(C, events - 3)); // the swap-out of layer - 2 is done
        }
        instructions.push(launch(Op::Zero, &[(t, 0, 8)]));
        instructions.push(record(C, events));
        instructions.push(wait(D, events));
        let tensor = TensorRows { layer, role: TensorRole::Fc1Output, start: 0, end: 8 };
        instructions.push(copy_of(D, (t, 0, 8), (t + 1, 0, 8), tensor));
        instructions.push(record(D, events + 1));
        events += 2;
    }
    let host_bytes = u64::from(pairs) * row * 8;
    let arena_bytes = base + if pairs > 1 { 2 } else { 1 } * row * 8;
    Plan {
        provenance: provenance(),
        buffers,
        events,
        instructions,
        rank_programs: Vec::new(),
        totals: Totals {
            arena_bytes,
            // Each transient is live from its launch to its swap-out, so one at a time.
            arena_lower_bound_bytes: base + row * 8,
            host_bytes,
            parameter_bytes: base,
            rounding_buffer_bytes: 0,
        },
    }
}

/// 5,000 buffers (1,000 of them live all step) and 11,998 instructions; the time is in
/// `spec/validity.md`.
#[test]
fn checks_a_step_sized_plan() {
    let plan = long_plan(1000, 2000);
    assert_eq!(plan.buffers.len(), 5000);
    let start = std::time::Instant::now();
    let found_now = violations(&plan);
    std::println!("check_plan: {} instructions in {:?}", plan.instructions.len(), start.elapsed());
    // The chain swaps out and never back: each host slot is a dead write, and nothing else is
    // wrong.
    assert_eq!(found_now.len(), 2000);
    assert!(found_now.iter().all(|v| v.name() == "host_write_never_read"), "{}", found_now[0]);
    // The same plan without one of its Waits races.
    let mut plan = plan;
    let index = plan.instructions.iter().rposition(|i| i.stream == C && matches!(i.action, Action::Wait(_)));
    plan.instructions.remove(index.expect("a wait"));
    assert!(found(&plan).contains(&("race", index)));
}
