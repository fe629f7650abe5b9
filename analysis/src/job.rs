//! The job timeline: every frame of a run goes in, iteration breakdowns come out.
//!
//! The live run and the replay of a profile both feed frames to a [`JobTimeline`] and ask it
//! for the iterations that are ready, so a profile cut short reads the same as it was shown
//! live. An iteration is ready when samples have arrived past its end and every other live
//! rank has finished the same iteration (so that waiting for the slowest rank can be told
//! apart from moving bytes); at the end of a run everything left is attributed.
//!
//! A training job runs for days, so the timeline keeps nothing per iteration for good: the
//! summary's figures are folded into running aggregates ([`RunningSummary`]) as iterations
//! are attributed, and only the most recent [`RECENT_BREAKDOWNS`] breakdowns are kept.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use crate::aggregate::RunningSummary;

use crate::attribution::{
    attribute, CudaIteration, GpuSeries, IterationBreakdown, IterationInput, Links, RankSeries,
    ThreadSeries,
};
use crate::category::Category;
use crate::crossnode::CrossNode;
use crate::frame::{Frame, ProcessInfo, RunEnd, RunHeader, SourceStatus};
use crate::gpu_usage::{GpuUsage, NvmlReading};
use crate::loops::MarkerLog;
use crate::process::ancestors;
use crate::series::{names, LABEL_GPU, LABEL_UUID, LINK_LOOPBACK, LINK_NIC};
use crate::timeline::SeriesStore;
use crate::Nanos;

/// How long a rank's finished iteration waits for slower ranks before it is attributed
/// without them, ns.
const PEER_PATIENCE_NS: Nanos = 10_000_000_000;

/// How long an iteration of a CUDA-timed loop waits for its GPU times (and its peers') past
/// its end before it is attributed without them, ns: the hook reads CUDA events back only
/// once the GPU has passed them, a few iterations late.
const GPU_PATIENCE_NS: Nanos = 10_000_000_000;

/// How long an iteration waits for samples past its end before it is attributed with what
/// there is (a sampler that died must not stall the summary), ns.
const SAMPLE_PATIENCE_NS: Nanos = 2_000_000_000;

/// Breakdowns [`JobTimeline::breakdowns`] keeps, the most recent (a few hundred bytes each:
/// tens of MiB at most). Experiment runs and tests are far shorter, so they keep all of theirs.
pub const RECENT_BREAKDOWNS: usize = 100_000;

/// Everything known about a run.
#[derive(Debug, Default)]
pub struct JobTimeline {
    /// The run's header, once seen.
    pub header: Option<RunHeader>,
    /// Series and samples.
    pub series: SeriesStore,
    /// Markers per process.
    pub markers: MarkerLog,
    /// Processes of the job, by pid (latest record).
    pub processes: BTreeMap<u32, ProcessInfo>,
    /// Pids seen gone.
    pub exited: BTreeSet<u32>,
    /// Latest state per source.
    pub sources: BTreeMap<String, SourceStatus>,
    /// How the run ended, if it did.
    pub end: Option<RunEnd>,
    /// The most recent iterations attributed, in the order attributed: at most
    /// [`RECENT_BREAKDOWNS`]. The summary reads [`JobTimeline::totals`], not these.
    pub breakdowns: VecDeque<IterationBreakdown>,
    /// What the summary needs of every iteration attributed so far.
    pub totals: RunningSummary,
    /// Next iteration to attribute, per loop pid.
    next_iter: BTreeMap<u32, u64>,
    /// Marker datagrams rejected as malformed, as counted by the live side.
    pub markers_rejected: u64,
    /// Ranks of other nodes, as their agents attributed them (a collector's job profile).
    pub nodes: CrossNode,
    /// What each rank's GPU did over its counted (post-warm-up) iterations, by rank: the
    /// node's own ranks, and other nodes' as their agents read them.
    pub gpu_usage: BTreeMap<u32, GpuUsage>,
    /// What the GPU did in each iteration of the last attribution round, by (rank,
    /// iteration): what an agent ships with the iteration. Cleared every round.
    round_gpu: HashMap<(u32, u64), NvmlReading>,
}

