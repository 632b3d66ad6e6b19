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

use alloc::vec::Vec;

use super::control::Control;
use super::greedy::{sweep_from, ComponentPlacement};
use super::Item;
use crate::generate::SplitMix64;

/// The most rounds for one component (each costs one node per buffer of the node budget, and
/// polls the stop callback).
pub const REPAIR_MOST_ROUNDS: u32 = 4096;

/// Lowers `placement`'s peak towards `goal`, spending nodes from `nodes_left` (one per buffer
/// per round) and polling `control` between rounds. Returns the nodes spent. The placement only
/// ever changes for a valid one with a lower peak.
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
        let candidate = sweep_from(items, members, &mut rng, &current.offsets, from, start);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arena::greedy::by_start;
    use crate::generate::{pipelined_graph, GraphShape, PipelineShape};

    #[test]
    fn lowers_the_sweep_peak_of_a_pipelined_graph_and_stays_valid() {
        let graph = GraphShape { blocks: 2, ops_per_block: 40, activation_bytes: 1 << 28 };
        let buffers = pipelined_graph(0, PipelineShape { graph, micro_batches: 6, stagger: 6 });
        let items: Vec<Item> = buffers.iter().map(|b| Item { lower: b.lower, upper: b.upper, size: b.size }).collect();
        let members: Vec<u32> = (0..items.len() as u32).collect();
        let mut placement = by_start(&items, &members);
        let before = placement.peak;
        let mut never = |_: &crate::arena::Progress| false;
        let mut control = Control::new(&mut never);
        let mut nodes_left = 64 * items.len() as u64;
        let spent = repair(&items, &members, &mut placement, 0, &mut nodes_left, &mut control);
        assert!(spent <= 64 * items.len() as u64 && nodes_left + spent == 64 * items.len() as u64);
        crate::check::check_placement(&buffers, &placement.offsets, 1, placement.peak, None).unwrap();
        let recomputed = buffers.iter().zip(&placement.offsets).map(|(b, o)| o + b.size).max().unwrap();
        assert_eq!(placement.peak, recomputed);
        assert!(placement.peak < before, "{} buffers: {} not below {before}", items.len(), placement.peak);
    }
}
