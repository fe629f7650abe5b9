//! The single most important finding of a run, in one sentence, with the change it suggests
//! and what that change could gain.
//!
//! The finding names the largest stall. Its gain is the bound of removing that stall entirely:
//! the iteration would take `(1 - f)` of its time, where `f` is the stall's share. Stalls under
//! [`MINOR_STALL`] are not worth a change; the job is then called compute-bound.
//!
//! A pipeline-parallel job (its ranks sent to each other point to point) whose lighter stages
//! wait for a heavier one is told so in stages (`finding/pipeline.rs`): the cure is to balance the
//! stages, which no per-category advice would say. A fully sharded job (FSDP's all-gathers and
//! reduce-scatters, no DDP) whose exposed operations are its largest stall is told FSDP's
//! knobs (`finding/fsdp.rs`). A tensor-parallel job (DTensor's collectives, or a DeviceMesh `tp`
//! dimension's) whose exposed TP communication is its largest stall is told to keep TP on fast
//! links (`finding/tensor_parallel.rs`). Advice naming DDP's knobs is given only to a job that
//! uses DDP.

use serde::{Deserialize, Serialize};

use crate::category::Category;
use crate::figures::{Figures, RankSummary};
use crate::parallelism::Parallelism;

mod exposed_comm;
mod fsdp;
mod pipeline;
mod tensor_parallel;

/// A stall share below which no change is suggested, 0–1.
pub const MINOR_STALL: f64 = 0.05;

/// The largest speed-up a finding promises. Removing a stall of share `f` bounds the speed-up
/// at `1 / (1 - f)`, which runs away as `f` nears 1 (a job whose time is all "other" would be
/// "10⁹× faster"): what is left of the iteration then is too little of what was measured to
/// bound anything, so the finding says "more than 10×" and why.
pub const MAX_SPEEDUP: f64 = 10.0;

/// What stallscope would tell the user first.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// The category the finding is about (`compute` when no stall matters).
    pub category: Option<Category>,
    /// Its share of the job's wall time, 0–1.
    pub fraction: f64,
    /// The rank it concerns most (the slowest rank for `peer_wait`), when one stands out.
    pub rank: Option<u32>,
    /// One sentence.
    pub sentence: String,
    /// The change to make.
    pub suggestion: String,
    /// Upper bound of the speed-up from removing the stall: old time / new time.
    pub max_speedup: f64,
}

/// What the finding is made from.
pub struct FindingInput<'a> {
    /// The job's figures.
    pub job: &'a Figures,
    /// Each rank's.
    pub ranks: &'a [RankSummary],
    /// DataLoader workers per rank, when the hook reported them.
    pub loader_workers: Option<u32>,
    /// CPUs on the node.
    pub cpus: u32,
    /// How the job is parallelised, as its markers tell.
    pub parallelism: &'a Parallelism,
}

fn pct(f: f64) -> String {
    format!("{:.0}%", f * 100.0)
}

/// The change for interconnect time on a job that trains on the CPU: the "interconnect" is
/// loopback between processes, and a small all-reduce is latency-bound (PyTorch's
/// ddp-tutorial-series toy all-reduces 84 bytes), so faster links would not help.
const CPU_INTERCONNECT: &str = "this is communication between processes on the CPU (no GPU was seen), so NVLink cannot help: when the gradients are small the all-reduce is latency-bound — accumulate gradients (DDP no_sync) or use a larger batch per process; `stallscope advise` tells which";

/// [`CPU_INTERCONNECT`] for a job without DDP.
const CPU_INTERCONNECT_NO_DDP: &str = "this is communication between processes on the CPU (no GPU was seen), so NVLink cannot help: small messages are latency-bound — exchange fewer, larger tensors or do more work per exchange";

