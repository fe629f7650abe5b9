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
    /// ns, counter: CPU time of all threads of a process, live and exited (`stat` utime+stime).
    pub const PROC_ALL_CPU_NS: &str = "proc.cpu_ns";
    /// bytes, counter: bytes a process caused to be read from storage (`io` read_bytes).
    pub const PROC_READ_BYTES: &str = "proc.read_bytes";
    /// bytes, counter: received on an interface.
    pub const NET_RX_BYTES: &str = "net.rx_bytes";
    /// bytes, counter: sent on an interface.
    pub const NET_TX_BYTES: &str = "net.tx_bytes";
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
}

/// Label value of `link` for the loopback interface.
pub const LINK_LOOPBACK: &str = "loopback";
/// Label value of `link` for a network interface that leaves the node.
pub const LINK_NIC: &str = "nic";
