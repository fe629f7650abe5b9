//! The job's processes, as the attribution needs them.
//!
//! Every tick, only the main thread (tid == pid) of each watched process: it runs the training
//! loop (or the loader worker's loop), and reading every thread at 100 Hz would cost more than
//! the rest of the agent. CPU time comes from `schedstat` (ns, and run-queue delay beside it)
//! because `stat`'s utime/stime advance in 10 ms clock ticks; `stat` still gives the state, to
//! see a thread blocked in I/O. The files stay open and are re-read from offset 0, since an
//! open and close per tick would cost more than the read.
//!
//! Slowly, whole-process totals: CPU time of all threads (live and exited) and bytes read from
//! storage. A process that ends is forgotten without a word: in a job, processes end all the
//! time, and that is not a failure of the source.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use procfs_core::process::{Io, Schedstat, Stat};
use procfs_core::FromRead;
use stallscope_analysis::series::{names, SeriesId, SeriesKind};

use super::{is_gone, pread_all, Registry, Roots, Source, SourceError, Tier, Watched};

/// Main threads of the watched processes: `schedstat` and `stat` of `/proc/PID/task/PID`.
pub struct ProcessSource {
    proc_root: PathBuf,
    threads: Vec<MainThread>,
    buf: Vec<u8>,
    token: u64,
    /// Rounds read so far; the state is read every [`STATE_EVERY`] rounds.
    rounds: u64,
}

/// The thread state (for I/O blocking) is read every this many rounds: 50 Hz at the default
/// 100 Hz is plenty for a share of time in state D, and `stat` is the costlier file.
pub const STATE_EVERY: u64 = 2;

struct MainThread {
    pid: u32,
    schedstat: File,
    stat: File,
    /// cpu, runq, blocked; valid for the registry of `ProcessSource::token`.
    ids: Option<[SeriesId; 3]>,
}

impl ProcessSource {
    /// Reads below `roots.proc`.
    pub fn new(roots: &Roots) -> Self {
        ProcessSource {
            proc_root: roots.proc.clone(),
            threads: Vec::new(),
            buf: Vec::new(),
            token: 0,
            rounds: 0,
        }
    }

    fn open(proc_root: &Path, pid: u32) -> Result<Option<MainThread>, SourceError> {
        let task = proc_root
            .join(pid.to_string())
            .join("task")
            .join(pid.to_string());
        let schedstat = match File::open(task.join("schedstat")) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound && task.is_dir() => {
                return Err(SourceError::Unsupported(format!(
                    "no per-task schedstat: {} missing (kernel without CONFIG_SCHED_INFO)",
                    task.join("schedstat").display()
                )))
            }
            Err(e) => return open_failed(task.join("schedstat"), e),
        };
        let stat = match File::open(task.join("stat")) {
            Ok(f) => f,
            Err(e) => return open_failed(task.join("stat"), e),
        };
        Ok(Some(MainThread {
            pid,
            schedstat,
            stat,
            ids: None,
        }))
    }
}

impl Source for ProcessSource {
    fn name(&self) -> &'static str {
        "process"
    }

    fn tier(&self) -> Tier {
        Tier::Fast
    }

    fn describe(&self) -> String {
        format!(
            "main-thread CPU, run-queue delay and I/O blocking from {}/PID/task/PID/{{schedstat,stat}}",
            self.proc_root.display()
        )
    }

    fn sample(&mut self, watched: &Watched, out: &mut Registry) -> Result<(), SourceError> {
        let proc_root = &self.proc_root;
        let mut failure = sync(
            &mut self.threads,
            |t| t.pid,
            watched,
            |pid| Self::open(proc_root, pid),
        )?;
        if self.token != out.token() {
            self.token = out.token();
            self.threads.iter_mut().for_each(|t| t.ids = None);
        }
        let buf = &mut self.buf;
        let with_state = self.rounds % STATE_EVERY == 0;
        self.rounds += 1;
        self.threads.retain_mut(|t| {
            let (sched, state) = match read_main_thread(t, buf, with_state) {
                Ok(v) => v,
                Err((Failure::Gone, _)) => return false,
                Err((Failure::Other(e), file)) => {
                    let task = format!("{}/task/{}/{file}", t.pid, t.pid);
                    failure.get_or_insert(e.with_path(proc_root.join(task)));
                    return false;
                }
            };
            let ids = *t.ids.get_or_insert_with(|| declare_main(out, t.pid));
            out.push(ids[0], sched.sum_exec_runtime);
            out.push(ids[1], sched.run_delay);
            if let Some(state) = state {
                out.push(ids[2], u64::from(state == 'D'));
            }
            true
        });
        match failure {
            Some(e) if self.threads.is_empty() => Err(e),
            _ => Ok(()),
        }
    }
}

