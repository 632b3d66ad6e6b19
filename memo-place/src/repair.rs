//! The improvement search of components too large for the exact search (up to 100k buffers and
//! beyond, where even the overlap graph may be too large to build): a large-neighbourhood search
//! over the start-order sweep.
//!
//! The peak is first reached when some buffer `p` starts; what put `p` there are the choices made
//! for the buffers alive then. Each round keeps the current placement of every buffer starting
//! before a step `from` (the start of a buffer alive when `p` starts, drawn at random: windows of
//! every length up to the oldest such buffer), and places the rest again with the best-fit sweep,
//! which now and then passes over the tightest gap for the next one (`greedy::sweep_from`). The
//! result replaces the current placement when its (peak, buffers at the peak) is no worse, so the
//! search also walks along plateaus; the best peak seen is kept. Each round is O(n log n) and
//! needs no overlap graph.
//!
//! Before the rounds, *peak-first* starts ([`peak_first`]): the sweep fills the step of most live
//! bytes with whatever holes its earlier choices left, so instead the buffers alive there are
//! stacked from 0 without holes (that step then sits exactly at the lower bound), and the sweep
//! runs forward from it for the later buffers and backward (in reversed time) for the earlier
//! ones. Four stack orders; one replaces the placement only if its peak is lower.

use alloc::vec;
use alloc::vec::Vec;

use super::control::Control;
use super::greedy::{sweep_from, ComponentPlacement};
use super::Item;
use crate::rng::SplitMix64;
use crate::tuning::*;

/// Lowers `placement`'s peak towards `goal`, spending nodes from `nodes_left` (one per buffer
/// per round, two per start) and polling `control` between rounds and starts and inside their
/// sweeps (every `GREEDY_POLL_EVERY` buffers: a start or round stopped half-way is dropped).
/// Returns the nodes spent. The placement only ever changes for a valid one with a lower peak.
pub(crate) fn repair(
    items: &[Item],
    members: &[u32],
    placement: &mut ComponentPlacement,
    goal: u64,
    nodes_left: &mut u64,
    control: &mut Control,
) -> u64 {
    let n = members.len();
    let item = |l: usize| &items[members[l] as usize];
    let mut rng = SplitMix64::new(0x0073_7765_6570);
    let cost = n as u64;
    let mut spent = 0;
    let at_peak = |p: &ComponentPlacement| (0..n).filter(|&l| p.offsets[l] + item(l).size == p.peak).count();
    if control.stopped() {
        return 0;
    }
    // Peak-first starts: the buffers alive at a step of most live bytes stacked without holes,
    // the later ones swept forward and the earlier ones backward from there (two sweeps each).
    'starts: for at in most_live_steps(items, members, PEAK_FIRST_STEPS) {
        for stack in [Stack::LongestAfter, Stack::LongestBefore, Stack::LongestEither, Stack::Current] {
            if placement.peak <= goal || *nodes_left < 2 * cost || control.tick(2 * cost) {
                break 'starts;
            }
            *nodes_left -= 2 * cost;
            spent += 2 * cost;
            let Some(candidate) = peak_first(items, members, stack, &placement.offsets, Some(at), control) else {
                break 'starts;
            };
            if candidate.peak < placement.peak {
                *placement = candidate;
            }
        }
    }
    let mut current = placement.clone();
    let mut current_count = at_peak(&current);
    let mut alive: Vec<u32> = Vec::new();
    for _ in 0..REPAIR_MOST_ROUNDS {
        if placement.peak <= goal || *nodes_left < cost || control.tick(cost) {
            break;
        }
        *nodes_left -= cost;
        spent += cost;
        // The first buffer (by start) at the peak, and the buffers alive when it starts.
        let Some(first) =
            (0..n).filter(|&l| current.offsets[l] + item(l).size == current.peak).min_by_key(|&l| (item(l).lower, l))
        else {
            break;
        };
        let start = item(first).lower;
        alive.clear();
        alive.extend((0..n as u32).filter(|&l| item(l as usize).lower <= start && item(l as usize).upper > start));
        let from = item(alive[rng.below(alive.len() as u64) as usize] as usize).lower;
        let Some(candidate) = sweep_from(items, members, &mut rng, &current.offsets, from, start, control) else {
            break;
        };
        let count = at_peak(&candidate);
        if (candidate.peak, count) <= (current.peak, current_count) {
            current = candidate;
            current_count = count;
            if current.peak < placement.peak {
                *placement = current.clone();
            }
        }
    }
    spent
}

