//! Streams.

use super::check;
use crate::error::HipError;
use crate::sys::hip::{HipFns, STREAM_NON_BLOCKING};
use crate::sys::{HipEvent, HipStream};

/// `hipStreamCreateWithFlags(hipStreamNonBlocking)`.
pub fn create(hip: &HipFns) -> Result<HipStream, HipError> {
    let mut stream = std::ptr::null_mut();
    // Safety: `stream` is a valid out-pointer.
    check(hip, "hipStreamCreateWithFlags", unsafe {
        (hip.hipStreamCreateWithFlags)(&mut stream, STREAM_NON_BLOCKING)
    })?;
    Ok(stream)
}

/// `hipStreamDestroy`.
///
/// # Safety
/// `stream` came from [`create`] and is not used afterwards.
pub unsafe fn destroy(hip: &HipFns, stream: HipStream) -> Result<(), HipError> {
    // Safety: the caller's contract.
    check(hip, "hipStreamDestroy", unsafe { (hip.hipStreamDestroy)(stream) })
}

/// `hipStreamSynchronize`.
///
/// # Safety
/// `stream` is a live stream.
pub unsafe fn synchronize(hip: &HipFns, stream: HipStream) -> Result<(), HipError> {
    // Safety: the caller's contract.
    check(hip, "hipStreamSynchronize", unsafe { (hip.hipStreamSynchronize)(stream) })
}

/// `hipStreamWaitEvent(stream, event, 0)`.
///
/// # Safety
/// `stream` and `event` are live.
pub unsafe fn wait_event(hip: &HipFns, stream: HipStream, event: HipEvent) -> Result<(), HipError> {
    // Safety: the caller's contract.
    check(hip, "hipStreamWaitEvent", unsafe { (hip.hipStreamWaitEvent)(stream, event, 0) })
}
