//! The checker against corrupted planner plans: each corruption of [`crate::fuzzing::plan_mutate`]
//! applied deterministically to real plans (a tiny 4-layer memo plan at t = 1, the 7B memo plan
//! at 32K tokens on a800x8 with t = 8, and a tiny Qwen2-shaped memo plan at t = 4 with replicated
//! K/V, whose launches are the Llama family's ops), each asserting the violation variant it must
//! cause.
//! The fuzz target `plan_mutate` does the same with random plans and targets.

use std::sync::OnceLock;
use std::vec::Vec;

use super::*;
use crate::fuzzing::plan_mutate::{mutate, unordered_conflict, Applied, Expected, Mutation};
use crate::model::{Hardware, ModelConfig, Parallelism};
use crate::plan::Strategy;
use crate::planner::{self, PlanRequest};

use Stream::{Compute as C, DeviceToHost as D, HostToDevice as H};

fn planned(request: PlanRequest) -> Plan {
    let plan = planner::plan(&request).expect("the request plans").plan;
    assert_eq!(check_plan(&plan), Ok(()), "the valid plan passes");
    plan
}

/// Four layers of h = 64 with 4 heads, 64 tokens, t = 1, memo with α forced to 0.5: layers 0
/// and 1 swap half their token-split rows and recompute the rest.
fn tiny_memo() -> &'static Plan {
    static PLAN: OnceLock<Plan> = OnceLock::new();
    PLAN.get_or_init(|| {
        let model = ModelConfig::new("tiny", 4, 64, 4, 64, 1);
        let hardware = Hardware::preset("a800x8").unwrap();
        let mut request = PlanRequest::new(model, Parallelism::single(), hardware, Strategy::Memo);
        request.forced_alpha = Some(0.5);
        planned(request)
    })
}

/// The 7B model at 32K tokens on 8 A800 with t = 8, memo with α from the LP.
fn seven_b_32k() -> &'static Plan {
    static PLAN: OnceLock<Plan> = OnceLock::new();
    PLAN.get_or_init(|| {
        let model = ModelConfig::preset("7b", 32 * 1024, 1).unwrap();
        let hardware = Hardware::preset("a800x8").unwrap();
        planned(PlanRequest::new(model, Parallelism::new(8, 1), hardware, Strategy::Memo))
    })
}

/// A tiny Qwen2-shaped model (4 layers, h 64, 4 query heads and 2 key/value heads, SwiGLU of 96,
/// RMSNorm, Q/K/V biases, untied classifier), 64 tokens, t = 4 > kv_heads (K and V and their
/// biases replicated, their gradients all-reduced), memo with α forced to 0.5: its launches are
/// the Llama family's ops (`rms_norm`, `swiglu`, `linear_no_bias`,
/// `linear_backward_weight_no_bias` and their kin).
fn tiny_qwen_t4() -> &'static Plan {
    static PLAN: OnceLock<Plan> = OnceLock::new();
    PLAN.get_or_init(|| {
        let mut model = ModelConfig::new("tiny-qwen", 4, 64, 4, 64, 1);
        model.kv_heads = 2;
        model.ffn_hidden = 96;
        model.vocab = 101;
        model.architecture = crate::model::Architecture {
            biases: crate::model::Biases::QkvOnly,
            ..crate::model::Architecture::llama(1e6, 1e-6)
        };
        let hardware = Hardware::preset("h100x8").unwrap();
        let mut request = PlanRequest::new(model, Parallelism::new(4, 1), hardware, Strategy::Memo);
        request.forced_alpha = Some(0.5);
        planned(request)
    })
}

fn plans() -> [(&'static str, &'static Plan); 3] {
    [("tiny memo", tiny_memo()), ("7b 32k memo", seven_b_32k()), ("tiny qwen t4 memo", tiny_qwen_t4())]
}

