//! The recorder: one thread that takes every event of the node (samples, markers, processes,
//! sources), turns each into a frame for the [`Journal`] — which writes the profile, ingests,
//! attributes and keeps the live model — and publishes the model to the feed and the status.
//!
//! Every frame goes through [`Journal::emit`], so the timeline the live run attributes from is
//! exactly the one a replay of the profile rebuilds.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use stallscope_analysis::attribution::IterationBreakdown;
use stallscope_analysis::frame::{Frame, ProcessInfo, Role, RunEnd, RunHeader, SourceStatus};
use stallscope_analysis::hang::{self, HangEvent, HangWatch};
use stallscope_analysis::job::JobTimeline;
use stallscope_analysis::journal::retention::KeepHandle;
use stallscope_analysis::journal::{Breakdowns, FrameSink, Journal};
use stallscope_analysis::marker::{Marker, MarkerEvent, MAX_DATAGRAM};
use stallscope_analysis::process::ancestors;
use stallscope_analysis::slowdown::{self, SlowdownNews};
use stallscope_analysis::summary::{self, Summary};
use stallscope_analysis::view::JobView;

use super::feed::FeedHub;
use super::sample_merge::{SampleMerge, Stream};
use crate::clock::monotonic_ns;
use crate::markers::{Channel, Datagram as Received};
use crate::proctree::ProcEntry;
use crate::sampler::{MarkerNews, SamplerEvent};
use crate::sink::{Mailbox, Sink};

