//! The MEMO runtime: the `Backend` trait, the plan interpreter and the GPT trainer loop.
//!
//! Not built yet: this crate is a placeholder in the workspace layout of `DESIGN.md` and exports
//! nothing, so nothing can depend on behaviour it does not have. The issue "The runtime and the
//! trainer, on the CPU reference backend" fills it.
#![forbid(unsafe_code)]
