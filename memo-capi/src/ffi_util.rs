//! The few places that touch caller memory: writing an out-parameter, reading a byte range or a
//! C string. Each checks for NULL first; everything else is the caller's promise, stated in the
//! `# Safety` section of the exported function.

use std::ffi::{c_char, CStr};

use crate::status::{CapiError, MemoStatus};

/// Writes `value` through `out`.
///
/// # Safety
/// `out` is NULL or valid for writing one aligned `T`.
pub(crate) unsafe fn write_out<T>(out: *mut T, name: &str, value: T) -> Result<(), CapiError> {
    if out.is_null() {
        return Err(CapiError::null(name));
    }
    // Safety: not NULL (checked), and the caller promises it is valid for one aligned write.
    unsafe { out.write(value) };
    Ok(())
}

/// The `len` bytes at `data` (`data` may be NULL when `len` is 0).
///
/// # Safety
/// `data` is NULL or valid for reading `len` bytes, which nothing writes during the call.
pub(crate) unsafe fn bytes_arg<'a>(data: *const u8, len: usize, name: &str) -> Result<&'a [u8], CapiError> {
    if len == 0 {
        return Ok(&[]);
    }
    if data.is_null() {
        return Err(CapiError::null(name));
    }
    if len > isize::MAX as usize {
        return Err(CapiError::new(MemoStatus::InvalidArgument, format!("`{name}` length {len} is above isize::MAX")));
    }
    // Safety: not NULL, len fits in isize, and the caller promises `len` readable bytes.
    Ok(unsafe { std::slice::from_raw_parts(data, len) })
}

/// The UTF-8 text of the NUL-terminated string `text`.
///
/// # Safety
/// `text` is NULL or points to a NUL-terminated string that nothing writes during the call.
pub(crate) unsafe fn str_arg<'a>(text: *const c_char, name: &str) -> Result<&'a str, CapiError> {
    if text.is_null() {
        return Err(CapiError::null(name));
    }
    // Safety: not NULL, and the caller promises a NUL-terminated string.
    let text = unsafe { CStr::from_ptr(text) };
    text.to_str().map_err(|_| {
        CapiError::new(MemoStatus::InvalidArgument, format!("`{name}` is not UTF-8 text: {}", text.to_string_lossy()))
    })
}