fn declare_main(out: &mut Registry, pid: u32) -> [SeriesId; 3] {
    let pid = pid.to_string();
    let labels = [("pid", pid.as_str())];
    [
        out.series(names::PROC_CPU_NS, "ns", SeriesKind::Counter, &labels),
        out.series(names::PROC_RUNQ_NS, "ns", SeriesKind::Counter, &labels),
        out.series(
            names::PROC_BLOCKED_IO,
            "threads",
            SeriesKind::Gauge,
            &labels,
        ),
    ]
}

/// Schedstat (and, `with_state`, the state) of a main thread, or why not and from which file.
fn read_main_thread(
    t: &MainThread,
    buf: &mut Vec<u8>,
    with_state: bool,
) -> Result<(Schedstat, Option<char>), (Failure, &'static str)> {
    let sched = read_schedstat(&t.schedstat, buf).map_err(|e| (e, "schedstat"))?;
    if !with_state {
        return Ok((sched, None));
    }
    let bytes = pread_all(&t.stat, buf).map_err(|e| (Failure::from(e), "stat"))?;
    let state = stat_state(bytes).ok_or_else(|| {
        let line = String::from_utf8_lossy(&bytes[..bytes.len().min(80)]).into_owned();
        (
            Failure::Other(Unnamed::Parse(format!("no state in {line:?}"))),
            "stat",
        )
    })?;
    Ok((sched, Some(state)))
}

/// The state letter of a `stat` line: field 3, after the parenthesised `comm` (which may
/// itself hold `)` and spaces, hence the last `)`). The hot path needs only this field, and a
/// full `Stat` parse allocates and costs several times more.
fn stat_state(bytes: &[u8]) -> Option<char> {
    let close = bytes.iter().rposition(|b| *b == b')')?;
    match bytes.get(close + 1..close + 3) {
        Some([b' ', s]) if s.is_ascii_alphabetic() => Some(*s as char),
        _ => None,
    }
}

fn read_schedstat(file: &File, buf: &mut Vec<u8>) -> Result<Schedstat, Failure> {
    Ok(Schedstat::from_read(pread_all(file, buf)?)?)
}

/// Whole-process totals of the watched processes: `/proc/PID/stat` utime+stime and
/// `/proc/PID/io` read_bytes.
pub struct ProcessTotalsSource {
    proc_root: PathBuf,
    procs: Vec<Totals>,
    buf: Vec<u8>,
    token: u64,
    /// ns per clock tick (`sysconf(_SC_CLK_TCK)`), to convert utime and stime.
    ns_per_tick: u64,
}

struct Totals {
    pid: u32,
    stat: File,
    /// `None` when `io` cannot be read (another user's process without CAP_SYS_PTRACE).
    io: Option<File>,
    /// all cpu, read bytes; valid for the registry of `ProcessTotalsSource::token`.
    ids: Option<[SeriesId; 2]>,
}

