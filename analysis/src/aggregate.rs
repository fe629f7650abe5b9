//! Running aggregates of the attributed iterations: what the end-of-run summary needs, folded
//! in as iterations are attributed, so that the summary of a job that runs for days costs
//! memory bounded by its ranks, not by its length.
//!
//! Everything but the median is a sum and exact. The median iteration time keeps every wall
//! time exactly up to a count ([`EXACT_WALLS_PER_RANK`], [`EXACT_WALLS_JOB`]) — so short runs,
//! experiments and tests read exactly as before — and from then on comes from a log-bucketed
//! histogram whose buckets are at most 1/128 of their lower bound wide: the median it gives is
//! within [`MEDIAN_MAX_RELATIVE_ERROR`] (1/256 ≈ 0.39%) of the exact one.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use serde::{Deserialize, Serialize};

use crate::attribution::IterationBreakdown;
use crate::category::Split;
use crate::critical::CriticalPath;
use crate::Nanos;

/// Wall times kept exactly per rank before its median comes from the histogram (8 bytes
/// each: 32 KiB per rank at most).
pub const EXACT_WALLS_PER_RANK: usize = 4_096;

/// Wall times kept exactly for the job (all ranks together) before its median comes from the
/// histogram (8 bytes each: 512 KiB at most).
pub const EXACT_WALLS_JOB: usize = 65_536;

/// Largest relative error of a median read from the histogram, as a fraction of the exact
/// median: half a bucket's width over its lower bound, 1/256.
pub const MEDIAN_MAX_RELATIVE_ERROR: f64 = 1.0 / 256.0;

/// Significant bits a histogram bucket keeps of a wall time (the leading one included): a
/// bucket spans `[m·2^s, (m+1)·2^s)` with `m` in 128..256, so it is at most 1/128 of its
/// lower bound wide. Times below 256 ns get a bucket each (exact).
const BUCKET_BITS: u32 = 8;

/// The histogram bucket of `ns`: `shift << 8 | mantissa`.
fn bucket(ns: u64) -> u32 {
    let bits = u64::BITS - ns.leading_zeros();
    let shift = bits.saturating_sub(BUCKET_BITS);
    (shift << BUCKET_BITS) | (ns >> shift) as u32
}

/// The value that stands for bucket `b`, ns: its middle (its only value below 256 ns).
fn bucket_value(b: u32) -> u64 {
    let shift = b >> BUCKET_BITS;
    let m = u64::from(b & ((1 << BUCKET_BITS) - 1));
    let lo = m << shift;
    lo + ((1u64 << shift) >> 1)
}

/// The median of a stream of wall times, ns: exact up to a count, then approximate within
/// [`MEDIAN_MAX_RELATIVE_ERROR`].
///
/// The exact times are held as two heaps, the lower half's largest on top of one and the upper
/// half's smallest on top of the other, so the median is read without sorting: a live model
/// reads every rank's median at each refresh of its summary, and sorting 4,096 times of each of
/// 10,000 ranks took 530 ms of the collector's job thread (times that vary as real iterations
/// do), while records waited. A time taken costs a push onto a heap of at most 2,048.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(from = "WallMedianForm", into = "WallMedianForm")]
pub struct WallMedian {
    /// Every time so far, while there are at most `exact_cap`; `None` after.
    exact: Option<Halves>,
    exact_cap: usize,
    /// Times per bucket ([`bucket`]), only buckets that were hit.
    histogram: BTreeMap<u32, u64>,
    count: u64,
}

/// The exact times, split at the median: `lower` holds the smaller half (one more when the
/// count is odd), `upper` the larger.
#[derive(Clone, Debug, Default)]
struct Halves {
    /// Its largest on top.
    lower: BinaryHeap<u64>,
    /// Its smallest on top.
    upper: BinaryHeap<Reverse<u64>>,
}

impl Halves {
    fn of(mut times: Vec<u64>) -> Halves {
        times.sort_unstable();
        let upper = times.split_off(times.len().div_ceil(2));
        Halves {
            lower: BinaryHeap::from(times),
            upper: upper.into_iter().map(Reverse).collect(),
        }
    }

