//! Frames: the unit of the profile file and of the agent→collector stream.
//!
//! A frame is a postcard-encoded [`Frame`]. Variants are only ever appended, never reordered
//! or changed, so an older profile stays readable; [`FORMAT_VERSION`] is bumped when a change
//! cannot be made that way, and readers refuse versions newer than theirs by name.

use serde::{Deserialize, Serialize};

use crate::attribution::IterationBreakdown;
use crate::gpu_usage::NvmlReading;
use crate::marker::Marker;
use crate::series::{SampleBatch, SeriesDecl};
use crate::Nanos;

/// Version of the frame encoding written by this build. 2: sample batches are written packed
/// into runs ([`Frame::SampleRun`]); readers of version 1 would skip every run as
/// undecodable, so they refuse the file by name instead. Version-1 files read as before.
pub const FORMAT_VERSION: u8 = 2;

/// What a run was.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunHeader {
    /// stallscope version that wrote it.
    pub stallscope_version: String,
    /// Host name of the node.
    pub host: String,
    /// The wrapped command, as given.
    pub command: Vec<String>,
    /// ns since the Unix epoch when the run began (wall clock, for humans).
    pub started_unix_ns: u64,
    /// ns, `CLOCK_MONOTONIC` when the run began.
    pub started_mono_ns: Nanos,
    /// Hz, fast sampling rate.
    pub rate_hz: f64,
    /// Iterations at the start of each rank left out of summaries (warm-up).
    pub warmup_iters: u32,
    /// Logical CPUs on the node.
    pub cpus: u32,
}

impl RunHeader {
    /// Whether a collector wrote it (`stallscope collector`, or the collector side of
    /// `stallscope collector-bench`): the profile is a job's, its host the collector's and its
    /// ranks on the agents' nodes.
    /// A training command whose second word is `collector` is not one.
    pub fn is_collectors(&self) -> bool {
        matches!(
            self.command.as_slice(),
            [stallscope, role, ..] if stallscope == "stallscope"
                && (role == "collector" || role == "collector-bench")
        )
    }
}

/// What role a process plays in the job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Role {
    /// Launches ranks (torchrun's agent, a shell) but trains nothing.
    Launcher,
    /// Runs a training loop: it sends step markers.
    Rank,
    /// A data-loader worker of a rank.
    Loader,
    /// Any other descendant of a rank.
    Helper,
}

/// A process of the job as discovered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInfo {
    /// Process id.
    pub pid: u32,
    /// Parent process id.
    pub ppid: u32,
    /// Executable name (`comm`).
    pub comm: String,
    /// Role in the job.
    pub role: Role,
    /// Global rank of the rank process it belongs to, when known.
    pub rank: Option<u32>,
    /// The rank process it belongs to (itself for a rank).
    pub rank_pid: Option<u32>,
    /// ns, when it was first seen.
    pub seen_ns: Nanos,
}

/// A source's state, reported when it changes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceStatus {
    /// Source name (`cpu`, `disk`, `net`, `psi`, …).
    pub source: String,
    /// Whether it delivers samples.
    pub up: bool,
    /// Why not, or what it reads.
    pub message: String,
}

/// How a run ended.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunEnd {
    /// ns, `CLOCK_MONOTONIC`.
    pub ended_mono_ns: Nanos,
    /// The command's exit code, or 128 + signal.
    pub exit_code: i32,
    /// Marker datagrams known lost (sequence gaps).
    pub markers_dropped: u64,
    /// Marker datagrams rejected as malformed.
    pub markers_rejected: u64,
}

/// A communication span (`comm` phase) of one iteration, ns on the node's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommSpan {
    /// ns, when the rank began waiting on the collective.
    pub begin: Nanos,
    /// ns, when the wait ended.
    pub end: Nanos,
}

/// One rank's iteration as attributed on its node, with what the cross-node join needs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeIteration {
    /// The node's name (set by the collector from the agent's handshake).
    pub node: String,
    /// The breakdown as the node attributed it (peer wait among the node's own ranks only),
    /// times on the node's clock.
    pub breakdown: IterationBreakdown,
    /// The `comm` spans that began in the iteration, in order, on the node's clock.
    pub comm: Vec<CommSpan>,
    /// World size the rank announced, when it did.
    pub world_size: Option<u32>,
}

/// One rank's attributed iteration with what its GPU did, as an agent of protocol 3 on ships
/// it ([`Frame::NodeIteration`] is what earlier agents sent, and what a node without NVIDIA
/// GPUs still could).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeReport {
    /// The iteration, as [`Frame::NodeIteration`] carries it.
    pub iteration: NodeIteration,
    /// The rank's GPU in the iteration; `None` on a rank without one.
    pub gpu: Option<NvmlReading>,
}

