//! One exit-code table: the README shows the table `memo --help` prints, every subcommand's
//! `--help` ends with it, and each error path below exits with the code that table gives its kind.
//! Bad files are tried per option that reads one: a binary, a missing file, a malformed TOML.

mod common;

use common::{assert_fails, code, memo, scratch, stderr};

/// The `Exit codes:` block at the end of a `--help` text.
fn exit_table(help: &str) -> String {
    let start = help.find("Exit codes:").expect("the help lists the exit codes");
    help[start..].trim_end().to_string()
}

/// The codes the table lists.
fn listed_codes(table: &str) -> Vec<i32> {
    table.lines().skip(1).filter_map(|l| l.split_whitespace().next()?.parse().ok()).collect()
}

#[test]
fn the_readme_and_every_help_list_the_same_exit_codes() {
    let help = String::from_utf8(memo(&["--help"], None).stdout).unwrap();
    let table = exit_table(&help);
    assert_eq!(listed_codes(&table), [0, 1, 2, 3, 4, 5, 6, 7, 8, 70, 130]);
    for command in ["plan", "solve", "check", "show", "train", "profile", "completions"] {
        let output = memo(&[command, "--help"], None);
        assert_eq!(code(&output), 0);
        assert_eq!(exit_table(&String::from_utf8_lossy(&output.stdout)), table, "memo {command} --help");
    }
    // The README holds the same table, indented as a code block in a list item.
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let dedented: String = readme.lines().map(|l| l.strip_prefix("  ").unwrap_or(l)).collect::<Vec<_>>().join("\n");
    assert!(dedented.contains(&table), "README.md does not show `memo --help`'s exit codes:\n{table}");
}

#[test]
fn each_error_path_exits_with_the_code_of_its_kind() {
    let table = exit_table(&String::from_utf8(memo(&["--help"], None).stdout).unwrap());
    let path = |name: &str, contents: &[u8]| scratch(name, contents).to_str().unwrap().to_string();
    let binary = path("exit-binary.bin", &[0x4d, 0x45, 0xff, 0xfe, 0x00, 0x9c, 0x0a, 0x80]);
    let broken_toml = path("exit-broken.toml", b"[model]\npreset = \"7b\"\n[machine\n");
    let typo_toml = path("exit-typo.toml", b"[model]\npreset = \"7b\"\nlayers = \"x\"\n");
    let missing = "/nonexistent/memo-exit-test.toml".to_string();
    let plan = "plan --model 7b --seq 32K --machine a800x8 --tp 8";
    // (arguments, expected code, words the message must hold); {b} {m} {t} {y}: the files above.
    let table_of_cases = [
        ("plan --config {b}", 2, "{b}|not a text file|--config takes a TOML file"),
        ("plan --config {m}", 1, "{m}|cannot read"),
        ("plan --config {t}", 2, "{t}:3:9: unclosed table"),
        ("plan --config {y}", 2, "{y}:3:10: invalid type"),
        ("{plan} --machine-file {b}", 2, "{b}|--machine-file takes a TOML file"),
        ("{plan} --machine-file {m}", 1, "{m}|cannot read"),
        ("train --model {b} --steps 1", 2, "{b}|--model takes a TOML file"),
        ("train --model no-such-model --steps 1", 2, "no such model or file"),
        ("profile --device cpu --model {b}", 2, "{b}|--model takes a TOML file"),
        ("train --machine-file {b} --steps 1", 2, "--machine-file takes a TOML file"),
        ("solve {b}", 2, "{b}|not UTF-8"),
        ("solve {m}", 1, "{m}|cannot read"),
        ("check {b}", 2, "{b}"),
        ("show {b}", 2, "{b}"),
        ("check {m}", 1, "{m}"),
        ("train --steps 0", 2, "--steps"),
        ("plan --model 7b --seq 99999999999999999M", 2, "too large"),
        ("solve --capacity 99999999999TiB {b}", 2, "too large|2^64 - 1"),
        ("plan --model 7b --seq 1M --machine a800x8 --strategy keep-all", 5, "does not fit|fewer tokens"),
        ("train --device cuda --steps 1", 7, ""),
        ("plan --model 7b --seq 32K --machine a800x8 --tp 8 --layers 2 --device-memory 1GiB", 8, "no strategy fits"),
        ("plan --model 7b --machine a800x8 --tp 8 --layers 2 --device-memory 1GiB --max-seq", 8, "any length"),
        ("plan --model 7b --seq 32K --machine h200x1 --tp 8", 2, "stays inside one node"),
        ("plan --model 7b --seq -5 --machine a800x8", 2, "can't be negative"),
    ];
    let fill = |text: &str| {
        text.replace("{plan}", plan)
            .replace("{b}", &binary)
            .replace("{m}", &missing)
            .replace("{t}", &broken_toml)
            .replace("{y}", &typo_toml)
    };
    let cases = table_of_cases.iter().map(|&(args, code, words)| {
        // Split the template, then fill: a path with a space stays one argument.
        let args: Vec<String> = args
            .split(' ')
            .flat_map(|a| if a == "{plan}" { plan.split(' ').map(str::to_string).collect() } else { vec![fill(a)] })
            .collect();
        let words: Vec<String> = words.split('|').filter(|w| !w.is_empty()).map(fill).collect();
        (args, code, words)
    });
    for (args, expected, words) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = memo(&args, None);
        if expected == 7 && code(&output) == 0 {
            continue; // a machine with a working CUDA device trains; nothing to check here
        }
        // A misfit prints its table on stdout before failing; every other failure prints nothing there.
        let message = if expected == 5 || expected == 8 {
            assert_eq!(code(&output), expected, "{}", stderr(&output));
            assert_eq!(stderr(&output).lines().count(), 1, "{}", stderr(&output));
            stderr(&output)
        } else {
            assert_fails(&output, expected)
        };
        for word in words {
            assert!(message.contains(&word), "memo {}: {message:?} lacks {word:?}", args.join(" "));
        }
        assert!(listed_codes(&table).contains(&expected), "code {expected} is not in the table");
        // A message starts with the failure, never with a doubled `memo: ` prefix.
        assert!(!message.starts_with("memo: memo:"), "{message}");
    }
}

