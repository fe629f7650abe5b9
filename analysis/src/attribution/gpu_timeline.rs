//! The GPU's own account of an iteration, from CUDA events, over the CPU's.
//!
//! On CUDA the loop's CPU thread only queues work: a wait for data may overlap kernels still
//! running from the previous step (no stall at all), and the exposed all-reduce happens on the
//! GPU stream after `backward()` has long returned on the CPU (the CPU then blocks somewhere
//! else, in a sync or a copy, where it looks like compute). The PyTorch hook times both on the
//! GPU stream with CUDA events, read back lazily ([`CudaIteration`]). When an iteration has
//! them, they decide how much of it was a data stall and how much exposed communication; the
//! CPU-side evidence still decides what kind (fetch or prep; peer wait, network or
//! interconnect) and the rest of the iteration keeps the CPU-side parts that are neither
//! (host-to-device copies, link traffic while idle, compute), with whatever the GPU was doing
//! otherwise counted as compute.
//!
//! The GPU's step-to-step time differs from the CPU's by the jitter of the queue, so GPU
//! times are scaled by the ratio of the two before they are laid onto the CPU's wall time.

use crate::category::{apportion, Category};

use super::parts::Parts;
use super::Basis;

/// Bounds on the CPU-to-GPU iteration time ratio used to scale GPU times: outside them the
/// two clocks disagree about what an iteration is (a first step, a pause) and the GPU times
/// are laid on unscaled.
const SCALE_BOUNDS: (f64, f64) = (0.5, 2.0);

/// What the GPU saw of one iteration of one rank, from CUDA events, and of the same iteration
/// on the other ranks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaIteration {
    /// ns on the GPU from the previous step to this one.
    pub iter_ns: Option<u64>,
    /// ns the GPU sat idle while the loop waited for data.
    pub data_idle_ns: Option<u64>,
    /// ns of exposed gradient all-reduce on the GPU stream.
    pub comm_ns: Option<u64>,
    /// ns, the least exposed all-reduce any rank's GPU saw in this iteration (this one's
    /// included), once every rank timed it: the rank that arrived last waits least, so the
    /// least is the transfer and the rest of each rank's is waiting for that rank.
    pub fastest_comm_ns: Option<u64>,
}

/// The classes of CPU-side evidence the GPU times stand in for.
fn is_data(basis: Basis) -> bool {
    matches!(
        basis,
        Basis::DataLoaderCpu
            | Basis::LoaderRunQueue
            | Basis::DataLoaderIo
            | Basis::DataLoaderNet
            | Basis::DataLoaderReads
            | Basis::DataNoActivity
            | Basis::CounterLoader
    )
}

/// CPU-side evidence of exposed communication (including the GPU-link share of it): what the
/// GPU times stand in for here, and what the cross-node join splits again.
pub(crate) fn is_comm(basis: Basis) -> bool {
    matches!(
        basis,
        Basis::PeerArrival
            | Basis::CommNicBytes
            | Basis::CommLocalBytes
            | Basis::CommNoBytes
            | Basis::CommGpuLinkBytes
    )
}

/// The order in which the rest of the iteration keeps its CPU-side parts when the GPU times
/// leave less room than the CPU saw: copies and link traffic first, then marked and sampled
/// compute; `other` is dropped (the GPU either worked or waited for the host then). Link
/// traffic while the loop idled is dropped too when the GPU timed the exposed all-reduce
/// (`gpu_comm`): it is that all-reduce, seen from the CPU.
fn keep_rank(basis: Basis, gpu_comm: bool) -> Option<u8> {
    match basis {
        Basis::H2dPcieBytes => Some(0),
        Basis::CounterNic | Basis::CounterLocal | Basis::CounterGpuLink if !gpu_comm => Some(1),
        Basis::ComputeMarker | Basis::CounterBusy | Basis::CounterRunQueue | Basis::GpuBusy => {
            Some(2)
        }
        _ => None,
    }
}

