//! *Twins*: buffers over exactly the same time sections. Stacked directly on each other they can
//! swap places, so the skyline search stacks them only larger below, and tries first the twins with
//! no larger one left. Per group, in linear space: its members, larger first, and the stack of its
//! placed members each higher than all placed before (undone last-in, first-out).

use alloc::vec::Vec;

/// The group of a buffer without twins.
const ALONE: u32 = u32::MAX;

pub(crate) struct Twins {
    /// Each buffer's group, or `ALONE`.
    group: Vec<u32>,
    /// Group `g`'s members are `members[row[g]..row[g + 1]]`, larger first (ties by index).
    row: Vec<u32>,
    members: Vec<u32>,
    /// Group `g`'s placed members higher than every one placed before them, in the slots
    /// `highs[row[g]..row[g] + high_count[g]]`.
    highs: Vec<u32>,
    high_count: Vec<u32>,
}

impl Twins {
    /// The groups of buffers with the section ranges `spans` and sizes `size` (local indices).
    pub(crate) fn new(spans: &[(u32, u32)], size: &[u64]) -> Twins {
        let mut order: Vec<u32> = (0..spans.len() as u32).collect();
        order.sort_unstable_by_key(|&l| (spans[l as usize], core::cmp::Reverse(size[l as usize]), l));
        let mut group = alloc::vec![ALONE; spans.len()];
        let (mut row, mut members) = (alloc::vec![0u32], Vec::new());
        for run in order.chunk_by(|&a, &b| spans[a as usize] == spans[b as usize]).filter(|run| run.len() > 1) {
            for &l in run {
                group[l as usize] = row.len() as u32 - 1;
            }
            members.extend_from_slice(run);
            row.push(members.len() as u32);
        }
        let highs = alloc::vec![0; members.len()];
        let high_count = alloc::vec![0; row.len() - 1];
        Twins { group, row, members, highs, high_count }
    }

    /// The other buffers of `l`'s group, larger first (none for a buffer without twins).
    pub(crate) fn of(&self, l: usize) -> impl Iterator<Item = u32> + '_ {
        let g = self.group[l];
        let members: &[u32] = if g == ALONE { &[] } else { self.slots(&self.members, g) };
        members.iter().copied().filter(move |&t| t as usize != l)
    }

    /// Records that `l` was placed at `offset[l]` (every placed buffer's offset in `offset`).
    pub(crate) fn placed(&mut self, l: usize, offset: &[u64]) {
        let g = self.group[l];
        if g == ALONE {
            return;
        }
        let (start, count) = (self.row[g as usize] as usize, self.high_count[g as usize] as usize);
        if count == 0 || offset[l] > offset[self.highs[start + count - 1] as usize] {
            self.highs[start + count] = l as u32;
            self.high_count[g as usize] += 1;
        }
    }

    /// Records that `l`, the last buffer placed still placed, was unplaced.
    pub(crate) fn unplaced(&mut self, l: usize) {
        let g = self.group[l];
        if g == ALONE {
            return;
        }
        let (start, count) = (self.row[g as usize] as usize, self.high_count[g as usize] as usize);
        if count > 0 && self.highs[start + count - 1] as usize == l {
            self.high_count[g as usize] -= 1;
        }
    }

    /// The highest placed buffer of `l`'s group (`l` itself unplaced), if any.
    pub(crate) fn highest_placed(&self, l: usize) -> Option<u32> {
        let g = self.group[l];
        if g == ALONE {
            return None;
        }
        let count = self.high_count[g as usize] as usize;
        (count > 0).then(|| self.highs[self.row[g as usize] as usize + count - 1])
    }

    fn slots<'s>(&self, of: &'s [u32], g: u32) -> &'s [u32] {
        &of[self.row[g as usize] as usize..self.row[g as usize + 1] as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twins_are_the_other_buffers_over_the_same_sections_larger_first() {
        let spans = [(0, 2), (0, 2), (1, 3), (0, 2), (1, 2)];
        let size = [5, 9, 1, 7, 1];
        let twins = Twins::new(&spans, &size);
        let of = |l: usize| twins.of(l).collect::<Vec<u32>>();
        assert_eq!(of(0), [1, 3]);
        assert_eq!(of(1), [3, 0]);
        assert_eq!(of(3), [1, 0]);
        assert!(of(2).is_empty() && of(4).is_empty());
        // A large group is kept whole (no quadratic lists).
        let twins = Twins::new(&[(0, 1); 1000], &[1; 1000]);
        assert_eq!(twins.of(500).count(), 999);
    }

    #[test]
    fn the_highest_placed_twin_follows_placements_and_their_undoing() {
        let spans = [(0, 2); 3];
        let mut twins = Twins::new(&spans, &[4, 2, 1]);
        let mut offset = [u64::MAX; 3];
        assert_eq!(twins.highest_placed(0), None);
        offset[1] = 10;
        twins.placed(1, &offset);
        assert_eq!(twins.highest_placed(0), Some(1));
        // Placed lower than the highest (as a canonical search may): the highest stays.
        offset[2] = 0;
        twins.placed(2, &offset);
        assert_eq!(twins.highest_placed(0), Some(1));
        offset[0] = 20;
        twins.placed(0, &offset);
        assert_eq!(twins.highest_placed(2), Some(0));
        for l in [0, 2, 1] {
            twins.unplaced(l);
            offset[l] = u64::MAX;
        }
        assert_eq!(twins.highest_placed(0), None);
        // Undone in between: 1 at 10, then 0 at 20 undone, then 2 at 30.
        offset[1] = 10;
        twins.placed(1, &offset);
        offset[0] = 20;
        twins.placed(0, &offset);
        twins.unplaced(0);
        offset[0] = u64::MAX;
        offset[2] = 30;
        twins.placed(2, &offset);
        assert_eq!(twins.highest_placed(0), Some(2));
    }
}
