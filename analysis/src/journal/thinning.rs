//! A fast loop's per-iteration detail at a bounded rate, with the live run's exact totals in
//! between (issue 31).
//!
//! Once the samples are thinned ([`super::retention`]), a run profile grows with its
//! iterations: each rank-iteration's markers and breakdown take ~60 bytes packed
//! ([`super::packing`]), so a loop of 1-ms iterations on 2 ranks would write ~400 MB an hour.
//! [`Thinning`], a [`FrameSink`] between the flight recorder and the packer, writes the
//! markers and breakdowns of every iteration only while the node's ranks finish at most
//! [`DETAIL_PER_S`] rank-iterations a second on average (a token bucket, [`BURST`] deep:
//! a 100-ms loop of 2 ranks keeps everything); above it, it keeps that many, spread evenly
//! (the same iteration numbers on every rank), and always:
//!
//! - the first and the last [`ENDS_NS`] of the run;
//! - around a hang ([`Frame::Hang`]): what it holds and [`HANG_AFTER_NS`] after;
//! - a long iteration (over [`LONG_FACTOR`](super::retention::LONG_FACTOR) × its rank's
//!   recent median) and around any stretch asked for through a [`KeepHandle`] (a slowdown);
//! - every marker that is not an iteration's (a process's `meta`), and those of processes
//!   that write no breakdown (loaders);
//! - everything, once a GPU's series is declared (each iteration's GPU readings are summed
//!   from the samples, not from totals).
//!
//! What it leaves out the summary still counts: it asks the journal for its running totals
//! ([`FrameSink::wants_totals`], written as [`Frame::IterationTotals`]) every
//! [`TOTALS_EVERY_NS`] while it leaves iterations out, and at the end of every run (so that
//! a replay also finds the slowdowns the live run found, whatever rounds it folds them in), and a reader takes those in place of its own
//! (`JobTimeline`), so `summary` (and the report's summary) gives the live run's figures;
//! `run_facts::RunFactsFold` (what `advise` and `experiment` read) folds the breakdowns
//! written, so above the rate it sees the kept iterations only. Frames are
//! held [`HOLD_NS`] before they are written, in order, so that an iteration's markers are
//! kept or left out with its breakdown; a kept iteration keeps its previous step too, so a
//! reader knows its bounds.

use std::collections::{HashMap, HashSet, VecDeque};

use super::retention::{KeepHandle, RecentWalls};
use super::FrameSink;
use crate::frame::Frame;
use crate::marker::MarkerEvent;
use crate::series::LABEL_GPU;
use crate::Nanos;

/// Rank-iterations a second whose markers and breakdowns are written, on average, once a loop
/// is faster: ~60 bytes each packed, ~11 MB an hour.
pub const DETAIL_PER_S: f64 = 50.0;

/// Rank-iterations of detail that may be written at once after a quiet stretch.
pub const BURST: f64 = 50.0;

/// ns, the run's first and last stretch of this length keep every iteration (shorter than
/// [`HOLD_NS`], so that the last stretch's first iteration still has its previous step).
pub const ENDS_NS: Nanos = 1_000_000_000;

/// ns, frames are held this long before they are written: about twice as long as an
/// iteration's breakdown comes after its markers (an attribution round), so that it decides
/// them. Markers of an iteration not decided yet are written, and then so is the iteration.
/// Not longer: a reader of the profile while it is written sees them this much later.
pub const HOLD_NS: Nanos = 2_000_000_000;

/// ns, iterations kept whole after a hang.
pub const HANG_AFTER_NS: Nanos = 60_000_000_000;

/// ns of the frames' time between two [`Frame::IterationTotals`] while iterations are left
/// out: what a profile cut short (a SIGKILL) reads approximately, from the last one on.
pub const TOTALS_EVERY_NS: Nanos = 60_000_000_000;

/// Decisions remembered, by iteration number: far more than [`ENDS_NS`] of any loop holds.
const DECISIONS_KEPT: usize = 1 << 16;

/// What was decided of one iteration number (every rank's).
#[derive(Clone, Copy, Debug)]
struct Decision {
    kept: bool,
    /// Kept on the rate's credit (not forced): each rank's breakdown of it is charged.
    charged: bool,
    /// ns, the latest end of its breakdowns.
    end_ns: Nanos,
}

