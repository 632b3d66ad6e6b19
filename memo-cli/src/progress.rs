//! When a command starts reporting its progress on standard error. Every command that may run
//! past 2 s reports (`memo plan`, `memo train` inside a step, `memo solve`); shorter runs print
//! nothing extra, so their output stays as documented. One environment variable moves the
//! threshold for `memo plan` and `memo train`, so tests and scripts can see the lines of a short
//! run without depending on how fast the machine is.

use std::time::Duration;

use crate::exit::{self, Failure};

/// The environment variable that sets after how many milliseconds a command reports its progress
/// (0: from the start).
pub const AFTER_VARIABLE: &str = "MEMO_PROGRESS_AFTER_MS";

/// Runs (and training steps) shorter than this print no progress.
pub const DEFAULT_AFTER: Duration = Duration::from_secs(2);

/// [`AFTER_VARIABLE`]'s threshold, else [`DEFAULT_AFTER`]; a value that is not whole milliseconds
/// is refused, naming the variable.
pub fn after() -> Result<Duration, Failure> {
    let Some(value) = std::env::var_os(AFTER_VARIABLE) else { return Ok(DEFAULT_AFTER) };
    value.to_str().and_then(|v| v.trim().parse::<u64>().ok()).map(Duration::from_millis).ok_or_else(|| {
        Failure::new(
            exit::BAD_INPUT,
            format!(
                "{AFTER_VARIABLE}={}: expected whole milliseconds (e.g. 0 to report from the start, 2000 the default)",
                value.to_string_lossy()
            ),
        )
    })
}
