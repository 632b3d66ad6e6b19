//! The `plan_mutate` harness's own tests: the smoke run over every kind, the committed corpus,
//! and the seed writer.

use std::collections::BTreeMap;

use super::*;
use crate::fuzzing::{run_corpus, smoke};

/// About a second of cases in a debug build. Every kind must be applied a few times (the
/// generator reaches plans with targets for each), and every kind but a dropped swap-in must
/// be rejected each time (`check_counted` asserts that); the counts are printed.
#[test]
fn smoke_test() {
    let counts = core::cell::RefCell::new(BTreeMap::<Mutation, (u32, u32, u32)>::new());
    smoke(0x6d75_7461, 320, 64, |case: MutateCase| {
        let kind = case.mutation;
        let result = check_counted(case);
        let mut counts = counts.borrow_mut();
        let (cases, applied, rejected) = counts.entry(kind).or_default();
        *cases += 1;
        if let Some((done, was_rejected)) = result {
            assert_eq!(done, kind);
            *applied += 1;
            *rejected += u32::from(was_rejected);
        }
    });
    let counts = counts.into_inner();
    for kind in Mutation::ALL {
        let (cases, applied, rejected) = counts.get(&kind).copied().unwrap_or_default();
        std::println!("{}: {cases} cases, {applied} applied, {rejected} rejected", kind.name());
        assert!(applied >= 5, "{} applied only {applied} times in {cases} cases", kind.name());
        assert_eq!(rejected, applied, "{}", kind.name());
    }
}

#[test]
fn the_committed_corpus_passes() {
    run_corpus("plan_mutate", check);
}

/// Prints, per kind, how many inputs of a corpus folder (`PLAN_MUTATE_CORPUS`, by default
/// the committed seeds) chose it, applied it and had it rejected: how a fuzzing run spread
/// its corpus over the kinds (`fuzz/README.md`).
#[test]
#[ignore = "reads a corpus folder; run by hand after a fuzzing run"]
fn kinds_in_a_corpus() {
    let default = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/plan_mutate");
    let folder = std::env::var_os("PLAN_MUTATE_CORPUS").map_or(default, std::path::PathBuf::from);
    let mut counts = BTreeMap::<Mutation, (u32, u32, u32)>::new();
    for entry in std::fs::read_dir(&folder).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        let Ok(case) = MutateCase::arbitrary_take_rest(Unstructured::new(&bytes)) else { continue };
        let (cases, applied, rejected) = counts.entry(case.mutation).or_default();
        *cases += 1;
        if let Some((_, was_rejected)) = check_counted(case) {
            *applied += 1;
            *rejected += u32::from(was_rejected);
        }
    }
    for (kind, (cases, applied, rejected)) in counts {
        std::println!("{}: {cases} inputs, {applied} applied, {rejected} rejected", kind.name());
    }
}

/// Writes the seed corpus: for each kind, the first SplitMix64 byte string (seed 1, 2, ...;
/// 64 bytes) whose case applies it, named after it.
#[test]
#[ignore = "writes fuzz/corpus/plan_mutate/; run by hand after a change to the generator"]
fn write_seed_corpus() {
    let folder = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/plan_mutate");
    std::fs::create_dir_all(&folder).unwrap();
    for kind in Mutation::ALL {
        let bytes = (1..)
            .map(|seed| crate::fuzzing::plan::seed_bytes(seed, 64))
            .find(|bytes| {
                let case = MutateCase::arbitrary_take_rest(Unstructured::new(bytes)).unwrap();
                case.mutation == kind && check_counted(case).is_some()
            })
            .unwrap();
        std::fs::write(folder.join(kind.name()), bytes).unwrap();
    }
}
