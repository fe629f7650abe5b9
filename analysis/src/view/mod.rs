//! The live job model: what every view renders — the status line, `stallscope top`,
//! `/metrics`, the report — and what the feed sends to a second process.
//!
//! Views are pure functions of a [`JobView`], so each is tested on a model built in the test,
//! without a process or a terminal. The model is fed by the journal that writes the profile
//! (`crate::journal::Journal`), so replaying a profile rebuilds the very model the live run
//! showed. Its memory is bounded whatever the job's length and size: per rank the last
//! [`recent_kept`] iterations' parts ([`RECENT_ITERATIONS`] up to 1,024 ranks, fewer beyond:
//! the job's share [`RECENT_PARTS_BUDGET`], at least [`MIN_RECENT_ITERATIONS`] a rank), per
//! node the last
//! [`RESOURCE_HISTORY`] resource readings, for the job the last [`STRAGGLER_WINDOWS`]
//! straggler windows; everything else is a running total.
//!
//! A [`JobView`] is plain data (serde): the feed sends a snapshot of it, then
//! [`ViewUpdate`]s that [`JobView::apply`] folds in, so a client's copy equals the server's.

pub mod binary;
pub mod hub;
mod live;
mod meter;

pub use crate::resources::NodeResources;
pub use live::{job_name, LiveModel, LOCAL};
pub use meter::NodeMeter;

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::category::Split;
use crate::crossnode::StragglerWindow;
use crate::gpu_usage::RankGpu;
use crate::summary::{Figures, Summary};
use crate::Nanos;

/// The schema name of a [`JobView`] and of the feed's messages.
pub const VIEW_SCHEMA: &str = "stallscope.view/1";

/// Iterations of one rank in its rolling window (the status line's "recent").
pub const WINDOW_ITERATIONS: usize = 32;

/// Iterations per rank whose parts are kept for charts, in a job of up to
/// [`RECENT_PARTS_BUDGET`] / [`RECENT_ITERATIONS`] (1,024) ranks; a larger job keeps fewer
/// per rank ([`recent_kept`]).
pub const RECENT_ITERATIONS: usize = 512;

/// Iterations' parts a job model keeps over all its ranks (80 bytes a part: 40 MiB), up to
/// 8,192 ranks, where each keeps [`MIN_RECENT_ITERATIONS`]; more ranks keep that many each.
/// At 10,000 ranks the full [`RECENT_ITERATIONS`] each took 390 MiB (780 MiB of buffers),
/// and growing them was a tenth of the collector's job thread in the job's first 20 s.
pub const RECENT_PARTS_BUDGET: usize = RECENT_ITERATIONS * 1_024;

/// Iterations per rank kept whatever the job's size: two [`WINDOW_ITERATIONS`] windows, and
/// enough for a p95.
pub const MIN_RECENT_ITERATIONS: usize = 2 * WINDOW_ITERATIONS;

/// Iterations per rank whose parts a model of `ranks` ranks keeps: [`RECENT_ITERATIONS`] up
/// to 1,024 ranks, then the [`RECENT_PARTS_BUDGET`] shared, at least
/// [`MIN_RECENT_ITERATIONS`] (64 at 10,000 ranks).
pub fn recent_kept(ranks: usize) -> usize {
    (RECENT_PARTS_BUDGET / ranks.max(1)).clamp(MIN_RECENT_ITERATIONS, RECENT_ITERATIONS)
}

/// Resource readings kept per node (one a second: two minutes) for sparklines.
pub const RESOURCE_HISTORY: usize = 120;

/// Straggler windows the model keeps, the most recent.
pub const STRAGGLER_WINDOWS: usize = 64;

/// One attributed iteration's parts, for charts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct IterationParts {
    /// Iteration index.
    pub iter: u64,
    /// ns, when it ended (the node's clock; the collector's in a job model).
    pub end_ns: Nanos,
    /// ns per category; sums to the iteration's wall time.
    pub split: Split,
    /// Share of the iteration the rank's GPU was busy (NVML), ppm, when it has one.
    pub gpu_busy_ppm: Option<u32>,
}

impl IterationParts {
    /// Wall time, ns.
    pub fn wall_ns(&self) -> u64 {
        self.split.total()
    }
}

