//! Whole-run series in bounded memory: one time axis cut into at most [`MAX_COLUMNS`]
//! columns, which double in width (neighbours merged) whenever the run outgrows them, so a
//! profile is read once, streaming, whatever its length; and a log-scaled histogram that gives
//! quantiles of iteration times within 1.1% without keeping the times.

use serde::{Deserialize, Serialize};

use crate::category::Split;
use crate::Nanos;

/// Columns a whole-run series has at most.
pub const MAX_COLUMNS: usize = 480;

/// The narrowest column, ns: a run shorter than 4.8 s still gets one column per 10 ms.
pub const MIN_COLUMN_NS: Nanos = 10_000_000;

/// Something a column holds that two neighbours can be merged into.
pub trait Merge: Default + Clone {
    /// Folds `other` (the later neighbour) into `self`.
    fn merge(&mut self, other: &Self);
}

/// A time axis: where column 0 begins and how wide each column is.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Axis {
    /// ns, where column 0 begins (the run's start, on the clock the profile runs on).
    pub t0_ns: Nanos,
    /// ns, the width of one column.
    pub width_ns: Nanos,
}

impl Axis {
    /// An axis starting at `t0_ns` with the narrowest columns.
    pub fn new(t0_ns: Nanos) -> Axis {
        Axis {
            t0_ns,
            width_ns: MIN_COLUMN_NS,
        }
    }

    /// The column holding instant `t_ns` (instants before the start go to column 0).
    pub fn index(&self, t_ns: Nanos) -> usize {
        (t_ns.saturating_sub(self.t0_ns) / self.width_ns) as usize
    }

    /// s from the start to the beginning of column `k`.
    pub fn start_seconds(&self, k: usize) -> f64 {
        (k as u64 * self.width_ns) as f64 / 1e9
    }

    /// s from the start to instant `t_ns`.
    pub fn seconds(&self, t_ns: Nanos) -> f64 {
        t_ns.saturating_sub(self.t0_ns) as f64 / 1e9
    }
}

/// A series of columns on a shared [`Axis`] (the axis itself is kept by the owner, which
/// coarsens every series at once).
#[derive(Clone, Debug, Default)]
pub struct Columns<T> {
    /// Column `k` at index `k`; missing trailing columns are empty.
    pub cols: Vec<T>,
}

impl<T: Merge> Columns<T> {
    /// The column `k`, created empty (with those before it) when missing.
    pub fn at(&mut self, k: usize) -> &mut T {
        if self.cols.len() <= k {
            self.cols.resize(k + 1, T::default());
        }
        &mut self.cols[k]
    }

    /// Merges neighbours pairwise: column `k` becomes columns `2k` and `2k + 1`.
    pub fn coarsen(&mut self) {
        let mut merged = Vec::with_capacity(self.cols.len().div_ceil(2));
        for pair in self.cols.chunks(2) {
            let mut c = pair[0].clone();
            if let Some(b) = pair.get(1) {
                c.merge(b);
            }
            merged.push(c);
        }
        self.cols = merged;
    }
}

/// Bins per doubling of a [`LogHistogram`]: 2^(1/32) apart, quantiles within 1.1%.
const BINS_PER_OCTAVE: f64 = 32.0;

/// The smallest time a [`LogHistogram`] tells apart, ns; shorter ones share bin 0.
const HISTOGRAM_FLOOR_NS: f64 = 1_000.0;

/// Counts (and summed values) of times in log-scaled bins: quantiles without the times.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LogHistogram {
    counts: Vec<u32>,
    sums_ns: Vec<u64>,
    total: u64,
}

impl LogHistogram {
    fn bin(ns: u64) -> usize {
        let x = (ns as f64).max(HISTOGRAM_FLOOR_NS) / HISTOGRAM_FLOOR_NS;
        (x.log2() * BINS_PER_OCTAVE) as usize
    }

    fn lower_ns(bin: usize) -> f64 {
        HISTOGRAM_FLOOR_NS * (bin as f64 / BINS_PER_OCTAVE).exp2()
    }

