//! Keeps a [`JobView`] up to date from the journal: every frame it writes, every iteration it
//! attributes. Also collects what changed since the feed last asked ([`ViewUpdate`]).
//!
//! The summary inside the model is the end-of-run summary's code run on the job so far, so a
//! live view says what the end of the run will say. It costs a sort of the exact wall times
//! per rank, so it is refreshed once a second of the job's time for up to 64 ranks and less
//! often above ([`LiveModel::summary_every_ns`]), and at the end.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::attribution::IterationBreakdown;
use crate::fast_hash::FastMap;
use crate::frame::Frame;
use crate::job::JobTimeline;
use crate::rank_table::RankTable;
use crate::summary::summarize;
use crate::Nanos;

use super::{
    push_bounded, recent_kept, trim_recent, IterationParts, JobView, NodeMeter, NodeView, RankView,
    ViewUpdate, RECENT_ITERATIONS, RESOURCE_HISTORY, STRAGGLER_WINDOWS,
};

/// Ranks whose summary is refreshed every second; more ranks refresh less often.
const RANKS_PER_SECOND: usize = 64;

/// The name of the node a single-node run's host field leaves empty.
pub const LOCAL: &str = "local";

/// A [`JobView`] and what changed in it since [`LiveModel::take_update`].
#[derive(Debug, Default)]
pub struct LiveModel {
    view: JobView,
    meter: NodeMeter,
    /// The node this process samples (`run`, `agent`); `None` in a collector.
    local_node: Option<String>,
    pending: ViewUpdate,
    dirty_ranks: BTreeSet<u32>,
    dirty_nodes: BTreeSet<String>,
    last_summary_ns: Option<Nanos>,
    /// GPU busy shares (ppm) other nodes' agents reported, per rank by iteration in the
    /// order reported, until the joined iteration is observed: at most [`REPORT_GPU_HELD`]
    /// per rank, the latest. Per rank, not by (rank, iteration): a map taking 300,000 keys a
    /// second in and out was a fourteenth of the collector's job thread at 10,000 ranks; by
    /// rank number, so that a round's look-ups walk it in order ([`RankTable`]).
    report_gpu: RankTable<VecDeque<(u64, u32)>>,
    /// ns between summaries when set ([`LiveModel::set_summary_every`]), instead of the
    /// live pace.
    summary_every: Option<Nanos>,
    /// Ranks the model held when the last update was taken: what a viewer's copy holds.
    ranks_at_update: usize,
    /// Per node, the RDMA bytes its agent sent last, for the reading and counters that follow.
    rdma: BTreeMap<String, crate::frame::NodeRdma>,
    /// Every node's TCP flows, for their totals per class.
    flows: crate::flows::FlowLedger,
    /// A profile whose samples were thinned ([`Frame::SamplesThinned`]): this node's
    /// one-second readings come as [`Frame::NodeResources`], not from its samples.
    thinned: bool,
    /// The ranks in the view by their process id: a rank new to the model looks for the
    /// rank its process held before among these, not among every rank (at 10,000 ranks
    /// that walk per new rank made the first round of a job half a second long).
    ranks_by_pid: FastMap<u32, Vec<u32>>,
}

/// Reported GPU readings held per rank for iterations not yet joined.
const REPORT_GPU_HELD: usize = 64;

impl LiveModel {
    /// An empty model of job `name`.
    pub fn new(name: &str) -> LiveModel {
        LiveModel {
            view: JobView::new(name),
            ..LiveModel::default()
        }
    }

    /// The model as it stands.
    pub fn view(&self) -> &JobView {
        &self.view
    }

