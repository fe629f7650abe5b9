//! Ranks that turn slow: online change-point detection, per rank, on each part of its
//! iterations.
//!
//! A rank whose data loading, compute or links degrade halfway through a run (a failing disk,
//! a throttled CPU, a flapping link) slows the whole job, and a share over the run hides when
//! it began. [`SlowdownWatch`] takes every attributed iteration, rank by rank in iteration
//! order, and runs a robust two-window test per category: the reference window is the rank's
//! latest [`BASELINE_KEPT`] normal iterations (median and MAD per category, the median
//! iteration); the test window is the latest [`PERSIST`] iterations, or more while they last
//! less than [`MIN_TEST_WINDOW_NS`] together (a fast loop's run of grown iterations must last
//! a quarter of a second: on a loaded machine a 5-ms loop had 4–14 iterations in a row stretched
//! by the scheduler, named as slowdowns, each writing a 14 MB trace). A category has grown when
//! each iteration of the test window holds, in that category, the first two of these, and
//! the window the third:
//! - at least [`MIN_GROWTH_SHARE`] of the baseline iteration more than its baseline median,
//!   and [`NOISE_MADS`] robust standard deviations more (the noise the rank showed);
//! - [`MIN_FACTOR`] times its baseline median;
//! - not shared: with other ranks to compare with, the same part did not grow by half as
//!   much on any of them in [`SHARED_BY`] of the same iterations (a machine that slows down
//!   as a whole, with other processes' load coming and going or a CPU that changes speed,
//!   slows every rank's compute and loaders alike; a slower link slows a collective on
//!   every rank); a rank alone is compared with itself instead: the part's growth must be
//!   [`REST_MARGIN`] times the growth of the rest of the iteration (its other parts but peer
//!   wait and `other`, which on a contended CPU grows with the work that waits for it), since
//!   a machine that slows down stretches every part alike. A rank alone is never named for
//!   its compute: other processes' load on the CPU stretches compute first and unevenly, and
//!   with no peer nothing tells the rank's own slowdown from the machine's.
//!
//! Time a rank's threads spent ready to run but waiting on a run queue (the evidence's
//! run-queue bases) counts as `other` here ([`watched_split`]): it is the node's CPU being
//! short, which lands on whichever rank the scheduler queued.
//!
//! An iteration the counters did not see ([`MIN_SEEN_SHARE`]: the rank's samples missing
//! or late when it was attributed) is not taken: neither reference nor test, it neither
//! starts nor ends a run of grown iterations.
//!
//! `peer_wait` is never the category that grew: a rank waits for a slow peer, so it is the
//! peer's slowdown, named on the peer. Nor is `other` (nothing seen explains it): a rank that
//! waits for a slow peer outside a marked collective (DDP's backward waiting for its
//! all-reduce) shows that wait there. The first iterations of a rank (the header's warm-up,
//! at least [`WARMUP_SKIPPED`]) are left out, and nothing is tested before [`BASELINE_MIN`]
//! normal iterations. A slowdown recovers when [`PERSIST`] iterations in a row are back below
//! half the growth. While one is open the baseline is frozen, so a long slowdown never
//! becomes the norm. Iterations are taken as they were sent: the watch never walks iteration
//! numbers, so a step numbered 10^14 costs what step 1 does.
//!
//! The live run and a profile read back feed the same breakdowns in the same order per rank
//! (`crate::job::JobTotals::record`), so both find the same slowdowns.

use std::collections::VecDeque;

use crate::fast_hash::FastMap;
use crate::rank_table::RankTable;

use serde::{Deserialize, Serialize};

use crate::attribution::{Basis, IterationBreakdown};
use crate::category::{Category, Split};

/// Normal iterations per rank the reference window holds, the latest.
pub const BASELINE_KEPT: usize = 64;
/// Normal iterations a rank needs before it is tested.
pub const BASELINE_MIN: usize = 10;
/// Iterations at the start of every rank left out, at the least (start-up, first batches).
pub const WARMUP_SKIPPED: u64 = 5;
/// Iterations in a row that make a slowdown, and a recovery.
pub const PERSIST: usize = 4;
/// A category must grow by this share of the baseline iteration.
pub const MIN_GROWTH_SHARE: f64 = 0.25;
/// … to at least this many times its baseline median.
pub const MIN_FACTOR: f64 = 2.0;
/// … by at least this many robust standard deviations (1.4826 × MAD) of its baseline.
pub const NOISE_MADS: f64 = 3.0;
/// A rank alone: its part must grow this many times more than the rest of the iteration
/// (peer wait and `other` left out).
pub const REST_MARGIN: f64 = 1.5;
/// A part under this share of the baseline iteration counts as this share (factors of a
/// part that was nearly nothing are not infinite), and a rest under it tells nothing.
pub const MIN_PART_SHARE: f64 = 0.02;

