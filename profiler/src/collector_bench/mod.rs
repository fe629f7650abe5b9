//! `stallscope collector-bench` (hidden): how many agents one collector keeps up with.
//!
//! Issue 5 asks for ≥ 1,000 agents at 100 Hz with a p99 latency from an agent's record to
//! the live feed under 250 ms, on the project's 2-core machine. This measures it through the
//! code users run, not a stand-in: the collector side is a child process running the
//! collector's own composition ([`side`]); the agents are tokio tasks in this process
//! ([`agents`]), each with its own TCP connection on loopback speaking the real protocol.
//!
//! For each agent count of the ramp, a fresh collector: connect every agent (handshake and
//! clock exchanges included), start them all shipping, warm up, measure a window (frames
//! reaching the live feed, their latency, the collector's CPU and RSS, the agents' CPU), then
//! stop the agents and wait (bounded) until every record sent is acknowledged, i.e. written
//! to the job profile. A step is *sustained* when the collector ingested at least 99% of the
//! offered rate in the window, every record sent was acknowledged and reached the live feed,
//! and the p99 latency is under the goal.

pub(crate) mod agents;
mod histogram;
pub mod side;
mod viewer;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;
use tokio::sync::{watch, Notify, Semaphore};

use self::agents::{AgentPlan, Control, Go, Outcome};
use self::side::{cpu_seconds, Totals, WindowReport};
use self::viewer::{Viewer, ViewerReport};
use crate::cli::CollectorBenchArgs;
use crate::collector_cmd::raise_nofile_limit;

/// Agents connecting at once: under the listen backlog, so no SYN is dropped and retried a
/// second later.
const CONNECTING_AT_ONCE: usize = 64;

/// How long one agent may take from connect to Welcome.
const CONNECT_WITHIN: Duration = Duration::from_secs(30);

/// How long the agents wait at the end of a step for their records to be acknowledged.
const DRAIN_WITHIN: Duration = Duration::from_secs(15);

/// Share of the offered frame rate the collector must ingest in the window.
const KEEP_UP: f64 = 0.99;

/// File descriptors needed besides one per agent.
const SPARE_FDS: u64 = 64;

/// One step of the ramp, as measured.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// Agents asked for.
    pub agents: usize,
    /// Agents welcomed.
    pub connected: usize,
    /// Ranks per agent.
    pub ranks_per_agent: usize,
    /// ms between two writes of an agent (0: a write per step).
    pub send_every_ms: u64,
    /// Frames (rank-iterations) per second offered (welcomed agents × ranks × rate).
    pub offered_fps: f64,
    /// Frames per second that reached the live feed in the window.
    pub frames_per_s: f64,
    /// Numbers per second those frames carried.
    pub values_per_s: f64,
    /// % of one core, the collector process in the window.
    pub collector_cpu_pct: f64,
    /// % of one core, the collector's job thread in the window (of `collector_cpu_pct`),
    /// when it was found.
    pub job_thread_cpu_pct: Option<f64>,
    /// % of one core, the agents' process in the window.
    pub agents_cpu_pct: f64,
    /// The collector's side of the window.
    pub window: WindowReport,
    /// Records the agents sent (health reports included).
    pub sent: u64,
    /// Records acknowledged by the end of the drain.
    pub acked: u64,
    /// s, how long the drain took.
    pub drain_s: f64,
    /// What the live-feed subscriber saw in all.
    pub totals: Totals,
    /// What a viewer of the whole job (over the collector's port) saw in the window.
    pub viewer: ViewerReport,
    /// The first error an agent met, if any did.
    pub error: Option<String>,
    /// Whether the step met every criterion.
    pub sustained: bool,
}

