//! Helpers shared by the analysis crate's integration tests.

pub mod fuzzing;
