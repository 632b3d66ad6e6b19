//! The repository explains itself: no file in it refers to a document outside it, and every
//! repository path the architecture, the README, `docs/` and `spec/` name in backticks exists, so
//! a newcomer following `ARCHITECTURE.md` never meets a dead end.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every file under `dir` except build output, fetched libraries and version control.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if ![".git", "target", ".cache", "gpu-bundle", "gpu-check-out", "__pycache__"].contains(&name.as_str()) {
                files(&path, out);
            }
        } else {
            out.push(path);
        }
    }
}

/// Documents that lived beside the repository while it was written; naming one sends a reader
/// to a file a clone does not have. Spelt in pieces so this file does not name them itself.
const OUTSIDE: [&str; 3] = [concat!("../sha", "red"), concat!("DES", "IGN.md"), concat!("ME", "MO.md")];

#[test]
fn no_file_refers_to_a_document_outside_the_repository() {
    let mut all = Vec::new();
    files(&root(), &mut all);
    let mut found = Vec::new();
    for path in &all {
        let Ok(text) = std::fs::read_to_string(path) else { continue }; // binary files
        for (number, line) in text.lines().enumerate() {
            // The outside folder's name as a path of its own; a folder ending in it (support/) is fine.
            let shared = line
                .match_indices(concat!("sha", "red/"))
                .any(|(at, _)| !line[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == '-'));
            if shared || OUTSIDE.iter().any(|name| line.contains(name)) {
                found.push(format!("{}:{}: {line}", path.strip_prefix(root()).unwrap_or(path).display(), number + 1));
            }
        }
    }
    assert!(all.len() > 100, "walked only {} files", all.len());
    assert!(found.is_empty(), "references to files outside the repository:\n{}", found.join("\n"));
}

/// The folders at the root that a named path may start with.
const TOP: [&str; 17] = [
    "memo-plan-core/",
    "memo-place/",
    "memo-runtime/",
    "memo-nccl/",
    "memo-mpi/",
    "runtime-cpu/",
    "runtime-cuda/",
    "runtime-hip/",
    "kernels/",
    "memo-cli/",
    "memo-capi/",
    "tests/",
    "fuzz/",
    "spec/",
    "docs/",
    "scripts/",
    "examples/",
];

#[test]
fn every_path_the_documents_name_exists() {
    let root = root();
    let mut documents = vec![root.join("ARCHITECTURE.md"), root.join("README.md"), root.join("BENCHMARKS.md")];
    for dir in ["docs", "spec"] {
        files(&root.join(dir), &mut documents);
    }
    documents.retain(|p| p.extension().is_some_and(|e| e == "md"));
    let mut named = 0;
    let mut missing = Vec::new();
    for document in &documents {
        let text = std::fs::read_to_string(document).unwrap();
        // Inside backticks: the odd pieces of a split on '`'.
        for quoted in text.split('`').skip(1).step_by(2) {
            for word in quoted.split_whitespace() {
                let word = word.trim_end_matches([',', ';', ':', '.', ')']);
                if !TOP.iter().any(|top| word.starts_with(top)) || word.contains(['*', '<', '{', '$', ',']) {
                    continue;
                }
                // A path with a line (`file.rs:42`) or an anchor (`file.md#part`) names the file.
                let path = word.split([':', '#']).next().unwrap_or(word);
                named += 1;
                if !root.join(path).exists() {
                    missing.push(format!("{}: `{path}`", document.strip_prefix(&root).unwrap_or(document).display()));
                }
            }
        }
    }
    assert!(named > 50, "only {named} paths named: is the scan broken?");
    assert!(missing.is_empty(), "named but not in the repository:\n{}", missing.join("\n"));
}

/// Count words for the numbers a stream count can be written as.
const COUNT_WORDS: [&str; 11] = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"];

/// Every count of streams written before the word ("N streams", "a N-stream timeline", in words
/// or digits) in the repository's documents, sources and `--help` texts (which live in
/// `memo-cli/src`) names the plan's own stream count, `memo_plan_core::plan::STREAMS`: when the
/// collective stream was added, six documents went on counting one stream fewer. Counts of one
/// and two describe a stream or a pair of them, not the plan, so only counts from three up are
/// held to the constant.
#[test]
fn every_stream_count_named_is_the_plans() {
    let streams = memo_plan_core::plan::STREAMS;
    let mut all = Vec::new();
    files(&root(), &mut all);
    all.retain(|p| {
        p.extension().is_some_and(|e| ["md", "rs", "sh", "py", "toml", "txt"].contains(&e.to_str().unwrap_or("")))
    });
    let mut named = 0;
    let mut wrong = Vec::new();
    for path in &all {
        let Ok(text) = std::fs::read_to_string(path) else { continue };
        for (number, line) in text.lines().enumerate() {
            let lower = line.to_lowercase();
            for (at, _) in lower.match_indices("stream") {
                let before = lower[..at].trim_end_matches([' ', '-']);
                if before.len() == lower[..at].len() {
                    continue; // "upstream", "stream_count": not a count before it
                }
                let word = before.rsplit(|c: char| !c.is_alphanumeric()).next().unwrap_or("");
                let count = word.parse::<usize>().ok().or_else(|| COUNT_WORDS.iter().position(|w| *w == word));
                let Some(count) = count.filter(|&n| n >= 3) else { continue };
                named += 1;
                if count != streams {
                    let shown = path.strip_prefix(root()).unwrap_or(path).display().to_string();
                    wrong.push(format!("{shown}:{}: {}", number + 1, line.trim()));
                }
            }
        }
    }
    // The README, the specs and the --help texts all name it: a scan that finds none is broken.
    assert!(named >= 10, "found only {named} stream counts: the scan is broken");
    assert!(wrong.is_empty(), "the plan has {streams} streams, but these lines say otherwise:\n{}", wrong.join("\n"));
}
