//! Per-flow network truth: which TCP connections of a node carried whose bytes.
//!
//! A node's NIC counters cannot tell a gradient all-reduce from a checkpoint upload or another
//! tenant's transfer. An agent's flow source (sock_diag: `agent/src/sources/flows.rs`) reads
//! every TCP socket of its network namespace with its `tcp_info` and owner, classes each
//! ([`FlowClass`]) and ships what changed every half second ([`NodeFlows`], appended last to
//! the frames). The [`FlowLedger`] keeps each flow's totals for the summary
//! ([`FlowSummary`]: the largest flows, the rest summed per class), and when each flow that is
//! not the job's moved bytes, in a few merged runs of time, so that the finding can say that
//! another transfer shared the link while the collectives waited ([`SharedLink`]).
//!
//! What is lost: a connection that opens and closes between two reads of the source (100 ms)
//! is never seen, and one that closes loses what it moved since its last read.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::attribution::IterationBreakdown;
use crate::category::Category;
use crate::Nanos;

/// Whose a flow is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FlowClass {
    /// A training loop's socket to another rank (gloo, NCCL's socket transport).
    Collective,
    /// A data-loader worker's socket (a dataset read over the network).
    Data,
    /// Rendezvous and store: the `MASTER_PORT` store's connections, the launcher's.
    Control,
    /// Not the job's: another process on the node.
    Other,
}

impl FlowClass {
    /// Every class, in order.
    pub const ALL: [FlowClass; 4] = [
        FlowClass::Collective,
        FlowClass::Data,
        FlowClass::Control,
        FlowClass::Other,
    ];

    /// The name in the summary JSON and in series labels.
    pub fn as_str(self) -> &'static str {
        match self {
            FlowClass::Collective => "collective",
            FlowClass::Data => "data",
            FlowClass::Control => "control",
            FlowClass::Other => "other",
        }
    }
}

/// One TCP connection as the flow source last read it. Totals count from the connection's
/// start when the source saw it open, else from the source's first read. The packet source
/// (`agent/src/sources/packets.rs`, where the agent may capture) sends UDP flows the same way:
/// their `local` and `remote` end in `/udp`, with bytes counted from the capture's start and no
/// retransmissions or RTT.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FlowSample {
    /// Its class at this read.
    pub class: Option<FlowClass>,
    /// `address:port` on this node (`[v6]:port` for IPv6).
    pub local: String,
    /// `address:port` of the peer.
    pub remote: String,
    /// Whether it stays on the node (a loopback address): it never crosses a NIC.
    pub loopback: bool,
    /// The job's processes holding the socket (empty for `other`).
    pub pids: Vec<u32>,
    /// bytes received (`tcpi_bytes_received`).
    pub bytes_in: u64,
    /// bytes sent and acknowledged (`tcpi_bytes_acked`).
    pub bytes_out: u64,
    /// segments retransmitted (`tcpi_total_retrans`).
    pub retransmits: u64,
    /// us, smoothed round-trip time (`tcpi_rtt`).
    pub rtt_us: u32,
}

/// What changed about a node's flows since the last [`NodeFlows`]: flows that moved bytes or
/// opened.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeFlows {
    /// The node (set by the collector from the agent's Hello; empty in a run's own profile).
    pub node: String,
    /// ns, the node's clock, when the read that these totals come from began.
    pub t_ns: Nanos,
    /// ns, the node's clock, the previous [`NodeFlows`] of the node (its bytes moved in
    /// between); equal to `t_ns` for the first.
    pub since_ns: Nanos,
    /// The flows, with their totals.
    pub flows: Vec<FlowSample>,
}

/// Flows listed one by one in the summary of a node; the rest are summed per class.
pub const LISTED_FLOWS: usize = 10;

/// Runs of activity kept per flow (the oldest are dropped past it).
const MAX_RUNS: usize = 64;

/// ns: activity this close to a run's end extends it (consecutive reports of a flow that
/// keeps moving meet exactly: each starts where the previous ended).
const RUN_GAP_NS: Nanos = 0;

/// Iterations with network waits kept per node (and rank) to meet flows that arrive after
/// them: flows arrive about a second late, iterations last milliseconds or more.
const MAX_WAITS: usize = 4096;

/// Flows kept per node before the quietest are folded into their class's rest.
const MAX_FLOWS: usize = 512;

