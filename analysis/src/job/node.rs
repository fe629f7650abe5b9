//! One node's timeline: the samples, markers and processes of the ranks this process
//! samples, and the attribution of their iterations. Each loop's progress is a typed
//! [`RankProgress`]; when an iteration may be attributed is the [`Readiness`] policy's call.

use std::collections::{BTreeMap, HashMap};

use crate::attribution::{
    attribute, comm_span_times, CudaIteration, IterationBreakdown, IterationInput, Links,
    RankSeries, ThreadSeries,
};
use crate::category::Category;
use crate::collectives::OpTime;
use crate::frame::{Frame, ProcessInfo, SourceStatus};
use crate::gpu_usage::NvmlReading;
use crate::loops::{MarkerLog, ProcessMarks, Span};
use crate::marker::{phase, CommOp, Direction};
use crate::process::ancestors;
use crate::series::{names, SeriesId, LINK_LOOPBACK, LINK_NIC};
use crate::timeline::SeriesStore;
use crate::Nanos;

use super::readiness::{Readiness, Seen};

/// Where one training loop (a rank's process) stands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RankProgress {
    /// The next iteration to attribute.
    pub next_iter: u64,
}

/// One attributed iteration and what its GPU did in it, when the rank runs on one.
pub struct Attributed {
    /// The breakdown.
    pub breakdown: IterationBreakdown,
    /// NVML's readings over the iteration.
    pub gpu: Option<NvmlReading>,
    /// Each `comm` span's share of it, in the order they began.
    pub comm: Vec<OpTime>,
}

/// Everything known about the ranks of this node.
#[derive(Debug, Default)]
pub struct NodeTimeline {
    /// Series and samples.
    pub series: SeriesStore,
    /// Markers per process.
    pub markers: MarkerLog,
    /// Processes of the job, by pid (latest record).
    pub processes: BTreeMap<u32, ProcessInfo>,
    /// Pids seen gone, with when (ns): kept until [`NodeTimeline::prune`] forgets them.
    pub exited: BTreeMap<u32, Nanos>,
    /// Latest state per source.
    pub sources: BTreeMap<String, SourceStatus>,
    /// Progress per loop pid.
    pub(super) progress: BTreeMap<u32, RankProgress>,
    /// What the GPU did in each iteration of the last attribution round, by (rank,
    /// iteration): what an agent ships with the iteration. Cleared every round.
    round_gpu: HashMap<(u32, u64), NvmlReading>,
    /// A profile whose samples were thinned ([`Frame::SamplesThinned`]): the breakdowns it
    /// wrote, by (pid, iteration), taken as the attribution instead of re-attributing from
    /// the samples left; an iteration is ready once its breakdown is here.
    given: Option<HashMap<(u32, u64), IterationBreakdown>>,
}

impl NodeTimeline {
    /// Takes one of the node's frames (samples, markers, processes, sources); others are not
    /// the node's.
    pub fn ingest(&mut self, frame: &Frame) {
        match frame {
            Frame::Series(d) => self.series.declare(d.clone()),
            Frame::Samples(b) => self.series.ingest(b),
            Frame::Markers(ms) => ms.iter().for_each(|m| self.markers.ingest(m)),
            Frame::Process(p) => {
                self.exited.remove(&p.pid);
                self.processes.insert(p.pid, p.clone());
            }
            Frame::ProcessExit { pid, t_ns } => {
                self.exited.insert(*pid, *t_ns);
            }
            Frame::Source(s) => {
                self.sources.insert(s.source.clone(), s.clone());
            }
            Frame::SamplesThinned(_) => {
                self.given.get_or_insert_with(HashMap::new);
            }
            Frame::Breakdown(b) => {
                if let Some(given) = self.given.as_mut() {
                    given.insert((b.pid, b.iter), b.clone());
                }
            }
            _ => {}
        }
    }

    /// Whether a breakdown read is taken as the attribution ([`Frame::SamplesThinned`]).
    pub fn takes_breakdowns_as_written(&self) -> bool {
        self.given.is_some()
    }

    /// Per loop (its pid): the next iteration to attribute.
    pub fn progress_all(&self) -> Vec<(u32, u64)> {
        self.progress
            .iter()
            .map(|(pid, p)| (*pid, p.next_iter))
            .collect()
    }