/// One rank, live.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankView {
    /// Global rank.
    pub rank: u32,
    /// Its node (the host in a single-node run).
    pub node: String,
    /// The loop's process id.
    pub pid: u32,
    /// Counted (post-warm-up) iterations and their totals, as the summary has them.
    pub figures: Figures,
    /// s, the iteration time below which 95% of its recent iterations fell.
    pub p95_iteration_seconds: f64,
    /// Its GPU per counted iteration, when it has one.
    pub gpu: Option<RankGpu>,
    /// DataLoader workers its loop configured (`num_workers`), when the hook said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loader_workers: Option<u32>,
    /// Process ids of the loader workers seen working for it (ranks of the node that keeps
    /// the model; a collector sees other nodes' ranks without them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub loader_pids: Vec<u32>,
    /// The last [`recent_kept`] iterations' parts, oldest first (warm-up included).
    pub recent: VecDeque<IterationParts>,
}

impl RankView {
    /// Keeps only its last `kept` iterations' parts.
    pub(crate) fn keep_recent(&mut self, kept: usize) {
        let extra = self.recent.len().saturating_sub(kept);
        self.recent.drain(..extra);
    }

    /// ns per category over its last [`WINDOW_ITERATIONS`] iterations.
    pub fn window(&self) -> Split {
        window_split(self.recent.iter().rev().take(WINDOW_ITERATIONS))
    }

    /// ns, the median wall time of its recent window; 0 when empty.
    pub fn window_median_ns(&self) -> u64 {
        let mut walls: Vec<u64> = self
            .recent
            .iter()
            .rev()
            .take(WINDOW_ITERATIONS)
            .map(IterationParts::wall_ns)
            .collect();
        walls.sort_unstable();
        walls.get(walls.len() / 2).copied().unwrap_or(0)
    }
}

fn window_split<'a>(parts: impl Iterator<Item = &'a IterationParts>) -> Split {
    let mut split = Split::default();
    for p in parts {
        split.add_split(&p.split);
    }
    split
}

/// One node, live.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeView {
    /// Node name.
    pub node: String,
    /// Its ranks.
    pub ranks: Vec<u32>,
    /// The latest resource reading, when its sources gave one.
    pub resources: Option<NodeResources>,
    /// The last [`RESOURCE_HISTORY`] readings, oldest first.
    pub history: VecDeque<NodeResources>,
    /// ns, its clock minus the collector's (multi-node jobs).
    pub clock_offset_ns: Option<i64>,
    /// ns, the offset is right within this.
    pub clock_uncertainty_ns: Option<u64>,
    /// Records its agent dropped while the collector was away.
    pub records_dropped: u64,
    /// Marker datagrams lost on it.
    pub markers_dropped: u64,
    /// Sources on it that are down, with why.
    pub sources_down: Vec<String>,
    /// Its GPUs as NVML names them (index, UUID, product name), by index; empty when it has
    /// none or its agent predates them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<crate::frame::GpuIdentity>,
    /// Bytes per NIC (loopback left out) since its agent or run started counting, by name;
    /// empty when none was seen or its agent predates them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nics: Vec<crate::frame::NicBytes>,
    /// What its counters moved since its agent or run started counting (exact sums, what
    /// `/metrics`' node counters expose); absent when its agent predates them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counters: Option<crate::resources::NodeCounters>,
    /// Each RDMA port's wait, congestion and retransmission counters since its agent or run
    /// started counting, by device, port and counter; empty without RDMA ports.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rdma_counters: Vec<crate::frame::RdmaCount>,
    /// Its TCP flows over its NICs summed per class since its agent or run started (the flow
    /// source); empty without one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flow_classes: Vec<crate::flows::FlowClassTotals>,
}

impl NodeView {
    /// The product name of its GPU `gpu` (NVML index), when known.
    pub fn gpu_model(&self, gpu: &str) -> Option<&str> {
        self.gpus
            .iter()
            .find(|g| g.gpu == gpu)
            .and_then(|g| g.model.as_deref())
    }
}

