//! [`CudaError`]: what goes wrong inside the CUDA backend, typed, until the trait boundary turns
//! it into a [`memo_runtime::BackendError`] (`From<CudaError>`; [`CudaError::at`] when the plan
//! instruction is known).

use std::fmt;

use memo_runtime::BackendError;

/// A `cudnnStatus_t` as the library returned it: a raw integer, never a Rust enum (a newer
/// cuDNN may return a value our headers do not list, and an enum holding it would be undefined
/// behaviour the moment it is read). [`CudnnStatus::name`] maps the values of cuDNN 9.21's
/// header to their names; any other is reported as "unknown status N".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CudnnStatus(pub u32);

impl CudnnStatus {
    /// `CUDNN_STATUS_SUCCESS`.
    pub const SUCCESS: CudnnStatus = CudnnStatus(0);

    /// The status's name in cuDNN 9.21's `cudnn_graph.h`, if it is one of those.
    pub fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0 => "CUDNN_STATUS_SUCCESS",
            1001 => "CUDNN_STATUS_NOT_INITIALIZED",
            1002 => "CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH",
            1003 => "CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH",
            1004 => "CUDNN_STATUS_DEPRECATED",
            1005 => "CUDNN_STATUS_LICENSE_ERROR",
            1006 => "CUDNN_STATUS_RUNTIME_IN_PROGRESS",
            1007 => "CUDNN_STATUS_RUNTIME_FP_OVERFLOW",
            1008 => "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED",
            2000 => "CUDNN_STATUS_BAD_PARAM",
            2001 => "CUDNN_STATUS_INVALID_VALUE",
            2002 => "CUDNN_STATUS_BAD_PARAM_NULL_POINTER",
            2003 => "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER",
            2004 => "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED",
            2005 => "CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND",
            2006 => "CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT",
            2007 => "CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH",
            2008 => "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH",
            2009 => "CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES",
            2010 => "CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE",
            2011 => "CUDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH",
            2012 => "CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE",
            3000 => "CUDNN_STATUS_NOT_SUPPORTED",
            3001 => "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN",
            3002 => "CUDNN_STATUS_NOT_SUPPORTED_SHAPE",
            3003 => "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE",
            3004 => "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT",
            3005 => "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER",
            3006 => "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART",
            3007 => "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH",
            3008 => "CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING",
            3009 => "CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE",
            3010 => "CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT",
            3011 => "CUDNN_STATUS_NOT_SUPPORTED_PADDING",
            3012 => "CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM",
            3013 => "CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API",
            3014 => "CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE",
            4000 => "CUDNN_STATUS_INTERNAL_ERROR",
            4001 => "CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED",
            4002 => "CUDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE",
            4003 => "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED",
            4004 => "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",
            4005 => "CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM",
            4006 => "CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED",
            5000 => "CUDNN_STATUS_EXECUTION_FAILED",
            5001 => "CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER",
            5002 => "CUDNN_STATUS_EXECUTION_FAILED_CUBLAS",
            5003 => "CUDNN_STATUS_EXECUTION_FAILED_CUDART",
            5004 => "CUDNN_STATUS_EXECUTION_FAILED_CURAND",
            _ => return None,
        })
    }
}

impl fmt::Display for CudnnStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "unknown status {}", self.0),
        }
    }
}

