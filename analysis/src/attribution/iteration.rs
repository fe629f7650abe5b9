//! Attribution of one iteration of one rank.
//!
//! The iteration is cut into pieces at every phase boundary; each piece takes the label of the
//! most specific phase covering it (`comm` over `data` over `h2d`/`compute`), and each label
//! has its rule. Weights from counters are turned into nanoseconds with largest-remainder
//! rounding per piece, so the parts always sum to the wall time.
//!
//! A rank that drives a GPU ([`RankSeries::gpu`]) adds the GPU's evidence: its busy share is
//! compute (the CPU thread of a CUDA loop often sleeps while kernels run); its NVLink bytes,
//! and its PCIe bytes beyond what the NICs carried (GPUDirect RDMA crosses PCIe on its way to
//! the NIC), are the intra-node interconnect; PCIe bytes received while the loop waits for data
//! or copies in `h2d` are host-to-device copies, counted as interconnect for their estimated
//! transfer time. A rank without a GPU is attributed exactly as before.
//!
//! A rank whose GPU was timed with CUDA events ([`IterationInput::gpu`]) has the data stall
//! and the exposed communication of each iteration re-measured on the GPU stream afterwards
//! (see [`super::gpu_timeline`]).

use crate::category::Category;
use crate::loops::Span;
use crate::marker::phase;
use crate::series::SeriesId;
use crate::timeline::SeriesStore;
use crate::Nanos;

use super::gpu_timeline::{reconcile, CudaIteration};
use super::parts::Parts;
use super::{Basis, Coverage, IterationBreakdown};

/// Byte rate below which a link is taken as quiet, bytes/s: background chatter (ssh, DNS,
/// package downloads) must not turn idle time into "network".
pub const QUIET_LINK_BYTES_PER_S: f64 = 100_000.0;

/// Loader CPU below which the loader is taken as idle, cores.
pub const IDLE_LOADER_CORES: f64 = 0.1;

