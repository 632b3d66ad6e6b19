//! The allocator half of the C ABI: one process-wide record/replay allocator behind a mutex, the
//! two functions PyTorch's `CUDAPluggableAllocator` loads (`memo_alloc`, `memo_free`), and the
//! calls that drive it (record, iteration end, plan, replay, statistics).

use std::ffi::{c_char, c_int, c_void};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, PoisonError};

use memo_place::{SolveOptions, DEFAULT_BUDGET_NODES};

use super::cuda::CudaAllocator;
use super::host::HostAllocator;
use super::plan::{replay_solve_options, MEMO_DEFAULT_REPLAY_ALIGNMENT};
use super::{DeviceAllocator, Mode, RecordReplayAllocator};
use crate::ffi_util::{str_arg, write_out};
use crate::placement::{MemoPlaceOptions, MEMO_NO_CAPACITY};
use crate::status::{guard, guard_value, CapiError, MemoStatus};

/// `memo_allocator_select_backend`: the CUDA runtime, loaded at run time (the default).
pub const MEMO_BACKEND_CUDA: u32 = 0;
/// `memo_allocator_select_backend`: the process heap, for running without a GPU.
pub const MEMO_BACKEND_HOST: u32 = 1;

/// `MemoAllocatorStats::mode`: requests go to the device allocator, nothing is recorded.
pub const MEMO_MODE_PASSTHROUGH: u32 = 0;
/// `MemoAllocatorStats::mode`: requests go to the device allocator and are recorded.
pub const MEMO_MODE_RECORD: u32 = 1;
/// `MemoAllocatorStats::mode`: requests get planned arena addresses.
pub const MEMO_MODE_REPLAY: u32 = 2;

/// The allocator's state and counters. Counters run since the first use or the last
/// `memo_allocator_reset_stats`; the rest describes the state now.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoAllocatorStats {
    /// `memo_iteration_end` calls.
    pub iterations: u64,
    /// Iterations recorded since the last `memo_allocator_record`.
    pub recorded_iterations: u64,
    /// Allocation requests, every mode and size.
    pub requests: u64,
    /// Requests given their planned arena address.
    pub replayed: u64,
    /// Bytes of those.
    pub replayed_bytes: u64,
    /// Requests given device memory because the plan says so (never freed in the recorded
    /// iteration, so they outlive it).
    pub unplanned: u64,
    /// Bytes of those.
    pub unplanned_bytes: u64,
    /// Replay requests that did not get their planned address and went to the device allocator.
    pub fallbacks: u64,
    /// Bytes of those.
    pub fallback_bytes: u64,
    /// Fallbacks whose size differed from the plan's at the same position.
    pub fallback_size_mismatch: u64,
    /// Fallbacks past the end of the plan (more requests than the recorded iteration).
    pub fallback_beyond_plan: u64,
    /// Fallbacks whose planned bytes were still held by a live buffer.
    pub fallback_overlap: u64,
    /// Fallbacks for a device other than the arena's.
    pub fallback_other_device: u64,
    /// Frees of pointers this allocator did not hand out, or freed twice: ignored.
    pub unknown_frees: u64,
    /// Failed device allocations and frees.
    pub device_errors: u64,
    /// The arena's size in bytes (0: none).
    pub arena_bytes: u64,
    /// The plan's arena size (its peak), 0 without a plan.
    pub plan_peak: u64,
    /// The plan's lower bound: the most bytes its arena buffers have alive at once.
    pub plan_lower_bound: u64,
    /// Device bytes held now: the arena and every device allocation made for a request.
    pub device_bytes_live: u64,
    /// The most device bytes held at once ("reserved").
    pub device_bytes_peak: u64,
    /// Bytes of the requests live now.
    pub requested_bytes_live: u64,
    /// The most requested bytes live at once ("allocated").
    pub requested_bytes_peak: u64,
    /// `MEMO_MODE_PASSTHROUGH`, `MEMO_MODE_RECORD` or `MEMO_MODE_REPLAY`.
    pub mode: u32,
    /// The arena's device, -1 without an arena.
    pub arena_device: i32,
    /// 1 when a plan exists, else 0.
    pub plan_ready: u32,
    /// 1 when the plan's peak is proven optimal, else 0.
    pub plan_optimal: u32,
    /// Block instances the plan placed bi-level (0: placed as one instance, no markers).
    pub plan_block_instances: u64,
    /// Distinct level-1 problems solved for them (blocks with equal requests share one).
    pub plan_level1_problems: u64,
}

