//! The finding for a fully sharded job (FSDP) held up by its own all-gathers and
//! reduce-scatters.
//!
//! FSDP keeps a shard of every layer's parameters per rank: it all-gathers a layer's
//! parameters before the layer runs (in forward, and again in backward unless they were kept)
//! and reduce-scatters its gradients after. Time the loop spends in them is exposed when
//! nothing overlaps it. DDP's knobs (`no_sync`, `bucket_cap_mb`) do not apply; FSDP's own do:
//! prefetching the next layer's all-gather while this one computes, keeping gathered
//! parameters from forward to backward, or sharding over fewer, faster-linked ranks. Their gain
//! is at most the exposed time the ranks spent in these operations.

use super::exposed_comm::weigh;
use super::{pct, Finding, FindingInput};
use crate::collectives::Role;

/// FSDP's operations per iteration, averaged over the ranks.
#[derive(Default)]
struct Exposed {
    /// s in all-gathers.
    gather: f64,
    /// s in reduce-scatters.
    scatter: f64,
    /// s of those waiting for a peer.
    waited: f64,
    /// All-gathers.
    gathers: f64,
    /// Reduce-scatters.
    scatters: f64,
}

fn exposed_per_iteration(input: &FindingInput) -> Exposed {
    let mut e = Exposed::default();
    let mut ranks = 0;
    for r in input.ranks.iter().filter(|r| r.figures.iterations > 0) {
        ranks += 1;
        for c in r.collectives.iter().filter(|c| c.role == Some(Role::Fsdp)) {
            if c.op.contains("gather") {
                e.gather += c.seconds_per_iteration;
                e.gathers += c.count_per_iteration;
            } else {
                e.scatter += c.seconds_per_iteration;
                e.scatters += c.count_per_iteration;
            }
            e.waited += c.waited_seconds_per_iteration;
        }
    }
    let n = f64::from(ranks.max(1));
    Exposed {
        gather: e.gather / n,
        scatter: e.scatter / n,
        waited: e.waited / n,
        gathers: e.gathers / n,
        scatters: e.scatters / n,
    }
}

/// The advice. Parameters resharded after forward are gathered twice per reduce-scatter
/// (forward and backward); about once means `reshard_after_forward=False` is already in use.
fn suggestion(e: &Exposed) -> String {
    let keep = if e.scatters > 0.0 && e.gathers < 1.5 * e.scatters {
        ""
    } else {
        " keep the gathered parameters from forward to backward with reshard_after_forward=False (one all-gather per layer instead of two, for the memory of the unsharded layers);"
    };
    format!("prefetch, so that the next layer's all-gather runs while this one computes (FSDP2: set_modules_to_forward_prefetch and set_modules_to_backward_prefetch; FSDP1: forward_prefetch=True, backward_prefetch=BACKWARD_PRE);{keep} or shard over fewer ranks — HSDP (a 2-D DeviceMesh: shard within a node, replicate across nodes) or a smaller shard group — so that each all-gather crosses faster links")
}

