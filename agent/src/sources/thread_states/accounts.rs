//! Each watched thread's time on the CPU, on a run queue and in state D, rebuilt from the
//! kernel's scheduling events, and read at any past instant.
//!
//! A thread is in one of four states, and each event moves it: switched in → running;
//! switched out → runnable (preempted), blocked (state D) or sleeping (any other wait), or
//! gone (it exited); woken → runnable. The time since the last event goes to the state the
//! thread was in, so the totals at an instant `t` are exact for every event up to `t`: no
//! sampling error, whatever the read rate.
//!
//! A thread's first state comes from `/proc` when its process is first watched (its
//! `schedstat` for the totals, `stat` for the state), or from its first event for threads
//! that start later (their totals start at 0, as the polling source's sums do).

use std::collections::HashMap;

use stallscope_analysis::Nanos;

/// `TASK_UNINTERRUPTIBLE`: the thread waits and cannot be interrupted (state D, usually I/O).
const TASK_UNINTERRUPTIBLE: u32 = 0x0002;
/// `EXIT_DEAD | EXIT_ZOMBIE`: the thread has exited.
const TASK_EXITED: u32 = 0x0010 | 0x0020;
/// `TASK_DEAD`: the thread's last switch out.
const TASK_DEAD: u32 = 0x0080;
/// `TASK_NOLOAD`: an uninterruptible wait that is not counted as load (idle kernel threads;
/// `/proc` shows it as `I`, not `D`).
const TASK_NOLOAD: u32 = 0x0400;

/// What happened to a thread, as the kernel reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// Switched out with the kernel's task state bits `state` (0: preempted, still runnable).
    Off {
        /// The task state bits.
        state: u32,
    },
    /// Switched in.
    On,
    /// Woken: made runnable.
    Wake,
}

/// One scheduling event of a watched thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// ns, `CLOCK_MONOTONIC`.
    pub ns: Nanos,
    /// The thread.
    pub tid: u32,
    /// Its process.
    pub tgid: u32,
    /// What happened.
    pub kind: EventKind,
}

/// Where a thread is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// On a CPU.
    Running,
    /// Waiting on a run queue.
    Runnable,
    /// In state D.
    Blocked,
    /// In any other wait.
    Sleeping,
}

impl State {
    /// The state a `/proc/PID/stat` letter says: `R` running (or runnable: `/proc` does not
    /// tell), `D` blocked, anything else asleep.
    pub fn from_proc_letter(letter: char) -> Self {
        match letter {
            'R' => State::Running,
            'D' => State::Blocked,
            _ => State::Sleeping,
        }
    }
}

/// One thread's totals, ns, up to `since`, and its state since then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thread {
    state: State,
    /// ns, when it entered `state`.
    since: Nanos,
    cpu_ns: u64,
    runq_ns: u64,
    blocked_ns: u64,
    /// ns in state D up to the last tick read ([`Process::tick`]).
    blocked_mark: u64,
}

/// A thread's totals at an instant, ns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// On a CPU.
    pub cpu_ns: u64,
    /// Waiting on a run queue.
    pub runq_ns: u64,
    /// In state D.
    pub blocked_ns: u64,
}

impl Totals {
    /// Adds `other`'s totals.
    fn add(&mut self, other: Totals) {
        self.cpu_ns += other.cpu_ns;
        self.runq_ns += other.runq_ns;
        self.blocked_ns += other.blocked_ns;
    }
}

impl Thread {
    /// A thread in `state` since `since`, with the totals it had then.
    pub fn new(state: State, since: Nanos, cpu_ns: u64, runq_ns: u64) -> Self {
        Thread {
            state,
            since,
            cpu_ns,
            runq_ns,
            blocked_ns: 0,
            blocked_mark: 0,
        }
    }

    /// A thread first seen through `kind` at `ns`: totals from 0.
    fn first_seen(kind: EventKind, ns: Nanos) -> Self {
        // Whatever state the event leaves: it moves the thread out of the one before it.
        let before = match kind {
            EventKind::Wake => State::Sleeping,
            EventKind::On => State::Runnable,
            EventKind::Off { .. } => State::Running,
        };
        let mut t = Thread::new(before, ns, 0, 0);
        t.apply(kind, ns);
        t
    }

