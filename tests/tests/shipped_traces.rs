//! Every trace shipped in `examples/traces/` parses, is placed at its known optimum, and the
//! placement passes the independent checker.

use memo_plan_core::check::check_placement;
use memo_plan_core::{parse_trace, solve, SolveOptions};

fn place(name: &str) -> (u64, u64, bool) {
    let path = format!("{}/../examples/traces/{name}", env!("CARGO_MANIFEST_DIR"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let trace = parse_trace(&bytes).unwrap_or_else(|e| panic!("{path}: {e}"));
    let solution = solve(&trace.buffers, &SolveOptions::default()).unwrap();
    check_placement(&trace.buffers, &solution.offsets, 1, solution.peak, None).unwrap();
    (solution.peak, solution.lower_bound, solution.optimal)
}

#[test]
fn memo_layer_trace_is_placed_at_its_lower_bound() {
    // The busiest step (request 18) holds 16, 21, 22, 23 and 24: 512 + 1024 + 256 + 128 + 512 MB.
    assert_eq!(place("memo-layer.trace"), (2_432_000_000, 2_432_000_000, true));
}

#[test]
fn small_csv_is_placed_at_its_lower_bound() {
    assert_eq!(place("small.csv"), (10240, 10240, true));
}

#[test]
fn every_shipped_trace_is_covered_here() {
    let dir = format!("{}/../examples/traces", env!("CARGO_MANIFEST_DIR"));
    let mut names: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["memo-layer.trace", "small.csv"], "add a test for each new shipped trace");
}
