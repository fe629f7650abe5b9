//! Several `stallscope run` profiles of one job (one per node, each on its own clock) joined
//! into the frames a collector would have written for it, so one report covers the job.
//!
//! Each profile is replayed through its own [`Journal`] as its node's agent would have, and
//! every attributed iteration becomes a [`Frame::NodeIteration`] with its collectives' spans,
//! every second of its samples a [`Frame::NodeResources`], its losses a [`Frame::NodeHealth`],
//! its GPUs' names (from its series' labels) a [`Frame::NodeGpus`].
//! The nodes' monotonic clocks are aligned through their wall clocks (each header holds both
//! at the run's start): the hosts' NTP is trusted to [`WALL_CLOCK_UNCERTAINTY_NS`], where a
//! collector would have measured the offsets. The collector's join then runs on them.

use crate::frame::{
    CommSpan, Frame, GpuIdentity, NodeClock, NodeGpus, NodeHealth, NodeIteration,
    NodeResourcesReport, RunEnd, RunHeader,
};
use crate::journal::replay::frame_time;
use crate::journal::Journal;
use crate::marker::phase;
use crate::view::NodeMeter;
use crate::Nanos;

/// ns the hosts' wall clocks are assumed to agree within (NTP on a LAN): the stated
/// uncertainty of a join of run profiles.
pub const WALL_CLOCK_UNCERTAINTY_NS: u64 = 10_000_000;

/// Where the joined clock starts, ns: the earliest run's start.
const JOINED_T0_NS: Nanos = 1_000_000_000;

/// Joins run profiles (`frames` per profile, in order) into one job's frames, in time order.
/// Errors name a profile that has no run header or is not a run's.
pub fn join_runs(profiles: &[(String, Vec<Frame>)]) -> Result<Vec<Frame>, String> {
    let mut headers = Vec::new();
    for (name, frames) in profiles {
        let h = frames
            .iter()
            .find_map(|f| match f {
                Frame::Header(h) => Some(h.clone()),
                _ => None,
            })
            .ok_or_else(|| format!("{name} has no run header: it cannot be joined"))?;
        if h.is_collectors() {
            return Err(format!(
                "{name} is already a job profile (a collector's): report it alone"
            ));
        }
        headers.push(h);
    }
    let base_unix = headers.iter().map(|h| h.started_unix_ns).min().unwrap_or(0);
    let mut timed: Vec<(Nanos, Frame)> = Vec::new();
    let mut end = RunEnd::default();
    let mut exit_code = 0;
    for ((name, frames), h) in profiles.iter().zip(&headers) {
        let node = if h.host.is_empty() {
            name.clone()
        } else {
            h.host.clone()
        };
        // node − collector: the node's monotonic start against its wall-clock start.
        let collector_start = (h.started_unix_ns - base_unix) as i128 + i128::from(JOINED_T0_NS);
        let offset = (h.started_mono_ns as i128 - collector_start) as i64;
        let to_joined = |t: Nanos| t.saturating_add_signed(-offset);
        timed.push((
            0,
            Frame::NodeClock(NodeClock {
                node: node.clone(),
                offset_ns: offset,
                drift_ppm: 0.0,
                at_ns: JOINED_T0_NS,
                uncertainty_ns: WALL_CLOCK_UNCERTAINTY_NS,
                samples: 0,
            }),
        ));
        let mut journal = Journal::reader("");
        let mut meter = NodeMeter::default();
        let mut health = NodeHealth {
            node: node.clone(),
            ..NodeHealth::default()
        };
        let mut gpus: Vec<GpuIdentity> = Vec::new();
        // A profile whose samples were thinned holds its one-second readings as frames.
        let mut thinned = false;
        for f in frames {
            journal.ingest(f);
            let reading = match f {
                Frame::SamplesThinned(_) => {
                    thinned = true;
                    None
                }
                Frame::NodeResources(r) if thinned => Some(r.resources.clone()),
                _ if thinned => None,
                Frame::End(_) => meter.flush(),
                _ => meter.ingest(f),
            };
            if let Some(r) = reading {
                let t = r.t_ns;
                timed.push((
                    to_joined(t),
                    Frame::NodeResources(Box::new(NodeResourcesReport {
                        node: node.clone(),
                        resources: r,
                    })),
                ));
            }
            match f {
                Frame::End(e) => {
                    end.ended_mono_ns = end.ended_mono_ns.max(to_joined(e.ended_mono_ns));
                    end.markers_dropped += e.markers_dropped;
                    end.markers_rejected += e.markers_rejected;
                    health.markers_rejected += e.markers_rejected;
                    if e.exit_code != 0 {
                        exit_code = e.exit_code;
                    }
                }
                Frame::Source(s) if !s.up => health.sources_down.push(s.clone()),
                Frame::Experiment(_) => timed.push((0, f.clone())),
                Frame::Series(d) => {
                    use crate::series::{LABEL_GPU, LABEL_MODEL, LABEL_UUID};
                    if let Some(gpu) = d.label(LABEL_GPU) {
                        if !gpus.iter().any(|g| g.gpu == gpu) {
                            gpus.push(GpuIdentity {
                                gpu: gpu.to_string(),
                                uuid: d.label(LABEL_UUID).map(str::to_string),
                                model: d.label(LABEL_MODEL).map(str::to_string),
                            });
                        }
                    }
                }
                _ => {}
            }
            if let Some(t) = frame_time(f) {
                end.ended_mono_ns = end.ended_mono_ns.max(to_joined(t));
            }
        }
        let new = journal.attribute(u64::MAX, true);
        let job = journal.timeline();
        health.markers_dropped = job.node.markers.dropped();
        for b in new {
            let marks = job.node.markers.procs.get(&b.pid);
            let comm = marks
                .map(|m| m.spans_within(b.start_ns, b.end_ns))
                .unwrap_or_default()
                .into_iter()
                .filter(|s| s.phase == phase::COMM)
                .map(|s| CommSpan {
                    begin: s.begin,
                    end: s.end,
                })
                .collect();
            let at = to_joined(b.end_ns);
            timed.push((
                at,
                Frame::NodeIteration(NodeIteration {
                    node: node.clone(),
                    world_size: marks.and_then(|m| m.info().world_size),
                    breakdown: b,
                    comm,
                }),
            ));
        }
        timed.push((end.ended_mono_ns, Frame::NodeHealth(health)));
        if !gpus.is_empty() {
            gpus.sort();
            timed.push((0, Frame::NodeGpus(NodeGpus { node, gpus })));
        }
    }
    timed.sort_by_key(|(t, _)| *t);
    let first = &headers[0];
    let mut out = vec![Frame::Header(RunHeader {
        stallscope_version: first.stallscope_version.clone(),
        host: String::new(),
        command: vec!["stallscope".into(), "collector".into()],
        started_unix_ns: base_unix,
        started_mono_ns: JOINED_T0_NS,
        rate_hz: first.rate_hz,
        warmup_iters: first.warmup_iters,
        cpus: first.cpus,
    })];
    out.extend(timed.into_iter().map(|(_, f)| f));
    end.exit_code = exit_code;
    out.push(Frame::End(end));
    Ok(out)
}
