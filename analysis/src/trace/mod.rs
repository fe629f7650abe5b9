//! A profile as a trace for the viewers people already use (ui.perfetto.dev, `chrome://tracing`
//! importers): the Trace Event Format's JSON.
//!
//! The frames go through a reader [`Journal`] exactly as a replay takes them (attributed
//! every [`REPLAY_STEP_NS`] of the frames' time, pruned at each step), and each event is
//! written as soon as it is known, so a profile of any length is exported in the journal's
//! bounded memory. What the trace shows:
//!
//! - one process per node (`node NAME`), and per rank four threads: `rank N` holds the
//!   iterations as slices; `rank N categories` holds, within each iteration's bounds, one
//!   slice per category as long as the category's share (a stacked bar: the order is the
//!   report's, not when each happened); `rank N phases` holds the phases the hook marked
//!   (`data`, `compute`, `comm`, …) and the collectives by their identity (`all_reduce g0
//!   #12`); `rank N comm observed` the communication the agent saw. Slices on one thread must
//!   nest, and phases straddle iteration boundaries, so iterations have a thread of their own;
//! - the node's resources as counter tracks (CPU, run queue, GPU, disks, NICs, RDMA, PCIe,
//!   NVLink, PSI);
//! - hangs (and their end) as global instants.
//!
//! Times are the profile's monotonic clock in µs: a run's node clock, or in a collector's job
//! profile the collector's clock, onto which every node's iterations, collectives and readings
//! are mapped with the node's estimated offset ([`NodeClock`]), as the cross-node join maps
//! them, so the ranks of all nodes line up. A window (`since_ns`) keeps only what ends in it:
//! the flight recorder's last minutes.

mod json;

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{self, Write};

use serde_json::{json, Map, Value};

use crate::attribution::IterationBreakdown;
use crate::category::Category;
use crate::frame::{Frame, NodeClock, RunHeader};
use crate::hang::HangReport;
use crate::journal::replay::frame_time;
use crate::journal::{Journal, REPLAY_STEP_NS};
use crate::marker::{Marker, MarkerEvent};
use crate::resources::NodeResources;
use crate::timeline::LinkPeaks;
use crate::view::NodeReading;
use crate::Nanos;

pub use json::{micros, Event, TraceJson};

/// What the export covers.
#[derive(Clone, Debug, Default)]
pub struct TraceOptions {
    /// ns on the profile's clock: only what ends at or after it (`None`: everything).
    pub since_ns: Option<Nanos>,
    /// The profile's path, for the trace's `otherData`.
    pub profile: String,
}

/// What an export wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TraceStats {
    /// Events written.
    pub events: u64,
    /// Iteration slices written, all ranks.
    pub iterations: u64,
    /// Ranks with a track.
    pub ranks: usize,
    /// Nodes (processes).
    pub nodes: usize,
    /// Hangs marked.
    pub hangs: usize,
}

/// Threads per rank (see `Tracks::rank_track`).
const RANK_THREADS: u32 = 4;
/// A rank's categories thread, after its iterations thread.
const CATEGORIES: u32 = 1;
/// A rank's thread of the hook's phases and collectives.
const PHASES: u32 = 2;
/// A rank's thread of the communication the agent observed.
const OBSERVED_COMM: u32 = 3;

/// Writes the trace of `frames` (a profile's, in file order, one at a time) to `out`.
/// `peaks`: the run's link peaks ([`crate::journal::link_peaks_of`], a first pass), so that the
/// categories are the ones the summary gives; `None` attributes with the peaks seen so far.
pub fn export<W: Write, F: Borrow<Frame>>(
    frames: impl IntoIterator<Item = F>,
    peaks: Option<LinkPeaks>,
    options: &TraceOptions,
    out: W,
) -> io::Result<(TraceStats, W)> {
    let other = json!({
        "generator": format!("stallscope {}", env!("CARGO_PKG_VERSION")),
        "profile": options.profile,
        "clock": "CLOCK_MONOTONIC of the profile's writer (a job profile: the collector's), µs",
    });
    let mut tracks = Tracks::new(
        TraceJson::start(out, &other)?,
        options.since_ns.unwrap_or(0),
    );
    let mut journal = Journal::reader("");
    if let Some(p) = peaks {
        journal.assume_link_peaks(p);
    }
    let mut next_step: Option<Nanos> = None;
    for f in frames {
        let f = f.borrow();
        if let Some(t) = frame_time(f) {
            let next = *next_step.get_or_insert(t.saturating_add(REPLAY_STEP_NS));
            if t >= next {
                let boundary = next + (t - next) / REPLAY_STEP_NS * REPLAY_STEP_NS;
                let done = journal.attribute(boundary, false);
                tracks.attributed(&done, &mut journal)?;
                journal.prune();
                next_step = Some(boundary.saturating_add(REPLAY_STEP_NS));
            }
        }
        tracks.frame(f)?;
        journal.ingest(f);
    }
    let done = journal.attribute(u64::MAX, true);
    tracks.attributed(&done, &mut journal)?;
    let stats = TraceStats {
        events: tracks.out.events(),
        iterations: tracks.iterations,
        ranks: tracks.ranks.len(),
        nodes: tracks.nodes.len(),
        hangs: tracks.hangs,
    };
    Ok((stats, tracks.out.finish()?))
}

