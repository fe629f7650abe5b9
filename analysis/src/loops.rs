//! The marker log: per process, the phases it marked and the steps that bound its iterations.
//!
//! Iteration `i` of a process runs from its step `i - 1` (for `i = 0`, from its first marker)
//! to its step `i`. Steps are placed by the iteration number they carry, not by counting, so a
//! lost datagram costs the two iterations it bounds and shifts nothing else. Sequence gaps
//! count what was lost.
//!
//! A loop on CUDA also sends, a few iterations late, what its GPU saw of each iteration
//! (CUDA events read back lazily by the PyTorch hook): those `gpu_iter` metas are kept per
//! iteration ([`CudaEventTimes`]) rather than as the latest value.
//!
//! A span that is one communication operation keeps its identity ([`CommOp`]), so that the
//! peer matching finds the same operation on the other ranks by (group, op, seq), or a
//! receive by the sender's send of the same number, rather than by position.

use std::collections::{BTreeMap, HashMap};

use crate::marker::{phase, CommOp, Direction, Marker, MarkerEvent};

/// The operation name of a batch of point-to-point operations.
pub const BATCH_P2P: &str = "batch_isend_irecv";
use crate::Nanos;

/// A closed phase of one process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    /// Phase name.
    pub phase: String,
    /// ns.
    pub begin: Nanos,
    /// ns.
    pub end: Nanos,
    /// The communication operation it is, when the sender named one (`B comm op=…`).
    pub op: Option<CommOp>,
}

/// What the GPU of one loop saw of one iteration, from CUDA events on its stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaEventTimes {
    /// ns on the GPU from the previous step to this one (`gpu_iter_us`).
    pub iter_ns: Option<u64>,
    /// ns the GPU sat idle while the loop waited for data (`gpu_data_us`).
    pub data_idle_ns: Option<u64>,
    /// ns of exposed gradient all-reduce on the GPU stream (`gpu_comm_us`).
    pub comm_ns: Option<u64>,
}

impl CudaEventTimes {
    /// The times in one `gpu_iter` meta, with its iteration; `None` when it is not one or the
    /// iteration is not a number.
    fn from_meta(kv: &[(String, String)]) -> Option<(u64, CudaEventTimes)> {
        let get = |key: &str| kv.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
        let iter = get("gpu_iter")?.parse().ok()?;
        let ns = |key: &str| -> Option<u64> {
            get(key)?
                .parse::<u64>()
                .ok()
                .map(|us| us.saturating_mul(1000))
        };
        Some((
            iter,
            CudaEventTimes {
                iter_ns: ns("gpu_iter_us"),
                data_idle_ns: ns("gpu_data_us"),
                comm_ns: ns("gpu_comm_us"),
            },
        ))
    }
}

/// What a process said of itself in `meta` markers, parsed once as they arrive: the one
/// parser of the hook's facts, for attribution, the summary, the live model, the agent, the
/// experiment (`run_facts`) and the advisor. A value that does not parse is absent.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProcessMeta {
    /// `role`: `loader` for a DataLoader worker.
    pub role: Option<String>,
    /// `parent`: the pid of the loop a loader works for.
    pub parent: Option<u32>,
    /// `workers`: the DataLoader's `num_workers`.
    pub workers: Option<u32>,
    /// `batch_size`: samples per batch, per rank.
    pub batch_size: Option<u64>,
    /// `batch_bytes`: bytes of one batch as the DataLoader returned it.
    pub batch_bytes: Option<u64>,
    /// `dataset_samples`: `len(dataset)`.
    pub dataset_samples: Option<u64>,
    /// `world_size`: ranks in the job.
    pub world_size: Option<u32>,
    /// `local_world_size`: ranks on this node (torchrun's `LOCAL_WORLD_SIZE`).
    pub local_world_size: Option<u32>,
    /// `backend`: torch.distributed's backend (`gloo`, `nccl`).
    pub backend: Option<String>,
    /// `device`: where the model runs (`cpu`, `cuda:0`).
    pub device: Option<String>,
    /// `comm_hook`: the name of the program's own DDP comm hook, when it set one.
    pub comm_hook: Option<String>,
    /// `comm_bytes`: bytes DDP all-reduced per iteration.
    pub comm_bytes: Option<f64>,
    /// `comm_buckets`: DDP's buckets (collectives) per iteration.
    pub comm_buckets: Option<f64>,
    /// `comm_bucket_kb`: each bucket's bytes, in the order backward made them (sent in kB).
    pub comm_bucket_bytes: Option<Vec<f64>>,
    /// `comm_bucket_ready_ms`: s from the first bucket's ready time to each bucket's (sent in
    /// ms), in the same order.
    pub comm_bucket_ready_seconds: Option<Vec<f64>>,
    /// `comm_overlap_us`: s of the all-reduce hidden behind backward per iteration (sent in µs).
    pub comm_overlap_seconds: Option<f64>,
    /// `finishing=1` (the hook's `destroy_process_group`) or `exit=1` (its goodbye at exit):
    /// the process is past its training. Its own, never absorbed from another process.
    pub finishing: bool,
}

