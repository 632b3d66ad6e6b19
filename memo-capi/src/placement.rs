//! The placement half of the C ABI: traces and placements (their handles: `handles.rs`).
//! Solving copies the trace out first, so a long solve holds no lock.

use memo_place::{solve, BufferLifetime, Solution, SolveError, SolveOptions};
use memo_plan_core::parse_trace;

use crate::ffi_util::{bytes_arg, write_out};
use crate::handles::{bad_handle, handle_of, pointer_of, registry};
use crate::status::{guard, CapiError, MemoStatus};
use crate::trace_builder::TraceBuilder;

/// A memory request trace being built (opaque; made by `memo_trace_new` or `memo_trace_parse`,
/// freed by `memo_trace_free`).
pub struct MemoTrace {
    _opaque: [u8; 0],
}

/// A placement of a trace's buffers (opaque; made by `memo_place`, freed by
/// `memo_placement_free`).
pub struct MemoPlacement {
    _opaque: [u8; 0],
}

/// `MemoPlaceOptions::capacity` for "no capacity: only minimise the peak".
pub const MEMO_NO_CAPACITY: u64 = u64::MAX;

/// What `memo_place` solves for. Start from `memo_place_options_default()` and change fields.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoPlaceOptions {
    /// Find a placement whose peak is at most this many bytes (still minimised as far as the
    /// budget allows), or fail; `MEMO_NO_CAPACITY`: only minimise.
    pub capacity: u64,
    /// Every offset is a multiple of this, and every buffer occupies its size rounded up to it
    /// (0 or 1: no alignment).
    pub alignment: u64,
    /// Node budget of the exact search over the whole solve (deterministic; 0: greedy only).
    pub budget_nodes: u64,
}

impl MemoPlaceOptions {
    /// The solver's options these stand for.
    pub fn to_solve_options(&self) -> SolveOptions {
        SolveOptions {
            capacity: (self.capacity != MEMO_NO_CAPACITY).then_some(self.capacity),
            alignment: self.alignment.max(1),
            budget_nodes: self.budget_nodes,
            ..SolveOptions::default()
        }
    }
}

/// What is known about a placement.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoPlacementSummary {
    /// Buffers placed (one per `malloc`, or per CSV line).
    pub buffers: u64,
    /// Requests in the trace (for a CSV trace, its largest `upper`).
    pub steps: u64,
    /// The arena this placement needs, in bytes: the highest offset + footprint.
    pub peak: u64,
    /// The most footprint bytes alive at once: no placement has a lower peak.
    pub lower_bound: u64,
    /// The peak of the greedy portfolio, before the exact search.
    pub greedy_peak: u64,
    /// Search nodes visited.
    pub nodes: u64,
    /// 1 when no placement has a lower peak (proven), else 0.
    pub optimal: u32,
    /// 1 when the node budget ran out before every part was settled, else 0.
    pub budget_exhausted: u32,
}

/// One placed buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoPlacedBuffer {
    /// The id the trace gave it.
    pub id: u64,
    /// Its size in bytes.
    pub size: u64,
    /// Its offset in the arena, in bytes.
    pub offset: u64,
    /// The first step at which it is alive.
    pub lower: u32,
    /// The first step at which it is no longer alive.
    pub upper: u32,
}

/// A placement with the buffers it places.
pub(crate) struct Placed {
    buffers: Vec<BufferLifetime>,
    steps: u32,
    solution: Solution,
}

/// Runs `f` on the trace `trace` under the registry lock.
fn with_trace<R>(
    trace: *const MemoTrace,
    f: impl FnOnce(&mut TraceBuilder) -> Result<R, CapiError>,
) -> Result<R, CapiError> {
    if trace.is_null() {
        return Err(CapiError::null("trace"));
    }
    let handle = handle_of(trace);
    let mut registry = registry();
    let builder = registry.traces.get_mut(&handle).ok_or_else(|| bad_handle("MemoTrace", "trace", handle))?;
    f(builder)
}

/// Runs `f` on the placement `placement` under the registry lock.
fn with_placement<R>(
    placement: *const MemoPlacement,
    f: impl FnOnce(&Placed) -> Result<R, CapiError>,
) -> Result<R, CapiError> {
    if placement.is_null() {
        return Err(CapiError::null("placement"));
    }
    let handle = handle_of(placement);
    let registry = registry();
    let placed = registry.placements.get(&handle).ok_or_else(|| bad_handle("MemoPlacement", "placement", handle))?;
    f(placed)
}

/// Registers a trace and writes its handle through `out`.
///
/// # Safety
/// `out` is valid for writing one pointer (checked for NULL before anything is registered).
unsafe fn register_trace(out: *mut *mut MemoTrace, builder: TraceBuilder) -> Result<(), CapiError> {
    if out.is_null() {
        return Err(CapiError::null("out"));
    }
    let mut registry = registry();
    let handle = registry.issue();
    registry.traces.insert(handle, builder);
    // Safety: not NULL (checked above); the caller promises it is valid for one write.
    unsafe { write_out(out, "out", pointer_of(handle)) }
}

