//! The job timeline: every frame of a run goes in, iteration breakdowns come out.
//!
//! The live run and the replay of a profile both feed frames to a [`JobTimeline`] and ask it
//! for the iterations that are ready, so a profile cut short reads the same as it was shown
//! live. An iteration is ready when samples have arrived past its end and every other live
//! rank has finished the same iteration (so that waiting for the slowest rank can be told
//! apart from moving bytes); at the end of a run everything left is attributed.
//!
//! It is three parts, each owned separately: this node's timeline ([`NodeTimeline`]: samples,
//! markers, processes, the attribution of its ranks, with [`Readiness`] deciding when), the
//! cross-node join of other nodes' reports ([`CrossNode`]), and the running summary
//! ([`JobTotals`]). A training job runs for days, so nothing is kept per iteration for good:
//! the summary's figures are folded into running aggregates as iterations are attributed, and
//! no breakdown is kept.

use crate::attribution::IterationBreakdown;
use crate::crossnode::CrossNode;
use crate::frame::{Frame, NodeReport, RunEnd, RunHeader};
use crate::gpu_usage::NvmlReading;
use crate::Nanos;

mod forget;
mod gpu_map;
mod node;
mod readiness;
mod totals;

pub use forget::{GONE_GRACE_NS, IDLE_KEEP_NS};
pub use node::{Attributed, Held, NodeTimeline, RankProgress};
pub use readiness::{Readiness, Seen, GPU_PATIENCE_NS, PEER_PATIENCE_NS, SAMPLE_PATIENCE_NS};
pub use totals::JobTotals;

/// Everything known about a run.
#[derive(Debug, Default)]
pub struct JobTimeline {
    /// The run's header, once seen.
    pub header: Option<RunHeader>,
    /// How the run ended, if it did.
    pub end: Option<RunEnd>,
    /// Marker datagrams rejected as malformed, as counted by the live side.
    pub markers_rejected: u64,
    /// This node's ranks.
    pub node: NodeTimeline,
    /// Ranks of other nodes, as their agents attributed them (a collector's job profile).
    pub nodes: CrossNode,
    /// The running summary.
    pub summary: JobTotals,
    /// When the node's iterations may be attributed.
    pub readiness: Readiness,
    /// The hangs declared, in order (a resumed one updated in place).
    pub hangs: Vec<crate::hang::HangReport>,
    /// Each node's TCP flows, as their flow sources read them.
    pub flows: crate::flows::FlowLedger,
    /// A thinned profile's live totals were taken ([`Frame::IterationTotals`]): per loop pid,
    /// the first iteration they do not count, below which an iteration read is not counted
    /// again.
    counted: std::collections::BTreeMap<u32, u64>,
    /// The live run's count of marker datagrams lost, from the totals taken.
    markers_dropped: Option<u64>,
}

impl JobTimeline {
    /// Takes one frame. Breakdown frames are taken only from a profile whose samples were
    /// thinned ([`Frame::SamplesThinned`]); otherwise breakdowns are re-derived.
    pub fn ingest(&mut self, frame: &Frame) {
        match frame {
            Frame::Header(h) => {
                self.nodes.set_first_iter(u64::from(h.warmup_iters));
                self.header = Some(h.clone());
            }
            Frame::End(e) => {
                self.markers_rejected = e.markers_rejected;
                self.end = Some(e.clone());
            }
            Frame::NodeClock(c) => self.nodes.clock(c),
            Frame::NodeIteration(it) => {
                self.nodes.report(it);
            }
            Frame::NodeReport(r) => {
                let it = &r.iteration;
                let fresh = self.nodes.report(it);
                if let Some(gpu) = r.gpu.as_ref().filter(|_| fresh) {
                    let b = &it.breakdown;
                    if b.iter >= self.warmup() {
                        self.summary
                            .add_gpu(b.rank, gpu, b.end_ns.saturating_sub(b.start_ns));
                    }
                }
            }
            Frame::NodeHealth(h) => self.nodes.health(h),
            Frame::NodeFlows(f) => self.flows.ingest(f),
            Frame::IterationTotals(t) if self.node.takes_breakdowns_as_written() => {
                self.summary.totals = t.totals.clone();
                self.summary.comm = t.comm.iter().cloned().collect();
                self.summary.slowdowns.replace_found(t.slowdowns.clone());
                self.counted = t.progress.iter().copied().collect();
                self.markers_dropped = Some(t.markers_dropped);
            }
            Frame::Hang(h) => match self.hangs.iter_mut().find(|k| k.at_seconds == h.at_seconds) {
                Some(known) => known.clone_from(h),
                None => self.hangs.push((**h).clone()),
            },
            _ => self.node.ingest(frame),
        }
    }

