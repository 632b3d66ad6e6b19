//! Tests of the whole placement pipeline. Every solution goes through the independent checker.

use alloc::vec::Vec;

use super::*;
use crate::check::check_placement;
use crate::generate::{known_optimum, known_optimum_offsets, training_step, SplitMix64, StepShape};
use crate::lifetime::lower_bound;

/// The buffers of an `id,lower,upper,size` CSV (`#` comments, one header line): the test data's
/// form. (The trace parsers of every form are `memo-plan-core`'s `trace` module.)
pub(crate) struct CsvTrace {
    pub(crate) buffers: Vec<BufferLifetime>,
}

pub(crate) fn parse_trace(bytes: &[u8]) -> Result<CsvTrace, core::str::Utf8Error> {
    let text = core::str::from_utf8(bytes)?;
    let rows = text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).skip(1);
    let buffers = rows
        .map(|row| {
            let f: Vec<u64> = row.split(',').map(|v| v.trim().parse().unwrap()).collect();
            BufferLifetime { id: f[0], lower: f[1] as u32, upper: f[2] as u32, size: f[3] }
        })
        .collect();
    Ok(CsvTrace { buffers })
}

fn buf(lower: u32, upper: u32, size: u64) -> BufferLifetime {
    BufferLifetime { id: 0, lower, upper, size }
}

/// Solves and checks: the checker accepts, the peak is at least the lower bound, and a second
/// solve gives the identical solution.
fn solve_checked(buffers: &[BufferLifetime], options: &SolveOptions) -> Result<Solution, SolveError> {
    let result = solve(buffers, options);
    if let Ok(solution) = &result {
        if let Err(violations) =
            check_placement(buffers, &solution.offsets, options.alignment, solution.peak, options.capacity)
        {
            panic!("checker rejected the solution: {violations:?}");
        }
        assert!(solution.peak >= solution.lower_bound);
        assert_eq!(solution.lower_bound, lower_bound(buffers, options.alignment));
        if solution.peak == solution.lower_bound {
            assert!(solution.optimal);
        }
    }
    assert_eq!(result, solve(buffers, options), "not deterministic");
    result
}

/// The optimum by brute force: every compacted placement is "each buffer at the lowest offset that
/// fits among those placed before it" for some order of the buffers.
fn brute_force_optimum(buffers: &[BufferLifetime]) -> u64 {
    fn permute(order: &mut Vec<usize>, k: usize, buffers: &[BufferLifetime], best: &mut u64) {
        if k == order.len() {
            let mut placed: Vec<(usize, u64)> = Vec::new();
            let mut peak = 0;
            for &i in order.iter() {
                let mut taken: Vec<(u64, u64)> = placed
                    .iter()
                    .filter(|&&(j, _)| buffers[j].overlaps_in_time(&buffers[i]))
                    .map(|&(j, offset)| (offset, offset + buffers[j].size))
                    .collect();
                taken.sort_unstable();
                let mut offset = 0;
                for (start, end) in taken {
                    if start >= offset + buffers[i].size {
                        break;
                    }
                    offset = offset.max(end);
                }
                placed.push((i, offset));
                peak = peak.max(offset + buffers[i].size);
            }
            *best = (*best).min(peak);
            return;
        }
        for i in k..order.len() {
            order.swap(k, i);
            permute(order, k + 1, buffers, best);
            order.swap(k, i);
        }
    }
    let mut best = u64::MAX;
    permute(&mut (0..buffers.len()).collect(), 0, buffers, &mut best);
    if buffers.is_empty() {
        0
    } else {
        best
    }
}

fn random_buffers(rng: &mut SplitMix64, count: usize, horizon: u64, max_size: u64) -> Vec<BufferLifetime> {
    (0..count)
        .map(|id| {
            let lower = rng.below(horizon) as u32;
            let upper = lower + 1 + rng.below(horizon / 2 + 1) as u32;
            BufferLifetime { id: id as u64, lower, upper, size: rng.between(1, max_size) }
        })
        .collect()
}

#[test]
fn memo_example_forward_and_backward_reach_their_lower_bounds() {
    let trace = parse_trace(include_bytes!("testdata/memo-layer.csv")).unwrap();
    // MEMO plans one layer's forward requests (0-11) and backward requests (12-23) separately;
    // the skeletal tensors 15 and 16 cross the two and live in the rounding buffers instead.
    let forward: Vec<BufferLifetime> = trace.buffers.iter().copied().filter(|b| b.upper <= 12).collect();
    let backward: Vec<BufferLifetime> = trace.buffers.iter().copied().filter(|b| b.lower >= 12).collect();
    let ids = |set: &[BufferLifetime]| set.iter().map(|b| b.id).collect::<Vec<_>>();
    assert_eq!(ids(&forward), [13, 14, 17, 18, 19]);
    assert_eq!(ids(&backward), [20, 21, 22, 23, 24]);
    let options = SolveOptions::default();
    let forward = solve_checked(&forward, &options).unwrap();
    let backward = solve_checked(&backward, &options).unwrap();
    assert_eq!((forward.peak, forward.lower_bound, forward.optimal), (512_000_000, 512_000_000, true));
    assert_eq!((backward.peak, backward.lower_bound, backward.optimal), (1_920_000_000, 1_920_000_000, true));
    // The whole layer in one placement also reaches its lower bound.
    let whole = solve_checked(&trace.buffers, &options).unwrap();
    assert!(whole.optimal);
    assert_eq!(whole.peak, whole.lower_bound);
}

#[test]
fn matches_brute_force_on_small_random_instances() {
    let mut rng = SplitMix64::new(1);
    for case in 0..300 {
        let count = 1 + (case % 7);
        let buffers = random_buffers(&mut rng, count, 12, 20);
        let solution = solve_checked(&buffers, &SolveOptions::default()).unwrap();
        let optimum = brute_force_optimum(&buffers);
        assert_eq!(solution.peak, optimum, "case {case}: {buffers:?}");
        assert!(solution.optimal, "case {case}: optimum reached but not proven: {buffers:?}");
    }
}

/// Every search mix is exact: on the same small random instances, each reaches the brute-force
/// optimum and proves it.
#[test]
fn every_search_mix_matches_brute_force() {
    for mix in [SearchMix::Restarts, SearchMix::Bounds] {
        let mut rng = SplitMix64::new(2);
        for case in 0..150 {
            let buffers = random_buffers(&mut rng, 1 + case % 7, 12, 20);
            let solution = solve_checked(&buffers, &SolveOptions { mix, ..SolveOptions::default() }).unwrap();
            assert_eq!(solution.peak, brute_force_optimum(&buffers), "{mix:?}, case {case}: {buffers:?}");
            assert!(solution.optimal, "{mix:?}, case {case}: optimum reached but not proven: {buffers:?}");
        }
    }
}

