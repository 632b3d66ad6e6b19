//! Launch scratch: device bytes a backend's kernels need for one launch besides its arguments
//! (partial sums of deterministic reductions, rotated queries and keys, a library's workspace).
//!
//! The backend answers a [`ScratchSizer`] before planning; the schedule gives every launch whose
//! answer is not 0 a [`TensorRole::Scratch`](super::TensorRole::Scratch) transient of that many
//! bytes as its trailing argument ([`super::Launch::scratch`]), live for that launch only, so
//! bi-level placement places it in the arena like any transient and the checker checks its
//! accesses like any other argument's. [`crate::check::check_plan_scratch`] holds a plan to a
//! sizer: every launch's scratch at least what the sizer asks. `spec/plan-format.md` ("Launch
//! scratch") and `spec/validity.md` (rule 11).

use core::fmt;

use alloc::vec::Vec;

use super::shapes::{ArgShape, ShapeContext};
use super::{Launch, Op, Plan};

/// Bytes of scratch one launch needs: a pure function of the op, its argument shapes (in
/// [`Op::signature`] order) and the model's shape context. A backend implements it with the same
/// function that sizes its kernels' scratch, so its answer does not need the device.
pub trait ScratchSizer: fmt::Debug {
    /// Device bytes of scratch a launch of `op` on `args` needs; 0 for none.
    fn scratch_bytes(&self, op: Op, args: &[ArgShape], ctx: &ShapeContext) -> u64;
}

/// The shapes a sizer is asked about for `launch` of `plan`: its arguments in [`Op::signature`]
/// order (the scratch argument past them left out); `None` when an argument names no buffer of
/// the plan or rows outside it.
pub fn signature_shapes(plan: &Plan, launch: &Launch) -> Option<Vec<ArgShape>> {
    let signature = launch.op.signature().len();
    let args = launch.args.get(..signature)?;
    args.iter()
        .map(|arg| {
            let buffer = plan.buffer(arg.region.buffer)?;
            let rows = arg.region.end.checked_sub(arg.region.start).filter(|_| arg.region.end <= buffer.rows)?;
            Some(ArgShape { first_row: arg.region.start, rows, row_bytes: buffer.row_bytes })
        })
        .collect()
}

/// The sizer of a backend whose kernels need no scratch (the CPU's): 0 for every launch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NoScratch;

impl ScratchSizer for NoScratch {
    fn scratch_bytes(&self, _op: Op, _args: &[ArgShape], _ctx: &ShapeContext) -> u64 {
        0
    }
}

/// Bytes per row of a scratch buffer: one row holds the launch's whole scratch, rounded up to
/// this, so every scratch span starts and ends on the arena's alignment.
pub const SCRATCH_ROW_ALIGN: u64 = 256;

/// The scratch buffer's row bytes for `bytes` of scratch: `bytes` rounded up to
/// [`SCRATCH_ROW_ALIGN`]; `None` when that overflows.
pub fn scratch_row_bytes(bytes: u64) -> Option<u64> {
    bytes.checked_next_multiple_of(SCRATCH_ROW_ALIGN)
}