/// The process-wide allocator; made on first use with the CUDA backend.
type Global = RecordReplayAllocator<Box<dyn DeviceAllocator + Send>>;

static ALLOCATOR: Mutex<Option<Global>> = Mutex::new(None);

/// Runs `f` on the allocator under its lock. A panic while it was held (a bug, caught at the
/// boundary) is ignored: refusing every later request would stop training, and each request's
/// bookkeeping is a few inserts and removes.
fn with_allocator<R>(f: impl FnOnce(&mut Global) -> Result<R, CapiError>) -> Result<R, CapiError> {
    let mut slot: MutexGuard<'_, Option<Global>> = ALLOCATOR.lock().unwrap_or_else(PoisonError::into_inner);
    let allocator = slot.get_or_insert_with(|| RecordReplayAllocator::new(Box::new(CudaAllocator::new())));
    f(allocator)
}

/// Allocates `size` bytes on `device` for `stream`, as PyTorch's `CUDAPluggableAllocator` calls
/// it: from the device allocator, or in replay from the planned place in the arena. Size 0 gets
/// NULL, as from PyTorch's own allocator, and is not a failure. Otherwise NULL means failure (the
/// last error, on this thread, says why): a negative size, no CUDA runtime, the device out of
/// memory. Pointers are aligned to at least 256 bytes.
#[no_mangle]
pub extern "C" fn memo_alloc(size: isize, device: c_int, stream: *mut c_void) -> *mut c_void {
    let address = guard_value("memo_alloc", 0, || {
        let size = usize::try_from(size)
            .map_err(|_| CapiError::new(MemoStatus::InvalidArgument, format!("size {size} is negative")))?;
        with_allocator(|allocator| allocator.allocate(size, device, stream.addr()))
    });
    std::ptr::with_exposed_provenance_mut(address)
}

/// Frees what `memo_alloc` returned, as PyTorch's `CUDAPluggableAllocator` calls it. NULL does
/// nothing. A pointer this allocator did not hand out (or freed already) is ignored, counted in
/// `unknown_frees` and described by the last error on this thread.
#[no_mangle]
pub extern "C" fn memo_free(ptr: *mut c_void, size: isize, device: c_int, stream: *mut c_void) {
    // The allocator knows each pointer's device from its allocation.
    let _ = device;
    guard("memo_free", || with_allocator(|allocator| allocator.free(ptr.addr(), size.max(0) as usize, stream.addr())));
}

/// Marks the end of a training iteration: in record mode, closes its trace (and writes it, if
/// recording into a directory: `MEMO_STATUS_IO` if that fails; the trace is still kept); in
/// replay mode, the next request is the first of the plan again.
#[no_mangle]
pub extern "C" fn memo_iteration_end() -> MemoStatus {
    guard("memo_iteration_end", || with_allocator(|allocator| allocator.end_iteration()))
}

/// Opens an instance of the repeated block `key` (for example key 0 around each layer's forward,
/// key 1 around each layer's backward). While recording, it marks the trace
/// (`# memo-block begin <key>`); the plan then places each distinct block's own buffers (those
/// allocated and freed inside it) once, and the iteration with each block instance as one request
/// of that block's peak (bi-level, `spec/c-api.md`). In other modes it does nothing, so training
/// code may mark blocks in every iteration. `MEMO_STATUS_INVALID_STATE` while recording with a
/// block open: blocks do not nest.
#[no_mangle]
pub extern "C" fn memo_block_begin(key: i64) -> MemoStatus {
    guard("memo_block_begin", || with_allocator(|allocator| allocator.block_begin(key)))
}

/// Closes the block opened by `memo_block_begin`. `MEMO_STATUS_INVALID_STATE` while recording
/// with no block open; nothing in other modes. A block still open when the iteration ends is
/// closed there.
#[no_mangle]
pub extern "C" fn memo_block_end() -> MemoStatus {
    guard("memo_block_end", || with_allocator(|allocator| allocator.block_end()))
}