/// Hard-set instances, small: a guillotine, a pinwheel and a holed tiling, and random buffers; at
/// the tiling's height where there is one.
fn portfolio_cases() -> Vec<(Vec<BufferLifetime>, Option<u64>)> {
    use crate::generate::{non_guillotine, with_holes};
    let mut rng = SplitMix64::new(41);
    let mut cases = Vec::new();
    for seed in 0..3 {
        cases.push((known_optimum(seed, 80, 160, 1 << 20), None));
        cases.push((non_guillotine(seed, 90, 180, 1 << 20), Some(1 << 20)));
        cases.push((with_holes(seed, 120, 3, 240, 1 << 20), Some(1 << 20)));
        cases.push((random_buffers(&mut rng, 60, 40, 1000), None));
    }
    cases
}

/// The portfolio (`solve_portfolio`) is never worse than any of its mixes alone with the same
/// node budget: a checked placement with a peak at most each one's, proven optimal where one of
/// them proves it, and a "not found" only where each alone finds nothing either; its nodes are
/// at most theirs together.
#[cfg(feature = "std")]
#[test]
fn the_portfolio_is_no_worse_than_each_mix_alone() {
    let mixes = SearchMix::portfolio(2);
    for (case, (buffers, capacity)) in portfolio_cases().into_iter().enumerate() {
        let options = SolveOptions { capacity, budget_nodes: 30_000, ..SolveOptions::default() };
        let alone: Vec<_> =
            mixes.iter().map(|&mix| solve_checked(&buffers, &SolveOptions { mix, ..options })).collect();
        let together = solve_portfolio(&buffers, &options, mixes, &mut |_| false);
        let spent: u64 = alone
            .iter()
            .map(|result| match result {
                Ok(solution) => solution.stats.nodes,
                Err(SolveError::NotFoundWithinBudget { nodes, .. }) => *nodes,
                Err(e) => panic!("case {case}: {e}"),
            })
            .sum();
        match together {
            Ok(solution) => {
                check_placement(&buffers, &solution.offsets, 1, solution.peak, capacity)
                    .unwrap_or_else(|e| panic!("case {case}: {e:?}"));
                for single in alone.iter().flatten() {
                    assert!(solution.peak <= single.peak, "case {case}: {} above {}", solution.peak, single.peak);
                    assert!(solution.optimal || !single.optimal, "case {case}: a mix alone proved it");
                }
                assert!(solution.stats.nodes <= spent, "case {case}: {} nodes, {spent} alone", solution.stats.nodes);
            }
            Err(SolveError::NotFoundWithinBudget { best_peak, .. }) => {
                assert!(alone.iter().all(Result::is_err), "case {case}: a mix alone placed it");
                assert!(best_peak > capacity.unwrap_or(0), "case {case}");
            }
            Err(e) => panic!("case {case}: {e}"),
        }
    }
}

/// The portfolio proves what one mix proves (infeasibility above the lower bound), and its stop
/// callback sees the workers' progress together: nodes that only grow, the best peak found, and a
/// stop ends every worker with a checked placement.
#[cfg(feature = "std")]
#[test]
fn the_portfolio_proves_infeasibility_and_stops_as_one_solve() {
    let mixes = SearchMix::portfolio(2);
    let shape = [(1, 3, 3), (2, 4, 5), (2, 3, 1), (7, 8, 5), (3, 6, 2), (3, 5, 2), (6, 7, 4), (7, 8, 2), (4, 6, 1)];
    let small: Vec<BufferLifetime> = shape.iter().map(|&(lower, upper, size)| buf(lower, upper, size)).collect();
    let more = [(5, 7, 5), (0, 2, 3)].map(|(lower, upper, size)| buf(lower, upper, size));
    let buffers: Vec<BufferLifetime> = small.into_iter().chain(more).collect();
    let options = SolveOptions { capacity: Some(9), ..SolveOptions::default() };
    assert_eq!(
        solve_portfolio(&buffers, &options, mixes, &mut |_| false),
        Err(SolveError::ProvenInfeasible { capacity: 9, lower_bound: 10 })
    );

    // Random lifetimes and sizes, far from any perfect packing: no mix settles it within 300,000
    // nodes (2.5% above the lower bound then).
    let mut rng = SplitMix64::new(3);
    let buffers: Vec<BufferLifetime> = (0..400)
        .map(|id| {
            let lower = rng.below(1000) as u32;
            BufferLifetime { id, lower, upper: lower + 1 + rng.below(200) as u32, size: (1 + rng.below(1000)) * 1024 }
        })
        .collect();
    let options = SolveOptions { budget_nodes: u64::MAX, ..SolveOptions::default() };
    let mut seen: Vec<Progress> = Vec::new();
    let solution = solve_portfolio(&buffers, &options, mixes, &mut |progress| {
        seen.push(*progress);
        progress.nodes >= 200_000
    })
    .unwrap();
    check_placement(&buffers, &solution.offsets, 1, solution.peak, None).unwrap();
    assert!(seen.windows(2).all(|w| w[0].nodes <= w[1].nodes), "nodes of all the workers only grow");
    let last = seen.last().copied().unwrap_or_default();
    assert!(last.peak >= solution.peak, "{last:?}, peak {}", solution.peak);
    assert!(!solution.optimal, "settled: pick an instance that is not");
    assert!(solution.stats.stopped && last.nodes >= 200_000, "{last:?}");
}

/// Solves `known_optimum(seed, N, 4N steps, 2^20)` (the instances of BENCHMARKS.md) for seeds 0-9
/// at each size and asserts the optimum, through the checker.
fn assert_known_optimum_reached(counts: &[usize]) {
    let cases: Vec<(u64, usize)> = counts.iter().flat_map(|&count| (0..10).map(move |seed| (seed, count))).collect();
    assert_known_optimum_reached_on(&cases);
}

