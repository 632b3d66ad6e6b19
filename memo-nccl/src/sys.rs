//! The raw layer: the C types and values of `nccl.h` this crate uses, where the library is
//! searched, and the function table resolved once at load.
//!
//! Values are those of NCCL's `src/nccl.h.in` (2.14 to 2.30; none of these changed), which RCCL's
//! `rccl.h` repeats: `ncclResult_t`, `ncclDataType_t`, `ncclRedOp_t` are C enums (`int`);
//! `ncclUniqueId` is 128 bytes passed by value; `ncclComm_t` and the stream are pointers.
//!
//! A loaded library is never unloaded: NCCL starts threads (its proxy and bootstrap threads)
//! that run its code until the process ends, so the function pointers stay valid for the rest of
//! the process (`'static` tables).

use std::ffi::{c_char, c_int, c_uint, c_void, OsStr};
use std::path::PathBuf;

use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};

use crate::error::NcclError;
use crate::Flavour;

/// `ncclResult_t`.
pub type NcclResult = c_int;
/// `ncclComm_t`.
pub type NcclComm = *mut c_void;
/// `cudaStream_t` / `hipStream_t` (a `CUstream` is the same pointer).
pub type Stream = *mut c_void;

/// `ncclSuccess`.
pub const SUCCESS: NcclResult = 0;
/// `ncclInProgress`: a non-blocking communicator's call is still running.
pub const IN_PROGRESS: NcclResult = 7;
/// `NCCL_UNIQUE_ID_BYTES`.
pub const UNIQUE_ID_BYTES: usize = 128;
/// `NCCL_API_MAGIC`, the `magic` of an `ncclConfig_t` made by `NCCL_CONFIG_INITIALIZER`.
pub const CONFIG_MAGIC: c_uint = 0xcafe_beef;
/// The `ncclConfig_t` version this crate fills: 2.14.0, the first with `blocking`. NCCL reads
/// `size` bytes of the struct and, for a version below each later field's, that field's default
/// (`parseCommConfig` in `src/init.cc`), so this prefix is valid for every NCCL from 2.14 on.
pub const CONFIG_VERSION: c_uint = 21400;

/// The names of `ncclResult_t`, by value.
pub const RESULT_NAMES: [&str; 9] = [
    "ncclSuccess",
    "ncclUnhandledCudaError",
    "ncclSystemError",
    "ncclInternalError",
    "ncclInvalidArgument",
    "ncclInvalidUsage",
    "ncclRemoteError",
    "ncclInProgress",
    "ncclTimeout",
];

/// `ncclResult_t`'s name, or `"unknown ncclResult_t"`.
pub fn result_name(code: NcclResult) -> &'static str {
    usize::try_from(code).ok().and_then(|i| RESULT_NAMES.get(i)).copied().unwrap_or("unknown ncclResult_t")
}

/// `ncclUniqueId`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RawUniqueId {
    /// `char internal[NCCL_UNIQUE_ID_BYTES]`.
    pub internal: [c_char; UNIQUE_ID_BYTES],
}

/// The first fields of `ncclConfig_t` (`ncclConfig_v21400`): `size` says how many bytes NCCL
/// reads, the later fields keep their defaults.
#[repr(C)]
pub struct Config {
    /// `sizeof` this struct.
    pub size: usize,
    /// [`CONFIG_MAGIC`].
    pub magic: c_uint,
    /// [`CONFIG_VERSION`].
    pub version: c_uint,
    /// 0: non-blocking (every call may return `ncclInProgress`; `ncclCommGetAsyncError` says
    /// when it is done).
    pub blocking: c_int,
}

impl Config {
    /// A non-blocking configuration.
    pub fn non_blocking() -> Config {
        Config { size: std::mem::size_of::<Config>(), magic: CONFIG_MAGIC, version: CONFIG_VERSION, blocking: 0 }
    }
}