/// A [`FrameSink`] that leaves out fast loops' per-iteration frames above a rate (module
/// docs).
pub struct Thinning {
    inner: Box<dyn FrameSink>,
    /// Frames not yet written, oldest first, with the frames' time when each came.
    held: VecDeque<(Nanos, Frame)>,
    /// ns, the latest frame time seen.
    now: Nanos,
    /// ns, the first breakdown's start.
    first_ns: Option<Nanos>,
    /// By iteration number.
    decided: HashMap<u64, Decision>,
    /// Iteration numbers decided, oldest first (to forget them).
    order: VecDeque<u64>,
    /// Rank-iterations of detail that may be written now.
    credit: f64,
    /// ns, the end of the latest breakdown (the bucket's clock).
    credit_ns: Option<Nanos>,
    /// Stretches (from, to) ns whose iterations are kept.
    keep: Vec<(Nanos, Nanos)>,
    handle: Option<KeepHandle>,
    walls: RecentWalls,
    /// Processes that wrote a breakdown: only their markers are thinned.
    loops: HashSet<u32>,
    /// Every iteration is kept from now on (a GPU's series was declared).
    keep_all: bool,
    /// Rank-iterations left out so far.
    dropped: u64,
    /// Some iteration was decided against.
    left_out: bool,
    /// The latest iteration whose markers were written before it was decided: it and those
    /// before are kept.
    written_undecided: Option<u64>,
    /// ns, when the journal last wrote its totals.
    totals_ns: Option<Nanos>,
}

impl Thinning {
    /// Thins the per-iteration frames written to `inner`.
    pub fn new(inner: Box<dyn FrameSink>) -> Thinning {
        Thinning {
            inner,
            held: VecDeque::new(),
            now: 0,
            first_ns: None,
            decided: HashMap::new(),
            order: VecDeque::new(),
            credit: BURST,
            credit_ns: None,
            keep: Vec::new(),
            handle: None,
            walls: RecentWalls::default(),
            loops: HashSet::new(),
            keep_all: false,
            dropped: 0,
            left_out: false,
            written_undecided: None,
            totals_ns: None,
        }
    }

    /// Keeps the iterations of the stretches asked for through `handle` too.
    pub fn with_keeper(mut self, handle: KeepHandle) -> Thinning {
        self.handle = Some(handle);
        self
    }

    /// Rank-iterations whose markers and breakdown were left out so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Keeps the iterations ending in `(from, to)`: those decided already and those to come.
    fn keep_span(&mut self, from: Nanos, to: Nanos) {
        for d in self.decided.values_mut() {
            if (from..=to).contains(&d.end_ns) {
                d.kept = true;
            }
        }
        self.keep.push((from, to));
    }

    fn take_requests(&mut self) {
        let asked = self
            .handle
            .as_ref()
            .map(KeepHandle::take)
            .unwrap_or_default();
        for (from, to) in asked {
            self.keep_span(from, to);
        }
    }

    /// Decides iteration `b.iter` when its first breakdown comes: whether every rank's markers
    /// and breakdown of it are written.
    fn decide(&mut self, b: &crate::attribution::IterationBreakdown) {
        self.loops.insert(b.pid);
        let long = self.walls.is_long(b.rank, b.wall_ns());
        let first = *self.first_ns.get_or_insert(b.start_ns);
        let last = self.credit_ns.unwrap_or(b.end_ns);
        if b.end_ns > last {
            let dt = (b.end_ns - last) as f64 / 1e9;
            self.credit = (self.credit + dt * DETAIL_PER_S).min(BURST);
        }
        self.credit_ns = Some(last.max(b.end_ns));
        if let Some(d) = self.decided.get_mut(&b.iter) {
            d.end_ns = d.end_ns.max(b.end_ns);
            if d.charged {
                self.credit -= 1.0;
            } else if long {
                d.kept = true;
            }
            return;
        }
        let kept_at = |i: Option<u64>| i.and_then(|i| self.decided.get(&i)).map(|d| d.kept);
        // Iteration i - 1 left out between two kept ones would have its bounds and no
        // breakdown: a reader would attribute it from what samples are left.
        let gap_of_one = kept_at(b.iter.checked_sub(1)) == Some(false)
            && kept_at(b.iter.checked_sub(2)) == Some(true);
        let forced = self.keep_all
            || long
            || self.written_undecided.is_some_and(|w| b.iter <= w)
            || b.start_ns < first.saturating_add(ENDS_NS)
            || self
                .keep
                .iter()
                .any(|(from, to)| b.end_ns >= *from && b.start_ns <= *to);
        let charged = !forced && self.credit >= 1.0 && !gap_of_one;
        let kept = forced || charged;
        if charged {
            self.credit -= 1.0;
        }
        self.left_out |= !kept;
        self.decided.insert(
            b.iter,
            Decision {
                kept,
                charged,
                end_ns: b.end_ns,
            },
        );
        self.order.push_back(b.iter);
        if self.order.len() > DECISIONS_KEPT {
            if let Some(old) = self.order.pop_front() {
                self.decided.remove(&old);
            }
        }
        let now = self.now;
        self.keep
            .retain(|(_, to)| *to >= now.saturating_sub(HOLD_NS));
    }

