//! How a test that cannot run on this machine says so. Included with `#[path]` by the test
//! files of every crate that has such a test (one definition, no test-only crate to depend on).

use std::fmt::Display;
use std::io::Write;

/// `why` names the cause first, in the words every test skipping for it uses (`no CUDA device:
/// <the backend's error>`, `no HIP device: ...`, `no usable NCCL: ...`), so that `scripts/test.sh`
/// lists each cause on one line however many tests it stops.
///
/// Prints `SKIP <test>: <why>` (the test's name is its thread's, which the test harness sets)
/// and, when `MEMO_SKIP_LOG` names a file, appends the same line to it: `scripts/test.sh` sets
/// it and lists every skipped check at the end of the run, since the harness shows a passing
/// test's output only with `--nocapture`.
pub fn skip(why: impl Display) {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("a test");
    let line = format!("SKIP {}::{test}: {why}", env!("CARGO_CRATE_NAME"));
    println!("{line}");
    if let Some(path) = std::env::var_os("MEMO_SKIP_LOG") {
        // Several test binaries append at once: one write of one line each.
        if let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = file.write_all(format!("{line}\n").as_bytes());
        }
    }
}