/// The options `memo_place` uses when given NULL: no capacity, alignment 1, the solver's default
/// node budget.
#[no_mangle]
pub extern "C" fn memo_place_options_default() -> MemoPlaceOptions {
    let defaults = SolveOptions::default();
    MemoPlaceOptions { capacity: MEMO_NO_CAPACITY, alignment: defaults.alignment, budget_nodes: defaults.budget_nodes }
}

/// Makes an empty trace and writes its handle to `*out`.
///
/// # Safety
/// `out` is NULL (refused) or valid for writing one pointer.
#[no_mangle]
pub unsafe extern "C" fn memo_trace_new(out: *mut *mut MemoTrace) -> MemoStatus {
    // Safety: forwarded from this function's contract.
    guard("memo_trace_new", || unsafe { register_trace(out, TraceBuilder::new()) })
}

/// Parses a trace in either text form of `spec/trace-format.md` (MEMO's `malloc`/`free` lines or
/// the `id,lower,upper,size` CSV) from the `len` bytes at `text`, and writes its handle to `*out`.
/// Further requests may be added to it; buffers the text never freed are still live. On failure
/// `*out` is set to NULL and the last error names the line.
///
/// # Safety
/// `text` is valid for reading `len` bytes (or NULL with `len` 0); `out` is NULL (refused) or
/// valid for writing one pointer.
#[no_mangle]
pub unsafe extern "C" fn memo_trace_parse(text: *const u8, len: usize, out: *mut *mut MemoTrace) -> MemoStatus {
    guard("memo_trace_parse", || {
        // Safety: forwarded from this function's contract.
        unsafe { write_out(out, "out", std::ptr::null_mut())? };
        // Safety: forwarded from this function's contract.
        let bytes = unsafe { bytes_arg(text, len, "text")? };
        let trace = parse_trace(bytes).map_err(|e| CapiError::new(MemoStatus::InvalidTrace, e.to_string()))?;
        // Safety: forwarded from this function's contract.
        unsafe { register_trace(out, TraceBuilder::from_trace(trace)) }
    })
}

/// Appends the request `malloc id size` (`size` in bytes). Refused, leaving the trace unchanged,
/// if `id` is still allocated.
#[no_mangle]
pub extern "C" fn memo_trace_add_malloc(trace: *mut MemoTrace, id: u64, size: u64) -> MemoStatus {
    guard("memo_trace_add_malloc", || with_trace(trace, |builder| builder.add_malloc(id, size)))
}

/// Appends the request `free id size`. Refused, leaving the trace unchanged, if `id` is not
/// allocated or was allocated with another size.
#[no_mangle]
pub extern "C" fn memo_trace_add_free(trace: *mut MemoTrace, id: u64, size: u64) -> MemoStatus {
    guard("memo_trace_add_free", || with_trace(trace, |builder| builder.add_free(id, size)))
}

/// Writes the number of buffers in the trace (one per `malloc`) to `*out`.
///
/// # Safety
/// `out` is NULL (refused) or valid for writing one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn memo_trace_buffer_count(trace: *const MemoTrace, out: *mut usize) -> MemoStatus {
    guard("memo_trace_buffer_count", || {
        let count = with_trace(trace, |builder| Ok(builder.buffer_count()))?;
        // Safety: forwarded from this function's contract.
        unsafe { write_out(out, "out", count) }
    })
}

/// Frees a trace. NULL is accepted and does nothing; a handle freed already is refused with
/// `MEMO_STATUS_BAD_HANDLE`. Placements made from the trace stay valid.
#[no_mangle]
pub extern "C" fn memo_trace_free(trace: *mut MemoTrace) -> MemoStatus {
    guard("memo_trace_free", || {
        if trace.is_null() {
            return Ok(());
        }
        let handle = handle_of(trace);
        registry().traces.remove(&handle).map(drop).ok_or_else(|| bad_handle("MemoTrace", "trace", handle))
    })
}

/// The status and message of a solver error.
pub(crate) fn solve_error(error: &SolveError) -> CapiError {
    let status = match error {
        SolveError::EmptyLifetime { .. } => MemoStatus::InvalidTrace,
        SolveError::TooLarge => MemoStatus::TooLarge,
        SolveError::ProvenInfeasible { .. } => MemoStatus::Infeasible,
        SolveError::NotFoundWithinBudget { .. } => MemoStatus::NotFoundWithinBudget,
    };
    CapiError::new(status, error.to_string())
}

