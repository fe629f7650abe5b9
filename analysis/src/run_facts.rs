//! What one configuration's profile says that the experiment needs: the wall time of each
//! iteration, and the inputs of the what-if model (batch, loader CPU, dataset size).

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::category::Split;
use crate::critical::CriticalPath;
use crate::frame::{Frame, Role};
use crate::loops::ProcessMeta;
use crate::marker::MarkerEvent;
use crate::secs;
use crate::series::names;

/// Facts of one run, read from its frames.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunFacts {
    /// s, per counted iteration index (warm-up left out), the mean wall time over ranks.
    pub iteration_seconds: Vec<f64>,
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
    let mut facts = RunFacts::default();
    let mut walls: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
    // The one critical-path rule (`crate::critical`): the rank that waited least, ties to
    // the one that finished last. The rank count is not known until the end, so iterations
    // are taken as they stand (all ranks have long reported one 4,096 iterations back).
    let mut critical = CriticalPath::default();
    let mut ranks: HashSet<u32> = HashSet::new();
    let mut loaders: HashSet<u32> = HashSet::new();
    let mut cpu_series: HashMap<u32, u32> = HashMap::new(); // series id → pid
    let mut cpu_max: HashMap<u32, u64> = HashMap::new(); // pid → ns
    let mut read_series: HashMap<u32, u32> = HashMap::new(); // series id → pid
    let mut read_max: HashMap<u32, u64> = HashMap::new(); // pid → bytes
                                                          // The hook's facts, through the one parser (`ProcessMeta`); the latest said wins.
    let mut meta = ProcessMeta::default();

    // A collector's job profile has no `Breakdown` of its own: its ranks' iterations are the
    // ones their agents shipped, read only where the profile has no `Breakdown`.
    let has_breakdowns = frames.iter().any(|f| matches!(f, Frame::Breakdown(_)));
    for frame in frames {
        let breakdown = match frame {
            Frame::Breakdown(b) => Some(b),
            _ if !has_breakdowns => frame.node_iteration().map(|it| &it.breakdown),
            _ => None,
        };
        if let Some(b) = breakdown {
            ranks.insert(b.rank);
            facts.iterations_total = facts.iterations_total.max(b.iter + 1);
            if b.iter >= warmup as u64 {
                walls.entry(b.iter).or_default().push(secs(b.wall_ns()));
                critical.add(b.iter, b.end_ns, &b.split, usize::MAX);
            }
            continue;
        }
        match frame {
            Frame::Header(h) => facts.cpus = h.cpus,
            Frame::Process(p) if p.role == Role::Loader => {
                loaders.insert(p.pid);
            }
            Frame::Series(d) if d.name == names::PROC_ALL_CPU_NS => {
                if let Some(pid) = d.label("pid").and_then(|p| p.parse().ok()) {
                    cpu_series.insert(d.id.0, pid);
                }
            }
            Frame::Series(d) if d.name == names::PROC_READ_BYTES => {
                if let Some(pid) = d.label("pid").and_then(|p| p.parse().ok()) {
                    read_series.insert(d.id.0, pid);
                }
            }
            Frame::Samples(batch) => {
                for (id, v) in &batch.values {
                    if let Some(pid) = cpu_series.get(&id.0) {
                        let max = cpu_max.entry(*pid).or_default();
                        *max = (*max).max(*v);
                    }
                    if let Some(pid) = read_series.get(&id.0) {
                        let max = read_max.entry(*pid).or_default();
                        *max = (*max).max(*v);
                    }
                }
            }
            Frame::Markers(markers) => {
                for m in markers {
                    if let MarkerEvent::Meta(kv) = &m.event {
                        for (k, v) in kv {
                            meta.set(k, v);
                        }
                    }
                }
            }
            Frame::NodeMeta(node_meta) => {
                for (k, v) in &node_meta.fields {
                    meta.set(k, v);
                }
            }
            _ => {}
        }
    }
    facts.ranks = ranks.len() as u32;
    facts.batch_size = meta.batch_size;
    facts.workers = meta.workers;
    facts.dataset_samples = meta.dataset_samples;
    facts.critical_path = critical.totals().0;
    facts.iteration_seconds = walls
        .values()
        .map(|w| w.iter().sum::<f64>() / w.len() as f64)
        .collect();
    if !loaders.is_empty() {
        let ns: u64 = loaders.iter().filter_map(|pid| cpu_max.get(pid)).sum();
        if ns > 0 {
            facts.loader_cpu_seconds = Some(secs(ns));
        }
        let read: Vec<u64> = loaders
            .iter()
            .filter_map(|pid| read_max.get(pid))
            .copied()
            .collect();
        if !read.is_empty() {
            facts.loader_read_bytes = Some(read.iter().sum());
        }
    }
    facts
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
