//! The cross-node join: ranks on different nodes, one job.
//!
//! Each node's agent attributes its own ranks' iterations (it has the samples; the collector
//! does not) and ships them as [`NodeIteration`]s, on the node's clock, with the begin and end
//! of each exposed collective. A node only knows when *its own* ranks arrived at a
//! collective, so its `peer_wait` stops at the node's last local arrival. Here, once every rank
//! of the job has reported an iteration, all arrivals are mapped onto the collector's clock
//! with each node's estimated offset ([`NodeClock`]) and the exposed communication of each
//! rank is split again: waiting until the last rank of the whole job began the same collective
//! is `peer_wait`, the rest is the transfer, divided between network and interconnect in the
//! proportion the node measured. The other categories are the node's and are kept as they are.
//!
//! A rank timed on its GPU with CUDA events (on CUDA the CPU only queues the all-reduce, so
//! its CPU-side spans say nothing of when it ran) carries the exposed all-reduce its GPU saw
//! instead; there, the rank whose GPU saw the least arrived last, the least is the transfer
//! and the rest of each rank's is `peer_wait`.
//!
//! The rank that arrived last at a collective held the others up by the time between its
//! arrival and the one before it; per window of [`WINDOW_ITERS`] iterations, the rank that held
//! the others up longest is that window's straggler, provided the others spent a noticeable
//! share of their time waiting ([`STRAGGLER_MIN_WAIT`]).
//!
//! A job runs for days, so nothing here grows with its length: arrivals are summed into their
//! window as iterations are joined, and a window is reduced to its straggler (if any) once
//! joins have moved [`WINDOW_CLOSE_LAG_ITERS`] past it; the de-duplication of reports keeps,
//! per rank, the iteration below which everything counts as joined and the few joined above it
//! ([`JoinedIters`]). What grows is only the list of windows that named a straggler, which is
//! the summary's output.
//!
//! The live collector and the replay of a job profile feed the same frames through this code.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::attribution::{Basis, Evidence, IterationBreakdown};
use crate::category::{apportion, Category, Split};
use crate::frame::{NodeClock, NodeHealth, NodeIteration};
use crate::Nanos;

/// Iterations per straggler window.
pub const WINDOW_ITERS: u64 = 10;

/// Share of the other ranks' wall time spent in `peer_wait` above which a window names a
/// straggler, 0–1.
pub const STRAGGLER_MIN_WAIT: f64 = 0.05;

/// How long an iteration reported by some ranks waits for the others before it is joined
/// without them, ns (on the collector's clock, from the first report's end).
const JOIN_PATIENCE_NS: Nanos = 15_000_000_000;

/// Iterations the newest joined one must be past a straggler window's last before the window
/// is closed (reduced to its straggler). Iterations normally join in order, a few out of it
/// within [`JOIN_PATIENCE_NS`]; an iteration still waiting keeps its window open too. The
/// arrivals of an iteration joined into a window already closed (a rank's report that came
/// more than this late) are left out of the straggler figures; its breakdowns still count.
pub const WINDOW_CLOSE_LAG_ITERS: u64 = 1_000;

/// Joined iterations of one rank remembered above its contiguous joined prefix (iterations
/// joined out of order, or past a lost one), at most; beyond it the oldest is forgotten and
/// every iteration of the rank up to it counts as joined (8 bytes-ish each; 1,000 ranks with
/// the set full: ~20 MiB).
pub const JOINED_GAPS_MAX: usize = 1_024;

/// One window's straggler.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StragglerWindow {
    /// First iteration of the window.
    pub first_iter: u64,
    /// Last iteration of the window.
    pub last_iter: u64,
    /// The rank that held the others up longest.
    pub rank: u32,
    /// Its node.
    pub node: String,
    /// s, how long it held the next-to-last rank up, summed over the window.
    pub held_seconds: f64,
    /// Share of the other ranks' wall time they spent in `peer_wait` in the window, 0–1.
    pub others_wait_fraction: f64,
}

