//! The recipes' scratch in the plan: a plan made with [`RecipeScratch`] gives every launch whose
//! recipe uses scratch a scratch argument at least that large, placed in the arena and accepted
//! by the checker held to the same sizer; the plan made without it is refused by that check.

use memo_plan_core::check::{check_plan, check_plan_scratch, CheckedPlan};
use memo_plan_core::model::{Hardware, ModelConfig, Parallelism};
use memo_plan_core::plan::scratch::{signature_shapes, ScratchSizer};
use memo_plan_core::plan::shapes::ShapeContext;
use memo_plan_core::plan::{Action, Place, Plan, Strategy, TensorRole};
use memo_plan_core::planner::{plan, plan_with_scratch, PlanRequest};

use crate::RecipeScratch;

fn request(tensor: u64, strategy: Strategy) -> PlanRequest {
    let model = ModelConfig::new("tiny", 2, 64, 4, 128, 1);
    PlanRequest::new(model, Parallelism::new(tensor, 1), Hardware::preset("h200x1").unwrap(), strategy)
}

/// (launches with scratch, launches whose recipe asks scratch) of `plan`.
fn scratch_launches(plan: &Plan) -> (usize, usize) {
    let ctx = ShapeContext::for_model(&plan.provenance.model, 0, plan.provenance.parallel.tensor);
    let (mut with, mut asked) = (0, 0);
    for instruction in &plan.instructions {
        let Action::Launch(launch) = &instruction.action else { continue };
        let shapes = signature_shapes(plan, launch).expect("a checked plan's arguments are in it");
        let needed = RecipeScratch.scratch_bytes(launch.op, &shapes, &ctx);
        asked += usize::from(needed > 0);
        if let Some(arg) = launch.scratch() {
            let buffer = plan.buffers[arg.region.buffer.index()];
            assert_eq!(buffer.role, TensorRole::Scratch);
            assert!(matches!(buffer.place, Place::Device { .. }));
            assert!(buffer.bytes().unwrap() >= needed, "{:?}", launch.op);
            with += 1;
        }
    }
    (with, asked)
}

#[test]
fn the_recipes_scratch_is_planned_placed_and_checked() {
    for tensor in [1, 2] {
        for strategy in Strategy::ALL {
            let report = plan_with_scratch(&request(tensor, strategy), &RecipeScratch).unwrap();
            assert_eq!(check_plan(&report.plan), Ok(()));
            assert_eq!(check_plan_scratch(&report.plan, &RecipeScratch), Ok(()));
            assert!(CheckedPlan::check_scratch(report.plan.clone(), &RecipeScratch).is_ok());
            let (with, asked) = scratch_launches(&report.plan);
            // The deterministic reductions (weight gradients, norms' backward, the squared
            // gradient norm) use scratch: every such launch has its own in the plan.
            assert!(asked > 0 && with == asked, "{strategy:?} t={tensor}: {with} of {asked}");
            // Without the sizer the same request leaves them outside: the check refuses it.
            let bare = plan(&request(tensor, strategy)).unwrap().plan;
            let refused = check_plan_scratch(&bare, &RecipeScratch).unwrap_err();
            assert_eq!(refused.len(), asked);
        }
    }
}
