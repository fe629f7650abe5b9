//! The threads of the loader workers other than their main thread: CPU, run-queue delay and
//! how many are blocked in I/O.
//!
//! A DataLoader worker that reads from an object store through a thread pool, or decodes on
//! threads of its own, leaves its main thread asleep in state S: reading the main thread alone,
//! the loop's wait for that worker would look like nothing at all. So the workers (the job's
//! processes that are neither loops nor launchers, [`Watched::is_worker`]) have every thread
//! read, up to [`MAX_THREADS`] each. The main thread stays with [`super::ProcessSource`]; this
//! source adds the others as three series per worker, declared once it has any.
//!
//! The threads are read every [`READ_EVERY`] rounds (50 Hz at the default 100 Hz: a PyTorch
//! worker has two threads beside its main one — the result queue's feeder among them — so the
//! example's four workers add eight threads, and reading them every tick cost 0.17% of a core
//! more over a run). The thread list is read again every [`LIST_EVERY`] reads (a directory
//! read costs more than the threads' `schedstat`); a thread's CPU is summed as it grows, so a
//! thread that exits leaves what it was seen using in the total, which never goes back.

use std::fs::File;
use std::path::{Path, PathBuf};

use stallscope_analysis::series::{names, SeriesId, SeriesKind};

use super::main_thread::{parse_schedstat, stat_state, Schedstat, STATE_EVERY};
use super::{open_failed, sync};
use crate::sources::{is_gone, pread_all, Registry, Roots, Source, SourceError, Tier, Watched};

/// Threads read per worker at most (the first ones listed, main thread aside).
pub const MAX_THREADS: usize = 32;

/// The workers' threads are read every this many rounds, their state each time.
pub const READ_EVERY: u64 = STATE_EVERY;

/// A worker's thread list is read again every this many reads (5 Hz at the default 100 Hz).
pub const LIST_EVERY: u64 = 10;

/// Every thread but the main one of each loader worker.
pub struct WorkerThreadsSource {
    proc_root: PathBuf,
    workers: Vec<Worker>,
    buf: Vec<u8>,
    token: u64,
    rounds: u64,
}

struct Worker {
    pid: u32,
    threads: Vec<Thread>,
    /// ns on the CPU of the threads read, summed as they grew (exited ones included).
    cpu_ns: u64,
    /// ns on a run queue, the same way.
    runq_ns: u64,
    /// Rounds since the thread list was last read.
    since_listed: u64,
    /// cpu, runq, blocked; valid for the registry of `WorkerThreadsSource::token`.
    ids: Option<[SeriesId; 3]>,
}

struct Thread {
    tid: u32,
    schedstat: File,
    stat: File,
    /// The last `schedstat` read.
    last: Option<Schedstat>,
    /// Whether it was in state D when its state was last read.
    blocked: bool,
}

impl WorkerThreadsSource {
    /// Reads below `roots.proc`.
    pub fn new(roots: &Roots) -> Self {
        WorkerThreadsSource {
            proc_root: roots.proc.clone(),
            workers: Vec::new(),
            buf: Vec::new(),
            token: 0,
            rounds: 0,
        }
    }
}

impl Worker {
    /// Opens the threads listed now that are not open yet, and forgets those gone.
    fn list(&mut self, proc_root: &Path) {
        self.since_listed = 0;
        let task = proc_root.join(self.pid.to_string()).join("task");
        let Ok(dir) = std::fs::read_dir(&task) else {
            return;
        };
        let listed: Vec<u32> = dir
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .filter(|tid| *tid != self.pid)
            .collect();
        self.threads.retain(|t| listed.contains(&t.tid));
        for tid in listed {
            if self.threads.len() >= MAX_THREADS {
                break;
            }
            if self.threads.iter().any(|t| t.tid == tid) {
                continue;
            }
            let dir = task.join(tid.to_string());
            if let (Ok(schedstat), Ok(stat)) = (
                File::open(dir.join("schedstat")),
                File::open(dir.join("stat")),
            ) {
                self.threads.push(Thread {
                    tid,
                    schedstat,
                    stat,
                    last: None,
                    blocked: false,
                });
            }
        }
    }