/// The job, live: the verdict and the figures every view starts with.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobView {
    /// Always [`VIEW_SCHEMA`].
    pub schema: String,
    /// The job's name (`--job`, else the command's name).
    pub name: String,
    /// The summary of everything attributed so far: the figures, the finding, coverage,
    /// markers, sources down (refreshed at most once a second while running).
    pub summary: Summary,
    /// ns, the latest time the model has seen (the node's clock, the collector's in a job).
    pub now_ns: Nanos,
    /// Iterations attributed, warm-up included, all ranks.
    pub attributed: u64,
    /// Samples (inputs) per second over the ranks' recent windows, when the batch size is
    /// known.
    pub samples_per_second: Option<f64>,
    /// Samples per iteration per rank (`batch_size` meta), when the hook said.
    pub batch_size: Option<u64>,
    /// Per rank.
    pub ranks: BTreeMap<u32, RankView>,
    /// Per node.
    pub nodes: BTreeMap<String, NodeView>,
    /// The most recent [`STRAGGLER_WINDOWS`] windows in which one rank held the others up.
    pub stragglers: VecDeque<StragglerWindow>,
    /// Records dropped by agents while the collector was away, all nodes.
    pub records_dropped: u64,
}

impl JobView {
    /// An empty model of job `name`.
    pub fn new(name: &str) -> JobView {
        JobView {
            schema: VIEW_SCHEMA.into(),
            name: name.into(),
            ..JobView::default()
        }
    }

    /// ns per category over every rank's recent window.
    pub fn window(&self) -> Split {
        let mut split = Split::default();
        for r in self.ranks.values() {
            split.add_split(&r.window());
        }
        split
    }

    /// The job's [`WINDOW_ITERATIONS`] most recent iterations, whichever their ranks, latest
    /// last: what the status line speaks of.
    pub fn recent(&self) -> Vec<&IterationParts> {
        let mut parts: Vec<&IterationParts> = self
            .ranks
            .values()
            .flat_map(|r| r.recent.iter().rev().take(WINDOW_ITERATIONS))
            .collect();
        parts.sort_by_key(|p| p.end_ns);
        let skip = parts.len().saturating_sub(WINDOW_ITERATIONS);
        parts.split_off(skip)
    }

    /// The highest iteration number any rank completed, plus one.
    pub fn iterations(&self) -> u64 {
        self.ranks
            .values()
            .filter_map(|r| r.recent.back())
            .map(|p| p.iter + 1)
            .max()
            .unwrap_or(0)
    }

    /// Folds in an update from the feed.
    pub fn apply(&mut self, u: ViewUpdate) {
        let kept_before = recent_kept(self.ranks.len());
        self.now_ns = u.now_ns;
        self.attributed = u.attributed;
        self.samples_per_second = u.samples_per_second;
        self.batch_size = u.batch_size;
        self.records_dropped = u.records_dropped;
        if let Some(s) = u.summary {
            self.summary = *s;
        }
        for h in u.hangs {
            self.summary.note_hang(h);
        }
        // Before the ranks: a rank removed may be taken again by another process since.
        for rank in &u.removed_ranks {
            self.ranks.remove(rank);
        }
        for r in u.ranks {
            let recent = self
                .ranks
                .remove(&r.rank)
                .map(|old| old.recent)
                .unwrap_or_default();
            self.ranks.insert(r.rank, RankView { recent, ..r });
        }
        // The ranks are those of the update's end, as when the model took it.
        let kept = recent_kept(self.ranks.len());
        if kept < kept_before {
            trim_recent(&mut self.ranks, kept);
        }
        for (rank, parts) in u.parts {
            if let Some(r) = self.ranks.get_mut(&rank) {
                push_bounded(&mut r.recent, parts, kept);
            }
        }
        for n in u.nodes {
            let mut history = self
                .nodes
                .remove(&n.node)
                .map(|old| old.history)
                .unwrap_or_default();
            for r in u.readings.iter().filter(|r| r.node == n.node) {
                if history.back().is_none_or(|h| h.t_ns != r.resources.t_ns) {
                    push_bounded(&mut history, r.resources.clone(), RESOURCE_HISTORY);
                }
            }
            if let Some(res) = &n.resources {
                if history.back().is_none_or(|h| h.t_ns != res.t_ns) {
                    push_bounded(&mut history, res.clone(), RESOURCE_HISTORY);
                }
            }
            self.nodes.insert(n.node.clone(), NodeView { history, ..n });
        }
        for w in u.stragglers {
            push_bounded(&mut self.stragglers, w, STRAGGLER_WINDOWS);
        }
    }
}

