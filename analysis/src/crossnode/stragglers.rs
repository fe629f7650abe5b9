//! Who held the job up: per window of [`WINDOW_ITERS`] iterations, the rank that arrived last
//! at the collectives for the longest, when the others spent a noticeable share of their time
//! waiting ([`STRAGGLER_MIN_WAIT`]). Arrivals are summed into their window as iterations are
//! joined, and a window is reduced to its straggler once joins have moved
//! [`WINDOW_CLOSE_LAG_ITERS`] past it, so nothing grows with the job's length but the list of
//! windows that named one.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Iterations per straggler window.
pub const WINDOW_ITERS: u64 = 10;

/// Share of the other ranks' wall time spent in `peer_wait` above which a window names a
/// straggler, 0–1.
pub const STRAGGLER_MIN_WAIT: f64 = 0.05;

/// Iterations the newest joined one must be past a straggler window's last before the window
/// is closed (reduced to its straggler). Iterations normally join in order, a few out of it
/// within the join's patience; an iteration still waiting keeps its window open too. The
/// arrivals of an iteration joined into a window already closed (a rank's report that came
/// more than this late) are left out of the straggler figures; its breakdowns still count.
pub const WINDOW_CLOSE_LAG_ITERS: u64 = 1_000;

/// A window's straggler, as the arrivals summed over it say.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Straggler {
    /// The rank that held the others up longest.
    rank: u32,
    /// ns it held the next-to-last rank up, summed over the window.
    held_ns: u64,
    /// Share of the other ranks' wall time they spent waiting, 0–1.
    others_wait_fraction: f64,
}

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
pub(crate) struct IterationArrivals {
    /// ns each rank held the next-to-last one up, by rank.
    pub(crate) held: BTreeMap<u32, u64>,
    /// Per rank: (peer_wait ns, wall ns).
    pub(crate) waits: BTreeMap<u32, (u64, u64)>,
}

impl IterationArrivals {
    /// Adds another iteration's arrivals.
    fn add(&mut self, other: &IterationArrivals) {
        self.add_parts(&other.held, &other.waits);
    }

    /// Adds an iteration's arrivals: ns each rank held the next-to-last one up (a rank may
    /// come more than once), and per rank its (peer_wait ns, wall ns).
    fn add_parts<'a>(
        &mut self,
        held: impl IntoIterator<Item = (&'a u32, &'a u64)>,
        waits: impl IntoIterator<Item = (&'a u32, &'a (u64, u64))>,
    ) {
        for (rank, ns) in held {
            *self.held.entry(*rank).or_default() += ns;
        }
        for (rank, (w, t)) in waits {
            let e = self.waits.entry(*rank).or_default();
            e.0 += w;
            e.1 += t;
        }
    }

    /// The straggler of a window with these summed arrivals; `None` when nobody held anyone
    /// up or the others waited less than [`STRAGGLER_MIN_WAIT`].
    fn straggler(&self) -> Option<Straggler> {
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
        (share >= STRAGGLER_MIN_WAIT).then_some(Straggler {
            rank,
            held_ns,
            others_wait_fraction: share,
        })
    }
}

/// The straggler windows of a job: open ones with their summed arrivals, closed ones reduced
/// to their straggler.
#[derive(Debug, Default)]
pub(crate) struct StragglerWindows {
    /// First iteration of the first window (the warm-up).
    pub(crate) first_iter: u64,
    /// Arrivals summed per window still open, by window (0 = the one starting at
    /// `first_iter`).
    open: BTreeMap<u64, IterationArrivals>,
    /// Windows below this are closed: their arrivals are no longer taken.
    closed_below: u64,
    /// Closed windows that named a straggler, in window order, by window.
    closed: Vec<(u64, Straggler)>,
}

impl StragglerWindows {
    /// Sums iteration `iter`'s arrivals into its window, unless it is before the first or its
    /// window is closed.
    pub(crate) fn add(&mut self, iter: u64, arrivals: &IterationArrivals) {
        if let Some(sums) = self.window_of(iter) {
            sums.add(arrivals);
        }
    }

    /// [`StragglerWindows::add`] of one joined iteration's arrivals as the join lists them,
    /// by rank: no maps made for them (the join makes one per iteration).
    pub(crate) fn add_joined(
        &mut self,
        iter: u64,
        held: &[(u32, u64)],
        waits: &[(u32, (u64, u64))],
    ) {
        if let Some(sums) = self.window_of(iter) {
            sums.add_parts(
                held.iter().map(|(r, ns)| (r, ns)),
                waits.iter().map(|(r, w)| (r, w)),
            );
        }
    }

    /// The sums of the open window of iteration `iter`; `None` before the first, or when
    /// its window is closed.
    fn window_of(&mut self, iter: u64) -> Option<&mut IterationArrivals> {
        if iter < self.first_iter {
            return None;
        }
        let w = (iter - self.first_iter) / WINDOW_ITERS;
        (w >= self.closed_below).then(|| self.open.entry(w).or_default())
    }

    /// Closes the windows whose last iteration is below `limit`.
    pub(super) fn close_below(&mut self, limit: u64) {
        let closable = limit.saturating_sub(self.first_iter) / WINDOW_ITERS;
        while let Some(entry) = self.open.first_entry() {
            if *entry.key() >= closable {
                break;
            }
            let (w, sums) = entry.remove_entry();
            if let Some(s) = sums.straggler() {
                self.closed.push((w, s));
            }
        }
        self.closed_below = self.closed_below.max(closable);
    }

    /// Values held by the open windows.
    pub(super) fn held(&self) -> usize {
        self.open
            .values()
            .map(|a| a.held.len() + a.waits.len())
            .sum()
    }

    /// Every window that named a straggler, closed then open, with the node of each rank.
    pub(crate) fn list(&self, rank_nodes: &BTreeMap<u32, String>) -> Vec<StragglerWindow> {
        let open = self
            .open
            .iter()
            .filter_map(|(w, sums)| sums.straggler().map(|s| (*w, s)));
        self.closed
            .iter()
            .copied()
            .chain(open)
            .map(|(w, s)| {
                let first = self.first_iter + w * WINDOW_ITERS;
                StragglerWindow {
                    first_iter: first,
                    last_iter: first + WINDOW_ITERS - 1,
                    rank: s.rank,
                    node: rank_nodes.get(&s.rank).cloned().unwrap_or_default(),
                    held_seconds: crate::secs(s.held_ns),
                    others_wait_fraction: s.others_wait_fraction,
                }
            })
            .collect()
    }
}
