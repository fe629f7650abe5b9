//! What one configuration's profile says that the experiment needs: the wall time of each
//! iteration, and the inputs of the what-if model (batch, loader CPU, dataset size); the
//! advisor reads a profile through it too.
//!
//! A fold ([`RunFactsFold`]): frames go in one at a time, as the profile reader gives them,
//! and what is kept does not grow with the run (per iteration, only the last
//! [`crate::critical::PENDING`] awaiting their last rank; the iteration times as running
//! totals and a median that is exact up to 65,536 iterations), so `advise` and the report's
//! advice read a profile of any size. A thinned profile (a fast loop's, whose per-iteration
//! detail is kept at a bounded rate) gives its counts, mean, median and critical path from
//! the live run's exact totals ([`Frame::IterationTotals`]), not from the sample it kept.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::aggregate::{WallMedian, EXACT_WALLS_JOB};

use crate::attribution::IterationBreakdown;
use crate::category::Split;
use crate::critical::CriticalPath;
use crate::frame::{Frame, IterationTotals, Role};
use crate::loops::ProcessMeta;
use crate::marker::MarkerEvent;
use crate::secs;
use crate::series::names;

/// Facts of one run, read from its frames.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunFacts {
    /// s, per counted iteration index (warm-up left out), the mean wall time over ranks: the
    /// first [`EXACT_WALLS_JOB`] (an experiment's configurations run a few dozen).
    pub iteration_seconds: Vec<f64>,
    /// Counted iterations (warm-up left out), all of them.
    pub iterations_counted: u64,
    /// s, the mean of the counted iterations' times (each the mean over ranks).
    pub mean_iteration_seconds: f64,
    /// s, their median (exact up to [`EXACT_WALLS_JOB`] iterations, then within 0.39%).
    pub median_iteration_seconds: f64,
    /// Ranks that completed iterations.
    pub ranks: u32,
    /// Iterations each rank completed, warm-up included (the largest over ranks).
    pub iterations_total: u64,
    /// Per-process batch size, as the hook reported it.
    pub batch_size: Option<u64>,
    /// DataLoader workers per process, as the hook reported it.
    pub workers: Option<u32>,
    /// Samples in the dataset (`len(dataset)`), as the hook reported it.
    pub dataset_samples: Option<u64>,
    /// CPU seconds used by all data-loader worker processes over their lives, when any ran.
    pub loader_cpu_seconds: Option<f64>,
    /// bytes the data-loader worker processes caused to be read from storage over their lives
    /// (`/proc/PID/io` read_bytes: page-cache hits are not counted), when any ran.
    pub loader_read_bytes: Option<u64>,
    /// Logical CPUs of the node.
    pub cpus: u32,
    /// The job's critical path: for each counted iteration, the breakdown of the rank that
    /// waited least for its peers (the one the others waited for), summed. This is what the
    /// job's iteration time is made of, so it is what a difference of iteration times
    /// measures: a data stall on one rank shows here as that stall, not as the other ranks'
    /// `peer_wait`.
    pub critical_path: Split,
}

impl RunFacts {
    /// Batches the loaders prepared per rank: the iterations plus what they had prefetched
    /// when the run ended (PyTorch's default `prefetch_factor` of 2 per worker).
    pub fn batches_prepared_per_rank(&self) -> u64 {
        self.iterations_total + 2 * self.workers.unwrap_or(0) as u64
    }
}

/// Reads the facts from a run's frames; iterations below `warmup` are left out of the times.
pub fn run_facts(frames: &[Frame], warmup: u32) -> RunFacts {
    let mut fold = RunFactsFold::new(warmup);
    frames.iter().for_each(|f| fold.ingest(f));
    fold.finish()
}

/// The iterations of one kind of record (the run's own `Breakdown`s, or the ones a job
/// profile's agents shipped): a collector's job profile has no `Breakdown` of its own, so
/// its ranks' iterations are the shipped ones, used only where no `Breakdown` was seen.
#[derive(Debug, Default)]
struct Iterations {
    seen: bool,
    ranks: HashSet<u32>,
    iterations_total: u64,
    /// Per counted iteration still awaiting ranks: (s summed over ranks, ranks).
    pending: BTreeMap<u64, (f64, u32)>,
    /// The first [`EXACT_WALLS_JOB`] counted iterations' mean times, s.
    first: Vec<f64>,
    counted: u64,
    sum_seconds: f64,
    median: Option<WallMedian>,
    /// The one critical-path rule (`crate::critical`): the rank that waited least, ties to
    /// the one that finished last. The rank count is not known until the end, so iterations
    /// are taken as they stand (all ranks have long reported one 4,096 iterations back).
    critical: CriticalPath,
}