/// Up to `count` steps of most live bytes, most first, each at least 64 steps from the others.
fn most_live_steps(items: &[Item], members: &[u32], count: usize) -> Vec<u32> {
    let mut events: Vec<(u32, i128)> = Vec::with_capacity(2 * members.len());
    for &m in members {
        let item = &items[m as usize];
        events.push((item.lower, i128::from(item.size)));
        events.push((item.upper, -i128::from(item.size)));
    }
    events.sort_unstable();
    let mut steps: Vec<(i128, u32)> = Vec::new();
    let mut live = 0i128;
    for (i, &(at, delta)) in events.iter().enumerate() {
        live += delta;
        if events.get(i + 1).is_none_or(|&(next, _)| next != at) {
            steps.push((-live, at));
        }
    }
    steps.sort_unstable();
    let mut chosen: Vec<u32> = Vec::new();
    for &(_, at) in &steps {
        if chosen.len() == count {
            break;
        }
        if chosen.iter().all(|&c| c.abs_diff(at) >= 64) {
            chosen.push(at);
        }
    }
    chosen
}

/// How [`peak_first`] orders the stack at the step of most live bytes, bottom first.
#[derive(Clone, Copy, Debug)]
enum Stack {
    /// Latest end at the bottom: the space freed after the step is on top.
    LongestAfter,
    /// Earliest start at the bottom: the space freed before the step (backwards) is on top.
    LongestBefore,
    /// The longest of the two sides' shorter one at the bottom.
    LongestEither,
    /// The order of the given offsets (the current placement squeezed at the step).
    Current,
}

