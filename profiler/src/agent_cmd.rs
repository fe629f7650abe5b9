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
use std::path::Path;
use std::sync::mpsc::channel;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use stallscope_agent::markers::MarkerListener;
use stallscope_agent::node::feed::{self, FeedHub};
use stallscope_agent::node::recorder::{Event, Inbox, Recorder, Stderr};
use stallscope_agent::node::shipping::{shipping_tap, TrackSenders};
use stallscope_agent::node::{agent_socket, check_rate, header, host_name, NodeInputs, Samplers};
use stallscope_agent::sampler::ExtraRoots;
use stallscope_agent::shipper::{Shipper, ShipperConfig};
use stallscope_analysis::frame::RunHeader;

use crate::cli::AgentArgs;
use crate::python_env;

/// How long the agent waits at exit for the collector to acknowledge what is left.
const DRAIN_WITHIN: Duration = Duration::from_secs(10);

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
    check_rate(args.rate).map_err(anyhow::Error::msg)?;
    if args.buffer == 0 {
        bail!("--buffer must hold at least one record");
    }
    let token = match &args.token_file {
        Some(p) => read_token(p)?,
        None => String::new(),
    };
    let tls = args.tls.client(&args.collector)?;
    let node = match &args.node {
        Some(n) => n.clone(),
        None => host_name(),
    };
    let socket = agent_socket(args.socket.as_deref())
        .context("cannot set up the agent's runtime directory")?;
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    // SAFETY: getuid cannot fail.
    let shared = unsafe { libc::getuid() } == 0;
    let shipper = Arc::new(
        Shipper::spawn(ShipperConfig {
            collector: args.collector.clone(),
            token,
            node: node.clone(),
            buffer_records: args.buffer,
            clock_offset_ns: args.clock_offset_ms * 1_000_000,
            tls: tls.clone(),
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
    // A root agent serves the trainings of every user on the node: they may send to its
    // socket. Any other agent serves its own user only. The default directory is one only
    // this user can write in (`runtime_dir`), so setting the mode by path cannot be raced.
    use std::os::unix::fs::PermissionsExt;
    let mode = if shared { 0o666 } else { 0o600 };
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set the mode of {}", socket.display()))?;

    stallscope_agent::node::sweep::sweep_leftovers();
    let (pydir, _pydir_claim) = python_dir(shared)?;
    let pythonpath = python_env::install_shared(pydir.path()).ok();
    eprintln!(
        "stallscope agent: node {node}, markers on {}, shipping to {}{}",
        socket.display(),
        args.collector,
        match &tls {
            Some(t) => format!(
                " over TLS (trusting {}, certificate for {})",
                args.tls
                    .tls_ca
                    .as_deref()
                    .unwrap_or(Path::new(""))
                    .display(),
                t.name()
            ),
            None => String::new(),
        }
    );
    if let Some(p) = &pythonpath {
        eprintln!("stallscope agent: {}", zero_code_instruction(p, &socket));
    }

    let listener = Arc::new(listener);
    let (recorder, feed_socket, _metrics) = recorder_of(&node, &args, &shipper, &listener)?;

    let samplers = Samplers::start(
        args.rate,
        NodeInputs::machine(args.roots.roots()),
        0,
        Some(roots),
        recorder.news.clone(),
        &inbox,
    );
    if let Some(what) = &samplers.gpu_described {
        eprintln!("stallscope agent: GPU sources: {what}");
    }
    if let Some(why) = &samplers.gpu_missing {
        eprintln!("stallscope agent: {why}; no GPU sources");
    }

    finish_on_signal(tx.clone())?;
    let summary = {
        let listener = listener.clone();
        recorder.run(rx, inbox, move || listener.rejected())
    };
    samplers.stop();
    drop(listener);
    drop(feed_socket);
    let shipper = Arc::try_unwrap(shipper).map_err(|_| anyhow::anyhow!("shipper still shared"))?;
    drain(shipper, &summary);
    Ok(0)
}

/// Where the agent writes the marker package and hook for its users: `python/` in its runtime
/// directory (readable by every user for a root agent), removed when the agent ends.
/// Claimed while the agent lives, so a later agent or run sweeps it if this one is killed.
fn python_dir(
    shared: bool,
) -> anyhow::Result<(
    tempfile::TempDir,
    Option<stallscope_agent::node::sweep::Claim>,
)> {
    let runtime = stallscope_agent::node::runtime_dir(shared)
        .context("cannot set up the agent's runtime directory")?;
    let dir = tempfile::Builder::new()
        .prefix("python-")
        .tempdir_in(runtime)
        .context("cannot create the agent's Python directory")?;
    let claim = stallscope_agent::node::sweep::claim(dir.path()).ok();
    Ok((dir, claim))
}

/// What a user does to have a training send its markers to this agent with no code change,
/// as words a shell takes as they are (a path with a space is quoted).
fn zero_code_instruction(pythonpath: &str, socket: &Path) -> String {
    use crate::launch::shell_word;
    format!(
        "zero-code PyTorch markers: start the training with PYTHONPATH={}${{PYTHONPATH:+:$PYTHONPATH}} STALLSCOPE_SOCKET={} (or under `stallscope run`, which joins this agent)",
        shell_word(pythonpath),
        shell_word(&socket.display().to_string())
    )
}

/// The agent's recorder: no profile, every attributed iteration shipped, the model on the
/// node's `agent.feed` (returned, to be dropped at the end).
fn recorder_of(
    node: &str,
    args: &AgentArgs,
    shipper: &Arc<Shipper>,
    listener: &Arc<MarkerListener>,
) -> anyhow::Result<(
    Recorder,
    Option<feed::FeedSocket>,
    Option<stallscope_metrics::MetricsServer>,
)> {
    // The node's name (--node) names it in the live model and its views.
    let header = RunHeader {
        command: vec!["stallscope".into(), "agent".into()],
        host: node.to_string(),
        ..header(&[], args.rate, 0)
    };
    let hub = Arc::new(FeedHub::default());
    let metrics = stallscope_metrics::serve_flag(args.metrics.as_deref(), &hub)?;
    let feed_socket = feed::open(hub.clone(), "agent.feed");
    let recorder = Recorder::new(None, header, "", Box::new(Stderr), false)
        .with_tap(shipping_tap(shipper.clone(), listener.clone()))
        .with_feed(hub);
    Ok((recorder, feed_socket, metrics))
}

/// Sends `Event::Finish` on SIGINT or SIGTERM.
fn finish_on_signal(tx: std::sync::mpsc::Sender<Event>) -> anyhow::Result<()> {
    let mut signals =
        signal_hook::iterator::Signals::new([libc::SIGINT, libc::SIGTERM]).context("signals")?;
    std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            let _ = tx.send(Event::Finish(0));
        }
    });
    Ok(())
}

