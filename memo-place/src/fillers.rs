//! Fillers: rectangles that fill a component's slack so that every section is exactly full, for
//! the flat splits (`split`) to take it apart. They succeed where the fillers are the packing's
//! holes, but the slack profile alone does not say where those are (a 24-unit hole ending where a
//! 1,544-unit one starts reads as a 24-unit one under a 1,520-unit one); so the fillers come in
//! shapes: [`Shape::Nested`] and [`Shape::Runs`], one set each from one sweep, and [`fewest`], every
//! set of the fewest rectangles, for a part whose fillers were wrong. `first..end`: sections.

use crate::tuning::*;
use alloc::vec::Vec;

/// One filler: `height` units over sections `first..end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Filler {
    pub first: usize,
    pub end: usize,
    pub height: u64,
}

/// How one sweep cuts a slack profile into fillers.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// Holes nest: the open filler of exactly the fall's height closes, so holes of distinct
    /// heights overlapping in time are recovered.
    Nested,
    /// Holes end where the slack changes: holes side by side in time are recovered.
    Runs,
}

/// The fillers of `slack` in one `shape`, or `None` when they would be more than `most`. Where the
/// slack rises, a filler opens; where it falls, `Nested` closes the open filler of that height if
/// any, else the latest (the last in part); `Runs` closes all and opens the slack left as one.
pub(crate) fn shaped(slack: &[u64], shape: Shape, most: usize) -> Option<Vec<Filler>> {
    let mut fillers = Vec::new();
    let mut open: Vec<(usize, u64)> = Vec::new(); // (first section, height)
    for k in 0..=slack.len() {
        let (before, now) = levels(slack, k);
        if now > before {
            open.push((k, now - before));
        }
        let mut closing = before.saturating_sub(now);
        if shape == Shape::Runs && closing > 0 {
            while let Some((first, height)) = open.pop() {
                fillers.push(Filler { first, end: k, height });
            }
            if now > 0 {
                open.push((k, now));
            }
            closing = 0;
        }
        if closing > 0 {
            if let Some(exact) = open.iter().rposition(|&(_, height)| height == closing) {
                let (first, height) = open.remove(exact);
                fillers.push(Filler { first, end: k, height });
                closing = 0;
            }
        }
        while closing > 0 {
            let Some((first, height)) = open.pop() else { break };
            let part = height.min(closing);
            fillers.push(Filler { first, end: k, height: part });
            if part < height {
                open.push((first, height - part));
            }
            closing -= part;
        }
        if fillers.len() > most {
            return None;
        }
    }
    Some(fillers)
}

/// Every set of fillers of `slack` with the fewest rectangles, up to `variants` sets, each sorted,
/// within `work` steps, none holding more than `OPEN_MOST` open at once. A depth-first search over
/// the boundaries where the slack changes, each closing any subset of the open fillers and opening
/// at most one with what is missing, cut off by a count of the changes left.
pub(crate) fn fewest(slack: &[u64], variants: usize, work: u64) -> Vec<Vec<Filler>> {
    let changes: Vec<usize> = (0..=slack.len()).filter(|&k| levels(slack, k).0 != levels(slack, k).1).collect();
    if changes.is_empty() {
        return Vec::new();
    }
    let mut search = Fewest {
        slack,
        changes,
        open: Vec::new(),
        closed: Vec::new(),
        best: usize::MAX,
        found: Vec::new(),
        variants,
        work,
    };
    search.descend(0);
    for set in &mut search.found {
        set.sort_unstable();
    }
    search.found.sort_unstable();
    search.found.dedup();
    search.found
}

/// The slack before section boundary `k` and after it (0 outside the profile).
fn levels(slack: &[u64], k: usize) -> (u64, u64) {
    let before = if k == 0 { 0 } else { slack[k - 1] };
    (before, slack.get(k).copied().unwrap_or(0))
}

/// The depth-first search of [`fewest`].
struct Fewest<'s> {
    slack: &'s [u64],
    /// The section boundaries where the slack changes.
    changes: Vec<usize>,
    /// Open fillers: (first section, height).
    open: Vec<(usize, u64)>,
    closed: Vec<Filler>,
    /// The fewest fillers of a set found so far.
    best: usize,
    found: Vec<Vec<Filler>>,
    variants: usize,
    work: u64,
}

