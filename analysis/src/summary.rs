//! Job and rank summaries: the text printed at the end of a run and the stable summary JSON.
//!
//! The JSON (`schema: "stallscope.summary/1"`) is an interface scripts depend on: fields are
//! only ever added. Categories are named fields in report order, never a map, so their order
//! and presence never change. Warm-up iterations are left out of every figure.
//!
//! The figures come from the running totals the [`JobTimeline`] folds every attributed
//! iteration into ([`crate::aggregate`]), so summarising a days-long job needs no per-iteration
//! history; the median iteration time is exact up to a count of iterations and within
//! [`crate::aggregate::MEDIAN_MAX_RELATIVE_ERROR`] beyond it.

use std::fmt::Write;

use serde::{Deserialize, Serialize};

use crate::figures::figures;
pub use crate::figures::{Categories, CoverageShare, Figures, RankSummary, Share};

use crate::category::Category;
use crate::collectives::{collectives, Collective, JobComm};
use crate::crossnode::StragglerWindow;
use crate::finding::{find, Finding, FindingInput};
use crate::gpu_usage::{render_line, GpuUsage, UNMEASURED_PREFIX};
use crate::job::JobTimeline;
use crate::parallelism::Parallelism;
use crate::secs;

/// The schema name written into every summary.
pub const SCHEMA: &str = "stallscope.summary/1";

/// Marker datagram health.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MarkerHealth {
    /// Datagrams known lost (sequence gaps).
    pub dropped: u64,
    /// Datagrams rejected as malformed.
    pub rejected: u64,
}

/// A source that did not deliver.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SourceDown {
    /// Source name.
    pub source: String,
    /// Why.
    pub message: String,
}

/// The summary of a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Always [`SCHEMA`].
    pub schema: String,
    /// The wrapped command.
    pub command: Vec<String>,
    /// Node host name.
    pub host: String,
    /// The command's exit code (128 + signal when killed); `null` if the profile was cut short.
    pub exit_code: Option<i32>,
    /// Whether the profile ended normally.
    pub complete: bool,
    /// Run wall time, s (to the last frame when cut short).
    pub wall_seconds: f64,
    /// Iterations per rank left out at the start.
    pub warmup_iterations: u32,
    /// All ranks together: seconds summed over ranks, fractions of their summed wall time.
    pub job: Figures,
    /// Per rank, by rank.
    pub ranks: Vec<RankSummary>,
    /// The most important finding.
    pub finding: Finding,
    /// Marker health.
    pub markers: MarkerHealth,
    /// Sources that did not deliver.
    pub sources_down: Vec<SourceDown>,
    /// Where the profile is, when known.
    pub profile: Option<String>,
    /// CPU time stallscope itself used during the run, s (all its threads; `null` when
    /// summarising a profile afterwards).
    pub profiler_cpu_seconds: Option<f64>,
    /// Multi-node job: each node that reported, with its ranks and clock. Empty otherwise.
    #[serde(default)]
    pub nodes: Vec<NodeSummary>,
    /// Multi-node job: every window of iterations in which one rank held the others up.
    #[serde(default)]
    pub stragglers: Vec<StragglerWindow>,
    /// Several ranks: the job's critical path (per iteration, the rank that held it up),
    /// shares of its time; the finding reads it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub critical_path: Option<Categories>,
    /// What the figures cannot be trusted for, in words (two nodes reporting one rank).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Every hang declared (no rank finished an iteration for `--hang-after`), in order.
    #[serde(default)]
    pub hangs: Vec<crate::hang::HangReport>,
    /// Transfers that were not the job's and moved bytes over a node's NIC while its
    /// collectives waited on the network, the largest first (from the flow source).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared_links: Vec<crate::flows::SharedLink>,
    /// Every rank that turned slow (a category of its iterations grew and stayed grown), in
    /// the order found; a recovered one has its `until_iteration`.
    #[serde(default)]
    pub slowdowns: Vec<crate::slowdown::Slowdown>,
}

