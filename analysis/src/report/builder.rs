//! Builds a [`Report`] from a profile's frames, read once and in order (streaming): the
//! frames go through a [`Journal`] as in the live run, attributed one second of the run's
//! time after another, and every update of the live model is folded into whole-run columns.

use std::collections::BTreeMap;

use crate::category::{Category, Split};
use crate::crossnode::{IterationArrivals, StragglerWindows};
use crate::experiment::ExperimentReport;
use crate::figures::Categories;
use crate::frame::{Frame, NodeClock, RunEnd, RunHeader};
use crate::journal::replay::frame_time;
use crate::journal::Journal;
use crate::resources::NodeResources;
use crate::view::ViewUpdate;
use crate::Nanos;

use super::columns::{
    Axis, Columns, IterationColumn, LogHistogram, Merge, RankColumn, ResourceColumn, Slowest,
    MAX_COLUMNS, RESOURCE_FIELDS,
};
use super::*;

/// ns of the run's time between two attribution rounds, as the live run attributes.
const STEP_NS: Nanos = 1_000_000_000;

/// ns of the run's time between two summaries of the live model while reading: the report
/// takes the summary at the end, so this only bounds how stale the model's derived figures
/// get on the way.
const SUMMARY_EVERY_NS: Nanos = 600 * STEP_NS;

/// The longest iterations kept per rank to name in the report.
const LONGEST_KEPT: usize = 32;

/// Long iterations named in the report.
const LONG_LISTED: usize = 20;

/// Straggler windows listed one by one.
const STRAGGLER_ROWS: usize = 100;

/// Counted iterations awaiting their last rank for the straggler windows; beyond, the oldest
/// is taken as it stands (as the critical path's, [`crate::critical::PENDING`]).
const ARRIVALS_PENDING: usize = crate::critical::PENDING;

/// A counted iteration some ranks have finished: their waits, for the straggler windows of
/// ranks on one node. (The critical path is the journal's: [`crate::critical`], the one rule.)
#[derive(Debug, Default)]
struct PendingIteration {
    /// Per rank that finished it: (rank, peer_wait ns, wall ns).
    waits: Vec<(u32, u64, u64)>,
}

impl PendingIteration {
    /// Who held whom up in this iteration, from the waits alone: the rank that waited least
    /// arrived last at the collectives, and the next-to-last rank waited for it about as
    /// long as the least wait of the others. `None` with fewer than two ranks.
    fn arrivals(&self) -> Option<IterationArrivals> {
        if self.waits.len() < 2 {
            return None;
        }
        let mut by_wait = self.waits.clone();
        by_wait.sort_by_key(|&(rank, wait, _)| (wait, rank));
        let mut a = IterationArrivals::default();
        a.held.insert(by_wait[0].0, by_wait[1].1);
        for (rank, wait, wall) in &self.waits {
            a.waits.insert(*rank, (*wait, *wall));
        }
        Some(a)
    }
}

/// An iteration is long when it is at least this many times its rank's median…
const LONG_FACTOR: f64 = 3.0;

/// …and at least this much longer, ns.
const LONG_MARGIN_NS: u64 = 50_000_000;

/// The name of the node a single-node run's empty host field stands for (as the live model).
const LOCAL: &str = "local";

/// What the report keeps of one rank while reading.
#[derive(Clone, Debug, Default)]
struct RankTrack {
    node: String,
    first_start_ns: Option<Nanos>,
    first_iteration_ns: u64,
    warmup_ns: u64,
    counted: LogHistogram,
    counted_split: Split,
    last_end_ns: Nanos,
    longest: Vec<Slowest>,
    gpu_busy_ppm_sum: u64,
    gpu_busy_n: u64,
}

impl RankTrack {
    fn keep_long(&mut self, s: Slowest) {
        if self.longest.len() < LONGEST_KEPT {
            self.longest.push(s);
            return;
        }
        if let Some((i, shortest)) = self
            .longest
            .iter()
            .enumerate()
            .min_by_key(|(_, x)| x.wall_ns)
        {
            if s.wall_ns > shortest.wall_ns {
                self.longest[i] = s;
            }
        }
    }

    /// ns, the threshold above which a counted iteration is long.
    fn long_threshold_ns(&self) -> u64 {
        let median = self.counted.quantile_ns(0.5);
        ((median as f64 * LONG_FACTOR) as u64).max(median + LONG_MARGIN_NS)
    }
}

