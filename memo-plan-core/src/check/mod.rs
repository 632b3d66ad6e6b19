//! Independent checkers. They import only the data types of their inputs and recompute
//! everything they need; they never call the solver (so they can catch its bugs).

/// The placement checker, which lives in `memo-place` beside the solver but shares no code with it.
pub use memo_place::check as placement;
pub mod plan;

pub use placement::{check_placement, PlacementViolation};
pub use plan::{check_plan, check_plan_scratch, CheckedPlan, PlanViolation};