/// The parts that can be the one that grew: not `peer_wait` nor `other` (see the module docs).
const CANDIDATES: [Category; 5] = [
    Category::Compute,
    Category::DataFetch,
    Category::DataPrep,
    Category::Interconnect,
    Category::Network,
];

/// One rank that turned slow.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Slowdown {
    /// Global rank.
    pub rank: u32,
    /// Its node (the host in a single-node run; filled in by the summary).
    pub node: String,
    /// The category that grew (`compute`, `data_prep`, …).
    pub category: String,
    /// The first slow iteration.
    pub since_iteration: u64,
    /// The iteration whose end declared it.
    pub detected_iteration: u64,
    /// The first iteration back to normal; `None` while it lasts.
    pub until_iteration: Option<u64>,
    /// How much slower the rank's iterations became: median iteration over the slow
    /// iterations that declared it / the baseline median iteration.
    pub factor: f64,
    /// s per iteration in the category before (the baseline median).
    pub before_seconds: f64,
    /// s per iteration in the category when declared (median of the slow iterations).
    pub after_seconds: f64,
    /// The rank's process id.
    pub pid: u32,
}

impl Slowdown {
    /// Whether it still lasts.
    pub fn ongoing(&self) -> bool {
        self.until_iteration.is_none()
    }
}

/// ns the grown iterations of a test window last together, at least: a stretch shorter than
/// this is the scheduler's, not a rank turning slow, however many fast iterations it holds.
/// Iterations of 63 ms or more fill it with [`PERSIST`].
pub const MIN_TEST_WINDOW_NS: u64 = 250_000_000;

/// Grown iterations a test window holds at most (a 1-ms loop's quarter of a second).
const MAX_TEST_WINDOW: usize = 512;

/// The slowdowns of every rank, found as iterations are attributed; see the module docs.
#[derive(Debug)]
pub struct SlowdownWatch {
    /// Each loop's (rank, pid) and watch, in the order first seen. Boxed: a rank's watch is
    /// moved out and back for each of its iterations (it reads its peers'), a pointer rather
    /// than its ~600 bytes.
    ranks: Vec<((u32, u32), Box<RankWatch>)>,
    /// Where each loop's watch is in `ranks`.
    index: FastMap<(u32, u32), usize>,
    /// Per rank, the process of its latest loop and where that loop's watch is in `ranks`:
    /// found by rank number, so that a round's iterations, which come by rank, walk it in
    /// order; `index` is asked only when the rank's process changed.
    by_rank: RankTable<(u32, usize)>,
    /// Where the watch of each iteration of a [`SlowdownWatch::take_all`] is, in order,
    /// and the iteration's parts as the watch reads them ([`watched_split`]).
    slots: Vec<(usize, Split)>,
    /// Up to two rank numbers whose watches hold a baseline of [`BASELINE_MIN`] iterations:
    /// a rank has peers to compare with when one of them is another's. A watch's baseline
    /// never shrinks below that, so once two are here every rank has peers (asked for each
    /// iteration of each rank: a walk over 10,000 watches, none of them ready yet in a job's
    /// first iterations, would be quadratic).
    ranks_with_baseline: Vec<u32>,
    /// An empty watch, left in a rank's place while its iteration is taken.
    spare: Option<Box<RankWatch>>,
    /// Every slowdown found, in the order declared (a recovered one updated in place).
    found: Vec<Slowdown>,
    /// ns a test window lasts at least ([`MIN_TEST_WINDOW_NS`]).
    min_window_ns: u64,
}

impl Default for SlowdownWatch {
    fn default() -> SlowdownWatch {
        SlowdownWatch::with_min_window(MIN_TEST_WINDOW_NS)
    }
}