/// Solves `known_optimum(seed, N, 4N steps, 2^20)` for each `(seed, N)` and asserts the optimum.
fn assert_known_optimum_reached_on(cases: &[(u64, usize)]) {
    for &(seed, count) in cases {
        let height = 1 << 20;
        let buffers = known_optimum(seed, count, 4 * count as u32, height);
        // Solved once (determinism is tested on the other instances), through the checker.
        let solution = solve(&buffers, &SolveOptions::default()).unwrap();
        check_placement(&buffers, &solution.offsets, 1, solution.peak, None).unwrap();
        assert_eq!(solution.lower_bound, height);
        assert_eq!(solution.peak, height, "seed {seed}, {count} buffers: stats {:?}", solution.stats);
        assert!(solution.optimal);
    }
}

/// Every known-optimum instance of 100-300 buffers (seeds 0-9) is solved to its optimum within the
/// default budget.
#[test]
fn reaches_the_known_optimum_of_generated_instances() {
    assert_known_optimum_reached(&[100, 200, 300]);
}

/// Every known-optimum instance of 400 and 500 buffers (seeds 0-9) is solved to its optimum within
/// the default budget (a test of its own, so the two run in parallel).
#[test]
fn reaches_the_known_optimum_of_larger_generated_instances() {
    assert_known_optimum_reached(&[400, 500]);
}

/// Two hold-out instances of 500 buffers that kept their greedy placement (seed 39: 1.21814 of
/// the optimum, seed 42: 1.01947). Seed 42: a cut through stacks of 17-34 buffers of one
/// lifetime needs amounts from the middle of their subset sums, which the sweep never offered
/// (only the smallest sums) or offered unchecked (the true height's subset then could not be
/// realised, and the height was dropped). Seed 39: with nothing left to make up, a sweep offered
/// "none" twice per group, doubling its work for every later group, and the budget ran out
/// before the splits were found.
#[test]
fn reaches_the_known_optimum_of_500_buffer_seeds_39_and_42() {
    assert_known_optimum_reached_on(&[(39, 500), (42, 500)]);
}

/// The generator's own placement is valid at peak `height`: the optimum it claims is witnessed.
#[test]
fn known_optimum_instances_come_with_a_placement_at_the_optimum() {
    for count in [5, 100, 500] {
        for seed in 0..10 {
            let height = 1 << 20;
            let buffers = known_optimum(seed, count, 4 * count as u32, height);
            let offsets = known_optimum_offsets(seed, count, 4 * count as u32, height);
            assert_eq!(offsets.len(), buffers.len());
            check_placement(&buffers, &offsets, 1, height, None).unwrap();
            assert_eq!(buffers.iter().zip(&offsets).map(|(b, &o)| o + b.size).max(), Some(height));
        }
    }
}

/// Small known-optimum instances: every one is solved to its optimum.
#[test]
fn reaches_the_known_optimum_of_every_small_instance() {
    for count in [5, 10, 20, 30, 40] {
        for seed in 0..40 {
            let buffers = known_optimum(seed, count, 3 * count as u32, 1000);
            let solution = solve_checked(&buffers, &SolveOptions::default()).unwrap();
            assert_eq!(solution.peak, 1000, "seed {seed}, {count} buffers");
        }
    }
}

#[test]
fn never_worse_than_the_start_order_greedy_and_checked_on_random_instances() {
    let mut rng = SplitMix64::new(2);
    for case in 0..200 {
        let count = 1 + rng.below(80) as usize;
        let alignment = [1, 8, 256][case % 3];
        let buffers = random_buffers(&mut rng, count, 60, 5000);
        let options = SolveOptions { alignment, budget_nodes: 20_000, ..SolveOptions::default() };
        let solution = solve_checked(&buffers, &options).unwrap();
        let items: Vec<Item> =
            buffers.iter().map(|b| Item { lower: b.lower, upper: b.upper, size: b.size.div_ceil(alignment) }).collect();
        let all: Vec<u32> = (0..items.len() as u32).collect();
        let greedy = greedy::by_start(&items, &all);
        assert!(solution.peak <= greedy.peak * alignment, "case {case}");
        assert!(solution.peak <= solution.stats.greedy_peak);
    }
}

#[test]
fn capacity_mode_reports_infeasible_and_not_found_honestly() {
    let buffers = known_optimum(9, 60, 60, 1000);
    // Below the lower bound: proven infeasible at once.
    let e = solve_checked(&buffers, &SolveOptions { capacity: Some(999), ..SolveOptions::default() }).unwrap_err();
    assert_eq!(e, SolveError::ProvenInfeasible { capacity: 999, lower_bound: 1000 });
    // At the optimum: found.
    let s = solve_checked(&buffers, &SolveOptions { capacity: Some(1000), ..SolveOptions::default() }).unwrap();
    assert!(s.peak <= 1000);
    // With no search budget, only the greedy answer is there: found or honestly not found.
    let no_budget = SolveOptions { capacity: Some(1000), budget_nodes: 0, ..SolveOptions::default() };
    match solve_checked(&buffers, &no_budget) {
        Ok(s) => assert_eq!(s.peak, 1000),
        Err(SolveError::NotFoundWithinBudget { capacity, best_peak, lower_bound, nodes }) => {
            assert_eq!((capacity, lower_bound, nodes), (1000, 1000, 0));
            assert!(best_peak > 1000);
        }
        Err(other) => panic!("unexpected {other:?}"),
    }
}

/// An instance whose optimum (10) is above its lower bound (9): at capacity 9 only the exact
/// search can prove infeasibility (the lower bound allows it), and it must, not merely give up.
/// (Seed 12335 of the MIP cross-check's crowded generator; the MIP agrees on 10.)
#[test]
fn proven_infeasible_above_the_lower_bound() {
    let shape = [
        (1, 3, 3),
        (2, 4, 5),
        (2, 3, 1),
        (7, 8, 5),
        (3, 6, 2),
        (3, 5, 2),
        (6, 7, 4),
        (7, 8, 2),
        (4, 6, 1),
        (5, 7, 5),
        (0, 2, 3),
    ];
    let buffers: Vec<BufferLifetime> = shape.iter().map(|&(lower, upper, size)| buf(lower, upper, size)).collect();
    assert_eq!(lower_bound(&buffers, 1), 9);
    let minimised = solve_checked(&buffers, &SolveOptions::default()).unwrap();
    assert_eq!((minimised.peak, minimised.optimal), (10, true));
    let e = solve_checked(&buffers, &SolveOptions { capacity: Some(9), ..SolveOptions::default() });
    assert_eq!(e, Err(SolveError::ProvenInfeasible { capacity: 9, lower_bound: 10 }));
}

