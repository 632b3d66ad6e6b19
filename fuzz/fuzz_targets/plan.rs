#![no_main]
use memo_plan_core::fuzzing::plan::{check, PlanCase};
libfuzzer_sys::fuzz_target!(|case: PlanCase| check(case));
