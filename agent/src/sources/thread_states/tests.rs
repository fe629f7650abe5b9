//! The source on a scripted event feed and a captured `/proc`: what the sampler would send.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use stallscope_analysis::series::names;

use super::accounts::{Event, EventKind, Scope};
use super::kernel::EventFeed;
use super::*;
use crate::sources::fake::FakeRoots;

const MS: Nanos = 1_000_000;

/// The test's clock, ns (tests in this module run one at a time on it: each sets it first).
static NOW: AtomicU64 = AtomicU64::new(0);
static CLOCK_LOCK: Mutex<()> = Mutex::new(());

fn now() -> Nanos {
    NOW.load(Ordering::SeqCst)
}

#[derive(Clone, Default)]
struct Script {
    /// Events not yet drained.
    events: Arc<Mutex<Vec<Event>>>,
    watched: Arc<Mutex<Vec<(u32, Scope)>>>,
    lost: Arc<AtomicU64>,
}

impl EventFeed for Script {
    fn watch(&mut self, pid: u32, scope: Scope) -> Result<(), String> {
        let mut w = self.watched.lock().unwrap();
        w.retain(|(p, _)| *p != pid);
        w.push((pid, scope));
        Ok(())
    }
    fn unwatch(&mut self, pid: u32) {
        self.watched.lock().unwrap().retain(|(p, _)| *p != pid);
    }
    fn drain(&mut self, out: &mut Vec<Event>) -> u64 {
        out.append(&mut self.events.lock().unwrap());
        self.lost.load(Ordering::SeqCst)
    }
}

impl Script {
    fn push(&self, ns: Nanos, tid: u32, tgid: u32, kind: EventKind) {
        self.events.lock().unwrap().push(Event {
            ns,
            tid,
            tgid,
            kind,
        });
    }
}

/// A rank (pid 100, running, 5 ms of CPU so far) and a loader worker (pid 200, asleep) with
/// one other thread (201, asleep).
fn fake_job() -> FakeRoots {
    let fake = FakeRoots::new();
    let stat = |pid: u32, state: char| format!("{pid} (python3) {state} 1 1 1 0 -1 0 0\n");
    fake.write(
        &fake.roots.proc,
        "100/task/100/schedstat",
        b"5000000 100 10\n",
    );
    fake.write(
        &fake.roots.proc,
        "100/task/100/stat",
        stat(100, 'R').as_bytes(),
    );
    fake.write(&fake.roots.proc, "200/task/200/schedstat", b"0 0 1\n");
    fake.write(
        &fake.roots.proc,
        "200/task/200/stat",
        stat(200, 'S').as_bytes(),
    );
    fake.write(&fake.roots.proc, "200/task/201/schedstat", b"0 0 1\n");
    fake.write(
        &fake.roots.proc,
        "200/task/201/stat",
        stat(201, 'S').as_bytes(),
    );
    fake
}

fn job() -> Watched {
    Watched {
        pids: vec![100, 200],
        launchers: vec![],
        loops: vec![100],
    }
}

/// The values of `name` for pid `pid` in each batch, with the batch's instant.
fn series(reg: &Registry, batches: &[SampleBatch], name: &str, pid: &str) -> Vec<(Nanos, u64)> {
    let Some(id) = reg
        .decls()
        .iter()
        .find(|d| d.name == name && d.label("pid") == Some(pid))
        .map(|d| d.id)
    else {
        return Vec::new();
    };
    batches
        .iter()
        .filter_map(|b| {
            b.values
                .iter()
                .find(|(i, _)| *i == id)
                .map(|(_, v)| (b.at(), *v))
        })
        .collect()
}

/// The job's captured `/proc`, a script of events, and the source reading both (on the
/// test's clock: hold `CLOCK_LOCK`).
fn started() -> (FakeRoots, Script, ThreadStateSource) {
    let fake = fake_job();
    let script = Script::default();
    let source = ThreadStateSource::with_feed(&fake.roots.proc, Box::new(script.clone()), now);
    (fake, script, source)
}

