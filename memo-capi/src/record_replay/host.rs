//! A device allocator on the process heap: lets the whole record/plan/replay cycle, the C ABI
//! included, run and be tested on a machine without a GPU. Selected with
//! `memo_allocator_select_backend(MEMO_BACKEND_HOST)`.

use std::alloc::Layout;
use std::collections::BTreeMap;

use super::{DeviceAllocator, DeviceError};

/// The alignment of every host allocation: that of `cudaMalloc`'s and more (512, the block size
/// PyTorch's caching allocator rounds to).
pub const HOST_ALIGNMENT: usize = 512;

/// Heap memory, one allocation per request. Zero-size requests get one byte, so that every
/// allocation has its own address.
#[derive(Debug, Default)]
pub struct HostAllocator {
    /// Address -> the layout it was allocated with (needed to free it).
    live: BTreeMap<usize, Layout>,
}

impl HostAllocator {
    /// An allocator with nothing allocated.
    pub fn new() -> Self {
        HostAllocator::default()
    }
}

impl DeviceAllocator for HostAllocator {
    fn allocate(&mut self, size: usize, _device: i32, _stream: usize) -> Result<usize, DeviceError> {
        let layout = Layout::from_size_align(size.max(1), HOST_ALIGNMENT)
            .map_err(|_| DeviceError::new(format!("{size} bytes is more than the host can address")))?;
        // Safety: the layout's size is not zero (at least 1).
        let pointer = unsafe { std::alloc::alloc(layout) };
        if pointer.is_null() {
            return Err(DeviceError::new(format!("the host heap has no {size} bytes to give")));
        }
        let address = pointer.expose_provenance();
        self.live.insert(address, layout);
        Ok(address)
    }

    fn free(&mut self, address: usize, _size: usize, _device: i32, _stream: usize) -> Result<(), DeviceError> {
        let layout = self
            .live
            .remove(&address)
            .ok_or_else(|| DeviceError::new(format!("{address:#x} is not a live host allocation")))?;
        // Recover the pointer with its provenance: the heap exposes nothing else to rebuild it from.
        let pointer = std::ptr::with_exposed_provenance_mut::<u8>(address);
        // Safety: `address` came from `alloc` with `layout` (it was in `live`) and is freed once
        // (it was removed from `live`).
        unsafe { std::alloc::dealloc(pointer, layout) };
        Ok(())
    }
}

impl Drop for HostAllocator {
    fn drop(&mut self) {
        for (address, layout) in std::mem::take(&mut self.live) {
            // Safety: as in `free`: each live entry came from `alloc` with its layout.
            unsafe { std::alloc::dealloc(std::ptr::with_exposed_provenance_mut::<u8>(address), layout) };
        }
    }
}
