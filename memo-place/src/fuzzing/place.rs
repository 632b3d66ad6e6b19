//! Harness for [`solve`]: valid instances built from fuzz input, solved, and every answer checked
//! against the independent checker and the [`oracle`]s.
//!
//! What [`check`] asserts, for every instance:
//! - determinism: solving twice gives identical results (offsets, peak, bounds, statistics);
//! - a `Solution` is a valid placement: [`check_placement`] and the pairwise [`naive_check`] both
//!   accept it, with its peak and under the capacity;
//! - bounds: `Solution::lower_bound` is the most footprint bytes alive at once, as its docs say
//!   (recomputed with [`lower_bound`]), and `lower_bound` <= the optimum <= `peak` <=
//!   `stats.greedy_peak` <= the sum of all footprints; `peak == lower_bound` implies `optimal`;
//! - optimality: `optimal` implies `peak` is the optimum (brute force on small instances, the
//!   tiling height on tiled ones) and no worse than any valid placement we have: the oracle's
//!   start-order first-fit, a solve of the buffers in reverse order, the solve without capacity.
//!   A budget that did not run out implies `optimal` (`SolveStats::budget_exhausted` says the
//!   budget ran out "before every component was settled");
//! - never worse than a classic greedy order: `peak` (or, not found, `best_peak`) is at most the
//!   lowest peak of [`classic_greedy_peaks`], and not found implies that one is above the capacity;
//! - capacity: `Ok` implies `peak <= capacity`; `ProvenInfeasible` implies `capacity` is below the
//!   optimum (brute force on small instances; on all, below every placement we know of) and its
//!   `lower_bound` is a true lower bound; `NotFoundWithinBudget` names a `best_peak` above the
//!   capacity and a `lower_bound` at or below it;
//! - the checker itself: one offset of the solution moved, [`check_placement`] and
//!   [`naive_check`] agree on whether the result is still valid.
//!
//! Why the start-order greedy is not compared unconditionally: the solver's portfolio contains a
//! start-order *best-fit*, run per component after peeling, not the oracle's whole-instance
//! *first-fit*; neither dominates the other on every instance, so "solver <= first-fit" is only
//! guaranteed when the solver claims optimality. For example, with a node budget of 0 the five
//! buffers `[2,3) 5 B`, `[2,7) 3 B`, `[6,8) 2 B`, `[7,8) 5 B`, `[6,7) 3 B` get peak 10 from the
//! portfolio and 8 from the oracle's first-fit (8 is optimal; the search finds it with a budget). Unconditionally the solver's peak is bounded by
//! its own greedy peak (the search only replaces the incumbent with lower ones) and by the sum of
//! the footprints (every greedy or search placement puts a buffer at a gap among, or on top of,
//! the buffers already placed, so by induction every end is at most the footprints placed so far).

use alloc::vec::Vec;

use arbitrary::{Arbitrary, Result, Unstructured};

use super::oracle::{classic_greedy_peaks, first_fit_by_start, footprints, naive_check, optimum_brute_force};
use crate::check::check_placement;
use crate::generate::known_optimum;
use crate::lifetime::{lower_bound, BufferLifetime};
use crate::{solve, SearchMix, Solution, SolveError, SolveOptions};

/// The shape of generated instances. One constant, so a reader sees every limit in one place.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// At most this many buffers.
    pub max_buffers: usize,
    /// Lifetimes lie within `0..steps`.
    pub steps: u32,
    /// Sizes are at most this (bytes).
    pub max_size: u64,
    /// The alignments an instance may ask for.
    pub alignments: [u64; 3],
    /// A third of the cases get a small node budget, drawn from `0..=small_budget_max`, so that
    /// budgets run out in every phase of the search.
    pub small_budget_max: u64,
    /// The others get this budget. Lower than [`DEFAULT_BUDGET_NODES`] (2,000,000) for speed:
    /// a hard 40-buffer instance spends the whole budget, at up to 10 us a node in a release
    /// build (more under AddressSanitizer), and `check` solves four times, so 100,000 nodes cost
    /// 42-65 s on one input the fuzzer found (`fuzz/README.md`); 20,000 keep every input to a
    /// few seconds. The search logic is the same at any budget.
    ///
    /// [`DEFAULT_BUDGET_NODES`]: crate::DEFAULT_BUDGET_NODES
    pub large_budget: u64,
    /// Instances with at most this many buffers that occupy bytes get their optimum by brute
    /// force (8! orders at most).
    pub brute_force_max_buffers: usize,
}

