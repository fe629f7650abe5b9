//! The finding for a tensor-parallel job held up by its own tensor-parallel communication.
//!
//! Tensor parallelism (Megatron-style, DTensor's `ColwiseParallel`/`RowwiseParallel`) splits
//! each layer's matrices over the ranks of its group and joins their partial results with an
//! all-reduce (or all-gather and reduce-scatter under sequence parallelism) inside every layer,
//! in forward and in backward. Those sit on the critical path of each layer: the compute
//! cannot go on until they return, so they overlap little, and their number grows with the
//! layers. They are only cheap over the fastest links, which is why TP is kept inside a
//! fast-link domain (the GPUs of one node joined by NVLink or NVSwitch) and the slower links
//! carry data or pipeline parallelism. The gain is at most the exposed time the ranks spent in
//! the tensor-parallel group's operations.

use super::exposed_comm::weigh;
use super::{pct, Finding, FindingInput};
use crate::collectives::Role;

/// The tensor-parallel operations per iteration, averaged over the ranks that counted
/// iterations.
#[derive(Default)]
struct Exposed {
    /// s in them.
    seconds: f64,
    /// s of those waiting for a peer.
    waited: f64,
    /// Operations.
    count: f64,
    /// bytes.
    bytes: f64,
}

fn exposed_per_iteration(input: &FindingInput) -> Exposed {
    let mut e = Exposed::default();
    let mut ranks = 0;
    for r in input.ranks.iter().filter(|r| r.figures.iterations > 0) {
        ranks += 1;
        for c in r
            .collectives
            .iter()
            .filter(|c| c.role == Some(Role::TensorParallel))
        {
            e.seconds += c.seconds_per_iteration;
            e.waited += c.waited_seconds_per_iteration;
            e.count += c.count_per_iteration;
            e.bytes += c.bytes_per_iteration;
        }
    }
    let n = f64::from(ranks.max(1));
    Exposed {
        seconds: e.seconds / n,
        waited: e.waited / n,
        count: e.count / n,
        bytes: e.bytes / n,
    }
}

/// The advice: where TP belongs, and what to do when it already is there.
const SUGGESTION: &str = "keep tensor parallelism inside a fast-link domain: a TP group no larger than the GPUs of one node joined by NVLink or NVSwitch, with data or pipeline parallelism across the slower links (a 2-D DeviceMesh: tp inside the node, dp across nodes); if it already is, use a smaller TP degree (more data parallelism), or sequence parallelism and async TP to overlap its collectives with compute";

/// [`SUGGESTION`] for a job in which no rank had a GPU: its tensor-parallel group talks over
/// loopback between processes on the CPU, so there is no fast-link domain to keep it in.
const CPU_SUGGESTION: &str = "this tensor parallelism runs between processes on the CPU (no GPU was seen), so faster links cannot help: use a smaller TP degree (more data parallelism), or fewer and larger exchanges per layer (sequence parallelism, async TP); on GPUs, keep the TP group inside the GPUs of one node joined by NVLink or NVSwitch";

/// The tensor-parallel finding, when the tensor-parallel group's exposed operations take at
/// least [`MINOR_STALL`](super::MINOR_STALL) of the iteration and more than any stall outside communication.
pub(super) fn exposed(input: &FindingInput) -> Option<Finding> {
    let e = exposed_per_iteration(input);
    let w = weigh(input, e.seconds)?;
    let (f, t, gain, speedup) = (w.fraction, w.median, w.gain, w.speedup);
    Some(Finding {
        category: Some(w.category),
        fraction: f,
        rank: None,
        sentence: format!(
            "{} of the iteration time is tensor parallelism's exposed communication: {:.1} ms per iteration in {:.1} operations of {:.1} kB on the tensor-parallel group ({:.1} ms of it waiting for the slowest rank); hiding it would save up to {:.1} ms, the median iteration from {t:.3} s to about {:.3} s ({speedup:.2}× faster)",
            pct(f),
            e.seconds * 1e3,
            e.count,
            e.bytes / 1e3,
            e.waited * 1e3,
            gain * 1e3,
            t - gain,
        ),
        suggestion: if trains_on_cpu_only(input) {
            CPU_SUGGESTION
        } else {
            SUGGESTION
        }
        .into(),
        max_speedup: speedup,
    })
}

/// Whether every rank was seen without a GPU.
fn trains_on_cpu_only(input: &FindingInput) -> bool {
    !input.ranks.is_empty() && input.ranks.iter().all(|r| r.gpu.is_none())
}

