//! [`NcclError`]: every way loading the library, making a communicator or a collective call
//! fails, each saying what, where and how to fix it.

use std::fmt;
use std::time::Duration;

use memo_runtime::rendezvous::RendezvousError;
use memo_runtime::BackendError;

use crate::{Flavour, Version, MIN_VERSION};

/// What went wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NcclError {
    /// No file of the library could be loaded.
    LibraryNotFound {
        /// NCCL or RCCL: its names, variable and install advice.
        flavour: Flavour,
        /// Every path or name tried, each with why it failed.
        tried: Vec<String>,
    },
    /// The library lacks a function this crate calls.
    SymbolNotFound {
        /// The file.
        library: String,
        /// The function.
        symbol: &'static str,
    },
    /// The library is older than [`MIN_VERSION`], or says a version code that is not one.
    TooOld {
        /// The file.
        library: String,
        /// `ncclGetVersion`'s code.
        code: i32,
        /// The code read, when it is one.
        version: Option<Version>,
    },
    /// A call returned an error.
    Call {
        /// The C function.
        call: &'static str,
        /// `ncclResult_t`.
        code: i32,
        /// Its name in `nccl.h` (`ncclInvalidArgument`...).
        name: &'static str,
        /// `ncclGetErrorString(code)`.
        message: String,
        /// `ncclGetLastError`, when the library has it and it says something.
        last: Option<String>,
    },
    /// A non-blocking call did not complete within the timeout; the communicator was aborted.
    Timeout {
        /// The C function.
        call: &'static str,
        /// This rank.
        rank: usize,
        /// The world size.
        world_size: usize,
        /// The timeout.
        waited: Duration,
    },
    /// The communicator was aborted by an earlier error; nothing more runs on it.
    Aborted {
        /// The call refused.
        call: &'static str,
        /// The error that aborted it.
        cause: String,
    },
    /// An argument this crate refuses before calling the library.
    Invalid(String),
    /// The exchange of the unique id failed.
    Rendezvous(RendezvousError),
}

impl NcclError {
    /// Whether this means "no usable library here" (missing, lacking a function, too old), as
    /// opposed to a failure of a working one.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, NcclError::LibraryNotFound { .. } | NcclError::SymbolNotFound { .. } | NcclError::TooOld { .. })
    }
}

impl fmt::Display for NcclError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NcclError::LibraryNotFound { flavour, tried } => {
                write!(f, "{} cannot be loaded; tried ", flavour.library)?;
                if tried.is_empty() {
                    f.write_str("nothing (the search is empty)")?;
                } else {
                    f.write_str(&tried.join(", "))?;
                }
                write!(f, ". To fix: {}, or set {} to the library file", flavour.install, flavour.variable)
            }
            NcclError::SymbolNotFound { library, symbol } => write!(
                f,
                "{library} has no function `{symbol}`: it is not NCCL or RCCL {MIN_VERSION} or newer; install a newer \
                 one"
            ),
            NcclError::TooOld { library, code, version: Some(version) } => write!(
                f,
                "{library} is version {version} (code {code}); {MIN_VERSION} or newer is needed (the non-blocking \
                 communicator behind the join timeout); install a newer one"
            ),
            NcclError::TooOld { library, code, version: None } => {
                write!(f, "{library} says version code {code}, which is not an NCCL version code")
            }
            NcclError::Call { call, code, name, message, last } => {
                write!(f, "{call} failed: {name} ({code}): {message}")?;
                if let Some(last) = last {
                    write!(f, "; last error: {last}")?;
                }
                Ok(())
            }
            NcclError::Timeout { call, rank, world_size, waited } => write!(
                f,
                "{call} on rank {rank} of {world_size} did not complete within {waited:?}; the communicator was \
                 aborted: a rank did not join or cannot be reached (run every rank with NCCL_DEBUG=INFO to see where)"
            ),
            NcclError::Aborted { call, cause } => {
                write!(f, "{call} refused: the communicator was aborted after an earlier error: {cause}")
            }
            NcclError::Invalid(message) => f.write_str(message),
            NcclError::Rendezvous(error) => write!(f, "the unique id exchange failed: {error}"),
        }
    }
}

impl std::error::Error for NcclError {}

impl From<RendezvousError> for NcclError {
    fn from(error: RendezvousError) -> Self {
        NcclError::Rendezvous(error)
    }
}

impl From<NcclError> for BackendError {
    fn from(error: NcclError) -> Self {
        if error.is_unavailable() {
            BackendError::Unavailable(error.to_string())
        } else {
            BackendError::Other(format!("collectives: {error}"))
        }
    }
}
