//! Per-rank, per-iteration attribution of wall time to stall categories.
//!
//! Follows the semantics of DESIGN.md: marked phases decide first (`data` is a data stall,
//! split into fetch and prep by what the loader was doing; `comm` is exposed communication,
//! split into waiting for the last peer and the transfer, the transfer between interconnect
//! and network by the bytes each link class moved); where no marker speaks, counters decide
//! per sample tick. Every iteration's parts sum exactly to its wall time, and each part says
//! which rule decided it ([`Evidence`]) and how much of the wall time was seen ([`Coverage`]).

use serde::{Deserialize, Serialize};

use crate::category::{Category, Split};
use crate::Nanos;

/// The rule that decided a part of an iteration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Basis {
    /// `data` marker while loader threads ran (waiting to run: [`Basis::LoaderRunQueue`]).
    DataLoaderCpu,
    /// `data` marker while loader threads were blocked on I/O (state D).
    DataLoaderIo,
    /// `data` marker while no loader thread was seen running, runnable or in state D (an
    /// object-store or HTTP read sleeps in state S; or nothing was sampled): counted as
    /// `other`, since nothing seen says whether it was fetch or prep.
    DataNoActivity,
    /// `comm` marker after every rank had arrived, bytes on the NICs.
    CommNicBytes,
    /// `comm` marker after every rank had arrived, bytes on loopback/NVLink/PCIe peer links.
    CommLocalBytes,
    /// `comm` marker with no bytes seen on any link; counted as network when the node has a
    /// NIC that carried traffic in the run, else interconnect.
    CommNoBytes,
    /// `comm` marker before the last rank arrived at the collective.
    PeerArrival,
    /// `compute` or `h2d` marker.
    ComputeMarker,
    /// No marker: the rank's main thread was on the CPU (waiting for one:
    /// [`Basis::CounterRunQueue`]).
    CounterBusy,
    /// No marker: the rank idle while NIC bytes flowed.
    CounterNic,
    /// No marker: the rank idle while loopback bytes flowed.
    CounterLocal,
    /// No marker: the rank idle while its loader worked.
    CounterLoader,
    /// Nothing seen explains it.
    Unexplained,
    /// No marker: the rank's GPU ran kernels while its CPU thread did not.
    GpuBusy,
    /// `comm` marker after every rank had arrived, bytes on the rank's GPU's NVLinks or on its
    /// PCIe link beyond what the NICs carried.
    CommGpuLinkBytes,
    /// No marker: the rank and its GPU idle while the GPU's NVLink/PCIe bytes flowed.
    CounterGpuLink,
    /// Host-to-device copy: PCIe bytes into the GPU while the loop waited for data or was in
    /// `h2d`, for their estimated transfer time.
    H2dPcieBytes,
    /// CUDA events: the GPU idle while the loop waited for data; fetch, prep or (no loader
    /// activity seen) other, as the CPU side saw the wait.
    GpuIdleForData,
    /// CUDA events: the exposed all-reduce on the GPU stream, less waiting for the slowest
    /// rank; network or interconnect as the bytes (or the CPU side's split) say.
    GpuExposedComm,
    /// CUDA events: the exposed all-reduce beyond the least any rank's GPU saw in the same
    /// iteration: waiting for the rank that arrived last.
    GpuSlowestPeer,
    /// CUDA events: the rest of the iteration on a GPU-timed rank: kernels, and the host work
    /// that queues them, that no other rule claimed.
    GpuWork,
    /// `data` marker (or, with no marker, an idle rank) while no loader thread was seen
    /// running, runnable or in state D, but the loader workers' own TCP flows (class `data`)
    /// received bytes: a worker asleep on a socket read (an object store, HTTP, a network
    /// file system's client) is fetching.
    DataLoaderNet,
    /// `data` marker while no loader thread was seen running, runnable or in state D, but the
    /// processes the loop waited for read from storage meanwhile (`io` read_bytes advanced):
    /// the throttled or slow reads were waited in state D between the state samples (the
    /// state is read at 50 Hz; a 4 kB read at 400 kB/s takes 10 ms).
    DataLoaderReads,
    /// No marker: the rank's main thread was ready to run but waited on a run queue (another
    /// process held the CPU, or the job has more busy threads than the node has cores). It is
    /// compute by rule 4 (the loop was busy); told apart so that it can be seen, and so that
    /// the slowdown watch does not take the node's load for the rank turning slow.
    CounterRunQueue,
    /// The loader the loop waited for (in a `data` span, or while the loop idled) was ready to
    /// run but waited on a run queue: `data_prep`, as loader CPU is, told apart as
    /// [`Basis::CounterRunQueue`] is.
    LoaderRunQueue,
}

/// How much of one category one rule decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evidence {
    /// The category the time went to.
    pub category: Category,
    /// The rule that put it there.
    pub basis: Basis,
    /// ns.
    pub ns: u64,
}

/// How much of an iteration's wall time the evidence saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coverage {
    /// ns inside a marked phase (`data`, `comm`, `compute`, `h2d`).
    pub marked_ns: u64,
    /// ns covered by sample ticks.
    pub sampled_ns: u64,
}

/// Where one iteration of one rank went.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IterationBreakdown {
    /// Global rank.
    pub rank: u32,
    /// The rank's process.
    pub pid: u32,
    /// 0-based iteration index of that process.
    pub iter: u64,
    /// ns, `CLOCK_MONOTONIC`, the previous step (or the first marker).
    pub start_ns: Nanos,
    /// ns, the step that completed this iteration.
    pub end_ns: Nanos,
    /// ns per category; sums to `end_ns - start_ns`.
    pub split: Split,
    /// Which rule decided how much.
    pub evidence: Vec<Evidence>,
    /// What was seen.
    pub coverage: Coverage,
}

impl IterationBreakdown {
    /// Wall time of the iteration, ns.
    pub fn wall_ns(&self) -> u64 {
        self.end_ns - self.start_ns
    }
}

mod counters;
mod gpu_timeline;
mod inputs;
mod iteration;
mod parts;
mod unmarked;

pub(crate) use gpu_timeline::is_comm;
pub use gpu_timeline::CudaIteration;
pub use inputs::{
    GpuSeries, IterationInput, Links, RankSeries, ThreadSeries, IDLE_LOADER_CORES,
    QUIET_LINK_BYTES_PER_S,
};
pub use iteration::{attribute, comm_span_times, CommSpanTime};

#[cfg(test)]
mod tests;