/// What joined iterations say about who arrived last: one iteration's, or a window's summed.
#[derive(Clone, Debug, Default)]
struct IterationArrivals {
    /// ns each rank held the next-to-last one up, by rank.
    held: BTreeMap<u32, u64>,
    /// Per rank: (peer_wait ns, wall ns).
    waits: BTreeMap<u32, (u64, u64)>,
}

impl IterationArrivals {
    /// Adds another iteration's arrivals.
    fn add(&mut self, other: &IterationArrivals) {
        for (rank, ns) in &other.held {
            *self.held.entry(*rank).or_default() += ns;
        }
        for (rank, (w, t)) in &other.waits {
            let e = self.waits.entry(*rank).or_default();
            e.0 += w;
            e.1 += t;
        }
    }

    /// The straggler of a window with these summed arrivals: (rank, ns it held the others up,
    /// share of the others' wall time they waited); `None` when nobody held anyone up or the
    /// others waited less than [`STRAGGLER_MIN_WAIT`].
    fn straggler(&self) -> Option<(u32, u64, f64)> {
        let (&rank, &held_ns) = self.held.iter().max_by_key(|(_, ns)| **ns)?;
        let (wait, wall) = self
            .waits
            .iter()
            .filter(|(r, _)| **r != rank)
            .fold((0u64, 0u64), |acc, (_, (w, t))| (acc.0 + w, acc.1 + t));
        let share = if wall == 0 {
            0.0
        } else {
            wait as f64 / wall as f64
        };
        (share >= STRAGGLER_MIN_WAIT).then_some((rank, held_ns, share))
    }
}

/// The iterations of one rank already joined: every one below `below`, and those in `above`.
/// Reports of a rank arrive in order (an agent resends only what was not acknowledged), so
/// the iterations before the first one joined count as joined too.
#[derive(Clone, Debug, Default)]
struct JoinedIters {
    /// Every iteration below this counts as joined.
    below: u64,
    /// Joined iterations at or above `below`, at most [`JOINED_GAPS_MAX`].
    above: BTreeSet<u64>,
}

impl JoinedIters {
    fn starting_at(iter: u64) -> JoinedIters {
        JoinedIters {
            below: iter,
            above: BTreeSet::new(),
        }
    }

    fn contains(&self, iter: u64) -> bool {
        iter < self.below || self.above.contains(&iter)
    }

    fn insert(&mut self, iter: u64) {
        if iter < self.below {
            return;
        }
        self.above.insert(iter);
        while self.above.first() == Some(&self.below) {
            self.above.pop_first();
            self.below += 1;
        }
        while self.above.len() > JOINED_GAPS_MAX {
            if let Some(oldest) = self.above.pop_first() {
                self.below = oldest + 1;
            }
        }
    }
}

/// Everything the join knows.
#[derive(Debug, Default)]
pub struct CrossNode {
    /// Latest clock estimate per node.
    pub clocks: BTreeMap<String, NodeClock>,
    /// Latest health report per node.
    pub health: BTreeMap<String, NodeHealth>,
    /// The node of each rank seen.
    pub rank_nodes: BTreeMap<u32, String>,
    /// Largest world size any rank announced.
    world_size: Option<u32>,
    /// Reports waiting for the other ranks, by iteration, then rank.
    pending: BTreeMap<u64, BTreeMap<u32, NodeIteration>>,
    /// Iterations already joined, by rank: a report sent again after a reconnect is dropped.
    joined: HashMap<u32, JoinedIters>,
    /// First iteration of the first straggler window (the warm-up); set before joining.
    first_iter: u64,
    /// The newest iteration joined.
    newest_joined: Option<u64>,
    /// Arrivals summed per straggler window still open, by window (0 = the one starting at
    /// `first_iter`).
    open_windows: BTreeMap<u64, IterationArrivals>,
    /// Windows below this are closed: their arrivals are no longer taken.
    closed_below: u64,
    /// Closed windows that named a straggler, in window order: (window, rank, held ns, share).
    closed_stragglers: Vec<(u64, u32, u64, f64)>,
}