impl ProcessMeta {
    /// The keys the advisor reads, sorted: what an agent forwards to the collector
    /// (`crate::frame::NodeMeta::KEYS`), so a job profile answers `advise` as a run's does.
    pub const ADVISOR_KEYS: &'static [&'static str] = &[
        "backend",
        "batch_size",
        "comm_bucket_kb",
        "comm_bucket_ready_ms",
        "comm_buckets",
        "comm_bytes",
        "comm_hook",
        "comm_overlap_us",
        "device",
        "local_world_size",
        "workers",
        "world_size",
    ];

    /// Takes one key and value (other keys are ignored).
    pub fn set(&mut self, key: &str, value: &str) {
        match key {
            "role" => self.role = Some(value.to_string()),
            "parent" => self.parent = value.parse().ok(),
            "workers" => self.workers = value.parse().ok(),
            "batch_size" => self.batch_size = value.parse().ok(),
            "batch_bytes" => self.batch_bytes = value.parse().ok(),
            "dataset_samples" => self.dataset_samples = value.parse().ok(),
            "world_size" => self.world_size = value.parse().ok(),
            "local_world_size" => self.local_world_size = value.parse().ok(),
            "backend" => self.backend = Some(value.to_string()),
            "device" => self.device = Some(value.to_string()),
            "comm_hook" => self.comm_hook = Some(value.to_string()),
            "comm_bytes" => self.comm_bytes = finite(value),
            "comm_buckets" => self.comm_buckets = finite(value),
            "comm_bucket_kb" => {
                self.comm_bucket_bytes = list(value).map(|kb| kb.iter().map(|k| k * 1e3).collect())
            }
            "comm_bucket_ready_ms" => {
                self.comm_bucket_ready_seconds =
                    list(value).map(|ms| ms.iter().map(|m| m / 1e3).collect())
            }
            "comm_overlap_us" => self.comm_overlap_seconds = finite(value).map(|us| us / 1e6),
            "finishing" | "exit" => self.finishing = value == "1",
            _ => {}
        }
    }

    /// Takes every fact another process of the same job said (later ones win), except the
    /// job's sizes, where the largest any rank said wins (a rank that has not joined the
    /// group yet says less).
    pub fn absorb(&mut self, other: &ProcessMeta) {
        fn later<T: Clone>(mine: &mut Option<T>, theirs: &Option<T>) {
            if theirs.is_some() {
                mine.clone_from(theirs);
            }
        }
        later(&mut self.role, &other.role);
        later(&mut self.parent, &other.parent);
        later(&mut self.workers, &other.workers);
        later(&mut self.batch_size, &other.batch_size);
        later(&mut self.batch_bytes, &other.batch_bytes);
        later(&mut self.dataset_samples, &other.dataset_samples);
        later(&mut self.backend, &other.backend);
        later(&mut self.device, &other.device);
        later(&mut self.comm_hook, &other.comm_hook);
        later(&mut self.comm_bytes, &other.comm_bytes);
        later(&mut self.comm_buckets, &other.comm_buckets);
        later(&mut self.comm_bucket_bytes, &other.comm_bucket_bytes);
        later(
            &mut self.comm_bucket_ready_seconds,
            &other.comm_bucket_ready_seconds,
        );
        later(&mut self.comm_overlap_seconds, &other.comm_overlap_seconds);
        self.world_size = self.world_size.max(other.world_size);
        self.local_world_size = self.local_world_size.max(other.local_world_size);
    }

    /// Whether it said it is a DataLoader worker.
    pub fn is_loader(&self) -> bool {
        self.role.as_deref() == Some("loader")
    }
}