    /// Its totals at `t` (not before `since`: an earlier `t` gives the totals at `since`).
    pub fn at(&self, t: Nanos) -> Totals {
        let mut totals = Totals {
            cpu_ns: self.cpu_ns,
            runq_ns: self.runq_ns,
            blocked_ns: self.blocked_ns,
        };
        let d = t.saturating_sub(self.since);
        match self.state {
            State::Running => totals.cpu_ns += d,
            State::Runnable => totals.runq_ns += d,
            State::Blocked => totals.blocked_ns += d,
            State::Sleeping => {}
        }
        totals
    }

    /// Moves the thread by an event at `ns`; false when the thread has exited.
    pub fn apply(&mut self, kind: EventKind, ns: Nanos) -> bool {
        let next = match kind {
            EventKind::On => State::Running,
            EventKind::Off { state } if state & (TASK_DEAD | TASK_EXITED) != 0 => {
                // Nothing accrues after its last switch out, even while its process is
                // still listed (discovery forgets it within a second).
                self.close(ns);
                self.state = State::Sleeping;
                return false;
            }
            EventKind::Off { state: 0 } => State::Runnable,
            EventKind::Off { state }
                if state & TASK_UNINTERRUPTIBLE != 0 && state & TASK_NOLOAD == 0 =>
            {
                State::Blocked
            }
            EventKind::Off { .. } => State::Sleeping,
            // A wake-up of a thread that is running or already queued changes nothing.
            EventKind::Wake if matches!(self.state, State::Running | State::Runnable) => {
                return true;
            }
            EventKind::Wake => State::Runnable,
        };
        self.close(ns);
        self.state = next;
        true
    }

    /// Adds the time since `since` to the state's total, and starts again at `ns`.
    fn close(&mut self, ns: Nanos) {
        let now = self.at(ns);
        self.cpu_ns = now.cpu_ns;
        self.runq_ns = now.runq_ns;
        self.blocked_ns = now.blocked_ns;
        self.since = self.since.max(ns);
    }

    /// Its state now.
    pub fn state(&self) -> State {
        self.state
    }
}

/// Whether the kernel reports one thread of a process or all of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The main thread (tid == pid) only.
    Main,
    /// Every thread.
    All,
}

/// A watched process: its main thread, and with [`Scope::All`] its other threads.
#[derive(Debug)]
pub struct Process {
    /// Its pid.
    pub pid: u32,
    /// What the kernel reports of it.
    pub scope: Scope,
    /// ns, since when its totals are known: no instant before is read.
    pub from: Nanos,
    main: Option<Thread>,
    others: HashMap<u32, Thread>,
    /// ns on the CPU and on a run queue of its other threads that have exited.
    exited: Totals,
}

/// What a process did over one tick `(t - period, t]`, and its totals at `t`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tick {
    /// The main thread's totals at `t`; `None` before it is known.
    pub main: Option<Totals>,
    /// Whether the main thread spent at least half of the tick in state D.
    pub main_blocked: bool,
    /// The other threads' summed totals at `t` (exited ones included).
    pub others: Totals,
    /// How many other threads spent at least half of the tick in state D.
    pub others_blocked: u64,
    /// How many other threads there are (exited ones not).
    pub other_threads: usize,
}
impl Process {
    /// A process watched from `from`, its main thread as `/proc` showed it then (`None` when
    /// it could not be read: it is then known from its first event).
    pub fn new(pid: u32, scope: Scope, from: Nanos, main: Option<Thread>) -> Self {
        Process {
            pid,
            scope,
            from,
            main,
            others: HashMap::new(),
            exited: Totals::default(),
        }
    }

    /// Adds another thread as `/proc` showed it (on widening to [`Scope::All`]): its totals
    /// start at 0 there.
    pub fn seed_other(&mut self, tid: u32, state: State, ns: Nanos) {
        if tid != self.pid {
            self.others
                .entry(tid)
                .or_insert_with(|| Thread::new(state, ns, 0, 0));
        }
    }

    /// Applies one of its events.
    pub fn apply(&mut self, e: &Event) {
        if e.tid == self.pid {
            match &mut self.main {
                Some(t) => {
                    t.apply(e.kind, e.ns);
                }
                None => self.main = Some(Thread::first_seen(e.kind, e.ns)),
            }
            return;
        }
        if self.scope == Scope::Main {
            return;
        }
        let alive = match self.others.get_mut(&e.tid) {
            Some(t) => t.apply(e.kind, e.ns),
            None => {
                let t = Thread::first_seen(e.kind, e.ns);
                self.others.insert(e.tid, t);
                true
            }
        };
        if !alive {
            if let Some(t) = self.others.remove(&e.tid) {
                self.exited.add(t.at(e.ns));
            }
        }
    }

