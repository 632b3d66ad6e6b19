//! memo's first `tiny-llama` step (32 tokens, seed 11) against PyTorch's:
//! `examples/python/llama_step_compare.py` loads the dumped parameters into Hugging Face
//! `transformers.LlamaForCausalLM` (or, without `transformers`, its compact PyTorch Llama) in
//! float64 and compares the loss and every gradient within its bf16-derived bound. Runs where the
//! Python interpreter (`MEMO_TORCH_PYTHON`, else `python3`) imports torch; elsewhere it checks that the
//! script says `SKIP: ...` and exits 0, and prints a SKIP line itself.
#![cfg(target_os = "linux")]

#[path = "../../tests/support/skip.rs"]
mod skip;

#[path = "../examples/first_step_dump.rs"]
#[allow(dead_code)] // its `main` and argument parsing
mod first_step_dump;

use std::path::Path;
use std::process::Command;

#[test]
fn the_first_llama_step_agrees_with_pytorch() {
    let python = std::env::var("MEMO_TORCH_PYTHON").unwrap_or_else(|_| "python3".to_string());
    if !Command::new(&python).arg("--version").output().is_ok_and(|o| o.status.success()) {
        skip::skip(format!("no {python} found"));
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let script = root.join("examples/python/llama_step_compare.py");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("llama-step-compare");
    let has_torch = Command::new(&python).args(["-c", "import torch"]).output().is_ok_and(|o| o.status.success());
    if !has_torch {
        // The script skips without a traceback, before reading the dump.
        let run = Command::new(&python).arg(&script).arg(&dir).output().unwrap();
        let stdout = String::from_utf8_lossy(&run.stdout);
        assert!(
            run.status.success() && stdout.starts_with("SKIP: torch is not installed"),
            "{stdout}{}",
            String::from_utf8_lossy(&run.stderr)
        );
        assert!(run.stderr.is_empty(), "{}", String::from_utf8_lossy(&run.stderr));
        skip::skip(format!("{python} cannot import torch (set MEMO_TORCH_PYTHON to an interpreter that can)"));
        return;
    }
    let _ = std::fs::remove_dir_all(&dir);
    let summary = first_step_dump::dump("tiny-llama", 32, 11, &dir).unwrap();
    println!("{summary}");
    let run = Command::new(&python).arg(&script).arg(&dir).output().unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    println!("{stdout}");
    assert!(run.status.success(), "the comparison failed:\n{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    assert!(stdout.contains(": PASS"), "{stdout}");
}