/// A node's clock against the collector's: `node_ns = collector_ns + offset_ns + drift`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeClock {
    /// The node's name.
    pub node: String,
    /// ns, the node's clock minus the collector's at `at_ns`.
    pub offset_ns: i64,
    /// ppm, how fast the offset grows (ns of offset per ms of collector time, × 1000).
    pub drift_ppm: f64,
    /// ns, on the collector's clock, where `offset_ns` holds.
    pub at_ns: Nanos,
    /// ns, half the round trip of the best exchanges: the offset is right within this.
    pub uncertainty_ns: u64,
    /// Exchanges the estimate rests on.
    pub samples: u32,
}

impl NodeClock {
    /// The collector's time of a node time, ns.
    pub fn to_collector(&self, node_ns: Nanos) -> Nanos {
        let approx = node_ns as i128 - self.offset_ns as i128;
        let drift = self.drift_ppm * 1e-6 * (approx - self.at_ns as i128) as f64;
        (approx - drift as i128).clamp(0, u64::MAX as i128) as Nanos
    }
}

/// What a node's agent lost or could not read, as of its last report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeHealth {
    /// The node's name.
    pub node: String,
    /// Records dropped from the agent's buffer while the collector was away.
    pub records_dropped: u64,
    /// Marker datagrams known lost on the node (sequence gaps).
    pub markers_dropped: u64,
    /// Marker datagrams rejected as malformed on the node.
    pub markers_rejected: u64,
    /// Sources down on the node.
    pub sources_down: Vec<SourceStatus>,
}

/// The GPUs of a node as NVML names them: what a dashboard labels a GPU's figures with
/// (dcgm-exporter's `modelName`). An agent ships it when it first knows its GPUs, when they
/// change, and now and then so that a restarted collector learns them again.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeGpus {
    /// The node (set by the collector from the agent's Hello).
    pub node: String,
    /// Its GPUs, by NVML index.
    pub gpus: Vec<GpuIdentity>,
}

/// One GPU's identity.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct GpuIdentity {
    /// NVML index (the `gpu` label of its series).
    pub gpu: String,
    /// `GPU-…`, when NVML gave it.
    pub uuid: Option<String>,
    /// Product name (`NVIDIA H100 80GB HBM3`), when NVML gave it.
    pub model: Option<String>,
}

/// The bytes a node's NICs moved, per interface, since its agent (or run) started counting:
/// what `stallscope_node_network_bytes_total{device}` exposes. An agent ships it with its
/// resources every 2 s.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeNics {
    /// The node (set by the collector from the agent's Hello).
    pub node: String,
    /// Its NICs (loopback left out), by name.
    pub nics: Vec<NicBytes>,
}

/// A node's counters since its agent started counting ([`crate::resources::NodeCounters`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeCountersReport {
    /// The node (set by the collector from the agent's Hello).
    pub node: String,
    /// The sums.
    pub counters: crate::resources::NodeCounters,
}

/// One NIC's bytes since counting started.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NicBytes {
    /// Interface name (`eth0`, `ib0`), node_exporter's `device`.
    pub iface: String,
    /// bytes received.
    pub rx_bytes: u64,
    /// bytes sent.
    pub tx_bytes: u64,
}