/// `memo plan --seq 99999999999M` once printed "memo: memo: the activation elements ...": the
/// strategy named `memo` read as a second prefix.
#[test]
fn a_planner_error_names_the_strategy_apart_from_the_prefix() {
    let output = memo(&["plan", "--model", "7b", "--seq", "99999999999M", "--machine", "a800x8"], None);
    let message = assert_fails(&output, 2);
    assert!(message.starts_with("memo: cannot plan strategy memo: "), "{message}");
}

/// Plan files: garbage, truncated and damaged ones do not decode (2); one that decodes and breaks
/// a rule is invalid (6), as the table says.
#[test]
fn plan_files_that_do_not_decode_are_bad_input() {
    let good = scratch("exit-good.memo", b"");
    let output = memo(
        &["plan", "--model", "7b", "--seq", "32K", "--machine", "a800x8", "--tp", "8", "--strategy", "memo", "-o"]
            .iter()
            .copied()
            .chain([good.to_str().unwrap()])
            .collect::<Vec<_>>(),
        None,
    );
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    // `-o` says what it wrote.
    assert!(stderr(&output).contains(&format!("wrote the memo plan to {}", good.display())), "{}", stderr(&output));
    let bytes = std::fs::read(&good).unwrap();
    let truncated = scratch("exit-truncated.memo", &bytes[..bytes.len() / 2]);
    let mut flipped = bytes.clone();
    flipped[bytes.len() / 3] ^= 0x10;
    let damaged = scratch("exit-damaged.memo", &flipped);
    for path in [&truncated, &damaged] {
        let message = assert_fails(&memo(&["check", path.to_str().unwrap()], None), 2);
        assert!(message.contains(path.file_name().unwrap().to_str().unwrap()), "{message}");
    }
    let mut plan = memo_plan_core::plan::Plan::decode(&bytes).unwrap();
    plan.totals.arena_bytes /= 2;
    let broken = scratch("exit-broken.memo", &plan.encode());
    assert_eq!(code(&memo(&["check", broken.to_str().unwrap()], None)), 6);
}
