//! [`Stream`] and [`Event`].

use super::Device;
use crate::error::HipError;
use crate::result;
use crate::sys::{HipEvent, HipStream};

/// A non-blocking stream, destroyed on drop.
pub struct Stream {
    device: Device,
    raw: HipStream,
}

// Safety: stream handles are process-wide (see the module docs of `safe`).
unsafe impl Send for Stream {}

impl Stream {
    /// `hipStreamCreateWithFlags(hipStreamNonBlocking)`.
    pub fn new(device: &Device) -> Result<Self, HipError> {
        Ok(Stream { device: device.clone(), raw: result::stream::create(device.hip())? })
    }

    /// The handle.
    pub fn raw(&self) -> HipStream {
        self.raw
    }

    /// Waits until everything enqueued so far has run.
    pub fn synchronize(&self) -> Result<(), HipError> {
        // Safety: live stream.
        unsafe { result::stream::synchronize(self.device.hip(), self.raw) }
    }

    /// Makes later work on this stream wait for `event`'s last recording.
    pub fn wait(&self, event: &Event) -> Result<(), HipError> {
        // Safety: both live.
        unsafe { result::stream::wait_event(self.device.hip(), self.raw, event.raw) }
    }

    /// Records `event` here.
    pub fn record(&self, event: &Event) -> Result<(), HipError> {
        // Safety: both live.
        unsafe { result::event::record(self.device.hip(), event.raw, self.raw) }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // Safety: created in `new`, destroyed once, here.
        if let Err(error) = unsafe { result::stream::destroy(self.device.hip(), self.raw) } {
            self.device.defer(error);
        }
    }
}

/// An event without timing, destroyed on drop.
pub struct Event {
    device: Device,
    raw: HipEvent,
}

// Safety: event handles are process-wide (see the module docs of `safe`).
unsafe impl Send for Event {}

impl Event {
    /// `hipEventCreateWithFlags(hipEventDisableTiming)`.
    pub fn new(device: &Device) -> Result<Self, HipError> {
        Ok(Event { device: device.clone(), raw: result::event::create(device.hip())? })
    }

    /// An event that can be timed (`hipEventDefault`).
    pub fn timed(device: &Device) -> Result<Self, HipError> {
        Ok(Event {
            device: device.clone(),
            raw: result::event::create_with_flags(device.hip(), crate::sys::hip::EVENT_DEFAULT)?,
        })
    }

    /// Milliseconds from this event's last recording to `later`'s (both timed, both done).
    pub fn elapsed_ms(&self, later: &Event) -> Result<f32, HipError> {
        // Safety: both live; the caller waited for their recordings (an unfinished or untimed
        // event is an error HIP reports, not undefined behaviour).
        unsafe { result::event::elapsed_ms(self.device.hip(), self.raw, later.raw) }
    }

    /// Waits on the host until the last recording has run.
    pub fn synchronize(&self) -> Result<(), HipError> {
        // Safety: live event.
        unsafe { result::event::synchronize(self.device.hip(), self.raw) }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // Safety: created in `new`, destroyed once, here.
        if let Err(error) = unsafe { result::event::destroy(self.device.hip(), self.raw) } {
            self.device.defer(error);
        }
    }
}