    /// Takes a frame the journal wrote: the header names the node, samples feed the node's
    /// resources, other nodes' frames their health and clocks.
    pub fn ingest(&mut self, frame: &Frame) {
        match frame {
            Frame::Hang(h) => {
                // At once, not at the next summary: a hang is news.
                self.view.summary.note_hang((**h).clone());
                self.pending.hangs.push((**h).clone());
            }
            Frame::Header(h) => {
                if self.view.name.is_empty() {
                    self.view.name = job_name(&h.command);
                }
                let is_collector = h.is_collectors();
                if !is_collector {
                    let node = if h.host.is_empty() { LOCAL } else { &h.host };
                    self.local_node = Some(node.to_string());
                }
            }
            Frame::NodeResources(r) => {
                let mut resources = r.resources.clone();
                if let Some(rdma) = self.rdma.get(&r.node) {
                    rdma.complete_reading(&mut resources);
                }
                self.resources(&r.node, resources)
            }
            Frame::NodeRdma(x) => {
                let mut counters = x.counters.clone();
                counters.sort();
                let node = self.node_mut(&x.node);
                if node.rdma_counters != counters {
                    node.rdma_counters = counters;
                    self.dirty_nodes.insert(x.node.clone());
                }
                self.rdma.insert(x.node.clone(), x.clone());
            }
            Frame::NodeFlows(f) => {
                self.flows.ingest(f);
                let totals = self.flows.class_totals(&f.node);
                // A run's own flows come unnamed: they are its node's.
                let name = match (&self.local_node, f.node.is_empty()) {
                    (Some(local), true) => local.clone(),
                    _ => f.node.clone(),
                };
                let node = self.node_mut(&name);
                if node.flow_classes != totals {
                    node.flow_classes = totals;
                    self.dirty_nodes.insert(name);
                }
            }
            Frame::NodeGpus(g) => {
                let mut gpus = g.gpus.clone();
                gpus.sort();
                gpus.dedup_by(|a, b| a.gpu == b.gpu);
                let n = self.node_mut(&g.node);
                if n.gpus != gpus {
                    n.gpus = gpus;
                    self.dirty_nodes.insert(g.node.clone());
                }
            }
            Frame::NodeCounters(c) => {
                let mut counters = c.counters.clone();
                if let Some(rdma) = self.rdma.get(&c.node) {
                    rdma.complete_counters(&mut counters);
                }
                let node = self.node_mut(&c.node);
                if node.counters.as_ref() != Some(&counters) {
                    node.counters = Some(counters);
                    self.dirty_nodes.insert(c.node.clone());
                }
            }
            Frame::NodeNics(n) => {
                let mut nics = n.nics.clone();
                nics.sort();
                let node = self.node_mut(&n.node);
                if node.nics != nics {
                    node.nics = nics;
                    self.dirty_nodes.insert(n.node.clone());
                }
            }
            Frame::Series(d) => {
                self.gpu_declared(d);
                self.meter.ingest(frame);
            }
            Frame::NodeReport(r) => {
                let b = &r.iteration.breakdown;
                if let Some(ppm) = r.gpu.as_ref().and_then(|g| g.busy_ppm) {
                    push_bounded(
                        self.report_gpu.entry_or_default(b.rank),
                        (b.iter, ppm),
                        REPORT_GPU_HELD,
                    );
                }
            }
            Frame::NodeClock(c) => {
                self.dirty_nodes.insert(c.node.clone());
            }
            Frame::NodeHealth(h) => {
                self.dirty_nodes.insert(h.node.clone());
            }
            Frame::SamplesThinned(_) => self.thinned = true,
            Frame::Samples(_) if self.thinned => {}
            Frame::Source(_) => {
                if let Some(n) = &self.local_node {
                    self.dirty_nodes.insert(n.clone());
                }
            }
            _ => {
                // The run's last second is rarely whole: at its end the open bucket is a
                // reading too (resource charts stopped up to a second before the run did).
                let reading = match frame {
                    Frame::End(_) => self.meter.flush(),
                    _ => self.meter.ingest(frame),
                };
                if let Some(reading) = reading {
                    if let Some(node) = self.local_node.clone() {
                        self.resources(&node, reading);
                        let nics = self.meter.nics();
                        let counters = self.meter.counters();
                        let rdma_counters = self.meter.rdma_counters();
                        let n = self.node_mut(&node);
                        if !nics.is_empty() {
                            n.nics = nics;
                        }
                        n.rdma_counters = rdma_counters;
                        n.counters = Some(counters);
                    }
                }
            }
        }
    }

    /// A series of one of this node's GPUs names the GPU: its index, UUID and product name.
    fn gpu_declared(&mut self, d: &crate::series::SeriesDecl) {
        use crate::series::{LABEL_GPU, LABEL_MODEL, LABEL_UUID};
        let (Some(node), Some(gpu)) = (self.local_node.clone(), d.label(LABEL_GPU)) else {
            return;
        };
        let identity = crate::frame::GpuIdentity {
            gpu: gpu.to_string(),
            uuid: d.label(LABEL_UUID).map(str::to_string),
            model: d.label(LABEL_MODEL).map(str::to_string),
        };
        let n = self.node_mut(&node);
        match n.gpus.iter_mut().find(|g| g.gpu == identity.gpu) {
            Some(known) if *known == identity => return,
            Some(known) => *known = identity,
            None => {
                n.gpus.push(identity);
                n.gpus.sort();
            }
        }
        self.dirty_nodes.insert(node);
    }