    /// Whether iteration `iter`'s frames are written: yes unless it was decided against,
    /// or when both its neighbours are kept (left out between them, a reader would have its
    /// bounds and no breakdown, and attribute it from what samples are left).
    fn kept(&self, iter: u64) -> bool {
        let kept = |i: u64| self.decided.get(&i).is_none_or(|d| d.kept);
        kept(iter) || (iter > 0 && kept(iter - 1) && kept(iter + 1))
    }

    /// `frame` as it is written, if at all: markers of the iterations left out dropped.
    fn thinned(&mut self, frame: Frame) -> Option<Frame> {
        match frame {
            Frame::Breakdown(b) if !self.kept(b.iter) => {
                self.dropped += 1;
                None
            }
            Frame::Markers(ms) if !ms.is_empty() => {
                for m in &ms {
                    if self.loops.contains(&m.pid) && !self.decided.contains_key(&m.iter) {
                        self.written_undecided = self.written_undecided.max(Some(m.iter));
                    }
                }
                let ms: Vec<_> = ms
                    .into_iter()
                    .filter(|m| {
                        !self.loops.contains(&m.pid)
                            || matches!(m.event, MarkerEvent::Meta(_))
                            || self.kept(m.iter)
                            // A kept iteration's start.
                            || (m.event == MarkerEvent::Step
                                && self.decided.get(&(m.iter + 1)).is_some_and(|d| d.kept))
                    })
                    .collect();
                (!ms.is_empty()).then_some(Frame::Markers(ms))
            }
            f => Some(f),
        }
    }

    /// Writes the frames held longer than [`HOLD_NS`] (all of them: `all`).
    fn release(&mut self, all: bool) -> Result<(), String> {
        while let Some((at, _)) = self.held.front() {
            if !all && at.saturating_add(HOLD_NS) > self.now {
                break;
            }
            let (_, frame) = self.held.pop_front().expect("a front");
            if let Some(f) = self.thinned(frame) {
                self.inner.write(&f)?;
            }
        }
        Ok(())
    }
}

/// ns, the time a frame speaks of, when it has one.
fn time_of(frame: &Frame) -> Option<Nanos> {
    match frame {
        Frame::Breakdown(b) => Some(b.end_ns),
        f => super::replay::frame_time(f),
    }
}

impl FrameSink for Thinning {
    fn write(&mut self, frame: &Frame) -> Result<(), String> {
        if let Some(t) = time_of(frame) {
            self.now = self.now.max(t);
        }
        self.take_requests();
        match frame {
            Frame::Breakdown(b) => self.decide(b),
            Frame::Series(d) if d.label(LABEL_GPU).is_some() => {
                self.keep_all = true;
                self.decided.values_mut().for_each(|d| d.kept = true);
            }
            Frame::Hang(_) => {
                let now = self.now;
                self.keep_span(0, now.saturating_add(HANG_AFTER_NS));
            }
            _ => {}
        }
        self.held.push_back((self.now, frame.clone()));
        self.release(false)
    }

    fn flush(&mut self) -> Result<(), String> {
        self.inner.flush()
    }

    fn flush_all(&mut self) -> Result<(), String> {
        self.release(true)?;
        self.inner.flush_all()
    }

    fn finish(mut self: Box<Self>) -> Result<(), String> {
        // The run's last stretch, whole.
        let now = self.now;
        self.keep_span(now.saturating_sub(ENDS_NS), now);
        self.release(true)?;
        self.inner.finish()
    }

    fn wants_totals(&mut self, finishing: bool) -> bool {
        // At the end, always: a replay re-folds the iterations in other rounds than the live
        // run did, and the slowdowns it finds could differ.
        if finishing && !self.decided.is_empty() {
            return true;
        }
        // Iterations held are not left out yet, but may be.
        let leaving_out = self.left_out;
        let due = finishing
            || self
                .totals_ns
                .is_none_or(|t| self.now >= t.saturating_add(TOTALS_EVERY_NS));
        if leaving_out && due {
            self.totals_ns = Some(self.now);
            return true;
        }
        self.inner.wants_totals(finishing)
    }
}

#[cfg(test)]
mod tests;
