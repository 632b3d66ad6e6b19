//! MEMO's planner, as a dependency-light `no_std` library.
//!
//! What is here now (see `ARCHITECTURE.md` beside this crate for the module map):
//! - [`trace`]: memory request traces, in MEMO's `malloc`/`free` text form and the `id,lower,upper,size`
//!   CSV form of public dynamic-storage-allocation (DSA) benchmarks;
//! - [`lifetime`]: buffer lifetimes, the live-bytes profile and its maximum, the lower bound of any
//!   placement;
//! - [`arena`]: exact arena placement (greedy portfolio, then a MiniMalloc-style branch-and-bound);
//!   with the `mip` feature, `arena::mip` solves MEMO's MIP formulation with `microlp`, a
//!   cross-check for small instances;
//! - [`check`]: an independent checker for placements that shares no code with the solver;
//! - [`generate`]: deterministic instance generators (known optimum, training-step shaped);
//! - [`model`], [`swap`], [`cost`]: model and machine descriptions with presets, MEMO's swap
//!   fraction α and the constraint that binds it, FLOPs per op and MFU (`spec/cost-model.md`);
//! - with the `fuzzing` feature, `fuzzing`: the harnesses behind the cargo-fuzz targets in `fuzz/`.
//!
//! Not here yet: the per-layer program, the schedule, bi-level placement, the plan format and the
//! plan checker.
//!
//! Placement is integer arithmetic and deterministic: same input, same output, on every platform.
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

extern crate alloc;
#[cfg(any(test, feature = "std"))]
extern crate std;

mod log;

pub mod arena;
pub mod bilevel;
pub mod check;
pub mod cost;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod generate;
pub mod lifetime;
pub mod model;
pub mod plan;
pub mod planner;
pub mod schedule;
pub mod simulate;
pub mod swap;
pub mod trace;

pub use arena::{solve, Solution, SolveError, SolveOptions, SolveStats};
pub use lifetime::{lower_bound, BufferLifetime};
pub use trace::{parse_trace, Trace, TraceError, TraceFormat};
