//! What the advisor takes from a measured run: the iteration time and its critical-path
//! breakdown per iteration, and the job's shape (ranks, batch, loader CPU, gradient bytes per
//! iteration and collectives per iteration as the PyTorch hook reports them). Built from the
//! experiment's [`RunFacts`] so both commands read a profile the same way.

use std::collections::{HashMap, HashSet, VecDeque};

use serde::{Deserialize, Serialize};

use super::shape;
use crate::category::Category;
use crate::frame::Frame;
use crate::loops::ProcessMeta;
use crate::marker::MarkerEvent;
use crate::run_facts::{RunFacts, RunFactsFold};
use crate::secs;
use crate::series::names;

/// s per iteration of each category along the job's critical path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Breakdown {
    /// s, the accelerators (or compute threads) working.
    pub compute: f64,
    /// s, waiting for storage.
    pub data_fetch: f64,
    /// s, waiting for CPU preparation of batches.
    pub data_prep: f64,
    /// s, exposed communication over the intra-node link (NVLink/PCIe/loopback).
    pub interconnect: f64,
    /// s, exposed communication over the network.
    pub network: f64,
    /// s, waiting for a slower rank.
    pub peer_wait: f64,
    /// s, everything else.
    pub other: f64,
}

impl Breakdown {
    /// s, the sum: one iteration.
    pub fn total(&self) -> f64 {
        self.compute
            + self.data_fetch
            + self.data_prep
            + self.interconnect
            + self.network
            + self.peer_wait
            + self.other
    }

