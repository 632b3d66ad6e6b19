//! What `--help` says about the plan agrees with the plan's own constants.

mod common;

use common::memo;
use memo_plan_core::plan::STREAMS;

const COUNT_WORDS: [&str; 9] = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight"];

/// `memo plan`, `memo show` and `memo train` describe the plan's program as running on its
/// streams; each names the count `memo_plan_core::plan::STREAMS` gives (the repository-wide scan in
/// `tests/tests/repository.rs` holds every other document to it).
#[test]
fn help_names_the_plans_stream_count() {
    let count = COUNT_WORDS[STREAMS];
    for command in ["plan", "show", "train"] {
        let output = memo(&[command, "--help"], None);
        assert!(output.status.success(), "memo {command} --help fails");
        let help = String::from_utf8_lossy(&output.stdout);
        assert!(
            help.contains(&format!("{count} streams")),
            "memo {command} --help does not say \"{count} streams\":\n{help}"
        );
    }
}
