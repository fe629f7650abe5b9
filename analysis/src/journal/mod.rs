//! The journal: the one machine that writes a run's frames, ingests them, attributes the
//! iterations that are ready, keeps the live model and summarises.
//!
//! `stallscope run`, `stallscope agent` and `stallscope collector` each hold one, so the
//! profile a run writes, the numbers it attributes live, the model its views draw and the
//! summary it prints all come from the same frames through the same code, and a replay of
//! the profile ([`Journal::replay`]) rebuilds them. Where the frames go is a [`FrameSink`]
//! (the profile writer, or nothing on an agent), so this stays free of I/O.

pub mod packing;
pub mod replay;
pub mod retention;
pub mod thinning;

use crate::attribution::IterationBreakdown;
use crate::frame::{Frame, RunEnd, RunHeader};
use crate::job::JobTimeline;
use crate::summary::{summarize, Summary};
use std::borrow::Borrow;

use crate::timeline::{LinkPeaks, PeaksPass};

use crate::view::{JobView, LiveModel, ViewUpdate};
use crate::Nanos;
use replay::frame_time;

/// ns of the frames' time between two attribution rounds of a replay, as the live run
/// attributes.
pub const REPLAY_STEP_NS: Nanos = 1_000_000_000;

/// ns of the frames' time between two summaries of a replayed model: only the last one is
/// read, so this only bounds how stale it gets on the way.
pub const REPLAY_SUMMARY_EVERY_NS: Nanos = 600 * REPLAY_STEP_NS;

/// Where a journal's frames are written: the profile.
pub trait FrameSink: Send {
    /// Writes one frame (buffered).
    fn write(&mut self, frame: &Frame) -> Result<(), String>;
    /// Writes one frame whose encoding the caller has (`payload`, `frame.encode()`'s bytes),
    /// so that it need not be encoded again. By default, [`FrameSink::write`].
    fn write_encoded(&mut self, frame: &Frame, payload: &[u8]) -> Result<(), String> {
        let _ = payload;
        self.write(frame)
    }
    /// Makes what was written durable enough to acknowledge.
    fn flush(&mut self) -> Result<(), String>;
    /// Puts every frame written so far in the file now, frames a sink holds back to pack
    /// together included, for a reader of the file while it is written (the flight
    /// recorder's trace). By default, [`FrameSink::flush`].
    fn flush_all(&mut self) -> Result<(), String> {
        self.flush()
    }
    /// Writes what is left and closes.
    fn finish(self: Box<Self>) -> Result<(), String>;
    /// Whether the journal should write its running totals now ([`Frame::IterationTotals`],
    /// after an attribution round): a sink that leaves iterations out asks for them, now and
    /// then and when the run ends (`finishing`). By default, never.
    fn wants_totals(&mut self, _finishing: bool) -> bool {
        false
    }
}

/// What a journal writes computed breakdowns as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Breakdowns {
    /// `Frame::Breakdown` after each attribution (for other readers of a run's profile;
    /// replay re-derives them).
    Written,
    /// Not written (a collector's job profile holds the nodes' reports instead).
    NotWritten,
}

/// Frames in, attributed iterations, a live model and a summary out.
pub struct Journal {
    sink: Option<Box<dyn FrameSink>>,
    /// Why the sink failed, once it did.
    write_error: Option<String>,
    /// A failure not yet taken by [`Journal::take_write_failure`].
    new_failure: Option<String>,
    breakdowns: Breakdowns,
    timeline: JobTimeline,
    live: LiveModel,
}

impl Journal {
    /// A journal of job `name` writing to `sink` (none: keep nothing), starting with `header`.
    pub fn new(
        sink: Option<Box<dyn FrameSink>>,
        header: RunHeader,
        name: &str,
        breakdowns: Breakdowns,
    ) -> Journal {
        let mut j = Journal {
            sink,
            write_error: None,
            new_failure: None,
            breakdowns,
            timeline: JobTimeline::default(),
            live: LiveModel::new(name),
        };
        j.emit(Frame::Header(header));
        j
    }