    /// Its totals at `t` and what it did since the tick before (`last`, ns): read the ticks
    /// in order, as each marks how long its threads had been in state D by then.
    pub fn tick(&mut self, t: Nanos, last: Nanos) -> Tick {
        let span = t.saturating_sub(last.max(self.from));
        let mut tick = Tick {
            others: self.exited,
            other_threads: self.others.len(),
            ..Tick::default()
        };
        if let Some(main) = &mut self.main {
            let at = main.at(t);
            tick.main = Some(at);
            tick.main_blocked = mostly_blocked(main, at, span);
        }
        for thread in self.others.values_mut() {
            let at = thread.at(t);
            tick.others.add(at);
            tick.others_blocked += u64::from(mostly_blocked(thread, at, span));
        }
        tick
    }

    /// Reports its main thread only from `t` on: the other threads' totals so far stay in
    /// its sums, and they are followed no more (no events of theirs will come).
    pub fn narrow(&mut self, t: Nanos) {
        self.exited = self.others_at(t);
        self.others.clear();
        self.scope = Scope::Main;
    }

    /// Takes over the other threads' totals of `old` at `t` (exited and live), so that their
    /// sums go on from there when the threads are read again from `/proc`.
    pub fn carry_others_from(&mut self, old: &Process, t: Nanos) {
        self.exited = old.others_at(t);
    }

    /// The other threads' totals at `t`, exited ones included.
    fn others_at(&self, t: Nanos) -> Totals {
        let mut sum = self.exited;
        for thread in self.others.values() {
            sum.add(thread.at(t));
        }
        sum
    }
}

