//! The raw layer: C types, the constants this crate uses (each with the header it comes from),
//! where the libraries are searched, and one function table per library resolved once at load.
//!
//! Loaded libraries are never unloaded: ROCm's runtimes start threads and register exit
//! handlers, so unloading them while the process runs is not safe. That also makes every
//! resolved function pointer valid for the rest of the process (`'static` tables).

pub mod hip;
pub mod hipblas;
pub mod hiprtc;

use std::ffi::{c_int, c_void};
use std::path::{Path, PathBuf};

use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};

use crate::error::HipError;

/// `hipError_t`.
pub type HipErrorCode = c_int;
/// `hipStream_t`.
pub type HipStream = *mut c_void;
/// `hipEvent_t`.
pub type HipEvent = *mut c_void;
/// `hipModule_t`.
pub type HipModule = *mut c_void;
/// `hipFunction_t`.
pub type HipFunction = *mut c_void;
/// `hiprtcProgram`.
pub type HiprtcProgram = *mut c_void;
/// `hipblasHandle_t`.
pub type HipblasHandle = *mut c_void;

/// Where the libraries are looked for.
///
/// The default ([`LibrarySearch::from_env`]) is what the issue asks: `$ROCM_PATH/lib`,
/// `$HIP_PATH/lib`, `/opt/rocm/lib`, then the dynamic linker's own search by name (which
/// honours `LD_LIBRARY_PATH` and `ldconfig`) for each versioned name, newest first.
/// [`LibrarySearch::only`] looks in the given folders and nowhere else, so a test can point at
/// an empty folder (no library) or at an unpacked runtime in the same process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LibrarySearch {
    /// Folders, in order.
    pub dirs: Vec<PathBuf>,
    /// Then ask the dynamic linker by file name.
    pub system: bool,
}

impl LibrarySearch {
    /// `$ROCM_PATH/lib`, `$HIP_PATH/lib`, `/opt/rocm/lib`, then the system search.
    pub fn from_env() -> Self {
        let mut dirs = Vec::new();
        for var in ["ROCM_PATH", "HIP_PATH"] {
            if let Some(root) = std::env::var_os(var).filter(|v| !v.is_empty()) {
                dirs.push(Path::new(&root).join("lib"));
            }
        }
        dirs.push(PathBuf::from("/opt/rocm/lib"));
        LibrarySearch { dirs, system: true }
    }

    /// Exactly these folders, no system search.
    pub fn only<I: IntoIterator<Item = P>, P: Into<PathBuf>>(dirs: I) -> Self {
        LibrarySearch { dirs: dirs.into_iter().map(Into::into).collect(), system: false }
    }
}

impl Default for LibrarySearch {
    fn default() -> Self {
        Self::from_env()
    }
}

/// Libraries a ROCm library needs, preloaded by full path when they sit in the same folder
/// (with those named in the folder's [`PRELOAD_LIST`]). Debian's packages unpacked into a cache
/// folder have no RUNPATH pointing at their neighbours and `LD_LIBRARY_PATH` cannot change once
/// the process runs; a library already loaded satisfies a later dependency on its soname, so
/// loading these first makes the unpacked runtime loadable. On an installed ROCm (RUNPATH
/// `$ORIGIN`) this changes nothing.
const NEIGHBOURS: &[&str] = &[
    "libnuma.so.1",
    "libelf.so.1",
    "libdrm.so.2",
    "libdrm_amdgpu.so.1",
    "libz.so.1",
    "libLLVM-15.so.1",
    "libhsakmt.so.1",
    "libhsa-runtime64.so.1",
    "libamd_comgr.so.3",
    "libamd_comgr.so.2",
    "libhiprtc-builtins.so.7",
    "libhiprtc-builtins.so.6",
    "libhiprtc-builtins.so.5",
];

/// A loaded library: its handle (never closed) and where it came from.
pub struct Loaded {
    /// The handle, leaked on purpose (see the module docs).
    pub library: &'static Library,
    /// The file or name that was loaded.
    pub origin: String,
}

/// Loads the first of `names` found in `search` (folders first, then by name), or says
/// everything that was tried.
pub fn load(library: &'static str, names: &[&str], search: &LibrarySearch) -> Result<Loaded, HipError> {
    let mut tried = Vec::new();
    for dir in &search.dirs {
        let mut found_in_dir = false;
        for name in names {
            let path = dir.join(name);
            if !path.exists() {
                continue;
            }
            if !found_in_dir {
                preload_neighbours(dir);
                found_in_dir = true;
            }
            match open(Some(path.as_os_str())) {
                Ok(lib) => return Ok(Loaded { library: leak(lib), origin: path.display().to_string() }),
                Err(e) => tried.push(format!("{} ({e})", path.display())),
            }
        }
        if !found_in_dir {
            tried.push(format!("{}/{{{}}} (no such file)", dir.display(), names.join(",")));
        }
    }
    if search.system {
        // Names the loader simply did not find are listed once; any other failure with its error.
        let mut not_found = Vec::new();
        for name in names {
            match open(Some(std::ffi::OsStr::new(name))) {
                Ok(lib) => return Ok(Loaded { library: leak(lib), origin: (*name).to_string() }),
                Err(e) if e.to_string().contains("No such file or directory") => not_found.push(*name),
                Err(e) => tried.push(format!("{name} by the system search ({e})")),
            }
        }
        if !not_found.is_empty() {
            tried.push(format!("{{{}}} by the system search (not found)", not_found.join(",")));
        }
    }
    Err(HipError::LibraryNotFound { library, tried })
}