    /// Adds one time, ns.
    pub fn add(&mut self, ns: u64) {
        let b = Self::bin(ns);
        if self.counts.len() <= b {
            self.counts.resize(b + 1, 0);
            self.sums_ns.resize(b + 1, 0);
        }
        self.counts[b] = self.counts[b].saturating_add(1);
        self.sums_ns[b] += ns;
        self.total += 1;
    }

    /// Times added.
    pub fn len(&self) -> u64 {
        self.total
    }

    /// Whether none was added.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// ns, the `q` quantile (0–1): the mean of the times in the bin it falls in; 0 when empty.
    pub fn quantile_ns(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0u64;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += u64::from(c);
            if seen >= rank && c > 0 {
                return self.sums_ns[b] / u64::from(c);
            }
        }
        0
    }

    /// The times at or above `threshold_ns` (their bins, whole): how many, and ns summed.
    pub fn above(&self, threshold_ns: u64) -> (u64, u64) {
        let first = Self::bin(threshold_ns);
        let first = if Self::lower_ns(first) < threshold_ns as f64 {
            first + 1
        } else {
            first
        };
        let mut n = 0u64;
        let mut sum = 0u64;
        for b in first..self.counts.len() {
            n += u64::from(self.counts[b]);
            sum += self.sums_ns[b];
        }
        (n, sum)
    }
}

impl Merge for LogHistogram {
    fn merge(&mut self, other: &Self) {
        if self.counts.len() < other.counts.len() {
            self.counts.resize(other.counts.len(), 0);
            self.sums_ns.resize(other.counts.len(), 0);
        }
        for (b, (&c, &s)) in other.counts.iter().zip(&other.sums_ns).enumerate() {
            self.counts[b] = self.counts[b].saturating_add(c);
            self.sums_ns[b] += s;
        }
        self.total += other.total;
    }
}

/// The slowest iteration seen in a column.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Slowest {
    /// Its rank.
    pub rank: u32,
    /// Its iteration index.
    pub iter: u64,
    /// ns, its wall time.
    pub wall_ns: u64,
    /// ns, when it ended.
    pub end_ns: Nanos,
    /// Its parts.
    pub split: Split,
}

/// The iterations (any rank's) that ended in one column.
#[derive(Clone, Debug, Default)]
pub struct IterationColumn {
    /// Iterations.
    pub iterations: u64,
    /// ns per category, summed over them.
    pub split: Split,
    /// Their wall times.
    pub walls: LogHistogram,
    /// The slowest of them: a checkpoint or an epoch's end stays visible however wide the
    /// column grows.
    pub slowest: Option<Slowest>,
}

impl IterationColumn {
    /// Adds one iteration.
    pub fn add(&mut self, rank: u32, iter: u64, end_ns: Nanos, split: &Split) {
        let wall = split.total();
        self.iterations += 1;
        self.split.add_split(split);
        self.walls.add(wall);
        if self.slowest.is_none_or(|s| wall > s.wall_ns) {
            self.slowest = Some(Slowest {
                rank,
                iter,
                wall_ns: wall,
                end_ns,
                split: *split,
            });
        }
    }
}

impl Merge for IterationColumn {
    fn merge(&mut self, other: &Self) {
        self.iterations += other.iterations;
        self.split.add_split(&other.split);
        self.walls.merge(&other.walls);
        if let Some(o) = other.slowest {
            if self.slowest.is_none_or(|s| o.wall_ns > s.wall_ns) {
                self.slowest = Some(o);
            }
        }
    }
}

/// One rank's iterations that ended in one column: which, and their parts.
#[derive(Clone, Copy, Debug, Default)]
pub struct RankColumn {
    /// Iterations.
    pub iterations: u64,
    /// The first iteration index among them.
    pub first_iter: u64,
    /// The last.
    pub last_iter: u64,
    /// ns per category, summed.
    pub split: Split,
}