    /// Reads every thread's `schedstat` and its state (unless it cannot have changed); returns
    /// how many are in state D. Threads gone are dropped.
    fn read(&mut self, buf: &mut Vec<u8>) -> u64 {
        let (mut cpu, mut runq) = (0u64, 0u64);
        self.threads.retain_mut(|t| {
            let Ok(bytes) = pread_all(&t.schedstat, buf) else {
                return false;
            };
            let Some(now) = parse_schedstat(bytes) else {
                return false;
            };
            if let Some(last) = t.last {
                cpu += now.cpu_ns.saturating_sub(last.cpu_ns);
                runq += now.runq_ns.saturating_sub(last.runq_ns);
            }
            // Only a thread that ran can have put itself to sleep in state D.
            let unchanged = t.last.is_some_and(|l| {
                now.scheduled > 0 && l.scheduled == now.scheduled && l.cpu_ns == now.cpu_ns
            });
            t.last = Some(now);
            if t.blocked || !unchanged {
                match pread_all(&t.stat, buf).map(stat_state) {
                    Ok(Some(state)) => t.blocked = state == 'D',
                    Ok(None) => {}
                    Err(e) if is_gone(&e) => return false,
                    Err(_) => {}
                }
            }
            true
        });
        self.cpu_ns += cpu;
        self.runq_ns += runq;
        self.threads.iter().filter(|t| t.blocked).count() as u64
    }
}

impl Source for WorkerThreadsSource {
    fn name(&self) -> &'static str {
        "worker_threads"
    }

    fn tier(&self) -> Tier {
        Tier::Fast
    }

    fn describe(&self) -> String {
        format!(
            "loader workers' other threads' CPU, run-queue delay and I/O blocking from {}/PID/task/TID/{{schedstat,stat}}",
            self.proc_root.display()
        )
    }

    fn sample(&mut self, watched: &Watched, out: &mut Registry) -> Result<(), SourceError> {
        let proc_root = &self.proc_root;
        let failure = sync(
            &mut self.workers,
            |w| w.pid,
            watched,
            |pid| watched.is_worker(pid),
            |pid| {
                let task = proc_root.join(pid.to_string()).join("task");
                match std::fs::metadata(&task) {
                    Ok(_) => Ok(Some(Worker {
                        pid,
                        threads: Vec::new(),
                        cpu_ns: 0,
                        runq_ns: 0,
                        since_listed: LIST_EVERY,
                        ids: None,
                    })),
                    Err(e) => open_failed(task, e),
                }
            },
        )?;
        if self.token != out.token() {
            self.token = out.token();
            self.workers.iter_mut().for_each(|w| w.ids = None);
        }
        let due = self.rounds % READ_EVERY == 0;
        self.rounds += 1;
        if !due {
            return match failure {
                Some(e) if self.workers.is_empty() => Err(e),
                _ => Ok(()),
            };
        }
        for w in &mut self.workers {
            if w.since_listed >= LIST_EVERY {
                w.list(proc_root);
            }
            w.since_listed += 1;
            let blocked = w.read(&mut self.buf);
            if w.ids.is_none() && w.threads.is_empty() {
                continue;
            }
            let ids = *w.ids.get_or_insert_with(|| declare(out, w.pid));
            out.push(ids[0], w.cpu_ns);
            out.push(ids[1], w.runq_ns);
            out.push(ids[2], blocked);
        }
        match failure {
            Some(e) if self.workers.is_empty() => Err(e),
            _ => Ok(()),
        }
    }
}