/// The file `scripts/fetch-rocm.sh` writes into an unpacked runtime's folder: the libraries
/// there, one file name per line, to load before the runtime itself.
pub const PRELOAD_LIST: &str = "memo-preload.txt";

fn preload_neighbours(dir: &Path) {
    let listed = std::fs::read_to_string(dir.join(PRELOAD_LIST)).unwrap_or_default();
    let mut pending: Vec<PathBuf> = NEIGHBOURS
        .iter()
        .copied()
        .chain(listed.lines().map(str::trim).filter(|l| !l.is_empty() && !l.contains('/')))
        .map(|name| dir.join(name))
        .filter(|path| path.exists())
        .collect();
    // A library loads once everything it needs is loaded: retry in passes while one succeeds.
    // A failure here is not an error yet: if the main library then fails to load, its own
    // dlopen message names the dependency that is missing.
    loop {
        let before = pending.len();
        pending.retain(|path| match open(Some(path.as_os_str())) {
            Ok(lib) => {
                leak(lib);
                false
            }
            Err(_) => true,
        });
        if pending.is_empty() || pending.len() == before {
            break;
        }
    }
}

fn open(name: Option<&std::ffi::OsStr>) -> Result<Library, libloading::Error> {
    // Safety: loading a library runs its initialisers. The libraries named here are ROCm's
    // own (or the ones they depend on), whose initialisers only set up their runtime state.
    // RTLD_GLOBAL so that libraries they load later by name (comgr, the hiprtc builtins) can
    // resolve against them.
    unsafe { Library::open(name, RTLD_NOW | RTLD_GLOBAL) }
}

fn leak(library: Library) -> &'static Library {
    Box::leak(Box::new(library))
}

/// Resolves `symbol` in `loaded` as a function pointer of type `T`.
///
/// # Safety
/// `T` must be the `extern "C"` function pointer type that matches the symbol's C declaration.
pub unsafe fn resolve<T: Copy>(loaded: &Loaded, symbol: &'static str) -> Result<T, HipError> {
    let mut name = Vec::with_capacity(symbol.len() + 1);
    name.extend_from_slice(symbol.as_bytes());
    name.push(0);
    // Safety: the caller guarantees the type; the library is never unloaded, so copying the
    // pointer out of the `Symbol` keeps it valid.
    match unsafe { loaded.library.get::<T>(&name) } {
        Ok(found) => Ok(*found),
        Err(_) => Err(HipError::SymbolNotFound { library: loaded.origin.clone(), symbol }),
    }
}

/// Like [`resolve`], `None` when the library lacks the symbol.
///
/// # Safety
/// As [`resolve`].
pub unsafe fn resolve_optional<T: Copy>(loaded: &Loaded, symbol: &'static str) -> Option<T> {
    // Safety: as `resolve`.
    unsafe { resolve(loaded, symbol) }.ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_search_ends_with_opt_rocm_and_the_system() {
        let search = LibrarySearch::from_env();
        assert_eq!(search.dirs.last(), Some(&PathBuf::from("/opt/rocm/lib")));
        assert!(search.system);
        assert!(!LibrarySearch::only(["/nowhere"]).system);
    }

    #[test]
    fn a_folder_without_the_library_is_listed_with_every_name_tried() {
        let dir = std::env::temp_dir().join(format!("memo-runtime-hip-sys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temporary folder");
        match load("libhipblas", hipblas::NAMES, &LibrarySearch::only([&dir])) {
            Err(HipError::LibraryNotFound { library, tried }) => {
                assert_eq!(library, "libhipblas");
                assert_eq!(
                    tried,
                    vec![format!(
                        "{}/{{libhipblas.so,libhipblas.so.3,libhipblas.so.2,libhipblas.so.1,libhipblas.so.0}} (no such file)",
                        dir.display()
                    )]
                );
            }
            Err(other) => panic!("{other}"),
            Ok(loaded) => panic!("loaded {} from an empty folder", loaded.origin),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_that_is_not_a_library_is_reported_with_the_loader_message() {
        let dir = std::env::temp_dir().join(format!("memo-runtime-hip-sys-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temporary folder");
        std::fs::write(dir.join("libamdhip64.so"), b"not an ELF file").expect("write");
        match load("libamdhip64", hip::NAMES, &LibrarySearch::only([&dir])) {
            Err(HipError::LibraryNotFound { tried, .. }) => {
                assert_eq!(tried.len(), 1, "{tried:?}");
                assert!(tried[0].starts_with(&format!("{}/libamdhip64.so (", dir.display())), "{tried:?}");
            }
            Err(other) => panic!("{other}"),
            Ok(loaded) => panic!("loaded {}", loaded.origin),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
