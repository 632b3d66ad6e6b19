//! Time sections of a component: the elementary step ranges between consecutive lifetime
//! endpoints. Within a section the set of live buffers does not change, so the live units of a
//! section (its "total") and a buffer's section range are all the search needs about time.

use alloc::vec::Vec;
use core::cell::OnceCell;

use super::Item;

/// The sections of one component.
pub(crate) struct Sections {
    /// Section `k` covers steps `[points[k], points[k + 1])`.
    points: Vec<u32>,
    /// Live units in each section.
    pub totals: Vec<u64>,
    /// `range_max[j][k]`: the largest total over sections `k .. k + 2^j`, built when first needed.
    range_max: OnceCell<Vec<Vec<u64>>>,
}

/// The distinct lifetime endpoints of `members`, sorted: their section boundaries.
pub(crate) fn endpoints(items: &[Item], members: &[u32]) -> Vec<u32> {
    let mut points: Vec<u32> =
        members.iter().flat_map(|&m| [items[m as usize].lower, items[m as usize].upper]).collect();
    points.sort_unstable();
    points.dedup();
    points
}

impl Sections {
    pub(crate) fn new(items: &[Item], members: &[u32]) -> Sections {
        let points = endpoints(items, members);
        let count = points.len().saturating_sub(1);
        // Difference array over sections, then a prefix sum.
        let mut delta = alloc::vec![0i128; count + 1];
        let mut sections = Sections { points, totals: Vec::new(), range_max: OnceCell::new() };
        for &m in members {
            let range = sections.range_of(&items[m as usize]);
            delta[range.start] += i128::from(items[m as usize].size);
            delta[range.end] -= i128::from(items[m as usize].size);
        }
        let mut running = 0i128;
        sections.totals = delta[..count]
            .iter()
            .map(|d| {
                running += d;
                // Component totals never exceed the checked sum of all sizes.
                u64::try_from(running).unwrap_or(u64::MAX)
            })
            .collect();
        sections
    }

    fn range_max(&self) -> &[Vec<u64>] {
        self.range_max.get_or_init(|| {
            let count = self.totals.len();
            let mut table = alloc::vec![self.totals.clone()];
            let mut width = 1;
            while width * 2 <= count {
                let previous = &table[table.len() - 1];
                let next: Vec<u64> = (0..=count - width * 2).map(|k| previous[k].max(previous[k + width])).collect();
                table.push(next);
                width *= 2;
            }
            table
        })
    }

    /// The number of sections.
    pub(crate) fn len(&self) -> usize {
        self.totals.len()
    }

    /// The sections an item spans.
    pub(crate) fn range_of(&self, item: &Item) -> core::ops::Range<usize> {
        let start = self.points.partition_point(|&p| p < item.lower);
        let end = self.points.partition_point(|&p| p < item.upper);
        start..end
    }

    /// The first step of section `k` and the step after section `k + count - 1`.
    pub(crate) fn steps(&self, k: usize, count: usize) -> (u32, u32) {
        (self.points[k], self.points[k + count])
    }

    /// The largest live total during an item's lifetime (its "contention").
    pub(crate) fn max_total_over(&self, item: &Item) -> u64 {
        let range = self.range_of(item);
        if range.is_empty() {
            return 0;
        }
        let level = (usize::BITS - 1 - range.len().leading_zeros()) as usize;
        let row = &self.range_max()[level];
        row[range.start].max(row[range.end - (1 << level)])
    }

    /// Which sections each of `members` spans, and which members each section holds.
    pub(crate) fn rows(&self, items: &[Item], members: &[u32]) -> Rows {
        let spans: Vec<(u32, u32)> = members
            .iter()
            .map(|&m| {
                let r = self.range_of(&items[m as usize]);
                (r.start as u32, r.end as u32)
            })
            .collect();
        let mut row = alloc::vec![0usize; self.len() + 1];
        for &(start, end) in &spans {
            for s in start..end {
                row[s as usize + 1] += 1;
            }
        }
        for s in 0..self.len() {
            row[s + 1] += row[s];
        }
        let mut fill = row.clone();
        let mut held = alloc::vec![0u32; row[self.len()]];
        for (l, &(start, end)) in spans.iter().enumerate() {
            for s in start as usize..end as usize {
                held[fill[s]] = l as u32;
                fill[s] += 1;
            }
        }
        Rows { spans, row, held }
    }

    /// The largest total over all sections: the component's lower bound.
    pub(crate) fn lower_bound(&self) -> u64 {
        self.totals.iter().copied().max().unwrap_or(0)
    }
}

/// Members against sections, both ways (local indices: positions in the member list).
#[derive(Clone)]
pub(crate) struct Rows {
    /// Each member's section range `[start, end)`.
    pub spans: Vec<(u32, u32)>,
    /// Section `s` holds `held[row[s]..row[s + 1]]`, in member order.
    pub row: Vec<usize>,
    pub held: Vec<u32>,
}

impl Rows {
    /// The members (local indices) alive in section `s`.
    pub(crate) fn of(&self, s: usize) -> &[u32] {
        &self.held[self.row[s]..self.row[s + 1]]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_and_range_max() {
        let items = [
            Item { lower: 0, upper: 4, size: 3 },
            Item { lower: 2, upper: 6, size: 5 },
            Item { lower: 5, upper: 9, size: 1 },
        ];
        let s = Sections::new(&items, &[0, 1, 2]);
        // points 0 2 4 5 6 9 -> sections [0,2) [2,4) [4,5) [5,6) [6,9)
        assert_eq!(s.totals, [3, 8, 5, 6, 1]);
        assert_eq!(s.range_of(&items[1]), 1..4);
        assert_eq!(s.max_total_over(&items[0]), 8);
        assert_eq!(s.max_total_over(&items[2]), 6);
        assert_eq!(s.lower_bound(), 8);
    }
}