/// Reads a profile's frames and builds its [`Report`].
pub struct ReportBuilder {
    journal: Journal,
    header: Option<RunHeader>,
    is_collector: bool,
    end: Option<RunEnd>,
    axis: Option<Axis>,
    last_ns: Nanos,
    next_step_ns: Option<Nanos>,
    warmup: u64,
    job_cols: Columns<IterationColumn>,
    rank_cols: BTreeMap<u32, Columns<RankColumn>>,
    node_cols: BTreeMap<String, Columns<ResourceColumn>>,
    ranks: BTreeMap<u32, RankTrack>,
    arrivals_pending: BTreeMap<u64, PendingIteration>,
    /// Straggler windows of ranks that share a node (a run profile), from their waits.
    local_stragglers: StragglerWindows,
    /// The critical path, read from the journal's summary at the end: ns per category and
    /// the iterations on it.
    critical: Split,
    critical_iterations: u64,
    experiment: Option<ExperimentReport>,
    frames: u64,
    sources: Vec<SourceProfile>,
    problems: Vec<String>,
    /// Each flow's retransmitted segments as last read, by node and `(local, remote)`, with
    /// when (ns, the node's clock), to turn the flow frames' totals into retransmissions per
    /// column.
    retransmits_seen: BTreeMap<(String, String, String), (u64, Nanos)>,
}

/// Flows whose retransmissions the builder remembers before it forgets those not read for
/// [`RETRANSMITS_FORGET_NS`] (a connection per sample opens thousands).
const RETRANSMITS_KEPT: usize = 4096;
const RETRANSMITS_FORGET_NS: Nanos = 60_000_000_000;

impl ReportBuilder {
    /// A builder for job `name` (empty: named from the profile's command).
    pub fn new(name: &str) -> ReportBuilder {
        ReportBuilder {
            journal: {
                let mut j = Journal::reader(name);
                j.set_summary_every(SUMMARY_EVERY_NS);
                j
            },
            header: None,
            is_collector: false,
            end: None,
            axis: None,
            last_ns: 0,
            next_step_ns: None,
            warmup: 0,
            job_cols: Columns::default(),
            rank_cols: BTreeMap::new(),
            node_cols: BTreeMap::new(),
            ranks: BTreeMap::new(),
            arrivals_pending: BTreeMap::new(),
            local_stragglers: StragglerWindows::default(),
            critical: Split::default(),
            critical_iterations: 0,
            experiment: None,
            frames: 0,
            retransmits_seen: BTreeMap::new(),
            sources: Vec::new(),
            problems: Vec::new(),
        }
    }

    /// Names a profile the frames come from.
    pub fn source(&mut self, source: SourceProfile) {
        self.sources.push(source);
    }

    /// Notes what went wrong reading (a damaged frame, a cut file): the report says it.
    pub fn problem(&mut self, sentence: String) {
        self.problems.push(sentence);
    }

    /// Frames taken so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Whether an end frame was taken.
    pub fn saw_end(&self) -> bool {
        self.end.is_some()
    }

    /// The header taken, if any.
    pub fn header(&self) -> Option<&RunHeader> {
        self.header.as_ref()
    }

    /// Takes the next frame of the profile.
    pub fn ingest(&mut self, frame: &Frame) {
        self.frames += 1;
        match frame {
            // The first header is the run's (a second one is a profile appended to).
            Frame::Header(h) if self.header.is_none() => {
                self.is_collector = h.is_collectors();
                self.warmup = u64::from(h.warmup_iters);
                self.local_stragglers.first_iter = self.warmup;
                if h.started_mono_ns > 0 && self.axis.is_none() {
                    self.axis = Some(Axis::new(h.started_mono_ns));
                }
                self.header = Some(h.clone());
            }
            Frame::End(e) => self.end = Some(e.clone()),
            Frame::Experiment(r) => self.experiment = Some((**r).clone()),
            Frame::NodeFlows(f) => self.flows(f),
            _ => {}
        }
        if let Some(t) = self.time_of(frame) {
            if self.axis.is_none() {
                self.axis = Some(Axis::new(t));
            }
            self.last_ns = self.last_ns.max(t);
            let next = *self.next_step_ns.get_or_insert(t + STEP_NS);
            if t >= next {
                let boundary = next + (t - next) / STEP_NS * STEP_NS;
                self.journal.attribute(boundary, false);
                let u = self.journal.take_update();
                self.fold(u);
                self.journal.prune();
                self.next_step_ns = Some(boundary + STEP_NS);
            }
        }
        self.journal.ingest(frame);
    }

    /// The instant a frame speaks of on the report's clock: a node's iteration in a job
    /// profile is on its node's clock, taken to the collector's.
    fn time_of(&self, frame: &Frame) -> Option<Nanos> {
        let t = frame_time(frame)?;
        match frame.node_iteration() {
            Some(it) => Some(self.clock(&it.node).map_or(t, |c| c.to_collector(t))),
            None => Some(t),
        }
    }

    fn local_node(&self) -> String {
        match self.header.as_ref().map(|h| h.host.as_str()) {
            Some(h) if !h.is_empty() => h.to_string(),
            _ => LOCAL.to_string(),
        }
    }

    /// The column of `t_ns`, coarsening every series until it fits.
    fn column(&mut self, t_ns: Nanos) -> usize {
        let axis = self.axis.get_or_insert_with(|| Axis::new(t_ns));
        let mut k = axis.index(t_ns);
        while k >= MAX_COLUMNS {
            axis.width_ns *= 2;
            k = axis.index(t_ns);
            self.job_cols.coarsen();
            self.rank_cols.values_mut().for_each(Columns::coarsen);
            self.node_cols.values_mut().for_each(Columns::coarsen);
        }
        k
    }

