//! `scripts/gpu-check.sh --dry-run`: the GPU machine's script, run here on the CPU backend with
//! this build's `memo`, so that its control flow, its parsing and its table are tested where
//! there is no GPU; and `--plan`: its phases, budgets and commands fit 12 minutes with the
//! numerics first. Needs bash, coreutils' `timeout` and python3; says SKIP without them.

#[path = "../../tests/support/skip.rs"]
mod skip;

use std::path::PathBuf;
use std::process::Command;

fn have(program: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {program}")]).output().is_ok_and(|o| o.status.success())
}

#[test]
fn the_dry_run_measures_every_strategy_and_prints_one_table() {
    if let Some(missing) = ["bash", "timeout", "python3"].into_iter().find(|p| !have(p)) {
        skip::skip(format!("{missing} is not installed"));
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
        .env("STEPS", "1")
        // Under 8 MiB keep-all fits 1K tokens of this model, memo 2K, full-recompute 5K. One step
        // a run and no try at full-recompute's own longest: a debug build's CPU backend takes
        // 5 s a step at 1K tokens, 15 s at 2K, over a minute at 5K.
        .env("CAP", "8MiB")
        .env("LONG_FACTOR", "2")
        .env("CAP_LONG_STEPS", "1")
        .env("CAP_LONGEST", "0")
        .env("PEER_SEQS", "32")
        .env("VARIANT_SEQ_DRY", "32")
        // A variant under trial (the default is none: attention runs on cuDNN), and phase 3's
        // deadlines for the slow debug build on a busy machine (the five capped runs took 130 s
        // at a load of 5 on 2 cores, when full-recompute's was cut at the phase's end): the
        // script's logic is under test, not its speed.
        .env("VARIANT", "pipelined")
        .env("DRY_PHASE_S", "400")
        .env("CAP_TIMEOUT", "150")
        // A short profile: on a busy machine it may fail as too noisy, which the script records.
        .env("PROFILE_SEQ", "64")
        .env("PROFILE_REPEATS", "1")
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&output.stdout);
    let log = String::from_utf8_lossy(&output.stderr);
    // No test executables in this bundle: the script says so and exits 1, after every phase.
    assert_eq!(output.status.code(), Some(1), "{table}\n{log}");
    // It printed the GPU run's plan first, and every phase's time.
    assert!(log.contains("gpu-check plan:") && log.contains(" s of 720 s (12 minutes): fits"), "{log}");
    for phase in 0..=5 {
        assert!(log.contains(&format!("] phase {phase} took ")), "phase {phase}'s time:\n{log}");
    }
    assert!(table.contains("DRY RUN") && table.contains("none ran"), "{table}");
    for strategy in ["keep-all", "full-recompute", "memo"] {
        let row = table
            .lines()
            .find(|l| l.trim_start().starts_with(strategy) && l.contains(" 32 "))
            .unwrap_or_else(|| panic!("no {strategy} row:\n{table}"));
        assert!(row.trim_end().ends_with("ok"), "{row}");
    }
    assert!(table.contains("capped at 8MiB") && table.contains("peer at 32 tokens"), "{table}");
    let jsonl = std::fs::read_to_string(out.join("gpu-check.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = jsonl.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let measured: Vec<&serde_json::Value> = records.iter().filter(|r| r["kind"] == "measure").collect();
    assert_eq!(measured.len(), 3, "{jsonl}");
    for record in measured {
        assert!(record["step_time_s"].as_f64().unwrap() > 0.0, "{record}");
        assert!(record["mfu_attention"].as_f64().unwrap() > 0.0, "{record}");
        assert!(record["device_bytes"].as_u64().unwrap() > 0, "{record}");
    }
    // Phase 3: keep-all at its longest under the cap and one granule past it (refused), memo and
    // full-recompute at 2x (memo's own longest; full-recompute's is not tried here).
    let longest: Vec<&serde_json::Value> = records.iter().filter(|r| r["kind"] == "max_seq").collect();
    assert_eq!(longest.len(), 3);
    let trained = |strategy: &str| {
        let record = longest.iter().find(|r| r["strategy"] == strategy).unwrap();
        let capped = record["planner_max_seq_capped"].as_u64().unwrap();
        assert!(record["planner_max_seq"].as_u64().unwrap() > capped, "{record}");
        (record["trained_max_seq_capped"].as_u64().unwrap(), capped)
    };
    assert_eq!(
        (trained("keep-all"), trained("memo"), trained("full-recompute")),
        ((1024, 1024), (2048, 2048), (2048, 5120))
    );
    let keep_all = longest.iter().find(|r| r["strategy"] == "keep-all").unwrap();
    assert_eq!(keep_all["first_failure_capped"]["seq_len"], 2048, "{keep_all}");
    assert_eq!(keep_all["first_failure_capped"]["status"], "does not fit", "{keep_all}");
    let capacity = records.iter().find(|r| r["kind"] == "capacity").unwrap();
    assert_eq!(capacity["keep_all_longest"], 1024, "{capacity}");
    assert_eq!(capacity["long_seq"], 2048, "{capacity}");
    assert_eq!(capacity["memo_trains_long"], "ok", "{capacity}");
    assert_eq!(capacity["memo_over_keep_all_trained"], 2.0, "{capacity}");
    assert!(capacity["memo_vs_keep_all"].is_f64() && capacity["memo_within_10pct"].is_boolean(), "{capacity}");
    assert!(capacity["memo_faster_than_full_recompute"].is_boolean(), "{capacity}");
    assert_eq!(records.iter().filter(|r| r["kind"] == "capacity_run").count(), 5, "{jsonl}");
    // The attention variant's trial: measured beside the baseline (the CPU ignores the variable;
    // the dry run has no test executables to run with it).
    assert!(records.iter().any(|r| r["kind"] == "attention_kernels"), "{jsonl}");
    let variant = records.iter().find(|r| r["kind"] == "variant").unwrap();
    assert_eq!(variant["variant"], "pipelined", "{variant}");
    assert_eq!(variant["measure"]["status"], "ok", "{variant}");
    assert!(variant["step_over_baseline"].as_f64().unwrap() > 0.0, "{variant}");
    assert!(["cudnn", "pipelined"].contains(&variant["capped_runs_used"].as_str().unwrap()), "{variant}");
    assert!(records.iter().any(|r| r["kind"] == "cudnn_attention"), "{jsonl}");
    assert!(records.iter().any(|r| r["kind"] == "peer"), "{jsonl}");
    let _ = std::fs::remove_dir_all(scratch);
}

/// `scripts/gpu-check.sh --plan`: the GPU run's phases with their budgets fit 12 minutes, the
/// numerics (runtime-cuda's test-gpu and test-nccl) run before anything else on the GPU, and no
/// command runs twice; budgets that exceed 12 minutes make it fail. Needs bash; runs nothing.
#[test]
fn the_plan_fits_twelve_minutes_with_the_numerics_first_and_nothing_twice() {
    if !have("bash") {
        skip::skip("bash is not installed");
        return;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let plan = |budget: Option<&str>| {
        let mut command = Command::new("bash");
        command.arg(root.join("scripts/gpu-check.sh")).arg("--plan").current_dir(&root);
        for variable in ["PHASE0_S", "PHASE1_S", "PHASE2_S", "PHASE3_S", "PHASE4_S", "PHASE5_S", "SEQS", "PEER_SEQS"] {
            command.env_remove(variable);
        }
        if let Some(seconds) = budget {
            command.env("PHASE3_S", seconds);
        }
        command.output().unwrap()
    };
    let output = plan(None);
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{text}\n{}", String::from_utf8_lossy(&output.stderr));
    // "phase N NAME: budget B s (source)", then its commands ("  BOUND s  COMMAND").
    let mut phases: Vec<(String, u64, Vec<String>)> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("phase ") {
            let (name, budget) = rest.split_once(": budget ").unwrap();
            let seconds: u64 = budget.split(' ').next().unwrap().parse().unwrap();
            assert!(budget.contains('(') && budget.len() > 20, "each budget says where it comes from: {line}");
            phases.push((name.to_string(), seconds, Vec::new()));
        } else if line.starts_with("  ") {
            let command = line.trim_start().split_once("s  ").unwrap().1.to_string();
            phases.last_mut().unwrap().2.push(command);
        }
    }
    let names: Vec<&str> = phases.iter().map(|(n, _, _)| n.as_str()).collect();
    assert_eq!(names, ["0 machine", "1 numerics", "2 tests", "3 measurements", "4 capacity", "5 peer"], "{text}");
    let total: u64 = phases.iter().map(|(_, b, _)| b).sum();
    assert!(total <= 12 * 60, "{total} s:\n{text}");
    assert!(text.contains(&format!("total: {total} s of 720 s (12 minutes): fits")), "{text}");
    // The numerics first: the first commands that use the GPU beyond nvidia-smi are test-gpu,
    // then test-nccl.
    let commands: Vec<&String> = phases.iter().flat_map(|(_, _, c)| c).collect();
    let first = commands.iter().position(|c| !c.starts_with("nvidia-smi")).unwrap();
    assert!(commands[first].contains("test-runtime-cuda-test-gpu "), "{text}");
    assert!(commands[first + 1].contains("test-runtime-cuda-test-nccl "), "{text}");
    assert!(phases[1].2.iter().all(|c| !c.contains("memo train")), "{text}");
    // Nothing twice: every command differs, and no test executable runs a test another run ran
    // (test-gpu's one skipped test is the one run alone).
    let mut seen = std::collections::HashSet::new();
    for command in &commands {
        assert!(seen.insert(command.as_str()), "run twice: {command}");
    }
    assert!(!text.contains("plans_build_on_a_gpu"), "the lib tests run once, with the plans' test in them:\n{text}");
    let lib_runs = commands.iter().filter(|c| c.contains("test-runtime-cuda-lib-runtime_cuda")).count();
    assert_eq!(lib_runs, 1, "{text}");
    let gpu_runs: Vec<&&String> = commands.iter().filter(|c| c.contains("test-runtime-cuda-test-gpu")).collect();
    assert_eq!(gpu_runs.len(), 2, "{text}");
    assert!(
        gpu_runs[0].contains("--skip attention_throughput") && gpu_runs[1].contains("attention_throughput --exact")
    );
    // Budgets past 12 minutes: the plan says so and fails.
    let over = plan(Some("900"));
    let text = String::from_utf8_lossy(&over.stdout);
    assert_eq!(over.status.code(), Some(1), "{text}");
    assert!(text.contains("DOES NOT FIT"), "{text}");
}

/// The PyTorch peer of the GPU run (`scripts/torch_peer.py`) on the CPU: every mode trains, and
/// its model has the parameter count `memo train` reports for the same shape, so the two train
/// the same architecture. Runs with the interpreter in `MEMO_TORCH_PYTHON`, else `python3`; says
/// SKIP when that has no PyTorch (CI installs none).
#[test]
fn the_torch_peer_trains_every_mode_with_memos_parameter_count() {
    let python = std::env::var("MEMO_TORCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let has_torch = Command::new(&python).args(["-c", "import torch"]).output().is_ok_and(|o| o.status.success());
    if !has_torch {
        skip::skip(format!("{python} cannot import torch (set MEMO_TORCH_PYTHON to an interpreter that can)"));
        return;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let scratch = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("memo-torch-peer");
    std::fs::create_dir_all(&scratch).unwrap();
    // A shape unlike the defaults (ffn_hidden not 4h, vocab not 256) so that both read the file.
    let model = scratch.join("model.toml");
    std::fs::write(&model, "[model]\nlayers = 3\nhidden = 48\nheads = 3\nffn_hidden = 80\nvocab = 300\n").unwrap();
    let peer = Command::new(&python)
        .arg(root.join("scripts/torch_peer.py"))
        .args(["--device", "cpu", "--seq", "32", "--steps", "2", "--warmup", "1", "--model"])
        .arg(&model)
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&peer.stderr);
    assert!(peer.status.success(), "{log}");
    let lines: Vec<serde_json::Value> =
        String::from_utf8_lossy(&peer.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let modes: Vec<&str> = lines.iter().map(|l| l["mode"].as_str().unwrap()).collect();
    assert_eq!(modes, ["store", "checkpoint", "offload"], "{lines:?}");
    let memo = Command::new(env!("CARGO_BIN_EXE_memo"))
        .args(["train", "--device", "cpu", "--seq", "32", "--steps", "1", "--json", "--model"])
        .arg(&model)
        .output()
        .unwrap();
    assert!(memo.status.success(), "{}", String::from_utf8_lossy(&memo.stderr));
    let stdout = String::from_utf8_lossy(&memo.stdout);
    let summary: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    for line in &lines {
        assert_eq!(line["status"], "ok", "{line}");
        assert_eq!(line["parameters"], summary["parameters"], "{line}\n{summary}");
        let loss = line["loss"].as_f64().unwrap();
        // Near ln(300) = 5.70 after two steps from a small initialisation.
        assert!(loss.is_finite() && (loss - 300f64.ln()).abs() < 1.0, "{line}");
    }
    let _ = std::fs::remove_dir_all(scratch);
}