fn declare(out: &mut Registry, pid: u32) -> [SeriesId; 3] {
    let pid = pid.to_string();
    let labels = [("pid", pid.as_str())];
    [
        out.series(
            names::PROC_THREADS_CPU_NS,
            "ns",
            SeriesKind::Counter,
            &labels,
        ),
        out.series(
            names::PROC_THREADS_RUNQ_NS,
            "ns",
            SeriesKind::Counter,
            &labels,
        ),
        out.series(
            names::PROC_THREADS_BLOCKED_IO,
            "threads",
            SeriesKind::Gauge,
            &labels,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use stallscope_analysis::series::names;

    use super::*;
    use crate::sources::fake::{FakeRoots, Round};

    fn watched_workers(pids: &[u32], loops: &[u32]) -> Watched {
        Watched {
            pids: pids.iter().chain(loops).copied().collect(),
            launchers: Vec::new(),
            loops: loops.to_vec(),
        }
    }

    fn thread(fake: &FakeRoots, pid: u32, tid: u32, cpu_ns: u64, scheduled: u64, state: char) {
        fake.write(
            &fake.roots.proc,
            &format!("{pid}/task/{tid}/schedstat"),
            format!("{cpu_ns} 7 {scheduled}\n").as_bytes(),
        );
        fake.write(
            &fake.roots.proc,
            &format!("{pid}/task/{tid}/stat"),
            format!("{tid} (pt_data_worker) {state} 1 2 3\n").as_bytes(),
        );
    }

    /// Samples as many rounds as it takes to read the threads once more.
    fn read_once(source: &mut WorkerThreadsSource, watched: &Watched, reg: &mut Registry) -> Round {
        for _ in 0..READ_EVERY {
            source.sample(watched, reg).unwrap();
        }
        Round::take(reg)
    }

    /// A worker whose main thread sleeps while two threads of its pool work: one reading
    /// (state D), one decoding. Their CPU adds up across reads, the reader counts as blocked,
    /// and the main thread is not read here.
    #[test]
    fn a_workers_pool_threads_are_read_beside_its_main_thread() {
        let fake = FakeRoots::new();
        thread(&fake, 500, 500, 1_000, 1, 'S');
        thread(&fake, 500, 501, 10_000, 5, 'D');
        thread(&fake, 500, 502, 20_000, 9, 'R');
        let mut source = WorkerThreadsSource::new(&fake.roots);
        let mut reg = Registry::default();
        let watched = watched_workers(&[500], &[400]);
        let first = read_once(&mut source, &watched, &mut reg);
        let worker = ("pid", "500");
        assert_eq!(first.get(names::PROC_THREADS_CPU_NS, worker), Some(0));
        assert_eq!(first.get(names::PROC_THREADS_BLOCKED_IO, worker), Some(1));
        thread(&fake, 500, 501, 15_000, 6, 'D');
        thread(&fake, 500, 502, 50_000, 10, 'R');
        let second = read_once(&mut source, &watched, &mut reg);
        assert_eq!(
            second.get(names::PROC_THREADS_CPU_NS, worker),
            Some(5_000 + 30_000)
        );
        // A thread that exits keeps what it used in the total.
        std::fs::remove_dir_all(fake.roots.proc.join("500/task/502")).unwrap();
        thread(&fake, 500, 501, 16_000, 7, 'S');
        let third = read_once(&mut source, &watched, &mut reg);
        assert_eq!(
            third.get(names::PROC_THREADS_CPU_NS, worker),
            Some(35_000 + 1_000)
        );
        assert_eq!(third.get(names::PROC_THREADS_BLOCKED_IO, worker), Some(0));
    }

    /// Loops and launchers have many threads (intra-op pools, gloo) that the attribution does
    /// not read: they are left alone, and so is everything before a loop is known.
    #[test]
    fn loops_launchers_and_unknown_jobs_are_not_read() {
        let fake = FakeRoots::new();
        thread(&fake, 400, 400, 1, 1, 'R');
        thread(&fake, 400, 401, 1, 1, 'R');
        let mut source = WorkerThreadsSource::new(&fake.roots);
        let mut reg = Registry::default();
        source
            .sample(&watched_workers(&[], &[400]), &mut reg)
            .unwrap();
        assert!(Round::take(&mut reg).decls.is_empty());
        source.sample(&Watched::new(vec![400]), &mut reg).unwrap();
        assert!(Round::take(&mut reg).decls.is_empty());
    }
}