impl ProcessTotalsSource {
    /// Reads below `roots.proc`.
    pub fn new(roots: &Roots) -> Self {
        // SAFETY: sysconf only reads a configuration value.
        let ticks_per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        let ticks_per_s = if ticks_per_s > 0 {
            ticks_per_s as u64
        } else {
            100
        };
        ProcessTotalsSource {
            proc_root: roots.proc.clone(),
            procs: Vec::new(),
            buf: Vec::new(),
            token: 0,
            ns_per_tick: 1_000_000_000 / ticks_per_s,
        }
    }

    fn open(proc_root: &Path, pid: u32) -> Result<Option<Totals>, SourceError> {
        let dir = proc_root.join(pid.to_string());
        let stat = match File::open(dir.join("stat")) {
            Ok(f) => f,
            Err(e) => return open_failed(dir.join("stat"), e),
        };
        Ok(Some(Totals {
            pid,
            stat,
            io: File::open(dir.join("io")).ok(),
            ids: None,
        }))
    }
}

impl Source for ProcessTotalsSource {
    fn name(&self) -> &'static str {
        "process_totals"
    }

    fn tier(&self) -> Tier {
        Tier::Slow
    }

    fn describe(&self) -> String {
        format!(
            "whole-process CPU and storage reads from {}/PID/{{stat,io}}",
            self.proc_root.display()
        )
    }

    fn sample(&mut self, watched: &Watched, out: &mut Registry) -> Result<(), SourceError> {
        let proc_root = &self.proc_root;
        let mut failure = sync(
            &mut self.procs,
            |p| p.pid,
            watched,
            |pid| Self::open(proc_root, pid),
        )?;
        if self.token != out.token() {
            self.token = out.token();
            self.procs.iter_mut().for_each(|p| p.ids = None);
        }
        let (buf, ns_per_tick) = (&mut self.buf, self.ns_per_tick);
        self.procs.retain_mut(|p| {
            let cpu_ticks = match read_stat(&p.stat, buf) {
                Ok(stat) => stat.utime + stat.stime,
                Err(Failure::Gone) => return false,
                Err(Failure::Other(e)) => {
                    failure.get_or_insert(e.with_path(proc_root.join(format!("{}/stat", p.pid))));
                    return false;
                }
            };
            let read_bytes = match p.io.as_ref().map(|f| read_io(f, buf)) {
                Some(Ok(io)) => Some(io.read_bytes),
                Some(Err(Failure::Gone)) => return false,
                Some(Err(Failure::Other(_))) => {
                    p.io = None;
                    None
                }
                None => None,
            };
            let ids = *p.ids.get_or_insert_with(|| declare_totals(out, p.pid));
            out.push(ids[0], cpu_ticks * ns_per_tick);
            if let Some(bytes) = read_bytes {
                out.push(ids[1], bytes);
            }
            true
        });
        match failure {
            Some(e) if self.procs.is_empty() => Err(e),
            _ => Ok(()),
        }
    }
}

fn declare_totals(out: &mut Registry, pid: u32) -> [SeriesId; 2] {
    let pid = pid.to_string();
    let labels = [("pid", pid.as_str())];
    [
        out.series(names::PROC_ALL_CPU_NS, "ns", SeriesKind::Counter, &labels),
        out.series(
            names::PROC_READ_BYTES,
            "bytes",
            SeriesKind::Counter,
            &labels,
        ),
    ]
}

fn read_stat(file: &File, buf: &mut Vec<u8>) -> Result<Stat, Failure> {
    Ok(Stat::from_read(pread_all(file, buf)?)?)
}

fn read_io(file: &File, buf: &mut Vec<u8>) -> Result<Io, Failure> {
    Ok(Io::from_read(pread_all(file, buf)?)?)
}

