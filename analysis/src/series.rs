//! Series and raw samples: what sources produce.
//!
//! A series is declared once (name, unit, counter or gauge, labels); samples then carry the
//! series id and the raw value as read. Counters stay cumulative: rates are derived from two
//! raw samples in one place ([`crate::timeline`]), never stored pre-derived, so a replayed
//! profile re-derives everything through the same code.

use serde::{Deserialize, Serialize};

use crate::Nanos;

/// Names a declared series inside one run (or one agent).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SeriesId(pub u32);

/// How a series' values behave.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SeriesKind {
    /// Monotonic cumulative total; the increase between two samples is what happened.
    Counter,
    /// An instantaneous level, read at the sample time.
    Gauge,
}

/// A series as declared by its source.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeriesDecl {
    /// Id used by samples.
    pub id: SeriesId,
    /// Dotted name, one of [`names`] for series the attribution reads.
    pub name: String,
    /// Base unit: `ns`, `us`, `bytes`, `count`, `threads`.
    pub unit: String,
    /// Counter or gauge.
    pub kind: SeriesKind,
    /// Labels such as `pid`, `iface`, `device`, `resource`.
    pub labels: Vec<(String, String)>,
}

impl SeriesDecl {
    /// The value of label `key`, if present.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// One round of reads: every value read in the window `[t_ns, t_ns + dur_ns)`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleBatch {
    /// ns, when the reads began.
    pub t_ns: Nanos,
    /// ns, how long the reads took.
    pub dur_ns: u32,
    /// Raw values by series.
    pub values: Vec<(SeriesId, u64)>,
}

impl SampleBatch {
    /// The instant the batch stands for: the middle of its read window, ns.
    pub fn at(&self) -> Nanos {
        self.t_ns + self.dur_ns as u64 / 2
    }
}

/// Names of the series the attribution reads. Label `pid` on process series, `iface` (and
/// `link` = `loopback` or `nic`) on network series.
pub mod names {
    /// ns, counter: CPU time of a process's main thread (`schedstat` field 1).
    pub const PROC_CPU_NS: &str = "proc.main.cpu_ns";
    /// ns, counter: run-queue delay of a process's main thread (`schedstat` field 2).
    pub const PROC_RUNQ_NS: &str = "proc.main.runq_ns";
    /// threads, gauge: 1 when the main thread was in state D (uninterruptible, usually I/O).
    pub const PROC_BLOCKED_IO: &str = "proc.main.blocked_io";
    /// ns, counter: CPU time of a loader worker's threads other than its main thread, as
    /// read (`schedstat` field 1 of each; a thread's last moments before it exits are lost).
    pub const PROC_THREADS_CPU_NS: &str = "proc.threads.cpu_ns";
    /// ns, counter: run-queue delay of the same threads (`schedstat` field 2).
    pub const PROC_THREADS_RUNQ_NS: &str = "proc.threads.runq_ns";
    /// threads, gauge: how many of the same threads were in state D.
    pub const PROC_THREADS_BLOCKED_IO: &str = "proc.threads.blocked_io";
    /// ns, counter: CPU time of all threads of a process, live and exited (`stat` utime+stime).
    pub const PROC_ALL_CPU_NS: &str = "proc.cpu_ns";
    /// bytes, counter: bytes a process caused to be read from storage (`io` read_bytes).
    pub const PROC_READ_BYTES: &str = "proc.read_bytes";
    /// bytes, counter: received on an interface.
    pub const NET_RX_BYTES: &str = "net.rx_bytes";
    /// bytes, counter: sent on an interface.
    pub const NET_TX_BYTES: &str = "net.tx_bytes";
    /// bytes, counter: received on an RDMA port (InfiniBand, RoCE, EFA), labels `device` and
    /// `port`: `counters/port_rcv_data` × 4, or EFA's `hw_counters/rx_bytes`. The attribution
    /// counts them as NIC bytes.
    pub const RDMA_RX_BYTES: &str = "rdma.rx_bytes";
    /// bytes, counter: sent on an RDMA port (`port_xmit_data` × 4, or EFA's `tx_bytes`).
    pub const RDMA_TX_BYTES: &str = "rdma.tx_bytes";
    /// ticks, counter: `counters/port_xmit_wait`, ticks in which the port had data to send and
    /// could not (no flow-control credits: congestion downstream); the tick length is the
    /// hardware's.
    pub const RDMA_XMIT_WAIT: &str = "rdma.xmit_wait";
    /// count or bytes (the series' unit), counter: one congestion or retransmission counter of
    /// an RDMA port, label `counter` = its sysfs file name (`np_cnp_sent`, `retrans_pkts`, …).
    pub const RDMA_COUNTER: &str = "rdma.counter";
    /// bytes, counter: received on the node's TCP flows of one class (label `class`:
    /// `collective`, `data`, `control`, `other`) and link (label `link`), from the flow source
    /// (sock_diag). With them, the attribution's network bytes are the collective ones.
    pub const FLOW_RX_BYTES: &str = "flow.rx_bytes";
    /// bytes, counter: sent (acknowledged) on them.
    pub const FLOW_TX_BYTES: &str = "flow.tx_bytes";
    /// segments, counter: retransmitted on the node's TCP flows of one class (label `class`).
    pub const FLOW_RETRANSMITS: &str = "flow.retransmits";
    /// bytes, counter: read from a block device (`diskstats` sectors × 512).
    pub const DISK_READ_BYTES: &str = "disk.read_bytes";
    /// bytes, counter: written to a block device.
    pub const DISK_WRITE_BYTES: &str = "disk.write_bytes";
    /// ms, counter: time the device had I/O in flight (`diskstats` field 10).
    pub const DISK_BUSY_MS: &str = "disk.busy_ms";
    /// us, counter: PSI `some` total for label `resource` (cpu, io, memory).
    pub const PSI_SOME_US: &str = "psi.some_us";
    /// us, counter: PSI `full` total.
    pub const PSI_FULL_US: &str = "psi.full_us";