impl CrossNode {
    /// Whether any node has reported (the profile is a multi-node job profile).
    pub fn is_active(&self) -> bool {
        !self.rank_nodes.is_empty() || !self.clocks.is_empty()
    }

    /// Takes a node's clock estimate.
    pub fn clock(&mut self, c: &NodeClock) {
        self.clocks.insert(c.node.clone(), c.clone());
    }

    /// Takes a node's health report.
    pub fn health(&mut self, h: &NodeHealth) {
        self.health.insert(h.node.clone(), h.clone());
    }

    /// Sets the first iteration of the first straggler window (the job's warm-up, from its
    /// header): iterations before it are left out of the straggler windows. Takes effect for
    /// iterations joined after it; the header comes before any iteration.
    pub fn set_first_iter(&mut self, first_iter: u64) {
        self.first_iter = first_iter;
    }

    /// Takes one rank's iteration; whether it was new. Repeats of a report already taken (an
    /// agent resends what a collector that died had not acknowledged) are dropped.
    pub fn report(&mut self, it: &NodeIteration) -> bool {
        let (rank, iter) = (it.breakdown.rank, it.breakdown.iter);
        if self.joined.get(&rank).is_some_and(|j| j.contains(iter)) {
            return false;
        }
        self.rank_nodes.insert(it.breakdown.rank, it.node.clone());
        if let Some(w) = it.world_size {
            self.world_size = Some(self.world_size.map_or(w, |o| o.max(w)));
        }
        let reports = self.pending.entry(iter).or_default();
        if reports.contains_key(&rank) {
            return false;
        }
        reports.insert(rank, it.clone());
        true
    }

    fn to_collector(&self, node: &str, t: Nanos) -> Nanos {
        self.clocks.get(node).map_or(t, |c| c.to_collector(t))
    }

    fn expected_ranks(&self) -> usize {
        self.rank_nodes
            .len()
            .max(self.world_size.unwrap_or(0) as usize)
    }