impl RankColumn {
    /// Adds one iteration.
    pub fn add(&mut self, iter: u64, split: &Split) {
        if self.iterations == 0 || iter < self.first_iter {
            self.first_iter = iter;
        }
        self.last_iter = self.last_iter.max(iter);
        self.iterations += 1;
        self.split.add_split(split);
    }
}

impl Merge for RankColumn {
    fn merge(&mut self, other: &Self) {
        if other.iterations == 0 {
            return;
        }
        if self.iterations == 0 {
            *self = *other;
            return;
        }
        self.first_iter = self.first_iter.min(other.first_iter);
        self.last_iter = self.last_iter.max(other.last_iter);
        self.iterations += other.iterations;
        self.split.add_split(&other.split);
    }
}

/// The resource quantities a [`ResourceColumn`] keeps, in [`crate::resources::NodeResources`]'
/// order, then the TCP retransmissions of the node's flows (from [`crate::flows::NodeFlows`]).
pub const RESOURCE_FIELDS: usize = 17;

/// One node's resource readings in one column: mean and peak of each quantity.
#[derive(Clone, Copy, Debug, Default)]
pub struct ResourceColumn {
    /// Readings of each quantity.
    pub n: [u32; RESOURCE_FIELDS],
    /// Summed values.
    pub sum: [f64; RESOURCE_FIELDS],
    /// Peak values.
    pub max: [f64; RESOURCE_FIELDS],
}

impl ResourceColumn {
    /// Adds one reading of each quantity that has one.
    pub fn add(&mut self, values: &[Option<f64>; RESOURCE_FIELDS]) {
        for (i, v) in values.iter().enumerate() {
            if let Some(v) = v.filter(|v| v.is_finite()) {
                self.n[i] += 1;
                self.sum[i] += v;
                self.max[i] = if self.n[i] == 1 {
                    v
                } else {
                    self.max[i].max(v)
                };
            }
        }
    }

    /// The mean of quantity `i`, when it was read.
    pub fn mean(&self, i: usize) -> Option<f64> {
        (self.n[i] > 0).then(|| self.sum[i] / f64::from(self.n[i]))
    }
}

impl Merge for ResourceColumn {
    fn merge(&mut self, other: &Self) {
        for i in 0..RESOURCE_FIELDS {
            if other.n[i] == 0 {
                continue;
            }
            self.max[i] = if self.n[i] == 0 {
                other.max[i]
            } else {
                self.max[i].max(other.max[i])
            };
            self.n[i] += other.n[i];
            self.sum[i] += other.sum[i];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_of_the_histogram_are_within_its_resolution() {
        let mut h = LogHistogram::default();
        for ms in 1..=1000u64 {
            h.add(ms * 1_000_000);
        }
        let p50 = h.quantile_ns(0.5) as f64 / 1e6;
        let p95 = h.quantile_ns(0.95) as f64 / 1e6;
        assert!((p50 - 500.0).abs() / 500.0 < 0.02, "{p50}");
        assert!((p95 - 950.0).abs() / 950.0 < 0.02, "{p95}");
        let (n, sum) = h.above(900_000_000);
        assert!((95..=105).contains(&n), "{n}");
        assert!(sum > 90 * 900_000_000, "{sum}");
    }

    #[test]
    fn coarsening_keeps_totals_and_the_slowest_iteration() {
        let mut cols: Columns<IterationColumn> = Columns::default();
        let mut split = Split::default();
        for k in 0..9u64 {
            split.ns[0] = if k == 5 { 5_000_000_000 } else { 10_000_000 };
            cols.at(k as usize).add(0, k, k, &split);
        }
        cols.coarsen();
        assert_eq!(cols.cols.len(), 5);
        assert_eq!(cols.cols.iter().map(|c| c.iterations).sum::<u64>(), 9);
        assert_eq!(cols.cols[2].slowest.map(|s| s.iter), Some(5));
        assert_eq!(cols.cols[2].walls.len(), 2);
    }
}
