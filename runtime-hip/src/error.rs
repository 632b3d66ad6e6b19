//! [`HipError`]: every way the HIP layers fail, each saying what, where and how to fix it.

use std::fmt;

use memo_runtime::BackendError;

/// `hipErrorOutOfMemory` (`hip_runtime_api.h`).
pub const HIP_ERROR_OUT_OF_MEMORY: i32 = 2;
/// `hipErrorNoDevice` (`hip_runtime_api.h`): the runtime found no usable GPU.
pub const HIP_ERROR_NO_DEVICE: i32 = 100;

/// What went wrong in the HIP runtime, hiprtc or hipBLAS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HipError {
    /// No file of a library could be loaded.
    LibraryNotFound {
        /// The library's base name (`libamdhip64`, `libhiprtc`, `libhipblas`).
        library: &'static str,
        /// Every path or name tried, each with why it failed.
        tried: Vec<String>,
    },
    /// A library was loaded but lacks a function this crate needs.
    SymbolNotFound {
        /// The library file.
        library: String,
        /// The missing function.
        symbol: &'static str,
    },
    /// The HIP runtime found no GPU (`hipErrorNoDevice`, or a device count of 0).
    NoDevice {
        /// The call that said so.
        call: &'static str,
        /// The HIP error code (100), or 0 when the count was simply 0.
        code: i32,
        /// `hipGetErrorString` of the code.
        message: String,
    },
    /// The ordinal asked for is not a device.
    InvalidOrdinal {
        /// What was asked for.
        ordinal: usize,
        /// Devices present.
        count: usize,
    },
    /// A HIP runtime call failed.
    Hip {
        /// The function.
        call: &'static str,
        /// `hipError_t`.
        code: i32,
        /// `hipGetErrorString(code)`.
        message: String,
    },
    /// A hiprtc call other than the compilation itself failed.
    Hiprtc {
        /// The function.
        call: &'static str,
        /// `hiprtcResult`.
        code: i32,
        /// `hiprtcGetErrorString(code)`.
        message: String,
    },
    /// A kernel source did not compile.
    Compile {
        /// The source file (`kernels/<name>`).
        source: String,
        /// The options passed to hiprtc.
        options: Vec<String>,
        /// hiprtc's log (file, line and message of each error).
        log: String,
    },
    /// A hipBLAS call failed.
    Blas {
        /// The function.
        call: &'static str,
        /// `hipblasStatus_t`.
        status: i32,
        /// What the status means.
        message: String,
    },
    /// The device or library cannot do what the backend needs.
    Unsupported(String),
}

impl HipError {
    /// Whether this error means "no usable HIP installation or device here" (the library, a
    /// symbol or the GPU is missing), as opposed to a failure of a working installation.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, HipError::LibraryNotFound { .. } | HipError::SymbolNotFound { .. } | HipError::NoDevice { .. })
    }
}

/// What to install for each library.
fn install_hint(library: &str) -> &'static str {
    match library {
        "libhipblas" => {
            "install ROCm's hipBLAS (package hipblas, with rocBLAS) and set ROCM_PATH to the ROCm root; the HIP \
             backend needs it for every plan, since every training step has GEMMs"
        }
        "libhiprtc" => "install ROCm's HIP runtime (hip-runtime-amd, which ships hiprtc) and set ROCM_PATH",
        _ => {
            "install ROCm (the HIP runtime, hip-runtime-amd) and set ROCM_PATH to its root (the folder holding \
             lib/libamdhip64.so), or HIP_PATH"
        }
    }
}