impl JobTimeline {
    /// Takes one frame. Breakdown frames are not taken: breakdowns are always re-derived.
    pub fn ingest(&mut self, frame: &Frame) {
        match frame {
            Frame::Header(h) => {
                self.nodes.set_first_iter(u64::from(h.warmup_iters));
                self.header = Some(h.clone());
            }
            Frame::Series(d) => self.series.declare(d.clone()),
            Frame::Samples(b) => self.series.ingest(b),
            Frame::Markers(ms) => ms.iter().for_each(|m| self.markers.ingest(m)),
            Frame::Process(p) => {
                self.exited.remove(&p.pid);
                self.processes.insert(p.pid, p.clone());
            }
            Frame::ProcessExit { pid, .. } => {
                self.exited.insert(*pid);
            }
            Frame::Breakdown(_) | Frame::Experiment(_) | Frame::NodeResources(_) => {}
            Frame::Source(s) => {
                self.sources.insert(s.source.clone(), s.clone());
            }
            Frame::End(e) => {
                self.markers_rejected = e.markers_rejected;
                self.end = Some(e.clone());
            }
            Frame::NodeClock(c) => self.nodes.clock(c),
            Frame::NodeIteration(it) => {
                self.nodes.report(it);
            }
            Frame::NodeReport(r) => {
                let it = &r.iteration;
                let fresh = self.nodes.report(it);
                if let Some(gpu) = r.gpu.as_ref().filter(|_| fresh) {
                    let b = &it.breakdown;
                    if b.iter >= self.warmup() {
                        self.gpu_usage
                            .entry(b.rank)
                            .or_default()
                            .add(gpu, b.end_ns.saturating_sub(b.start_ns));
                    }
                }
            }
            Frame::NodeHealth(h) => self.nodes.health(h),
        }
    }

    /// The data-loader processes of loop `pid`: descendants that said `role=loader`, or, when
    /// none did, every descendant.
    fn loader_pids(&self, pid: u32) -> Vec<u32> {
        let descends =
            |p: u32| ancestors(p, |q| self.processes.get(&q).map(|i| i.ppid)).any(|up| up == pid);
        let mut marked: Vec<u32> = self
            .markers
            .procs
            .values()
            .filter(|m| m.info().is_loader() && m.info().parent == Some(pid))
            .map(|m| m.pid)
            .collect();
        if marked.is_empty() {
            let says_no_workers = self
                .markers
                .procs
                .get(&pid)
                .is_some_and(|m| m.info().workers == Some(0));
            if !says_no_workers {
                marked = self
                    .processes
                    .keys()
                    .copied()
                    .filter(|p| descends(*p))
                    .collect();
            }
        }
        marked
    }

    fn thread_series(&self, pid: u32) -> ThreadSeries {
        let p = pid.to_string();
        let label = [("pid", p.as_str())];
        ThreadSeries {
            cpu: self.series.find(names::PROC_CPU_NS, &label),
            runq: self.series.find(names::PROC_RUNQ_NS, &label),
            blocked: self.series.find(names::PROC_BLOCKED_IO, &label),
        }
    }

    fn links(&self) -> Links {
        let mut links = Links::default();
        for name in [names::NET_RX_BYTES, names::NET_TX_BYTES] {
            for d in self.series.named(name) {
                match d.label("link") {
                    Some(LINK_NIC) => links.nic.push(d.id),
                    Some(LINK_LOOPBACK) => links.local.push(d.id),
                    _ => {}
                }
            }
        }
        let peaks = self.series.link_peaks();
        links.nic_bytes_per_s = peaks.nic;
        links.local_bytes_per_s = peaks.loopback;
        links.nvlink_bytes_per_s = peaks.nvlink;
        links.pcie_bytes_per_s = peaks.pcie;
        links.comm_fallback = if peaks.nic_bytes_total > 0 {
            Category::Network
        } else {
            Category::Interconnect
        };
        links
    }

