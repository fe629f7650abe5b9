//! What a parallelism's exposed communication weighs in the iteration: shared by the findings
//! of the strategies whose own collectives sit on the critical path (FSDP, tensor parallel),
//! which differ in what they count and advise, not in when they speak or what they promise.

use super::{FindingInput, MAX_SPEEDUP, MINOR_STALL};
use crate::category::Category;

/// Categories an exposed operation's time goes to.
const COMM: [Category; 3] = [
    Category::PeerWait,
    Category::Interconnect,
    Category::Network,
];

/// The weight of `seconds` of exposed communication per iteration.
pub(super) struct ExposedComm {
    /// Share of the mean iteration, 0–1.
    pub fraction: f64,
    /// The communication category with the most time: where the finding points.
    pub category: Category,
    /// s, the median iteration.
    pub median: f64,
    /// s per iteration hiding it would save at most (≤ the median iteration).
    pub gain: f64,
    /// × faster with none of it, bounded by [`MAX_SPEEDUP`].
    pub speedup: f64,
}

/// `seconds` per iteration of exposed communication, when it takes at least [`MINOR_STALL`]
/// of the mean iteration and more than any stall outside communication (data fetch, data
/// prep, other); `None` otherwise.
pub(super) fn weigh(input: &FindingInput, seconds: f64) -> Option<ExposedComm> {
    let median = input.job.median_iteration_seconds;
    let mean = input.job.wall_seconds / input.job.iterations.max(1) as f64;
    if seconds <= 0.0 || mean <= 0.0 {
        return None;
    }
    let fraction = (seconds / mean).min(1.0);
    let categories = &input.job.categories;
    let other_stall = [Category::DataFetch, Category::DataPrep, Category::Other]
        .into_iter()
        .map(|c| categories.get(c).fraction)
        .fold(0.0, f64::max);
    if fraction < MINOR_STALL || fraction < other_stall {
        return None;
    }
    let category = COMM.into_iter().max_by(|a, b| {
        categories
            .get(*a)
            .seconds
            .total_cmp(&categories.get(*b).seconds)
    })?;
    Some(ExposedComm {
        fraction,
        category,
        median,
        gain: seconds.min(median),
        speedup: (1.0 / (1.0 - fraction).max(1e-9)).min(MAX_SPEEDUP),
    })
}
