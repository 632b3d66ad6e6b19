//! NCCL for the CUDA backend: `memo_nccl` with NCCL's file names (`libnccl.so.2`, `libnccl.so`,
//! or the file in `MEMO_NCCL_LIBRARY`), loaded at run time. cudarc's own NCCL loader is not used:
//! it does not try `libnccl.so.2` and panics when it finds nothing (`spec/backends.md`,
//! "Collectives on GPUs").
//!
//! A communicator belongs to one device: [`crate::CudaBackend::join_collectives`] makes the
//! backend's context current and joins; the collectives then take arena addresses
//! (`CUdeviceptr`) and a `CUstream` through [`stream`].

use std::ffi::c_void;

pub use memo_nccl::{
    Communicator, DataType, Flavour, Nccl, NcclError, ReduceOp, Search, UniqueId, Version, MIN_VERSION, NCCL,
};

use crate::probe;

/// Loads NCCL: `MEMO_NCCL_LIBRARY` if set, else `libnccl.so.2` then `libnccl.so` by the dynamic
/// linker's search. When neither loads, the error also lists NCCL files found outside the
/// linker's path (CUDA's folders, Python's `nvidia/nccl/lib`), to point `MEMO_NCCL_LIBRARY` at.
pub fn load() -> Result<Nccl, NcclError> {
    memo_nccl::load_nccl().map_err(|error| match error {
        NcclError::LibraryNotFound { flavour, mut tried } => {
            for file in probe::found_elsewhere("libnccl.so") {
                tried.push(format!("{file} exists but is not on the loader's path"));
            }
            NcclError::LibraryNotFound { flavour, tried }
        }
        other => other,
    })
}

/// A cudarc stream as the `cudaStream_t` NCCL takes (the same pointer).
pub fn stream(stream: &cudarc::driver::CudaStream) -> *mut c_void {
    stream.cu_stream().cast()
}
