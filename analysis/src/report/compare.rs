//! `stallscope report --compare BEFORE AFTER`: what changed between two runs of a job, per
//! category, per rank and in iteration time, from their two reports.

use serde::{Deserialize, Serialize};

use crate::category::Category;

use super::Report;

/// Two runs side by side.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// Always [`super::REPORT_SCHEMA`].
    pub schema: String,
    /// The run before the change.
    pub before: Report,
    /// The run after it.
    pub after: Report,
    /// s, median iteration time before.
    pub median_before_seconds: f64,
    /// s, after.
    pub median_after_seconds: f64,
    /// Relative change of the median, after / before − 1 (negative: faster).
    pub median_change: f64,
    /// Per category: the mean iteration's seconds before and after.
    pub categories: Vec<CategoryChange>,
    /// Per rank present in either run.
    pub ranks: Vec<RankChange>,
    /// One sentence: what changed most.
    pub sentence: String,
}

/// One category, before and after.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CategoryChange {
    /// The category.
    pub category: Category,
    /// s per mean counted iteration, before.
    pub before_seconds: f64,
    /// s per mean counted iteration, after.
    pub after_seconds: f64,
    /// Share of the iteration before, 0–1.
    pub before_fraction: f64,
    /// Share after, 0–1.
    pub after_fraction: f64,
}

/// One rank, before and after.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankChange {
    /// Rank.
    pub rank: u32,
    /// s, its median iteration before (absent: not in that run).
    pub before_median_seconds: Option<f64>,
    /// s, after.
    pub after_median_seconds: Option<f64>,
    /// Its largest stall before.
    pub before_largest_stall: Option<Category>,
    /// After.
    pub after_largest_stall: Option<Category>,
}

/// s per mean counted iteration of category `c` in a report, and its share.
fn per_iteration(r: &Report, c: Category) -> (f64, f64) {
    let share = r.breakdown.job.get(c);
    let iterations = r.summary.job.iterations.max(1) as f64;
    (share.seconds / iterations, share.fraction)
}

/// Compares two reports.
pub fn compare(before: Report, after: Report) -> Comparison {
    let mb = before.summary.job.median_iteration_seconds;
    let ma = after.summary.job.median_iteration_seconds;
    let change = if mb > 0.0 { ma / mb - 1.0 } else { 0.0 };
    let categories: Vec<CategoryChange> = Category::ALL
        .iter()
        .map(|&c| {
            let (bs, bf) = per_iteration(&before, c);
            let (a_s, af) = per_iteration(&after, c);
            CategoryChange {
                category: c,
                before_seconds: bs,
                after_seconds: a_s,
                before_fraction: bf,
                after_fraction: af,
            }
        })
        .collect();
    let mut ranks: std::collections::BTreeMap<u32, RankChange> = Default::default();
    for r in &before.breakdown.ranks {
        let e = ranks.entry(r.rank).or_default();
        e.rank = r.rank;
        e.before_median_seconds = Some(r.median_seconds);
        e.before_largest_stall = r.largest_stall;
    }
    for r in &after.breakdown.ranks {
        let e = ranks.entry(r.rank).or_default();
        e.rank = r.rank;
        e.after_median_seconds = Some(r.median_seconds);
        e.after_largest_stall = r.largest_stall;
    }
    let moved = categories
        .iter()
        .max_by(|a, b| {
            (a.after_seconds - a.before_seconds)
                .abs()
                .total_cmp(&(b.after_seconds - b.before_seconds).abs())
        })
        .filter(|c| (c.after_seconds - c.before_seconds).abs() > 0.0);
    let sentence = match (mb > 0.0 && ma > 0.0, moved) {
        (false, _) => "one of the runs has no counted iterations: nothing to compare".to_string(),
        (true, Some(c)) => format!(
            "The median iteration went from {mb:.3} s to {ma:.3} s ({:+.1}%); {} changed most, from {:.3} s to {:.3} s per iteration.",
            change * 100.0,
            c.category.name().replace('_', " "),
            c.before_seconds,
            c.after_seconds
        ),
        (true, None) => format!(
            "The median iteration went from {mb:.3} s to {ma:.3} s ({:+.1}%).",
            change * 100.0
        ),
    };
    Comparison {
        schema: super::REPORT_SCHEMA.into(),
        before,
        after,
        median_before_seconds: mb,
        median_after_seconds: ma,
        median_change: change,
        categories,
        ranks: ranks.into_values().collect(),
        sentence,
    }
}
