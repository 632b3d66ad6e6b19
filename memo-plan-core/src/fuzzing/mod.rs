//! Fuzz harnesses (feature `fuzzing`): one submodule per target, each with an [`Arbitrary`] case
//! type, built valid by construction where the target needs valid input, and a `check(case)` that
//! panics on the first violated invariant.
//!
//! - [`trace_parse`]: any bytes into the three trace parsers, and generated valid traces of both
//!   forms whose lifetimes are known;
//! - [`place`]: generated instances into [`memo_place::solve`] (re-exported from `memo-place`), every answer checked against
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

pub use memo_place::fuzzing::{oracle, place, smoke};

pub mod plan;
pub mod plan_decode;
pub mod plan_mutate;
pub mod trace_parse;

/// Runs `check` on every file of the committed seed corpus of `target` (`fuzz/corpus/<target>/`
/// at the repository root), decoded as libFuzzer does ([`memo_place::fuzzing::run_corpus`]).
#[cfg(test)]
pub(crate) fn run_corpus<T: for<'a> arbitrary::Arbitrary<'a>>(target: &str, check: impl Fn(T)) {
    memo_place::fuzzing::run_corpus(std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")), target, check);
}
