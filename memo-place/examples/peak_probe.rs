//! Issue 19, how loose is the live-bytes lower bound on pipelined graphs? Solves one
//! `generate::pipelined_graph` for SECONDS (stop callback, unlimited nodes), prints the best peak
//! over time, then what the final placement's peak is made of: the steps whose live buffers reach
//! the peak, their live bytes, and how many steps are within 0.5% of the lower bound (each of
//! them must be packed with under 0.5% of holes for a 0.5% placement).
//!
//! `cargo run --release -p memo-place --example peak_probe -- BLOCKS OPS SEED SECONDS`

use memo_place::check::check_placement;
use memo_place::generate::{pipelined_graph, GraphShape, PipelineShape};
use memo_place::{lower_bound, SolveOptions};
use memo_place::{solve_with, Progress};
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, d: u64| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(d);
    let (blocks, ops, seed) = (arg(0, 4) as u32, arg(1, 100) as u32, arg(2, 1));
    let limit = Duration::from_secs(arg(3, 10));
    let shape = GraphShape { blocks, ops_per_block: ops, activation_bytes: 1 << 28 };
    let buffers = pipelined_graph(seed, PipelineShape { graph: shape, micro_batches: 16, stagger: blocks * ops / 40 });
    let lb = lower_bound(&buffers, 1);
    let gap = |p: u64| (p as f64 - lb as f64) * 100.0 / lb as f64;
    let start = Instant::now();
    let mut last = 0u64;
    let mut marks = vec![1.0, 2.0, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 240.0, 480.0];
    marks.retain(|&m| m <= limit.as_secs_f64());
    let mut next = 0;
    let options = SolveOptions { capacity: None, alignment: 1, budget_nodes: u64::MAX, ..SolveOptions::default() };
    let s = solve_with(&buffers, &options, &mut |p: &Progress| {
        last = p.peak;
        let t = start.elapsed().as_secs_f64();
        while next < marks.len() && t >= marks[next] {
            println!("  {:>5.0} s: +{:.3}%", marks[next], gap(p.peak));
            next += 1;
        }
        start.elapsed() >= limit
    })
    .expect("minimise always places");
    check_placement(&buffers, &s.offsets, 1, s.peak, None).expect("valid");
    println!(
        "{blocks}x{ops} seed {seed}: {} buffers, lb {lb}, greedy +{:.3}%, final +{:.3}% after {:.1} s (last progress +{:.3}%)",
        buffers.len(),
        gap(s.stats.greedy_peak),
        gap(s.peak),
        start.elapsed().as_secs_f64(),
        gap(last.max(s.peak))
    );
    // Per-step live bytes and the top of the live buffers.
    let steps = buffers.iter().map(|b| b.upper).max().unwrap_or(0) as usize;
    let mut delta = vec![0i128; steps + 1];
    let mut top = vec![0u64; steps];
    for (b, &o) in buffers.iter().zip(&s.offsets) {
        delta[b.lower as usize] += b.size as i128;
        delta[b.upper as usize] -= b.size as i128;
        for t in b.lower..b.upper {
            top[t as usize] = top[t as usize].max(o + b.size);
        }
    }
    let mut live = vec![0u64; steps];
    let mut acc = 0i128;
    for t in 0..steps {
        acc += delta[t];
        live[t] = acc as u64;
    }
    let at_peak: Vec<usize> = (0..steps).filter(|&t| top[t] == s.peak).collect();
    let tight = (0..steps).filter(|&t| live[t] as f64 >= lb as f64 * 0.995).count();
    let tight1 = (0..steps).filter(|&t| live[t] as f64 >= lb as f64 * 0.99).count();
    let weights: u64 = buffers.iter().filter(|b| b.lower == 0 && b.upper as usize == steps).map(|b| b.size).sum();
    println!(
        "  steps {steps}; steps with live >= 99.5% of lb: {tight}, >= 99%: {tight1}; weights (throughout) {:.1}% of lb; largest buffer {:.2}% of lb",
        weights as f64 * 100.0 / lb as f64,
        buffers.iter().map(|b| b.size).max().unwrap_or(0) as f64 * 100.0 / lb as f64
    );
    println!("  steps whose live buffers reach the peak: {}", at_peak.len());
    for &t in at_peak.iter().take(6) {
        let n = buffers.iter().filter(|b| b.lower as usize <= t && (b.upper as usize) > t).count();
        println!(
            "    step {t}: live {:.3}% of lb ({n} buffers), holes below the peak {:.3}% of lb",
            live[t] as f64 * 100.0 / lb as f64,
            (s.peak - live[t]) as f64 * 100.0 / lb as f64
        );
    }
    let min_hole = at_peak.iter().map(|&t| s.peak - live[t]).min().unwrap_or(0);
    println!("  least holes at a peak step: {:.3}% of lb", min_hole as f64 * 100.0 / lb as f64);
}
