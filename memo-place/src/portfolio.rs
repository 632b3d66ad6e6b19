//! Several search mixes side by side, one thread each (`std` only): each mix ([`SearchMix`]) places
//! some instances in a fraction of the time the other takes, so running them together takes about
//! the time of the faster. Every worker is an ordinary [`solve_with`] with the whole node budget; a
//! final answer stops the others, else the best placement wins. The caller's stop callback sees the
//! progress of all of them together.

use core::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::vec::Vec;

use super::{solve_with, Progress, SearchMix, Solution, SolveError, SolveOptions};
use crate::lifetime::BufferLifetime;
use crate::tuning::*;

/// What the workers share, behind a lock: their progress and the caller's callback.
struct Shared<'s> {
    progress: Vec<Progress>,
    stop: &'s mut (dyn FnMut(&Progress) -> bool + Send),
}

/// [`solve_with`] under each of `mixes` at once, one thread each (`options.mix` is not used), each
/// with the whole budget: a proof (optimal or infeasible) as soon as one worker has it, else the
/// lowest peak (ties to the earlier mix), else [`SolveError::NotFoundWithinBudget`]; `stats.nodes`
/// counts every worker's. `stop` is polled by one worker at a time, at one in
/// `POLLS_PER_SHARED_POLL` of its polls, with their progress together; a stop ends them all. With
/// one mix this is [`solve_with`] on the caller's thread, deterministic; with more, the placement
/// (not a proven peak or verdict) may differ between runs.
pub fn solve_portfolio(
    buffers: &[BufferLifetime],
    options: &SolveOptions,
    mixes: &[SearchMix],
    stop: &mut (dyn FnMut(&Progress) -> bool + Send),
) -> Result<Solution, SolveError> {
    let (first_mix, other_mixes) = match mixes.split_first() {
        Some((&first, others)) if !others.is_empty() => (first, others),
        single => {
            let mix = single.map_or_else(SearchMix::default, |(&mix, _)| mix);
            return solve_with(buffers, &SolveOptions { mix, ..*options }, stop);
        }
    };
    let shared = Mutex::new(Shared { progress: alloc::vec![Progress::default(); mixes.len()], stop });
    // `settled`: a worker's answer is final; `stopped`: the caller's callback said stop.
    let (shared, settled, stopped) = (&shared, &AtomicBool::new(false), &AtomicBool::new(false));
    // One worker: a solve under `mix` whose polls go through `shared`.
    let worker = move |index: usize, mix: SearchMix| {
        let mut polls = 0u32;
        let result = solve_with(buffers, &SolveOptions { mix, ..*options }, &mut |progress: &Progress| {
            if settled.load(Ordering::Relaxed) {
                return true;
            }
            if !progress.first_placement {
                if stopped.load(Ordering::Relaxed) {
                    return true;
                }
                polls = polls.wrapping_add(1);
                if !polls.is_multiple_of(POLLS_PER_SHARED_POLL) {
                    return false;
                }
            }
            let mut shared = shared.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            shared.progress[index] = *progress;
            let together = together(&shared.progress, progress.first_placement);
            let stop = (shared.stop)(&together);
            if stop {
                stopped.store(true, Ordering::Relaxed);
            }
            stop
        });
        if settles(&result) {
            settled.store(true, Ordering::Relaxed);
        }
        result
    };
    std::thread::scope(|scope| {
        let others: Vec<_> =
            (1..).zip(other_mixes).map(|(index, &mix)| scope.spawn(move || worker(index, mix))).collect();
        // The first mix on the caller's thread.
        let first = worker(0, first_mix);
        let rest =
            others.into_iter().map(|other| other.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)));
        best_of(first, rest)
    })
}

/// The workers' progress as one: every node, the lowest peak (0: none), the highest bound.
fn together(progress: &[Progress], first_placement: bool) -> Progress {
    Progress {
        nodes: progress.iter().fold(0u64, |sum, p| sum.saturating_add(p.nodes)),
        peak: progress.iter().map(|p| p.peak).filter(|&peak| peak > 0).min().unwrap_or(0),
        lower_bound: progress.iter().map(|p| p.lower_bound).max().unwrap_or(0),
        first_placement,
    }
}

/// Whether a worker's answer is final: a proven optimum, or an error no search changes.
fn settles(result: &Result<Solution, SolveError>) -> bool {
    match result {
        Ok(solution) => solution.optimal,
        Err(SolveError::NotFoundWithinBudget { .. }) => false,
        Err(_) => true,
    }
}

/// The answer of the workers' results (`first`, then `rest`, in mix order).
fn best_of(
    first: Result<Solution, SolveError>,
    rest: impl Iterator<Item = Result<Solution, SolveError>>,
) -> Result<Solution, SolveError> {
    let Some(spent) = nodes_spent(&first) else { return first };
    let (mut nodes, mut answer) = (spent, first);
    for result in rest {
        let Some(spent) = nodes_spent(&result) else { return result };
        nodes = nodes.saturating_add(spent);
        answer = match (answer, result) {
            // Ties to a proof, then to the earlier mix.
            (Ok(best), Ok(solution)) => {
                Ok(if (solution.peak, !solution.optimal) < (best.peak, !best.optimal) { solution } else { best })
            }
            (Ok(best), Err(_)) | (Err(_), Ok(best)) => Ok(best),
            (Err(earlier), Err(later)) => Err(lowest_not_found(earlier, later)),
        };
    }
    match answer {
        Ok(mut solution) => {
            solution.stats.nodes = nodes;
            Ok(solution)
        }
        Err(SolveError::NotFoundWithinBudget { capacity, best_peak, lower_bound, .. }) => {
            Err(SolveError::NotFoundWithinBudget { capacity, best_peak, lower_bound, nodes })
        }
        Err(error) => Err(error),
    }
}

/// The nodes a worker's result spent; `None` for an error that is the answer whatever the others.
fn nodes_spent(result: &Result<Solution, SolveError>) -> Option<u64> {
    match result {
        Ok(solution) => Some(solution.stats.nodes),
        Err(SolveError::NotFoundWithinBudget { nodes, .. }) => Some(*nodes),
        Err(_) => None,
    }
}

/// Of two "not found" answers, the one with the lower best peak (the higher lower bound kept).
fn lowest_not_found(earlier: SolveError, later: SolveError) -> SolveError {
    match (earlier, later) {
        (
            SolveError::NotFoundWithinBudget { capacity, best_peak: a, lower_bound: la, nodes },
            SolveError::NotFoundWithinBudget { best_peak: b, lower_bound: lb, .. },
        ) => SolveError::NotFoundWithinBudget { capacity, best_peak: a.min(b), lower_bound: la.max(lb), nodes },
        (earlier, _) => earlier,
    }
}
