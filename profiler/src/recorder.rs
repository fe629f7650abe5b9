//! The recorder: one thread that takes every event of the run, writes it to the profile as a
//! frame, feeds the same frame to the job timeline, attributes iterations as they become
//! ready, and keeps the live status line.
//!
//! Writing and ingesting go through one function ([`Recorder::emit`]), so the timeline the
//! live run attributes from is exactly the one a replay of the profile rebuilds.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{IsTerminal, Write};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use stallscope_agent::clock::monotonic_ns;
use stallscope_agent::markers::MarkerEvent as Received;
use stallscope_agent::proctree::ProcEntry;
use stallscope_agent::sampler::{LoopPids, SamplerEvent};
use stallscope_agent::sink::{Mailbox, Sink};
use stallscope_analysis::attribution::IterationBreakdown;
use stallscope_analysis::frame::{Frame, ProcessInfo, Role, RunEnd, RunHeader, SourceStatus};
use stallscope_analysis::job::JobTimeline;
use stallscope_analysis::marker::{Marker, MarkerEvent};
use stallscope_analysis::summary::{summarize, Summary};
use stallscope_collector::profile::ProfileWriter;
use stallscope_dashboards::status::StatusModel;

use crate::terminal::PinnedStatus;

/// What the recorder is sent.
pub enum Event {
    /// From the sampler thread.
    Sampler(SamplerEvent),
    /// From the marker listener.
    Marker(Received),
    /// A step seen by `--iter-regex` on the command's stdout.
    RegexStep(Marker),
    /// The command ended with this exit code: write the end and summarise.
    Finish(i32),
}

/// Where the sampler and the marker listener put their events: drained by the recorder every
/// [`ATTRIBUTE_EVERY`], so that neither wakes the recorder for each sample or marker.
#[derive(Clone, Default)]
pub struct Inbox(Mailbox<Event>);

impl Sink<SamplerEvent> for Inbox {
    fn put(&self, item: SamplerEvent) -> bool {
        self.0.push(Event::Sampler(item));
        true
    }
}

impl Sink<Received> for Inbox {
    fn put(&self, item: Received) -> bool {
        self.0.push(Event::Marker(item));
        true
    }
}

/// How often markers are written as a frame and ready iterations attributed.
const ATTRIBUTE_EVERY: Duration = Duration::from_millis(100);
/// How often the profile is flushed to the file.
const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// Where the live status goes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum StatusMode {
    /// No status.
    Off,
    /// Redrawn in place on a terminal every second.
    Terminal,
    /// A plain line every ten seconds (logs, CI).
    Lines,
}

impl StatusMode {
    /// In place on a terminal, plain lines otherwise, or off.
    pub fn for_stderr(quiet: bool) -> StatusMode {
        match (quiet, std::io::stderr().is_terminal()) {
            (true, _) => StatusMode::Off,
            (false, true) => StatusMode::Terminal,
            (false, false) => StatusMode::Lines,
        }
    }
}

/// The recorder's state.
pub struct Recorder {
    writer: Option<ProfileWriter>,
    write_error: Option<String>,
    job: JobTimeline,
    status: StatusModel,
    status_mode: StatusMode,
    pinned: Option<PinnedStatus>,
    pending_markers: Vec<Marker>,
    /// `--iter-regex`: steps come from stdout, not from the hook.
    regex_steps: bool,
    emitted: BTreeMap<u32, ProcessInfo>,
    /// Every process of the job seen, with its start time, for cleanup.
    pub descendants: Arc<Mutex<Vec<(u32, u64)>>>,
    /// The processes that sent a step (the training loops), for the sampler, which reads the
    /// launchers above them at the slow tier only.
    pub loops: LoopPids,
    /// What `loops` holds, without its lock.
    loops_seen: BTreeSet<u32>,
    /// Called after every attribution round with the timeline and the new breakdowns (the
    /// agent ships them from here).
    tap: Option<Tap>,
}

/// See [`Recorder::with_tap`].
pub type Tap = Box<dyn FnMut(&JobTimeline, &[IterationBreakdown]) + Send>;

impl Recorder {
    /// A recorder writing to `writer` that starts with `header`.
    pub fn new(
        writer: ProfileWriter,
        header: RunHeader,
        status_mode: StatusMode,
        regex_steps: bool,
    ) -> Recorder {
        Self::start(Some(writer), header, status_mode, regex_steps)
    }

    /// A recorder that writes no profile (an agent: its records go to the collector).
    pub fn unwritten(header: RunHeader) -> Recorder {
        Self::start(None, header, StatusMode::Off, false)
    }