#[cfg(test)]
mod tests {
    use super::super::find;
    use super::*;
    use crate::category::Category;
    use crate::collectives::Collective;
    use crate::figures::{Categories, Figures, RankSummary, Share};
    use crate::parallelism::Parallelism;

    /// A rank's 10 iterations of 100 ms: `comm` ms of interconnect per iteration, the rest
    /// compute; `tp` ms of it in 4 all-reduces on a tensor-parallel group.
    fn rank(rank: u32, comm: f64, tp: f64, role: Option<Role>) -> RankSummary {
        let share = |ms: f64| Share {
            seconds: ms / 100.0,
            fraction: ms / 100.0,
        };
        RankSummary {
            rank,
            figures: Figures {
                iterations: 10,
                median_iteration_seconds: 0.1,
                wall_seconds: 1.0,
                categories: Categories {
                    compute: share(100.0 - comm),
                    interconnect: share(comm),
                    ..Categories::default()
                },
                ..Figures::default()
            },
            collectives: vec![Collective {
                op: "all_reduce".into(),
                group: Some("0".into()),
                role,
                count_per_iteration: 4.0,
                bytes_per_iteration: 4.0 * 8192.0,
                seconds_per_iteration: tp / 1e3,
                waited_seconds_per_iteration: tp / 4e3,
            }],
            ..RankSummary::default()
        }
    }

    /// `r` as seen on a GPU (NVML gave its index).
    fn on_gpu(mut r: RankSummary) -> RankSummary {
        r.gpu = Some(crate::gpu_usage::RankGpu {
            gpu: r.rank.to_string(),
            ..Default::default()
        });
        r
    }

    fn finding(ranks: &[RankSummary]) -> Finding {
        let mut job = ranks[0].figures.clone();
        let n = ranks.len() as f64;
        job.wall_seconds *= n;
        job.iterations *= ranks.len() as u64;
        job.categories.interconnect.seconds *= n;
        job.categories.compute.seconds *= n;
        find(&FindingInput {
            job: &job,
            ranks,
            loader_workers: None,
            cpus: 2,
            parallelism: &Parallelism::default(),
        })
    }

    #[test]
    fn exposed_tensor_parallel_communication_is_told_to_stay_on_fast_links() {
        let role = Some(Role::TensorParallel);
        let f = finding(&[
            on_gpu(rank(0, 30.0, 30.0, role)),
            on_gpu(rank(1, 30.0, 30.0, role)),
        ]);
        assert_eq!(f.category, Some(Category::Interconnect));
        assert!((f.fraction - 0.3).abs() < 1e-9, "{}", f.fraction);
        for part in [
            "30% of the iteration time is tensor parallelism's exposed communication",
            "30.0 ms per iteration in 4.0 operations of 32.8 kB",
            "7.5 ms of it waiting",
            "save up to 30.0 ms, the median iteration from 0.100 s to about 0.070 s (1.43× faster)",
        ] {
            assert!(f.sentence.contains(part), "{part}: {}", f.sentence);
        }
        assert!(
            f.suggestion.contains("inside a fast-link domain"),
            "{}",
            f.suggestion
        );
        for text in [&f.sentence, &f.suggestion] {
            assert!(!text.contains("no_sync") && !text.contains("DDP"), "{text}");
        }
    }

    #[test]
    fn tensor_parallelism_on_the_cpu_is_not_told_about_nvlink_domains() {
        let role = Some(Role::TensorParallel);
        let f = finding(&[rank(0, 30.0, 30.0, role), rank(1, 30.0, 30.0, role)]);
        assert!(
            f.sentence
                .contains("tensor parallelism's exposed communication"),
            "{}",
            f.sentence
        );
        assert!(
            f.suggestion
                .starts_with("this tensor parallelism runs between processes on the CPU")
                && f.suggestion.contains("smaller TP degree"),
            "{}",
            f.suggestion
        );
        assert!(
            !f.suggestion.contains("fast-link domain"),
            "{}",
            f.suggestion
        );
    }

    #[test]
    fn minor_or_other_roles_communication_gets_no_tensor_parallel_advice() {
        let role = Some(Role::TensorParallel);
        let f = finding(&[rank(0, 2.0, 2.0, role), rank(1, 2.0, 2.0, role)]);
        assert_eq!(f.category, Some(Category::Compute), "{}", f.sentence);
        let f = finding(&[rank(0, 30.0, 30.0, None), rank(1, 30.0, 30.0, None)]);
        assert!(!f.sentence.contains("tensor parallel"), "{}", f.sentence);
    }
}
