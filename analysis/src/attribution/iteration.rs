//! Attribution of one iteration of one rank.
//!
//! The iteration is cut into pieces at every phase boundary; each piece takes the label of the
//! most specific phase covering it (`comm` over `data` over `h2d`/`compute`), and each label
//! has its rule. Weights from counters are turned into nanoseconds with largest-remainder
//! rounding per piece, so the parts always sum to the wall time.

use crate::category::{apportion, Category, Split};
use crate::loops::Span;
use crate::marker::phase;
use crate::series::SeriesId;
use crate::timeline::SeriesStore;
use crate::Nanos;

use super::{Basis, Coverage, Evidence, IterationBreakdown};

/// Byte rate below which a link is taken as quiet, bytes/s: background chatter (ssh, DNS,
/// package downloads) must not turn idle time into "network".
pub const QUIET_LINK_BYTES_PER_S: f64 = 100_000.0;

/// Loader CPU below which the loader is taken as idle, cores.
pub const IDLE_LOADER_CORES: f64 = 0.1;

/// The series of one process's main thread.
#[derive(Clone, Copy, Debug, Default)]
pub struct ThreadSeries {
    /// `proc.main.cpu_ns`.
    pub cpu: Option<SeriesId>,
    /// `proc.main.runq_ns`.
    pub runq: Option<SeriesId>,
    /// `proc.main.blocked_io`.
    pub blocked: Option<SeriesId>,
}

/// The series that speak for one rank.
#[derive(Clone, Debug, Default)]
pub struct RankSeries {
    /// The training loop's process.
    pub main: ThreadSeries,
    /// Its data-loader workers; empty when it loads in the loop (0 workers).
    pub loaders: Vec<ThreadSeries>,
}

/// The node's links.
#[derive(Clone, Debug, Default)]
pub struct Links {
    /// `net.rx_bytes`/`net.tx_bytes` of network interfaces.
    pub nic: Vec<SeriesId>,
    /// The same for loopback.
    pub local: Vec<SeriesId>,
    /// bytes/s, the highest NIC rate seen (0 when unknown).
    pub nic_bytes_per_s: f64,
    /// bytes/s, the highest loopback rate seen (0 when unknown).
    pub local_bytes_per_s: f64,
    /// Where exposed communication goes when no bytes were seen on any link.
    pub comm_fallback: Category,
}

/// One iteration to attribute.
#[derive(Clone, Debug)]
pub struct IterationInput {
    /// Global rank.
    pub rank: u32,
    /// The loop's process.
    pub pid: u32,
    /// Iteration index.
    pub iter: u64,
    /// ns.
    pub start: Nanos,
    /// ns.
    pub end: Nanos,
    /// The loop's phases, clipped to `[start, end]`.
    pub spans: Vec<Span>,
    /// For each `comm` span beginning in this iteration (in order): when the last rank began
    /// the same collective, ns, if other ranks were seen.
    pub peer_arrivals: Vec<Option<Nanos>>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Label {
    Comm(usize),
    Data,
    Compute,
    Unmarked,
}

/// Accumulates (category, basis, weight) and turns a piece into exact nanoseconds.
#[derive(Default)]
struct Parts {
    split: Split,
    evidence: Vec<Evidence>,
}

impl Parts {
    fn put(&mut self, category: Category, basis: Basis, ns: u64) {
        if ns == 0 {
            return;
        }
        self.split.add(category, ns);
        match self
            .evidence
            .iter_mut()
            .find(|e| e.category == category && e.basis == basis)
        {
            Some(e) => e.ns += ns,
            None => self.evidence.push(Evidence {
                category,
                basis,
                ns,
            }),
        }
    }

