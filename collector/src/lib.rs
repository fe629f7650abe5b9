//! The job side of stallscope: the profile file, and for multi-node jobs the ingest server
//! that agents stream to, their clock alignment, and the job task that joins the ranks'
//! iterations, writes the job profile and publishes live updates.

pub mod clock;
pub mod feed;
pub mod job;
pub mod metrics;
pub mod profile;
pub mod server;

/// ns, `CLOCK_MONOTONIC`: the collector's clock, which agents' clocks are mapped onto.
pub fn monotonic_ns() -> stallscope_analysis::Nanos {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
