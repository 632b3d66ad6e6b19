//! Status codes, the per-thread last error message, and the guard every exported function runs its
//! body in, so that no panic crosses the C boundary.

use std::any::Any;
use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// What a call did. Every `memo_*` function that can fail returns one; `MEMO_STATUS_OK` is 0 and
/// every failure is positive. The values are part of the ABI and never change meaning.
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoStatus {
    /// The call did what it says.
    Ok = 0,
    /// A required pointer argument was NULL.
    NullPointer = 1,
    /// A handle is not one this library gave out, or was already freed.
    BadHandle = 2,
    /// An argument is out of its range (an index, an alignment, a negative size, non-UTF-8 text).
    InvalidArgument = 3,
    /// A trace is malformed: a parse error, or a request that contradicts the earlier ones.
    InvalidTrace = 4,
    /// No placement fits under the capacity: proven.
    Infeasible = 5,
    /// No placement under the capacity was found within the node budget; one may exist.
    NotFoundWithinBudget = 6,
    /// The sizes add up to more than 2^64 bytes, or more than the address space.
    TooLarge = 7,
    /// A caller-provided array is shorter than the data to copy into it.
    BufferTooSmall = 8,
    /// Reading or writing a file failed.
    Io = 9,
    /// The device allocator failed: the CUDA runtime is missing, or an allocation or free failed.
    Device = 10,
    /// The call does not fit the allocator's state (for example replay before any plan).
    InvalidState = 11,
    /// A bug in this library: an internal panic was caught at the boundary. Please report it
    /// with the message.
    Internal = 12,
    /// The bytes are not a plan this library can read (`spec/plan-format.md`): the message is the
    /// decoder's, naming the byte offset and the part of the plan.
    PlanDecode = 13,
    /// The plan decodes but breaks the validity rules (`spec/validity.md`): running it could
    /// corrupt memory. `memo_plan_violation` gives each violation.
    PlanInvalid = 14,
}

impl MemoStatus {
    /// The constant's name as the C header spells it.
    pub fn name(self) -> &'static str {
        self.c_name().to_str().unwrap_or("MEMO_STATUS_UNKNOWN")
    }

    /// The status with this value, if any.
    pub fn from_i32(value: i32) -> Option<MemoStatus> {
        MemoStatus::all().into_iter().find(|s| *s as i32 == value)
    }

    fn c_name(self) -> &'static CStr {
        match self {
            MemoStatus::Ok => c"MEMO_STATUS_OK",
            MemoStatus::NullPointer => c"MEMO_STATUS_NULL_POINTER",
            MemoStatus::BadHandle => c"MEMO_STATUS_BAD_HANDLE",
            MemoStatus::InvalidArgument => c"MEMO_STATUS_INVALID_ARGUMENT",
            MemoStatus::InvalidTrace => c"MEMO_STATUS_INVALID_TRACE",
            MemoStatus::Infeasible => c"MEMO_STATUS_INFEASIBLE",
            MemoStatus::NotFoundWithinBudget => c"MEMO_STATUS_NOT_FOUND_WITHIN_BUDGET",
            MemoStatus::TooLarge => c"MEMO_STATUS_TOO_LARGE",
            MemoStatus::BufferTooSmall => c"MEMO_STATUS_BUFFER_TOO_SMALL",
            MemoStatus::Io => c"MEMO_STATUS_IO",
            MemoStatus::Device => c"MEMO_STATUS_DEVICE",
            MemoStatus::InvalidState => c"MEMO_STATUS_INVALID_STATE",
            MemoStatus::Internal => c"MEMO_STATUS_INTERNAL",
            MemoStatus::PlanDecode => c"MEMO_STATUS_PLAN_DECODE",
            MemoStatus::PlanInvalid => c"MEMO_STATUS_PLAN_INVALID",
        }
    }

    /// Every status, in numeric order.
    pub fn all() -> [MemoStatus; 15] {
        [
            MemoStatus::Ok,
            MemoStatus::NullPointer,
            MemoStatus::BadHandle,
            MemoStatus::InvalidArgument,
            MemoStatus::InvalidTrace,
            MemoStatus::Infeasible,
            MemoStatus::NotFoundWithinBudget,
            MemoStatus::TooLarge,
            MemoStatus::BufferTooSmall,
            MemoStatus::Io,
            MemoStatus::Device,
            MemoStatus::InvalidState,
            MemoStatus::Internal,
            MemoStatus::PlanDecode,
            MemoStatus::PlanInvalid,
        ]
    }
}

/// A failed call: its status and a message that says what was wrong and how to fix it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapiError {
    /// The status the call returns.
    pub status: MemoStatus,
    /// The message `memo_last_error` gives (the function's name is prefixed by the guard).
    pub message: String,
}

impl CapiError {
    /// An error with this status and message.
    pub fn new(status: MemoStatus, message: impl Into<String>) -> Self {
        CapiError { status, message: message.into() }
    }

