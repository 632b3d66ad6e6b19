// A `CheckedPlan` made without the checker: its field is private.
use memo_plan_core::check::CheckedPlan;
use memo_plan_core::plan::Plan;

fn forge(plan: Plan) -> CheckedPlan {
    CheckedPlan { plan }
}

fn main() {
    let _ = forge;
}