fn suggestion(c: Category, input: &FindingInput, straggler: Option<u32>) -> String {
    match c {
        Category::DataPrep => match input.loader_workers {
            Some(w) if input.cpus > 0 && w + 1 < input.cpus => format!(
                "raise DataLoader num_workers (now {w}; this node has {} CPUs), or make decoding and augmentation cheaper",
                input.cpus
            ),
            Some(w) => format!(
                "the {w} loader workers already use the node's {} CPUs: make decoding and augmentation cheaper (pre-process once, decode on the GPU), or choose an instance type with more CPUs per accelerator",
                input.cpus
            ),
            None => "give data loading more CPU (more DataLoader workers) or make decoding and augmentation cheaper".into(),
        },
        Category::DataFetch => "cache the dataset in memory or on local disk, raise DataLoader workers/prefetch_factor to keep more reads in flight, or use storage with more read bandwidth".into(),
        Category::Network if input.parallelism.ddp => "overlap communication with compute (larger DDP bucket_cap_mb, gradient accumulation), compress gradients (fp16/PowerSGD comm hooks), or choose an instance type with more network bandwidth".into(),
        Category::Network => "overlap communication with compute, send fewer or smaller tensors (compression), or choose an instance type with more network bandwidth".into(),
        Category::Interconnect
            if !input.ranks.is_empty() && input.ranks.iter().all(|r| r.gpu.is_none()) =>
        {
            if input.parallelism.ddp {
                CPU_INTERCONNECT.into()
            } else {
                CPU_INTERCONNECT_NO_DDP.into()
            }
        }
        Category::Interconnect => "use accelerators joined by NVLink, keep peer traffic off the host (pinned memory, fewer staging copies), or overlap communication with compute".into(),
        Category::PeerWait => match straggler {
            Some(r) => format!("look at rank {r}: it arrives last at the collectives — balance its data or work, or check its device and data loading"),
            None => "find the slowest rank and balance its data or work".into(),
        },
        Category::Other => "mark the unexplained work with stallscope.phase(...) or check that markers arrive (`stallscope summary` counts any lost on its `markers:` line)".into(),
        Category::Compute => String::new(),
    }
}

fn describe(c: Category) -> &'static str {
    match c {
        Category::DataFetch => "waiting for storage reads (data fetch)",
        Category::DataPrep => "waiting for CPU data preparation (data prep)",
        Category::Interconnect => "moving data between devices inside the node (interconnect)",
        Category::Network => "in exposed communication over the network",
        Category::PeerWait => "waiting for a slower rank at the collectives (peer wait)",
        Category::Other => "in time nothing explains (other)",
        Category::Compute => "computing",
    }
}

/// The finding for a job.
pub fn find(input: &FindingInput) -> Finding {
    let job = input.job;
    if job.iterations == 0 {
        return no_iterations();
    }
    if let Some(f) = pipeline::imbalance(input) {
        return f;
    }
    if let Some(f) = fsdp::exposed(input) {
        return f;
    }
    if let Some(f) = tensor_parallel::exposed(input) {
        return f;
    }
    let stall = largest_stall(job);
    let f = job.categories.get(stall).fraction;
    let t = job.median_iteration_seconds;
    if f < MINOR_STALL {
        return compute_bound(job);
    }
    let (rank, straggler) = concerned_rank(input, stall);
    let unbounded = 1.0 / (1.0 - f).max(1e-9);
    let speedup = unbounded.min(MAX_SPEEDUP);
    let rank_note = match (rank, input.ranks.len()) {
        (Some(r), n) if n > 1 && stall != Category::PeerWait => format!(" (most on rank {r})"),
        _ => String::new(),
    };
    let gain = if unbounded > MAX_SPEEDUP {
        format!(
            "removing it could make the iteration more than {MAX_SPEEDUP:.0}× faster than its median of {t:.3} s; the profile measured too little else ({}) to bound it closer",
            pct(1.0 - f)
        )
    } else {
        format!(
            "removing it would cut the median iteration from {:.3} s to about {:.3} s ({:.2}× faster)",
            t,
            t * (1.0 - f),
            speedup
        )
    };
    Finding {
        category: Some(stall),
        fraction: f,
        rank,
        sentence: format!(
            "{} of the iteration time is spent {}{}: {gain}",
            pct(f),
            describe(stall),
            rank_note,
        ),
        suggestion: suggestion(stall, input, straggler),
        max_speedup: speedup,
    }
}

/// No step markers arrived: say how to get them.
fn no_iterations() -> Finding {
    Finding {
        sentence: "no iterations were seen: no step markers arrived".into(),
        suggestion: "for PyTorch keep the automatic hook on (no --no-auto), call stallscope.step() each iteration, or give --iter-regex matching a line the training prints each iteration".into(),
        max_speedup: 1.0,
        ..Default::default()
    }
}

/// No stall worth naming.
fn compute_bound(job: &Figures) -> Finding {
    Finding {
        category: Some(Category::Compute),
        fraction: job.categories.compute.fraction,
        rank: None,
        sentence: format!(
            "compute-bound: computing takes {} of the iteration time; no stall exceeds {}",
            pct(job.categories.compute.fraction),
            pct(MINOR_STALL)
        ),
        suggestion: "only faster compute helps: a faster accelerator, mixed precision, or a larger batch per device".into(),
        max_speedup: 1.0,
    }
}

