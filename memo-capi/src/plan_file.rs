//! Plan files through the C ABI: load a plan (`spec/plan-format.md`) from bytes or a file, check
//! it with the independent checker (`spec/validity.md`), read its totals, provenance and buffers.
//!
//! A plan handle holds the decoded plan and, once something asks, the checker's verdict. Calls
//! copy the handle's `Arc` out of the registry and work without the lock, so checking a large plan
//! on one thread does not hold up calls on others.

use std::ffi::c_char;
use std::sync::{Arc, OnceLock};

use memo_plan_core::check::check_plan;
use memo_plan_core::plan::encode::alpha_bound_name;
use memo_plan_core::plan::{Place, Plan};

use crate::ffi_util::{bytes_arg, copy_text, static_name, str_arg, write_out};
use crate::handles::{bad_handle, handle_of, pointer_of, registry};
use crate::status::{guard, CapiError, MemoStatus};

/// A plan read from bytes or a file (opaque; made by `memo_plan_load` or `memo_plan_load_file`,
/// freed by `memo_plan_free`).
pub struct MemoPlan {
    _opaque: [u8; 0],
}

/// `MemoPlanBuffer::place`: the buffer is in the device arena.
pub const MEMO_PLACE_DEVICE: u32 = 0;
/// `MemoPlanBuffer::place`: the buffer is in the pinned host slab.
pub const MEMO_PLACE_HOST: u32 = 1;

/// A plan's sizes, as it states them (`memo_plan_check` verifies them against its buffers).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoPlanTotals {
    /// Bytes of the one device arena: the highest end of a device buffer.
    pub arena_bytes: u64,
    /// The most device-buffer bytes live at once: no placement of these buffers needs less.
    pub arena_lower_bound_bytes: u64,
    /// Bytes of the pinned host slab (swapped activations).
    pub host_bytes: u64,
    /// Bytes of parameters, gradients and optimizer state.
    pub parameter_bytes: u64,
    /// Bytes of the two rounding buffers.
    pub rounding_buffer_bytes: u64,
}

/// How a plan was made: the model, the layout, the strategy and its swap fraction, and the
/// placement's levels. The names are static text (never freed, never NULL).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemoPlanProvenance {
    /// The strategy: `"memo"`, `"full-recompute"`, `"full-swap"` or `"keep-all"`.
    pub strategy: *const c_char,
    /// What bound α: `"bandwidth"`, `"host_memory"`, `"none"` or `"forced"`.
    pub alpha_bound: *const c_char,
    /// The swap fraction α (docs/technique.md section 1): the share of each token-split tensor's rows
    /// copied to the host; the rest are recomputed.
    pub alpha: f64,
    /// Rows of each token-split tensor copied to the host.
    pub swapped_rows: u64,
    /// Tokens per sequence.
    pub seq_len: u64,
    /// Sequences per micro-batch.
    pub micro_batch: u64,
    /// Hidden size.
    pub hidden: u64,
    /// Attention heads.
    pub heads: u64,
    /// Vocabulary size.
    pub vocab: u64,
    /// Tensor (sequence) parallel degree: the plan is one of these GPUs'.
    pub tensor_parallel: u64,
    /// Data parallel degree.
    pub data_parallel: u64,
    /// Level 1: the peak of one layer's forward transients, in bytes.
    pub level1_forward_peak: u64,
    /// Level 1: the peak of one layer's backward transients, in bytes.
    pub level1_backward_peak: u64,
    /// Level 2: the peak of the whole step with each layer block as one request, in bytes.
    pub level2_peak: u64,
    /// Transformer layers.
    pub layers: u32,
    /// 1 when the level-2 placement is proven optimal, else 0.
    pub level2_optimal: u32,
}

/// One buffer of a plan.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoPlanBuffer {
    /// What it is for (static text): `"parameter"`, `"gradient"`, `"optimizer_state"`,
    /// `"skeletal"`, `"transient"`, `"rounding_buffer"`, `"cross_layer"`, `"host_slot"`,
    /// `"input"` or `"scalar"`.
    pub kind: *const c_char,
    /// The tensor it holds (static text), as `spec/plan-format.md` names it: `"q"`, `"fc1_out"`,
    /// `"embedding"`, ...
    pub role: *const c_char,
    /// Rows (tokens for activations, output features for weights, 1 for scalars).
    pub rows: u64,
    /// Bytes of one row.
    pub row_bytes: u64,
    /// `rows * row_bytes`.
    pub bytes: u64,
    /// Its offset in the arena (`MEMO_PLACE_DEVICE`) or the host slab (`MEMO_PLACE_HOST`).
    pub offset: u64,
    /// The layer it belongs to, or -1 (embedding, classifier, optimizer, rounding buffers).
    pub layer: i64,
    /// `MEMO_PLACE_DEVICE` or `MEMO_PLACE_HOST`.
    pub place: u32,
    /// For a rounding buffer, which one (0 or 1); else 0.
    pub slot: u32,
}

