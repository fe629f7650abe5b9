//! The finding for an imbalanced pipeline: a lighter stage waiting for the slowest one.
//!
//! In a pipeline every stage runs every micro-batch in turn, so the iteration takes about
//! as long as the slowest stage's work; the others wait for it in `recv` (peer wait). Naming
//! "peer wait" or the transfer would not say what to change: moving work from the slowest
//! stage to the one that waits most would, by half their difference, as would more
//! micro-batches or an interleaved schedule (smaller bubbles).

use super::{pct, Finding, FindingInput, MAX_SPEEDUP, MINOR_STALL};
use crate::category::Category;
use crate::figures::RankSummary;

/// s per iteration the rank was busy with its own work: its time less what it waited for
/// peers and spent moving data.
fn busy_per_iteration(r: &RankSummary) -> Option<f64> {
    let f = &r.figures;
    if f.iterations == 0 {
        return None;
    }
    let c = &f.categories;
    let waiting = c.peer_wait.seconds + c.interconnect.seconds + c.network.seconds;
    Some((f.wall_seconds - waiting).max(0.0) / f.iterations as f64)
}

/// The pipeline finding, when the job is a pipeline and one stage waits for another for at
/// least [`MINOR_STALL`] of its time.
pub(super) fn imbalance(input: &FindingInput) -> Option<Finding> {
    let pipeline = input.parallelism.pipeline.as_ref()?;
    let stages: Vec<(&RankSummary, usize, f64)> = input
        .ranks
        .iter()
        .filter_map(|r| Some((r, pipeline.stage_of(r.rank)?, busy_per_iteration(r)?)))
        .collect();
    let slowest = stages.iter().max_by(|a, b| a.2.total_cmp(&b.2))?;
    let wait = |r: &RankSummary| r.figures.categories.peer_wait.fraction;
    let waiter = stages
        .iter()
        .filter(|s| s.0.rank != slowest.0.rank)
        .max_by(|a, b| wait(a.0).total_cmp(&wait(b.0)))?;
    let waited = wait(waiter.0);
    if waited < MINOR_STALL {
        return None;
    }
    let mean = stages.iter().map(|s| s.2).sum::<f64>() / stages.len() as f64;
    let speedup = if mean > 0.0 {
        (slowest.2 / mean).clamp(1.0, MAX_SPEEDUP)
    } else {
        1.0
    };
    let moved_s = (slowest.2 - waiter.2).max(0.0) / 2.0;
    let per = match pipeline.micro_batches.filter(|m| *m >= 1.0) {
        Some(m) => format!("{:.1} ms of work per micro-batch", moved_s * 1e3 / m),
        None => format!("{:.1} ms of work per iteration", moved_s * 1e3),
    };
    let (w, ws, s, ss) = (waiter.0.rank, waiter.1, slowest.0.rank, slowest.1);
    Some(Finding {
        category: Some(Category::PeerWait),
        fraction: waited,
        rank: Some(s),
        sentence: format!(
            "rank {w} (pipeline stage {ws}) waits {} of its time for stage {ss} (rank {s}), the slowest stage: it works {:.1} ms per iteration, stage {ws} {:.1} ms; balanced stages could make the iteration up to {speedup:.2}× faster",
            pct(waited),
            slowest.2 * 1e3,
            waiter.2 * 1e3,
        ),
        suggestion: format!(
            "move about {per} from stage {ss} (rank {s}) to stage {ws} (rank {w}), or use more micro-batches or an interleaved schedule to shrink the pipeline's bubbles"
        ),
        max_speedup: speedup,
    })
}

#[cfg(test)]
mod tests {
    use super::super::find;
    use super::*;
    use crate::figures::{Categories, Figures, Share};
    use crate::parallelism::{Parallelism, Pipeline};

    /// One rank's figures over 10 iterations of 100 ms: `busy` and `wait` ms per iteration,
    /// the rest transfer.
    fn stage(rank: u32, busy: f64, wait: f64) -> RankSummary {
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
                    compute: share(busy),
                    peer_wait: share(wait),
                    interconnect: share(100.0 - busy - wait),
                    ..Categories::default()
                },
                ..Figures::default()
            },
            ..RankSummary::default()
        }
    }

    #[test]
    fn the_waiting_stage_is_told_how_much_work_to_take_over() {
        let ranks = [stage(0, 30.0, 60.0), stage(1, 90.0, 5.0)];
        let job = ranks[1].figures.clone();
        let pipeline = Parallelism {
            ddp: false,
            pipeline: Some(Pipeline {
                stages: vec![0, 1],
                micro_batches: Some(3.0),
            }),
        };
        let input = |parallelism| FindingInput {
            job: &job,
            ranks: &ranks,
            loader_workers: None,
            cpus: 2,
            parallelism,
        };
        let f = find(&input(&pipeline));
        assert_eq!((f.category, f.rank), (Some(Category::PeerWait), Some(1)));
        assert!(
            f.sentence.starts_with(
                "rank 0 (pipeline stage 0) waits 60% of its time for stage 1 (rank 1)"
            ),
            "{}",
            f.sentence
        );
        // (90 - 30 ms) / 2 per iteration over 3 micro-batches; balanced: 90 / 60 ms.
        let moved = "about 10.0 ms of work per micro-batch from stage 1";
        assert!(f.suggestion.contains(moved), "{}", f.suggestion);
        assert!((f.max_speedup - 1.5).abs() < 1e-9, "{}", f.max_speedup);
        // Without point-to-point operations it is no pipeline.
        let f = find(&input(&Parallelism::default()));
        assert!(!f.sentence.contains("stage"), "{}", f.sentence);
    }
}
