//! The record/replay allocator: MEMO's way of replacing a framework's caching allocator with
//! planned addresses (`spec/c-api.md`, "The record/replay allocator").
//!
//! - **Record**: every request is forwarded to the device allocator and logged; each
//!   [`RecordReplayAllocator::end_iteration`] closes one iteration's trace (MEMO's text form).
//! - **Plan**: one iteration's trace is placed by the solver ([`ReplayPlan`]): buffers freed within
//!   the iteration get arena offsets; buffers it never frees get device slots.
//! - **Replay**: one arena of the planned size; the k-th request of an iteration gets arena + the
//!   k-th planned offset when its size matches and the planned bytes are free. Anything else falls
//!   back to the device allocator and is counted: a divergent request can cost memory, never
//!   correctness, because the allocator checks the planned range against the live arena buffers
//!   before handing it out.
//!
//! Frees are told apart by address in every mode: inside the arena they end a replayed buffer,
//! anywhere else they go back to the device allocator. The device allocator is a trait
//! ([`DeviceAllocator`]), so these rules are tested on the host with a fake one; `cuda` loads
//! the CUDA runtime at run time, `host` uses the process heap.
//!
//! Plans are bi-level when the framework marks repeated blocks (one layer's forward, one layer's
//! backward) with [`RecordReplayAllocator::block_begin`] / [`RecordReplayAllocator::block_end`]
//! while recording ([`blocks`]): each distinct block is placed once, and the iteration with each
//! block instance as one request. Without markers the iteration is placed as one instance, which
//! the solver handles up to a few thousand buffers. Repeated blocks are not detected unmarked.

pub mod blocks;
pub mod cuda;
pub mod ffi;
pub mod host;
pub mod plan;
mod record;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::PathBuf;

use memo_place::SolveOptions;

pub use plan::{ReplayPlan, Slot};
use record::Recorder;

use crate::status::{CapiError, MemoStatus};

/// Why the device allocator failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceError {
    /// What failed, with the library's own words where it has some.
    pub message: String,
}

impl DeviceError {
    /// An error with this message.
    pub fn new(message: impl Into<String>) -> Self {
        DeviceError { message: message.into() }
    }
}

/// The device memory calls the allocator needs. Addresses are plain numbers here: only the
/// implementation turns them into pointers.
pub trait DeviceAllocator {
    /// Allocates `size` bytes on `device` for use on `stream`; returns a non-zero address aligned
    /// to at least 256 bytes.
    fn allocate(&mut self, size: usize, device: i32, stream: usize) -> Result<usize, DeviceError>;
    /// Frees what [`allocate`](DeviceAllocator::allocate) returned at `address`.
    fn free(&mut self, address: usize, size: usize, device: i32, stream: usize) -> Result<(), DeviceError>;
}

impl<D: DeviceAllocator + ?Sized> DeviceAllocator for Box<D> {
    fn allocate(&mut self, size: usize, device: i32, stream: usize) -> Result<usize, DeviceError> {
        (**self).allocate(size, device, stream)
    }
    fn free(&mut self, address: usize, size: usize, device: i32, stream: usize) -> Result<(), DeviceError> {
        (**self).free(address, size, device, stream)
    }
}

/// What the allocator does with requests.
#[repr(u32)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Forward to the device allocator, record nothing (the initial mode).
    #[default]
    Passthrough = 0,
    /// Forward to the device allocator and record each iteration's trace.
    Record = 1,
    /// Hand out planned arena addresses.
    Replay = 2,
}

/// Why a request in replay did not get its planned address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallback {
    /// Its size differs from the planned request's at the same position.
    SizeMismatch,
    /// The iteration has more requests than the plan.
    BeyondPlan,
    /// Its planned bytes are still held by a live replayed buffer (the frees came in another order
    /// than recorded, or a buffer outlived its iteration).
    Overlap,
    /// It is for another device than the arena's.
    OtherDevice,
}

