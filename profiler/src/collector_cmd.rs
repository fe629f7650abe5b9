//! `stallscope collector`: the job side of a multi-node job.
//!
//! Composes the collector crate's ingest server and job task on a small tokio runtime, says
//! on stderr what happens to agents (joined, refused and why, gone, records dropped), prints a
//! live status every few seconds from the live feed, and at SIGINT/SIGTERM writes the end of
//! the job profile and prints the job summary.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use stallscope_analysis::frame::RunHeader;
use stallscope_analysis::slowdown;
use stallscope_analysis::summary::{render_text, Summary};
use stallscope_analysis::view::hub::{FeedHub, FeedMessage, SUBSCRIBER_QUEUE};
use stallscope_analysis::view::JobView;
use stallscope_collector::events::{JobEvent, EVENTS_CAPACITY};
use stallscope_collector::job::{self, JobTask};
use stallscope_collector::profile::ProfileWriter;
use stallscope_collector::server::{self, ServerConfig};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use tokio::sync::{broadcast, mpsc, watch};

use crate::cli::CollectorArgs;

/// Between two live status lines.
const STATUS_EVERY: Duration = Duration::from_secs(5);

/// Messages queued between the connections and the job task. A message holds what one read
/// of a connection took (at most [`server`]'s read chunk: about 60 records), so this bounds
/// the records waiting to about 250,000 — a second at 300,000 a second — and the memory they
/// hold; a collector that falls behind then slows its agents through TCP.
const INGEST_QUEUE: usize = 4_096;

/// The address to listen on, refusing a non-loopback one without a token.
pub fn listen_addr(listen: &str, has_token: bool) -> anyhow::Result<SocketAddr> {
    let addr = listen
        .to_socket_addrs()
        .with_context(|| format!("--listen {listen:?} is not an address (HOST:PORT)"))?
        .next()
        .with_context(|| format!("--listen {listen:?} resolves to no address"))?;
    if !addr.ip().is_loopback() && !has_token {
        bail!(
            "listening on {addr} (not loopback) requires --token-file: anyone who can reach it could send records into the job"
        );
    }
    Ok(addr)
}

fn say(update: &JobEvent) {
    match update {
        JobEvent::NodeUp { node, peer } => {
            eprintln!("stallscope collector: node {node} joined from {peer}")
        }
        JobEvent::NodeDown {
            node,
            peer,
            reason: Some(why),
        } => eprintln!(
            "stallscope collector: refused {} ({peer}): {why}",
            node.as_deref().unwrap_or("an agent")
        ),
        JobEvent::NodeDown {
            node: Some(node),
            reason: None,
            ..
        } => eprintln!("stallscope collector: node {node} left"),
        JobEvent::Slowdown(s) => eprintln!("{}", slowdown::describe(s)),
        JobEvent::Hang {
            report,
            answered_after_seconds,
        } => {
            eprintln!("{}", stallscope_analysis::hang::describe(report));
            match answered_after_seconds {
                Some(s) => eprintln!(
                    "stallscope collector: the agents answered within {s:.2} s of the request"
                ),
                None => eprintln!("stallscope collector: no agent answered the request"),
            }
        }
        JobEvent::HangResumed { after_seconds } => eprintln!(
            "stallscope: the job resumed: a rank finished an iteration {after_seconds:.0} s after the hang was declared"
        ),
        JobEvent::Dropped { node, records } => eprintln!(
            "stallscope collector: node {node} dropped {records} records while the collector was away (its buffer was full)"
        ),
        _ => {}
    }
}

/// Says what happens to agents as it happens.
async fn print_events(mut feed: broadcast::Receiver<JobEvent>) {
    loop {
        match feed.recv().await {
            Ok(u) => say(&u),
            Err(broadcast::error::RecvError::Lagged(_)) => {}
            Err(broadcast::error::RecvError::Closed) => break,
        }
    }
}

