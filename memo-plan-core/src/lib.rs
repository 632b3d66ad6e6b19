//! MEMO's planner, as a dependency-light `no_std` library.
//!
//! Modules (see `ARCHITECTURE.md` beside this crate for the map and its invariants):
//! - [`trace`]: memory request traces, in MEMO's `malloc`/`free` text form and the `id,lower,upper,size`
//!   CSV form of public dynamic-storage-allocation (DSA) benchmarks;
//! - [`lifetime`]: buffer lifetimes, the live-bytes profile and its maximum, the lower bound of any
//!   placement;
//! - [`arena`]: exact arena placement (greedy portfolio, then a MiniMalloc-style branch-and-bound);
//!   with the `mip` feature, `arena::mip` solves MEMO's MIP formulation with `microlp`, a
//!   cross-check for small instances;
//! - [`model`], [`swap`], [`cost`]: model and machine descriptions with presets, MEMO's swap
//!   fraction α and the constraint that binds it, FLOPs per op and MFU (`spec/cost-model.md`);
//! - [`plan`]: the plan, one GPU's training step as a program over buffers on three streams;
//! - [`schedule`]: builds that program for a model under one of four strategies;
//! - [`bilevel`]: places its buffers in one arena, level 1 per layer block, level 2 for the step;
//! - [`simulate`]: the three streams' timeline: step time, stalls;
//! - [`planner`]: the front door, model + machine + strategy -> a placed plan and its report;
//! - [`check`]: independent checkers for placements and for plans, sharing no code with what they
//!   check;
//! - [`generate`]: deterministic instance generators (known optimum, training-step shaped);
//! - with the `fuzzing` feature, `fuzzing`: the harnesses behind the cargo-fuzz targets in `fuzz/`.
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

pub use arena::{solve, solve_with, Progress, Solution, SolveError, SolveOptions, SolveStats};
pub use lifetime::{lower_bound, BufferLifetime};
pub use trace::{parse_trace, Trace, TraceError, TraceFormat};