/// One loop's state.
#[derive(Debug, Default)]
struct RankWatch {
    /// Breakdowns taken.
    taken: u64,
    /// The latest normal iterations (reference window).
    baseline: VecDeque<Split>,
    /// Per category: the current run of grown iterations (first iteration, parts of each).
    runs: [Run; 7],
    /// Per category: the index in `found` of its open slowdown.
    open: [Option<usize>; 7],
    /// The latest [`RECENT_KEPT`] iterations taken, by number: what its peers compare with.
    recent: VecDeque<(u64, Split)>,
    /// `baseline`'s figures when last computed, and iterations it took since.
    cached: Option<Baseline>,
    joined_since: usize,
}

/// The reference window's figures are computed again once this share of the window (1/N)
/// joined it since the last time, not for every iteration: 22 medians of up to
/// [`BASELINE_KEPT`] values for each iteration of each rank were a third of the collector's
/// CPU at 10,000 ranks, and every eighth iteration still a sixth of its job thread's
/// instructions. A median moves little while a quarter of its values change (16 of a full
/// window, 3 of the first 10), and a slowdown's iterations never join the window.
pub const BASELINE_REFRESH_SHARE: usize = 4;

/// Iterations that join the reference window before its figures are computed again
/// ([`BASELINE_REFRESH_SHARE`] of `window` iterations), at least 1.
pub fn baseline_refresh(window: usize) -> usize {
    (window / BASELINE_REFRESH_SHARE).max(1)
}

impl RankWatch {
    /// The reference window's figures, computed again when a quarter of it joined since
    /// ([`baseline_refresh`]); the rests beside each part with `with_rest` only (a rank with
    /// peers never reads them: [`outgrew_the_rest`]).
    fn baseline(&mut self, with_rest: bool) -> Baseline {
        match self.cached {
            Some(b) if self.joined_since < baseline_refresh(self.baseline.len()) => b,
            _ => {
                let b = baseline(&self.baseline, with_rest);
                self.cached = Some(b);
                self.joined_since = 0;
                b
            }
        }
    }

    /// The figures its peers compare with: the last computed, or now.
    fn peer_baseline(&self) -> Baseline {
        self.cached
            .unwrap_or_else(|| baseline(&self.baseline, false))
    }
}

/// Iterations per rank kept for its peers to compare with.
const RECENT_KEPT: usize = 16;

#[derive(Debug, Default, Clone)]
struct Run {
    /// The run's first iteration.
    first: u64,
    /// Its latest iterations' parts: the shortest latest stretch of at least [`PERSIST`]
    /// that lasts the watch's test window together (at most [`MAX_TEST_WINDOW`]).
    splits: Vec<Split>,
}

impl Run {
    /// Adds a grown iteration, then leaves out the earliest ones the window does not need.
    fn push_grown(&mut self, split: Split, min_window_ns: u64) {
        self.splits.push(split);
        let mut wall: u64 = self.splits.iter().map(Split::total).sum();
        while self.splits.len() > PERSIST
            && (self.splits.len() > MAX_TEST_WINDOW
                || wall - self.splits[0].total() >= min_window_ns)
        {
            wall -= self.splits.remove(0).total();
        }
    }

    /// Whether the window is full: [`PERSIST`] iterations at least, lasting `min_window_ns`
    /// together (or [`MAX_TEST_WINDOW`] of them).
    fn is_full(&self, min_window_ns: u64) -> bool {
        self.splits.len() >= PERSIST
            && (self.splits.len() >= MAX_TEST_WINDOW
                || self.splits.iter().map(Split::total).sum::<u64>() >= min_window_ns)
    }
}

/// The reference window's figures, ns.
#[derive(Clone, Copy, Debug)]
struct Baseline {
    iteration: f64,
    /// Per category, the median; of the [`CANDIDATES`] only (the others 0) unless computed
    /// with the rests: nothing else reads the others.
    median: [f64; 7],
    /// Per category, 1.4826 × the median absolute deviation; as `median`.
    sigma: [f64; 7],
    /// Per category, the median of the rest of the iteration ([`rest_of`]); `None` when
    /// computed for a rank with peers, which never reads them. A rank's peers never go
    /// away, so a rank alone when its figures were computed is alone before.
    rest: Option<[f64; 7]>,
}

