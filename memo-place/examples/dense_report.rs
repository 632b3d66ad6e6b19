//! Dense traces, measured: a generated operator graph (`BLOCKS x OPS`, seed `SEED`), its
//! overlapping pairs, the lower bound, each classic greedy order's peak (best and first fit; with
//! `classic`), the greedy stage alone (node budget 0: its time and peak), and the solve under a
//! time limit as `memo solve` runs it (the search mixes side by side). Gaps are to the lower bound.
//!
//! `cargo run --release -p memo-place --example dense_report -- BLOCKS OPS SEED [SECONDS] [classic]`
//! (defaults 64 470 0 10).

use memo_place::check::check_placement;
use memo_place::generate::{operator_graph, GraphShape};
use memo_place::{lower_bound, solve, solve_portfolio, BufferLifetime, Progress, SearchMix, SolveOptions};
use std::time::{Duration, Instant};

/// Overlapping pairs, in O(n log n): each buffer in start order overlaps the earlier-starting ones
/// not ended by its start.
fn pairs(buffers: &[BufferLifetime]) -> u64 {
    let mut lowers: Vec<u32> = buffers.iter().map(|b| b.lower).collect();
    let mut uppers: Vec<u32> = buffers.iter().map(|b| b.upper).collect();
    lowers.sort_unstable();
    uppers.sort_unstable();
    lowers.iter().enumerate().map(|(i, &l)| (i as u64).saturating_sub(uppers.partition_point(|&u| u <= l) as u64)).sum()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: f64| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    let (blocks, ops, seed) = (arg(0, 64.0) as u32, arg(1, 470.0) as u32, arg(2, 0.0) as u64);
    let limit = Duration::from_secs_f64(arg(3, 10.0));
    let buffers = operator_graph(seed, GraphShape { blocks, ops_per_block: ops, activation_bytes: 1 << 28 });
    let lb = lower_bound(&buffers, 1);
    let gap = |p: u64| (p - lb) as f64 * 100.0 / lb as f64;
    println!(
        "operator graph {blocks}x{ops} seed {seed}: {} buffers, {} overlapping pairs, lower bound {lb}",
        buffers.len(),
        pairs(&buffers)
    );
    if args.iter().any(|a| a == "classic") {
        let start = Instant::now();
        let peaks = memo_place::classic_peaks(&buffers, 1).expect("no overflow");
        let names = ["size", "lifetime", "start", "area"];
        for (k, peak) in peaks.iter().enumerate() {
            println!("  classic {} {}: +{:.3}%", names[k / 2], ["best fit", "first fit"][k % 2], gap(*peak));
        }
        println!("  (the 8 classic orders: {:.2} s)", start.elapsed().as_secs_f64());
    }
    let start = Instant::now();
    let greedy = solve(&buffers, &SolveOptions { budget_nodes: 0, ..SolveOptions::default() }).expect("placed");
    println!("  greedy stage (budget 0): +{:.3}% in {:.2} s", gap(greedy.peak), start.elapsed().as_secs_f64());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let options = SolveOptions { budget_nodes: u64::MAX, ..SolveOptions::default() };
    let start = Instant::now();
    let solution =
        solve_portfolio(&buffers, &options, SearchMix::portfolio(cores), &mut |_: &Progress| start.elapsed() >= limit)
            .expect("placed");
    let seconds = start.elapsed().as_secs_f64();
    check_placement(&buffers, &solution.offsets, 1, solution.peak, None).expect("the checker accepts it");
    println!(
        "  solve ({cores} threads, {:.0} s limit): +{:.3}% (greedy +{:.3}%) in {seconds:.2} s",
        limit.as_secs_f64(),
        gap(solution.peak),
        gap(solution.stats.greedy_peak)
    );
}