#[test]
fn alignment_rounds_footprints_and_offsets() {
    let buffers = [buf(0, 2, 10), buf(1, 3, 10), buf(2, 4, 1)];
    let s = solve_checked(&buffers, &SolveOptions { alignment: 64, ..SolveOptions::default() }).unwrap();
    assert!(s.offsets.iter().all(|o| o % 64 == 0));
    assert_eq!(s.peak, 128);
}

#[test]
fn invalid_inputs_are_errors_not_panics() {
    assert_eq!(solve(&[buf(3, 3, 1)], &SolveOptions::default()), Err(SolveError::EmptyLifetime { buffer: 0 }));
    assert_eq!(solve(&[buf(0, 1, u64::MAX), buf(0, 1, 1)], &SolveOptions::default()), Err(SolveError::TooLarge));
    assert_eq!(
        solve(&[buf(0, 1, u64::MAX)], &SolveOptions { alignment: 2, ..SolveOptions::default() }),
        Err(SolveError::TooLarge)
    );
    let empty = solve_checked(&[], &SolveOptions::default()).unwrap();
    assert_eq!((empty.peak, empty.optimal), (0, true));
    let zero = solve_checked(&[buf(0, 4, 0), buf(1, 2, 5)], &SolveOptions::default()).unwrap();
    assert_eq!(zero.peak, 5);
}

#[test]
fn training_step_traces_are_placed_near_their_lower_bound() {
    let shape = StepShape { layers: 8, transients_per_layer: 200, skeletal_per_layer: 10, activation_bytes: 1 << 28 };
    let buffers = training_step(3, shape);
    let s = solve_checked(&buffers, &SolveOptions::default()).unwrap();
    // Within 0.5% of the lower bound (the target at scale; BENCHMARKS.md has the large runs).
    assert!(s.peak * 1000 <= s.lower_bound * 1005, "peak {} lower bound {}", s.peak, s.lower_bound);
}

/// A stop callback that never stops changes nothing; one that stops at its first poll still gets
/// a checked placement (the greedy one, or better), marked `stopped`; with a capacity the greedy
/// misses, the stop is reported as "not found within the limit", never as infeasible.
#[test]
fn a_stop_callback_ends_the_solve_with_the_best_so_far() {
    let buffers = known_optimum(3, 300, 1200, 1 << 20);
    let options = SolveOptions::default();
    let plain = solve_checked(&buffers, &options).unwrap();
    let mut polls = 0u32;
    let never = solve_with(&buffers, &options, &mut |_| {
        polls += 1;
        false
    });
    assert_eq!(never.as_ref(), Ok(&plain));
    assert!(!plain.stats.stopped);

    let mut seen = Vec::new();
    let stopped = solve_with(&buffers, &options, &mut |p| {
        seen.push(*p);
        true
    })
    .unwrap();
    check_placement(&buffers, &stopped.offsets, 1, stopped.peak, None).unwrap();
    assert!(stopped.stats.stopped && !stopped.stats.budget_exhausted);
    assert!(stopped.peak <= stopped.stats.greedy_peak);
    assert_eq!(seen.len(), 1, "stopped is sticky: the callback is not asked again");

    let capped = SolveOptions { capacity: Some(1 << 20), ..options };
    let greedy = solve(&buffers, &SolveOptions { budget_nodes: 0, ..options }).unwrap();
    assert!(greedy.peak > 1 << 20, "seed 3's greedy misses the optimum");
    match solve_with(&buffers, &capped, &mut |p| p.nodes > 32) {
        Err(SolveError::NotFoundWithinBudget { capacity, best_peak, .. }) => {
            assert_eq!(capacity, 1 << 20);
            assert!(best_peak > capacity);
        }
        Ok(found) => panic!("found within 32 nodes? peak {}", found.peak),
        Err(other) => panic!("{other}"),
    }
}

/// The progress shown to the callback: nodes never go back, the peak only falls (once there is
/// one) and never below the lower bound, which only rises.
#[test]
fn progress_is_monotone() {
    let buffers = known_optimum(9, 300, 1200, 1 << 20);
    let mut last = Progress::default();
    let solution = solve_with(&buffers, &SolveOptions::default(), &mut |p| {
        assert!(p.nodes >= last.nodes);
        if last.peak > 0 {
            assert!(p.peak <= last.peak && p.peak >= p.lower_bound, "{p:?} after {last:?}");
        }
        assert!(p.lower_bound >= last.lower_bound);
        last = *p;
        false
    })
    .unwrap();
    assert!(last.nodes > 0 && last.nodes <= solution.stats.nodes.max(last.nodes));
}

/// Never worse than any classic greedy order (computed by the independent oracle), on random
/// instances of several shapes, alignments and budgets (0: the greedy portfolio alone).
#[cfg(feature = "fuzzing")]
#[test]
fn never_worse_than_any_classic_greedy_order() {
    use crate::fuzzing::oracle::classic_greedy_peaks;
    let mut rng = SplitMix64::new(19);
    for case in 0..400u64 {
        let count = 2 + (case % 60) as usize;
        let buffers = match case % 4 {
            0 => random_buffers(&mut rng, count, 40, 1000),
            1 => random_buffers(&mut rng, count, 200, 1 << 20),
            2 => known_optimum(case, count, 4 * count as u32, 1 << 10),
            _ => crate::generate::with_holes(case, count, 1 + count / 10, 4 * count as u32, 1 << 10),
        };
        let alignment = [1, 8, 256][(case % 3) as usize];
        let classic = classic_greedy_peaks(&buffers, alignment).unwrap().into_iter().min().unwrap();
        for budget_nodes in [0, 2_000] {
            let options = SolveOptions { alignment, budget_nodes, ..SolveOptions::default() };
            let solution = solve_checked(&buffers, &options).unwrap();
            assert!(solution.peak <= classic, "case {case}, budget {budget_nodes}: {} > {classic}", solution.peak);
        }
    }
}

std::thread_local! {
    /// Set by a test on its own thread: `solve` builds no overlap graph (`pair_limit`), as on a
    /// component too dense for one.
    pub(crate) static GRAPH_FREE: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
}

