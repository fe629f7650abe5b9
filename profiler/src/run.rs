//! `stallscope run -- COMMAND`: one process that holds an agent and a collector, so that one
//! command on one machine profiles a whole training.
//!
//! The command starts first and never waits on stallscope: if the marker socket, a source or
//! the profile fails, the failure is said once and the training goes on. stallscope exits the
//! way the command exited.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;

use anyhow::Context;
use regex::bytes::Regex;
use stallscope_agent::clock::monotonic_ns;
use stallscope_agent::markers::MarkerListener;
use stallscope_agent::node::feed::{self, FeedHub};
use stallscope_agent::node::recorder::{Event, Inbox, Recorder};
use stallscope_agent::node::sweep;
use stallscope_agent::node::{agent_candidates, check_rate, NodeInputs, Samplers};
use stallscope_analysis::frame::RunHeader;
use stallscope_analysis::journal::retention::Retention;
use stallscope_analysis::journal::thinning::Thinning;
use stallscope_analysis::journal::FrameSink;
use stallscope_analysis::marker::{Marker, MarkerEvent};
use stallscope_analysis::summary::render_text;
use stallscope_collector::profile::ProfileWriter;

use crate::child::{exit_code, exit_like, Job};
use crate::cli::RunArgs;
use crate::forward::{reap, Forwarder};
use crate::python_env;
use crate::terminal::StatusLine;
use crate::top::run_tui;

/// The default profile name: `stallscope-YYYYMMDD-HHMMSS.stallscope` in local time.
pub fn default_profile_path() -> PathBuf {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as libc::time_t)
        .unwrap_or(0);
    // SAFETY: localtime_r writes into the tm we own.
    let tm = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&now, &mut tm);
        tm
    };
    PathBuf::from(format!(
        "stallscope-{:04}{:02}{:02}-{:02}{:02}{:02}.stallscope",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    ))
}

fn header(args: &RunArgs) -> RunHeader {
    stallscope_agent::node::header(&args.command, args.rate, args.warmup)
}

/// Reads the forwarder's copy of the command's stdout (the forwarder writes it to the user:
/// [`crate::forward`]) line by line and turns matching lines into steps.
fn read_steps(stdout: impl std::io::Read, regex: Regex, pid: u32, tx: Sender<Event>) {
    let mut reader = BufReader::new(stdout);
    let mut line = Vec::new();
    let mut seq = 0u64;
    let mut counted = 0u64;
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let t_ns = monotonic_ns();
        let text = line.strip_suffix(b"\n").unwrap_or(&line);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        let Some(caps) = regex.captures(text) else {
            continue;
        };
        let group = |name: &str| {
            caps.name(name)
                .and_then(|m| std::str::from_utf8(m.as_bytes()).ok())
                .and_then(|s| s.parse::<u64>().ok())
        };
        let rank = group("rank").map_or(0, |r| r as u32);
        let iter = group("iter").unwrap_or(counted);
        counted += 1;
        let m = Marker {
            seq,
            t_ns,
            pid,
            rank: Some(rank),
            iter,
            event: MarkerEvent::Step,
        };
        seq += 1;
        let _ = tx.send(Event::RegexStep(m));
    }
}

/// The training command with what it needs to send markers: the socket, and the Python
/// package (plus, unless `--no-auto`, the PyTorch hook) written into `dir` and put on
/// `PYTHONPATH`. A hook that cannot be written is said once; the command runs regardless.
fn training_command(args: &RunArgs, socket: &Path, dir: &Path) -> Command {
    let mut command = Command::new(&args.command[0]);
    command.args(&args.command[1..]);
    command.env("STALLSCOPE_SOCKET", socket);
    match python_env::install(dir, !args.no_auto) {
        Ok(pythonpath) => {
            command.env("PYTHONPATH", pythonpath);
        }
        Err(e) => eprintln!(
            "stallscope: cannot write the Python hook ({e}); PyTorch will not be instrumented"
        ),
    }
    if args.no_auto {
        command.env("STALLSCOPE_AUTO", "0");
    }
    command
}

/// The directory for the run's socket and Python files, removed when the run ends, and
/// claimed while it runs so that a later run sweeps it if this one is killed
/// (`agent::node::sweep`).
struct RunDir {
    dir: tempfile::TempDir,
    _claim: Option<sweep::Claim>,
}