/// One record of the profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Frame {
    /// First frame of a profile.
    Header(RunHeader),
    /// A series is declared.
    Series(SeriesDecl),
    /// One round of samples.
    Samples(SampleBatch),
    /// Markers, in arrival order.
    Markers(Vec<Marker>),
    /// A process of the job was found (or its role or rank became known).
    Process(ProcessInfo),
    /// A process of the job was gone at this time.
    ProcessExit {
        /// Process id.
        pid: u32,
        /// ns, when it was noticed gone.
        t_ns: Nanos,
    },
    /// An iteration's attribution as computed live.
    Breakdown(IterationBreakdown),
    /// A source changed state.
    Source(SourceStatus),
    /// Last frame of a complete profile.
    End(RunEnd),
    /// A node's clock as the collector estimated it (multi-node job profiles).
    NodeClock(NodeClock),
    /// One rank's attributed iteration as its node's agent shipped it, in the agent's clock.
    NodeIteration(NodeIteration),
    /// What a node's agent lost or could not read.
    NodeHealth(NodeHealth),
    /// The result of `stallscope experiment`: the configurations run and the stalls by
    /// difference.
    Experiment(Box<crate::experiment::ExperimentReport>),
    /// One rank's attributed iteration and its GPU's readings, as its node's agent shipped
    /// them (agents of protocol 3 on).
    NodeReport(Box<NodeReport>),
    /// A node's resources over the last second (CPU, run queue, NICs, disks, PSI, GPUs), as its
    /// agent measured them (agents of protocol 4 on).
    NodeResources(Box<NodeResourcesReport>),
    /// Consecutive [`Frame::Samples`] packed (format 2 on): the profile writer makes them and
    /// the reader gives back the batches one [`Frame::Samples`] at a time, so nothing past
    /// the file sees this variant.
    SampleRun(Box<crate::sample_run::SampleRun>),
    /// A node's GPUs as NVML names them (agents of protocol 5 on; a run's own GPUs come from
    /// its series' labels). Last, so that profiles written before it still read.
    NodeGpus(NodeGpus),
    /// A node's bytes per NIC (agents of protocol 5 on). Last, so that profiles written
    /// before it still read.
    NodeNics(NodeNics),
    /// What a rank's process said of itself that the advisor reads (its batch, loader
    /// workers, DDP buckets), as its node's agent forwarded it (agents of protocol 7 on).
    /// Last, so that profiles written before it still read.
    NodeMeta(NodeMeta),
    /// What a node's counters moved since its agent started counting (agents of protocol 8
    /// on), shipped with its resources every 2 s. Last, so that profiles written before it
    /// still read.
    NodeCounters(NodeCountersReport),
    /// A node's RDMA bytes (agents of protocol 9 on), sent just before the
    /// [`Frame::NodeResources`] and [`Frame::NodeCounters`] it completes: postcard does not
    /// carry their RDMA fields (see `crate::resources`). Last, so that profiles written before
    /// it still read.
    NodeRdma(NodeRdma),
    /// A hang declared by `stallscope run` (no rank finished an iteration for `--hang-after`):
    /// where each rank stood and their stacks; written again, with `resumed_after_seconds`,
    /// when iterations resume. Last, so that profiles written before it still read.
    Hang(Box<crate::hang::HangReport>),
    /// What changed about a node's TCP flows (bytes, retransmissions, class) since its last
    /// one, from the flow source (sock_diag) every half second. Last, so that profiles
    /// written before it still read.
    NodeFlows(crate::flows::NodeFlows),
    /// Written once after the header of a run profile whose raw samples were kept only around
    /// what matters (`crate::journal::retention`): its [`Frame::Breakdown`]s are the
    /// attribution, since the samples that made them are mostly gone. Last, so that profiles
    /// written before it still read.
    SamplesThinned(SamplesThinned),
    /// Consecutive frames other than samples (markers, breakdowns, readings: about a
    /// second's), each as a u32-LE length and its payload, deflated together: the profile
    /// writer packs them (`ProfileWriter::deflating`) and the reader gives the frames back, so
    /// nothing past the file sees this variant. Last, so that profiles written before it
    /// still read.
    Deflated(Vec<u8>),
    /// A node's answer when the collector asked where its ranks stand (agents of protocol 10
    /// on): the collector folds the answers into one [`Frame::Hang`]. Last, so that profiles
    /// written before it still read.
    NodeHang(Box<crate::hang::NodeHang>),
    /// Consecutive [`Frame::Markers`] and [`Frame::Breakdown`]s packed column by column,
    /// times as deltas (`crate::journal::packing` makes them in front of a run's profile
    /// writer): the reader gives the frames back one at a time, so nothing past the file sees
    /// this variant. Last, so that profiles written before it still read.
    IterationPack(Box<crate::iteration_pack::IterationPack>),
    /// The live run's totals of every iteration it attributed so far, written by a run whose
    /// per-iteration frames were thinned (`crate::journal::thinning`): a reader of a thinned
    /// profile takes them in place of its own, so its summary gives the live run's figures.
    /// Last, so that profiles written before it still read.
    IterationTotals(Box<IterationTotals>),
}

/// What the summary needs of every iteration a run attributed up to a moment
/// ([`Frame::IterationTotals`]): a reader takes it in place of what it folded itself, and
/// folds only the iterations after `progress` on top.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct IterationTotals {
    /// Per loop (its pid): the first iteration not in these totals.
    pub progress: Vec<(u32, u64)>,
    /// The sums, medians and critical path ([`crate::aggregate`]).
    pub totals: crate::aggregate::RunningSummary,
    /// Per (rank, pid): its communication operations.
    pub comm: Vec<((u32, u32), crate::collectives::CommTotals)>,
    /// The slowdowns found, in the order found.
    pub slowdowns: Vec<crate::slowdown::Slowdown>,
    /// Marker datagrams known lost (sequence gaps; a reader sees the iterations left out as
    /// gaps too).
    pub markers_dropped: u64,
}

/// What a run profile's sample flight recorder kept ([`Frame::SamplesThinned`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SamplesThinned {
    /// ns, how much of the samples the ring held in memory: the window kept before a moment
    /// that matters, and the first and last stretch of the run kept whole.
    pub window_ns: Nanos,
}

