//! The job's thread states from the kernel's scheduler events (eBPF), in place of polling
//! `/proc` 100 times a second.
//!
//! Why: at 100 Hz the polling sources cost ~1.5% of a core on the issue-31 job, and almost
//! all of it is the wake-up itself (a thread waking cold every 10 ms beside a training that
//! fills the caches), not the reads. Here the kernel records each switch and wake-up of the
//! watched threads as it happens ([`kernel`]), the sampler wakes ten times a second, and this
//! source rebuilds every thread's time on the CPU, on a run queue and in state D at each
//! instant of the usual 100 Hz grid ([`accounts`]). It gives the same series as
//! [`super::process::ProcessSource`] and [`super::process::WorkerThreadsSource`], at the same
//! instants, as past batches ([`Source::take_backfill`]): exact where polling samples.
//!
//! The main threads of the loops (and of every process before the loops are known) and all
//! threads of the loader workers are watched, as the polling sources read them; launchers stay
//! with the slow polling source. When the ring fills and the kernel drops events, the threads
//! are read from `/proc` again and followed from there.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use stallscope_analysis::series::{names, SampleBatch, SeriesId, SeriesKind};
use stallscope_analysis::Nanos;

use super::process::{parse_schedstat, stat_state};
use super::{pread_all, Registry, Source, SourceError, Tier, Watched};
use crate::clock::monotonic_ns;

pub mod accounts;
pub mod kernel;

use accounts::{Event, Process, Scope, State, Thread};
use kernel::{EventFeed, Kernel};

/// Environment variable that turns the eBPF source off (`off`): the threads are then polled
/// from `/proc`, as where eBPF cannot be loaded.
pub const ENABLE_ENV: &str = "STALLSCOPE_EBPF";

/// The inode of the initial pid namespace (`PROC_PID_INIT_INO`): `/proc/self/ns/pid` of a
/// process in it reads `pid:[4026531836]`.
const INITIAL_PID_NAMESPACE: &str = "pid:[4026531836]";

/// Thread states from the kernel's scheduler events.
pub struct ThreadStateSource {
    proc_root: PathBuf,
    feed: Box<dyn EventFeed>,
    clock: fn() -> Nanos,
    /// ns between two ticks given (the sampler's fast period).
    period: Nanos,
    watches: Vec<Watch>,
    /// Index in `watches` by pid.
    by_pid: HashMap<u32, usize>,
    events: Vec<Event>,
    /// Events after the last tick given, kept for the next round.
    pending: Vec<Event>,
    /// ns, the last instant of the grid given.
    last_grid: Option<Nanos>,
    /// ns, the last instant given (of the grid, or a round's).
    last_instant: Option<Nanos>,
    /// The kernel's count of dropped events when last read.
    lost_seen: u64,
    backfill: Vec<SampleBatch>,
    token: u64,
    buf: Vec<u8>,
}

struct Watch {
    process: Process,
    /// cpu, runq, blocked of the main thread; valid for the registry of `token`.
    main_ids: Option<[SeriesId; 3]>,
    /// The same of the other threads (loader workers).
    other_ids: Option<[SeriesId; 3]>,
}

impl ThreadStateSource {
    /// Whether to read the threads of the job under `proc_root` from the kernel's events;
    /// why not. Yes unless [`ENABLE_ENV`] is `off`, as long as `proc_root` is this kernel's
    /// `/proc` and this process is in the initial pid namespace: the programs see the
    /// kernel's own pids, and a container's `/proc` numbers its processes otherwise.
    pub fn wanted(proc_root: &Path) -> Result<(), String> {
        if std::env::var(ENABLE_ENV).is_ok_and(|v| v == "off") {
            return Err(format!("{ENABLE_ENV}=off"));
        }
        if proc_root != Path::new("/proc") {
            return Err(format!(
                "{} is not this kernel's /proc",
                proc_root.display()
            ));
        }
        match std::fs::read_link("/proc/self/ns/pid") {
            Ok(ns) if ns.as_os_str() == INITIAL_PID_NAMESPACE => Ok(()),
            Ok(ns) => Err(format!(
                "in a pid namespace of its own ({}): the kernel's events name other pids",
                ns.display()
            )),
            Err(e) => Err(format!("cannot read /proc/self/ns/pid: {e}")),
        }
    }

    /// Loads the programs into the kernel; why not, when they cannot be (the agent then
    /// polls `/proc`).
    pub fn load(proc_root: &Path) -> Result<Self, String> {
        Ok(Self::with_feed(
            proc_root,
            Box::new(Kernel::load()?),
            monotonic_ns,
        ))
    }

