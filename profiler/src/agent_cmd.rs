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
use std::time::Duration;

use anyhow::{bail, Context};
use stallscope_agent::markers::MarkerListener;
use stallscope_agent::node::feed::FeedHub;
use stallscope_agent::node::gpu_thread::spawn_gpu;
use stallscope_agent::node::recorder::{Event, Inbox, Recorder, Stderr};
use stallscope_agent::node::report::{shipping_tap, TrackSenders};
use stallscope_agent::sampler::{self, ExtraRoots, Pids, SamplerConfig, SharedPids};
use stallscope_agent::shipper::{Shipper, ShipperConfig};
use stallscope_analysis::frame::RunHeader;

use crate::cli::AgentArgs;
use crate::python_env;

/// Where an agent receives markers when neither `--socket` nor `$STALLSCOPE_SOCKET` says
/// (the marker package falls back to the same path).
pub const AGENT_SOCKET: &str = "/tmp/stallscope/agent.sock";

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
    let hub = Arc::new(FeedHub::default());
    let _metrics = stallscope_collector::metrics::serve_flag(args.metrics.as_deref(), &hub)?;
    let feed_socket = crate::run::open_feed(hub.clone(), "agent.feed");
    let recorder = Recorder::new(None, header, &node, Box::new(Stderr), false)
        .with_tap(shipping_tap(shipper.clone(), listener.clone()))
        .with_feed(hub);

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
    let gpu_sampler = spawn_gpu(&config, pids, inbox.clone()).map(|(handle, what)| {
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
    drop(feed_socket);
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