/// One node's flow, with its totals in the summary JSON.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FlowSummary {
    /// `collective`, `data`, `control` or `other`.
    pub class: Option<FlowClass>,
    /// `address:port` on the node; `null` for a class's rest.
    pub local: Option<String>,
    /// `address:port` of the peer; `null` for a class's rest.
    pub remote: Option<String>,
    /// The job's processes holding it.
    pub pids: Vec<u32>,
    /// bytes received.
    pub bytes_in: u64,
    /// bytes sent (acknowledged).
    pub bytes_out: u64,
    /// segments retransmitted: a sign of congestion on the path.
    pub retransmits: u64,
    /// ms, the last smoothed round-trip time; `null` for a class's rest.
    pub rtt_ms: Option<f64>,
    /// How many flows this row sums (1 for a listed flow).
    pub flows: u64,
}

/// What a node's flows of one class moved over its NICs (loopback flows left out), for the
/// live views: `top`'s share of the NIC, `/metrics`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowClassTotals {
    /// The class.
    pub class: Option<FlowClass>,
    /// bytes received.
    pub bytes_in: u64,
    /// bytes sent (acknowledged).
    pub bytes_out: u64,
    /// segments retransmitted.
    pub retransmits: u64,
}

/// The job's share of `totals`' bytes (every class but `other`), 0–1; `None` when nothing
/// moved.
pub fn job_share(totals: &[FlowClassTotals]) -> Option<f64> {
    let bytes = |t: &FlowClassTotals| (t.bytes_in + t.bytes_out) as f64;
    let all: f64 = totals.iter().map(bytes).sum();
    let job: f64 = totals
        .iter()
        .filter(|t| t.class != Some(FlowClass::Other))
        .map(bytes)
        .sum();
    (all > 0.0).then(|| job / all)
}

/// A transfer that was not the job's and moved bytes over a NIC while the job's collectives
/// waited on the network.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SharedLink {
    /// The node whose link was shared.
    pub node: String,
    /// `address:port` on the node.
    pub local: String,
    /// `address:port` of the peer.
    pub remote: String,
    /// bytes it moved in all (both ways).
    pub bytes: u64,
    /// Its retransmitted segments.
    pub retransmits: u64,
    /// The first and last iteration in which it moved bytes while a collective waited on the
    /// network.
    pub iterations: (u64, u64),
}

#[derive(Clone, Debug, Default)]
struct FlowState {
    last: FlowSample,
    /// ns, the last read in which it moved bytes.
    last_active_ns: Nanos,
    /// Merged runs `[from, to]` (ns) in which it moved bytes.
    runs: VecDeque<(Nanos, Nanos)>,
    /// Iterations in which it moved bytes while a collective waited: first, last.
    shared: Option<(u64, u64)>,
}

#[derive(Clone, Debug, Default)]
struct NodeLedger {
    /// ns, the latest [`NodeFlows::t_ns`].
    t_ns: Nanos,
    flows: BTreeMap<(String, String), FlowState>,
    /// Flows folded out of `flows`, summed per class.
    folded: BTreeMap<FlowClass, FlowSummary>,
    /// The same, of those over a NIC only.
    folded_nic: BTreeMap<FlowClass, FlowSummary>,
    /// This node's latest iterations with network waits, `[from, to]` (ns) and number, kept
    /// to meet flow activity that arrives after them.
    waits: VecDeque<(Nanos, Nanos, u64)>,
}

/// Every node's flows, as their [`NodeFlows`] arrived.
#[derive(Clone, Debug, Default)]
pub struct FlowLedger {
    nodes: BTreeMap<String, NodeLedger>,
}

fn push_run(runs: &mut VecDeque<(Nanos, Nanos)>, from: Nanos, to: Nanos) {
    match runs.back_mut() {
        Some(last) if from <= last.1 + RUN_GAP_NS => {
            last.0 = last.0.min(from);
            last.1 = last.1.max(to);
        }
        _ => {
            if runs.len() == MAX_RUNS {
                runs.pop_front();
            }
            runs.push_back((from, to));
        }
    }
}

fn overlaps((a0, a1): (Nanos, Nanos), (b0, b1): (Nanos, Nanos)) -> bool {
    a0 <= b1 && b0 <= a1
}

