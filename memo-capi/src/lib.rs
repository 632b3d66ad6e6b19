//! A C ABI over `memo-plan-core`, and a record/replay device allocator that PyTorch's
//! `torch.cuda.memory.CUDAPluggableAllocator` can load. `spec/c-api.md` is the contract; the C
//! header `include/memo.h` is generated from this crate by cbindgen (`tests/header.rs` keeps it
//! up to date).
//!
//! - [`placement`]: traces (built request by request, or parsed), placements (minimise or fit a
//!   capacity), their offsets, peak, lower bound and optimality;
//! - [`plan_file`]: plans (`spec/plan-format.md`) loaded from bytes or files, checked with the
//!   independent checker, their totals, provenance and buffers read;
//! - [`record_replay`]: the allocator: record each iteration's requests, plan one, replay the
//!   planned addresses from one arena, fall back to the device allocator (counted) for anything
//!   the plan does not cover;
//! - [`status`]: status codes, the per-thread last error message, and the guard that keeps panics
//!   from crossing the boundary.
//!
//! Every exported function returns a status (or, for `memo_alloc`, NULL) and never unwinds: its
//! body runs under `catch_unwind`, as a last resort, since the code is written not to panic.
//! Handles are validated on every call. The caller owns no memory of this library except through
//! the explicit `*_free` functions (and device memory through `memo_free`).
#![deny(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod ffi_util;
mod handles;
pub mod model;
pub mod placement;
pub mod plan_file;
pub mod record_replay;
pub mod status;
mod trace_builder;

pub use model::MemoModel;
pub use placement::{
    MemoPlaceOptions, MemoPlacedBuffer, MemoPlacement, MemoPlacementSummary, MemoTrace, MEMO_NO_CAPACITY,
};
pub use plan_file::{MemoPlan, MemoPlanBuffer, MemoPlanProvenance, MemoPlanTotals, MEMO_PLACE_DEVICE, MEMO_PLACE_HOST};
pub use record_replay::ffi::{
    MemoAllocatorStats, MEMO_BACKEND_CUDA, MEMO_BACKEND_HOST, MEMO_MODE_PASSTHROUGH, MEMO_MODE_RECORD, MEMO_MODE_REPLAY,
};
pub use record_replay::{DeviceAllocator, DeviceError, RecordReplayAllocator};
pub use status::{last_error_message, CapiError, MemoStatus};
pub use trace_builder::TraceBuilder;