/// The Llama-shaped plan runs the new ops, so every corruption above lands among them too.
#[test]
fn the_qwen_plan_runs_the_llama_ops() {
    let ops: std::collections::BTreeSet<crate::plan::Op> = tiny_qwen_t4()
        .instructions
        .iter()
        .filter_map(|i| match &i.action {
            Action::Launch(l) => Some(l.op),
            _ => None,
        })
        .collect();
    use crate::plan::Op;
    for op in [
        Op::RmsNorm,
        Op::RmsNormBackward,
        Op::Swiglu,
        Op::SwigluBackward,
        Op::LinearNoBias,
        Op::LinearBackwardWeightNoBias,
        Op::Linear,
        Op::LinearBackwardWeight,
    ] {
        assert!(ops.contains(&op), "{op:?}");
    }
    assert!(!ops.contains(&Op::LayerNorm) && !ops.contains(&Op::Gelu));
    let roles = |role| tiny_qwen_t4().buffers.iter().any(|b| b.role == role);
    assert!(
        roles(crate::plan::TensorRole::ClassifierWeight) && roles(crate::plan::TensorRole::ReplicatedBiasGradients)
    );
}

/// Applies the corruption and asserts the checker rejects it with what [`Applied::expected`]
/// names; the mutated plan, what was done and the violations.
fn rejected(
    name: &str,
    plan: &Plan,
    mutation: Mutation,
    target: u32,
    detail: u64,
) -> (Plan, Applied, Vec<PlanViolation>) {
    let (mutated, applied) =
        mutate(plan, mutation, target, detail).unwrap_or_else(|| panic!("{name}: no target for {mutation:?}"));
    let violations = check_plan(&mutated).err().unwrap_or_else(|| panic!("{name}: {} passes", applied.what));
    assert!(
        applied.expected.found_in(&violations),
        "{name}: {}: {:?} not in {violations:?}",
        applied.what,
        applied.expected
    );
    (mutated, applied, violations)
}

#[test]
fn the_plans_swap_and_recompute() {
    for (name, plan) in plans() {
        let rows = plan.provenance.swapped_rows;
        let local_rows = plan.provenance.model.seq_len / plan.provenance.parallel.tensor;
        assert!(0 < rows && rows < local_rows, "{name}: {rows} of {local_rows} rows swapped");
        let swap_ins = plan.instructions.iter().filter(|i| i.stream == H && matches!(i.action, Action::Copy { .. }));
        assert!(swap_ins.count() > 0, "{name}");
    }
}

/// A buffer moved onto another live at the same time: an `Overlap` naming the two, whichever of
/// the three placements (same first byte, on the other's last byte, ending on its first byte).
#[test]
fn an_offset_shifted_onto_a_live_neighbour_overlaps() {
    for (name, plan) in plans() {
        for (target, detail) in [(0, 0), (5, 1 << 32 | 3), (17, 2 << 32 | 9), (400, 1 << 32), (1001, 2 << 32)] {
            let (_, applied, violations) = rejected(name, plan, Mutation::ShiftOffset, target, detail);
            let Expected::Overlap(a, b) = applied.expected else { panic!("{applied:?}") };
            assert!(
                violations.iter().any(|v| matches!(v, PlanViolation::Overlap { first, second, .. }
                    if (first.id, second.id) == (a.min(b), a.max(b)))),
                "{name}: {}",
                applied.what
            );
        }
    }
}

/// The index, among the plan's Waits, of the first Wait on `stream` whose event is recorded on
/// `recorded_on`, and its instruction index.
fn first_wait(plan: &Plan, stream: Stream, recorded_on: Stream) -> (u32, usize) {
    let waits = (0..plan.instructions.len()).filter(|&i| matches!(plan.instructions[i].action, Action::Wait(_)));
    for (position, index) in waits.enumerate() {
        let Action::Wait(event) = plan.instructions[index].action else { unreachable!() };
        let record = plan.instructions.iter().find(|i| i.action == Action::Record(event)).expect("a record");
        if plan.instructions[index].stream == stream && record.stream == recorded_on {
            return (position as u32, index);
        }
    }
    panic!("no wait on {} for {}", stream.name(), recorded_on.name());
}

