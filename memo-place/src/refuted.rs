//! The partial placements a zero-slack search has proven infeasible, as 128-bit fingerprints
//! (the search's state key with the section range mixed in) in an open-addressing table: one probe
//! per lookup. Two states share a fingerprint only by a 2^-128 chance, as the search assumes.

use crate::tuning::*;
use alloc::vec::Vec;

/// A random odd constant that spreads a section range over 128 bits.
const RANGE_MIX: u128 = 0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835;

pub(crate) struct Refuted {
    /// Open addressing with linear probing; 0 marks an empty slot (a fingerprint of 0 is stored as 1).
    slots: Vec<u128>,
    len: usize,
}

impl Refuted {
    pub(crate) fn new() -> Refuted {
        Refuted { slots: Vec::new(), len: 0 }
    }

    /// The fingerprint of a state searched over sections `[start, end)`.
    pub(crate) fn fingerprint(state_key: u128, start: u32, end: u32) -> u128 {
        let range = (u128::from(start) << 64 | u128::from(end)).wrapping_add(1).wrapping_mul(RANGE_MIX);
        (state_key ^ range).max(1)
    }

    pub(crate) fn contains(&self, fingerprint: u128) -> bool {
        if self.slots.is_empty() {
            return false;
        }
        let mask = self.slots.len() - 1;
        let mut slot = Self::home(fingerprint) & mask;
        loop {
            match self.slots[slot] {
                0 => return false,
                held if held == fingerprint => return true,
                _ => slot = (slot + 1) & mask,
            }
        }
    }

    /// Records `fingerprint` unless the set is full.
    pub(crate) fn insert(&mut self, fingerprint: u128) {
        if self.len >= REFUTED_MOST {
            return;
        }
        if 2 * (self.len + 1) > self.slots.len() {
            self.grow();
        }
        let mask = self.slots.len() - 1;
        let mut slot = Self::home(fingerprint) & mask;
        while self.slots[slot] != 0 {
            if self.slots[slot] == fingerprint {
                return;
            }
            slot = (slot + 1) & mask;
        }
        self.slots[slot] = fingerprint;
        self.len += 1;
    }

    fn home(fingerprint: u128) -> usize {
        (fingerprint as u64 ^ (fingerprint >> 64) as u64) as usize
    }

    fn grow(&mut self) {
        let old = core::mem::take(&mut self.slots);
        self.slots = alloc::vec![0; (old.len() * 2).max(REFUTED_FIRST_SLOTS)];
        self.len = 0;
        for fingerprint in old.into_iter().filter(|&f| f != 0) {
            self.insert(fingerprint);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::SplitMix64;

    #[test]
    fn holds_what_was_inserted_and_nothing_else() {
        let mut rng = SplitMix64::new(5);
        let keys: Vec<u128> =
            (0..5000).map(|_| u128::from(rng.next_u64()) << 64 | u128::from(rng.next_u64())).collect();
        let mut set = Refuted::new();
        for (i, &k) in keys.iter().enumerate() {
            assert!(!set.contains(Refuted::fingerprint(k, 0, 3)));
            set.insert(Refuted::fingerprint(k, 0, 3));
            if i % 2 == 0 {
                set.insert(Refuted::fingerprint(k, 0, 3)); // twice: still one entry
            }
        }
        assert_eq!(set.len, keys.len());
        for &k in &keys {
            assert!(set.contains(Refuted::fingerprint(k, 0, 3)));
            // The same state over another range is another entry.
            assert!(!set.contains(Refuted::fingerprint(k, 1, 3)));
        }
        // A state key of 0 is held too.
        set.insert(Refuted::fingerprint(0, 0, 0));
        assert!(set.contains(Refuted::fingerprint(0, 0, 0)));
    }
}
