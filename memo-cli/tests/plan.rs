//! `memo plan`, `memo check` and `memo show`, run as a user runs them.

mod common;

use common::{assert_fails, code, memo, scratch, stderr};

const PAPER: [&str; 8] = ["--model", "7b", "--seq", "1M", "--machine", "a800x8", "--tp", "8"];

fn plan_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["plan"];
    args.extend_from_slice(&PAPER);
    args.extend_from_slice(extra);
    args
}

fn json(output: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stdout)))
}

#[test]
fn the_paper_setting_fits_with_memo_only_among_the_swapping_strategies() {
    let output = memo(&plan_args(&["--json"]), None);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let value = json(&output);
    let strategies = value["strategies"].as_array().unwrap();
    let by = |name: &str| strategies.iter().find(|s| s["strategy"] == name).unwrap().clone();
    let memo_plan = by("memo");
    assert_eq!(memo_plan["fits"], true);
    assert_eq!(memo_plan["alpha_bound"], "host_memory");
    let alpha = memo_plan["alpha"].as_f64().unwrap();
    assert!((0.46..0.48).contains(&alpha), "{alpha}");
    // 16 bsh bf16 per GPU (16 GiB) plus the log-sum-exp.
    assert_eq!(memo_plan["skeletal_bytes_per_layer"], (16u64 << 30) + (1 << 20) * 32 / 8 * 4);
    for field in ["arena_bytes", "parameter_bytes", "rounding_buffer_bytes", "arena_lower_bound_bytes", "host_bytes"] {
        assert!(memo_plan[field].as_u64().unwrap() > 0, "{field}");
    }
    assert_eq!(memo_plan["device_bytes"], memo_plan["arena_bytes"]);
    assert!(memo_plan["mfu_causal"].as_f64().unwrap() < memo_plan["mfu_full"].as_f64().unwrap());
    assert_eq!(by("keep-all")["fits"], false);
    assert_eq!(by("full-swap")["fits"], false);
    assert!(by("full-swap")["host_excess_bytes"].as_u64().unwrap() > 0);
    assert!(!by("keep-all")["remedies"].as_array().unwrap().is_empty());
}

#[test]
fn a_written_plan_checks_and_shows() {
    let path = scratch("plan-memo.memo", b"");
    let path = path.to_str().unwrap();
    let output = memo(&plan_args(&["--strategy", "memo", "-o", path]), None);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let checked = memo(&["check", path], None);
    assert_eq!(code(&checked), 0, "{}", stderr(&checked));
    assert!(String::from_utf8_lossy(&checked.stdout).contains("valid (memo plan"));
    let shown = memo(&["show", path, "--json"], None);
    assert_eq!(code(&shown), 0, "{}", stderr(&shown));
    let summary = json(&shown);
    assert_eq!(summary["strategy"], "memo");
    assert_eq!(summary["seq_len"], 1 << 20);
    let dump = memo(&["show", path, "--dump-json"], None);
    assert_eq!(code(&dump), 0);
    assert_eq!(json(&dump)["buffers"].as_array().unwrap().len() as u64, summary["buffers"].as_u64().unwrap());
}

/// A context-parallel plan (c = 2, t = 2) is written, checked and shown: one program per
/// context rank, the ring's ops in it (spec/context-parallel.md).
#[test]
fn a_context_parallel_plan_is_written_checked_and_shown() {
    let path = scratch("plan-cp2.memo", b"");
    let path = path.to_str().unwrap();
    let args = ["--model", "7b", "--layers", "3", "--machine", "h100x8", "--tp", "2", "--cp", "2", "--seq", "8K"];
    let mut write = vec!["plan"];
    write.extend_from_slice(&args);
    write.extend(["--strategy", "memo", "-o", path]);
    let output = memo(&write, None);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let checked = memo(&["check", path], None);
    assert_eq!(code(&checked), 0, "{}", stderr(&checked));
    assert!(String::from_utf8_lossy(&checked.stdout).contains("valid (memo plan"));
    let shown = memo(&["show", path], None);
    assert_eq!(code(&shown), 0, "{}", stderr(&shown));
    let text = String::from_utf8_lossy(&shown.stdout).to_string();
    assert!(text.contains("context parallel: c = 2 ranks per sequence, one program each (1 rank program"), "{text}");
    let dump = memo(&["show", path, "--dump-json"], None);
    assert_eq!(code(&dump), 0, "{}", stderr(&dump));
    let dump = json(&dump);
    assert_eq!(dump["provenance"]["parallel"]["context"], 2);
    let ops: Vec<&str> =
        dump["instructions"].as_array().unwrap().iter().filter_map(|i| i["launch"]["op"].as_str()).collect();
    for op in ["rotary", "attention_block_causal", "ring_exchange", "to_bf16", "data_all_reduce_sum_bf16"] {
        assert!(ops.contains(&op), "{op} not in the plan");
    }
    assert!(!ops.contains(&"attention"), "no whole-sequence attention at c = 2");
}