/// Drops the Wait and returns the violations; asserts the mutation dropped exactly that Wait.
fn without_wait(name: &str, plan: &Plan, stream: Stream, recorded_on: Stream) -> (usize, Vec<PlanViolation>) {
    let (target, index) = first_wait(plan, stream, recorded_on);
    let (mutated, _, violations) = rejected(name, plan, Mutation::DropWait, target, 0);
    let mut expected = plan.clone();
    expected.instructions.remove(index);
    assert!(mutated == expected, "{name}: dropped another wait than {index}");
    (index, violations)
}

/// Without the d2h stream's Wait for the forward, the swap-out copies the rounding buffer before
/// the compute stream is known to have written it.
#[test]
fn a_swap_out_without_its_wait_reads_before_ready() {
    for (name, plan) in plans() {
        let (at, violations) = without_wait(name, plan, D, C);
        assert!(
            violations
                .iter()
                .any(|v| matches!(v, PlanViolation::ReadNotReady { instruction, stream: D, writer_stream: C, .. }
                if *instruction == at)),
            "{name}: {violations:?}"
        );
    }
}

/// Without the compute stream's Wait for "swapped out", layer l + 1 overwrites rounding buffer
/// l % 2 while the swap-out may still read it.
#[test]
fn reusing_a_rounding_buffer_without_its_wait_races_with_the_swap_out() {
    for (name, plan) in plans() {
        let (_, violations) = without_wait(name, plan, C, D);
        assert!(
            violations.iter().any(|v| matches!(
                v,
                PlanViolation::Race { stream: C, other_stream: D, other_access: Access::Read, .. }
            )),
            "{name}: {violations:?}"
        );
    }
}

/// Without the h2d stream's Wait for the backward, the swap-in refills the rounding buffer while
/// layer l + 2's backward may still read it.
#[test]
fn a_swap_in_without_its_wait_races_with_the_backward() {
    for (name, plan) in plans() {
        let (_, violations) = without_wait(name, plan, H, C);
        assert!(
            violations.iter().any(|v| matches!(v, PlanViolation::Race { stream: H, other_stream: C, .. })),
            "{name}: {violations:?}"
        );
    }
}

/// Without the compute stream's Wait for "swapped in", the recompute reads swapped rows the copy
/// may not have brought back yet.
#[test]
fn a_recompute_without_its_wait_reads_before_ready() {
    for (name, plan) in plans() {
        let (_, violations) = without_wait(name, plan, C, H);
        assert!(
            violations.iter().any(|v| matches!(v, PlanViolation::ReadNotReady { stream: C, writer_stream: H, .. })),
            "{name}: {violations:?}"
        );
    }
}

/// Every Wait of the tiny plan orders something: without any one of them, the independent
/// pairwise search finds an unordered conflict, and the checker rejects the plan.
#[test]
fn every_wait_of_the_tiny_plan_is_needed() {
    let plan = tiny_memo();
    let waits: Vec<usize> =
        (0..plan.instructions.len()).filter(|&i| matches!(plan.instructions[i].action, Action::Wait(_))).collect();
    assert_eq!(waits.len(), 8, "two swapped layers, four waits each");
    for index in waits {
        let mut mutated = plan.clone();
        mutated.instructions.remove(index);
        assert!(unordered_conflict(&mutated, index).is_some(), "wait {index}");
        let violations = check_plan(&mutated).expect_err("rejected");
        assert!(Expected::Unordered(0, 0).found_in(&violations), "wait {index}: {violations:?}");
    }
}

