//! The job task: everything the connections receive goes through here, in one place.
//!
//! Each record goes to the [`Journal`] — which writes it to the job profile and gives it to the
//! same timeline `stallscope summary` replays the profile through. Every [`ATTRIBUTE_EVERY`]
//! the task joins the iterations that are ready across nodes; every [`TICK`] it also flushes
//! the profile, and only then acknowledges the records to their agents: an acknowledged
//! record is in the file, so an agent may forget it. Node events go out on the broadcast as
//! they happen, each rank-iteration on a broadcast of its own
//! ([`JobTask::iteration_events`]); the live model goes to the [`FeedHub`] every tick.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use stallscope_analysis::frame::{Frame, NodeClock, RunEnd, RunHeader};
use stallscope_analysis::journal::{Breakdowns, Journal};
use stallscope_analysis::slowdown::SlowdownNews;
use stallscope_analysis::summary::{self, Summary};
use stallscope_analysis::view::hub::FeedHub;
use tokio::sync::{broadcast, mpsc, watch};

use crate::events::{JobEvent, EVENTS_CAPACITY};
use crate::hang::{HangAction, JobHangs};
use crate::monotonic_ns;
use crate::profile::ProfileWriter;
use crate::server::Ingest;

/// Between two flushes, acknowledgements and updates of the live model.
pub const TICK: Duration = Duration::from_millis(100);

/// Between two attribution rounds (joins of what every rank reported), at most. Records wait
/// in the queue while a round runs, so a round is kept to what became ready since the last:
/// at 10,000 ranks one round per [`TICK`] joined 20,000–30,000 rank-iterations at once, 20–55
/// ms during which nothing was taken in; one round per iteration of the job is a third of that.
pub const ATTRIBUTE_EVERY: Duration = Duration::from_millis(20);

/// Rank-iterations one attribution round joins at most (whole iterations, at least one): from
/// 5,000 ranks on, one iteration a round, about 10 ms of the job thread at 10,000 ranks. At
/// 20,000 a round there joined two iterations whenever one had waited, 44–124 ms while records
/// queued. A backlog (a rank's late reports held its iterations back) is joined over several
/// rounds, [`ATTRIBUTE_EVERY`] apart (50 a second, more than a 30 Hz job's iterations), with
/// records taken in between.
pub const ROUND_RANK_ITERATIONS: usize = 5_000;

/// Messages taken from the queue per wake-up of the job task, beyond the first.
const DRAIN_AT_ONCE: usize = 256;

/// The job task's state.
pub struct JobTask {
    journal: Journal,
    feed: broadcast::Sender<JobEvent>,
    /// [`JobEvent::Iteration`]s, apart from the other events: one per rank-iteration
    /// (300,000 a second at 10,000 ranks) is more than the terminal's printer should wake
    /// for, and nothing is made of them while nobody subscribes.
    iterations: broadcast::Sender<JobEvent>,
    hub: Arc<FeedHub>,
    /// Per connection (by the address of its ack cell), the cell and the highest sequence
    /// number written since the last flush.
    unflushed: HashMap<usize, (Arc<AtomicU64>, u64)>,
    dropped: BTreeMap<String, u64>,
    /// The slowdowns already published.
    slowdowns: SlowdownNews,
    /// Declares hangs across nodes.
    hangs: JobHangs,
    /// Where a request for the ranks' places and stacks goes (every agent's connection).
    stacks_asks: Option<watch::Sender<u64>>,
    /// Connections welcomed, by node (a node reconnecting may briefly hold two).
    connected: BTreeMap<String, usize>,
    /// Each node's name as the iteration events share it, made once per node.
    node_names: HashMap<String, Arc<str>>,
    /// The name [`JobTask::node_name`] gave last.
    last_name: Option<Arc<str>>,
}

/// What the records of one [`Ingest::Records`] share: looked up once for them all.
struct Batch {
    /// Whether anyone subscribes to the iteration events.
    watched: bool,
    /// The node's clock estimate, once looked up (`Some(None)`: none yet).
    clock: Option<Option<NodeClock>>,
    /// ns, when the records were taken (the collector's clock): progress for the hang watch.
    now: u64,
}

impl JobTask {
    /// A task of job `name` writing to `writer`, starting the profile with `header`; node
    /// events go to `feed`, the live model to `hub`.
    pub fn new(
        writer: ProfileWriter,
        header: RunHeader,
        name: &str,
        feed: broadcast::Sender<JobEvent>,
        hub: Arc<FeedHub>,
    ) -> JobTask {
        let mut journal =
            Journal::new(Some(Box::new(writer)), header, name, Breakdowns::NotWritten);
        journal.limit_rounds(ROUND_RANK_ITERATIONS);
        JobTask {
            journal,
            feed,
            iterations: broadcast::channel(EVENTS_CAPACITY).0,
            hub,
            unflushed: HashMap::new(),
            dropped: BTreeMap::new(),
            slowdowns: SlowdownNews::default(),
            hangs: JobHangs::new(None),
            stacks_asks: None,
            connected: BTreeMap::new(),
            node_names: HashMap::new(),
            last_name: None,
        }
    }