/// The limits of the place harness.
pub const OPTIONS: Options = Options {
    max_buffers: 40,
    steps: 64,
    max_size: 1 << 40,
    alignments: [1, 8, 256],
    small_budget_max: 2_000,
    large_budget: 20_000,
    brute_force_max_buffers: 8,
};

/// One fuzz case: a valid instance, the options to solve it with, and a perturbation for the
/// checker cross-check.
#[derive(Clone, Debug)]
pub struct PlaceCase {
    /// The buffers; every lifetime is non-empty and within `0..OPTIONS.steps`.
    pub buffers: Vec<BufferLifetime>,
    /// The optimal peak when the generator knows it (tiled instances).
    pub known_optimum: Option<u64>,
    /// Capacity, alignment, node budget and search mix.
    pub options: SolveOptions,
    /// Which buffer of the solution to move, and where: `(index, offset)` (index modulo the
    /// number of buffers).
    pub moved: (usize, u64),
}

impl<'a> Arbitrary<'a> for PlaceCase {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let alignment = *u.choose(&OPTIONS.alignments)?;
        let (buffers, known_optimum) = if u.ratio(1, 6)? { tiled(u, alignment)? } else { free_form(u)? };
        let budget_nodes =
            if u.ratio(1, 3)? { u.int_in_range(0..=OPTIONS.small_budget_max)? } else { OPTIONS.large_budget };
        let capacity = if u.ratio(1, 2)? { Some(capacity_near(u, &buffers, alignment)?) } else { None };
        let moved = (u.arbitrary()?, moved_offset(u, alignment)?);
        // Drawn last, so inputs written before the mixes read as they did (the default mix).
        let mix = *u.choose(&[SearchMix::Balanced, SearchMix::Restarts, SearchMix::Bounds])?;
        let options = SolveOptions { capacity, alignment, budget_nodes, mix };
        Ok(PlaceCase { buffers, known_optimum, options, moved })
    }
}

/// Buffers with lifetimes anywhere in `0..steps` and sizes of one of four scales (tiny sizes make
/// ties and exact packings; large ones exercise the arithmetic). A few are zero-size: valid input
/// that occupies nothing.
fn free_form(u: &mut Unstructured<'_>) -> Result<(Vec<BufferLifetime>, Option<u64>)> {
    let count = u.int_in_range(1..=OPTIONS.max_buffers)?;
    let scale = *u.choose(&[4, 1_000, 1 << 20, OPTIONS.max_size])?;
    let mut buffers = Vec::with_capacity(count);
    for id in 0..count as u64 {
        let lower = u.int_in_range(0..=OPTIONS.steps - 1)?;
        let upper = u.int_in_range(lower + 1..=OPTIONS.steps)?;
        let size = if u.ratio(1, 32)? { 0 } else { u.int_in_range(1..=scale)? };
        buffers.push(BufferLifetime { id, lower, upper, size });
    }
    Ok((buffers, None))
}

/// A rectangle tiled by guillotine cuts (`generate::known_optimum`): the optimum is its height.
/// Sizes are scaled by a multiple of the alignment so that footprints tile too.
fn tiled(u: &mut Unstructured<'_>, alignment: u64) -> Result<(Vec<BufferLifetime>, Option<u64>)> {
    let seed = u.arbitrary()?;
    let count = u.int_in_range(2..=OPTIONS.max_buffers)?;
    let steps = u.int_in_range(1..=OPTIONS.steps)?;
    let height = u.int_in_range(1..=1_000u64)?;
    // The generator needs steps * height >= count pieces; raise the height if it is short.
    let height = height.max((count as u64).div_ceil(u64::from(steps)));
    // Large units exercise the arithmetic: 1000 * 2^20 * 256 stays below 2^40.
    let unit = alignment * *u.choose(&[1, 3, 1 << 20])?;
    let buffers: Vec<BufferLifetime> = known_optimum(seed, count, steps, height)
        .into_iter()
        .map(|b| BufferLifetime { size: b.size * unit, ..b })
        .collect();
    Ok((buffers, Some(height * unit)))
}

