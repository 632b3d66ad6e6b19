#![no_main]
use runtime_cpu::fuzzing::{check, ExecuteCase};
libfuzzer_sys::fuzz_target!(|case: ExecuteCase| check(case));