/// Re-divides `cpu` (the CPU-side parts of an iteration of `wall` ns) with the GPU's times.
/// `transfer_weights` gives the (network, interconnect) weights of the bytes moved in the
/// iteration, for a transfer the CPU side saw none of. The result sums to `wall` exactly.
pub(super) fn reconcile(
    cpu: &Parts,
    wall: u64,
    gpu: &CudaIteration,
    comm_fallback: Category,
    transfer_weights: impl FnOnce() -> (f64, f64),
) -> Parts {
    let scale = cpu_over_gpu_scale(wall, gpu.iter_ns);
    let scaled = |ns: u64| (ns as f64 * scale).round() as u64;
    let mut data = gpu.data_idle_ns.map_or(evidence_ns(cpu, is_data), scaled);
    let mut comm = gpu.comm_ns.map_or(evidence_ns(cpu, is_comm), scaled);
    if data + comm > wall {
        let over = data + comm - wall;
        let cut_data = (over as f64 * data as f64 / (data + comm) as f64).round() as u64;
        data -= cut_data.min(data);
        comm -= (over - cut_data).min(comm);
    }
    let mut out = Parts::default();
    match gpu.data_idle_ns {
        Some(_) => put_gpu_data(&mut out, cpu, data),
        None => keep_scaled(&mut out, cpu, is_data, data),
    }
    match gpu.comm_ns {
        Some(own) => {
            let waited = match gpu.fastest_comm_ns {
                Some(fastest) => scaled(own.saturating_sub(fastest)).min(comm),
                None => evidence_ns(cpu, |b| b == Basis::PeerArrival).min(comm),
            };
            put_gpu_comm(
                &mut out,
                cpu,
                (comm, waited),
                comm_fallback,
                transfer_weights,
            );
        }
        None => keep_scaled(&mut out, cpu, is_comm, comm),
    }
    let mut room = wall - data - comm;
    let mut kept: Vec<_> = cpu
        .evidence
        .iter()
        .filter_map(|e| keep_rank(e.basis, gpu.comm_ns.is_some()).map(|r| (r, *e)))
        .collect();
    kept.sort_by_key(|(r, _)| *r);
    for (_, e) in kept {
        let ns = e.ns.min(room);
        out.put(e.category, e.basis, ns);
        room -= ns;
    }
    out.put(Category::Compute, Basis::GpuWork, room);
    out
}

/// The CPU/GPU iteration-time ratio the GPU's times are scaled by: within [`SCALE_BOUNDS`],
/// else 1 (unscaled).
fn cpu_over_gpu_scale(wall: u64, gpu_iter_ns: Option<u64>) -> f64 {
    match gpu_iter_ns {
        Some(g) if g > 0 => {
            let s = wall as f64 / g as f64;
            if (SCALE_BOUNDS.0..=SCALE_BOUNDS.1).contains(&s) {
                s
            } else {
                1.0
            }
        }
        _ => 1.0,
    }
}

/// ns of the CPU-side evidence whose basis `pred` picks.
fn evidence_ns(cpu: &Parts, pred: impl Fn(Basis) -> bool) -> u64 {
    cpu.evidence
        .iter()
        .filter(|e| pred(e.basis))
        .map(|e| e.ns)
        .sum()
}

/// ns of the CPU-side evidence of category `c` whose basis `pred` picks, as a weight.
fn evidence_weight(cpu: &Parts, c: Category, pred: impl Fn(Basis) -> bool) -> f64 {
    cpu.evidence
        .iter()
        .filter(|e| pred(e.basis) && e.category == c)
        .map(|e| e.ns as f64)
        .sum()
}

/// The GPU's idle time waiting for data, `data` ns, split into prep, fetch and unexplained
/// (`other`) as the CPU side split its wait.
fn put_gpu_data(out: &mut Parts, cpu: &Parts, data: u64) {
    out.apportion(
        data,
        &[
            (
                Category::DataPrep,
                Basis::GpuIdleForData,
                evidence_weight(cpu, Category::DataPrep, is_data),
            ),
            (
                Category::DataFetch,
                Basis::GpuIdleForData,
                evidence_weight(cpu, Category::DataFetch, is_data),
            ),
            (
                Category::Other,
                Basis::GpuIdleForData,
                evidence_weight(cpu, Category::Other, is_data),
            ),
        ],
        (Category::Other, Basis::GpuIdleForData),
    );
}

/// The GPU's exposed all-reduce, `comm` ns of which `waited` for the slowest peer; the rest
/// is the transfer, split as the CPU side's comm split (or the iteration's link bytes say).
fn put_gpu_comm(
    out: &mut Parts,
    cpu: &Parts,
    (comm, waited): (u64, u64),
    comm_fallback: Category,
    transfer_weights: impl FnOnce() -> (f64, f64),
) {
    out.put(Category::PeerWait, Basis::GpuSlowestPeer, waited);
    let transfer = |b: Basis| is_comm(b) && b != Basis::PeerArrival;
    let (mut net, mut inter) = (
        evidence_weight(cpu, Category::Network, transfer),
        evidence_weight(cpu, Category::Interconnect, transfer),
    );
    if net + inter <= 0.0 {
        (net, inter) = transfer_weights();
    }
    out.apportion(
        comm - waited,
        &[
            (Category::Network, Basis::GpuExposedComm, net),
            (Category::Interconnect, Basis::GpuExposedComm, inter),
        ],
        (comm_fallback, Basis::GpuExposedComm),
    );
}

/// Puts the CPU-side evidence of one class (`pred`) into `out`, resized to `total` ns in
/// proportion (the class was cut only where the GPU times left no room for it).
fn keep_scaled(out: &mut Parts, cpu: &Parts, pred: fn(Basis) -> bool, total: u64) {
    let entries: Vec<_> = cpu.evidence.iter().filter(|e| pred(e.basis)).collect();
    let weights: Vec<f64> = entries.iter().map(|e| e.ns as f64).collect();
    if let Some(ns) = apportion(total, &weights) {
        for (e, n) in entries.iter().zip(ns) {
            out.put(e.category, e.basis, n);
        }
    }
}