/// Forgets entries whose pid is no longer watched and opens entries for newly watched pids.
/// Returns the first failure to open that was not the process going away (the round goes on
/// without that pid); `Unsupported` stops the round.
fn sync<T>(
    entries: &mut Vec<T>,
    pid_of: impl Fn(&T) -> u32,
    watched: &Watched,
    mut open: impl FnMut(u32) -> Result<Option<T>, SourceError>,
) -> Result<Option<SourceError>, SourceError> {
    entries.retain(|e| watched.pids.contains(&pid_of(e)));
    let mut failure = None;
    for &pid in &watched.pids {
        if entries.iter().any(|e| pid_of(e) == pid) {
            continue;
        }
        match open(pid) {
            Ok(Some(entry)) => entries.push(entry),
            Ok(None) => {}
            Err(e @ SourceError::Unsupported(_)) => return Err(e),
            Err(e) => {
                failure.get_or_insert(e);
            }
        }
    }
    Ok(failure)
}

fn open_failed<T>(path: PathBuf, e: io::Error) -> Result<Option<T>, SourceError> {
    if is_gone(&e) {
        Ok(None)
    } else {
        Err(SourceError::Io { path, source: e })
    }
}

/// Why reading one process failed: it went away, or something worth reporting.
enum Failure {
    Gone,
    Other(Unnamed),
}

/// A failure before its path is known (built only when reported).
enum Unnamed {
    Io(io::Error),
    Parse(String),
}

impl Unnamed {
    fn with_path(self, path: PathBuf) -> SourceError {
        match self {
            Unnamed::Io(source) => SourceError::Io { path, source },
            Unnamed::Parse(message) => SourceError::Parse { path, message },
        }
    }
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        if is_gone(&e) {
            Failure::Gone
        } else {
            Failure::Other(Unnamed::Io(e))
        }
    }
}

