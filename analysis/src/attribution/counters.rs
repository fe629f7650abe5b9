//! What the counters say over a span: CPU busy and blocked time of threads, loader activity,
//! bytes over the NICs, loopback and the GPU's links, and the transfer time they stand for.
//! Shared by every attribution rule.

use crate::series::SeriesId;
use crate::timeline::SeriesStore;
use crate::Nanos;

use super::inputs::{GpuSeries, Links, RankSeries, ThreadSeries, QUIET_LINK_BYTES_PER_S};

pub(super) fn delta(store: &SeriesStore, id: Option<SeriesId>, a: Nanos, b: Nanos) -> f64 {
    id.and_then(|id| store.counter_delta(id, a, b))
        .unwrap_or(0.0)
}

/// ns the process's main thread (and a loader worker's other threads) ran or waited to run
/// in `[a, b]`: (on a CPU, on a run queue). Waiting to run is busy by the rules (the work was
/// ready; the CPU was not), and is told apart as [`super::Basis::CounterRunQueue`] and
/// [`super::Basis::LoaderRunQueue`]: another process's load, or more threads than cores.
pub(super) fn busy_parts(store: &SeriesStore, t: &ThreadSeries, a: Nanos, b: Nanos) -> (f64, f64) {
    (
        delta(store, t.cpu, a, b) + delta(store, t.others[0], a, b),
        delta(store, t.runq, a, b) + delta(store, t.others[1], a, b),
    )
}

/// What the loader the loop waited for was seen doing over a span, ns: on a CPU, waiting for
/// one, blocked on I/O.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct LoaderActivity {
    pub(super) cpu: f64,
    pub(super) queued: f64,
    pub(super) io: f64,
}

impl LoaderActivity {
    /// ns it ran or waited to run.
    pub(super) fn busy(&self) -> f64 {
        self.cpu + self.queued
    }

    /// The share of its busy time spent waiting for a CPU, 0–1.
    pub(super) fn queued_share(&self) -> f64 {
        if self.busy() > 0.0 {
            self.queued / self.busy()
        } else {
            0.0
        }
    }
}

/// ns its threads spent blocked on I/O in `[a, b]` (state D, as sampled; two threads blocked
/// count twice, and the caller bounds the sum by the wait).
pub(super) fn io_ns(store: &SeriesStore, t: &ThreadSeries, a: Nanos, b: Nanos) -> f64 {
    [t.blocked, t.others[2]]
        .into_iter()
        .flatten()
        .filter_map(|id| store.gauge_mean(id, a, b))
        .map(|m| m * (b - a) as f64)
        .sum()
}

/// What the loop waits for did in `[a, b]`: the worker it named (`worker`, when it is one of
/// the rank's loaders: the others are preparing later batches, which is not what the loop
/// waits for), else every loader, else the loop's own thread (it loads itself).
pub(super) fn loader_activity(
    store: &SeriesStore,
    rank: &RankSeries,
    worker: Option<u32>,
    a: Nanos,
    b: Nanos,
) -> LoaderActivity {
    awaited(rank, worker)
        .iter()
        .fold(LoaderActivity::default(), |sum, t| {
            let (cpu, queued) = busy_parts(store, t, a, b);
            LoaderActivity {
                cpu: sum.cpu + cpu,
                queued: sum.queued + queued,
                io: sum.io + io_ns(store, t, a, b),
            }
        })
}

/// Bytes the processes of [`loader_activity`] caused to be read from storage in `[a, b]`
/// (`io` read_bytes, read on the slow tier, so interpolated over up to 100 ms).
pub(super) fn loader_reads(
    store: &SeriesStore,
    rank: &RankSeries,
    worker: Option<u32>,
    a: Nanos,
    b: Nanos,
) -> f64 {
    awaited(rank, worker)
        .iter()
        .map(|t| delta(store, t.read_bytes, a, b))
        .sum()
}

