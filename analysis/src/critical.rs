//! The job's critical path: per iteration, the parts of the rank that held it up.
//!
//! Averaged over ranks, a job with one slow rank reads as "peer wait": every other rank waits
//! for it, and with four ranks or more their waits outweigh the straggler's own cause (its
//! data preparation, its slower device). What would make the job faster is removing what the
//! straggler spent its time on, so the finding reads the critical path: per iteration, the
//! rank that waited least for its peers (it arrived last at the collectives; ties go to the
//! one that finished last). On one rank the critical path is that rank.
//!
//! Iterations are taken as their ranks finish them; one that some rank never finishes (it
//! died, or it is not attributed yet) is taken as it stands once [`PENDING`] later ones wait,
//! or when the path is read.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::category::{Category, Split};
use crate::Nanos;

/// Iterations awaiting their last rank; beyond, the oldest is taken as it stands.
pub const PENDING: usize = 4_096;

/// An iteration some ranks have finished.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Pending {
    /// Ranks that finished it.
    ranks: u32,
    /// The holding rank so far: its peer wait, ns, and end, ns.
    held_by: Option<(u64, Nanos)>,
    /// Its parts.
    split: Split,
}

/// The critical path of the counted iterations so far.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CriticalPath {
    pending: BTreeMap<u64, Pending>,
    /// ns per category over the iterations taken.
    split: Split,
    /// Iterations taken.
    iterations: u64,
}

impl CriticalPath {
    /// Takes rank's iteration `iter` (ending at `end_ns`, with parts `split`); `ranks` is how
    /// many ranks the job has as far as is known.
    pub fn add(&mut self, iter: u64, end_ns: Nanos, split: &Split, ranks: usize) {
        let p = self.pending.entry(iter).or_default();
        p.ranks += 1;
        let key = (split.get(Category::PeerWait), end_ns);
        let holds = p
            .held_by
            .is_none_or(|(wait, end)| key.0 < wait || (key.0 == wait && key.1 >= end));
        if holds {
            p.held_by = Some(key);
            p.split = *split;
        }
        if p.ranks as usize >= ranks {
            if let Some(done) = self.pending.remove(&iter) {
                self.take(&done);
            }
        }
        while self.pending.len() > PENDING {
            if let Some((_, done)) = self.pending.pop_first() {
                self.take(&done);
            }
        }
    }

    fn take(&mut self, done: &Pending) {
        self.split.add_split(&done.split);
        self.iterations += 1;
    }

    /// ns per category along the path and the iterations on it, those still awaiting a rank
    /// included as they stand.
    pub fn totals(&self) -> (Split, u64) {
        let mut split = self.split;
        for p in self.pending.values() {
            split.add_split(&p.split);
        }
        (split, self.iterations + self.pending.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn split(parts: &[(Category, u64)]) -> Split {
        let mut s = Split::default();
        for (c, ms) in parts {
            s.add(*c, ms * MS);
        }
        s
    }

    #[test]
    fn the_path_follows_the_rank_that_waited_least() {
        let mut cp = CriticalPath::default();
        let waiter = split(&[(Category::Compute, 60), (Category::PeerWait, 40)]);
        let straggler = split(&[(Category::Compute, 60), (Category::DataPrep, 40)]);
        for iter in 0..10 {
            // The straggler finishes a hair before the others: ends are noise in DDP.
            cp.add(iter, 1_000, &waiter, 4);
            cp.add(iter, 999, &straggler, 4);
            cp.add(iter, 1_001, &waiter, 4);
            cp.add(iter, 1_000, &waiter, 4);
        }
        let (s, n) = cp.totals();
        assert_eq!(n, 10);
        assert_eq!(s.get(Category::DataPrep), 400 * MS);
        assert_eq!(s.get(Category::PeerWait), 0);
    }

    #[test]
    fn an_iteration_a_rank_never_finishes_still_counts() {
        let mut cp = CriticalPath::default();
        let s = split(&[(Category::Compute, 10)]);
        cp.add(0, 1, &s, 2);
        assert_eq!(cp.totals(), (s, 1), "read as it stands");
        for iter in 1..=PENDING as u64 + 1 {
            cp.add(iter, 1, &s, 2);
        }
        assert_eq!(cp.pending.len(), PENDING, "bounded");
        assert_eq!(cp.totals().1, PENDING as u64 + 2);
    }
}
