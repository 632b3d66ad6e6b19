//! The safe layer: RAII types over the result layer. Each owns one HIP object and releases it
//! on drop; an error while releasing is recorded on the [`Device`] and returned by its next
//! [`Device::bind`], never panicked.
//!
//! The types are `Send`: HIP handles and device addresses belong to the process, not to a
//! thread; what is per thread is the current device, which [`Device::bind`] sets before use.

pub mod blas;
pub mod memory;
pub mod module;
pub mod stream;

use std::sync::{Arc, Mutex};

use crate::error::HipError;
use crate::result;
use crate::sys::hip::{HipFns, HipLib, ATTRIBUTE_WARP_SIZE};
use crate::sys::LibrarySearch;

struct DeviceInner {
    hip: HipFns,
    origin: String,
    ordinal: i32,
    name: String,
    warp_size: i32,
    deferred: Mutex<Option<HipError>>,
}

/// One GPU of a loaded HIP runtime. Cheap to clone (shared).
#[derive(Clone)]
pub struct Device {
    inner: Arc<DeviceInner>,
}

impl Device {
    /// Loads the HIP runtime from `search` and opens GPU `ordinal`: the library first
    /// ([`HipError::LibraryNotFound`]), then the device count ([`HipError::NoDevice`]), then the
    /// ordinal ([`HipError::InvalidOrdinal`]).
    pub fn open(search: &LibrarySearch, ordinal: usize) -> Result<(Device, HipLib), HipError> {
        let lib = HipLib::load(search)?;
        let hip = lib.fns;
        // hipInit reports a missing device with its own code on some versions (101 on ROCm 5.2
        // without a GPU); the device count below says it plainly, so its result decides.
        let init = result::device::init(&hip);
        let count = result::device::count(&hip)?;
        init?;
        if ordinal >= count {
            return Err(HipError::InvalidOrdinal { ordinal, count });
        }
        let ordinal_c = i32::try_from(ordinal).map_err(|_| HipError::InvalidOrdinal { ordinal, count })?;
        result::device::set(&hip, ordinal_c)?;
        let name = result::device::name(&hip, ordinal_c)?;
        let warp_size = result::device::attribute(&hip, ATTRIBUTE_WARP_SIZE, ordinal_c)?;
        let device = Device {
            inner: Arc::new(DeviceInner {
                hip,
                origin: lib.loaded.origin.clone(),
                ordinal: ordinal_c,
                name,
                warp_size,
                deferred: Mutex::new(None),
            }),
        };
        Ok((device, lib))
    }

    /// The runtime's functions.
    pub fn hip(&self) -> &HipFns {
        &self.inner.hip
    }

    /// The GPU's ordinal.
    pub fn ordinal(&self) -> usize {
        self.inner.ordinal as usize
    }

    /// `hipDeviceGetName`.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The wavefront size the runtime reports (64 on CDNA, 32 on RDNA).
    pub fn warp_size(&self) -> i32 {
        self.inner.warp_size
    }

    /// The HIP runtime file in use.
    pub fn library(&self) -> &str {
        &self.inner.origin
    }

    /// Makes this GPU current on the calling thread and returns any error recorded while
    /// releasing an object since the last call.
    pub fn bind(&self) -> Result<(), HipError> {
        self.take_deferred()?;
        result::device::set(&self.inner.hip, self.inner.ordinal)
    }

    /// The first error recorded by a drop, if any (and forgets it).
    pub fn take_deferred(&self) -> Result<(), HipError> {
        let mut deferred = self.inner.deferred.lock().unwrap_or_else(|p| p.into_inner());
        match deferred.take() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// Records an error from a drop (the first one is kept).
    pub fn defer(&self, error: HipError) {
        let mut deferred = self.inner.deferred.lock().unwrap_or_else(|p| p.into_inner());
        deferred.get_or_insert(error);
    }

    /// `hipDeviceSynchronize`.
    pub fn synchronize(&self) -> Result<(), HipError> {
        result::device::synchronize(&self.inner.hip)
    }
}