    /// Each part by name, in the order the text shows them: s per iteration.
    pub fn named(&self) -> [(&'static str, f64); 7] {
        [
            ("compute", self.compute),
            ("data fetch", self.data_fetch),
            ("data prep", self.data_prep),
            ("interconnect", self.interconnect),
            ("network", self.network),
            ("peer wait", self.peer_wait),
            ("other", self.other),
        ]
    }

    /// Scales every part so the total is `seconds` (the median iteration), keeping shares.
    pub fn scaled_to(&self, seconds: f64) -> Breakdown {
        let t = self.total();
        if t <= 0.0 {
            return Breakdown {
                other: seconds,
                ..Default::default()
            };
        }
        let k = seconds / t;
        Breakdown {
            compute: self.compute * k,
            data_fetch: self.data_fetch * k,
            data_prep: self.data_prep * k,
            interconnect: self.interconnect * k,
            network: self.network * k,
            peer_wait: self.peer_wait * k,
            other: self.other * k,
        }
    }
}

/// The measured job, as the model needs it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    /// s, the mean iteration time of the job over its counted iterations: what the hours and
    /// the cost of training follow from. A job held up by its loaders alternates between
    /// iterations whose batch was ready and ones that waited, so its median can sit well below
    /// the time an iteration takes on average (0.109 against 0.130 s on a disk-bound run).
    pub iteration_seconds: f64,
    /// s, the median iteration time, for display beside the mean.
    #[serde(default)]
    pub median_iteration_seconds: f64,
    /// Critical-path breakdown of one median iteration (shares of the run, scaled to it).
    pub breakdown: Breakdown,
    /// Iterations counted.
    pub iterations: usize,
    /// Ranks (processes) of the job: its `world_size`, also where the profile holds only
    /// one node's ranks (`ranks_measured`).
    pub ranks: u32,
    /// Nodes the job's ranks ran on: `world_size / local_world_size` as the ranks said it,
    /// else what the profiles tell (see [`super::shape`] and `nodes_from`).
    pub nodes: u32,
    /// How `nodes` was found (`world_size 4 / local_world_size 2`, `distinct host names`,
    /// `--measured-nodes`).
    #[serde(default)]
    pub nodes_from: String,
    /// Where the profiles' evidence of the job's size disagreed, or the profile holds only
    /// part of the job: each said in words.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_count_notes: Vec<String>,
    /// Ranks whose iterations the profiles hold (one node's, for one node's run profile).
    #[serde(default)]
    pub ranks_measured: u32,
    /// The job's ranks, as torch.distributed told the hook (`world_size` meta).
    #[serde(default)]
    pub world_size: Option<u32>,
    /// Ranks per node, as torchrun told the hook (`local_world_size` meta, from
    /// `LOCAL_WORLD_SIZE`).
    #[serde(default)]
    pub local_world_size: Option<u32>,
    /// The nodes by name: a run profile's host (each node's `stallscope run` names its own),
    /// or in a collector's job profile the agents' node names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    /// Per-process batch, samples.
    pub batch_size: Option<u64>,
    /// DataLoader worker processes per rank.
    pub workers: Option<u32>,
    /// CPU seconds the loader workers spent per sample prepared.
    pub loader_cpu_seconds_per_sample: Option<f64>,
    /// bytes the loader workers read from storage per sample prepared (what the page cache did
    /// not hold: the uncached share is in it).
    #[serde(default)]
    pub loader_read_bytes_per_sample: Option<f64>,
    /// Logical CPUs of the node it ran on.
    pub cpus: u32,
    /// bytes of gradients all-reduced per iteration per rank (sum of DDP bucket sizes).
    pub comm_bytes_per_iteration: Option<f64>,
    /// s, median time from the first to the last DDP bucket ready in a backward: the
    /// communication that overlapped backward compute.
    pub comm_overlap_seconds: Option<f64>,
    /// Collectives (DDP buckets) per iteration.
    pub collectives_per_iteration: Option<f64>,
    /// bytes of each DDP bucket in the order they became ready in a backward (the last
    /// layers' first; to the kB), when the hook sent them.
    #[serde(default)]
    pub bucket_bytes: Option<Vec<f64>>,
    /// s after the first DDP bucket was ready at which each bucket became ready (the
    /// median over recent backwards, in the order of `bucket_bytes`), when the hook sent them.
    #[serde(default)]
    pub bucket_ready_seconds: Option<Vec<f64>>,
    /// The DDP communication hook the program chose, by name (`fp16_compress_hook`,
    /// `CommHookType.FP16_COMPRESS`, …); `None`: DDP's own all-reduce.
    #[serde(default)]
    pub comm_hook: Option<String>,
    /// torch.distributed backend (`gloo`, `nccl`).
    pub backend: Option<String>,
    /// CPU seconds each rank's own process (not its loaders) used per iteration, when
    /// measured: for a job training on the CPU, its compute without the time it was
    /// preempted by its loader workers.
    pub rank_cpu_seconds_per_iteration: Option<f64>,
    /// Whether the job ran on accelerators (a `device` meta other than `cpu`, or GPU
    /// readings in the profile).
    pub on_gpu: bool,
    /// What bounds the job's GPU work, as its GPU figures say (`None` without them).
    #[serde(default)]
    pub gpu_bound: Option<GpuBound>,
    /// bytes per iteration per rank FSDP all-gathered and reduce-scattered (the whole
    /// tensors), the mean over the ranks; `None` in a DDP job or without them.
    #[serde(default)]
    pub sharded_bytes_per_iteration: Option<f64>,
    /// FSDP's all-gathers and reduce-scatters per iteration per rank.
    #[serde(default)]
    pub sharded_collectives_per_iteration: Option<f64>,
    /// bytes per iteration the busiest rank sent and received point to point (a pipeline's
    /// activations and their gradients).
    #[serde(default)]
    pub p2p_bytes_per_iteration: Option<f64>,
    /// Its point-to-point operations (or batches of them) per iteration.
    #[serde(default)]
    pub p2p_ops_per_iteration: Option<f64>,
}

/// What bounds a job's GPU work: which of the GPU's peaks its kernels run closest to.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuBound {
    /// Whether memory bandwidth (rather than tensor throughput) is the bound.
    pub memory: bool,
    /// The figures it was told from, in words.
    pub evidence: String,
}

