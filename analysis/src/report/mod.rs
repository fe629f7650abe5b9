//! `stallscope report`: the post-hoc report of a profile, as one data structure every format
//! (HTML, Markdown, JSON) renders.
//!
//! The report is built by replaying the profile through the same [`crate::journal::Journal`]
//! and live model the run, `stallscope top` and `/metrics` used, so it says what the live
//! views said; the live model keeps only recent history, so the builder also folds every
//! update the model emits into whole-run series on one time axis ([`columns`]), in memory
//! bounded by the column count whatever the run's length. It adds what the live views
//! cannot know: the time outside iterations (start-up, warm-up, long iterations such as
//! epoch ends and checkpoints, teardown), the critical path over the whole run, and every
//! straggler window with what the straggler was doing.
//!
//! The JSON form (`stallscope.report/1`) is this structure: fields are only ever added.

pub mod builder;
pub mod columns;
pub mod compare;
pub mod join;
#[doc(hidden)]
pub mod sample;
mod stragglers;

pub use builder::ReportBuilder;
pub use compare::{compare, Comparison};

use serde::{Deserialize, Serialize};

use crate::advisor::AdviceReport;
use crate::category::Category;
use crate::experiment::ExperimentReport;
use crate::figures::Categories;
use crate::summary::Summary;

/// The schema name of a [`Report`] in JSON.
pub const REPORT_SCHEMA: &str = "stallscope.report/1";

/// The post-hoc report of one job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Always [`REPORT_SCHEMA`].
    pub schema: String,
    /// The stallscope that wrote the report.
    pub stallscope_version: String,
    /// The job's name.
    pub name: String,
    /// The profiles it was made from.
    pub sources: Vec<SourceProfile>,
    /// What went wrong reading them or what they lack, one sentence each (empty when
    /// nothing did).
    pub problems: Vec<String>,
    /// s, from the run's start to its end (to the last frame when cut short).
    pub run_seconds: f64,
    /// The verdict: the finding, its change, the bound on the gain, how sure we are.
    pub verdict: Verdict,
    /// The summary the live model ended with (as `stallscope summary --json` prints it).
    pub summary: Summary,
    /// Where the counted iterations' time went: job, nodes, ranks, critical path.
    pub breakdown: Breakdown,
    /// Every iteration of the run, downsampled to columns on the run's time axis.
    pub timeline: Timeline,
    /// The run's time that no counted iteration covers.
    pub outside: Outside,
    /// Which rank held the others up, window by window.
    pub stragglers: Stragglers,
    /// Each node's resources over the run, on the timeline's axis.
    pub resources: Vec<NodeResourceSeries>,
    /// The result of `stallscope experiment`, when given: the stalls by difference and the
    /// DS-Analyzer what-if.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experiment: Option<ExperimentReport>,
    /// The advisor's answer for this profile, or why there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advice: Option<AdviceSection>,
}

/// One profile the report read.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SourceProfile {
    /// Its path, as given.
    pub path: String,
    /// `run` (one node's `stallscope run`), `job` (a collector's), `experiment`, or
    /// `unreadable`.
    pub kind: String,
    /// Its host (run profiles).
    pub host: String,
    /// bytes on disk.
    pub bytes: u64,
    /// Frames read from it.
    pub frames: u64,
    /// Whether it ends with the run's end frame (false: the profiler was stopped hard).
    pub complete: bool,
}

/// The verdict, first thing a reader sees.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// One sentence: what limits the job.
    pub sentence: String,
    /// The change to make.
    pub suggestion: String,
    /// The category the finding is about.
    pub category: Option<Category>,
    /// Its share of the counted iterations' wall time, 0–1.
    pub fraction: f64,
    /// The rank it concerns most.
    pub rank: Option<u32>,
    /// s, the job's median iteration time.
    pub median_iteration_seconds: f64,
    /// Upper bound of the speed-up from removing the stall entirely: old time / new time.
    pub max_speedup: f64,
    /// s per iteration the change could save at most.
    pub max_gain_seconds: f64,
    /// Why the bound is a bound (what it assumes, what caps it).
    pub bound_explained: String,
    /// How sure the figures are.
    pub confidence: Confidence,
}

/// How far the figures can be trusted, and why.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Confidence {
    /// `high`, `medium` or `low`.
    pub level: String,
    /// Share of the counted time inside marked phases, 0–1.
    pub coverage_marked: f64,
    /// Share of the counted time covered by sample ticks, 0–1.
    pub coverage_sampled: f64,
    /// ms, the largest clock uncertainty of any node (multi-node jobs).
    pub clock_uncertainty_ms: Option<f64>,
    /// Marker datagrams lost.
    pub markers_dropped: u64,
    /// Marker datagrams rejected as malformed.
    pub markers_rejected: u64,
    /// Records agents dropped while the collector was away.
    pub records_dropped: u64,
    /// Sources that did not deliver, with why.
    pub sources_down: Vec<String>,
    /// Whether every profile ended normally.
    pub complete: bool,
    /// What lowers the level, one sentence each.
    pub reasons: Vec<String>,
}