    fn start(
        writer: Option<ProfileWriter>,
        header: RunHeader,
        status_mode: StatusMode,
        regex_steps: bool,
    ) -> Recorder {
        let mut r = Recorder {
            writer,
            write_error: None,
            job: JobTimeline::default(),
            status: StatusModel::default(),
            status_mode,
            pinned: None,
            pending_markers: Vec::new(),
            regex_steps,
            emitted: BTreeMap::new(),
            descendants: Arc::default(),
            loops: LoopPids::default(),
            loops_seen: BTreeSet::new(),
            tap: None,
        };
        r.emit(Frame::Header(header));
        r
    }

    /// Calls `tap` after every attribution round (every 100 ms), before the timeline forgets
    /// what no pending iteration needs, with the iterations attributed in that round.
    pub fn with_tap(mut self, tap: Tap) -> Recorder {
        self.tap = Some(tap);
        self
    }

    /// Writes a frame to the profile and gives it to the timeline. A profile that cannot be
    /// written is reported once; the run goes on and is still summarised.
    fn emit(&mut self, frame: Frame) {
        if let Some(w) = self.writer.as_mut() {
            if let Err(e) = w.write(&frame) {
                self.fail_writer(e.to_string());
            }
        }
        self.job.ingest(&frame);
    }

    fn fail_writer(&mut self, why: String) {
        self.clear_status();
        eprintln!("stallscope: cannot write the profile any more ({why}); the run goes on");
        self.write_error = Some(why);
        self.writer = None;
    }

    fn on_event(&mut self, event: Event) -> Option<i32> {
        match event {
            Event::Sampler(SamplerEvent::Samples { decls, batch }) => {
                for d in decls {
                    self.emit(Frame::Series(d));
                }
                self.emit(Frame::Samples(batch));
            }
            Event::Sampler(SamplerEvent::Source(status)) => self.on_source(status),
            Event::Sampler(SamplerEvent::Processes { t_ns, live, gone }) => {
                self.on_processes(t_ns, &live, &gone)
            }
            Event::Marker(Received::Marker(m)) => {
                if !(self.regex_steps && m.event == MarkerEvent::Step) {
                    self.on_marker(m);
                }
            }
            Event::Marker(Received::Rejected(why)) => {
                self.clear_status();
                eprintln!("stallscope: rejected a malformed marker ({why}); further ones are only counted");
            }
            Event::RegexStep(m) => self.on_marker(m),
            Event::Finish(code) => return Some(code),
        }
        None
    }

    /// Queues a marker for the next frame; a step makes its sender a training loop.
    fn on_marker(&mut self, m: Marker) {
        if m.event == MarkerEvent::Step && self.loops_seen.insert(m.pid) {
            if let Ok(mut loops) = self.loops.lock() {
                loops.insert(m.pid);
            }
        }
        self.pending_markers.push(m);
    }

    fn on_source(&mut self, status: SourceStatus) {
        if !status.up {
            self.clear_status();
            eprintln!(
                "stallscope: source {} is down: {} (the run goes on without it)",
                status.source, status.message
            );
        }
        self.emit(Frame::Source(status));
    }

    fn role_of(
        &self,
        pid: u32,
        by_pid: &BTreeMap<u32, &ProcEntry>,
    ) -> (Role, Option<u32>, Option<u32>) {
        let ranks = self.job.markers.ranks();
        if let Some(r) = ranks.get(&pid) {
            return (Role::Rank, Some(*r), Some(pid));
        }
        let loader = self
            .job
            .markers
            .procs
            .get(&pid)
            .is_some_and(|m| m.meta.get("role").map(String::as_str) == Some("loader"));
        let mut p = pid;
        for _ in 0..64 {
            let Some(parent) = by_pid.get(&p).map(|e| e.ppid) else {
                break;
            };
            if let Some(r) = ranks.get(&parent) {
                let role = if loader { Role::Loader } else { Role::Helper };
                return (role, Some(*r), Some(parent));
            }
            p = parent;
        }
        (Role::Launcher, None, None)
    }

