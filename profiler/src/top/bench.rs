//! Benchmarks of the dashboard at 1,024 ranks on 128 nodes (run in release, by hand; they
//! print figures and assert nothing about time):
//!
//! ```text
//! cargo test --release -p stallscope --bin stallscope top::bench -- --ignored --nocapture --test-threads 1
//! ```
//!
//! - `draw_of_a_full_frame`: each screen drawn through crossterm into a sink (the escape
//!   sequences a terminal would get), the model changing between frames as a live one does.
//! - `cpu_at_four_redraws_a_second`: the very loop `stallscope top` runs, attached over a real
//!   feed socket to a model that takes 1,024 new iterations 10 times a second; the CPU of the
//!   dashboard's two threads (the loop, and the feed reader that parses and folds) from
//!   /proc/self/task, against the wall time.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratatui::backend::CrosstermBackend;
use ratatui::layout::Rect;
use ratatui::{Terminal, TerminalOptions, Viewport};
use stallscope_agent::node::feed::{self, FeedHub};
use stallscope_agent::node::feed_client::FeedClient;
use stallscope_analysis::category::{Category, Split};
use stallscope_analysis::figures::{Categories, Figures};
use stallscope_analysis::view::{
    IterationParts, JobView, NodeResources, NodeView, RankView, ViewUpdate, RECENT_ITERATIONS,
    RESOURCE_HISTORY,
};
use stallscope_dashboards::top::{App, Mode, Screen};

use super::live::FollowedModel;
use super::screen::{self, Input, Keys, Model, Options};

const RANKS: u32 = 1024;
const NODES: u32 = 128;
const MS: u64 = 1_000_000;

fn parts(rank: u32, iter: u64) -> IterationParts {
    let mut split = Split::default();
    let j = (iter * 7 + u64::from(rank)) % 11;
    split.add(Category::Compute, (80 + j) * MS);
    split.add(Category::DataPrep, (rank % 7) as u64 * MS);
    split.add(Category::Network, 12 * MS);
    split.add(Category::PeerWait, (10 + j) * MS);
    IterationParts {
        iter,
        end_ns: (iter + 1) * 120 * MS,
        split,
        gpu_busy_ppm: Some(850_000),
    }
}

fn reading(t: u64) -> NodeResources {
    let wave = (t % 20) as f64 / 20.0;
    NodeResources {
        t_ns: t * 1_000 * MS,
        dur_ns: 1_000 * MS,
        cpu_busy_cores: Some(40.0 + 8.0 * wave),
        runq_delay: Some(0.1 * wave),
        nic_rx_bytes_per_s: Some(11e9 * wave),
        nic_tx_bytes_per_s: Some(10e9 * wave),
        disk_read_bytes_per_s: Some(2e9),
        disk_write_bytes_per_s: Some(0.0),
        psi_cpu: Some(0.1),
        psi_io: Some(0.02),
        psi_memory: Some(0.0),
        gpu_busy: Some(0.85),
        pcie_rx_bytes_per_s: Some(6e9),
        pcie_tx_bytes_per_s: Some(1e9),
        nvlink_rx_bytes_per_s: Some(200e9),
        nvlink_tx_bytes_per_s: Some(200e9),
        rdma_rx_bytes_per_s: Some(12e9 * wave),
        rdma_tx_bytes_per_s: Some(12e9 * wave),
    }
}

