//! Window modules: a way to place a component by placing smaller instances, one inside another.
//!
//! Take a proper range of the component's sections and the buffers living only inside it. If their
//! live total is the same `height` in every section of the range, the component can be placed in
//! two steps that never need each other's addresses: the module alone at capacity `height`, then
//! the rest with the module standing in as one buffer of size `height` over the range; the
//! module's buffers go to the stand-in's offset plus their own. Each part is solved by the whole
//! pipeline, modules included, with a node allowance, and only where the rest keeps at most
//! `MODULE_REST_MOST_PERCENT` of the buffers. Not complete: `place` only reports placements, and a
//! part not placed concludes nothing about the component.

use alloc::vec::Vec;

use super::control::{Control, Progress};
use super::greedy::ComponentPlacement;
use super::sections::Sections;
use super::{solve_nested, Item, SearchMix, SolveError, SolveOptions};
use crate::lifetime::BufferLifetime;
use crate::tuning::*;

/// A range of sections `[first, end)` and the buffers living inside it, `height` in each section.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Module {
    pub first: usize,
    pub end: usize,
    pub height: u64,
    pub inside: Vec<u32>,
}

/// The modules of a component: every proper range of at least two sections whose inside buffers
/// (two at least) have one live total in each; the most buffers first, over sections not covered.
pub(crate) fn find(items: &[Item], members: &[u32], sections: &Sections) -> Vec<Module> {
    let count = sections.len();
    if !(3..=MODULE_MOST_SECTIONS).contains(&count) {
        return Vec::new();
    }
    let ranges: Vec<core::ops::Range<usize>> = members.iter().map(|&m| sections.range_of(&items[m as usize])).collect();
    // Buffers by the section their range ends before, so a scan adds each once it fits.
    let mut ending: Vec<Vec<u32>> = alloc::vec![Vec::new(); count + 1];
    for (local, range) in ranges.iter().enumerate() {
        ending[range.end].push(local as u32);
    }
    // For each first section, the ranges grow one section at a time; `step[k]` is section k's
    // total minus section k - 1's, so the totals are all equal exactly when no step is non-zero.
    let mut candidates: Vec<(usize, usize, usize, u64)> = Vec::new(); // (buffers, first, end, height)
    let mut step = alloc::vec![0i128; count + 1];
    for first in 0..count {
        let (mut uneven, mut inside, mut last_total) = (0usize, 0usize, 0u64);
        for end in first + 1..=count {
            // Section `end - 1` joins, empty: its step is minus the total before it.
            if end - 1 > first {
                step[end - 1] = -i128::from(last_total);
                uneven += usize::from(last_total != 0);
            }
            last_total = 0;
            for &local in &ending[end] {
                let range = &ranges[local as usize];
                if range.start < first {
                    continue;
                }
                let size = items[members[local as usize] as usize].size;
                last_total += size;
                inside += 1;
                if range.start > first {
                    let before = step[range.start] != 0;
                    step[range.start] += i128::from(size);
                    let after = step[range.start] != 0;
                    uneven = uneven + usize::from(after) - usize::from(before);
                }
            }
            let proper = end - first >= 2 && end - first < count;
            if proper && uneven == 0 && inside >= 2 && last_total > 0 {
                candidates.push((inside, first, end, last_total));
            }
        }
    }
    candidates.sort_unstable_by_key(|&(inside, first, end, _)| (core::cmp::Reverse(inside), first, end));
    let mut taken: Vec<Module> = Vec::new();
    for (_, first, end, height) in candidates {
        if taken.iter().all(|m| end <= m.first || first >= m.end) {
            let inside = (0..members.len() as u32)
                .filter(|&l| ranges[l as usize].start >= first && ranges[l as usize].end <= end)
                .collect();
            taken.push(Module { first, end, height, inside });
        }
    }
    taken
}

/// The modules of one component at one capacity, kept across its restart rounds: a module placed
/// stays placed, so a later try spends its larger allowance on the parts still unplaced.
pub(crate) struct Modules {
    /// The component's modules, found at the first try.
    found: Option<Vec<Module>>,
    /// Each module's placement, offsets by position in its `inside`, once placed.
    placed: Vec<Option<Vec<u64>>>,
    /// No try can place the component (no good modules, a part infeasible, or the depth limit).
    never: bool,
    /// How many modules deep the component is; its parts are one deeper.
    depth: u32,
    /// The solve's search mix, which its parts' solves keep.
    mix: SearchMix,
}

impl Modules {
    /// No try yet, `depth` modules deep with search mix `mix`; `may_place` false: every try fails.
    pub(crate) fn new(may_place: bool, depth: u32, mix: SearchMix) -> Modules {
        let never = !may_place || depth >= MODULE_DEPTH_LIMIT;
        Modules { found: None, placed: Vec::new(), never, depth, mix }
    }

