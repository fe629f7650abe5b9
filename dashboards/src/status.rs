//! The one-line live status: iterations, median iteration time over the recent window, the
//! largest stall in that window and, on GPUs, how busy they were: the first number a GPU
//! user looks at, live. A pure function of the live model.

use stallscope_analysis::category::{Category, Split};
use stallscope_analysis::secs;
use stallscope_analysis::view::JobView;

/// The status text, without line control characters.
pub fn render(view: &JobView) -> String {
    let recent = view.recent();
    if recent.is_empty() {
        return "stallscope: waiting for the first iteration…".into();
    }
    let mut walls: Vec<u64> = recent.iter().map(|p| p.wall_ns()).collect();
    walls.sort_unstable();
    let median = walls[walls.len() / 2];
    let mut split = Split::default();
    for p in &recent {
        split.add_split(&p.split);
    }
    let share = |c: Category| split.get(c) as f64 * 100.0 / split.total().max(1) as f64;
    let stall = match split.largest_stall() {
        Some(c) => format!("largest stall {} {:.0}%", c.name(), share(c)),
        None => "no stalls".into(),
    };
    let ranks = view.ranks.len();
    let mut line = format!(
        "stallscope: {} it × {} rank{} · median {:.3} s · {} · compute {:.0}%",
        view.iterations(),
        ranks,
        if ranks == 1 { "" } else { "s" },
        secs(median),
        stall,
        share(Category::Compute)
    );
    let busy: Vec<u32> = recent.iter().filter_map(|p| p.gpu_busy_ppm).collect();
    if !busy.is_empty() {
        let mean = busy.iter().map(|p| u64::from(*p)).sum::<u64>() as f64 / busy.len() as f64;
        line.push_str(&format!(" · GPU {:.0}% busy", mean / 1e4));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use stallscope_analysis::view::{IterationParts, RankView};

    fn view(iterations: &[(u32, u64, u64, u64, Option<u32>)]) -> JobView {
        let mut v = JobView::new("train");
        for (i, &(rank, iter, wall_ms, prep_ms, gpu)) in iterations.iter().enumerate() {
            let mut split = Split::default();
            split.add(Category::DataPrep, prep_ms * 1_000_000);
            split.add(Category::Compute, (wall_ms - prep_ms) * 1_000_000);
            v.ranks
                .entry(rank)
                .or_insert_with(|| RankView {
                    rank,
                    ..RankView::default()
                })
                .recent
                .push_back(IterationParts {
                    iter,
                    end_ns: i as u64,
                    split,
                    gpu_busy_ppm: gpu,
                });
        }
        v
    }

    #[test]
    fn waits_for_the_first_iteration() {
        insta::assert_snapshot!(render(&JobView::new("train")), @"stallscope: waiting for the first iteration…");
    }

    #[test]
    fn shows_iterations_median_and_largest_stall() {
        let v = view(&[
            (0, 0, 100, 60, None),
            (1, 0, 200, 120, None),
            (0, 1, 300, 180, None),
        ]);
        insta::assert_snapshot!(render(&v), @"stallscope: 2 it × 2 ranks · median 0.200 s · largest stall data_prep 60% · compute 40%");
    }

    #[test]
    fn on_a_gpu_says_how_busy_it_was() {
        let v = view(&[
            (0, 0, 100, 10, Some(800_000)),
            (0, 1, 100, 10, Some(900_000)),
        ]);
        insta::assert_snapshot!(render(&v), @"stallscope: 2 it × 1 rank · median 0.100 s · largest stall data_prep 10% · compute 90% · GPU 85% busy");
    }
}