/// Whether `thread`, whose totals are `at` now, spent at least half of the last `span` ns in
/// state D; marks its total for the next tick.
fn mostly_blocked(thread: &mut Thread, at: Totals, span: Nanos) -> bool {
    let blocked = at.blocked_ns.saturating_sub(thread.blocked_mark);
    thread.blocked_mark = at.blocked_ns;
    blocked > 0 && blocked * 2 >= span
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;

    fn off(state: u32) -> EventKind {
        EventKind::Off { state }
    }

    #[test]
    fn time_goes_to_the_state_the_thread_was_in() {
        let mut t = Thread::new(State::Running, 0, 1_000, 10);
        assert!(t.apply(off(TASK_UNINTERRUPTIBLE), 4 * MS)); // ran 4 ms, then waits on I/O
        assert!(t.apply(EventKind::Wake, 9 * MS)); // 5 ms in D
        assert!(t.apply(EventKind::On, 10 * MS)); // 1 ms queued
        assert!(t.apply(off(0), 12 * MS)); // ran 2 ms, preempted
        assert!(t.apply(EventKind::On, 15 * MS)); // 3 ms queued
        assert!(t.apply(off(1), 16 * MS)); // ran 1 ms, sleeps (S)
        assert_eq!(
            t.at(20 * MS),
            Totals {
                cpu_ns: 1_000 + 7 * MS,
                runq_ns: 10 + 4 * MS,
                blocked_ns: 5 * MS,
            }
        );
        assert_eq!(t.state(), State::Sleeping);
    }

    /// `/proc`'s `run_delay` grows only when a waiting thread gets a CPU, so a poll during a
    /// long wait on a run queue sees neither CPU nor waiting; here the wait counts as it
    /// happens.
    #[test]
    fn a_queued_thread_counts_its_wait_as_it_happens() {
        let mut t = Thread::new(State::Running, 0, 0, 0);
        t.apply(off(0), 2 * MS); // preempted
        assert_eq!(t.at(12 * MS).runq_ns, 10 * MS);
        assert_eq!(t.at(12 * MS).cpu_ns, 2 * MS);
    }

    #[test]
    fn a_running_thread_accrues_cpu_up_to_the_instant_read() {
        let t = Thread::new(State::Running, 10 * MS, 0, 0);
        assert_eq!(t.at(25 * MS).cpu_ns, 15 * MS);
        // Before it was known, it is read as it was then.
        assert_eq!(t.at(5 * MS).cpu_ns, 0);
    }

    #[test]
    fn killable_waits_are_state_d_and_idle_kernel_waits_are_not() {
        let mut t = Thread::new(State::Running, 0, 0, 0);
        t.apply(off(0x0100 | TASK_UNINTERRUPTIBLE), MS); // TASK_KILLABLE
        assert_eq!(t.state(), State::Blocked);
        t.apply(EventKind::Wake, 2 * MS);
        t.apply(EventKind::On, 2 * MS);
        t.apply(off(TASK_NOLOAD | TASK_UNINTERRUPTIBLE), 3 * MS); // TASK_IDLE
        assert_eq!(t.state(), State::Sleeping);
    }

    #[test]
    fn a_thread_that_exited_accrues_nothing_more() {
        let mut t = Thread::new(State::Running, 0, 0, 0);
        assert!(!t.apply(off(TASK_DEAD), 3 * MS));
        assert_eq!(t.at(50 * MS).cpu_ns, 3 * MS);
    }

    #[test]
    fn a_wakeup_of_a_running_thread_changes_nothing() {
        let mut t = Thread::new(State::Running, 0, 0, 0);
        t.apply(EventKind::Wake, MS);
        assert_eq!(t.state(), State::Running);
        assert_eq!(t.at(3 * MS).cpu_ns, 3 * MS);
    }

    #[test]
    fn exited_threads_keep_their_time_in_the_process_sums() {
        let mut p = Process::new(
            10,
            Scope::All,
            0,
            Some(Thread::new(State::Sleeping, 0, 0, 0)),
        );
        let ev = |ns, tid, kind| Event {
            ns,
            tid,
            tgid: 10,
            kind,
        };
        p.apply(&ev(MS, 11, EventKind::Wake)); // a new thread
        p.apply(&ev(2 * MS, 11, EventKind::On));
        p.apply(&ev(7 * MS, 11, off(TASK_DEAD)));
        p.apply(&ev(7 * MS, 12, EventKind::On)); // first seen running
        let s = p.tick(10 * MS, 0);
        assert_eq!(s.others.cpu_ns, 5 * MS + 3 * MS);
        assert_eq!(s.others.runq_ns, MS);
        assert_eq!(s.other_threads, 1);
        assert_eq!(s.main.map(|m| m.cpu_ns), Some(0));
    }

    #[test]
    fn a_narrowed_process_keeps_its_other_threads_sums_and_stops_following_them() {
        let mut p = Process::new(10, Scope::All, 0, None);
        p.seed_other(11, State::Running, 0);
        p.narrow(4 * MS);
        let tick = p.tick(20 * MS, 0);
        assert_eq!((tick.others.cpu_ns, tick.other_threads), (4 * MS, 0));
    }

    #[test]
    fn a_main_only_process_ignores_its_other_threads() {
        let mut p = Process::new(10, Scope::Main, 0, None);
        p.apply(&Event {
            ns: MS,
            tid: 11,
            tgid: 10,
            kind: EventKind::On,
        });
        let tick = p.tick(5 * MS, 0);
        assert_eq!((tick.other_threads, tick.main), (0, None));
    }

    #[test]
    fn a_tick_is_blocked_when_at_least_half_of_it_was_in_state_d() {
        let running = Thread::new(State::Running, 0, 0, 0);
        let mut p = Process::new(10, Scope::Main, 0, Some(running));
        let ev = |ns, kind| Event {
            ns,
            tid: 10,
            tgid: 10,
            kind,
        };
        p.apply(&ev(4 * MS, off(TASK_UNINTERRUPTIBLE)));
        p.apply(&ev(9 * MS, EventKind::Wake));
        // (0, 10]: 5 ms of 10 in D, though it is runnable at the tick's end.
        assert!(p.tick(10 * MS, 0).main_blocked);
        p.apply(&ev(10 * MS, EventKind::On));
        p.apply(&ev(16 * MS, off(TASK_UNINTERRUPTIBLE)));
        // (10, 20]: 4 ms.
        assert!(!p.tick(20 * MS, 10 * MS).main_blocked);
        // (20, 30]: blocked throughout.
        assert!(p.tick(30 * MS, 20 * MS).main_blocked);
        assert_eq!(
            p.tick(40 * MS, 30 * MS).main.map(|m| m.blocked_ns),
            Some(29 * MS)
        );
    }
}