#[test]
fn a_record_moved_after_its_wait() {
    for (name, plan) in plans() {
        for (target, detail) in [(0, 0), (3, 1), (7, 1_000), (30, u64::MAX)] {
            let (mutated, applied, _) = rejected(name, plan, Mutation::MoveRecordAfterWait, target, detail);
            let Expected::WaitBeforeRecord(wait) = applied.expected else { panic!("{applied:?}") };
            assert!(matches!(mutated.instructions[wait].action, Action::Wait(_)), "{name}: {}", applied.what);
        }
    }
}

#[test]
fn a_shrunk_arena_leaves_a_buffer_outside() {
    for (name, plan) in plans() {
        let arena = plan.totals.arena_bytes;
        for (detail, claimed) in [(0, arena - 1), (255, arena - 256), (arena - 1, 0)] {
            let (_, _, violations) = rejected(name, plan, Mutation::ShrinkArena, 0, detail);
            assert!(
                violations.contains(&PlanViolation::TotalMismatch {
                    total: Total::ArenaBytes,
                    claimed,
                    actual: u128::from(arena)
                }),
                "{name}"
            );
            assert!(violations.iter().any(|v| matches!(v, PlanViolation::OutsideArena { end, arena_bytes, .. }
                if *arena_bytes == claimed && *end == u128::from(arena))));
        }
    }
}

#[test]
fn rows_past_the_end_of_a_buffer() {
    for (name, plan) in plans() {
        for (target, detail) in [(0, 0), (11, 63), (250, 1 << 32), (4_000, 5)] {
            let (mutated, applied, violations) = rejected(name, plan, Mutation::RowsPastEnd, target, detail);
            let Expected::RowsOutOfBounds(at) = applied.expected else { panic!("{applied:?}") };
            let found = violations.iter().find_map(|v| match v {
                PlanViolation::RowsOutOfBounds { instruction, buffer, start, end } if *instruction == at => {
                    Some((buffer.buffer.rows, *start, *end))
                }
                _ => None,
            });
            let (rows, start, end) = found.unwrap_or_else(|| panic!("{name}: {}", applied.what));
            assert_eq!(end, rows + 1 + detail % 64, "{name}: {}", applied.what);
            assert_eq!(start == end, detail & (1 << 32) != 0);
            assert!(matches!(mutated.instructions[at].action, Action::Launch(_)));
        }
    }
}

#[test]
fn each_changed_total_mismatches() {
    let totals = [
        Total::ArenaBytes,
        Total::ArenaLowerBoundBytes,
        Total::HostBytes,
        Total::ParameterBytes,
        Total::RoundingBufferBytes,
    ];
    for (name, plan) in plans() {
        for (target, total) in totals.into_iter().enumerate() {
            for detail in [0, 1, 2, 3 << 2 | 3, u64::MAX] {
                let (_, applied, _) = rejected(name, plan, Mutation::ChangeTotal, target as u32, detail);
                assert_eq!(applied.expected, Expected::TotalMismatch(total), "{name}: {}", applied.what);
            }
        }
    }
}

/// Each structural corruption, with the variant it must cause at the instruction it names.
#[test]
fn each_structural_corruption_has_its_variant() {
    let names = [
        "size_overflow",
        "place_mismatch",
        "no_such_buffer",
        "no_such_event",
        "wrong_arg_count",
        "wrong_access",
        "launch_wrong_stream",
        "launch_on_host",
        "copy_not_host_device",
        "copy_wrong_stream",
        "copy_size_mismatch",
        "double_record",
        "wait_unrecorded",
    ];
    for (name, plan) in plans() {
        for (which, variant) in names.into_iter().enumerate() {
            for (target, high) in [(0, 0), (9, 1), (123, 2)] {
                // `detail % 13` picks the corruption; `detail >> 8` its variation.
                let detail = which as u64 + 13 * (high << 8);
                let (_, applied, _) = rejected(name, plan, Mutation::Malform, target, detail);
                assert!(
                    matches!(applied.expected, Expected::Variant(v, _) if v == variant),
                    "{name}: {}: {:?}",
                    applied.what,
                    applied.expected
                );
            }
        }
    }
}