/// A phase a rank is inside: when it began, its slice's name and arguments.
struct Open {
    begin: Nanos,
    name: String,
    cat: &'static str,
    args: Value,
}

/// The tracks made so far and what is needed to place events on them.
struct Tracks<W: Write> {
    out: TraceJson<W>,
    since: Nanos,
    header: Option<RunHeader>,
    /// Node name → its process id in the trace (1, 2, … in order of appearance).
    nodes: HashMap<String, u32>,
    /// Ranks whose threads are named.
    ranks: BTreeSet<u32>,
    /// A job profile's ranks' nodes (from their reports).
    rank_nodes: HashMap<u32, String>,
    /// Each node's clock against the collector's (job profiles).
    clocks: HashMap<String, NodeClock>,
    /// A process's rank, as `Frame::Process` said.
    pid_ranks: HashMap<u32, u32>,
    /// Phases begun and not yet ended, by (pid, phase).
    open: BTreeMap<(u32, String), Open>,
    /// A job profile's newest iteration per rank whose collectives were written (reports
    /// come in order per rank; an agent's resends are skipped).
    comm_written: HashMap<u32, u64>,
    /// ns, the end of the latest slice on each track whose slices follow one another (a
    /// rank's iterations, their categories, the communication observed): [`Self::in_turn`].
    track_ends: HashMap<(u32, u32), Nanos>,
    iterations: u64,
    hangs: usize,
}

impl<W: Write> Tracks<W> {
    fn new(out: TraceJson<W>, since: Nanos) -> Self {
        Tracks {
            out,
            since,
            header: None,
            nodes: HashMap::new(),
            ranks: BTreeSet::new(),
            rank_nodes: HashMap::new(),
            clocks: HashMap::new(),
            pid_ranks: HashMap::new(),
            open: BTreeMap::new(),
            comm_written: HashMap::new(),
            track_ends: HashMap::new(),
            iterations: 0,
            hangs: 0,
        }
    }

    /// Whether this is a collector's job profile (its ranks on the agents' nodes).
    fn is_job(&self) -> bool {
        self.header.as_ref().is_some_and(RunHeader::is_collectors)
    }

    /// The node a run's own ranks and readings are on.
    fn own_node(&self) -> String {
        match &self.header {
            Some(h) if !h.host.is_empty() => h.host.clone(),
            _ => "local".to_string(),
        }
    }

    /// `t` (ns on `node`'s clock) on the trace's clock.
    fn on_trace_clock(&self, node: &str, t: Nanos) -> Nanos {
        match self.clocks.get(node) {
            Some(c) if self.is_job() => c.to_collector(t),
            _ => t,
        }
    }

    /// The process of `node`, named on first use.
    fn node_pid(&mut self, node: &str) -> io::Result<u32> {
        if let Some(pid) = self.nodes.get(node) {
            return Ok(*pid);
        }
        let pid = self.nodes.len() as u32 + 1;
        self.nodes.insert(node.to_string(), pid);
        let name = format!("node {node}");
        self.metadata("process_name", pid, 0, json!({ "name": name }))?;
        self.metadata("process_sort_index", pid, 0, json!({ "sort_index": pid }))?;
        Ok(pid)
    }