    /// The NVML index (label `gpu`) of the GPU that loop `pid` drives, from the first of: the
    /// `gpu_uuid` it sent; NVML's per-process utilisation naming its pid; the `cuda_device` it
    /// sent, through the `cuda_visible` list (`CUDA_VISIBLE_DEVICES`) when it sent one; its
    /// `local_rank`; the only GPU of the node.
    pub fn gpu_of(&self, pid: u32) -> Option<String> {
        let mut gpus: Vec<(&str, Option<&str>)> = self
            .series
            .named(names::GPU_PCIE_RX_BYTES)
            .chain(self.series.named(names::GPU_UTIL_PCT))
            .chain(self.series.named(names::GPU_POWER_MW))
            .filter_map(|d| Some((d.label(LABEL_GPU)?, d.label(LABEL_UUID))))
            .collect();
        gpus.sort_unstable();
        gpus.dedup_by(|a, b| a.0 == b.0);
        if gpus.is_empty() {
            return None;
        }
        let exists = |index: &str| gpus.iter().any(|g| g.0 == index).then(|| index.to_string());
        let by_uuid = |uuid: &str| {
            gpus.iter()
                .find(|g| g.1.is_some_and(|u| u.starts_with(uuid)))
                .map(|g| g.0.to_string())
        };
        let meta = self.markers.procs.get(&pid).map(|m| &m.meta);
        let get = |key: &str| meta.and_then(|m| m.get(key)).map(String::as_str);
        if let Some(found) = get("gpu_uuid").and_then(by_uuid) {
            return Some(found);
        }
        let pid_label = pid.to_string();
        if let Some(d) = self
            .series
            .named(names::GPU_PROC_SM_PCT)
            .find(|d| d.label("pid") == Some(&pid_label))
        {
            return d.label(LABEL_GPU).map(str::to_string);
        }
        if let Some(device) = get("cuda_device").and_then(|d| d.parse::<usize>().ok()) {
            let visible = get("cuda_visible").map(|v| v.split(':').nth(device));
            match visible {
                Some(Some(entry)) if entry.starts_with("GPU-") => return by_uuid(entry),
                Some(Some(entry)) => return exists(entry.trim()),
                Some(None) => {}
                None => return exists(&device.to_string()),
            }
        }
        if let Some(found) = get("local_rank").and_then(exists) {
            return Some(found);
        }
        (gpus.len() == 1).then(|| gpus[0].0.to_string())
    }

    /// The series of GPU `gpu` (NVML index) that speak for loop `pid`.
    fn gpu_series(&self, pid: u32, gpu: &str) -> GpuSeries {
        let on_gpu = |name: &'static str| self.series.on_gpu(name, gpu).map(|d| d.id);
        let pid_label = pid.to_string();
        let own_sm = self
            .series
            .named(names::GPU_PROC_SM_PCT)
            .find(|d| d.label(LABEL_GPU) == Some(gpu) && d.label("pid") == Some(&pid_label))
            .map(|d| d.id);
        GpuSeries {
            busy_pct: on_gpu(names::GPU_UTIL_PCT).or(own_sm),
            pcie_rx: on_gpu(names::GPU_PCIE_RX_BYTES),
            pcie_tx: on_gpu(names::GPU_PCIE_TX_BYTES),
            nvlink: [names::GPU_NVLINK_RX_BYTES, names::GPU_NVLINK_TX_BYTES]
                .into_iter()
                .filter_map(on_gpu)
                .collect(),
        }
    }

    fn ready(&self, pid: u32, iter: u64, end: Nanos, now: Nanos, finishing: bool) -> bool {
        if finishing {
            return true;
        }
        let samples_caught_up = self.series.watermark().is_some_and(|w| w >= end)
            || now.saturating_sub(end) > SAMPLE_PATIENCE_NS;
        let peers_done = self.markers.loops().filter(|q| q.pid != pid).all(|q| {
            self.exited.contains(&q.pid)
                || q.steps.keys().next_back().is_some_and(|last| *last >= iter)
                || now.saturating_sub(end) > PEER_PATIENCE_NS
        });
        // Every loop's GPU times of this iteration, for its own split and its peers' wait.
        let gpu_times_in = self.markers.loops().all(|q| {
            q.gpu_settled(iter)
                || self.exited.contains(&q.pid)
                || now.saturating_sub(end) > GPU_PATIENCE_NS
        });
        samples_caught_up && peers_done && gpu_times_in
    }