/// Where the counted iterations' time went.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Breakdown {
    /// All ranks together.
    pub job: Categories,
    /// Per node, its ranks together.
    pub nodes: Vec<NodeBreakdown>,
    /// Per rank.
    pub ranks: Vec<RankRow>,
    /// The critical path: in each counted iteration, the parts of the rank that held it up
    /// (waited least for its peers; see [`crate::critical`]); summed.
    pub critical_path: Categories,
    /// Iterations on the critical path.
    pub critical_path_iterations: u64,
}

/// One node's counted iterations.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeBreakdown {
    /// Node name.
    pub node: String,
    /// Its ranks.
    pub ranks: Vec<u32>,
    /// Its ranks' counted iterations together.
    pub parts: Categories,
}

/// One rank's counted iterations.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankRow {
    /// Global rank.
    pub rank: u32,
    /// Its node.
    pub node: String,
    /// Counted iterations.
    pub iterations: u64,
    /// s, median iteration time.
    pub median_seconds: f64,
    /// s, 95th percentile iteration time.
    pub p95_seconds: f64,
    /// Its parts.
    pub parts: Categories,
    /// Its largest stall (not compute), when it has one.
    pub largest_stall: Option<Category>,
    /// Mean share of its iterations its GPU was busy (NVML), 0–1, when it has one.
    pub gpu_busy: Option<f64>,
}

/// Every iteration of the run on one time axis.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    /// s, the width of a column.
    pub column_seconds: f64,
    /// The columns, from the run's start; a column without iterations is left out.
    pub columns: Vec<TimelineColumn>,
}

/// The iterations (all ranks) that ended in one column.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TimelineColumn {
    /// s from the run's start to the column's start.
    pub start_seconds: f64,
    /// Iterations that ended in it (warm-up included).
    pub iterations: u64,
    /// The mean iteration's parts, s (fractions of the mean iteration).
    pub mean: Categories,
    /// s, median iteration time in the column.
    pub p50_seconds: f64,
    /// s, 95th percentile.
    pub p95_seconds: f64,
    /// The slowest iteration in it.
    pub slowest: Option<SlowIteration>,
}

/// One iteration singled out.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SlowIteration {
    /// Rank.
    pub rank: u32,
    /// Its node.
    pub node: String,
    /// Iteration index.
    pub iter: u64,
    /// s from the run's start to its end.
    pub at_seconds: f64,
    /// s, its wall time.
    pub seconds: f64,
    /// s, its rank's median iteration time.
    pub rank_median_seconds: f64,
    /// Its largest part.
    pub largest: Category,
    /// Its parts.
    pub parts: Categories,
    /// What its node did meanwhile, when readings cover it.
    pub activity: Option<Activity>,
}

/// What a node's resources did over an interval (means of its readings).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Activity {
    /// cores the job's processes kept busy.
    pub cpu_busy_cores: Option<f64>,
    /// MB/s read from disks.
    pub disk_read_mb_per_s: Option<f64>,
    /// MB/s written to disks.
    pub disk_write_mb_per_s: Option<f64>,
    /// MB/s received on the NICs.
    pub nic_rx_mb_per_s: Option<f64>,
    /// MB/s sent on the NICs.
    pub nic_tx_mb_per_s: Option<f64>,
    /// GPU busy, 0–1.
    pub gpu_busy: Option<f64>,
}

/// The run's time outside counted, ordinary iterations.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Outside {
    /// s, the run's wall time.
    pub run_seconds: f64,
    /// Per rank.
    pub ranks: Vec<RankOutside>,
    /// The longest iterations that were not ordinary (at least 3× their rank's median and
    /// 50 ms longer): epoch ends, evaluation, checkpoint saves. At most 20, longest first.
    pub long_iterations: Vec<SlowIteration>,
    /// What the node did before the first step.
    pub startup_activity: Option<Activity>,
    /// What the node did after the last step.
    pub teardown_activity: Option<Activity>,
    /// One paragraph: the run's time, where it went.
    pub sentence: String,
}