/// Dense components (no overlap graph: every pair limit 0 here) get the classic orders too, over
/// a tree of lifetimes, after the leaves' improvement, charged a node per buffer: on random
/// instances with long lifetimes a solve with the nodes for them is never worse than any classic
/// order (the independent oracle's); with a node budget of 0 (the sweeps alone) they do not run.
#[cfg(feature = "fuzzing")]
#[test]
fn without_a_graph_never_worse_than_any_classic_order() {
    use crate::fuzzing::oracle::classic_greedy_peaks;
    GRAPH_FREE.with(|g| g.set(true));
    let mut rng = SplitMix64::new(43);
    let mut worse_without_the_orders = 0;
    for case in 0..60u64 {
        let count = 20 + (case % 60) as usize;
        // Long lifetimes over few steps: most pairs overlap.
        let buffers = random_buffers(&mut rng, count, 12 + (case % 5) * 8, 1 << (4 + case % 16));
        let alignment = [1, 8, 256][(case % 3) as usize];
        let classic = classic_greedy_peaks(&buffers, alignment).unwrap().into_iter().min().unwrap();
        let options = SolveOptions { alignment, budget_nodes: u64::MAX, ..SolveOptions::default() };
        let solution = solve_checked(&buffers, &options).unwrap();
        assert!(solution.peak <= classic, "case {case}: {} > {classic}", solution.peak);
        let sweeps = SolveOptions { alignment, budget_nodes: 0, ..SolveOptions::default() };
        let greedy = solve_checked(&buffers, &sweeps).unwrap();
        worse_without_the_orders += usize::from(greedy.peak > classic);
    }
    GRAPH_FREE.with(|g| g.set(false));
    // The orders matter: the sweeps alone are worse than some order on this many cases.
    assert!(worse_without_the_orders >= 5, "{worse_without_the_orders}");
}

/// The classic orders find the same placements with the graph as with the tree of lifetimes.
#[test]
fn classic_orders_place_alike_with_the_graph_and_with_the_tree() {
    let mut rng = SplitMix64::new(47);
    for case in 0..60u64 {
        let buffers = random_buffers(&mut rng, 10 + case as usize * 3, 30, 1000);
        let items = Item::all_of(&buffers);
        let members: Vec<u32> = (0..items.len() as u32).collect();
        let graph = Overlaps::build(&items, &members, usize::MAX).unwrap();
        let mut never = |_: &Progress| false;
        let mut control = control::Control::new(&mut never);
        let with_graph = greedy::best_classic(&items, &members, Some(&graph), &mut { u64::MAX }, &mut control).unwrap();
        let with_tree = greedy::best_classic(&items, &members, None, &mut { u64::MAX }, &mut control).unwrap();
        assert_eq!((with_graph.offsets, with_graph.peak), (with_tree.offsets, with_tree.peak), "case {case}");
    }
}

/// The zero-slack domains (`domains`) and the valley choice (`search::fill_skyline`) only drop
/// placements no perfect packing needs: on small instances made zero slack by fillers, the
/// skyline search with domains reaches the same verdict as without them (and as brute force, up
/// to 8 buffers), placed or proven infeasible.
#[test]
fn zero_slack_domains_keep_the_search_exact() {
    let mut rng = SplitMix64::new(23);
    let mut verdicts = [0; 2]; // placed, infeasible
    let mut pruned = 0;
    for case in 0..200 {
        let mut buffers = random_buffers(&mut rng, 4 + case % 8, 8, 9);
        // Fill every run of steps with the same slack up to the most live bytes with one filler
        // (long fillers make some instances unpackable).
        let capacity = lower_bound(&buffers, 1);
        let horizon = buffers.iter().map(|b| b.upper).max().unwrap_or(0);
        let slack =
            |t: u32| capacity - buffers.iter().filter(|b| b.lower <= t && t < b.upper).map(|b| b.size).sum::<u64>();
        let mut fillers = Vec::new();
        let mut t = 0;
        while t < horizon {
            let mut end = t + 1;
            while end < horizon && slack(end) == slack(t) {
                end += 1;
            }
            if slack(t) > 0 {
                fillers.push(buf(t, end, slack(t)));
            }
            t = end;
        }
        buffers.extend(fillers);
        let items = Item::all_of(&buffers);
        let members: Vec<u32> = (0..items.len() as u32).collect();
        let sections = Sections::new(&items, &members);
        assert!(domains::Domains::of(&items, &members, &sections, capacity).is_some(), "zero slack");
        let rank: Vec<u32> = (0..items.len() as u32).collect();
        let style = search::Style { guided: true, rightmost: false, contention: false, by_section: false };
        let verdict = |mut shared: search::Shared| {
            let (outcome, used) = search_unstopped(&items, &rank, style, &mut shared, capacity);
            let found = match outcome {
                SearchOutcome::Found(placement) => {
                    assert!(placement.peak <= capacity);
                    true
                }
                SearchOutcome::Infeasible => false,
                SearchOutcome::BudgetExhausted => panic!("case {case}: unbounded search stopped"),
            };
            (found, used)
        };
        let (with, with_nodes) = verdict(search::Shared::new(&items, &members, &sections, capacity));
        let (without, without_nodes) = verdict(search::Shared::without_domains(&sections));
        assert_eq!(with, without, "case {case}: {buffers:?}");
        if buffers.len() <= 8 {
            assert_eq!(with, brute_force_optimum(&buffers) == capacity, "case {case}: {buffers:?}");
        }
        verdicts[usize::from(!with)] += 1;
        pruned += usize::from(with_nodes < without_nodes);
    }
    assert!(verdicts[0] > 10 && verdicts[1] > 10, "both verdicts exercised: {verdicts:?}");
    assert!(pruned > 0, "the domains pruned somewhere");
}

/// One exact search of all of `items` at `capacity`, never stopped: its outcome and nodes.
fn search_unstopped(
    items: &[Item],
    rank: &[u32],
    style: search::Style,
    shared: &mut search::Shared,
    capacity: u64,
) -> (SearchOutcome, u64) {
    let members: Vec<u32> = (0..items.len() as u32).collect();
    let sections = Sections::new(items, &members);
    let overlaps = Overlaps::build(items, &members, OVERLAP_PAIR_LIMIT).unwrap();
    let mut never = |_: &Progress| false;
    let mut control = Control::new(&mut never);
    let mut nodes = u64::MAX;
    let component = search::Component { items, members: &members, overlaps: &overlaps, sections: &sections };
    search::search(component, rank, style, shared, capacity, &mut nodes, &mut control)
}

