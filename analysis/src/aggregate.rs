//! Running aggregates of the attributed iterations: what the end-of-run summary needs, folded
//! in as iterations are attributed, so that the summary of a job that runs for days costs
//! memory bounded by its ranks, not by its length.
//!
//! Everything but the median is a sum and exact. The median iteration time keeps every wall
//! time exactly up to a count ([`EXACT_WALLS_PER_RANK`], less past 256 ranks:
//! [`exact_walls_per_rank`]; [`EXACT_WALLS_JOB`]) — so short runs,
//! experiments and tests read exactly as before — and from then on comes from a log-bucketed
//! histogram whose buckets are at most 1/128 of their lower bound wide: the median it gives is
//! within [`MEDIAN_MAX_RELATIVE_ERROR`] (1/256 ≈ 0.39%) of the exact one.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::attribution::IterationBreakdown;
use crate::category::Split;
use crate::critical::CriticalPath;
use crate::Nanos;

/// Wall times kept exactly per rank before its median comes from the histogram (8 bytes
/// each: 32 KiB per rank at most).
pub const EXACT_WALLS_PER_RANK: usize = 4_096;

/// Wall times kept exactly over every rank together (8 bytes each: 8 MiB at most): past 256
/// ranks each keeps its share ([`exact_walls_per_rank`]). At 10,000 ranks, 4,096 each was
/// 320 MiB, and reading them at each refresh of the live summary (every 10 s) held the
/// collector's job thread 490–525 ms sorted, 56–60 ms in one pass (`bench` below).
pub const EXACT_WALLS_RANKS: usize = 1 << 20;

/// Wall times a rank keeps exactly in a job of `ranks` ranks (seen so far): 4,096 up to 256
/// ranks, then an even share of [`EXACT_WALLS_RANKS`] (104 at 10,000 ranks), at least 16.
pub fn exact_walls_per_rank(ranks: usize) -> usize {
    (EXACT_WALLS_RANKS / ranks.max(1)).clamp(16, EXACT_WALLS_PER_RANK)
}

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
/// Built for a collector's 10,000 ranks, each taking a time 30 times a second and read at
/// every refresh of the live summary:
/// - a time taken touches the end of a list and one bucket of a short sorted list, found
///   from the last time's bucket, not the nodes of a tree (with times that vary, taking one
///   was 9% of a 10,000-rank collector's job thread, 4% now);
/// - the exact median is not sorted out of every time: the histogram says which bucket holds
///   it and how many times lie below, so one pass over the times picks out that bucket's few.
///   Sorting 4,096 times of each of 10,000 ranks took 490–525 ms; the pass, 56–60 ms,
///   which is why a rank of a large job keeps fewer ([`exact_walls_per_rank`]): 104 each at
///   10,000 ranks, then its buckets, 0.2 ms for all.
#[derive(Clone, Debug, Deserialize)]
#[serde(from = "WallMedianForm")]
pub struct WallMedian {
    /// Every time so far, in the order taken, while there are at most `exact_cap`; `None`
    /// after.
    exact: Option<Vec<u64>>,
    exact_cap: usize,
    /// Times per bucket ([`bucket`]), only buckets that were hit, in bucket order.
    histogram: Vec<(u32, u64)>,
    count: u64,
    /// Where in `histogram` the last time taken went: where the next one's bucket is looked
    /// for from. Not part of the value (not compared, not kept in profiles).
    hint: usize,
}

impl PartialEq for WallMedian {
    fn eq(&self, other: &WallMedian) -> bool {
        self.exact == other.exact
            && self.exact_cap == other.exact_cap
            && self.histogram == other.histogram
            && self.count == other.count
    }
}

impl Eq for WallMedian {}

/// [`WallMedian`] as profiles hold it ([`Frame::IterationTotals`](crate::frame::Frame)): the
/// histogram as a map.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct WallMedianForm {
    exact: Option<Vec<u64>>,
    exact_cap: usize,
    histogram: BTreeMap<u32, u64>,
    count: u64,
}

impl From<WallMedianForm> for WallMedian {
    fn from(f: WallMedianForm) -> WallMedian {
        WallMedian {
            exact: f.exact,
            exact_cap: f.exact_cap,
            histogram: f.histogram.into_iter().collect(),
            count: f.count,
            hint: 0,
        }
    }
}