/// A finite number, or `None`.
fn finite(text: &str) -> Option<f64> {
    text.parse::<f64>().ok().filter(|v| v.is_finite())
}

/// A `:`-separated list of non-negative finite numbers (`0:12.5:40.1`); `None` if any is not
/// one, or the list is empty.
fn list(text: &str) -> Option<Vec<f64>> {
    text.split(':')
        .map(|x| finite(x).filter(|v| *v >= 0.0))
        .collect::<Option<Vec<f64>>>()
        .filter(|v| !v.is_empty())
}

/// What one process sent.
#[derive(Clone, Debug, Default)]
pub struct ProcessMarks {
    /// Process id.
    pub pid: u32,
    /// Latest rank it reported.
    pub rank: Option<u32>,
    /// ns of its first event.
    pub first_ns: Option<Nanos>,
    /// ns of its latest event.
    pub last_ns: Option<Nanos>,
    /// Step time by iteration number, ns.
    pub steps: BTreeMap<u64, Nanos>,
    /// Closed phases, in the order they closed.
    pub spans: Vec<Span>,
    open: HashMap<String, (Nanos, Option<CommOp>)>,
    /// Latest metadata per key (`workers`, `role`, `parent`, `local_rank`, …).
    pub meta: BTreeMap<String, String>,
    /// The keys of `meta` that are read, parsed.
    info: ProcessMeta,
    last_seq: Option<u64>,
    /// Datagrams known lost (sequence gaps).
    pub dropped: u64,
    /// The process each phase that named one waited for (`B data w=<pid>`: the DataLoader
    /// worker whose batch was next), by the phase's begin time, ns.
    pub waits: BTreeMap<Nanos, u32>,
    /// What the GPU saw, by iteration number (CUDA loops only).
    pub gpu: BTreeMap<u64, CudaEventTimes>,
    /// The latest iteration whose GPU times arrived: they come in iteration order, so an
    /// earlier one still missing never will (the hook dropped it).
    pub gpu_latest: Option<u64>,
    /// Point-to-point operations it marked, by (peer's global rank, direction), counted
    /// since it started (never pruned: a few entries per peer).
    pub p2p: BTreeMap<(u32, Direction), u64>,
    /// Batched point-to-point operations it marked (`batch_isend_irecv`, which
    /// `torch.distributed.pipelining` sends and receives with), counted since it started.
    pub batch_p2p: u64,
}

impl ProcessMarks {
    /// What it said of itself, parsed.
    pub fn info(&self) -> &ProcessMeta {
        &self.info
    }

    /// The phases begun and not ended yet: name, ns of the begin, and the communication
    /// operation it is when the sender named one (a blocking collective while it blocks).
    pub fn open_phases(&self) -> impl Iterator<Item = (&str, Nanos, Option<&CommOp>)> {
        self.open
            .iter()
            .map(|(name, (begin, op))| (name.as_str(), *begin, op.as_ref()))
    }

    /// Whether it runs a training loop (it has sent a step).
    pub fn is_loop(&self) -> bool {
        !self.steps.is_empty()
    }

    /// The bounds of iteration `iter`, ns, when both its steps are known.
    pub fn iteration(&self, iter: u64) -> Option<(Nanos, Nanos)> {
        let end = *self.steps.get(&iter)?;
        let start = if iter == 0 {
            self.first_ns?
        } else {
            *self.steps.get(&(iter - 1))?
        };
        (start <= end).then_some((start, end))
    }

