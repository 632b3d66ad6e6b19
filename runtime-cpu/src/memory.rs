//! The CPU backend's device arena and pinned host slab: two zeroed, 256-byte-aligned host
//! allocations, shared by the stream threads through raw pointers.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

use memo_plan_core::plan::Access;
use memo_runtime::{BackendError, KernelArg, Space, Span};

use crate::ops::ArgData;

/// Alignment of both allocations: the plan's (what GPU allocators give and its offsets assume).
const ALIGN: usize = memo_plan_core::bilevel::ALIGNMENT as usize;

/// One allocation.
struct Block {
    ptr: NonNull<u8>,
    len: usize,
}

impl Block {
    fn new(bytes: u64, what: &'static str) -> Result<Self, BackendError> {
        let len = usize::try_from(bytes).map_err(|_| BackendError::OutOfMemory { what, bytes })?;
        if len == 0 {
            return Ok(Block { ptr: NonNull::dangling(), len: 0 });
        }
        let layout = Layout::from_size_align(len, ALIGN).map_err(|_| BackendError::OutOfMemory { what, bytes })?;
        // Safety: the layout has a non-zero size (checked above).
        let ptr = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or(BackendError::OutOfMemory { what, bytes })?;
        Ok(Block { ptr, len })
    }

    /// Checks that `span` lies inside and returns its start and length.
    fn range(&self, span: Span) -> Result<(usize, usize), BackendError> {
        let end = span.offset.checked_add(span.len);
        match end {
            Some(end) if end <= self.len as u64 => Ok((span.offset as usize, span.len as usize)),
            _ => Err(BackendError::OutOfBounds { span, size: self.len as u64 }),
        }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if self.len > 0 {
            // Safety: allocated in `new` with exactly this layout (it was valid then).
            unsafe { dealloc(self.ptr.as_ptr(), Layout::from_size_align_unchecked(self.len, ALIGN)) };
        }
    }
}

/// The arena and the host slab.
pub struct Memory {
    arena: Block,
    host: Block,
}

// Safety: the blocks are plain bytes owned by `Memory`; the stream threads access them
// concurrently only through `copy` and `views`, called for the backend's unsafe `launch` and
// `copy`, whose contract orders every conflicting access of two streams (see the module docs of
// `backend`); every in-call overlap with a write is refused before slices are made.
unsafe impl Send for Memory {}
// Safety: as above.
unsafe impl Sync for Memory {}

impl Memory {
    pub fn new(arena_bytes: u64, host_bytes: u64) -> Result<Self, BackendError> {
        Ok(Memory {
            arena: Block::new(arena_bytes, "device arena")?,
            host: Block::new(host_bytes, "pinned host slab")?,
        })
    }

    pub fn arena_bytes(&self) -> u64 {
        self.arena.len as u64
    }

    pub fn host_bytes(&self) -> u64 {
        self.host.len as u64
    }

    fn block(&self, space: Space) -> &Block {
        match space {
            Space::Device => &self.arena,
            Space::Host => &self.host,
        }
    }

    /// Copies `bytes` into `span` (every stream idle).
    pub fn write(&self, span: Span, bytes: &[u8]) -> Result<(), BackendError> {
        let block = self.block(span.space);
        let (start, len) = block.range(span)?;
        if len != bytes.len() {
            return Err(BackendError::Other(format!("upload of {} bytes into a span of {len}", bytes.len())));
        }
        // Safety: in bounds (checked); no stream runs (the caller synchronised), so nothing else
        // touches these bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), block.ptr.as_ptr().add(start), len) };
        Ok(())
    }

    /// Reads `span` (every stream idle).
    pub fn read(&self, span: Span) -> Result<Vec<u8>, BackendError> {
        let block = self.block(span.space);
        let (start, len) = block.range(span)?;
        let mut out = vec![0u8; len];
        // Safety: in bounds (checked); no stream runs, so nothing writes these bytes now.
        unsafe { std::ptr::copy_nonoverlapping(block.ptr.as_ptr().add(start), out.as_mut_ptr(), len) };
        Ok(out)
    }

    /// Copies `src` to `dst` on a stream thread.
    pub fn copy(&self, src: Span, dst: Span) -> Result<(), String> {
        if src.len != dst.len {
            return Err(format!("copy of {} bytes into {} bytes", src.len, dst.len));
        }
        let (from, len) = self.block(src.space).range(src).map_err(|e| e.to_string())?;
        let (to, _) = self.block(dst.space).range(dst).map_err(|e| e.to_string())?;
        if src.space == dst.space && from < to + len && to < from + len && len > 0 {
            return Err("copy between overlapping bytes".to_string());
        }
        // Safety: both ranges are in bounds and do not overlap (checked); the contract of the
        // unsafe `Backend::copy` this serves orders every other stream's access to them against it.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.block(src.space).ptr.as_ptr().add(from),
                self.block(dst.space).ptr.as_ptr().add(to),
                len,
            )
        };
        Ok(())
    }

    /// Slices for a launch's arguments, in order. The caller has refused arguments that overlap
    /// with a write.
    pub fn views(&self, args: &[KernelArg]) -> Result<Vec<View<'_>>, String> {
        args.iter()
            .map(|a| {
                let (start, len) = self.block(a.span.space).range(a.span).map_err(|e| e.to_string())?;
                // Safety: in bounds (checked); written arguments overlap no other argument of this
                // launch (checked by the caller), and the contract of the unsafe
                // `Backend::launch` this serves orders every access of other streams to these
                // bytes against it.
                let ptr = unsafe { self.block(a.span.space).ptr.as_ptr().add(start) };
                Ok(View(Some(match a.access {
                    // Safety: as above; the slice lives no longer than the launch.
                    Access::Read => ArgData::Read(unsafe { std::slice::from_raw_parts(ptr, len) }),
                    Access::Write | Access::ReadWrite => {
                        // Safety: as above; no other slice of this launch overlaps it.
                        ArgData::Write(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
                    }
                })))
            })
            .collect()
    }
}

/// One argument's bytes, taken once.
pub struct View<'a>(Option<ArgData<'a>>);

impl<'a> View<'a> {
    pub fn take(&mut self) -> ArgData<'a> {
        self.0.take().unwrap_or(ArgData::Read(&[]))
    }
}