impl Serialize for WallMedian {
    /// As [`WallMedianForm`], without a copy.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        /// The histogram as a map.
        struct Buckets<'a>(&'a [(u32, u64)]);
        impl Serialize for Buckets<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_map(self.0.iter().map(|(b, c)| (b, c)))
            }
        }
        let mut st = s.serialize_struct("WallMedian", 4)?;
        st.serialize_field("exact", &self.exact)?;
        st.serialize_field("exact_cap", &self.exact_cap)?;
        st.serialize_field("histogram", &Buckets(&self.histogram))?;
        st.serialize_field("count", &self.count)?;
        st.end()
    }
}

/// The times of bucket `b`: from the first, up to the second (excluded).
fn bucket_bounds(b: u32) -> (u64, u64) {
    let shift = b >> BUCKET_BITS;
    let m = u64::from(b & ((1 << BUCKET_BITS) - 1));
    (m << shift, (m + 1) << shift)
}

impl WallMedian {
    /// Keeps up to `exact_cap` times exactly.
    pub fn new(exact_cap: usize) -> WallMedian {
        WallMedian {
            exact: Some(Vec::new()),
            exact_cap,
            histogram: Vec::new(),
            count: 0,
            hint: 0,
        }
    }

    /// Takes one time, ns, keeping at most `cap` times exactly from now on (a lower cap than
    /// its own: what a rank's share of [`EXACT_WALLS_RANKS`] shrinks to as ranks join).
    pub fn add_within(&mut self, ns: u64, cap: usize) {
        self.exact_cap = self.exact_cap.min(cap);
        self.add(ns);
    }

    /// Takes one time, ns.
    pub fn add(&mut self, ns: u64) {
        self.count += 1;
        let b = bucket(ns);
        self.hint = match self.position(b) {
            Ok(i) => {
                self.histogram[i].1 += 1;
                i
            }
            Err(i) => {
                self.histogram.insert(i, (b, 1));
                i
            }
        };
        if let Some(exact) = &mut self.exact {
            if exact.len() < self.exact_cap {
                exact.push(ns);
            } else {
                self.exact = None;
            }
        }
    }

    /// Where bucket `b` is in the histogram (`Ok`), or where it goes (`Err`), looked for from
    /// the last time's bucket outwards: a loop's times are alike, so the walk is short and
    /// reads the list in order. (From the list's end it was 6% of a 10,000-rank collector's
    /// job thread; a binary search, whose reads jump, 12%.)
    fn position(&self, b: u32) -> Result<usize, usize> {
        let h = &self.histogram;
        if h.is_empty() {
            return Err(0);
        }
        let mut i = self.hint.min(h.len() - 1);
        if h[i].0 < b {
            // The last bucket at or below `b`.
            while i + 1 < h.len() && h[i + 1].0 <= b {
                i += 1;
            }
            if h[i].0 == b {
                Ok(i)
            } else {
                Err(i + 1)
            }
        } else {
            // The first bucket at or above `b`.
            while i > 0 && h[i - 1].0 >= b {
                i -= 1;
            }
            if h[i].0 == b {
                Ok(i)
            } else {
                Err(i)
            }
        }
    }

    /// Whether [`WallMedian::median`] is exact.
    pub fn is_exact(&self) -> bool {
        self.exact.is_some()
    }

    /// Values held (exact times plus histogram buckets): what its memory grows with.
    pub fn held(&self) -> usize {
        self.exact.as_ref().map_or(0, Vec::len) + self.histogram.len()
    }

    /// The median, ns (the mean of the two middle times of an even count); 0 when empty.
    pub fn median(&self) -> u64 {
        let n = self.count;
        if n == 0 {
            return 0;
        }
        let [low, high] = self.nth_pair(n.saturating_sub(1) / 2, n / 2);
        (low + high) / 2
    }

