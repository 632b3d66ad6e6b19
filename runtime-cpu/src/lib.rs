//! The CPU backend for the MEMO runtime.
//!
//! [`ops`] holds the CPU reference kernels: every op a plan launches (`spec/plan-format.md`, the
//! op table), bf16 storage with fp32 accumulation. The backend itself (streams on threads,
//! events, the arena) is being built.
#![forbid(unsafe_code)]

pub mod ops;
