//! Plans in and out of files, always through the independent checker: a plan is checked before
//! it is reported or written, and after it is read.

use std::io::Write;
use std::path::Path;

use memo_plan_core::check::plan::check_plan;
use memo_plan_core::plan::Plan;

use crate::exit::{self, Failure};

/// Checks `plan`; a plan the planner made that fails is a bug (exit 70).
pub fn check(plan: &Plan) -> Result<(), Failure> {
    check_plan(plan).map_err(|violations| {
        let first: Vec<String> = violations.iter().take(3).map(ToString::to_string).collect();
        Failure::new(
            exit::INTERNAL_ERROR,
            format!(
                "the {} plan failed its independent check with {} violation(s), first: {} (a planner bug: please report it)",
                plan.provenance.strategy.name(),
                violations.len(),
                first.join("; ")
            ),
        )
    })
}

/// Writes `plan`'s encoding to `path` atomically: a temporary file in the same directory, synced,
/// then renamed over `path`, so a reader never sees half a plan and an old plan survives a crash.
/// Returns the bytes written.
pub fn write_plan(path: &Path, plan: &Plan) -> Result<usize, Failure> {
    let bytes = plan.encode();
    write_atomically(path, &bytes).map_err(|e| {
        Failure::new(exit::IO_ERROR, format!("cannot write {}: {e}; check the directory", path.display()))
    })?;
    Ok(bytes.len())
}

/// `bytes` to `path` via a temporary sibling and a rename.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "plan".into());
    let temporary = dir.join(format!(".{name}.tmp{}", std::process::id()));
    let result = (|| {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&temporary, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    result
}

/// Reads, decodes and checks a plan file. A file that does not decode is bad input (exit 2); one
/// that decodes but fails the checker is reported with its violations (exit 6).
pub fn read_plan(path: &Path) -> Result<Plan, Failure> {
    let name = path.display();
    let bytes = std::fs::read(path).map_err(|e| {
        Failure::new(exit::IO_ERROR, format!("cannot read {name}: {e}; check the path and permissions"))
    })?;
    Plan::decode(&bytes).map_err(|e| Failure::new(exit::BAD_INPUT, format!("{name}: {e}")))
}
