//! hiprtc: compile one source to a code object.

use std::ffi::{c_char, CStr, CString};

use crate::error::HipError;
use crate::sys::hiprtc::{HiprtcFns, HiprtcResult};
use crate::sys::HiprtcProgram;

fn error_string(rtc: &HiprtcFns, code: HiprtcResult) -> String {
    // Safety: takes any code, returns a static string or null.
    let text = unsafe { (rtc.hiprtcGetErrorString)(code) };
    if text.is_null() {
        return format!("unknown hiprtc error {code}");
    }
    // Safety: non-null and NUL-terminated (above).
    unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
}

fn check(rtc: &HiprtcFns, call: &'static str, code: HiprtcResult) -> Result<(), HipError> {
    if code == 0 {
        Ok(())
    } else {
        Err(HipError::Hiprtc { call, code, message: error_string(rtc, code) })
    }
}

fn c_string(what: &str, text: &str) -> Result<CString, HipError> {
    CString::new(text).map_err(|_| HipError::Unsupported(format!("hiprtc: the {what} contains a NUL byte")))
}

/// A program, destroyed on every path out of [`compile`].
struct Program<'a> {
    rtc: &'a HiprtcFns,
    handle: HiprtcProgram,
}

impl Drop for Program<'_> {
    fn drop(&mut self) {
        // Safety: created by hiprtcCreateProgram and destroyed once. Its status is ignored:
        // nothing it could say changes the compile result already taken.
        let _ = unsafe { (self.rtc.hiprtcDestroyProgram)(&mut self.handle) };
    }
}

impl Program<'_> {
    fn log(&self) -> Result<String, HipError> {
        let mut size = 0usize;
        // Safety: live program, valid out-pointer.
        check(self.rtc, "hiprtcGetProgramLogSize", unsafe {
            (self.rtc.hiprtcGetProgramLogSize)(self.handle, &mut size)
        })?;
        let mut log = vec![0u8; size + 1];
        // Safety: the buffer holds the size hiprtc reported, plus a NUL.
        check(self.rtc, "hiprtcGetProgramLog", unsafe {
            (self.rtc.hiprtcGetProgramLog)(self.handle, log.as_mut_ptr().cast::<c_char>())
        })?;
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        Ok(String::from_utf8_lossy(&log[..end]).into_owned())
    }
}

/// Serialises every compilation in the process: hiprtc of ROCm 5.2 crashes (SIGSEGV inside
/// `hiprtcCompileProgram`) when two threads compile at once, as this crate's tests running in
/// parallel showed. Kernels compile once per backend, so nothing is lost.
static COMPILE_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Compiles `source` (named `name` in logs) with the named `headers` (name, text) available to
/// `#include`, and returns the code object. A compile failure is [`HipError::Compile`] with
/// hiprtc's log.
pub fn compile(
    rtc: &HiprtcFns,
    name: &str,
    source: &str,
    headers: &[(&str, &str)],
    options: &[String],
) -> Result<Vec<u8>, HipError> {
    let _serialised = COMPILE_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let source_c = c_string("source", source)?;
    let name_c = c_string("source name", name)?;
    let header_texts = headers.iter().map(|(_, text)| c_string("header", text)).collect::<Result<Vec<_>, _>>()?;
    let header_names = headers.iter().map(|(name, _)| c_string("header name", name)).collect::<Result<Vec<_>, _>>()?;
    let option_cs = options.iter().map(|o| c_string("option", o)).collect::<Result<Vec<_>, _>>()?;
    let header_text_ptrs: Vec<*const c_char> = header_texts.iter().map(|h| h.as_ptr()).collect();
    let header_name_ptrs: Vec<*const c_char> = header_names.iter().map(|h| h.as_ptr()).collect();
    let option_ptrs: Vec<*const c_char> = option_cs.iter().map(|o| o.as_ptr()).collect();

    let mut handle = std::ptr::null_mut();
    // Safety: every pointer is a NUL-terminated string alive for the call; the arrays hold
    // `headers.len()` entries each.
    check(rtc, "hiprtcCreateProgram", unsafe {
        (rtc.hiprtcCreateProgram)(
            &mut handle,
            source_c.as_ptr(),
            name_c.as_ptr(),
            header_text_ptrs.len() as i32,
            header_text_ptrs.as_ptr(),
            header_name_ptrs.as_ptr(),
        )
    })?;
    let program = Program { rtc, handle };
    // Safety: live program; `option_ptrs` holds that many NUL-terminated strings.
    let status = unsafe { (rtc.hiprtcCompileProgram)(program.handle, option_ptrs.len() as i32, option_ptrs.as_ptr()) };
    if status != 0 {
        let log = program.log().unwrap_or_else(|e| format!("(no log: {e})"));
        let log =
            if log.trim().is_empty() { format!("hiprtc error {status}: {}", error_string(rtc, status)) } else { log };
        return Err(HipError::Compile { source: name.to_string(), options: options.to_vec(), log });
    }
    let mut size = 0usize;
    // Safety: live program, valid out-pointer.
    check(rtc, "hiprtcGetCodeSize", unsafe { (rtc.hiprtcGetCodeSize)(program.handle, &mut size) })?;
    let mut code = vec![0u8; size];
    // Safety: the buffer holds the size hiprtc reported.
    check(rtc, "hiprtcGetCode", unsafe { (rtc.hiprtcGetCode)(program.handle, code.as_mut_ptr().cast::<c_char>()) })?;
    if code.is_empty() {
        return Err(HipError::Compile {
            source: name.to_string(),
            options: options.to_vec(),
            log: "hiprtc reported success but produced an empty code object".into(),
        });
    }
    Ok(code)
}