/// A job of 1,024 ranks on 128 nodes with full histories.
fn big_job() -> JobView {
    let mut v = JobView::new("big");
    for rank in 0..RANKS {
        let node = format!("node-{:03}", rank % NODES);
        let recent: VecDeque<IterationParts> = (0..RECENT_ITERATIONS as u64)
            .map(|i| parts(rank, i))
            .collect();
        let mut total = Split::default();
        for p in &recent {
            total.add_split(&p.split);
        }
        v.ranks.insert(
            rank,
            RankView {
                rank,
                node: node.clone(),
                pid: 10_000 + rank,
                figures: Figures {
                    iterations: recent.len() as u64,
                    median_iteration_seconds: 0.12,
                    wall_seconds: total.total() as f64 / 1e9,
                    categories: Categories::from_split(&total),
                    ..Figures::default()
                },
                p95_iteration_seconds: 0.13,
                recent,
                ..RankView::default()
            },
        );
        let n = v.nodes.entry(node.clone()).or_insert_with(|| NodeView {
            node,
            history: (0..RESOURCE_HISTORY as u64).map(reading).collect(),
            resources: Some(reading(RESOURCE_HISTORY as u64)),
            clock_offset_ns: Some(120_000),
            clock_uncertainty_ns: Some(40_000),
            ..NodeView::default()
        });
        n.ranks.push(rank);
    }
    v
}

/// One round of a live job: every rank's next iteration, every node's next reading.
fn round(iter: u64) -> ViewUpdate {
    ViewUpdate {
        now_ns: (iter + 1) * 120 * MS,
        attributed: iter * u64::from(RANKS),
        parts: (0..RANKS).map(|r| (r, parts(r, iter))).collect(),
        nodes: (0..NODES)
            .map(|n| NodeView {
                node: format!("node-{n:03}"),
                resources: Some(reading(iter)),
                ranks: (0..RANKS).filter(|r| r % NODES == n).collect(),
                ..NodeView::default()
            })
            .collect(),
        ..ViewUpdate::default()
    }
}

fn sink_terminal(w: u16, h: u16) -> Terminal<CrosstermBackend<std::io::Sink>> {
    Terminal::with_options(
        CrosstermBackend::new(std::io::sink()),
        TerminalOptions {
            viewport: Viewport::Fixed(Rect::new(0, 0, w, h)),
        },
    )
    .expect("a terminal on a sink")
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1]
}

#[test]
#[ignore = "benchmark: run in release with --ignored --nocapture"]
fn draw_of_a_full_frame() {
    let mut view = big_job();
    let mut iter = RECENT_ITERATIONS as u64;
    println!("draw of one frame, 1,024 ranks on 128 nodes, 200 frames per screen and size");
    println!(
        "{:<10} {:>8} {:>9} {:>9} {:>9}",
        "screen", "size", "min ms", "median", "max"
    );
    for (w, h) in [(80u16, 24u16), (200, 60)] {
        let mut terminal = sink_terminal(w, h);
        for screen in Screen::ALL {
            let mut app = App::new(Mode::Live("bench".into()));
            app.screen = screen;
            let mut ms = Vec::new();
            for _ in 0..200 {
                view.apply(round(iter));
                iter += 1;
                let t = Instant::now();
                terminal
                    .draw(|f| stallscope_dashboards::top::draw(f, &app, &view))
                    .expect("draw");
                ms.push(t.elapsed().as_secs_f64() * 1e3);
            }
            ms.sort_by(f64::total_cmp);
            println!(
                "{:<10} {:>8} {:>9.3} {:>9.3} {:>9.3}",
                screen.title(),
                format!("{w}x{h}"),
                ms[0],
                percentile(&ms, 0.5),
                ms[ms.len() - 1]
            );
        }
    }
}

/// No keys: waits out the frame interval.
struct NoKeys;

impl Keys for NoKeys {
    fn next(&mut self, timeout: Duration) -> std::io::Result<Option<Input>> {
        std::thread::sleep(timeout);
        Ok(None)
    }
}

/// CPU seconds of this process's threads named `name` (utime + stime, clock ticks).
fn thread_cpu_seconds(name: &str) -> f64 {
    // SAFETY: sysconf only reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let mut ticks = 0u64;
    for task in std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
    {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        if &stat[open + 1..close] != name {
            continue;
        }
        let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        ticks += fields[11].parse::<u64>().unwrap_or(0) + fields[12].parse::<u64>().unwrap_or(0);
    }
    ticks as f64 / hz
}

