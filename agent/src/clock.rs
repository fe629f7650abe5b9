//! The node clock (`CLOCK_MONOTONIC`), read in one place: `stallscope_analysis::clock`.

pub use stallscope_analysis::clock::monotonic_ns;
