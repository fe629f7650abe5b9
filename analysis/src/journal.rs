//! The journal: the one machine that writes a run's frames, ingests them, attributes the
//! iterations that are ready, keeps the live model and summarises.
//!
//! `stallscope run`, `stallscope agent` and `stallscope collector` each hold one, so the
//! profile a run writes, the numbers it attributes live, the model its views draw and the
//! summary it prints all come from the same frames through the same code, and a replay of
//! the profile ([`Journal::replay`]) rebuilds them. Where the frames go is a [`FrameSink`]
//! (the profile writer, or nothing on an agent), so this stays free of I/O.

use crate::attribution::IterationBreakdown;
use crate::frame::{Frame, RunEnd, RunHeader};
use crate::job::JobTimeline;
use crate::summary::{summarize, Summary};
use crate::view::{JobView, LiveModel, ViewUpdate};
use crate::Nanos;

/// Where a journal's frames are written: the profile.
pub trait FrameSink: Send {
    /// Writes one frame (buffered).
    fn write(&mut self, frame: &Frame) -> Result<(), String>;
    /// Makes what was written durable enough to acknowledge.
    fn flush(&mut self) -> Result<(), String>;
    /// Writes what is left and closes.
    fn finish(self: Box<Self>) -> Result<(), String>;
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
    /// ingested, everything attributed.
    pub fn replay<'a>(frames: impl IntoIterator<Item = &'a Frame>, name: &str) -> Journal {
        let mut j = Journal::reader(name);
        for f in frames {
            j.ingest(f);
        }
        j.attribute(u64::MAX, true);
        j
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
        self.ingest(&frame);
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

    /// The job timeline (what the agent's tap reads to ship iterations).
    pub fn timeline(&self) -> &JobTimeline {
        &self.timeline
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