/// Counters since the allocator was made or its statistics were last reset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// `end_iteration` calls.
    pub iterations: u64,
    /// Allocation requests (all sizes, all modes).
    pub requests: u64,
    /// Requests given their planned arena address, and their bytes.
    pub replayed: u64,
    /// Bytes of the replayed requests.
    pub replayed_bytes: u64,
    /// Requests given device memory because the plan says so (never freed in the recorded
    /// iteration), and their bytes.
    pub unplanned: u64,
    /// Bytes of the unplanned requests.
    pub unplanned_bytes: u64,
    /// Requests in replay that fell back to the device allocator, all reasons.
    pub fallbacks: u64,
    /// Bytes of the fallbacks.
    pub fallback_bytes: u64,
    /// Fallbacks because the size differs from the plan's.
    pub fallback_size_mismatch: u64,
    /// Fallbacks because the iteration ran past the plan.
    pub fallback_beyond_plan: u64,
    /// Fallbacks because the planned bytes were still in use.
    pub fallback_overlap: u64,
    /// Fallbacks because the request is for another device.
    pub fallback_other_device: u64,
    /// Frees of addresses the allocator did not hand out (or freed twice): refused.
    pub unknown_frees: u64,
    /// Device allocator failures.
    pub device_errors: u64,
    /// The most device bytes held at once (arena included).
    pub device_bytes_peak: u64,
    /// The most requested bytes live at once.
    pub requested_bytes_peak: u64,
}

/// The arena of replay mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arena {
    /// Its address.
    pub base: usize,
    /// Its size in bytes.
    pub bytes: u64,
    /// The device it is on.
    pub device: i32,
}

impl Arena {
    fn offset_of(&self, address: usize) -> Option<u64> {
        let offset = (address.checked_sub(self.base)?) as u64;
        (offset < self.bytes).then_some(offset)
    }
}

/// A replayed buffer: its end offset (start + footprint) and requested size.
#[derive(Clone, Copy, Debug)]
struct Replayed {
    end: u64,
    size: u64,
}

/// A device allocation made for a request (not the arena).
#[derive(Clone, Copy, Debug)]
struct DeviceAllocation {
    size: usize,
    device: i32,
}

/// The record/replay allocator over a device allocator `D`. Not synchronised: the C ABI keeps one
/// behind a mutex.
pub struct RecordReplayAllocator<D> {
    device: D,
    mode: Mode,
    recorder: Recorder,
    plan: Option<ReplayPlan>,
    arena: Option<Arena>,
    /// The device replay serves (requests for others fall back without taking a position).
    replay_device: i32,
    /// The position of the next request of the current iteration, in replay.
    cursor: usize,
    /// Live replayed buffers by start offset; their ranges never overlap.
    replayed_live: BTreeMap<u64, Replayed>,
    /// Live device allocations made for requests, by address.
    device_live: BTreeMap<usize, DeviceAllocation>,
    device_bytes_live: u64,
    requested_bytes_live: u64,
    counters: Counters,
}

