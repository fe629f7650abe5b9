//! Main threads of the job's ranks and loaders: CPU, run-queue delay and I/O blocking.
//!
//! CPU time comes from `schedstat` (ns, and run-queue delay beside it) because `stat`'s
//! utime/stime advance in 10 ms clock ticks; `stat` still gives the state, to see a thread
//! blocked in I/O. A read of `stat` costs about three of `schedstat` (the kernel formats some
//! 50 fields), so it is skipped when its answer is already known: a thread that was not in
//! state D when last read, and has neither run nor been scheduled since (the same
//! `schedstat`), cannot have blocked since, as only the thread itself, running, can put itself
//! to sleep.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use stallscope_analysis::series::{names, SeriesId, SeriesKind};

use super::{open_failed, sync, unparsed, Failure};
use crate::sources::text::{fields, parse_u64};
use crate::sources::{pread_all, Registry, Roots, Source, SourceError, Tier, Watched};

/// Main threads of the watched processes: `schedstat` and `stat` of `/proc/PID/task/PID`.
pub struct ProcessSource {
    proc_root: PathBuf,
    /// Whether this instance reads the launchers (slow tier) or every other process (fast).
    launchers: bool,
    threads: Vec<MainThread>,
    buf: Vec<u8>,
    token: u64,
    /// Rounds read so far; the state is read every `state_every` rounds.
    rounds: u64,
    /// [`STATE_EVERY`] on the fast tier, 1 on the slow one.
    state_every: u64,
    /// Said after what it reads (why the eBPF thread states are not used).
    note: Option<String>,
}

/// The thread state (for I/O blocking) is read every this many fast rounds: 50 Hz at the
/// default 100 Hz is plenty for a share of time in state D, and `stat` is the costlier file.
pub const STATE_EVERY: u64 = 2;

struct MainThread {
    pid: u32,
    schedstat: File,
    stat: File,
    /// cpu, runq, blocked; valid for the registry of `ProcessSource::token`.
    ids: Option<[SeriesId; 3]>,
    /// The last state read and the `schedstat` read just before it; `None` before the first.
    last_state: Option<LastState>,
}

/// What the last read of a thread's state found.
#[derive(Clone, Copy)]
struct LastState {
    /// Whether it was in state D.
    blocked: bool,
    /// ns on the CPU, from the `schedstat` read just before.
    cpu_ns: u64,
    /// Times scheduled in, from the same `schedstat`.
    scheduled: u64,
}

/// A parsed `schedstat` line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Schedstat {
    /// ns on the CPU (`sum_exec_runtime`).
    pub(crate) cpu_ns: u64,
    /// ns waiting on a run queue (`run_delay`).
    pub(crate) runq_ns: u64,
    /// Times scheduled in (`pcount`); 0 throughout on a kernel that keeps no scheduler info.
    pub(crate) scheduled: u64,
}

impl LastState {
    /// Whether the thread is still known not to be in state D without reading `stat`: it was
    /// not, and it has not been on a CPU since (a kernel without scheduler info always says 0
    /// times scheduled, so then this is never known).
    fn still_not_blocked(&self, now: &Schedstat) -> bool {
        !self.blocked
            && now.scheduled > 0
            && now.scheduled == self.scheduled
            && now.cpu_ns == self.cpu_ns
    }
}

impl ProcessSource {
    /// Reads the main threads of the job's processes but its launchers, every tick, below
    /// `roots.proc`.
    pub fn new(roots: &Roots) -> Self {
        ProcessSource {
            proc_root: roots.proc.clone(),
            launchers: false,
            threads: Vec::new(),
            buf: Vec::new(),
            token: 0,
            rounds: 0,
            state_every: STATE_EVERY,
            note: None,
        }
    }

    /// The same, saying `note` after what it reads when it comes up.
    pub fn noting(self, note: String) -> Self {
        ProcessSource {
            note: Some(note),
            ..self
        }
    }

    /// Reads the main threads of the launchers only, on the slow tier.
    pub fn launchers(roots: &Roots) -> Self {
        ProcessSource {
            launchers: true,
            state_every: 1,
            ..Self::new(roots)
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
            last_state: None,
        }))
    }
}

