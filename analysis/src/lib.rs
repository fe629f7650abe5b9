//! The domain of stallscope, pure and free of I/O.
//!
//! Everything that decides *what a number means* lives here, so that the live path (agent,
//! collector) and the replay path (`stallscope summary` reading a profile) run the very same
//! code: the data model ([`series`], [`marker`], [`frame`]), the node timeline that derives
//! rates from raw counters ([`timeline`]), per-iteration attribution ([`attribution`]), what each rank's GPU did ([`gpu_usage`]), and the
//! job summary with its one-sentence finding ([`summary`], [`finding`]), folded from running
//! aggregates ([`aggregate`]) so a long job's memory stays bounded.
//!
//! Time is `CLOCK_MONOTONIC` nanoseconds of the node ([`Nanos`]); Python's
//! `time.monotonic_ns()` reads the same clock, so markers and samples need no alignment.

pub mod advisor;
pub mod aggregate;
pub mod attribution;
pub mod category;
pub mod clock;
pub mod collectives;
pub mod critical;
pub mod crossnode;
pub mod experiment;
pub mod fast_hash;
pub mod figures;
pub mod finding;
pub mod flows;
pub mod frame;
pub mod gpu_usage;
pub mod hang;
pub mod iteration_pack;
pub mod job;
pub mod journal;
pub mod loops;
pub mod marker;
pub mod parallelism;
pub mod process;
pub mod rank_table;
pub mod report;
pub mod resources;
pub mod run_facts;
pub mod sample_run;
pub mod series;
pub mod slowdown;
pub mod summary;
pub mod timeline;
pub mod trace;
pub mod view;
pub mod wire;

/// Nanoseconds on the node's `CLOCK_MONOTONIC`.
pub type Nanos = u64;

/// Nanoseconds per second.
pub const NS_PER_SEC: u64 = 1_000_000_000;

/// Seconds as `f64` from nanoseconds.
pub fn secs(ns: u64) -> f64 {
    ns as f64 / NS_PER_SEC as f64
}
