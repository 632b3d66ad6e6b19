//! Launch scratch (rule 11): the planner gives the launches a backend's sizer asks scratch for a
//! scratch transient each, placed and checked like any transient; a plan whose scratch is
//! dropped, shrunk, read, shared or misplaced is rejected.

use alloc::vec::Vec;

use super::*;
use crate::model::{Hardware, ModelConfig, Parallelism};
use crate::plan::scratch::{signature_shapes, NoScratch, ScratchSizer};
use crate::plan::{Arg, Strategy, TensorRole};
use crate::planner::{self, plan_with_scratch, PlanRequest};

/// A sizer shaped like a GPU backend's attention: the forward's softmax sums and rotated q
/// (rows x (heads x 4 + q's row bytes)), the backward's dQ accumulator (twice q's bytes), and a
/// fixed block of partial sums for the squared gradient norm.
#[derive(Debug)]
struct AttentionLike;

impl ScratchSizer for AttentionLike {
    fn scratch_bytes(&self, op: Op, args: &[ArgShape], ctx: &ShapeContext) -> u64 {
        let Some(q) = args.first() else { return 0 };
        match op {
            Op::Attention => q.rows * (ctx.heads * 4 + q.row_bytes),
            Op::AttentionBackward => q.rows * q.row_bytes * 2 + 100,
            Op::GradNormSquared => 1000,
            _ => 0,
        }
    }
}

fn request(tensor: u64, strategy: Strategy) -> PlanRequest {
    let model = ModelConfig::new("tiny", 4, 64, 4, 256, 1);
    PlanRequest::new(model, Parallelism::new(tensor, 1), Hardware::preset("h200x1").unwrap(), strategy)
}

fn launches(plan: &Plan) -> impl Iterator<Item = (usize, &Launch)> {
    plan.instructions.iter().enumerate().filter_map(|(i, ins)| match &ins.action {
        Action::Launch(launch) => Some((i, launch)),
        _ => None,
    })
}

fn names(result: Result<(), Vec<PlanViolation>>) -> Vec<&'static str> {
    result.err().unwrap_or_default().iter().map(|v| v.innermost().name()).collect()
}

/// The first attention backward launch and its scratch buffer.
fn backward_scratch(plan: &Plan) -> (usize, BufferId) {
    let (index, launch) = launches(plan).find(|(_, l)| l.op == Op::AttentionBackward).unwrap();
    (index, launch.scratch().unwrap().region.buffer)
}

#[test]
fn every_launch_the_sizer_asks_for_gets_its_own_placed_scratch_and_the_plan_checks() {
    for tensor in [1, 2] {
        for strategy in Strategy::ALL {
            let report = plan_with_scratch(&request(tensor, strategy), &AttentionLike).unwrap();
            let plan = &report.plan;
            assert_eq!(check_plan_scratch(plan, &AttentionLike), Ok(()), "{strategy:?} t={tensor}");
            assert_eq!(check_plan(plan), Ok(()));
            let ctx = ShapeContext::for_model(&plan.provenance.model, 0, tensor);
            let mut users: BTreeMap<BufferId, usize> = BTreeMap::new();
            let mut attention = 0;
            for (_, launch) in launches(plan) {
                let shapes = signature_shapes(plan, launch).expect("a checked plan's arguments are in it");
                let needed = AttentionLike.scratch_bytes(launch.op, &shapes, &ctx);
                match launch.scratch() {
                    None => assert_eq!(needed, 0, "{:?} has no scratch", launch.op),
                    Some(arg) => {
                        let buffer = plan.buffer(arg.region.buffer).unwrap();
                        assert_eq!(
                            (buffer.kind, buffer.role, arg.access),
                            (BufferKind::Transient, TensorRole::Scratch, Access::Write)
                        );
                        assert!(buffer.bytes().unwrap() >= needed && needed > 0);
                        assert_eq!(buffer.bytes().unwrap() % 256, 0);
                        assert!(matches!(buffer.place, Place::Device { .. }));
                        *users.entry(arg.region.buffer).or_default() += 1;
                    }
                }
                attention += usize::from(matches!(launch.op, Op::Attention | Op::AttentionBackward));
            }
            assert!(attention >= 8);
            // One scratch per launch, used by that launch only.
            assert!(users.values().all(|&n| n == 1));
            let scratch = plan.buffers.iter().filter(|b| b.role == TensorRole::Scratch).count();
            assert_eq!(scratch, users.len());
            // The same request without scratch makes a plan the sizer rejects, one violation per
            // launch that needs scratch.
            let bare = planner::plan(&request(tensor, strategy)).unwrap().plan;
            let rejected = check_plan_scratch(&bare, &AttentionLike).unwrap_err();
            assert_eq!(rejected.len(), users.len());
            assert!(rejected.iter().all(|v| v.name() == "scratch_too_small"));
            assert_eq!(check_plan_scratch(&bare, &NoScratch), Ok(()));
        }
    }
}

