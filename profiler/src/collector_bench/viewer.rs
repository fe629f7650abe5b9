//! A viewer of the whole job during the benchmark: what `stallscope top HOST:PORT` does, on a
//! thread of the agents' process — a [`FeedClient`] on the collector's port, in the binary
//! form, folding every message into its own copy of the job model. Issue 31 asks that a
//! viewer be kept current at 10,000 ranks: each update's lag (when it arrived minus the
//! latest iteration end it carries, both `CLOCK_MONOTONIC` on this machine) is measured in
//! the window, and a viewer the collector dropped (it fell behind) fails the step.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use stallscope_agent::node::feed::FeedMessage;
use stallscope_agent::node::feed_client::FeedClient;

use super::histogram::Histogram;
use super::side::TOKEN;

/// What the viewer saw.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ViewerReport {
    /// Whether it read the binary form.
    pub binary: bool,
    /// Updates folded in the window.
    pub updates: u64,
    /// ms, lag of its model behind the job in the window: 99th percentile.
    pub lag_p99_ms: Option<f64>,
    /// ms, the largest.
    pub lag_max_ms: Option<f64>,
    /// Ranks in its model at the window's end.
    pub ranks: usize,
    /// Why it stopped before the job ended, if it did.
    pub error: Option<String>,
}

#[derive(Default)]
struct State {
    report: ViewerReport,
    measuring: bool,
    lag: Histogram,
}

/// A viewer running on its own thread.
pub struct Viewer {
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Viewer {
    /// Attaches to the collector at `addr` and follows it.
    pub fn start(addr: SocketAddr) -> anyhow::Result<Viewer> {
        let mut client = FeedClient::connect_tcp_binary(
            &addr.to_string(),
            TOKEN,
            Duration::from_secs(30),
            None,
        )?;
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (state, stop) = (state.clone(), stop.clone());
            std::thread::Builder::new()
                .name("bench-viewer".into())
                .spawn(move || follow(&mut client, &state, &stop))?
        };
        Ok(Viewer {
            state,
            stop,
            thread: Some(thread),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens the measured window.
    pub fn mark(&self) {
        let mut s = self.lock();
        s.measuring = true;
        s.report.updates = 0;
        s.lag = Histogram::default();
    }

    /// Closes the window and reports it.
    pub fn end(&self) -> ViewerReport {
        let mut s = self.lock();
        s.measuring = false;
        let mut r = s.report.clone();
        r.lag_p99_ms = s.lag.quantile_ms(0.99);
        r.lag_max_ms = (s.lag.count > 0).then(|| s.lag.max_us as f64 / 1e3);
        r
    }

    /// Stops following (bounded: the feed's end, or its read timeout).
    pub fn finish(mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn follow(client: &mut FeedClient, state: &Mutex<State>, stop: &AtomicBool) {
    let lock = || state.lock().unwrap_or_else(|e| e.into_inner());
    lock().report.binary = client.is_binary();
    while !stop.load(Ordering::Acquire) {
        match client.next_message() {
            Some(Ok((_, msg))) => {
                let now = stallscope_agent::clock::monotonic_ns();
                let ranks = client.view().map_or(0, |v| v.ranks.len());
                let mut s = lock();
                s.report.binary = client.is_binary();
                s.report.ranks = ranks;
                match msg {
                    FeedMessage::Update(u) if s.measuring => {
                        s.report.updates += 1;
                        if u.now_ns > 0 {
                            s.lag.record(now.saturating_sub(u.now_ns) / 1000);
                        }
                    }
                    FeedMessage::End => return,
                    _ => {}
                }
            }
            Some(Err(e)) => {
                lock().report.error = Some(e.to_string());
                return;
            }
            None => return,
        }
    }
}