/// One node of a multi-node job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeSummary {
    /// The node's name.
    pub node: String,
    /// Its ranks.
    pub ranks: Vec<u32>,
    /// ms, its clock minus the collector's, as estimated.
    pub clock_offset_ms: Option<f64>,
    /// ms, the estimate is right within this.
    pub clock_uncertainty_ms: Option<f64>,
    /// Records its agent dropped while the collector was away.
    pub records_dropped: u64,
    /// Its TCP flows (sock_diag): the largest one by one, then the rest summed per class.
    /// Empty when no flow source ran.
    #[serde(default)]
    pub flows: Vec<crate::flows::FlowSummary>,
}

impl Summary {
    /// A copy of every field but `ranks`, which is left empty: the binary feed carries the
    /// ranks apart (`crate::view::binary`), and cloning a job's 10,000 of them only to drop
    /// them would cost more than the rest.
    pub fn clone_without_ranks(&self) -> Summary {
        // Every field named, so that a field added to the summary is not forgotten here.
        let Summary {
            schema,
            command,
            host,
            exit_code,
            complete,
            wall_seconds,
            warmup_iterations,
            job,
            ranks: _,
            finding,
            markers,
            sources_down,
            profile,
            profiler_cpu_seconds,
            nodes,
            stragglers,
            critical_path,
            warnings,
            hangs,
            shared_links,
            slowdowns,
        } = self;
        Summary {
            schema: schema.clone(),
            command: command.clone(),
            host: host.clone(),
            exit_code: *exit_code,
            complete: *complete,
            wall_seconds: *wall_seconds,
            warmup_iterations: *warmup_iterations,
            job: job.clone(),
            ranks: Vec::new(),
            finding: finding.clone(),
            markers: *markers,
            sources_down: sources_down.clone(),
            profile: profile.clone(),
            profiler_cpu_seconds: *profiler_cpu_seconds,
            nodes: nodes.clone(),
            stragglers: stragglers.clone(),
            critical_path: *critical_path,
            warnings: warnings.clone(),
            hangs: hangs.clone(),
            shared_links: shared_links.clone(),
            slowdowns: slowdowns.clone(),
        }
    }

    /// Takes hang `h`, declared or resumed: it replaces the one declared at the same time,
    /// else it is a new one.
    pub fn note_hang(&mut self, h: crate::hang::HangReport) {
        match self.hangs.iter_mut().find(|k| k.at_seconds == h.at_seconds) {
            Some(k) => *k = h,
            None => self.hangs.push(h),
        }
    }
}