/// Tells the bound from the profile's GPU figures, averaged over the run: with GPM (Hopper
/// on), DRAM bandwidth against tensor-core activity, each a share of its peak — the one
/// closer to its peak bounds the job. Without GPM, NVML's memory utilisation (share of time
/// device memory was read or written) against its utilisation (share of time a kernel ran):
/// memory at 60% or more of the kernel time marks a memory-bound job (a dense GEMM keeps it
/// well under half).
#[derive(Debug, Default)]
struct GpuFigures {
    /// Series id → which of [`GPU_BOUND_SERIES`].
    ids: HashMap<u32, usize>,
    /// Per series, the sum of its samples and how many.
    sums: [(f64, u64); 4],
}

/// The GPU series the bound is told from: GPM DRAM bandwidth and tensor activity, NVML
/// memory and kernel utilisation.
const GPU_BOUND_SERIES: [&str; 4] = [
    names::GPU_GPM_DRAM_BW,
    names::GPU_GPM_TENSOR_ACTIVITY,
    names::GPU_MEM_UTIL_PCT,
    names::GPU_UTIL_PCT,
];

impl GpuFigures {
    fn ingest(&mut self, frame: &Frame) {
        match frame {
            Frame::Series(d) => {
                if let Some(i) = GPU_BOUND_SERIES.iter().position(|n| *n == d.name) {
                    self.ids.insert(d.id.0, i);
                }
            }
            Frame::Samples(batch) => {
                for (id, v) in &batch.values {
                    if let Some(&i) = self.ids.get(&id.0) {
                        self.sums[i].0 += *v as f64;
                        self.sums[i].1 += 1;
                    }
                }
            }
            _ => {}
        }
    }

    fn finish(self) -> Option<GpuBound> {
        let sums = self.sums;
        let mean = |i: usize| (sums[i].1 > 0).then(|| sums[i].0 / sums[i].1 as f64);
        if let (Some(dram), Some(tensor)) = (mean(0), mean(1)) {
            let (dram, tensor) = (dram / 1000.0, tensor / 1000.0);
            return Some(GpuBound {
                memory: dram > tensor,
                evidence: format!(
                    "GPM: DRAM bandwidth at {:.0}% of peak, tensor cores active {:.0}% of the time",
                    dram * 100.0,
                    tensor * 100.0
                ),
            });
        }
        let (Some(mem), Some(util)) = (mean(2), mean(3)) else {
            return None;
        };
        Some(GpuBound {
            memory: util > 0.0 && mem >= 0.6 * util,
            evidence: format!(
                "NVML: memory read or written {mem:.0}% of the time, a kernel running {util:.0}%"
            ),
        })
    }
}

