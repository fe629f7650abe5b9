//! `/metrics`: the live job model as Prometheus text, for `stallscope run`, `agent` and
//! `collector`.
//!
//! A scrape reads the model; it never samples. The server subscribes to the process's
//! [`FeedHub`] like any other view and folds every message into its own copy of the
//! [`JobView`] ([`MetricsState`]). It also keeps what the model itself only keeps as a window:
//! a cumulative iteration-time histogram per rank (the feed's updates carry every new
//! iteration); the node counters are the model's exact sums of the raw counters' increases
//! (`NodeView::counters`), integrated from the one-second resource rates only for a node
//! whose agent predates them (an agent ships its latest reading every 2 s: integrating those
//! counted about half of what moved). The exposition
//! ([`expose::render`]) is a pure function of that state, so it is tested on a state built in
//! the test.
//!
//! The hub drops a subscriber whose queue is full (issue 30, item 12): when that happens to
//! the fold (a scrape of a huge model holding the state while the run publishes), the fold
//! subscribes again and starts from the fresh snapshot, counting it in
//! `stallscope_feed_resyncs_total`, instead of serving the state it had for ever. What it
//! integrates (histograms, held seconds) takes from the snapshot only what is newer than what
//! it already counted, so a resync counts nothing twice; and it keeps them only for the ranks
//! (and nodes) the model has, so a rank that moves leaves no series behind.

pub mod expose;
mod http;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stallscope_analysis::crossnode::StragglerWindow;
use stallscope_analysis::resources::NodeCounters;
use stallscope_analysis::view::hub::{FeedHub, FeedMessage, SUBSCRIBER_QUEUE};
use stallscope_analysis::view::{IterationParts, JobView, NodeResources};

pub use http::MetricsServer;

/// The default port of `--metrics` (outside Prometheus's exporter range 9100–9999, which is
/// fully allocated; next to the collector's ingest port 7571).
pub const DEFAULT_PORT: u16 = 7572;

/// s, the upper bounds of the iteration-time histogram's buckets (`+Inf` is implied).
pub const BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Why the metrics server could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The address could not be parsed.
    #[error("--metrics {0}: not an address (HOST:PORT, :PORT or PORT)")]
    Address(String),
    /// The address could not be bound.
    #[error("--metrics {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The server's thread could not start.
    #[error("metrics server thread: {0}")]
    Thread(std::io::Error),
}

/// Parses `--metrics`' value: `HOST:PORT`, `:PORT` (loopback) or `PORT` (loopback).
pub fn parse_address(s: &str) -> Result<SocketAddr, MetricsError> {
    let s = s.trim();
    if let Ok(port) = s.trim_start_matches(':').parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    s.parse().map_err(|_| MetricsError::Address(s.into()))
}

/// One rank's cumulative iteration-time histogram.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Histogram {
    /// Iterations at or below each of [`BUCKETS`], not cumulative.
    pub counts: [u64; BUCKETS.len()],
    /// Iterations above the last bucket.
    pub over: u64,
    /// s, their summed wall time.
    pub sum_seconds: f64,
    /// The last iteration counted: a snapshot after a resync counts only those after it.
    pub last_iter: Option<u64>,
}

impl Histogram {
    /// Counts one iteration of `seconds`.
    pub fn observe(&mut self, seconds: f64) {
        match BUCKETS.iter().position(|b| seconds <= *b) {
            Some(i) => self.counts[i] += 1,
            None => self.over += 1,
        }
        self.sum_seconds += seconds;
    }

    /// Iterations counted.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum::<u64>() + self.over
    }
}

/// Bytes (or seconds) a node moved: its exact counters, or its one-second rates integrated.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeTotals {
    /// ns, the start of the latest reading folded in.
    pub last_t_ns: u64,
    /// bytes received on the NICs; `None` while no reading had it.
    pub nic_rx_bytes: Option<f64>,
    /// bytes sent on the NICs.
    pub nic_tx_bytes: Option<f64>,
    /// bytes read from whole disks.
    pub disk_read_bytes: Option<f64>,
    /// bytes written to whole disks.
    pub disk_write_bytes: Option<f64>,
    /// s the loops' threads waited in the run queue.
    pub runq_delay_seconds: Option<f64>,
    /// s of CPU the job's processes used.
    pub cpu_seconds: Option<f64>,
    /// bytes the GPUs received over PCIe.
    pub pcie_rx_bytes: Option<f64>,
    /// bytes the GPUs sent over PCIe.
    pub pcie_tx_bytes: Option<f64>,
    /// bytes the GPUs received over NVLink.
    pub nvlink_rx_bytes: Option<f64>,
    /// bytes the GPUs sent over NVLink.
    pub nvlink_tx_bytes: Option<f64>,
    /// bytes received on the RDMA ports (InfiniBand, RoCE, EFA).
    pub rdma_rx_bytes: Option<f64>,
    /// bytes sent on the RDMA ports.
    pub rdma_tx_bytes: Option<f64>,
}