    /// Joins every iteration that all ranks have reported, or that waited longer than the
    /// patience at `now` (ns, collector clock), or every one with `finishing`. Returns the
    /// split-again breakdowns, times on the collector's clock.
    pub fn join_ready(&mut self, now: Nanos, finishing: bool) -> Vec<IterationBreakdown> {
        let expected = self.expected_ranks();
        let ready: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, reports)| {
                finishing
                    || reports.len() >= expected
                    || reports.values().any(|r| {
                        let end = self.to_collector(&r.node, r.breakdown.end_ns);
                        now.saturating_sub(end) > JOIN_PATIENCE_NS
                    })
            })
            .map(|(iter, _)| *iter)
            .collect();
        let mut out = Vec::new();
        for iter in ready {
            let Some(reports) = self.pending.remove(&iter) else {
                continue;
            };
            out.extend(self.join(iter, reports));
        }
        self.close_windows();
        out.sort_by_key(|b| (b.end_ns, b.rank));
        out
    }

    /// Reduces to their straggler the windows that joins have moved
    /// [`WINDOW_CLOSE_LAG_ITERS`] past and that no waiting iteration falls in.
    fn close_windows(&mut self) {
        let Some(newest) = self.newest_joined else {
            return;
        };
        let mut limit = newest.saturating_sub(WINDOW_CLOSE_LAG_ITERS);
        if let Some(waiting) = self.pending.keys().next() {
            limit = limit.min(*waiting);
        }
        // Windows whose last iteration is below `limit`.
        let closable = limit.saturating_sub(self.first_iter) / WINDOW_ITERS;
        while let Some(entry) = self.open_windows.first_entry() {
            if *entry.key() >= closable {
                break;
            }
            let (w, sums) = entry.remove_entry();
            if let Some((rank, held, share)) = sums.straggler() {
                self.closed_stragglers.push((w, rank, held, share));
            }
        }
        self.closed_below = self.closed_below.max(closable);
    }

    /// Values held for the join and its straggler windows (pending reports, remembered joined
    /// iterations, open windows' entries): what its memory grows with.
    pub fn held(&self) -> usize {
        self.pending.values().map(BTreeMap::len).sum::<usize>()
            + self
                .joined
                .values()
                .map(|j| 1 + j.above.len())
                .sum::<usize>()
            + self
                .open_windows
                .values()
                .map(|a| a.held.len() + a.waits.len())
                .sum::<usize>()
    }

    fn join(
        &mut self,
        iter: u64,
        reports: BTreeMap<u32, NodeIteration>,
    ) -> Vec<IterationBreakdown> {
        // Every rank's collectives on the collector's clock.
        let spans: BTreeMap<u32, Vec<(Nanos, Nanos)>> = reports
            .iter()
            .map(|(rank, r)| {
                let mapped = r
                    .comm
                    .iter()
                    .map(|s| {
                        (
                            self.to_collector(&r.node, s.begin),
                            self.to_collector(&r.node, s.end),
                        )
                    })
                    .collect();
                (*rank, mapped)
            })
            .collect();
        let collectives = spans.values().map(Vec::len).max().unwrap_or(0);
        let mut arrivals = IterationArrivals::default();
        let mut latest = Vec::with_capacity(collectives);
        for k in 0..collectives {
            let mut begins: Vec<(Nanos, u32)> = spans
                .iter()
                .filter_map(|(rank, s)| s.get(k).map(|x| (x.0, *rank)))
                .collect();
            begins.sort_unstable();
            let last = begins.last().copied();
            latest.push(last.map(|l| l.0));
            if let (Some((t_last, rank)), Some((t_before, _))) =
                (last, begins.len().checked_sub(2).map(|i| begins[i]))
            {
                *arrivals.held.entry(rank).or_default() += t_last - t_before;
            }
        }
        let nodes: HashSet<&str> = reports.values().map(|r| r.node.as_str()).collect();
        let across_nodes = nodes.len() > 1;
        // Ranks timed on their GPUs: the exposed all-reduce each GPU saw. Their CPU-side
        // collective spans only say when work was queued.
        let gpu_comm: BTreeMap<u32, u64> = reports
            .iter()
            .filter_map(|(rank, r)| gpu_exposed_comm(&r.breakdown).map(|c| (*rank, c)))
            .collect();
        let fastest = gpu_comm.values().min().copied();
        if !gpu_comm.is_empty() {
            arrivals.held = held_by_least_exposed(&gpu_comm);
        }
        let mut out = Vec::with_capacity(reports.len());
        for (rank, r) in &reports {
            let mut b = match (gpu_comm.get(rank), fastest) {
                (Some(_), Some(fastest)) => resplit_gpu(&r.breakdown, fastest, across_nodes),
                _ => resplit(&r.breakdown, &spans[rank], &latest, across_nodes),
            };
            b.start_ns = self.to_collector(&r.node, r.breakdown.start_ns);
            b.end_ns = b.start_ns + r.breakdown.wall_ns();
            arrivals
                .waits
                .insert(*rank, (b.split.get(Category::PeerWait), b.wall_ns()));
            self.joined
                .entry(*rank)
                .or_insert_with(|| JoinedIters::starting_at(iter))
                .insert(iter);
            out.push(b);
        }
        self.newest_joined = Some(self.newest_joined.map_or(iter, |n| n.max(iter)));
        if iter >= self.first_iter {
            let w = (iter - self.first_iter) / WINDOW_ITERS;
            if w >= self.closed_below {
                self.open_windows.entry(w).or_default().add(&arrivals);
            }
        }
        out
    }

    /// The straggler of each window of [`WINDOW_ITERS`] iterations from the first iteration
    /// ([`CrossNode::set_first_iter`]) on that had one.
    pub fn stragglers(&self) -> Vec<StragglerWindow> {
        let open = self
            .open_windows
            .iter()
            .filter_map(|(w, sums)| sums.straggler().map(|(r, h, s)| (*w, r, h, s)));
        self.closed_stragglers
            .iter()
            .copied()
            .chain(open)
            .map(|(w, rank, held_ns, share)| {
                let first = self.first_iter + w * WINDOW_ITERS;
                StragglerWindow {
                    first_iter: first,
                    last_iter: first + WINDOW_ITERS - 1,
                    rank,
                    node: self.rank_nodes.get(&rank).cloned().unwrap_or_default(),
                    held_seconds: crate::secs(held_ns),
                    others_wait_fraction: share,
                }
            })
            .collect()
    }
}

