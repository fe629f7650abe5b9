//! What an agent ships to the collector: per attributed iteration, the rank's iteration with
//! the begin and end of its collectives (for the cross-node join) and what its GPU did; every
//! few seconds, the node's health (when it changed), its latest resource reading and its bytes
//! per NIC; its GPUs' names when known, changed, and every [`GPUS_EVERY`]; and when the
//! collector asks (the job stalls), where its ranks stand and their stacks.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use stallscope_analysis::attribution::IterationBreakdown;
use stallscope_analysis::clock::shift;
use stallscope_analysis::flows::NodeFlows;
use stallscope_analysis::frame::{
    CommSpan, Frame, GpuIdentity, NodeCountersReport, NodeGpus, NodeHealth, NodeIteration,
    NodeMeta, NodeNics, NodeRdma, NodeReport, NodeResourcesReport,
};
use stallscope_analysis::job::JobTimeline;
use stallscope_analysis::marker::phase;
use stallscope_analysis::view::JobView;

use super::recorder::{Inbox, Tap};
use crate::markers::{Datagram, MarkerListener};
use crate::sampler::ExtraRoots;
use crate::shipper::Shipper;
use crate::sink::Sink;

/// How often the node's health and resources go to the collector.
pub const HEALTH_EVERY: Duration = Duration::from_secs(2);

/// How often the node's GPUs' names go again unchanged, so that a collector restarted since
/// learns them.
pub const GPUS_EVERY: Duration = Duration::from_secs(30);

/// Least time between two [`NodeMeta`] of one process whose keys were all sent before: the
/// hook sends its buckets' timings every 16 backwards, and a job profile needs a recent
/// value, not every one (8 ranks: ~50 bytes/s).
pub const META_EVERY: Duration = Duration::from_secs(30);

/// What the collector needs of one attributed iteration.
pub fn node_iteration(job: &JobTimeline, b: &IterationBreakdown, offset: i64) -> NodeIteration {
    let marks = job.node.markers.procs.get(&b.pid);
    let comm = marks
        .map(|m| m.spans_within(b.start_ns, b.end_ns))
        .unwrap_or_default()
        .into_iter()
        .filter(|s| s.phase == phase::COMM)
        .map(|s| CommSpan {
            begin: shift(s.begin, offset),
            end: shift(s.end, offset),
        })
        .collect();
    let mut breakdown = b.clone();
    breakdown.start_ns = shift(b.start_ns, offset);
    breakdown.end_ns = shift(b.end_ns, offset);
    NodeIteration {
        node: String::new(),
        breakdown,
        comm,
        world_size: marks.and_then(|m| m.info().world_size),
    }
}

