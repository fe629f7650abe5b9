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

use std::collections::{BTreeMap, BTreeSet};

use crate::attribution::IterationBreakdown;
use crate::category::Category;
use crate::frame::{NodeClock, NodeHealth, NodeIteration};
use crate::rank_table::RankTable;
use crate::Nanos;

mod resplit;
mod stragglers;

use resplit::{gpu_exposed_comm, held_by_least_exposed, resplit_gpu_owned, resplit_owned};
pub use resplit::{resplit, resplit_gpu};
pub(crate) use stragglers::{IterationArrivals, StragglerWindows};
pub use stragglers::{StragglerWindow, STRAGGLER_MIN_WAIT, WINDOW_CLOSE_LAG_ITERS, WINDOW_ITERS};

/// How long an iteration reported by some ranks waits for the others before it is joined
/// without them, ns (on the collector's clock, from the first report's end).
const JOIN_PATIENCE_NS: Nanos = 15_000_000_000;

/// Joined iterations of one rank remembered above its contiguous joined prefix (iterations
/// joined out of order, or past a lost one), at most; beyond it the oldest is forgotten and
/// every iteration of the rank up to it counts as joined (8 bytes-ish each; 1,000 ranks with
/// the set full: ~20 MiB).
pub const JOINED_GAPS_MAX: usize = 1_024;

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
        if iter == self.below && self.above.is_empty() {
            // The next one, in order (as nearly always): no set touched.
            self.below += 1;
            return;
        }
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
    /// Reports waiting for the other ranks, by iteration, each iteration's in the order
    /// they came (the join puts them in rank order).
    pending: BTreeMap<u64, Vec<NodeIteration>>,
    /// Per rank, by rank number: the iterations joined, those of its reports in `pending`
    /// (so a rank's report is found without a search among the iteration's, 10,000 at
    /// 10,000 ranks) and its node. One look-up per report finds them all: at 300,000
    /// reports a second, a map each (two hashed, one a tree of 10,000 ranks) were a sixth of
    /// the collector's job thread. The join takes an iteration's reports in rank order, so
    /// its look-ups walk the table in order.
    ranks: RankTable<RankJoin>,
    /// ns, collector clock: per waiting iteration, the earliest end of its reports (as the
    /// node's clock estimate mapped it on arrival), so that the join's patience is one look
    /// per iteration, not a clock look-up per report every round (10,000 ranks).
    first_end: BTreeMap<u64, Nanos>,
    /// The newest iteration joined.
    newest_joined: Option<u64>,
    /// Who held the job up, per window of iterations.
    windows: StragglerWindows,
    /// Ranks two nodes both reported, with the nodes and the reports refused.
    clashes: BTreeMap<u32, RankClash>,
    /// The join's vectors, kept from one iteration to the next.
    scratch: JoinScratch,
    /// Emptied vectors of joined iterations' reports, for iterations to come: at 10,000
    /// ranks an iteration's vector doubled its way to 10,000 reports of a few hundred bytes
    /// each, copying them each time.
    spare: Vec<Vec<NodeIteration>>,
    /// The node whose clock was looked up last and that clock (its figures; `None`: no
    /// estimate): a node's reports come together, and a look-up by name compares names.
    last_clock: Option<(String, Option<NodeClock>)>,
    /// Rank-iterations one [`CrossNode::join_ready`] joins at most, whole iterations (at
    /// least one), unless finishing; `None`: every ready one ([`CrossNode::limit_rounds`]).
    round_limit: Option<usize>,
}

/// What the join keeps of one rank.
#[derive(Debug, Default)]
struct RankJoin {
    /// Its iterations already joined (`None` before the first): a report sent again after a
    /// reconnect is dropped.
    joined: Option<JoinedIters>,
    /// Its iterations whose report waits in `pending` for the other ranks': a few.
    waiting: Vec<u64>,
    /// Its node, as [`CrossNode::rank_nodes`] has it (`None` before its first report).
    node: Option<String>,
}

