//! Builds `examples/c/place_memo_example.c` with the system C compiler against this crate's
//! shared library and checked-in header, runs it on the MEMO paper's layer trace and on a plan
//! file made here by the planner, and checks what it prints. Prints SKIP and passes when no C
//! compiler is found. (Unix: the link flags are the Unix ones.)
#![cfg(unix)]

#[path = "../../tests/support/skip.rs"]
mod skip;

use std::path::{Path, PathBuf};
use std::process::Command;

use memo_plan_core::model::{Hardware, ModelConfig, Parallelism};
use memo_plan_core::plan::{Place, Plan, Strategy};
use memo_plan_core::planner::{plan, PlanRequest};

/// The C compiler: `$CC`, else the first of cc, gcc, clang that runs.
fn c_compiler() -> Option<String> {
    let candidates = std::env::var("CC").into_iter().chain(["cc", "gcc", "clang"].map(String::from));
    candidates.into_iter().find(|name| Command::new(name).arg("--version").output().is_ok_and(|o| o.status.success()))
}

/// The directory holding this crate's shared library: `cargo test` leaves it next to the test
/// binary in `<target>/<profile>/deps/`; `cargo build` also copies it up to `<target>/<profile>/`.
fn library_dir(shared: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary has a path");
    let deps = exe.parent().expect("the test binary is in <target>/<profile>/deps").to_path_buf();
    let profile = deps.parent().map(Path::to_path_buf).unwrap_or_else(|| deps.clone());
    if deps.join(shared).is_file() {
        deps
    } else {
        profile
    }
}

#[test]
fn the_c_example_places_the_memo_layer_trace() {
    let Some(compiler) = c_compiler() else {
        // CI must show that the example runs: there a missing compiler is a failure.
        assert!(std::env::var_os("CI").is_none(), "no C compiler found in CI (tried $CC, cc, gcc, clang)");
        skip::skip("no C compiler found (tried $CC, cc, gcc, clang)");
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let shared = if cfg!(target_os = "macos") { "libmemo_capi.dylib" } else { "libmemo_capi.so" };
    let libs = library_dir(shared);
    assert!(libs.join(shared).is_file(), "{} is missing: cargo builds it with the tests", libs.join(shared).display());
    let program = Path::new(env!("CARGO_TARGET_TMPDIR")).join("place_memo_example");
    let build = Command::new(&compiler)
        .args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic"])
        .arg("-I")
        .arg(root.join("memo-capi/include"))
        .arg(root.join("examples/c/place_memo_example.c"))
        .arg("-L")
        .arg(&libs)
        .arg("-lmemo_capi")
        .arg(format!("-Wl,-rpath,{}", libs.display()))
        .arg("-o")
        .arg(&program)
        .output()
        .expect("the C compiler runs");
    assert!(build.status.success(), "{compiler} failed:\n{}", String::from_utf8_lossy(&build.stderr));

    // A small plan file, as `memo plan -o` writes it: 4 layers, so that two swap and it has host
    // slots.
    let request = PlanRequest::new(
        ModelConfig::new("tiny", 4, 64, 4, 64, 1),
        Parallelism::single(),
        Hardware::preset("h200x1").unwrap(),
        Strategy::Memo,
    );
    let tiny = plan(&request).unwrap().plan;
    let plan_path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("c_example_tiny.memo");
    std::fs::write(&plan_path, tiny.encode()).unwrap();

    // The loader searches LD_LIBRARY_PATH before the rpath, and cargo's LD_LIBRARY_PATH names
    // `<target>/<profile>/` too, where an older `cargo build` may have left an older library: put
    // the one built with this test first.
    let search = std::env::var_os("LD_LIBRARY_PATH").unwrap_or_default();
    let search = std::env::join_paths(std::iter::once(libs.clone()).chain(std::env::split_paths(&search)))
        .expect("library paths join");
    let run = Command::new(&program)
        .arg(root.join("examples/traces/memo-layer.trace"))
        .arg(&plan_path)
        .env("LD_LIBRARY_PATH", search)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    println!("{stdout}");
    assert!(run.status.success(), "the example failed:\n{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    for expected in [
        "whole layer: 12 buffers, peak 2432 MB, lower bound 2432 MB, proven optimal",
        "whole layer under 2000 MB: MEMO_STATUS_INFEASIBLE (memo_place: proven infeasible",
        "forward transients: 5 buffers, peak 512 MB, lower bound 512 MB, proven optimal",
        "backward transients: 5 buffers, peak 1920 MB, lower bound 1920 MB, proven optimal",
    ] {
        assert!(stdout.contains(expected), "missing {expected:?} in:\n{stdout}");
    }
    assert_eq!(stdout.lines().filter(|l| l.starts_with("  tensor ")).count(), 12);
    check_plan_lines(&stdout, &tiny);
}

/// The plan part of the output: the provenance, totals and first buffer of each kind agree with
/// the plan the file was written from.
fn check_plan_lines(stdout: &str, tiny: &Plan) {
    let t = &tiny.totals;
    let p = &tiny.provenance;
    for expected in [
        format!(
            "plan: valid; model tiny, 4 layers, 64 tokens, strategy memo, alpha {:.3} (bound: {})",
            p.alpha,
            memo_plan_core::plan::encode::alpha_bound_name(p.alpha_bound)
        ),
        format!("plan: {} buffers, {} instructions", tiny.buffers.len(), tiny.instructions.len()),
        format!(
            "plan: arena {} bytes (lower bound {}), host {} bytes, parameters {} bytes, rounding buffers {} bytes",
            t.arena_bytes, t.arena_lower_bound_bytes, t.host_bytes, t.parameter_bytes, t.rounding_buffer_bytes
        ),
    ] {
        assert!(stdout.contains(&expected), "missing {expected:?} in:\n{stdout}");
    }
    let buffer_lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with("  buffer ")).collect();
    let mut kinds: Vec<_> = tiny.buffers.iter().map(|b| b.kind).collect();
    kinds.sort();
    kinds.dedup();
    assert_eq!(buffer_lines.len(), kinds.len(), "{stdout}");
    for line in buffer_lines {
        // "  buffer   12: kind role layer  0, ... arena offset 256"
        let index: usize = line["  buffer ".len()..].split(':').next().unwrap().trim().parse().unwrap();
        let b = &tiny.buffers[index];
        let (space, offset) = match b.place {
            Place::Device { offset } => ("arena", offset),
            Place::Host { offset } => ("host", offset),
        };
        assert!(line.contains(b.kind.name()) && line.contains(b.role.name()), "{line}");
        assert!(line.ends_with(&format!("= {:>8} bytes, {space} offset {offset}", b.bytes().unwrap())), "{line}");
        assert!(line.contains(&format!("layer {:>2}", b.layer.map_or(-1, i64::from))), "{line}");
    }
    assert!(stdout.contains(" host_slot ") && stdout.contains(", host offset "), "{stdout}");
}
