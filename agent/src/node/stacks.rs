//! Fetches the Python stacks of hung training loops from the PyTorch hook, without ptrace.
//!
//! A loop with the hook registered `faulthandler` for a real-time signal and said where it
//! dumps (meta `stacks=<path> stacks_signal=<n>`, see `stallscope/_stacks.py`). Here each such
//! loop is sent its signal, by pid; what its file grew by within [`STACKS_WAIT`] is its
//! stacks. Only processes that said so are signalled: a real-time signal nobody handles
//! terminates a process.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use stallscope_analysis::hang::{self, NodeHang, RankAtHang};
use stallscope_analysis::job::JobTimeline;
use stallscope_analysis::loops::MarkerLog;

/// How long the dumps are waited for, at most.
pub const STACKS_WAIT: Duration = Duration::from_secs(1);
/// bytes of one rank's stacks kept, at most.
pub const STACKS_MAX_BYTES: u64 = 64 * 1024;
/// bytes of all of a node's stacks sent to the collector at most (a message holds 1 MiB):
/// ranks beyond are named without theirs.
pub const NODE_STACKS_MAX_BYTES: usize = 512 * 1024;
/// How long a dump file must stop growing to count as written.
const SETTLED: Duration = Duration::from_millis(100);

/// One loop asked: its rank and dump file.
struct Asked {
    rank: u32,
    path: PathBuf,
    /// bytes of the file before the signal.
    from: u64,
}

/// Every hooked rank's stacks, by rank (as text); ranks whose dump did not come are left out.
pub fn fetch(markers: &MarkerLog, ranks: &[RankAtHang]) -> BTreeMap<String, String> {
    let asked: Vec<Asked> = ranks.iter().filter_map(|r| ask(markers, r)).collect();
    let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
    let start = Instant::now();
    let mut last_sizes: Vec<u64> = asked.iter().map(|a| a.from).collect();
    let mut last_change = Instant::now();
    while start.elapsed() < STACKS_WAIT {
        std::thread::sleep(Duration::from_millis(20));
        let sizes: Vec<u64> = asked.iter().map(|a| size(&a.path)).collect();
        if sizes != last_sizes {
            last_sizes = sizes;
            last_change = Instant::now();
            continue;
        }
        let all_grew = asked.iter().zip(&last_sizes).all(|(a, s)| *s > a.from);
        if all_grew && last_change.elapsed() >= SETTLED {
            break;
        }
    }
    asked
        .iter()
        .filter_map(|a| Some((a.rank.to_string(), read_from(&a.path, a.from)?)))
        .collect()
}

/// This node's answer to the collector's request `id` (the job stalls): where each live loop
/// stands, the groups they described, and their stacks (fetched now, holding the caller up to
/// [`STACKS_WAIT`]).
pub fn node_answer(job: &JobTimeline, id: u64) -> NodeHang {
    let markers = &job.node.markers;
    let mut ranks = hang::ranks_at(markers, &job.node.exited);
    let mut stacks = fetch(markers, &ranks);
    hang::refine_by_stacks(&mut ranks, &stacks);
    let mut total = 0;
    stacks.retain(|_, text| {
        total += text.len();
        total <= NODE_STACKS_MAX_BYTES
    });
    let (groups, world_size) = hang::groups_said(markers);
    NodeHang {
        node: String::new(),
        id,
        ranks,
        groups,
        world_size,
        stacks,
    }
}

/// Signals rank `r`'s loop when its hook said where it dumps; `None` when it did not, or
/// the signal could not be sent.
fn ask(markers: &MarkerLog, r: &RankAtHang) -> Option<Asked> {
    let meta = &markers.procs.get(&r.pid)?.meta;
    let path = PathBuf::from(meta.get("stacks")?);
    let name = path.file_name()?.to_str()?;
    if !(name.starts_with("stacks.") && name.ends_with(".txt")) {
        return None; // only the hook's own files are read
    }
    let signal: i32 = meta.get("stacks_signal")?.parse().ok()?;
    if !(libc::SIGRTMIN()..=libc::SIGRTMAX()).contains(&signal) {
        return None;
    }
    let from = std::fs::metadata(&path).ok()?.len();
    let pid = i32::try_from(r.pid).ok()?;
    if !catches(r.pid, signal) {
        // The handler is gone: Python unregisters faulthandler's signals when it shuts down,
        // and the default action of a real-time signal would end the process.
        return None;
    }
    // SAFETY: kill(2) has no memory effects; the pid is a live loop that registered a handler.
    (unsafe { libc::kill(pid, signal) } == 0).then_some(Asked {
        rank: r.rank,
        path,
        from,
    })
}

/// Whether process `pid` has a handler for `signal` now: bit `signal - 1` of the `SigCgt`
/// mask in `/proc/PID/status` (hex). Unknown (no such process, unreadable) is `false`.
fn catches(pid: u32, signal: i32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| (1..=64).contains(&signal) && mask & (1 << (signal - 1)) != 0)
}

/// What `path` holds past `from`, at most [`STACKS_MAX_BYTES`]; `None` when nothing.
fn read_from(path: &Path, from: u64) -> Option<String> {
    let mut file = std::fs::File::open(path).ok()?;
    file.seek(SeekFrom::Start(from)).ok()?;
    let mut bytes = Vec::new();
    file.take(STACKS_MAX_BYTES).read_to_end(&mut bytes).ok()?;
    (!bytes.is_empty()).then(|| String::from_utf8_lossy(&bytes).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_signalled_only_while_it_catches_the_signal() {
        let me = std::process::id();
        let signal = libc::SIGRTMIN() + 5;
        // Nothing in the test harness handles this real-time signal: sending it would end us.
        assert!(!catches(me, signal));
        extern "C" fn nothing(_: libc::c_int) {}
        // SAFETY: installs a handler that does nothing, for a signal nothing else uses here.
        let old = unsafe { libc::signal(signal, nothing as *const () as libc::sighandler_t) };
        assert!(catches(me, signal));
        // SAFETY: puts back what was there.
        unsafe { libc::signal(signal, old) };
        assert!(!catches(me, signal));
        assert!(!catches(u32::MAX, signal), "no such process");
    }
}