    /// What the GPU of loop `pid` saw of iteration `iter`, with the least exposed all-reduce
    /// of all ranks once every CUDA-timed loop has reported it; `None` for an untimed
    /// iteration.
    fn gpu_iteration(&self, pid: u32, iter: u64) -> Option<CudaIteration> {
        let own = self.markers.procs.get(&pid)?.gpu.get(&iter)?;
        let mut fastest = Some(u64::MAX);
        for q in self.markers.loops().filter(|q| q.gpu_timed()) {
            match q.gpu.get(&iter).and_then(|t| t.comm_ns) {
                Some(c) => fastest = fastest.map(|f| f.min(c)),
                None => fastest = None,
            }
        }
        Some(CudaIteration {
            iter_ns: own.iter_ns,
            data_idle_ns: own.data_idle_ns,
            comm_ns: own.comm_ns,
            fastest_comm_ns: fastest.filter(|f| *f != u64::MAX),
        })
    }

    /// For each comm span beginning in iteration `iter` of `pid`: the latest begin of the same
    /// (by order) comm span among all loops that have that iteration. `None` for a collective
    /// no other rank was seen in.
    fn peer_arrivals(&self, pid: u32, iter: u64, begins: &[Nanos]) -> Vec<Option<Nanos>> {
        let others: Vec<Vec<Nanos>> = self
            .markers
            .loops()
            .filter(|q| q.pid != pid)
            .filter_map(|q| q.iteration(iter).map(|(a, b)| q.comm_begins(a, b)))
            .collect();
        begins
            .iter()
            .enumerate()
            .map(|(k, own)| {
                let latest = others.iter().filter_map(|o| o.get(k)).max().copied();
                latest.map(|l| l.max(*own))
            })
            .collect()
    }

    /// Iterations at the start of each rank left out of the summary (the header's).
    fn warmup(&self) -> u64 {
        self.header
            .as_ref()
            .map_or(0, |h| u64::from(h.warmup_iters))
    }

    /// What rank `rank`'s GPU did in iteration `iter`, when the last attribution round
    /// attributed it and the rank runs on a GPU NVML reads.
    pub fn gpu_reading(&self, rank: u32, iter: u64) -> Option<&NvmlReading> {
        self.round_gpu.get(&(rank, iter))
    }

    /// Attributes every iteration that is ready at `now` (ns, the node clock), and joins the
    /// other nodes' iterations that are ready. With `finishing`, attributes everything whose
    /// bounds are known. Returns the new ones.
    pub fn attribute_ready(&mut self, now: Nanos, finishing: bool) -> Vec<IterationBreakdown> {
        let ranks = self.markers.ranks();
        let links = self.links();
        let warmup = self.warmup();
        self.round_gpu.clear();
        let mut out = Vec::new();
        for (pid, rank) in &ranks {
            let Some(marks) = self.markers.procs.get(pid) else {
                continue;
            };
            let mut iter = self.next_iter.get(pid).copied().unwrap_or(0);
            let last = marks.steps.keys().next_back().copied();
            while last.is_some_and(|l| iter <= l) {
                let Some((start, end)) = marks.iteration(iter) else {
                    iter += 1; // a lost step: this iteration's bounds are unknown
                    continue;
                };
                if !self.ready(*pid, iter, end, now, finishing) {
                    break;
                }
                let spans = marks.spans_within(start, end);
                let begins = marks.comm_begins(start, end);
                let input = IterationInput {
                    rank: *rank,
                    pid: *pid,
                    iter,
                    start,
                    end,
                    spans,
                    peer_arrivals: self.peer_arrivals(*pid, iter, &begins),
                    gpu: self.gpu_iteration(*pid, iter),
                };
                let gpu_index = self.gpu_of(*pid);
                let rank_series = RankSeries {
                    main: self.thread_series(*pid),
                    loaders: self
                        .loader_pids(*pid)
                        .into_iter()
                        .map(|p| self.thread_series(p))
                        .collect(),
                    gpu: gpu_index.as_deref().map(|g| self.gpu_series(*pid, g)),
                };
                out.push(attribute(&input, &self.series, &rank_series, &links));
                if let Some(gpu) = gpu_index {
                    let batch = marks.info().batch_bytes;
                    let reading = NvmlReading::read(
                        &self.series,
                        &gpu,
                        (start, end),
                        input.gpu.is_some(),
                        batch,
                    );
                    if iter >= warmup {
                        let usage = self.gpu_usage.entry(*rank).or_default();
                        usage.add(&reading, end - start);
                    }
                    self.round_gpu.insert((*rank, iter), reading);
                }
                iter += 1;
            }
            self.next_iter.insert(*pid, iter);
        }
        out.extend(self.nodes.join_ready(now, finishing));
        out.sort_by_key(|b| (b.end_ns, b.rank));
        self.record(&out, warmup);
        out
    }

