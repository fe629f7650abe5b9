//! What attribution is given: the iteration's bounds and phases, the series of the rank's
//! threads and GPU, and the node's links with their peak rates.

use crate::category::Category;
use crate::loops::Span;
use crate::series::SeriesId;
use crate::Nanos;

use super::gpu_timeline::CudaIteration;

/// Byte rate below which a link is taken as quiet, bytes/s: background chatter (ssh, DNS,
/// package downloads) must not turn idle time into "network".
pub const QUIET_LINK_BYTES_PER_S: f64 = 100_000.0;

/// Loader CPU below which the loader is taken as idle, cores.
pub const IDLE_LOADER_CORES: f64 = 0.1;

/// The series of one process: its main thread's, and a loader worker's other threads'.
#[derive(Clone, Copy, Debug, Default)]
pub struct ThreadSeries {
    /// The process.
    pub pid: u32,
    /// `proc.main.cpu_ns`.
    pub cpu: Option<SeriesId>,
    /// `proc.main.runq_ns`.
    pub runq: Option<SeriesId>,
    /// `proc.main.blocked_io`.
    pub blocked: Option<SeriesId>,
    /// A loader worker's other threads: `proc.threads.cpu_ns`, `proc.threads.runq_ns`,
    /// `proc.threads.blocked_io` (absent for loops, and for workers with one thread).
    pub others: [Option<SeriesId>; 3],
    /// `proc.read_bytes`: bytes the whole process caused to be read from storage (slow tier).
    pub read_bytes: Option<SeriesId>,
}

/// The series of the GPU a rank drives.
#[derive(Clone, Debug, Default)]
pub struct GpuSeries {
    /// %, gauge: `gpu.util_pct` of the device, or `gpu.proc.sm_pct` of the rank's process when
    /// the device-level one is missing.
    pub busy_pct: Option<SeriesId>,
    /// bytes, counter: `gpu.pcie.rx_bytes` (host-to-device copies and peer traffic in).
    pub pcie_rx: Option<SeriesId>,
    /// bytes, counter: `gpu.pcie.tx_bytes`.
    pub pcie_tx: Option<SeriesId>,
    /// bytes, counters: `gpu.nvlink.rx_bytes` and `gpu.nvlink.tx_bytes`.
    pub nvlink: Vec<SeriesId>,
}

/// The series that speak for one rank.
#[derive(Clone, Debug, Default)]
pub struct RankSeries {
    /// The training loop's process.
    pub main: ThreadSeries,
    /// Its data-loader workers; empty when it loads in the loop (0 workers).
    pub loaders: Vec<ThreadSeries>,
    /// The GPU it drives, when the node has NVML and the rank was mapped to a device.
    pub gpu: Option<GpuSeries>,
}

/// The node's links.
#[derive(Clone, Debug, Default)]
pub struct Links {
    /// `net.rx_bytes`/`net.tx_bytes` of network interfaces, and `rdma.rx_bytes`/`rdma.tx_bytes`
    /// of RDMA ports (whose bytes the interfaces' counters never see).
    pub nic: Vec<SeriesId>,
    /// The same for loopback.
    pub local: Vec<SeriesId>,
    /// bytes/s, the highest NIC rate seen (0 when unknown).
    pub nic_bytes_per_s: f64,
    /// bytes/s, the highest loopback rate seen (0 when unknown).
    pub local_bytes_per_s: f64,
    /// Where exposed communication goes when no bytes were seen on any link.
    pub comm_fallback: Category,
    /// bytes/s, the highest NVLink rate (rx + tx) seen on one GPU (0 when unknown).
    pub nvlink_bytes_per_s: f64,
    /// bytes/s, the highest PCIe rate (rx + tx) seen on one GPU (0 when unknown).
    pub pcie_bytes_per_s: f64,
    /// bytes, counters: `flow.rx_bytes{class="data"}` of every link, what the data-loader
    /// workers' own sockets received (empty without the flow source).
    pub data_rx: Vec<SeriesId>,
}

/// One iteration to attribute.
#[derive(Clone, Debug)]
pub struct IterationInput {
    /// Global rank.
    pub rank: u32,
    /// The loop's process.
    pub pid: u32,
    /// Iteration index.
    pub iter: u64,
    /// ns.
    pub start: Nanos,
    /// ns.
    pub end: Nanos,
    /// The loop's phases, clipped to `[start, end]`.
    pub spans: Vec<Span>,
    /// For each `comm` span beginning in this iteration (in order): when the last rank began
    /// the same collective, ns, if other ranks were seen.
    pub peer_arrivals: Vec<Option<Nanos>>,
    /// What the rank's GPU saw of the iteration (CUDA events), when it was timed.
    pub gpu: Option<CudaIteration>,
    /// The `data` phases (clipped like `spans`, ns) in which the loop said which process it
    /// waited for (the DataLoader worker whose batch was next), with that process's pid.
    pub waits: Vec<(Nanos, Nanos, u32)>,
}
