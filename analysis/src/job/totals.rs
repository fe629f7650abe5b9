//! The running summary of a job: what the end-of-run summary needs of every attributed
//! iteration, folded in as iterations are attributed (bounded memory), and what each rank's
//! GPU did. No breakdown is kept: everything that reads them reads the folded figures, the
//! live model's recent parts or the profile.

use std::collections::BTreeMap;

use crate::aggregate::RunningSummary;
use crate::attribution::IterationBreakdown;
use crate::collectives::{CommTotals, OpTime};
use crate::gpu_usage::{GpuUsage, NvmlReading};
use crate::rank_table::RankTable;
use crate::slowdown::SlowdownWatch;

/// A job's running summary.
#[derive(Debug, Default)]
pub struct JobTotals {
    /// What the summary needs of every iteration attributed so far.
    pub totals: RunningSummary,
    /// What each rank's GPU did over its counted (post-warm-up) iterations, by rank: the
    /// node's own ranks, and other nodes' as their agents read them. By rank number: looked
    /// up per rank-iteration (a tree of 10,000 ranks was a walk of a dozen nodes each, a hash
    /// map a cache miss each).
    pub gpu_usage: RankTable<GpuUsage>,
    /// Each of this node's loops' communication operations over its counted iterations, by
    /// (rank, pid) as [`RunningSummary::ranks`].
    pub comm: BTreeMap<(u32, u32), CommTotals>,
    /// Ranks that turned slow, found as iterations are recorded (warm-up included: the watch
    /// leaves out each rank's first iterations itself).
    pub slowdowns: SlowdownWatch,
}

impl JobTotals {
    /// Folds newly attributed breakdowns into the totals (iterations below `warmup` are not
    /// counted) and the slowdown watch.
    pub fn record(&mut self, new: &[IterationBreakdown], warmup: u64) {
        for b in new {
            self.totals.add(b, warmup);
        }
        self.slowdowns.take_all(new, warmup);
    }

    /// Counts the communication spans of a counted iteration of loop `pid` (rank `rank`).
    pub fn add_comm(&mut self, (rank, pid): (u32, u32), spans: &[OpTime]) {
        let totals = self.comm.entry((rank, pid)).or_default();
        spans.iter().for_each(|s| totals.add(s));
    }

    /// Counts what rank `rank`'s GPU did in an iteration of `wall_ns`.
    pub fn add_gpu(&mut self, rank: u32, reading: &NvmlReading, wall_ns: u64) {
        self.gpu_usage.entry_or_default(rank).add(reading, wall_ns);
    }
}