impl Iterations {
    fn add(&mut self, b: &IterationBreakdown, warmup: u32) {
        self.seen = true;
        self.ranks.insert(b.rank);
        self.iterations_total = self.iterations_total.max(b.iter + 1);
        if b.iter < warmup as u64 {
            return;
        }
        let p = self.pending.entry(b.iter).or_default();
        p.0 += secs(b.wall_ns());
        p.1 += 1;
        self.critical.add(b.iter, b.end_ns, &b.split, usize::MAX);
        while self.pending.len() > crate::critical::PENDING {
            if let Some((_, done)) = self.pending.pop_first() {
                self.close(done);
            }
        }
    }

    fn close(&mut self, (sum, n): (f64, u32)) {
        let mean = sum / f64::from(n.max(1));
        if self.first.len() < EXACT_WALLS_JOB {
            self.first.push(mean);
        }
        self.counted += 1;
        self.sum_seconds += mean;
        self.median
            .get_or_insert_with(|| WallMedian::new(EXACT_WALLS_JOB))
            .add((mean * 1e9).round() as u64);
    }

    /// As [`Iterations::finish`], for a thinned profile: the counts, mean, median and critical
    /// path are the live run's totals `t` (exact, where the kept iterations are a sample),
    /// and `after` the iterations written after them (a profile cut before its last totals).
    fn finish_with_totals(self, facts: &mut RunFacts, t: &IterationTotals, after: Iterations) {
        self.finish(facts);
        let mut later = RunFacts::default();
        after.finish(&mut later);
        let job = &t.totals.job;
        let per_rank = t.totals.ranks.values().map(|r| r.iterations).max();
        facts.iterations_counted = per_rank.unwrap_or(0) + later.iterations_counted;
        let ranks = f64::from(facts.ranks.max(1));
        let later_rank_iterations = later.iterations_counted as f64 * ranks;
        let rank_iterations = job.iterations as f64 + later_rank_iterations;
        if rank_iterations > 0.0 {
            facts.mean_iteration_seconds = (secs(job.split.total())
                + later.mean_iteration_seconds * later_rank_iterations)
                / rank_iterations;
        }
        if job.iterations > 0 {
            facts.median_iteration_seconds = secs(job.walls.median());
        }
        let mut critical = t.totals.critical.totals().0;
        critical.add_split(&later.critical_path);
        facts.critical_path = critical;
        let progress = t.progress.iter().map(|(_, next)| *next).max();
        facts.iterations_total = facts.iterations_total.max(progress.unwrap_or(0));
    }

    fn finish(mut self, facts: &mut RunFacts) {
        for done in std::mem::take(&mut self.pending).into_values() {
            self.close(done);
        }
        facts.ranks = self.ranks.len() as u32;
        facts.iterations_total = self.iterations_total;
        facts.iterations_counted = self.counted;
        if self.counted > 0 {
            facts.mean_iteration_seconds = self.sum_seconds / self.counted as f64;
        }
        facts.median_iteration_seconds = self.median.map_or(0.0, |m| m.median() as f64 / 1e9);
        facts.iteration_seconds = self.first;
        facts.critical_path = self.critical.totals().0;
    }
}

/// The facts of a run, read one frame at a time ([`RunFactsFold::ingest`]) in bounded memory.
#[derive(Debug, Default)]
pub struct RunFactsFold {
    warmup: u32,
    cpus: u32,
    /// The run's own attributed iterations (a thinned profile's: those kept).
    own: Iterations,
    /// A thinned profile's latest live totals ([`Frame::IterationTotals`]).
    totals: Option<Box<IterationTotals>>,
    /// The run's own iterations written after those totals.
    after_totals: Iterations,
    /// The iterations a job profile's agents shipped.
    shipped: Iterations,
    loaders: HashSet<u32>,
    cpu_series: HashMap<u32, u32>,  // series id → pid
    cpu_max: HashMap<u32, u64>,     // pid → ns
    read_series: HashMap<u32, u32>, // series id → pid
    read_max: HashMap<u32, u64>,    // pid → bytes
    /// The hook's facts, through the one parser (`ProcessMeta`); the latest said wins.
    meta: ProcessMeta,
}

impl RunFactsFold {
    /// A fold leaving the first `warmup` iterations of each rank out of the times.
    pub fn new(warmup: u32) -> RunFactsFold {
        RunFactsFold {
            warmup,
            ..RunFactsFold::default()
        }
    }

    /// Sets the warm-up (before the first iteration arrives: a reader that learns it from
    /// the profile's header).
    pub fn set_warmup(&mut self, warmup: u32) {
        self.warmup = warmup;
    }

