//! Compile-checking kernels with an NVRTC library at an explicit path, with no GPU and no CUDA
//! install: `scripts/test.sh` (the README's test command) fetches NVIDIA's NVRTC wheel into `.cache/nvrtc/` (`scripts/fetch-nvrtc.sh`)
//! and the compile test loads `libnvrtc.so` from there with `libloading`.
//!
//! The backend itself compiles through cudarc (which finds NVRTC on the library path); this
//! module exists because cudarc's loader cannot be pointed at a folder, and a test must not
//! depend on `LD_LIBRARY_PATH` being set by whoever runs `cargo test`.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};

use crate::error::CudaError;

/// `nvrtcResult`: 0 is success.
type NvrtcResult = c_int;
/// `nvrtcProgram`.
type Program = *mut c_void;

type CreateProgram = unsafe extern "C" fn(
    *mut Program,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> NvrtcResult;
type CompileProgram = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> NvrtcResult;
type GetSize = unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult;
type GetBytes = unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult;
type DestroyProgram = unsafe extern "C" fn(*mut Program) -> NvrtcResult;
type Version = unsafe extern "C" fn(*mut c_int, *mut c_int) -> NvrtcResult;

/// An NVRTC library loaded from a path.
pub struct Nvrtc {
    library: libloading::Library,
    path: PathBuf,
}

/// What one compilation produced.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// The compiler's log (warnings; with `--ptxas-options=-v`, registers and spills per kernel).
    pub log: String,
    /// Bytes of the cubin.
    pub cubin_bytes: usize,
}