impl Source for ProcessSource {
    fn name(&self) -> &'static str {
        if self.launchers {
            "process_launchers"
        } else {
            "process"
        }
    }

    fn tier(&self) -> Tier {
        if self.launchers {
            Tier::Slow
        } else {
            Tier::Fast
        }
    }

    fn describe(&self) -> String {
        let whose = if self.launchers {
            "launchers' main-thread"
        } else {
            "main-thread"
        };
        let mut what = format!(
            "{whose} CPU, run-queue delay and I/O blocking from {}/PID/task/PID/{{schedstat,stat}}",
            self.proc_root.display()
        );
        if let Some(note) = &self.note {
            what.push_str(&format!(" ({note})"));
        }
        what
    }

    fn sample(&mut self, watched: &Watched, out: &mut Registry) -> Result<(), SourceError> {
        let proc_root = &self.proc_root;
        let launchers = self.launchers;
        let mut failure = sync(
            &mut self.threads,
            |t| t.pid,
            watched,
            |pid| watched.is_launcher(pid) == launchers,
            |pid| Self::open(proc_root, pid),
        )?;
        if self.token != out.token() {
            self.token = out.token();
            self.threads.iter_mut().for_each(|t| t.ids = None);
        }
        let buf = &mut self.buf;
        let with_state = self.rounds % self.state_every == 0;
        self.rounds += 1;
        self.threads.retain_mut(|t| {
            let (sched, blocked) = match read_main_thread(t, buf, with_state) {
                Ok(v) => v,
                Err((Failure::Gone, _)) => return false,
                Err((Failure::Other(e), file)) => {
                    let task = format!("{}/task/{}/{file}", t.pid, t.pid);
                    failure.get_or_insert(e.with_path(proc_root.join(task)));
                    return false;
                }
            };
            let ids = *t.ids.get_or_insert_with(|| declare_main(out, t.pid));
            out.push(ids[0], sched.cpu_ns);
            out.push(ids[1], sched.runq_ns);
            if let Some(blocked) = blocked {
                out.push(ids[2], u64::from(blocked));
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

/// Schedstat and, `with_state`, whether the thread is in state D (from `stat`, unless
/// [`LastState::still_not_blocked`]), or why not and from which file.
fn read_main_thread(
    t: &mut MainThread,
    buf: &mut Vec<u8>,
    with_state: bool,
) -> Result<(Schedstat, Option<bool>), (Failure, &'static str)> {
    let bytes = pread_all(&t.schedstat, buf).map_err(|e| (Failure::from(e), "schedstat"))?;
    let sched =
        parse_schedstat(bytes).ok_or_else(|| (unparsed("schedstat", bytes), "schedstat"))?;
    if !with_state {
        return Ok((sched, None));
    }
    if t.last_state
        .is_some_and(|last| last.still_not_blocked(&sched))
    {
        return Ok((sched, Some(false)));
    }
    let bytes = pread_all(&t.stat, buf).map_err(|e| (Failure::from(e), "stat"))?;
    let state = stat_state(bytes).ok_or_else(|| (unparsed("no state", bytes), "stat"))?;
    let blocked = state == 'D';
    t.last_state = Some(LastState {
        blocked,
        cpu_ns: sched.cpu_ns,
        scheduled: sched.scheduled,
    });
    Ok((sched, Some(blocked)))
}

/// `schedstat`: three decimal numbers separated by spaces, then a newline.
pub(crate) fn parse_schedstat(bytes: &[u8]) -> Option<Schedstat> {
    let mut fields = fields(bytes);
    let mut next = || parse_u64(fields.next()?);
    let sched = Schedstat {
        cpu_ns: next()?,
        runq_ns: next()?,
        scheduled: next()?,
    };
    fields.next().is_none().then_some(sched)
}

/// The state letter of a `stat` line: field 3, after the parenthesised `comm` (which may
/// itself hold `)` and spaces, hence the last `)`). The hot path needs only this field.
pub(crate) fn stat_state(bytes: &[u8]) -> Option<char> {
    let close = bytes.iter().rposition(|b| *b == b')')?;
    match bytes.get(close + 1..close + 3) {
        Some([b' ', s]) if s.is_ascii_alphabetic() => Some(*s as char),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use stallscope_analysis::series::names;

    use super::super::watched;
    use super::*;
    use crate::sources::fake::{testdata, FakeRoots, Round};

    /// dd (running, pid 6971) and a vfork parent (state D, pid 6885), main threads only.
    fn fake_main_threads() -> FakeRoots {
        let fake = FakeRoots::new();
        fake.proc("6971/task/6971/schedstat", "dd_schedstat.txt");
        fake.proc("6971/task/6971/stat", "dd_stat.txt");
        fake.proc("6885/task/6885/schedstat", "d_state_schedstat.txt");
        fake.proc("6885/task/6885/stat", "d_state_stat.txt");
        fake
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
    fn stat_is_read_again_only_when_the_thread_may_have_blocked() {
        let fake = fake_main_threads();
        let dd = ("pid", "6971");
        let mut source = ProcessSource::new(&fake.roots);
        let mut reg = Registry::default();
        let mut blocked_after = |source: &mut ProcessSource, rounds: u64| {
            for _ in 0..rounds {
                source.sample(&watched(&[6971]), &mut reg).unwrap();
            }
            Round::take(&mut reg).get(names::PROC_BLOCKED_IO, dd)
        };
        assert_eq!(blocked_after(&mut source, 1), Some(0), "state R read");
        // A D in stat now could only be reached by running, which schedstat would show: while
        // schedstat stands still, the thread is still not blocked and stat is not read.
        let d_state = testdata("d_state_stat.txt");
        fake.write(&fake.roots.proc, "6971/task/6971/stat", &d_state);
        assert_eq!(blocked_after(&mut source, STATE_EVERY), Some(0));
        let ran = b"1507065999 71378 8\n";
        fake.write(&fake.roots.proc, "6971/task/6971/schedstat", ran);
        assert_eq!(
            blocked_after(&mut source, STATE_EVERY),
            Some(1),
            "ran, so read"
        );
        // Once blocked, stat is read every time: a woken thread may not have run yet.
        fake.proc("6971/task/6971/stat", "dd_stat.txt");
        assert_eq!(blocked_after(&mut source, STATE_EVERY), Some(0));

        // A kernel without scheduler info says "0 0 0" forever: stat is always read.
        let fake = fake_main_threads();
        fake.write(&fake.roots.proc, "6971/task/6971/schedstat", b"0 0 0\n");
        let mut source = ProcessSource::new(&fake.roots);
        assert_eq!(blocked_after(&mut source, 1), Some(0));
        fake.write(&fake.roots.proc, "6971/task/6971/stat", &d_state);
        assert_eq!(blocked_after(&mut source, STATE_EVERY), Some(1));
    }

    #[test]
    fn launchers_are_read_by_the_slow_instance_only() {
        let fake = fake_main_threads();
        let mut job = watched(&[6971, 6885]);
        job.launchers = vec![6885];
        let mut fast = ProcessSource::new(&fake.roots);
        let mut slow = ProcessSource::launchers(&fake.roots);
        assert_eq!((fast.tier(), slow.tier()), (Tier::Fast, Tier::Slow));
        let mut reg = Registry::default();
        fast.sample(&job, &mut reg).unwrap();
        let round = Round::take(&mut reg);
        assert!(round.get(names::PROC_CPU_NS, ("pid", "6971")).is_some());
        assert_eq!(round.get(names::PROC_CPU_NS, ("pid", "6885")), None);
        slow.sample(&job, &mut reg).unwrap();
        let round = Round::take(&mut reg);
        assert_eq!(round.get(names::PROC_CPU_NS, ("pid", "6971")), None);
        assert_eq!(round.get(names::PROC_BLOCKED_IO, ("pid", "6885")), Some(1));
        // Until a loop is known there are no launchers: the fast instance reads everyone.
        fast.sample(&watched(&[6971, 6885]), &mut reg).unwrap();
        let round = Round::take(&mut reg);
        assert!(round.get(names::PROC_CPU_NS, ("pid", "6885")).is_some());
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
    fn schedstat_is_three_numbers() {
        let sched = parse_schedstat(&testdata("dd_schedstat.txt")).unwrap();
        assert_eq!(
            sched,
            Schedstat {
                cpu_ns: 1_507_065_413,
                runq_ns: 71_378,
                scheduled: 7
            }
        );
        assert_eq!(parse_schedstat(b"1 2\n"), None);
        assert_eq!(parse_schedstat(b"1 2 3 4\n"), None);
        assert_eq!(parse_schedstat(b"1 -2 3\n"), None);
    }
}
