//! Events.

use super::check;
use crate::error::HipError;
use crate::sys::hip::{HipFns, EVENT_DISABLE_TIMING};
use crate::sys::{HipEvent, HipStream};

/// `hipEventCreateWithFlags(hipEventDisableTiming)`: for ordering only.
pub fn create(hip: &HipFns) -> Result<HipEvent, HipError> {
    create_with_flags(hip, EVENT_DISABLE_TIMING)
}

/// `hipEventCreateWithFlags(flags)`.
pub fn create_with_flags(hip: &HipFns, flags: std::ffi::c_uint) -> Result<HipEvent, HipError> {
    let mut event = std::ptr::null_mut();
    // Safety: `event` is a valid out-pointer.
    check(hip, "hipEventCreateWithFlags", unsafe { (hip.hipEventCreateWithFlags)(&mut event, flags) })?;
    Ok(event)
}

/// `hipEventElapsedTime(start, stop)` in milliseconds.
///
/// # Safety
/// Both events are live, created with timing, and recorded.
pub unsafe fn elapsed_ms(hip: &HipFns, start: HipEvent, stop: HipEvent) -> Result<f32, HipError> {
    let mut ms = 0f32;
    // Safety: valid out-pointer; the caller's contract for the events.
    check(hip, "hipEventElapsedTime", unsafe { (hip.hipEventElapsedTime)(&mut ms, start, stop) })?;
    Ok(ms)
}

/// `hipEventRecord`.
///
/// # Safety
/// `event` and `stream` are live.
pub unsafe fn record(hip: &HipFns, event: HipEvent, stream: HipStream) -> Result<(), HipError> {
    // Safety: the caller's contract.
    check(hip, "hipEventRecord", unsafe { (hip.hipEventRecord)(event, stream) })
}

/// `hipEventSynchronize`.
///
/// # Safety
/// `event` is live.
pub unsafe fn synchronize(hip: &HipFns, event: HipEvent) -> Result<(), HipError> {
    // Safety: the caller's contract.
    check(hip, "hipEventSynchronize", unsafe { (hip.hipEventSynchronize)(event) })
}

/// `hipEventDestroy`.
///
/// # Safety
/// `event` came from [`create`] and is not used afterwards.
pub unsafe fn destroy(hip: &HipFns, event: HipEvent) -> Result<(), HipError> {
    // Safety: the caller's contract.
    check(hip, "hipEventDestroy", unsafe { (hip.hipEventDestroy)(event) })
}
