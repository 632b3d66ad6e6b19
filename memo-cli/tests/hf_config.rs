//! `memo plan --model config.json`: a Hugging Face config read as the model, and its refusals.

mod common;

use common::{assert_fails, code, memo, stderr};

const LLAMA_8B: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/models/hf/llama3.1-8b/config.json");

/// `contents` as `<scratch>/<directory>/config.json`.
fn config_json(directory: &str, contents: &str) -> std::path::PathBuf {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("memo-cli-hf-{directory}"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("config.json");
    std::fs::write(&path, contents).unwrap();
    path
}

#[test]
fn a_llama_config_json_plans_like_its_preset() {
    let args = ["plan", "--model", LLAMA_8B, "--seq", "8K", "--machine", "h100x8", "--tp", "8"];
    let output = memo(&args, None);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.starts_with(
            "llama3.1-8b (32 layers, h 4096, 32 heads, 8 K/V heads, SwiGLU FFN 14336, RMSNorm, no biases, untied, \
             rope theta 500000 (llama3 scaling)), 8192 tokens"
        ),
        "{stdout}"
    );
    for strategy in ["memo", "full-recompute", "full-swap", "keep-all"] {
        assert!(stdout.contains(strategy), "{strategy}: {stdout}");
    }
    // The same plans as the preset's, in JSON (all but the timings of planning).
    let json = |model: &str| {
        let output =
            memo(&["plan", "--model", model, "--seq", "8K", "--machine", "h100x8", "--tp", "8", "--json"], None);
        assert_eq!(code(&output), 0, "{}", stderr(&output));
        let mut value: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        for strategy in value["strategies"].as_array_mut().unwrap() {
            strategy.as_object_mut().unwrap().remove("plan_time_ms");
        }
        value
    };
    assert_eq!(json(LLAMA_8B), json("llama3.1-8b"));
}

#[test]
fn a_mixture_of_experts_exits_2_naming_the_field_and_the_file() {
    let mixtral = std::fs::read_to_string(LLAMA_8B).unwrap().replacen(
        "\"model_type\": \"llama\",",
        "\"model_type\": \"llama\",\n  \"num_local_experts\": 8,",
        1,
    );
    let path = config_json("mixtral", &mixtral);
    let path = path.to_str().unwrap();
    let output = memo(&["plan", "--model", path, "--seq", "8K", "--machine", "h100x8", "--tp", "8"], None);
    let message = assert_fails(&output, 2);
    assert!(message.starts_with(&format!("memo: {path}: num_local_experts")), "{message}");
}

#[test]
fn broken_and_missing_config_jsons_are_one_line_errors() {
    let path = config_json("broken", "{\n  \"model_type\": \"llama\",\n  \"hidden_size\": 4096,,\n}\n");
    let path = path.to_str().unwrap();
    let message = assert_fails(&memo(&["plan", "--model", path, "--seq", "8K", "--machine", "h100x8"], None), 2);
    assert!(message.contains(path) && message.contains("line 3 column"), "{message}");
    let missing = "/nonexistent/memo/config.json";
    let message = assert_fails(&memo(&["plan", "--model", missing, "--seq", "8K", "--machine", "h100x8"], None), 1);
    assert!(message.contains(missing), "{message}");
}
