//! The CUDA runtime as a device allocator, loaded at run time with `libloading`: nothing is linked
//! at build time, and a machine without CUDA gets an error from the first allocation, never a
//! panic or a failed load of this library.
//!
//! The runtime is looked for under the path in `MEMO_CUDART_PATH` if set, else under the usual
//! sonames. A copy already loaded into the process is preferred (on Linux, every name is first
//! tried with `RTLD_NOLOAD`): in a PyTorch process the wheel has already loaded its
//! `libcudart.so.<major>`, and using that copy avoids a second runtime beside it.

use std::ffi::{c_char, c_int, c_void, CStr};

use libloading::Library;

use super::{DeviceAllocator, DeviceError};

/// The environment variable naming the CUDA runtime library to load instead of the defaults.
pub const CUDART_PATH_VARIABLE: &str = "MEMO_CUDART_PATH";

/// The library names tried, in order, when `MEMO_CUDART_PATH` is not set.
pub const CUDART_NAMES: &[&str] = if cfg!(windows) {
    &["cudart64_13.dll", "cudart64_12.dll", "cudart64_110.dll"]
} else {
    &["libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"]
};

type CudaMalloc = unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int;
type CudaFree = unsafe extern "C" fn(*mut c_void) -> c_int;
type CudaGetDevice = unsafe extern "C" fn(*mut c_int) -> c_int;
type CudaSetDevice = unsafe extern "C" fn(c_int) -> c_int;
type CudaGetErrorString = unsafe extern "C" fn(c_int) -> *const c_char;

/// The entry points, valid while `_library` is loaded (it is kept here, beside them).
struct Api {
    malloc: CudaMalloc,
    free: CudaFree,
    get_device: CudaGetDevice,
    set_device: CudaSetDevice,
    error_string: CudaGetErrorString,
    _library: Library,
}

impl Api {
    /// Loads the first library of `candidates` that has every entry point, preferring one that
    /// is loaded already.
    fn load(candidates: &[String]) -> Result<Api, String> {
        if let Some(api) = candidates.iter().find_map(|name| already_loaded(name).and_then(|l| Api::bind(l).ok())) {
            return Ok(api);
        }
        let mut failures = Vec::new();
        for name in candidates {
            // Safety: loading the CUDA runtime runs its initialisers, which have no preconditions
            // and are what every CUDA program runs.
            let library = match unsafe { Library::new(name) } {
                Ok(library) => library,
                Err(e) => {
                    failures.push(format!("{name}: {e}"));
                    continue;
                }
            };
            match Api::bind(library) {
                Ok(api) => return Ok(api),
                Err(e) => failures.push(format!("{name}: {e}")),
            }
        }
        Err(format!(
            "cannot load the CUDA runtime ({}); install CUDA or set {CUDART_PATH_VARIABLE} to the path of libcudart",
            failures.join("; ")
        ))
    }

    /// The entry points of a loaded CUDA runtime.
    fn bind(library: Library) -> Result<Api, libloading::Error> {
        // Safety: the types are the CUDA runtime API's C signatures (cuda_runtime_api.h); the
        // pointers are copied out of the symbols and stay valid because the library is moved into
        // the same struct and unloaded only with it.
        unsafe {
            Ok(Api {
                malloc: *library.get::<CudaMalloc>(b"cudaMalloc\0")?,
                free: *library.get::<CudaFree>(b"cudaFree\0")?,
                get_device: *library.get::<CudaGetDevice>(b"cudaGetDevice\0")?,
                set_device: *library.get::<CudaSetDevice>(b"cudaSetDevice\0")?,
                error_string: *library.get::<CudaGetErrorString>(b"cudaGetErrorString\0")?,
                _library: library,
            })
        }
    }

    /// A CUDA error code in words.
    fn describe(&self, code: c_int) -> String {
        // Safety: cudaGetErrorString accepts any code and returns a static string or NULL.
        let text = unsafe { (self.error_string)(code) };
        if text.is_null() {
            return format!("CUDA error {code}");
        }
        // Safety: not NULL; the runtime returns a NUL-terminated static string.
        let text = unsafe { CStr::from_ptr(text) };
        format!("{} (CUDA error {code})", text.to_string_lossy())
    }

    /// Runs `f` with `device` current on this thread, then restores the previous device.
    fn on_device<T>(&self, device: i32, f: impl FnOnce() -> Result<T, DeviceError>) -> Result<T, DeviceError> {
        let mut current: c_int = 0;
        // Safety: writes one int through a valid pointer.
        let code = unsafe { (self.get_device)(&mut current) };
        if code != 0 {
            return Err(DeviceError::new(format!("cudaGetDevice failed: {}", self.describe(code))));
        }
        if current == device {
            return f();
        }
        // Safety: plain call; an invalid device is reported by the code.
        let code = unsafe { (self.set_device)(device) };
        if code != 0 {
            return Err(DeviceError::new(format!("cudaSetDevice({device}) failed: {}", self.describe(code))));
        }
        let result = f();
        // Safety: as above; `current` was the valid current device.
        unsafe { (self.set_device)(current) };
        result
    }
}

