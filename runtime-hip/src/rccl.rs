//! RCCL for the HIP backend: `memo_nccl` with RCCL's file names (`librccl.so.1`, `librccl.so`, or
//! the file in `MEMO_RCCL_LIBRARY`), looked for in the folders of [`LibrarySearch`] (the ROCm
//! roots) before the dynamic linker's search. RCCL exports NCCL's C API under the same names, so
//! the binding is shared with the CUDA backend (`spec/backends.md`, "Collectives on GPUs").
//!
//! A communicator belongs to one device: [`crate::HipBackend::join_collectives`] sets the
//! backend's device on the calling thread and joins; the collectives then take arena addresses
//! and a `hipStream_t`.

pub use memo_nccl::{
    Communicator, DataType, Flavour, Nccl, NcclError, ReduceOp, Search, UniqueId, Version, MIN_VERSION, RCCL,
};

use crate::sys::LibrarySearch;

/// Loads RCCL: `MEMO_RCCL_LIBRARY` if set, else `librccl.so.1` then `librccl.so` in each folder
/// of `search`, then (when `search.system`) by the dynamic linker's search.
pub fn load(search: &LibrarySearch) -> Result<Nccl, NcclError> {
    let mut rccl = Search::from_env(&RCCL, search.dirs.clone());
    rccl.system = search.system;
    Nccl::load(&RCCL, &rccl)
}