impl SlowdownWatch {
    /// A watch whose test windows last `min_window_ns` at least (the default:
    /// [`MIN_TEST_WINDOW_NS`]).
    pub fn with_min_window(min_window_ns: u64) -> SlowdownWatch {
        SlowdownWatch {
            ranks: Vec::new(),
            index: FastMap::default(),
            by_rank: RankTable::default(),
            slots: Vec::new(),
            ranks_with_baseline: Vec::new(),
            spare: None,
            found: Vec::new(),
            min_window_ns,
        }
    }

    /// Every slowdown found so far, in the order declared.
    pub fn found(&self) -> &[Slowdown] {
        &self.found
    }

    /// Takes `found` as the slowdowns found so far (a thinned profile's live totals,
    /// [`crate::frame::IterationTotals`]); the ranks' windows go on from what they hold.
    pub fn replace_found(&mut self, found: Vec<Slowdown>) {
        self.found = found;
        for (_, w) in &mut self.ranks {
            w.open = Default::default();
        }
    }

    /// Takes one attributed iteration of a rank; iterations of one rank must come in order.
    /// The first `warmup` iterations of each rank (at least [`WARMUP_SKIPPED`]) are skipped.
    pub fn take(&mut self, b: &IterationBreakdown, warmup: u64) {
        self.take_all(std::slice::from_ref(b), warmup);
    }

    /// Takes the iterations one attribution round gave (every rank's, in any order between
    /// ranks): each rank's are remembered first, so a rank is compared with whatever its
    /// peers did in the same iterations, whichever order the round lists them in.
    pub fn take_all(&mut self, new: &[IterationBreakdown], warmup: u64) {
        let mut slots = std::mem::take(&mut self.slots);
        slots.clear();
        for b in new {
            let slot = match self.by_rank.get(b.rank) {
                Some(&(pid, slot)) if pid == b.pid => slot,
                _ => {
                    let key = (b.rank, b.pid);
                    let ranks = &mut self.ranks;
                    let slot = *self.index.entry(key).or_insert_with(|| {
                        ranks.push((key, Box::default()));
                        ranks.len() - 1
                    });
                    self.by_rank.insert(b.rank, (b.pid, slot));
                    slot
                }
            };
            let w = &mut self.ranks[slot].1;
            if !seen(b) {
                // Not taken (`take_one` leaves it out too): no parts needed.
                slots.push((slot, Split::default()));
                continue;
            }
            let split = watched_split(b);
            slots.push((slot, split));
            if w.recent.len() == RECENT_KEPT {
                w.recent.pop_front();
            }
            w.recent.push_back((b.iter, split));
        }
        for (b, &(slot, split)) in new.iter().zip(&slots) {
            // Taken out while its iteration is taken (it reads its peers): the empty watch
            // left in its place has no baseline, so no peer sees it, as if it were removed.
            let empty = self.spare.take().unwrap_or_default();
            let mut w = std::mem::replace(&mut self.ranks[slot].1, empty);
            self.take_one(&mut w, b, split, warmup);
            self.spare = Some(std::mem::replace(&mut self.ranks[slot].1, w));
        }
        self.slots = slots;
    }

    /// The watch of loop (`rank`, `pid`), when it has taken an iteration.
    #[cfg(test)]
    fn watch_of(&self, rank: u32, pid: u32) -> Option<&RankWatch> {
        self.index.get(&(rank, pid)).map(|i| &*self.ranks[*i].1)
    }

