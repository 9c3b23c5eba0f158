//! The trainer's tiny runs and helpers (`crates/trainer/tests/common`), shared rather than copied.
// Each test file uses its own part of these helpers.
#![allow(dead_code)]

#[path = "../../../trainer/tests/common/mod.rs"]
mod trainer;

pub use trainer::*;
