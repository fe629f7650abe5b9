//! When an iteration may be attributed: once samples have arrived past its end (so its
//! counters are complete), every other live rank has finished the same iteration (so waiting
//! for the slowest rank can be told from moving bytes), and every CUDA-timed loop has sent its
//! GPU times of it. Each condition has a patience, so a dead sampler or a stuck rank cannot
//! hold the summary back; at the end of a run everything left is attributed.

use std::collections::BTreeMap;

use crate::loops::MarkerLog;
use crate::Nanos;

/// What the node has seen, as far as readiness asks.
#[derive(Clone, Copy)]
pub struct Seen<'a> {
    /// ns, the latest time every sampler has reported past.
    pub watermark: Option<Nanos>,
    /// The loops' markers.
    pub markers: &'a MarkerLog,
    /// Pids seen gone, with when, ns.
    pub exited: &'a BTreeMap<u32, Nanos>,
    /// ns, the newest sample of the loop's GPU at the fast tier, read by a sampler of its
    /// own (NVML calls block) that may lag the CPU sampler that moves `watermark`; `None`
    /// when the loop has no such GPU or its source is down.
    pub gpu_watermark: Option<Nanos>,
}

/// How long a rank's finished iteration waits for slower ranks before it is attributed
/// without them, ns.
pub const PEER_PATIENCE_NS: Nanos = 10_000_000_000;

/// How long an iteration of a CUDA-timed loop waits for its GPU times (and its peers') past
/// its end before it is attributed without them, ns: the hook reads CUDA events back only
/// once the GPU has passed them, a few iterations late.
pub const GPU_PATIENCE_NS: Nanos = 10_000_000_000;

/// How long an iteration waits for samples past its end before it is attributed with what
/// there is (a sampler that died must not stall the summary), ns.
pub const SAMPLE_PATIENCE_NS: Nanos = 2_000_000_000;

/// The readiness policy, with its patience limits, ns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Readiness {
    /// See [`PEER_PATIENCE_NS`].
    pub peer_patience_ns: Nanos,
    /// See [`GPU_PATIENCE_NS`].
    pub gpu_patience_ns: Nanos,
    /// See [`SAMPLE_PATIENCE_NS`].
    pub sample_patience_ns: Nanos,
}

impl Default for Readiness {
    fn default() -> Readiness {
        Readiness {
            peer_patience_ns: PEER_PATIENCE_NS,
            gpu_patience_ns: GPU_PATIENCE_NS,
            sample_patience_ns: SAMPLE_PATIENCE_NS,
        }
    }
}

impl Readiness {
    /// Whether iteration `iter` of loop `pid`, which ended at `end`, may be attributed at
    /// `now` (ns, node clock); always with `finishing`.
    pub fn is_ready(
        &self,
        node: Seen<'_>,
        pid: u32,
        iter: u64,
        end: Nanos,
        now: Nanos,
        finishing: bool,
    ) -> bool {
        if finishing {
            return true;
        }
        let late = |patience: Nanos| now.saturating_sub(end) > patience;
        // Both samplers past the end: else the GPU's bytes of the iteration's last moments
        // would be missed for good (they are prorated over the samples around its bounds).
        let samples_caught_up = (node.watermark.is_some_and(|w| w >= end)
            && node.gpu_watermark.is_none_or(|g| g >= end))
            || late(self.sample_patience_ns);
        let peers_done = node.markers.loops().filter(|q| q.pid != pid).all(|q| {
            node.exited.contains_key(&q.pid)
                || q.steps.keys().next_back().is_some_and(|last| *last >= iter)
                || late(self.peer_patience_ns)
        });
        // Every loop's GPU times of this iteration, for its own split and its peers' wait.
        let gpu_times_in = node.markers.loops().all(|q| {
            q.gpu_settled(iter) || node.exited.contains_key(&q.pid) || late(self.gpu_patience_ns)
        });
        samples_caught_up && peers_done && gpu_times_in
    }
}
