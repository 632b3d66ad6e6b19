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

/// Asserts the failure contract: exit `expected`, nothing on stdout, one `memo:` line on stderr,
/// and returns that line. Before it, stderr may hold the progress lines a command prints once its
/// work passes a second (`memo solve: 1.1 s: ...`): how many there are depends on the machine's
/// speed, which a test must not (so they are allowed, and checked to be progress lines).
pub fn assert_fails(output: &Output, expected: i32) -> String {
    let message = stderr(output);
    assert_eq!(code(output), expected, "stderr: {message}");
    assert!(output.stdout.is_empty(), "stdout on failure: {:?}", String::from_utf8_lossy(&output.stdout));
    assert!(!message.contains("panicked"), "{message}");
    let lines: Vec<&str> = message.lines().collect();
    let Some((failure, progress)) = lines.split_last() else { panic!("no failure line on stderr") };
    for line in progress {
        let is_progress =
            line.starts_with("memo ") && line.split_once(": ").is_some_and(|(_, rest)| rest.contains(" s: "));
        assert!(is_progress, "one failure line expected, after progress lines only: {message:?}");
    }
    assert!(failure.starts_with("memo: "), "{message:?}");
    format!("{failure}\n")
}

/// A file in the test scratch directory holding `contents`.
pub fn scratch(name: &str, contents: &[u8]) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("memo-cli-{name}"));
    std::fs::write(&path, contents).expect("the scratch file is written");
    path
}
