//! The CPU reference backend of the MEMO runtime: the device arena and the pinned host slab are
//! host memory, each of the plan's streams is a thread, events are real, and the kernels
//! ([`ops`]) store bf16 and accumulate in f32 as GPUs do. Unsafe code is confined to `memory`
//! (raw shared access to the arena), each block with its safety argument.
#![deny(missing_docs)]

mod backend;
mod checked;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod memory;
pub mod ops;

pub use backend::CpuBackend;