/// A decoded plan and, once asked for, the checker's violations (one message each).
pub(crate) struct LoadedPlan {
    pub(crate) plan: Plan,
    violations: OnceLock<Vec<String>>,
}

impl LoadedPlan {
    /// The violations, checking the plan on first use.
    fn violations(&self) -> &[String] {
        self.violations
            .get_or_init(|| check_plan(&self.plan).err().unwrap_or_default().iter().map(ToString::to_string).collect())
    }
}

/// The plan `plan` names (a shared copy: the registry lock is released on return).
pub(crate) fn loaded(plan: *const MemoPlan) -> Result<Arc<LoadedPlan>, CapiError> {
    if plan.is_null() {
        return Err(CapiError::null("plan"));
    }
    let handle = handle_of(plan);
    registry().plans.get(&handle).cloned().ok_or_else(|| bad_handle("MemoPlan", "plan", handle))
}

/// Decodes `bytes` and registers the plan under a new handle, written to `*out`.
///
/// # Safety
/// `out` is valid for writing one pointer (it was set to NULL already, so it is not NULL).
unsafe fn register(bytes: &[u8], source: &str, out: *mut *mut MemoPlan) -> Result<(), CapiError> {
    let plan = Plan::decode(bytes).map_err(|e| CapiError::new(MemoStatus::PlanDecode, format!("{source}: {e}")))?;
    let mut registry = registry();
    let handle = registry.issue();
    registry.plans.insert(handle, Arc::new(LoadedPlan { plan, violations: OnceLock::new() }));
    // Safety: forwarded from this function's contract.
    unsafe { write_out(out, "out", pointer_of(handle)) }
}

/// Decodes the plan in the `len` bytes at `bytes` (`spec/plan-format.md`, as `memo plan -o`
/// writes it) and writes its handle to `*out`. Bytes that are not a plan are refused with
/// `MEMO_STATUS_PLAN_DECODE`; the last error is the decoder's message (where, what, what to do)
/// and `*out` is NULL. Loading does not check the plan: call `memo_plan_check` before trusting it.
///
/// # Safety
/// `bytes` is valid for reading `len` bytes (or NULL with `len` 0); `out` is NULL (refused) or
/// valid for writing one pointer.
#[no_mangle]
pub unsafe extern "C" fn memo_plan_load(bytes: *const u8, len: usize, out: *mut *mut MemoPlan) -> MemoStatus {
    guard("memo_plan_load", || {
        // Safety: forwarded from this function's contract.
        unsafe { write_out(out, "out", std::ptr::null_mut())? };
        // Safety: forwarded from this function's contract.
        let bytes = unsafe { bytes_arg(bytes, len, "bytes")? };
        // Safety: `out` is valid and not NULL (written above).
        unsafe { register(bytes, "the plan bytes", out) }
    })
}

/// Reads and decodes the plan file at `path`, like `memo_plan_load`. A file that cannot be read
/// is `MEMO_STATUS_IO`; one that is not a plan is `MEMO_STATUS_PLAN_DECODE`, the message starting
/// with the path.
///
/// # Safety
/// `path` is NULL (refused) or a NUL-terminated string; `out` is NULL (refused) or valid for
/// writing one pointer.
#[no_mangle]
pub unsafe extern "C" fn memo_plan_load_file(path: *const c_char, out: *mut *mut MemoPlan) -> MemoStatus {
    guard("memo_plan_load_file", || {
        // Safety: forwarded from this function's contract.
        unsafe { write_out(out, "out", std::ptr::null_mut())? };
        // Safety: forwarded from this function's contract.
        let path = unsafe { str_arg(path, "path")? };
        let bytes = std::fs::read(path).map_err(|e| {
            CapiError::new(MemoStatus::Io, format!("cannot read the plan {path}: {e}; check the path and permissions"))
        })?;
        // Safety: `out` is valid and not NULL (written above).
        unsafe { register(&bytes, path, out) }
    })
}

