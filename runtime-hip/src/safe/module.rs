//! Compiling `memo_kernels::SOURCES` with hiprtc, and [`Module`]: a loaded code object with its
//! kernels, unloaded on drop.

use std::collections::HashMap;
use std::ffi::c_void;

use memo_kernels::{Source, Target};

use super::Device;
use crate::error::HipError;
use crate::result;
use crate::sys::hiprtc::HiprtcFns;
use crate::sys::{HipFunction, HipModule, HipStream};

/// The name under which [`memo_kernels::HEADER`] is offered to `#include`.
pub const HEADER_NAME: &str = "memo_gpu.h";

/// Compiles one kernel source with `options` (the shared header available).
pub fn compile_source(rtc: &HiprtcFns, source: &Source, options: &[String]) -> Result<Vec<u8>, HipError> {
    result::hiprtc::compile(rtc, source.name, source.text, &[(HEADER_NAME, memo_kernels::HEADER)], options)
}

/// The options for the GPU in use: those of [`memo_kernels::compile_options`] for HIP, with the
/// architecture either `arch` or, when `None`, left out so that hiprtc compiles for the current
/// device (its documented default).
pub fn device_options(arch: Option<&str>) -> Vec<String> {
    let mut options: Vec<String> = memo_kernels::compile_options(Target::Hip { gfx: "gfx90a" })
        .into_iter()
        .filter(|o| !o.starts_with("--offload-arch="))
        .collect();
    if let Some(arch) = arch {
        options.insert(0, format!("--offload-arch={arch}"));
    }
    options
}

/// A loaded code object and its kernels by name.
pub struct Module {
    device: Device,
    raw: HipModule,
    functions: HashMap<&'static str, HipFunction>,
}

// Safety: module and function handles are process-wide (see the module docs of `safe`).
unsafe impl Send for Module {}

impl Module {
    /// Loads `code` (from [`compile_source`]) and looks up each of `kernels`.
    pub fn load(device: &Device, code: &[u8], source: &str, kernels: &[&'static str]) -> Result<Self, HipError> {
        let raw = result::module::load_data(device.hip(), code)?;
        let mut module = Module { device: device.clone(), raw, functions: HashMap::new() };
        for &kernel in kernels {
            // Safety: the module is live (owned above).
            let function = unsafe { result::module::function(device.hip(), raw, kernel) }.map_err(|e| {
                HipError::Unsupported(format!(
                    "kernels/{source} declares kernel `{kernel}` but its code object lacks it: {e}"
                ))
            })?;
            module.functions.insert(kernel, function);
        }
        Ok(module)
    }

    /// The kernel named `name`, if this module has it.
    pub fn function(&self, name: &str) -> Option<HipFunction> {
        self.functions.get(name).copied()
    }

    /// Launches `function` (one of this module's) with `params` (pointers to each value).
    ///
    /// # Safety
    /// As `result::module::launch`.
    pub unsafe fn launch(
        &self,
        function: HipFunction,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        stream: HipStream,
        params: &mut [*mut c_void],
    ) -> Result<(), HipError> {
        // Safety: the caller's contract.
        unsafe { result::module::launch(self.device.hip(), function, grid, block, shared_bytes, stream, params) }
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // Safety: loaded in `load`, unloaded once, here; its functions go with it.
        if let Err(error) = unsafe { result::module::unload(self.device.hip(), self.raw) } {
            self.device.defer(error);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_options_take_the_arch_given_or_leave_it_to_hiprtc() {
        assert_eq!(device_options(None), vec!["-std=c++17".to_string(), "-DMEMO_HIP=1".to_string()]);
        assert_eq!(device_options(Some("gfx942"))[0], "--offload-arch=gfx942");
        assert_eq!(device_options(Some("gfx942")).len(), 3);
    }
}