    /// The node of rank `rank`.
    fn node_of(&self, rank: u32) -> String {
        self.rank_nodes
            .get(&rank)
            .cloned()
            .unwrap_or_else(|| self.own_node())
    }

    /// (process, thread) of rank `rank`'s iterations track; its threads are named on first
    /// use. Each rank has four threads, [`RANK_THREADS`] apart from the next rank's: its
    /// iterations (`+0`), their categories (`+CATEGORIES`), the phases and collectives the hook
    /// marked (`+PHASES`), and the communication the agent observed (`+OBSERVED_COMM`). They
    /// are kept apart because slices on one thread must nest: a phase or an observed comm span
    /// that straddles an iteration's boundary would make the viewer drop that iteration.
    fn rank_track(&mut self, rank: u32) -> io::Result<(u32, u32)> {
        let pid = self.node_pid(&self.node_of(rank))?;
        let tid = rank.saturating_mul(RANK_THREADS).saturating_add(1);
        if self.ranks.insert(rank) {
            for (offset, name) in [
                (0, format!("rank {rank}")),
                (CATEGORIES, format!("rank {rank} categories")),
                (PHASES, format!("rank {rank} phases")),
                (OBSERVED_COMM, format!("rank {rank} comm observed")),
            ] {
                let t = tid.saturating_add(offset);
                self.metadata("thread_name", pid, t, json!({ "name": name }))?;
                self.metadata("thread_sort_index", pid, t, json!({ "sort_index": t }))?;
            }
        }
        Ok((pid, tid))
    }

    fn metadata(&mut self, name: &str, pid: u32, tid: u32, args: Value) -> io::Result<()> {
        self.out.event(&Event {
            name,
            cat: None,
            ph: "M",
            ts: 0.0,
            dur: None,
            pid,
            tid,
            s: None,
            args,
        })
    }

    /// `[begin, end]` of the next slice on `track`, whose slices follow one another, moved to
    /// begin no earlier than the previous one ended. A job profile's times come from each
    /// node's clock through the collector's estimate of it, which moves between two
    /// iterations (by microseconds on a quiet machine, more under load): one iteration's end
    /// and the next one's start, the same instant on the node, could then overlap on the
    /// trace's clock, and the viewer drops a slice that overlaps its neighbour rather than
    /// nesting in it (Perfetto's `slice_drop_overlapping_complete_event`).
    fn in_turn(&mut self, track: (u32, u32), begin: Nanos, end: Nanos) -> (Nanos, Nanos) {
        let previous = self.track_ends.get(&track).copied().unwrap_or(0);
        let begin = begin.max(previous);
        let end = end.max(begin);
        self.track_ends.insert(track, end);
        (begin, end)
    }

    /// A complete slice `[begin, end]` on a thread, when it ends in the window.
    #[allow(clippy::too_many_arguments)]
    fn slice(
        &mut self,
        (pid, tid): (u32, u32),
        name: &str,
        cat: &'static str,
        begin: Nanos,
        end: Nanos,
        args: Value,
    ) -> io::Result<()> {
        if end < self.since {
            return Ok(());
        }
        self.out.event(&Event {
            name,
            cat: Some(cat),
            ph: "X",
            ts: micros(begin),
            dur: Some(micros(end.saturating_sub(begin))),
            pid,
            tid,
            s: None,
            args,
        })
    }

    /// Takes one frame of the profile (before the journal does).
    fn frame(&mut self, f: &Frame) -> io::Result<()> {
        match f {
            Frame::Header(h) => self.header = Some(h.clone()),
            Frame::NodeClock(c) => {
                self.clocks.insert(c.node.clone(), c.clone());
            }
            Frame::Process(p) => {
                if let Some(rank) = p.rank {
                    self.pid_ranks.insert(p.pid, rank);
                }
            }
            Frame::Markers(ms) => {
                for m in ms {
                    self.marker(m)?;
                }
            }
            Frame::NodeIteration(_) | Frame::NodeReport(_) => {
                let it = f.node_iteration().expect("both carry one");
                let (rank, iter) = (it.breakdown.rank, it.breakdown.iter);
                self.rank_nodes.insert(rank, it.node.clone());
                if self.comm_written.get(&rank).is_some_and(|w| *w >= iter) {
                    return Ok(());
                }
                self.comm_written.insert(rank, iter);
                let (pid, tid) = self.rank_track(rank)?;
                let track = (pid, tid + OBSERVED_COMM);
                for span in &it.comm {
                    let begin = self.on_trace_clock(&it.node, span.begin);
                    let end = self.on_trace_clock(&it.node, span.end);
                    let (begin, end) = self.in_turn(track, begin, end);
                    self.slice(
                        track,
                        "comm",
                        "collective",
                        begin,
                        end,
                        json!({ "iteration": iter }),
                    )?;
                }
            }
            Frame::Hang(h) => self.hang(h)?,
            _ => {}
        }
        Ok(())
    }