/// Frees a plan. NULL is accepted and does nothing; a handle freed already is refused with
/// `MEMO_STATUS_BAD_HANDLE`.
#[no_mangle]
pub extern "C" fn memo_plan_free(plan: *mut MemoPlan) -> MemoStatus {
    guard("memo_plan_free", || {
        if plan.is_null() {
            return Ok(());
        }
        let handle = handle_of(plan);
        registry().plans.remove(&handle).map(drop).ok_or_else(|| bad_handle("MemoPlan", "plan", handle))
    })
}

/// Checks the plan against every rule of `spec/validity.md` with the independent checker
/// (overlaps in the arena, data read before it is written, races between streams, events,
/// totals). `MEMO_STATUS_OK` when it is valid; `MEMO_STATUS_PLAN_INVALID` when not, the last
/// error giving the count and the first violation. The verdict is kept with the plan: later
/// calls (and `memo_plan_violation_count`, `memo_plan_violation`) do not check again.
#[no_mangle]
pub extern "C" fn memo_plan_check(plan: *const MemoPlan) -> MemoStatus {
    guard("memo_plan_check", || {
        let loaded = loaded(plan)?;
        match loaded.violations() {
            [] => Ok(()),
            [first, ..] => Err(CapiError::new(
                MemoStatus::PlanInvalid,
                format!(
                    "the plan breaks {} rule(s) of spec/validity.md, first: {first}; memo_plan_violation gives each",
                    loaded.violations().len()
                ),
            )),
        }
    })
}

/// Writes the number of the plan's violations of `spec/validity.md` to `*out` (0: valid),
/// checking the plan first if `memo_plan_check` has not.
///
/// # Safety
/// `out` is NULL (refused) or valid for writing one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn memo_plan_violation_count(plan: *const MemoPlan, out: *mut usize) -> MemoStatus {
    guard("memo_plan_violation_count", || {
        let count = loaded(plan)?.violations().len();
        // Safety: forwarded from this function's contract.
        unsafe { write_out(out, "out", count) }
    })
}