impl RunDir {
    fn path(&self) -> &Path {
        self.dir.path()
    }
}

fn run_dir() -> anyhow::Result<RunDir> {
    let dir = tempfile::Builder::new()
        .prefix("stallscope-")
        .tempdir()
        .context("cannot create the run directory")?;
    let claim = sweep::claim(dir.path()).ok();
    Ok(RunDir { dir, _claim: claim })
}

/// Runs the command under stallscope and returns the exit code to leave with (unless the
/// command died of a signal, in which case stallscope dies of the same signal).
pub fn run(args: RunArgs) -> anyhow::Result<i32> {
    check_rate(args.rate).map_err(anyhow::Error::msg)?;
    sweep::sweep_leftovers();
    if let Some(socket) = answering_agent() {
        return join_agent(&args, &socket);
    }
    let recorded = record(&args, &[])?;
    sweep::sweep_leftovers();
    eprint!("{}", render_text(&recorded.summary));
    if let Some(path) = &args.summary_json {
        write_json(path, &recorded.summary)?;
    }
    exit_like(&recorded.status)
}

/// A command run under stallscope.
pub struct Recorded {
    /// How the command ended.
    pub status: std::process::ExitStatus,
    /// The run's summary, as printed at the end of `stallscope run`.
    pub summary: stallscope_analysis::summary::Summary,
    /// Where the profile was written.
    pub profile: PathBuf,
}

/// Runs the command under stallscope with `extra_env` added to its environment, writes the
/// profile and returns the summary; prints nothing but the live status.
pub fn record(args: &RunArgs, extra_env: &[(String, String)]) -> anyhow::Result<Recorded> {
    let cpu_before = own_cpu_seconds();
    check_rate(args.rate).map_err(anyhow::Error::msg)?;
    let regex = iter_regex(args)?;
    let profile_path = args.output.clone().unwrap_or_else(default_profile_path);
    let writer = ProfileWriter::create(&profile_path)
        .with_context(|| format!("cannot create the profile {}", profile_path.display()))?
        .deflating();
    let dir = run_dir()?;
    let socket = dir.path().join("markers.sock");

    let (tx, rx) = channel::<Event>();
    let inbox = Inbox::default();
    let listener = listen(&socket, &inbox);
    let mut command = training_command(args, &socket, dir.path());
    command.envs(extra_env.iter().map(|(k, v)| (k, v)));
    let tui_log = (args.tui && run_tui::usable()).then(|| run_tui::log_path(&profile_path));
    let log_file = match &tui_log {
        Some(path) => Some(
            std::fs::File::create(path)
                .with_context(|| format!("cannot create the log {}", path.display()))?,
        ),
        None => None,
    };
    if let Some(log) = &log_file {
        // The training writes to a file, not a pipe: it never gets SIGPIPE from stallscope.
        command.stdout(log.try_clone()?);
        command.stderr(log.try_clone()?);
        command.stdin(Stdio::null());
        command.env("PYTHONUNBUFFERED", "1");
    }
    let forwarder = match &regex {
        Some(_) => {
            let out = match log_file.as_ref().map(|f| f.try_clone()) {
                Some(Ok(f)) => Stdio::from(f),
                _ => Stdio::inherit(),
            };
            let (forwarder, training_stdout) = Forwarder::spawn(out)?;
            command.stdout(training_stdout);
            // Python buffers a piped stdout; lines must arrive when printed to time iterations.
            command.env("PYTHONUNBUFFERED", "1");
            Some(forwarder)
        }
        None => None,
    };
    let Outlets {
        recorder,
        feed_socket,
        metrics: _metrics,
        hub,
    } = recorder_of(args, writer, tui_log.is_some(), &profile_path)?;
    let mut job = match tui_log {
        Some(_) => Job::spawn_keeping_terminal(command),
        None => Job::spawn(command),
    }
    .with_context(|| format!("cannot run {:?}", args.command[0]))?;
    let pid = job.pid();
    // The parent's end of the training's pipe closed with the command `Job::spawn` took, so
    // the forwarder sees the end of the output when the training's side closes.
    let stdout_thread = regex.zip(forwarder).map(|(re, forwarder)| {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let Forwarder { child, copies } = forwarder;
            read_steps(copies, re, pid, tx);
            reap(child);
        })
    });
    let dashboard = match &tui_log {
        Some(log) => {
            let at = feed_socket.as_ref().map_or_else(
                || "this run".to_string(),
                |s| s.path().display().to_string(),
            );
            match run_tui::start(&hub, log, at) {
                Ok(d) => Some(d),
                Err(e) => {
                    eprintln!("stallscope: no dashboard ({e}); the run goes on");
                    None
                }
            }
        }
        None => None,
    };

    let descendants = recorder.descendants.clone();
    let samplers = Samplers::start(
        args.rate,
        NodeInputs::machine(args.roots.roots()),
        pid,
        None,
        recorder.news.clone(),
        &inbox,
    );
    if let Some(why) = samplers.gpu_missing.as_ref().filter(|_| !args.quiet) {
        eprintln!("stallscope: {why}; no GPU sources");
    }
    let rejected = Arc::new(AtomicU64::new(0));
    let recorder_thread = {
        let rejected = rejected.clone();
        std::thread::Builder::new()
            .name("stallscope-recorder".into())
            .spawn(move || recorder.run(rx, inbox, move || rejected.load(Ordering::Relaxed)))?
    };

    let status = job.wait()?;
    if let Some(d) = dashboard {
        d.finish();
    }
    samplers.stop();
    let found: Vec<(u32, u64)> = descendants.lock().map(|d| d.clone()).unwrap_or_default();
    job.end_leftovers(&found);
    if let Some(l) = &listener {
        rejected.store(l.rejected(), Ordering::Relaxed);
    }
    drop(listener);
    if let Some(t) = stdout_thread {
        let _ = t.join();
    }
    let _ = tx.send(Event::Finish(exit_code(&status)));
    drop(tx);
    let mut summary = recorder_thread
        .join()
        .map_err(|_| anyhow::anyhow!("the recorder thread panicked"))?;
    summary.profile = Some(profile_path.display().to_string());
    summary.profiler_cpu_seconds = Some(own_cpu_seconds() - cpu_before);
    drop(dir);
    drop(feed_socket);
    Ok(Recorded {
        status,
        summary,
        profile: profile_path,
    })
}