/// Dropping a swap-in makes layer `l`'s backward read layer `l + 2`'s data (the independent
/// data-flow search finds the stale read). Both layers' skeletal tensors are the same
/// rounding-buffer ids, so the stale read itself looks ready; what gives it away is the host slot
/// that was swapped out and never read back (`HostWriteNeverRead`, rule 4b of
/// `spec/validity.md`). Found by the `plan_mutate` fuzz target, which the checker used to pass.
#[test]
fn a_dropped_swap_in_leaves_a_host_write_never_read() {
    for (name, plan) in plans() {
        let copies = plan.instructions.iter().filter(|i| i.stream == H && matches!(i.action, Action::Copy { .. }));
        let copies = copies.count() as u32;
        // Every swap-in of the tiny plan; the first, a middle and the last of the 7B plan's.
        let targets: Vec<u32> = if copies < 40 { (0..copies).collect() } else { std::vec![0, copies / 2, copies - 1] };
        for target in targets {
            let (mutated, applied) = mutate(plan, Mutation::DropSwapIn, target, 0).expect("a swap-in to drop");
            let Expected::StaleRead(reader, writer) = applied.expected else { panic!("{applied:?}") };
            let layer = |index: usize| match &mutated.instructions[index].action {
                Action::Launch(launch) => launch.layer,
                other => panic!("{name}: instruction {index} is {other:?}"),
            };
            let writer = writer.expect("layer l + 2's data is there");
            assert_ne!(layer(reader), layer(writer), "{name}: {}", applied.what);
            let violations = check_plan(&mutated).expect_err("the checker rejects a dropped swap-in");
            assert!(
                violations.iter().any(|v| v.name() == "host_write_never_read"),
                "{name}: {}: {}",
                applied.what,
                violations[0]
            );
        }
    }
}

use Stream::Collective as K;

/// Without the compute stream's Wait for the collective stream (after the first all-gather), the
/// first launch that reads the gathered rows reads them before the collective is known to have
/// written them: `ReadNotReady` at that launch, the writer on the collective stream.
#[test]
fn a_collective_output_read_without_its_wait_is_not_ready() {
    let (name, plan) = ("7b 32k memo", seven_b_32k());
    let (at, violations) = without_wait(name, plan, C, K);
    // The next compute launch after the removed Wait reads the all-gather's output.
    let reader = (at..plan.instructions.len() - 1)
        .find(|&i| plan.instructions[i + 1].stream == C && matches!(plan.instructions[i + 1].action, Action::Launch(_)))
        .expect("a reader");
    assert!(
        violations
            .iter()
            .any(|v| matches!(v, PlanViolation::ReadNotReady { instruction, stream: C, writer_stream: K, .. }
            if *instruction == reader)),
        "{name}: {violations:?}"
    );
}

/// Without the collective stream's Wait for compute, an all-gather of a norm output reads its
/// input before the layer norm is known to have written it: `ReadNotReady` at the all-gather.
/// (The first such Wait, before the embedding table's all-gather, orders nothing: the table is a
/// parameter, written before the step.)
#[test]
fn a_collective_input_read_without_its_wait_is_not_ready() {
    let plan = seven_b_32k();
    let waits = (0..plan.instructions.len())
        .filter(|&i| plan.instructions[i].stream == K && matches!(plan.instructions[i].action, Action::Wait(_)));
    let mut caught = 0;
    for at in waits.take(4) {
        let mut mutated = plan.clone();
        mutated.instructions.remove(at);
        let Err(violations) = check_plan(&mutated) else { continue };
        // The collective now sits at `at`.
        assert!(
            violations
                .iter()
                .any(|v| matches!(v, PlanViolation::ReadNotReady { instruction, stream: K, writer_stream: C, .. }
                if *instruction == at)),
            "{violations:?}"
        );
        caught += 1;
    }
    assert!(caught >= 3, "{caught} of the first 4 collective Waits were needed");
}