    /// A journal that writes nothing, for rebuilding a profile's model frame by frame
    /// ([`Journal::ingest`], [`Journal::attribute`]).
    pub fn reader(name: &str) -> Journal {
        Journal {
            sink: None,
            write_error: None,
            new_failure: None,
            breakdowns: Breakdowns::NotWritten,
            timeline: JobTimeline::default(),
            live: LiveModel::new(name),
        }
    }

    /// Summarises every `ns` of the job's time ([`LiveModel::set_summary_every`]).
    pub fn set_summary_every(&mut self, ns: Nanos) {
        self.live.set_summary_every(ns);
    }

    /// Rebuilds the journal of a profile's frames, as the live run ended it: every frame
    /// ingested, everything attributed ([`Journal::replaying`]).
    pub fn replay<F: Borrow<Frame>>(frames: impl IntoIterator<Item = F>, name: &str) -> Journal {
        Journal::reader(name).replaying(frames)
    }

    /// Takes every frame of a profile into this reader journal and attributes everything.
    /// The frames are taken one at a time (a profile's reader can stream them): every
    /// [`REPLAY_STEP_NS`] of the frames' time what is ready is attributed and what no pending
    /// iteration needs is forgotten, so memory follows the run's pending window, not its
    /// length; the model is summarised every [`REPLAY_SUMMARY_EVERY_NS`] and at the end.
    pub fn replaying<F: Borrow<Frame>>(mut self, frames: impl IntoIterator<Item = F>) -> Journal {
        self.set_summary_every(REPLAY_SUMMARY_EVERY_NS);
        let mut next_step: Option<Nanos> = None;
        for f in frames {
            let f = f.borrow();
            if let Some(t) = frame_time(f) {
                let next = *next_step.get_or_insert(t.saturating_add(REPLAY_STEP_NS));
                if t >= next {
                    let boundary = next + (t - next) / REPLAY_STEP_NS * REPLAY_STEP_NS;
                    self.attribute(boundary, false);
                    self.take_update();
                    self.prune();
                    next_step = Some(boundary.saturating_add(REPLAY_STEP_NS));
                }
            }
            self.ingest(f);
        }
        self.attribute(u64::MAX, true);
        self
    }

    /// Attributes every iteration with `peaks` as the node's link peaks (the whole run's, from
    /// [`link_peaks_of`]) instead of the peaks seen so far: what a replay attributing as it
    /// goes needs to give what attributing everything at the end gives.
    pub fn assume_link_peaks(&mut self, peaks: LinkPeaks) {
        self.timeline.node.series.assume_link_peaks(peaks);
    }

    /// Takes a frame in without writing it (a frame read back from a profile).
    pub fn ingest(&mut self, frame: &Frame) {
        self.timeline.ingest(frame);
        self.live.ingest(frame);
    }

    /// Writes a frame and takes it in. A sink that fails is dropped: the journal goes on
    /// (the run is still summarised), and the failure is kept for
    /// [`Journal::take_write_failure`].
    pub fn emit(&mut self, frame: Frame) {
        self.write(&frame);
        // The live model first: the timeline keeps the frame (a node's iteration waits for
        // the cross-node join) without a copy. Neither reads the other on the way in.
        self.live.ingest(&frame);
        self.timeline.ingest_owned(frame);
    }

    /// [`Journal::emit`] of a frame whose encoding the caller has (`payload`, exactly
    /// `frame.encode()`'s bytes: a node's record as it came, its node name put in), so that
    /// the sink writes it without encoding it again.
    pub fn emit_encoded(&mut self, frame: Frame, payload: &[u8]) {
        if let Some(s) = self.sink.as_mut() {
            if let Err(e) = s.write_encoded(&frame, payload) {
                self.fail(e);
            }
        }
        self.live.ingest(&frame);
        self.timeline.ingest_owned(frame);
    }

