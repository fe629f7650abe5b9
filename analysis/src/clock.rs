//! The node clock: `CLOCK_MONOTONIC`, the clock Python's `time.monotonic_ns()` reads, so a
//! marker's time and a sample's need no alignment on one node. The one reading of it that the
//! agent, the collector and the binary share.

use crate::Nanos;

/// ns on `CLOCK_MONOTONIC` now.
pub fn monotonic_ns() -> Nanos {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `t` moved by `by` ns, saturating at 0 (an agent's injected clock offset, in tests).
pub fn shift(t: Nanos, by: i64) -> Nanos {
    t.saturating_add_signed(by)
}
