//! Reductions that keep optimality: temporal components (groups that never share a step are placed
//! independently) and peeling (a buffer alive with *every* other of its component can sit at its
//! bottom: in any placement the others lie wholly above or below it). Applied until nothing
//! changes, they leave "leaf" components, each with a base offset (the bytes peeled under it).

use alloc::vec::Vec;

use super::Item;

/// A component left after the reductions: its items sit at `base` units and above.
#[derive(Clone, Debug)]
pub(crate) struct Leaf {
    pub base: u64,
    pub items: Vec<u32>,
}

/// The result of the reductions: fixed offsets for peeled (and lone) items, and the leaves.
pub(crate) struct Decomposition {
    /// `(item, offset)` in units for every item placed by the reductions alone.
    pub fixed: Vec<(u32, u64)>,
    pub leaves: Vec<Leaf>,
}

/// Applies temporal decomposition and peeling to all items, iteratively (no deep recursion).
pub(crate) fn decompose(items: &[Item]) -> Decomposition {
    let mut fixed = Vec::new();
    let mut leaves = Vec::new();
    let mut work: Vec<(u64, Vec<u32>)> = Vec::new();
    work.push((0, (0..items.len() as u32).collect()));
    while let Some((base, mut subset)) = work.pop() {
        subset.sort_unstable_by_key(|&i| (items[i as usize].lower, items[i as usize].upper, i));
        for component in split_components(items, &subset) {
            let members = &subset[component];
            if members.len() == 1 {
                fixed.push((members[0], base));
                continue;
            }
            let peeled = peelable(items, members);
            if peeled.is_empty() {
                leaves.push(Leaf { base, items: members.to_vec() });
                continue;
            }
            let mut top = base;
            let mut rest = Vec::with_capacity(members.len() - peeled.len());
            let mut peeled_iter = peeled.iter().peekable();
            for &member in members {
                if peeled_iter.peek() == Some(&&member) {
                    peeled_iter.next();
                    fixed.push((member, top));
                    top += items[member as usize].size;
                } else {
                    rest.push(member);
                }
            }
            if !rest.is_empty() {
                work.push((top, rest));
            }
        }
    }
    // Leaves in a fixed order regardless of how the work stack unwound.
    leaves.sort_unstable_by_key(|leaf| leaf.items[0]);
    Decomposition { fixed, leaves }
}

/// Ranges of `sorted` (sorted by lower) forming temporal components.
pub(crate) fn split_components(items: &[Item], sorted: &[u32]) -> Vec<core::ops::Range<usize>> {
    let mut components = Vec::new();
    let mut start = 0;
    let mut reach = 0u32;
    for (pos, &i) in sorted.iter().enumerate() {
        let item = &items[i as usize];
        if pos > start && item.lower >= reach {
            components.push(start..pos);
            start = pos;
            reach = 0;
        }
        reach = reach.max(item.upper);
    }
    if start < sorted.len() {
        components.push(start..sorted.len());
    }
    components
}

/// The members (in the order given) that overlap in time every other member.
/// `i` overlaps every `j != i` iff `lower_i < min upper_j` and `max lower_j < upper_i`.
pub(crate) fn peelable(items: &[Item], members: &[u32]) -> Vec<u32> {
    // The smallest and second-smallest upper (and the smallest's owner), likewise for the lowers.
    let mut min_upper: Option<(u32, u32)> = None;
    let mut second_min_upper = u32::MAX;
    let mut max_lower: Option<(u32, u32)> = None;
    let mut second_max_lower = 0u32;
    for &m in members {
        let item = &items[m as usize];
        match min_upper {
            Some((upper, _)) if item.upper >= upper => second_min_upper = second_min_upper.min(item.upper),
            previous => {
                if let Some((upper, _)) = previous {
                    second_min_upper = upper;
                }
                min_upper = Some((item.upper, m));
            }
        }
        match max_lower {
            Some((lower, _)) if item.lower <= lower => second_max_lower = second_max_lower.max(item.lower),
            previous => {
                if let Some((lower, _)) = previous {
                    second_max_lower = lower;
                }
                max_lower = Some((item.lower, m));
            }
        }
    }
    let (Some(min_upper), Some(max_lower)) = (min_upper, max_lower) else { return Vec::new() };
    members
        .iter()
        .copied()
        .filter(|&m| {
            let item = &items[m as usize];
            let min_upper_others = if min_upper.1 == m { second_min_upper } else { min_upper.0 };
            let max_lower_others = if max_lower.1 == m { second_max_lower } else { max_lower.0 };
            item.lower < min_upper_others && max_lower_others < item.upper
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(lower: u32, upper: u32, size: u64) -> Item {
        Item { lower, upper, size }
    }

    #[test]
    fn peels_whole_span_buffers_then_splits() {
        // 0 spans everything; 1-4 and 5-8 are two chains that only 0 connects.
        let chain = |t: u32| [item(t, t + 2, 1), item(t + 1, t + 3, 1), item(t + 2, t + 4, 1), item(t + 3, t + 5, 1)];
        let mut items = alloc::vec![item(0, 20, 5)];
        items.extend(chain(0));
        items.extend(chain(10));
        let d = decompose(&items);
        assert_eq!(d.fixed, [(0, 0)]);
        let leaves: Vec<(u64, Vec<u32>)> = d.leaves.iter().map(|l| (l.base, l.items.clone())).collect();
        assert_eq!(leaves, [(5, alloc::vec![1, 2, 3, 4]), (5, alloc::vec![5, 6, 7, 8])]);
    }

    #[test]
    fn a_clique_is_peeled_entirely() {
        let items = [item(0, 5, 1), item(1, 6, 2), item(2, 7, 3), item(4, 9, 4)];
        let d = decompose(&items);
        assert!(d.leaves.is_empty());
        assert_eq!(d.fixed, [(0, 0), (1, 1), (2, 3), (3, 6)]);
    }

    #[test]
    fn a_middle_buffer_overlapping_both_ends_is_peeled() {
        let items = [item(0, 2, 1), item(1, 3, 1), item(2, 4, 1)];
        let d = decompose(&items);
        assert_eq!(d.fixed, [(1, 0), (0, 1), (2, 1)]);
        assert!(d.leaves.is_empty());
    }

    #[test]
    fn a_chain_is_not_peeled() {
        let items = [item(0, 2, 1), item(1, 3, 1), item(2, 4, 1), item(3, 5, 1)];
        let d = decompose(&items);
        assert!(d.fixed.is_empty());
        assert_eq!(d.leaves.len(), 1);
    }
}
