//! What a new user tripped on, each case as they ran it: units that were misread or
//! refused, machines overridden in silence, exit codes that said "fine" when nothing fitted,
//! `memo show`'s summed sizes beside the arena, cost-model figures shown as if measured, and no
//! shell completions. Every run here is bounded by its work (few layers, short sequences), never
//! by time.

mod common;

use common::{assert_fails, code, memo, scratch, stderr};

fn stdout(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn json(output: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(output)))
}

/// A TOML file with `[machine]` fields on a800x8, for 7B at 32K tokens with 2 layers and t = 8.
fn cluster(name: &str, machine: &str) -> String {
    let text = format!(
        "[model]\npreset = \"7b\"\nseq_len = \"32K\"\nlayers = 2\n[parallel]\ntensor = 8\n[machine]\npreset = \
         \"a800x8\"\n{machine}"
    );
    scratch(name, text.as_bytes()).to_str().unwrap().to_string()
}

/// `d2h = "12500"` was read as 12.5 kB/s (a 5,194,659 s step, without a word); `"12.5GB/s"` was
/// refused. A rate now needs a unit, and takes fractions and binary prefixes.
#[test]
fn a_rate_without_a_unit_is_refused_and_fractions_and_binary_prefixes_are_read() {
    let bare = cluster("units-bare.toml", "d2h = \"12500\"\n");
    let message = assert_fails(&memo(&["plan", "--config", &bare, "--strategy", "memo"], None), 2);
    assert!(
        message.contains("units-bare.toml: machine.d2h = \"12500\": a rate needs a unit, e.g. 12.5GB/s"),
        "{message}"
    );
    let integer = cluster("units-integer.toml", "h2d = 12500\n");
    let message = assert_fails(&memo(&["plan", "--config", &integer, "--strategy", "memo"], None), 2);
    assert!(message.contains("machine.h2d = 12500: a rate needs a unit"), "{message}");
    let message = assert_fails(&memo(&["plan", "--config", &bare, "--d2h", "12500"], None), 2);
    assert!(message.contains("--d2h") && message.contains("a rate needs a unit"), "{message}");

    let good = cluster(
        "units-good.toml",
        "d2h = \"12.5GB/s\"\nh2d = \"25 GiB/s\"\nhost_memory_per_node = \"1.5TB\"\npeak_flops = \"312TFLOP/s\"\n",
    );
    let output = memo(&["plan", "--config", &good, "--strategy", "memo", "--json"], None);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let plan = json(&output);
    let overrides = plan["machine_overrides"].as_array().unwrap();
    let value = |field: &str| overrides.iter().find(|o| o["field"] == field).map(|o| o["value"].clone());
    assert_eq!(value("d2h"), Some(12_500_000_000u64.into()));
    assert_eq!(value("h2d"), Some((25u64 << 30).into()));
    assert_eq!(value("host_memory_per_node"), Some(1_500_000_000_000u64.into()));
    assert_eq!(value("peak_flops"), None, "312T is the preset's own peak");
    // The flags take the same forms.
    let flagged = memo(
        &["plan", "--config", &good, "--strategy", "memo", "--json", "--d2h", "0.5TB/s", "--device-memory", "79.5GiB"],
        None,
    );
    assert_eq!(code(&flagged), 0, "{}", stderr(&flagged));
    let overrides = json(&flagged)["machine_overrides"].clone();
    assert!(
        overrides.to_string().contains(r#"{"field":"d2h","preset":25000000000,"value":500000000000}"#),
        "{overrides}"
    );
    assert!(overrides.to_string().contains(&format!("\"value\":{}", 159u64 << 29)), "{overrides}");
}

/// `--seq 1G` was refused and `--seq -5` said "unexpected argument".
#[test]
fn token_counts_take_g_and_a_negative_one_says_so() {
    // 1G = 2^30 tokens is read, and planned: it is too long for 7B (the planner says so).
    let args = ["plan", "--model", "7b", "--seq", "1G", "--machine", "a800x8", "--tp", "8", "--layers", "1"];
    let message = assert_fails(&memo(&args, None), 2);
    assert!(message.contains("cannot plan strategy memo") && message.contains("too long"), "{message}");
    let args = ["plan", "--model", "7b", "--seq", "0.5M", "--machine", "a800x8", "--tp", "8", "--layers", "1"];
    let output = memo(&[&args[..], &["--strategy", "memo", "--json"]].concat(), None);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    assert_eq!(json(&output)["seq_len"], 1u64 << 19);
    for command in [&["plan", "--model", "7b", "--machine", "a800x8"][..], &["train", "--steps", "1"][..]] {
        let mut args = command.to_vec();
        args.extend(["--seq", "-5"]);
        let message = assert_fails(&memo(&args, None), 2);
        assert!(message.contains("--seq") && message.contains("a token count can't be negative"), "{message}");
        assert!(!message.contains("unexpected argument"), "{message}");
    }
    let message = assert_fails(&memo(&["plan", "--model", "7b", "--machine", "a800x8", "--seq", "1.1"], None), 2);
    assert!(message.contains("not a whole number of tokens"), "{message}");
}

/// `--machine h200x1 --tp 8` was accepted with one GPU per node.
#[test]
fn a_tensor_parallel_group_larger_than_a_node_is_refused_with_the_reason() {
    let args = ["plan", "--model", "7b", "--seq", "32K", "--machine", "h200x1", "--tp", "8", "--layers", "2"];
    let message = assert_fails(&memo(&args, None), 2);
    for words in ["t = 8", "h200x1 has 1 GPU per node", "stays inside one node", "--tp 1", "a800x8 (8 GPUs)"] {
        assert!(message.contains(words), "{message:?} lacks {words:?}");
    }
    // The same with the GPUs per node overridden: the message says the count is the override's.
    let mut more = args.to_vec();
    more.extend(["--gpus-per-node", "4"]);
    let message = assert_fails(&memo(&more, None), 2);
    assert!(
        message.contains("h200x1 has 4 GPUs per node (as overridden)") && message.contains("--tp 4 or less"),
        "{message}"
    );
}

/// `--gpus-per-node 8` on h200x1 cut host memory per GPU eightfold while the header still said
/// `h200x1`. The header says the machine was overridden, what changed, and what follows.
#[test]
fn machine_overrides_are_named_in_the_header_and_the_json() {
    let args = ["plan", "--model", "7b", "--seq", "32K", "--machine", "h200x1", "--layers", "2", "--strategy", "memo"];
    let plain = memo(&args, None);
    assert_eq!(code(&plain), 0, "{}", stderr(&plain));
    assert!(!stdout(&plain).contains("overridden"), "{}", stdout(&plain));
    let mut overridden = args.to_vec();
    overridden.extend(["--gpus-per-node", "8"]);
    let output = memo(&overridden, None);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let text = stdout(&output);
    let header: Vec<&str> = text.lines().take(2).collect();
    assert!(
        header[0].contains("on h200x1 (overridden): 140.00 GiB per GPU, 256.00 GiB host per node (32.00 GiB per GPU)"),
        "{text}"
    );
    assert_eq!(
        header[1], "machine h200x1 overridden: gpus_per_node 1 -> 8; host_memory_per_gpu 256.00 GiB -> 32.00 GiB",
        "{text}"
    );
    overridden.push("--json");
    let value = json(&memo(&overridden, None));
    assert_eq!(
        value["machine_overrides"],
        serde_json::json!([
            {"field": "gpus_per_node", "preset": 1, "value": 8},
            {"field": "host_memory_per_gpu", "preset": 256u64 << 30, "value": 32u64 << 30},
        ])
    );
}

/// The side-by-side table exited 0 when no strategy fitted, and `--max-seq` exited 0 when every
/// strategy said "none": both exit 8 now, after printing their table.
#[test]
fn nothing_fitting_exits_8_after_the_table() {
    let tiny = ["plan", "--model", "7b", "--seq", "32K", "--machine", "a800x8", "--tp", "8", "--layers", "2"];
    let mut none = tiny.to_vec();
    none.extend(["--device-memory", "1GiB"]);
    let output = memo(&none, None);
    assert_eq!(code(&output), 8, "{}", stderr(&output));
    assert!(stdout(&output).contains("keep-all"), "the table comes first: {}", stdout(&output));
    let message = stderr(&output);
    assert_eq!(message.lines().count(), 1, "{message}");
    assert!(message.starts_with("memo: no strategy fits 32768 tokens on a800x8: "), "{message}");
    // Advice never contradicts itself: no shorter sequence is offered where none fits.
    let table = stdout(&output);
    assert!(table.contains("fewer tokens will not do") && !table.contains("shorter sequence"), "{table}");

    let mut max_seq = none.clone();
    max_seq.push("--max-seq");
    let output = memo(&max_seq, None);
    assert_eq!(code(&output), 8, "{}", stderr(&output));
    assert!(stdout(&output).contains("none"), "{}", stdout(&output));
    let message = stderr(&output);
    assert_eq!(message.lines().count(), 1, "{message}");
    assert!(message.starts_with("memo: no strategy fits any length on a800x8, not even 1024 tokens"), "{message}");

    // One strategy fitting is success, for the table and for --max-seq alike.
    let output = memo(&tiny, None);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let mut some = tiny.to_vec();
    some.push("--max-seq");
    let output = memo(&some, None);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
}

/// The headline table printed the cost model's MFU-c and MFU-f as if measured.
#[test]
fn the_headline_table_labels_cost_model_figures_as_estimates() {
    let args = ["plan", "--model", "7b", "--seq", "32K", "--machine", "a800x8", "--tp", "8", "--layers", "2"];
    let output = memo(&args, None);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let text = stdout(&output);
    let header = text.lines().find(|l| l.starts_with("strategy")).unwrap();
    assert!(header.contains("step (est.)") && header.contains("MFU (est.)"), "{header}");
    assert!(!text.contains("MFU-f") && !text.contains("MFU-c"), "{text}");
    assert!(
        text.contains(
            "Estimates, not measurements: step, collect. and MFU come from the cost model (spec/cost-model.md)"
        ),
        "{text}"
    );
    // JSON keeps both MFU figures.
    let mut json_args = args.to_vec();
    json_args.push("--json");
    let value = json(&memo(&json_args, None));
    for plan in value["strategies"].as_array().unwrap() {
        assert!(plan["mfu_full"].as_f64().is_some() && plan["mfu_causal"].as_f64().is_some(), "{plan}");
    }
}

/// `memo show` listed "transient 761 buffers 399.49 GiB" beside an 18.20 GiB arena: a sum over the
/// step. Each kind now shows the peak of its live bytes beside its summed sizes, labelled.
#[test]
fn show_separates_peak_live_bytes_from_summed_sizes() {
    let path = scratch("new-user-show.memo", b"");
    let path = path.to_str().unwrap();
    let args = ["plan", "--model", "7b", "--seq", "32K", "--machine", "a800x8", "--tp", "8", "--layers", "2"];
    let mut write = args.to_vec();
    write.extend(["--strategy", "memo", "-o", path]);
    let output = memo(&write, None);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let shown = memo(&["show", path], None);
    assert_eq!(code(&shown), 0, "{}", stderr(&shown));
    let text = stdout(&shown);
    assert!(text.contains("buffers by kind (peak live: the most bytes of the kind live at once; summed:"), "{text}");
    let columns = text.lines().find(|l| l.trim_start().starts_with("kind ")).unwrap();
    assert_eq!(columns.split_whitespace().collect::<Vec<_>>(), ["kind", "buffers", "peak", "live", "summed"]);
    let value = json(&memo(&["show", path, "--json"], None));
    let arena = value["arena_bytes"].as_u64().unwrap();
    let kinds = value["bytes_by_kind"].as_array().unwrap();
    let transient = kinds.iter().find(|k| k["kind"] == "transient").unwrap();
    let (peak, summed) = (transient["peak_live_bytes"].as_u64().unwrap(), transient["summed_bytes"].as_u64().unwrap());
    assert!(peak > 0 && peak <= arena && peak < summed, "{transient} arena {arena}");
    for kind in kinds {
        assert!(kind["peak_live_bytes"].as_u64().unwrap() <= kind["summed_bytes"].as_u64().unwrap(), "{kind}");
    }
}

/// There were no shell completions.
#[test]
fn completions_are_written_for_bash_zsh_and_fish() {
    for shell in ["bash", "zsh", "fish"] {
        let output = memo(&["completions", shell], None);
        assert_eq!(code(&output), 0, "{shell}: {}", stderr(&output));
        let script = stdout(&output);
        for subcommand in ["solve", "plan", "check", "show", "train", "profile", "completions"] {
            assert!(script.contains(subcommand), "{shell} script lacks {subcommand}");
        }
        assert!(script.contains("--max-seq") || script.contains("max-seq"), "{shell} script lacks plan's options");
    }
    assert!(stdout(&memo(&["completions", "bash"], None)).contains("complete -F"));
    assert!(stdout(&memo(&["completions", "zsh"], None)).starts_with("#compdef memo"));
    assert!(stdout(&memo(&["completions", "fish"], None)).contains("complete -c memo"));
    let message = assert_fails(&memo(&["completions", "tcsh"], None), 2);
    assert!(message.contains("tcsh") && message.contains("memo completions --help"), "{message}");
}

/// The README's copy of the main job's table is the table `memo plan` prints today (the last
/// column, each plan's wall time, cut), with the note under it: the copy once showed MFU-c and
/// MFU-f as if measured.
#[test]
fn the_readme_shows_the_main_job_table_as_printed() {
    let args = ["plan", "--model", "7b", "--seq", "1M", "--machine", "a800x8", "--tp", "8"];
    let output = memo(&args, None);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let text = stdout(&output);
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let table: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("strategy")).take(5).collect();
    assert_eq!(table.len(), 5, "{text}");
    for row in table {
        // The plan column is the last one, after the MFU's `%` (or its header's `(est.)`).
        let end = row.rfind('%').or_else(|| row.rfind("(est.)").map(|i| i + "(est.)".len() - 1)).unwrap();
        let cut = &row[..=end];
        assert!(readme.contains(&format!("{cut}\n")), "README.md lacks the row {cut:?}");
    }
    let note: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("Estimates, not measurements")).take(4).collect();
    assert!(readme.contains(&note.join("\n")), "README.md lacks the note under the table:\n{}", note.join("\n"));
}