/// What the recorder is sent.
pub enum Event {
    /// From the CPU sampler thread.
    Sampler(SamplerEvent),
    /// From the GPU sampler thread ([`GpuInbox`]).
    GpuSampler(SamplerEvent),
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

impl Inbox {
    /// Where the GPU sampler thread puts its events: the same inbox, its batches told apart
    /// so that the two threads' can be put back in time order ([`SampleMerge`]).
    pub fn gpu(&self) -> GpuInbox {
        GpuInbox(self.clone())
    }
}

/// The [`Inbox`] as the GPU sampler thread puts into it ([`Inbox::gpu`]).
#[derive(Clone)]
pub struct GpuInbox(Inbox);

impl Sink<SamplerEvent> for GpuInbox {
    fn put(&self, item: SamplerEvent) -> bool {
        self.0 .0.push(Event::GpuSampler(item));
        true
    }
}

impl Sink<Received> for Inbox {
    fn put(&self, item: Received) -> bool {
        self.0.push(Event::Marker(item));
        true
    }
}

/// How often markers are written as a frame, ready iterations attributed and the model
/// published to the feed (at most 10 updates a second).
const ATTRIBUTE_EVERY: Duration = Duration::from_millis(100);
/// How often the profile is flushed to the file.
const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// Where the live status and the recorder's messages go (the terminal, in the binary).
pub trait StatusOut: Send {
    /// How often [`StatusOut::draw`] is called; `None`: never.
    fn every(&self) -> Option<Duration>;
    /// Draws the model.
    fn draw(&mut self, view: &JobView);
    /// Says something once (a source down, a profile that cannot be written), clearing the
    /// status first.
    fn say(&mut self, message: &str);
    /// Gives the terminal back (at the end).
    fn clear(&mut self);
}

/// No status; messages to stderr.
pub struct Stderr;

impl StatusOut for Stderr {
    fn every(&self) -> Option<Duration> {
        None
    }
    fn draw(&mut self, _: &JobView) {}
    fn say(&mut self, message: &str) {
        eprintln!("{message}");
    }
    fn clear(&mut self) {}
}

/// The recorder's state.
pub struct Recorder {
    journal: Journal,
    status: Box<dyn StatusOut>,
    feed: Option<Arc<FeedHub>>,
    pending_markers: Vec<Marker>,
    /// The processes' own marker channels, read at every round ([`Recorder::read_channels`]).
    channels: Vec<Channel>,
    /// Where a channel's markers are read into.
    channel_buf: Vec<u8>,
    /// `--iter-regex`: steps come from stdout, not from the hook.
    regex_steps: bool,
    emitted: BTreeMap<u32, ProcessInfo>,
    /// Every process of the job seen, with its start time, for cleanup.
    pub descendants: Arc<Mutex<Vec<(u32, u64)>>>,
    /// For the samplers: the processes that sent a step (the training loops; the sampler reads
    /// the launchers above them at the slow tier only), and when to discover again at once.
    pub news: MarkerNews,
    /// What `news.loops` holds, without its lock.
    loops_seen: BTreeSet<u32>,
    /// Senders not discovered when their first marker came, for which discovery was asked
    /// (once each; forgotten when discovery finds them gone, so a reused pid asks again).
    senders_announced: BTreeSet<u32>,
    /// Called after every attribution round with the timeline and the new breakdowns (the
    /// agent ships them from here).
    tap: Option<Tap>,
    /// Declares hangs (`stallscope run`); none on an agent.
    hang_watch: Option<HangWatch>,
    /// Writes the recent trace when a hang is declared ([`Recorder::with_flight_recorder`]).
    flight_recorder: Option<FlightRecorder>,
    /// Asks the profile's sample flight recorder to keep a stretch of samples; none when
    /// every sample is written (or nothing is).
    sample_keeper: Option<KeepHandle>,
    /// The slowdowns already said on stderr.
    slowdown_news: SlowdownNews,
    /// When a slowdown last wrote the flight recorder's trace (ns, the monotonic clock).
    last_slowdown_trace_ns: Option<u64>,
    /// The two sampler threads' batches, given to the journal in time order.
    samples: SampleMerge,
}

/// ns of raw samples kept in the profile before and after a slowdown is declared.
const SAMPLES_AROUND_SLOWDOWN_NS: u64 = 60_000_000_000;
/// ns after a slowdown's trace before another slowdown writes one: a trace is the last 60 s
/// of the run (up to ~15 MB for a fast loop), and what a second one in that minute would hold
/// the first mostly holds; its samples are kept in the profile all the same.
const SLOWDOWN_TRACE_GAP_NS: u64 = 60_000_000_000;

/// The flight recorder's hook: called, once the profile is flushed, with what happened
/// (`hang-37s`, a file-name part) and ns now on the profile's clock. It must not block (it
/// runs on the recorder's thread): `stallscope run` exports in a thread of its own.
pub type FlightRecorder = Box<dyn FnMut(&str, u64) + Send>;

/// See [`Recorder::with_tap`].
pub type Tap = Box<dyn FnMut(&JobTimeline, &JobView, &[IterationBreakdown]) + Send>;

impl Recorder {
    /// A recorder of job `name` writing to `sink` (none: an agent, whose records go to the
    /// collector) that starts with `header`; `regex_steps`: steps come from `--iter-regex`.
    pub fn new(
        sink: Option<Box<dyn FrameSink>>,
        header: RunHeader,
        name: &str,
        status: Box<dyn StatusOut>,
        regex_steps: bool,
    ) -> Recorder {
        let breakdowns = if sink.is_some() {
            Breakdowns::Written
        } else {
            Breakdowns::NotWritten
        };
        Recorder {
            journal: Journal::new(sink, header, name, breakdowns),
            status,
            feed: None,
            pending_markers: Vec::new(),
            channels: Vec::new(),
            channel_buf: vec![0; MAX_DATAGRAM + 1],
            regex_steps,
            emitted: BTreeMap::new(),
            descendants: Arc::default(),
            news: MarkerNews::default(),
            loops_seen: BTreeSet::new(),
            senders_announced: BTreeSet::new(),
            tap: None,
            hang_watch: None,
            flight_recorder: None,
            sample_keeper: None,
            slowdown_news: SlowdownNews::default(),
            last_slowdown_trace_ns: None,
            samples: SampleMerge::default(),
        }
    }

    /// Lets [`Recorder::keep_samples`] reach the profile's sample flight recorder
    /// ([`stallscope_analysis::journal::retention`]).
    pub fn with_sample_keeper(mut self, keeper: Option<KeepHandle>) -> Recorder {
        self.sample_keeper = keeper;
        self
    }

    /// Keeps the raw samples from `from_ns` to `to_ns` (the monotonic clock, ns) in the
    /// profile, for a moment that matters (a slowdown); nothing when every sample is written
    /// anyway. Never blocks the recorder for long: the request is read at the next sample.
    pub fn keep_samples(&self, from_ns: u64, to_ns: u64) {
        if let Some(k) = &self.sample_keeper {
            k.keep(from_ns, to_ns);
        }
    }