/// Builds the summary of everything attributed so far.
pub fn summarize(job: &JobTimeline) -> Summary {
    let header = job.header.clone().unwrap_or_default();
    let warmup = header.warmup_iters;
    let parallelism = crate::parallelism::of_markers(&job.node.markers);
    let ranks: Vec<RankSummary> = job
        .summary
        .totals
        .ranks
        .iter()
        .map(|((rank, pid), totals)| RankSummary {
            rank: *rank,
            pid: *pid,
            node: job.nodes.rank_nodes.get(rank).cloned(),
            figures: figures(totals),
            gpu: job.summary.gpu_usage.get(*rank).map(GpuUsage::figures),
            collectives: rank_collectives(job, (*rank, *pid), totals.iterations, &parallelism),
        })
        .collect();
    let job_figures = figures(&job.summary.totals.job);
    let workers = job.node.markers.loader_workers();
    let critical = critical_path(job, &job_figures);
    let mut finding = find(&FindingInput {
        job: critical.as_ref().unwrap_or(&job_figures),
        ranks: &ranks,
        loader_workers: workers,
        cpus: header.cpus,
        parallelism: &parallelism,
    });
    let shared_links = job.flows.shared_links(&header.host);
    if finding.category == Some(crate::category::Category::Network) {
        if let Some(s) = shared_links.first() {
            finding.sentence.push(' ');
            finding
                .sentence
                .push_str(&crate::flows::shared_link_sentence(s));
        }
    }
    let last_t = job
        .end
        .as_ref()
        .map(|e| e.ended_mono_ns)
        .or(job.summary.totals.last_end_ns)
        .or(job.node.series.watermark())
        .unwrap_or(header.started_mono_ns);
    Summary {
        schema: SCHEMA.to_string(),
        command: header.command.clone(),
        host: header.host.clone(),
        exit_code: job.end.as_ref().map(|e| e.exit_code),
        complete: job.end.is_some(),
        wall_seconds: secs(last_t.saturating_sub(header.started_mono_ns)),
        warmup_iterations: warmup,
        job: job_figures,
        ranks,
        finding,
        markers: marker_health(job),
        sources_down: sources_down(job),
        profile: None,
        profiler_cpu_seconds: None,
        nodes: node_summaries(job),
        stragglers: job.nodes.stragglers(),
        critical_path: critical.map(|c| c.categories),
        warnings: job
            .nodes
            .rank_clashes()
            .into_iter()
            .chain(gpus_unmeasured(job))
            .collect(),
        hangs: job.hangs.clone(),
        shared_links,
        slowdowns: slowdowns(job),
    }
}

/// The slowdowns found, each with its rank's node (the host in a single-node run).
pub fn slowdowns(job: &JobTimeline) -> Vec<crate::slowdown::Slowdown> {
    let host = job
        .header
        .as_ref()
        .map(|h| h.host.clone())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "local".to_string());
    let mut found = job.summary.slowdowns.found().to_vec();
    for s in &mut found {
        s.node = job
            .nodes
            .rank_nodes
            .get(&s.rank)
            .cloned()
            .unwrap_or_else(|| host.clone());
    }
    found
}

/// Loop `pid`'s (rank `rank`'s) communication operations over its `iterations` counted ones.
fn rank_collectives(
    job: &JobTimeline,
    (rank, pid): (u32, u32),
    iterations: u64,
    parallelism: &Parallelism,
) -> Vec<Collective> {
    let Some(totals) = job.summary.comm.get(&(rank, pid)) else {
        return Vec::new();
    };
    let meta = job.node.markers.procs.get(&pid).map(|m| m.info());
    let tp = job.node.markers.tensor_parallel_groups();
    let context = JobComm {
        ddp: parallelism.ddp,
        ddp_bytes_per_iteration: meta.and_then(|m| m.comm_bytes),
        tensor_parallel_groups: &tp,
    };
    collectives(totals, iterations, context)
}

/// A sentence for each rank that ran on a GPU (its iterations were timed with CUDA events) on
/// a node where NVML gave no reading at all: a GPU missing from the start is not a source that
/// went down, so nothing else would say that its figures are absent.
fn gpus_unmeasured(job: &JobTimeline) -> Vec<String> {
    let mut unmeasured: Vec<_> = job
        .summary
        .gpu_usage
        .iter()
        .filter(|(_, g)| g.iterations > 0 && g.read == 0)
        .collect();
    unmeasured.sort_unstable_by_key(|(rank, _)| *rank);
    unmeasured
        .into_iter()
        .map(|(rank, g)| {
            let device = g.gpu.strip_prefix(UNMEASURED_PREFIX).unwrap_or(&g.gpu);
            let node = job
                .nodes
                .rank_nodes
                .get(&rank)
                .map_or_else(String::new, |n| format!(" on {n}"));
            format!(
                "rank {rank} ran on a GPU (CUDA device {device}) but NVML gave no reading of it{node}: its busy share, power, PCIe and NVLink bytes are not measured and host-to-device copies count as compute; run `stallscope doctor` there (is the NVIDIA driver's libnvidia-ml installed and visible?)"
            )
        })
        .collect()
}