    /// Reads from `feed`, with `clock` for now (tests script both).
    pub fn with_feed(proc_root: &Path, feed: Box<dyn EventFeed>, clock: fn() -> Nanos) -> Self {
        ThreadStateSource {
            proc_root: proc_root.to_path_buf(),
            feed,
            clock,
            period: 10_000_000,
            watches: Vec::new(),
            by_pid: HashMap::new(),
            events: Vec::new(),
            pending: Vec::new(),
            last_grid: None,
            last_instant: None,
            lost_seen: 0,
            backfill: Vec::new(),
            token: 0,
            buf: Vec::new(),
        }
    }

    /// Follows `watched`: starts and stops watching processes, and widens a process that
    /// became a loader worker to all its threads.
    fn sync(&mut self, watched: &Watched, now: Nanos) -> Result<(), SourceError> {
        let wanted = |pid: u32| watched.pids.contains(&pid) && !watched.is_launcher(pid);
        let before = self.watches.len();
        let feed = &mut self.feed;
        self.watches.retain(|w| {
            let keep = wanted(w.process.pid);
            if !keep {
                feed.unwatch(w.process.pid);
            }
            keep
        });
        let mut changed = self.watches.len() != before;
        for &pid in watched.pids.iter().filter(|p| wanted(**p)) {
            let scope = if watched.is_worker(pid) {
                Scope::All
            } else {
                Scope::Main
            };
            if let Some(w) = self.watches.iter_mut().find(|w| w.process.pid == pid) {
                if w.process.scope != scope {
                    self.feed
                        .watch(pid, scope)
                        .map_err(SourceError::Unsupported)?;
                    if scope == Scope::All {
                        w.process.scope = scope;
                        seed_others(&self.proc_root, &mut w.process, &mut self.buf, now);
                    } else {
                        w.process.narrow(now);
                    }
                }
                continue;
            }
            self.feed
                .watch(pid, scope)
                .map_err(SourceError::Unsupported)?;
            let Some(main) = read_thread(&self.proc_root, pid, pid, &mut self.buf, now) else {
                self.feed.unwatch(pid); // gone already
                continue;
            };
            let mut process = Process::new(pid, scope, now, Some(main));
            if scope == Scope::All {
                seed_others(&self.proc_root, &mut process, &mut self.buf, now);
            }
            self.watches.push(Watch {
                process,
                main_ids: None,
                other_ids: None,
            });
            changed = true;
        }
        if changed {
            self.by_pid = self
                .watches
                .iter()
                .enumerate()
                .map(|(i, w)| (w.process.pid, i))
                .collect();
        }
        Ok(())
    }

    /// Reads every watched process from `/proc` again (the kernel dropped events: the states
    /// held may be wrong), and follows them from `now`.
    fn reseed(&mut self, now: Nanos) {
        for w in &mut self.watches {
            let pid = w.process.pid;
            let main = read_thread(&self.proc_root, pid, pid, &mut self.buf, now);
            let mut process = Process::new(pid, w.process.scope, now, main);
            process.carry_others_from(&w.process, now);
            if process.scope == Scope::All {
                seed_others(&self.proc_root, &mut process, &mut self.buf, now);
            }
            w.process = process;
        }
    }

    /// The ticks of the grid from the last one given up to `now`, as past batches, then
    /// `now` itself into the round's batch (so that the series reach the round's instant, as
    /// a polled read would), each with every event up to it applied.
    fn give_ticks(&mut self, now: Nanos, out: &mut Registry) {
        let period = self.period;
        if self.token != out.token() {
            self.token = out.token();
            for w in &mut self.watches {
                w.main_ids = None;
                w.other_ids = None;
            }
        }
        let mut next_event = 0;
        if let Some(grid) = self.last_grid {
            let mut t = grid + period;
            while t < now {
                if self.last_instant.is_some_and(|last| t <= last) {
                    // The round's instant before was on (or past) the grid.
                    t += period;
                    continue;
                }
                self.apply_up_to(t, &mut next_event);
                let values = self.values_at(t, out);
                if !values.is_empty() {
                    self.backfill.push(SampleBatch {
                        t_ns: t,
                        dur_ns: 0,
                        values,
                    });
                }
                self.last_grid = Some(t);
                t += period;
            }
        } else {
            self.last_grid = Some(now / period * period);
        }
        self.apply_up_to(now, &mut next_event);
        for (id, v) in self.values_at(now, out) {
            out.push(id, v);
        }
        // Events stamped after the read began wait for the next round.
        self.pending.extend(self.events.drain(next_event..));
        self.events.clear();
    }

    /// Applies the events from `next_event` on that happened by `t`.
    fn apply_up_to(&mut self, t: Nanos, next_event: &mut usize) {
        while let Some(e) = self.events.get(*next_event).filter(|e| e.ns <= t) {
            if let Some(w) = self
                .by_pid
                .get(&e.tgid)
                .and_then(|i| self.watches.get_mut(*i))
            {
                if e.ns >= w.process.from {
                    w.process.apply(e);
                }
            }
            *next_event += 1;
        }
    }