/// What changed in a [`JobView`] since the last update: the feed sends these after its first
/// snapshot. Ranks and nodes that changed are sent whole but without their histories, which
/// grow by `parts` and by the node's `readings`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ViewUpdate {
    /// See [`JobView::now_ns`].
    pub now_ns: Nanos,
    /// See [`JobView::attributed`].
    pub attributed: u64,
    /// See [`JobView::samples_per_second`].
    pub samples_per_second: Option<f64>,
    /// See [`JobView::batch_size`].
    pub batch_size: Option<u64>,
    /// See [`JobView::records_dropped`].
    pub records_dropped: u64,
    /// The new summary, when it was refreshed.
    pub summary: Option<Box<Summary>>,
    /// Ranks whose figures changed, with empty `recent`.
    pub ranks: Vec<RankView>,
    /// New iterations' parts, by rank, in order.
    pub parts: Vec<(u32, IterationParts)>,
    /// Nodes that changed, with empty `history`.
    pub nodes: Vec<NodeView>,
    /// New straggler windows.
    pub stragglers: Vec<StragglerWindow>,
    /// Every resource reading since the last update, in order (a node may have several: an
    /// update is taken when its owner attributes, not when a reading closes): what the
    /// report folds, and what a node's `history` grows by.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub readings: Vec<NodeReading>,
    /// Ranks that left the model: their process now reports as another rank.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed_ranks: Vec<u32>,
    /// The feed's hang events: each hang declared, or resumed (`resumed_after_seconds` set),
    /// since the last update, as the summary's `hangs` holds it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hangs: Vec<crate::hang::HangReport>,
}

/// One node's resources over one reading.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeReading {
    /// The node.
    pub node: String,
    /// The reading, on the node's clock.
    pub resources: NodeResources,
}

impl ViewUpdate {
    /// One update standing for `self` and then `later`: applying it does what applying both
    /// in turn does (a replay merges its steps' updates to keep its memory within a budget).
    /// Parts and readings are concatenated, the rest is `later`'s where it says, `self`'s
    /// where it does not.
    pub fn then(mut self, later: ViewUpdate) -> ViewUpdate {
        let ViewUpdate {
            now_ns,
            attributed,
            samples_per_second,
            batch_size,
            records_dropped,
            summary,
            ranks,
            parts,
            nodes,
            stragglers,
            readings,
            removed_ranks,
            hangs,
        } = later;
        self.hangs.extend(hangs);
        self.now_ns = now_ns;
        self.attributed = attributed;
        self.samples_per_second = samples_per_second;
        self.batch_size = batch_size;
        self.records_dropped = records_dropped;
        if summary.is_some() {
            self.summary = summary;
        }
        // A rank removed later leaves with its earlier figures and parts.
        self.ranks.retain(|r| !removed_ranks.contains(&r.rank));
        self.parts.retain(|(r, _)| !removed_ranks.contains(r));
        self.removed_ranks.extend(removed_ranks);
        for r in ranks {
            self.ranks.retain(|old| old.rank != r.rank);
            self.ranks.push(r);
        }
        self.parts.extend(parts);
        for n in nodes {
            self.nodes.retain(|old| old.node != n.node);
            self.nodes.push(n);
        }
        self.stragglers.extend(stragglers);
        self.readings.extend(readings);
        self
    }
}

/// Appends `item`, dropping the oldest beyond `cap`. The oldest go first, so the queue never
/// holds more than `cap` and never grows its buffer past it.
pub(crate) fn push_bounded<T>(q: &mut VecDeque<T>, item: T, cap: usize) {
    if cap == 0 {
        q.clear();
        return;
    }
    while q.len() >= cap {
        q.pop_front();
    }
    q.push_back(item);
}

/// Shortens every rank's recent parts to their last `kept`, and gives back the memory of a
/// buffer grown for far more: done, by the model and by a viewer alike, when the job's
/// ranks grew enough to lower [`recent_kept`], so that both keep the same whatever the
/// updates' boundaries.
pub(crate) fn trim_recent(ranks: &mut BTreeMap<u32, RankView>, kept: usize) {
    for r in ranks.values_mut() {
        r.keep_recent(kept);
        if r.recent.capacity() > 2 * kept {
            r.recent.shrink_to(kept);
        }
    }
}

#[cfg(test)]
mod tests;
