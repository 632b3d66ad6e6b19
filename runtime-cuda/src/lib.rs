//! The MEMO backend for NVIDIA GPUs (cudarc).
#![deny(missing_docs)]

pub mod nvrtc_check;