/// What a node's RDMA ports moved, for the reading that follows (same node, same `t_ns`) and
/// the node's counters.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeRdma {
    /// The node (set by the collector from the agent's Hello).
    pub node: String,
    /// ns, the start of the reading it completes ([`NodeResources::t_ns`](crate::resources::NodeResources::t_ns), the agent's clock shifted as that reading's).
    pub t_ns: Nanos,
    /// bytes/s received over that reading.
    pub rx_bytes_per_s: Option<f64>,
    /// bytes/s sent over that reading.
    pub tx_bytes_per_s: Option<f64>,
    /// bytes received since the agent started counting.
    pub rx_bytes: Option<f64>,
    /// bytes sent since the agent started counting.
    pub tx_bytes: Option<f64>,
    /// Each port's wait, congestion and retransmission counters since the agent started
    /// counting.
    pub counters: Vec<RdmaCount>,
}

/// What one counter of an RDMA port moved since its agent or run started counting.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RdmaCount {
    /// The RDMA device (`mlx5_0`, `efa_0`).
    pub device: String,
    /// The port number.
    pub port: String,
    /// The sysfs file: `port_xmit_wait` (ticks), a `*_bytes` one (bytes), else events.
    pub counter: String,
    /// Its increases since the first read.
    pub value: u64,
}

impl NodeRdma {
    /// Puts the rates into `r` when it is the reading this one goes with.
    pub fn complete_reading(&self, r: &mut crate::resources::NodeResources) {
        if r.t_ns == self.t_ns {
            r.rdma_rx_bytes_per_s = self.rx_bytes_per_s;
            r.rdma_tx_bytes_per_s = self.tx_bytes_per_s;
        }
    }

    /// Puts the totals into `c`.
    pub fn complete_counters(&self, c: &mut crate::resources::NodeCounters) {
        c.rdma_rx_bytes = self.rx_bytes;
        c.rdma_tx_bytes = self.tx_bytes;
    }
}

/// A rank's `key=value` facts (the PyTorch hook's `M` events) of the keys in
/// [`NodeMeta::KEYS`], the latest value of each, as its node's agent forwards them to the
/// collector when they change: a job profile then holds what `stallscope advise` needs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeMeta {
    /// The node (set by the collector from the agent's Hello).
    pub node: String,
    /// Process id on the node.
    pub pid: u32,
    /// Global rank, when the process said it.
    pub rank: Option<u32>,
    /// Key and latest value, in key order.
    pub fields: Vec<(String, String)>,
}

impl NodeMeta {
    /// The keys an agent forwards: what the advisor reads of a rank (the one list, kept
    /// beside the one parser of the hook's facts).
    pub const KEYS: &'static [&'static str] = crate::loops::ProcessMeta::ADVISOR_KEYS;

    /// Whether `key` is one an agent forwards.
    pub fn forwards(key: &str) -> bool {
        Self::KEYS.binary_search(&key).is_ok()
    }
}

/// A node's resources as its agent measured them, in the agent's clock.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeResourcesReport {
    /// The node (set by the collector from the agent's Hello).
    pub node: String,
    /// What the agent's meter read over its last bucket.
    pub resources: crate::resources::NodeResources,
}

impl Frame {
    /// The rank's iteration a node's agent shipped, in either of the frames that carry one.
    pub fn node_iteration(&self) -> Option<&NodeIteration> {
        match self {
            Frame::NodeIteration(it) => Some(it),
            Frame::NodeReport(r) => Some(&r.iteration),
            _ => None,
        }
    }

    /// Encodes with postcard.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("frames always encode")
    }

    /// Decodes a postcard payload.
    pub fn decode(bytes: &[u8]) -> Result<Frame, postcard::Error> {
        postcard::from_bytes(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::{NodeMeta, RunHeader};

    /// A collector's host is not one of the job's nodes: the benchmark's collector side is a
    /// collector too (its `top` counted the benchmark's host as a 1,251st node of 1,250).
    #[test]
    fn a_collectors_profile_is_told_by_its_command() {
        let header = |command: &[&str]| RunHeader {
            command: command.iter().map(|c| c.to_string()).collect(),
            ..RunHeader::default()
        };
        assert!(header(&["stallscope", "collector", "--listen", ":7070"]).is_collectors());
        assert!(header(&["stallscope", "collector-bench"]).is_collectors());
        assert!(!header(&["stallscope", "run", "--", "python3", "collector"]).is_collectors());
        assert!(!header(&["python3", "collector"]).is_collectors());
        assert!(!header(&[]).is_collectors());
    }

    #[test]
    fn the_forwarded_keys_are_sorted_so_each_is_found() {
        let mut sorted = NodeMeta::KEYS.to_vec();
        sorted.sort_unstable();
        assert_eq!(sorted, NodeMeta::KEYS);
        for key in NodeMeta::KEYS {
            assert!(NodeMeta::forwards(key), "{key}");
        }
        assert!(!NodeMeta::forwards("role"));
    }
}