impl Fewest<'_> {
    fn descend(&mut self, change: usize) {
        let count = self.closed.len() + self.open.len();
        if change == self.changes.len() {
            if count < self.best {
                self.best = count;
                self.found.clear();
            }
            if self.found.len() < self.variants {
                self.found.push(self.closed.clone());
            }
            return;
        }
        if self.open.len() > OPEN_MOST {
            return;
        }
        // Every subset of the open fillers is looked at: that is the work charged.
        let subsets = 1u64 << self.open.len();
        if self.work < subsets {
            self.work = 0;
            return;
        }
        self.work -= subsets;
        let k = self.changes[change];
        let (before, now) = levels(self.slack, k);
        // The subsets of open fillers that may close here, with the filler that opens (0: none).
        let mut choices: Vec<(u32, u64)> = (0u32..1 << self.open.len())
            .filter_map(|subset| {
                let closing: u64 = (0..self.open.len()).filter(|&i| subset >> i & 1 == 1).map(|i| self.open[i].1).sum();
                let left = before.checked_sub(closing)?;
                let opening = now.checked_sub(left)?;
                (subset != 0 || opening != 0).then_some((subset, opening))
            })
            .collect();
        choices.sort_by_key(|&(subset, opening)| (opening != 0, subset.count_ones(), subset));
        for (subset, opening) in choices {
            if self.work == 0 {
                return;
            }
            let opened = usize::from(opening != 0);
            // Each change left needs a filler to open or close: at least this many more open.
            let open_after = self.open.len() - subset.count_ones() as usize + opened;
            let changes_left = self.changes.len() - change - 1;
            let more = changes_left.saturating_sub(open_after).div_ceil(2);
            if count + opened + more > self.best {
                continue;
            }
            let (open_before, closed_before) = (self.open.clone(), self.closed.len());
            let mut kept = Vec::with_capacity(open_after);
            for (i, &(first, height)) in open_before.iter().enumerate() {
                if subset >> i & 1 == 1 {
                    self.closed.push(Filler { first, end: k, height });
                } else {
                    kept.push((first, height));
                }
            }
            if opening != 0 {
                kept.push((k, opening));
            }
            self.open = kept;
            self.descend(change + 1);
            self.open = open_before;
            self.closed.truncate(closed_before);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slack profile of `fillers` over `sections` sections.
    fn profile(fillers: &[Filler], sections: usize) -> Vec<u64> {
        let mut slack = alloc::vec![0; sections];
        for f in fillers {
            for s in &mut slack[f.first..f.end] {
                *s += f.height;
            }
        }
        slack
    }

    fn filler(first: usize, end: usize, height: u64) -> Filler {
        Filler { first, end, height }
    }

    #[test]
    fn each_shape_recovers_its_holes() {
        // Nested: a short hole inside a long one.
        let nested = [filler(0, 10, 5), filler(3, 6, 2)];
        let got = shaped(&profile(&nested, 10), Shape::Nested, 8).unwrap();
        assert_eq!(sorted(got), sorted(nested.to_vec()));
        // Runs: a hole ending where a lower one starts.
        let runs = [filler(0, 4, 5), filler(4, 9, 3)];
        let got = shaped(&profile(&runs, 9), Shape::Runs, 8).unwrap();
        assert_eq!(sorted(got), sorted(runs.to_vec()));
        // Too many for the cap.
        assert!(shaped(&profile(&runs, 9), Shape::Runs, 1).is_none());
    }

    fn sorted(mut fillers: Vec<Filler>) -> Vec<Filler> {
        fillers.sort_unstable();
        fillers
    }

    #[test]
    fn the_fewest_sets_include_holes_neither_sweep_recovers() {
        // A hole ending where a taller one starts, both inside a longer one, which a third ends
        // with: the holes of the generator's holes 500 seed 7, in small. Neither sweep recovers
        // them; they are among the sets of four rectangles.
        let holes = [filler(0, 8, 1175), filler(2, 3, 24), filler(3, 8, 1544), filler(6, 12, 42_399)];
        let slack = profile(&holes, 12);
        for shape in [Shape::Nested, Shape::Runs] {
            assert_ne!(sorted(shaped(&slack, shape, 8).unwrap()), sorted(holes.to_vec()));
        }
        let sets = fewest(&slack, 64, 1 << 20);
        assert!(sets.contains(&sorted(holes.to_vec())), "{sets:?}");
        for set in &sets {
            assert_eq!(set.len(), holes.len());
            assert_eq!(profile(set, 12), slack, "every set makes the same profile");
        }
    }

    /// On random sets of up to six holes: every set `fewest` returns makes the same profile, all
    /// have the same count, never more than the holes (which make the profile too, or fewer when
    /// some start together); and both sweeps make the same profile.
    #[test]
    fn every_set_makes_the_profile_with_the_fewest_rectangles() {
        let mut rng = crate::generate::SplitMix64::new(7);
        for case in 0..500 {
            let sections = 2 + rng.below(12) as usize;
            let holes: Vec<Filler> = (0..1 + rng.below(6))
                .map(|_| {
                    let first = rng.below(sections as u64) as usize;
                    let end = first + 1 + rng.below((sections - first) as u64) as usize;
                    filler(first, end, 1 + rng.below(8))
                })
                .collect();
            let slack = profile(&holes, sections);
            for shape in [Shape::Nested, Shape::Runs] {
                let swept = shaped(&slack, shape, usize::MAX).expect("no cap");
                assert_eq!(profile(&swept, sections), slack, "case {case}: {holes:?}");
            }
            let sets = fewest(&slack, 16, 1 << 20);
            assert!(!sets.is_empty(), "case {case}: {holes:?}");
            for set in &sets {
                assert_eq!(profile(set, sections), slack, "case {case}: {holes:?} -> {set:?}");
                assert_eq!(set.len(), sets[0].len());
                assert!(set.len() <= holes.len(), "case {case}: {holes:?} -> {set:?}");
            }
        }
    }

    #[test]
    fn fewest_is_bounded_by_its_arguments() {
        let holes = [filler(0, 8, 1175), filler(2, 3, 24), filler(3, 8, 1544), filler(6, 12, 42_399)];
        let slack = profile(&holes, 12);
        assert_eq!(fewest(&slack, 1, 1 << 20).len(), 1);
        assert!(fewest(&slack, 64, 0).is_empty());
        assert!(fewest(&[0, 0, 0], 64, 1 << 20).is_empty());
    }
}
