//! Offset domains at zero slack: where each buffer *can* sit when every section is exactly full.
//!
//! In a placement where a section's buffers fill it from 0 to the capacity without a gap, a
//! buffer's offset is the total size of the buffers under it there: a subset sum of the section's
//! other buffers. It is so in every section the buffer spans, so its offset lies in the
//! intersection of those subset sums. With sizes that rarely add up by coincidence (a perfect
//! packing cut at random heights) the intersection is a handful of values, and the skyline search
//! (`search::fill_skyline`) drops every buffer whose domain lacks the floor it would sit on:
//! most wrong choices go before they are tried, and fail-first counts see the true choices.
//!
//! The sums are enumerated in each buffer's sparsest sections only (`DOMAIN_SECTIONS`, each with
//! at most `DOMAIN_MOST_OTHERS` other buffers): enough to make domains small, bounded in work. A
//! buffer without such a section, or whose domain stays large, is left unrestricted (`None`).
//! Every domain is a superset of the offsets the buffer takes in any zero-slack placement, so
//! the search stays exact.

use alloc::vec::Vec;

use super::sections::Sections;
use super::Item;

/// Sections per buffer whose subset sums are intersected (the sparsest ones).
pub const DOMAIN_SECTIONS: usize = 4;

/// The most other buffers a section may have for its subset sums to be enumerated (2^12 sums).
pub const DOMAIN_MOST_OTHERS: usize = 12;

/// Domains with more values than this are dropped (they prune little and cost memory).
pub const DOMAIN_MOST_VALUES: usize = 1 << 14;

/// The offset domain of each buffer (local index), sorted; `None`: any offset.
pub(crate) struct Domains {
    values: Vec<Option<Vec<u64>>>,
}

impl Domains {
    /// The domains of `members` (local indices) at `capacity`, or `None` unless every section
    /// is exactly full there (zero slack) or no buffer gets a domain.
    pub(crate) fn of(items: &[Item], members: &[u32], sections: &Sections, capacity: u64) -> Option<Domains> {
        if sections.totals.iter().any(|&t| t != capacity) {
            return None;
        }
        let rows = sections.rows(items, members);
        let (mut sums, mut scratch) = (Vec::new(), Vec::new());
        let mut chosen: Vec<(usize, usize)> = Vec::new(); // (others, section)
        let values: Vec<Option<Vec<u64>>> = members
            .iter()
            .enumerate()
            .map(|(l, &m)| {
                let size = items[m as usize].size;
                let (start, end) = rows.spans[l];
                // The sparsest sections, and the span's first and last (they differ most from
                // each other: sums shared by neighbouring sections do not narrow a domain).
                chosen.clear();
                chosen.extend(
                    (start as usize..end as usize)
                        .map(|s| (rows.of(s).len() - 1, s))
                        .filter(|&(others, _)| others <= DOMAIN_MOST_OTHERS),
                );
                chosen.sort_unstable();
                chosen.truncate(DOMAIN_SECTIONS);
                for edge in [start as usize, end as usize - 1] {
                    let others = rows.of(edge).len() - 1;
                    if others <= DOMAIN_MOST_OTHERS && !chosen.contains(&(others, edge)) {
                        chosen.push((others, edge));
                    }
                }
                let highest = capacity.checked_sub(size)?;
                let mut domain: Option<Vec<u64>> = None;
                for &(_, s) in &chosen {
                    let limit = domain.as_ref().and_then(|d| d.last().copied()).unwrap_or(highest);
                    let others = rows
                        .of(s)
                        .iter()
                        .filter(|&&o| o as usize != l)
                        .map(|&o| items[members[o as usize] as usize].size);
                    subset_sums(others, limit, &mut sums, &mut scratch);
                    domain = Some(match domain {
                        None => sums.clone(),
                        Some(d) => intersect(&d, &sums),
                    });
                }
                domain.filter(|d| d.len() <= DOMAIN_MOST_VALUES)
            })
            .collect();
        values.iter().any(Option::is_some).then_some(Domains { values })
    }

