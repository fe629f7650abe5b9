//! Whether perf events can be opened here: a probe for `stallscope doctor`.
//!
//! Hardware counters are often missing in VMs while software events work, and
//! `kernel.perf_event_paranoid` may forbid both for unprivileged users; perf is optional, so
//! the probe only says what works and why not.

use std::path::Path;

use perf_event::events::Software;
use perf_event::Builder;

/// Opens, enables and reads a software event (task-clock) on this process: what it read, or
/// why it could not, with the paranoid level found below `proc`.
pub fn probe_software_event(proc: &Path) -> Result<String, String> {
    let paranoid = std::fs::read_to_string(proc.join("sys/kernel/perf_event_paranoid"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    let attempt = || -> std::io::Result<u64> {
        let mut counter = Builder::new(Software::TASK_CLOCK).build()?;
        counter.enable()?;
        let mut x = 0u64;
        for i in 0..100_000u64 {
            x = std::hint::black_box(x.wrapping_add(i));
        }
        counter.disable()?;
        counter.read()
    };
    match attempt() {
        Ok(ns) => Ok(format!(
            "software events work (task-clock read {ns} ns; perf_event_paranoid = {paranoid})"
        )),
        Err(e) => Err(format!(
            "cannot open a software perf event: {e} (perf_event_paranoid = {paranoid})"
        )),
    }
}