/// `name` if the process has loaded it already (Linux: `dlopen` with `RTLD_NOLOAD`), else None.
#[cfg(target_os = "linux")]
fn already_loaded(name: &str) -> Option<Library> {
    use libloading::os::unix::{Library as UnixLibrary, RTLD_LOCAL, RTLD_NOW};
    /// glibc's and musl's value of `RTLD_NOLOAD`: only return a handle to a loaded library.
    const RTLD_NOLOAD: c_int = 4;
    // Safety: with RTLD_NOLOAD nothing is loaded and no initialiser runs; a hit only adds a
    // reference to a library that is loaded already.
    unsafe { UnixLibrary::open(Some(name), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD) }.ok().map(Library::from)
}

/// Elsewhere, no cheap way to ask: load as usual.
#[cfg(not(target_os = "linux"))]
fn already_loaded(_name: &str) -> Option<Library> {
    None
}

/// `cudaMalloc`/`cudaFree` of a CUDA runtime loaded on first use.
pub struct CudaAllocator {
    candidates: Vec<String>,
    /// The loaded runtime, or why it could not be loaded (tried once).
    api: Option<Result<Api, String>>,
}

impl CudaAllocator {
    /// Loads from `MEMO_CUDART_PATH` if set, else from [`CUDART_NAMES`], on first use.
    pub fn new() -> Self {
        let candidates = match std::env::var(CUDART_PATH_VARIABLE) {
            Ok(path) if !path.is_empty() => vec![path],
            _ => CUDART_NAMES.iter().map(|name| name.to_string()).collect(),
        };
        CudaAllocator::with_candidates(candidates)
    }

    /// Loads from the first of `candidates` that works, on first use.
    pub fn with_candidates(candidates: Vec<String>) -> Self {
        CudaAllocator { candidates, api: None }
    }

    fn api(&mut self) -> Result<&Api, DeviceError> {
        let candidates = &self.candidates;
        self.api.get_or_insert_with(|| Api::load(candidates)).as_ref().map_err(|e| DeviceError::new(e.clone()))
    }
}

impl Default for CudaAllocator {
    fn default() -> Self {
        CudaAllocator::new()
    }
}

impl DeviceAllocator for CudaAllocator {
    fn allocate(&mut self, size: usize, device: i32, _stream: usize) -> Result<usize, DeviceError> {
        let api = self.api()?;
        api.on_device(device, || {
            let mut pointer: *mut c_void = std::ptr::null_mut();
            // Safety: cudaMalloc writes one pointer through a valid pointer to a local.
            let code = unsafe { (api.malloc)(&mut pointer, size) };
            if code != 0 {
                return Err(DeviceError::new(format!("cudaMalloc({size}) failed: {}", api.describe(code))));
            }
            if pointer.is_null() {
                return Err(DeviceError::new(format!("cudaMalloc({size}) returned NULL")));
            }
            Ok(pointer.expose_provenance())
        })
    }

    fn free(&mut self, address: usize, _size: usize, device: i32, _stream: usize) -> Result<(), DeviceError> {
        let api = self.api()?;
        api.on_device(device, || {
            // Safety: `address` came from cudaMalloc (the caller frees only what `allocate`
            // returned, once); cudaFree reports anything else as an error code.
            let code = unsafe { (api.free)(std::ptr::with_exposed_provenance_mut(address)) };
            if code != 0 {
                return Err(DeviceError::new(format!("cudaFree({address:#x}) failed: {}", api.describe(code))));
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_runtime_is_an_error_naming_what_was_tried() {
        let mut cuda = CudaAllocator::with_candidates(vec!["/nonexistent/libcudart.so.99".to_string()]);
        let error = cuda.allocate(1024, 0, 0).unwrap_err();
        assert!(error.message.contains("/nonexistent/libcudart.so.99"), "{}", error.message);
        assert!(error.message.contains(CUDART_PATH_VARIABLE), "{}", error.message);
        // Tried once, the same answer every time.
        assert_eq!(cuda.free(0x1000, 1, 0, 0).unwrap_err(), error);
    }

    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn only_loaded_libraries_are_found_without_loading() {
        assert!(already_loaded("libc.so.6").is_some());
        assert!(already_loaded("libmemo-never-loaded.so.77").is_none());
    }

    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn a_library_without_the_entry_points_is_refused() {
        // The C library loads but has no cudaMalloc.
        let mut cuda = CudaAllocator::with_candidates(vec!["libc.so.6".to_string()]);
        let error = cuda.allocate(1024, 0, 0).unwrap_err();
        assert!(error.message.contains("cudaMalloc"), "{}", error.message);
    }
}