    fn write(&mut self, frame: &Frame) {
        if let Some(s) = self.sink.as_mut() {
            if let Err(e) = s.write(frame) {
                self.fail(e);
            }
        }
    }

    fn fail(&mut self, why: String) {
        self.sink = None;
        self.new_failure = Some(why.clone());
        self.write_error = Some(why);
    }

    /// The sink's failure, once, when it just failed.
    pub fn take_write_failure(&mut self) -> Option<String> {
        self.new_failure.take()
    }

    /// Whether frames still reach the sink.
    pub fn is_writing(&self) -> bool {
        self.sink.is_some()
    }

    /// Attributes (and, in a job, joins) what is ready at `now` (ns, the timeline's clock),
    /// writes the breakdowns when asked to, and updates the live model. The timeline keeps
    /// what the new iterations needed until [`Journal::prune`].
    pub fn attribute(&mut self, now: Nanos, finishing: bool) -> Vec<IterationBreakdown> {
        let new = self.timeline.attribute_ready(now, finishing);
        if self.breakdowns == Breakdowns::Written {
            for b in &new {
                self.write(&Frame::Breakdown(b.clone()));
            }
            if self
                .sink
                .as_mut()
                .is_some_and(|s| s.wants_totals(finishing))
            {
                let totals = self.timeline.iteration_totals();
                self.write(&Frame::IterationTotals(Box::new(totals)));
            }
        }
        let now = if now == u64::MAX {
            self.timeline.summary.totals.last_end_ns.unwrap_or(0)
        } else {
            now
        };
        self.live.observe(&self.timeline, &new, now, finishing);
        new
    }

    /// Forgets what no pending iteration needs.
    pub fn prune(&mut self) {
        self.timeline.prune();
    }

    /// Flushes the sink.
    pub fn flush(&mut self) {
        if let Some(s) = self.sink.as_mut() {
            if let Err(e) = s.flush() {
                self.fail(e);
            }
        }
    }

    /// Puts every frame written so far in the file, those held back to be packed together
    /// included ([`FrameSink::flush_all`]): for a reader of the profile while it is written.
    pub fn flush_all(&mut self) {
        if let Some(s) = self.sink.as_mut() {
            if let Err(e) = s.flush_all() {
                self.fail(e);
            }
        }
    }

    /// The job timeline (what the agent's tap reads to ship iterations).
    pub fn timeline(&self) -> &JobTimeline {
        &self.timeline
    }

    /// Joins at most `rank_iterations` across nodes per [`Journal::attribute`] (whole
    /// iterations; see [`crate::crossnode::CrossNode::limit_rounds`]).
    pub fn limit_rounds(&mut self, rank_iterations: usize) {
        self.timeline.nodes.limit_rounds(rank_iterations);
    }

    /// The live model.
    pub fn view(&self) -> &JobView {
        self.live.view()
    }

    /// What changed in the live model since the last call.
    pub fn take_update(&mut self) -> ViewUpdate {
        self.live.take_update()
    }

    /// Attributes what is left at `now` (ns), writes `end`, closes the sink and returns the
    /// summary and why the sink failed, if it did.
    pub fn finish(mut self, now: Nanos, end: RunEnd) -> (Summary, Option<String>) {
        self.attribute(now, true);
        self.emit(Frame::End(end));
        if let Some(s) = self.sink.take() {
            if let Err(e) = s.finish() {
                self.fail(e);
            }
        }
        (summarize(&self.timeline), self.write_error)
    }
}

/// The link peaks of a profile's whole run (its own samples'), from its frames taken one at a
/// time: the first pass of a replay that must attribute as if at the end
/// ([`Journal::assume_link_peaks`]).
pub fn link_peaks_of<F: Borrow<Frame>>(frames: impl IntoIterator<Item = F>) -> LinkPeaks {
    let mut pass = PeaksPass::default();
    for f in frames {
        match f.borrow() {
            Frame::Series(d) => pass.declare(d.clone()),
            Frame::Samples(b) => pass.ingest(b),
            _ => {}
        }
    }
    pass.peaks()
}