/// The buffers alive at a step of most live bytes stacked from 0 without holes in `stack`'s
/// order; the buffers starting after the step placed by the forward best-fit sweep, those ending
/// by it by the same sweep in reversed time. The two sides share no step, so the result is valid.
/// `None` if `control` stopped a sweep.
fn peak_first(
    items: &[Item],
    members: &[u32],
    stack: Stack,
    current: &[u64],
    at: Option<u32>,
    control: &mut Control,
) -> Option<ComponentPlacement> {
    let n = members.len();
    let item = |l: usize| items[members[l] as usize];
    // The given step, or the first step of most live bytes.
    let step = match at {
        Some(step) => step,
        None => most_live_steps(items, members, 1).first().copied().unwrap_or(0),
    };
    let end = (0..n).map(|l| item(l).upper).max().unwrap_or(0);
    let mut alive: Vec<usize> = (0..n).filter(|&l| item(l).lower <= step && item(l).upper > step).collect();
    let key = |l: usize| -> (u64, u64) {
        let (before, after) = (u64::from(step - item(l).lower), u64::from(item(l).upper - step));
        match stack {
            Stack::LongestAfter => (u64::MAX - after, 0),
            Stack::LongestBefore => (u64::MAX - before, 0),
            Stack::LongestEither => (u64::MAX - before.min(after), u64::MAX - before.max(after)),
            Stack::Current => (current[l], 0),
        }
    };
    alive.sort_by_key(|&l| (key(l), l));
    let mut offsets = vec![0u64; n];
    let mut top = 0;
    for &l in &alive {
        offsets[l] = top;
        top += item(l).size;
    }
    let mut rng = SplitMix64::new(0);
    // Forward: the buffers ending after the step; those starting by it are the stack.
    let forward: Vec<usize> = (0..n).filter(|&l| item(l).upper > step).collect();
    let forward_members: Vec<u32> = forward.iter().map(|&l| members[l]).collect();
    let kept: Vec<u64> = forward.iter().map(|&l| offsets[l]).collect();
    let ahead = sweep_from(items, &forward_members, &mut rng, &kept, step + 1, 0, control)?;
    // Backward: the buffers starting by the step, in reversed time (steps `end - upper` ..
    // `end - lower`); those ending after it are the stack.
    let backward: Vec<usize> = (0..n).filter(|&l| item(l).lower <= step).collect();
    let mirrored: Vec<Item> = backward
        .iter()
        .map(|&l| Item { lower: end - item(l).upper, upper: end - item(l).lower, size: item(l).size })
        .collect();
    let backward_members: Vec<u32> = (0..backward.len() as u32).collect();
    let kept: Vec<u64> = backward.iter().map(|&l| offsets[l]).collect();
    let behind = sweep_from(&mirrored, &backward_members, &mut rng, &kept, end - step, 0, control)?;
    for (i, &l) in forward.iter().enumerate() {
        offsets[l] = ahead.offsets[i];
    }
    for (i, &l) in backward.iter().enumerate() {
        offsets[l] = behind.offsets[i];
    }
    Some(ComponentPlacement { offsets, peak: ahead.peak.max(behind.peak) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::{pipelined_graph, GraphShape, PipelineShape};
    use crate::greedy::by_start;

    #[test]
    fn lowers_the_sweep_peak_of_a_pipelined_graph_and_stays_valid() {
        let graph = GraphShape { blocks: 2, ops_per_block: 40, activation_bytes: 1 << 28 };
        let buffers = pipelined_graph(0, PipelineShape { graph, micro_batches: 6, stagger: 6 });
        let items = Item::all_of(&buffers);
        let members: Vec<u32> = (0..items.len() as u32).collect();
        let mut placement = by_start(&items, &members);
        let before = placement.peak;
        let mut never = |_: &crate::Progress| false;
        let mut control = Control::new(&mut never);
        // The peak-first starts take 64 nodes per buffer (8 steps x 4 orders x 2 sweeps), the
        // rounds the rest.
        let mut nodes_left = 256 * items.len() as u64;
        let spent = repair(&items, &members, &mut placement, 0, &mut nodes_left, &mut control);
        assert!(spent <= 256 * items.len() as u64 && nodes_left + spent == 256 * items.len() as u64);
        crate::check::check_placement(&buffers, &placement.offsets, 1, placement.peak, None).unwrap();
        let recomputed = buffers.iter().zip(&placement.offsets).map(|(b, o)| o + b.size).max().unwrap();
        assert_eq!(placement.peak, recomputed);
        assert!(placement.peak < before, "{} buffers: {} not below {before}", items.len(), placement.peak);
    }

    #[test]
    fn peak_first_stacks_the_most_live_step_and_stays_valid() {
        let graph = GraphShape { blocks: 2, ops_per_block: 40, activation_bytes: 1 << 28 };
        let buffers = pipelined_graph(1, PipelineShape { graph, micro_batches: 6, stagger: 6 });
        let items = Item::all_of(&buffers);
        let members: Vec<u32> = (0..items.len() as u32).collect();
        let sweep = by_start(&items, &members);
        let lower = crate::lower_bound(&buffers, 1);
        let mut best = u64::MAX;
        let mut never = |_: &crate::Progress| false;
        let mut control = Control::new(&mut never);
        for stack in [Stack::LongestAfter, Stack::LongestBefore, Stack::LongestEither, Stack::Current] {
            let placement = peak_first(&items, &members, stack, &sweep.offsets, None, &mut control).unwrap();
            crate::check::check_placement(&buffers, &placement.offsets, 1, placement.peak, None).unwrap();
            let recomputed = buffers.iter().zip(&placement.offsets).map(|(b, o)| o + b.size).max().unwrap();
            assert_eq!(placement.peak, recomputed, "{stack:?}");
            // The stack has no holes: the buffers alive at the most-live step end at its live bytes.
            let step = crate::lifetime::live_profile(&buffers, 1).peak_step().unwrap();
            let top = buffers
                .iter()
                .zip(&placement.offsets)
                .filter(|(b, _)| b.lower <= step && b.upper > step)
                .map(|(b, o)| o + b.size)
                .max()
                .unwrap();
            assert_eq!(top, lower, "{stack:?}");
            best = best.min(placement.peak);
        }
        assert!(best < sweep.peak, "{} buffers: peak-first {best}, sweep {}", items.len(), sweep.peak);
    }
}