#[test]
fn a_plan_that_does_not_fit_exits_5_with_the_remedy() {
    let output = memo(&plan_args(&["--strategy", "keep-all", "--layers", "8"]), None);
    assert_eq!(code(&output), 5);
    let message = stderr(&output);
    assert!(message.contains("does not fit") && message.contains("--max-seq"), "{message}");
}

#[test]
fn a_corrupt_plan_file_is_bad_input_and_a_broken_one_is_invalid() {
    let path = scratch("plan-corrupt.memo", b"MEMOPLAN but not really");
    let message = assert_fails(&memo(&["check", path.to_str().unwrap()], None), 2);
    assert!(message.contains("plan-corrupt.memo"), "{message}");

    // A valid encoding whose plan breaks a rule: shrink the arena and reseal.
    let good = scratch("plan-good.memo", b"");
    let output = memo(
        &[
            "plan",
            "--model",
            "7b",
            "--seq",
            "32K",
            "--machine",
            "a800x8",
            "--tp",
            "8",
            "--strategy",
            "memo",
            "-o",
            good.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let mut plan = memo_plan_core::plan::Plan::decode(&std::fs::read(&good).unwrap()).unwrap();
    plan.totals.arena_bytes /= 2;
    let broken = scratch("plan-broken.memo", &plan.encode());
    let output = memo(&["check", broken.to_str().unwrap()], None);
    assert_eq!(code(&output), 6);
    let listed = String::from_utf8_lossy(&output.stdout);
    assert!(listed.lines().count() >= 2, "{listed}");
    assert!(stderr(&output).contains("violation"));
}

#[test]
fn max_seq_orders_the_strategies() {
    let output = memo(&["plan", "--model", "7b", "--machine", "a800x8", "--tp", "8", "--max-seq", "--json"], None);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let value = json(&output);
    let rows = value["max_seq"].as_array().unwrap();
    let longest = |name: &str| rows.iter().find(|r| r["strategy"] == name).unwrap()["max_seq_len"].as_u64().unwrap();
    assert!(longest("memo") > longest("full-recompute"));
    assert!(longest("full-recompute") > longest("keep-all"));
    assert!(longest("memo") >= 1 << 20, "memo fits 1M tokens");
}

/// The misfits' remedies quote `--max-seq`'s longest sequences (full-swap's once said 4439240
/// tokens, a host-only bound, where `--max-seq` said 558080). Four layers of 7B at 64M tokens:
/// every strategy misses, and the searches stay short.
#[test]
fn remedies_quote_the_longest_sequence_of_max_seq() {
    let setting = ["--model", "7b", "--layers", "4", "--machine", "a800x8", "--tp", "8"];
    let output = memo(&[&["plan", "--max-seq", "--json"][..], &setting].concat(), None);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let value = json(&output);
    let rows = value["max_seq"].as_array().unwrap();
    let longest = |name: &str| rows.iter().find(|r| r["strategy"] == name).unwrap()["max_seq_len"].as_u64().unwrap();
    let output = memo(&[&["plan", "--seq", "64M", "--json"][..], &setting].concat(), None);
    // No strategy fits: exit 8, after the JSON.
    assert_eq!(code(&output), 8, "{}", stderr(&output));
    for plan in json(&output)["strategies"].as_array().unwrap() {
        let name = plan["strategy"].as_str().unwrap();
        assert_eq!(plan["fits"], false, "{name} fits 64M tokens");
        let remedies: Vec<&str> = plan["remedies"].as_array().unwrap().iter().map(|r| r.as_str().unwrap()).collect();
        let quoted = format!("fits at most {} tokens", longest(name));
        assert!(remedies.iter().any(|r| r.contains(&quoted)), "{name}: {remedies:?} lacks {quoted:?}");
    }
}

#[test]
fn bad_configuration_is_one_line_naming_the_field() {
    let message = assert_fails(&memo(&["plan", "--model", "8b", "--seq", "1M", "--machine", "a800x8"], None), 2);
    assert!(message.contains("8b") && message.contains("7b"), "{message}");
    let message =
        assert_fails(&memo(&["plan", "--model", "7b", "--seq", "1M", "--machine", "a800x8", "--tp", "3"], None), 2);
    assert!(message.contains("heads"), "{message}");
    let message = assert_fails(&memo(&["plan", "--model", "7b", "--machine", "a800x8"], None), 2);
    assert!(message.contains("--seq"), "{message}");
    let message = assert_fails(&memo(&plan_args(&["-o", "x.memo"]), None), 2);
    assert!(message.contains("--strategy"), "{message}");
    let toml = scratch("bad.toml", b"[model]\npreset = \"7b\"\nhidden = \"big\"\n");
    let message = assert_fails(
        &memo(&["plan", "--config", toml.to_str().unwrap(), "--seq", "1K", "--machine", "a800x8"], None),
        2,
    );
    // file:line:column, as compilers write it (toml's own rendering spans lines with `|` gutters).
    assert!(message.contains("bad.toml:3:10: invalid type"), "{message}");
}

/// The collectives cost time at t = 8: `--json` reports their seconds on the collective stream
/// and the interconnect the plan was timed with; a slower link (`--interconnect-bandwidth`) makes
/// them, and the step, slower; at t = 1 there are none.
#[test]
fn collectives_cost_time_and_the_interconnect_flags_change_it() {
    let small = ["plan", "--model", "7b", "--seq", "32K", "--machine", "a800x8", "--strategy", "memo", "--json"];
    let run = |extra: &[&str]| {
        let mut args = small.to_vec();
        args.extend_from_slice(extra);
        let output = memo(&args, None);
        // 7B at t = 1 does not fit one A800 (exit 5), but is planned and reported all the same.
        assert!([0, 5].contains(&code(&output)), "{}", stderr(&output));
        json(&output)
    };
    let preset = run(&["--tp", "8"]);
    assert_eq!(preset["interconnect_bytes_per_s"], 200_000_000_000u64);
    assert_eq!(preset["interconnect_latency_ns"], 5_000);
    let collective = preset["collective_s"].as_f64().unwrap();
    assert!(collective > 0.0 && preset["collectives"].as_u64().unwrap() > 0, "{preset}");
    let slow = run(&["--tp", "8", "--interconnect-bandwidth", "20GB/s", "--interconnect-latency", "50us"]);
    assert_eq!(slow["interconnect_bytes_per_s"], 20_000_000_000u64);
    assert!(slow["collective_s"].as_f64().unwrap() > 5.0 * collective, "{slow}");
    assert!(slow["step_time_s"].as_f64().unwrap() > preset["step_time_s"].as_f64().unwrap());
    let single = run(&["--tp", "1"]);
    assert_eq!(single["collective_s"], 0.0);
    assert_eq!(single["collectives"], 0);
    let bad =
        memo(&["plan", "--model", "7b", "--seq", "32K", "--machine", "a800x8", "--interconnect-latency", "soon"], None);
    assert_ne!(code(&bad), 0);
    assert!(stderr(&bad).contains("expected a latency"), "{}", stderr(&bad));
}

/// `memo plan` with the progress threshold at 0 (`MEMO_PROGRESS_AFTER_MS`, what a run past 2 s does):
/// its output and its stderr.
fn memo_with_progress(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_memo"))
        .args(args)
        .env("MEMO_PROGRESS_AFTER_MS", "0")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("the memo binary runs")
}

/// A `memo plan` of 10+ minutes and a `--max-seq` search of 22 s once printed nothing until they
/// ended. Past the threshold (2 s; forced to 0 here, so the test bounds no time) each strategy,
/// each stage and the check are reported on stderr as `memo plan: <seconds> s: ...` lines, and
/// the table on stdout is the same.
#[test]
fn a_plan_past_the_threshold_reports_each_strategy_and_stage_on_stderr() {
    let args = ["plan", "--model", "7b", "--seq", "4K", "--machine", "h200x8", "--tp", "8", "--layers", "4"];
    let output = memo_with_progress(&args);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let message = stderr(&output);
    for line in message.lines() {
        let (_, rest) = line.split_once(": ").unwrap();
        assert!(line.starts_with("memo plan: ") && rest.contains(" s: "), "{message}");
    }
    for strategy in ["memo", "full-recompute", "full-swap", "keep-all"] {
        for stage in ["alpha", "schedule", "placement", "simulate", "check"] {
            let wanted = format!("strategy {strategy} (");
            assert!(
                message.lines().any(|l| l.contains(&wanted) && l.ends_with(stage)
                    || l.contains(&wanted) && l.contains(&format!(": {stage} ("))),
                "{strategy} {stage}: {message}"
            );
        }
    }
    let quiet = memo(&args, None);
    let table = |o: &std::process::Output| -> Vec<Vec<String>> {
        // A strategy's row ends with its wall time to plan (`3.753 ms`), which differs run to run.
        let strategies = ["memo", "full-recompute", "full-swap", "keep-all"];
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(|line| {
                let mut words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
                if words.first().is_some_and(|w| strategies.contains(&w.as_str())) && words.len() > 2 {
                    words.truncate(words.len() - 2);
                }
                words
            })
            .collect()
    };
    assert_eq!(table(&output), table(&quiet));
}

/// `--max-seq` reports each length it probes, for each strategy; a failing plan's progress lines
/// keep the failure contract (progress lines, then one `memo:` line).
#[test]
fn max_seq_reports_each_probe_and_a_failure_keeps_its_one_line() {
    let output = memo_with_progress(&[
        "plan",
        "--model",
        "7b",
        "--machine",
        "h200x8",
        "--tp",
        "8",
        "--layers",
        "2",
        "--max-seq",
        "--strategy",
        "keep-all",
    ]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let message = stderr(&output);
    assert!(message.contains("memo plan: ") && message.contains("--max-seq, strategy keep-all (1 of 1)"), "{message}");
    for probe in ["probe 1 at 1024 tokens", "probe 2 at ", "probe 3 at "] {
        assert!(message.contains(probe), "{probe}: {message}");
    }
    // Refused after the progress began: progress lines, then the one failure line.
    let small =
        ["plan", "--model", "7b", "--seq", "4K", "--machine", "h200x8", "--layers", "2", "--plan-memory", "1MiB"];
    let failed = memo_with_progress(&small);
    let line = assert_fails(&failed, 2);
    assert!(line.contains("over the limit"), "{line}");
    assert!(stderr(&failed).lines().count() > 1, "progress lines before the failure: {}", stderr(&failed));
    // A plan that does not fit prints its table, then the progress lines end before the failure.
    let misfit = memo_with_progress(&plan_args(&["--strategy", "keep-all", "--layers", "8"]));
    assert_eq!(code(&misfit), 5);
    let message = stderr(&misfit);
    let (last, progress) = message.lines().collect::<Vec<_>>().split_last().map(|(l, p)| (*l, p.to_vec())).unwrap();
    assert!(last.starts_with("memo: the keep-all plan does not fit"), "{message}");
    assert!(!progress.is_empty() && progress.iter().all(|l| l.starts_with("memo plan: ")), "{message}");
}

/// `memo plan --layers 100000 --hidden 65536` ran 10+ minutes at 4.2 GB. It is refused up front
/// (exit 2) with the memory it would take and how to go on; `--plan-memory` sets the limit.
#[test]
fn a_step_too_large_to_plan_is_refused_up_front() {
    let args =
        ["plan", "--model", "7b", "--seq", "4K", "--machine", "h200x8", "--layers", "100000", "--hidden", "65536"];
    let message = assert_fails(&memo(&args, None), 2);
    for part in ["planning 100000 layers would take about", "GiB", "bytes", "--plan-memory", "fewer layers"] {
        assert!(message.contains(part), "{part}: {message}");
    }
    let small =
        ["plan", "--model", "7b", "--seq", "4K", "--machine", "h200x8", "--layers", "2", "--plan-memory", "1MiB"];
    let message = assert_fails(&memo(&small, None), 2);
    assert!(message.contains("over the limit of 0.0 GiB (1048576 bytes)"), "{message}");
}

/// `memo plan --machine-file` with measured kernel rates (what `memo profile` writes) predicts
/// from them: keep-all at t = 1 is the compute stream's launches, so the step is the cost model's
/// formula `n (A / a_f + (5/2) A / a_b) + G / g` (A one layer's causal attention FLOPs, G the
/// step's GEMM FLOPs), not the preset's `FLOPs / (60% of peak)`; halving the GEMM rate adds `G / g`.
#[test]
fn a_profile_with_kernel_rates_predicts_from_them() {
    use memo_plan_core::cost::{layer_forward_flops, step_flops, AttentionFlops};
    use memo_plan_core::model::{ModelConfig, Parallelism};
    let (forward, backward, gemm) = (45e12, 27.5e12, 600e12);
    let machine = |gemm: &str| {
        format!(
            "[machine]\npreset = \"h200x1\"\nattention_forward_flops = \"45TFLOP/s\"\n\
             attention_backward_flops = \"27.5T\"\ngemm_flops = \"{gemm}\"\n"
        )
    };
    let measured = scratch("rates.toml", machine("600TFLOP/s").as_bytes());
    let slower = scratch("rates-half-gemm.toml", machine("300TFLOP/s").as_bytes());
    let common = ["plan", "--model", "7b", "--layers", "4", "--seq", "8K", "--strategy", "keep-all", "--json"];
    let run = |extra: &[&str]| {
        let output = memo(&[&common[..], extra].concat(), None);
        assert_eq!(code(&output), 0, "{}", stderr(&output));
        json(&output)
    };
    let preset = run(&["--machine", "h200x1"]);
    let with_rates = run(&["--machine-file", measured.to_str().unwrap()]);
    let half_gemm = run(&["--machine-file", slower.to_str().unwrap()]);
    assert_eq!(preset["measured_rates"], serde_json::Value::Null);
    assert_eq!(with_rates["measured_rates"]["gemm_flops"], 600_000_000_000_000u64);
    assert_eq!(with_rates["measured_rates"]["attention_backward_flops"], 27_500_000_000_000u64);

    let mut model = ModelConfig::preset("7b", 8192, 1).unwrap();
    model.layers = 4;
    let single = Parallelism::single();
    let attention = layer_forward_flops(&model, &single, AttentionFlops::CausalHalved).unwrap().attention() as f64;
    let step = step_flops(&model, &single, AttentionFlops::CausalHalved, 1.0).unwrap();
    let gemm_flops = step.model_flops as f64 - 3.0 * 4.0 * attention;
    let formula = 4.0 * (attention / forward + 2.5 * attention / backward) + gemm_flops / gemm;
    let predicted = with_rates["step_time_s"].as_f64().unwrap();
    assert!((predicted - formula).abs() <= 1e-9 * formula, "{predicted} vs {formula}");
    let at_preset = preset["step_time_s"].as_f64().unwrap();
    assert!(at_preset < predicted / 2.0, "the preset's {at_preset} s vs the measured rates' {predicted} s");
    let added = half_gemm["step_time_s"].as_f64().unwrap() - predicted;
    let expected = gemm_flops / (gemm / 2.0) - gemm_flops / gemm;
    assert!((added - expected).abs() <= 1e-9 * expected, "{added} vs {expected}");

    // The text says so, naming the file and the rates.
    let output = memo(
        &["plan", "--model", "7b", "--layers", "4", "--seq", "8K", "--machine-file", measured.to_str().unwrap()],
        None,
    );
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains(&format!(
            "step (est.) uses the measured kernel rates of {}: attention_forward_flops 45TFLOP/s, \
             attention_backward_flops 27.5TFLOP/s, gemm_flops 600TFLOP/s",
            measured.display()
        )),
        "{text}"
    );
    // A rate without a unit, or above the peak, is refused.
    let bare = scratch("rates-bare.toml", b"[machine]\npreset = \"h200x1\"\ngemm_flops = \"600\"\n");
    let output = memo(&["plan", "--model", "7b", "--seq", "8K", "--machine-file", bare.to_str().unwrap()], None);
    assert_eq!(code(&output), 2, "{}", stderr(&output));
    assert!(stderr(&output).contains("machine.gemm_flops"), "{}", stderr(&output));
    let fast = scratch("rates-fast.toml", b"[machine]\npreset = \"h200x1\"\ngemm_flops = \"2P\"\n");
    let output = memo(&["plan", "--model", "7b", "--seq", "8K", "--machine-file", fast.to_str().unwrap()], None);
    assert_eq!(code(&output), 2, "{}", stderr(&output));
    assert!(stderr(&output).contains("gemm_flops = 2000000000000000 is above peak_flops"), "{}", stderr(&output));
}

/// Llama-3.1-70B at t = 8 on one node of 8x H100: the model state alone (16 bytes per
/// parameter over 8 GPUs) is past the GPU's memory, and the advice says so and offers nodes with
/// the distributed optimizer; on 4 nodes (d = 4 follows) with `--zero 1` it fits, its model state
/// is the plan's less what the sharding takes off, and the data-parallel ring crosses the network.
#[test]
fn llama_70b_fits_on_four_nodes_with_the_distributed_optimizer_only() {
    let base = ["plan", "--model", "llama3.1-70b", "--seq", "1K", "--machine", "h100x8", "--tp", "8"];
    let with = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        memo(&args, None)
    };
    let one_node = with(&["--strategy", "memo"]);
    assert_eq!(code(&one_node), 5, "{}", stderr(&one_node));
    let message = stderr(&one_node);
    assert!(message.contains("more nodes with --zero 1"), "{message}");
    assert!(message.contains("does not fit even 1024 tokens"), "{message}");
    let output = with(&["--strategy", "memo", "--nodes", "4", "--zero", "1", "--json"]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let plan = json(&output);
    assert_eq!(
        (plan["nodes"].as_u64(), plan["data_parallel"].as_u64(), plan["zero"].as_u64()),
        (Some(4), Some(4), Some(1))
    );
    assert_eq!(plan["fits"], true);
    assert_eq!(plan["data_parallel_across_nodes"], true);
    assert_eq!(plan["network_bytes_per_s"], 50_000_000_000u64);
    let whole = plan["plan_parameter_bytes"].as_u64().unwrap();
    let saved = plan["sharded_away_bytes"].as_u64().unwrap();
    // ZeRO 1 over 4 keeps a quarter of the 12 bytes of optimizer state per parameter: of the
    // plan's 16 bytes per parameter, 9 go.
    assert_eq!(saved, whole / 16 * 9, "{whole} {saved}");
    assert_eq!(plan["parameter_bytes"].as_u64().unwrap(), whole - saved);
    assert_eq!(plan["device_bytes"].as_u64().unwrap(), plan["arena_bytes"].as_u64().unwrap() - saved);
    let dp = &plan["data_parallel_s"];
    assert!(dp["reduce_gradients"].as_f64().unwrap() > 0.0 && dp["gather_parameters"].as_f64().unwrap() > 0.0);
    // d given instead of the nodes: the nodes follow.
    let output = with(&["--strategy", "memo", "--dp", "4", "--zero", "2", "--json"]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let plan2 = json(&output);
    assert_eq!((plan2["nodes"].as_u64(), plan2["zero"].as_u64()), (Some(4), Some(2)));
    assert!(plan2["sharded_away_bytes"].as_u64().unwrap() > saved, "ZeRO 2 shards the gradients too");
    // The table's header says where the data-parallel ranks sit.
    let output = with(&["--strategy", "memo", "--nodes", "4", "--zero", "1"]);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("on 4 nodes of h100x8"), "{text}");
    assert!(text.contains("data parallel: d = 4 ranks per group, across 4 nodes: the network, 50 GB/s"), "{text}");
}

/// Layouts that do not fill their nodes, a group larger than a node, an unknown ZeRO stage and
/// a plan file of a sharded plan are refused, each naming the numbers and the fix.
#[test]
fn node_layouts_and_zero_stages_are_checked() {
    let base = ["plan", "--model", "7b", "--seq", "8K", "--machine", "h100x8", "--layers", "2"];
    let refused = |extra: &[&str], words: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        let message = assert_fails(&memo(&args, None), 2);
        for w in words {
            assert!(message.contains(w), "{args:?}: {message:?} lacks {w:?}");
        }
    };
    refused(
        &["--tp", "8", "--nodes", "4", "--dp", "2"],
        &["d x t = 2 x 8 = 16 GPUs", "4 node(s) of 8 GPUs (32 GPUs)", "use d = 4", "or 2 node(s)"],
    );
    refused(&["--tp", "8", "--dp", "2", "--nodes", "1"], &["d x t = 2 x 8 = 16 GPUs", "use d = 1"]);
    refused(&["--tp", "16"], &["t = 16", "8 GPUs per node", "stays inside one node", "--tp 8 or less"]);
    refused(&["--tp", "16", "--nodes", "2"], &["t = 16", "stays inside one node"]);
    refused(&["--zero", "3"], &["ZeRO stage", "0", "1", "2"]);
    refused(&["--tp", "8", "--nodes", "0"], &["nodes is 0", "at least 1 node"]);
    // A machine without a preset has no network: d > 1 across nodes asks for one.
    let machine = scratch(
        "no-network.toml",
        b"[machine]\ndevice_memory = \"80GiB\"\nhost_memory_per_node = \"2TiB\"\ngpus_per_node = 8\n\
          d2h = \"25GB/s\"\nh2d = \"25GB/s\"\npeak_flops = \"312T\"\ninterconnect_bandwidth = \"200GB/s\"\n",
    );
    let machine = machine.to_str().unwrap();
    let args = ["plan", "--model", "7b", "--seq", "8K", "--layers", "2", "--tp", "8", "--nodes", "2"];
    let message = assert_fails(&memo(&[&args[..], &["--machine-file", machine]].concat(), None), 2);
    assert!(message.contains("network_bytes_per_s is 0") && message.contains("--network-bandwidth"), "{message}");
    // With the network given it plans.
    let given =
        memo(&[&args[..], &["--machine-file", machine, "--network-bandwidth", "25GB/s", "--json"]].concat(), None);
    assert_eq!(code(&given), 0, "{}", stderr(&given));
    refused(&["--tp", "8", "--nodes", "2", "--zero", "1", "--strategy", "memo", "-o", "x.memo"], &["-o", "--zero 1"]);
    let toml = scratch("zero-5.toml", b"[parallel]\nzero = 5\n");
    refused(&["--config", toml.to_str().unwrap()], &["parallel.zero = 5", "0, 1 or 2"]);
    // Part of one node is fine: t = 2, d = 2 on an 8-GPU node.
    let mut args = base.to_vec();
    args.extend(["--tp", "2", "--dp", "2", "--zero", "1", "--strategy", "memo", "--json"]);
    let output = memo(&args, None);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let plan = json(&output);
    assert_eq!((plan["nodes"].as_u64(), plan["data_parallel_across_nodes"].as_bool()), (Some(1), Some(false)));
}

/// `--cp C` (and `[parallel] context`): the header and JSON carry c, per-GPU bytes follow the
/// rank's s / c tokens, d follows from the nodes over c x t, ZeRO shards over d x c; layouts that
/// do not fit their nodes and sequences that are not multiples of 2 c t are refused with exit 2
/// and the numbers, and so is `memo train` at c > 1 (no runtime runs the ring yet).
#[test]
fn context_parallelism_is_planned_and_what_cannot_run_is_refused() {
    let base = ["plan", "--model", "llama3.1-8b", "--seq", "64K", "--machine", "h100x8", "--layers", "3"];
    let run = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        memo(&args, None)
    };
    let one = run(&["--tp", "4", "--strategy", "memo", "--json"]);
    assert_eq!(code(&one), 0, "{}", stderr(&one));
    let one = json(&one);
    let two = run(&["--tp", "4", "--cp", "2", "--zero", "1", "--strategy", "memo", "--json"]);
    assert_eq!(code(&two), 0, "{}", stderr(&two));
    let two = json(&two);
    assert_eq!((two["context_parallel"].as_u64(), one["context_parallel"].as_u64()), (Some(2), Some(1)));
    assert_eq!((two["data_parallel"].as_u64(), two["nodes"].as_u64()), (Some(1), Some(1)));
    // One layer's skeletal set: the rank's half of the tokens.
    let skeletal = |p: &serde_json::Value| p["skeletal_bytes_per_layer"].as_u64().unwrap();
    assert_eq!(skeletal(&two) * 2, skeletal(&one));
    assert!(two["sharded_away_bytes"].as_u64().unwrap() > 0, "ZeRO 1 over d x c = 2");
    let ring = &two["context_parallel_s"];
    // K and V of 32K tokens of 8 / 4 = 2 K/V heads of 128: 2 x 32768 x 256 x 2 bytes.
    assert_eq!(ring["ring_kv_bytes"].as_u64(), Some(2 * 32768 * 256 * 2));
    assert_eq!(one["context_parallel_s"]["exposed"].as_f64(), Some(0.0));
    // The same from a TOML file.
    let toml = scratch("context-2.toml", b"[parallel]\ntensor = 4\ncontext = 2\n");
    let from_file = run(&["--config", toml.to_str().unwrap(), "--strategy", "memo", "--json"]);
    assert_eq!(code(&from_file), 0, "{}", stderr(&from_file));
    assert_eq!(json(&from_file)["context_parallel"].as_u64(), Some(2));
    // The text header names c and where its ring runs.
    let text = run(&["--tp", "8", "--cp", "2", "--nodes", "2", "--strategy", "memo"]);
    assert_eq!(code(&text), 0, "{}", stderr(&text));
    let text = String::from_utf8_lossy(&text.stdout).to_string();
    assert!(text.contains("t = 8, c = 2, d = 1, on 2 nodes of h100x8"), "{text}");
    assert!(text.contains("context parallel: c = 2 ranks per sequence, 32768 tokens each"), "{text}");
    assert!(text.contains("ring attention across nodes: the network, 50 GB/s"), "{text}");
    let refused = |extra: &[&str], words: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        let message = assert_fails(&memo(&args, None), 2);
        for w in words {
            assert!(message.contains(w), "{args:?}: {message:?} lacks {w:?}");
        }
    };
    refused(&["--tp", "8", "--cp", "2", "--nodes", "1"], &["d x c x t = 1 x 2 x 8 = 16 GPUs", "2 node(s) or more"]);
    let other_seq = |seq: &str, extra: &[&str], words: &[&str]| {
        let mut args = vec!["plan", "--model", "llama3.1-8b", "--seq", seq, "--machine", "h100x8", "--layers", "3"];
        args.extend_from_slice(extra);
        let message = assert_fails(&memo(&args, None), 2);
        for w in words {
            assert!(message.contains(w), "{args:?}: {message:?} lacks {w:?}");
        }
    };
    // 48K is a multiple of 2 c t = 12, so the layout itself is what is refused.
    other_seq("48K", &["--tp", "2", "--cp", "3", "--nodes", "3"], &["c x t = 3 x 2 = 6 GPUs", "a multiple of 8"]);
    refused(&["--tp", "2", "--cp", "3", "--nodes", "3"], &["2 x c x t = 2 x 3 x 2 = 12", "e.g. 65532 or 65544"]);
    other_seq("1000", &["--tp", "8", "--cp", "4"], &["2 x c x t = 2 x 4 x 8 = 64", "e.g. 960 or 1024"]);
    refused(&["--cp", "0"], &["context is 0"]);
    // The file would hold whole model state where the figures shard it over d x c.
    refused(
        &["--tp", "4", "--cp", "2", "--zero", "1", "--strategy", "memo", "-o", "x.memo"],
        &["-o with --zero 1 at d x c = 1 x 2 = 2"],
    );
    // --max-seq searches multiples of 2 c t.
    let output = run(&["--tp", "8", "--cp", "2", "--nodes", "2", "--strategy", "memo", "--max-seq", "--json"]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let found = json(&output);
    assert_eq!(found["granularity"].as_u64(), Some(1024), "2 c t = 32 divides 1K");
    let longest = found["max_seq"][0]["max_seq_len"].as_u64().unwrap();
    assert_eq!(longest % 1024, 0, "{found}");
    // Without c, on one node: a shorter longest sequence (each GPU holds all of its tokens).
    let output = run(&["--tp", "8", "--strategy", "memo", "--max-seq", "--json"]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    assert!(json(&output)["max_seq"][0]["max_seq_len"].as_u64().unwrap() < longest, "c = 2 holds half");
    let text = run(&["--tp", "8", "--cp", "2", "--nodes", "2", "--strategy", "memo", "--max-seq"]);
    let text = String::from_utf8_lossy(&text.stdout).to_string();
    assert!(text.contains("c = 2 ranks per sequence, s / 2 tokens each (two chunks of s / 4)"), "{text}");
}
