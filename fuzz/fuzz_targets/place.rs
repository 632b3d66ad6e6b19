#![no_main]
use memo_place::fuzzing::place::{check, PlaceCase};
libfuzzer_sys::fuzz_target!(|case: PlaceCase| check(case));