    /// Closed spans overlapping `[a, b]`, clipped to it.
    pub fn spans_within(&self, a: Nanos, b: Nanos) -> Vec<Span> {
        self.spans
            .iter()
            .filter(|s| s.end > a && s.begin < b)
            .map(|s| Span {
                phase: s.phase.clone(),
                begin: s.begin.max(a),
                end: s.end.min(b),
                op: s.op.clone(),
            })
            .collect()
    }

    /// The `comm` spans within `[a, b)`, clipped as [`ProcessMarks::spans_within`] clips
    /// them, in the order they began: the order the attribution numbers them in.
    pub fn comm_spans(&self, a: Nanos, b: Nanos) -> Vec<Span> {
        let mut v: Vec<Span> = self
            .spans_within(a, b)
            .into_iter()
            .filter(|s| s.phase == phase::COMM)
            .collect();
        v.sort_by_key(|s| s.begin);
        v
    }

    /// ns, when this process began the kept operation `matches` picks (the earliest such).
    pub fn op_begin(&self, matches: impl Fn(&CommOp) -> bool) -> Option<Nanos> {
        self.spans
            .iter()
            .filter(|s| s.op.as_ref().is_some_and(&matches))
            .map(|s| s.begin)
            .min()
    }

    /// Begin times of the `comm` spans within `[a, b)`, in order, ns: the same spans, clipped
    /// the same way, as [`ProcessMarks::spans_within`] gives the attribution, so that the
    /// k-th collective of an iteration is the k-th on both sides. A collective that straddles
    /// the step counts in both iterations, beginning at `a` in the later one.
    pub fn comm_begins(&self, a: Nanos, b: Nanos) -> Vec<Nanos> {
        let mut v: Vec<Nanos> = self
            .spans_within(a, b)
            .into_iter()
            .filter(|s| s.phase == phase::COMM)
            .map(|s| s.begin)
            .collect();
        v.sort_unstable();
        v
    }

    /// Whether the loop's GPU is timed with CUDA events: it sent GPU times, or said which CUDA
    /// device it drives (the hook does so as it starts timing).
    pub fn gpu_timed(&self) -> bool {
        self.gpu_latest.is_some() || self.meta.contains_key("cuda_device")
    }

    /// Whether the GPU times of `iter` have arrived or never will (the loop is not timed on a
    /// GPU, or a later iteration's times came first).
    pub fn gpu_settled(&self, iter: u64) -> bool {
        match self.gpu_latest {
            Some(latest) => latest >= iter,
            None => !self.gpu_timed(),
        }
    }

    /// The process the loop waited for in `[a, b]`, when the phase covering it named one.
    pub fn waited_for(&self, a: Nanos, b: Nanos) -> Option<u32> {
        let (begin, pid) = self.waits.range(..=a).next_back()?;
        self.spans
            .iter()
            .any(|s| s.begin == *begin && s.end >= b && s.phase == phase::DATA)
            .then_some(*pid)
    }

    /// Forgets spans that ended before `t` and steps older than the one before `t`.
    pub fn prune_before(&mut self, t: Nanos) {
        self.spans.retain(|s| s.end >= t);
        // A wait is kept while its phase is: closed and kept, or still open.
        let open: Vec<Nanos> = self.open.values().map(|(t, _)| *t).collect();
        let spans = &self.spans;
        self.waits.retain(|begin, _| {
            *begin >= t || open.contains(begin) || spans.iter().any(|s| s.begin == *begin)
        });
        let old: Vec<u64> = self
            .steps
            .iter()
            .filter(|(_, at)| **at < t)
            .map(|(i, _)| *i)
            .collect();
        // Keep the newest old step: it starts the next iteration.
        for i in old.iter().rev().skip(1) {
            self.steps.remove(i);
        }
        if let Some(&first) = self.steps.keys().next() {
            self.gpu = self.gpu.split_off(&first);
        }
    }
}