/// However early the stop callback says stop (at its first poll, or at its k-th: inside a greedy
/// sweep, an overlap graph build, a repair start or round), the solve ends with a placement the
/// checker accepts, marked `stopped`; on small instances no worse than the start-order sweep (a
/// component of fewer than 2,048 buffers always completes it), and on large generated graphs (one
/// leaf of 21k buffers, too large for the exact search and too dense for an overlap graph, and an
/// operator graph of 20k) a valid placement even when the stop comes inside that sweep.
#[test]
fn a_stop_at_any_poll_still_gives_a_checked_placement() {
    use crate::generate::{operator_graph, pipelined_graph, GraphShape, PipelineShape};
    let graph = GraphShape { blocks: 4, ops_per_block: 100, activation_bytes: 1 << 28 };
    let instances = [
        known_optimum(3, 300, 1200, 1 << 20),
        random_buffers(&mut SplitMix64::new(8), 60, 100, 1000),
        pipelined_graph(0, PipelineShape { graph, micro_batches: 16, stagger: 10 }),
        operator_graph(1, GraphShape { blocks: 24, ops_per_block: 250, activation_bytes: 1 << 28 }),
    ];
    for (index, buffers) in instances.iter().enumerate() {
        let items = Item::all_of(buffers);
        let all: Vec<u32> = (0..items.len() as u32).collect();
        let sweep = greedy::by_start(&items, &all).peak;
        for stop_at in [1u32, 2, 5, 13, 40] {
            let mut polls = 0u32;
            let solution = solve_with(buffers, &SolveOptions::default(), &mut |_| {
                polls += 1;
                polls >= stop_at
            })
            .unwrap();
            let case = alloc::format!("instance {index} ({} buffers), stop at poll {stop_at}", buffers.len());
            check_placement(buffers, &solution.offsets, 1, solution.peak, None)
                .unwrap_or_else(|v| panic!("{case}: {v:?}"));
            // Stopped inside its first sweep, a component of `GREEDY_POLL_EVERY` buffers or more
            // is stacked (`greedy::first_placement`); a smaller one completes its sweep unpolled.
            if buffers.len() < GREEDY_POLL_EVERY {
                assert!(solution.peak <= sweep, "{case}: {} above the sweep's {sweep}", solution.peak);
            }
            assert!(solution.peak >= solution.lower_bound, "{case}");
            // After the stop, only a first placement asks again (`Control::first_placement`),
            // once: told to stop, it stacks its component.
            if polls >= stop_at {
                let most = stop_at as usize + solution.stats.components as usize;
                assert!(solution.stats.stopped && polls as usize <= most, "{case}: asked {polls} times");
            }
        }
    }
}

/// The exact search at the proven optimum of random instances finds a placement the checker
/// accepts, and one unit below proves infeasibility, with the parts a canonical search splits off
/// ranked afresh by contention (`search::Style::contention`) and without. (The first version of
/// this test found a part split off a canonical search reported placed with a buffer unplaced: at
/// zero slack, sections with nothing left to place but under a gap were not taken for walls.)
#[test]
fn split_off_parts_keep_the_search_exact() {
    let mut rng = SplitMix64::new(31);
    for case in 0..300 {
        let buffers = if case < 150 {
            random_buffers(&mut rng, 6 + case % 10, 30, 40)
        } else {
            random_buffers(&mut rng, 12 + case % 16, 40, 40)
        };
        let optimum = solve_checked(&buffers, &SolveOptions::default()).unwrap();
        assert!(optimum.optimal, "case {case}");
        let items = Item::all_of(&buffers);
        let members: Vec<u32> = (0..items.len() as u32).collect();
        let sections = Sections::new(&items, &members);
        let rank = search_ranks(&items, &members, &sections).swap_remove(0);
        let search_at = |capacity: u64, contention: bool, by_section: bool| {
            let style = search::Style { guided: false, rightmost: false, contention, by_section };
            let mut shared = search::Shared::new(&items, &members, &sections, capacity);
            search_unstopped(&items, &rank, style, &mut shared, capacity).0
        };
        for (contention, by_section) in [(false, false), (true, false), (false, true)] {
            let case = alloc::format!("case {case}, contention {contention}, by section {by_section}");
            match search_at(optimum.peak, contention, by_section) {
                SearchOutcome::Found(placement) => {
                    assert!(placement.peak <= optimum.peak, "{case}");
                    check_placement(&buffers, &placement.offsets, 1, placement.peak, None)
                        .unwrap_or_else(|v| panic!("{case}: {v:?}"));
                }
                _ => panic!("{case}: no placement at the optimum {}", optimum.peak),
            }
            let below = search_at(optimum.peak - 1, contention, by_section);
            assert!(matches!(below, SearchOutcome::Infeasible), "{case}: not proven below the optimum");
        }
    }
}

/// A perfect packing with a few pieces deleted has few fillers per buffer, so its filled instance
/// is near perfect and its flat splits run once with all the budget: holes 500 seed 5 is then
/// placed within two million nodes (1,026,878; 1,020,391 with the `Nested` fillers first, 461,364
/// before the splits tried pinwheels), where the round-by-round allowance had not placed it
/// (`NEAR_PERFECT_BUFFERS_PER_FILLER`). With a fifth of the pieces deleted, the filled instances
/// are not near perfect.
#[test]
fn near_perfect_filled_instances_split_with_all_the_budget() {
    let height = 1 << 20;
    let buffers = crate::generate::with_holes(5, 500, 10, 2000, height);
    let options =
        SolveOptions { capacity: Some(height), alignment: 1, budget_nodes: 2_000_000, ..SolveOptions::default() };
    let solution = solve(&buffers, &options).expect("placed within the budget");
    check_placement(&buffers, &solution.offsets, 1, solution.peak, Some(height)).unwrap();
    assert_eq!(solution.peak, height);

    let near_perfect = |buffers: &[BufferLifetime], capacity: u64| -> Vec<bool> {
        let items = Item::all_of(buffers);
        let members: Vec<u32> = (0..items.len() as u32).collect();
        let sections = Sections::new(&items, &members);
        [fillers::Shape::Nested, fillers::Shape::Runs]
            .into_iter()
            .filter_map(|shape| Filled::new(&items, &members, &sections, capacity, shape, (0, SearchMix::default())))
            .map(|filled| filled.near_perfect)
            .collect()
    };
    assert_eq!(near_perfect(&buffers, height), [true, true]);
    let holed = crate::generate::with_holes(5, 300, 60, 1200, height);
    let holed_filled = near_perfect(&holed, height);
    assert!(!holed_filled.is_empty() && holed_filled.iter().all(|&near| !near), "{holed_filled:?}");
}

