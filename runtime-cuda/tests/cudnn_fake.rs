//! The cuDNN probe against fake cuDNN libraries (no GPU, no cuDNN needed): a `libcudnn.so.9`
//! compiled here with `cc` whose `cudnnGetVersion` says 8.9.7, one that says 9.21.0 but whose
//! `cudnnCreate` fails with `CUDNN_STATUS_NOT_INITIALIZED` (what a real cuDNN does on a machine
//! without a GPU), and one whose `cudnnCreate` returns 12345, a status no header lists (a newer
//! cuDNN's): it must be reported as "unknown status 12345" (statuses are read as integers, never
//! as a Rust enum, where it would be undefined behaviour). Each is loaded in a child process
//! (the library is loaded once per process) through `LD_LIBRARY_PATH`; the probe must answer one
//! line saying why, never panic. Without `cc` the test prints SKIP. (The plan cache against a
//! fake that refuses token-major statistics is runtime-cuda's lib test
//! `attention::cudnn::tests::a_refused_plan_is_asked_of_cudnn_once`.)

#[path = "../../tests/support/skip.rs"]
mod skip;

use std::path::Path;
use std::process::Command;

const CHILD: &str = "MEMO_FAKE_CUDNN_CHILD";

/// Run in the child process only: prints the probe's answer.
#[test]
fn probe_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    match runtime_cuda::attention::probe_cudnn() {
        Ok(line) => println!("PROBE OK {line}"),
        Err(line) => println!("PROBE ERR {line}"),
    }
}

/// A fake `libcudnn.so.9` in `dir` reporting `version`, whose `cudnnCreate` returns `create`
/// (every backend function exists and fails: none is reached).
fn fake(dir: &Path, version: u32, create: u32) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let source = dir.join("fake_cudnn.c");
    std::fs::write(
        &source,
        format!(
            "#include <stddef.h>\n\
             size_t cudnnGetVersion(void) {{ return {version}; }}\n\
             int cudnnCreate(void **handle) {{ (void)handle; return {create}; }}\n\
             int cudnnDestroy(void *handle) {{ (void)handle; return 0; }}\n\
             int cudnnSetStream(void *handle, void *stream) {{ (void)handle; (void)stream; return 0; }}\n\
             void cudnnGetLastErrorString(char *m, size_t n) {{ if (n) m[0] = 0; }}\n\
             int cudnnBackendCreateDescriptor(int k, void **d) {{ (void)k; (void)d; return 4000; }}\n\
             int cudnnBackendDestroyDescriptor(void *d) {{ (void)d; return 4000; }}\n\
             int cudnnBackendSetAttribute(void *d, int a, int t, long c, const void *v) {{ (void)d; (void)a; (void)t; (void)c; (void)v; return 4000; }}\n\
             int cudnnBackendGetAttribute(void *d, int a, int t, long r, long *c, void *v) {{ (void)d; (void)a; (void)t; (void)r; (void)c; (void)v; return 4000; }}\n\
             int cudnnBackendFinalize(void *d) {{ (void)d; return 4000; }}\n\
             int cudnnBackendExecute(void *h, void *p, void *v) {{ (void)h; (void)p; (void)v; return 4000; }}\n"
        ),
    )
    .map_err(|e| e.to_string())?;
    let library = dir.join("libcudnn.so.9");
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&library)
        .arg(&source)
        .status()
        .map_err(|e| format!("cc: {e}"))?;
    if !status.success() {
        return Err(format!("cc failed: {status}"));
    }
    let _ = std::fs::remove_file(dir.join("libcudnn.so"));
    std::os::unix::fs::symlink("libcudnn.so.9", dir.join("libcudnn.so")).map_err(|e| e.to_string())?;
    Ok(())
}

/// The child's answer with the fake in `dir` first on the library path.
fn probe_with(dir: &Path) -> String {
    let exe = std::env::current_exe().expect("the test executable");
    let path = format!("{}:{}", dir.display(), std::env::var("LD_LIBRARY_PATH").unwrap_or_default());
    let output = Command::new(exe)
        .args(["--exact", "probe_child", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("LD_LIBRARY_PATH", path)
        .output()
        .expect("the child runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "the child failed (a panic?):\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The harness prints `test probe_child ... ` before the child's own line.
    let at = stdout.find("PROBE ").unwrap_or_else(|| panic!("no probe line:\n{stdout}"));
    stdout[at..].lines().next().unwrap_or_default().to_string()
}

#[test]
fn a_too_old_failing_or_unknown_status_cudnn_is_one_line_never_a_panic() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    if Command::new("cc").arg("--version").output().is_err() {
        skip::skip("no C compiler (cc) to build the fake cuDNN libraries");
        return;
    }
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fake-cudnn");
    let (old, failing, unknown) = (root.join("8.9.7"), root.join("9.21.0"), root.join("9.99.0"));
    fake(&old, 8907, 1001).expect("the 8.9.7 fake");
    fake(&failing, 92100, 1001).expect("the 9.21.0 fake");
    fake(&unknown, 99900, 12345).expect("the 9.99.0 fake");
    let line = probe_with(&old);
    assert!(line.starts_with("PROBE ERR") && line.contains("cuDNN 8.9.7 is too old"), "{line}");
    let line = probe_with(&failing);
    assert!(
        line.starts_with("PROBE ERR")
            && line.contains("cuDNN 9.21.0: cudnnCreate failed: CUDNN_STATUS_NOT_INITIALIZED"),
        "{line}"
    );
    let line = probe_with(&unknown);
    assert!(
        line.starts_with("PROBE ERR") && line.contains("cuDNN 9.99.0: cudnnCreate failed: unknown status 12345"),
        "{line}"
    );
}