/// Every collective kind is rejected on the t = 8 plan at several targets, with its variant; on
/// the t = 1 plan there is nothing to apply it to.
#[test]
fn every_collective_corruption_is_rejected() {
    for mutation in Mutation::COLLECTIVE {
        for (target, detail) in [(0, 0), (1, 1), (7, 2), (33, 3), (1000, 5)] {
            let (mutated, applied, violations) = rejected("7b 32k memo", seven_b_32k(), mutation, target, detail);
            if mutation != Mutation::DropCollectiveWait && mutation != Mutation::MisSizeCollective {
                assert_eq!(mutated.rank_programs.len(), 1, "{}", applied.what);
                assert!(
                    violations.iter().any(|v| matches!(v, PlanViolation::CollectiveMismatch { rank: 1, .. })),
                    "{}: {violations:?}",
                    applied.what
                );
            }
        }
        assert!(
            mutate(tiny_memo(), mutation, 0, 0).is_none(),
            "{}: the t = 1 plan has no collectives",
            mutation.name()
        );
    }
}

/// A rank program that is the shared program unchanged passes; one for a rank outside the group,
/// or two for the same rank, do not.
#[test]
fn rank_programs_are_checked() {
    let plan = seven_b_32k();
    let mut same = plan.clone();
    same.rank_programs = alloc::vec![crate::plan::RankProgram { rank: 3, instructions: plan.instructions.clone() }];
    assert_eq!(check_plan(&same), Ok(()));
    let mut outside = same.clone();
    outside.rank_programs[0].rank = 8;
    let violations = check_plan(&outside).unwrap_err();
    assert!(violations.iter().any(|v| matches!(v, PlanViolation::BadRank { rank: 8, ranks: 8, previous: None, .. })));
    let mut twice = same.clone();
    twice.rank_programs.push(twice.rank_programs[0].clone());
    let violations = check_plan(&twice).unwrap_err();
    assert!(violations.iter().any(|v| matches!(v, PlanViolation::BadRank { rank: 3, previous: Some(3), .. })));
    // A rank program's own races are reported inside it: rank 3 without its first collective Wait.
    let (_, index) = first_wait(plan, C, K);
    let mut racy = same.clone();
    racy.rank_programs[0].instructions.remove(index);
    let violations = check_plan(&racy).unwrap_err();
    assert!(
        violations.iter().any(|v| matches!(v, PlanViolation::InRankProgram { rank: 3, violation }
            if matches!(**violation, PlanViolation::ReadNotReady { .. }))),
        "{violations:?}"
    );
    // Rank 0 with its own program is compared with the shared program that the others run.
    let mut rank0 = plan.clone();
    let mut program = plan.instructions.clone();
    let collective = program.iter().position(|i| i.stream == K && matches!(i.action, Action::Launch(_))).unwrap();
    program.remove(collective);
    rank0.rank_programs = alloc::vec![crate::plan::RankProgram { rank: 0, instructions: program }];
    let violations = check_plan(&rank0).unwrap_err();
    assert!(violations.iter().any(|v| matches!(v, PlanViolation::CollectiveMismatch { rank: 1, position: 0, .. })));
}

/// A tiny memo plan with context parallelism: 4 layers, 64 tokens in sequences of 2, `t` tensor-
/// and `c` context-parallel ranks, α forced to 0.5 (`spec/context-parallel.md`).
fn tiny_context(t: u64, c: u64) -> Plan {
    let model = ModelConfig::new("tiny", 4, 64, 4, 64, 2);
    let hardware = Hardware::preset("h100x8").unwrap();
    let mut request = PlanRequest::new(model, Parallelism::new(t, 1).with_context(c), hardware, Strategy::Memo);
    request.forced_alpha = Some(0.5);
    planned(request)
}