/// ns of exposed all-reduce the rank's GPU saw (CUDA events), when it was timed.
fn gpu_exposed_comm(b: &IterationBreakdown) -> Option<u64> {
    let gpu = |basis: Basis| matches!(basis, Basis::GpuExposedComm | Basis::GpuSlowestPeer);
    b.evidence.iter().any(|e| gpu(e.basis)).then(|| {
        b.evidence
            .iter()
            .filter(|e| gpu(e.basis))
            .map(|e| e.ns)
            .sum()
    })
}

/// Who held whom up, from the exposed all-reduce each GPU saw: the rank that arrived last
/// waited least, and held the next one up by the difference.
fn held_by_least_exposed(gpu_comm: &BTreeMap<u32, u64>) -> BTreeMap<u32, u64> {
    let mut by_wait: Vec<(u64, u32)> = gpu_comm.iter().map(|(r, c)| (*c, *r)).collect();
    by_wait.sort_unstable();
    let mut held = BTreeMap::new();
    if let [(least, rank), (next, _), ..] = by_wait[..] {
        held.insert(rank, next - least);
    }
    held
}

/// Splits the exposed all-reduce of a GPU-timed breakdown again, given the least any rank of
/// the job saw (`fastest`, ns): that much is the transfer, in the proportion of network to
/// interconnect the node measured; the rest is waiting for the rank that arrived last. The
/// other categories are kept; the parts still sum to the wall time.
pub fn resplit_gpu(b: &IterationBreakdown, fastest: u64, across_nodes: bool) -> IterationBreakdown {
    let Some(exposed) = gpu_exposed_comm(b) else {
        return b.clone();
    };
    let transfer = fastest.min(exposed);
    let measured = |c: Category| -> f64 {
        b.evidence
            .iter()
            .filter(|e| e.basis == Basis::GpuExposedComm && e.category == c)
            .map(|e| e.ns as f64)
            .sum()
    };
    let (net_ns, local_ns) = split_transfer(
        transfer,
        [
            measured(Category::Network),
            measured(Category::Interconnect),
        ],
        across_nodes,
    );
    with_comm(
        b,
        |basis| matches!(basis, Basis::GpuExposedComm | Basis::GpuSlowestPeer),
        [
            (
                Category::PeerWait,
                Basis::GpuSlowestPeer,
                exposed - transfer,
            ),
            (Category::Network, Basis::GpuExposedComm, net_ns),
            (Category::Interconnect, Basis::GpuExposedComm, local_ns),
        ],
    )
}

/// `transfer` ns divided between network and interconnect in the proportion `weights`
/// (network, interconnect); with no weight, all network across nodes, else all interconnect.
fn split_transfer(transfer: u64, weights: [f64; 2], across_nodes: bool) -> (u64, u64) {
    match apportion(transfer, &weights) {
        Some(v) => (v[0], v[1]),
        None if across_nodes => (transfer, 0),
        None => (0, transfer),
    }
}