    /// Watches for a hang every attribution round: one is declared after `after_ns` without an
    /// iteration (`None`: the default threshold, see [`HangWatch::new`]).
    pub fn with_hang_watch(mut self, after_ns: Option<u64>) -> Recorder {
        self.hang_watch = Some(HangWatch::new(after_ns));
        self
    }

    /// Calls `hook` when a hang is declared (and wherever else the recent trace is wanted,
    /// through [`Recorder::record_flight`]).
    pub fn with_flight_recorder(mut self, hook: FlightRecorder) -> Recorder {
        self.flight_recorder = Some(hook);
        self
    }

    /// Flushes the profile and calls the flight recorder's hook with `what` (a file-name
    /// part: `hang-37s`, `slowdown-rank1-iter30`) at `now` (ns, the profile's clock).
    pub fn record_flight(&mut self, what: &str, now: u64) {
        if let Some(hook) = self.flight_recorder.as_mut() {
            // Frames held back to be deflated together too: the trace reads the file now.
            self.journal.flush_all();
            hook(what, now);
        }
    }

    /// Publishes the live model to `feed` (at most every 100 ms, only while it has
    /// subscribers).
    pub fn with_feed(mut self, feed: Arc<FeedHub>) -> Recorder {
        self.feed = Some(feed);
        self
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
        self.journal.emit(frame);
        self.say_write_failure();
    }

    fn say_write_failure(&mut self) {
        if let Some(why) = self.journal.take_write_failure() {
            self.status.say(&format!(
                "stallscope: cannot write the profile any more ({why}); the run goes on"
            ));
        }
    }

    fn on_event(&mut self, event: Event) -> Option<i32> {
        match event {
            Event::Sampler(e) => self.on_sampler(Stream::Cpu, e),
            Event::GpuSampler(e) => self.on_sampler(Stream::Gpu, e),
            Event::Marker(Received::Marker(m)) => {
                if !(self.regex_steps && m.event == MarkerEvent::Step) {
                    self.on_marker(m);
                }
            }
            Event::Marker(Received::Rejected(why)) => self.status.say(&format!(
                "stallscope: rejected a malformed marker ({why}); further ones are only counted"
            )),
            Event::Marker(Received::Channel(c)) => self.channels.push(c),
            Event::RegexStep(m) => self.on_marker(m),
            Event::Finish(code) => return Some(code),
        }
        None
    }

    /// An event of the sampler thread `stream`: its batches wait in the merge until the
    /// other thread's have caught up ([`Recorder::release_samples`]).
    fn on_sampler(&mut self, stream: Stream, event: SamplerEvent) {
        match event {
            SamplerEvent::Samples { decls, batch } => self.samples.push(stream, decls, batch),
            SamplerEvent::Source(status) => self.on_source(status),
            SamplerEvent::Flows(flows) => self.emit(Frame::NodeFlows(flows)),
            SamplerEvent::Processes { t_ns, live, gone } => {
                // The rounds before a discovery come before what it found, as they did before
                // the merge: a process's last readings precede the frame that says it is gone
                // (the samples' flight recorder keeps the samples before that frame).
                self.release_samples(false);
                self.on_processes(t_ns, &live, &gone)
            }
        }
    }

    /// Writes the samplers' batches that are in time order now (all of them with `all`).
    fn release_samples(&mut self, all: bool) {
        let mut merge = std::mem::take(&mut self.samples);
        merge.release(all, |(decls, batch)| {
            for d in decls {
                self.emit(Frame::Series(d));
            }
            self.emit(Frame::Samples(batch));
        });
        self.samples = merge;
    }

    /// Reads what every process's own channel holds, in the order the channels came, as if
    /// each marker had come through the listener; forgets the channels their processes closed.
    /// A channel comes after the markers its process sent before it (they reached the
    /// listener first), and is read after them.
    fn read_channels(&mut self) {
        let mut channels = std::mem::take(&mut self.channels);
        let mut buf = std::mem::take(&mut self.channel_buf);
        channels.retain_mut(|c| {
            c.drain(&mut buf, |d| {
                self.on_event(Event::Marker(d));
            })
        });
        self.channels = channels;
        self.channel_buf = buf;
    }