/// The figures of the job's critical path (per iteration, the rank that held it up; see
/// [`crate::critical`]), which the finding reads; `None` before any counted iteration or on
/// one rank, where it is the job.
fn critical_path(job: &JobTimeline, job_figures: &Figures) -> Option<Figures> {
    let (split, iterations) = job.summary.totals.critical.totals();
    if iterations == 0 || split.total() == 0 || job.summary.totals.ranks.len() < 2 {
        return None;
    }
    Some(Figures {
        iterations,
        median_iteration_seconds: job_figures.median_iteration_seconds,
        wall_seconds: secs(split.total()),
        categories: Categories::from_split(&split),
        coverage: job_figures.coverage,
    })
}

/// Marker datagrams lost and malformed, this node's and every other node's.
fn marker_health(job: &JobTimeline) -> MarkerHealth {
    let health = job.nodes.health.values();
    MarkerHealth {
        dropped: job.markers_dropped() + health.clone().map(|h| h.markers_dropped).sum::<u64>(),
        rejected: job.markers_rejected + health.map(|h| h.markers_rejected).sum::<u64>(),
    }
}

/// The sources that are down, this node's and every other node's (named with the node).
fn sources_down(job: &JobTimeline) -> Vec<SourceDown> {
    job.node
        .sources
        .values()
        .filter(|s| !s.up)
        .map(|s| SourceDown {
            source: s.source.clone(),
            message: s.message.clone(),
        })
        .chain(job.nodes.health.values().flat_map(|h| {
            h.sources_down.iter().map(|s| SourceDown {
                source: format!("{} on {}", s.source, h.node),
                message: s.message.clone(),
            })
        }))
        .collect()
}

fn node_summaries(job: &JobTimeline) -> Vec<NodeSummary> {
    let host = job.header.as_ref().map_or("", |h| h.host.as_str());
    // A run's own flows are filed under the empty name: its node is the header's host.
    fn flow_node<'a>(job: &JobTimeline, host: &str, n: &'a str) -> &'a str {
        if n == host && !host.is_empty() && !job.flows.nodes().any(|f| f == n) {
            ""
        } else {
            n
        }
    }
    let mut names: Vec<&str> = job.nodes.rank_nodes.values().map(String::as_str).collect();
    names.extend(job.nodes.clocks.keys().map(String::as_str));
    names.extend(
        job.flows
            .nodes()
            .map(|n| if n.is_empty() { host } else { n }),
    );
    names.sort_unstable();
    names.dedup();
    // Each node's ranks, in one pass over the ranks (a pass per node was 90 ms of a refresh
    // of the live model at 10,000 ranks on 1,250 nodes); in rank order, as the map gives them.
    let mut ranks_of: std::collections::HashMap<&str, Vec<u32>> = Default::default();
    for (rank, node) in &job.nodes.rank_nodes {
        ranks_of.entry(node.as_str()).or_default().push(*rank);
    }
    names
        .into_iter()
        .map(|node| {
            let clock = job.nodes.clocks.get(node);
            NodeSummary {
                flows: job.flows.summary(flow_node(job, host, node)),
                node: node.to_string(),
                ranks: if flow_node(job, host, node).is_empty() && job.nodes.rank_nodes.is_empty() {
                    // A run's own node: its own ranks.
                    let mut own: Vec<u32> =
                        job.summary.totals.ranks.keys().map(|(r, _)| *r).collect();
                    own.dedup();
                    own
                } else {
                    ranks_of.remove(node).unwrap_or_default()
                },
                clock_offset_ms: clock.map(|c| c.offset_ns as f64 / 1e6),
                clock_uncertainty_ms: clock.map(|c| c.uncertainty_ns as f64 / 1e6),
                records_dropped: job.nodes.health.get(node).map_or(0, |h| h.records_dropped),
            }
        })
        .collect()
}