    /// Declares a hang after `after_ns` without an iteration of any rank (`None`: the
    /// default, see [`stallscope_analysis::hang::HangWatch::new`]), asking the agents through
    /// `asks` (the server's `ServerConfig::stacks_asked`) where their ranks stand.
    pub fn with_hang_watch(mut self, after_ns: Option<u64>, asks: watch::Sender<u64>) -> JobTask {
        self.hangs = JobHangs::new(after_ns);
        self.stacks_asks = Some(asks);
        self
    }

    /// Where the [`JobEvent::Iteration`]s go (subscribe before the task runs).
    pub fn iteration_events(&self) -> broadcast::Sender<JobEvent> {
        self.iterations.clone()
    }

    fn emit(&mut self, frame: Frame) {
        self.journal.emit(frame);
    }

    fn publish(&self, u: JobEvent) {
        let _ = self.feed.send(u);
    }

    /// Takes one message from a connection.
    pub fn on_ingest(&mut self, msg: Ingest) {
        match msg {
            Ingest::NodeUp { node, peer } => {
                *self.connected.entry(node.clone()).or_default() += 1;
                self.publish(JobEvent::NodeUp { node, peer })
            }
            Ingest::NodeDown { node, peer, reason } => {
                if let Some(n) = node.as_ref().and_then(|n| self.connected.get_mut(n)) {
                    *n = n.saturating_sub(1);
                }
                self.connected.retain(|_, n| *n > 0);
                self.publish(JobEvent::NodeDown { node, peer, reason })
            }
            Ingest::Clock(c) => {
                self.emit(Frame::NodeClock(c));
            }
            Ingest::Records {
                records,
                encoded,
                ack,
            } => {
                let Some(last) = records.last().map(|r| r.0) else {
                    return;
                };
                // One connection's records: one node, whose clock no record changes (an
                // agent sends no clock estimates), so its name and clock are looked up once.
                let now = monotonic_ns();
                if let Some(node) = records.iter().find_map(|(_, f)| f.node_iteration()) {
                    let iterations =
                        records
                            .iter()
                            .filter_map(|(_, f)| f.node_iteration())
                            .map(|it| {
                                let b = &it.breakdown;
                                (b.rank, b.iter, b.end_ns.saturating_sub(b.start_ns))
                            });
                    self.hangs.on_iterations(&node.node, iterations, now);
                }
                let mut batch = Batch {
                    watched: self.iterations.receiver_count() > 0,
                    clock: None,
                    now,
                };
                for (i, (_, frame)) in records.into_iter().enumerate() {
                    self.on_record(frame, encoded.get(i), &mut batch);
                }
                self.unflushed_upto(ack, last);
            }
        }
    }

    /// Notes that the connection of `ack` has records up to `seq` waiting for the flush.
    fn unflushed_upto(&mut self, ack: Arc<AtomicU64>, seq: u64) {
        // Keyed by the connection's ack cell: one entry per connection, found without a scan
        // over every connection (1,000 agents would make that the hot spot).
        self.unflushed
            .entry(Arc::as_ptr(&ack) as usize)
            .and_modify(|entry| entry.1 = entry.1.max(seq))
            .or_insert((ack, seq));
    }

    /// Takes one frame from a node: the profile (`encoded`: its encoding, when the
    /// connection made it from the bytes received) and the timeline, and the live feed.
    fn on_record(&mut self, frame: Frame, encoded: Option<&[u8]>, batch: &mut Batch) {
        if let Frame::NodeHang(h) = &frame {
            self.hangs.on_answer((**h).clone(), batch.now);
        }
        let update = if let Some(it) = frame.node_iteration().filter(|_| batch.watched) {
            let journal = &self.journal;
            let clock = batch.clock.get_or_insert_with(|| {
                // The figures `to_collector` reads, without a copy of the node's name.
                journal
                    .timeline()
                    .nodes
                    .clocks
                    .get(&it.node)
                    .map(|c| NodeClock {
                        node: String::new(),
                        ..*c
                    })
            });
            let end_ns = clock
                .as_ref()
                .map_or(it.breakdown.end_ns, |c| c.to_collector(it.breakdown.end_ns));
            Some(JobEvent::Iteration {
                node: self.node_name(&it.node),
                rank: it.breakdown.rank,
                iter: it.breakdown.iter,
                end_ns,
                split: it.breakdown.split,
                gpu_busy_ppm: match &frame {
                    Frame::NodeReport(r) => r.gpu.as_ref().and_then(|g| g.busy_ppm),
                    _ => None,
                },
            })
        } else if let Frame::NodeHealth(h) = &frame {
            let before = self.dropped.insert(h.node.clone(), h.records_dropped);
            (before.unwrap_or(0) != h.records_dropped).then(|| JobEvent::Dropped {
                node: h.node.clone(),
                records: h.records_dropped,
            })
        } else {
            None
        };
        match encoded {
            Some(payload) => self.journal.emit_encoded(frame, payload),
            None => self.emit(frame),
        }
        match update {
            Some(u @ JobEvent::Iteration { .. }) => {
                let _ = self.iterations.send(u);
            }
            Some(u) => self.publish(u),
            None => {}
        }
    }