    /// Where loop `pid` stands.
    pub fn progress(&self, pid: u32) -> RankProgress {
        self.progress.get(&pid).copied().unwrap_or_default()
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
            pid,
            cpu: self.series.find(names::PROC_CPU_NS, &label),
            runq: self.series.find(names::PROC_RUNQ_NS, &label),
            blocked: self.series.find(names::PROC_BLOCKED_IO, &label),
            others: [
                self.series.find(names::PROC_THREADS_CPU_NS, &label),
                self.series.find(names::PROC_THREADS_RUNQ_NS, &label),
                self.series.find(names::PROC_THREADS_BLOCKED_IO, &label),
            ],
            read_bytes: self.series.find(names::PROC_READ_BYTES, &label),
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
        // With the flow source, the network is only the job's own collective flows: another
        // transfer on the same NIC (a checkpoint upload, another tenant) did not carry them.
        let collective_nic: Vec<SeriesId> = [names::FLOW_RX_BYTES, names::FLOW_TX_BYTES]
            .into_iter()
            .flat_map(|name| self.series.named(name))
            .filter(|d| d.label("class") == Some("collective") && d.label("link") == Some(LINK_NIC))
            .map(|d| d.id)
            .collect();
        if self.series.named(names::FLOW_RX_BYTES).next().is_some() {
            links.nic = collective_nic;
        }
        // What the loader workers' own sockets received: a dataset read over the network.
        links.data_rx = self
            .series
            .named(names::FLOW_RX_BYTES)
            .filter(|d| d.label("class") == Some("data"))
            .map(|d| d.id)
            .collect();
        // RDMA ports are NICs whose bytes the kernel's interface table never sees.
        for name in [names::RDMA_RX_BYTES, names::RDMA_TX_BYTES] {
            links.nic.extend(self.series.named(name).map(|d| d.id));
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
        match self.peers_on_other_nodes() {
            // Every rank is here: the collectives never leave the node, so whatever the NICs
            // carried (an ssh session, a dataset read over NFS, metrics) is not theirs.
            Some(false) => {
                links.nic.clear();
                links.nic_bytes_per_s = 0.0;
                links.comm_fallback = Category::Interconnect;
            }
            // Peers elsewhere: exposed communication with no bytes seen is the network's.
            Some(true) => links.comm_fallback = Category::Network,
            None => {}
        }
        links
    }

    /// Whether the job's collectives reach ranks on other nodes: its world size (what the
    /// loops said) against the ranks on this node (torchrun's `LOCAL_WORLD_SIZE` as the
    /// loops said it, else the loops here); `None` when no loop said its world size.
    pub fn peers_on_other_nodes(&self) -> Option<bool> {
        let world = self
            .markers
            .loops()
            .filter_map(|m| m.info().world_size)
            .max()?;
        let local = self
            .markers
            .loops()
            .filter_map(|m| m.info().local_world_size)
            .max()
            .unwrap_or_else(|| self.markers.loops().count() as u32);
        Some(world > local)
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

    /// For each comm span of iteration `iter` of `pid` (`comm`, in the order they began):
    /// when the last rank began the same operation, ns, or `None` for one no other rank was
    /// seen in. An operation the hook named ([`CommOp`]) is matched by its identity: a
    /// collective by (group, op, seq) among every other loop, a send or receive by the peer's
    /// receive or send of the same number to or from this rank (a receiver waits for its
    /// sender to begin; a sender, with gloo, for its receiver). The others (DDP's exposed
    /// all-reduce, `stallscope.phase("comm")`) are matched by position among the peers'
    /// unnamed comm spans of the same iteration.
    fn peer_arrivals(&self, pid: u32, iter: u64, spans: &[Span]) -> Vec<Option<Nanos>> {
        let ranks = self.markers.ranks();
        let others: Vec<&ProcessMarks> = self.markers.loops().filter(|q| q.pid != pid).collect();
        let unnamed: Vec<Vec<Nanos>> = others
            .iter()
            .filter_map(|q| q.iteration(iter).map(|(a, b)| q.comm_spans(a, b)))
            .map(|v| {
                v.into_iter()
                    .filter(|s| s.op.is_none())
                    .map(|s| s.begin)
                    .collect()
            })
            .collect();
        let mut k = 0;
        spans
            .iter()
            .map(|span| {
                let latest = match &span.op {
                    Some(op) => match (op.peer, op.direction(), ranks.get(&pid)) {
                        (Some(peer), Some(direction), Some(&own)) => {
                            p2p_arrival(&others, &ranks, op, (own, peer), direction)
                        }
                        _ => others
                            .iter()
                            .filter_map(|q| q.op_begin(|o| same(o, op)))
                            .max(),
                    },
                    None => {
                        k += 1;
                        unnamed.iter().filter_map(|o| o.get(k - 1)).max().copied()
                    }
                };
                latest.map(|l| l.max(span.begin))
            })
            .collect()
    }

    /// What rank `rank`'s GPU did in iteration `iter`, when the last attribution round
    /// attributed it and the rank runs on a GPU NVML reads.
    pub fn gpu_reading(&self, rank: u32, iter: u64) -> Option<&NvmlReading> {
        self.round_gpu.get(&(rank, iter))
    }

    /// Attributes every iteration of this node's loops that `readiness` says is ready at
    /// `now` (ns, the node clock); with `finishing`, every one whose bounds are known.
    pub fn attribute_ready(
        &mut self,
        now: Nanos,
        finishing: bool,
        readiness: &Readiness,
    ) -> Vec<Attributed> {
        let ranks = self.markers.ranks();
        let links = self.links();
        self.round_gpu.clear();
        let mut out = Vec::new();
        for (pid, rank) in &ranks {
            let Some(marks) = self.markers.procs.get(pid) else {
                continue;
            };
            let mut iter = self.progress(*pid).next_iter;
            let last = marks.steps.keys().next_back().copied();
            let gpu_watermark = last
                .is_some_and(|l| iter <= l)
                .then(|| self.gpu_watermark(*pid))
                .flatten();
            while last.is_some_and(|l| iter <= l) {
                let Some((start, end)) = marks.iteration(iter) else {
                    // A lost step: this iteration's bounds are unknown. Go straight to the next
                    // step the loop sent rather than through every number in between (a step
                    // of iteration 10^15 would take days, one number at a time).
                    match marks.steps.range(iter + 1..).next() {
                        Some((&next, _)) => iter = next,
                        None => break,
                    }
                    continue;
                };
                let seen = Seen {
                    watermark: self.series.watermark(),
                    markers: &self.markers,
                    exited: &self.exited,
                    gpu_watermark,
                };
                let given = self.given.as_mut().map(|g| g.remove(&(*pid, iter)));
                let ready = match &given {
                    Some(b) => b.is_some() || finishing,
                    None => readiness.is_ready(seen, *pid, iter, end, now, finishing),
                };
                if !ready {
                    break;
                }
                let done =
                    self.attribute_one(*rank, *pid, iter, (start, end), &links, given.flatten());
                if let Some(g) = &done.gpu {
                    self.round_gpu.insert((*rank, iter), g.clone());
                }
                out.push(done);
                iter += 1;
            }
            self.progress.insert(*pid, RankProgress { next_iter: iter });
        }
        out
    }

    /// ns, the newest fast-tier sample of loop `pid`'s GPU (0 before the first): `None`
    /// when it has none declared or the GPU source is down (nothing more will come).
    fn gpu_watermark(&self, pid: u32) -> Option<Nanos> {
        if self.sources.get(GPU_FAST_SOURCE).is_some_and(|s| !s.up) {
            return None;
        }
        let gpu = self.gpu_of(pid)?;
        let fast = [
            names::GPU_PCIE_RX_BYTES,
            names::GPU_PCIE_TX_BYTES,
            names::GPU_NVLINK_RX_BYTES,
            names::GPU_NVLINK_TX_BYTES,
            names::GPU_ENERGY_MJ,
            names::GPU_POWER_MW,
        ];
        let decls: Vec<_> = fast
            .into_iter()
            .filter_map(|n| self.series.on_gpu(n, &gpu))
            .collect();
        if decls.is_empty() {
            return None;
        }
        Some(
            decls
                .iter()
                .filter_map(|d| self.series.latest(d.id))
                .max()
                .unwrap_or(0),
        )
    }

    /// Attributes iteration `iter` of loop `pid` (rank `rank`), spanning `(start, end)` ns;
    /// `given`: its breakdown as a thinned profile wrote it, taken as it is.
    fn attribute_one(
        &self,
        rank: u32,
        pid: u32,
        iter: u64,
        (start, end): (Nanos, Nanos),
        links: &Links,
        given: Option<IterationBreakdown>,
    ) -> Attributed {
        let marks = &self.markers.procs[&pid];
        let comm = marks.comm_spans(start, end);
        let spans = marks.spans_within(start, end);
        let waits = spans
            .iter()
            .filter(|s| s.phase == phase::DATA)
            .filter_map(|s| Some((s.begin, s.end, marks.waited_for(s.begin, s.end)?)))
            .collect();
        let input = IterationInput {
            rank,
            pid,
            iter,
            start,
            end,
            spans,
            peer_arrivals: self.peer_arrivals(pid, iter, &comm),
            gpu: self.gpu_iteration(pid, iter),
            waits,
        };
        let gpu_index = self.gpu_of(pid);
        let rank_series = RankSeries {
            main: self.thread_series(pid),
            loaders: self
                .loader_pids(pid)
                .into_iter()
                .map(|p| self.thread_series(p))
                .collect(),
            gpu: gpu_index.as_deref().map(|g| self.gpu_series(pid, g)),
        };
        let breakdown =
            given.unwrap_or_else(|| attribute(&input, &self.series, &rank_series, links));
        let comm = comm
            .iter()
            .zip(comm_span_times(&input))
            .map(|(span, t)| OpTime {
                op: span.op.as_ref().map(|o| o.op.clone()),
                group: span.op.as_ref().map(|o| o.group),
                ended_here: span.end < end,
                bytes: span.op.as_ref().map_or(0, |o| o.bytes),
                exposed_ns: t.exposed_ns,
                waited_ns: t.waited_ns,
            })
            .collect();
        let gpu = match gpu_index {
            Some(gpu) => Some(NvmlReading::read(
                &self.series,
                &gpu,
                (start, end),
                input.gpu.is_some(),
                marks.info().batch_bytes,
            )),
            // A CUDA loop on a node whose NVML gave no GPU (no driver library, no device it
            // can open): the iteration still says it ran on a GPU, with no reading, so that
            // the summary can say in words what is not measured.
            None if marks.gpu_timed() => Some(NvmlReading::unmeasured(
                marks.meta.get("cuda_device").map(String::as_str),
                input.gpu.is_some(),
                marks.info().batch_bytes,
            )),
            None => None,
        };
        Attributed {
            breakdown,
            gpu,
            comm,
        }
    }

    /// Forgets samples and marks that no unattributed iteration can need any more, and the
    /// processes gone whose iterations are all attributed (see [`super::forget`]).
    pub fn prune(&mut self) {
        let keep_from = self.keep_from();
        if let Some(t) = keep_from {
            self.series.prune_before(t);
            for m in self.markers.procs.values_mut() {
                m.prune_before(t);
            }
        }
        self.forget_gone(keep_from);
    }

    /// How much the timeline holds, for tests and benchmarks of its memory.
    pub fn held(&self) -> Held {
        let (series, samples) = self.series.held();
        let procs = self.markers.procs.values();
        Held {
            marked_procs: self.markers.procs.len(),
            spans: procs.clone().map(|p| p.spans.len()).sum(),
            steps: procs.map(|p| p.steps.len() + p.gpu.len()).sum(),
            processes: self.processes.len() + self.exited.len() + self.progress.len(),
            series,
            samples,
        }
    }
}

/// The GPU's fast-tier source, as the agent names it in its [`SourceStatus`].
const GPU_FAST_SOURCE: &str = "gpu";

/// How much a [`NodeTimeline`] holds (counts, not bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// Processes with marks.
    pub marked_procs: usize,
    /// Closed phases kept.
    pub spans: usize,
    /// Steps and per-iteration GPU times kept.
    pub steps: usize,
    /// Process records, exits and loop progress entries.
    pub processes: usize,
    /// Series declared.
    pub series: usize,
    /// Samples over all series.
    pub samples: usize,
}

/// Whether `a` and `b` are the same collective: same op, group and number.
fn same(a: &CommOp, b: &CommOp) -> bool {
    a.peer.is_none() && a.op == b.op && a.group == b.group && a.seq == b.seq
}

/// ns, when rank `peer` began its end of rank `own`'s point-to-point operation `op` (its
/// receive of our send, or its send of our receive, of the same number), when kept.
fn p2p_arrival(
    others: &[&ProcessMarks],
    ranks: &BTreeMap<u32, u32>,
    op: &CommOp,
    (own, peer): (u32, u32),
    direction: Direction,
) -> Option<Nanos> {
    let q = others.iter().find(|q| ranks.get(&q.pid) == Some(&peer))?;
    q.op_begin(|o| {
        o.peer == Some(own) && o.seq == op.seq && o.direction().is_some_and(|d| d != direction)
    })
}