    /// The `k`-th and `l`-th smallest times (from 0; `l` is `k` or `k + 1`, both below the
    /// count), ns: exact while [`WallMedian::is_exact`], else their buckets' middles.
    fn nth_pair(&self, k: u64, l: u64) -> [u64; 2] {
        // Each one's bucket and the count of times below it.
        let mut found = [None; 2];
        let mut below = 0;
        for &(b, c) in &self.histogram {
            for (slot, rank) in found.iter_mut().zip([k, l]) {
                if slot.is_none() && rank < below + c {
                    *slot = Some((b, below));
                }
            }
            if found[1].is_some() {
                break;
            }
            below += c;
        }
        let (Some((kb, k_below)), Some((lb, _))) = (found[0], found[1]) else {
            return [0, 0];
        };
        let Some(exact) = &self.exact else {
            return [bucket_value(kb), bucket_value(lb)];
        };
        // Every time is in the histogram too, and no time lies between the two ranks: the
        // times from the first bucket's start to the second's end are ranks `k_below` on, in
        // some order.
        let (lo, hi) = (bucket_bounds(kb).0, bucket_bounds(lb).1);
        let mut here: Vec<u64> = exact
            .iter()
            .copied()
            .filter(|t| (lo..hi).contains(t))
            .collect();
        let (i, j) = ((k - k_below) as usize, (l - k_below) as usize);
        if j >= here.len() {
            // A profile's histogram and times that disagree.
            return [bucket_value(kb), bucket_value(lb)];
        }
        let (_, &mut at_j, _) = here.select_nth_unstable(j);
        let at_i = if i == j {
            at_j
        } else {
            *here[..j].iter().max().unwrap_or(&at_j)
        };
        [at_i, at_j]
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
        self.nth_pair(k, k)[0]
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
        self.add_within(b, usize::MAX);
    }

    /// Counts one iteration, keeping at most `exact_cap` wall times exactly from now on
    /// ([`WallMedian::add_within`]).
    pub fn add_within(&mut self, b: &IterationBreakdown, exact_cap: usize) {
        self.iterations += 1;
        self.split.add_split(&b.split);
        self.marked_ns += b.coverage.marked_ns;
        self.sampled_ns += b.coverage.sampled_ns;
        self.walls.add_within(b.wall_ns(), exact_cap);
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
            rank.add_within(b, exact_walls_per_rank(self.rank_ids.len()));
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
    fn the_buckets_stay_in_order_whichever_way_the_times_move() {
        let mut m = WallMedian::new(0);
        let mut counts = BTreeMap::new();
        // Up and down from the last time, far and near, below the first bucket and above
        // the last, repeats among them.
        let times =
            scrambled(500)
                .into_iter()
                .chain([1, 90_000_000, 2, 30_000_000, 1, 120_000_000, 0]);
        for ns in times {
            m.add(ns);
            *counts.entry(bucket(ns)).or_insert(0u64) += 1;
            let expected: Vec<(u32, u64)> = counts.iter().map(|(b, c)| (*b, *c)).collect();
            assert_eq!(m.histogram, expected, "after {ns}");
        }
    }

    #[test]
    fn a_median_read_back_from_a_profile_goes_on_as_the_one_written() {
        let mut m = WallMedian::new(EXACT_WALLS_PER_RANK);
        scrambled(301).into_iter().for_each(|ns| m.add(ns));
        let bytes = postcard::to_allocvec(&m).unwrap();
        let mut back: WallMedian = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back, m);
        for ns in [1, 2, 3, 90_000_000] {
            m.add(ns);
            back.add(ns);
            assert_eq!(back.median(), m.median());
        }
        // The bytes are those of the form profiles held before: the histogram as a map.
        let mut histogram = BTreeMap::new();
        for ns in scrambled(301) {
            *histogram.entry(bucket(ns)).or_default() += 1;
        }
        let before = WallMedianForm {
            exact: Some(scrambled(301)),
            exact_cap: EXACT_WALLS_PER_RANK,
            histogram,
            count: 301,
        };
        assert_eq!(postcard::to_allocvec(&before).unwrap(), bytes);
    }

