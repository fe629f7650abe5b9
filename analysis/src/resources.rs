//! A node's resources over one reading: what the live model shows per node and what an agent
//! ships to the collector (`Frame::NodeResources`). Data only; the node meter
//! (`crate::view::NodeMeter`) fills it from raw samples.

use serde::{Deserialize, Serialize};

use crate::Nanos;

/// A node's resources over one bucket. A quantity no source measured is `None`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeResources {
    /// ns, the bucket's start (the node's clock).
    pub t_ns: Nanos,
    /// ns, the bucket's length.
    pub dur_ns: Nanos,
    /// cores, CPU time the job's processes used per second.
    pub cpu_busy_cores: Option<f64>,
    /// s per s, time the loops' threads waited in the run queue (summed over them).
    pub runq_delay: Option<f64>,
    /// bytes/s received on the NICs (loopback left out).
    pub nic_rx_bytes_per_s: Option<f64>,
    /// bytes/s sent on the NICs.
    pub nic_tx_bytes_per_s: Option<f64>,
    /// bytes/s read from whole disks.
    pub disk_read_bytes_per_s: Option<f64>,
    /// bytes/s written to whole disks.
    pub disk_write_bytes_per_s: Option<f64>,
    /// Share of the time some task waited for a CPU (PSI `some`), 0–1.
    pub psi_cpu: Option<f64>,
    /// Share of the time some task waited for I/O (PSI `some`), 0–1.
    pub psi_io: Option<f64>,
    /// Share of the time some task waited for memory (PSI `some`), 0–1.
    pub psi_memory: Option<f64>,
    /// Mean GPU utilisation over the node's GPUs (NVML), 0–1.
    pub gpu_busy: Option<f64>,
    /// bytes/s received over PCIe by the GPUs (NVML field 198), summed.
    pub pcie_rx_bytes_per_s: Option<f64>,
    /// bytes/s sent over PCIe by the GPUs (NVML field 197), summed.
    pub pcie_tx_bytes_per_s: Option<f64>,
    /// bytes/s received over NVLink, summed.
    pub nvlink_rx_bytes_per_s: Option<f64>,
    /// bytes/s sent over NVLink, summed.
    pub nvlink_tx_bytes_per_s: Option<f64>,
}

/// What a node's counters moved since its agent or run started counting: exact sums of the
/// raw counters' increases, not rates integrated back (an agent ships its latest one-second
/// reading only every 2 s, so integrating those counted about half of what moved). What
/// `/metrics` exposes as `_total` counters. A quantity no source measured is `None`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeCounters {
    /// s of CPU the job's processes used.
    pub cpu_seconds: Option<f64>,
    /// s the loops' threads waited in the run queue.
    pub runq_delay_seconds: Option<f64>,
    /// bytes received on the NICs (loopback left out).
    pub nic_rx_bytes: Option<f64>,
    /// bytes sent on the NICs.
    pub nic_tx_bytes: Option<f64>,
    /// bytes read from whole disks.
    pub disk_read_bytes: Option<f64>,
    /// bytes written to whole disks.
    pub disk_write_bytes: Option<f64>,
    /// bytes the GPUs received over PCIe.
    pub pcie_rx_bytes: Option<f64>,
    /// bytes the GPUs sent over PCIe.
    pub pcie_tx_bytes: Option<f64>,
    /// bytes the GPUs received over NVLink.
    pub nvlink_rx_bytes: Option<f64>,
    /// bytes the GPUs sent over NVLink.
    pub nvlink_tx_bytes: Option<f64>,
}