/// The recorder's tap of an agent: ships every attributed iteration, and every
/// [`HEALTH_EVERY`] the node's health (when it changed) and its latest resources.
pub fn shipping_tap(shipper: Arc<Shipper>, listener: Arc<MarkerListener>) -> Tap {
    let offset = shipper.clock_offset_ns();
    let mut last_health: Option<(Instant, NodeHealth)> = None;
    let mut last_resources_at: Option<u64> = None;
    let mut last_gpus: Option<(Instant, Vec<GpuIdentity>)> = None;
    let mut last_meta: HashMap<u32, (Instant, NodeMeta)> = HashMap::new();
    let mut flows_sent = FlowsSent::default();
    let mut last_answered = shipper.stacks_asked();
    Box::new(
        move |job: &JobTimeline, view: &JobView, new: &[IterationBreakdown]| {
            shipper.push_all(new.iter().map(|b| {
                Frame::NodeReport(Box::new(NodeReport {
                    iteration: node_iteration(job, b, offset),
                    gpu: job.gpu_reading(b.rank, b.iter).cloned(),
                }))
            }));
            let asked = shipper.stacks_asked();
            if asked != last_answered {
                last_answered = asked;
                let answer = super::stacks::node_answer(job, asked);
                shipper.push(Frame::NodeHang(Box::new(answer)));
            }
            if last_health
                .as_ref()
                .is_some_and(|(at, _)| at.elapsed() < HEALTH_EVERY)
            {
                return;
            }
            let health = NodeHealth {
                node: String::new(),
                records_dropped: shipper.dropped(),
                markers_dropped: job.node.markers.dropped(),
                markers_rejected: listener.rejected(),
                sources_down: job
                    .node
                    .sources
                    .values()
                    .filter(|s| !s.up)
                    .cloned()
                    .collect(),
            };
            if last_health.as_ref().is_none_or(|(_, h)| *h != health) {
                shipper.push(Frame::NodeHealth(health.clone()));
            }
            last_health = Some((Instant::now(), health));
            let latest = view.nodes.values().find_map(|n| n.resources.clone());
            if let Some(mut r) = latest.filter(|r| last_resources_at != Some(r.t_ns)) {
                last_resources_at = Some(r.t_ns);
                r.t_ns = shift(r.t_ns, offset);
                let counters = view.nodes.values().find_map(|n| n.counters.clone());
                let rdma_counters = view
                    .nodes
                    .values()
                    .find(|n| !n.rdma_counters.is_empty())
                    .map(|n| n.rdma_counters.clone())
                    .unwrap_or_default();
                // Before the frames it completes: their RDMA fields are not encoded.
                let rdma_rates = r.rdma_rx_bytes_per_s.is_some() || r.rdma_tx_bytes_per_s.is_some();
                if rdma_rates || !rdma_counters.is_empty() {
                    let c = counters.clone().unwrap_or_default();
                    shipper.push(Frame::NodeRdma(NodeRdma {
                        node: String::new(),
                        t_ns: r.t_ns,
                        rx_bytes_per_s: r.rdma_rx_bytes_per_s,
                        tx_bytes_per_s: r.rdma_tx_bytes_per_s,
                        rx_bytes: c.rdma_rx_bytes,
                        tx_bytes: c.rdma_tx_bytes,
                        counters: rdma_counters,
                    }));
                }
                shipper.push(Frame::NodeResources(Box::new(NodeResourcesReport {
                    node: String::new(),
                    resources: r,
                })));
                if let Some(n) = view.nodes.values().find(|n| !n.nics.is_empty()) {
                    shipper.push(Frame::NodeNics(NodeNics {
                        node: String::new(),
                        nics: n.nics.clone(),
                    }));
                }
                if let Some(c) = counters {
                    shipper.push(Frame::NodeCounters(NodeCountersReport {
                        node: String::new(),
                        counters: c,
                    }));
                }
            }
            let gpus = view.nodes.values().find(|n| !n.gpus.is_empty());
            if let Some(gpus) = gpus.map(|n| &n.gpus).filter(|gpus| {
                last_gpus
                    .as_ref()
                    .is_none_or(|(at, last)| last != *gpus || at.elapsed() >= GPUS_EVERY)
            }) {
                shipper.push(Frame::NodeGpus(NodeGpus {
                    node: String::new(),
                    gpus: gpus.clone(),
                }));
                last_gpus = Some((Instant::now(), gpus.clone()));
            }
            for meta in changed_meta(job, &mut last_meta) {
                shipper.push(Frame::NodeMeta(meta));
            }
            if let Some(flows) = flows_sent.changed(job, offset) {
                shipper.push(Frame::NodeFlows(flows));
            }
        },
    )
}

/// The node's flows as last shipped: each flow's totals, and when.
#[derive(Default)]
struct FlowsSent {
    t_ns: Option<u64>,
    totals: HashMap<(String, String), (u64, u64, u64)>,
}

impl FlowsSent {
    /// The node's flows that moved since the last call, in the collector's clock (`offset`).
    fn changed(&mut self, job: &JobTimeline, offset: i64) -> Option<NodeFlows> {
        let (t_ns, latest) = job.flows.latest("")?;
        if self.t_ns == Some(t_ns) {
            return None;
        }
        let mut flows = Vec::new();
        let mut now = HashMap::new();
        for f in latest {
            let key = (f.local.clone(), f.remote.clone());
            let totals = (f.bytes_in, f.bytes_out, f.retransmits);
            if self.totals.get(&key) != Some(&totals) {
                flows.push(f.clone());
            }
            now.insert(key, totals);
        }
        let since = self.t_ns.unwrap_or(t_ns);
        self.t_ns = Some(t_ns);
        self.totals = now;
        (!flows.is_empty()).then(|| NodeFlows {
            node: String::new(),
            t_ns: shift(t_ns, offset),
            since_ns: shift(since, offset),
            flows,
        })
    }
}