/// `--iter-regex`, compiled.
fn iter_regex(args: &RunArgs) -> anyhow::Result<Option<Regex>> {
    args.iter_regex
        .as_deref()
        .map(|r| {
            Regex::new(r)
                .with_context(|| format!("--iter-regex {r:?} is not a valid regular expression"))
        })
        .transpose()
}

/// The marker listener on `socket`; without it (said once) the run goes on unmarked.
fn listen(socket: &Path, inbox: &Inbox) -> Option<MarkerListener> {
    match MarkerListener::bind(socket, inbox.clone()) {
        Ok(l) => Some(l),
        Err(e) => {
            eprintln!(
                "stallscope: cannot listen for markers on {} ({e}); iterations will not be seen",
                socket.display()
            );
            None
        }
    }
}

/// What a run's journal feeds: the recorder, the feed socket, `/metrics` (kept until the end
/// of the run) and the hub an in-process dashboard subscribes to.
struct Outlets {
    recorder: Recorder,
    feed_socket: Option<feed::FeedSocket>,
    metrics: Option<stallscope_metrics::MetricsServer>,
    hub: Arc<FeedHub>,
}

/// The run's recorder, writing to `writer`, drawing the status line (unless `tui`: the
/// dashboard takes its place), publishing its model on the run's feed socket and, with
/// `--metrics`, on `/metrics`.
fn recorder_of(
    args: &RunArgs,
    writer: ProfileWriter,
    tui: bool,
    profile: &std::path::Path,
) -> anyhow::Result<Outlets> {
    let header = header(args);
    let name = args
        .job
        .clone()
        .unwrap_or_else(|| stallscope_analysis::view::job_name(&header.command));
    let hub = Arc::new(FeedHub::default());
    let metrics = stallscope_metrics::serve_flag(args.metrics.as_deref(), &hub)?;
    let feed_socket = feed::open(hub.clone(), &format!("run-{}.feed", std::process::id()));
    // Markers and breakdowns packed column by column, whatever is kept.
    let packed = Box::new(stallscope_analysis::journal::packing::Packing::new(
        Box::new(writer),
    ));
    let (sink, keeper): (Box<dyn FrameSink>, _) = if args.keep_all_samples {
        (packed, None)
    } else {
        // Samples around what matters, and a fast loop's iterations at a bounded rate.
        let keeper = stallscope_analysis::journal::retention::KeepHandle::default();
        let iterations = Thinning::new(packed).with_keeper(keeper.subscribe());
        let thinned = Retention::new(Box::new(iterations)).with_keeper(keeper);
        let keeper = thinned.handle();
        (Box::new(thinned), Some(keeper))
    };
    let recorder = Recorder::new(
        Some(sink),
        header,
        &name,
        Box::new(StatusLine::for_stderr(args.quiet || tui)),
        args.iter_regex.is_some(),
    )
    .with_feed(hub.clone())
    .with_hang_watch(args.hang_after.map(|s| (s * 1e9) as u64))
    .with_sample_keeper(keeper);
    let recorder = if args.flight_recorder > 0.0 {
        recorder.with_flight_recorder(flight_recorder(profile, args.flight_recorder))
    } else {
        recorder
    };
    Ok(Outlets {
        recorder,
        feed_socket,
        metrics,
        hub,
    })
}

