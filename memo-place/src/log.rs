//! The one logging macro of the crate: `defmt::debug!` with the `defmt` feature, nothing without.

/// Logs a debug message through defmt when the `defmt` feature is on; compiles to nothing (the
/// arguments are not even evaluated) otherwise.
#[cfg(feature = "defmt")]
macro_rules! debug_log {
    ($($arg:tt)*) => { defmt::debug!($($arg)*) };
}

#[cfg(not(feature = "defmt"))]
macro_rules! debug_log {
    ($($arg:tt)*) => {{}};
}

pub(crate) use debug_log;