/// Chooses the device allocator: `MEMO_BACKEND_CUDA` (the default) or `MEMO_BACKEND_HOST`.
/// Starts a fresh allocator (passthrough, no plan, counters zero); refused with
/// `MEMO_STATUS_INVALID_STATE` while anything is allocated through the current one.
#[no_mangle]
pub extern "C" fn memo_allocator_select_backend(backend: u32) -> MemoStatus {
    guard("memo_allocator_select_backend", || {
        let device: Box<dyn DeviceAllocator + Send> = match backend {
            MEMO_BACKEND_CUDA => Box::new(CudaAllocator::new()),
            MEMO_BACKEND_HOST => Box::new(HostAllocator::new()),
            other => {
                return Err(CapiError::new(
                    MemoStatus::InvalidArgument,
                    format!("backend {other}: expected MEMO_BACKEND_CUDA (0) or MEMO_BACKEND_HOST (1)"),
                ))
            }
        };
        let mut slot = ALLOCATOR.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(current) = slot.as_ref().filter(|a| !a.is_idle()) {
            return Err(CapiError::new(
                MemoStatus::InvalidState,
                format!(
                    "{} bytes are still allocated through the current backend (arena included): free them and release the arena first",
                    current.device_bytes_live()
                ),
            ));
        }
        *slot = Some(RecordReplayAllocator::new(device));
        Ok(())
    })
}

/// Starts recording: requests go to the device allocator and each iteration's requests (ended by
/// `memo_iteration_end`) become a trace in MEMO's text form. With a directory `trace_dir` (made
/// if missing), iteration n's trace is written to `trace_dir/iteration-NNNN.trace`; NULL keeps
/// only the last iteration's trace, in memory. Only the device of the first request is recorded.
///
/// # Safety
/// `trace_dir` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn memo_allocator_record(trace_dir: *const c_char) -> MemoStatus {
    guard("memo_allocator_record", || {
        let dir = if trace_dir.is_null() {
            None
        } else {
            // Safety: forwarded from this function's contract.
            Some(PathBuf::from(unsafe { str_arg(trace_dir, "trace_dir")? }))
        };
        with_allocator(|allocator| allocator.record(dir))
    })
}

/// The solver options for a plan: NULL gives no capacity, alignment 512, the default budget;
/// given options with alignment 0 or 1 get 512 (device pointers need alignment).
///
/// # Safety
/// `options` is NULL or valid for reading one `MemoPlaceOptions`.
unsafe fn plan_options(options: *const MemoPlaceOptions) -> SolveOptions {
    if options.is_null() {
        return replay_solve_options(None, MEMO_DEFAULT_REPLAY_ALIGNMENT, DEFAULT_BUDGET_NODES);
    }
    // Safety: not NULL, and the caller promises one readable MemoPlaceOptions.
    let options = unsafe { options.read() };
    let capacity = (options.capacity != MEMO_NO_CAPACITY).then_some(options.capacity);
    replay_solve_options(capacity, options.alignment, options.budget_nodes)
}

/// Plans the last recorded iteration: its buffers freed within the iteration are placed in one
/// arena (minimising the peak, or under `options->capacity`; alignment at least 256, 512 by
/// default); the ones it never frees will come from the device allocator. `options` may be NULL.
/// The plan replaces any earlier one; the mode is unchanged.
///
/// # Safety
/// `options` is NULL or valid for reading one `MemoPlaceOptions`.
#[no_mangle]
pub unsafe extern "C" fn memo_allocator_plan(options: *const MemoPlaceOptions) -> MemoStatus {
    guard("memo_allocator_plan", || {
        // Safety: forwarded from this function's contract.
        let options = unsafe { plan_options(options) };
        with_allocator(|allocator| allocator.plan_recorded(&options).map(drop))
    })
}

/// Plans the one-iteration trace in the file `path` (MEMO's text form, as record mode writes it),
/// like `memo_allocator_plan`: for replaying in a later process what an earlier one recorded.
///
/// # Safety
/// `path` is NULL (refused) or a NUL-terminated string; `options` is NULL or valid for reading
/// one `MemoPlaceOptions`.
#[no_mangle]
pub unsafe extern "C" fn memo_allocator_plan_file(path: *const c_char, options: *const MemoPlaceOptions) -> MemoStatus {
    guard("memo_allocator_plan_file", || {
        // Safety: forwarded from this function's contract.
        let path = unsafe { str_arg(path, "path")? };
        let text = std::fs::read(path)
            .map_err(|e| CapiError::new(MemoStatus::Io, format!("cannot read the trace {path}: {e}")))?;
        // Safety: forwarded from this function's contract.
        let options = unsafe { plan_options(options) };
        with_allocator(|allocator| {
            allocator
                .plan_text(&text, &options)
                .map(drop)
                .map_err(|e| CapiError::new(e.status, format!("{path}: {}", e.message)))
        })
    })
}