fn widen(range: &mut Option<(u64, u64)>, first: u64, last: u64) {
    *range = Some(match *range {
        Some((a, b)) => (a.min(first), b.max(last)),
        None => (first, last),
    });
}

impl NodeLedger {
    fn ingest(&mut self, f: &NodeFlows) {
        self.t_ns = self.t_ns.max(f.t_ns);
        for s in &f.flows {
            let key = (s.local.clone(), s.remote.clone());
            let state = self.flows.entry(key).or_default();
            let moved = s.bytes_in + s.bytes_out > state.last.bytes_in + state.last.bytes_out;
            if moved && !s.loopback && s.class == Some(FlowClass::Other) {
                push_run(&mut state.runs, f.since_ns.min(f.t_ns), f.t_ns);
                let run = (f.since_ns.min(f.t_ns), f.t_ns);
                for &(w0, w1, i) in &self.waits {
                    if overlaps(run, (w0, w1)) {
                        widen(&mut state.shared, i, i);
                    }
                }
            }
            if moved {
                state.last_active_ns = f.t_ns;
            }
            state.last = s.clone();
        }
        if self.flows.len() > MAX_FLOWS {
            self.fold_quietest(self.flows.len() - MAX_FLOWS);
        }
    }

    fn fold_quietest(&mut self, n: usize) {
        let mut by_age: Vec<(Nanos, (String, String))> = self
            .flows
            .iter()
            .map(|(k, s)| (s.last_active_ns, k.clone()))
            .collect();
        by_age.sort();
        for (_, key) in by_age.into_iter().take(n) {
            if let Some(s) = self.flows.remove(&key) {
                let class = s.last.class.unwrap_or(FlowClass::Other);
                let rest = self.folded.entry(class).or_default();
                rest.class = Some(class);
                rest.bytes_in += s.last.bytes_in;
                rest.bytes_out += s.last.bytes_out;
                rest.retransmits += s.last.retransmits;
                rest.flows += 1;
                if !s.last.loopback {
                    let nic = self.folded_nic.entry(class).or_default();
                    nic.bytes_in += s.last.bytes_in;
                    nic.bytes_out += s.last.bytes_out;
                    nic.retransmits += s.last.retransmits;
                }
            }
        }
    }

    /// Notes an iteration with network waits; flows already seen moving then share it.
    fn wait(&mut self, b: &IterationBreakdown) {
        let span = (b.start_ns, b.end_ns);
        if self.waits.len() == MAX_WAITS {
            self.waits.pop_front();
        }
        self.waits.push_back((span.0, span.1, b.iter));
        for s in self.flows.values_mut() {
            if s.runs.iter().any(|&r| overlaps(r, span)) {
                widen(&mut s.shared, b.iter, b.iter);
            }
        }
    }

    fn summary(&self) -> Vec<FlowSummary> {
        let mut all: Vec<FlowSummary> = self
            .flows
            .values()
            .filter(|s| s.last.bytes_in + s.last.bytes_out > 0)
            .map(|s| FlowSummary {
                class: s.last.class,
                local: Some(s.last.local.clone()),
                remote: Some(s.last.remote.clone()),
                pids: s.last.pids.clone(),
                bytes_in: s.last.bytes_in,
                bytes_out: s.last.bytes_out,
                retransmits: s.last.retransmits,
                rtt_ms: Some(f64::from(s.last.rtt_us) / 1e3),
                flows: 1,
            })
            .collect();
        all.sort_by_key(|f| std::cmp::Reverse(f.bytes_in + f.bytes_out));
        let rest = all.split_off(all.len().min(LISTED_FLOWS));
        let mut folded = self.folded.clone();
        for f in rest {
            let class = f.class.unwrap_or(FlowClass::Other);
            let r = folded.entry(class).or_default();
            r.class = Some(class);
            r.bytes_in += f.bytes_in;
            r.bytes_out += f.bytes_out;
            r.retransmits += f.retransmits;
            r.flows += 1;
        }
        all.extend(folded.into_values());
        all
    }
}

impl FlowLedger {
    /// Takes one node's flows (`node` empty: the run's own node).
    pub fn ingest(&mut self, f: &NodeFlows) {
        self.nodes.entry(f.node.clone()).or_default().ingest(f);
    }