/// Emptied report vectors kept for the iterations to come. In a steady job an iteration is
/// joined for each one that begins, so a few suffice; each holds up to a report per rank
/// (2 MiB at 10,000 ranks).
const SPARE_KEPT: usize = 8;

/// What the join of one iteration works out per rank (in the reports' order) and per
/// collective.
#[derive(Debug, Default)]
struct JoinScratch {
    /// Every rank's collectives on the collector's clock, one rank after the other.
    spans: Vec<(Nanos, Nanos)>,
    /// Per rank, where its collectives lie in `spans`.
    ranges: Vec<(usize, usize)>,
    /// Per rank, its start on the collector's clock.
    starts: Vec<Nanos>,
    /// Per rank, the exposed all-reduce its GPU saw, when timed on it.
    gpu: Vec<Option<u64>>,
    /// Per collective, when the last rank began it.
    latest: Vec<Option<Nanos>>,
    /// ns a rank held the next-to-last one up (a rank once per collective it was last at).
    held: Vec<(u32, u64)>,
    /// Per rank: (peer_wait ns, wall ns).
    waits: Vec<(u32, (u64, u64))>,
}

impl JoinScratch {
    fn clear(&mut self) {
        self.spans.clear();
        self.ranges.clear();
        self.starts.clear();
        self.gpu.clear();
        self.latest.clear();
        self.held.clear();
        self.waits.clear();
    }
}

/// One rank number reported by two nodes for the same iterations: loops that never said their
/// rank (no `RANK`, no process group) are numbered 0, 1, … on each node. The first node's
/// reports are kept; the others' are refused and counted, and the summary says so.
#[derive(Clone, Debug, Default)]
struct RankClash {
    /// The node whose reports are kept.
    kept: String,
    /// The nodes whose reports are refused.
    refused_from: BTreeSet<String>,
    /// Reports refused.
    refused: u64,
}

impl CrossNode {
    /// Whether any node has reported (the profile is a multi-node job profile).
    pub fn is_active(&self) -> bool {
        !self.rank_nodes.is_empty() || !self.clocks.is_empty()
    }

    /// The node of `rank`, as [`CrossNode::rank_nodes`] has it, found by rank number (the
    /// live model asks for every rank-iteration).
    pub fn node_of(&self, rank: u32) -> Option<&str> {
        self.ranks.get(rank).and_then(|r| r.node.as_deref())
    }

    /// Joins at most `rank_iterations` per [`CrossNode::join_ready`] (whole iterations, at
    /// least one; all of them when finishing), leaving the rest ready for the next call.
    /// The collector, which takes records in between, uses it: a rank's late reports hold
    /// back its iterations' join, and the one round that then joined them all (90,000–
    /// 160,000 rank-iterations at 10,000 ranks, 0.2–0.8 s) held every record behind it.
    pub fn limit_rounds(&mut self, rank_iterations: usize) {
        self.round_limit = Some(rank_iterations.max(1));
    }

    /// Takes a node's clock estimate.
    pub fn clock(&mut self, c: &NodeClock) {
        self.clocks.insert(c.node.clone(), c.clone());
        self.last_clock = None;
    }

    /// Takes a node's health report.
    pub fn health(&mut self, h: &NodeHealth) {
        self.health.insert(h.node.clone(), h.clone());
    }

    /// Sets the first iteration of the first straggler window (the job's warm-up, from its
    /// header): iterations before it are left out of the straggler windows. Takes effect for
    /// iterations joined after it; the header comes before any iteration.
    pub fn set_first_iter(&mut self, first_iter: u64) {
        self.windows.first_iter = first_iter;
    }

    /// Takes one rank's iteration; whether it was new. Repeats of a report already taken (an
    /// agent resends what a collector that died had not acknowledged) are dropped.
    pub fn report(&mut self, it: &NodeIteration) -> bool {
        match self.admit(it) {
            Some(end) => {
                self.hold(it.clone(), end);
                true
            }
            None => false,
        }
    }

    /// [`CrossNode::report`] of a report the caller no longer needs: it waits for the join
    /// as it came, not copied (the collector takes 300,000 a second at 10,000 ranks).
    pub fn report_owned(&mut self, it: NodeIteration) -> bool {
        match self.admit(&it) {
            Some(end) => {
                self.hold(it, end);
                true
            }
            None => false,
        }
    }