impl Nvrtc {
    /// The repository's cache folder of `scripts/fetch-nvrtc.sh`, if the script completed there;
    /// otherwise why not (the script's last failure, or that it has not run).
    pub fn cache_folder() -> Result<PathBuf, String> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap_or(Path::new("."));
        let folder = root.join(".cache").join("nvrtc");
        if folder.join("READY").is_file() {
            return Ok(folder);
        }
        match std::fs::read_to_string(root.join(".cache").join("nvrtc.failed")) {
            Ok(reason) => Err(format!("scripts/fetch-nvrtc.sh failed: {}", reason.trim())),
            Err(_) => Err("no .cache/nvrtc/READY: scripts/fetch-nvrtc.sh has not run".into()),
        }
    }

    /// Loads the NVRTC library at `path` (`libnvrtc.so`, e.g. from [`Nvrtc::cache_folder`]) and
    /// checks it has `nvrtcCreateProgram`.
    ///
    /// # Safety
    /// `path` must be an NVRTC library (CUDA 12 or 13's `libnvrtc.so`): this runs its
    /// initialisers, and [`Nvrtc::version`] and [`Nvrtc::compile`] call its functions through
    /// the signatures of `nvrtc.h`, which nothing can check; a different library exporting
    /// those names with other signatures is undefined behaviour. The path is trusted, not
    /// verified.
    pub unsafe fn load(path: &Path) -> Result<Self, CudaError> {
        // Safety: the caller's promise (above): `path` is NVRTC, whose initialisers have no
        // preconditions on us; the library stays loaded as long as `self` lives, and every
        // symbol is used only through it.
        let library = unsafe { libloading::Library::new(path) }
            .map_err(|e| CudaError::NvrtcLibrary(format!("cannot load NVRTC from {}: {e}", path.display())))?;
        let nvrtc = Nvrtc { library, path: path.to_path_buf() };
        nvrtc.symbol::<CreateProgram>(b"nvrtcCreateProgram\0")?;
        Ok(nvrtc)
    }

    fn symbol<T: Copy>(&self, name: &[u8]) -> Result<T, CudaError> {
        // Safety: each call site names a type `T` that is the documented C signature of `name`
        // in nvrtc.h (CUDA 12), and `load`'s caller promised the library is NVRTC; the pointer
        // is copied out and used only while `self` lives.
        let symbol = unsafe { self.library.get::<T>(name) }.map_err(|e| {
            CudaError::NvrtcLibrary(format!(
                "{} lacks {}: {e}",
                self.path.display(),
                String::from_utf8_lossy(name).trim_end_matches('\0')
            ))
        })?;
        Ok(*symbol)
    }

    /// NVRTC's (major, minor) version.
    pub fn version(&self) -> Result<(i32, i32), CudaError> {
        let version = self.symbol::<Version>(b"nvrtcVersion\0")?;
        let (mut major, mut minor) = (0, 0);
        // Safety: both pointers are to live locals, as nvrtcVersion requires.
        let status = unsafe { version(&mut major, &mut minor) };
        if status != 0 {
            return Err(CudaError::NvrtcLibrary(format!("nvrtcVersion failed with status {status}")));
        }
        Ok((major, minor))
    }

    /// Compiles `source` (named `name` in the log) with `options`; an error carries the log and
    /// the options.
    pub fn compile(&self, name: &str, source: &str, options: &[String]) -> Result<Compiled, CudaError> {
        let create = self.symbol::<CreateProgram>(b"nvrtcCreateProgram\0")?;
        let compile = self.symbol::<CompileProgram>(b"nvrtcCompileProgram\0")?;
        let log_size = self.symbol::<GetSize>(b"nvrtcGetProgramLogSize\0")?;
        let get_log = self.symbol::<GetBytes>(b"nvrtcGetProgramLog\0")?;
        let cubin_size = self.symbol::<GetSize>(b"nvrtcGetCUBINSize\0")?;
        let destroy = self.symbol::<DestroyProgram>(b"nvrtcDestroyProgram\0")?;
        let nul = |what: String| CudaError::NvrtcLibrary(format!("{what} holds a NUL byte"));
        let c_source = CString::new(source).map_err(|_| nul(format!("{name}: the source")))?;
        let c_name = CString::new(name).map_err(|_| nul(format!("{name}: the name")))?;
        let c_options: Vec<CString> = options
            .iter()
            .map(|o| CString::new(o.as_str()).map_err(|_| nul(format!("option {o:?}"))))
            .collect::<Result<_, _>>()?;
        let option_ptrs: Vec<*const c_char> = c_options.iter().map(|o| o.as_ptr()).collect();
        let mut program: Program = std::ptr::null_mut();
        // Safety: the strings are NUL-terminated and outlive the call; no headers are passed
        // (count 0, null arrays), which nvrtcCreateProgram allows.
        let status =
            unsafe { create(&mut program, c_source.as_ptr(), c_name.as_ptr(), 0, std::ptr::null(), std::ptr::null()) };
        if status != 0 {
            return Err(CudaError::NvrtcLibrary(format!("{name}: nvrtcCreateProgram failed with status {status}")));
        }
        let count =
            c_int::try_from(option_ptrs.len()).map_err(|_| CudaError::NvrtcLibrary("too many options".into()))?;
        // Safety: `program` was created above; the option pointers live in `c_options`.
        let compiled = unsafe { compile(program, count, option_ptrs.as_ptr()) };
        let mut size = 0usize;
        // Safety: `program` is live; `size` is a live local.
        let mut log = if unsafe { log_size(program, &mut size) } == 0 && size > 0 {
            let mut bytes = vec![0u8; size];
            // Safety: `bytes` holds the `size` bytes nvrtcGetProgramLogSize asked for.
            if unsafe { get_log(program, bytes.as_mut_ptr().cast()) } == 0 {
                CStr::from_bytes_until_nul(&bytes).map(|c| c.to_string_lossy().into_owned()).unwrap_or_default()
            } else {
                String::new()
            }
        } else {
            String::new()
        };
        let mut cubin_bytes = 0usize;
        if compiled == 0 {
            // Safety: `program` is live and compiled; `cubin_bytes` is a live local.
            if unsafe { cubin_size(program, &mut cubin_bytes) } != 0 {
                cubin_bytes = 0;
            }
        }
        // Safety: `program` is live and not used after this.
        unsafe { destroy(&mut program) };
        if compiled != 0 {
            if log.is_empty() {
                log = format!("(no log; status {compiled})");
            }
            return Err(CudaError::Nvrtc { source: name.to_string(), options: options.to_vec(), log });
        }
        Ok(Compiled { log, cubin_bytes })
    }
}