    /// Whether buffer `l` may sit at `offset`.
    pub(crate) fn allows(&self, l: usize, offset: u64) -> bool {
        match &self.values[l] {
            None => true,
            Some(d) => d.binary_search(&offset).is_ok(),
        }
    }

    /// The lowest offset at or above `from` that buffer `l` may take (`u64::MAX`: none).
    pub(crate) fn lowest_from(&self, l: usize, from: u64) -> u64 {
        match &self.values[l] {
            None => from,
            Some(d) => d.get(d.partition_point(|&v| v < from)).copied().unwrap_or(u64::MAX),
        }
    }
}

/// The distinct subset sums of `sizes` up to `limit`, sorted, into `out`.
fn subset_sums(sizes: impl Iterator<Item = u64>, limit: u64, out: &mut Vec<u64>, scratch: &mut Vec<u64>) {
    out.clear();
    out.push(0);
    for size in sizes {
        // Merge `out` with `out + size` (both sorted), dropping duplicates and sums past `limit`.
        scratch.clear();
        let (mut i, mut j) = (0, 0);
        while i < out.len() || j < out.len() {
            let shifted = out.get(j).map(|&v| v.saturating_add(size)).filter(|&v| v <= limit);
            let next = match (out.get(i).copied(), shifted) {
                (Some(a), Some(b)) if a <= b => {
                    i += 1;
                    a
                }
                (_, Some(b)) => {
                    j += 1;
                    b
                }
                (Some(a), None) => {
                    i += 1;
                    j = out.len();
                    a
                }
                (None, None) => break,
            };
            if scratch.last() != Some(&next) {
                scratch.push(next);
            }
        }
        core::mem::swap(out, scratch);
    }
}

/// The values in both sorted lists.
fn intersect(a: &[u64], b: &[u64]) -> Vec<u64> {
    let (mut i, mut j) = (0, 0);
    let mut both = Vec::new();
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            core::cmp::Ordering::Less => i += 1,
            core::cmp::Ordering::Greater => j += 1,
            core::cmp::Ordering::Equal => {
                both.push(a[i]);
                i += 1;
                j += 1;
            }
        }
    }
    both
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subset_sums_are_distinct_sorted_and_capped() {
        let (mut out, mut scratch) = (Vec::new(), Vec::new());
        subset_sums([3u64, 5, 3].into_iter(), 9, &mut out, &mut scratch);
        assert_eq!(out, [0, 3, 5, 6, 8]);
    }

    #[test]
    fn a_domain_is_the_intersection_of_its_sections_sums() {
        // Steps [0, 2) and [2, 4), both full at 20: buffer 0 (size 4) lives in both; 1 and 2
        // (6, 10) in the first, 3 (16) in the second. Buffer 0 sits on a subset of {6, 10} in the
        // first ({0, 6, 10, 16}) and of {16} in the second ({0, 16}): so at 0 or 16.
        let items = [
            Item { lower: 0, upper: 4, size: 4 },
            Item { lower: 0, upper: 2, size: 6 },
            Item { lower: 0, upper: 2, size: 10 },
            Item { lower: 2, upper: 4, size: 16 },
        ];
        let members = [0, 1, 2, 3];
        let sections = Sections::new(&items, &members);
        let domains = Domains::of(&items, &members, &sections, 20).expect("zero slack at 20");
        assert!(domains.allows(0, 0) && domains.allows(0, 16));
        assert!(!domains.allows(0, 6) && !domains.allows(0, 10));
        assert_eq!(domains.lowest_from(0, 1), 16);
        assert_eq!(domains.lowest_from(0, 17), u64::MAX);
        // Buffer 1 (one section): sums of {4, 10} up to 14.
        assert!(domains.allows(1, 14) && !domains.allows(1, 6));
        // Not zero slack at 21: no domains.
        assert!(Domains::of(&items, &members, &sections, 21).is_none());
    }
}
