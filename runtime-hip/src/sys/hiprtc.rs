//! hiprtc, HIP's run-time compiler: its function table.
//!
//! ROCm 6 and later ship it as `libhiprtc.so`; ROCm 5.x exports the same functions from the HIP
//! runtime library itself, which is the fallback. Signatures from `hip/hiprtc.h`.

use std::ffi::{c_char, c_int};

use super::hip::{table, HipLib};
use super::{HiprtcProgram, LibrarySearch, Loaded};
use crate::error::HipError;

/// File names of hiprtc, newest first after the unversioned development link.
pub const NAMES: &[&str] = &["libhiprtc.so", "libhiprtc.so.7", "libhiprtc.so.6", "libhiprtc.so.5"];

/// `hiprtcResult`.
pub type HiprtcResult = c_int;

/// hiprtc's functions, resolved once.
#[derive(Clone, Copy)]
#[allow(missing_docs, non_snake_case)] // each field is the C function of the same name
pub struct HiprtcFns {
    pub hiprtcGetErrorString: unsafe extern "C" fn(HiprtcResult) -> *const c_char,
    pub hiprtcCreateProgram: unsafe extern "C" fn(
        *mut HiprtcProgram,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> HiprtcResult,
    pub hiprtcCompileProgram: unsafe extern "C" fn(HiprtcProgram, c_int, *const *const c_char) -> HiprtcResult,
    pub hiprtcGetProgramLogSize: unsafe extern "C" fn(HiprtcProgram, *mut usize) -> HiprtcResult,
    pub hiprtcGetProgramLog: unsafe extern "C" fn(HiprtcProgram, *mut c_char) -> HiprtcResult,
    pub hiprtcGetCodeSize: unsafe extern "C" fn(HiprtcProgram, *mut usize) -> HiprtcResult,
    pub hiprtcGetCode: unsafe extern "C" fn(HiprtcProgram, *mut c_char) -> HiprtcResult,
    pub hiprtcDestroyProgram: unsafe extern "C" fn(*mut HiprtcProgram) -> HiprtcResult,
}

/// The loaded hiprtc.
pub struct HiprtcLib {
    /// Where its functions come from (`libhiprtc.so*`, or the HIP runtime).
    pub origin: String,
    /// Its functions.
    pub fns: HiprtcFns,
}

impl HiprtcLib {
    /// Loads `libhiprtc` from `search`, or falls back to the HIP runtime `hip` when it exports
    /// hiprtc (ROCm 5.x).
    pub fn load(search: &LibrarySearch, hip: &HipLib) -> Result<HiprtcLib, HipError> {
        match super::load("libhiprtc", NAMES, search) {
            Ok(loaded) => Self::resolve(&loaded),
            Err(HipError::LibraryNotFound { library, mut tried }) => match Self::resolve(&hip.loaded) {
                Ok(lib) => Ok(lib),
                Err(_) => {
                    tried.push(format!("{} (the HIP runtime itself: it does not export hiprtc)", hip.loaded.origin));
                    Err(HipError::LibraryNotFound { library, tried })
                }
            },
            Err(other) => Err(other),
        }
    }

    fn resolve(loaded: &Loaded) -> Result<HiprtcLib, HipError> {
        let fns = table!(
            *loaded,
            HiprtcFns {
                hiprtcGetErrorString,
                hiprtcCreateProgram,
                hiprtcCompileProgram,
                hiprtcGetProgramLogSize,
                hiprtcGetProgramLog,
                hiprtcGetCodeSize,
                hiprtcGetCode,
                hiprtcDestroyProgram,
            }
        );
        Ok(HiprtcLib { origin: loaded.origin.clone(), fns })
    }
}
