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
use crate::timeline::SeriesStore;
use crate::Nanos;

use super::counters::{
    delta, gpu_transfer_weight, h2d_ns, link_bytes, loader_activity, loader_reads, quiet,
    transfer_weights,
};
use super::gpu_timeline::reconcile;
use super::inputs::{GpuSeries, IterationInput, Links, RankSeries};
use super::parts::Parts;
use super::unmarked::attribute_unmarked;
use super::{Basis, Coverage, IterationBreakdown};

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

fn attribute_data(
    parts: &mut Parts,
    store: &SeriesStore,
    rank: &RankSeries,
    links: &Links,
    (a, b): (Nanos, Nanos),
    worker: Option<u32>,
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
    let loader = loader_activity(store, rank, worker, a, b);
    let (cpu, io) = (loader.busy(), loader.io);
    // What the loader was seen doing explains at most the wait; the rest of it (a worker
    // asleep in state S, or nothing sampled) is a network fetch when the loader workers'
    // sockets received bytes meanwhile (an object-store or HTTP read), a storage fetch when
    // the awaited processes read from storage meanwhile (waits in state D that fell between
    // the state samples: the cap above drops the samples that over-count, so without this
    // the D share comes out low), else unexplained.
    let seen = (cpu + io).min(waited as f64);
    let (cpu, io) = if cpu + io > 0.0 {
        (seen * cpu / (cpu + io), seen * io / (cpu + io))
    } else {
        (0.0, 0.0)
    };
    let asleep = waited as f64 - seen;
    let (net, reads, none) = if link_bytes(store, &links.data_rx, a, b) > 0.0 {
        (asleep, 0.0, 0.0)
    } else if loader_reads(store, rank, worker, a, b) > 0.0 {
        (0.0, asleep, 0.0)
    } else {
        (0.0, 0.0, asleep)
    };
    let queued = cpu * loader.queued_share();
    parts.apportion(
        waited,
        &[
            (Category::DataPrep, Basis::DataLoaderCpu, cpu - queued),
            (Category::DataPrep, Basis::LoaderRunQueue, queued),
            (Category::DataFetch, Basis::DataLoaderIo, io),
            (Category::DataFetch, Basis::DataLoaderNet, net),
            (Category::DataFetch, Basis::DataLoaderReads, reads),
            (Category::Other, Basis::DataNoActivity, none),
        ],
        (Category::Other, Basis::DataNoActivity),
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

/// How the CPU-side attribution split one `comm` span's exposed time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommSpanTime {
    /// ns of the iteration the span was the phase that decided (the first-begun `comm` span
    /// covering a piece decides it, so overlapping spans are not counted twice).
    pub exposed_ns: u64,
    /// ns of those spent waiting for the last peer to begin the same operation (`peer_wait`);
    /// the rest moved data.
    pub waited_ns: u64,
}

/// For each `comm` span of `input`, in the order they began (the order of
/// [`IterationInput::peer_arrivals`]), the time [`attribute`] gave it and its peer wait, by
/// the same rule; on a CUDA-timed rank, as the CPU side saw it, before the GPU's times
/// re-split the iteration.
pub fn comm_span_times(input: &IterationInput) -> Vec<CommSpanTime> {
    let count = input
        .spans
        .iter()
        .filter(|s| s.phase == phase::COMM)
        .count();
    let mut out = vec![CommSpanTime::default(); count];
    for (a, b, label) in pieces(input) {
        let Label::Comm(i) = label else { continue };
        out[i].exposed_ns += b - a;
        if let Some(t) = input.peer_arrivals.get(i).copied().flatten() {
            out[i].waited_ns += t.clamp(a, b) - a;
        }
    }
    out
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
                let waited = input
                    .waits
                    .iter()
                    .find(|w| w.0 <= a && w.1 >= b)
                    .map(|w| w.2);
                attribute_data(&mut parts, store, rank, links, (a, b), waited);
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
