//! `examples/python/replay_allocator.py` compiles, and its host self-test (ctypes bindings checked
//! against the header, one record/plan/replay cycle on the host backend; no GPU, no torch) passes
//! against this crate's shared library; without a GPU the comparison refuses in one line. Prints
//! SKIP and passes without python3.
#![cfg(target_os = "linux")]

#[path = "../../tests/support/skip.rs"]
mod skip;

use std::path::Path;
use std::process::Command;

#[test]
fn the_python_script_compiles_and_its_host_selftest_passes() {
    let python = "python3";
    if !Command::new(python).arg("--version").output().is_ok_and(|o| o.status.success()) {
        skip::skip("no python3 found");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let script = root.join("examples/python/replay_allocator.py");
    // Compiled into the target directory, not beside the script.
    let compiled = Path::new(env!("CARGO_TARGET_TMPDIR")).join("replay_allocator.pyc");
    let compile = Command::new(python)
        .args(["-c", "import sys, py_compile; py_compile.compile(sys.argv[1], cfile=sys.argv[2], doraise=True)"])
        .arg(&script)
        .arg(&compiled)
        .output()
        .unwrap();
    assert!(compile.status.success(), "{}", String::from_utf8_lossy(&compile.stderr));

    let exe = std::env::current_exe().unwrap();
    // `cargo test` leaves the shared library next to the test binary (deps/); `cargo build`
    // also copies it one level up.
    let deps = exe.parent().unwrap();
    let library = [deps, deps.parent().unwrap()]
        .map(|dir| dir.join("libmemo_capi.so"))
        .into_iter()
        .find(|path| path.is_file())
        .unwrap_or_else(|| deps.join("libmemo_capi.so"));
    let run = Command::new(python).arg(&script).arg("--host-selftest").arg("--lib").arg(&library).output().unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    println!("{stdout}");
    assert!(run.status.success(), "the self-test failed:\n{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    assert!(stdout.contains("host selftest ok: memo-layer peak 2432 MB; replayed 11, fell back 1"), "{stdout}");

    // Without a GPU (hidden here whether or not PyTorch is installed) or without the library, the
    // comparison says in one line what it needs instead of three tracebacks from its workers.
    for (lib, needs) in
        [(library.as_path(), "--host-selftest"), (Path::new("/nonexistent/libmemo_capi.so"), "cargo build")]
    {
        let run =
            Command::new(python).arg(&script).arg("--lib").arg(lib).env("CUDA_VISIBLE_DEVICES", "").output().unwrap();
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(2), "{stderr}");
        assert!(run.stdout.is_empty(), "{}", String::from_utf8_lossy(&run.stdout));
        assert_eq!(stderr.lines().count(), 1, "one line:\n{stderr}");
        assert!(stderr.starts_with("replay_allocator.py: ") && stderr.contains(needs), "{stderr}");
    }
}
