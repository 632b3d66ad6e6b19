//! [`CheckedPlan`]: a plan that [`super::check_plan`] accepted, as a type.
//!
//! Running a plan on a backend is sound only if the plan orders every access: the backends let
//! their stream threads (or GPU streams) touch the arena's bytes concurrently, and it is the
//! plan's events that keep two of them from writing the same bytes at once. The checker proves
//! that; this type carries the proof to wherever a plan is executed, so that the executor needs
//! no promise from its caller. Its field is private and its only constructor runs the checker,
//! so no safe code can make one from a plan that was not checked, and it hands out no mutable
//! access, so a checked plan cannot be changed afterwards.

use alloc::vec::Vec;

use super::{check_plan, check_plan_scratch, PlanViolation};
use crate::plan::scratch::ScratchSizer;
use crate::plan::Plan;

/// A plan that breaks none of the rules of `spec/validity.md`. Only [`CheckedPlan::check`]
/// makes one.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckedPlan {
    plan: Plan,
}

impl CheckedPlan {
    /// Checks `plan` with [`check_plan`]: the checked plan, or every violation found (sorted as
    /// [`check_plan`] sorts them).
    pub fn check(plan: Plan) -> Result<Self, Vec<PlanViolation>> {
        check_plan(&plan)?;
        Ok(CheckedPlan { plan })
    }

    /// Checks `plan` with [`check_plan_scratch`] against the scratch `sizer` of the backend that
    /// will run it: the checked plan (every launch's scratch in the plan, at least what the
    /// backend's kernels use), or every violation found.
    pub fn check_scratch(plan: Plan, sizer: &dyn ScratchSizer) -> Result<Self, Vec<PlanViolation>> {
        check_plan_scratch(&plan, sizer)?;
        Ok(CheckedPlan { plan })
    }

    /// The plan.
    pub fn as_plan(&self) -> &Plan {
        &self.plan
    }

    /// The plan, giving up the proof (changing it needs another check to execute it).
    pub fn into_plan(self) -> Plan {
        self.plan
    }
}

impl AsRef<Plan> for CheckedPlan {
    fn as_ref(&self) -> &Plan {
        &self.plan
    }
}
