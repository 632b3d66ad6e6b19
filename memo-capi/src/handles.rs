//! The registry of live handles: traces, placements and plans.
//!
//! Handles are opaque values, not addresses: each is a number from a counter that never repeats,
//! looked up in the registry under a lock on every call. So a stale, freed, foreign or mistyped
//! handle is refused with `MEMO_STATUS_BAD_HANDLE` instead of being dereferenced, and a handle may
//! be used from any thread.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::placement::Placed;
use crate::plan_file::LoadedPlan;
use crate::status::{CapiError, MemoStatus};
use crate::trace_builder::TraceBuilder;

/// Every live handle.
pub(crate) struct Registry {
    /// The next handle value; shared by every kind, so no value ever names two things.
    next: u64,
    /// `MemoTrace` handles.
    pub(crate) traces: BTreeMap<u64, TraceBuilder>,
    /// `MemoPlacement` handles.
    pub(crate) placements: BTreeMap<u64, Placed>,
    /// `MemoPlan` handles. Shared, so that a call copies the `Arc` out and works on the plan (the
    /// checker can take a while on a large one) without holding the lock.
    pub(crate) plans: BTreeMap<u64, Arc<LoadedPlan>>,
}

static REGISTRY: Mutex<Registry> =
    Mutex::new(Registry { next: 1, traces: BTreeMap::new(), placements: BTreeMap::new(), plans: BTreeMap::new() });

/// The registry. A panic while it was held (a bug, caught at the boundary) leaves maps that are
/// still consistent (every change is one insert or remove), so poisoning is ignored.
pub(crate) fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Registry {
    /// A handle value never given out before.
    pub(crate) fn issue(&mut self) -> u64 {
        let handle = self.next;
        self.next += 1;
        handle
    }
}

/// The registry key a handle pointer stands for.
pub(crate) fn handle_of<T>(pointer: *const T) -> u64 {
    pointer.addr() as u64
}

/// The handle pointer of a registry key.
pub(crate) fn pointer_of<T>(handle: u64) -> *mut T {
    // Never dereferenced: the value is only a key into the registry.
    std::ptr::without_provenance_mut(handle as usize)
}

/// The error for a handle that is not a live one of kind `kind` (the argument's name: `name`).
pub(crate) fn bad_handle(kind: &str, name: &str, handle: u64) -> CapiError {
    CapiError::new(
        MemoStatus::BadHandle,
        format!("`{name}` ({handle:#x}) is not a live {kind} handle: it was freed already, or never came from this library, or is another kind of handle"),
    )
}
