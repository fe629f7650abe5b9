//! The collector side of the benchmark: a process of its own, so that its CPU time
//! (`getrusage`) and memory (RSS) are the collector's alone.
//!
//! It starts the real collector ([`Collector::start`], as `stallscope collector` does: the
//! ingest server with a token, the job task writing a job profile, the live feed and its
//! printer) on loopback, plus one more live-feed subscriber, on a thread of its own, that
//! measures each [`JobEvent::Iteration`]'s latency: the time it is received minus the
//! iteration's end (already on the collector's clock), which the simulated agent stamped when
//! it scheduled the record.
//!
//! The driver speaks to it by lines: it prints `addr HOST:PORT` once listening; on stdin,
//! `mark` opens the measured window, `end` closes it and answers a [`WindowReport`] as one
//! JSON line, and `finish` answers the [`Totals`] and stops the collector.

use std::io::{BufRead, Write};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use stallscope_analysis::frame::RunHeader;
use stallscope_collector::events::JobEvent;
use stallscope_collector::monotonic_ns;
use stallscope_collector::profile::ProfileWriter;
use stallscope_collector::server::ServerConfig;
use tokio::sync::broadcast;

use super::histogram::Histogram;
use crate::collector_cmd::{raise_nofile_limit, runtime, Collector, JOB_THREAD};

/// The token the benchmark's agents present.
pub const TOKEN: &str = "collector-bench";

/// What the collector did during the measured window.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct WindowReport {
    /// s, the window's length.
    pub wall_s: f64,
    /// s, CPU time of the collector process (user + system) in the window.
    pub cpu_s: f64,
    /// s, CPU time of its job thread (`stallscope-job`, user + system) in the window: the one
    /// thread every record goes through (intake, join, attribution, live model), so the one
    /// that falls behind first. `None` when no such thread was found.
    #[serde(default)]
    pub job_thread_cpu_s: Option<f64>,
    /// Iteration frames that reached the live feed in the window, those the latency probe
    /// fell behind on (and missed) included: the collector ingested them all.
    pub frames: u64,
    /// ms, latency from the iteration's end to the live feed: median.
    pub p50_ms: Option<f64>,
    /// ms, 99th percentile.
    pub p99_ms: Option<f64>,
    /// ms, the largest.
    pub max_ms: Option<f64>,
    /// MiB, resident memory at the window's end.
    pub rss_mib: f64,
    /// MiB, resident memory at the window's start.
    pub rss_start_mib: f64,
    /// MiB, the most resident memory since the collector started.
    pub rss_peak_mib: f64,
    /// Each second since the collector started, to the window's end: where a p99 over the
    /// goal came from (the start's backlog, a stall that recurs).
    #[serde(default)]
    pub timeline: Vec<LatencySecond>,
    /// s since the collector started when the window opened.
    #[serde(default)]
    pub window_from_s: f64,
}

/// One second of the collector's run, as the latency probe saw it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySecond {
    /// Iterations that reached the live feed in the second.
    pub frames: u64,
    /// ms, the largest latency among them.
    pub max_ms: f64,
}

/// Seconds a timeline holds at most: a step's warm-up and window (60 + 600 s) fit.
const TIMELINE_SECONDS: usize = 3_600;

/// Everything the latency subscriber saw since the collector started.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Totals {
    /// Iteration frames that reached the live feed.
    pub frames: u64,
    /// Updates the subscriber missed because it fell behind the feed.
    pub lagged: u64,
}

/// The measured window, while open.
struct Window {
    /// s since the probe started.
    from_s: f64,
    started: Instant,
    cpu_s: f64,
    job_thread_cpu_s: Option<f64>,
    frames_before: u64,
    rss_start_mib: f64,
    latency: Histogram,
}

struct Probe {
    totals: Totals,
    window: Option<Window>,
    /// ns (the collector's clock) when the probe started: second 0 of the timeline.
    started_ns: u64,
    /// Per second since then: iterations seen, and the largest latency among them, µs.
    timeline: Vec<(u64, u64)>,
}