/// Copies violation number `index` (sorted by instruction, then buffer, as `memo check` lists
/// them) as NUL-terminated text into `buffer[0 .. len)`, and the bytes it takes (NUL included)
/// to `*needed` unless `needed` is NULL. `MEMO_STATUS_BUFFER_TOO_SMALL` when `len` is smaller
/// (nothing written to `buffer`; `*needed` says how much to allocate; `buffer` may be NULL with
/// `len` 0 to ask). `MEMO_STATUS_INVALID_ARGUMENT` when `index` is not below the count.
///
/// # Safety
/// `buffer` is NULL or valid for writing `len` bytes; `needed` is NULL or valid for writing one
/// `size_t`.
#[no_mangle]
pub unsafe extern "C" fn memo_plan_violation(
    plan: *const MemoPlan,
    index: usize,
    buffer: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> MemoStatus {
    guard("memo_plan_violation", || {
        let loaded = loaded(plan)?;
        let violations = loaded.violations();
        let text = violations.get(index).ok_or_else(|| {
            CapiError::new(
                MemoStatus::InvalidArgument,
                format!("violation index {index} is out of range: the plan has {} violations", violations.len()),
            )
        })?;
        // Safety: forwarded from this function's contract.
        unsafe { copy_text(text, buffer, len, needed) }
    })
}

/// Writes the plan's sizes to `*out`.
///
/// # Safety
/// `out` is NULL (refused) or valid for writing one `MemoPlanTotals`.
#[no_mangle]
pub unsafe extern "C" fn memo_plan_totals(plan: *const MemoPlan, out: *mut MemoPlanTotals) -> MemoStatus {
    guard("memo_plan_totals", || {
        let t = loaded(plan)?.plan.totals;
        let totals = MemoPlanTotals {
            arena_bytes: t.arena_bytes,
            arena_lower_bound_bytes: t.arena_lower_bound_bytes,
            host_bytes: t.host_bytes,
            parameter_bytes: t.parameter_bytes,
            rounding_buffer_bytes: t.rounding_buffer_bytes,
        };
        // Safety: forwarded from this function's contract.
        unsafe { write_out(out, "out", totals) }
    })
}

/// Writes how the plan was made to `*out`.
///
/// # Safety
/// `out` is NULL (refused) or valid for writing one `MemoPlanProvenance`.
#[no_mangle]
pub unsafe extern "C" fn memo_plan_provenance(plan: *const MemoPlan, out: *mut MemoPlanProvenance) -> MemoStatus {
    guard("memo_plan_provenance", || {
        let loaded = loaded(plan)?;
        let p = &loaded.plan.provenance;
        let provenance = MemoPlanProvenance {
            strategy: static_name(p.strategy.name()),
            alpha_bound: static_name(alpha_bound_name(p.alpha_bound)),
            alpha: p.alpha,
            swapped_rows: p.swapped_rows,
            seq_len: p.model.seq_len,
            micro_batch: p.model.micro_batch,
            hidden: p.model.hidden,
            heads: p.model.heads,
            vocab: p.model.vocab,
            tensor_parallel: p.parallel.tensor,
            data_parallel: p.parallel.data,
            level1_forward_peak: p.level1_forward.peak_bytes,
            level1_backward_peak: p.level1_backward.peak_bytes,
            level2_peak: p.level2.peak_bytes,
            layers: p.model.layers,
            level2_optimal: u32::from(p.level2.optimal),
        };
        // Safety: forwarded from this function's contract.
        unsafe { write_out(out, "out", provenance) }
    })
}

/// Copies the model's name (`"7B"`, or whatever the plan's maker called it) as NUL-terminated
/// text into `buffer`, as `memo_plan_violation` copies its text.
///
/// # Safety
/// `buffer` is NULL or valid for writing `len` bytes; `needed` is NULL or valid for writing one
/// `size_t`.
#[no_mangle]
pub unsafe extern "C" fn memo_plan_model_name(
    plan: *const MemoPlan,
    buffer: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> MemoStatus {
    guard("memo_plan_model_name", || {
        let loaded = loaded(plan)?;
        // Safety: forwarded from this function's contract.
        unsafe { copy_text(&loaded.plan.provenance.model.name, buffer, len, needed) }
    })
}

/// Writes the number of the plan's buffers to `*out`.
///
/// # Safety
/// `out` is NULL (refused) or valid for writing one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn memo_plan_buffer_count(plan: *const MemoPlan, out: *mut usize) -> MemoStatus {
    guard("memo_plan_buffer_count", || {
        let count = loaded(plan)?.plan.buffers.len();
        // Safety: forwarded from this function's contract.
        unsafe { write_out(out, "out", count) }
    })
}

/// Writes the number of the plan's instructions (launches, copies, event records and waits on
/// the four streams) to `*out`.
///
/// # Safety
/// `out` is NULL (refused) or valid for writing one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn memo_plan_instruction_count(plan: *const MemoPlan, out: *mut usize) -> MemoStatus {
    guard("memo_plan_instruction_count", || {
        let count = loaded(plan)?.plan.instructions.len();
        // Safety: forwarded from this function's contract.
        unsafe { write_out(out, "out", count) }
    })
}

/// Writes buffer number `index` (`0 ..` the buffer count; the plan's own numbering, which its
/// instructions use) to `*out`. `MEMO_STATUS_INVALID_ARGUMENT` when `index` is out of range.
///
/// # Safety
/// `out` is NULL (refused) or valid for writing one `MemoPlanBuffer`.
#[no_mangle]
pub unsafe extern "C" fn memo_plan_buffer(plan: *const MemoPlan, index: usize, out: *mut MemoPlanBuffer) -> MemoStatus {
    guard("memo_plan_buffer", || {
        let loaded = loaded(plan)?;
        let buffers = &loaded.plan.buffers;
        let b = buffers.get(index).ok_or_else(|| {
            CapiError::new(
                MemoStatus::InvalidArgument,
                format!("buffer index {index} is out of range: the plan has {} buffers", buffers.len()),
            )
        })?;
        // The decoder refuses buffers whose size overflows, so this cannot fail; were it to, an
        // error says so instead of a made-up size.
        let bytes = b.bytes().ok_or_else(|| {
            CapiError::new(
                MemoStatus::PlanInvalid,
                format!("buffer {index} ({b}): {} rows of {} bytes overflow 64 bits", b.rows, b.row_bytes),
            )
        })?;
        let (place, offset) = match b.place {
            Place::Device { offset } => (MEMO_PLACE_DEVICE, offset),
            Place::Host { offset } => (MEMO_PLACE_HOST, offset),
        };
        let buffer = MemoPlanBuffer {
            kind: static_name(b.kind.name()),
            role: static_name(b.role.name()),
            rows: b.rows,
            row_bytes: b.row_bytes,
            bytes,
            offset,
            layer: b.layer.map_or(-1, i64::from),
            place,
            slot: u32::from(b.slot),
        };
        // Safety: forwarded from this function's contract.
        unsafe { write_out(out, "out", buffer) }
    })
}
