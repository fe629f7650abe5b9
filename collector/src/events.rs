//! The collector's events: agents joining and leaving, records dropped, iterations arriving,
//! ranks turning slow —
//! what the collector's terminal says as it happens, and what its load benchmark times. An
//! in-process broadcast; a subscriber that falls behind misses events (it is told how many)
//! rather than slowing the collector. (The live job model every view renders is the feed:
//! `analysis::view`'s `FeedHub`.)

use std::net::SocketAddr;
use std::sync::Arc;

use stallscope_analysis::category::Split;
use stallscope_analysis::hang::HangReport;
use stallscope_analysis::slowdown::Slowdown;
use stallscope_analysis::Nanos;

/// Events kept for a slow subscriber before it starts missing them.
pub const EVENTS_CAPACITY: usize = 65_536;

/// One thing the collector learned.
#[derive(Clone, Debug)]
pub enum JobEvent {
    /// An agent was welcomed.
    NodeUp {
        /// Its node name.
        node: String,
        /// Its address.
        peer: SocketAddr,
    },
    /// An agent's connection ended; `reason` says why when it was refused or broken.
    NodeDown {
        /// Its node name, if it said Hello.
        node: Option<String>,
        /// Its address.
        peer: SocketAddr,
        /// Why, when not a clean goodbye.
        reason: Option<String>,
    },
    /// A rank's iteration arrived from its node (before the cross-node join). Sent on a
    /// broadcast of its own (`JobTask::iteration_events`), not with the other events.
    Iteration {
        /// Its node: shared, as every subscriber gets its own copy of the event (300,000 a
        /// second at 10,000 ranks).
        node: Arc<str>,
        /// Global rank.
        rank: u32,
        /// Iteration index.
        iter: u64,
        /// ns, collector clock, when the iteration ended.
        end_ns: Nanos,
        /// The node's split (peer wait among its own ranks only).
        split: Split,
        /// Share of the iteration the rank's GPU was busy, ppm, when its agent read one.
        gpu_busy_ppm: Option<u32>,
    },
    /// A rank turned slow (`until_iteration` null), or one that did recovered.
    Slowdown(Box<Slowdown>),
    /// No rank finished an iteration for the hang threshold: where each stands, with stacks.
    Hang {
        /// The hang.
        report: Box<HangReport>,
        /// s from the collector's request to the last agent's answer (`None`: none answered).
        answered_after_seconds: Option<f64>,
    },
    /// The declared hang ended: a rank finished an iteration.
    HangResumed {
        /// s from the declaration to that iteration.
        after_seconds: f64,
    },
    /// Records from one node dropped by its agent while the collector was away (new total).
    Dropped {
        /// The node.
        node: String,
        /// Records, in total.
        records: u64,
    },
}
