//! Device memory: allocation, copies, memset.

use std::ffi::{c_int, c_void};

use super::check;
use crate::error::HipError;
use crate::sys::hip::HipFns;
use crate::sys::HipStream;

/// `hipMalloc`.
pub fn malloc(hip: &HipFns, bytes: usize) -> Result<*mut c_void, HipError> {
    let mut ptr = std::ptr::null_mut();
    // Safety: `ptr` is a valid out-pointer.
    check(hip, "hipMalloc", unsafe { (hip.hipMalloc)(&mut ptr, bytes) })?;
    Ok(ptr)
}

/// `hipFree`.
///
/// # Safety
/// `ptr` came from [`malloc`] and is not used afterwards.
pub unsafe fn free(hip: &HipFns, ptr: *mut c_void) -> Result<(), HipError> {
    // Safety: the caller's contract.
    check(hip, "hipFree", unsafe { (hip.hipFree)(ptr) })
}

/// `hipMemcpy` (synchronous), `kind` one of `sys::hip::MEMCPY_*`.
///
/// # Safety
/// `dst` and `src` are valid for `bytes` in the spaces `kind` says.
pub unsafe fn copy(
    hip: &HipFns,
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    kind: c_int,
) -> Result<(), HipError> {
    // Safety: the caller's contract.
    check(hip, "hipMemcpy", unsafe { (hip.hipMemcpy)(dst, src, bytes, kind) })
}

/// `hipMemcpyAsync` on `stream`.
///
/// # Safety
/// `dst` and `src` are valid for `bytes` until the copy completes on `stream`.
pub unsafe fn copy_async(
    hip: &HipFns,
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    kind: c_int,
    stream: HipStream,
) -> Result<(), HipError> {
    // Safety: the caller's contract.
    check(hip, "hipMemcpyAsync", unsafe { (hip.hipMemcpyAsync)(dst, src, bytes, kind, stream) })
}

/// `hipMemsetAsync` of `bytes` bytes to `value` on `stream`.
///
/// # Safety
/// `dst` is device memory valid for `bytes` until the memset completes on `stream`.
pub unsafe fn set_async(
    hip: &HipFns,
    dst: *mut c_void,
    value: u8,
    bytes: usize,
    stream: HipStream,
) -> Result<(), HipError> {
    // Safety: the caller's contract.
    check(hip, "hipMemsetAsync", unsafe { (hip.hipMemsetAsync)(dst, c_int::from(value), bytes, stream) })
}