    /// Takes iteration `b` of watch `w`, whose parts as the watch reads them are `split`
    /// ([`watched_split`]).
    fn take_one(&mut self, w: &mut RankWatch, b: &IterationBreakdown, split: Split, warmup: u64) {
        w.taken += 1;
        if w.taken <= warmup.max(WARMUP_SKIPPED) || b.split.total() == 0 || !seen(b) {
            return;
        }
        let b = Taken {
            rank: b.rank,
            pid: b.pid,
            iter: b.iter,
            split,
        };
        if w.baseline.len() < BASELINE_MIN {
            w.baseline.push_back(b.split);
            if w.baseline.len() == BASELINE_MIN {
                self.note_baseline(b.rank);
            }
            return;
        }
        // The rests beside each part are read only by a rank with no peers, and a rank that
        // has peers keeps them.
        let base = w.baseline(!self.has_peers(b.rank));
        let mut normal = true;
        for c in CANDIDATES {
            let k = c.index();
            let grown = has_grown(&base, &b.split, c);
            match w.open[k] {
                Some(at) => {
                    normal = false;
                    let back = !is_above(&base, &b.split, c, 0.5);
                    let run = &mut w.runs[k];
                    if !back {
                        run.splits.clear();
                        continue;
                    }
                    if run.splits.is_empty() {
                        run.first = b.iter;
                    }
                    run.splits.push(b.split);
                    if run.splits.len() >= PERSIST {
                        self.found[at].until_iteration = Some(run.first);
                        w.open[k] = None;
                        run.splits.clear();
                    }
                }
                None => {
                    let run = &mut w.runs[k];
                    if !grown {
                        run.splits.clear();
                        continue;
                    }
                    normal = false;
                    if run.splits.is_empty() {
                        run.first = b.iter;
                    }
                    run.push_grown(b.split, self.min_window_ns);
                    let its_own = |watch: &SlowdownWatch, run: &Run| {
                        if watch.has_peers(b.rank) {
                            !watch.shared_with_peers(b.rank, &w.recent, &base, c)
                        } else {
                            // Compute is what other processes' load on the CPU stretches,
                            // and unevenly: with no peer, nothing tells the two apart (in
                            // CI, a single-rank job beside another test's training had its
                            // compute grow 3.4× for 25 iterations and was named).
                            c != Category::Compute && outgrew_the_rest(&base, &run.splits, c)
                        }
                    };
                    if run.is_full(self.min_window_ns) && its_own(self, run) {
                        let walls: Vec<f64> = run.splits.iter().map(|s| s.total() as f64).collect();
                        let parts: Vec<f64> = run.splits.iter().map(|s| s.get(c) as f64).collect();
                        self.found.push(Slowdown {
                            rank: b.rank,
                            pid: b.pid,
                            node: String::new(),
                            category: c.name().to_string(),
                            since_iteration: run.first,
                            detected_iteration: b.iter,
                            until_iteration: None,
                            factor: median(walls) / base.iteration.max(1.0),
                            before_seconds: base.median[k] / 1e9,
                            after_seconds: median(parts) / 1e9,
                        });
                        w.open[k] = Some(self.found.len() - 1);
                        run.splits.clear();
                    }
                }
            }
        }
        if normal && w.open.iter().all(Option::is_none) {
            if w.baseline.len() == BASELINE_KEPT {
                w.baseline.pop_front();
            }
            w.baseline.push_back(b.split);
            w.joined_since += 1;
        }
    }
}

impl SlowdownWatch {
    /// Whether another rank has a baseline to compare with.
    fn has_peers(&self, rank: u32) -> bool {
        self.ranks_with_baseline.iter().any(|r| *r != rank)
    }

    /// Notes that a watch of `rank` now holds a baseline of [`BASELINE_MIN`] iterations.
    fn note_baseline(&mut self, rank: u32) {
        if self.ranks_with_baseline.len() < 2 && !self.ranks_with_baseline.contains(&rank) {
            self.ranks_with_baseline.push(rank);
        }
    }

    /// Whether the growth of part `c` on rank `rank` (its `recent` iterations, baseline
    /// `base`) shows on another rank too, in at least [`SHARED_BY`] of the same iterations
    /// (the latest [`PERSIST`] + 2 of this rank) by at least half as much: then the job or
    /// the machine slowed down (other processes' load, a slower link under a collective every
    /// rank takes part in), and no one rank turned slow.
    fn shared_with_peers(
        &self,
        rank: u32,
        recent: &VecDeque<(u64, Split)>,
        base: &Baseline,
        c: Category,
    ) -> bool {
        let k = c.index();
        let iters: Vec<u64> = recent
            .iter()
            .rev()
            .take(PERSIST + 2)
            .map(|(i, _)| *i)
            .collect();
        let own: Vec<f64> = recent
            .iter()
            .rev()
            .take(PERSIST)
            .map(|(_, s)| s.get(c) as f64)
            .collect();
        let growth = median(own) - base.median[k];
        self.ranks
            .iter()
            .filter(|((r, _), q)| *r != rank && q.baseline.len() >= BASELINE_MIN)
            .any(|(_, q)| {
                let bar = q.peer_baseline().median[k] + growth / 2.0;
                let grown = q
                    .recent
                    .iter()
                    .filter(|(i, s)| iters.contains(i) && s.get(c) as f64 > bar)
                    .count();
                grown >= SHARED_BY
            })
    }
}