/// The stall category with the most time.
fn largest_stall(job: &Figures) -> Category {
    Category::ALL
        .into_iter()
        .filter(|c| *c != Category::Compute)
        .max_by(|a, b| {
            job.categories
                .get(*a)
                .seconds
                .total_cmp(&job.categories.get(*b).seconds)
        })
        .unwrap_or(Category::Other)
}

/// The rank the finding concerns (the one with the largest share of `stall`, or for
/// `peer_wait` the one that waited least: the straggler), and the straggler.
fn concerned_rank(input: &FindingInput, stall: Category) -> (Option<u32>, Option<u32>) {
    let share = |r: &RankSummary, c: Category| r.figures.categories.get(c).fraction;
    if stall == Category::PeerWait {
        let straggler = input
            .ranks
            .iter()
            .min_by(|a, b| share(a, stall).total_cmp(&share(b, stall)))
            .map(|r| r.rank);
        return (straggler, straggler);
    }
    let worst = input
        .ranks
        .iter()
        .max_by(|a, b| share(a, stall).total_cmp(&share(b, stall)))
        .map(|r| r.rank);
    (worst.filter(|_| input.ranks.len() > 1), None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::figures::{Categories, RankSummary, Share};

    fn figures(prep: f64, compute: f64) -> Figures {
        Figures {
            iterations: 10,
            median_iteration_seconds: 0.5,
            wall_seconds: 5.0,
            categories: Categories {
                compute: Share {
                    seconds: compute * 5.0,
                    fraction: compute,
                },
                data_prep: Share {
                    seconds: prep * 5.0,
                    fraction: prep,
                },
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn names_the_largest_stall_with_its_gain_and_change() {
        let job = figures(0.6, 0.4);
        let f = find(&FindingInput {
            job: &job,
            ranks: &[],
            loader_workers: Some(0),
            cpus: 8,
            parallelism: &Parallelism::default(),
        });
        assert_eq!(f.category, Some(Category::DataPrep));
        assert!((f.max_speedup - 2.5).abs() < 1e-9);
        assert!(f.sentence.contains("60%"), "{}", f.sentence);
        assert!(f.sentence.contains("0.200 s"), "{}", f.sentence);
        assert!(
            f.suggestion.contains("num_workers (now 0"),
            "{}",
            f.suggestion
        );
    }

    #[test]
    fn a_stall_near_the_whole_iteration_is_capped_and_says_why() {
        let job = figures(0.999, 0.001);
        let f = find(&FindingInput {
            job: &job,
            ranks: &[],
            loader_workers: Some(0),
            cpus: 8,
            parallelism: &Parallelism::default(),
        });
        assert_eq!(f.max_speedup, MAX_SPEEDUP);
        assert!(
            f.sentence.contains("more than 10× faster"),
            "{}",
            f.sentence
        );
        assert!(!f.sentence.contains("1000.00×"), "{}", f.sentence);
    }

    #[test]
    fn interconnect_on_a_cpu_job_does_not_ask_for_nvlink() {
        let mut job = figures(0.0, 0.29);
        job.categories.interconnect = Share {
            seconds: 3.55,
            fraction: 0.71,
        };
        let ranks = [RankSummary::default(), RankSummary::default()];
        let f = find(&FindingInput {
            job: &job,
            ranks: &ranks,
            loader_workers: Some(0),
            cpus: 2,
            parallelism: &Parallelism {
                ddp: true,
                pipeline: None,
            },
        });
        assert_eq!(f.category, Some(Category::Interconnect));
        assert!(
            !f.suggestion.contains("use accelerators joined by NVLink"),
            "{}",
            f.suggestion
        );
        assert!(
            f.suggestion.contains("accumulate gradients"),
            "{}",
            f.suggestion
        );
    }

    #[test]
    fn small_stalls_make_a_compute_bound_finding() {
        let job = figures(0.02, 0.98);
        let f = find(&FindingInput {
            job: &job,
            ranks: &[],
            loader_workers: None,
            cpus: 2,
            parallelism: &Parallelism::default(),
        });
        assert_eq!(f.category, Some(Category::Compute));
        assert!(f.sentence.starts_with("compute-bound"));
    }

    #[test]
    fn no_iterations_says_how_to_get_markers() {
        let job = Figures::default();
        let f = find(&FindingInput {
            job: &job,
            ranks: &[],
            loader_workers: None,
            cpus: 2,
            parallelism: &Parallelism::default(),
        });
        assert_eq!(f.category, None);
        assert!(f.suggestion.contains("--iter-regex"));
    }
}
