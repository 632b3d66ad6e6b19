//! Prints the placement quality table of BENCHMARKS.md: for generated instance sets, how often
//! the solver reaches the known optimum or the lower bound, peak / lower bound of the greedy
//! portfolio and of the full solve, and the time per instance.
//!
//! `cargo run --release -p memo-place --example placement_report` prints the table;
//! `... --example placement_report -- seeds 300 [FIRST] [COUNT]` prints one line per
//! known-optimum seed (FIRST.. FIRST+COUNT, default 0-9) of 300 buffers: peak / optimum, nodes,
//! milliseconds; `... -- training` prints only the training-step rows of the table.

use memo_place::check::check_placement;
use memo_place::generate::{known_optimum, training_step, StepShape};
use memo_place::{solve, BufferLifetime, SolveOptions};
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("seeds") {
        let count: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(300);
        let first: u64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(0);
        let seeds: u64 = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(10);
        for seed in first..first + seeds {
            per_seed(seed, count);
        }
        return;
    }
    let training_only = args.first().map(String::as_str) == Some("training");
    println!("| set | buffers | instances | at lower bound | proven optimal | worst peak/lb (greedy) | worst peak/lb (solve) | median ms | max ms |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for count in [100usize, 200, 300, 400, 500].into_iter().filter(|_| !training_only) {
        let instances: Vec<Vec<BufferLifetime>> =
            (0..10).map(|seed| known_optimum(seed, count, 4 * count as u32, 1 << 20)).collect();
        report(&format!("known optimum {count}"), &instances);
    }
    for (layers, transients) in [(32u32, 600u32), (48, 800), (64, 900)] {
        let shape =
            StepShape { layers, transients_per_layer: transients, skeletal_per_layer: 11, activation_bytes: 1 << 30 };
        let instances: Vec<Vec<BufferLifetime>> = (0..3).map(|seed| training_step(seed, shape)).collect();
        report(&format!("training step, {layers} layers"), &instances);
    }
}

/// One known-optimum instance: peak / optimum, whether proven, nodes and time.
fn per_seed(seed: u64, count: usize) {
    let buffers = known_optimum(seed, count, 4 * count as u32, 1 << 20);
    let start = Instant::now();
    let s = solve(&buffers, &SolveOptions::default()).expect("generated instances are valid");
    let ms = start.elapsed().as_secs_f64() * 1e3;
    check_placement(&buffers, &s.offsets, 1, s.peak, None).expect("the checker accepts every solution");
    println!(
        "known optimum {count} seed {seed}: peak/optimum {:.5} optimal {} nodes {} components {} largest {} {:.1} ms",
        s.peak as f64 / s.lower_bound as f64,
        s.optimal,
        s.stats.nodes,
        s.stats.components,
        s.stats.largest_component,
        ms
    );
}

fn report(name: &str, instances: &[Vec<BufferLifetime>]) {
    let mut at_bound = 0;
    let mut optimal = 0;
    let mut worst_greedy = 1.0f64;
    let mut worst = 1.0f64;
    let mut times = Vec::new();
    let mut sizes = Vec::new();
    for buffers in instances {
        let options = SolveOptions::default();
        let start = Instant::now();
        let s = solve(buffers, &options).expect("generated instances are valid");
        times.push(start.elapsed().as_secs_f64() * 1e3);
        check_placement(buffers, &s.offsets, 1, s.peak, None).expect("the checker accepts every solution");
        sizes.push(buffers.len());
        at_bound += usize::from(s.peak == s.lower_bound);
        optimal += usize::from(s.optimal);
        worst_greedy = worst_greedy.max(s.stats.greedy_peak as f64 / s.lower_bound as f64);
        worst = worst.max(s.peak as f64 / s.lower_bound as f64);
    }
    times.sort_by(f64::total_cmp);
    let size = if sizes.iter().min() == sizes.iter().max() {
        sizes[0].to_string()
    } else {
        format!("{}-{}", sizes.iter().min().unwrap(), sizes.iter().max().unwrap())
    };
    println!(
        "| {name} | {size} | {} | {at_bound} | {optimal} | {worst_greedy:.4} | {worst:.5} | {:.0} | {:.0} |",
        instances.len(),
        times[times.len() / 2],
        times[times.len() - 1]
    );
}