/// What the watch reads of one breakdown: its parts as [`watched_split`] gives them.
struct Taken {
    rank: u32,
    pid: u32,
    iter: u64,
    split: Split,
}

/// The parts of `b` the watch tests: time a rank's threads spent ready to run but waiting on a
/// run queue ([`Basis::CounterRunQueue`], [`Basis::LoaderRunQueue`]) counts as `other`, as it
/// did when the threads were polled (a thread queued through a whole tick looked idle, and its
/// wait fell to `other`). That wait is the node's CPU being short, other processes' load or the
/// job's own threads outnumbering the cores: it stretches whichever rank the scheduler happened
/// to queue, and is no more the rank turning slow than a machine slowing down as a whole is
/// (the peers' comparison catches that, but not load that lands on one rank at a time).
fn watched_split(b: &IterationBreakdown) -> Split {
    let mut split = b.split;
    for e in &b.evidence {
        if matches!(e.basis, Basis::CounterRunQueue | Basis::LoaderRunQueue) {
            let k = e.category.index();
            let moved = e.ns.min(split.ns[k]);
            split.ns[k] -= moved;
            split.add(Category::Other, moved);
        }
    }
    split
}

/// An iteration is taken only if the counters saw at least this share of it: CPU samples of
/// the rank's main thread bracketed that much of its wall time when it was attributed
/// ([`crate::attribution::Coverage::sampled_ns`]).
pub const MIN_SEEN_SHARE: f64 = 0.9;

/// Whether the counters saw `b` ([`MIN_SEEN_SHARE`]). Where they did not, the time no marker
/// decides is `other` ("nothing seen explains it") however the rank spent it, so compute
/// that comes and goes with the samples is no change of the rank: an agent that discovered a
/// rank late (compute 0 in its first iterations) or samples that came late (compute 8 ms of
/// 220, then 59 ms once they came) named steady ranks as slowdowns.
fn seen(b: &IterationBreakdown) -> bool {
    b.coverage.sampled_ns as f64 >= MIN_SEEN_SHARE * b.wall_ns() as f64
}

/// Iterations of the same numbers in which a peer's part grew too, for the growth to be the
/// job's or the machine's rather than a rank's.
const SHARED_BY: usize = 2;

/// Whether category `c` of `split` has grown past every bar of the module docs.
fn has_grown(base: &Baseline, split: &Split, c: Category) -> bool {
    let k = c.index();
    let grew = split.get(c) as f64 / base.median[k].max(part_floor(base));
    is_above(base, split, c, 1.0) && grew >= MIN_FACTOR
}

/// ns: a part counts as at least this ([`MIN_PART_SHARE`] of the baseline iteration).
fn part_floor(base: &Baseline) -> f64 {
    MIN_PART_SHARE * base.iteration.max(1.0)
}

/// Whether category `c` grew, over the iterations `run`, [`REST_MARGIN`] times more than
/// the rest of the iteration (medians over the run, against the baseline's); never when the
/// rest was too small to tell.
fn outgrew_the_rest(base: &Baseline, run: &[Split], c: Category) -> bool {
    let k = c.index();
    let floor = part_floor(base);
    // Computed for every rank alone ([`Baseline::rest`]).
    debug_assert!(base.rest.is_some(), "a rank alone's baseline has its rests");
    let Some(base_rest) = base.rest.map(|r| r[k]).filter(|r| *r >= floor) else {
        return false;
    };
    let part = median(run.iter().map(|s| s.get(c) as f64).collect());
    let rest = median(run.iter().map(|s| rest_of(s, c) as f64).collect());
    part / base.median[k].max(floor) >= REST_MARGIN * (rest / base_rest)
}

/// ns of `split` outside category `c`, peer wait and `other`: peer wait is the peers', and
/// `other` on a CPU that other processes contend for is mostly the wait for the CPU that
/// the grown part needed, so it grows with it.
fn rest_of(split: &Split, c: Category) -> u64 {
    let (wait, other) = (split.get(Category::PeerWait), split.get(Category::Other));
    rest_from(split.total(), c, split.get(c), wait, other)
}

