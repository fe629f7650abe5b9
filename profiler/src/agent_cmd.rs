//! `stallscope agent`: the node side of a multi-node job.
//!
//! It is `stallscope run` without the command: the same marker listener, sampler and recorder
//! attribute the node's ranks, but the ranks are whatever processes send markers to the
//! agent's socket (their subtrees are sampled), no profile is written on the node, and every
//! attributed iteration goes to the collector through the shipper, on the node's clock, with
//! the begin and end of its collectives for the cross-node join. Runs until SIGINT or SIGTERM,
//! then attributes what is left, waits (bounded) for the collector to acknowledge it, and says
//! what could not be delivered.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::mpsc::channel;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use stallscope_agent::markers::{MarkerEvent, MarkerListener};
use stallscope_agent::sampler::{self, ExtraRoots, Pids, SamplerConfig, SharedPids};
use stallscope_agent::shipper::{Shipper, ShipperConfig};
use stallscope_agent::sink::Sink;
use stallscope_analysis::attribution::IterationBreakdown;
use stallscope_analysis::frame::{
    CommSpan, Frame, NodeHealth, NodeIteration, NodeReport, RunHeader,
};
use stallscope_analysis::job::JobTimeline;
use stallscope_analysis::marker::phase;

use crate::cli::AgentArgs;
use crate::python_env;
use crate::recorder::{Event, Inbox, Recorder, Tap};

/// Where an agent receives markers when neither `--socket` nor `$STALLSCOPE_SOCKET` says
/// (the marker package falls back to the same path).
pub const AGENT_SOCKET: &str = "/tmp/stallscope/agent.sock";

/// How often the node's health goes to the collector (when it changed).
const HEALTH_EVERY: Duration = Duration::from_secs(2);

/// How long the agent waits at exit for the collector to acknowledge what is left.
const DRAIN_WITHIN: Duration = Duration::from_secs(10);

/// The agent's marker socket: `--socket`, `$STALLSCOPE_SOCKET`, or [`AGENT_SOCKET`].
pub fn agent_socket(given: Option<&Path>) -> PathBuf {
    given
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("STALLSCOPE_SOCKET").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(AGENT_SOCKET))
}

/// Reads a token file: its first line, which must not be empty.
pub fn read_token(path: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the token file {}", path.display()))?;
    let token = text.lines().next().unwrap_or("").trim().to_string();
    if token.is_empty() {
        bail!("the token file {} is empty", path.display());
    }
    Ok(token)
}

/// Hands markers on, and makes every process that sends one a root of the sampled job.
#[derive(Clone)]
struct TrackSenders {
    inbox: Inbox,
    roots: ExtraRoots,
}

impl Sink<MarkerEvent> for TrackSenders {
    fn put(&self, item: MarkerEvent) -> bool {
        if let MarkerEvent::Marker(m) = &item {
            if let Ok(mut r) = self.roots.lock() {
                r.insert(m.pid);
            }
        }
        self.inbox.put(item)
    }
}

/// Moves a node time by the injected offset.
fn shift(t: u64, by: i64) -> u64 {
    (t as i64).saturating_add(by).max(0) as u64
}

/// What the collector needs of one attributed iteration.
fn node_iteration(job: &JobTimeline, b: &IterationBreakdown, offset: i64) -> NodeIteration {
    let marks = job.markers.procs.get(&b.pid);
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
    let world_size = marks.and_then(|m| m.meta.get("world_size").and_then(|w| w.parse().ok()));
    let mut breakdown = b.clone();
    breakdown.start_ns = shift(b.start_ns, offset);
    breakdown.end_ns = shift(b.end_ns, offset);
    NodeIteration {
        node: String::new(),
        breakdown,
        comm,
        world_size,
    }
}

fn tap(shipper: Arc<Shipper>, listener: Arc<MarkerListener>) -> Tap {
    let offset = shipper.clock_offset_ns();
    let mut last_health: Option<(Instant, NodeHealth)> = None;
    Box::new(move |job: &JobTimeline, new: &[IterationBreakdown]| {
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
            markers_dropped: job.markers.dropped(),
            markers_rejected: listener.rejected(),
            sources_down: job.sources.values().filter(|s| !s.up).cloned().collect(),
        };
        if last_health.as_ref().is_none_or(|(_, h)| *h != health) {
            shipper.push(Frame::NodeHealth(health.clone()));
        }
        last_health = Some((Instant::now(), health));
    })
}

