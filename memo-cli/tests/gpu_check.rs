//! `scripts/gpu-check.sh --dry-run`: the GPU machine's script, run here on the CPU backend with
//! this build's `memo`, so that its control flow, its parsing and its table are tested where
//! there is no GPU. Needs bash, coreutils' `timeout` and python3; says SKIP without them.

use std::path::PathBuf;
use std::process::Command;

fn have(program: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {program}")]).output().is_ok_and(|o| o.status.success())
}

#[test]
fn the_dry_run_measures_every_strategy_and_prints_one_table() {
    if let Some(missing) = ["bash", "timeout", "python3"].into_iter().find(|p| !have(p)) {
        println!("SKIP: {missing} is not installed");
        return;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let scratch = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("memo-gpu-check");
    let _ = std::fs::remove_dir_all(&scratch);
    let bundle = scratch.join("bundle");
    std::fs::create_dir_all(&bundle).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_memo"), bundle.join("memo")).unwrap();
    let out = scratch.join("out");
    // Three narrow layers (memo swaps one): the script's logic, not the numbers, is under test.
    let model = scratch.join("model.toml");
    std::fs::write(&model, "[model]\nlayers = 3\nhidden = 32\nheads = 2\nvocab = 256\n").unwrap();
    let output = Command::new("bash")
        .arg(root.join("scripts/gpu-check.sh"))
        .arg("--dry-run")
        .current_dir(&root)
        .env("OUT", &out)
        .env("BUNDLE", &bundle)
        .env("MODEL", &model)
        .env("SEQS", "32")
        .env("STEPS", "2")
        .env("MAXSEQ_START", "32")
        .env("MAXSEQ_LIMIT", "64")
        .env("PEER_SEQ", "32")
        // A short profile: on a busy machine it may fail as too noisy, which the script records.
        .env("PROFILE_SEQ", "64")
        .env("PROFILE_REPEATS", "1")
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&output.stdout);
    let log = String::from_utf8_lossy(&output.stderr);
    // No test executables in this bundle: the script says so and exits 1, after every phase.
    assert_eq!(output.status.code(), Some(1), "{table}\n{log}");
    assert!(table.contains("DRY RUN") && table.contains("none ran"), "{table}");
    for strategy in ["keep-all", "full-recompute", "memo"] {
        let row = table
            .lines()
            .find(|l| l.trim_start().starts_with(strategy) && l.contains(" 32 "))
            .unwrap_or_else(|| panic!("no {strategy} row:\n{table}"));
        assert!(row.trim_end().ends_with("ok"), "{row}");
    }
    assert!(table.contains("longest sequence trained") && table.contains("peer at 32 tokens"), "{table}");
    let jsonl = std::fs::read_to_string(out.join("gpu-check.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = jsonl.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let measured: Vec<&serde_json::Value> = records.iter().filter(|r| r["kind"] == "measure").collect();
    assert_eq!(measured.len(), 3, "{jsonl}");
    for record in measured {
        assert!(record["step_time_s"].as_f64().unwrap() > 0.0, "{record}");
        assert!(record["mfu_attention"].as_f64().unwrap() > 0.0, "{record}");
        assert!(record["device_bytes"].as_u64().unwrap() > 0, "{record}");
    }
    let longest: Vec<&serde_json::Value> = records.iter().filter(|r| r["kind"] == "max_seq").collect();
    assert_eq!(longest.len(), 3);
    for record in longest {
        assert_eq!(record["trained_max_seq"], 64, "{record}");
        assert!(record["planner_max_seq"].as_u64().unwrap() > 64, "{record}");
    }
    assert!(records.iter().any(|r| r["kind"] == "peer"), "{jsonl}");
    let _ = std::fs::remove_dir_all(scratch);
}