    /// Takes the profile's next frame.
    pub fn ingest(&mut self, frame: &Frame) {
        match frame {
            Frame::Breakdown(b) => {
                self.own.add(b, self.warmup);
                if self.totals.is_some() {
                    self.after_totals.add(b, self.warmup);
                }
            }
            Frame::IterationTotals(t) => {
                self.totals = Some(t.clone());
                self.after_totals = Iterations::default();
            }
            Frame::Header(h) => self.cpus = h.cpus,
            Frame::Process(p) if p.role == Role::Loader => {
                self.loaders.insert(p.pid);
            }
            Frame::Series(d) if d.name == names::PROC_ALL_CPU_NS => {
                if let Some(pid) = d.label("pid").and_then(|p| p.parse().ok()) {
                    self.cpu_series.insert(d.id.0, pid);
                }
            }
            Frame::Series(d) if d.name == names::PROC_READ_BYTES => {
                if let Some(pid) = d.label("pid").and_then(|p| p.parse().ok()) {
                    self.read_series.insert(d.id.0, pid);
                }
            }
            Frame::Samples(batch) => {
                for (id, v) in &batch.values {
                    if let Some(pid) = self.cpu_series.get(&id.0) {
                        let max = self.cpu_max.entry(*pid).or_default();
                        *max = (*max).max(*v);
                    }
                    if let Some(pid) = self.read_series.get(&id.0) {
                        let max = self.read_max.entry(*pid).or_default();
                        *max = (*max).max(*v);
                    }
                }
            }
            Frame::Markers(markers) => {
                for m in markers {
                    if let MarkerEvent::Meta(kv) = &m.event {
                        for (k, v) in kv {
                            self.meta.set(k, v);
                        }
                    }
                }
            }
            Frame::NodeMeta(node_meta) => {
                for (k, v) in &node_meta.fields {
                    self.meta.set(k, v);
                }
            }
            _ => {
                if let Some(it) = frame.node_iteration() {
                    self.shipped.add(&it.breakdown, self.warmup);
                }
            }
        }
    }

    /// The facts.
    pub fn finish(self) -> RunFacts {
        let mut facts = RunFacts {
            cpus: self.cpus,
            batch_size: self.meta.batch_size,
            workers: self.meta.workers,
            dataset_samples: self.meta.dataset_samples,
            ..RunFacts::default()
        };
        if self.own.seen {
            match &self.totals {
                Some(t) => self
                    .own
                    .finish_with_totals(&mut facts, t, self.after_totals),
                None => self.own.finish(&mut facts),
            }
        } else {
            self.shipped.finish(&mut facts);
        }
        if !self.loaders.is_empty() {
            let ns: u64 = self
                .loaders
                .iter()
                .filter_map(|pid| self.cpu_max.get(pid))
                .sum();
            if ns > 0 {
                facts.loader_cpu_seconds = Some(secs(ns));
            }
            let read: Vec<u64> = self
                .loaders
                .iter()
                .filter_map(|pid| self.read_max.get(pid))
                .copied()
                .collect();
            if !read.is_empty() {
                facts.loader_read_bytes = Some(read.iter().sum());
            }
        }
        facts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribution::{Coverage, IterationBreakdown};
    use crate::category::Category;

    fn breakdown(rank: u32, iter: u64, end_ns: u64, part: Category) -> Frame {
        let mut split = Split::default();
        split.add(Category::Compute, 60);
        split.add(part, 40);
        Frame::Breakdown(IterationBreakdown {
            rank,
            pid: 100 + rank,
            iter,
            start_ns: end_ns - 100,
            end_ns,
            split,
            evidence: Vec::new(),
            coverage: Coverage::default(),
        })
    }

    /// Issue 30: the experiment read the critical path by a rule of its own that broke ties
    /// the other way (the first rank read, where the summary takes the one that finished
    /// last). With no peer wait on either rank, the rank that finished last held the
    /// iteration up, as the summary and the report say.
    #[test]
    fn the_critical_path_breaks_ties_as_the_summary_does() {
        let frames: Vec<Frame> = (0..4)
            .flat_map(|iter| {
                let end = 1_000 * (iter + 1);
                [
                    breakdown(0, iter, end, Category::Other),
                    breakdown(1, iter, end + 5, Category::DataPrep),
                ]
            })
            .collect();
        let facts = run_facts(&frames, 1);
        assert_eq!(facts.critical_path.get(Category::DataPrep), 3 * 40);
        assert_eq!(facts.critical_path.get(Category::Other), 0);
        assert_eq!(facts.ranks, 2);
        assert_eq!(facts.iteration_seconds.len(), 3);
    }
}
