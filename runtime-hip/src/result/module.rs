//! Code objects: load, look up a kernel, launch, unload.

use std::ffi::{c_void, CString};

use super::check;
use crate::error::HipError;
use crate::sys::hip::HipFns;
use crate::sys::{HipFunction, HipModule, HipStream};

/// `hipModuleLoadData` of a code object hiprtc produced.
pub fn load_data(hip: &HipFns, image: &[u8]) -> Result<HipModule, HipError> {
    if image.is_empty() {
        return Err(HipError::Unsupported("hipModuleLoadData: the code object is empty".into()));
    }
    let mut module = std::ptr::null_mut();
    // Safety: `module` is a valid out-pointer; `image` is a complete code object (its length is
    // encoded in its ELF header) that outlives the call.
    check(hip, "hipModuleLoadData", unsafe { (hip.hipModuleLoadData)(&mut module, image.as_ptr().cast()) })?;
    Ok(module)
}

/// `hipModuleGetFunction`.
///
/// # Safety
/// `module` is live.
pub unsafe fn function(hip: &HipFns, module: HipModule, name: &str) -> Result<HipFunction, HipError> {
    let name = CString::new(name).map_err(|_| HipError::Unsupported(format!("kernel name {name:?} contains NUL")))?;
    let mut function = std::ptr::null_mut();
    // Safety: valid out-pointer, NUL-terminated name, live module (caller).
    check(hip, "hipModuleGetFunction", unsafe { (hip.hipModuleGetFunction)(&mut function, module, name.as_ptr()) })?;
    Ok(function)
}

/// `hipModuleLaunchKernel` with parameters passed as an array of pointers to each value.
///
/// # Safety
/// `function` is live, `params` point at values of the kernel's parameter types in order, and
/// every device address among them stays valid until the kernel completes on `stream`.
pub unsafe fn launch(
    hip: &HipFns,
    function: HipFunction,
    grid: [u32; 3],
    block: [u32; 3],
    shared_bytes: u32,
    stream: HipStream,
    params: &mut [*mut c_void],
) -> Result<(), HipError> {
    // Safety: the caller's contract; `extra` is null, as allowed when `kernelParams` is used.
    check(hip, "hipModuleLaunchKernel", unsafe {
        (hip.hipModuleLaunchKernel)(
            function,
            grid[0],
            grid[1],
            grid[2],
            block[0],
            block[1],
            block[2],
            shared_bytes,
            stream,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    })
}

/// `hipModuleUnload`.
///
/// # Safety
/// `module` came from [`load_data`]; none of its functions is used afterwards.
pub unsafe fn unload(hip: &HipFns, module: HipModule) -> Result<(), HipError> {
    // Safety: the caller's contract.
    check(hip, "hipModuleUnload", unsafe { (hip.hipModuleUnload)(module) })
}