    /// A process that now reports as `rank` and was another rank before (an elastic restart
    /// renumbering, a hook that learnt its rank late): its former rank leaves the model, so
    /// that a rank's label changing does not leave a rank behind in every view and a
    /// `/metrics` series per label for ever (issue 30, item 12). The summary keeps its
    /// iterations.
    fn forget_former_rank_of(&mut self, rank: u32, pid: u32, node: &str) {
        let ranks = &self.view.ranks;
        let mut former: Vec<u32> = self
            .ranks_by_pid
            .get(&pid)
            .into_iter()
            .flatten()
            .copied()
            .filter(|r| *r != rank && ranks.get(r).is_some_and(|v| v.pid == pid && v.node == node))
            .collect();
        // In rank order, as a walk over the ranks found them.
        former.sort_unstable();
        for old in former {
            self.view.ranks.remove(&old);
            self.unindex(old, pid);
            self.dirty_ranks.remove(&old);
            self.pending.parts.retain(|(r, _)| *r != old);
            self.pending.removed_ranks.push(old);
        }
    }

    /// Takes the GPU busy share (ppm) reported for `rank`'s iteration `iter` (nearly always
    /// the oldest held: iterations are joined in order).
    fn reported_gpu(&mut self, rank: u32, iter: u64) -> Option<u32> {
        let held = self.report_gpu.get_mut(rank)?;
        let at = held.iter().position(|(i, _)| *i == iter)?;
        held.remove(at).map(|(_, ppm)| ppm)
    }

    /// Drops `rank` from the ranks of process `pid`.
    fn unindex(&mut self, rank: u32, pid: u32) {
        if let Some(ranks) = self.ranks_by_pid.get_mut(&pid) {
            ranks.retain(|r| *r != rank);
            if ranks.is_empty() {
                self.ranks_by_pid.remove(&pid);
            }
        }
    }

    fn resources(&mut self, node: &str, r: super::NodeResources) {
        self.pending.readings.push(super::NodeReading {
            node: node.to_string(),
            resources: r.clone(),
        });
        let n = self.node_mut(node);
        n.resources = Some(r.clone());
        push_bounded(&mut n.history, r, RESOURCE_HISTORY);
        self.dirty_nodes.insert(node.to_string());
    }

    fn node_mut(&mut self, node: &str) -> &mut NodeView {
        self.view
            .nodes
            .entry(node.to_string())
            .or_insert_with(|| NodeView {
                node: node.to_string(),
                ..NodeView::default()
            })
    }

    /// Between two summary refreshes, ns of the job's time: 1 s up to 64 ranks, then 1 s per
    /// 64 ranks, at most 10 s.
    pub fn summary_every_ns(&self) -> Nanos {
        if let Some(ns) = self.summary_every {
            return ns;
        }
        let ranks = self.view.ranks.len().max(1);
        (ranks.div_ceil(RANKS_PER_SECOND) as Nanos).min(10) * 1_000_000_000
    }

    /// Summarises every `ns` of the job's time instead of at the live pace: a reader that
    /// replays a long profile only needs the summary at the end, and each one costs a pass
    /// over every rank's figures.
    pub fn set_summary_every(&mut self, ns: Nanos) {
        self.summary_every = Some(ns);
    }

