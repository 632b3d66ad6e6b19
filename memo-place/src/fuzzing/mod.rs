//! The placement fuzz harness (feature `fuzzing`): [`place`] feeds generated instances to
//! [`crate::solve`] and checks every answer against the independent checker and the [`oracle`]s.
//! The cargo-fuzz target `place` in `fuzz/fuzz_targets/` only calls [`place::check`]; a smoke test
//! runs it on cases drawn with [`smoke`], so `cargo test --features fuzzing` exercises it without
//! libFuzzer.

use alloc::vec::Vec;

use arbitrary::{Arbitrary, Unstructured};

use crate::generate::SplitMix64;

pub mod oracle;
pub mod place;

/// Runs `check` on `cases` inputs from a SplitMix64 byte stream seeded with `seed`, each of a
/// length drawn from `0..=max_len` and decoded as a libFuzzer target decodes its input
/// (`Arbitrary::arbitrary_take_rest`). Inputs that do not decode are skipped. Deterministic: the
/// same seed gives the same cases on every platform.
pub fn smoke<T: for<'a> Arbitrary<'a>>(seed: u64, cases: usize, max_len: usize, check: impl Fn(T)) {
    let mut rng = SplitMix64::new(seed);
    let mut bytes: Vec<u8> = Vec::with_capacity(max_len + 8);
    for _ in 0..cases {
        let len = rng.below(max_len as u64 + 1) as usize;
        bytes.clear();
        while bytes.len() < len {
            bytes.extend_from_slice(&rng.next_u64().to_le_bytes());
        }
        bytes.truncate(len);
        if let Ok(case) = T::arbitrary_take_rest(Unstructured::new(&bytes)) {
            check(case);
        }
    }
}

/// Runs `check` on every file of the committed seed corpus of `target` (`fuzz/corpus/<target>/`
/// under `repository`, the folder that holds `fuzz/`), decoded as libFuzzer does. Prints `SKIP`
/// and does nothing when that folder is not there (a crate built outside its repository).
pub fn run_corpus<T: for<'a> Arbitrary<'a>>(repository: &std::path::Path, target: &str, check: impl Fn(T)) {
    let folder = repository.join("fuzz/corpus").join(target);
    let Ok(entries) = std::fs::read_dir(&folder) else {
        std::println!("SKIP: no corpus at {}", folder.display());
        return;
    };
    let mut paths: Vec<std::path::PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    assert!(!paths.is_empty(), "empty corpus at {}", folder.display());
    for path in paths {
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        match T::arbitrary_take_rest(Unstructured::new(&bytes)) {
            Ok(case) => check(case),
            Err(e) => panic!("{} does not decode: {e}", path.display()),
        }
    }
}
