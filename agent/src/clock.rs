//! The node clock (`CLOCK_MONOTONIC`), read in one place: `stallscope_analysis::clock`; and
//! the calling thread's CPU, which the sources' cost benches and tests measure themselves by.

pub use stallscope_analysis::clock::monotonic_ns;

/// ns of CPU the calling thread has used so far: in user space, in the kernel
/// (`getrusage(RUSAGE_THREAD)`).
pub fn thread_cpu_ns() -> (u64, u64) {
    // SAFETY: a zeroed rusage is valid for the call to fill.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid rusage pointer.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1_000;
    (ns(ru.ru_utime), ns(ru.ru_stime))
}