/// Every process's marks.
#[derive(Debug, Default)]
pub struct MarkerLog {
    /// By pid.
    pub procs: BTreeMap<u32, ProcessMarks>,
    /// What the processes [`MarkerLog::forget`] removed leave to the summary.
    forgotten: Forgotten,
}

/// What forgotten processes said that the summary still reads: a node's agent serves job
/// after job, so their marks go once attributed, and these few figures stay.
#[derive(Clone, Debug, Default)]
struct Forgotten {
    /// Datagrams known lost.
    dropped: u64,
    /// The most DataLoader workers a forgotten loop said it had.
    workers: Option<u32>,
    /// The largest batch (samples per rank) a forgotten loop said it took.
    batch_size: Option<u64>,
    /// The process groups forgotten loops said were tensor parallel, sorted.
    tensor_parallel_groups: Vec<u32>,
    /// Some forgotten loop used DDP (it sent `comm_buckets`).
    ddp: bool,
    /// The forgotten loops that exchanged point-to-point operations (pipeline stages), the
    /// latest [`MAX_FORGOTTEN_STAGES`].
    stages: Vec<P2pLoop>,
}

/// Forgotten pipeline stages kept: a node's agent serves job after job.
const MAX_FORGOTTEN_STAGES: usize = 1024;

/// What a loop that exchanged point-to-point operations said of them: what tells a pipeline's
/// stages and micro-batches (`crate::parallelism`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct P2pLoop {
    /// Its rank, as [`MarkerLog::ranks`] gives it.
    pub rank: u32,
    /// Its point-to-point operations by (peer's global rank, direction).
    pub p2p: BTreeMap<(u32, Direction), u64>,
    /// Its batches of point-to-point operations.
    pub batch_p2p: u64,
    /// Iterations it ended (its last step's number + 1).
    pub iterations: Option<u64>,
}

impl MarkerLog {
    /// Records one marker.
    pub fn ingest(&mut self, m: &Marker) {
        let p = self.procs.entry(m.pid).or_insert_with(|| ProcessMarks {
            pid: m.pid,
            ..Default::default()
        });
        match p.last_seq {
            Some(last) if m.seq > last + 1 => p.dropped += m.seq - last - 1,
            Some(last) if m.seq <= last => {
                // A new process image under the same pid, or a fork that kept the counter:
                // start counting again rather than inventing drops.
            }
            _ if p.last_seq.is_none() && m.seq > 0 => p.dropped += m.seq,
            _ => {}
        }
        p.last_seq = Some(m.seq);
        if m.rank.is_some() {
            p.rank = m.rank;
        }
        p.first_ns = Some(p.first_ns.map_or(m.t_ns, |f| f.min(m.t_ns)));
        p.last_ns = Some(p.last_ns.map_or(m.t_ns, |l| l.max(m.t_ns)));
        match &m.event {
            MarkerEvent::Begin(name) => {
                p.open.insert(name.clone(), (m.t_ns, None));
            }
            MarkerEvent::BeginWaiting(name, waits_for) => {
                p.open.insert(name.clone(), (m.t_ns, None));
                p.waits.insert(m.t_ns, *waits_for);
            }
            MarkerEvent::BeginOp(name, op) => {
                if let (Some(peer), Some(direction)) = (op.peer, op.direction()) {
                    *p.p2p.entry((peer, direction)).or_default() += 1;
                }
                if op.op == BATCH_P2P {
                    p.batch_p2p += 1;
                }
                p.open.insert(name.clone(), (m.t_ns, Some(op.clone())));
            }
            MarkerEvent::End(name) => {
                if let Some((begin, op)) = p.open.remove(name) {
                    if begin <= m.t_ns {
                        p.spans.push(Span {
                            phase: name.clone(),
                            begin,
                            end: m.t_ns,
                            op,
                        });
                    }
                }
            }
            MarkerEvent::Step => {
                p.steps.insert(m.iter, m.t_ns);
            }
            MarkerEvent::Meta(kv) => {
                if let Some((iter, times)) = CudaEventTimes::from_meta(kv) {
                    p.gpu.insert(iter, times);
                    p.gpu_latest = Some(p.gpu_latest.map_or(iter, |l| l.max(iter)));
                    return;
                }
                for (k, v) in kv {
                    p.info.set(k, v);
                    p.meta.insert(k.clone(), v.clone());
                }
            }
        }
    }