/// Whether category `c` of `split` lies above its baseline median by `part` of the bar
/// (growth of [`MIN_GROWTH_SHARE`] of the iteration and [`NOISE_MADS`] deviations).
fn is_above(base: &Baseline, split: &Split, c: Category, part: f64) -> bool {
    let k = c.index();
    let bar = (MIN_GROWTH_SHARE * base.iteration).max(NOISE_MADS * base.sigma[k]);
    split.get(c) as f64 > base.median[k] + part * bar
}

/// The figures of reference window `window`; its rests ([`Baseline::rest`]) and the figures
/// of peer wait and `other` with `with_rest` only (nine of the fifteen columns, which a rank
/// with peers never reads: the parts that can be the one that grew are [`CANDIDATES`]).
fn baseline(window: &VecDeque<Split>, with_rest: bool) -> Baseline {
    // The 15 columns the 22 figures are made of (each category's part, the whole iteration,
    // the rest of it beside each part), written into one buffer, the rests from the columns
    // already written: this runs every [`baseline_refresh`] iterations of every rank (at
    // 10,000 ranks a selection over `f64`s per median was a quarter of the collector's
    // instructions, and summing each iteration again for each rest column half of what was
    // left). The values are taken as
    // integers (ns: their order is that of the `f64`s the figures are made of) and sorted
    // (fewer instructions than a selection, at 64 values), which gives each median and, by a
    // merge of the two sides of a part's median, the median of its deviations: the figures
    // the selections over `f64`s gave, bit for bit ([`median_sorted`],
    // [`deviation_median_sorted`]).
    let n = window.len();
    // Columns 0–6: each category's part; 7: the whole iteration. Then, apart, column `k`: the
    // rest beside category `k`.
    let mut parts: Vec<u64> = Vec::with_capacity(8 * n);
    for c in Category::ALL {
        parts.extend(window.iter().map(|s| s.get(c)));
    }
    parts.extend(window.iter().map(Split::total));
    let mut rests: Vec<u64> = Vec::with_capacity(if with_rest { 7 * n } else { 0 });
    if with_rest {
        let column = |k: usize| &parts[k * n..(k + 1) * n];
        let (totals, wait, other) = (
            column(7),
            column(Category::PeerWait.index()),
            column(Category::Other.index()),
        );
        for c in Category::ALL {
            let rows = totals
                .iter()
                .zip(column(c.index()))
                .zip(wait.iter().zip(other));
            rests.extend(
                rows.map(|((total, part), (wait, other))| {
                    rest_from(*total, c, *part, *wait, *other)
                }),
            );
        }
    }
    let read = |k: usize| with_rest || k == 7 || CANDIDATES.iter().any(|c| c.index() == k);
    for (k, col) in parts.chunks_exact_mut(n.max(1)).enumerate() {
        if read(k) {
            col.sort_unstable();
        }
    }
    for col in rests.chunks_exact_mut(n.max(1)) {
        col.sort_unstable();
    }
    let column = |k: usize| &parts[k * n..(k + 1) * n];
    let mut median_ns = [0.0; 7];
    let mut sigma = [0.0; 7];
    let mut rest = [0.0; 7];
    for c in Category::ALL {
        let k = c.index();
        if !read(k) {
            continue;
        }
        let v = column(k);
        let m = median_sorted(v);
        median_ns[k] = m;
        sigma[k] = 1.4826 * deviation_median_sorted(v, m);
        if with_rest {
            rest[k] = median_sorted(&rests[k * n..(k + 1) * n]);
        }
    }
    Baseline {
        iteration: median_sorted(column(7)),
        median: median_ns,
        sigma,
        rest: with_rest.then_some(rest),
    }
}

/// [`rest_of`] of an iteration of `total` ns whose part `c`, peer wait and `other` hold
/// `part`, `wait` and `other` ns.
fn rest_from(total: u64, c: Category, part: u64, wait: u64, other: u64) -> u64 {
    let mut out = total - part;
    if c != Category::PeerWait {
        out -= wait;
    }
    if c != Category::Other {
        out -= other;
    }
    out
}

