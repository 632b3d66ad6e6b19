//! The HIP runtime (`libamdhip64`): its function table and the constants used with it.
//!
//! Signatures are those of `hip/hip_runtime_api.h` (ROCm 5.x to 7.x; none of these changed).
//! `hipDeviceProp_t` is deliberately not used: its layout changed in ROCm 6.

use std::ffi::{c_char, c_int, c_uint, c_void};

use super::{HipErrorCode, HipEvent, HipFunction, HipModule, HipStream, LibrarySearch, Loaded};
use crate::error::HipError;

/// File names of the HIP runtime, newest ABI first after the unversioned development link.
pub const NAMES: &[&str] = &["libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5"];

/// `hipMemcpyHostToHost`.
pub const MEMCPY_HOST_TO_HOST: c_int = 0;
/// `hipMemcpyHostToDevice`.
pub const MEMCPY_HOST_TO_DEVICE: c_int = 1;
/// `hipMemcpyDeviceToHost`.
pub const MEMCPY_DEVICE_TO_HOST: c_int = 2;
/// `hipMemcpyDeviceToDevice`.
pub const MEMCPY_DEVICE_TO_DEVICE: c_int = 3;
/// `hipStreamNonBlocking`: the stream does not synchronise with the null stream.
pub const STREAM_NON_BLOCKING: c_uint = 0x1;
/// `hipEventDefault`: an event that can be timed (`hipEventElapsedTime`).
pub const EVENT_DEFAULT: c_uint = 0x0;
/// `hipEventDisableTiming`: plan events only order work, they are never timed.
pub const EVENT_DISABLE_TIMING: c_uint = 0x2;
/// `hipHostMallocDefault`: ordinary (not write-combined) pinned memory, which the CPU reads at
/// full speed: the host slab receives device-to-host swaps.
pub const HOST_MALLOC_DEFAULT: c_uint = 0x0;
/// `hipDeviceAttributeWarpSize` in the `hipDeviceAttribute_t` of ROCm 5.x-7.x's
/// `hip_runtime_api.h` (the CUDA-compatible block, alphabetical, from 0). Checked on use: a
/// value other than 32 or 64 means the enum moved and the backend refuses to guess.
pub const ATTRIBUTE_WARP_SIZE: c_int = 87;

/// The HIP runtime's functions, resolved once.
#[derive(Clone, Copy)]
#[allow(missing_docs, non_snake_case)] // each field is the C function of the same name
pub struct HipFns {
    pub hipInit: unsafe extern "C" fn(c_uint) -> HipErrorCode,
    pub hipGetErrorString: unsafe extern "C" fn(HipErrorCode) -> *const c_char,
    pub hipGetDeviceCount: unsafe extern "C" fn(*mut c_int) -> HipErrorCode,
    pub hipSetDevice: unsafe extern "C" fn(c_int) -> HipErrorCode,
    pub hipDeviceGetAttribute: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> HipErrorCode,
    pub hipDeviceGetName: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> HipErrorCode,
    pub hipDeviceSynchronize: unsafe extern "C" fn() -> HipErrorCode,
    pub hipMalloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> HipErrorCode,
    pub hipFree: unsafe extern "C" fn(*mut c_void) -> HipErrorCode,
    pub hipHostMalloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> HipErrorCode,
    pub hipHostFree: unsafe extern "C" fn(*mut c_void) -> HipErrorCode,
    pub hipMemcpy: unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int) -> HipErrorCode,
    pub hipMemcpyAsync: unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int, HipStream) -> HipErrorCode,
    pub hipMemsetAsync: unsafe extern "C" fn(*mut c_void, c_int, usize, HipStream) -> HipErrorCode,
    pub hipStreamCreateWithFlags: unsafe extern "C" fn(*mut HipStream, c_uint) -> HipErrorCode,
    pub hipStreamDestroy: unsafe extern "C" fn(HipStream) -> HipErrorCode,
    pub hipStreamSynchronize: unsafe extern "C" fn(HipStream) -> HipErrorCode,
    pub hipStreamWaitEvent: unsafe extern "C" fn(HipStream, HipEvent, c_uint) -> HipErrorCode,
    pub hipEventCreateWithFlags: unsafe extern "C" fn(*mut HipEvent, c_uint) -> HipErrorCode,
    pub hipEventRecord: unsafe extern "C" fn(HipEvent, HipStream) -> HipErrorCode,
    pub hipEventSynchronize: unsafe extern "C" fn(HipEvent) -> HipErrorCode,
    pub hipEventDestroy: unsafe extern "C" fn(HipEvent) -> HipErrorCode,
    pub hipEventElapsedTime: unsafe extern "C" fn(*mut f32, HipEvent, HipEvent) -> HipErrorCode,
    pub hipModuleLoadData: unsafe extern "C" fn(*mut HipModule, *const c_void) -> HipErrorCode,
    pub hipModuleGetFunction: unsafe extern "C" fn(*mut HipFunction, HipModule, *const c_char) -> HipErrorCode,
    #[allow(clippy::type_complexity)]
    pub hipModuleLaunchKernel: unsafe extern "C" fn(
        HipFunction,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        HipStream,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> HipErrorCode,
    pub hipModuleUnload: unsafe extern "C" fn(HipModule) -> HipErrorCode,
}

/// The loaded HIP runtime.
pub struct HipLib {
    /// Where it was loaded from.
    pub loaded: Loaded,
    /// Its functions.
    pub fns: HipFns,
}

macro_rules! table {
    ($loaded:expr, $ty:ident { $($field:ident),* $(,)? }) => {
        $ty {
            // Safety: each field's type is the C declaration of the symbol of the same name
            // (`hip_runtime_api.h`), written out in the struct above.
            $($field: unsafe { super::resolve(&$loaded, stringify!($field))? },)*
        }
    };
}
pub(crate) use table;

impl HipLib {
    /// Finds and loads the HIP runtime and resolves every function.
    pub fn load(search: &LibrarySearch) -> Result<HipLib, HipError> {
        let loaded = super::load("libamdhip64", NAMES, search)?;
        let fns = table!(
            loaded,
            HipFns {
                hipInit,
                hipGetErrorString,
                hipGetDeviceCount,
                hipSetDevice,
                hipDeviceGetAttribute,
                hipDeviceGetName,
                hipDeviceSynchronize,
                hipMalloc,
                hipFree,
                hipHostMalloc,
                hipHostFree,
                hipMemcpy,
                hipMemcpyAsync,
                hipMemsetAsync,
                hipStreamCreateWithFlags,
                hipStreamDestroy,
                hipStreamSynchronize,
                hipStreamWaitEvent,
                hipEventCreateWithFlags,
                hipEventRecord,
                hipEventSynchronize,
                hipEventDestroy,
                hipEventElapsedTime,
                hipModuleLoadData,
                hipModuleGetFunction,
                hipModuleLaunchKernel,
                hipModuleUnload,
            }
        );
        Ok(HipLib { loaded, fns })
    }
}
