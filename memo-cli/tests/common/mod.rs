//! Helpers shared by the CLI tests: run the built `memo` binary, check the failure contract.
#![allow(dead_code)]

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// Runs `memo` with `args`, feeding `stdin` (empty when `None`).
pub fn memo(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_memo"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the memo binary starts");
    let mut pipe = child.stdin.take().expect("stdin is piped");
    let input = stdin.unwrap_or_default().to_vec();
    // A writer thread, so a child that stops reading early cannot deadlock the test; it may
    // close its end, so write errors are expected and ignored.
    let writer = std::thread::spawn(move || {
        let _ = pipe.write_all(&input);
    });
    let output = child.wait_with_output().expect("memo runs to completion");
    writer.join().expect("the stdin writer finishes");
    output
}

pub fn code(output: &Output) -> i32 {
    output.status.code().expect("memo exits with a code, not a signal")
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Asserts the failure contract: exit `expected`, nothing on stdout, one `memo:` line on stderr.
pub fn assert_fails(output: &Output, expected: i32) -> String {
    let message = stderr(output);
    assert_eq!(code(output), expected, "stderr: {message}");
    assert!(output.stdout.is_empty(), "stdout on failure: {:?}", String::from_utf8_lossy(&output.stdout));
    assert!(message.starts_with("memo: "), "{message:?}");
    assert_eq!(message.lines().count(), 1, "one line expected: {message:?}");
    assert!(!message.contains("panicked"), "{message}");
    message
}

/// A file in the test scratch directory holding `contents`.
pub fn scratch(name: &str, contents: &[u8]) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("memo-cli-{name}"));
    std::fs::write(&path, contents).expect("the scratch file is written");
    path
}
