//! The samples' flight recorder: a run profile keeps its raw 100 Hz samples only around what
//! matters, and everything derived from them always.
//!
//! Raw samples were 86% of a run profile (27 MB per hour of run on the 2-rank example, issue
//! 31), yet once an iteration is attributed they only serve to look closer at a moment. So
//! [`Retention`], a [`FrameSink`] in front of the profile writer, holds the last
//! [`WINDOW_NS`] of sample batches in a ring in memory and writes them only:
//!
//! - for the first and the last [`ENDS_NS`] of the run (the last from the ring, at the end);
//! - around a hang ([`Frame::Hang`]): the ring before it and a window after;
//! - around a long iteration: one over [`LONG_FACTOR`] × its rank's median of recent walls,
//!   from its own length (at most [`MARGIN_NS`]) before it to as much after; at most one
//!   every [`LONG_EVERY_NS`];
//! - for [`ENDS_NS`] before a process of the job is seen gone (its counters' last totals);
//! - around any moment another part asks for through a [`KeepHandle`] (a slowdown);
//! - always, once a GPU's series is declared: what each iteration's GPU did
//!   ([`crate::gpu_usage::NvmlReading`]) is read from the samples and not yet written as a
//!   frame of its own, so a GPU node's profile keeps them all.
//!
//! Every other frame passes at once: the series' declarations, markers (iteration parts,
//! phases, collectives), processes, the live breakdowns (the attribution itself), hangs. The
//! node's one-second resources are folded from every sample here ([`NodeMeter`], as the live
//! model folds them) and written as [`Frame::NodeResources`] (with [`Frame::NodeNics`] and
//! [`Frame::NodeCounters`] every [`COUNTERS_EVERY`] readings), as an agent ships them.
//! The profile says so with a [`Frame::SamplesThinned`] after its header, so that a reader
//! takes the breakdowns as written instead of re-attributing from the samples left
//! ([`crate::job::NodeTimeline`]). `stallscope run --keep-all-samples` writes without it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use super::FrameSink;
use crate::frame::{
    Frame, NodeCountersReport, NodeNics, NodeRdma, NodeResourcesReport, SamplesThinned,
};
use crate::resources::NodeResources;
use crate::series::{SampleBatch, LABEL_GPU};
use crate::view::{NodeMeter, LOCAL};
use crate::Nanos;

/// Readings between two [`Frame::NodeCounters`] (and [`Frame::NodeNics`]): the node's totals
/// since the start, which only the last one matters of.
pub const COUNTERS_EVERY: u32 = 10;

/// ns, the samples the ring holds: the window kept before a moment that matters (a hang's
/// minute before it).
pub const WINDOW_NS: Nanos = 60_000_000_000;

/// ns, the stretch kept whole at the start and at the end of a run. Not a minute: the
/// samples of a 40-s run's two minutes would be the whole run, and samples cost ~28 MB per
/// hour (issue 31's goal for a whole profile is 10); the run's resources, start-up included,
/// are written every second whatever is kept.
pub const ENDS_NS: Nanos = 2_000_000_000;

/// ns, kept at most either side of a long iteration (at least its own length).
pub const MARGIN_NS: Nanos = 2_000_000_000;

/// ns, the least time between the starts of two long iterations' windows: on a loaded
/// machine a fast loop has "long" iterations every second, and keeping each would keep
/// everything.
pub const LONG_EVERY_NS: Nanos = 30_000_000_000;

/// An iteration this many times its rank's median of recent walls is long.
pub const LONG_FACTOR: u64 = 3;

/// Recent walls per rank the median is taken of.
const RECENT_WALLS: usize = 64;

/// Walls a rank needs before any of its iterations may count as long.
const MIN_WALLS: usize = 8;

/// Stretches of time (from, to), ns, asked to be kept.
type Requests = Vec<(Nanos, Nanos)>;

/// Asks a [`Retention`] to keep the samples of a stretch of time: what is still in its ring
/// at the next write, and what comes until the stretch's end (and a
/// [`super::thinning::Thinning`] given a [`KeepHandle::subscribe`]d one, its iterations).
/// Cloned freely (a clone reads the same requests); safe to call from any thread.
#[derive(Clone, Debug, Default)]
pub struct KeepHandle {
    /// Each reader's requests not yet taken.
    queues: Arc<Mutex<Vec<Requests>>>,
    /// This one's reader.
    me: usize,
}

