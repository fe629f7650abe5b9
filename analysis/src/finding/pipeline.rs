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