    /// Places the component `members` under `capacity` through its modules, each part solved one
    /// level deeper within `*nodes_left` nodes (ticked on `control`, and returned). `None` when a
    /// part is not placed within the allowance or never will be.
    pub(crate) fn place(
        &mut self,
        items: &[Item],
        members: &[u32],
        sections: &Sections,
        capacity: u64,
        nodes_left: &mut u64,
        control: &mut Control,
    ) -> (Option<ComponentPlacement>, u64) {
        if self.never {
            return (None, 0);
        }
        let modules = self.found.get_or_insert_with(|| find(items, members, sections));
        let inside: usize = modules.iter().map(|m| m.inside.len()).sum();
        let rest = members.len() - inside + modules.len();
        if modules.is_empty() || rest * 100 > members.len() * MODULE_REST_MOST_PERCENT {
            self.never = true;
            return (None, 0);
        }
        self.placed.resize(modules.len(), None);
        let mut spent = 0u64;
        for (module, placed) in modules.iter().zip(&mut self.placed).filter(|(_, placed)| placed.is_none()) {
            let buffers: Vec<BufferLifetime> =
                module.inside.iter().map(|&l| lifetime(&items[members[l as usize] as usize], u64::from(l))).collect();
            let (part, used) = solve_part(&buffers, module.height, nodes_left, control, (self.depth, self.mix));
            spent += used;
            match part {
                Part::Placed(offsets) => *placed = Some(offsets),
                Part::NotWithinAllowance => return (None, spent),
                Part::Never => {
                    self.never = true;
                    return (None, spent);
                }
            }
        }
        // The rest: the buffers outside every module, then one stand-in per module.
        let mut outside = alloc::vec![true; members.len()];
        for module in modules.iter() {
            for &l in &module.inside {
                outside[l as usize] = false;
            }
        }
        let rest_members: Vec<u32> = (0..members.len() as u32).filter(|&l| outside[l as usize]).collect();
        let mut rest: Vec<BufferLifetime> =
            rest_members.iter().map(|&l| lifetime(&items[members[l as usize] as usize], u64::from(l))).collect();
        for (index, module) in modules.iter().enumerate() {
            let (lower, upper) = sections.steps(module.first, module.end - module.first);
            rest.push(BufferLifetime { id: (members.len() + index) as u64, lower, upper, size: module.height });
        }
        let (part, used) = solve_part(&rest, capacity, nodes_left, control, (self.depth, self.mix));
        spent += used;
        let rest_offsets = match part {
            Part::Placed(offsets) => offsets,
            Part::NotWithinAllowance => return (None, spent),
            Part::Never => {
                self.never = true;
                return (None, spent);
            }
        };
        let mut offsets = alloc::vec![0u64; members.len()];
        for (&l, &offset) in rest_members.iter().zip(&rest_offsets) {
            offsets[l as usize] = offset;
        }
        let bases = &rest_offsets[rest_members.len()..];
        for ((module, placed), &base) in modules.iter().zip(&self.placed).zip(bases) {
            let placed = placed.as_deref().unwrap_or_default(); // every module was placed above
            for (&l, &offset) in module.inside.iter().zip(placed) {
                offsets[l as usize] = base + offset;
            }
        }
        let peak = members.iter().zip(&offsets).map(|(&m, &o)| o + items[m as usize].size).max().unwrap_or(0);
        (Some(ComponentPlacement { offsets, peak }), spent)
    }
}

/// How the solve of one part ended.
enum Part {
    /// Its offsets, in the order of its buffers.
    Placed(Vec<u64>),
    /// Not placed within the allowance: a larger one may place it.
    NotWithinAllowance,
    /// Proven infeasible at its capacity (or unsolvable): no allowance places it.
    Never,
}

fn lifetime(item: &Item, id: u64) -> BufferLifetime {
    BufferLifetime { id, lower: item.lower, upper: item.upper, size: item.size }
}