#[test]
#[ignore = "benchmark: run in release with --ignored --nocapture"]
fn cpu_at_four_redraws_a_second() {
    let seconds: u64 = std::env::var("STALLSCOPE_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let dir = tempfile::tempdir().expect("dir");
    let hub = Arc::new(FeedHub::default());
    let socket = feed::serve(hub.clone(), &dir.path().join("bench.feed")).expect("feed");
    // The run's side: 10 rounds a second, as a journal publishes them.
    let stop = Arc::new(AtomicBool::new(false));
    let publisher = {
        let hub = hub.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut view = big_job();
            let mut iter = RECENT_ITERATIONS as u64;
            while !stop.load(Ordering::Acquire) {
                let u = round(iter);
                view.apply(u.clone());
                hub.publish(&view, u);
                iter += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            hub.end();
        })
    };
    let client = FeedClient::connect(socket.path(), Duration::from_secs(30)).expect("attach");
    // The form `top` asks for; STALLSCOPE_BENCH_FORM=json measures the JSON lines instead.
    let json = std::env::var("STALLSCOPE_BENCH_FORM").is_ok_and(|f| f == "json");
    let client = if json {
        // Its snapshot of 512 recent iterations × 1,024 ranks is over the 64 MiB a JSON line
        // may be (the binary snapshot is a fraction of it); the updates are what is measured.
        client.with_line_limit(1 << 30)
    } else {
        client.binary()
    };
    let model = FollowedModel::follow_client(client).expect("reader");
    let watched = model.clone();
    // Wait for the snapshot, so start-up is not counted.
    let started = Instant::now();
    while model.lock().view.is_none() && started.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let for_screens = Duration::from_secs(seconds / 4).max(Duration::from_secs(1));
    let loop_thread = std::thread::Builder::new()
        .name("bench-top-loop".into())
        .spawn(move || {
            let mut terminal = sink_terminal(200, 60);
            let mut frames = 0;
            for screen in Screen::ALL {
                let mut app = App::new(Mode::Live("bench".into()));
                app.screen = screen;
                let mut opts = Options {
                    fps: 4.0,
                    stop: None,
                    output: None,
                    for_at_most: Some(for_screens),
                };
                let mut m = Model::Live {
                    model: model.clone(),
                    at: "bench".into(),
                };
                frames += screen::run(&mut terminal, &mut app, &mut m, &mut NoKeys, &mut opts)
                    .expect("loop")
                    .1;
            }
            frames
        })
        .expect("loop thread");
    let cpu_before = thread_cpu_seconds("stallscope-top-");
    let wall = Instant::now();
    // Sample the loop thread's CPU just before it ends.
    let mut loop_cpu = 0.0f64;
    while !loop_thread.is_finished() {
        loop_cpu = loop_cpu.max(thread_cpu_seconds("bench-top-loop"));
        std::thread::sleep(Duration::from_millis(200));
    }
    let frames = loop_thread.join().expect("loop");
    let wall = wall.elapsed().as_secs_f64();
    let reader_cpu = thread_cpu_seconds("stallscope-top-") - cpu_before;
    let (messages, status) = {
        let live = watched.lock();
        (live.messages, live.status.clone())
    };
    stop.store(true, Ordering::Release);
    let _ = publisher.join();
    println!(
        "{seconds} s at 4 redraws/s (the four screens in turn), 1,024 ranks on 128 nodes, 10 updates/s:"
    );
    println!(
        "  frames drawn {frames} ({:.2}/s); loop thread {:.2}% of a core; feed reader ({} decode + fold) {:.2}% of a core; together {:.2}%",
        frames as f64 / wall,
        loop_cpu / wall * 100.0,
        if json { "JSON" } else { "binary" },
        reader_cpu / wall * 100.0,
        (loop_cpu + reader_cpu) / wall * 100.0
    );
    println!(
        "  feed messages folded {messages} ({:.1}/s), feed {status:?}",
        messages as f64 / wall
    );
}
