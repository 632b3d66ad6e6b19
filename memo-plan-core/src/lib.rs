//! MEMO's planner, as a dependency-light `no_std` library.
//!
//! Modules (see `ARCHITECTURE.md` beside this crate for the map and its invariants):
//! - [`trace`]: memory request traces, in MEMO's `malloc`/`free` text form and the `id,lower,upper,size`
//!   CSV form of public dynamic-storage-allocation (DSA) benchmarks;
//! - [`lifetime`] (from `memo-place`): buffer lifetimes, the live-bytes profile and its maximum,
//!   the lower bound of any placement;
//! - arena placement is the `memo-place` crate (greedy orders, then a MiniMalloc-style
//!   branch-and-bound); its entry points are re-exported here ([`solve`], [`SolveOptions`], ...);
//! - [`model`], [`swap`], [`cost`]: model and machine descriptions with presets, MEMO's swap
//!   fraction α and the constraint that binds it, FLOPs per op and MFU (`spec/cost-model.md`);
//! - [`plan`]: the plan, one GPU's training step as a program over buffers on four streams
//!   (compute, d2h, h2d, collective);
//! - [`schedule`]: builds that program for a model under one of four strategies;
//! - [`bilevel`]: places its buffers in one arena, level 1 per layer block, level 2 for the step;
//! - [`simulate`]: the four streams' timeline: step time, stalls;
//! - [`planner`]: the front door, model + machine + strategy -> a placed plan and its report;
//! - [`check`]: independent checkers for placements and for plans, sharing no code with what they
//!   check;
//! - [`generate`] (from `memo-place`): deterministic instance generators (known optimum,
//!   training-step shaped);
//! - with the `fuzzing` feature, `fuzzing`: the harnesses behind the cargo-fuzz targets in `fuzz/`.
//!
//! Placement is integer arithmetic and deterministic: same input, same output, on every platform.
//!
//! # The entry points, run
//!
//! Place a memory request trace in one arena and check the answer independently:
//!
//! ```
//! use memo_plan_core::{check::check_placement, parse_trace, solve, SolveOptions};
//!
//! // Three requests: 0 and 1 overlap in time, 2 comes after 0 is freed.
//! let trace = parse_trace(b"malloc 0 4096\nmalloc 1 1024\nfree 0 4096\nmalloc 2 4096\nfree 1 1024\nfree 2 4096\n")?;
//! let options = SolveOptions::default();
//! let solution = solve(&trace.buffers, &options)?;
//! assert_eq!((solution.peak, solution.lower_bound, solution.optimal), (5120, 5120, true));
//! check_placement(&trace.buffers, &solution.offsets, options.alignment, solution.peak, None).unwrap();
//! # Ok::<(), Box<dyn core::error::Error>>(())
//! ```
//!
//! Plan one GPU's training step with MEMO's swap and recompute, check the plan with the
//! independent checker, and round-trip it through the plan file format:
//!
//! ```
//! use memo_plan_core::check::check_plan;
//! use memo_plan_core::model::{Hardware, ModelConfig, Parallelism};
//! use memo_plan_core::plan::{Plan, Strategy};
//! use memo_plan_core::planner::{plan, PlanRequest};
//!
//! // The 7B model's layer shape, four layers of it, 32K tokens on 8 A800 with t = 8.
//! let mut model = ModelConfig::preset("7b", 32 << 10, 1)?;
//! model.layers = 4;
//! let request = PlanRequest::new(model, Parallelism::new(8, 1), Hardware::preset("a800x8")?, Strategy::Memo);
//! let report = plan(&request)?;
//! assert!(report.fits());
//! check_plan(&report.plan).expect("the planner's plans pass the checker");
//! let bytes = report.plan.encode();
//! assert_eq!(Plan::decode(&bytes)?, report.plan);
//! # Ok::<(), Box<dyn core::error::Error>>(())
//! ```
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

extern crate alloc;
#[cfg(any(test, feature = "std"))]
extern crate std;

pub mod bilevel;
pub mod check;
pub mod cost;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod model;
pub mod plan;
pub mod planner;
pub mod schedule;
pub mod simulate;
pub mod swap;
pub mod trace;

#[cfg(feature = "std")]
pub use memo_place::solve_portfolio;
pub use memo_place::{generate, lifetime};
pub use memo_place::{lower_bound, BufferLifetime};
pub use memo_place::{solve, solve_with, Progress, SearchMix, Solution, SolveError, SolveOptions, SolveStats};
pub use trace::{parse_trace, Trace, TraceError, TraceFormat};