    /// Queues a marker for the next frame; a step makes its sender a training loop. A new loop,
    /// or the first marker of a process not yet discovered, asks the sampler to discover now:
    /// a loop's workers are watched thread by thread only once the loop is known.
    fn on_marker(&mut self, m: Marker) {
        let mut news = false;
        if m.event == MarkerEvent::Step && self.loops_seen.insert(m.pid) {
            if let Ok(mut loops) = self.news.loops.lock() {
                loops.insert(m.pid);
            }
            news = true;
        }
        if !self.emitted.contains_key(&m.pid) && self.senders_announced.insert(m.pid) {
            news = true;
        }
        if news {
            self.news.discover_now.store(true, Ordering::Release);
        }
        self.pending_markers.push(m);
    }

    fn on_source(&mut self, status: SourceStatus) {
        if !status.up {
            self.status.say(&format!(
                "stallscope: source {} is down: {} (the run goes on without it)",
                status.source, status.message
            ));
        }
        self.emit(Frame::Source(status));
    }

    fn role_of(
        &self,
        pid: u32,
        by_pid: &BTreeMap<u32, &ProcEntry>,
    ) -> (Role, Option<u32>, Option<u32>) {
        let job = self.journal.timeline();
        let ranks = job.node.markers.ranks();
        if let Some(r) = ranks.get(&pid) {
            return (Role::Rank, Some(*r), Some(pid));
        }
        let loader = job
            .node
            .markers
            .procs
            .get(&pid)
            .is_some_and(|m| m.info().is_loader());
        let rank_above = ancestors(pid, |p| by_pid.get(&p).map(|e| e.ppid))
            .find_map(|up| ranks.get(&up).map(|r| (*r, up)));
        match rank_above {
            Some((rank, rank_pid)) => {
                let role = if loader { Role::Loader } else { Role::Helper };
                (role, Some(rank), Some(rank_pid))
            }
            None => (Role::Launcher, None, None),
        }
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
            self.senders_announced.remove(pid);
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
        let now = monotonic_ns();
        let new = self.journal.attribute(now, finishing);
        self.say_write_failure();
        if !finishing {
            self.watch_for_hang(now);
        }
        self.say_slowdowns(now);
        if let Some(tap) = self.tap.as_mut() {
            tap(self.journal.timeline(), self.journal.view(), &new);
        }
        let update = self.journal.take_update();
        if let Some(feed) = &self.feed {
            feed.publish(self.journal.view(), update);
        }
        self.journal.prune();
    }

    /// Declares a hang, with the loops' stacks, or its end: on stderr and as a frame (the
    /// summary's `hangs`). Fetching the stacks holds this thread up to a second, once per hang.
    fn watch_for_hang(&mut self, now: u64) {
        let Some(watch) = self.hang_watch.as_mut() else {
            return;
        };
        let job = self.journal.timeline();
        let started = job.header.as_ref().map_or(0, |h| h.started_mono_ns);
        match watch.check(&job.node.markers, &job.node.exited, now, started) {
            Some(HangEvent::Declared(mut report)) => {
                report.stacks = super::stacks::fetch(&job.node.markers, &report.ranks);
                hang::refine_by_stacks(&mut report.ranks, &report.stacks);
                self.status.say(&hang::describe(&report));
                let what = format!("hang-{:.0}s", report.at_seconds);
                self.emit(Frame::Hang(report));
                self.record_flight(&what, now);
            }
            Some(HangEvent::Resumed {
                at_seconds,
                after_seconds,
            }) => {
                self.status.say(&format!(
                    "stallscope: the job resumed: a rank finished an iteration {after_seconds:.0} s after the hang was declared"
                ));
                let known = job.hangs.iter().find(|h| h.at_seconds == at_seconds);
                if let Some(mut report) = known.cloned() {
                    report.resumed_after_seconds = Some(after_seconds);
                    self.emit(Frame::Hang(Box::new(report)));
                }
            }
            None => {}
        }
    }