/// A sink that keeps every frame written, for tests of what reaches a profile.
#[cfg(test)]
#[derive(Clone, Default)]
pub(crate) struct CollectingSink(pub std::sync::Arc<std::sync::Mutex<Vec<Frame>>>);

#[cfg(test)]
impl FrameSink for CollectingSink {
    fn write(&mut self, frame: &Frame) -> Result<(), String> {
        self.0.lock().unwrap().push(frame.clone());
        Ok(())
    }
    fn flush(&mut self) -> Result<(), String> {
        Ok(())
    }
    fn finish(self: Box<Self>) -> Result<(), String> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::marker::{Marker, MarkerEvent};
    use crate::series::{SampleBatch, SeriesDecl, SeriesId, SeriesKind};

    const MS: Nanos = 1_000_000;

    /// 200 s of a loop stepping every 100 ms after 30 ms of communication, its CPU and a NIC
    /// sampled every 10 ms, in file order.
    fn long_profile() -> Vec<Frame> {
        let mut frames = vec![
            Frame::Header(RunHeader::default()),
            Frame::Series(SeriesDecl {
                id: SeriesId(1),
                name: crate::series::names::PROC_CPU_NS.into(),
                unit: "ns".into(),
                kind: SeriesKind::Counter,
                labels: vec![("pid".into(), "7".into())],
            }),
        ];
        frames.push(Frame::Series(SeriesDecl {
            id: SeriesId(2),
            name: crate::series::names::NET_RX_BYTES.into(),
            unit: "bytes".into(),
            kind: SeriesKind::Counter,
            labels: vec![
                ("iface".into(), "eth0".into()),
                ("link".into(), crate::series::LINK_NIC.into()),
            ],
        }));
        let mut rx = 0;
        for tick in 1..=20_000u64 {
            let t = tick * 10 * MS;
            // Nothing on the NIC until 100 MB/s for the last 5 s: the run's peak comes at its
            // end.
            rx += if tick > 19_500 { 1_000_000 } else { 0 };
            frames.push(Frame::Samples(SampleBatch {
                t_ns: t,
                dur_ns: 0,
                values: vec![(SeriesId(1), t / 2), (SeriesId(2), rx)],
            }));
            if tick % 10 == 0 {
                let mark = |seq: u64, t_ns: Nanos, event: MarkerEvent| Marker {
                    seq,
                    t_ns,
                    pid: 7,
                    rank: Some(0),
                    iter: tick / 10,
                    event,
                };
                let comm = || crate::marker::phase::COMM.to_string();
                frames.push(Frame::Markers(vec![
                    mark(3 * tick, t - 30 * MS, MarkerEvent::Begin(comm())),
                    mark(3 * tick + 1, t, MarkerEvent::End(comm())),
                    mark(3 * tick + 2, t, MarkerEvent::Step),
                ]));
            }
        }
        frames
    }

    #[test]
    fn a_replay_holds_the_pending_window_and_sums_up_as_the_whole_profile_at_once() {
        let frames = long_profile();
        let mut j = Journal::reader("");
        j.assume_link_peaks(link_peaks_of(&frames));
        let j = j.replaying(&frames);
        let held = j.timeline().node.held();
        assert!(held.samples < 2_000, "{held:?} of 20000 samples held");

        let mut whole = JobTimeline::default();
        frames.iter().for_each(|f| whole.ingest(f));
        whole.attribute_ready(u64::MAX, true);
        let (streamed, at_once) = (summarize(j.timeline()), summarize(&whole));
        assert!(at_once.job.iterations > 1_900, "{:?}", at_once.job);
        assert_eq!(streamed, at_once);
        // Attributed with the peaks seen so far, the early iterations' communication would
        // go to the interconnect (no NIC byte yet), unlike attributing everything at the end.
        let so_far = summarize(Journal::replay(&frames, "").timeline());
        assert_ne!(so_far.job.categories, at_once.job.categories);
    }
}