/// What the loop waits for: the worker it named, else every loader, else itself.
fn awaited(rank: &RankSeries, worker: Option<u32>) -> Vec<&ThreadSeries> {
    let named: Vec<&ThreadSeries> = rank
        .loaders
        .iter()
        .filter(|t| Some(t.pid) == worker)
        .collect();
    if !named.is_empty() {
        named
    } else if rank.loaders.is_empty() {
        vec![&rank.main]
    } else {
        rank.loaders.iter().collect()
    }
}

pub(super) fn link_bytes(store: &SeriesStore, ids: &[SeriesId], a: Nanos, b: Nanos) -> f64 {
    ids.iter().map(|id| delta(store, Some(*id), a, b)).sum()
}

/// Estimated transfer time of `bytes` at `rate` (bytes/s); the bytes themselves when the
/// rate is unknown.
pub(super) fn per(bytes: f64, rate: f64) -> f64 {
    if rate > 0.0 {
        bytes / rate
    } else {
        bytes
    }
}

/// Transfer-time weights of the two link classes for bytes moved in `[a, b]`.
pub(super) fn transfer_weights(
    store: &SeriesStore,
    links: &Links,
    a: Nanos,
    b: Nanos,
) -> (f64, f64) {
    let nic = link_bytes(store, &links.nic, a, b);
    let local = link_bytes(store, &links.local, a, b);
    (
        per(nic, links.nic_bytes_per_s),
        per(local, links.local_bytes_per_s),
    )
}

/// Bytes on the rank's GPU links in `[a, b]` that did not go to the network: all NVLink bytes,
/// and the PCIe bytes beyond `nic_bytes` (GPUDirect RDMA and staging through host memory
/// cross PCIe on the way to the NIC).
pub(super) fn gpu_link_bytes(
    store: &SeriesStore,
    gpu: &GpuSeries,
    nic_bytes: f64,
    a: Nanos,
    b: Nanos,
) -> (f64, f64) {
    let nvlink = link_bytes(store, &gpu.nvlink, a, b);
    let pcie = delta(store, gpu.pcie_rx, a, b) + delta(store, gpu.pcie_tx, a, b);
    (nvlink, (pcie - nic_bytes).max(0.0))
}

/// Transfer-time weight of the GPU's own links for bytes moved in `[a, b]`.
pub(super) fn gpu_transfer_weight(
    store: &SeriesStore,
    links: &Links,
    gpu: &GpuSeries,
    a: Nanos,
    b: Nanos,
) -> f64 {
    let nic = link_bytes(store, &links.nic, a, b);
    let (nvlink, pcie) = gpu_link_bytes(store, gpu, nic, a, b);
    per(nvlink, links.nvlink_bytes_per_s) + per(pcie, links.pcie_bytes_per_s)
}

/// Share of `[a, b]` the GPU ran kernels, 0–1, when known.
pub(super) fn gpu_busy(store: &SeriesStore, gpu: &GpuSeries, a: Nanos, b: Nanos) -> Option<f64> {
    let mean = store.gauge_mean(gpu.busy_pct?, a, b)?;
    Some((mean / 100.0).clamp(0.0, 1.0))
}

/// ns of host-to-device copy in `[a, b]`: PCIe bytes received over the highest PCIe rate
/// seen, at most the interval.
pub(super) fn h2d_ns(
    store: &SeriesStore,
    links: &Links,
    gpu: &GpuSeries,
    a: Nanos,
    b: Nanos,
) -> u64 {
    let bytes = delta(store, gpu.pcie_rx, a, b);
    if bytes <= 0.0 || links.pcie_bytes_per_s <= 0.0 {
        return 0;
    }
    ((bytes / links.pcie_bytes_per_s * 1e9) as u64).min(b - a)
}

/// Whether the links `ids` moved less than [`QUIET_LINK_BYTES_PER_S`] over `[a, b]`.
pub(super) fn quiet(store: &SeriesStore, ids: &[SeriesId], (a, b): (Nanos, Nanos)) -> bool {
    link_bytes(store, ids, a, b) / ((b - a) as f64 / 1e9) <= QUIET_LINK_BYTES_PER_S
}
