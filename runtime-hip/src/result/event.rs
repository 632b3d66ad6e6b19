//! Events.

use super::check;
use crate::error::HipError;
use crate::sys::hip::{HipFns, EVENT_DISABLE_TIMING};
use crate::sys::{HipEvent, HipStream};

/// `hipEventCreateWithFlags(hipEventDisableTiming)`.
pub fn create(hip: &HipFns) -> Result<HipEvent, HipError> {
    let mut event = std::ptr::null_mut();
    // Safety: `event` is a valid out-pointer.
    check(hip, "hipEventCreateWithFlags", unsafe { (hip.hipEventCreateWithFlags)(&mut event, EVENT_DISABLE_TIMING) })?;
    Ok(event)
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