/// [`median`] of the values of `v` (sorted, ascending) as `f64`s: the conversion keeps their
/// order, so the middle values are the converted middle ones.
fn median_sorted(v: &[u64]) -> f64 {
    let n = v.len();
    if n == 0 {
        return 0.0;
    }
    let upper = v[n / 2] as f64;
    if n % 2 == 1 {
        return upper;
    }
    (v[n / 2 - 1] as f64 + upper) / 2.0
}

/// [`median`] of `|x - m|` over the values `x` of `v` (sorted, ascending) as `f64`s, without
/// sorting the deviations: they fall going up to `m` and rise going up from it, so the two
/// sides, read outwards from `m`, are merged until the middle.
fn deviation_median_sorted(v: &[u64], m: f64) -> f64 {
    let n = v.len();
    if n == 0 {
        return 0.0;
    }
    let dev = |x: u64| (x as f64 - m).abs();
    // Below `m`: indices `..split`, read downwards; from `m` up: `split..`, read upwards.
    let split = v.partition_point(|&x| (x as f64) < m);
    let (mut down, mut up) = (split, split);
    let mut lower = 0.0;
    let mut upper = 0.0;
    for _ in 0..=n / 2 {
        lower = upper;
        let take_down = match (down > 0, up < n) {
            (true, true) => dev(v[down - 1]) <= dev(v[up]),
            (true, false) => true,
            _ => false,
        };
        if take_down {
            down -= 1;
            upper = dev(v[down]);
        } else {
            upper = dev(v[up]);
            up += 1;
        }
    }
    if n % 2 == 1 {
        upper
    } else {
        (lower + upper) / 2.0
    }
}

/// The median (the mean of the middle two for an even count); 0 when empty.
fn median(mut v: Vec<f64>) -> f64 {
    median_in(&mut v)
}

/// [`median`] of `v`, reordering it: the middle values are selected, not the whole sorted
/// (what a sort would give, in linear time).
fn median_in(v: &mut [f64]) -> f64 {
    let n = v.len();
    if n == 0 {
        return 0.0;
    }
    let (below, upper, _) = v.select_nth_unstable_by(n / 2, f64::total_cmp);
    let upper = *upper;
    if n % 2 == 1 {
        return upper;
    }
    // The lower middle is the largest of the values below the upper one.
    let lower = below
        .iter()
        .copied()
        .max_by(f64::total_cmp)
        .unwrap_or(upper);
    (lower + upper) / 2.0
}

/// Tells which slowdowns are news: each one once when found, and once more when it
/// recovered (what `stallscope run` and the collector say as it happens).
#[derive(Debug, Default)]
pub struct SlowdownNews {
    /// Per slowdown told (in the order found), whether its recovery was told too.
    told: Vec<bool>,
}

impl SlowdownNews {
    /// The news in `found` (every slowdown so far, in the order found) since the last call:
    /// a new one as declared (`until_iteration` null), a recovered one with its end.
    pub fn take(&mut self, found: &[Slowdown]) -> Vec<Slowdown> {
        let mut news = Vec::new();
        for (i, s) in found.iter().enumerate() {
            if i == self.told.len() {
                news.push(Slowdown {
                    until_iteration: None,
                    ..s.clone()
                });
                self.told.push(false);
            }
            if !s.ongoing() && !self.told[i] {
                news.push(s.clone());
                self.told[i] = true;
            }
        }
        news
    }
}

/// The slowdown in words, for stderr.
pub fn describe(s: &Slowdown) -> String {
    let at = if s.node.is_empty() {
        String::new()
    } else {
        format!(" on {}", s.node)
    };
    match s.until_iteration {
        None => format!(
            "stallscope: rank {}{at} turned slow at iteration {} ({:.2}× slower): {} grew from {:.1} ms to {:.1} ms per iteration (seen at iteration {})",
            s.rank,
            s.since_iteration,
            s.factor,
            s.category,
            s.before_seconds * 1e3,
            s.after_seconds * 1e3,
            s.detected_iteration
        ),
        Some(until) => format!(
            "stallscope: rank {}{at} recovered at iteration {until}: its {} is back to normal (slow since iteration {})",
            s.rank, s.category, s.since_iteration
        ),
    }
}

#[cfg(test)]
mod tests;