    /// The processes that run training loops, by pid.
    pub fn loops(&self) -> impl Iterator<Item = &ProcessMarks> {
        self.procs.values().filter(|p| p.is_loop())
    }

    /// Datagrams known lost over all processes, forgotten ones included.
    pub fn dropped(&self) -> u64 {
        self.forgotten.dropped + self.procs.values().map(|p| p.dropped).sum::<u64>()
    }

    /// The most DataLoader workers any loop said it had, forgotten ones included.
    pub fn loader_workers(&self) -> Option<u32> {
        let live = self.loops().filter_map(|m| m.info().workers).max();
        live.max(self.forgotten.workers)
    }

    /// The largest batch (samples per rank) any loop said it took, forgotten ones included.
    pub fn batch_size(&self) -> Option<u64> {
        let live = self.loops().filter_map(|m| m.info().batch_size).max();
        live.max(self.forgotten.batch_size)
    }

    /// Removes process `pid`'s marks, keeping what the summary reads of them.
    pub fn forget(&mut self, pid: u32) {
        let stage = self.p2p_loops().into_iter().find(|(p, _)| *p == pid);
        let Some(p) = self.procs.remove(&pid) else {
            return;
        };
        let f = &mut self.forgotten;
        if let Some((_, stage)) = stage {
            if f.stages.len() >= MAX_FORGOTTEN_STAGES {
                f.stages.remove(0);
            }
            f.stages.push(stage);
        }
        f.ddp |= p.meta.contains_key("comm_buckets");
        f.dropped += p.dropped;
        if p.is_loop() {
            f.workers = f.workers.max(p.info.workers);
            f.batch_size = f.batch_size.max(p.info.batch_size);
            f.tensor_parallel_groups
                .extend(crate::collectives::tensor_parallel_groups(&p.meta));
            f.tensor_parallel_groups.sort_unstable();
            f.tensor_parallel_groups.dedup();
        }
    }

    /// Whether any loop, forgotten ones included, used DDP (it sent `comm_buckets`).
    pub fn ddp(&self) -> bool {
        self.forgotten.ddp || self.loops().any(|p| p.meta.contains_key("comm_buckets"))
    }

    /// The live loops that exchanged point-to-point operations, by pid, with their rank.
    fn p2p_loops(&self) -> Vec<(u32, P2pLoop)> {
        let ranks = self.ranks();
        self.loops()
            .filter(|p| !p.p2p.is_empty() || p.batch_p2p > 0)
            .filter_map(|p| {
                let stage = P2pLoop {
                    rank: *ranks.get(&p.pid)?,
                    p2p: p.p2p.clone(),
                    batch_p2p: p.batch_p2p,
                    iterations: p.steps.keys().next_back().map(|s| s + 1),
                };
                Some((p.pid, stage))
            })
            .collect()
    }

    /// The loops that exchanged point-to-point operations, forgotten ones included.
    pub fn pipeline_stages(&self) -> Vec<P2pLoop> {
        let mut out = self.forgotten.stages.clone();
        out.extend(self.p2p_loops().into_iter().map(|(_, s)| s));
        out
    }

