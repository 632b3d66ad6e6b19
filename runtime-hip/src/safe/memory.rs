//! [`DeviceBuffer`] (`hipMalloc`) and [`PinnedHostBuffer`] (`hipHostMalloc`).

use std::ffi::c_void;

use super::stream::Stream;
use super::Device;
use crate::error::{HipError, HIP_ERROR_OUT_OF_MEMORY};
use crate::result;
use crate::sys::hip::HOST_MALLOC_DEFAULT;

/// Device memory, freed on drop. Zero bytes allocate nothing (a null base).
pub struct DeviceBuffer {
    device: Device,
    ptr: *mut c_void,
    bytes: u64,
}

// Safety: a device address is valid from any thread of the process (see the module docs of
// `safe`); the buffer is only freed by its owner.
unsafe impl Send for DeviceBuffer {}

/// `true` when `error` is HIP's out-of-memory.
pub fn is_out_of_memory(error: &HipError) -> bool {
    matches!(error, HipError::Hip { code, .. } if *code == HIP_ERROR_OUT_OF_MEMORY)
}

impl DeviceBuffer {
    /// `hipMalloc(bytes)`.
    pub fn new(device: &Device, bytes: u64) -> Result<Self, HipError> {
        let size = usize::try_from(bytes)
            .map_err(|_| HipError::Unsupported(format!("{bytes} bytes do not fit this machine's address space")))?;
        let ptr = if size == 0 { std::ptr::null_mut() } else { result::memory::malloc(device.hip(), size)? };
        Ok(DeviceBuffer { device: device.clone(), ptr, bytes })
    }

    /// The base address.
    pub fn base(&self) -> u64 {
        self.ptr as u64
    }

    /// Bytes allocated.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Sets every byte to zero and waits for it (a memset on `stream`, then its synchronize).
    pub fn zero(&self, stream: &Stream) -> Result<(), HipError> {
        if self.ptr.is_null() {
            return Ok(());
        }
        // Safety: the whole allocation, which lives until the synchronize below returns.
        unsafe { result::memory::set_async(self.device.hip(), self.ptr, 0, self.bytes as usize, stream.raw())? };
        stream.synchronize()
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            // Safety: allocated by hipMalloc in `new`, freed once, here.
            if let Err(error) = unsafe { result::memory::free(self.device.hip(), self.ptr) } {
                self.device.defer(error);
            }
        }
    }
}

/// Page-locked host memory (not write-combined: the CPU reads swapped-out activations back at
/// full speed), freed on drop. Zero bytes allocate nothing.
pub struct PinnedHostBuffer {
    device: Device,
    ptr: *mut c_void,
    bytes: u64,
}

// Safety: as `DeviceBuffer`; host reads and writes go through `&self`/`&mut self` methods whose
// callers guarantee no stream is using the bytes.
unsafe impl Send for PinnedHostBuffer {}

impl PinnedHostBuffer {
    /// `hipHostMalloc(bytes, hipHostMallocDefault)`.
    pub fn new(device: &Device, bytes: u64) -> Result<Self, HipError> {
        let size = usize::try_from(bytes)
            .map_err(|_| HipError::Unsupported(format!("{bytes} bytes do not fit this machine's address space")))?;
        let ptr = if size == 0 {
            std::ptr::null_mut()
        } else {
            result::pinned::malloc(device.hip(), size, HOST_MALLOC_DEFAULT)?
        };
        Ok(PinnedHostBuffer { device: device.clone(), ptr, bytes })
    }

    /// The base address.
    pub fn base(&self) -> u64 {
        self.ptr as u64
    }

    /// Bytes allocated.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Sets every byte to zero.
    ///
    /// # Safety
    /// No stream may be reading or writing the buffer (call with every stream idle).
    pub unsafe fn zero(&mut self) {
        if !self.ptr.is_null() {
            // Safety: the whole allocation, host memory we own; no stream touches it (caller).
            unsafe { std::ptr::write_bytes(self.ptr.cast::<u8>(), 0, self.bytes as usize) };
        }
    }

    /// Copies `bytes` in at `offset`. `None` when out of range.
    ///
    /// # Safety
    /// No stream may be reading or writing these bytes (call with every stream idle).
    pub unsafe fn write(&mut self, offset: u64, bytes: &[u8]) -> Option<()> {
        let end = offset.checked_add(bytes.len() as u64)?;
        if end > self.bytes {
            return None;
        }
        if !bytes.is_empty() {
            // Safety: in range (checked), host memory we own; no stream touches it (caller).
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.cast::<u8>().add(offset as usize), bytes.len())
            };
        }
        Some(())
    }

    /// Copies `len` bytes out from `offset`. `None` when out of range.
    ///
    /// # Safety
    /// No stream may be writing these bytes (call with every stream idle).
    pub unsafe fn read(&self, offset: u64, len: u64) -> Option<Vec<u8>> {
        let end = offset.checked_add(len)?;
        if end > self.bytes {
            return None;
        }
        let mut out = vec![0u8; len as usize];
        if len > 0 {
            // Safety: in range (checked), host memory we own; no stream writes it (caller).
            unsafe {
                std::ptr::copy_nonoverlapping(self.ptr.cast::<u8>().add(offset as usize), out.as_mut_ptr(), out.len())
            };
        }
        Some(out)
    }
}

impl Drop for PinnedHostBuffer {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            // Safety: allocated by hipHostMalloc in `new`, freed once, here.
            if let Err(error) = unsafe { result::pinned::free(self.device.hip(), self.ptr) } {
                self.device.defer(error);
            }
        }
    }
}
