//! Builds `examples/c/place_memo_example.c` with the system C compiler against this crate's
//! shared library and checked-in header, runs it on the MEMO paper's layer trace, and checks the
//! peaks it prints. Prints SKIP and passes when no C compiler is found. (Unix: the link flags are
//! the Unix ones.)
#![cfg(unix)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The C compiler: `$CC`, else the first of cc, gcc, clang that runs.
fn c_compiler() -> Option<String> {
    let candidates = std::env::var("CC").into_iter().chain(["cc", "gcc", "clang"].map(String::from));
    candidates.into_iter().find(|name| Command::new(name).arg("--version").output().is_ok_and(|o| o.status.success()))
}

/// The directory cargo put this crate's libraries in: the test binary is in `<dir>/deps/`.
fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary has a path");
    exe.parent().and_then(Path::parent).expect("the test binary is in <target>/<profile>/deps").to_path_buf()
}

#[test]
fn the_c_example_places_the_memo_layer_trace() {
    let Some(compiler) = c_compiler() else {
        // CI must show that the example runs: there a missing compiler is a failure.
        assert!(std::env::var_os("CI").is_none(), "no C compiler found in CI (tried $CC, cc, gcc, clang)");
        println!("SKIP: no C compiler found (tried $CC, cc, gcc, clang)");
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let libs = library_dir();
    let shared = if cfg!(target_os = "macos") { "libmemo_capi.dylib" } else { "libmemo_capi.so" };
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

    let run = Command::new(&program).arg(root.join("examples/traces/memo-layer.trace")).output().unwrap();
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
}