    /// Turns a node's flow totals into the segments its TCP flows retransmitted since its
    /// previous flow frame, per second, placed like a reading over that interval.
    fn flows(&mut self, f: &crate::flows::NodeFlows) {
        if f.t_ns <= f.since_ns {
            // The node's first flow frame: totals from before anything was read.
            for s in &f.flows {
                let key = (f.node.clone(), s.local.clone(), s.remote.clone());
                self.retransmits_seen.insert(key, (s.retransmits, f.t_ns));
            }
            return;
        }
        let mut segments = 0;
        for s in &f.flows {
            let key = (f.node.clone(), s.local.clone(), s.remote.clone());
            let seen = self.retransmits_seen.insert(key, (s.retransmits, f.t_ns));
            segments += s.retransmits.saturating_sub(seen.map_or(0, |(r, _)| r));
        }
        if self.retransmits_seen.len() > RETRANSMITS_KEPT {
            let horizon = f.t_ns.saturating_sub(RETRANSMITS_FORGET_NS);
            self.retransmits_seen.retain(|_, (_, t)| *t >= horizon);
        }
        let node = if f.node.is_empty() {
            self.local_node()
        } else {
            f.node.clone()
        };
        let (mut from, mut to) = (f.since_ns, f.t_ns);
        if let Some(c) = self.clock(&node) {
            (from, to) = (c.to_collector(from), c.to_collector(to));
        }
        let k = self.column(from + (to - from) / 2);
        let mut values = [None; RESOURCE_FIELDS];
        values[RETRANSMITS] = Some(segments as f64 / ((f.t_ns - f.since_ns) as f64 / 1e9));
        self.node_cols.entry(node).or_default().at(k).add(&values);
    }

    fn resources(&mut self, node: &str, r: &NodeResources) {
        // A reading describes its whole bucket: it goes where the bucket's middle is.
        let k = self.column(r.t_ns + r.dur_ns / 2);
        let values = resource_values(r);
        self.node_cols
            .entry(node.to_string())
            .or_default()
            .at(k)
            .add(&values);
    }

    /// Folds one update of the live model into the whole-run series.
    /// Node `node`'s clock as the collector estimated it so far (the journal's).
    fn clock(&self, node: &str) -> Option<&NodeClock> {
        self.journal.timeline().nodes.clocks.get(node)
    }

    /// Folds one of the journal's updates: the iterations' parts and every resource reading
    /// (a job profile's agents' readings taken to the collector's clock).
    fn fold(&mut self, u: ViewUpdate) {
        for reading in &u.readings {
            let mut r = reading.resources.clone();
            if let Some(c) = self.clock(&reading.node) {
                r.t_ns = c.to_collector(r.t_ns);
            }
            self.resources(&reading.node, &r);
        }
        for r in &u.ranks {
            self.ranks.entry(r.rank).or_default().node = r.node.clone();
        }
        for (rank, p) in u.parts {
            let wall = p.wall_ns();
            let k = self.column(p.end_ns);
            self.job_cols.at(k).add(rank, p.iter, p.end_ns, &p.split);
            self.rank_cols
                .entry(rank)
                .or_default()
                .at(k)
                .add(p.iter, &p.split);
            let warmup = self.warmup;
            let t = self.ranks.entry(rank).or_default();
            let start = p.end_ns.saturating_sub(wall);
            t.first_start_ns = Some(t.first_start_ns.map_or(start, |s| s.min(start)));
            t.last_end_ns = t.last_end_ns.max(p.end_ns);
            if let Some(ppm) = p.gpu_busy_ppm {
                t.gpu_busy_ppm_sum += u64::from(ppm);
                t.gpu_busy_n += 1;
            }
            if p.iter == 0 && warmup > 0 {
                t.first_iteration_ns = wall;
            } else if p.iter < warmup {
                t.warmup_ns += wall;
            }
            if p.iter >= warmup {
                t.counted.add(wall);
                t.counted_split.add_split(&p.split);
                t.keep_long(Slowest {
                    rank,
                    iter: p.iter,
                    wall_ns: wall,
                    end_ns: p.end_ns,
                    split: p.split,
                });
                self.arrival_step(p.iter, rank, &p.split);
            }
        }
    }

    /// The ranks' waits in each counted iteration, for the straggler windows of ranks on one
    /// node; an iteration is closed once every rank known finished it.
    fn arrival_step(&mut self, iter: u64, rank: u32, split: &Split) {
        let ranks = self.ranks.len();
        let e = self.arrivals_pending.entry(iter).or_default();
        e.waits
            .push((rank, split.get(Category::PeerWait), split.total()));
        if e.waits.len() >= ranks {
            let done = self.arrivals_pending.remove(&iter).unwrap_or_default();
            self.close_iteration(iter, done);
        }
        while self.arrivals_pending.len() > ARRIVALS_PENDING {
            if let Some((iter, done)) = self.arrivals_pending.pop_first() {
                self.close_iteration(iter, done);
            }
        }
    }