/// Adds one filler per step of `buffers` whose live total is below `capacity`, so every step is
/// full (zero slack) and the fillers are free to move.
fn fill_every_step(buffers: &mut Vec<BufferLifetime>, capacity: u64) {
    let horizon = buffers.iter().map(|b| b.upper).max().unwrap_or(0);
    for t in 0..horizon {
        let live: u64 = buffers.iter().filter(|b| b.lower <= t && t < b.upper).map(|b| b.size).sum();
        if live < capacity {
            buffers.push(buf(t, t + 1, capacity - live));
        }
    }
}

/// Tightening (`domains::Domains::tighten`) only drops offsets no zero-slack placement uses: on
/// small random instances made zero slack by one filler per step, tightened until nothing is left
/// to tile, the search reaches the same verdict as without domains, and an instance refuted by a
/// section no tiling fills is never one the plain search places (about a third are refuted).
#[test]
fn tightened_domains_keep_the_search_exact() {
    let mut rng = SplitMix64::new(29);
    let (mut refuted, mut tiled) = (0, 0);
    for case in 0..300 {
        let mut buffers = random_buffers(&mut rng, 6 + case % 10, 10, 12);
        let capacity = lower_bound(&buffers, 1);
        fill_every_step(&mut buffers, capacity);
        let items = Item::all_of(&buffers);
        let members: Vec<u32> = (0..items.len() as u32).collect();
        let sections = Sections::new(&items, &members);
        // The same tightening twice: once to look at, once inside the search's shared state.
        let mut domains = domains::Domains::of(&items, &members, &sections, capacity);
        tiled +=
            usize::from(domains.as_mut().is_some_and(|d| d.tighten(&items, &members, 1 << 24, &mut |_| false) > 0));
        let tiling_refuted = domains.as_ref().is_some_and(domains::Domains::refuted);
        let mut shared = search::Shared::new(&items, &members, &sections, capacity);
        shared.tighten(&items, &members, 1 << 24, &mut |_| false);
        let rank: Vec<u32> = (0..items.len() as u32).collect();
        let style = search::Style { guided: true, rightmost: false, contention: false, by_section: false };
        let found = |shared: &mut search::Shared| match search_unstopped(&items, &rank, style, shared, capacity).0 {
            SearchOutcome::Found(placement) => {
                assert!(placement.peak <= capacity);
                true
            }
            SearchOutcome::Infeasible => false,
            SearchOutcome::BudgetExhausted => panic!("case {case}: unbounded search stopped"),
        };
        let tightened = found(&mut shared);
        let plain = found(&mut search::Shared::without_domains(&sections));
        assert_eq!(tightened, plain, "case {case}: {buffers:?}");
        assert!(!(tiling_refuted && plain), "case {case}: refuted, yet placed: {buffers:?}");
        refuted += usize::from(tiling_refuted);
    }
    // Deterministic (fixed seed): 106 and 108 of the 300 when written.
    assert!(tiled >= 100 && refuted >= 100, "tilings ran on {tiled} instances, refuted {refuted}");
}

/// The generators' own placements pass tightened domains: every buffer's offset in the tiling a
/// perfect packing was cut from stays in its domain, with sizes down to a single byte.
#[test]
fn tightening_keeps_the_offsets_of_a_known_placement() {
    for seed in 0..12u64 {
        let (count, height) = (40 + 10 * seed as usize, [64, 1 << 10, 1 << 20][seed as usize % 3]);
        let buffers = crate::generate::non_guillotine(seed, count, 2 * count as u32, height);
        let offsets = crate::generate::non_guillotine_offsets(seed, count, 2 * count as u32, height);
        let items = Item::all_of(&buffers);
        let members: Vec<u32> = (0..items.len() as u32).collect();
        let sections = Sections::new(&items, &members);
        let Some(mut domains) = domains::Domains::of(&items, &members, &sections, height) else { continue };
        domains.tighten(&items, &members, 1 << 24, &mut |_| false);
        assert!(!domains.refuted(), "seed {seed}: a packable instance refuted");
        for (l, &offset) in offsets.iter().enumerate() {
            assert!(domains.allows(l, offset), "seed {seed}: buffer {l} lost its offset {offset}");
        }
    }
}

/// A module of pinwheel 500 seed 4 that no placement packs at its height (the live total of
/// every step): one of its sections has no tiling with offsets from the domains, so the solve
/// ends with the proof within 200,000 nodes (116,920, of which the flat and pinwheel splits tried
/// first take most; the skyline search alone took 47 M nodes, 30 s, without one), and does not
/// go on lowering the peak above the capacity.
#[test]
fn an_unpackable_module_is_refuted_by_its_tilings() {
    let trace = parse_trace(include_bytes!("testdata/pinwheel_500_4_unpackable_module.csv")).unwrap();
    let capacity = 635_594;
    assert_eq!(lower_bound(&trace.buffers, 1), capacity);
    let options =
        SolveOptions { capacity: Some(capacity), alignment: 1, budget_nodes: 200_000, ..SolveOptions::default() };
    let mut nodes = 0;
    let result = solve_with(&trace.buffers, &options, &mut |p: &Progress| {
        nodes = p.nodes;
        false
    });
    assert_eq!(result, Err(SolveError::ProvenInfeasible { capacity, lower_bound: capacity + 1 }));
    assert!(nodes < 200_000, "{nodes} nodes");
}

/// Runs the bounds search (ties by `tiebreak`) on all of `items` with at most `nodes` nodes, with
/// the zero-slack domains of `shared` if it has some.
fn bounds_search(
    items: &[Item],
    shared: &search::Shared,
    capacity: u64,
    nodes: u64,
    tiebreak: bounds::Tiebreak,
) -> (SearchOutcome, u64) {
    let members: Vec<u32> = (0..items.len() as u32).collect();
    let sections = Sections::new(items, &members);
    let mut never = |_: &Progress| false;
    let mut control = Control::new(&mut never);
    let mut nodes_left = nodes;
    let mut searches = bounds::Bounds::new((items, &members, &sections), capacity, &[tiebreak]);
    let search = searches.first_mut().expect("sections of few buffers");
    search.run(shared.domains(), &mut nodes_left, &mut control)
}

/// A small random instance for the bounds search and its lower bound, made zero slack by fillers
/// in the even cases.
fn bounds_case(rng: &mut SplitMix64, case: usize) -> (Vec<BufferLifetime>, u64) {
    let mut buffers = random_buffers(rng, 6 + case % 10, 10, 12);
    let capacity = lower_bound(&buffers, 1);
    if case.is_multiple_of(2) {
        fill_every_step(&mut buffers, capacity);
    }
    (buffers, capacity)
}