impl Probe {
    fn new() -> Probe {
        Probe {
            totals: Totals::default(),
            window: None,
            started_ns: monotonic_ns(),
            timeline: Vec::new(),
        }
    }

    /// Counts an iteration seen at `now_ns` with latency `us` in its second.
    fn note_second(&mut self, now_ns: u64, us: u64) {
        let second = (now_ns.saturating_sub(self.started_ns) / 1_000_000_000) as usize;
        if second >= TIMELINE_SECONDS {
            return;
        }
        if self.timeline.len() <= second {
            self.timeline.resize(second + 1, (0, 0));
        }
        let (frames, max_us) = &mut self.timeline[second];
        *frames += 1;
        *max_us = (*max_us).max(us);
    }
}

/// s, CPU time (user + system) of this process so far.
pub fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct we own.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// s, CPU time (user + system) so far of this process's threads named `name`, from
/// `/proc/self/task/*/stat` (in clock ticks, 10 ms here); `None` where none is.
fn thread_cpu_seconds(name: &str) -> Option<f64> {
    use procfs_core::FromRead;
    // SAFETY: sysconf reads a constant of the system.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let threads: Vec<u64> = std::fs::read_dir("/proc/self/task")
        .ok()?
        .flatten()
        .filter_map(|task| procfs_core::process::Stat::from_file(task.path().join("stat")).ok())
        .filter(|stat| stat.comm == name)
        .map(|stat| stat.utime + stat.stime)
        .collect();
    (!threads.is_empty()).then(|| threads.iter().sum::<u64>() as f64 / ticks)
}

/// MiB, a `kB` line of `/proc/self/status` (`VmRSS`, `VmHWM`).
fn status_mib(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// How often the latency probe looks for new iteration events when it found none: the
/// resolution of its latencies.
const PROBE_POLL: std::time::Duration = std::time::Duration::from_millis(1);

/// Measures the latency of every [`JobEvent::Iteration`] on a thread of its own until the
/// feed closes. Not a task of the collector's runtime: there the probe waited its turn among
/// the 1,250 connections' tasks it measures, and that wait (170–190 ms at the 99th
/// percentile, with 300,000 events a second) was counted as the collector's latency. Nor a
/// blocking receive, which could wake the thread for each of 300,000 events a second. It
/// takes what has arrived, then sleeps [`PROBE_POLL`].
fn measure(mut feed: broadcast::Receiver<JobEvent>, probe: Arc<Mutex<Probe>>) {
    use broadcast::error::TryRecvError;
    loop {
        match feed.try_recv() {
            Ok(JobEvent::Iteration { end_ns, .. }) => {
                let now = monotonic_ns();
                let us = now.saturating_sub(end_ns) / 1000;
                let mut p = probe.lock().unwrap_or_else(|e| e.into_inner());
                p.totals.frames += 1;
                p.note_second(now, us);
                if let Some(w) = p.window.as_mut() {
                    w.latency.record(us);
                }
            }
            Ok(_) => {}
            Err(TryRecvError::Lagged(n)) => {
                probe
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .totals
                    .lagged += n;
            }
            Err(TryRecvError::Empty) => std::thread::sleep(PROBE_POLL),
            Err(TryRecvError::Closed) => break,
        }
    }
}

fn answer<T: Serialize>(value: &T) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", serde_json::to_string(value)?)?;
    out.flush()?;
    Ok(())
}