/// Prints the live status every [`STATUS_EVERY`], drawn from the live model as a feed
/// subscriber sees it (snapshot, then updates), until the job ends.
fn print_status(feed: Receiver<FeedMessage>) {
    let mut view: Option<JobView> = None;
    let mut last = Instant::now();
    loop {
        match feed.recv_timeout(Duration::from_millis(500)) {
            Ok(FeedMessage::Snapshot(v)) => view = Some((*v).clone()),
            Ok(FeedMessage::Update(u)) => {
                if let Some(v) = view.as_mut() {
                    v.apply((*u).clone());
                }
            }
            Ok(FeedMessage::End) | Err(RecvTimeoutError::Disconnected) => break,
            Err(RecvTimeoutError::Timeout) => {}
        }
        if last.elapsed() >= STATUS_EVERY {
            last = Instant::now();
            if let Some(v) = &view {
                eprintln!("{}", collector_status(v));
            }
        }
    }
}

/// The collector's status line: every node's clock offset, then the run's status line.
pub fn collector_status(v: &JobView) -> String {
    let nodes: Vec<String> = v
        .nodes
        .values()
        .filter_map(|n| {
            let (o, u) = (n.clock_offset_ns?, n.clock_uncertainty_ns?);
            Some(format!(
                "{} {:+.3}±{:.3} ms",
                n.node,
                o as f64 / 1e6,
                u as f64 / 1e6
            ))
        })
        .collect();
    format!(
        "stallscope collector: nodes [{}] · {}",
        nodes.join(", "),
        stallscope_dashboards::status::render(v)
    )
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// The collector's tasks, running on the current tokio runtime: the ingest server, the job
/// task and the feed printer. `stallscope collector` and the collector side of
/// `stallscope collector-bench` both start exactly this, so the benchmark measures the code a
/// user runs.
pub(crate) struct Collector {
    iterations: broadcast::Sender<JobEvent>,
    stop: watch::Sender<bool>,
    server: tokio::task::JoinHandle<()>,
    job: tokio::sync::oneshot::Receiver<(Summary, Option<String>)>,
    printer: tokio::task::JoinHandle<()>,
}

impl Collector {
    /// Starts serving `listener`, writing the job profile with `writer` from `header`, and
    /// publishing the live model of job `name` to `hub`.
    /// `hang_after_ns`: see [`JobTask::with_hang_watch`].
    pub(crate) fn start(
        listener: tokio::net::TcpListener,
        mut config: ServerConfig,
        writer: ProfileWriter,
        header: RunHeader,
        (name, hub): (&str, Arc<FeedHub>),
        (quiet, hang_after_ns): (bool, Option<u64>),
    ) -> Collector {
        let (asks, asks_rx) = watch::channel(0);
        config.stacks_asked = Some(asks_rx);
        let (feed, feed_rx) = broadcast::channel(EVENTS_CAPACITY);
        let (stop, stop_rx) = watch::channel(false);
        let (tx, rx) = mpsc::channel(INGEST_QUEUE);
        let server = tokio::spawn(server::serve(listener, config, tx, stop_rx.clone()));
        let printer = tokio::spawn(print_events(feed_rx));
        if !quiet {
            let rx = hub.subscribe(SUBSCRIBER_QUEUE);
            let _ = std::thread::Builder::new()
                .name("stallscope-status".into())
                .spawn(move || print_status(rx));
        }
        let task =
            JobTask::new(writer, header, name, feed, hub).with_hang_watch(hang_after_ns, asks);
        let iterations = task.iteration_events();
        let job = spawn_job_thread(task, rx, stop_rx);
        Collector {
            iterations,
            stop,
            server,
            job,
            printer,
        }
    }

    /// A new subscriber to the rank-iterations as they arrive ([`JobEvent::Iteration`]).
    pub(crate) fn subscribe_iterations(&self) -> broadcast::Receiver<JobEvent> {
        self.iterations.subscribe()
    }

    /// Stops accepting, ends the job profile and returns the job summary and any write error.
    pub(crate) async fn stop(self) -> anyhow::Result<(Summary, Option<String>)> {
        let _ = self.stop.send(true);
        let _ = self.server.await;
        let result = self.job.await.context("the job task panicked")?;
        // Let the printer say the last node events.
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.printer.abort();
        Ok(result)
    }
}

/// Name of the job task's thread, as `top -H` and `/proc/PID/task/*/comm` show it.
pub(crate) const JOB_THREAD: &str = "stallscope-job";

/// Runs the job task on a thread of its own (a current-thread runtime for its timer and
/// channels): everything a connection receives goes through it, so among thousands of
/// connection tasks on the shared workers it would be polled once per round of them, and the
/// readers would decode far ahead of it (10,000 ranks: 190 frames/s joined while 250,000 a
/// second were read). On its own thread it has the CPU the scheduler gives a thread.
fn spawn_job_thread(
    task: JobTask,
    rx: mpsc::Receiver<server::Ingest>,
    stop: watch::Receiver<bool>,
) -> tokio::sync::oneshot::Receiver<(Summary, Option<String>)> {
    let (done_tx, done) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name(JOB_THREAD.into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a current-thread runtime for the job task");
            let _ = done_tx.send(rt.block_on(job::run(task, rx, stop)));
        });
    if let Err(e) = spawned {
        eprintln!("stallscope collector: cannot start the job task's thread ({e})");
    }
    done
}