fn context_plans() -> &'static [(&'static str, Plan); 2] {
    static PLANS: OnceLock<[(&'static str, Plan); 2]> = OnceLock::new();
    PLANS.get_or_init(|| [("tiny t1 c2 memo", tiny_context(1, 2)), ("tiny t2 c4 memo", tiny_context(2, 4))])
}

/// Every context-parallel corruption is rejected on the c > 1 plans at several targets, with its
/// variant; the c = 1 plans have nothing to apply them to.
#[test]
fn every_context_parallel_corruption_is_rejected() {
    for (name, plan) in context_plans() {
        for mutation in Mutation::CONTEXT {
            for (target, detail) in [(0, 0), (1, 1), (2, 7), (3, 33), (1000, 5)] {
                rejected(name, plan, mutation, target, detail);
            }
        }
    }
    for mutation in Mutation::CONTEXT {
        assert!(mutate(tiny_memo(), mutation, 0, 0).is_none(), "{}: the c = 1 plan has no ring", mutation.name());
    }
}

/// The ring's violations name the context ranks, the exchange and the bytes: context rank 1 of
/// the c = 2 plan without its first exchange (the forward's K of layer 0) is out of step with
/// rank 0 from the first exchange whose size differs (K and V have the same size; the
/// accumulators twice that), in both directions of the ring.
#[test]
fn a_dropped_ring_exchange_names_the_ranks_the_exchange_and_the_sizes() {
    let (_, plan) = &context_plans()[0];
    let (mutated, _, violations) = rejected("tiny t1 c2 memo", plan, Mutation::DropRingExchange, 1, 0);
    assert_eq!(mutated.rank_programs[0].rank, 1);
    let ring: Vec<&PlanViolation> =
        violations.iter().filter(|v| matches!(v, PlanViolation::RingExchangeMismatch { .. })).collect();
    let pairs: Vec<(u32, u32)> = ring
        .iter()
        .filter_map(|v| match v {
            PlanViolation::RingExchangeMismatch { sender, receiver, tensor_rank: 0, sent, received, .. } => {
                assert_ne!(sent, received, "{v}");
                Some((*sender, *receiver))
            }
            _ => None,
        })
        .collect();
    assert_eq!(pairs, [(0, 1), (1, 0)], "{ring:?}");
    let message = ring[0].to_string();
    assert!(message.contains("from context rank 0 to context rank 1 (tensor-parallel rank 0)"), "{message}");
    assert!(message.contains("bytes"), "{message}");
}

/// Each context rank's program passes the single-program rules with its own context: a race in
/// context rank 2's program (c = 4, t = 2: the rank program at global rank 4) is reported inside
/// it.
#[test]
fn a_context_ranks_program_is_checked_as_its_own() {
    let (_, plan) = &context_plans()[1];
    assert_eq!(plan.rank_programs.iter().map(|p| p.rank).collect::<Vec<_>>(), [2, 4, 6]);
    let mut racy = plan.clone();
    let program = &mut racy.rank_programs[1].instructions;
    // Compute's wait for the first K/V the ring brings in: the block launch after it then reads
    // the ring buffer while the exchange may still write it.
    let received = program
        .windows(2)
        .position(|w| {
            matches!(&w[0].action, Action::Launch(l) if l.op == Op::RingExchange)
                && matches!(w[1].action, Action::Record(_))
        })
        .and_then(|at| match program[at + 1].action {
            Action::Record(event) => program.iter().position(|i| i.stream == C && i.action == Action::Wait(event)),
            _ => None,
        })
        .expect("a compute wait for the ring");
    program.remove(received);
    let violations = check_plan(&racy).unwrap_err();
    assert!(violations.iter().all(|v| matches!(v, PlanViolation::InRankProgram { rank: 4, .. })), "{violations:?}");
}