/// The series of one process's main thread.
#[derive(Clone, Copy, Debug, Default)]
pub struct ThreadSeries {
    /// `proc.main.cpu_ns`.
    pub cpu: Option<SeriesId>,
    /// `proc.main.runq_ns`.
    pub runq: Option<SeriesId>,
    /// `proc.main.blocked_io`.
    pub blocked: Option<SeriesId>,
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
    /// `net.rx_bytes`/`net.tx_bytes` of network interfaces.
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
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Label {
    Comm(usize),
    Data,
    H2d,
    Compute,
    Unmarked,
}

/// Cuts `[start, end]` at every span boundary and labels each piece.
fn pieces(input: &IterationInput) -> Vec<(Nanos, Nanos, Label)> {
    let mut cuts = vec![input.start, input.end];
    for s in &input.spans {
        cuts.push(s.begin);
        cuts.push(s.end);
    }
    cuts.sort_unstable();
    cuts.dedup();
    let mut comm_order: Vec<&Span> = input
        .spans
        .iter()
        .filter(|s| s.phase == phase::COMM)
        .collect();
    comm_order.sort_by_key(|s| s.begin);
    let mut out: Vec<(Nanos, Nanos, Label)> = Vec::new();
    for w in cuts.windows(2) {
        let (a, b) = (w[0], w[1]);
        if b <= a {
            continue;
        }
        let covers = |s: &Span| s.begin <= a && s.end >= b;
        let label = if let Some(i) = comm_order.iter().position(|s| covers(s)) {
            Label::Comm(i)
        } else if input
            .spans
            .iter()
            .any(|s| s.phase == phase::DATA && covers(s))
        {
            Label::Data
        } else if input
            .spans
            .iter()
            .any(|s| s.phase == phase::H2D && covers(s))
        {
            Label::H2d
        } else if input
            .spans
            .iter()
            .any(|s| s.phase == phase::COMPUTE && covers(s))
        {
            Label::Compute
        } else {
            Label::Unmarked
        };
        match out.last_mut() {
            Some(last) if last.2 == label && last.1 == a => last.1 = b,
            _ => out.push((a, b, label)),
        }
    }
    out
}

fn delta(store: &SeriesStore, id: Option<SeriesId>, a: Nanos, b: Nanos) -> f64 {
    id.and_then(|id| store.counter_delta(id, a, b))
        .unwrap_or(0.0)
}

/// ns the thread ran or waited to run in `[a, b]`.
fn busy_ns(store: &SeriesStore, t: &ThreadSeries, a: Nanos, b: Nanos) -> f64 {
    delta(store, t.cpu, a, b) + delta(store, t.runq, a, b)
}

/// ns the thread spent blocked on I/O in `[a, b]` (state D, as sampled).
fn io_ns(store: &SeriesStore, t: &ThreadSeries, a: Nanos, b: Nanos) -> f64 {
    t.blocked
        .and_then(|id| store.gauge_mean(id, a, b))
        .map_or(0.0, |m| m * (b - a) as f64)
}

fn loader_activity(store: &SeriesStore, rank: &RankSeries, a: Nanos, b: Nanos) -> (f64, f64) {
    let loaders: Vec<&ThreadSeries> = if rank.loaders.is_empty() {
        vec![&rank.main]
    } else {
        rank.loaders.iter().collect()
    };
    loaders.iter().fold((0.0, 0.0), |(cpu, io), t| {
        (cpu + busy_ns(store, t, a, b), io + io_ns(store, t, a, b))
    })
}

fn link_bytes(store: &SeriesStore, ids: &[SeriesId], a: Nanos, b: Nanos) -> f64 {
    ids.iter().map(|id| delta(store, Some(*id), a, b)).sum()
}

/// Estimated transfer time of `bytes` at `rate` (bytes/s); the bytes themselves when the
/// rate is unknown.
fn per(bytes: f64, rate: f64) -> f64 {
    if rate > 0.0 {
        bytes / rate
    } else {
        bytes
    }
}

/// Transfer-time weights of the two link classes for bytes moved in `[a, b]`.
fn transfer_weights(store: &SeriesStore, links: &Links, a: Nanos, b: Nanos) -> (f64, f64) {
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
fn gpu_link_bytes(
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
fn gpu_transfer_weight(
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
fn gpu_busy(store: &SeriesStore, gpu: &GpuSeries, a: Nanos, b: Nanos) -> Option<f64> {
    let mean = store.gauge_mean(gpu.busy_pct?, a, b)?;
    Some((mean / 100.0).clamp(0.0, 1.0))
}

/// ns of host-to-device copy in `[a, b]`: PCIe bytes received over the highest PCIe rate
/// seen, at most the interval.
fn h2d_ns(store: &SeriesStore, links: &Links, gpu: &GpuSeries, a: Nanos, b: Nanos) -> u64 {
    let bytes = delta(store, gpu.pcie_rx, a, b);
    if bytes <= 0.0 || links.pcie_bytes_per_s <= 0.0 {
        return 0;
    }
    ((bytes / links.pcie_bytes_per_s * 1e9) as u64).min(b - a)
}

fn attribute_comm(
    parts: &mut Parts,
    store: &SeriesStore,
    links: &Links,
    gpu: Option<&GpuSeries>,
    (a, b): (Nanos, Nanos),
    arrival: Option<Nanos>,
) {
    let transfer_from = match arrival {
        Some(t) if t > a => {
            let wait_end = t.min(b);
            parts.put(Category::PeerWait, Basis::PeerArrival, wait_end - a);
            wait_end
        }
        _ => a,
    };
    if transfer_from >= b {
        return;
    }
    let (nic, local) = transfer_weights(store, links, transfer_from, b);
    let gpu_local = gpu.map_or(0.0, |g| {
        gpu_transfer_weight(store, links, g, transfer_from, b)
    });
    // With GPU evidence, a NIC that only trickled (ssh, metrics) while the GPU's own links
    // moved the collective did not hold it up; its bytes over its low peak would weigh as
    // much as the real transfer.
    let nic = if gpu_local > 0.0 && quiet(store, &links.nic, (transfer_from, b)) {
        0.0
    } else {
        nic
    };
    parts.apportion(
        b - transfer_from,
        &[
            (Category::Network, Basis::CommNicBytes, nic),
            (Category::Interconnect, Basis::CommLocalBytes, local),
            (Category::Interconnect, Basis::CommGpuLinkBytes, gpu_local),
        ],
        (links.comm_fallback, Basis::CommNoBytes),
    );
}

/// Whether the links `ids` moved less than [`QUIET_LINK_BYTES_PER_S`] over `[a, b]`.
fn quiet(store: &SeriesStore, ids: &[SeriesId], (a, b): (Nanos, Nanos)) -> bool {
    link_bytes(store, ids, a, b) / ((b - a) as f64 / 1e9) <= QUIET_LINK_BYTES_PER_S
}

fn attribute_data(
    parts: &mut Parts,
    store: &SeriesStore,
    rank: &RankSeries,
    links: &Links,
    (a, b): (Nanos, Nanos),
) {
    let mut waited = b - a;
    // The loop waited: a data stall even if the GPU still drained queued kernels (NVML's
    // utilisation averages over 1/6 s or more, too coarse to carve this span up). Only the
    // host-to-device copy inside it is told apart.
    if let Some(gpu) = &rank.gpu {
        let copy = h2d_ns(store, links, gpu, a, b);
        parts.put(Category::Interconnect, Basis::H2dPcieBytes, copy);
        waited -= copy;
    }
    if waited == 0 {
        return;
    }
    let (cpu, io) = loader_activity(store, rank, a, b);
    parts.apportion(
        waited,
        &[
            (Category::DataPrep, Basis::DataLoaderCpu, cpu),
            (Category::DataFetch, Basis::DataLoaderIo, io),
        ],
        (Category::DataPrep, Basis::DataNoActivity),
    );
}

/// `h2d` marker: a host-to-device copy. With a GPU whose PCIe counters saw bytes come in, the
/// copy is the PCIe interconnect; otherwise (no GPU evidence) it stays compute, as a marked
/// phase of the step's own work.
fn attribute_h2d(
    parts: &mut Parts,
    store: &SeriesStore,
    gpu: Option<&GpuSeries>,
    (a, b): (Nanos, Nanos),
) {
    let copied = gpu.is_some_and(|g| delta(store, g.pcie_rx, a, b) > 0.0);
    if copied {
        parts.put(Category::Interconnect, Basis::H2dPcieBytes, b - a);
    } else {
        parts.put(Category::Compute, Basis::ComputeMarker, b - a);
    }
}

/// Rule 4: no marker speaks, so each sample tick decides.
fn attribute_unmarked(
    parts: &mut Parts,
    store: &SeriesStore,
    rank: &RankSeries,
    links: &Links,
    (a, b): (Nanos, Nanos),
) {
    let Some(cpu_id) = rank.main.cpu else {
        parts.put(Category::Other, Basis::Unexplained, b - a);
        return;
    };
    let mut cuts = vec![a];
    cuts.extend(store.times_within(cpu_id, a + 1, b.saturating_sub(1)));
    cuts.push(b);
    let mut weights: Vec<(Category, Basis, f64)> = Vec::new();
    let mut add = |c: Category, basis: Basis, w: f64| {
        if w > 0.0 {
            match weights.iter_mut().find(|x| x.0 == c && x.1 == basis) {
                Some(x) => x.2 += w,
                None => weights.push((c, basis, w)),
            }
        }
    };
    for w in cuts.windows(2) {
        let (x, y) = (w[0], w[1]);
        let len = (y - x) as f64;
        if len <= 0.0 {
            continue;
        }
        if store.counter_delta(cpu_id, x, y).is_none() {
            add(Category::Other, Basis::Unexplained, len);
            continue;
        }
        let cpu_busy = (busy_ns(store, &rank.main, x, y) / len).clamp(0.0, 1.0);
        add(Category::Compute, Basis::CounterBusy, cpu_busy * len);
        let gpu = rank.gpu.as_ref();
        let gpu_busy = gpu.and_then(|g| gpu_busy(store, g, x, y)).unwrap_or(0.0);
        // The GPU's busy time beyond the CPU thread's: kernels ran while the loop slept.
        let busy = cpu_busy.max(gpu_busy);
        add(Category::Compute, Basis::GpuBusy, (busy - cpu_busy) * len);
        let idle = (1.0 - busy) * len;
        if idle <= 0.0 {
            continue;
        }
        let secs = len / 1e9;
        let nic_bytes = link_bytes(store, &links.nic, x, y);
        let nic_rate = nic_bytes / secs;
        let local_rate = link_bytes(store, &links.local, x, y) / secs;
        let (gpu_link_rate, gpu_weight) = match gpu {
            Some(g) => {
                let (nvlink, pcie) = gpu_link_bytes(store, g, nic_bytes, x, y);
                (
                    (nvlink + pcie) / secs,
                    per(nvlink, links.nvlink_bytes_per_s) + per(pcie, links.pcie_bytes_per_s),
                )
            }
            None => (0.0, 0.0),
        };
        let (loader_cpu, loader_io) = if rank.loaders.is_empty() {
            (0.0, 0.0) // the loop itself is the loader, and it was idle
        } else {
            loader_activity(store, rank, x, y)
        };
        let loud = |rate: f64, weight: f64| {
            if rate > QUIET_LINK_BYTES_PER_S {
                weight
            } else {
                0.0
            }
        };
        if nic_rate > QUIET_LINK_BYTES_PER_S
            || local_rate > QUIET_LINK_BYTES_PER_S
            || gpu_link_rate > QUIET_LINK_BYTES_PER_S
        {
            let (n, l) = transfer_weights(store, links, x, y);
            let n = loud(nic_rate, n);
            let l = loud(local_rate, l);
            let g = loud(gpu_link_rate, gpu_weight);
            let all = n + l + g;
            if all > 0.0 {
                add(Category::Network, Basis::CounterNic, idle * n / all);
                add(Category::Interconnect, Basis::CounterLocal, idle * l / all);
                add(
                    Category::Interconnect,
                    Basis::CounterGpuLink,
                    idle * g / all,
                );
            } else {
                add(Category::Other, Basis::Unexplained, idle);
            }
        } else if loader_cpu + loader_io > IDLE_LOADER_CORES * len {
            let total = loader_cpu + loader_io;
            add(
                Category::DataPrep,
                Basis::CounterLoader,
                idle * loader_cpu / total,
            );
            add(
                Category::DataFetch,
                Basis::CounterLoader,
                idle * loader_io / total,
            );
        } else {
            add(Category::Other, Basis::Unexplained, idle);
        }
    }
    parts.apportion(b - a, &weights, (Category::Other, Basis::Unexplained));
}

/// Attributes one iteration. The parts of the result sum to `end - start` exactly.
pub fn attribute(
    input: &IterationInput,
    store: &SeriesStore,
    rank: &RankSeries,
    links: &Links,
) -> IterationBreakdown {
    let mut parts = Parts::default();
    let mut marked = 0;
    for (a, b, label) in pieces(input) {
        match label {
            Label::Comm(i) => {
                marked += b - a;
                let arrival = input.peer_arrivals.get(i).copied().flatten();
                attribute_comm(&mut parts, store, links, rank.gpu.as_ref(), (a, b), arrival);
            }
            Label::Data => {
                marked += b - a;
                attribute_data(&mut parts, store, rank, links, (a, b));
            }
            Label::H2d => {
                marked += b - a;
                attribute_h2d(&mut parts, store, rank.gpu.as_ref(), (a, b));
            }
            Label::Compute => {
                marked += b - a;
                parts.put(Category::Compute, Basis::ComputeMarker, b - a);
            }
            Label::Unmarked => attribute_unmarked(&mut parts, store, rank, links, (a, b)),
        }
    }
    if let Some(gpu) = &input.gpu {
        let (a, b) = (input.start, input.end);
        parts = reconcile(&parts, b - a, gpu, links.comm_fallback, || {
            let (nic, local) = transfer_weights(store, links, a, b);
            let gpu_links = rank
                .gpu
                .as_ref()
                .map_or(0.0, |g| gpu_transfer_weight(store, links, g, a, b));
            (nic, local + gpu_links)
        });
    }
    let sampled = rank
        .main
        .cpu
        .map_or(0, |id| store.covered(id, input.start, input.end));
    IterationBreakdown {
        rank: input.rank,
        pid: input.pid,
        iter: input.iter,
        start_ns: input.start,
        end_ns: input.end,
        split: parts.split,
        evidence: parts.evidence,
        coverage: Coverage {
            marked_ns: marked,
            sampled_ns: sampled,
        },
    }
}
