//! Pinned (page-locked) host memory.

use std::ffi::{c_uint, c_void};

use super::check;
use crate::error::HipError;
use crate::sys::hip::HipFns;

/// `hipHostMalloc` with `flags` (`sys::hip::HOST_MALLOC_DEFAULT`).
pub fn malloc(hip: &HipFns, bytes: usize, flags: c_uint) -> Result<*mut c_void, HipError> {
    let mut ptr = std::ptr::null_mut();
    // Safety: `ptr` is a valid out-pointer.
    check(hip, "hipHostMalloc", unsafe { (hip.hipHostMalloc)(&mut ptr, bytes, flags) })?;
    Ok(ptr)
}

/// `hipHostFree`.
///
/// # Safety
/// `ptr` came from [`malloc`] and is not used afterwards.
pub unsafe fn free(hip: &HipFns, ptr: *mut c_void) -> Result<(), HipError> {
    // Safety: the caller's contract.
    check(hip, "hipHostFree", unsafe { (hip.hipHostFree)(ptr) })
}
