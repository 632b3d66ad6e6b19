//! Fuzz harnesses (feature `fuzzing`): one submodule per target, each with an [`Arbitrary`] case
//! type, built valid by construction where the target needs valid input, and a `check(case)` that
//! panics on the first violated invariant.
//!
//! - [`trace_parse`]: any bytes into the three trace parsers, and generated valid traces of both
//!   forms whose lifetimes are known;
//! - [`place`]: generated instances into [`crate::arena::solve`], every answer checked against
//!   the independent checker and the [`oracle`]s;
//! - [`plan_decode`]: any bytes (as they are, and with the header's checksum made to match) into
//!   [`crate::plan::Plan::decode`], and generated valid plans through encode, decode and the JSON
//!   view;
//! - [`plan`]: generated small models, layouts, machines and strategies into the planner; the
//!   plan through the checker, the byte format and a second planning (determinism);
//! - [`plan_mutate`]: those plans with one corruption each, which the checker must reject.
//!
//! The cargo-fuzz targets in `fuzz/fuzz_targets/` only call these `check` functions; each module
//! also has a smoke test that runs its `check` for about a second on cases drawn with [`smoke`],
//! so `cargo test --features fuzzing` exercises every harness without libFuzzer.

use alloc::vec::Vec;

use arbitrary::{Arbitrary, Unstructured};

use crate::generate::SplitMix64;

pub mod oracle;
pub mod place;
pub mod plan;
pub mod plan_decode;
pub mod plan_mutate;
pub mod trace_parse;

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

/// Runs `check` on every file of the committed seed corpus of `target`
/// (`fuzz/corpus/<target>/` at the repository root), decoded as libFuzzer does. Prints `SKIP`
/// and does nothing when that folder is not there (the crate built outside its repository).
#[cfg(test)]
pub(crate) fn run_corpus<T: for<'a> Arbitrary<'a>>(target: &str, check: impl Fn(T)) {
    let folder = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus").join(target);
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