    /// Folds newly attributed breakdowns into the totals (iterations below `warmup` are not
    /// counted) and the window of recent ones.
    fn record(&mut self, new: &[IterationBreakdown], warmup: u64) {
        for b in new {
            self.totals.add(b, warmup);
        }
        let keep = new.len().min(RECENT_BREAKDOWNS);
        let overflow = (self.breakdowns.len() + keep).saturating_sub(RECENT_BREAKDOWNS);
        self.breakdowns.drain(..overflow);
        self.breakdowns
            .extend(new[new.len() - keep..].iter().cloned());
    }

    /// Forgets samples and marks that no unattributed iteration can need any more.
    pub fn prune(&mut self) {
        let oldest_needed = self
            .markers
            .loops()
            .filter_map(|m| {
                let next = self.next_iter.get(&m.pid).copied().unwrap_or(0);
                m.iteration(next)
                    .map(|(a, _)| a)
                    .or_else(|| next.checked_sub(1).and_then(|p| m.steps.get(&p).copied()))
            })
            .min();
        if let Some(t) = oldest_needed {
            self.series.prune_before(t);
            for m in self.markers.procs.values_mut() {
                m.prune_before(t);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::MEDIAN_MAX_RELATIVE_ERROR;
    use crate::attribution::Coverage;
    use crate::category::Split;
    use crate::summary::summarize;
    use crate::{secs, NS_PER_SEC};

    #[test]
    fn a_long_job_keeps_bounded_state_and_its_summary_right() {
        const WARMUP: u64 = 5;
        const ITERS: u64 = 150_000; // per rank: 300,000 breakdowns
        let mut job = JobTimeline::default();
        job.ingest(&Frame::Header(RunHeader {
            warmup_iters: WARMUP as u32,
            ..RunHeader::default()
        }));
        let (mut walls, mut prep, mut marked) = (Vec::new(), 0u64, 0u64);
        let mut batch = Vec::new();
        for iter in 0..ITERS {
            for rank in 0..2u32 {
                // 1–2 ms, spread over the range.
                let wall = 1_000_000 + (iter * 7_919 + u64::from(rank) * 13) % 1_000_000;
                let mut split = Split::default();
                split.add(Category::Compute, wall - wall / 4);
                split.add(Category::DataPrep, wall / 4);
                let start = iter * 3_000_000;
                if iter >= WARMUP {
                    walls.push(wall);
                    prep += wall / 4;
                    marked += wall / 2;
                }
                batch.push(IterationBreakdown {
                    rank,
                    pid: 100 + rank,
                    iter,
                    start_ns: start,
                    end_ns: start + wall,
                    split,
                    evidence: Vec::new(),
                    coverage: Coverage {
                        marked_ns: wall / 2,
                        sampled_ns: wall,
                    },
                });
            }
            if batch.len() >= 1_000 {
                job.record(&batch, WARMUP);
                batch.clear();
            }
        }
        job.record(&batch, WARMUP);
        assert_eq!(job.breakdowns.len(), RECENT_BREAKDOWNS);
        let last = job.breakdowns.back().unwrap();
        assert_eq!(
            (last.iter, last.rank),
            (ITERS - 1, 1),
            "the most recent are kept"
        );
        assert!(
            job.totals.held() <= 3 * 2 * 128, // 1–2 ms spans two octaves
            "only histogram buckets are left: {}",
            job.totals.held()
        );

        let s = summarize(&job);
        let counted = 2 * (ITERS - WARMUP);
        assert_eq!(s.job.iterations, counted);
        assert_eq!(s.ranks.len(), 2);
        assert_eq!(s.ranks[0].figures.iterations, ITERS - WARMUP);
        let total: u64 = walls.iter().sum();
        assert_eq!(s.job.wall_seconds, secs(total));
        assert_eq!(s.job.categories.data_prep.seconds, secs(prep));
        assert_eq!(s.job.coverage.marked, marked as f64 / total as f64);
        assert_eq!(s.job.coverage.sampled, 1.0);
        walls.sort_unstable();
        let n = walls.len();
        let exact = (walls[n / 2 - 1] + walls[n / 2]) as f64 / 2.0 / NS_PER_SEC as f64;
        let err = (s.job.median_iteration_seconds - exact).abs() / exact;
        assert!(
            err <= MEDIAN_MAX_RELATIVE_ERROR,
            "median {} vs {exact}",
            s.job.median_iteration_seconds
        );
        for r in &s.ranks {
            let err = (r.figures.median_iteration_seconds - exact).abs() / exact;
            assert!(err <= 2.0 * MEDIAN_MAX_RELATIVE_ERROR, "{r:?}");
        }
    }

    /// A collector's job: each node's agent ships its rank's GPU readings with the iteration;
    /// the summary shows every rank's GPU, warm-up left out, and a resent report (an agent
    /// replaying what a dead collector had not acknowledged) counted once.
    #[test]
    fn a_collector_shows_the_gpu_of_every_nodes_rank_once() {
        use crate::frame::{NodeIteration, NodeReport};
        use crate::gpu_usage::NvmlReading;
        let mut job = JobTimeline::default();
        job.ingest(&Frame::Header(RunHeader {
            warmup_iters: 2,
            ..RunHeader::default()
        }));
        let report = |node: &str, rank: u32, iter: u64, rx: u64| {
            let start = iter * 100_000_000;
            let mut split = Split::default();
            split.add(Category::Compute, 100_000_000);
            Frame::NodeReport(Box::new(NodeReport {
                iteration: NodeIteration {
                    node: node.into(),
                    breakdown: IterationBreakdown {
                        rank,
                        pid: 7,
                        iter,
                        start_ns: start,
                        end_ns: start + 100_000_000,
                        split,
                        evidence: Vec::new(),
                        coverage: Coverage::default(),
                    },
                    comm: Vec::new(),
                    world_size: Some(2),
                },
                gpu: Some(NvmlReading {
                    gpu: "0".into(),
                    busy_ppm: Some(500_000 + 400_000 * rank),
                    pcie_rx_bytes: Some(rx),
                    energy_mj: Some(30_000),
                    batch_bytes: Some(1_000_000),
                    ..NvmlReading::default()
                }),
            }))
        };
        for iter in 0..10 {
            // Warm-up iterations move far more bytes: they must not count.
            let rx = if iter < 2 { 50_000_000 } else { 2_000_000 };
            job.ingest(&report("node-a", 0, iter, rx));
            job.ingest(&report("node-b", 1, iter, 3 * rx));
        }
        for iter in 5..10 {
            job.ingest(&report("node-b", 1, iter, 999_000_000)); // resent
        }
        job.attribute_ready(0, true);
        for iter in 8..10 {
            job.ingest(&report("node-b", 1, iter, 999_000_000)); // resent after the join
        }
        let s = summarize(&job);
        let gpu = |rank: usize| s.ranks[rank].gpu.clone().expect("a GPU per rank");
        assert_eq!(s.ranks[1].node.as_deref(), Some("node-b"));
        assert_eq!(gpu(0).pcie_rx_bytes_per_iteration, Some(2e6));
        assert_eq!(gpu(1).pcie_rx_bytes_per_iteration, Some(6e6));
        assert_eq!(gpu(1).batch_bytes, Some(1_000_000));
        assert!((gpu(1).busy_fraction.unwrap() - 0.9).abs() < 1e-9);
        assert_eq!(gpu(0).energy_joules_per_iteration, Some(30.0));
        let text = crate::summary::render_text(&s);
        assert!(
            text.contains("gpu: rank 1 on node-b GPU 0: 90% busy, PCIe in 6.0 MB/iteration (6.00× the 1.0 MB batch)"),
            "{text}"
        );
    }
}