/// The rank named straggler in most windows, with how many of the windows named it.
pub fn main_straggler(s: &Summary) -> Option<(&StragglerWindow, usize)> {
    let mut counts: std::collections::BTreeMap<u32, usize> = Default::default();
    for w in &s.stragglers {
        *counts.entry(w.rank).or_default() += 1;
    }
    let (rank, n) = counts.into_iter().max_by_key(|(_, n)| *n)?;
    s.stragglers.iter().find(|w| w.rank == rank).map(|w| (w, n))
}

/// Ranks shown as columns of the text table; more are summarised by the job column.
const MAX_RANK_COLUMNS: usize = 8;

/// The human rendering printed at the end of `stallscope run` and by `stallscope summary`.
pub fn render_text(s: &Summary) -> String {
    let mut out = String::new();
    let nranks = s.ranks.len();
    let _ = writeln!(
        out,
        "stallscope: {} iteration{} on {} rank{} (first {} per rank left out as warm-up), median {:.3} s",
        s.job.iterations,
        if s.job.iterations == 1 { "" } else { "s" },
        nranks,
        if nranks == 1 { "" } else { "s" },
        s.warmup_iterations,
        s.job.median_iteration_seconds,
    );
    if nranks > 0 {
        write_table(&mut out, s);
    }
    for r in &s.ranks {
        if let Some(g) = &r.gpu {
            let _ = writeln!(out, "{}", render_line(r.rank, r.node.as_deref(), g));
        }
    }
    for r in s.ranks.iter().take(MAX_RANK_COLUMNS) {
        if let Some(line) = crate::collectives::render_line(r.rank, &r.collectives) {
            let _ = writeln!(out, "{line}");
        }
    }
    write_nodes(&mut out, s);
    write_verdict(&mut out, s);
    out
}

/// The table of categories by rank and for the job, and the coverage.
fn write_table(out: &mut String, s: &Summary) {
    let nranks = s.ranks.len();
    let shown: Vec<&RankSummary> = s.ranks.iter().take(MAX_RANK_COLUMNS).collect();
    let share = |sh: Share| format!("{:.2} s {:>5.1}%", sh.seconds, sh.fraction * 100.0);
    let _ = write!(out, "{:<14}", "");
    for r in &shown {
        let _ = write!(out, "{:>17}", format!("rank {}", r.rank));
    }
    let _ = writeln!(out, "{:>17}", "job");
    for c in Category::ALL {
        let _ = write!(out, "{:<14}", c.name());
        for r in &shown {
            let _ = write!(out, "{:>17}", share(r.figures.categories.get(c)));
        }
        let _ = writeln!(out, "{:>17}", share(s.job.categories.get(c)));
    }
    let _ = write!(out, "{:<14}", "iterations");
    for r in &shown {
        let f = &r.figures;
        let per = format!("{} × {:.3} s", f.iterations, f.median_iteration_seconds);
        let _ = write!(out, "{per:>17}");
    }
    let _ = writeln!(out, "{:>17}", format!("{:.2} s", s.job.wall_seconds));
    if nranks > MAX_RANK_COLUMNS {
        let more = nranks - MAX_RANK_COLUMNS;
        let _ = writeln!(out, "({more} more ranks: see --json)");
    }
    let _ = writeln!(
        out,
        "coverage: {:.0}% of the time inside marked phases, {:.0}% sampled",
        s.job.coverage.marked * 100.0,
        s.job.coverage.sampled * 100.0
    );
}