    /// Takes the iterations an attribution round produced at `now` (ns, the clock the job
    /// timeline runs on); refreshes the summary when it is due or the run is `finishing`.
    pub fn observe(
        &mut self,
        job: &JobTimeline,
        new: &[IterationBreakdown],
        now: Nanos,
        finishing: bool,
    ) {
        self.view.now_ns = self.view.now_ns.max(now);
        for b in new {
            let gpu_busy_ppm = match job.gpu_reading(b.rank, b.iter) {
                Some(g) => g.busy_ppm,
                None => self.reported_gpu(b.rank, b.iter),
            };
            let parts = IterationParts {
                iter: b.iter,
                end_ns: b.end_ns,
                split: b.split,
                gpu_busy_ppm,
            };
            // Only a rank new to the model, or whose process or node changed, can have taken
            // another's place, and only then does its view change other than by its recent
            // iterations (which `parts` carry): the rest skip the walk over every rank (at
            // 10,000 ranks that walk per iteration was a fifth of the collector's CPU) and are
            // not sent whole in every round's update (their figures change at a refresh).
            let node = node_name(job, self.local_node.as_deref(), b.rank);
            let kept = recent_kept(self.view.ranks.len());
            // The rank's view looked up once, in the common case.
            if let Some(r) = self
                .view
                .ranks
                .get_mut(&b.rank)
                .filter(|r| r.pid == b.pid && r.node == node)
            {
                push_bounded(&mut r.recent, parts, kept);
            } else {
                let node = node_name(job, self.local_node.as_deref(), b.rank).to_string();
                self.forget_former_rank_of(b.rank, b.pid, &node);
                let former_pid = self.view.ranks.get(&b.rank).map(|r| r.pid);
                let r = self.view.ranks.entry(b.rank).or_insert_with(|| RankView {
                    rank: b.rank,
                    node: node.clone(),
                    pid: b.pid,
                    ..RankView::default()
                });
                r.pid = b.pid;
                r.node = node;
                push_bounded(&mut r.recent, parts, kept);
                self.dirty_ranks.insert(b.rank);
                if former_pid != Some(b.pid) {
                    if let Some(former) = former_pid {
                        self.unindex(b.rank, former);
                    }
                    self.ranks_by_pid.entry(b.pid).or_default().push(b.rank);
                }
            }
            self.pending.parts.push((b.rank, parts));
            self.view.attributed += 1;
        }
        let due = self
            .last_summary_ns
            .is_none_or(|t| now.saturating_sub(t) >= self.summary_every_ns());
        if finishing || (due && !self.view.ranks.is_empty()) {
            self.refresh(job, now);
        }
    }

    /// Re-reads the summary and everything derived from the job timeline.
    fn refresh(&mut self, job: &JobTimeline, now: Nanos) {
        self.last_summary_ns = Some(now);
        let mut summary = summarize(job);
        let known = self.view.stragglers.back().map(|w| w.first_iter);
        for w in std::mem::take(&mut summary.stragglers) {
            if known.is_none_or(|k| w.first_iter > k) {
                push_bounded(&mut self.view.stragglers, w.clone(), STRAGGLER_WINDOWS);
                self.pending.stragglers.push(w);
            }
        }
        let warmup = u64::from(summary.warmup_iterations);
        for rs in &summary.ranks {
            let Some(r) = self.view.ranks.get_mut(&rs.rank) else {
                continue;
            };
            r.figures = rs.figures.clone();
            r.gpu = rs.gpu.clone();
            if let Some(marks) = job.node.markers.procs.get(&r.pid) {
                r.loader_workers = marks.info().workers;
                r.loader_pids = job
                    .node
                    .markers
                    .procs
                    .values()
                    .filter(|p| p.info().is_loader() && p.info().parent == Some(r.pid))
                    .map(|p| p.pid)
                    .collect();
            }
            r.p95_iteration_seconds = p95_seconds(r.recent.iter().filter(|p| p.iter >= warmup));
            self.dirty_ranks.insert(rs.rank);
        }
        self.view.batch_size = job.node.markers.batch_size();
        self.view.samples_per_second = self.view.batch_size.map(|batch| {
            self.view
                .ranks
                .values()
                .map(|r| r.window_median_ns())
                .filter(|ns| *ns > 0)
                .map(|ns| batch as f64 * 1e9 / ns as f64)
                .sum()
        });
        self.refresh_nodes(job);
        self.view.records_dropped = job.nodes.health.values().map(|h| h.records_dropped).sum();
        self.view.summary = summary.clone();
        self.pending.summary = Some(Box::new(summary));
    }

    fn refresh_nodes(&mut self, job: &JobTimeline) {
        let mut ranks_of: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        for r in self.view.ranks.values() {
            ranks_of.entry(r.node.clone()).or_default().push(r.rank);
        }
        if let Some(local) = self.local_node.clone() {
            let down: Vec<String> = job
                .node
                .sources
                .values()
                .filter(|s| !s.up)
                .map(|s| format!("{}: {}", s.source, s.message))
                .collect();
            let markers_dropped = job.node.markers.dropped();
            let n = self.node_mut(&local);
            n.sources_down = down;
            n.markers_dropped = markers_dropped;
        }
        for (node, h) in &job.nodes.health {
            let n = self.node_mut(node);
            n.records_dropped = h.records_dropped;
            n.markers_dropped = h.markers_dropped;
            n.sources_down = h
                .sources_down
                .iter()
                .map(|s| format!("{}: {}", s.source, s.message))
                .collect();
        }
        for (node, c) in &job.nodes.clocks {
            let n = self.node_mut(node);
            n.clock_offset_ns = Some(c.offset_ns);
            n.clock_uncertainty_ns = Some(c.uncertainty_ns);
        }
        for (node, ranks) in ranks_of {
            self.node_mut(&node).ranks = ranks;
        }
        self.dirty_nodes.extend(self.view.nodes.keys().cloned());
    }