    // GPU series (NVML), labels `gpu` (NVML index) and `uuid`; absent when the device does
    // not support the field, never 0 in its place.

    /// bytes, counter: sent by the GPU over PCIe (NVML field 197, `PCIE_COUNT_TX_BYTES`).
    pub const GPU_PCIE_TX_BYTES: &str = "gpu.pcie.tx_bytes";
    /// bytes, counter: received by the GPU over PCIe (field 198); host-to-device copies land here.
    pub const GPU_PCIE_RX_BYTES: &str = "gpu.pcie.rx_bytes";
    /// bytes, counter: data sent over all NVLinks (field 138 × 1024, scope all links).
    pub const GPU_NVLINK_TX_BYTES: &str = "gpu.nvlink.tx_bytes";
    /// bytes, counter: data received over all NVLinks (field 139 × 1024, scope all links).
    pub const GPU_NVLINK_RX_BYTES: &str = "gpu.nvlink.rx_bytes";
    /// mW, gauge: instant board power (field 186, `POWER_INSTANT`).
    pub const GPU_POWER_MW: &str = "gpu.power_mw";
    /// mJ, counter: energy since the driver loaded (field 83, `TOTAL_ENERGY_CONSUMPTION`).
    pub const GPU_ENERGY_MJ: &str = "gpu.energy_mj";
    /// MHz, gauge: SM clock.
    pub const GPU_SM_CLOCK_MHZ: &str = "gpu.clock.sm_mhz";
    /// MHz, gauge: memory clock.
    pub const GPU_MEM_CLOCK_MHZ: &str = "gpu.clock.mem_mhz";
    /// bitmask, gauge: NVML clock-throttle (event) reasons; 0 = running at full clocks.
    pub const GPU_THROTTLE_REASONS: &str = "gpu.throttle_reasons";
    /// bytes, gauge: device memory in use.
    pub const GPU_MEMORY_USED_BYTES: &str = "gpu.memory.used_bytes";
    /// %, gauge: share of the last sample period (1/6 s to 1 s) in which a kernel ran.
    pub const GPU_UTIL_PCT: &str = "gpu.util_pct";
    /// %, gauge: share of the last sample period in which device memory was read or written.
    pub const GPU_MEM_UTIL_PCT: &str = "gpu.mem_util_pct";
    /// %, gauge: SM utilisation of one process (label `pid`) on this GPU.
    pub const GPU_PROC_SM_PCT: &str = "gpu.proc.sm_pct";
    /// permille, gauge: GPM SM activity (share of SMs busy, time-averaged).
    pub const GPU_GPM_SM_ACTIVITY: &str = "gpu.gpm.sm_activity_permille";
    /// permille, gauge: GPM tensor-core activity (any tensor pipe).
    pub const GPU_GPM_TENSOR_ACTIVITY: &str = "gpu.gpm.tensor_activity_permille";
    /// permille, gauge: GPM DRAM bandwidth used, of the peak.
    pub const GPU_GPM_DRAM_BW: &str = "gpu.gpm.dram_bw_permille";
    /// bytes/s, gauge: GPM PCIe rate sent.
    pub const GPU_GPM_PCIE_TX_RATE: &str = "gpu.gpm.pcie_tx_bytes_per_s";
    /// bytes/s, gauge: GPM PCIe rate received.
    pub const GPU_GPM_PCIE_RX_RATE: &str = "gpu.gpm.pcie_rx_bytes_per_s";
    /// bytes/s, gauge: GPM NVLink rate sent, all links.
    pub const GPU_GPM_NVLINK_TX_RATE: &str = "gpu.gpm.nvlink_tx_bytes_per_s";
    /// bytes/s, gauge: GPM NVLink rate received, all links.
    pub const GPU_GPM_NVLINK_RX_RATE: &str = "gpu.gpm.nvlink_rx_bytes_per_s";
}

/// Label holding a GPU's NVML index.
pub const LABEL_GPU: &str = "gpu";
/// Label holding a GPU's UUID (`GPU-…`).
pub const LABEL_UUID: &str = "uuid";
/// Label holding a GPU's product name (`NVIDIA H100 80GB HBM3`), as NVML names it.
pub const LABEL_MODEL: &str = "model";

/// Label value of `link` for the loopback interface.
pub const LINK_LOOPBACK: &str = "loopback";
/// Label value of `link` for a network interface that leaves the node.
pub const LINK_NIC: &str = "nic";