/// Places the trace's buffers in one arena (`spec/placement.md`): minimising the peak, or under
/// `options->capacity`. `options` may be NULL for `memo_place_options_default()`. Writes a new
/// placement handle to `*out`, or NULL on failure (`MEMO_STATUS_INFEASIBLE` when no placement
/// fits, proven; `MEMO_STATUS_NOT_FOUND_WITHIN_BUDGET` when none was found and one may exist).
/// A buffer not freed yet lives to the end of the trace. The trace is unchanged and may grow and
/// be placed again.
///
/// # Safety
/// `options` is NULL or valid for reading one `MemoPlaceOptions`; `out` is NULL (refused) or
/// valid for writing one pointer.
#[no_mangle]
pub unsafe extern "C" fn memo_place(
    trace: *const MemoTrace,
    options: *const MemoPlaceOptions,
    out: *mut *mut MemoPlacement,
) -> MemoStatus {
    guard("memo_place", || {
        // Safety: forwarded from this function's contract.
        unsafe { write_out(out, "out", std::ptr::null_mut())? };
        let options = if options.is_null() {
            memo_place_options_default()
        } else {
            // Safety: not NULL, and the caller promises one readable MemoPlaceOptions.
            unsafe { options.read() }
        };
        let (buffers, steps) = with_trace(trace, |builder| Ok((builder.lifetimes(), builder.steps())))?;
        let solution = solve(&buffers, &options.to_solve_options()).map_err(|e| solve_error(&e))?;
        let mut registry = registry();
        let handle = registry.issue();
        registry.placements.insert(handle, Placed { buffers, steps, solution });
        // Safety: forwarded from this function's contract.
        unsafe { write_out(out, "out", pointer_of(handle)) }
    })
}

/// Writes the placement's peak, lower bound, optimality and search statistics to `*out`.
///
/// # Safety
/// `out` is NULL (refused) or valid for writing one `MemoPlacementSummary`.
#[no_mangle]
pub unsafe extern "C" fn memo_placement_summary(
    placement: *const MemoPlacement,
    out: *mut MemoPlacementSummary,
) -> MemoStatus {
    guard("memo_placement_summary", || {
        let summary = with_placement(placement, |placed| {
            let s = &placed.solution;
            Ok(MemoPlacementSummary {
                buffers: placed.buffers.len() as u64,
                steps: u64::from(placed.steps),
                peak: s.peak,
                lower_bound: s.lower_bound,
                greedy_peak: s.stats.greedy_peak,
                nodes: s.stats.nodes,
                optimal: u32::from(s.optimal),
                budget_exhausted: u32::from(s.stats.budget_exhausted),
            })
        })?;
        // Safety: forwarded from this function's contract.
        unsafe { write_out(out, "out", summary) }
    })
}

/// Copies every buffer's offset, in trace order (the order of the `malloc`s, or of the CSV
/// lines), into `offsets[0 .. count)`, where count is `MemoPlacementSummary::buffers`. Refused
/// with `MEMO_STATUS_BUFFER_TOO_SMALL` (nothing written) when `len` is below count.
///
/// # Safety
/// `offsets` is valid for writing `len` `uint64_t`s (it may be NULL when the count is 0).
#[no_mangle]
pub unsafe extern "C" fn memo_placement_offsets(
    placement: *const MemoPlacement,
    offsets: *mut u64,
    len: usize,
) -> MemoStatus {
    guard("memo_placement_offsets", || {
        with_placement(placement, |placed| {
            let source = &placed.solution.offsets;
            if len < source.len() {
                return Err(CapiError::new(
                    MemoStatus::BufferTooSmall,
                    format!("`offsets` has room for {len} offsets; the placement has {}", source.len()),
                ));
            }
            if source.is_empty() {
                return Ok(());
            }
            if offsets.is_null() {
                return Err(CapiError::null("offsets"));
            }
            // Safety: not NULL, and the caller promises room for `len` >= source.len() values,
            // which cannot overlap the library's own vector.
            unsafe { std::ptr::copy_nonoverlapping(source.as_ptr(), offsets, source.len()) };
            Ok(())
        })
    })
}

/// Writes buffer number `index` (in trace order) with its lifetime and offset to `*out`.
///
/// # Safety
/// `out` is NULL (refused) or valid for writing one `MemoPlacedBuffer`.
#[no_mangle]
pub unsafe extern "C" fn memo_placement_buffer(
    placement: *const MemoPlacement,
    index: usize,
    out: *mut MemoPlacedBuffer,
) -> MemoStatus {
    guard("memo_placement_buffer", || {
        let buffer = with_placement(placement, |placed| {
            let (Some(b), Some(&offset)) = (placed.buffers.get(index), placed.solution.offsets.get(index)) else {
                return Err(CapiError::new(
                    MemoStatus::InvalidArgument,
                    format!("buffer index {index} is out of range: the placement has {} buffers", placed.buffers.len()),
                ));
            };
            Ok(MemoPlacedBuffer { id: b.id, size: b.size, offset, lower: b.lower, upper: b.upper })
        })?;
        // Safety: forwarded from this function's contract.
        unsafe { write_out(out, "out", buffer) }
    })
}

/// Frees a placement. NULL is accepted and does nothing; a handle freed already is refused with
/// `MEMO_STATUS_BAD_HANDLE`.
#[no_mangle]
pub extern "C" fn memo_placement_free(placement: *mut MemoPlacement) -> MemoStatus {
    guard("memo_placement_free", || {
        if placement.is_null() {
            return Ok(());
        }
        let handle = handle_of(placement);
        registry().placements.remove(&handle).map(drop).ok_or_else(|| bad_handle("MemoPlacement", "placement", handle))
    })
}