/// The functions this crate calls, resolved once.
#[derive(Clone, Copy)]
#[allow(missing_docs, non_snake_case)] // each field is the C function of the same name
pub struct Fns {
    pub ncclGetVersion: unsafe extern "C" fn(*mut c_int) -> NcclResult,
    pub ncclGetErrorString: unsafe extern "C" fn(NcclResult) -> *const c_char,
    /// Since NCCL 2.13; `None` when absent.
    pub ncclGetLastError: Option<unsafe extern "C" fn(NcclComm) -> *const c_char>,
    pub ncclGetUniqueId: unsafe extern "C" fn(*mut RawUniqueId) -> NcclResult,
    pub ncclCommInitRankConfig:
        unsafe extern "C" fn(*mut NcclComm, c_int, RawUniqueId, c_int, *mut Config) -> NcclResult,
    /// Since NCCL 2.14; `None` when absent (then destroy without finalizing).
    pub ncclCommFinalize: Option<unsafe extern "C" fn(NcclComm) -> NcclResult>,
    pub ncclCommDestroy: unsafe extern "C" fn(NcclComm) -> NcclResult,
    pub ncclCommAbort: unsafe extern "C" fn(NcclComm) -> NcclResult,
    pub ncclCommGetAsyncError: unsafe extern "C" fn(NcclComm, *mut NcclResult) -> NcclResult,
    pub ncclAllGather: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, NcclComm, Stream) -> NcclResult,
    pub ncclReduceScatter:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, NcclComm, Stream) -> NcclResult,
    pub ncclAllReduce:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, NcclComm, Stream) -> NcclResult,
    pub ncclGroupStart: unsafe extern "C" fn() -> NcclResult,
    pub ncclGroupEnd: unsafe extern "C" fn() -> NcclResult,
}

/// Where the library is looked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Search {
    /// An explicit file (the flavour's variable, e.g. `MEMO_NCCL_LIBRARY`): when set, only it is
    /// tried, so a wrong path is an error rather than silently another library.
    pub file: Option<PathBuf>,
    /// Folders, each with every name of the flavour, in order.
    pub dirs: Vec<PathBuf>,
    /// Then the dynamic linker's own search by name (`LD_LIBRARY_PATH`, `ldconfig`).
    pub system: bool,
}

impl Search {
    /// The flavour's variable if set and not empty, else the given folders then the system search.
    pub fn from_env(flavour: &Flavour, dirs: Vec<PathBuf>) -> Search {
        let file = std::env::var_os(flavour.variable).filter(|v| !v.is_empty()).map(PathBuf::from);
        Search { file, dirs, system: true }
    }

    /// Exactly this file.
    pub fn file(path: impl Into<PathBuf>) -> Search {
        Search { file: Some(path.into()), dirs: Vec::new(), system: false }
    }

    /// Exactly these folders, no system search.
    pub fn only<I: IntoIterator<Item = P>, P: Into<PathBuf>>(dirs: I) -> Search {
        Search { file: None, dirs: dirs.into_iter().map(Into::into).collect(), system: false }
    }
}

/// A loaded library: its handle (never closed) and where it came from.
pub struct Loaded {
    /// The handle, leaked on purpose (see the module docs).
    pub library: &'static Library,
    /// The file or name that was loaded.
    pub origin: String,
}

/// Loads the first file of `search` that opens, or says everything that was tried.
pub fn load(flavour: &Flavour, search: &Search) -> Result<Loaded, NcclError> {
    let mut tried = Vec::new();
    if let Some(file) = &search.file {
        return match open(file.as_os_str()) {
            Ok(library) => Ok(Loaded { library: leak(library), origin: file.display().to_string() }),
            Err(e) => {
                tried.push(format!("{} ({e})", file.display()));
                Err(NcclError::LibraryNotFound { flavour: *flavour, tried })
            }
        };
    }
    for dir in &search.dirs {
        let mut found = false;
        for name in flavour.names {
            let path = dir.join(name);
            if !path.exists() {
                continue;
            }
            found = true;
            match open(path.as_os_str()) {
                Ok(library) => return Ok(Loaded { library: leak(library), origin: path.display().to_string() }),
                Err(e) => tried.push(format!("{} ({e})", path.display())),
            }
        }
        if !found {
            tried.push(format!("{}/{{{}}} (no such file)", dir.display(), flavour.names.join(",")));
        }
    }
    if search.system {
        for name in flavour.names {
            match open(OsStr::new(name)) {
                Ok(library) => return Ok(Loaded { library: leak(library), origin: (*name).to_string() }),
                Err(e) => tried.push(format!("{name} by the system search ({e})")),
            }
        }
    }
    Err(NcclError::LibraryNotFound { flavour: *flavour, tried })
}

