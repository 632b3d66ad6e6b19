//! The few places that touch caller memory: writing an out-parameter, reading a byte range or a
//! C string. Each checks for NULL first; everything else is the caller's promise, stated in the
//! `# Safety` section of the exported function.

use std::collections::BTreeMap;
use std::ffi::{c_char, CStr, CString};
use std::sync::{Mutex, PoisonError};

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

/// A NUL-terminated copy of the static name `name` that lives as long as the process: the names
/// a plan's buffers and provenance use (kinds, roles, strategies) are a small fixed set, each
/// copied once and never freed, so C can be handed `const char *` to them like
/// `memo_status_name`'s.
pub(crate) fn static_name(name: &'static str) -> *const c_char {
    static NAMES: Mutex<BTreeMap<&'static str, CString>> = Mutex::new(BTreeMap::new());
    let mut names = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    // The names are identifiers: none holds a NUL. Were one to, it would read as "?".
    let text = names.entry(name).or_insert_with(|| CString::new(name).unwrap_or_else(|_| c"?".to_owned()));
    // The CString's bytes are on the heap: moving the entry inside the map does not move them,
    // and no entry is ever removed, so the pointer stays valid for the life of the process.
    text.as_ptr()
}

/// Copies `text` (a NUL inside it becomes `?`, so C reads all of it) and a NUL into `buffer[0 .. len)` and writes the bytes that takes (the NUL
/// included) to `*needed` unless `needed` is NULL. When `len` is smaller, nothing is written to
/// `buffer` and the result is `MEMO_STATUS_BUFFER_TOO_SMALL` (`*needed` is still written), so a
/// caller can ask with `buffer` NULL and `len` 0, then allocate.
///
/// # Safety
/// `buffer` is NULL or valid for writing `len` bytes; `needed` is NULL or valid for writing one
/// `usize`.
pub(crate) unsafe fn copy_text(
    text: &str,
    buffer: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> Result<(), CapiError> {
    let size = text.len() + 1;
    if !needed.is_null() {
        // Safety: not NULL, and the caller promises one writable usize.
        unsafe { needed.write(size) };
    }
    if len < size {
        return Err(CapiError::new(
            MemoStatus::BufferTooSmall,
            format!("`buffer` has room for {len} bytes; the text needs {size} (its NUL included)"),
        ));
    }
    if buffer.is_null() {
        return Err(CapiError::null("buffer"));
    }
    // Safety: not NULL, and the caller promises `len` >= size writable bytes, which cannot
    // overlap the library's own string.
    let out = unsafe { std::slice::from_raw_parts_mut(buffer.cast::<u8>(), size) };
    for (slot, byte) in out.iter_mut().zip(text.bytes().map(|b| if b == 0 { b'?' } else { b }).chain([0])) {
        *slot = byte;
    }
    Ok(())
}