    fn on_processes(&mut self, t_ns: u64, live: &[ProcEntry], gone: &[u32]) {
        let by_pid: BTreeMap<u32, &ProcEntry> = live.iter().map(|e| (e.pid, e)).collect();
        for e in live {
            let (role, rank, rank_pid) = self.role_of(e.pid, &by_pid);
            let info = ProcessInfo {
                pid: e.pid,
                ppid: e.ppid,
                comm: e.comm.clone(),
                role,
                rank,
                rank_pid,
                seen_ns: t_ns,
            };
            let changed = self.emitted.get(&e.pid).is_none_or(|old| {
                (old.role, old.rank, old.ppid, &old.comm)
                    != (info.role, info.rank, info.ppid, &info.comm)
            });
            if changed {
                self.emitted.insert(e.pid, info.clone());
                self.emit(Frame::Process(info));
            }
        }
        for pid in gone {
            self.emitted.remove(pid);
            self.emit(Frame::ProcessExit { pid: *pid, t_ns });
        }
        if let Ok(mut d) = self.descendants.lock() {
            for e in live {
                if !d.iter().any(|(p, s)| *p == e.pid && *s == e.starttime) {
                    d.push((e.pid, e.starttime));
                }
            }
        }
    }

    fn attribute(&mut self, finishing: bool) {
        if !self.pending_markers.is_empty() {
            let ms = std::mem::take(&mut self.pending_markers);
            self.emit(Frame::Markers(ms));
        }
        let new = self.job.attribute_ready(monotonic_ns(), finishing);
        for b in &new {
            if let Some(w) = self.writer.as_mut() {
                if let Err(e) = w.write(&Frame::Breakdown(b.clone())) {
                    self.fail_writer(e.to_string());
                }
            }
        }
        self.status.update(&new);
        for b in &new {
            if let Some(ppm) = self
                .job
                .gpu_reading(b.rank, b.iter)
                .and_then(|g| g.busy_ppm)
            {
                self.status.gpu_busy(ppm);
            }
        }
        if let Some(tap) = self.tap.as_mut() {
            tap(&self.job, &new);
        }
        self.job.prune();
    }

    /// Gives the terminal's status row back (before a message, and at the end).
    fn clear_status(&mut self) {
        if let Some(p) = self.pinned.take() {
            p.end();
        }
    }

    fn draw_status(&mut self) {
        let line = self.status.render();
        match self.status_mode {
            StatusMode::Off => {}
            StatusMode::Terminal => {
                if self.pinned.is_none() {
                    self.pinned = PinnedStatus::begin();
                }
                if let Some(p) = self.pinned.as_mut() {
                    p.draw(&line);
                }
            }
            StatusMode::Lines => {
                let _ = writeln!(std::io::stderr().lock(), "{line}");
            }
        }
    }

    /// Runs until `Event::Finish` arrives on `rx` (or until every sender is gone), taking the
    /// events of `inbox` as it goes, then writes the end of the profile and returns the
    /// summary.
    pub fn run(mut self, rx: Receiver<Event>, inbox: Inbox, rejected: impl Fn() -> u64) -> Summary {
        let mut last_attr = Instant::now();
        let mut last_flush = Instant::now();
        let mut last_status = Instant::now();
        let status_every = match self.status_mode {
            StatusMode::Lines => Duration::from_secs(10),
            _ => Duration::from_secs(1),
        };
        let exit_code = loop {
            let until_next = ATTRIBUTE_EVERY.saturating_sub(last_attr.elapsed());
            match rx.recv_timeout(until_next) {
                Ok(ev) => {
                    if let Some(code) = self.on_event(ev) {
                        break code;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break -1,
            }
            if last_attr.elapsed() >= ATTRIBUTE_EVERY {
                for ev in inbox.0.take_all() {
                    self.on_event(ev);
                }
                self.attribute(false);
                last_attr = Instant::now();
            }
            if last_flush.elapsed() >= FLUSH_EVERY {
                if let Some(w) = self.writer.as_mut() {
                    if let Err(e) = w.flush() {
                        self.fail_writer(e.to_string());
                    }
                }
                last_flush = Instant::now();
            }
            if self.status_mode != StatusMode::Off && last_status.elapsed() >= status_every {
                self.draw_status();
                last_status = Instant::now();
            }
        };
        // Whatever is still queued (the last samples and markers) belongs to the run.
        for ev in inbox.0.take_all().into_iter().chain(rx.try_iter()) {
            let _ = self.on_event(ev);
        }
        self.attribute(true);
        self.emit(Frame::End(RunEnd {
            ended_mono_ns: monotonic_ns(),
            exit_code,
            markers_dropped: self.job.markers.dropped(),
            markers_rejected: rejected(),
        }));
        if let Some(w) = self.writer.take() {
            if let Err(e) = w.finish() {
                self.fail_writer(e.to_string());
            }
        }
        self.clear_status();
        summarize(&self.job)
    }
}