    /// A NULL pointer where the argument `name` is required.
    pub fn null(name: &str) -> Self {
        CapiError::new(MemoStatus::NullPointer, format!("`{name}` is NULL; pass a valid pointer"))
    }
}

impl std::fmt::Display for CapiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.status.name(), self.message)
    }
}

impl std::error::Error for CapiError {}

thread_local! {
    /// The message of the most recent failed call on this thread (empty before any failure).
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `message` as this thread's last error.
pub(crate) fn set_last_error(message: &str) {
    // A NUL inside the message would cut it short in C: replace it.
    let bytes: Vec<u8> = message.bytes().map(|b| if b == 0 { b'?' } else { b }).collect();
    let text = CString::new(bytes).unwrap_or_default();
    LAST_ERROR.with(|slot| *slot.borrow_mut() = text);
}

/// This thread's last error message, as Rust text (for tests and the Rust API).
pub fn last_error_message() -> String {
    LAST_ERROR.with(|slot| slot.borrow().to_string_lossy().into_owned())
}

/// The message of a caught panic's payload.
fn panic_message(payload: &(dyn Any + Send)) -> &str {
    if let Some(text) = payload.downcast_ref::<&str>() {
        text
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text
    } else {
        "a panic without a message"
    }
}

/// Runs the body of the exported function `function`: returns `MEMO_STATUS_OK`, or records the
/// error (prefixed with the function's name) as the last error and returns its status. A panic is
/// caught here as a last resort and becomes `MEMO_STATUS_INTERNAL`: the code is written not to
/// panic, and a panic unwinding into C would be undefined behaviour.
pub(crate) fn guard(function: &str, body: impl FnOnce() -> Result<(), CapiError>) -> MemoStatus {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => MemoStatus::Ok,
        Ok(Err(error)) => {
            set_last_error(&format!("{function}: {}", error.message));
            error.status
        }
        Err(payload) => {
            set_last_error(&format!(
                "{function}: internal error (a bug in memo-capi, please report it): {}",
                panic_message(payload.as_ref())
            ));
            MemoStatus::Internal
        }
    }
}

/// Like [`guard`] for a function that returns a value instead of a status: `failed` is what it
/// returns when the body fails or panics (the last error says why).
pub(crate) fn guard_value<T>(function: &str, failed: T, body: impl FnOnce() -> Result<T, CapiError>) -> T {
    let mut value = None;
    let status = guard(function, || {
        value = Some(body()?);
        Ok(())
    });
    match (status, value) {
        (MemoStatus::Ok, Some(value)) => value,
        _ => failed,
    }
}

/// The message of the most recent call on this thread that failed (an empty string if none has).
/// Successful calls leave it unchanged. The text belongs to the library: it stays valid until the
/// next failing `memo_*` call on this thread; copy it to keep it. Never NULL.
#[no_mangle]
pub extern "C" fn memo_last_error() -> *const c_char {
    // Borrowing the thread-local cannot fail here: nothing else on this thread holds it.
    LAST_ERROR.with(|slot| slot.borrow().as_ptr())
}

/// The name of a status code (`"MEMO_STATUS_OK"`, ...), or `"MEMO_STATUS_UNKNOWN"` for a value
/// that is none of them. Static text: never freed, never NULL.
#[no_mangle]
pub extern "C" fn memo_status_name(status: i32) -> *const c_char {
    MemoStatus::from_i32(status).map_or(c"MEMO_STATUS_UNKNOWN", MemoStatus::c_name).as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_turns_a_panic_into_internal_with_a_message() {
        let status = guard("memo_test", || panic!("boom"));
        assert_eq!(status, MemoStatus::Internal);
        let message = last_error_message();
        assert!(message.starts_with("memo_test: internal error"), "{message}");
        assert!(message.ends_with("boom"), "{message}");
    }

    #[test]
    fn guard_prefixes_the_function_and_success_leaves_the_message() {
        let status = guard("memo_x", || Err(CapiError::null("out")));
        assert_eq!(status, MemoStatus::NullPointer);
        assert_eq!(guard("memo_y", || Ok(())), MemoStatus::Ok);
        assert_eq!(last_error_message(), "memo_x: `out` is NULL; pass a valid pointer");
    }

    #[test]
    fn status_names_match_the_enum_and_unknown_values_are_named() {
        for status in MemoStatus::all() {
            // Safety: memo_status_name returns a pointer to a static NUL-terminated string.
            let name = unsafe { CStr::from_ptr(memo_status_name(status as i32)) };
            assert_eq!(name.to_str().unwrap(), status.name());
        }
        // Safety: as above.
        let unknown = unsafe { CStr::from_ptr(memo_status_name(-7)) };
        assert_eq!(unknown.to_str().unwrap(), "MEMO_STATUS_UNKNOWN");
        let values: Vec<i32> = MemoStatus::all().iter().map(|s| *s as i32).collect();
        assert_eq!(values, (0..15).collect::<Vec<_>>());
    }

    #[test]
    fn a_nul_in_a_message_is_replaced() {
        set_last_error("a\0b");
        assert_eq!(last_error_message(), "a?b");
    }
}