    /// Every watched process's values at `t`, over the tick since the last instant given.
    fn values_at(&mut self, t: Nanos, out: &mut Registry) -> Vec<(SeriesId, u64)> {
        let last = self.last_instant.unwrap_or(t);
        self.last_instant = Some(t);
        let mut values = Vec::with_capacity(self.watches.len() * 6);
        for w in &mut self.watches {
            if t <= w.process.from {
                continue;
            }
            let tick = w.process.tick(t, last);
            let pid = w.process.pid;
            if let Some(main) = tick.main {
                let ids = *w
                    .main_ids
                    .get_or_insert_with(|| declare(out, pid, MAIN_SERIES));
                values.push((ids[0], main.cpu_ns));
                values.push((ids[1], main.runq_ns));
                values.push((ids[2], u64::from(tick.main_blocked)));
            }
            if w.process.scope == Scope::All && (tick.other_threads > 0 || w.other_ids.is_some()) {
                let ids = *w
                    .other_ids
                    .get_or_insert_with(|| declare(out, pid, OTHER_SERIES));
                values.push((ids[0], tick.others.cpu_ns));
                values.push((ids[1], tick.others.runq_ns));
                values.push((ids[2], tick.others_blocked));
            }
        }
        values
    }
}

/// Names of the main thread's three series.
const MAIN_SERIES: [&str; 3] = [
    names::PROC_CPU_NS,
    names::PROC_RUNQ_NS,
    names::PROC_BLOCKED_IO,
];

/// Names of the other threads' three series.
const OTHER_SERIES: [&str; 3] = [
    names::PROC_THREADS_CPU_NS,
    names::PROC_THREADS_RUNQ_NS,
    names::PROC_THREADS_BLOCKED_IO,
];

fn declare(out: &mut Registry, pid: u32, series: [&str; 3]) -> [SeriesId; 3] {
    let pid = pid.to_string();
    let labels = [("pid", pid.as_str())];
    [
        out.series(series[0], "ns", SeriesKind::Counter, &labels),
        out.series(series[1], "ns", SeriesKind::Counter, &labels),
        out.series(series[2], "threads", SeriesKind::Gauge, &labels),
    ]
}

/// Thread `tid` of `pid` as `/proc` shows it at `now`: its `schedstat` totals and its state;
/// `None` when it is gone or unreadable.
fn read_thread(
    proc_root: &Path,
    pid: u32,
    tid: u32,
    buf: &mut Vec<u8>,
    now: Nanos,
) -> Option<Thread> {
    let dir = proc_root
        .join(pid.to_string())
        .join("task")
        .join(tid.to_string());
    let sched = parse_schedstat(pread_all(&File::open(dir.join("schedstat")).ok()?, buf).ok()?)?;
    let state = stat_state(pread_all(&File::open(dir.join("stat")).ok()?, buf).ok()?)?;
    Some(Thread::new(
        State::from_proc_letter(state),
        now,
        sched.cpu_ns,
        sched.runq_ns,
    ))
}

/// Adds the threads of `process` other than its main one, as `/proc` lists them now.
fn seed_others(proc_root: &Path, process: &mut Process, buf: &mut Vec<u8>, now: Nanos) {
    let task = proc_root.join(process.pid.to_string()).join("task");
    let Ok(dir) = std::fs::read_dir(&task) else {
        return;
    };
    for tid in dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()) {
        if tid == process.pid {
            continue;
        }
        let stat = File::open(task.join(tid.to_string()).join("stat")).ok();
        let state = stat
            .and_then(|f| stat_state(pread_all(&f, buf).ok()?))
            .map_or(State::Sleeping, State::from_proc_letter);
        process.seed_other(tid, state, now);
    }
}

impl Source for ThreadStateSource {
    fn name(&self) -> &'static str {
        "thread_states"
    }

    fn tier(&self) -> Tier {
        Tier::Fast
    }

    fn describe(&self) -> String {
        format!(
            "thread states of the job's main threads and loader workers from eBPF (sched_switch, sched_wakeup), read every wake-up and given every {} ms",
            self.period / 1_000_000
        )
    }

    fn sample(&mut self, watched: &Watched, out: &mut Registry) -> Result<(), SourceError> {
        let now = (self.clock)();
        self.sync(watched, now)?;
        self.events.append(&mut self.pending);
        let lost = self.feed.drain(&mut self.events);
        if lost > self.lost_seen {
            self.lost_seen = lost;
            self.events.clear();
            self.reseed(now);
        }
        self.events.sort_by_key(|e| e.ns);
        self.give_ticks(now, out);
        Ok(())
    }

    fn take_backfill(&mut self, out: &mut Vec<SampleBatch>) {
        out.append(&mut self.backfill);
    }

    fn replaces_polling(&self) -> bool {
        true
    }

    fn set_period(&mut self, period: Nanos) {
        self.period = period.max(1);
    }
}

#[cfg(test)]
mod tests;
