//! What an agent ships to the collector: per attributed iteration, the rank's iteration with
//! the begin and end of its collectives (for the cross-node join) and what its GPU did; every
//! few seconds, the node's health (when it changed), its latest resource reading and its bytes
//! per NIC; its GPUs' names when known, changed, and every [`GPUS_EVERY`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use stallscope_analysis::attribution::IterationBreakdown;
use stallscope_analysis::clock::shift;
use stallscope_analysis::frame::{
    CommSpan, Frame, GpuIdentity, NodeGpus, NodeHealth, NodeIteration, NodeNics, NodeReport,
    NodeResourcesReport,
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
    Box::new(
        move |job: &JobTimeline, view: &JobView, new: &[IterationBreakdown]| {
            for b in new {
                shipper.push(Frame::NodeReport(Box::new(NodeReport {
                    iteration: node_iteration(job, b, offset),
                    gpu: job.gpu_reading(b.rank, b.iter).cloned(),
                })));
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
        },
    )
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
        if let Datagram::Marker(m) = &item {
            if let Ok(mut r) = self.roots.lock() {
                r.insert(m.pid);
            }
        }
        self.inbox.put(item)
    }
}