/// One line per node of a multi-node job, then the straggler.
fn write_nodes(out: &mut String, s: &Summary) {
    for n in &s.nodes {
        let ranks: Vec<String> = n.ranks.iter().map(u32::to_string).collect();
        let _ = write!(out, "node {}: rank {}", n.node, ranks.join(", "));
        if let (Some(o), Some(u)) = (n.clock_offset_ms, n.clock_uncertainty_ms) {
            let _ = write!(out, "; clock {o:+.3} ms ± {u:.3} ms");
        }
        if n.records_dropped > 0 {
            let _ = write!(
                out,
                "; {} records dropped while the collector was away",
                n.records_dropped
            );
        }
        let _ = writeln!(out);
    }
    if let Some((w, n)) = main_straggler(s) {
        let windows = s
            .job
            .iterations
            .div_ceil(crate::crossnode::WINDOW_ITERS * s.ranks.len().max(1) as u64);
        let _ = writeln!(
            out,
            "straggler: rank {} on node {} held the others up in {} of {} windows of {} iterations (in iterations {}–{} the others waited {:.0}% of their time)",
            w.rank,
            w.node,
            n,
            windows.max(n as u64),
            crate::crossnode::WINDOW_ITERS,
            w.first_iter,
            w.last_iter,
            w.others_wait_fraction * 100.0
        );
    } else if !s.nodes.is_empty() {
        let _ = writeln!(out, "straggler: none (no rank kept the others waiting)");
    }
}

