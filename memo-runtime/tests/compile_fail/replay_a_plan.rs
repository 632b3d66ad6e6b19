// `Replay::new` takes a `CheckedPlan`, not a `Plan`.
use memo_plan_core::plan::Plan;
use memo_runtime::Replay;

fn replay(plan: Plan) -> Replay {
    Replay::new(plan).unwrap()
}

fn main() {
    let _ = replay;
}