impl KeepHandle {
    /// Keep the samples from `from_ns` to `to_ns` (the samples' clock, ns).
    pub fn keep(&self, from_ns: Nanos, to_ns: Nanos) {
        if let Ok(mut queues) = self.queues.lock() {
            if queues.is_empty() {
                queues.push(Vec::new());
            }
            for q in queues.iter_mut() {
                q.push((from_ns, to_ns.max(from_ns)));
            }
        }
    }

    /// A handle that reads every request from now on as well as this one.
    pub fn subscribe(&self) -> KeepHandle {
        let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        if queues.is_empty() {
            queues.push(Vec::new());
        }
        queues.push(Vec::new());
        KeepHandle {
            queues: self.queues.clone(),
            me: queues.len() - 1,
        }
    }

    /// The requests this reader has not taken yet.
    pub(super) fn take(&self) -> Vec<(Nanos, Nanos)> {
        self.queues
            .lock()
            .ok()
            .and_then(|mut q| q.get_mut(self.me).map(std::mem::take))
            .unwrap_or_default()
    }
}

/// Each rank's recent iteration walls, for telling a long iteration.
#[derive(Debug, Default)]
pub(super) struct RecentWalls(HashMap<u32, VecDeque<Nanos>>);

impl RecentWalls {
    /// Whether an iteration of `wall` ns is long for `rank` (over [`LONG_FACTOR`] × the
    /// median of its last [`RECENT_WALLS`], once it has [`MIN_WALLS`]); remembers it.
    pub(super) fn is_long(&mut self, rank: u32, wall: Nanos) -> bool {
        let walls = self.0.entry(rank).or_default();
        let long = walls.len() >= MIN_WALLS && {
            let mut sorted: Vec<Nanos> = walls.iter().copied().collect();
            sorted.sort_unstable();
            wall > sorted[sorted.len() / 2].saturating_mul(LONG_FACTOR)
        };
        if walls.len() == RECENT_WALLS {
            walls.pop_front();
        }
        walls.push_back(wall);
        long
    }
}

/// A [`FrameSink`] that writes sample batches only around what matters (module docs).
pub struct Retention {
    inner: Box<dyn FrameSink>,
    /// Batches not written, oldest first, none older than [`WINDOW_NS`] before the newest.
    ring: VecDeque<SampleBatch>,
    /// ns, the first batch's time: the run's first [`ENDS_NS`] are kept whole.
    first_ns: Option<Nanos>,
    /// Stretches to keep (from, to), ns: batches in one are written when they come.
    keep: Vec<(Nanos, Nanos)>,
    /// Requests from other parts.
    handle: KeepHandle,
    /// Recent walls per rank, ns, for telling a long iteration.
    walls: RecentWalls,
    /// The note after the header is written.
    noted: bool,
    /// The node's one-second resources, from every sample.
    meter: NodeMeter,
    /// The node's name in the readings (the header's host, or [`LOCAL`]).
    node: String,
    /// Readings written since the last counters.
    readings: u32,
    /// ns, the end of the last long iteration whose samples were kept.
    last_long_ns: Option<Nanos>,
    /// Every sample is written from now on (a GPU's series was declared).
    keep_all: bool,
}

impl Retention {
    /// Thins the samples written to `inner`.
    pub fn new(inner: Box<dyn FrameSink>) -> Retention {
        Retention {
            inner,
            ring: VecDeque::new(),
            first_ns: None,
            keep: Vec::new(),
            handle: KeepHandle::default(),
            walls: RecentWalls::default(),
            noted: false,
            meter: NodeMeter::default(),
            node: LOCAL.to_string(),
            readings: 0,
            keep_all: false,
            last_long_ns: None,
        }
    }

    /// Reads the requests of `handle` (one [`KeepHandle::subscribe`]d from for another
    /// reader) instead of its own.
    pub fn with_keeper(mut self, handle: KeepHandle) -> Retention {
        self.handle = handle;
        self
    }

    /// Where other parts ask for a stretch of samples to be kept.
    pub fn handle(&self) -> KeepHandle {
        self.handle.clone()
    }