    fn len(&self) -> usize {
        self.lower.len() + self.upper.len()
    }

    fn push(&mut self, ns: u64) {
        if self.lower.peek().is_none_or(|top| ns <= *top) {
            self.lower.push(ns);
        } else {
            self.upper.push(Reverse(ns));
        }
        if self.lower.len() > self.upper.len() + 1 {
            let top = self.lower.pop().expect("the lower half is not empty");
            self.upper.push(Reverse(top));
        } else if self.upper.len() > self.lower.len() {
            let Reverse(bottom) = self.upper.pop().expect("the upper half is not empty");
            self.lower.push(bottom);
        }
    }

    /// The mean of the two middle times of an even count, the middle one of an odd count.
    fn median(&self) -> Option<u64> {
        let low = *self.lower.peek()?;
        Some(if self.lower.len() > self.upper.len() {
            low
        } else {
            let Reverse(high) = *self.upper.peek()?;
            (low + high) / 2
        })
    }

    fn sorted(&self) -> Vec<u64> {
        let mut all: Vec<u64> = self.lower.iter().copied().collect();
        all.extend(self.upper.iter().map(|r| r.0));
        all.sort_unstable();
        all
    }
}

/// [`WallMedian`] as profiles hold it ([`Frame::IterationTotals`](crate::frame::Frame)): the
/// exact times as one list, in no particular order.
#[derive(Clone, Serialize, Deserialize)]
struct WallMedianForm {
    exact: Option<Vec<u64>>,
    exact_cap: usize,
    histogram: BTreeMap<u32, u64>,
    count: u64,
}

impl From<WallMedianForm> for WallMedian {
    fn from(f: WallMedianForm) -> WallMedian {
        WallMedian {
            exact: f.exact.map(Halves::of),
            exact_cap: f.exact_cap,
            histogram: f.histogram,
            count: f.count,
        }
    }
}

impl From<WallMedian> for WallMedianForm {
    fn from(m: WallMedian) -> WallMedianForm {
        WallMedianForm {
            exact: m.exact.map(|h| {
                let mut all = h.lower.into_vec();
                all.extend(h.upper.into_iter().map(|r| r.0));
                all
            }),
            exact_cap: m.exact_cap,
            histogram: m.histogram,
            count: m.count,
        }
    }
}

impl PartialEq for WallMedian {
    /// The same times (in any order) and the same histogram.
    fn eq(&self, other: &WallMedian) -> bool {
        self.count == other.count
            && self.exact_cap == other.exact_cap
            && self.histogram == other.histogram
            && self.exact.as_ref().map(Halves::sorted) == other.exact.as_ref().map(Halves::sorted)
    }
}

impl Eq for WallMedian {}

impl WallMedian {
    /// Keeps up to `exact_cap` times exactly.
    pub fn new(exact_cap: usize) -> WallMedian {
        WallMedian {
            exact: Some(Halves::default()),
            exact_cap,
            histogram: BTreeMap::new(),
            count: 0,
        }
    }

    /// Takes one time, ns.
    pub fn add(&mut self, ns: u64) {
        self.count += 1;
        *self.histogram.entry(bucket(ns)).or_default() += 1;
        if let Some(exact) = &mut self.exact {
            if exact.len() < self.exact_cap {
                exact.push(ns);
            } else {
                self.exact = None;
            }
        }
    }

    /// Whether [`WallMedian::median`] is exact.
    pub fn is_exact(&self) -> bool {
        self.exact.is_some()
    }

    /// Values held (exact times plus histogram buckets): what its memory grows with.
    pub fn held(&self) -> usize {
        self.exact.as_ref().map_or(0, Halves::len) + self.histogram.len()
    }

    /// The median, ns (the mean of the two middle times of an even count); 0 when empty.
    pub fn median(&self) -> u64 {
        let n = self.count;
        if n == 0 {
            return 0;
        }
        if let Some(exact) = &self.exact {
            return exact.median().unwrap_or(0);
        }
        let nth = |k: u64| {
            let mut seen = 0;
            for (b, c) in &self.histogram {
                seen += c;
                if seen > k {
                    return bucket_value(*b);
                }
            }
            0
        };
        if n % 2 == 1 {
            nth(n / 2)
        } else {
            (nth(n / 2 - 1) + nth(n / 2)) / 2
        }
    }
}