fn integrate(total: &mut Option<f64>, rate: Option<f64>, seconds: f64) {
    if let Some(r) = rate {
        *total = Some(total.unwrap_or(0.0) + r * seconds);
    }
}

impl NodeTotals {
    /// Takes the node's exact counters in place of what was integrated.
    pub fn take_exact(&mut self, c: &NodeCounters) {
        self.nic_rx_bytes = c.nic_rx_bytes;
        self.nic_tx_bytes = c.nic_tx_bytes;
        self.disk_read_bytes = c.disk_read_bytes;
        self.disk_write_bytes = c.disk_write_bytes;
        self.runq_delay_seconds = c.runq_delay_seconds;
        self.cpu_seconds = c.cpu_seconds;
        self.pcie_rx_bytes = c.pcie_rx_bytes;
        self.pcie_tx_bytes = c.pcie_tx_bytes;
        self.nvlink_rx_bytes = c.nvlink_rx_bytes;
        self.nvlink_tx_bytes = c.nvlink_tx_bytes;
        self.rdma_rx_bytes = c.rdma_rx_bytes;
        self.rdma_tx_bytes = c.rdma_tx_bytes;
    }

    /// Folds in one reading, once.
    pub fn add(&mut self, r: &NodeResources) {
        if r.t_ns <= self.last_t_ns && self.last_t_ns != 0 {
            return;
        }
        self.last_t_ns = r.t_ns;
        let s = r.dur_ns as f64 / 1e9;
        integrate(&mut self.nic_rx_bytes, r.nic_rx_bytes_per_s, s);
        integrate(&mut self.nic_tx_bytes, r.nic_tx_bytes_per_s, s);
        integrate(&mut self.disk_read_bytes, r.disk_read_bytes_per_s, s);
        integrate(&mut self.disk_write_bytes, r.disk_write_bytes_per_s, s);
        integrate(&mut self.runq_delay_seconds, r.runq_delay, s);
        integrate(&mut self.cpu_seconds, r.cpu_busy_cores, s);
        integrate(&mut self.pcie_rx_bytes, r.pcie_rx_bytes_per_s, s);
        integrate(&mut self.pcie_tx_bytes, r.pcie_tx_bytes_per_s, s);
        integrate(&mut self.nvlink_rx_bytes, r.nvlink_rx_bytes_per_s, s);
        integrate(&mut self.nvlink_tx_bytes, r.nvlink_tx_bytes_per_s, s);
        integrate(&mut self.rdma_rx_bytes, r.rdma_rx_bytes_per_s, s);
        integrate(&mut self.rdma_tx_bytes, r.rdma_tx_bytes_per_s, s);
    }
}

/// What a scrape renders: the model, plus the cumulative figures the model keeps only as
/// windows.
#[derive(Clone, Debug, Default)]
pub struct MetricsState {
    /// The model, as the feed last said.
    pub view: JobView,
    /// Per rank.
    pub histograms: BTreeMap<u32, Histogram>,
    /// Per node.
    pub nodes: BTreeMap<String, NodeTotals>,
    /// s, how long each (rank, node) held the others up, over every straggler window.
    pub held: BTreeMap<(u32, String), f64>,
    /// The first iteration of the latest straggler window counted in `held`.
    pub held_upto: Option<u64>,
    /// Times the fold fell behind, was dropped by the hub and started again from a snapshot.
    pub resyncs: u64,
    /// Whether the run ended.
    pub ended: bool,
}

impl MetricsState {
    /// Folds in one feed message.
    pub fn fold(&mut self, msg: FeedMessage) {
        match msg {
            FeedMessage::Snapshot(view) => {
                self.view = (*view).clone();
                let windows = std::mem::take(&mut self.view.stragglers);
                windows.iter().for_each(|w| self.hold(w));
                self.view.stragglers = windows;
                let warmup = u64::from(self.view.summary.warmup_iterations);
                for r in self.view.ranks.values() {
                    let h = self.histograms.entry(r.rank).or_default();
                    r.recent
                        .iter()
                        .filter(|p| p.iter >= warmup)
                        .for_each(|p| observe(h, p));
                }
                self.forget_gone_ranks();
                self.fold_nodes();
            }
            FeedMessage::Update(u) => {
                u.stragglers.iter().for_each(|w| self.hold(w));
                // The summary comes in the round of the first iteration, warm-up and all.
                let warmup = u64::from(
                    u.summary
                        .as_ref()
                        .map_or(self.view.summary.warmup_iterations, |s| s.warmup_iterations),
                );
                for (rank, p) in u.parts.iter().filter(|(_, p)| p.iter >= warmup) {
                    observe(self.histograms.entry(*rank).or_default(), p);
                }
                self.view.apply((*u).clone());
                if !u.ranks.is_empty() {
                    self.forget_gone_ranks();
                }
                self.fold_nodes();
            }
            FeedMessage::End => self.ended = true,
        }
    }

