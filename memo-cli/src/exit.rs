//! Exit codes of `memo`, and the one-line error that goes with each failure.
//!
//! | code | meaning |
//! |------|---------|
//! | 0    | success |
//! | 1    | I/O error: the input cannot be read, or the output cannot be written (e.g. a closed pipe) |
//! | 2    | bad input: a usage error (unknown option, bad value), an invalid trace, TOML or model file, or a file that does not decode as a plan (garbage, truncated, damaged) |
//! | 3    | proven infeasible: no placement fits under `--capacity` |
//! | 4    | not found: no placement under `--capacity` was found within the limit (`--time-limit`, `--budget-nodes` or Ctrl-C) |
//! | 5    | does not fit: the plan of the chosen `--strategy` needs more device or host memory than the machine has |
//! | 6    | invalid plan: a plan file that decodes but breaks a plan rule (`memo check` lists them) |
//! | 7    | device unavailable: the `--device` backend cannot be opened (no driver, no device, or not built); the backend's message says which |
//! | 8    | nothing fits: `memo plan` without `--strategy` found no strategy whose plan fits the machine, or `--max-seq` found no length that any strategy fits (the table is still printed) |
//! | 70   | internal error: a result failed its independent check (a bug: please report it) |
//! | 130  | interrupted: Ctrl-C stopped `memo train` (its state saved; the line says where and the `--resume` command), or a second Ctrl-C ended `memo train` or `memo solve` at once |
//!
//! Every failure prints exactly one line on standard error, starting with `memo:`, that says what
//! went wrong and what to do about it (after the progress lines, `memo solve: ...`, of a solve
//! that ran past a second).

use std::io::Write;
use std::process::ExitCode;

/// Everything went well.
pub const SUCCESS: u8 = 0;
/// The input could not be read or the output could not be written.
pub const IO_ERROR: u8 = 1;
/// A usage error or an invalid trace.
pub const BAD_INPUT: u8 = 2;
/// No placement fits under the capacity (proven).
pub const INFEASIBLE: u8 = 3;
/// No placement under the capacity was found within the time limit or node budget (one may exist).
pub const NOT_FOUND: u8 = 4;
/// The chosen strategy's plan does not fit the machine.
pub const DOES_NOT_FIT: u8 = 5;
/// A plan file decodes but breaks a plan rule.
pub const PLAN_INVALID: u8 = 6;
/// The `--device` backend cannot be opened.
pub const DEVICE_UNAVAILABLE: u8 = 7;
/// Nothing fits: no strategy at the given length (`memo plan` without `--strategy`), or no length
/// for any strategy (`--max-seq`).
pub const NONE_FITS: u8 = 8;
/// A result failed its independent check: a bug in `memo` (`EX_SOFTWARE` of `sysexits.h`).
pub const INTERNAL_ERROR: u8 = 70;
/// Ctrl-C (SIGINT): 128 + 2, as a shell reports a process its interrupt ended.
pub const INTERRUPTED: u8 = 130;

/// The exit-code table as `--help` shows it.
pub const HELP: &str = "\
Exit codes:
  0   success
  1   I/O error: cannot read the input or write the output (e.g. a closed pipe)
  2   bad input: a usage error, an invalid trace, TOML or model file, or a file that does not
      decode as a plan (garbage, truncated, damaged); the message names the file and line
  3   proven infeasible under --capacity
  4   not found within the limit: no placement under --capacity before --time-limit,
      --budget-nodes or Ctrl-C stopped the search (raise one of them)
  5   the chosen strategy's plan does not fit the machine (the message says by how much, and what would fit)
  6   a plan file that decodes but breaks a plan rule (`memo check` lists every violation)
  7   the --device backend cannot be opened (no driver, no device, or not built: the message says which)
  8   nothing fits: memo plan without --strategy fits no strategy, or --max-seq fits no length with any
      strategy (the table is printed first, then one line on standard error)
  70  internal error: the result failed its independent check (please report it)
  130 interrupted: Ctrl-C stopped memo train, which saved its state and says where and how to
      --resume; a second Ctrl-C ends memo train or memo solve at once";

/// Why a command failed: an exit code and a one-line message (without the `memo: ` prefix).
#[derive(Debug)]
pub struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    /// A failure with the given exit code and message.
    pub fn new(code: u8, message: impl Into<String>) -> Self {
        Failure { code, message: message.into() }
    }

    /// The exit code.
    #[cfg(test)]
    pub fn code(&self) -> u8 {
        self.code
    }

    /// The message, without the `memo: ` prefix.
    #[cfg(test)]
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The same failure with `prefix` before its message (`rank 2 of 4: ...` for one process of
    /// several).
    pub fn prefixed(self, prefix: &str) -> Self {
        Failure { code: self.code, message: format!("{prefix}{}", self.message) }
    }

    /// Prints the message as one line on standard error (a failing stderr is ignored: there is
    /// nowhere left to report it) and returns the exit code.
    pub fn report(&self) -> ExitCode {
        let line = self.message.replace(['\n', '\r'], " ");
        let _ = writeln!(std::io::stderr().lock(), "memo: {line}");
        ExitCode::from(self.code)
    }
}
