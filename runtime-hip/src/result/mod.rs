//! The result layer: each HIP, hiprtc and hipBLAS call as a function returning
//! `Result<_, HipError>`, with the error code and the library's own text for it. One module per
//! API group. Functions that take device or host addresses are `unsafe`: the caller vouches
//! for the addresses (the safe layer does, from the allocations it owns).

pub mod device;
pub mod event;
pub mod hipblas;
pub mod hiprtc;
pub mod memory;
pub mod module;
pub mod pinned;
pub mod stream;

use std::ffi::CStr;

use crate::error::{HipError, HIP_ERROR_NO_DEVICE};
use crate::sys::hip::HipFns;
use crate::sys::HipErrorCode;

/// `hipGetErrorString(code)`.
pub fn error_string(hip: &HipFns, code: HipErrorCode) -> String {
    // Safety: hipGetErrorString takes any code and returns a static NUL-terminated string (or
    // null, handled).
    let text = unsafe { (hip.hipGetErrorString)(code) };
    if text.is_null() {
        return format!("unknown HIP error {code}");
    }
    // Safety: non-null, NUL-terminated, static (above).
    unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
}

/// `Ok` for `hipSuccess`, else the error of `call`.
pub fn check(hip: &HipFns, call: &'static str, code: HipErrorCode) -> Result<(), HipError> {
    match code {
        0 => Ok(()),
        HIP_ERROR_NO_DEVICE => Err(HipError::NoDevice { call, code, message: error_string(hip, code) }),
        _ => Err(HipError::Hip { call, code, message: error_string(hip, code) }),
    }
}