    /// Counts one straggler window, once.
    fn hold(&mut self, w: &StragglerWindow) {
        if self.held_upto.is_some_and(|upto| w.first_iter <= upto) {
            return;
        }
        self.held_upto = Some(w.first_iter);
        *self.held.entry((w.rank, w.node.clone())).or_default() += w.held_seconds;
    }

    /// Drops the figures of ranks the model no longer has, and of a rank's former node.
    fn forget_gone_ranks(&mut self) {
        let ranks = &self.view.ranks;
        self.histograms.retain(|rank, _| ranks.contains_key(rank));
        self.held
            .retain(|(rank, node), _| ranks.get(rank).is_some_and(|r| &r.node == node));
    }

    /// The node counters: the model's exact sums where it has them (`NodeView::counters`),
    /// else (a job profile or an agent from before them) the one-second rates integrated.
    fn fold_nodes(&mut self) {
        for n in self.view.nodes.values() {
            let totals = self.nodes.entry(n.node.clone()).or_default();
            for r in n.history.iter().chain(n.resources.iter()) {
                totals.add(r);
            }
            if let Some(c) = &n.counters {
                totals.take_exact(c);
            }
        }
    }
}

/// Counts an iteration once: a snapshot after a resync repeats those already counted.
fn observe(h: &mut Histogram, p: &IterationParts) {
    if h.last_iter.is_some_and(|last| p.iter <= last) {
        return;
    }
    h.last_iter = Some(p.iter);
    h.observe(p.wall_ns() as f64 / 1e9);
}

/// How often the fold looks whether its server was dropped.
const FOLD_STOP_POLL: Duration = Duration::from_millis(500);

/// Folds `hub`'s messages into `state` on a thread of its own until the run ends or `stop`
/// is raised; subscribes again (a fresh snapshot, counted in [`MetricsState::resyncs`]) when
/// the hub drops it for falling behind.
fn spawn_fold(
    hub: Arc<FeedHub>,
    state: Arc<Mutex<MetricsState>>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<()> {
    let mut rx = hub.subscribe(SUBSCRIBER_QUEUE);
    std::thread::Builder::new()
        .name("stallscope-metrics-fold".into())
        .spawn(move || loop {
            match rx.recv_timeout(FOLD_STOP_POLL) {
                Ok(msg) => {
                    let end = matches!(msg, FeedMessage::End);
                    if let Ok(mut s) = state.lock() {
                        s.fold(msg);
                    }
                    if end {
                        return;
                    }
                }
                Err(RecvTimeoutError::Timeout) if !stop.load(Ordering::Acquire) => {}
                Err(RecvTimeoutError::Disconnected) if !stop.load(Ordering::Acquire) => {
                    if let Ok(mut s) = state.lock() {
                        s.resyncs += 1;
                    }
                    rx = hub.subscribe(SUBSCRIBER_QUEUE);
                }
                Err(_) => return,
            }
        })
        .map(drop)
}

/// Serves `/metrics` on `addr` from the model `hub` publishes, on threads of its own, until
/// the returned server is dropped.
pub fn serve(addr: SocketAddr, hub: &Arc<FeedHub>) -> Result<MetricsServer, MetricsError> {
    let state = Arc::new(Mutex::new(MetricsState::default()));
    let stop = Arc::new(AtomicBool::new(false));
    spawn_fold(hub.clone(), state.clone(), stop.clone()).map_err(MetricsError::Thread)?;
    let mut server = http::start(addr, state);
    match &mut server {
        Ok(server) => server.stop_fold = Some(stop),
        Err(_) => stop.store(true, Ordering::Release),
    }
    server
}

#[cfg(test)]
mod tests;

/// Serves `/metrics` when `--metrics` was given (`flag` is its value), saying where on stderr.
pub fn serve_flag(
    flag: Option<&str>,
    hub: &Arc<FeedHub>,
) -> Result<Option<MetricsServer>, MetricsError> {
    let Some(flag) = flag else { return Ok(None) };
    let server = serve(parse_address(flag)?, hub)?;
    eprintln!(
        "stallscope: metrics on http://{}/metrics",
        server.local_addr()
    );
    Ok(Some(server))
}