/// A capacity near where the answer changes: around the live-bytes bound, between it and the sum
/// of footprints, or anything at all.
fn capacity_near(u: &mut Unstructured<'_>, buffers: &[BufferLifetime], alignment: u64) -> Result<u64> {
    let bound = lower_bound(buffers, alignment);
    let sum: u64 = buffers.iter().map(|b| b.size.div_ceil(alignment) * alignment).sum();
    Ok(match u.int_in_range(0..=3u8)? {
        0 => bound.saturating_sub(u.int_in_range(0..=2 * alignment)?),
        1 => bound + u.int_in_range(0..=16)? * alignment + u.int_in_range(0..=alignment - 1)?,
        2 => u.int_in_range(bound..=sum.max(bound))?,
        _ => u.arbitrary()?,
    })
}

/// Where to move a buffer for the checker cross-check: small offsets collide with the solution's
/// buffers often; huge ones test the end-overflow check.
fn moved_offset(u: &mut Unstructured<'_>, alignment: u64) -> Result<u64> {
    Ok(match u.int_in_range(0..=3u8)? {
        0 => u.int_in_range(0..=64)? * alignment,
        1 => u.int_in_range(0..=1 << 12)?,
        2 => u64::MAX - u.int_in_range(0..=1 << 12)?,
        _ => u.arbitrary()?,
    })
}

/// Solves the case's instance and checks every invariant listed in the module docs; panics on
/// the first that fails.
pub fn check(case: PlaceCase) {
    let PlaceCase { buffers, known_optimum, options, moved } = case;
    let alignment = options.alignment.max(1);
    let footprint = footprints(&buffers, alignment).expect("generated footprints fit in a u64");
    let footprint_sum: u64 = footprint.iter().sum();
    let live = lower_bound(&buffers, alignment);
    let occupying = footprint.iter().filter(|&&f| f > 0).count();
    let optimum = known_optimum.or_else(|| {
        (occupying <= OPTIONS.brute_force_max_buffers).then(|| optimum_brute_force(&buffers, alignment)).flatten()
    });
    let (first_fit_offsets, first_fit_peak) = first_fit_by_start(&buffers, alignment).expect("footprints fit");
    assert!(naive_check(&buffers, &first_fit_offsets, alignment).valid, "the oracle's greedy is invalid");
    if let Some(optimum) = optimum {
        assert!(
            live <= optimum && optimum <= first_fit_peak,
            "oracle bounds: live {live}, optimum {optimum}, first-fit {first_fit_peak}"
        );
    }

    let result = solve(&buffers, &options);
    assert_eq!(result, solve(&buffers, &options), "two solves of the same input differ");
    let classic = classic_greedy_peaks(&buffers, alignment).expect("footprints fit").into_iter().min().unwrap_or(0);
    match &result {
        Ok(solution) => assert!(solution.peak <= classic, "peak {} above a classic greedy's {classic}", solution.peak),
        Err(SolveError::NotFoundWithinBudget { best_peak, capacity, .. }) => {
            assert!(*best_peak <= classic && classic > *capacity, "not found, best {best_peak}, classic {classic}")
        }
        Err(_) => {}
    }

    // Valid placements we know of, and whether each claims to be optimal: an infeasibility proof
    // must lie below all of them, and an optimal one must be the lowest of them.
    let mut known: Vec<(u64, bool)> = alloc::vec![(first_fit_peak, false)];
    if options.capacity.is_some() {
        let uncapped = solve(&buffers, &SolveOptions { capacity: None, ..options });
        let uncapped = uncapped.unwrap_or_else(|e| panic!("solve without capacity failed: {e}"));
        check_solution(&buffers, &uncapped, alignment, None, live, footprint_sum, optimum);
        known.push((uncapped.peak, uncapped.optimal));
    } else {
        let reversed: Vec<BufferLifetime> = buffers.iter().rev().copied().collect();
        let solution = solve(&reversed, &options).unwrap_or_else(|e| panic!("solve of the reversed input failed: {e}"));
        check_solution(&reversed, &solution, alignment, None, live, footprint_sum, optimum);
        known.push((solution.peak, solution.optimal));
    }
    if let Ok(solution) = &result {
        known.push((solution.peak, solution.optimal));
    }
    let best_known = known.iter().map(|&(peak, _)| peak).min().unwrap_or(u64::MAX);
    for &(peak, optimal) in &known {
        assert!(
            !optimal || peak == best_known,
            "claimed optimal peak {peak}, but a placement with peak {best_known} exists"
        );
    }

    match result {
        Ok(solution) => {
            check_solution(&buffers, &solution, alignment, options.capacity, live, footprint_sum, optimum);
            if let Some(capacity) = options.capacity {
                assert!(solution.peak <= capacity, "peak {} above the capacity {capacity}", solution.peak);
            }
            check_the_checker(&buffers, &solution, alignment, moved);
        }
        Err(SolveError::ProvenInfeasible { capacity, lower_bound }) => {
            assert_eq!(Some(capacity), options.capacity, "ProvenInfeasible without that capacity");
            assert!(
                lower_bound > capacity,
                "ProvenInfeasible with a bound {lower_bound} not above the capacity {capacity}"
            );
            assert!(
                capacity < best_known,
                "ProvenInfeasible at capacity {capacity}, but a placement with peak {best_known} exists"
            );
            if let Some(optimum) = optimum {
                assert!(lower_bound <= optimum, "ProvenInfeasible bound {lower_bound} above the optimum {optimum}");
            }
        }
        Err(SolveError::NotFoundWithinBudget { capacity, best_peak, lower_bound, nodes }) => {
            assert_eq!(Some(capacity), options.capacity, "NotFoundWithinBudget without that capacity");
            assert!(
                best_peak > capacity && lower_bound <= capacity,
                "NotFoundWithinBudget: best {best_peak}, bound {lower_bound}, capacity {capacity}"
            );
            assert!(
                lower_bound >= live && nodes <= options.budget_nodes,
                "NotFoundWithinBudget: bound {lower_bound}, nodes {nodes}"
            );
            if let Some(optimum) = optimum {
                assert!(
                    lower_bound <= optimum && optimum <= best_peak,
                    "NotFoundWithinBudget: bound {lower_bound}, optimum {optimum}, best {best_peak}"
                );
            }
        }
        Err(e) => panic!("valid input rejected: {e}"),
    }
}