    /// The process groups any loop said were tensor parallel (a DeviceMesh's `tp` dimension,
    /// or DTensor's collectives' group), forgotten ones included; sorted.
    pub fn tensor_parallel_groups(&self) -> Vec<u32> {
        let mut out = self.forgotten.tensor_parallel_groups.clone();
        for p in self.loops() {
            out.extend(crate::collectives::tensor_parallel_groups(&p.meta));
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The rank each loop process stands for: its reported rank, or, for loops that never
    /// reported one, the next free numbers in pid order.
    pub fn ranks(&self) -> BTreeMap<u32, u32> {
        self.ranks_without(None)
    }

    /// [`MarkerLog::ranks`] as it would be without loop `skip`.
    pub fn ranks_without(&self, skip: Option<u32>) -> BTreeMap<u32, u32> {
        let loops = || self.loops().filter(|p| Some(p.pid) != skip);
        let mut out = BTreeMap::new();
        let mut taken: Vec<u32> = loops().filter_map(|p| p.rank).collect();
        let mut next = 0;
        for p in loops() {
            let r = match p.rank {
                Some(r) => r,
                None => {
                    while taken.contains(&next) {
                        next += 1;
                    }
                    taken.push(next);
                    next
                }
            };
            out.insert(p.pid, r);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 30: one parser of the hook's facts. Every key the advisor reads is one it
    /// parses, and across ranks the latest fact wins but the job's size is the largest said.
    #[test]
    fn the_advisors_facts_are_parsed_once_and_absorbed_across_ranks() {
        let mut rank0 = ProcessMeta::default();
        for (k, v) in [
            ("comm_bucket_kb", "2505:2411"),
            ("comm_bucket_ready_ms", "0.0:36.8"),
            ("comm_overlap_us", "1500"),
            ("world_size", "4"),
            ("local_world_size", "2"),
            ("device", "cuda:0"),
            ("comm_bytes", "nan"),
        ] {
            rank0.set(k, v);
        }
        assert_eq!(
            rank0.comm_bucket_bytes,
            Some(vec![2_505_000.0, 2_411_000.0])
        );
        assert_eq!(rank0.comm_bucket_ready_seconds, Some(vec![0.0, 0.0368]));
        assert_eq!(rank0.comm_overlap_seconds, Some(0.0015));
        assert_eq!(rank0.comm_bytes, None, "not a number is absent");
        let mut rank1 = ProcessMeta::default();
        rank1.set("world_size", "2");
        rank1.set("backend", "gloo");
        let mut job = rank0.clone();
        job.absorb(&rank1);
        assert_eq!(job.world_size, Some(4), "the largest size said");
        assert_eq!(job.backend.as_deref(), Some("gloo"));
        assert_eq!(
            job.device.as_deref(),
            Some("cuda:0"),
            "kept where not said again"
        );
        let mut sorted = ProcessMeta::ADVISOR_KEYS.to_vec();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            ProcessMeta::ADVISOR_KEYS,
            "sorted: forwarding binary-searches it"
        );
    }

    fn m(seq: u64, t: Nanos, pid: u32, iter: u64, event: MarkerEvent) -> Marker {
        Marker {
            seq,
            t_ns: t,
            pid,
            rank: Some(0),
            iter,
            event,
        }
    }

    #[test]
    fn iterations_are_bounded_by_steps_and_gaps_are_counted() {
        let mut log = MarkerLog::default();
        log.ingest(&m(0, 100, 7, 0, MarkerEvent::Begin("data".into())));
        log.ingest(&m(1, 150, 7, 0, MarkerEvent::End("data".into())));
        log.ingest(&m(2, 300, 7, 0, MarkerEvent::Step));
        // seq 3 and 4 lost
        log.ingest(&m(5, 500, 7, 1, MarkerEvent::Step));
        let p = &log.procs[&7];
        assert_eq!(p.iteration(0), Some((100, 300)));
        assert_eq!(p.iteration(1), Some((300, 500)));
        assert_eq!(p.iteration(2), None);
        assert_eq!(p.dropped, 2);
        assert_eq!(p.spans_within(120, 300)[0].begin, 120);
    }

    /// A data wait that named its worker keeps the name for that wait only, and forgets it
    /// with the wait.
    #[test]
    fn a_data_wait_keeps_the_worker_it_named_until_pruned() {
        let mut log = MarkerLog::default();
        log.ingest(&m(
            0,
            100,
            7,
            0,
            MarkerEvent::BeginWaiting("data".into(), 41),
        ));
        log.ingest(&m(1, 150, 7, 0, MarkerEvent::End("data".into())));
        log.ingest(&m(2, 200, 7, 0, MarkerEvent::Begin("data".into())));
        log.ingest(&m(3, 250, 7, 0, MarkerEvent::End("data".into())));
        log.ingest(&m(
            4,
            300,
            7,
            0,
            MarkerEvent::BeginWaiting("data".into(), 42),
        ));
        let p = log.procs.get_mut(&7).unwrap();
        assert_eq!(p.waited_for(100, 150), Some(41));
        assert_eq!(p.waited_for(120, 150), Some(41), "a clipped wait");
        assert_eq!(p.waited_for(200, 250), None, "this one named nobody");
        p.prune_before(200);
        assert_eq!(p.waits.keys().copied().collect::<Vec<_>>(), vec![300]);
    }

    /// Issue 17, item 7: a collective that straddles the step is the first of the next
    /// iteration for the peer matching as it is for the attribution's pieces.
    #[test]
    fn a_collective_straddling_the_step_counts_on_both_sides_alike() {
        let mut log = MarkerLog::default();
        let comm = || "comm".to_string();
        log.ingest(&m(0, 90, 7, 0, MarkerEvent::Begin(comm())));
        log.ingest(&m(1, 100, 7, 0, MarkerEvent::Step));
        log.ingest(&m(2, 110, 7, 1, MarkerEvent::End(comm())));
        log.ingest(&m(3, 150, 7, 1, MarkerEvent::Begin(comm())));
        log.ingest(&m(4, 160, 7, 1, MarkerEvent::End(comm())));
        log.ingest(&m(5, 200, 7, 1, MarkerEvent::Step));
        let p = &log.procs[&7];
        let (a, b) = p.iteration(1).unwrap();
        let pieces: Vec<Nanos> = p
            .spans_within(a, b)
            .into_iter()
            .filter(|s| s.phase == "comm")
            .map(|s| s.begin)
            .collect();
        assert_eq!(pieces, [100, 150]);
        assert_eq!(p.comm_begins(a, b), pieces);
    }

    #[test]
    fn gpu_times_are_kept_per_iteration_and_a_skipped_one_is_settled() {
        let mut log = MarkerLog::default();
        let meta = |seq, kv: &[(&str, &str)]| {
            let kv = kv.iter().map(|(k, v)| (k.to_string(), v.to_string()));
            m(seq, 1, 7, 0, MarkerEvent::Meta(kv.collect()))
        };
        log.ingest(&meta(0, &[("cuda_device", "0")]));
        assert!(log.procs[&7].gpu_timed());
        assert!(!log.procs[&7].gpu_settled(0), "times are expected");
        log.ingest(&meta(1, &[("gpu_iter", "1"), ("gpu_iter_us", "2500")]));
        log.ingest(&meta(
            2,
            &[
                ("gpu_iter", "3"),
                ("gpu_comm_us", "40"),
                ("gpu_data_us", "7"),
            ],
        ));
        let p = &log.procs[&7];
        assert_eq!(p.gpu[&1].iter_ns, Some(2_500_000));
        assert_eq!(p.gpu[&3].comm_ns, Some(40_000));
        assert_eq!(p.gpu[&3].data_idle_ns, Some(7_000));
        assert!(
            p.gpu_settled(2),
            "iteration 2's times were dropped by the hook"
        );
        assert!(!p.gpu_settled(4));
        assert!(
            !p.meta.contains_key("gpu_iter"),
            "not kept as the latest value"
        );
    }

    #[test]
    fn ranks_fill_in_for_loops_that_never_said() {
        let mut log = MarkerLog::default();
        let mut a = m(0, 1, 10, 0, MarkerEvent::Step);
        a.rank = None;
        let b = Marker {
            rank: Some(0),
            pid: 20,
            ..a.clone()
        };
        log.ingest(&a);
        log.ingest(&b);
        let r = log.ranks();
        assert_eq!(r[&20], 0);
        assert_eq!(r[&10], 1);
    }
}