    /// A phase's begin or end; a slice when it ends.
    fn marker(&mut self, m: &Marker) -> io::Result<()> {
        let begun = |name: String, cat, args| Open {
            begin: m.t_ns,
            name,
            cat,
            args,
        };
        match &m.event {
            MarkerEvent::Begin(phase) => {
                let open = begun(phase.clone(), "phase", Value::Null);
                self.open.insert((m.pid, phase.clone()), open);
            }
            MarkerEvent::BeginWaiting(phase, peer) => {
                let open = begun(phase.clone(), "phase", json!({ "waits_for_pid": peer }));
                self.open.insert((m.pid, phase.clone()), open);
            }
            MarkerEvent::BeginOp(phase, op) => {
                let name = format!("{} g{} #{}", op.op, op.group, op.seq);
                let args = json!({
                    "op": op.op, "group": op.group, "seq": op.seq, "bytes": op.bytes,
                    "peer": op.peer, "phase": phase,
                });
                self.open
                    .insert((m.pid, phase.clone()), begun(name, "collective", args));
            }
            MarkerEvent::End(phase) => {
                let Some(open) = self.open.remove(&(m.pid, phase.clone())) else {
                    return Ok(());
                };
                let Some(rank) = m.rank.or_else(|| self.pid_ranks.get(&m.pid).copied()) else {
                    return Ok(());
                };
                let (pid, tid) = self.rank_track(rank)?;
                let track = (pid, tid + PHASES);
                let mut args = open.args;
                if args.is_null() {
                    args = json!({});
                }
                args["iteration"] = json!(m.iter);
                self.slice(track, &open.name, open.cat, open.begin, m.t_ns, args)?;
            }
            MarkerEvent::Step | MarkerEvent::Meta(_) => {}
        }
        Ok(())
    }

    /// The iterations the journal just attributed, and the readings it took since the last
    /// round.
    fn attributed(&mut self, done: &[IterationBreakdown], journal: &mut Journal) -> io::Result<()> {
        for b in done {
            self.iteration(b)?;
        }
        for r in journal.take_update().readings {
            self.reading(&r)?;
        }
        Ok(())
    }

    /// An iteration's slice on its rank's track and its categories' on the other.
    fn iteration(&mut self, b: &IterationBreakdown) -> io::Result<()> {
        if b.end_ns < self.since {
            return Ok(());
        }
        let (pid, tid) = self.rank_track(b.rank)?;
        let mut args = Map::new();
        args.insert("iteration".into(), json!(b.iter));
        args.insert("wall_ms".into(), json!(b.wall_ns() as f64 / 1e6));
        for c in Category::ALL {
            args.insert(
                format!("{}_ms", c.name()),
                json!(b.split.get(c) as f64 / 1e6),
            );
        }
        args.insert("largest".into(), json!(b.split.largest().name()));
        let name = format!("iteration {}", b.iter);
        let args = Value::Object(args);
        let (start, end) = self.in_turn((pid, tid), b.start_ns, b.end_ns);
        self.slice((pid, tid), &name, "iteration", start, end, args)?;
        self.iterations += 1;
        let mut at = start;
        for c in Category::ALL {
            let ns = b.split.get(c);
            if ns == 0 {
                continue;
            }
            let args = json!({ "iteration": b.iter, "ms": ns as f64 / 1e6,
                "share": ns as f64 / b.wall_ns().max(1) as f64 });
            let track = (pid, tid + CATEGORIES);
            let (begin, end) = self.in_turn(track, at, at + ns);
            self.slice(track, c.name(), "category", begin, end, args)?;
            at = end;
        }
        Ok(())
    }