/// Waits (bounded) for the collector to acknowledge what is left, and says what was not
/// delivered.
fn drain(shipper: Shipper, summary: &stallscope_analysis::summary::Summary) {
    let dropped = shipper.dropped();
    let left = shipper.finish(DRAIN_WITHIN);
    eprintln!(
        "stallscope agent: {} iterations of {} ranks attributed; {} records undelivered, {} dropped while the collector was away",
        summary.job.iterations,
        summary.ranks.len(),
        left,
        dropped
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 17, item 12: the instruction names both what the hook needs, the package and
    /// the socket, so it works for a user whose environment has neither.
    #[test]
    fn the_zero_code_instruction_gives_the_path_and_the_socket() {
        let said = zero_code_instruction(
            "/run/stallscope/python-x/site:/run/stallscope/python-x/pkg",
            Path::new("/run/stallscope/agent.sock"),
        );
        assert!(
            said.contains("PYTHONPATH=/run/stallscope/python-x/site:/run/stallscope/python-x/pkg"),
            "{said}"
        );
        assert!(
            said.contains("STALLSCOPE_SOCKET=/run/stallscope/agent.sock"),
            "{said}"
        );
    }

    /// A runtime directory with a space in its path (`$XDG_RUNTIME_DIR` is the user's) still
    /// gives words a shell takes as one: what the shell sets is the paths.
    #[test]
    fn the_instruction_quotes_paths_a_shell_would_split() {
        let said = zero_code_instruction(
            "/tmp/my dir/site:/tmp/my dir/pkg",
            Path::new("/tmp/my dir/agent.sock"),
        );
        let words = said
            .split_once("start the training with ")
            .and_then(|(_, rest)| rest.split_once(" (or under"))
            .map(|(w, _)| w.to_string())
            .expect(&said);
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "PYTHONPATH= {words} sh -c 'printf \"%s|%s\" \"$PYTHONPATH\" \"$STALLSCOPE_SOCKET\"'"
            ))
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "/tmp/my dir/site:/tmp/my dir/pkg|/tmp/my dir/agent.sock",
            "{said}"
        );
    }
}