/// The tie-break orders of the bounds search.
const TIEBREAKS: [bounds::Tiebreak; 3] =
    [bounds::Tiebreak::Larger, bounds::Tiebreak::Tighter, bounds::Tiebreak::LargerArea];

/// The bounds search (`bounds`) is exact: on small random instances at their lower bound, some
/// with slack and some made zero slack by one filler per step (with domains), it reaches the
/// skyline or canonical search's verdict, and every placement it finds passes the checker.
#[test]
fn the_bounds_search_agrees_with_the_exact_search() {
    let mut rng = SplitMix64::new(31);
    let (mut placed, mut refuted) = (0, 0);
    for case in 0..300 {
        let (buffers, capacity) = bounds_case(&mut rng, case);
        let items = Item::all_of(&buffers);
        let members: Vec<u32> = (0..items.len() as u32).collect();
        let sections = Sections::new(&items, &members);
        let rank: Vec<u32> = (0..items.len() as u32).collect();
        let style = search::Style { guided: true, rightmost: false, contention: false, by_section: false };
        let exact =
            match search_unstopped(&items, &rank, style, &mut search::Shared::without_domains(&sections), capacity).0 {
                SearchOutcome::Found(_) => true,
                SearchOutcome::Infeasible => false,
                SearchOutcome::BudgetExhausted => panic!("case {case}: unbounded search stopped"),
            };
        let shared = search::Shared::new(&items, &members, &sections, capacity);
        for tiebreak in TIEBREAKS {
            let bounds = match bounds_search(&items, &shared, capacity, u64::MAX, tiebreak).0 {
                SearchOutcome::Found(placement) => {
                    check_placement(&buffers, &placement.offsets, 1, placement.peak, Some(capacity))
                        .unwrap_or_else(|e| panic!("case {case}, {tiebreak:?}: {e:?}"));
                    true
                }
                SearchOutcome::Infeasible => false,
                SearchOutcome::BudgetExhausted => panic!("case {case}: unbounded bounds search stopped"),
            };
            assert_eq!(bounds, exact, "case {case}, {tiebreak:?}: {buffers:?}");
            placed += usize::from(bounds);
            refuted += usize::from(!bounds);
        }
    }
    // Deterministic (fixed seed): 711 placed and 189 refuted (three orders) when written.
    assert!(placed >= 600 && refuted >= 150, "placed {placed}, refuted {refuted}");
}

/// The bounds search resumed run after run with a small budget each (as the restart rounds run
/// it) goes the same way as one run: the same verdict, the same placement, no more nodes.
#[test]
fn the_bounds_search_resumed_ends_as_one_run_does() {
    let mut rng = SplitMix64::new(37);
    for case in 0..60 {
        let (buffers, capacity) = bounds_case(&mut rng, case);
        let items = Item::all_of(&buffers);
        let members: Vec<u32> = (0..items.len() as u32).collect();
        let sections = Sections::new(&items, &members);
        let shared = search::Shared::new(&items, &members, &sections, capacity);
        let tiebreak = TIEBREAKS[(case / 2) % TIEBREAKS.len()]; // each order with and without slack
        let (whole, whole_nodes) = bounds_search(&items, &shared, capacity, u64::MAX, tiebreak);
        let mut search = bounds::Bounds::new((&items, &members, &sections), capacity, &[tiebreak]).remove(0);
        let mut never = |_: &Progress| false;
        let mut control = Control::new(&mut never);
        let (mut runs, mut nodes) = (0, 0);
        let resumed = loop {
            let mut nodes_left = 3;
            let (outcome, used) = search.run(shared.domains(), &mut nodes_left, &mut control);
            runs += 1;
            nodes += used;
            if !matches!(outcome, SearchOutcome::BudgetExhausted) {
                break outcome;
            }
            assert!(runs < 1_000_000, "case {case}: no end");
        };
        match (whole, resumed) {
            (SearchOutcome::Found(a), SearchOutcome::Found(b)) => assert_eq!(a.offsets, b.offsets, "case {case}"),
            (SearchOutcome::Infeasible, SearchOutcome::Infeasible) => {}
            (a, b) => {
                let found = |o: &SearchOutcome| matches!(o, SearchOutcome::Found(_));
                panic!("case {case}: found in one run {}, resumed {}", found(&a), found(&b))
            }
        }
        assert!(nodes <= whole_nodes, "case {case}: {nodes} nodes resumed, {whole_nodes} in one run");
        assert!(runs > 1 || whole_nodes <= 3, "case {case}: settled in one run of {whole_nodes} nodes");
    }
}

/// Pinwheel 300 seed 6's hardest window module (test data: 187 buffers, every step full at
/// 535,815 bytes): the skyline search does not place it within 300,000 nodes (nor, in every restart
/// style, within 10 s: BENCHMARKS.md); the bounds search does, within 500,000.
#[test]
fn the_bounds_search_places_a_core_the_skyline_search_does_not() {
    let trace = parse_trace(include_bytes!("testdata/pinwheel_300_6_core.csv")).unwrap();
    let capacity = 535_815;
    assert_eq!(lower_bound(&trace.buffers, 1), capacity);
    let items = Item::all_of(&trace.buffers);
    let members: Vec<u32> = (0..items.len() as u32).collect();
    let sections = Sections::new(&items, &members);
    let mut shared = search::Shared::new(&items, &members, &sections, capacity);
    match bounds_search(&items, &shared, capacity, 500_000, bounds::Tiebreak::Larger) {
        (SearchOutcome::Found(placement), _) => {
            check_placement(&trace.buffers, &placement.offsets, 1, placement.peak, Some(capacity)).unwrap();
        }
        (_, nodes) => panic!("not placed within {nodes} nodes"),
    }
    let overlaps = Overlaps::build(&items, &members, OVERLAP_PAIR_LIMIT).unwrap();
    let rank: Vec<u32> = (0..items.len() as u32).collect();
    let mut never = |_: &Progress| false;
    let mut control = Control::new(&mut never);
    let mut nodes = 300_000;
    let style = search::Style::of_restart(0);
    let (skyline, _) = search::search(
        search::Component { items: &items, members: &members, overlaps: &overlaps, sections: &sections },
        &rank,
        style,
        &mut shared,
        capacity,
        &mut nodes,
        &mut control,
    );
    assert!(matches!(skyline, SearchOutcome::BudgetExhausted));
}
