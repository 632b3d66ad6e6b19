//! Finding the CUDA libraries before cudarc touches them: cudarc loads each library lazily and
//! PANICS when it is missing, so every library is probed first and absence becomes
//! [`BackendError::Unavailable`] saying which library and how to fix it.

use memo_runtime::BackendError;

/// Folders where CUDA installs put its libraries, named in the hint when one is missing.
const USUAL_FOLDERS: &[&str] =
    &["/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib", "/usr/lib/x86_64-linux-gnu"];

/// The usual folders, and the `nvidia/*/lib` folders of Python's site-packages (PyTorch's CUDA
/// wheels put the libraries there).
fn folders() -> Vec<String> {
    let mut folders: Vec<String> = USUAL_FOLDERS.iter().map(|f| f.to_string()).collect();
    for root in ["/usr/local/lib", "/usr/lib", "/opt/conda/lib"] {
        let Ok(entries) = std::fs::read_dir(root) else { continue };
        for python in entries.flatten().filter(|e| e.file_name().to_string_lossy().starts_with("python3")) {
            for packages in ["site-packages", "dist-packages"] {
                let nvidia = python.path().join(packages).join("nvidia");
                let Ok(libraries) = std::fs::read_dir(&nvidia) else { continue };
                for library in libraries.flatten() {
                    folders.push(library.path().join("lib").to_string_lossy().into_owned());
                }
            }
        }
    }
    folders
}

/// Files in the usual folders whose names start with `prefix` (for the hint).
pub(crate) fn found_elsewhere(prefix: &str) -> Vec<String> {
    let mut found = Vec::new();
    for folder in folders() {
        let Ok(entries) = std::fs::read_dir(&folder) else { continue };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(prefix) {
                found.push(format!("{folder}/{name}"));
            }
        }
    }
    found.sort();
    found
}

fn missing(library: &str, what: &str, stem: &str) -> BackendError {
    let candidates = cudarc::get_lib_name_candidates(stem);
    let mut names: Vec<&str> = Vec::new();
    for name in candidates.iter().map(String::as_str).filter(|n| n.contains(".so")) {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    let elsewhere = found_elsewhere(&format!("lib{stem}.so"));
    let hint = if elsewhere.is_empty() {
        String::new()
    } else {
        format!(
            "; found {} outside the loader's path: put its folder on LD_LIBRARY_PATH (a name not looked for, such as \
             a newer major version, needs a link named {library} in a folder of your own, then that folder)",
            elsewhere.join(", ")
        )
    };
    // cudarc knows about fifteen names for libcuda; the first few say what kind of name was tried.
    const SHOWN: usize = 3;
    let looked_for = if names.len() > SHOWN {
        format!("{} and {} other names", names[..SHOWN].join(", "), names.len() - SHOWN)
    } else {
        names.join(", ")
    };
    BackendError::Unavailable(format!(
        "{library} ({what}) cannot be loaded: the CUDA backend needs it at run time; looked for {looked_for}; install \
         it or put its folder on LD_LIBRARY_PATH{hint}"
    ))
}

/// Checks that the driver, NVRTC and cuBLAS libraries can be loaded, in that order.
pub(crate) fn libraries() -> Result<(), BackendError> {
    // Safety: each probe only tries to dlopen the library under its candidate names (running its
    // initialisers) and closes it again; it calls no CUDA function.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(missing(
            "libcuda.so",
            "the NVIDIA driver library; no NVIDIA driver is installed on this machine",
            "cuda",
        ));
    }
    // Safety: as above.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(missing("libnvrtc.so", "NVRTC, the CUDA run-time compiler of the kernels", "nvrtc"));
    }
    // Safety: as above.
    if !unsafe { cudarc::cublas::sys::is_culib_present() } {
        return Err(missing("libcublas.so", "cuBLAS, for the GEMMs", "cublas"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_message_says_what_and_how() {
        let BackendError::Unavailable(message) = missing("libcuda.so", "the driver", "cuda") else {
            panic!("not Unavailable")
        };
        assert!(message.contains("libcuda.so") && message.contains("LD_LIBRARY_PATH"), "{message}");
    }
}