/// One rank's run, start to end, in parts that add up to the run's wall time.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankOutside {
    /// Rank.
    pub rank: u32,
    /// Node.
    pub node: String,
    /// s from the run's start to the loop's first event (interpreter start, imports).
    pub before_loop_seconds: f64,
    /// s, the first iteration (model build, rendezvous, first batch, compilation).
    pub first_iteration_seconds: f64,
    /// s, the other warm-up iterations.
    pub warmup_seconds: f64,
    /// s, counted iterations of ordinary length.
    pub steady_seconds: f64,
    /// s, counted iterations that were not ordinary (see [`Outside::long_iterations`]).
    pub long_seconds: f64,
    /// How many those were.
    pub long_iterations: u64,
    /// s from the last step to the run's end (teardown, the last evaluation and save).
    pub teardown_seconds: f64,
}

/// Straggler windows: which rank held the others up.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Stragglers {
    /// Per rank that straggled in some window, most held first.
    pub by_rank: Vec<StragglerRank>,
    /// The windows, most held first (at most 100).
    pub windows: Vec<StragglerRow>,
    /// Windows in all.
    pub total_windows: u64,
}

/// One rank's straggling over the run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StragglerRank {
    /// Rank.
    pub rank: u32,
    /// Node.
    pub node: String,
    /// Windows it was the straggler of.
    pub windows: u64,
    /// s it held the next-to-last rank up, summed.
    pub held_seconds: f64,
}

/// One straggler window and what the straggler did in it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StragglerRow {
    /// First iteration.
    pub first_iter: u64,
    /// Last iteration.
    pub last_iter: u64,
    /// s from the run's start to the window's first iteration's end, when known.
    pub at_seconds: Option<f64>,
    /// The straggler.
    pub rank: u32,
    /// Its node.
    pub node: String,
    /// s it held the next-to-last rank up.
    pub held_seconds: f64,
    /// Share of the others' wall time spent waiting for it, 0–1.
    pub others_wait_fraction: f64,
    /// Its own parts over the window's iterations (at the timeline's resolution).
    pub doing: Option<Categories>,
}

/// One node's resources on the timeline's axis.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeResourceSeries {
    /// Node name.
    pub node: String,
    /// Its ranks.
    pub ranks: Vec<u32>,
    /// ms, its clock minus the collector's.
    pub clock_offset_ms: Option<f64>,
    /// ms, the offset is right within this.
    pub clock_uncertainty_ms: Option<f64>,
    /// Records its agent dropped.
    pub records_dropped: u64,
    /// Marker datagrams lost on it.
    pub markers_dropped: u64,
    /// Sources down on it, with why.
    pub sources_down: Vec<String>,
    /// Its GPUs as NVML named them (index, product name, UUID); empty when none was seen.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<crate::frame::GpuIdentity>,
    /// Readings, one row per column that has one.
    pub columns: Vec<ResourceRow>,
}

/// A node's mean readings in one column.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ResourceRow {
    /// s from the run's start to the column's start.
    pub start_seconds: f64,
    /// cores the job's processes kept busy.
    pub cpu_busy_cores: Option<f64>,
    /// s per s the loops' threads waited in the run queue.
    pub runq_delay: Option<f64>,
    /// GPU busy, 0–1.
    pub gpu_busy: Option<f64>,
    /// MB/s received on the NICs.
    pub nic_rx_mb_per_s: Option<f64>,
    /// MB/s sent on the NICs.
    pub nic_tx_mb_per_s: Option<f64>,
    /// MB/s read from disks.
    pub disk_read_mb_per_s: Option<f64>,
    /// MB/s written to disks.
    pub disk_write_mb_per_s: Option<f64>,
    /// MB/s over PCIe, both ways.
    pub pcie_mb_per_s: Option<f64>,
    /// MB/s over NVLink, both ways.
    pub nvlink_mb_per_s: Option<f64>,
    /// MB/s on the RDMA ports (InfiniBand, RoCE, EFA), both ways; absent from reports
    /// written before them.
    #[serde(default)]
    pub rdma_mb_per_s: Option<f64>,
    /// segments/s its TCP flows (those the flow source read, every class) retransmitted;
    /// absent without the flow source and from reports written before it.
    #[serde(default)]
    pub tcp_retransmits_per_s: Option<f64>,
    /// PSI some, CPU, 0–1.
    pub psi_cpu: Option<f64>,
    /// PSI some, I/O, 0–1.
    pub psi_io: Option<f64>,
    /// PSI some, memory, 0–1.
    pub psi_memory: Option<f64>,
}

/// The advisor's section: its answer, or why it has none.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdviceSection {
    /// The advisor's answer on the catalog.
    Advice(Box<AdviceReport>),
    /// Why there is none.
    Unavailable(String),
}

#[cfg(test)]
mod tests;
