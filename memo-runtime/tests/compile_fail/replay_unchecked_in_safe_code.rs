// The unchecked way in is an `unsafe fn`: safe code cannot call it.
use memo_plan_core::plan::Plan;
use memo_runtime::Replay;

fn replay(plan: Plan) -> Replay {
    Replay::new_unchecked(plan).unwrap()
}

fn main() {
    let _ = replay;
}