/// Switches to replay on `device`: allocates one arena of the planned size (keeping the current
/// arena if it is large enough and nothing in it is live). Call it right after an iteration ends:
/// the next request is the first of the plan. `MEMO_STATUS_INVALID_STATE` without a plan;
/// `MEMO_STATUS_DEVICE` if the arena cannot be allocated (the mode is then unchanged).
#[no_mangle]
pub extern "C" fn memo_allocator_replay(device: c_int) -> MemoStatus {
    guard("memo_allocator_replay", || with_allocator(|allocator| allocator.replay(device)))
}

/// Switches to passthrough: requests go to the device allocator, unrecorded. The arena and the
/// buffers in it stay valid; free them as usual.
#[no_mangle]
pub extern "C" fn memo_allocator_passthrough() -> MemoStatus {
    guard("memo_allocator_passthrough", || {
        with_allocator(|allocator| {
            allocator.passthrough();
            Ok(())
        })
    })
}

/// Gives the arena back to the device allocator (replay mode becomes passthrough). Refused with
/// `MEMO_STATUS_INVALID_STATE` while a buffer in it is live. No arena: does nothing.
#[no_mangle]
pub extern "C" fn memo_allocator_release_arena() -> MemoStatus {
    guard("memo_allocator_release_arena", || with_allocator(|allocator| allocator.release_arena()))
}

/// Writes the allocator's state and counters to `*out`.
///
/// # Safety
/// `out` is NULL (refused) or valid for writing one `MemoAllocatorStats`.
#[no_mangle]
pub unsafe extern "C" fn memo_allocator_stats(out: *mut MemoAllocatorStats) -> MemoStatus {
    guard("memo_allocator_stats", || {
        let stats = with_allocator(|allocator| Ok(stats_of(allocator)))?;
        // Safety: forwarded from this function's contract.
        unsafe { write_out(out, "out", stats) }
    })
}

/// Zeroes the counters; the peaks restart from what is live now.
#[no_mangle]
pub extern "C" fn memo_allocator_reset_stats() -> MemoStatus {
    guard("memo_allocator_reset_stats", || {
        with_allocator(|allocator| {
            allocator.reset_counters();
            Ok(())
        })
    })
}

/// The C view of an allocator's state.
pub(crate) fn stats_of<D: DeviceAllocator>(allocator: &RecordReplayAllocator<D>) -> MemoAllocatorStats {
    let c = allocator.counters();
    let plan = allocator.plan();
    let arena = allocator.arena();
    MemoAllocatorStats {
        iterations: c.iterations,
        recorded_iterations: allocator.recorded_iterations(),
        requests: c.requests,
        replayed: c.replayed,
        replayed_bytes: c.replayed_bytes,
        unplanned: c.unplanned,
        unplanned_bytes: c.unplanned_bytes,
        fallbacks: c.fallbacks,
        fallback_bytes: c.fallback_bytes,
        fallback_size_mismatch: c.fallback_size_mismatch,
        fallback_beyond_plan: c.fallback_beyond_plan,
        fallback_overlap: c.fallback_overlap,
        fallback_other_device: c.fallback_other_device,
        unknown_frees: c.unknown_frees,
        device_errors: c.device_errors,
        arena_bytes: arena.map_or(0, |a| a.bytes),
        plan_peak: plan.map_or(0, |p| p.arena_bytes),
        plan_lower_bound: plan.map_or(0, |p| p.lower_bound),
        device_bytes_live: allocator.device_bytes_live(),
        device_bytes_peak: c.device_bytes_peak,
        requested_bytes_live: allocator.requested_bytes_live(),
        requested_bytes_peak: c.requested_bytes_peak,
        mode: match allocator.mode() {
            Mode::Passthrough => MEMO_MODE_PASSTHROUGH,
            Mode::Record => MEMO_MODE_RECORD,
            Mode::Replay => MEMO_MODE_REPLAY,
        },
        arena_device: arena.map_or(-1, |a| a.device),
        plan_ready: u32::from(plan.is_some()),
        plan_optimal: u32::from(plan.is_some_and(|p| p.optimal)),
        plan_block_instances: plan.map_or(0, |p| p.block_instances),
        plan_level1_problems: plan.map_or(0, |p| p.level1_problems),
    }
}