/// The collector's runtime: one worker thread for the connections, whatever the machine (the
/// collector shares its node with other work; the job task has a thread of its own). Two
/// workers, at 1,250 agents, spent a fifth of their time parking and waking each other.
pub(crate) fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("stallscope-collector")
        .enable_all()
        .build()
}

/// Raises this process's soft limit on open files to its hard limit: every agent holds one
/// socket, and the usual soft limit of 1,024 would refuse agents beyond it. Returns the
/// limit now in force.
pub(crate) fn raise_nofile_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write the rlimit we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 0;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim = raised;
            }
        }
    }
    lim.rlim_cur
}

/// Runs the collector until SIGINT or SIGTERM; exit code 0.
pub fn collector(args: CollectorArgs) -> anyhow::Result<i32> {
    stallscope_agent::node::sweep::sweep_leftovers();
    let token = match &args.token_file {
        Some(p) => Some(crate::agent_cmd::read_token(p)?),
        None => None,
    };
    let addr = listen_addr(&args.listen, token.is_some())?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(stallscope_collector::tls::server_config(cert, key)?),
        (None, None) => None,
        _ => bail!("--tls-cert and --tls-key go together"),
    };
    let out = args.out.clone().unwrap_or_else(|| {
        let p = crate::run::default_profile_path();
        p.with_file_name(format!("job-{}", p.display()))
    });
    let writer = ProfileWriter::append(&out)
        .with_context(|| format!("cannot write the job profile {}", out.display()))?;
    let header = RunHeader {
        command: vec!["stallscope".into(), "collector".into()],
        started_mono_ns: stallscope_collector::monotonic_ns(),
        ..stallscope_agent::node::header(&[], 0.0, args.warmup)
    };
    raise_nofile_limit();
    let rt = runtime().context("cannot start the collector's runtime")?;
    let (summary, write_error) = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        eprintln!(
            "stallscope collector: listening on {addr} ({}{}), writing {}",
            if token.is_some() {
                "token required"
            } else {
                "loopback only, no token"
            },
            match &args.tls_cert {
                Some(cert) if tls.is_some() => format!(
                    ", TLS with {}: agents and viewers need --tls-ca",
                    cert.display()
                ),
                _ => String::new(),
            },
            out.display()
        );
        let hub = Arc::new(FeedHub::default());
        let config = ServerConfig {
            token,
            feed: Some(hub.clone()),
            tls,
            ..ServerConfig::default()
        };
        let _metrics = stallscope_metrics::serve_flag(args.metrics.as_deref(), &hub)?;
        let _feed_socket = stallscope_agent::node::feed::open(
            hub.clone(),
            &format!("collector-{}.feed", addr.port()),
        );
        let name = args.job.clone().unwrap_or_else(|| "job".into());
        let hang_after = args.hang_after.map(|s| (s * 1e9) as u64);
        let collector = Collector::start(
            listener,
            config,
            writer,
            header,
            (&name, hub),
            (args.quiet, hang_after),
        );
        shutdown_signal().await;
        collector.stop().await
    })?;
    if let Some(e) = write_error {
        eprintln!("stallscope collector: the job profile could not be written to the end: {e}");
    }
    let mut summary = summary;
    summary.profile = Some(out.display().to_string());
    eprint!("{}", render_text(&summary));
    if let Some(path) = &args.summary_json {
        crate::run::write_json(Path::new(path), &summary)?;
    }
    Ok(0)
}