    /// Takes an iteration all ranks (or all that will) have finished into the straggler
    /// windows.
    fn close_iteration(&mut self, iter: u64, done: PendingIteration) {
        if let Some(arrivals) = done.arrivals() {
            self.local_stragglers.add(iter, &arrivals);
        }
    }

    /// Attributes what is left and builds the report.
    pub fn finish(mut self) -> Report {
        self.journal.attribute(u64::MAX, true);
        let u = self.journal.take_update();
        self.fold(u);
        for (iter, done) in std::mem::take(&mut self.arrivals_pending) {
            self.close_iteration(iter, done);
        }
        (self.critical, self.critical_iterations) =
            self.journal.timeline().summary.totals.critical.totals();
        let axis = self.axis.unwrap_or(Axis::new(0));
        let view = self.journal.view().clone();
        let summary = view.summary.clone();
        let run_end = self
            .end
            .as_ref()
            .map_or(self.last_ns, |e| e.ended_mono_ns.max(self.last_ns));
        let run_seconds = axis.seconds(run_end);

        let mut problems = std::mem::take(&mut self.problems);
        problems.extend(summary.warnings.iter().cloned());
        if self.header.is_none() && self.experiment.is_none() {
            problems.push(if self.frames == 0 {
                "the profile holds no frames: the run wrote nothing (it was stopped before its first write, or this is not the profile)".into()
            } else {
                "the profile has no run header: its start is damaged or missing".into()
            });
        }
        if self.header.is_some() && self.end.is_none() {
            problems.push(format!(
                "the profile was cut {run_seconds:.1} s into the run (the profiler was killed or the machine stopped): what came after is missing, and the last iterations may be too"
            ));
        }
        if self.header.is_some() && view.attributed == 0 {
            problems.push("no iteration was attributed: no step markers reached stallscope".into());
        }

        let rank_medians: BTreeMap<u32, f64> = self
            .ranks
            .iter()
            .map(|(r, t)| (*r, t.counted.quantile_ns(0.5) as f64 / 1e9))
            .collect();
        let ctx = Ctx {
            axis,
            builder: &self,
            rank_medians: &rank_medians,
        };
        let timeline = ctx.timeline();
        let outside = ctx.outside(run_end);
        let stragglers = ctx.stragglers(&summary);
        let resources = ctx.resources(&view);
        let breakdown = ctx.breakdown(&summary);
        let workers = self
            .journal
            .timeline()
            .node
            .markers
            .loops()
            .filter_map(|m| m.info().workers)
            .max();
        let critical = CriticalPath {
            split: self.critical,
            iterations: self.critical_iterations,
            loader_workers: workers,
            cpus: self.header.as_ref().map_or(0, |h| h.cpus),
            parallelism: crate::parallelism::of_markers(&self.journal.timeline().node.markers),
        };
        let verdict = verdict(&summary, &critical, &view, &problems, self.end.is_some());

        Report {
            schema: REPORT_SCHEMA.into(),
            stallscope_version: env!("CARGO_PKG_VERSION").into(),
            name: view.name.clone(),
            sources: std::mem::take(&mut self.sources),
            problems,
            run_seconds,
            verdict,
            summary,
            breakdown,
            timeline,
            outside,
            stragglers,
            resources,
            experiment: self.experiment.take(),
            advice: None,
        }
    }
}

/// A node reading's quantities in [`ResourceColumn`] order.
fn resource_values(r: &NodeResources) -> [Option<f64>; RESOURCE_FIELDS] {
    [
        r.cpu_busy_cores,
        r.runq_delay,
        r.nic_rx_bytes_per_s,
        r.nic_tx_bytes_per_s,
        r.disk_read_bytes_per_s,
        r.disk_write_bytes_per_s,
        r.psi_cpu,
        r.psi_io,
        r.psi_memory,
        r.gpu_busy,
        r.pcie_rx_bytes_per_s,
        r.pcie_tx_bytes_per_s,
        r.nvlink_rx_bytes_per_s,
        r.nvlink_tx_bytes_per_s,
        r.rdma_rx_bytes_per_s,
        r.rdma_tx_bytes_per_s,
        None,
    ]
}

const CPU: usize = 0;
const RUNQ: usize = 1;
const NIC_RX: usize = 2;
const NIC_TX: usize = 3;
const DISK_R: usize = 4;
const DISK_W: usize = 5;
const PSI_CPU: usize = 6;
const PSI_IO: usize = 7;
const PSI_MEM: usize = 8;
const GPU: usize = 9;
const PCIE_RX: usize = 10;
const PCIE_TX: usize = 11;
const NVL_RX: usize = 12;
const NVL_TX: usize = 13;
const RDMA_RX: usize = 14;
const RDMA_TX: usize = 15;
const RETRANSMITS: usize = 16;

fn mb(x: Option<f64>) -> Option<f64> {
    x.map(|b| b / 1e6)
}

fn both(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (None, None) => None,
        _ => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
    }
}

