//! `memo profile --device cpu` writes a `[machine]` TOML that `memo plan --machine-file` and
//! `memo train --machine-file` read; `memo train --json` reports step time and both MFUs.

mod common;

use std::path::PathBuf;

use common::{assert_fails, code, memo, stderr};

fn scratch_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("memo-profile-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn the_profile_is_a_machine_file_for_plan_and_train() {
    let dir = scratch_dir("roundtrip");
    let path = dir.join("cpu-machine.toml");
    let file = path.to_str().unwrap();
    let args = ["profile", "--device", "cpu", "--model", "tiny", "--seq", "64", "--repeats", "1"];
    let output = memo(&[&args[..], &["--copy-size", "1MiB", "--out", file, "--json"]].concat(), None);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let measured: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    for key in [
        "d2h_bytes_per_s",
        "h2d_bytes_per_s",
        "layer_forward_s",
        "attention_forward_flops",
        "attention_backward_flops",
        "gemm_flops",
    ] {
        assert!(measured[key].as_f64().unwrap() > 0.0, "{key}: {measured}");
    }
    let text = std::fs::read_to_string(&path).unwrap();
    // The layer time holds for the profiled shape only: a comment; the rate is what plans use.
    assert!(text.contains("[machine]") && text.contains("\n# layer_forward_s = "), "{text}");
    assert!(text.contains("\nachieved_flops = "), "{text}");
    assert!(text.contains("attention_forward_flops = ") && text.contains("gemm_flops = "), "{text}");
    // No temporary sibling is left behind.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);

    // memo plan plans for it: the machine is named after the file, the layer time is the measured one.
    let output =
        memo(&["plan", "--model", "7b", "--layers", "4", "--seq", "4K", "--machine-file", file, "--json"], None);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let plans: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(plans["strategies"][0]["machine"], "cpu-machine", "{plans}");
    // A profile of the tiny model at 64 tokens planning 7B at 4K tokens: the figures stay possible
    // (the measured rate, not the tiny layer's time, times the 7B layer).
    for plan in plans["strategies"].as_array().unwrap() {
        let causal = plan["mfu_causal"].as_f64().unwrap();
        assert!(causal > 0.0 && causal <= 1.0, "MFU-c {causal} of {plan}");
    }
    // The measured kernel rates round-trip: profile's writer -> plan's reader, the step timed with
    // them (the FLOP/s whole numbers, as written).
    for plan in plans["strategies"].as_array().unwrap() {
        for key in ["attention_forward_flops", "attention_backward_flops", "gemm_flops"] {
            let written = measured[key].as_f64().unwrap().round().max(1.0) as u64;
            assert_eq!(plan["measured_rates"][key].as_u64(), Some(written), "{key}: {plan}");
        }
    }
    let output = memo(&["plan", "--model", "7b", "--layers", "4", "--seq", "4K", "--machine-file", file], None);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(
        table.contains(&format!("step (est.) uses the measured kernel rates of {file}: attention_forward_flops ")),
        "{table}"
    );

    // A layer time of the tiny model written back as a live line is refused for 7B: it would run
    // the 7B layer above the peak.
    let measured_line = text.lines().find(|l| l.starts_with("# layer_forward_s = ")).unwrap();
    let live = dir.join("live-layer-time.toml");
    std::fs::write(&live, text.replace(measured_line, &measured_line[2..])).unwrap();
    let args = ["plan", "--model", "7b", "--layers", "4", "--seq", "4K", "--machine-file", live.to_str().unwrap()];
    let message = assert_fails(&memo(&args, None), 2);
    assert!(message.contains("above peak_flops") && message.contains("another layer shape"), "{message}");

    // memo train trains with it, and its --json lines carry step time and both MFUs.
    let output = memo(
        &[
            "train",
            "--device",
            "cpu",
            "--model",
            "tiny",
            "--seq",
            "32",
            "--steps",
            "2",
            "--json",
            "--machine-file",
            file,
        ],
        None,
    );
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let lines: Vec<serde_json::Value> =
        String::from_utf8_lossy(&output.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    for line in &lines[..2] {
        let step = line["step_time_s"].as_f64().unwrap();
        let (six_n, attention) = (line["mfu_6n"].as_f64().unwrap(), line["mfu_attention"].as_f64().unwrap());
        assert!(step > 0.0 && six_n > 0.0 && attention > six_n, "{line}");
        // tokens_per_s is tokens over the same step time.
        assert!((line["tokens_per_s"].as_f64().unwrap() * step - 32.0).abs() < 1e-6, "{line}");
    }
    assert_eq!(lines[2]["machine"], "cpu-machine");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn timings_add_the_compute_streams_busy_and_wait() {
    let args = ["train", "--device", "cpu", "--model", "tiny", "--seq", "32", "--steps", "1", "--json", "--timings"];
    let output = memo(&args, None);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let line: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&output.stdout).lines().next().unwrap()).unwrap();
    let busy = line["compute_busy_s"].as_f64().unwrap();
    assert!(busy > 0.0 && busy <= line["step_time_s"].as_f64().unwrap(), "{line}");
    assert!(line["compute_wait_s"].as_f64().unwrap() >= 0.0, "{line}");
}

#[test]
fn bad_profiles_and_machine_files_are_one_line() {
    let message = assert_fails(&memo(&["profile", "--device", "cuda", "--seq", "64"], None), 7);
    assert!(message.contains("cuda:0"), "{message}");
    let message = assert_fails(&memo(&["profile", "--device", "hip:2"], None), 7);
    assert!(message.contains("hip:2"), "{message}");
    let dir = scratch_dir("bad");
    let path = dir.join("half.toml");
    std::fs::write(&path, "[machine]\nd2h = \"10GB/s\"\n").unwrap();
    let file = path.to_str().unwrap();
    let args = ["train", "--device", "cpu", "--model", "tiny", "--seq", "32", "--steps", "1", "--machine-file", file];
    let message = assert_fails(&memo(&args, None), 2);
    assert!(message.contains("half.toml") && message.contains("peak_flops"), "{message}");
    let message =
        assert_fails(&memo(&["plan", "--model", "7b", "--seq", "4K", "--machine-file", "/nonexistent.toml"], None), 1);
    assert!(message.contains("/nonexistent.toml"), "{message}");
    let _ = std::fs::remove_dir_all(dir);
}