/// The FSDP finding, when FSDP's exposed operations (with no DDP in the job) take at least
/// [`MINOR_STALL`](super::MINOR_STALL) of the iteration and more than any stall outside communication.
pub(super) fn exposed(input: &FindingInput) -> Option<Finding> {
    if input.parallelism.ddp {
        return None;
    }
    let e = exposed_per_iteration(input);
    let (gather, scatter, waited) = (e.gather, e.scatter, e.waited);
    let lost = gather + scatter;
    let w = weigh(input, lost)?;
    let (f, t, gain, speedup) = (w.fraction, w.median, w.gain, w.speedup);
    Some(Finding {
        category: Some(w.category),
        fraction: f,
        rank: None,
        sentence: format!(
            "{} of the iteration time is FSDP's exposed communication: {:.1} ms per iteration all-gathering parameters and {:.1} ms reduce-scattering gradients ({:.1} ms of it waiting for the slowest rank); hiding it behind compute would save up to {:.1} ms, the median iteration from {t:.3} s to about {:.3} s ({speedup:.2}× faster)",
            pct(f),
            gather * 1e3,
            scatter * 1e3,
            waited * 1e3,
            gain * 1e3,
            t - gain,
        ),
        suggestion: suggestion(&e),
        max_speedup: speedup,
    })
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
    /// compute; `gather` and `scatter` ms of it in FSDP's operations.
    fn rank(rank: u32, comm: f64, (gather, scatter): (f64, f64)) -> RankSummary {
        let share = |ms: f64| Share {
            seconds: ms / 100.0,
            fraction: ms / 100.0,
        };
        let op = |op: &str, ms: f64| Collective {
            op: op.into(),
            group: Some("0".into()),
            role: Some(Role::Fsdp),
            count_per_iteration: if op.contains("gather") { 8.0 } else { 4.0 },
            bytes_per_iteration: 1e6,
            seconds_per_iteration: ms / 1e3,
            waited_seconds_per_iteration: ms / 4e3,
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
            collectives: vec![
                op("all_gather_into_tensor", gather),
                op("reduce_scatter_tensor", scatter),
            ],
            ..RankSummary::default()
        }
    }

    fn job(ranks: &[RankSummary]) -> Figures {
        let mut job = ranks[0].figures.clone();
        job.wall_seconds *= ranks.len() as f64;
        job.iterations *= ranks.len() as u64;
        job.categories.interconnect.seconds *= ranks.len() as f64;
        job.categories.compute.seconds *= ranks.len() as f64;
        job
    }

    fn finding(ranks: &[RankSummary], parallelism: &Parallelism) -> Finding {
        find(&FindingInput {
            job: &job(ranks),
            ranks,
            loader_workers: None,
            cpus: 2,
            parallelism,
        })
    }

    #[test]
    fn exposed_gathers_and_scatters_get_fsdp_advice_with_a_bounded_gain() {
        let ranks = [rank(0, 40.0, (30.0, 10.0)), rank(1, 40.0, (30.0, 10.0))];
        let f = finding(&ranks, &Parallelism::default());
        assert_eq!(f.category, Some(Category::Interconnect));
        assert!((f.fraction - 0.4).abs() < 1e-9, "{}", f.fraction);
        for part in [
            "40% of the iteration time is FSDP's exposed communication",
            "30.0 ms per iteration all-gathering parameters and 10.0 ms reduce-scattering",
            "10.0 ms of it waiting",
            "save up to 40.0 ms, the median iteration from 0.100 s to about 0.060 s (1.67× faster)",
        ] {
            assert!(f.sentence.contains(part), "{part}: {}", f.sentence);
        }
        for knob in [
            "set_modules_to_forward_prefetch",
            "reshard_after_forward=False",
            "HSDP",
            "shard group",
        ] {
            assert!(f.suggestion.contains(knob), "{knob}: {}", f.suggestion);
        }
        for text in [&f.sentence, &f.suggestion] {
            assert!(!text.contains("no_sync") && !text.contains("DDP"), "{text}");
        }
    }

    #[test]
    fn parameters_kept_from_forward_to_backward_are_not_advised_again() {
        let mut ranks = [rank(0, 40.0, (30.0, 10.0)), rank(1, 40.0, (30.0, 10.0))];
        for r in &mut ranks {
            r.collectives[0].count_per_iteration = 4.0; // one all-gather per reduce-scatter
        }
        let f = finding(&ranks, &Parallelism::default());
        assert!(
            f.suggestion.contains("set_modules_to_forward_prefetch"),
            "{}",
            f.suggestion
        );
        assert!(
            !f.suggestion.contains("reshard_after_forward"),
            "{}",
            f.suggestion
        );
    }

    #[test]
    fn a_minor_or_ddp_job_gets_no_fsdp_advice() {
        let ranks = [rank(0, 2.0, (1.5, 0.5)), rank(1, 2.0, (1.5, 0.5))];
        let f = finding(&ranks, &Parallelism::default());
        assert_eq!(f.category, Some(Category::Compute), "{}", f.sentence);
        let ranks = [rank(0, 40.0, (30.0, 10.0)), rank(1, 40.0, (30.0, 10.0))];
        let ddp = Parallelism {
            ddp: true,
            pipeline: None,
        };
        let f = finding(&ranks, &ddp);
        assert!(!f.sentence.contains("FSDP"), "{}", f.sentence);
    }
}