/// Runs the agent until SIGINT or SIGTERM; exit code 0.
pub fn agent(args: AgentArgs) -> anyhow::Result<i32> {
    if !(args.rate > 0.0 && args.rate <= 10_000.0) {
        bail!("--rate must be between 0 and 10000 Hz, not {}", args.rate);
    }
    if args.buffer == 0 {
        bail!("--buffer must hold at least one record");
    }
    let token = match &args.token_file {
        Some(p) => read_token(p)?,
        None => String::new(),
    };
    let node = match &args.node {
        Some(n) => n.clone(),
        None => crate::run::host_name(),
    };
    let socket = agent_socket(args.socket.as_deref());
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let shipper = Arc::new(
        Shipper::spawn(ShipperConfig {
            collector: args.collector.clone(),
            token,
            node: node.clone(),
            buffer_records: args.buffer,
            clock_offset_ns: args.clock_offset_ms * 1_000_000,
        })
        .context("cannot start the shipper thread")?,
    );

    let (tx, rx) = channel::<Event>();
    let inbox = Inbox::default();
    let roots: ExtraRoots = Arc::new(Mutex::new(BTreeSet::new()));
    let listener = MarkerListener::bind(
        &socket,
        TrackSenders {
            inbox: inbox.clone(),
            roots: roots.clone(),
        },
    )
    .with_context(|| format!("cannot listen for markers on {}", socket.display()))?;
    // Training processes of any user on the node may send markers.
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o777));

    let pydir = tempfile::Builder::new()
        .prefix("stallscope-agent-")
        .tempdir()
        .context("cannot create the agent's directory")?;
    let pythonpath = python_env::install(pydir.path(), true).ok();
    eprintln!(
        "stallscope agent: node {node}, markers on {}, shipping to {}",
        socket.display(),
        args.collector
    );
    if let Some(p) = &pythonpath {
        eprintln!(
            "stallscope agent: zero-code PyTorch markers: start the training with PYTHONPATH={p} (or under `stallscope run`, which joins this agent)"
        );
    }

    let header = RunHeader {
        command: vec!["stallscope".into(), "agent".into()],
        ..crate::run::header_for(&[], args.rate, 0)
    };
    let listener = Arc::new(listener);
    let recorder = Recorder::unwritten(header).with_tap(tap(shipper.clone(), listener.clone()));

    let pids = SharedPids::default();
    let config = SamplerConfig {
        rate_hz: args.rate,
        roots: args.roots.roots(),
        pids: Pids::DiscoverAndPublish(pids.clone()),
        extra_roots: Some(roots),
        loops: Some(recorder.loops.clone()),
        ..SamplerConfig::new(0)
    };
    let sampler = sampler::spawn(
        config.clone(),
        sampler::default_sources(&config.roots),
        inbox.clone(),
    );
    let gpu_sampler = crate::run::spawn_gpu(&config, pids, inbox.clone()).map(|(handle, what)| {
        eprintln!("stallscope agent: GPU sources: {what}");
        handle
    });

    let mut signals =
        signal_hook::iterator::Signals::new([libc::SIGINT, libc::SIGTERM]).context("signals")?;
    {
        let tx = tx.clone();
        std::thread::spawn(move || {
            if signals.forever().next().is_some() {
                let _ = tx.send(Event::Finish(0));
            }
        });
    }
    let summary = {
        let listener = listener.clone();
        recorder.run(rx, inbox, move || listener.rejected())
    };
    sampler.stop();
    if let Some(g) = gpu_sampler {
        g.stop();
    }
    drop(listener);
    let shipper = Arc::try_unwrap(shipper).map_err(|_| anyhow::anyhow!("shipper still shared"))?;
    let dropped = shipper.dropped();
    let left = shipper.finish(DRAIN_WITHIN);
    eprintln!(
        "stallscope agent: {} iterations of {} ranks attributed; {} records undelivered, {} dropped while the collector was away",
        summary.job.iterations,
        summary.ranks.len(),
        left,
        dropped
    );
    Ok(0)
}