    /// Says each rank that turned slow, and each that recovered, once (the job timeline finds
    /// them as it records iterations). A new slowdown also keeps the raw samples around `now`
    /// (ns, the monotonic clock) in the profile, and writes the recent trace beside it (the
    /// flight recorder), as a hang does, unless another slowdown wrote one in the last
    /// [`SLOWDOWN_TRACE_GAP_NS`].
    fn say_slowdowns(&mut self, now: u64) {
        let job = self.journal.timeline();
        if job.summary.slowdowns.found().is_empty() {
            return;
        }
        for s in self.slowdown_news.take(&summary::slowdowns(job)) {
            self.status.say(&slowdown::describe(&s));
            if s.ongoing() {
                self.keep_samples(
                    now.saturating_sub(SAMPLES_AROUND_SLOWDOWN_NS),
                    now.saturating_add(SAMPLES_AROUND_SLOWDOWN_NS),
                );
                let recent = self
                    .last_slowdown_trace_ns
                    .is_some_and(|at| now.saturating_sub(at) < SLOWDOWN_TRACE_GAP_NS);
                if !recent {
                    self.last_slowdown_trace_ns = Some(now);
                    let what = format!("slowdown-rank{}-iter{}", s.rank, s.since_iteration);
                    self.record_flight(&what, now);
                }
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
                self.read_channels();
                self.release_samples(false);
                self.attribute(false);
                last_attr = Instant::now();
            }
            if last_flush.elapsed() >= FLUSH_EVERY {
                self.journal.flush();
                self.say_write_failure();
                last_flush = Instant::now();
            }
            if self
                .status
                .every()
                .is_some_and(|every| last_status.elapsed() >= every)
            {
                self.status.draw(self.journal.view());
                last_status = Instant::now();
            }
        };
        // Whatever is still queued (the last samples and markers) belongs to the run.
        for ev in inbox.0.take_all().into_iter().chain(rx.try_iter()) {
            let _ = self.on_event(ev);
        }
        self.read_channels();
        self.release_samples(true);
        self.attribute(true);
        let end = RunEnd {
            ended_mono_ns: monotonic_ns(),
            exit_code,
            markers_dropped: self.journal.timeline().node.markers.dropped(),
            markers_rejected: rejected(),
        };
        let (summary, _) = self.journal.finish(monotonic_ns(), end);
        if let Some(feed) = &self.feed {
            feed.end();
        }
        self.status.clear();
        summary
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marker(pid: u32, event: MarkerEvent) -> Marker {
        Marker {
            seq: 0,
            t_ns: 1_000,
            pid,
            rank: Some(0),
            iter: 0,
            event,
        }
    }

    /// The sampler is asked to discover again at once by a process it has not found yet
    /// (a loader worker's first marker) and by a loop's first step (its workers are then
    /// watched thread by thread), once each; not by every marker. A sender found gone is
    /// forgotten.
    #[test]
    fn a_new_sender_or_a_new_loop_asks_for_discovery_once() {
        let mut r = Recorder::new(
            None,
            super::super::header(&[], 100.0, 1),
            "t",
            Box::new(Stderr),
            false,
        );
        let asked = |r: &Recorder| r.news.discover_now.swap(false, Ordering::AcqRel);
        r.on_processes(
            1,
            &[ProcEntry {
                pid: 10,
                ppid: 1,
                comm: "python".into(),
                starttime: 5,
            }],
            &[],
        );
        r.on_marker(marker(10, MarkerEvent::Begin("forward".into())));
        assert!(!asked(&r), "a discovered process's marker asks nothing");
        r.on_marker(marker(10, MarkerEvent::Step));
        assert!(asked(&r), "a new loop asks");
        r.on_marker(marker(10, MarkerEvent::Step));
        assert!(!asked(&r), "a known loop does not");
        r.on_marker(marker(11, MarkerEvent::Begin("fetch".into())));
        assert!(asked(&r), "an undiscovered sender asks");
        r.on_marker(marker(11, MarkerEvent::End("fetch".into())));
        assert!(!asked(&r), "once");
        r.on_processes(2, &[], &[11]);
        r.on_marker(marker(11, MarkerEvent::Begin("fetch".into())));
        assert!(
            asked(&r),
            "a pid found gone and sending again (reused) asks again"
        );
        assert_eq!(
            r.news
                .loops
                .lock()
                .unwrap()
                .iter()
                .copied()
                .collect::<Vec<_>>(),
            [10]
        );
    }
}
