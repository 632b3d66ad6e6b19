#![no_main]
use memo_plan_core::fuzzing::place::{check, PlaceCase};
libfuzzer_sys::fuzz_target!(|case: PlaceCase| check(case));