impl WallMedian {
    /// The `q` quantile (0–1) by nearest rank, ns; 0 when empty. Exact while
    /// [`WallMedian::is_exact`], else within [`MEDIAN_MAX_RELATIVE_ERROR`].
    pub fn quantile(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let k = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).clamp(1, self.count) - 1;
        if let Some(exact) = &self.exact {
            return exact.sorted()[k as usize];
        }
        let mut seen = 0;
        for (b, c) in &self.histogram {
            seen += c;
            if seen > k {
                return bucket_value(*b);
            }
        }
        0
    }
}

/// Sums over a set of counted iterations.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    /// Iterations counted.
    pub iterations: u64,
    /// ns per category, summed.
    pub split: Split,
    /// ns inside marked phases, summed.
    pub marked_ns: u64,
    /// ns covered by sample ticks, summed.
    pub sampled_ns: u64,
    /// Their wall times, for the median.
    pub walls: WallMedian,
}

impl Totals {
    /// Empty, keeping up to `exact_cap` wall times exactly.
    pub fn new(exact_cap: usize) -> Totals {
        Totals {
            iterations: 0,
            split: Split::default(),
            marked_ns: 0,
            sampled_ns: 0,
            walls: WallMedian::new(exact_cap),
        }
    }

    /// Counts one iteration.
    pub fn add(&mut self, b: &IterationBreakdown) {
        self.iterations += 1;
        self.split.add_split(&b.split);
        self.marked_ns += b.coverage.marked_ns;
        self.sampled_ns += b.coverage.sampled_ns;
        self.walls.add(b.wall_ns());
    }
}

/// What the summary needs of every iteration attributed so far.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunningSummary {
    /// Per (rank, pid): its counted (post-warm-up) iterations. A rank with only warm-up
    /// iterations so far is here with none counted.
    pub ranks: BTreeMap<(u32, u32), Totals>,
    /// All ranks' counted iterations together.
    pub job: Totals,
    /// ns, the latest end of any iteration attributed (warm-up included).
    pub last_end_ns: Option<Nanos>,
    /// The counted iterations' critical path: what the finding reads.
    pub critical: CriticalPath,
    /// The ranks seen (a restarted rank has a new pid, not a new rank).
    rank_ids: BTreeSet<u32>,
}

impl Default for RunningSummary {
    fn default() -> RunningSummary {
        RunningSummary {
            ranks: BTreeMap::new(),
            job: Totals::new(EXACT_WALLS_JOB),
            last_end_ns: None,
            critical: CriticalPath::default(),
            rank_ids: BTreeSet::new(),
        }
    }
}