impl From<procfs_core::ProcError> for Failure {
    fn from(e: procfs_core::ProcError) -> Self {
        Failure::Other(Unnamed::Parse(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use stallscope_analysis::series::names;

    use super::*;
    use crate::sources::fake::{FakeRoots, Round};

    /// dd (running, pid 6971) and a vfork parent (state D, pid 6885), main threads only.
    fn fake_main_threads() -> FakeRoots {
        let fake = FakeRoots::new();
        fake.proc("6971/task/6971/schedstat", "dd_schedstat.txt");
        fake.proc("6971/task/6971/stat", "dd_stat.txt");
        fake.proc("6885/task/6885/schedstat", "d_state_schedstat.txt");
        fake.proc("6885/task/6885/stat", "d_state_stat.txt");
        fake
    }

    fn watched(pids: &[u32]) -> Watched {
        Watched {
            pids: pids.to_vec(),
        }
    }

    #[test]
    fn main_thread_cpu_runq_and_blocked_state() {
        let fake = fake_main_threads();
        let mut source = ProcessSource::new(&fake.roots);
        let mut reg = Registry::default();
        source.sample(&watched(&[6971, 6885]), &mut reg).unwrap();
        let round = Round::take(&mut reg);
        let dd = ("pid", "6971");
        assert_eq!(round.get(names::PROC_CPU_NS, dd), Some(1_507_065_413));
        assert_eq!(round.get(names::PROC_RUNQ_NS, dd), Some(71_378));
        assert_eq!(round.get(names::PROC_BLOCKED_IO, dd), Some(0));
        let vfork = ("pid", "6885");
        assert_eq!(round.get(names::PROC_CPU_NS, vfork), Some(915_448));
        assert_eq!(round.get(names::PROC_RUNQ_NS, vfork), Some(146_638));
        assert_eq!(round.get(names::PROC_BLOCKED_IO, vfork), Some(1));
        let cpu = round.decls.iter().find(|d| d.name == names::PROC_CPU_NS);
        assert_eq!(cpu.map(|d| d.unit.as_str()), Some("ns"));
    }

    #[test]
    fn open_files_are_reread_each_round() {
        let fake = fake_main_threads();
        let mut source = ProcessSource::new(&fake.roots);
        let mut reg = Registry::default();
        source.sample(&watched(&[6971]), &mut reg).unwrap();
        Round::take(&mut reg);
        // The same file, rewritten in place, as the kernel regenerates it.
        fake.write(
            &fake.roots.proc,
            "6971/task/6971/schedstat",
            b"1600000000 80000 9\n",
        );
        source.sample(&watched(&[6971]), &mut reg).unwrap();
        let round = Round::take(&mut reg);
        assert_eq!(
            round.get(names::PROC_CPU_NS, ("pid", "6971")),
            Some(1_600_000_000)
        );
        assert_eq!(round.decls.len(), 3, "series are declared once");
    }

    #[test]
    fn the_state_letter_is_found_after_a_comm_with_parentheses() {
        assert_eq!(stat_state(b"42 (python3) D 1 42 42 0"), Some('D'));
        assert_eq!(stat_state(b"42 (a) b) S 1 42"), Some('S'));
        assert_eq!(stat_state(b"42 (python3"), None);
    }

    #[test]
    fn vanished_pids_are_dropped_without_error() {
        let fake = fake_main_threads();
        let mut source = ProcessSource::new(&fake.roots);
        let mut reg = Registry::default();
        source
            .sample(&watched(&[6971, 6885, 4242]), &mut reg)
            .unwrap();
        let round = Round::take(&mut reg);
        assert_eq!(round.values.len(), 6);
        assert_eq!(round.get(names::PROC_CPU_NS, ("pid", "4242")), None);

        fs::remove_dir_all(fake.roots.proc.join("6885")).unwrap();
        source.sample(&watched(&[6971]), &mut reg).unwrap();
        let round = Round::take(&mut reg);
        assert_eq!(
            round.values.len(),
            2,
            "cpu and runq; the state comes every other round"
        );
        assert!(round.get(names::PROC_CPU_NS, ("pid", "6971")).is_some());
        assert_eq!(round.get(names::PROC_BLOCKED_IO, ("pid", "6971")), None);
        source.sample(&watched(&[6971]), &mut reg).unwrap();
        assert_eq!(Round::take(&mut reg).values.len(), 3);
    }

    #[test]
    fn task_without_schedstat_is_unsupported() {
        let fake = FakeRoots::new();
        fake.proc("6971/task/6971/stat", "dd_stat.txt");
        let mut source = ProcessSource::new(&fake.roots);
        let err = source
            .sample(&watched(&[6971]), &mut Registry::default())
            .unwrap_err();
        assert!(matches!(err, SourceError::Unsupported(_)), "{err}");
    }

    #[test]
    fn garbage_is_a_parse_error_naming_the_file() {
        let fake = FakeRoots::new();
        fake.write(&fake.roots.proc, "7/task/7/schedstat", b"not numbers\n");
        fake.proc("7/task/7/stat", "dd_stat.txt");
        let mut source = ProcessSource::new(&fake.roots);
        let err = source
            .sample(&watched(&[7]), &mut Registry::default())
            .unwrap_err();
        assert!(err.to_string().contains("7/task/7/schedstat"), "{err}");
    }

    #[test]
    fn totals_convert_clock_ticks_to_ns() {
        let fake = FakeRoots::new();
        fake.proc("6971/stat", "dd_stat.txt");
        fake.proc("6971/io", "dd_io.txt");
        fake.proc("6885/stat", "d_state_stat.txt");
        // 6885 has no io file: unreadable io skips that value only.
        let mut source = ProcessTotalsSource::new(&fake.roots);
        let mut reg = Registry::default();
        source
            .sample(&watched(&[6971, 6885, 4242]), &mut reg)
            .unwrap();
        let round = Round::take(&mut reg);
        // SAFETY: sysconf only reads a configuration value.
        let ticks_per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
        let dd = ("pid", "6971");
        // utime 32 + stime 117 ticks.
        assert_eq!(
            round.get(names::PROC_ALL_CPU_NS, dd),
            Some(149 * 1_000_000_000 / ticks_per_s)
        );
        assert_eq!(round.get(names::PROC_READ_BYTES, dd), Some(90_112));
        assert_eq!(round.get(names::PROC_ALL_CPU_NS, ("pid", "6885")), Some(0));
        assert_eq!(round.get(names::PROC_READ_BYTES, ("pid", "6885")), None);
    }
}
