//! The type system's half of the safety argument (`memo_runtime::backend`'s module docs): from
//! safe code, a plan reaches a backend only as a `CheckedPlan`, which only the checker makes.
//! Each file of `tests/compile_fail/` tries one way around that and must be refused by the
//! compiler with the error its `.stderr` holds.

#[test]
fn an_unchecked_plan_cannot_reach_a_backend_from_safe_code() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/compile_fail/*.rs");
}