impl RunningSummary {
    /// Takes one attributed iteration; those below `warmup` (iterations per rank) are seen but
    /// not counted.
    pub fn add(&mut self, b: &IterationBreakdown, warmup: u64) {
        self.last_end_ns = Some(self.last_end_ns.map_or(b.end_ns, |t| t.max(b.end_ns)));
        // A loop seen before has its rank in `rank_ids` already: one look-up in a tree of
        // 10,000 ranks per iteration, not two.
        let rank = match self.ranks.entry((b.rank, b.pid)) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => {
                self.rank_ids.insert(b.rank);
                e.insert(Totals::new(EXACT_WALLS_PER_RANK))
            }
        };
        if b.iter >= warmup {
            rank.add(b);
            self.job.add(b);
            self.critical
                .add(b.iter, b.end_ns, &b.split, self.rank_ids.len());
        }
    }

    /// Values held (exact wall times and histogram buckets) over all ranks and the job.
    pub fn held(&self) -> usize {
        self.job.walls.held() + self.ranks.values().map(|t| t.walls.held()).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_stands_for_its_times_within_the_bound() {
        for ns in (0..2_000_000u64)
            .step_by(7)
            .chain([u64::MAX / 3, 1 << 40, (1 << 40) - 1])
        {
            let v = bucket_value(bucket(ns));
            let err = (v as f64 - ns as f64).abs() / (ns as f64).max(1.0);
            assert!(err <= MEDIAN_MAX_RELATIVE_ERROR, "{ns} → {v}");
        }
        assert_eq!(bucket_value(bucket(255)), 255, "small times are exact");
    }

    #[test]
    fn the_median_is_exact_then_within_the_bound() {
        let mut m = WallMedian::new(10);
        for ns in [5, 1, 4, 2] {
            m.add(ns);
        }
        assert_eq!(m.median(), 3);
        let mut m = WallMedian::new(10);
        // 1001 times from 1.000 ms to 2.000 ms: the median is 1.5 ms.
        for k in 0..=1000u64 {
            m.add(1_000_000 + k * 1_000);
        }
        assert!(!m.is_exact());
        let err = (m.median() as f64 - 1.5e6).abs() / 1.5e6;
        assert!(err <= MEDIAN_MAX_RELATIVE_ERROR, "{}", m.median());
    }

    /// Times in a scrambled order, repeats among them.
    fn scrambled(n: u64) -> Vec<u64> {
        (0..n)
            .map(|k| 30_000_000 + (k * 7_919) % 1_013 * 1_000)
            .collect()
    }

    #[test]
    fn the_exact_median_and_quantiles_are_those_of_the_sorted_times_at_every_count() {
        let mut m = WallMedian::new(EXACT_WALLS_PER_RANK);
        let mut all = Vec::new();
        for ns in scrambled(600) {
            m.add(ns);
            all.push(ns);
            let mut sorted = all.clone();
            sorted.sort_unstable();
            let n = sorted.len();
            let median = if n % 2 == 1 {
                sorted[n / 2]
            } else {
                (sorted[n / 2 - 1] + sorted[n / 2]) / 2
            };
            assert_eq!(m.median(), median, "after {n} times");
            let k = ((0.95 * n as f64).ceil() as usize).clamp(1, n) - 1;
            assert_eq!(m.quantile(0.95), sorted[k], "after {n} times");
        }
        assert_eq!(m.held(), 600 + m.histogram.len());
    }

    #[test]
    fn a_median_read_back_from_a_profile_goes_on_as_the_one_written() {
        let mut m = WallMedian::new(EXACT_WALLS_PER_RANK);
        scrambled(301).into_iter().for_each(|ns| m.add(ns));
        let mut back: WallMedian =
            postcard::from_bytes(&postcard::to_allocvec(&m).unwrap()).unwrap();
        assert_eq!(back, m);
        assert_eq!(back.median(), m.median());
        for ns in [1, 2, 3, 90_000_000] {
            m.add(ns);
            back.add(ns);
            assert_eq!(back.median(), m.median());
        }
        // The form profiles held before: the same fields, the times in the order taken.
        let form = WallMedianForm {
            exact: Some(scrambled(301)),
            exact_cap: EXACT_WALLS_PER_RANK,
            histogram: BTreeMap::new(),
            count: 301,
        };
        let old: WallMedian = postcard::from_bytes(&postcard::to_allocvec(&form).unwrap()).unwrap();
        let mut sorted = scrambled(301);
        sorted.sort_unstable();
        assert_eq!(old.median(), sorted[150]);
    }
}
#[cfg(test)]
mod tmp_bench {
    #[test]
    #[ignore]
    fn tmp_median_cost() {
        for round in 0..3 {
            let mut ms: Vec<super::WallMedian> = (0..10_000)
                .map(|_| super::WallMedian::new(super::EXACT_WALLS_PER_RANK))
                .collect();
            let mut x: u64 = 12345;
            let t = std::time::Instant::now();
            for m in ms.iter_mut() {
                for _ in 0..4096 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    m.add(33_000_000 + (x >> 40) % 3_000_000);
                }
            }
            let adds = t.elapsed();
            let t = std::time::Instant::now();
            let s: u64 = ms.iter().map(|m| m.median()).sum();
            eprintln!("TMP round {round}: 40.96M adds {:?} ({:.1} ns/add); 10000 medians of 4096 jittered: {:?} ({s})", adds, adds.as_nanos() as f64 / 40.96e6, t.elapsed());
        }
    }
}
