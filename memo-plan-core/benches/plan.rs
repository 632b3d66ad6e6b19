//! Planning benchmarks: the paper's setting (7B, 1M tokens, 8 A800 with 2 TiB host, t = 8), each
//! strategy and all four together, end to end (α, schedule, both placement levels, timeline).
//! The plan checker is not included (it is benchmarked with the checker's own figures).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use memo_plan_core::model::{Hardware, ModelConfig, Parallelism};
use memo_plan_core::plan::Strategy;
use memo_plan_core::planner::{plan, plan_all, PlanRequest};
use std::hint::black_box;

fn paper_setting(strategy: Strategy) -> PlanRequest {
    let model = ModelConfig::preset("7b", 1 << 20, 1).expect("preset");
    PlanRequest::new(model, Parallelism::new(8, 1), Hardware::preset("a800x8").expect("preset"), strategy)
}

fn plan_7b_1m(c: &mut Criterion) {
    let mut group = c.benchmark_group("plan_7b_1m_a800x8_t8");
    group.sample_size(20);
    for strategy in Strategy::ALL {
        let request = paper_setting(strategy);
        let report = plan(&request).expect("plans");
        eprintln!(
            "{}: {} buffers, {} instructions, arena {} bytes, fits {}",
            strategy.name(),
            report.plan.buffers.len(),
            report.plan.instructions.len(),
            report.plan.totals.arena_bytes,
            report.fits()
        );
        group.bench_with_input(BenchmarkId::new("strategy", strategy.name()), &request, |b, request| {
            b.iter(|| plan(black_box(request)).expect("plans"))
        });
    }
    let request = paper_setting(Strategy::Memo);
    group.bench_function("all_four", |b| b.iter(|| plan_all(black_box(&request)).expect("plans")));
    group.finish();
}

criterion_group!(benches, plan_7b_1m);
criterion_main!(benches);