impl fmt::Display for HipError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HipError::LibraryNotFound { library, tried } => {
                write!(f, "{library} not found; tried ")?;
                if tried.is_empty() {
                    f.write_str("nothing (the search path is empty)")?;
                } else {
                    f.write_str(&tried.join(", "))?;
                }
                write!(f, ". To fix: {}", install_hint(library))
            }
            HipError::SymbolNotFound { library, symbol } => write!(
                f,
                "{library} has no function `{symbol}`: this ROCm is too old or not a HIP runtime; install ROCm 5.2 or \
                 newer and point ROCM_PATH at it"
            ),
            HipError::NoDevice { call, code, message } => write!(
                f,
                "no AMD GPU: {call} returned {code} ({message}); the HIP runtime loaded but sees no device (check that \
                 the amdgpu driver is loaded, /dev/kfd is readable and HIP_VISIBLE_DEVICES is not empty)"
            ),
            HipError::InvalidOrdinal { ordinal, count } => {
                write!(f, "device {ordinal} does not exist: {count} AMD GPU(s) present, numbered from 0")
            }
            HipError::Hip { call, code, message } => write!(f, "{call} failed with HIP error {code} ({message})"),
            HipError::Hiprtc { call, code, message } => write!(f, "{call} failed with hiprtc error {code} ({message})"),
            HipError::Compile { source, options, log } => write!(
                f,
                "hiprtc could not compile kernels/{source} with options [{}]:\n{}",
                options.join(" "),
                log.trim_end()
            ),
            HipError::Blas { call, status, message } => {
                write!(f, "{call} failed with hipBLAS status {status} ({message})")
            }
            HipError::Unsupported(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for HipError {}

impl From<HipError> for BackendError {
    fn from(error: HipError) -> Self {
        if error.is_unavailable() {
            BackendError::Unavailable(error.to_string())
        } else {
            BackendError::Other(format!("hip: {error}"))
        }
    }
}

/// The meaning of a `hipblasStatus_t` (values from `hipblas-common.h`).
pub fn blas_status_message(status: i32) -> &'static str {
    match status {
        0 => "HIPBLAS_STATUS_SUCCESS",
        1 => "HIPBLAS_STATUS_NOT_INITIALIZED: the library was not initialised",
        2 => "HIPBLAS_STATUS_ALLOC_FAILED: a resource allocation failed",
        3 => "HIPBLAS_STATUS_INVALID_VALUE: an unsupported value was passed",
        4 => "HIPBLAS_STATUS_MAPPING_ERROR: access to GPU memory failed",
        5 => "HIPBLAS_STATUS_EXECUTION_FAILED: the GPU program failed to execute",
        6 => "HIPBLAS_STATUS_INTERNAL_ERROR",
        7 => "HIPBLAS_STATUS_NOT_SUPPORTED: not implemented for these types or this GPU",
        8 => "HIPBLAS_STATUS_ARCH_MISMATCH",
        9 => "HIPBLAS_STATUS_HANDLE_IS_NULLPTR",
        10 => "HIPBLAS_STATUS_INVALID_ENUM: an unsupported enum value was passed",
        11 => "HIPBLAS_STATUS_UNKNOWN",
        _ => "unknown hipBLAS status",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_pieces_are_unavailable_and_failures_are_not() {
        let missing =
            HipError::LibraryNotFound { library: "libhipblas", tried: vec!["/x/libhipblas.so (gone)".into()] };
        match BackendError::from(missing) {
            BackendError::Unavailable(text) => {
                assert!(text.starts_with("libhipblas not found; tried /x/libhipblas.so (gone)."), "{text}");
                assert!(text.contains("every training step has GEMMs"), "{text}");
            }
            other => panic!("{other:?}"),
        }
        let no_device = HipError::NoDevice { call: "hipGetDeviceCount", code: 100, message: "hipErrorNoDevice".into() };
        assert!(matches!(BackendError::from(no_device), BackendError::Unavailable(_)));
        let failed =
            HipError::Hip { call: "hipMalloc", code: HIP_ERROR_OUT_OF_MEMORY, message: "out of memory".into() };
        assert_eq!(
            BackendError::from(failed),
            BackendError::Other("hip: hipMalloc failed with HIP error 2 (out of memory)".into())
        );
    }

    #[test]
    fn a_compile_error_shows_the_source_the_options_and_the_log() {
        let error = HipError::Compile {
            source: "norm.cu".into(),
            options: vec!["--offload-arch=gfx90a".into(), "-DMEMO_HIP=1".into()],
            log: "norm.cu:12:3: error: boom\n".into(),
        };
        assert_eq!(
            error.to_string(),
            "hiprtc could not compile kernels/norm.cu with options [--offload-arch=gfx90a -DMEMO_HIP=1]:\nnorm.cu:12:3: \
             error: boom"
        );
    }

    #[test]
    fn blas_statuses_have_their_header_names() {
        assert!(blas_status_message(10).starts_with("HIPBLAS_STATUS_INVALID_ENUM"));
        assert!(blas_status_message(7).starts_with("HIPBLAS_STATUS_NOT_SUPPORTED"));
        assert_eq!(blas_status_message(99), "unknown hipBLAS status");
    }
}