    /// Whether `it` is new, noting its rank's node and the world size, and noting it as
    /// waiting, when it is; its end on the collector's clock (ns) when it is.
    fn admit(&mut self, it: &NodeIteration) -> Option<Nanos> {
        let (rank, iter) = (it.breakdown.rank, it.breakdown.iter);
        // The rank looked up once (300,000 reports a second at 10,000 ranks).
        let state = self.ranks.entry_or_default(rank);
        let joined = state.joined.as_ref().is_some_and(|j| j.contains(iter));
        let taken = joined || state.waiting.contains(&iter);
        let same_owner = state.node.as_ref() == Some(&it.node);
        if let Some(owner) = state.node.as_ref().filter(|_| !same_owner) {
            if taken {
                let clash = self.clashes.entry(rank).or_insert_with(|| RankClash {
                    kept: owner.clone(),
                    ..RankClash::default()
                });
                clash.refused_from.insert(it.node.clone());
                clash.refused += 1;
                return None;
            }
        }
        if joined {
            return None;
        }
        if !same_owner {
            state.node = Some(it.node.clone());
            self.rank_nodes.insert(rank, it.node.clone());
        }
        if let Some(w) = it.world_size {
            self.world_size = Some(self.world_size.map_or(w, |o| o.max(w)));
        }
        if taken {
            // Waiting already.
            return None;
        }
        state.waiting.push(iter);
        let end = it.breakdown.end_ns;
        Some(self.clock_of(&it.node).map_or(end, |c| c.to_collector(end)))
    }

    /// `node`'s clock estimate, looked up by name only when another node's was looked up
    /// last.
    fn clock_of(&mut self, node: &str) -> Option<&NodeClock> {
        let hit = matches!(&self.last_clock, Some((name, _)) if name == node);
        if !hit {
            let clock = self.clocks.get(node).map(|c| NodeClock {
                // The figures `to_collector` reads, without a copy of the name.
                node: String::new(),
                ..*c
            });
            let mut name = self.last_clock.take().map(|(n, _)| n).unwrap_or_default();
            name.clear();
            name.push_str(node);
            self.last_clock = Some((name, clock));
        }
        self.last_clock.as_ref().and_then(|(_, c)| c.as_ref())
    }

    /// Keeps an admitted report until its iteration is joined; `end`: its end on the
    /// collector's clock, ns.
    fn hold(&mut self, it: NodeIteration, end: Nanos) {
        let iter = it.breakdown.iter;
        self.pending
            .entry(iter)
            .or_insert_with(|| self.spare.pop().unwrap_or_default())
            .push(it);
        self.first_end
            .entry(iter)
            .and_modify(|e| *e = (*e).min(end))
            .or_insert(end);
    }

    /// What went wrong with the ranks' numbering, in words: each rank two nodes reported.
    pub fn rank_clashes(&self) -> Vec<String> {
        self.clashes
            .iter()
            .map(|(rank, c)| {
                let others: Vec<&str> = c.refused_from.iter().map(String::as_str).collect();
                format!(
                    "rank {rank} was reported by {} and {} for the same iterations (loops that never said their rank are numbered 0, 1, … on each node): {}'s are kept, {} reports of {} were refused; give each process its rank (torchrun sets RANK; or call stallscope.set_rank())",
                    c.kept,
                    others.join(", "),
                    c.kept,
                    c.refused,
                    others.join(", ")
                )
            })
            .collect()
    }

    fn expected_ranks(&self) -> usize {
        self.rank_nodes
            .len()
            .max(self.world_size.unwrap_or(0) as usize)
    }