    #[test]
    fn a_large_jobs_ranks_share_the_exact_times() {
        assert_eq!(exact_walls_per_rank(8), EXACT_WALLS_PER_RANK);
        assert_eq!(exact_walls_per_rank(256), EXACT_WALLS_PER_RANK);
        assert_eq!(exact_walls_per_rank(10_000), 104);
        assert_eq!(exact_walls_per_rank(1_000_000), 16);
        // 120 iterations of each of 10,000 ranks: each keeps 104 times exactly, then reads
        // its median from the buckets, within the bound.
        let mut s = RunningSummary::default();
        let wall = |rank: u32, iter: u64| {
            30_000_000 + (u64::from(rank) * 31 + iter * 7_919) % 1_013 * 1_000
        };
        for iter in 0..120u64 {
            for rank in 0..10_000u32 {
                let b = IterationBreakdown {
                    rank,
                    pid: rank,
                    iter,
                    start_ns: iter * 40_000_000,
                    end_ns: iter * 40_000_000 + wall(rank, iter),
                    split: Split::default(),
                    evidence: Vec::new(),
                    coverage: crate::attribution::Coverage::default(),
                };
                s.add(&b, 0);
            }
        }
        let t = &s.ranks[&(17, 17)];
        assert!(!t.walls.is_exact());
        assert!(
            s.held() < 10_000 * (104 + 32) + EXACT_WALLS_JOB,
            "{} held",
            s.held()
        );
        let mut walls: Vec<u64> = (0..120).map(|iter| wall(17, iter)).collect();
        walls.sort_unstable();
        let exact = (walls[59] + walls[60]) / 2;
        let err = (t.walls.median() as f64 - exact as f64).abs() / exact as f64;
        assert!(
            err <= MEDIAN_MAX_RELATIVE_ERROR,
            "{} vs {exact}",
            t.walls.median()
        );
    }

    #[test]
    fn past_the_exact_count_the_quantiles_come_from_the_buckets() {
        let mut m = WallMedian::new(100);
        let times = scrambled(5_000);
        times.iter().for_each(|ns| m.add(*ns));
        assert!(!m.is_exact());
        let mut sorted = times.clone();
        sorted.sort_unstable();
        for q in [0.05, 0.5, 0.95] {
            let k = ((q * 5_000.0_f64).ceil() as usize).clamp(1, 5_000) - 1;
            let err = (m.quantile(q) as f64 - sorted[k] as f64).abs() / sorted[k] as f64;
            assert!(
                err <= MEDIAN_MAX_RELATIVE_ERROR,
                "q {q}: {} vs {}",
                m.quantile(q),
                sorted[k]
            );
        }
    }
}

/// What reading every rank's median costs at a live refresh of a 10,000-rank job: a
/// benchmark, not a test (it asserts nothing; docs/BENCHMARKS.md has its figures). Run it with
/// `cargo test --release -p stallscope-analysis --lib medians_of_10000_ranks -- --ignored
/// --nocapture`.
#[cfg(test)]
mod bench {
    use super::*;

    /// A wall time of about 33 ms that varies by 3 ms, as a hash of the rank and iteration.
    fn wall(rank: u64, iter: u64) -> u64 {
        let x = (rank << 32 ^ iter).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        33_000_000 + (x >> 40) % 3_000_000
    }

    fn time_medians(label: &str, ranks: &[WallMedian]) {
        let t = std::time::Instant::now();
        let sum: u64 = ranks.iter().map(WallMedian::median).sum();
        eprintln!(
            "{label}: {} medians in {:.1} ms ({} values held; checksum {sum})",
            ranks.len(),
            t.elapsed().as_secs_f64() * 1e3,
            ranks.iter().map(WallMedian::held).sum::<usize>()
        );
    }

    #[test]
    #[ignore]
    fn medians_of_10000_ranks() {
        for (label, cap) in [
            (
                "4,096 exact times per rank (the cap up to 256 ranks)",
                EXACT_WALLS_PER_RANK,
            ),
            ("the 10,000-rank share", exact_walls_per_rank(10_000)),
        ] {
            let mut ranks: Vec<WallMedian> = (0..10_000).map(|_| WallMedian::new(cap)).collect();
            let t = std::time::Instant::now();
            for iter in 0..4_096 {
                for (rank, m) in ranks.iter_mut().enumerate() {
                    m.add(wall(rank as u64, iter));
                }
            }
            let per_add = t.elapsed().as_secs_f64() * 1e9 / (4_096.0 * 10_000.0);
            eprintln!("{label}: {per_add:.1} ns per time taken, ranks in turn");
            for _ in 0..3 {
                time_medians(label, &ranks);
            }
        }
    }
}