    /// What changed since the last call: the feed sends it to every client.
    pub fn take_update(&mut self) -> ViewUpdate {
        let mut u = std::mem::take(&mut self.pending);
        // The next round's parts are about as many as this one's: no doubling from empty.
        self.pending.parts.reserve(u.parts.len());
        // A viewer applying this update keeps parts by the ranks it will then hold, the
        // model's now: when they grew enough to lower the number kept, it shortens every
        // rank, and so does the model; otherwise the ranks with parts in the update, which
        // the model kept by its ranks at each iteration.
        let kept = recent_kept(self.view.ranks.len());
        if kept < recent_kept(self.ranks_at_update) {
            trim_recent(&mut self.view.ranks, kept);
        } else if kept < RECENT_ITERATIONS {
            for (rank, _) in &u.parts {
                if let Some(r) = self.view.ranks.get_mut(rank) {
                    r.keep_recent(kept);
                }
            }
        }
        self.ranks_at_update = self.view.ranks.len();
        u.now_ns = self.view.now_ns;
        u.attributed = self.view.attributed;
        u.samples_per_second = self.view.samples_per_second;
        u.batch_size = self.view.batch_size;
        u.records_dropped = self.view.records_dropped;
        // The update carries neither a rank's recent iterations nor a node's history (their
        // news is in `parts`; the history is the viewer's to keep): they are set aside while
        // the rest is cloned.
        for rank in std::mem::take(&mut self.dirty_ranks) {
            if let Some(r) = self.view.ranks.get_mut(&rank) {
                let recent = std::mem::take(&mut r.recent);
                u.ranks.push(r.clone());
                r.recent = recent;
            }
        }
        for node in std::mem::take(&mut self.dirty_nodes) {
            if let Some(n) = self.view.nodes.get_mut(&node) {
                let history = std::mem::take(&mut n.history);
                u.nodes.push(n.clone());
                n.history = history;
            }
        }
        u
    }
}

/// The node of `rank`: as the collector joined it, else this process's node (`local`).
fn node_name<'a>(job: &'a JobTimeline, local: Option<&'a str>, rank: u32) -> &'a str {
    job.nodes.node_of(rank).or(local).unwrap_or(LOCAL)
}

/// The job's name from its command: the script's file stem for `python3 train.py`, else the
/// program's name.
pub fn job_name(command: &[String]) -> String {
    let is_python = command
        .first()
        .and_then(|p| std::path::Path::new(p).file_name())
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("python"));
    let word = if is_python {
        command.iter().skip(1).find(|a| !a.starts_with('-'))
    } else {
        command.first()
    };
    word.and_then(|w| std::path::Path::new(w).file_stem())
        .and_then(|s| s.to_str())
        .unwrap_or("")
        .to_string()
}

/// The 95th percentile (nearest rank) of the iterations' wall times, s; 0 with none.
fn p95_seconds<'a>(parts: impl Iterator<Item = &'a IterationParts>) -> f64 {
    let mut walls: Vec<u64> = parts.map(IterationParts::wall_ns).collect();
    if walls.is_empty() {
        return 0.0;
    }
    walls.sort_unstable();
    let k = ((0.95 * walls.len() as f64).ceil() as usize).clamp(1, walls.len()) - 1;
    walls[k] as f64 / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_is_named_after_its_script_or_program() {
        let c = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        assert_eq!(
            job_name(&c("python3 -u examples/train.py --workers 2")),
            "train"
        );
        assert_eq!(job_name(&c("/usr/bin/torchrun --nproc 2 t.py")), "torchrun");
        assert_eq!(job_name(&[]), "");
    }

    #[test]
    fn the_95th_percentile_is_by_nearest_rank() {
        let parts: Vec<IterationParts> = (1..=100)
            .map(|i| {
                let mut split = crate::category::Split::default();
                split.add(crate::category::Category::Compute, i * 1_000_000);
                IterationParts {
                    iter: i,
                    end_ns: 0,
                    split,
                    gpu_busy_ppm: None,
                }
            })
            .collect();
        assert!((p95_seconds(parts.iter()) - 0.095).abs() < 1e-12);
    }
}