    fn kept(&self, t: Nanos) -> bool {
        self.keep_all
            || self.first_ns.is_some_and(|f| t < f.saturating_add(ENDS_NS))
            || self.keep.iter().any(|(a, b)| (*a..=*b).contains(&t))
    }

    /// Takes new requests: writes what the ring holds of them, keeps the rest for later.
    fn take_requests(&mut self, extra: Option<(Nanos, Nanos)>) -> Result<(), String> {
        let mut new = self.handle.take();
        new.extend(extra);
        if new.is_empty() {
            return Ok(());
        }
        self.keep.extend(new);
        let ring = std::mem::take(&mut self.ring);
        for b in ring {
            if self.kept(b.at()) {
                self.inner.write(&Frame::Samples(b))?;
            } else {
                self.ring.push_back(b);
            }
        }
        Ok(())
    }

    /// Writes a reading of the node's resources, and its totals every [`COUNTERS_EVERY`]
    /// readings and at the end (`last`).
    fn write_reading(&mut self, r: Option<NodeResources>, last: bool) -> Result<(), String> {
        let Some(resources) = r else {
            return Ok(());
        };
        let node = self.node.clone();
        let counters = self.meter.counters();
        let rdma_counters = self.meter.rdma_counters();
        let rdma_rates =
            resources.rdma_rx_bytes_per_s.is_some() || resources.rdma_tx_bytes_per_s.is_some();
        if rdma_rates || !rdma_counters.is_empty() {
            // Before the frames it completes: their RDMA fields are not encoded.
            self.inner.write(&Frame::NodeRdma(NodeRdma {
                node: node.clone(),
                t_ns: resources.t_ns,
                rx_bytes_per_s: resources.rdma_rx_bytes_per_s,
                tx_bytes_per_s: resources.rdma_tx_bytes_per_s,
                rx_bytes: counters.rdma_rx_bytes,
                tx_bytes: counters.rdma_tx_bytes,
                counters: rdma_counters,
            }))?;
        }
        self.inner
            .write(&Frame::NodeResources(Box::new(NodeResourcesReport {
                node: node.clone(),
                resources,
            })))?;
        self.readings += 1;
        if self.readings >= COUNTERS_EVERY || last {
            self.readings = 0;
            let nics = self.meter.nics();
            if !nics.is_empty() {
                self.inner.write(&Frame::NodeNics(NodeNics {
                    node: node.clone(),
                    nics,
                }))?;
            }
            self.inner
                .write(&Frame::NodeCounters(NodeCountersReport { node, counters }))?;
        }
        Ok(())
    }

    fn on_samples(&mut self, b: &SampleBatch) -> Result<(), String> {
        let frame = Frame::Samples(b.clone());
        let reading = self.meter.ingest(&frame);
        self.write_reading(reading, false)?;
        let t = b.at();
        self.first_ns.get_or_insert(t);
        self.take_requests(None)?;
        self.keep
            .retain(|(_, to)| *to >= t.saturating_sub(WINDOW_NS));
        if self.kept(t) {
            return self.inner.write(&frame);
        }
        self.ring.push_back(b.clone());
        while self
            .ring
            .front()
            .is_some_and(|old| old.at().saturating_add(WINDOW_NS) < t)
        {
            self.ring.pop_front();
        }
        Ok(())
    }

    /// Writes the last [`ENDS_NS`] of what the ring holds, in order.
    fn write_ring(&mut self) -> Result<(), String> {
        let last = self.ring.back().map_or(0, |b| b.at());
        for b in std::mem::take(&mut self.ring) {
            if b.at().saturating_add(ENDS_NS) >= last {
                self.inner.write(&Frame::Samples(b))?;
            }
        }
        Ok(())
    }
}