    /// What the summary needs of every iteration attributed so far, with where each loop
    /// stands: what a run whose iterations are thinned writes now and then.
    pub fn iteration_totals(&self) -> crate::frame::IterationTotals {
        crate::frame::IterationTotals {
            progress: self.node.progress_all(),
            totals: self.summary.totals.clone(),
            comm: self
                .summary
                .comm
                .iter()
                .map(|(k, v)| (*k, v.clone()))
                .collect(),
            slowdowns: self.summary.slowdowns.found().to_vec(),
            markers_dropped: self.markers_dropped(),
        }
    }

    /// Marker datagrams of this node known lost (sequence gaps): the live run's count when a
    /// thinned profile's totals were taken (its iterations left out are gaps too).
    pub fn markers_dropped(&self) -> u64 {
        self.markers_dropped
            .unwrap_or_else(|| self.node.markers.dropped())
    }

    /// Whether iteration `b` is in the live totals taken ([`Frame::IterationTotals`]).
    fn counted(&self, b: &IterationBreakdown) -> bool {
        self.counted.get(&b.pid).is_some_and(|next| b.iter < *next)
    }

    /// [`JobTimeline::ingest`] of a frame the caller no longer needs: a node's iteration
    /// waits for the cross-node join as it came instead of as a copy (the collector takes
    /// 300,000 a second at 10,000 ranks).
    pub fn ingest_owned(&mut self, frame: Frame) {
        match frame {
            Frame::NodeIteration(it) => {
                self.nodes.report_owned(it);
            }
            Frame::NodeReport(r) => {
                let NodeReport { iteration, gpu } = *r;
                let (rank, iter, wall_ns) = (
                    iteration.breakdown.rank,
                    iteration.breakdown.iter,
                    iteration
                        .breakdown
                        .end_ns
                        .saturating_sub(iteration.breakdown.start_ns),
                );
                let fresh = self.nodes.report_owned(iteration);
                if let Some(gpu) = gpu.as_ref().filter(|_| fresh) {
                    if iter >= self.warmup() {
                        self.summary.add_gpu(rank, gpu, wall_ns);
                    }
                }
            }
            other => self.ingest(&other),
        }
    }

    /// Iterations at the start of each rank left out of the summary (the header's).
    pub fn warmup(&self) -> u64 {
        self.header
            .as_ref()
            .map_or(0, |h| u64::from(h.warmup_iters))
    }

    /// What rank `rank`'s GPU did in iteration `iter`, when the last attribution round
    /// attributed it and the rank runs on a GPU NVML reads.
    pub fn gpu_reading(&self, rank: u32, iter: u64) -> Option<&NvmlReading> {
        self.node.gpu_reading(rank, iter)
    }

    /// Attributes every iteration of this node that is ready at `now` (ns, the node clock),
    /// and joins the other nodes' iterations that are ready. With `finishing`, attributes
    /// everything whose bounds are known. Returns the new ones.
    pub fn attribute_ready(&mut self, now: Nanos, finishing: bool) -> Vec<IterationBreakdown> {
        let warmup = self.warmup();
        let mut out = Vec::new();
        let mut own = Vec::new();
        for done in self.node.attribute_ready(now, finishing, &self.readiness) {
            let b = done.breakdown;
            if self.counted(&b) {
                own.push(b);
                continue;
            }
            if let Some(g) = done.gpu.as_ref().filter(|_| b.iter >= warmup) {
                self.summary.add_gpu(b.rank, g, b.wall_ns());
            }
            if b.iter >= warmup {
                self.summary.add_comm((b.rank, b.pid), &done.comm);
            }
            own.push(b);
        }
        // Only this node's iterations are in the clock of its own flows.
        self.flows.iterations("", &own);
        out.append(&mut own);
        let joined = self.nodes.join_ready(now, finishing);
        if out.is_empty() {
            // A collector's: the join's, already in order, not copied.
            out = joined;
        } else {
            out.extend(joined);
            out.sort_by_key(|b| (b.end_ns, b.rank));
        }
        if self.counted.is_empty() {
            self.summary.record(&out, warmup);
        } else {
            let fresh: Vec<IterationBreakdown> =
                out.iter().filter(|b| !self.counted(b)).cloned().collect();
            self.summary.record(&fresh, warmup);
        }
        out
    }

    /// Forgets samples and marks that no unattributed iteration can need any more.
    pub fn prune(&mut self) {
        self.node.prune();
    }
}

#[cfg(test)]
mod p2p_tests;
#[cfg(test)]
mod tests;