    /// A node's resources over one reading, as counters at the reading's start.
    fn reading(&mut self, r: &NodeReading) -> io::Result<()> {
        let t = self.on_trace_clock(&r.node, r.resources.t_ns);
        if t.saturating_add(r.resources.dur_ns) < self.since {
            return Ok(());
        }
        let pid = self.node_pid(&r.node)?;
        for (name, values) in counters(&r.resources) {
            let args: Map<String, Value> = values
                .into_iter()
                .filter_map(|(k, v)| v.map(|v| (k.to_string(), json!(v))))
                .collect();
            if args.is_empty() {
                continue;
            }
            self.out.event(&Event {
                name,
                cat: Some("resources"),
                ph: "C",
                ts: micros(t),
                dur: None,
                pid,
                tid: 0,
                s: None,
                args: Value::Object(args),
            })?;
        }
        Ok(())
    }

    /// A hang as a global instant where it was declared, and its end where iterations resumed.
    fn hang(&mut self, h: &HangReport) -> io::Result<()> {
        let started = self.header.as_ref().map_or(0, |h| h.started_mono_ns);
        let at = started.saturating_add((h.at_seconds * 1e9) as Nanos);
        let collective = h
            .collective
            .as_ref()
            .map(|c| format!("{} g{} #{}", c.op, c.group, c.seq));
        let args = json!({
            "at_seconds": h.at_seconds,
            "stalled_seconds": h.stalled_seconds,
            "last_iteration": h.last_iteration,
            "collective": collective,
            "waiting_ranks": h.waiting_ranks,
            "missing_ranks": h.missing_ranks,
        });
        let (name, t) = match h.resumed_after_seconds {
            None => {
                self.hangs += 1;
                let missing: Vec<String> = h.missing_ranks.iter().map(u32::to_string).collect();
                let name = if missing.is_empty() {
                    "hang".to_string()
                } else {
                    format!("hang: rank {} missing", missing.join(", "))
                };
                (name, at)
            }
            Some(after) => (
                "hang resumed".to_string(),
                at.saturating_add((after * 1e9) as Nanos),
            ),
        };
        if t < self.since {
            return Ok(());
        }
        let pid = self.node_pid(&self.own_node())?;
        self.out.event(&Event {
            name: &name,
            cat: Some("hang"),
            ph: "i",
            ts: micros(t),
            dur: None,
            pid,
            tid: 0,
            s: Some("g"),
            args,
        })
    }
}

/// A reading's counter tracks: name and values (MB/s for bytes, % for shares).
#[allow(clippy::type_complexity)]
fn counters(r: &NodeResources) -> Vec<(&'static str, Vec<(&'static str, Option<f64>)>)> {
    let mb = |v: Option<f64>| v.map(|b| b / 1e6);
    let pct = |v: Option<f64>| v.map(|s| s * 100.0);
    vec![
        ("CPU", vec![("busy cores", r.cpu_busy_cores)]),
        ("run queue", vec![("delay s/s", r.runq_delay)]),
        ("GPU", vec![("busy %", pct(r.gpu_busy))]),
        (
            "disk",
            vec![
                ("read MB/s", mb(r.disk_read_bytes_per_s)),
                ("write MB/s", mb(r.disk_write_bytes_per_s)),
            ],
        ),
        (
            "NIC",
            vec![
                ("rx MB/s", mb(r.nic_rx_bytes_per_s)),
                ("tx MB/s", mb(r.nic_tx_bytes_per_s)),
            ],
        ),
        (
            "RDMA",
            vec![
                ("rx MB/s", mb(r.rdma_rx_bytes_per_s)),
                ("tx MB/s", mb(r.rdma_tx_bytes_per_s)),
            ],
        ),
        (
            "PCIe",
            vec![
                ("rx MB/s", mb(r.pcie_rx_bytes_per_s)),
                ("tx MB/s", mb(r.pcie_tx_bytes_per_s)),
            ],
        ),
        (
            "NVLink",
            vec![
                ("rx MB/s", mb(r.nvlink_rx_bytes_per_s)),
                ("tx MB/s", mb(r.nvlink_tx_bytes_per_s)),
            ],
        ),
        (
            "PSI",
            vec![
                ("cpu %", pct(r.psi_cpu)),
                ("io %", pct(r.psi_io)),
                ("memory %", pct(r.psi_memory)),
            ],
        ),
    ]
}

#[cfg(test)]
mod tests;
