//! The MEMO runtime: the [`Backend`] trait every device implements, the plan interpreter
//! ([`Replay`]) and the GPT trainer loop ([`Trainer`]).
//!
//! The runtime decides nothing: a plan from `memo-plan-core` is checked by the independent
//! checker (a [`memo_plan_core::check::CheckedPlan`], the only plan [`Replay::new`] takes), its buffers become spans of ONE device arena and one pinned host slab, and its
//! instructions become backend calls, in order, on the plan's streams. With tensor parallelism,
//! [`ParallelTrainer`] runs one [`Trainer`] per rank, joined by [`Collectives`].
// Unsafe code is denied but for the backend's two unsafe methods (`backend.rs`) and the
// interpreter that calls them (`interpret.rs`).
#![deny(unsafe_code)]
#![deny(missing_docs)]

pub mod backend;
pub mod checkpoint;
pub mod collective;
pub mod control;
pub mod data;
pub mod error;
pub mod interpret;
pub mod recall;
pub mod rendezvous;
pub mod trainer;

pub use backend::{AdamW, Backend, BackendError, CheckReport, KernelArg, KernelContext, MemoryReport, Space, Span};
pub use collective::{Collectives, LocalGroup, LocalRank};
pub use control::{StepControl, StopGate};
pub use error::{CheckpointMismatch, PlanMismatch, RuntimeError, TokenError};
pub use interpret::Replay;
pub use trainer::{
    cpu_hardware, training_model, NamedBytes, ParallelTrainer, PlannedStep, RankGroups, SetupTimes, TrainOptions,
    Trainer, TRAINING_MODELS,
};