/// The checks every `Solution` of an instance must pass (see the module docs).
fn check_solution(
    buffers: &[BufferLifetime],
    solution: &Solution,
    alignment: u64,
    capacity: Option<u64>,
    live: u64,
    footprint_sum: u64,
    optimum: Option<u64>,
) {
    let Solution { offsets, peak, lower_bound, optimal, stats } = solution;
    let (peak, lower_bound, optimal) = (*peak, *lower_bound, *optimal);
    if let Err(violations) = check_placement(buffers, offsets, alignment, peak, capacity) {
        panic!("the checker rejects the solution: {violations:?}");
    }
    let naive = naive_check(buffers, offsets, alignment);
    assert!(naive.valid && naive.peak == peak, "pairwise check: {naive:?}, claimed peak {peak}");
    assert!(live == lower_bound && lower_bound <= peak, "bounds: live {live}, solver bound {lower_bound}, peak {peak}");
    assert!(
        peak <= stats.greedy_peak && stats.greedy_peak <= footprint_sum,
        "peak {peak}, greedy {}, sum {footprint_sum}",
        stats.greedy_peak
    );
    assert!(optimal || peak != lower_bound, "peak {peak} equals the lower bound but is not marked optimal");
    assert!(
        optimal || stats.budget_exhausted,
        "budget left ({} nodes used) yet not optimal: peak {peak}, bound {lower_bound}",
        stats.nodes
    );
    if let Some(optimum) = optimum {
        assert!(
            lower_bound <= optimum && optimum <= peak,
            "solver bound {lower_bound}, optimum {optimum}, peak {peak}"
        );
        assert!(!optimal || peak == optimum, "claimed optimal peak {peak}, optimum {optimum}");
    }
}

/// Moves one buffer of a valid solution and asks the checker and the pairwise check whether the
/// result is valid: they must agree (and agree on the peak when it is).
fn check_the_checker(buffers: &[BufferLifetime], solution: &Solution, alignment: u64, moved: (usize, u64)) {
    if buffers.is_empty() {
        return;
    }
    let mut offsets = solution.offsets.clone();
    offsets[moved.0 % buffers.len()] = moved.1;
    let naive = naive_check(buffers, &offsets, alignment);
    let checker = check_placement(buffers, &offsets, alignment, naive.peak, None);
    assert_eq!(checker.is_ok(), naive.valid, "checker says {checker:?}, pairwise check says {naive:?}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smoke() {
        super::super::smoke(0x706c_6163_6500, 1_000, 600, check);
    }

    #[test]
    fn the_committed_corpus_passes() {
        super::super::run_corpus(std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")), "place", check);
    }
}