/// What went wrong in the CUDA backend.
#[derive(Clone, Debug, PartialEq)]
pub enum CudaError {
    /// A cuDNN call failed: `call` (e.g. `cudnnBackendFinalize`) on `what` (the descriptor and,
    /// where one was set or read, the attribute), its status, and cuDNN's own last error message
    /// (empty when it gave none).
    Cudnn {
        /// The function.
        call: &'static str,
        /// The descriptor and attribute, in words.
        what: String,
        /// Its status.
        status: CudnnStatus,
        /// `cudnnGetLastErrorString`.
        message: String,
    },
    /// cuDNN cannot be used at all: the library missing, too old, or without a device.
    CudnnUnavailable(String),
    /// No plan for this attention launch: refused by a version rule before cuDNN was asked, or
    /// no engine configuration finalized (`reason` names the first failure).
    CudnnRefused {
        /// The pass and shape.
        what: String,
        /// Why.
        reason: String,
    },
    /// An attention graph that our own code describes wrongly (a tensor declared twice, an
    /// operation of an unknown id): a bug here, not cuDNN's.
    Graph(String),
    /// NVRTC failed to compile `source`: its options and log.
    Nvrtc {
        /// The source's name.
        source: String,
        /// The options given.
        options: Vec<String>,
        /// NVRTC's log (or the status when there is no log).
        log: String,
    },
    /// The NVRTC library could not be used (loading, a missing symbol, a failing call).
    NvrtcLibrary(String),
    /// A CUDA driver call failed.
    Driver {
        /// What was being done.
        what: String,
        /// The driver's error.
        error: String,
    },
    /// A cuBLAS call failed.
    Cublas {
        /// What was being done.
        what: String,
        /// cuBLAS's status.
        status: String,
    },
    /// An NCCL call failed (`memo_nccl`'s error: the call and NCCL's result).
    Nccl(memo_nccl::NcclError),
    /// A collective launch without a usable communicator: none joined, one aborted earlier, or
    /// a peer that never issued its collective within the communicator's timeout.
    Collective(String),
    /// A launch's arguments do not fit what the step needs (a plan/recipe mismatch).
    Launch(String),
}

impl CudaError {
    /// A driver error while doing `what`.
    pub fn driver(what: impl Into<String>, error: impl fmt::Display) -> Self {
        CudaError::Driver { what: what.into(), error: error.to_string() }
    }

    /// As a [`BackendError::Kernel`] of plan instruction `instruction`.
    pub fn at(self, instruction: usize) -> BackendError {
        BackendError::Kernel { instruction, message: self.to_string() }
    }
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CudaError::Cudnn { call, what, status, message } => {
                write!(f, "cuDNN: {call} on {what}: {status}")?;
                if !message.is_empty() {
                    write!(f, " ({message})")?;
                }
                Ok(())
            }
            CudaError::CudnnUnavailable(why) => f.write_str(why),
            CudaError::CudnnRefused { what, reason } => write!(f, "cuDNN: no plan for {what}: {reason}"),
            CudaError::Graph(why) => write!(f, "attention graph: {why}"),
            CudaError::Nvrtc { source, options, log } => {
                write!(f, "{source}: NVRTC compile failed with options {options:?}:\n{log}")
            }
            CudaError::NvrtcLibrary(why) => write!(f, "NVRTC: {why}"),
            CudaError::Driver { what, error } => write!(f, "CUDA: {what}: {error}"),
            CudaError::Cublas { what, status } => write!(f, "cuBLAS: {what}: {status}"),
            CudaError::Nccl(error) => write!(f, "NCCL: {error}"),
            CudaError::Collective(why) => write!(f, "NCCL: {why}"),
            CudaError::Launch(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for CudaError {}

impl From<CudaError> for BackendError {
    fn from(error: CudaError) -> Self {
        match error {
            CudaError::CudnnUnavailable(why) => BackendError::Unavailable(why),
            other => BackendError::Other(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_is_named_or_reported_as_unknown() {
        assert_eq!(CudnnStatus(3004).to_string(), "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT");
        assert_eq!(CudnnStatus(0), CudnnStatus::SUCCESS);
        // A value no header of ours lists (a newer cuDNN's): a number, not undefined behaviour.
        assert_eq!(CudnnStatus(12345).to_string(), "unknown status 12345");
        assert_eq!(CudnnStatus(u32::MAX).name(), None);
        let error = CudaError::Cudnn {
            call: "cudnnBackendFinalize",
            what: "tensor 5 (stats)".into(),
            status: CudnnStatus(7777),
            message: String::new(),
        };
        assert_eq!(error.to_string(), "cuDNN: cudnnBackendFinalize on tensor 5 (stats): unknown status 7777");
        assert!(matches!(BackendError::from(error.clone()), BackendError::Other(m) if m == error.to_string()));
        assert!(matches!(
            BackendError::from(CudaError::CudnnUnavailable("no cuDNN".into())),
            BackendError::Unavailable(_)
        ));
    }
}
