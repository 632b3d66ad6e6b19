#![no_main]
use memo_plan_core::fuzzing::plan_mutate::{check, MutateCase};
libfuzzer_sys::fuzz_target!(|case: MutateCase| check(case));