    /// Takes iterations as they are attributed: those of node `node` (empty: the run's own)
    /// whose collectives waited on the network mark when the link mattered.
    pub fn iterations(&mut self, node: &str, done: &[IterationBreakdown]) {
        let Some(ledger) = self.nodes.get_mut(node) else {
            return;
        };
        for b in done.iter().filter(|b| b.split.get(Category::Network) > 0) {
            ledger.wait(b);
        }
    }

    /// Node `node`'s flows as last read, and when (ns, its clock): what an agent forwards.
    pub fn latest(&self, node: &str) -> Option<(Nanos, impl Iterator<Item = &FlowSample>)> {
        let l = self.nodes.get(node)?;
        Some((l.t_ns, l.flows.values().map(|s| &s.last)))
    }

    /// Node `node`'s flows over its NICs summed per class, in class order (classes that
    /// moved nothing left out).
    pub fn class_totals(&self, node: &str) -> Vec<FlowClassTotals> {
        let Some(l) = self.nodes.get(node) else {
            return Vec::new();
        };
        let mut by: BTreeMap<FlowClass, FlowClassTotals> = BTreeMap::new();
        let flows = l.flows.values().map(|s| &s.last).filter(|f| !f.loopback);
        for f in flows {
            let class = f.class.unwrap_or(FlowClass::Other);
            let t = by.entry(class).or_default();
            t.class = Some(class);
            t.bytes_in += f.bytes_in;
            t.bytes_out += f.bytes_out;
            t.retransmits += f.retransmits;
        }
        for (class, r) in &l.folded_nic {
            let t = by.entry(*class).or_default();
            t.class = Some(*class);
            t.bytes_in += r.bytes_in;
            t.bytes_out += r.bytes_out;
            t.retransmits += r.retransmits;
        }
        by.into_values()
            .filter(|t| t.bytes_in + t.bytes_out + t.retransmits > 0)
            .collect()
    }

    /// Whether any node reported flows.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The nodes that reported flows (empty name: the run's own).
    pub fn nodes(&self) -> impl Iterator<Item = &str> {
        self.nodes.keys().map(String::as_str)
    }

    /// Node `node`'s flows for the summary: the [`LISTED_FLOWS`] largest, then the rest
    /// summed per class (`local` and `remote` null).
    pub fn summary(&self, node: &str) -> Vec<FlowSummary> {
        self.nodes
            .get(node)
            .map(NodeLedger::summary)
            .unwrap_or_default()
    }

    /// Transfers that were not the job's and moved bytes over a NIC while its collectives
    /// waited on the network, the largest first. `own` names the run's own node (the empty
    /// name).
    pub fn shared_links(&self, own: &str) -> Vec<SharedLink> {
        let mut out: Vec<SharedLink> = self
            .nodes
            .iter()
            .flat_map(|(node, l)| {
                l.flows.values().filter_map(move |s| {
                    Some(SharedLink {
                        node: if node.is_empty() { own } else { node }.to_string(),
                        local: s.last.local.clone(),
                        remote: s.last.remote.clone(),
                        bytes: s.last.bytes_in + s.last.bytes_out,
                        retransmits: s.last.retransmits,
                        iterations: s.shared?,
                    })
                })
            })
            .collect();
        out.sort_by_key(|s| std::cmp::Reverse(s.bytes));
        out
    }
}

/// bytes in words: `25 MB`, `640 kB`, `900 B`.
pub fn bytes_in_words(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= 1e9 {
        format!("{:.1} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.0} MB", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.0} kB", b / 1e3)
    } else {
        format!("{bytes} B")
    }
}

/// The sentence the finding adds when another transfer shared the link.
pub fn shared_link_sentence(s: &SharedLink) -> String {
    let (a, b) = s.iterations;
    let when = if a == b {
        format!("iteration {a}")
    } else {
        format!("iterations {a}–{b}")
    };
    let retrans = if s.retransmits > 0 {
        format!(
            ", with {} retransmitted segments (congestion)",
            s.retransmits
        )
    } else {
        String::new()
    };
    format!(
        "An unrelated transfer of {} ({} → {} on {}) shared the link at {when}{retrans}, while the collectives waited on the network.",
        bytes_in_words(s.bytes),
        s.local,
        s.remote,
        s.node
    )
}

#[cfg(test)]
mod tests;
