//! The MEMO backend for AMD GPUs: HIP, hiprtc and hipBLAS loaded at run time.
//!
//! No Rust HIP crate both builds without ROCm and fails cleanly when it is missing, so this crate
//! carries its own small binding, loaded with `libloading`, in the layers cudarc uses:
//!
//! ```text
//! sys      raw C types, constants (each with its header), library search, one function table
//!          per library resolved once: sys::hip (libamdhip64), sys::hiprtc (libhiprtc, or the
//!          HIP runtime itself on ROCm 5.x), sys::hipblas (libhipblas, both GemmEx conventions)
//!   -> result   every call returns Result<_, HipError> with the code and the library's text;
//!               one module per API group: device, memory, pinned, stream, event, module,
//!               hiprtc, hipblas
//!   -> safe     RAII: Device, DeviceBuffer, PinnedHostBuffer, Stream, Event, Module, BlasHandle;
//!               errors while releasing are recorded on the Device and returned by its next bind
//!   -> backend  (with marshal: steps -> checked addresses, kernel parameter slots, GEMM calls)
//!               HipBackend: memo_runtime::Backend over one arena, one pinned slab, three
//!               streams and the plan's events; launches through memo_kernels::launch_steps;
//!               timing (measure) with timed events around each launch and copy
//! ```
//!
//! Collectives ([`rccl`]): RCCL loaded at run time through `memo-nccl` (the binding the CUDA
//! backend uses for NCCL: RCCL exports the same C API), a communicator per rank joined with a
//! timeout ([`HipBackend::join_collectives`]). Plans do not launch them yet.
//!
//! Library search ([`LibrarySearch::from_env`]): `$ROCM_PATH/lib`, `$HIP_PATH/lib`,
//! `/opt/rocm/lib`, then the dynamic linker by name (versions 7, 6, 5). Nothing here panics or
//! unwinds across `extern "C"` (no callbacks are registered); a missing library, symbol or GPU
//! is a [`HipError`] that says which, and becomes [`memo_runtime::BackendError::Unavailable`].
//!
//! Verified without a GPU (`spec/backends.md, HIP`): the libraries load from Debian's ROCm 5.2.3
//! packages unpacked by `scripts/fetch-rocm.sh`, every kernel source compiles with hiprtc for
//! gfx90a, and the no-library and no-device errors are returned. Everything that needs a GPU or
//! hipBLAS has not run on AMD hardware yet.
#![deny(missing_docs)]

mod backend;
mod error;
pub mod marshal;
pub mod rccl;
pub mod result;
pub mod safe;
pub mod sys;
mod timing;

pub use backend::HipBackend;
pub use error::{blas_status_message, HipError, HIP_ERROR_NO_DEVICE, HIP_ERROR_OUT_OF_MEMORY};
pub use sys::LibrarySearch;

use memo_kernels::Target;

/// One kernel source's hiprtc result: the code object's size, or the compile error.
#[derive(Debug)]
pub struct SourceCompile {
    /// The file in `kernels/`.
    pub source: &'static str,
    /// Code object bytes, or why it failed (with hiprtc's log).
    pub result: Result<usize, HipError>,
}

/// What [`compile_check`] did.
#[derive(Debug)]
pub struct CompileCheck {
    /// Where hiprtc was found.
    pub hiprtc: String,
    /// The options used.
    pub options: Vec<String>,
    /// Every source of `memo_kernels::SOURCES`, in order.
    pub sources: Vec<SourceCompile>,
}

/// Compiles every `memo_kernels::SOURCES` entry with hiprtc for `gfx` (e.g. `gfx90a`), without
/// a GPU. Errs only when the HIP runtime or hiprtc cannot be loaded; each source's own result is
/// in the report.
pub fn compile_check(search: &LibrarySearch, gfx: &'static str) -> Result<CompileCheck, HipError> {
    let hip = sys::hip::HipLib::load(search)?;
    let rtc = sys::hiprtc::HiprtcLib::load(search, &hip)?;
    let options = memo_kernels::compile_options(Target::Hip { gfx });
    let sources = memo_kernels::SOURCES
        .iter()
        .map(|source| SourceCompile {
            source: source.name,
            result: safe::module::compile_source(&rtc.fns, source, &options)
                .and_then(|code| kernels_present(source, &code).map(|()| code.len())),
        })
        .collect();
    Ok(CompileCheck { hiprtc: rtc.origin, options, sources })
}

/// Checks that every kernel `source` declares is defined in its code object: an AMDGPU code
/// object is an ELF file whose symbol table names each kernel and its descriptor `<name>.kd`.
/// (A kernel missing its `extern "C"`, or misspelt in `SOURCES`, compiles but cannot be loaded.)
pub fn kernels_present(source: &memo_kernels::Source, code: &[u8]) -> Result<(), HipError> {
    let missing: Vec<&str> = source
        .kernels
        .iter()
        .copied()
        .filter(|kernel| {
            let descriptor = format!("{kernel}.kd\0");
            !code.windows(descriptor.len()).any(|w| w == descriptor.as_bytes())
        })
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(HipError::Unsupported(format!(
            "kernels/{}: compiled, but its code object defines no kernel named {} (declared in \
             memo_kernels::SOURCES): check the `extern \"C\"` and the spelling",
            source.name,
            missing.join(", ")
        )))
    }
}

#[cfg(test)]
mod tests {
    /// The backend may be opened on one thread and driven from another (the device is bound
    /// on every call); this fails to compile if a field stops being `Send`.
    #[test]
    fn the_backend_can_move_between_threads() {
        fn send<T: Send>() {}
        send::<crate::HipBackend>();
    }
}
