//! Placement benchmarks over generated instance sets: time per instance, greedy (node budget 0)
//! and exact (default budget) side by side (exact only at 500 buffers). Quality (peak / lower bound) is printed once per
//! instance, outside the timed loop; `examples/placement_report.rs` prints the full table.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use memo_place::generate::{
    known_optimum, operator_graph, pipelined_graph, training_step, GraphShape, PipelineShape, StepShape,
};
use memo_place::{solve, SolveOptions};
use std::hint::black_box;

fn greedy_only() -> SolveOptions {
    SolveOptions { budget_nodes: 0, ..SolveOptions::default() }
}

fn known_optimum_300(c: &mut Criterion) {
    let mut group = c.benchmark_group("known_optimum_300");
    group.sample_size(10);
    // All ten seeds of BENCHMARKS.md's 300-buffer set: each is settled at its optimum.
    for seed in 0u64..10 {
        let buffers = known_optimum(seed, 300, 1200, 1 << 20);
        for (name, options) in [("greedy", greedy_only()), ("exact", SolveOptions::default())] {
            let s = solve(&buffers, &options).expect("solvable");
            eprintln!("known_optimum_300 seed {seed} {name}: peak/lb {:.4}", s.peak as f64 / s.lower_bound as f64);
            group.bench_with_input(BenchmarkId::new(name, seed), &buffers, |b, buffers| {
                b.iter(|| solve(black_box(buffers), &options).expect("solvable"))
            });
        }
    }
    group.finish();
}

fn known_optimum_500(c: &mut Criterion) {
    let mut group = c.benchmark_group("known_optimum_500");
    group.sample_size(10);
    // All ten seeds of BENCHMARKS.md's 500-buffer set, exact only (the greedy misses them all).
    for seed in 0u64..10 {
        let buffers = known_optimum(seed, 500, 2000, 1 << 20);
        let options = SolveOptions::default();
        let s = solve(&buffers, &options).expect("solvable");
        eprintln!("known_optimum_500 seed {seed} exact: peak/lb {:.4}", s.peak as f64 / s.lower_bound as f64);
        group.bench_with_input(BenchmarkId::new("exact", seed), &buffers, |b, buffers| {
            b.iter(|| solve(black_box(buffers), &options).expect("solvable"))
        });
    }
    group.finish();
}

fn training_steps(c: &mut Criterion) {
    let mut group = c.benchmark_group("training_step");
    group.sample_size(10);
    for (layers, transients) in [(32u32, 600u32), (48, 800), (64, 900)] {
        let shape =
            StepShape { layers, transients_per_layer: transients, skeletal_per_layer: 11, activation_bytes: 1 << 30 };
        let buffers = training_step(layers.into(), shape);
        let s = solve(&buffers, &SolveOptions::default()).expect("solvable");
        eprintln!(
            "training_step {} buffers: peak/lb {:.5}, optimal {}",
            buffers.len(),
            s.peak as f64 / s.lower_bound as f64,
            s.optimal
        );
        group.bench_with_input(BenchmarkId::from_parameter(buffers.len()), &buffers, |b, buffers| {
            b.iter(|| solve(black_box(buffers), &SolveOptions::default()).expect("solvable"))
        });
    }
    group.finish();
}

/// The real-model-shaped operator graphs of BENCHMARKS.md's issue-19 section (20k, 51k, 99.5k
/// buffers, seed 0), default options.
fn operator_graphs(c: &mut Criterion) {
    let mut group = c.benchmark_group("operator_graph");
    group.sample_size(10);
    for (blocks, ops_per_block) in [(24u32, 250u32), (48, 320), (64, 470)] {
        let buffers = operator_graph(0, GraphShape { blocks, ops_per_block, activation_bytes: 1 << 28 });
        let s = solve(&buffers, &SolveOptions::default()).expect("solvable");
        eprintln!("operator_graph {} buffers: peak/lb {:.5}", buffers.len(), s.peak as f64 / s.lower_bound as f64);
        group.bench_with_input(BenchmarkId::from_parameter(buffers.len()), &buffers, |b, buffers| {
            b.iter(|| solve(black_box(buffers), &SolveOptions::default()).expect("solvable"))
        });
    }
    group.finish();
}

/// The 20k-buffer pipelined graph of BENCHMARKS.md's issue-19 section (seed 0), default options:
/// the large-neighbourhood search spends the default node budget on it (about 100 rounds).
fn pipelined_graphs(c: &mut Criterion) {
    let mut group = c.benchmark_group("pipelined_graph");
    group.sample_size(10);
    let graph = GraphShape { blocks: 4, ops_per_block: 100, activation_bytes: 1 << 28 };
    let buffers = pipelined_graph(0, PipelineShape { graph, micro_batches: 16, stagger: 10 });
    let s = solve(&buffers, &SolveOptions::default()).expect("solvable");
    eprintln!("pipelined_graph {} buffers: peak/lb {:.5}", buffers.len(), s.peak as f64 / s.lower_bound as f64);
    group.bench_with_input(BenchmarkId::from_parameter(buffers.len()), &buffers, |b, buffers| {
        b.iter(|| solve(black_box(buffers), &SolveOptions::default()).expect("solvable"))
    });
    group.finish();
}

criterion_group!(benches, known_optimum_300, known_optimum_500, training_steps, operator_graphs, pipelined_graphs);
criterion_main!(benches);
