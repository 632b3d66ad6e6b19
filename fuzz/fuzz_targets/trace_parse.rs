#![no_main]
use memo_plan_core::fuzzing::trace_parse::{check, TraceCase};
libfuzzer_sys::fuzz_target!(|case: TraceCase| check(case));