impl<D: DeviceAllocator> RecordReplayAllocator<D> {
    /// An allocator in passthrough mode, with no plan and no arena.
    pub fn new(device: D) -> Self {
        RecordReplayAllocator {
            device,
            mode: Mode::Passthrough,
            recorder: Recorder::default(),
            plan: None,
            arena: None,
            replay_device: 0,
            cursor: 0,
            replayed_live: BTreeMap::new(),
            device_live: BTreeMap::new(),
            device_bytes_live: 0,
            requested_bytes_live: 0,
            counters: Counters::default(),
        }
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The plan, if one was made.
    pub fn plan(&self) -> Option<&ReplayPlan> {
        self.plan.as_ref()
    }

    /// The arena, if replay allocated one.
    pub fn arena(&self) -> Option<Arena> {
        self.arena
    }

    /// The counters.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Device bytes held now (arena included).
    pub fn device_bytes_live(&self) -> u64 {
        self.device_bytes_live
    }

    /// Requested bytes live now.
    pub fn requested_bytes_live(&self) -> u64 {
        self.requested_bytes_live
    }

    /// Iterations recorded since recording began.
    pub fn recorded_iterations(&self) -> u64 {
        self.recorder.finished_iterations()
    }

    /// The trace of the last recorded iteration, in MEMO's text form.
    pub fn last_trace(&self) -> Option<&str> {
        self.recorder.last_trace.as_deref()
    }

    /// Whether nothing is allocated through this allocator (no request live, no arena).
    pub fn is_idle(&self) -> bool {
        self.device_live.is_empty() && self.replayed_live.is_empty() && self.arena.is_none()
    }

    /// Zeroes the counters; peaks restart from what is live now.
    pub fn reset_counters(&mut self) {
        self.counters = Counters {
            device_bytes_peak: self.device_bytes_live,
            requested_bytes_peak: self.requested_bytes_live,
            ..Counters::default()
        };
    }

    /// Starts recording at iteration 0, writing each iteration's trace into `trace_dir` (made if
    /// missing) when given. Earlier recordings are dropped; live buffers stay valid and their
    /// frees are recorded as frees of earlier buffers.
    pub fn record(&mut self, trace_dir: Option<PathBuf>) -> Result<(), CapiError> {
        if let Some(dir) = &trace_dir {
            std::fs::create_dir_all(dir).map_err(|e| {
                CapiError::new(MemoStatus::Io, format!("cannot make the trace directory {}: {e}", dir.display()))
            })?;
        }
        self.recorder = Recorder::new(trace_dir);
        self.mode = Mode::Record;
        Ok(())
    }

    /// Opens an instance of the repeated block `key` (one layer's forward, say): in record mode a
    /// marker in the trace, so the plan places the block's own buffers once per distinct block
    /// ([`blocks`]). In other modes it does nothing, so training code can mark blocks always.
    /// Refused (`InvalidState`) while recording with a block open: blocks do not nest.
    pub fn block_begin(&mut self, key: i64) -> Result<(), CapiError> {
        if self.mode != Mode::Record {
            return Ok(());
        }
        self.recorder.block_begin(key)
    }

    /// Closes the block opened by [`block_begin`](Self::block_begin); refused while recording with
    /// no block open; nothing in other modes. A block still open when the iteration ends is
    /// closed there.
    pub fn block_end(&mut self) -> Result<(), CapiError> {
        if self.mode != Mode::Record {
            return Ok(());
        }
        self.recorder.block_end()
    }

    /// Marks the end of an iteration: closes the recorded trace in record mode, restarts the
    /// request count in replay mode.
    pub fn end_iteration(&mut self) -> Result<(), CapiError> {
        self.counters.iterations += 1;
        self.cursor = 0;
        if self.mode == Mode::Record {
            self.recorder.end_iteration()?;
        }
        Ok(())
    }

    /// Plans the last recorded iteration.
    pub fn plan_recorded(&mut self, options: &SolveOptions) -> Result<&ReplayPlan, CapiError> {
        let Some(text) = self.recorder.last_trace.as_deref() else {
            return Err(CapiError::new(
                MemoStatus::InvalidState,
                "no iteration has been recorded yet: start recording, run an iteration, mark its end, then plan",
            ));
        };
        let plan = ReplayPlan::from_text(text.as_bytes(), options)?;
        Ok(self.plan.insert(plan))
    }

    /// Plans a trace given as text (MEMO's form, one iteration), for example one recorded by an
    /// earlier process.
    pub fn plan_text(&mut self, text: &[u8], options: &SolveOptions) -> Result<&ReplayPlan, CapiError> {
        let plan = ReplayPlan::from_text(text, options)?;
        Ok(self.plan.insert(plan))
    }

    /// Switches to replay on `device`: allocates the planned arena (or keeps the current one if it
    /// is large enough and no replayed buffer is live). The next request is the first of an
    /// iteration.
    pub fn replay(&mut self, device: i32) -> Result<(), CapiError> {
        let Some(plan) = &self.plan else {
            return Err(CapiError::new(MemoStatus::InvalidState, "no plan to replay: plan a recorded iteration first"));
        };
        let needed = plan.arena_bytes;
        let reusable = self.arena.is_some_and(|a| a.bytes >= needed && a.device == device);
        if !reusable {
            self.release_arena()?;
            if needed > 0 {
                let bytes = usize::try_from(needed).map_err(|_| {
                    CapiError::new(
                        MemoStatus::TooLarge,
                        format!("the planned arena of {needed} bytes exceeds the address space"),
                    )
                })?;
                let base = self.device.allocate(bytes, device, 0).map_err(|e| {
                    self.counters.device_errors += 1;
                    CapiError::new(
                        MemoStatus::Device,
                        format!("cannot allocate the arena of {needed} bytes: {}", e.message),
                    )
                })?;
                self.arena = Some(Arena { base, bytes: needed, device });
                self.add_device_bytes(needed);
            }
        }
        self.replay_device = device;
        self.cursor = 0;
        self.mode = Mode::Replay;
        Ok(())
    }

    /// Switches to passthrough. The arena stays until [`release_arena`](Self::release_arena).
    pub fn passthrough(&mut self) {
        self.mode = Mode::Passthrough;
    }

    /// Gives the arena back to the device allocator; refused while a replayed buffer is live.
    pub fn release_arena(&mut self) -> Result<(), CapiError> {
        let Some(arena) = self.arena else { return Ok(()) };
        if !self.replayed_live.is_empty() {
            return Err(CapiError::new(
                MemoStatus::InvalidState,
                format!(
                    "{} replayed buffers are still live in the arena: free them before the arena is released or replaced",
                    self.replayed_live.len()
                ),
            ));
        }
        let bytes = usize::try_from(arena.bytes).unwrap_or(usize::MAX);
        self.device.free(arena.base, bytes, arena.device, 0).map_err(|e| {
            self.counters.device_errors += 1;
            CapiError::new(MemoStatus::Device, format!("cannot free the arena: {}", e.message))
        })?;
        self.arena = None;
        self.device_bytes_live -= arena.bytes;
        if self.mode == Mode::Replay {
            self.mode = Mode::Passthrough;
        }
        Ok(())
    }

    fn add_device_bytes(&mut self, bytes: u64) {
        self.device_bytes_live += bytes;
        self.counters.device_bytes_peak = self.counters.device_bytes_peak.max(self.device_bytes_live);
    }

    fn add_requested_bytes(&mut self, bytes: u64) {
        self.requested_bytes_live += bytes;
        self.counters.requested_bytes_peak = self.counters.requested_bytes_peak.max(self.requested_bytes_live);
    }

    /// A request served by the device allocator.
    fn allocate_from_device(&mut self, size: usize, device: i32, stream: usize) -> Result<usize, CapiError> {
        let address = self.device.allocate(size, device, stream).map_err(|e| {
            self.counters.device_errors += 1;
            CapiError::new(
                MemoStatus::Device,
                format!("device allocation of {size} bytes on device {device} failed: {}", e.message),
            )
        })?;
        self.device_live.insert(address, DeviceAllocation { size, device });
        self.add_device_bytes(size as u64);
        self.add_requested_bytes(size as u64);
        Ok(address)
    }

    /// Serves an allocation request of `size` bytes on `device` for `stream`; address 0 for size 0.
    pub fn allocate(&mut self, size: usize, device: i32, stream: usize) -> Result<usize, CapiError> {
        self.counters.requests += 1;
        // A zero-size request gets NULL (address 0), as from PyTorch's own caching allocator: no
        // memory, nothing to record or plan, and freeing it does nothing.
        if size == 0 {
            return Ok(0);
        }
        match self.mode {
            Mode::Passthrough => self.allocate_from_device(size, device, stream),
            Mode::Record => {
                let address = self.allocate_from_device(size, device, stream)?;
                if self.recorder.records_device(device) {
                    self.recorder.malloc(address, size as u64);
                }
                Ok(address)
            }
            Mode::Replay => self.replay_allocate(size, device, stream),
        }
    }

    fn fall_back(&mut self, reason: Fallback, size: usize, device: i32, stream: usize) -> Result<usize, CapiError> {
        let counters = &mut self.counters;
        counters.fallbacks += 1;
        counters.fallback_bytes += size as u64;
        match reason {
            Fallback::SizeMismatch => counters.fallback_size_mismatch += 1,
            Fallback::BeyondPlan => counters.fallback_beyond_plan += 1,
            Fallback::Overlap => counters.fallback_overlap += 1,
            Fallback::OtherDevice => counters.fallback_other_device += 1,
        }
        self.allocate_from_device(size, device, stream)
    }

    fn replay_allocate(&mut self, size: usize, device: i32, stream: usize) -> Result<usize, CapiError> {
        let Some(plan) = &self.plan else {
            return self.fall_back(Fallback::BeyondPlan, size, device, stream);
        };
        let arena = self.arena;
        // Requests of other devices were not recorded: they do not take a position.
        if device != self.replay_device {
            return self.fall_back(Fallback::OtherDevice, size, device, stream);
        }
        let position = self.cursor;
        self.cursor += 1;
        let size_bytes = size as u64;
        let slot = plan.slots.get(position).copied();
        let footprint = plan.footprint(size_bytes);
        match slot {
            None => self.fall_back(Fallback::BeyondPlan, size, device, stream),
            Some(slot) if slot.size() != size_bytes => self.fall_back(Fallback::SizeMismatch, size, device, stream),
            Some(Slot::Device { .. }) => {
                self.counters.unplanned += 1;
                self.counters.unplanned_bytes += size_bytes;
                self.allocate_from_device(size, device, stream)
            }
            Some(Slot::Arena { offset, .. }) => {
                let end = offset.saturating_add(footprint);
                // An arena exists whenever an arena slot does (its size is the planned peak).
                let Some(arena) = arena.filter(|a| end <= a.bytes) else {
                    return self.fall_back(Fallback::BeyondPlan, size, device, stream);
                };
                if !self.arena_range_free(offset, end) {
                    return self.fall_back(Fallback::Overlap, size, device, stream);
                }
                self.replayed_live.insert(offset, Replayed { end, size: size_bytes });
                self.counters.replayed += 1;
                self.counters.replayed_bytes += size_bytes;
                self.add_requested_bytes(size_bytes);
                Ok(arena.base + offset as usize)
            }
        }
    }

    /// Whether no live replayed buffer shares a byte with `[start, end)`. Live ranges never
    /// overlap, so only the live range that starts last before `end` can reach into it.
    fn arena_range_free(&self, start: u64, end: u64) -> bool {
        self.replayed_live.range(..end).next_back().is_none_or(|(_, live)| live.end <= start)
    }

    /// Frees what [`allocate`](Self::allocate) returned at `address` (`size` is the caller's word
    /// for its size; the allocator's own record is used). Freeing address 0 does nothing.
    pub fn free(&mut self, address: usize, size: usize, stream: usize) -> Result<(), CapiError> {
        if address == 0 {
            return Ok(());
        }
        self.recorder.free(address, size as u64, self.mode == Mode::Record);
        if let Some(offset) = self.arena.and_then(|a| a.offset_of(address)) {
            let Some(replayed) = self.replayed_live.remove(&offset) else {
                self.counters.unknown_frees += 1;
                return Err(CapiError::new(
                    MemoStatus::InvalidArgument,
                    format!("free of {address:#x}: inside the arena at offset {offset}, but no live replayed buffer starts there (freed twice?)"),
                ));
            };
            self.requested_bytes_live -= replayed.size;
            return Ok(());
        }
        let Some(allocation) = self.device_live.remove(&address) else {
            self.counters.unknown_frees += 1;
            return Err(CapiError::new(
                MemoStatus::InvalidArgument,
                format!("free of {address:#x}, which this allocator did not hand out or has freed already: ignored"),
            ));
        };
        self.device_bytes_live -= allocation.size as u64;
        self.requested_bytes_live -= allocation.size as u64;
        self.device.free(address, allocation.size, allocation.device, stream).map_err(|e| {
            self.counters.device_errors += 1;
            CapiError::new(MemoStatus::Device, format!("device free of {address:#x} failed: {}", e.message))
        })
    }
}
