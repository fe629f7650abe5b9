//! Whole-process totals of the job's processes: CPU time of all threads and bytes read from
//! storage, on the slow tier.

use std::fs::File;
use std::path::{Path, PathBuf};

use stallscope_analysis::series::{names, SeriesId, SeriesKind};

use super::{open_failed, sync, unparsed, Failure};
use crate::sources::text::{lines, parse_u64, stat_fields};
use crate::sources::{pread_all, Registry, Roots, Source, SourceError, Tier, Watched};

/// Whole-process totals of the watched processes: `/proc/PID/stat` utime+stime and
/// `/proc/PID/io` read_bytes.
///
/// `read_bytes` is read at every call: the attribution reads it over a loader's waits. The CPU
/// total of a loader worker too (`stallscope experiment` and the advisor take the loaders'
/// CPU from its last value); that of the other processes (the loops, the launchers) every
/// [`OTHERS_CPU_EVERY`] calls: only the node's one-second readings and the advisor's CPU per
/// iteration (a rate) read it, and a whole-process `stat` of a loop walks its every thread
/// (a training's dozens of intra-op and autograd threads): a fifth of the sampler's CPU at
/// every call.
pub struct ProcessTotalsSource {
    proc_root: PathBuf,
    procs: Vec<Totals>,
    buf: Vec<u8>,
    token: u64,
    /// ns per clock tick (`sysconf(_SC_CLK_TCK)`), to convert utime and stime.
    ns_per_tick: u64,
    /// Calls so far.
    calls: u64,
}

/// Calls of [`ProcessTotalsSource`] per read of the CPU total of a process that is not a
/// loader worker: every 500 ms on the slow tier.
pub const OTHERS_CPU_EVERY: u64 = 5;

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
            calls: 0,
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
            |_| true,
            |pid| Self::open(proc_root, pid),
        )?;
        if self.token != out.token() {
            self.token = out.token();
            self.procs.iter_mut().for_each(|p| p.ids = None);
        }
        let (buf, ns_per_tick) = (&mut self.buf, self.ns_per_tick);
        let others_due = self.calls % OTHERS_CPU_EVERY == 0;
        self.calls += 1;
        self.procs.retain_mut(|p| {
            let first = p.ids.is_none();
            let cpu_due = first || others_due || watched.is_worker(p.pid);
            let cpu_ticks = match cpu_due.then(|| read_cpu_ticks(&p.stat, buf)) {
                None => None,
                Some(Ok(ticks)) => Some(ticks),
                Some(Err(Failure::Gone)) => return false,
                Some(Err(Failure::Other(e))) => {
                    failure.get_or_insert(e.with_path(proc_root.join(format!("{}/stat", p.pid))));
                    return false;
                }
            };
            let read_bytes = match p.io.as_ref().map(|f| read_io_bytes(f, buf)) {
                Some(Ok(bytes)) => Some(bytes),
                Some(Err(Failure::Gone)) => return false,
                Some(Err(Failure::Other(_))) => {
                    p.io = None;
                    None
                }
                None => None,
            };
            let ids = *p.ids.get_or_insert_with(|| declare_totals(out, p.pid));
            if let Some(ticks) = cpu_ticks {
                out.push(ids[0], ticks * ns_per_tick);
            }
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

/// utime + stime of a whole-process `stat`, clock ticks.
fn read_cpu_ticks(file: &File, buf: &mut Vec<u8>) -> Result<u64, Failure> {
    let bytes = pread_all(file, buf)?;
    stat_cpu_ticks(bytes).ok_or_else(|| unparsed("no utime and stime", bytes))
}

/// `read_bytes` of an `io` file, bytes.
fn read_io_bytes(file: &File, buf: &mut Vec<u8>) -> Result<u64, Failure> {
    let bytes = pread_all(file, buf)?;
    io_read_bytes(bytes).ok_or_else(|| unparsed("no read_bytes", bytes))
}

/// utime + stime of a `stat` line (fields 14 and 15), clock ticks.
fn stat_cpu_ticks(bytes: &[u8]) -> Option<u64> {
    // Field 3 (the state) is the first after the comm.
    let (_, mut fields) = stat_fields(bytes)?;
    let utime = parse_u64(fields.nth(14 - 3)?)?;
    let stime = parse_u64(fields.next()?)?;
    Some(utime + stime)
}

/// `read_bytes` of an `io` file (`read_bytes: N` on a line of its own), bytes.
fn io_read_bytes(bytes: &[u8]) -> Option<u64> {
    lines(bytes)
        .find_map(|line| line.strip_prefix(b"read_bytes:"))
        .and_then(|n| parse_u64(n.trim_ascii()))
}

#[cfg(test)]
mod tests {
    use stallscope_analysis::series::names;

    use super::super::watched;
    use super::*;
    use crate::sources::fake::{testdata, FakeRoots, Round};

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

    /// The loop's CPU total is read every fifth call (its `stat` walks all its threads); the
    /// loader worker's, which `experiment` takes at its last value, and every process's
    /// storage reads, which the attribution reads over a wait, at every call.
    #[test]
    fn a_loops_cpu_total_is_read_every_fifth_call_a_workers_and_the_reads_at_every_one() {
        let fake = FakeRoots::new();
        for pid in [6971, 7000] {
            fake.proc(&format!("{pid}/stat"), "dd_stat.txt");
            fake.proc(&format!("{pid}/io"), "dd_io.txt");
        }
        let job = Watched {
            pids: vec![6971, 7000],
            launchers: Vec::new(),
            loops: vec![6971],
        };
        let mut source = ProcessTotalsSource::new(&fake.roots);
        let mut reg = Registry::default();
        let (the_loop, worker) = (("pid", "6971"), ("pid", "7000"));
        let mut loop_cpu_reads = Vec::new();
        for call in 0..11 {
            source.sample(&job, &mut reg).unwrap();
            let round = Round::take(&mut reg);
            if round.get(names::PROC_ALL_CPU_NS, the_loop).is_some() {
                loop_cpu_reads.push(call);
            }
            assert!(round.get(names::PROC_ALL_CPU_NS, worker).is_some());
            assert_eq!(round.get(names::PROC_READ_BYTES, the_loop), Some(90_112));
            assert_eq!(round.get(names::PROC_READ_BYTES, worker), Some(90_112));
        }
        assert_eq!(loop_cpu_reads, [0, 5, 10]);
    }

    #[test]
    fn utime_stime_and_read_bytes_are_found() {
        assert_eq!(stat_cpu_ticks(&testdata("dd_stat.txt")), Some(32 + 117));
        assert_eq!(
            stat_cpu_ticks(b"42 (a) b) S 1 2 3 4 5 6 7 8 9 10 11 12"),
            Some(11 + 12)
        );
        assert_eq!(stat_cpu_ticks(b"42 (a) S 1 2 3"), None);
        assert_eq!(io_read_bytes(&testdata("dd_io.txt")), Some(90_112));
        assert_eq!(io_read_bytes(b"rchar: 1\n"), None);
    }
}