/// The flight recorder of a run writing `profile`: the trace of its last `seconds`, beside
/// it, exported in a thread of its own (the recorder goes on attributing), and where it went
/// said on stderr.
fn flight_recorder(
    profile: &std::path::Path,
    seconds: f64,
) -> stallscope_agent::node::recorder::FlightRecorder {
    let profile = profile.to_path_buf();
    let window_ns = (seconds * 1e9) as u64;
    Box::new(move |what: &str, now: u64| {
        let out = crate::trace_cmd::flight_record_path(&profile, what);
        let profile = profile.clone();
        let since = now.saturating_sub(window_ns);
        let spawned = std::thread::Builder::new()
            .name("flight-recorder".into())
            .spawn(move || {
                match crate::trace_cmd::write_recent_trace(&profile, since, &out) {
                    Ok(s) => eprintln!(
                        "stallscope: flight recorder: the last {seconds:.0} s ({} iterations of {} ranks) written to {}",
                        s.iterations,
                        s.ranks,
                        out.display()
                    ),
                    Err(e) => eprintln!("stallscope: flight recorder: {e:#}"),
                }
            });
        if let Err(e) = spawned {
            eprintln!("stallscope: flight recorder: cannot start its thread ({e})");
        }
    })
}

/// The node agent's marker socket, when an agent answers on it (`$STALLSCOPE_SOCKET`, else a
/// root agent's or this user's own, only from directories nobody else can write in: see
/// [`agent_candidates`]). A datagram `connect` succeeds only where a socket is bound.
fn answering_agent() -> Option<PathBuf> {
    let probe = std::os::unix::net::UnixDatagram::unbound().ok()?;
    agent_candidates()
        .into_iter()
        .find(|path| probe.connect(path).is_ok())
}

/// `stallscope run` on a node with an agent: the command's markers go to the agent (which
/// samples, attributes and ships them to the collector); this process only runs the command
/// with the hook and passes its exit through.
fn join_agent(args: &RunArgs, socket: &Path) -> anyhow::Result<i32> {
    eprintln!(
        "stallscope: joined the node's agent at {}; the job's collector summarises this run",
        socket.display()
    );
    if args.iter_regex.is_some() || args.output.is_some() || args.summary_json.is_some() {
        eprintln!("stallscope: --iter-regex, --output and --summary-json are the agent's and collector's business here, and are ignored");
    }
    let dir = run_dir()?;
    let command = training_command(args, socket, dir.path());
    let mut job =
        Job::spawn(command).with_context(|| format!("cannot run {:?}", args.command[0]))?;
    let status = job.wait()?;
    job.end_leftovers(&[]);
    drop(dir);
    exit_like(&status)
}

/// CPU time used by this process, all threads, s.
fn own_cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct we own.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Writes the summary JSON.
pub fn write_json(
    path: &Path,
    summary: &stallscope_analysis::summary::Summary,
) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(summary)?;
    std::fs::write(path, text + "\n").with_context(|| format!("cannot write {}", path.display()))
}