    fn apportion(
        &mut self,
        span: u64,
        weights: &[(Category, Basis, f64)],
        fallback: (Category, Basis),
    ) {
        let raw: Vec<f64> = weights.iter().map(|w| w.2).collect();
        match apportion(span, &raw) {
            Some(ns) => {
                for (w, n) in weights.iter().zip(ns) {
                    self.put(w.0, w.1, n);
                }
            }
            None => self.put(fallback.0, fallback.1, span),
        }
    }
}

/// Cuts `[start, end]` at every span boundary and labels each piece.
fn pieces(input: &IterationInput) -> Vec<(Nanos, Nanos, Label)> {
    let mut cuts = vec![input.start, input.end];
    for s in &input.spans {
        cuts.push(s.begin);
        cuts.push(s.end);
    }
    cuts.sort_unstable();
    cuts.dedup();
    let mut comm_order: Vec<&Span> = input
        .spans
        .iter()
        .filter(|s| s.phase == phase::COMM)
        .collect();
    comm_order.sort_by_key(|s| s.begin);
    let mut out: Vec<(Nanos, Nanos, Label)> = Vec::new();
    for w in cuts.windows(2) {
        let (a, b) = (w[0], w[1]);
        if b <= a {
            continue;
        }
        let covers = |s: &Span| s.begin <= a && s.end >= b;
        let label = if let Some(i) = comm_order.iter().position(|s| covers(s)) {
            Label::Comm(i)
        } else if input
            .spans
            .iter()
            .any(|s| s.phase == phase::DATA && covers(s))
        {
            Label::Data
        } else if input
            .spans
            .iter()
            .any(|s| (s.phase == phase::COMPUTE || s.phase == phase::H2D) && covers(s))
        {
            Label::Compute
        } else {
            Label::Unmarked
        };
        match out.last_mut() {
            Some(last) if last.2 == label && last.1 == a => last.1 = b,
            _ => out.push((a, b, label)),
        }
    }
    out
}

fn delta(store: &SeriesStore, id: Option<SeriesId>, a: Nanos, b: Nanos) -> f64 {
    id.and_then(|id| store.counter_delta(id, a, b))
        .unwrap_or(0.0)
}

/// ns the thread ran or waited to run in `[a, b]`.
fn busy_ns(store: &SeriesStore, t: &ThreadSeries, a: Nanos, b: Nanos) -> f64 {
    delta(store, t.cpu, a, b) + delta(store, t.runq, a, b)
}

/// ns the thread spent blocked on I/O in `[a, b]` (state D, as sampled).
fn io_ns(store: &SeriesStore, t: &ThreadSeries, a: Nanos, b: Nanos) -> f64 {
    t.blocked
        .and_then(|id| store.gauge_mean(id, a, b))
        .map_or(0.0, |m| m * (b - a) as f64)
}

fn loader_activity(store: &SeriesStore, rank: &RankSeries, a: Nanos, b: Nanos) -> (f64, f64) {
    let loaders: Vec<&ThreadSeries> = if rank.loaders.is_empty() {
        vec![&rank.main]
    } else {
        rank.loaders.iter().collect()
    };
    loaders.iter().fold((0.0, 0.0), |(cpu, io), t| {
        (cpu + busy_ns(store, t, a, b), io + io_ns(store, t, a, b))
    })
}

fn link_bytes(store: &SeriesStore, ids: &[SeriesId], a: Nanos, b: Nanos) -> f64 {
    ids.iter().map(|id| delta(store, Some(*id), a, b)).sum()
}

/// Transfer-time weights of the two link classes for bytes moved in `[a, b]`.
fn transfer_weights(store: &SeriesStore, links: &Links, a: Nanos, b: Nanos) -> (f64, f64) {
    let nic = link_bytes(store, &links.nic, a, b);
    let local = link_bytes(store, &links.local, a, b);
    let per = |bytes: f64, rate: f64| if rate > 0.0 { bytes / rate } else { bytes };
    (
        per(nic, links.nic_bytes_per_s),
        per(local, links.local_bytes_per_s),
    )
}

fn attribute_comm(
    parts: &mut Parts,
    store: &SeriesStore,
    links: &Links,
    (a, b): (Nanos, Nanos),
    arrival: Option<Nanos>,
) {
    let transfer_from = match arrival {
        Some(t) if t > a => {
            let wait_end = t.min(b);
            parts.put(Category::PeerWait, Basis::PeerArrival, wait_end - a);
            wait_end
        }
        _ => a,
    };
    if transfer_from >= b {
        return;
    }
    let (nic, local) = transfer_weights(store, links, transfer_from, b);
    parts.apportion(
        b - transfer_from,
        &[
            (Category::Network, Basis::CommNicBytes, nic),
            (Category::Interconnect, Basis::CommLocalBytes, local),
        ],
        (links.comm_fallback, Basis::CommNoBytes),
    );
}

fn attribute_data(
    parts: &mut Parts,
    store: &SeriesStore,
    rank: &RankSeries,
    (a, b): (Nanos, Nanos),
) {
    let (cpu, io) = loader_activity(store, rank, a, b);
    parts.apportion(
        b - a,
        &[
            (Category::DataPrep, Basis::DataLoaderCpu, cpu),
            (Category::DataFetch, Basis::DataLoaderIo, io),
        ],
        (Category::DataPrep, Basis::DataNoActivity),
    );
}

/// Rule 4: no marker speaks, so each sample tick decides.
fn attribute_unmarked(
    parts: &mut Parts,
    store: &SeriesStore,
    rank: &RankSeries,
    links: &Links,
    (a, b): (Nanos, Nanos),
) {
    let Some(cpu_id) = rank.main.cpu else {
        parts.put(Category::Other, Basis::Unexplained, b - a);
        return;
    };
    let mut cuts = vec![a];
    cuts.extend(store.times_within(cpu_id, a + 1, b.saturating_sub(1)));
    cuts.push(b);
    let mut weights: Vec<(Category, Basis, f64)> = Vec::new();
    let mut add = |c: Category, basis: Basis, w: f64| {
        if w > 0.0 {
            match weights.iter_mut().find(|x| x.0 == c && x.1 == basis) {
                Some(x) => x.2 += w,
                None => weights.push((c, basis, w)),
            }
        }
    };
    for w in cuts.windows(2) {
        let (x, y) = (w[0], w[1]);
        let len = (y - x) as f64;
        if len <= 0.0 {
            continue;
        }
        if store.counter_delta(cpu_id, x, y).is_none() {
            add(Category::Other, Basis::Unexplained, len);
            continue;
        }
        let busy = (busy_ns(store, &rank.main, x, y) / len).clamp(0.0, 1.0);
        add(Category::Compute, Basis::CounterBusy, busy * len);
        let idle = (1.0 - busy) * len;
        if idle <= 0.0 {
            continue;
        }
        let secs = len / 1e9;
        let nic_rate = link_bytes(store, &links.nic, x, y) / secs;
        let local_rate = link_bytes(store, &links.local, x, y) / secs;
        let (loader_cpu, loader_io) = if rank.loaders.is_empty() {
            (0.0, 0.0) // the loop itself is the loader, and it was idle
        } else {
            loader_activity(store, rank, x, y)
        };
        if nic_rate > QUIET_LINK_BYTES_PER_S || local_rate > QUIET_LINK_BYTES_PER_S {
            let (n, l) = transfer_weights(store, links, x, y);
            let n = if nic_rate > QUIET_LINK_BYTES_PER_S {
                n
            } else {
                0.0
            };
            let l = if local_rate > QUIET_LINK_BYTES_PER_S {
                l
            } else {
                0.0
            };
            add(Category::Network, Basis::CounterNic, idle * n / (n + l));
            add(
                Category::Interconnect,
                Basis::CounterLocal,
                idle * l / (n + l),
            );
        } else if loader_cpu + loader_io > IDLE_LOADER_CORES * len {
            let total = loader_cpu + loader_io;
            add(
                Category::DataPrep,
                Basis::CounterLoader,
                idle * loader_cpu / total,
            );
            add(
                Category::DataFetch,
                Basis::CounterLoader,
                idle * loader_io / total,
            );
        } else {
            add(Category::Other, Basis::Unexplained, idle);
        }
    }
    parts.apportion(b - a, &weights, (Category::Other, Basis::Unexplained));
}

/// Attributes one iteration. The parts of the result sum to `end - start` exactly.
pub fn attribute(
    input: &IterationInput,
    store: &SeriesStore,
    rank: &RankSeries,
    links: &Links,
) -> IterationBreakdown {
    let mut parts = Parts::default();
    let mut marked = 0;
    for (a, b, label) in pieces(input) {
        match label {
            Label::Comm(i) => {
                marked += b - a;
                let arrival = input.peer_arrivals.get(i).copied().flatten();
                attribute_comm(&mut parts, store, links, (a, b), arrival);
            }
            Label::Data => {
                marked += b - a;
                attribute_data(&mut parts, store, rank, (a, b));
            }
            Label::Compute => {
                marked += b - a;
                parts.put(Category::Compute, Basis::ComputeMarker, b - a);
            }
            Label::Unmarked => attribute_unmarked(&mut parts, store, rank, links, (a, b)),
        }
    }
    let sampled = rank
        .main
        .cpu
        .map_or(0, |id| store.covered(id, input.start, input.end));
    IterationBreakdown {
        rank: input.rank,
        pid: input.pid,
        iter: input.iter,
        start_ns: input.start,
        end_ns: input.end,
        split: parts.split,
        evidence: parts.evidence,
        coverage: Coverage {
            marked_ns: marked,
            sampled_ns: sampled,
        },
    }
}