/// The collector child, driven by lines.
struct Side {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Side {
    /// Starts the collector side; what it says on stderr (a line per agent joining and
    /// leaving, as `stallscope collector` says) goes to `log`.
    fn spawn(log: &Path) -> anyhow::Result<(Side, std::net::SocketAddr)> {
        let exe = std::env::current_exe().context("cannot find this executable")?;
        let log = std::fs::File::create(log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        // `STALLSCOPE_BENCH_SIDE_WRAPPER`, words split on spaces: a command the collector side
        // runs under (`valgrind --tool=callgrind`, to count its instructions).
        let wrapper = std::env::var("STALLSCOPE_BENCH_SIDE_WRAPPER").unwrap_or_default();
        let mut words = wrapper.split_whitespace();
        let mut command = match words.next() {
            Some(program) => {
                let mut c = Command::new(program);
                c.args(words).arg(exe);
                c
            }
            None => Command::new(exe),
        };
        let mut child = command
            .args(["collector-bench", "--collector-side"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .context("cannot start the collector side")?;
        let stdin = child.stdin.take().context("no stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("no stdout")?);
        let mut side = Side {
            child,
            stdin,
            stdout,
        };
        let line = side.line()?;
        let addr = line
            .strip_prefix("addr ")
            .and_then(|a| a.parse().ok())
            .with_context(|| format!("the collector side said {line:?}, not its address"))?;
        Ok((side, addr))
    }

    fn line(&mut self) -> anyhow::Result<String> {
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            bail!("the collector side exited");
        }
        Ok(line.trim().to_string())
    }

    fn ask<T: serde::de::DeserializeOwned>(&mut self, command: &str) -> anyhow::Result<T> {
        writeln!(self.stdin, "{command}")?;
        self.stdin.flush()?;
        let line = self.line()?;
        serde_json::from_str(&line).with_context(|| format!("the collector side said {line:?}"))
    }

    /// Waits (bounded) for the child to end the job profile and exit; kills it otherwise.
    fn close(mut self, within: Duration) {
        drop(self.stdin);
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How long the collector side may take to answer a command: it answers between two reads
/// of its stdin, however far behind its ingest is.
const ANSWER_WITHIN: Duration = Duration::from_secs(60);

/// Asks the collector side something from async code without blocking an agents' thread.
/// A side that does not answer within [`ANSWER_WITHIN`] is killed (pid `side_pid`), which
/// ends the blocked read, and the step fails saying so instead of waiting for ever.
async fn ask<T: serde::de::DeserializeOwned + Send + 'static>(
    side: &Arc<std::sync::Mutex<Side>>,
    side_pid: u32,
    command: &'static str,
) -> anyhow::Result<T> {
    let side = side.clone();
    let asking = tokio::task::spawn_blocking(move || {
        side.lock()
            .unwrap_or_else(|e| e.into_inner())
            .ask::<T>(command)
    });
    match tokio::time::timeout(ANSWER_WITHIN, asking).await {
        Ok(answer) => answer?,
        Err(_) => {
            // SAFETY: kill(2) on the child we started and have not waited for.
            unsafe { libc::kill(side_pid as libc::pid_t, libc::SIGKILL) };
            bail!(
                "the collector side did not answer {command:?} within {} s (killed)",
                ANSWER_WITHIN.as_secs()
            )
        }
    }
}

/// Runs one step of the ramp with `n` agents.
/// Waits until every one of the `n` agents was welcomed or gave up; returns how many were
/// welcomed.
async fn all_answered(control: &Control, n: usize) -> usize {
    loop {
        let done =
            control.welcomed.load(Ordering::Acquire) + control.failed.load(Ordering::Acquire);
        if done >= n {
            return control.welcomed.load(Ordering::Acquire);
        }
        let _ = tokio::time::timeout(Duration::from_millis(100), control.changed.notified()).await;
    }
}

/// What one step measured.
struct Measured {
    connected: usize,
    window: WindowReport,
    agents_cpu: f64,
    outcomes: Vec<Outcome>,
    drain_s: f64,
    totals: Totals,
    viewer: ViewerReport,
}

/// The row of `n` agents: rates, CPU, and whether the collector kept up.
fn row_of(n: usize, args: &CollectorBenchArgs, m: Measured) -> Row {
    let Measured {
        connected,
        window,
        agents_cpu,
        outcomes,
        drain_s,
        totals,
        viewer,
    } = m;
    let sent: u64 = outcomes.iter().map(|o| o.sent).sum();
    let acked: u64 = outcomes.iter().map(|o| o.acked).sum();
    let error = outcomes.iter().find_map(|o| o.error.clone());
    let ranks = args.ranks_per_agent.max(1);
    let offered_fps = (connected * ranks) as f64 * args.rate;
    let frames_per_s = window.frames as f64 / window.wall_s.max(1e-9);
    let values = agents::values_per_frame(&agents::report(0, n, 0, 1, 1)) as f64;
    // Each agent's first record is its health report, not an iteration.
    let iterations_sent = sent.saturating_sub(connected as u64);
    let sustained = connected == n
        && error.is_none()
        && frames_per_s >= KEEP_UP * offered_fps
        && acked == sent
        && totals.frames == iterations_sent
        && totals.lagged == 0
        && window.p99_ms.is_some_and(|p| p < args.p99_goal_ms)
        && viewer.error.is_none()
        && viewer.updates > 0;
    Row {
        agents: n,
        connected,
        ranks_per_agent: ranks,
        send_every_ms: args.send_every_ms,
        offered_fps,
        frames_per_s,
        values_per_s: frames_per_s * values,
        collector_cpu_pct: 100.0 * window.cpu_s / window.wall_s.max(1e-9),
        job_thread_cpu_pct: window
            .job_thread_cpu_s
            .map(|s| 100.0 * s / window.wall_s.max(1e-9)),
        agents_cpu_pct: 100.0 * agents_cpu / window.wall_s.max(1e-9),
        window,
        sent,
        acked,
        drain_s,
        totals,
        viewer,
        error,
        sustained,
    }
}

fn step(n: usize, args: &CollectorBenchArgs, log: &Path) -> anyhow::Result<Row> {
    let (side, addr) = Side::spawn(log)?;
    let side_pid = side.child.id();
    let side = Arc::new(std::sync::Mutex::new(side));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.agent_threads.max(1))
        .thread_name("bench-agents")
        .enable_all()
        .build()
        .context("cannot start the agents' runtime")?;
    let plan = Arc::new(AgentPlan {
        addr,
        token: side::TOKEN.into(),
        agents: n,
        ranks: args.ranks_per_agent.max(1),
        rate_hz: args.rate,
        wall_spread_pct: args.wall_spread,
        send_every: Duration::from_millis(args.send_every_ms),
        connect_within: CONNECT_WITHIN,
        drain_within: DRAIN_WITHIN,
    });
    let (go_tx, go_rx) = watch::channel(None);
    let (stop_tx, stop_rx) = watch::channel(false);
    let control = Arc::new(Control {
        welcomed: Default::default(),
        failed: Default::default(),
        changed: Notify::new(),
        connecting: Semaphore::new(CONNECTING_AT_ONCE),
        go: go_rx,
        stop: stop_rx,
    });
    let row = rt.block_on(async {
        let tasks: Vec<_> = (0..n)
            .map(|i| tokio::spawn(agents::agent(i, plan.clone(), control.clone())))
            .collect();
        let connected = all_answered(&control, n).await;
        let viewer = Viewer::start(addr)?;
        let start = tokio::time::Instant::now() + Duration::from_millis(50);
        let start_mono = stallscope_agent::clock::monotonic_ns() + 50_000_000;
        let _ = go_tx.send(Some(Go {
            at: start,
            mono_ns: start_mono,
        }));
        tokio::time::sleep_until(start + Duration::from_secs_f64(args.warmup)).await;
        let agents_cpu = cpu_seconds();
        ask::<String>(&side, side_pid, "mark").await?;
        viewer.mark();
        tokio::time::sleep(Duration::from_secs_f64(args.seconds)).await;
        let window: WindowReport = ask(&side, side_pid, "end").await?;
        let viewer_report = viewer.end();
        let agents_cpu = cpu_seconds() - agents_cpu;
        let drain_from = Instant::now();
        let _ = stop_tx.send(true);
        let mut outcomes: Vec<Outcome> = Vec::with_capacity(n);
        for t in tasks {
            outcomes.push(t.await.unwrap_or_default());
        }
        let drain_s = drain_from.elapsed().as_secs_f64();
        let totals: Totals = ask(&side, side_pid, "finish").await?;
        // The collector ended the feed: the viewer's thread sees its end.
        tokio::task::spawn_blocking(move || viewer.finish()).await?;
        anyhow::Ok(row_of(
            n,
            args,
            Measured {
                connected,
                window,
                agents_cpu,
                outcomes,
                drain_s,
                totals,
                viewer: viewer_report,
            },
        ))
    });
    rt.shutdown_timeout(Duration::from_secs(5));
    match Arc::try_unwrap(side) {
        Ok(side) => side
            .into_inner()
            .unwrap_or_else(|e| e.into_inner())
            .close(Duration::from_secs(60)),
        Err(_) => {
            row?; // an unanswered command's error first
            bail!("the collector side is still in use")
        }
    }
    row
}

fn ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.1}"))
}

fn print_row(r: &Row) {
    println!(
        "{:>6} {:>6} {:>10.0} {:>11.0} {:>11.0} {:>8.1} {:>6} {:>8.1} {:>7.0} {:>7.0} {:>8} {:>8} {:>8} {:>9}  {}",
        r.agents,
        r.agents * r.ranks_per_agent,
        r.offered_fps,
        r.frames_per_s,
        r.values_per_s,
        r.collector_cpu_pct,
        r.job_thread_cpu_pct
            .map_or("-".into(), |pct| format!("{pct:.1}")),
        r.agents_cpu_pct,
        r.window.rss_mib,
        r.window.rss_mib - r.window.rss_start_mib,
        ms(r.window.p50_ms),
        ms(r.window.p99_ms),
        ms(r.window.max_ms),
        ms(r.viewer.lag_p99_ms),
        if r.sustained {
            "yes".to_string()
        } else {
            format!(
                "NO (connected {}/{}, acked {}/{}, feed {} lagged {}, viewer {} updates{}{})",
                r.connected,
                r.agents,
                r.acked,
                r.sent,
                r.totals.frames,
                r.totals.lagged,
                r.viewer.updates,
                r.viewer
                    .error
                    .as_deref()
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default(),
                r.error
                    .as_deref()
                    .map(|e| format!(", {e}"))
                    .unwrap_or_default()
            )
        }
    );
}

/// The step's latency over time, for `--timeline`: the largest of each second since the
/// collector started, a `|` before the first second wholly in the window.
fn timeline_line(w: &WindowReport) -> String {
    let first_in_window = w.window_from_s.ceil() as usize;
    let mut line = String::from("        largest latency each second since the start, ms:");
    for (second, s) in w.timeline.iter().enumerate() {
        if second == first_in_window {
            line.push_str(" |");
        }
        line.push_str(&format!(" {:.0}", s.max_ms));
    }
    line
}

/// Runs the ramp (or, with `--collector-side`, the collector side); exit code 0 when the goal
/// is met at the largest agent count asked for, 1 otherwise.
pub fn collector_bench(args: CollectorBenchArgs) -> anyhow::Result<i32> {
    if args.collector_side {
        return side::run();
    }
    if !(args.rate > 0.0 && args.rate <= 10_000.0) {
        bail!("--rate must be between 0 and 10000 Hz, not {}", args.rate);
    }
    if !(args.seconds > 0.0 && args.seconds <= 600.0 && args.warmup >= 0.0 && args.warmup <= 60.0) {
        bail!("--seconds must be in (0, 600] and --warmup in [0, 60]");
    }
    let most = args.agents.iter().copied().max().unwrap_or(0);
    if most == 0 {
        bail!("--agents must name at least one count above 0");
    }
    let limit = raise_nofile_limit();
    if limit < most as u64 + SPARE_FDS {
        bail!(
            "{most} agents need {} open files, the limit is {limit} (raise it with ulimit -n)",
            most as u64 + SPARE_FDS
        );
    }
    let log = std::env::temp_dir().join(format!(
        "stallscope-collector-bench-{}.log",
        std::process::id()
    ));
    if !(1..=1024).contains(&args.ranks_per_agent) {
        bail!("--ranks-per-agent must be between 1 and 1024");
    }
    if args.send_every_ms > 10_000 {
        bail!("--send-every-ms must be at most 10000");
    }
    let writes = match args.send_every_ms {
        0 => "a write per step".to_string(),
        ms => format!("a write every {ms} ms"),
    };
    println!(
        "collector-bench: {} rank(s) per agent at {} Hz each, {writes}, {} s warm-up, {} s measured per step, p99 goal {} ms",
        args.ranks_per_agent, args.rate, args.warmup, args.seconds, args.p99_goal_ms
    );
    println!(
        "{:>6} {:>6} {:>10} {:>11} {:>11} {:>8} {:>6} {:>8} {:>7} {:>7} {:>8} {:>8} {:>8} {:>9}  sustained",
        "agents",
        "ranks",
        "offered/s",
        "frames/s",
        "values/s",
        "coll%",
        "job%",
        "agents%",
        "RSS MiB",
        "+MiB",
        "p50 ms",
        "p99 ms",
        "max ms",
        "view p99"
    );
    let mut rows = Vec::new();
    for &n in &args.agents {
        let row = step(n, &args, &log)
            .with_context(|| format!("{n} agents (the collector side's log: {})", log.display()))?;
        print_row(&row);
        if args.timeline {
            println!("{}", timeline_line(&row.window));
        }
        let stop = !row.sustained && args.stop_at_failure;
        rows.push(row);
        if stop {
            break;
        }
    }
    let _ = std::fs::remove_file(&log);
    let best = rows.iter().filter(|r| r.sustained).map(|r| r.agents).max();
    match best {
        Some(b) => println!("largest sustained: {b} agents"),
        None => println!("largest sustained: none of the counts tried"),
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&rows)?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(if best == Some(most) { 0 } else { 1 })
}