#[test]
fn a_plan_without_its_scratch_or_with_less_is_rejected() {
    let good = plan_with_scratch(&request(1, Strategy::Memo), &AttentionLike).unwrap().plan;
    let (index, scratch) = backward_scratch(&good);

    // Dropped: the argument removed.
    let mut dropped = good.clone();
    let Action::Launch(launch) = &mut dropped.instructions[index].action else { unreachable!() };
    launch.args.pop();
    let violations = check_plan_scratch(&dropped, &AttentionLike).unwrap_err();
    assert!(violations.iter().any(|v| matches!(v,
        PlanViolation::ScratchTooSmall { instruction, op: Op::AttentionBackward, found: 0, .. } if *instruction == index)));

    // Shrunk: the buffer one alignment unit short of what the sizer asks.
    let mut shrunk = good.clone();
    shrunk.buffers[scratch.index()].row_bytes -= 256;
    let violations = check_plan_scratch(&shrunk, &AttentionLike).unwrap_err();
    assert!(violations.iter().any(|v| matches!(v,
        PlanViolation::ScratchTooSmall { instruction, .. } if *instruction == index)));

    // Half of the buffer: a partial scratch argument.
    let mut part = good.clone();
    part.buffers[scratch.index()].rows = 2;
    let Action::Launch(launch) = &mut part.instructions[index].action else { unreachable!() };
    launch.args.last_mut().unwrap().region.end = 1;
    assert!(names(check_plan(&part)).contains(&"bad_scratch"));
}

#[test]
fn a_scratch_is_written_by_its_launch_only_and_placed_clear_of_live_buffers() {
    let good = plan_with_scratch(&request(1, Strategy::Memo), &AttentionLike).unwrap().plan;
    let (index, scratch) = backward_scratch(&good);
    let set_scratch = |plan: &mut Plan, arg: Arg| {
        let Action::Launch(launch) = &mut plan.instructions[index].action else { unreachable!() };
        *launch.args.last_mut().unwrap() = arg;
    };
    let arg = |buffer: BufferId, rows: u64, access: Access| Arg { region: Region::rows(buffer, 0, rows), access };

    // Marked as read: rule 11 (and nothing wrote it).
    let mut read = good.clone();
    set_scratch(&mut read, arg(scratch, 1, Access::Read));
    assert!(names(check_plan(&read)).contains(&"bad_scratch"));

    // Another transient as the scratch: rule 11.
    let Action::Launch(launch) = &good.instructions[index].action else { unreachable!() };
    let dq = launch.args[6].region;
    let mut other = good.clone();
    set_scratch(&mut other, Arg { region: dq, access: Access::Write });
    assert!(names(check_plan(&other)).contains(&"bad_scratch"));

    // The scratch as a signature argument of another launch.
    let mut shared = good.clone();
    let (later, _) = launches(&good).find(|(i, l)| *i > index && l.op == Op::LinearBackwardInput).unwrap();
    let Action::Launch(launch) = &mut shared.instructions[later].action else { unreachable!() };
    launch.args[0].region = Region::rows(scratch, 0, 1);
    assert!(names(check_plan(&shared)).contains(&"bad_scratch"));

    // Placed over a buffer the launch reads (q): overlap (rule 6), like any transient.
    let Action::Launch(launch) = &good.instructions[index].action else { unreachable!() };
    let q = good.buffer(launch.args[0].region.buffer).unwrap().place;
    let mut over = good.clone();
    over.buffers[scratch.index()].place = q;
    assert!(names(check_plan(&over)).contains(&"overlap"));
}

#[test]
fn scratch_survives_the_byte_format_and_shows_in_the_json() {
    let good = plan_with_scratch(&request(2, Strategy::Memo), &AttentionLike).unwrap().plan;
    let decoded = Plan::decode(&good.encode()).unwrap();
    assert_eq!(decoded, good);
    assert_eq!(check_plan_scratch(&decoded, &AttentionLike), Ok(()));
    assert!(good.to_json().contains("\"param\": \"scratch\""));
}
