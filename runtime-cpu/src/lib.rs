//! The CPU backend for the MEMO runtime.
//!
//! Not built yet: a placeholder in the workspace layout of `DESIGN.md` that exports nothing.
//! Nothing depends on it yet.
#![forbid(unsafe_code)]