/// The lines of stdin (the parent's commands), read on a thread of their own.
fn stdin_lines() -> tokio::sync::mpsc::UnboundedReceiver<String> {
    let (lines_tx, lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    lines
}

/// `mark`: starts the measured window now.
fn start_window(p: &mut Probe) {
    p.window = Some(Window {
        from_s: monotonic_ns().saturating_sub(p.started_ns) as f64 / 1e9,
        started: Instant::now(),
        cpu_s: cpu_seconds(),
        job_thread_cpu_s: thread_cpu_seconds(JOB_THREAD),
        frames_before: p.totals.frames + p.totals.lagged,
        rss_start_mib: status_mib("VmRSS:"),
        latency: Histogram::default(),
    });
}

/// `end`: ends the window and reports it (all zero when none was started).
fn end_window(p: &mut Probe) -> WindowReport {
    match p.window.take() {
        Some(w) => WindowReport {
            wall_s: w.started.elapsed().as_secs_f64(),
            cpu_s: cpu_seconds() - w.cpu_s,
            job_thread_cpu_s: thread_cpu_seconds(JOB_THREAD)
                .zip(w.job_thread_cpu_s)
                .map(|(end, start)| end - start),
            frames: p.totals.frames + p.totals.lagged - w.frames_before,
            p50_ms: w.latency.quantile_ms(0.50),
            p99_ms: w.latency.quantile_ms(0.99),
            max_ms: (w.latency.count > 0).then(|| w.latency.max_us as f64 / 1e3),
            rss_mib: status_mib("VmRSS:"),
            rss_start_mib: w.rss_start_mib,
            rss_peak_mib: status_mib("VmHWM:"),
            timeline: p
                .timeline
                .iter()
                .map(|&(frames, max_us)| LatencySecond {
                    frames,
                    max_ms: max_us as f64 / 1e3,
                })
                .collect(),
            window_from_s: w.from_s,
        },
        None => WindowReport::default(),
    }
}

/// Runs the collector side until `finish` (or the end of stdin).
pub fn run() -> anyhow::Result<i32> {
    raise_nofile_limit();
    let dir = tempfile::Builder::new()
        .prefix("stallscope-collector-bench-")
        .tempdir()
        .context("cannot create the benchmark's directory")?;
    let writer = ProfileWriter::create(dir.path().join("job.stallscope"))
        .context("cannot create the benchmark's job profile")?;
    let header = RunHeader {
        command: vec!["stallscope".into(), "collector-bench".into()],
        started_mono_ns: monotonic_ns(),
        ..stallscope_agent::node::header(&[], 0.0, 0)
    };
    let rt = runtime().context("cannot start the collector's runtime")?;
    let probe = Arc::new(Mutex::new(Probe::new()));
    let mut lines = stdin_lines();
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("cannot listen on loopback")?;
        let addr = listener.local_addr()?;
        let hub = std::sync::Arc::new(stallscope_analysis::view::hub::FeedHub::default());
        // Viewers on the port too, as `stallscope collector` serves them.
        let config = ServerConfig {
            token: Some(TOKEN.into()),
            feed: Some(hub.clone()),
            ..ServerConfig::default()
        };
        let collector = Collector::start(
            listener,
            config,
            writer,
            header,
            ("bench", hub),
            (true, None),
        );
        {
            let (feed, probe) = (collector.subscribe_iterations(), probe.clone());
            std::thread::Builder::new()
                .name("bench-probe".into())
                .spawn(move || measure(feed, probe))
                .context("cannot start the latency probe's thread")?;
        }
        println!("addr {addr}");
        std::io::stdout().flush()?;
        while let Some(line) = lines.recv().await {
            let mut p = probe.lock().unwrap_or_else(|e| e.into_inner());
            match line.trim() {
                "mark" => {
                    start_window(&mut p);
                    answer(&"marked")?;
                }
                "end" => {
                    answer(&end_window(&mut p))?;
                }
                "finish" => {
                    answer(&p.totals)?;
                    break;
                }
                other => anyhow::bail!("unknown command {other:?}"),
            }
        }
        let (_summary, write_error) = collector.stop().await?;
        if let Some(e) = write_error {
            eprintln!(
                "stallscope collector-bench: the job profile was not written to the end: {e}"
            );
        }
        anyhow::Ok(())
    })?;
    Ok(0)
}