/// The loops' facts for the advisor ([`NodeMeta::KEYS`]) that changed since they were last
/// sent: at once when a key is new, else at most every [`META_EVERY`]. Forgets processes
/// that are gone.
pub fn changed_meta(
    job: &JobTimeline,
    last: &mut HashMap<u32, (Instant, NodeMeta)>,
) -> Vec<NodeMeta> {
    let procs = &job.node.markers.procs;
    last.retain(|pid, _| procs.contains_key(pid));
    let mut out = Vec::new();
    for (pid, marks) in procs {
        if marks.info().is_loader() {
            continue;
        }
        let fields: Vec<(String, String)> = marks
            .meta
            .iter()
            .filter(|(k, _)| NodeMeta::forwards(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if fields.is_empty() {
            continue;
        }
        let meta = NodeMeta {
            node: String::new(),
            pid: *pid,
            rank: marks.rank,
            fields,
        };
        let due = match last.get(pid) {
            None => true,
            Some((_, sent)) if *sent == meta => false,
            Some((at, sent)) => {
                let new_key = meta
                    .fields
                    .iter()
                    .any(|(k, _)| !sent.fields.iter().any(|(s, _)| s == k));
                new_key || sent.rank != meta.rank || at.elapsed() >= META_EVERY
            }
        };
        if due {
            last.insert(*pid, (Instant::now(), meta.clone()));
            out.push(meta);
        }
    }
    out
}

/// Hands markers on, and makes every process that sends one a root of the sampled job.
#[derive(Clone)]
pub struct TrackSenders {
    /// Where the markers go.
    pub inbox: Inbox,
    /// The sampler's extra roots.
    pub roots: ExtraRoots,
}

impl Sink<Datagram> for TrackSenders {
    fn put(&self, item: Datagram) -> bool {
        let sender = match &item {
            Datagram::Marker(m) => Some(m.pid),
            Datagram::Channel(c) => Some(c.pid),
            Datagram::Rejected(_) => None,
        };
        if let Some(pid) = sender {
            if let Ok(mut r) = self.roots.lock() {
                r.insert(pid);
            }
        }
        self.inbox.put(item)
    }
}

#[cfg(test)]
mod tests {
    use stallscope_analysis::marker::{Marker, MarkerEvent};

    use super::*;

    fn meta(job: &mut JobTimeline, pid: u32, seq: u64, fields: &[(&str, &str)]) {
        job.ingest(&Frame::Markers(vec![Marker {
            seq,
            t_ns: 1_000 + seq,
            pid,
            rank: Some(pid - 100),
            iter: 0,
            event: MarkerEvent::Meta(
                fields
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
        }]));
    }

    #[test]
    fn a_loops_advisor_facts_go_when_new_and_then_at_most_every_thirty_seconds() {
        let mut job = JobTimeline::default();
        let mut last = HashMap::new();
        meta(
            &mut job,
            100,
            0,
            &[("framework", "torch-2.4"), ("batch_size", "8")],
        );
        meta(&mut job, 101, 0, &[("role", "loader"), ("batch_size", "8")]);
        let sent = changed_meta(&job, &mut last);
        // The loop's forwarded keys only; the loader worker and unread keys stay home.
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].rank, Some(0));
        assert_eq!(sent[0].fields, vec![("batch_size".into(), "8".into())]);
        assert!(
            changed_meta(&job, &mut last).is_empty(),
            "unchanged: not again"
        );
        // A new key goes at once; a changed value of a key sent before waits its turn.
        meta(&mut job, 100, 1, &[("comm_bytes", "4916000")]);
        assert_eq!(changed_meta(&job, &mut last).len(), 1);
        meta(&mut job, 100, 2, &[("comm_bytes", "4916001")]);
        assert!(changed_meta(&job, &mut last).is_empty());
        last.get_mut(&100).unwrap().0 -= META_EVERY;
        let again = changed_meta(&job, &mut last);
        assert!(again[0]
            .fields
            .contains(&("comm_bytes".into(), "4916001".into())));
    }
}