#[test]
fn ticks_at_the_fast_rate_carry_exact_totals_rebuilt_from_the_events() {
    let _clock = CLOCK_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let (_fake, script, mut source) = started();
    let mut reg = Registry::default();
    let mut batches = Vec::new();

    NOW.store(1_000 * MS, Ordering::SeqCst);
    source.sample(&job(), &mut reg).unwrap();
    source.take_backfill(&mut batches);
    assert!(batches.is_empty(), "the first read only starts the grid");
    assert_eq!(
        *script.watched.lock().unwrap(),
        vec![(100, Scope::Main), (200, Scope::All)]
    );

    // The rank runs until 1,023 ms, then waits on I/O (D) until 1,047, is queued 3 ms, runs.
    script.push(1_023 * MS, 100, 100, EventKind::Off { state: 2 });
    script.push(1_047 * MS, 100, 100, EventKind::Wake);
    script.push(1_050 * MS, 100, 100, EventKind::On);
    // The worker's other thread wakes at 1,010, runs 1,012–1,030, sleeps; a thread of the
    // rank that is not its main one is not the rank's.
    script.push(1_010 * MS, 201, 200, EventKind::Wake);
    script.push(1_012 * MS, 201, 200, EventKind::On);
    script.push(1_030 * MS, 201, 200, EventKind::Off { state: 1 });
    script.push(1_015 * MS, 101, 100, EventKind::On);
    // After the read's instant (1,100): kept for the next round.
    script.push(1_100_500_000, 100, 100, EventKind::Off { state: 1 });
    NOW.store(1_100 * MS, Ordering::SeqCst);
    source.sample(&job(), &mut reg).unwrap();
    source.take_backfill(&mut batches);

    let times: Vec<Nanos> = batches.iter().map(|b| b.at()).collect();
    assert_eq!(
        times,
        (1..=9).map(|k| (1_000 + 10 * k) * MS).collect::<Vec<_>>()
    );
    let cpu = series(&reg, &batches, names::PROC_CPU_NS, "100");
    // 5 ms before, +23 ms to 1,023, then from 1,050.
    assert_eq!(cpu[0], (1_010 * MS, 15 * MS));
    assert_eq!(cpu[2], (1_030 * MS, 28 * MS));
    assert_eq!(cpu[4], (1_050 * MS, 28 * MS));
    assert_eq!(cpu[8], (1_090 * MS, 68 * MS));
    let runq = series(&reg, &batches, names::PROC_RUNQ_NS, "100");
    assert_eq!(runq[8].1, 100 + 3 * MS);
    let blocked: Vec<u64> = series(&reg, &batches, names::PROC_BLOCKED_IO, "100")
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    // D 1,023–1,047: the ticks ending at 1,030 (7 of 10 ms), 1,040 and 1,050 (7 of 10).
    assert_eq!(blocked, vec![0, 0, 1, 1, 1, 0, 0, 0, 0]);
    let others = series(&reg, &batches, names::PROC_THREADS_CPU_NS, "200");
    assert_eq!(others[1], (1_020 * MS, 8 * MS));
    assert_eq!(others[8], (1_090 * MS, 18 * MS));
    let others_runq = series(&reg, &batches, names::PROC_THREADS_RUNQ_NS, "200");
    assert_eq!(others_runq[8].1, 2 * MS);
    assert!(series(&reg, &batches, names::PROC_THREADS_CPU_NS, "100").is_empty());
    // The round's own batch has the values at its instant: running since 1,050.
    let cpu_id = reg
        .decls()
        .iter()
        .find(|d| d.name == names::PROC_CPU_NS && d.label("pid") == Some("100"))
        .map(|d| d.id)
        .unwrap();
    let round = reg.take_values();
    assert!(round.contains(&(cpu_id, 78 * MS)), "{round:?}");

    // The next round applies the held event: the rank stopped at 1,100.5 ms.
    batches.clear();
    NOW.store(1_200 * MS, Ordering::SeqCst);
    source.sample(&job(), &mut reg).unwrap();
    source.take_backfill(&mut batches);
    let cpu = series(&reg, &batches, names::PROC_CPU_NS, "100");
    assert_eq!(cpu.first(), Some(&(1_110 * MS, 78_500_000)));
    assert_eq!(cpu.last(), Some(&(1_190 * MS, 78_500_000)));
}

#[test]
fn dropped_events_send_the_source_back_to_proc() {
    let _clock = CLOCK_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let (fake, script, mut source) = started();
    let mut reg = Registry::default();
    let mut batches = Vec::new();
    NOW.store(1_000 * MS, Ordering::SeqCst);
    source.sample(&job(), &mut reg).unwrap();
    // The rank went off the CPU at 1,005 ms, but that event was lost; /proc says it has
    // 9 ms of CPU and sleeps.
    script.lost.store(1, Ordering::SeqCst);
    script.push(1_050 * MS, 100, 100, EventKind::Wake);
    let stat = b"100 (python3) S 1 1 1 0 -1 0 0\n";
    fake.write(&fake.roots.proc, "100/task/100/stat", stat);
    fake.write(
        &fake.roots.proc,
        "100/task/100/schedstat",
        b"9000000 100 11\n",
    );
    NOW.store(1_100 * MS, Ordering::SeqCst);
    source.sample(&job(), &mut reg).unwrap();
    source.take_backfill(&mut batches);
    assert!(
        batches.is_empty(),
        "nothing is given for the time the record is not whole"
    );
    NOW.store(1_200 * MS, Ordering::SeqCst);
    source.sample(&job(), &mut reg).unwrap();
    source.take_backfill(&mut batches);
    let cpu = series(&reg, &batches, names::PROC_CPU_NS, "100");
    assert_eq!(cpu.first(), Some(&(1_110 * MS, 9 * MS)));
    assert_eq!(cpu.last(), Some(&(1_190 * MS, 9 * MS)));
}

#[test]
fn processes_that_leave_the_job_are_no_longer_watched() {
    let _clock = CLOCK_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let (_fake, script, mut source) = started();
    let mut reg = Registry::default();
    NOW.store(1_000 * MS, Ordering::SeqCst);
    source.sample(&job(), &mut reg).unwrap();
    let mut launcher_now = job();
    launcher_now.pids = vec![100];
    NOW.store(1_100 * MS, Ordering::SeqCst);
    source.sample(&launcher_now, &mut reg).unwrap();
    assert_eq!(*script.watched.lock().unwrap(), vec![(100, Scope::Main)]);
    launcher_now.launchers = vec![100];
    source.sample(&launcher_now, &mut reg).unwrap();
    assert!(script.watched.lock().unwrap().is_empty());
}