    /// Joins every iteration that all ranks have reported, or that waited longer than the
    /// patience at `now` (ns, collector clock), or every one with `finishing`. Returns the
    /// split-again breakdowns, times on the collector's clock, by iteration, then rank: what
    /// takes them looks each rank up in per-rank tables, and at 10,000 ranks a walk through
    /// those tables in order costs a fraction of a walk in the order the ranks ended, which
    /// misses the cache at each rank.
    pub fn join_ready(&mut self, now: Nanos, finishing: bool) -> Vec<IterationBreakdown> {
        let expected = self.expected_ranks();
        let mut ready: Vec<u64> = self
            .pending
            .iter()
            .filter(|(iter, reports)| {
                finishing
                    || reports.len() >= expected
                    || self
                        .first_end
                        .get(iter)
                        .is_some_and(|end| now.saturating_sub(*end) > JOIN_PATIENCE_NS)
            })
            .map(|(iter, _)| *iter)
            .collect();
        // The first ready iterations, up to the round's limit.
        if let Some(limit) = self.round_limit.filter(|_| !finishing) {
            let mut taken = 0;
            let keep = ready
                .iter()
                .take_while(|iter| {
                    let first = taken == 0;
                    taken += self.pending.get(iter).map_or(0, Vec::len);
                    first || taken <= limit
                })
                .count();
            ready.truncate(keep);
        }
        // Room for every report of the ready iterations at once: at 10,000 ranks the output
        // doubling its way up took fresh memory, page faults included, every round.
        let mut out = Vec::with_capacity(
            ready
                .iter()
                .filter_map(|iter| self.pending.get(iter))
                .map(Vec::len)
                .sum(),
        );
        for iter in ready {
            self.first_end.remove(&iter);
            let Some(reports) = self.pending.remove(&iter) else {
                continue;
            };
            self.join(iter, reports, &mut out);
        }
        self.close_windows();
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
        self.windows.close_below(limit);
    }

    /// Values held for the join and its straggler windows (pending reports, remembered joined
    /// iterations, open windows' entries): what its memory grows with.
    pub fn held(&self) -> usize {
        self.pending.values().map(Vec::len).sum::<usize>()
            + self
                .ranks
                .values()
                .filter_map(|r| r.joined.as_ref())
                .map(|j| 1 + j.above.len())
                .sum::<usize>()
            + self.windows.held()
    }