    /// `node`'s name, shared.
    fn node_name(&mut self, node: &str) -> Arc<str> {
        // A connection's records come together: most often the name of the one before.
        if let Some(name) = self.last_name.as_ref().filter(|n| ***n == *node) {
            return name.clone();
        }
        if let Some(name) = self.node_names.get(node) {
            self.last_name = Some(name.clone());
            return name.clone();
        }
        let name: Arc<str> = Arc::from(node);
        self.node_names.insert(node.to_string(), name.clone());
        self.last_name = Some(name.clone());
        name
    }

    /// Joins what is ready and attributes it; publishes the slowdowns it declared.
    pub fn attribute(&mut self, finishing: bool) {
        self.journal.attribute(monotonic_ns(), finishing);
        let job = self.journal.timeline();
        if !job.summary.slowdowns.found().is_empty() {
            for s in self.slowdowns.take(&summary::slowdowns(job)) {
                self.publish(JobEvent::Slowdown(Box::new(s)));
            }
        }
    }

    /// Joins what is ready, flushes, acknowledges, publishes the model.
    pub fn tick(&mut self, finishing: bool) {
        self.attribute(finishing);
        if !finishing {
            self.watch_for_hang();
        }
        self.journal.flush();
        if self.journal.is_writing() {
            for (_, (ack, seq)) in self.unflushed.drain() {
                ack.store(seq, Ordering::Release);
            }
        }
        let update = self.journal.take_update();
        self.hub.publish(self.journal.view(), update);
    }

    /// Asks the agents when the job stalls, declares the hang from their answers (or its end):
    /// in the profile (`Frame::Hang`, so the summary's `hangs`, the live model, `/metrics`
    /// and the report) and as an event (the collector's stderr).
    fn watch_for_hang(&mut self) {
        let started = self
            .journal
            .timeline()
            .header
            .as_ref()
            .map_or(0, |h| h.started_mono_ns);
        let nodes: BTreeSet<String> = self.connected.keys().cloned().collect();
        match self.hangs.check(monotonic_ns(), started, &nodes) {
            Some(HangAction::Ask(id)) => {
                if let Some(asks) = &self.stacks_asks {
                    asks.send_replace(id);
                }
            }
            Some(HangAction::Declared {
                report,
                answered_after_seconds,
            }) => {
                self.emit(Frame::Hang(report.clone()));
                self.publish(JobEvent::Hang {
                    report,
                    answered_after_seconds,
                });
            }
            Some(HangAction::Resumed(report)) => {
                let after_seconds = report.resumed_after_seconds.unwrap_or_default();
                self.emit(Frame::Hang(report));
                self.publish(JobEvent::HangResumed { after_seconds });
            }
            None => {}
        }
    }

    /// Writes the end of the profile and returns the job summary.
    pub fn finish(mut self) -> (Summary, Option<String>) {
        self.tick(true);
        let end = RunEnd {
            ended_mono_ns: monotonic_ns(),
            exit_code: 0,
            markers_dropped: 0,
            markers_rejected: 0,
        };
        let done = self.journal.finish(monotonic_ns(), end);
        self.hub.end();
        done
    }
}

/// Runs the job task until `shutdown` turns true (or every connection's sender is gone), then
/// takes what is still queued, writes the end and returns the summary and any write error.
pub async fn run(
    mut task: JobTask,
    mut rx: mpsc::Receiver<Ingest>,
    mut shutdown: watch::Receiver<bool>,
) -> (Summary, Option<String>) {
    // The tick is kept by the clock, not only by a timer: while records keep arriving the task
    // never waits, and a runtime of its own advances its timers only when it does.
    let mut next_tick = tokio::time::Instant::now() + TICK;
    let mut next_round = tokio::time::Instant::now() + ATTRIBUTE_EVERY;
    loop {
        tokio::select! {
            msg = rx.recv() => match msg {
                Some(m) => {
                    task.on_ingest(m);
                    // What else is queued, up to a bound so the tick is never starved.
                    for _ in 0..DRAIN_AT_ONCE {
                        match rx.try_recv() {
                            Ok(m) => task.on_ingest(m),
                            Err(_) => break,
                        }
                    }
                }
                None => break,
            },
            _ = tokio::time::sleep_until(next_tick.min(next_round)) => {}
            _ = shutdown.changed() => break,
        }
        let now = tokio::time::Instant::now();
        if now >= next_tick {
            task.tick(false);
            // A late tick is not made up for with a burst of them.
            next_tick = (next_tick + TICK).max(now + TICK / 2);
            next_round = now + ATTRIBUTE_EVERY;
        } else if now >= next_round {
            task.attribute(false);
            next_round = now + ATTRIBUTE_EVERY;
        }
    }
    while let Ok(m) = rx.try_recv() {
        task.on_ingest(m);
    }
    task.finish()
}