/// The finding and the change, then how sure the figures are and where they came from.
fn write_verdict(out: &mut String, s: &Summary) {
    let _ = writeln!(out, "finding: {}", s.finding.sentence);
    if !s.finding.suggestion.is_empty() {
        let _ = writeln!(out, "change:  {}", s.finding.suggestion);
    }
    if s.markers.dropped > 0 || s.markers.rejected > 0 {
        let _ = writeln!(
            out,
            "markers: {} lost, {} malformed",
            s.markers.dropped, s.markers.rejected
        );
    }
    for d in &s.sources_down {
        let _ = writeln!(out, "source {} was down: {}", d.source, d.message);
    }
    for w in &s.warnings {
        let _ = writeln!(out, "warning: {w}");
    }
    if !s.complete {
        let _ = writeln!(
            out,
            "note: the profile was cut short; figures cover what it holds"
        );
    }
    if let Some(cpu) = s.profiler_cpu_seconds {
        let _ = writeln!(
            out,
            "overhead: stallscope used {:.2} s of CPU ({:.2}% of one core)",
            cpu,
            cpu * 100.0 / s.wall_seconds.max(1e-9)
        );
    }
    if let Some(p) = &s.profile {
        let _ = writeln!(out, "profile: {p}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribution::{Coverage, IterationBreakdown};
    use crate::frame::{Frame, NodeClock, NodeIteration, RunEnd, RunHeader, SourceStatus};
    use crate::marker::{Marker, MarkerEvent};

    const MS: u64 = 1_000_000;

    fn breakdown(rank: u32, iter: u64, parts: &[(Category, u64)]) -> IterationBreakdown {
        let mut split = crate::category::Split::default();
        for (c, ms) in parts {
            split.add(*c, ms * MS);
        }
        let wall = split.total();
        IterationBreakdown {
            rank,
            pid: 100 + rank,
            iter,
            start_ns: iter * wall,
            end_ns: (iter + 1) * wall,
            split,
            evidence: vec![],
            coverage: Coverage {
                marked_ns: wall / 2,
                sampled_ns: wall,
            },
        }
    }

    /// A job of two nodes: rank 1 on node-b waits for data, rank 0 on node-a waits for it.
    fn two_node_job() -> JobTimeline {
        let mut job = JobTimeline::default();
        job.ingest(&Frame::Header(RunHeader {
            host: "head".into(),
            command: vec!["stallscope".into(), "collector".into()],
            warmup_iters: 1,
            cpus: 8,
            ..RunHeader::default()
        }));
        for (node, offset_ms) in [("node-a", 3), ("node-b", -2)] {
            job.ingest(&Frame::NodeClock(NodeClock {
                node: node.into(),
                offset_ns: offset_ms * MS as i64,
                drift_ppm: 0.0,
                at_ns: 0,
                uncertainty_ns: MS / 4,
                samples: 8,
            }));
        }
        for iter in 0..21 {
            for (node, rank, parts) in [
                (
                    "node-a",
                    0,
                    vec![(Category::Compute, 60), (Category::PeerWait, 40)],
                ),
                (
                    "node-b",
                    1,
                    vec![(Category::Compute, 60), (Category::DataPrep, 40)],
                ),
            ] {
                job.ingest(&Frame::NodeIteration(NodeIteration {
                    node: node.into(),
                    breakdown: breakdown(rank, iter, &parts),
                    comm: vec![],
                    world_size: Some(2),
                }));
            }
        }
        job.ingest(&Frame::Source(SourceStatus {
            source: "psi".into(),
            up: false,
            message: "cannot read /proc/pressure/cpu".into(),
        }));
        job.attribute_ready(u64::MAX, true);
        job.ingest(&Frame::End(RunEnd {
            ended_mono_ns: 2_100 * MS,
            exit_code: 0,
            markers_dropped: 0,
            markers_rejected: 0,
        }));
        job
    }

    #[test]
    fn the_text_of_a_two_node_job() {
        let s = summarize(&two_node_job());
        insta::assert_snapshot!(render_text(&s));
    }

    #[test]
    fn the_text_of_a_run_without_iterations() {
        let mut job = JobTimeline::default();
        job.ingest(&Frame::Header(RunHeader {
            host: "vm".into(),
            command: vec!["python3".into(), "train.py".into()],
            warmup_iters: 1,
            cpus: 2,
            ..RunHeader::default()
        }));
        job.ingest(&Frame::Markers(vec![Marker {
            seq: 0,
            t_ns: 0,
            pid: 7,
            rank: Some(0),
            iter: 0,
            event: MarkerEvent::Meta(vec![("workers".into(), "0".into())]),
        }]));
        job.attribute_ready(u64::MAX, true);
        insta::assert_snapshot!(render_text(&summarize(&job)));
    }

    /// Issue 17, item 5: four ranks, rank 3's data preparation slower. Averaged over ranks
    /// the three waiters' peer wait (30%) outweighs rank 3's prep (10%); on the critical path
    /// it is rank 3's prep that holds every iteration up.
    #[test]
    fn the_finding_reads_the_critical_path_not_the_average_over_ranks() {
        let mut job = JobTimeline::default();
        job.ingest(&Frame::Header(RunHeader {
            host: "vm".into(),
            command: vec!["python3".into(), "train.py".into()],
            warmup_iters: 1,
            cpus: 16,
            ..RunHeader::default()
        }));
        let waiter = [(Category::Compute, 60), (Category::PeerWait, 40)];
        let slow = [(Category::Compute, 60), (Category::DataPrep, 40)];
        let mut all = Vec::new();
        for iter in 0..30 {
            for rank in 0..4 {
                all.push(breakdown(
                    rank,
                    iter,
                    if rank == 3 { &slow } else { &waiter },
                ));
            }
        }
        job.summary.record(&all, 1);
        let s = summarize(&job);
        assert!(
            s.job.categories.peer_wait.fraction > s.job.categories.data_prep.fraction,
            "the average over ranks is peer wait"
        );
        assert_eq!(
            s.finding.category,
            Some(Category::DataPrep),
            "{:?}",
            s.finding
        );
        assert!(
            (s.finding.fraction - 0.40).abs() < 1e-9,
            "{}",
            s.finding.fraction
        );
        assert_eq!(s.finding.rank, Some(3));
        assert!((s.finding.max_speedup - 1.0 / 0.6).abs() < 1e-6);
        assert!(
            s.finding.sentence.contains("most on rank 3"),
            "{}",
            s.finding.sentence
        );
        let cp = s.critical_path.expect("several ranks: a critical path");
        assert!((cp.data_prep.fraction - 0.40).abs() < 1e-9);
    }
}