fn open(name: &OsStr) -> Result<Library, libloading::Error> {
    // Safety: loading a library runs its initialisers. The files tried are NCCL's or RCCL's (by
    // their names, or the file the user named), whose initialisers only set up their own state.
    unsafe { Library::open(Some(name), RTLD_NOW | RTLD_LOCAL) }
}

fn leak(library: Library) -> &'static Library {
    Box::leak(Box::new(library))
}

/// Resolves `symbol` in `loaded` as a function pointer of type `T`.
///
/// # Safety
/// `T` must be the `extern "C"` function pointer type that matches the symbol's C declaration.
pub unsafe fn resolve<T: Copy>(loaded: &Loaded, symbol: &'static str) -> Result<T, NcclError> {
    let mut name = Vec::with_capacity(symbol.len() + 1);
    name.extend_from_slice(symbol.as_bytes());
    name.push(0);
    // Safety: the caller guarantees the type; the library is never unloaded, so copying the
    // pointer out of the `Symbol` keeps it valid.
    match unsafe { loaded.library.get::<T>(&name) } {
        Ok(found) => Ok(*found),
        Err(_) => Err(NcclError::SymbolNotFound { library: loaded.origin.clone(), symbol }),
    }
}

macro_rules! table {
    ($loaded:expr, $ty:ident { $($field:ident),* $(,)? } optional { $($optional:ident),* $(,)? }) => {
        $ty {
            // Safety: each field's type is the C declaration of the symbol of the same name
            // (`nccl.h`), written out in the struct above.
            $($field: unsafe { resolve(&$loaded, stringify!($field))? },)*
            // Safety: as above (the field is an `Option` of that type).
            $($optional: unsafe { resolve(&$loaded, stringify!($optional)) }.ok(),)*
        }
    };
}

/// Resolves every function. `ncclGetVersion` is resolved first by the caller, to refuse an old
/// library by its version rather than by a missing symbol.
pub fn resolve_all(loaded: &Loaded) -> Result<Fns, NcclError> {
    Ok(table!(
        loaded,
        Fns {
            ncclGetVersion,
            ncclGetErrorString,
            ncclGetUniqueId,
            ncclCommInitRankConfig,
            ncclCommDestroy,
            ncclCommAbort,
            ncclCommGetAsyncError,
            ncclAllGather,
            ncclReduceScatter,
            ncclAllReduce,
            ncclGroupStart,
            ncclGroupEnd,
        } optional {
            ncclGetLastError,
            ncclCommFinalize,
        }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_prefix_has_the_c_layout() {
        // size_t size; unsigned magic; unsigned version; int blocking; padded to 8 on 64-bit.
        assert_eq!(std::mem::offset_of!(Config, magic), 8);
        assert_eq!(std::mem::offset_of!(Config, version), 12);
        assert_eq!(std::mem::offset_of!(Config, blocking), 16);
        assert_eq!(std::mem::size_of::<Config>(), 24);
        assert_eq!(std::mem::size_of::<RawUniqueId>(), 128);
    }

    #[test]
    fn results_have_their_header_names() {
        assert_eq!(result_name(0), "ncclSuccess");
        assert_eq!(result_name(4), "ncclInvalidArgument");
        assert_eq!(result_name(IN_PROGRESS), "ncclInProgress");
        assert_eq!(result_name(8), "ncclTimeout");
        assert_eq!(result_name(9), "unknown ncclResult_t");
        assert_eq!(result_name(-1), "unknown ncclResult_t");
    }
}
