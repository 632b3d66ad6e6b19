//! The MEMO backend for NVIDIA GPUs, on cudarc with dynamic loading: it builds everywhere and,
//! where no CUDA driver or device is present, [`CudaBackend::new`] returns
//! [`memo_runtime::BackendError::Unavailable`] naming what is missing (never a panic: each
//! library is probed before cudarc touches it).
//!
//! What it does with a plan (`spec/backends.md`, "CUDA"):
//! - **Memory**: one device arena (`cuMemAlloc`) addressed as base + planned offset, one pinned
//!   host slab (`cuMemHostAlloc` with flags 0: not write-combined, because the host reads
//!   swapped-out bytes back), both zeroed at allocation; every span is bounds-checked
//!   ([`memo_runtime::BackendError::OutOfBounds`]).
//! - **Streams and events**: a CUDA stream for each plan stream (compute, device-to-host,
//!   host-to-device, collective);
//!   the plan's events are CUDA events, the only synchronisation (cudarc's per-allocation event
//!   tracking is turned off: with one arena it would serialise the streams).
//! - **Kernels**: every source of [`memo_kernels::SOURCES`] compiled by NVRTC at construction,
//!   straight to a CUBIN for the device's compute capability (one thread per source); each launch runs the steps of
//!   [`memo_kernels::launch_steps`]: kernels by name, GEMMs through cuBLAS `cublasGemmEx` (bf16
//!   in and out, `CUBLAS_COMPUTE_32F`) on that stream's own cuBLAS handle, memsets.
//! - **Errors from kernels**: kernels that find bad input (a token id outside the vocabulary, a
//!   non-finite gradient norm in AdamW) write status words; [`memo_runtime::Backend::synchronize`]
//!   reads them and returns [`memo_runtime::BackendError::Kernel`] with the instruction.
//!
//! - **Timing** (optional, [`CudaBackend::measure`]): CUDA events around every launch and copy,
//!   read at synchronize into [`memo_runtime::Backend::timings`].
//!
//! - **Collectives** ([`nccl`]): NCCL loaded at run time through `memo-nccl`; a communicator per
//!   rank joined with a timeout ([`CudaBackend::join_collectives`]), all-gather, reduce-scatter and
//!   all-reduce on arena addresses and a CUDA stream. A backend that has joined
//!   ([`CudaBackend::join`]) runs the plan's collective launches on it, on the collective
//!   stream's own CUDA stream, and [`memo_runtime::Backend::synchronize`] waits for that stream
//!   at most the communicator's timeout (a missing peer is an error, not a hang).
//!
//! [`nvrtc_check`] compiles the kernels with an NVRTC library at an explicit path, for CI
//! machines without a GPU.
#![deny(missing_docs)]

pub mod attention;
mod backend;
mod compile;
pub mod error;
mod exec;
pub mod nccl;
pub mod nvrtc_check;
mod probe;
mod scratch;
mod timing;

pub use attention::{AttentionChoice, AttentionScratch};
pub use backend::{CudaBackend, ATTENTION_VARIABLE};
pub use error::{CudaError, CudnnStatus};
pub use scratch::CudaScratch;
