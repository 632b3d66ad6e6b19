//! Devices: initialisation, count, selection, attributes, name, device-wide synchronisation.

use std::ffi::{c_char, c_int};

use super::check;
use crate::error::{HipError, HIP_ERROR_NO_DEVICE};
use crate::sys::hip::HipFns;

/// `hipInit(0)`.
pub fn init(hip: &HipFns) -> Result<(), HipError> {
    // Safety: no pointers.
    check(hip, "hipInit", unsafe { (hip.hipInit)(0) })
}

/// `hipGetDeviceCount`; a count of 0 is [`HipError::NoDevice`] too.
pub fn count(hip: &HipFns) -> Result<usize, HipError> {
    let mut count: c_int = 0;
    // Safety: `count` is a valid out-pointer.
    check(hip, "hipGetDeviceCount", unsafe { (hip.hipGetDeviceCount)(&mut count) })?;
    if count <= 0 {
        return Err(HipError::NoDevice {
            call: "hipGetDeviceCount",
            code: 0,
            message: format!("0 devices (as hipErrorNoDevice, {HIP_ERROR_NO_DEVICE})"),
        });
    }
    Ok(count as usize)
}

/// `hipSetDevice`: makes `ordinal` current on the calling thread.
pub fn set(hip: &HipFns, ordinal: c_int) -> Result<(), HipError> {
    // Safety: no pointers.
    check(hip, "hipSetDevice", unsafe { (hip.hipSetDevice)(ordinal) })
}

/// `hipDeviceGetAttribute`.
pub fn attribute(hip: &HipFns, attribute: c_int, ordinal: c_int) -> Result<i32, HipError> {
    let mut value: c_int = 0;
    // Safety: `value` is a valid out-pointer.
    check(hip, "hipDeviceGetAttribute", unsafe { (hip.hipDeviceGetAttribute)(&mut value, attribute, ordinal) })?;
    Ok(value)
}

/// `hipDeviceGetName`.
pub fn name(hip: &HipFns, ordinal: c_int) -> Result<String, HipError> {
    let mut buffer = [0u8; 256];
    let len = buffer.len() as c_int - 1;
    // Safety: the buffer holds `len + 1` bytes; the runtime writes at most `len` and a NUL.
    check(hip, "hipDeviceGetName", unsafe {
        (hip.hipDeviceGetName)(buffer.as_mut_ptr().cast::<c_char>(), len, ordinal)
    })?;
    let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
    Ok(String::from_utf8_lossy(&buffer[..end]).into_owned())
}

/// `hipDeviceSynchronize`.
pub fn synchronize(hip: &HipFns) -> Result<(), HipError> {
    // Safety: no pointers.
    check(hip, "hipDeviceSynchronize", unsafe { (hip.hipDeviceSynchronize)() })
}