impl FrameSink for Retention {
    fn write(&mut self, frame: &Frame) -> Result<(), String> {
        match frame {
            Frame::Samples(b) => return self.on_samples(b),
            Frame::Breakdown(b)
                if self.walls.is_long(b.rank, b.wall_ns())
                    && self
                        .last_long_ns
                        .is_none_or(|t| b.end_ns >= t.saturating_add(LONG_EVERY_NS)) =>
            {
                self.last_long_ns = Some(b.end_ns);
                let margin = b.wall_ns().min(MARGIN_NS);
                let span = (
                    b.start_ns.saturating_sub(margin),
                    b.end_ns.saturating_add(margin),
                );
                self.take_requests(Some(span))?;
            }
            // A process's last readings (its counters' totals: what `experiment` reads of
            // a loader's CPU and bytes) are in the samples just before it was seen gone.
            Frame::ProcessExit { .. } => {
                let now = self.ring.back().map_or(0, |b| b.at());
                self.take_requests(Some((now.saturating_sub(ENDS_NS), now)))?;
            }
            Frame::Hang(_) => {
                let now = self.ring.back().map_or(0, |b| b.at());
                self.take_requests(Some((
                    now.saturating_sub(WINDOW_NS),
                    now.saturating_add(WINDOW_NS),
                )))?;
            }
            Frame::End(_) => {
                self.write_ring()?;
                let last = self.meter.flush();
                self.write_reading(last, true)?;
            }
            Frame::Header(h) if !h.host.is_empty() => self.node = h.host.clone(),
            Frame::Series(d) => {
                self.meter.ingest(frame);
                if !self.keep_all && d.label(LABEL_GPU).is_some() {
                    self.keep_all = true;
                    while let Some(b) = self.ring.pop_front() {
                        self.inner.write(&Frame::Samples(b))?;
                    }
                }
            }
            _ => {}
        }
        self.inner.write(frame)?;
        if !self.noted && matches!(frame, Frame::Header(_)) {
            self.noted = true;
            self.inner.write(&Frame::SamplesThinned(SamplesThinned {
                window_ns: WINDOW_NS,
            }))?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), String> {
        self.inner.flush()
    }

    fn flush_all(&mut self) -> Result<(), String> {
        self.inner.flush_all()
    }

    fn finish(mut self: Box<Self>) -> Result<(), String> {
        self.write_ring()?;
        self.inner.finish()
    }

    fn wants_totals(&mut self, finishing: bool) -> bool {
        self.inner.wants_totals(finishing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribution::IterationBreakdown;
    use crate::frame::{RunEnd, RunHeader};
    use crate::journal::CollectingSink;

    const S: Nanos = 1_000_000_000;

    fn batch(t_ns: Nanos) -> Frame {
        Frame::Samples(SampleBatch {
            t_ns,
            dur_ns: 0,
            values: vec![],
        })
    }

    fn breakdown(iter: u64, start_ns: Nanos, end_ns: Nanos) -> Frame {
        Frame::Breakdown(IterationBreakdown {
            rank: 0,
            pid: 7,
            iter,
            start_ns,
            end_ns,
            split: Default::default(),
            evidence: vec![],
            coverage: Default::default(),
        })
    }

    fn sample_times(frames: &[Frame]) -> Vec<Nanos> {
        frames
            .iter()
            .filter_map(|f| match f {
                Frame::Samples(b) => Some(b.t_ns / S),
                _ => None,
            })
            .collect()
    }

    /// A 10-minute run sampled every second, one 1-s iteration a second, with a 10-s
    /// iteration ending at 300 s and a stretch asked for at 400–405 s.
    #[test]
    fn samples_are_kept_at_the_ends_and_around_what_matters_and_every_other_frame_passes() {
        let out = CollectingSink::default();
        let mut r = Box::new(Retention::new(Box::new(out.clone())));
        let handle = r.handle();
        r.write(&Frame::Header(RunHeader::default())).unwrap();
        for t in 1..=600u64 {
            if t == 402 {
                handle.keep(400 * S, 405 * S);
            }
            r.write(&batch(t * S)).unwrap();
            if t > 1 && t != 300 && !(291..300).contains(&t) {
                r.write(&breakdown(t, (t - 1) * S, t * S)).unwrap();
            }
            if t == 300 {
                r.write(&breakdown(t, 290 * S, 300 * S)).unwrap();
            }
        }
        r.write(&Frame::End(RunEnd::default())).unwrap();
        r.finish().unwrap();
        let frames = out.0.lock().unwrap().clone();
        assert!(matches!(frames[1], Frame::SamplesThinned(_)));
        let breakdowns = frames
            .iter()
            .filter(|f| matches!(f, Frame::Breakdown(_)))
            .count();
        assert_eq!(breakdowns, 600 - 1 - 9);
        let mut times = sample_times(&frames);
        times.sort_unstable();
        let expected: Vec<Nanos> = (1..=2)
            .chain(288..=302)
            .chain(400..=405)
            .chain(598..=600)
            .collect();
        assert_eq!(times, expected);
        assert!(matches!(frames.last(), Some(Frame::End(_))));
    }

    /// A loop of 100-ms iterations with a 400-ms one every 5 s, sampled every 100 ms: the
    /// samples around at most one long iteration in 30 s are kept.
    #[test]
    fn long_iterations_keep_at_most_one_window_in_30_s() {
        const MS: Nanos = 1_000_000;
        let out = CollectingSink::default();
        let mut r = Box::new(Retention::new(Box::new(out.clone())));
        let mut end = 0;
        for i in 0..600u64 {
            let wall = if i > 0 && i % 50 == 0 {
                400 * MS
            } else {
                100 * MS
            };
            let start = end;
            end += wall;
            let mut t = start - start % (100 * MS) + 100 * MS;
            while t <= end {
                r.write(&batch(t)).unwrap();
                t += 100 * MS;
            }
            r.write(&breakdown(i, start, end)).unwrap();
        }
        let frames = out.0.lock().unwrap().clone();
        let kept: Vec<Nanos> = frames
            .iter()
            .filter_map(|f| match f {
                Frame::Samples(b) if b.t_ns > ENDS_NS => Some(b.t_ns / (100 * MS)),
                _ => None,
            })
            .collect();
        // 12 long iterations end at 5.3 s, 10.6 s, ... (each 0.3 s later) in a 63.6-s run:
        // the first is kept, then the first at least 30 s after it (37.1 s), ±400 ms.
        let windows: Vec<Nanos> = kept
            .windows(2)
            .filter(|w| w[1] != w[0] + 1)
            .map(|w| w[1])
            .chain(kept.first().copied())
            .collect();
        assert_eq!(windows.len(), 2, "kept {kept:?}");
        assert_eq!(kept.len(), 2 * 13, "kept {kept:?}");
    }

    #[test]
    fn a_process_gone_keeps_its_last_readings() {
        let out = CollectingSink::default();
        let mut r = Box::new(Retention::new(Box::new(out.clone())));
        for t in 1..=100u64 {
            r.write(&batch(t * S)).unwrap();
            if t == 50 {
                r.write(&Frame::ProcessExit {
                    pid: 7,
                    t_ns: t * S,
                })
                .unwrap();
            }
        }
        r.finish().unwrap();
        let frames = out.0.lock().unwrap().clone();
        let mut times = sample_times(&frames);
        times.sort_unstable();
        let expected: Vec<Nanos> = (1..=2).chain(48..=50).chain(98..=100).collect();
        assert_eq!(times, expected);
    }

    #[test]
    fn a_gpu_node_keeps_every_sample() {
        use crate::series::{SeriesDecl, SeriesId, SeriesKind};
        let out = CollectingSink::default();
        let mut r = Box::new(Retention::new(Box::new(out.clone())));
        for t in 1..=100u64 {
            if t == 20 {
                r.write(&Frame::Series(SeriesDecl {
                    id: SeriesId(9),
                    name: crate::series::names::GPU_ENERGY_MJ.into(),
                    unit: "mJ".into(),
                    kind: SeriesKind::Counter,
                    labels: vec![(LABEL_GPU.into(), "0".into())],
                }))
                .unwrap();
            }
            r.write(&batch(t * S)).unwrap();
        }
        r.finish().unwrap();
        let frames = out.0.lock().unwrap().clone();
        assert_eq!(sample_times(&frames), (1..=100).collect::<Vec<_>>());
    }

    #[test]
    fn a_hang_keeps_the_minute_before_it_and_the_minute_after() {
        let out = CollectingSink::default();
        let mut r = Box::new(Retention::new(Box::new(out.clone())));
        for t in 1..=1000u64 {
            r.write(&batch(t * S)).unwrap();
            if t == 500 {
                r.write(&Frame::Hang(Box::default())).unwrap();
            }
        }
        r.finish().unwrap();
        let frames = out.0.lock().unwrap().clone();
        let mut times = sample_times(&frames);
        times.sort_unstable();
        let expected: Vec<Nanos> = (1..=2).chain(440..=560).chain(998..=1000).collect();
        assert_eq!(times, expected);
    }
}