    /// Joins iteration `iter` of `reports` (one per rank, in the order they came), appending
    /// its breakdowns to `out` in rank order. The reports are put in that order first, and
    /// their breakdowns are split again in place; what the join works out per rank lies in
    /// vectors reused from one iteration to the next, in the same order (at 10,000 ranks
    /// the maps made per iteration, a vector per rank's spans and each breakdown's copies
    /// were half the join's cost). Nothing it works out depends on the order the reports
    /// came in: the last two ranks at a collective are the largest (begin, rank), and the
    /// rest are sums.
    fn join(
        &mut self,
        iter: u64,
        mut reports: Vec<NodeIteration>,
        out: &mut Vec<IterationBreakdown>,
    ) {
        sort_by_unique_key(&mut reports, |r| r.breakdown.rank);
        let mut w = std::mem::take(&mut self.scratch);
        w.clear();
        {
            // Each node's clock looked up once for its ranks (a node's reports come together,
            // from one read of its connection).
            let clocks = &self.clocks;
            let mut last: Option<(&str, Option<&NodeClock>)> = None;
            for r in &reports {
                let clock = match last {
                    Some((node, clock)) if node == r.node => clock,
                    _ => {
                        let clock = clocks.get(&r.node);
                        last = Some((&r.node, clock));
                        clock
                    }
                };
                let to_collector = |t: Nanos| clock.map_or(t, |c| c.to_collector(t));
                // Every rank's collectives on the collector's clock.
                let from = w.spans.len();
                w.spans.extend(
                    r.comm
                        .iter()
                        .map(|s| (to_collector(s.begin), to_collector(s.end))),
                );
                w.ranges.push((from, w.spans.len()));
                w.starts.push(to_collector(r.breakdown.start_ns));
                // Ranks timed on their GPUs: the exposed all-reduce each GPU saw. Their
                // CPU-side collective spans only say when work was queued.
                w.gpu.push(gpu_exposed_comm(&r.breakdown));
            }
        }
        let collectives = w.ranges.iter().map(|(a, b)| b - a).max().unwrap_or(0);
        for k in 0..collectives {
            // The last rank to begin collective `k` and the one before it: the largest two
            // (begin, rank) of the ranks that had it.
            let mut last: Option<(Nanos, u32)> = None;
            let mut before: Option<(Nanos, u32)> = None;
            for (r, (a, b)) in reports.iter().zip(&w.ranges) {
                if k >= b - a {
                    continue;
                }
                let x = (w.spans[a + k].0, r.breakdown.rank);
                if last.is_none_or(|l| x > l) {
                    before = last;
                    last = Some(x);
                } else if before.is_none_or(|p| x > p) {
                    before = Some(x);
                }
            }
            w.latest.push(last.map(|l| l.0));
            if let (Some((t_last, rank)), Some((t_before, _))) = (last, before) {
                w.held.push((rank, t_last - t_before));
            }
        }
        // More than one node among the reports (no set of names made for it).
        let first_node = reports.first().map(|r| r.node.as_str());
        let across_nodes = reports.iter().any(|r| Some(r.node.as_str()) != first_node);
        let fastest = w.gpu.iter().flatten().min().copied();
        if fastest.is_some() {
            w.held.clear();
            w.held.extend(held_by_least_exposed(
                reports
                    .iter()
                    .zip(&w.gpu)
                    .filter_map(|(r, c)| c.map(|c| (r.breakdown.rank, c))),
            ));
        }
        out.reserve(reports.len());
        for (i, r) in reports.drain(..).enumerate() {
            let rank = r.breakdown.rank;
            let state = self.ranks.entry_or_default(rank);
            state.waiting.retain(|i| *i != iter);
            state
                .joined
                .get_or_insert_with(|| JoinedIters::starting_at(iter))
                .insert(iter);
            let wall = r.breakdown.wall_ns();
            let mut b = match (w.gpu[i], fastest) {
                (Some(_), Some(fastest)) => resplit_gpu_owned(r.breakdown, fastest, across_nodes),
                _ => {
                    let (a, z) = w.ranges[i];
                    resplit_owned(r.breakdown, &w.spans[a..z], &w.latest, across_nodes)
                }
            };
            b.start_ns = w.starts[i];
            b.end_ns = b.start_ns + wall;
            w.waits
                .push((rank, (b.split.get(Category::PeerWait), b.wall_ns())));
            out.push(b);
        }
        self.newest_joined = Some(self.newest_joined.map_or(iter, |n| n.max(iter)));
        self.windows.add_joined(iter, &w.held, &w.waits);
        self.scratch = w;
        if self.spare.len() < SPARE_KEPT {
            self.spare.push(reports);
        }
    }

    /// The straggler of each window of [`WINDOW_ITERS`] iterations from the first iteration
    /// ([`CrossNode::set_first_iter`]) on that had one.
    pub fn stragglers(&self) -> Vec<StragglerWindow> {
        self.windows.list(&self.rank_nodes)
    }
}

/// `items` in order of `key`, which no two share (a rank's report once per iteration). The
/// keys are sorted, not the items, which are then put in place by following the
/// permutation's cycles: a merge sort of 10,000 reports of a few hundred bytes moves each of
/// them a dozen times.
fn sort_by_unique_key<T, K: Ord + Copy>(items: &mut [T], key: impl Fn(&T) -> K) {
    let mut keys: Vec<(K, u32)> = items
        .iter()
        .enumerate()
        .map(|(i, x)| (key(x), i as u32))
        .collect();
    if keys.is_sorted() {
        return;
    }
    keys.sort_unstable();
    // `from[i]`: where the item that goes to `i` is now. Each cycle is walked once, carrying
    // its first element along by swaps; `u32::MAX` marks a place filled.
    let mut from: Vec<u32> = keys.iter().map(|(_, i)| *i).collect();
    for start in 0..from.len() {
        let mut at = start;
        loop {
            let next = from[at] as usize;
            from[at] = u32::MAX;
            if next == start || next == u32::MAX as usize {
                break;
            }
            items.swap(at, next);
            at = next;
        }
    }
}

#[cfg(test)]
mod tests;