/// Solves one part under `capacity` with the whole pipeline, one level deeper, within `*nodes_left`.
fn solve_part(
    buffers: &[BufferLifetime],
    capacity: u64,
    nodes_left: &mut u64,
    control: &mut Control,
    (depth, mix): (u32, SearchMix),
) -> (Part, u64) {
    let options = SolveOptions { capacity: Some(capacity), alignment: 1, budget_nodes: *nodes_left, mix };
    // The part's nodes count on the caller's control as spent, so its callback may stop the part.
    let mut seen = 0u64;
    let mut stop = |progress: &Progress| {
        let fresh = progress.nodes.saturating_sub(seen);
        seen = progress.nodes;
        control.tick(fresh)
    };
    let result = solve_nested(buffers, &options, &mut stop, depth + 1);
    let (outcome, used) = match result {
        Ok(solution) => (Part::Placed(solution.offsets), solution.stats.nodes),
        Err(SolveError::NotFoundWithinBudget { nodes, .. }) => (Part::NotWithinAllowance, nodes),
        Err(_) => (Part::Never, seen),
    };
    let used = used.min(*nodes_left);
    *nodes_left -= used;
    (outcome, used)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::check_placement;
    use crate::generate::non_guillotine;

    /// Steps 0..4, every one 17 units full, in three sections: steps 0..1, 1..3 and 3..4.
    fn two_overlapping_modules() -> [Item; 5] {
        [
            Item { lower: 0, upper: 4, size: 7 },
            Item { lower: 0, upper: 1, size: 10 },
            Item { lower: 1, upper: 3, size: 5 },
            Item { lower: 1, upper: 3, size: 5 },
            Item { lower: 3, upper: 4, size: 10 },
        ]
    }

    #[test]
    fn a_module_is_the_largest_even_range_and_others_keep_clear_of_it() {
        // Inside the first two sections: 10 units in each (the 10 over step 0 and the two 5s over
        // steps 1..3); inside the last two too (the 5s and the 10 over step 3). Both hold three
        // buffers; the first found is taken and the other overlaps it. A single section (the
        // two 5s alone) is never a module, nor are all three (the whole component).
        let items = two_overlapping_modules();
        let members: Vec<u32> = (0..5).collect();
        let sections = Sections::new(&items, &members);
        let modules = find(&items, &members, &sections);
        assert_eq!(modules, alloc::vec![Module { first: 0, end: 2, height: 10, inside: alloc::vec![1, 2, 3] }]);
        // Uneven inside every range: no module.
        let uneven = [Item { lower: 0, upper: 2, size: 3 }, Item { lower: 1, upper: 3, size: 4 }];
        let sections = Sections::new(&uneven, &[0, 1]);
        assert!(find(&uneven, &[0, 1], &sections).is_empty());
    }

    #[test]
    fn a_perfect_packing_is_placed_through_its_modules_and_checked() {
        // Every packing whose modules pass the rule on the rest is placed through them within the
        // allowance (the search is deterministic), and the checker accepts each placement.
        let height = 1 << 16;
        let mut placed = 0;
        for seed in 0..16 {
            let buffers = non_guillotine(seed, 60, 240, height);
            let items = Item::all_of(&buffers);
            let members: Vec<u32> = (0..items.len() as u32).collect();
            let sections = Sections::new(&items, &members);
            assert!(sections.totals.iter().all(|&t| t == height), "the generator's packings are perfect");
            let found = find(&items, &members, &sections);
            let rest = members.len() - found.iter().map(|m| m.inside.len()).sum::<usize>() + found.len();
            let tried = !found.is_empty() && rest * 100 <= members.len() * MODULE_REST_MOST_PERCENT;
            let mut nodes_left = 2_000_000;
            let mut stop = |_: &Progress| false;
            let mut control = Control::new(&mut stop);
            let mut modules = Modules::new(true, 0, SearchMix::default());
            let (placement, used) = modules.place(&items, &members, &sections, height, &mut nodes_left, &mut control);
            assert_eq!(used + nodes_left, 2_000_000, "the nodes spent are the nodes taken from the allowance");
            assert_eq!(placement.is_some(), tried, "seed {seed}: {} modules, rest of {rest}", found.len());
            if let Some(placement) = placement {
                check_placement(&buffers, &placement.offsets, 1, placement.peak, Some(height))
                    .unwrap_or_else(|v| panic!("seed {seed}: the checker rejects the modules' placement: {v:?}"));
                placed += 1;
            }
        }
        assert_eq!(placed, 5, "the packings with modules that pass the rule, seeds 0-15");
    }

    #[test]
    fn modules_that_leave_most_buffers_outside_are_not_tried() {
        // Five buffers, one module of three (see the first test): the rest would hold three of the
        // five (the two outside and the stand-in), over `MODULE_REST_MOST_PERCENT`.
        let items = two_overlapping_modules();
        let members: Vec<u32> = (0..5).collect();
        let sections = Sections::new(&items, &members);
        assert_eq!(find(&items, &members, &sections).len(), 1);
        let mut nodes_left = 1_000;
        let mut stop = |_: &Progress| false;
        let mut control = Control::new(&mut stop);
        let mut modules = Modules::new(true, 0, SearchMix::default());
        let (placement, used) = modules.place(&items, &members, &sections, 17, &mut nodes_left, &mut control);
        assert!(placement.is_none() && modules.never);
        assert_eq!((used, nodes_left), (0, 1_000));
    }

    #[test]
    fn the_nesting_stops_at_its_depth_limit() {
        let buffers = non_guillotine(1, 40, 160, 1 << 12);
        let items = Item::all_of(&buffers);
        let members: Vec<u32> = (0..items.len() as u32).collect();
        let sections = Sections::new(&items, &members);
        let mut nodes_left = 1_000;
        let mut stop = |_: &Progress| false;
        let mut control = Control::new(&mut stop);
        let mut modules = Modules::new(true, MODULE_DEPTH_LIMIT, SearchMix::default());
        let (placement, used) = modules.place(&items, &members, &sections, 1 << 12, &mut nodes_left, &mut control);
        assert!(placement.is_none() && modules.never);
        assert_eq!((used, nodes_left), (0, 1_000));
    }
}