/// `b` with the evidence `replaced` says is its exposed communication put back as `parts`
/// (those of 0 ns left out), and its split summed again from the evidence.
fn with_comm(
    b: &IterationBreakdown,
    replaced: fn(Basis) -> bool,
    parts: [(Category, Basis, u64); 3],
) -> IterationBreakdown {
    let mut evidence: Vec<Evidence> = b
        .evidence
        .iter()
        .filter(|e| !replaced(e.basis))
        .copied()
        .collect();
    evidence.extend(
        parts
            .into_iter()
            .filter(|p| p.2 > 0)
            .map(|(category, basis, ns)| Evidence {
                category,
                basis,
                ns,
            }),
    );
    let mut split = Split::default();
    for e in &evidence {
        split.add(e.category, e.ns);
    }
    IterationBreakdown {
        split,
        evidence,
        ..b.clone()
    }
}

fn is_comm(basis: Basis) -> bool {
    matches!(
        basis,
        Basis::PeerArrival | Basis::CommNicBytes | Basis::CommLocalBytes | Basis::CommNoBytes
    )
}

/// Splits the exposed communication of one breakdown again, given its collectives
/// (`own`, collector clock) and when the last rank of the job began each (`latest`).
/// The other categories are kept; the parts still sum to the wall time.
pub fn resplit(
    b: &IterationBreakdown,
    own: &[(Nanos, Nanos)],
    latest: &[Option<Nanos>],
    across_nodes: bool,
) -> IterationBreakdown {
    let exposed: u64 = b
        .evidence
        .iter()
        .filter(|e| is_comm(e.basis))
        .map(|e| e.ns)
        .sum();
    if exposed == 0 {
        return b.clone();
    }
    let waited: u64 = own
        .iter()
        .zip(latest)
        .map(|((begin, end), last)| match last {
            Some(l) if l > begin => (l.min(end)) - begin,
            _ => 0,
        })
        .sum::<u64>()
        .min(exposed);
    let on = |pred: &dyn Fn(&Evidence) -> bool| -> f64 {
        b.evidence
            .iter()
            .filter(|e| pred(e))
            .map(|e| e.ns as f64)
            .sum()
    };
    let nic = on(&|e| {
        e.basis == Basis::CommNicBytes
            || (e.basis == Basis::CommNoBytes && e.category == Category::Network)
    });
    let local = on(&|e| {
        e.basis == Basis::CommLocalBytes
            || (e.basis == Basis::CommNoBytes && e.category == Category::Interconnect)
    });
    let (net_ns, local_ns) = split_transfer(exposed - waited, [nic, local], across_nodes);
    with_comm(
        b,
        is_comm,
        [
            (Category::PeerWait, Basis::PeerArrival, waited),
            (Category::Network, Basis::CommNicBytes, net_ns),
            (Category::Interconnect, Basis::CommLocalBytes, local_ns),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribution::Coverage;
    use crate::frame::CommSpan;

    const MS: u64 = 1_000_000;

    /// A 100 ms iteration ending at `end` (node clock) of which the last `comm` ms were an
    /// exposed collective the node counted as network, and the rest compute.
    fn report(node: &str, rank: u32, iter: u64, end: Nanos, comm: u64) -> NodeIteration {
        let start = end - 100 * MS;
        let mut split = Split::default();
        split.add(Category::Compute, (100 - comm) * MS);
        split.add(Category::Network, comm * MS);
        NodeIteration {
            node: node.into(),
            breakdown: IterationBreakdown {
                rank,
                pid: 100 + rank,
                iter,
                start_ns: start,
                end_ns: end,
                split,
                evidence: vec![
                    Evidence {
                        category: Category::Compute,
                        basis: Basis::CounterBusy,
                        ns: (100 - comm) * MS,
                    },
                    Evidence {
                        category: Category::Network,
                        basis: Basis::CommNicBytes,
                        ns: comm * MS,
                    },
                ],
                coverage: Coverage::default(),
            },
            comm: vec![CommSpan {
                begin: end - comm * MS,
                end,
            }],
            world_size: Some(2),
        }
    }

    fn clock(node: &str, offset_ms: i64) -> NodeClock {
        NodeClock {
            node: node.into(),
            offset_ns: offset_ms * MS as i64,
            uncertainty_ns: 100_000,
            samples: 8,
            ..NodeClock::default()
        }
    }

    #[test]
    fn the_early_rank_waits_for_the_late_one_across_nodes_despite_clock_offsets() {
        let mut j = CrossNode::default();
        // Node b's clock runs 50 ms ahead of the collector's; a's agrees with it.
        j.clock(&clock("a", 0));
        j.clock(&clock("b", 50));
        // Both end the collective at collector time 1000 ms; rank 0 (node a) began it 60 ms
        // before, rank 1 (node b) 10 ms before: rank 0 waited 50 ms for rank 1.
        j.report(&report("a", 0, 5, 1000 * MS, 60));
        assert!(j.join_ready(0, false).is_empty(), "rank 1 has not reported");
        j.report(&report("b", 1, 5, 1050 * MS, 10));
        let out = j.join_ready(0, false);
        assert_eq!(out.len(), 2);
        let r0 = out.iter().find(|b| b.rank == 0).unwrap();
        let r1 = out.iter().find(|b| b.rank == 1).unwrap();
        assert_eq!(r0.split.get(Category::PeerWait), 50 * MS);
        assert_eq!(r0.split.get(Category::Network), 10 * MS);
        assert_eq!(r0.split.total(), 100 * MS);
        assert_eq!(r1.split.get(Category::PeerWait), 0);
        assert_eq!(r1.split.get(Category::Network), 10 * MS);
        assert_eq!(r1.end_ns, 1000 * MS, "times are on the collector's clock");
    }

    /// `report`, as a GPU-timed rank: the exposed all-reduce its GPU saw (`comm` ms, which the
    /// node counted as network) and a CPU-side span that says only when it was queued.
    fn gpu_report(node: &str, rank: u32, iter: u64, end: Nanos, comm: u64) -> NodeIteration {
        let mut r = report(node, rank, iter, end, comm);
        r.breakdown.evidence[1].basis = Basis::GpuExposedComm;
        r.breakdown.evidence[0].basis = Basis::GpuWork;
        r.comm = vec![CommSpan {
            begin: end - 90 * MS,
            end: end - 89 * MS,
        }];
        r
    }

    #[test]
    fn gpu_timed_ranks_wait_for_the_one_whose_gpu_saw_the_least_all_reduce() {
        let mut j = CrossNode::default();
        j.clock(&clock("a", 0));
        j.clock(&clock("b", 50));
        for iter in 0..10 {
            let end = (iter + 1) * 200 * MS;
            j.report(&gpu_report("a", 0, iter, end, 45));
            j.report(&gpu_report("b", 1, iter, end + 50 * MS, 5));
        }
        let out = j.join_ready(0, false);
        assert_eq!(out.len(), 20);
        let r0 = out.iter().find(|b| b.rank == 0).unwrap();
        let r1 = out.iter().find(|b| b.rank == 1).unwrap();
        assert_eq!(r0.split.get(Category::PeerWait), 40 * MS);
        assert_eq!(r0.split.get(Category::Network), 5 * MS);
        assert_eq!(r0.split.total(), 100 * MS);
        assert_eq!(r1.split.get(Category::PeerWait), 0);
        assert_eq!(r1.split.get(Category::Network), 5 * MS);
        let s = j.stragglers();
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!((s[0].rank, s[0].node.as_str()), (1, "b"));
        assert!((s[0].held_seconds - 0.4).abs() < 1e-9, "{s:?}");
    }

    #[test]
    fn a_report_sent_again_after_a_reconnect_is_not_counted_twice() {
        let mut j = CrossNode::default();
        j.report(&report("a", 0, 1, 1000 * MS, 10));
        j.report(&report("b", 1, 1, 1000 * MS, 10));
        assert_eq!(j.join_ready(0, false).len(), 2);
        j.report(&report("a", 0, 1, 1000 * MS, 10));
        assert!(j.join_ready(u64::MAX, true).is_empty());
    }

    #[test]
    fn the_rank_that_keeps_the_others_waiting_is_named_per_window() {
        let mut j = CrossNode::default();
        for iter in 0..20 {
            let end = (iter + 1) * 200 * MS;
            // In the first window rank 1 arrives 40 ms late; in the second nobody is late.
            let (c0, c1) = if iter < 10 { (50, 10) } else { (10, 10) };
            j.report(&report("a", 0, iter, end, c0));
            j.report(&report("b", 1, iter, end, c1));
        }
        j.join_ready(0, true);
        let s = j.stragglers();
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!((s[0].rank, s[0].node.as_str()), (1, "b"));
        assert_eq!((s[0].first_iter, s[0].last_iter), (0, 9));
        assert!((s[0].held_seconds - 0.4).abs() < 1e-9, "{s:?}");
        assert!((s[0].others_wait_fraction - 0.4).abs() < 1e-9, "{s:?}");
    }

    #[test]
    fn a_rank_that_never_reports_does_not_hold_the_join_forever() {
        let mut j = CrossNode::default();
        j.report(&report("a", 0, 3, 1000 * MS, 10));
        j.report(&report("b", 1, 2, 800 * MS, 10));
        assert!(
            j.join_ready(2000 * MS, false).is_empty(),
            "within the patience"
        );
        let late = j.join_ready(1000 * MS + JOIN_PATIENCE_NS + 1, false);
        assert_eq!(
            late.len(),
            2,
            "both iterations, each without the missing rank"
        );
    }

    #[test]
    fn a_long_job_keeps_the_join_bounded_and_its_straggler_windows() {
        const ITERS: u64 = 50_000;
        const FIRST: u64 = 5;
        let mut j = CrossNode::default();
        j.set_first_iter(FIRST);
        let late = |iter: u64| iter >= FIRST && ((iter - FIRST) / WINDOW_ITERS) % 3 == 0;
        let mut most = 0;
        for iter in 0..ITERS {
            let end = (iter + 1) * 200 * MS;
            // Every third window rank 1 arrives 40 ms late; otherwise nobody is late.
            let (c0, c1) = if late(iter) { (50, 10) } else { (10, 10) };
            j.report(&report("a", 0, iter, end, c0));
            j.report(&report("b", 1, iter, end, c1));
            assert_eq!(j.join_ready(end, false).len(), 2);
            most = most.max(j.held());
        }
        // Two ranks' remembered joins plus the open windows' entries (4 per window).
        let bound = 2 + 4 * (WINDOW_CLOSE_LAG_ITERS / WINDOW_ITERS + 2) as usize;
        assert!(most <= bound, "{most} > {bound}");
        // A report sent again, old or recent, is still dropped.
        j.report(&report("a", 0, 7, 1000 * MS, 10));
        j.report(&report("b", 1, ITERS - 1, 1000 * MS, 10));
        assert!(j.join_ready(u64::MAX, true).is_empty());
        let s = j.stragglers();
        let windows = (ITERS - FIRST).div_ceil(WINDOW_ITERS);
        assert_eq!(s.len() as u64, windows.div_ceil(3), "{:?}", &s[..3]);
        for (k, w) in s.iter().enumerate() {
            let first = FIRST + 3 * k as u64 * WINDOW_ITERS;
            assert_eq!(
                (w.first_iter, w.last_iter),
                (first, first + WINDOW_ITERS - 1)
            );
            assert_eq!((w.rank, w.node.as_str()), (1, "b"));
            assert!((w.held_seconds - 0.4).abs() < 1e-9, "{w:?}");
            assert!((w.others_wait_fraction - 0.4).abs() < 1e-9, "{w:?}");
        }
    }
}