fn mean_split(split: &Split, n: u64) -> Categories {
    let mut s = Split::default();
    for (i, v) in split.ns.iter().enumerate() {
        s.ns[i] = v / n.max(1);
    }
    Categories::from_split(&s)
}

/// What the builder's series answer, once read.
struct Ctx<'a> {
    axis: Axis,
    builder: &'a ReportBuilder,
    rank_medians: &'a BTreeMap<u32, f64>,
}

impl Ctx<'_> {
    fn node_of(&self, rank: u32) -> String {
        self.builder
            .ranks
            .get(&rank)
            .map(|t| t.node.clone())
            .unwrap_or_default()
    }

    fn slow(&self, s: &Slowest, with_activity: bool) -> SlowIteration {
        let node = self.node_of(s.rank);
        let wall = s.split.total();
        SlowIteration {
            rank: s.rank,
            node: node.clone(),
            iter: s.iter,
            at_seconds: self.axis.seconds(s.end_ns),
            seconds: wall as f64 / 1e9,
            rank_median_seconds: self.rank_medians.get(&s.rank).copied().unwrap_or(0.0),
            largest: s.split.largest(),
            parts: Categories::from_split(&s.split),
            activity: if with_activity {
                self.activity(&node, s.end_ns.saturating_sub(wall), s.end_ns)
            } else {
                None
            },
        }
    }

    /// What `node`'s readings say of `[a, b]` (the columns overlapping it).
    fn activity(&self, node: &str, a: Nanos, b: Nanos) -> Option<Activity> {
        let cols = self.builder.node_cols.get(node)?;
        let (ka, kb) = (self.axis.index(a), self.axis.index(b));
        let mut c = ResourceColumn::default();
        for col in cols.cols.iter().take(kb + 1).skip(ka) {
            c.merge(col);
        }
        if c.n.iter().all(|n| *n == 0) {
            return None;
        }
        Some(Activity {
            cpu_busy_cores: c.mean(CPU),
            disk_read_mb_per_s: mb(c.mean(DISK_R)),
            disk_write_mb_per_s: mb(c.mean(DISK_W)),
            nic_rx_mb_per_s: mb(c.mean(NIC_RX)),
            nic_tx_mb_per_s: mb(c.mean(NIC_TX)),
            gpu_busy: c.mean(GPU),
        })
    }

    fn timeline(&self) -> Timeline {
        let columns = self
            .builder
            .job_cols
            .cols
            .iter()
            .enumerate()
            .filter(|(_, c)| c.iterations > 0)
            .map(|(k, c)| TimelineColumn {
                start_seconds: self.axis.start_seconds(k),
                iterations: c.iterations,
                mean: mean_split(&c.split, c.iterations),
                p50_seconds: c.walls.quantile_ns(0.5) as f64 / 1e9,
                p95_seconds: c.walls.quantile_ns(0.95) as f64 / 1e9,
                slowest: c.slowest.as_ref().map(|s| self.slow(s, false)),
            })
            .collect();
        Timeline {
            column_seconds: self.axis.width_ns as f64 / 1e9,
            columns,
        }
    }

    fn outside(&self, run_end: Nanos) -> Outside {
        let t0 = self.axis.t0_ns;
        let mut ranks = Vec::new();
        let mut long: Vec<Slowest> = Vec::new();
        for (rank, t) in &self.builder.ranks {
            let threshold = t.long_threshold_ns();
            let (n_long, long_ns) = if t.counted.len() >= 4 {
                t.counted.above(threshold)
            } else {
                (0, 0)
            };
            if t.counted.len() >= 4 {
                long.extend(t.longest.iter().filter(|s| s.wall_ns >= threshold));
            }
            let counted_ns: u64 = t.counted_split.total();
            ranks.push(RankOutside {
                rank: *rank,
                node: t.node.clone(),
                before_loop_seconds: t
                    .first_start_ns
                    .map_or(0.0, |s| s.saturating_sub(t0) as f64 / 1e9),
                first_iteration_seconds: t.first_iteration_ns as f64 / 1e9,
                warmup_seconds: t.warmup_ns as f64 / 1e9,
                steady_seconds: counted_ns.saturating_sub(long_ns) as f64 / 1e9,
                long_seconds: long_ns as f64 / 1e9,
                long_iterations: n_long,
                teardown_seconds: run_end.saturating_sub(t.last_end_ns) as f64 / 1e9,
            });
        }
        long.sort_by_key(|b| std::cmp::Reverse(b.wall_ns));
        long.truncate(LONG_LISTED);
        let long_iterations: Vec<SlowIteration> = long.iter().map(|s| self.slow(s, true)).collect();
        let first_step = self
            .builder
            .ranks
            .values()
            .map(|t| t.first_start_ns.unwrap_or(t0) + t.first_iteration_ns)
            .min();
        let last_step = self.builder.ranks.values().map(|t| t.last_end_ns).max();
        let node = self
            .builder
            .ranks
            .values()
            .next()
            .map(|t| t.node.clone())
            .unwrap_or_else(|| self.builder.local_node());
        let startup_activity = first_step.and_then(|f| self.activity(&node, t0, f));
        let teardown_activity = last_step.and_then(|l| self.activity(&node, l, run_end));
        let run_seconds = self.axis.seconds(run_end);
        let sentence = outside_sentence(run_seconds, &ranks);
        Outside {
            run_seconds,
            ranks,
            long_iterations,
            startup_activity,
            teardown_activity,
            sentence,
        }
    }

    /// Straggler windows: the collector's (ranks on several nodes, joined by arrival), else
    /// those of the ranks that share this node, from their waits.
    fn stragglers(&self, summary: &crate::summary::Summary) -> Stragglers {
        let local;
        let listed = if summary.stragglers.is_empty() {
            let nodes: BTreeMap<u32, String> = self
                .builder
                .ranks
                .iter()
                .map(|(r, t)| (*r, t.node.clone()))
                .collect();
            local = self.builder.local_stragglers.list(&nodes);
            &local
        } else {
            &summary.stragglers
        };
        let mut by_rank: BTreeMap<u32, StragglerRank> = BTreeMap::new();
        for w in listed {
            let r = by_rank.entry(w.rank).or_insert_with(|| StragglerRank {
                rank: w.rank,
                node: w.node.clone(),
                ..StragglerRank::default()
            });
            r.windows += 1;
            r.held_seconds += w.held_seconds;
        }
        let mut by_rank: Vec<StragglerRank> = by_rank.into_values().collect();
        by_rank.sort_by(|a, b| b.held_seconds.total_cmp(&a.held_seconds));
        let mut windows: Vec<&crate::crossnode::StragglerWindow> = listed.iter().collect();
        windows.sort_by(|a, b| b.held_seconds.total_cmp(&a.held_seconds));
        windows.truncate(STRAGGLER_ROWS);
        let windows = windows
            .into_iter()
            .map(|w| {
                let (doing, at) = self.doing(w.rank, w.first_iter, w.last_iter);
                StragglerRow {
                    first_iter: w.first_iter,
                    last_iter: w.last_iter,
                    at_seconds: at,
                    rank: w.rank,
                    node: w.node.clone(),
                    held_seconds: w.held_seconds,
                    others_wait_fraction: w.others_wait_fraction,
                    doing,
                }
            })
            .collect();
        Stragglers {
            by_rank,
            windows,
            total_windows: listed.len() as u64,
        }
    }

    /// The rank's parts over the columns that hold iterations `first..=last`, and when the
    /// first of them began.
    fn doing(&self, rank: u32, first: u64, last: u64) -> (Option<Categories>, Option<f64>) {
        let Some(cols) = self.builder.rank_cols.get(&rank) else {
            return (None, None);
        };
        let mut split = Split::default();
        let mut at = None;
        for (k, c) in cols.cols.iter().enumerate() {
            if c.iterations > 0 && c.last_iter >= first && c.first_iter <= last {
                split.add_split(&c.split);
                at.get_or_insert(self.axis.start_seconds(k));
            }
        }
        (
            (split.total() > 0).then(|| Categories::from_split(&split)),
            at,
        )
    }

    fn resources(&self, view: &crate::view::JobView) -> Vec<NodeResourceSeries> {
        let mut names: Vec<String> = view.nodes.keys().cloned().collect();
        for n in self.builder.node_cols.keys() {
            if !names.contains(n) {
                names.push(n.clone());
            }
        }
        names
            .into_iter()
            .map(|name| {
                let nv = view.nodes.get(&name).cloned().unwrap_or_default();
                let columns = self
                    .builder
                    .node_cols
                    .get(&name)
                    .map(|cols| {
                        cols.cols
                            .iter()
                            .enumerate()
                            .filter(|(_, c)| c.n.iter().any(|n| *n > 0))
                            .map(|(k, c)| ResourceRow {
                                start_seconds: self.axis.start_seconds(k),
                                cpu_busy_cores: c.mean(CPU),
                                runq_delay: c.mean(RUNQ),
                                gpu_busy: c.mean(GPU),
                                nic_rx_mb_per_s: mb(c.mean(NIC_RX)),
                                nic_tx_mb_per_s: mb(c.mean(NIC_TX)),
                                disk_read_mb_per_s: mb(c.mean(DISK_R)),
                                disk_write_mb_per_s: mb(c.mean(DISK_W)),
                                pcie_mb_per_s: mb(both(c.mean(PCIE_RX), c.mean(PCIE_TX))),
                                nvlink_mb_per_s: mb(both(c.mean(NVL_RX), c.mean(NVL_TX))),
                                rdma_mb_per_s: mb(both(c.mean(RDMA_RX), c.mean(RDMA_TX))),
                                tcp_retransmits_per_s: c.mean(RETRANSMITS),
                                psi_cpu: c.mean(PSI_CPU),
                                psi_io: c.mean(PSI_IO),
                                psi_memory: c.mean(PSI_MEM),
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                NodeResourceSeries {
                    node: name.clone(),
                    ranks: nv.ranks.clone(),
                    clock_offset_ms: nv.clock_offset_ns.map(|o| o as f64 / 1e6),
                    clock_uncertainty_ms: nv.clock_uncertainty_ns.map(|u| u as f64 / 1e6),
                    records_dropped: nv.records_dropped,
                    markers_dropped: nv.markers_dropped,
                    sources_down: nv.sources_down.clone(),
                    gpus: nv.gpus.clone(),
                    columns,
                }
            })
            .collect()
    }

    fn breakdown(&self, summary: &crate::summary::Summary) -> Breakdown {
        let mut nodes: BTreeMap<String, (Vec<u32>, Split)> = BTreeMap::new();
        for (rank, t) in &self.builder.ranks {
            let n = nodes.entry(t.node.clone()).or_default();
            n.0.push(*rank);
            n.1.add_split(&t.counted_split);
        }
        let ranks = summary
            .ranks
            .iter()
            .map(|rs| {
                let t = self.builder.ranks.get(&rs.rank);
                let split = t.map(|t| t.counted_split).unwrap_or_default();
                RankRow {
                    rank: rs.rank,
                    node: rs
                        .node
                        .clone()
                        .or_else(|| t.map(|t| t.node.clone()))
                        .unwrap_or_default(),
                    iterations: rs.figures.iterations,
                    median_seconds: rs.figures.median_iteration_seconds,
                    p95_seconds: t.map_or(0.0, |t| t.counted.quantile_ns(0.95) as f64 / 1e9),
                    parts: rs.figures.categories,
                    largest_stall: split.largest_stall(),
                    gpu_busy: rs.gpu.as_ref().and_then(|g| g.busy_fraction).or_else(|| {
                        t.filter(|t| t.gpu_busy_n > 0)
                            .map(|t| t.gpu_busy_ppm_sum as f64 / t.gpu_busy_n as f64 / 1e6)
                    }),
                }
            })
            .collect();
        Breakdown {
            job: summary.job.categories,
            nodes: nodes
                .into_iter()
                .map(|(node, (ranks, split))| NodeBreakdown {
                    node,
                    ranks,
                    parts: Categories::from_split(&split),
                })
                .collect(),
            ranks,
            critical_path: Categories::from_split(&self.builder.critical),
            critical_path_iterations: self.builder.critical_iterations,
        }
    }
}

/// The paragraph on where the run's time went, per rank on average.
fn outside_sentence(run_seconds: f64, ranks: &[RankOutside]) -> String {
    if ranks.is_empty() {
        return format!("The run took {run_seconds:.2} s and no iteration was seen in it.");
    }
    let n = ranks.len() as f64;
    let mean = |f: fn(&RankOutside) -> f64| ranks.iter().map(f).sum::<f64>() / n;
    let before = mean(|r| r.before_loop_seconds);
    let first = mean(|r| r.first_iteration_seconds);
    let warm = mean(|r| r.warmup_seconds);
    let steady = mean(|r| r.steady_seconds);
    let long = mean(|r| r.long_seconds);
    let long_n = ranks.iter().map(|r| r.long_iterations).sum::<u64>() as f64 / n;
    let tear = mean(|r| r.teardown_seconds);
    let counted = steady + long;
    let share = |x: f64| {
        if run_seconds > 0.0 {
            x / run_seconds * 100.0
        } else {
            0.0
        }
    };
    let per = if ranks.len() > 1 {
        ", per rank on average"
    } else {
        ""
    };
    let mut s = format!(
        "The run took {run_seconds:.2} s; counted iterations cover {counted:.2} s of it ({:.0}%){per}. Start-up until the first step: {:.2} s ({before:.2} s before the training loop's first event — interpreter, imports, data set-up — and {first:.2} s in the first iteration — model build, rendezvous, first batch). Warm-up iterations left out: {warm:.2} s.",
        share(counted),
        before + first,
    );
    if long > 0.0 {
        s.push_str(&format!(
            " {long_n:.0} counted iteration(s) took far longer than their rank's median ({long:.2} s in all, {:.0}% of the run): epoch ends, evaluation or checkpoint saves happen there.",
            share(long)
        ));
    }
    s.push_str(&format!(
        " After the last step: {tear:.2} s (the last evaluation and save, teardown)."
    ));
    s
}

/// The verdict and how sure it is.
/// The job's critical path as the builder summed it, and what the finding's advice needs.
struct CriticalPath {
    /// ns per category over the iterations, each from the rank that held it up.
    split: Split,
    iterations: u64,
    loader_workers: Option<u32>,
    cpus: u32,
    parallelism: crate::parallelism::Parallelism,
}

/// The finding on the critical path: what the slowest rank of each iteration spent its time
/// on, so the waiters' peer wait does not outweigh the straggler's cause. Falls back to the
/// live summary's finding when no iteration was complete on every rank.
fn critical_finding(
    summary: &crate::summary::Summary,
    cp: &CriticalPath,
) -> (crate::finding::Finding, Categories) {
    if cp.iterations == 0 || cp.split.total() == 0 {
        return (summary.finding.clone(), summary.job.categories);
    }
    let figures = crate::figures::Figures {
        iterations: cp.iterations,
        median_iteration_seconds: summary.job.median_iteration_seconds,
        wall_seconds: cp.split.total() as f64 / 1e9,
        categories: Categories::from_split(&cp.split),
        coverage: summary.job.coverage,
    };
    let f = crate::finding::find(&crate::finding::FindingInput {
        job: &figures,
        ranks: &summary.ranks,
        loader_workers: cp.loader_workers,
        cpus: cp.cpus,
        parallelism: &cp.parallelism,
    });
    (f, figures.categories)
}

fn verdict(
    summary: &crate::summary::Summary,
    critical: &CriticalPath,
    view: &crate::view::JobView,
    problems: &[String],
    complete: bool,
) -> Verdict {
    let (finding, shares) = critical_finding(summary, critical);
    let f = &finding;
    let median = summary.job.median_iteration_seconds;
    let gain = if f.max_speedup > 1.0 {
        median * (1.0 - 1.0 / f.max_speedup)
    } else {
        0.0
    };
    let capped = f.max_speedup >= crate::finding::MAX_SPEEDUP;
    let bound_explained = match f.category {
        Some(Category::Compute) | None => "No stall is large enough to remove: only faster compute shortens the iteration.".into(),
        Some(c) if capped => format!(
            "The {} time is {:.0}% of the critical path: removing all of it would leave too little of what was measured to say how fast the iteration could get, so the bound is capped at {:.0}×.",
            c.name().replace('_', " "),
            f.fraction * 100.0,
            crate::finding::MAX_SPEEDUP
        ),
        Some(c) => format!(
            "The bound assumes the {} time disappears entirely from the critical path (per iteration, the rank that held it up: it waited least for its peers) and nothing else changes: the other stalls ({:.0}% of its time) and its compute remain, so the real gain is at most this, and less if the change moves time into another category.",
            c.name().replace('_', " "),
            (1.0 - f.fraction - shares.compute.fraction).max(0.0) * 100.0
        ),
    };
    let mut reasons: Vec<String> = problems.to_vec();
    let clock = view
        .nodes
        .values()
        .filter_map(|n| n.clock_uncertainty_ns)
        .max()
        .map(|u| u as f64 / 1e6);
    let cov = summary.job.coverage;
    let mut low = summary.job.iterations == 0 || !complete;
    if summary.job.iterations > 0 && cov.sampled < 0.5 {
        reasons.push(format!(
            "samples covered only {:.0}% of the iterations' time: the split rests on few readings",
            cov.sampled * 100.0
        ));
        low = true;
    } else if summary.job.iterations > 0 && cov.sampled < 0.9 {
        reasons.push(format!(
            "samples covered {:.0}% of the iterations' time",
            cov.sampled * 100.0
        ));
    }
    if let Some(u) = clock {
        let share = if median > 0.0 { u / 1e3 / median } else { 0.0 };
        if share > 0.05 {
            reasons.push(format!(
                "node clocks are known within ± {u:.2} ms, {:.0}% of an iteration: who waited for whom is uncertain by that much",
                share * 100.0
            ));
            low |= share > 0.25;
        }
    }
    if summary.markers.dropped > 0 {
        reasons.push(format!(
            "{} marker datagrams were lost: the iterations around them are merged",
            summary.markers.dropped
        ));
    }
    if summary.markers.rejected > 0 {
        reasons.push(format!(
            "{} marker datagrams were malformed and left out",
            summary.markers.rejected
        ));
    }
    if view.records_dropped > 0 {
        reasons.push(format!(
            "agents dropped {} records while the collector was away",
            view.records_dropped
        ));
    }
    let mut sources_down: Vec<String> = summary
        .sources_down
        .iter()
        .map(|s| format!("{}: {}", s.source, s.message))
        .collect();
    for n in view.nodes.values() {
        for s in &n.sources_down {
            let s = format!("{}: {s}", n.node);
            if !sources_down.contains(&s) {
                sources_down.push(s);
            }
        }
    }
    for s in &sources_down {
        reasons.push(format!("source down — {s}"));
    }
    let level = if low {
        "low"
    } else if reasons.is_empty() {
        "high"
    } else {
        "medium"
    };
    Verdict {
        sentence: f.sentence.clone(),
        suggestion: f.suggestion.clone(),
        category: f.category,
        fraction: f.fraction,
        rank: f.rank,
        median_iteration_seconds: median,
        max_speedup: f.max_speedup,
        max_gain_seconds: gain,
        bound_explained,
        confidence: Confidence {
            level: level.into(),
            coverage_marked: cov.marked,
            coverage_sampled: cov.sampled,
            clock_uncertainty_ms: clock,
            markers_dropped: summary.markers.dropped,
            markers_rejected: summary.markers.rejected,
            records_dropped: view.records_dropped,
            sources_down,
            complete,
            reasons,
        },
    }
}