/// The mean of the finite values of `xs` (0 when none).
pub fn mean(xs: &[f64]) -> f64 {
    let v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// The median of `xs` (0 when empty).
pub fn median(xs: &[f64]) -> f64 {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Reads the measured job from a run's frames (`warmup` iterations left out).
pub fn measure(frames: &[Frame], warmup: u32) -> Measured {
    let mut m = Measuring::new(warmup);
    frames.iter().for_each(|f| m.ingest(f));
    m.finish()
}

/// What the advisor measures of a profile, read one frame at a time in bounded memory (the
/// profile reader's frames go straight in: nothing holds the profile, whatever its size).
#[derive(Debug)]
pub struct Measuring {
    warmup: u32,
    /// The warm-up is the profile's own (its header's), not given.
    warmup_from_header: bool,
    facts: RunFactsFold,
    meta: MetaRead,
    rank_cpu: RankCpu,
    gpu: GpuFigures,
    ops: super::sharded::OpsRead,
}

impl Measuring {
    /// A fold leaving the first `warmup` iterations of each rank out.
    pub fn new(warmup: u32) -> Measuring {
        Measuring {
            warmup,
            warmup_from_header: false,
            facts: RunFactsFold::new(warmup),
            meta: MetaRead::default(),
            rank_cpu: RankCpu::default(),
            gpu: GpuFigures::default(),
            ops: super::sharded::OpsRead::new(warmup),
        }
    }

    /// A fold leaving out the warm-up the profile's header names (1 without a header), as
    /// the run it measured did.
    pub fn with_profiles_warmup() -> Measuring {
        Measuring {
            warmup_from_header: true,
            ..Measuring::new(1)
        }
    }

    /// Takes the profile's next frame.
    pub fn ingest(&mut self, frame: &Frame) {
        if let (true, Frame::Header(h)) = (self.warmup_from_header, frame) {
            self.warmup = h.warmup_iters;
            self.facts.set_warmup(h.warmup_iters);
            self.ops.set_warmup(h.warmup_iters);
        }
        self.facts.ingest(frame);
        self.meta.ingest(frame);
        self.rank_cpu.ingest(frame, self.warmup);
        self.gpu.ingest(frame);
        self.ops.ingest(frame);
    }

    /// The measured job.
    pub fn finish(self) -> Measured {
        let facts: RunFacts = self.facts.finish();
        let mut m = Measured {
            iteration_seconds: facts.mean_iteration_seconds,
            median_iteration_seconds: facts.median_iteration_seconds,
            iterations: facts.iterations_counted as usize,
            ranks: facts.ranks.max(1),
            ranks_measured: facts.ranks,
            nodes: 1,
            batch_size: facts.batch_size,
            workers: facts.workers,
            cpus: facts.cpus,
            ..Default::default()
        };
        let cp = &facts.critical_path;
        let n = m.iterations.max(1) as f64;
        let per = |c: Category| secs(cp.get(c)) / n;
        m.breakdown = Breakdown {
            compute: per(Category::Compute),
            data_fetch: per(Category::DataFetch),
            data_prep: per(Category::DataPrep),
            interconnect: per(Category::Interconnect),
            network: per(Category::Network),
            peer_wait: per(Category::PeerWait),
            other: per(Category::Other),
        }
        .scaled_to(m.iteration_seconds);
        if let Some(b) = facts.batch_size {
            let samples = (facts.batches_prepared_per_rank() * b * m.ranks as u64) as f64;
            if samples > 0.0 {
                m.loader_cpu_seconds_per_sample = facts.loader_cpu_seconds.map(|cpu| cpu / samples);
                m.loader_read_bytes_per_sample =
                    facts.loader_read_bytes.map(|bytes| bytes as f64 / samples);
            }
        }
        let source = self.meta.finish(&mut m);
        let ddp = m.collectives_per_iteration.is_some();
        self.ops.finish(&mut m, ddp);
        shape::settle(&mut m, source);
        m.rank_cpu_seconds_per_iteration = self.rank_cpu.finish();
        if m.on_gpu {
            m.gpu_bound = self.gpu.finish();
        }
        m
    }
}

impl Measured {
    /// Whether the program's comm hook sends the gradients as FP16/BF16 (PyTorch's
    /// `fp16_compress_hook`, `bf16_compress_hook`, their wrappers and the built-in
    /// `FP16_COMPRESS`): half the buckets' bytes cross the link.
    pub fn compressed(&self) -> bool {
        self.comm_hook.as_deref().is_some_and(|h| {
            let h = h.to_ascii_lowercase();
            h.contains("fp16") || h.contains("bf16")
        })
    }
}

/// One job measured from several run profiles (one per node, each `stallscope run -o`):
/// the mean iteration over all their iterations, the median of their medians, breakdowns
/// averaged, the rest from the first; one profile is itself. The job's size is the ranks' meta's
/// (`world_size / local_world_size` nodes), else their distinct hosts (at least the most any
/// one profile was read as): [`shape::settle`]. `None` without profiles.
pub fn pool(runs: &[Measured]) -> Option<Measured> {
    if let [one] = runs {
        return Some(one.clone());
    }
    let mut m = runs.first()?.clone();
    let n = runs.len() as f64;
    let weight: usize = runs.iter().map(|x| x.iterations).sum();
    m.iteration_seconds = runs
        .iter()
        .map(|x| x.iteration_seconds * x.iterations as f64)
        .sum::<f64>()
        / weight.max(1) as f64;
    m.median_iteration_seconds = median(
        &runs
            .iter()
            .map(|x| x.median_iteration_seconds)
            .collect::<Vec<_>>(),
    );
    let mut b = Breakdown::default();
    for x in runs {
        let s = x.breakdown;
        b.compute += s.compute / n;
        b.data_fetch += s.data_fetch / n;
        b.data_prep += s.data_prep / n;
        b.interconnect += s.interconnect / n;
        b.network += s.network / n;
        b.peer_wait += s.peer_wait / n;
        b.other += s.other / n;
    }
    m.breakdown = b.scaled_to(m.iteration_seconds);
    m.iterations = weight;
    let mut hosts: Vec<String> = runs.iter().flat_map(|x| x.hosts.clone()).collect();
    hosts.sort();
    hosts.dedup();
    let distinct = hosts.len() == runs.len();
    m.hosts = hosts;
    m.world_size = runs.iter().filter_map(|x| x.world_size).max();
    m.local_world_size = runs.iter().filter_map(|x| x.local_world_size).max();
    m.ranks_measured = if runs.iter().any(|x| x.ranks_measured == 0) {
        // Built without the ranks they hold: the job's ranks are the most any says.
        runs.iter().map(|x| x.ranks).max().unwrap_or(1)
    } else if distinct {
        runs.iter().map(|x| x.ranks_measured).sum()
    } else {
        runs.iter().map(|x| x.ranks_measured).max().unwrap_or(1)
    };
    let source = shape::Source::Pooled {
        profiles: runs.len(),
        most_nodes: runs.iter().map(|x| x.nodes).max().unwrap_or(1),
    };
    shape::settle(&mut m, source);
    Some(m)
}

/// CPU seconds per iteration of the ranks' own processes, over their counted iterations only
/// (start-up, imports and warm-up left out), averaged over ranks.
#[derive(Debug, Default)]
struct RankCpu {
    /// Per loop pid, its counted iterations' span: (first start, last end, how many), ns.
    window: HashMap<u32, (u64, u64, u64)>,
    /// Series id → pid, of the processes' CPU time.
    series: HashMap<u32, u32>,
    /// Per pid, its CPU samples of the last [`RECENT_CPU_NS`] (t ns, CPU ns): where the window's
    /// ends are found, as the iterations that set them arrive (a few seconds after their
    /// samples, once attributed).
    recent: HashMap<u32, VecDeque<CpuSample>>,
    /// Per pid, the first sample inside its window and the last one so far.
    inside: HashMap<u32, (CpuSample, CpuSample)>,
}

/// One CPU-time sample of a process: (t ns, CPU ns).
type CpuSample = (u64, u64);

/// ns of CPU samples kept per process to find the ends of its counted iterations' span in.
const RECENT_CPU_NS: u64 = 60_000_000_000;

impl RankCpu {
    fn ingest(&mut self, frame: &Frame, warmup: u32) {
        match frame {
            Frame::Breakdown(b) if b.iter >= warmup as u64 => {
                let w = self.window.entry(b.pid).or_insert((u64::MAX, 0, 0));
                *w = (w.0.min(b.start_ns), w.1.max(b.end_ns), w.2 + 1);
                let (start, end, _) = *w;
                if let Some(recent) = self.recent.get(&b.pid) {
                    let first = recent.iter().find(|(t, _)| *t >= start && *t <= end);
                    let last = recent.iter().rev().find(|(t, _)| *t >= start && *t <= end);
                    if let (Some(&first), Some(&last)) = (first, last) {
                        let e = self.inside.entry(b.pid).or_insert((first, last));
                        e.1 = if last.0 >= e.1 .0 { last } else { e.1 };
                    }
                }
            }
            Frame::Series(d) if d.name == names::PROC_ALL_CPU_NS => {
                if let Some(pid) = d.label("pid").and_then(|p| p.parse().ok()) {
                    self.series.insert(d.id.0, pid);
                }
            }
            Frame::Samples(batch) => {
                for (id, v) in &batch.values {
                    let Some(&pid) = self.series.get(&id.0) else {
                        continue;
                    };
                    let recent = self.recent.entry(pid).or_default();
                    recent.push_back((batch.t_ns, *v));
                    while recent
                        .front()
                        .is_some_and(|(t, _)| batch.t_ns.saturating_sub(*t) > RECENT_CPU_NS)
                    {
                        recent.pop_front();
                    }
                    if let (Some(&(start, end, _)), Some(e)) =
                        (self.window.get(&pid), self.inside.get_mut(&pid))
                    {
                        if batch.t_ns >= start && batch.t_ns <= end && batch.t_ns >= e.1 .0 {
                            e.1 = (batch.t_ns, *v);
                        }
                    }
                }
            }
            _ => {}
        }
    }

    /// CPU s per iteration of the loops, averaged over them: the CPU time between the first
    /// and last samples inside each loop's counted iterations, over the iterations that span.
    fn finish(self) -> Option<f64> {
        let mut per_iter = Vec::new();
        for (pid, (start, end, n)) in self.window {
            let Some(&(a, b)) = self.inside.get(&pid) else {
                continue;
            };
            if b.0 > a.0 && n > 1 {
                let iters = n as f64 * (b.0 - a.0) as f64 / (end - start).max(1) as f64;
                per_iter.push(secs(b.1.saturating_sub(a.1)) / iters);
            }
        }
        (!per_iter.is_empty()).then(|| per_iter.iter().sum::<f64>() / per_iter.len() as f64)
    }
}

/// The hook's facts and the hosts (a run profile's own, or a job profile's agents').
#[derive(Debug, Default)]
struct MetaRead {
    /// Host and node names seen.
    nodes: HashSet<String>,
    /// A job profile: its header is the collector's, and its nodes are the agents' that
    /// shipped iterations (the header comes first).
    job: bool,
    /// The hook's facts, through the one parser (`ProcessMeta`): the latest said wins, the
    /// job's sizes the largest any rank said.
    said: ProcessMeta,
    /// A device other than the CPU was named, or GPU series declared.
    on_gpu: bool,
}

impl MetaRead {
    fn take<'a>(&mut self, kv: impl Iterator<Item = &'a (String, String)>) {
        let mut said = ProcessMeta::default();
        for (k, v) in kv {
            said.set(k, v);
        }
        self.on_gpu |= said
            .device
            .as_deref()
            .is_some_and(|d| !d.starts_with("cpu"));
        self.said.absorb(&said);
    }

    fn ingest(&mut self, frame: &Frame) {
        match frame {
            Frame::Header(h) if h.is_collectors() => self.job = true,
            Frame::Header(h) => {
                self.nodes.insert(h.host.clone());
            }
            Frame::Markers(markers) => {
                for mk in markers {
                    if let MarkerEvent::Meta(kv) = &mk.event {
                        self.take(kv.iter());
                    }
                }
            }
            Frame::NodeMeta(meta) => {
                self.nodes.insert(meta.node.clone());
                self.take(meta.fields.iter());
            }
            Frame::NodeReport(_) | Frame::NodeIteration(_) => {
                if let Some(it) = frame.node_iteration() {
                    self.nodes.insert(it.node.clone());
                }
            }
            Frame::Series(d) if d.name.starts_with("gpu.") => self.on_gpu = true,
            _ => {}
        }
    }

    /// Puts what was said into `m`; returns which kind of profile it is.
    fn finish(self, m: &mut Measured) -> shape::Source {
        let said = self.said;
        m.on_gpu |= self.on_gpu;
        m.comm_bytes_per_iteration = said.comm_bytes;
        m.collectives_per_iteration = said.comm_buckets;
        m.bucket_bytes = said.comm_bucket_bytes;
        m.bucket_ready_seconds = said.comm_bucket_ready_seconds;
        m.comm_overlap_seconds = said.comm_overlap_seconds;
        m.backend = said.backend;
        m.comm_hook = said.comm_hook;
        m.world_size = said.world_size;
        m.local_world_size = said.local_world_size;
        let mut hosts: Vec<String> = self.nodes.into_iter().filter(|h| !h.is_empty()).collect();
        hosts.sort();
        m.hosts = hosts;
        if self.job {
            shape::Source::Job
        } else {
            shape::Source::Run
        }
    }
}
