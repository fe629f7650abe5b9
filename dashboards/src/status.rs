//! The one-line live status: iterations, median iteration time over the recent window, the
//! largest stall in that window and, on GPUs, how busy they were: the first number a GPU
//! user looks at, live.

use stallscope_analysis::attribution::IterationBreakdown;
use stallscope_analysis::category::{Category, Split};
use stallscope_analysis::secs;

/// Iterations (over all ranks) the status line looks back over.
pub const WINDOW: usize = 32;

/// The recent iterations the status line is drawn from.
#[derive(Debug, Default)]
pub struct StatusModel {
    recent: std::collections::VecDeque<IterationBreakdown>,
    /// Highest iteration number completed by any rank.
    pub iterations: u64,
    /// Ranks seen.
    pub ranks: std::collections::BTreeSet<u32>,
    /// The GPU's busy share of the most recent iterations that had one (any rank), ppm.
    gpu_busy: std::collections::VecDeque<u32>,
}

impl StatusModel {
    /// Takes newly attributed iterations.
    pub fn update(&mut self, new: &[IterationBreakdown]) {
        for b in new {
            self.iterations = self.iterations.max(b.iter + 1);
            self.ranks.insert(b.rank);
            self.recent.push_back(b.clone());
            if self.recent.len() > WINDOW {
                self.recent.pop_front();
            }
        }
    }

    /// Takes an iteration's GPU busy share, ppm (NVML utilisation over the iteration).
    pub fn gpu_busy(&mut self, ppm: u32) {
        self.gpu_busy.push_back(ppm);
        if self.gpu_busy.len() > WINDOW {
            self.gpu_busy.pop_front();
        }
    }

    /// The status text, without line control characters.
    pub fn render(&self) -> String {
        if self.recent.is_empty() {
            return "stallscope: waiting for the first iteration…".into();
        }
        let mut walls: Vec<u64> = self.recent.iter().map(|b| b.wall_ns()).collect();
        walls.sort_unstable();
        let median = walls[walls.len() / 2];
        let mut split = Split::default();
        for b in &self.recent {
            split.add_split(&b.split);
        }
        let stall = match split.largest_stall() {
            Some(c) => format!(
                "largest stall {} {:.0}%",
                c.name(),
                split.get(c) as f64 * 100.0 / split.total().max(1) as f64
            ),
            None => "no stalls".into(),
        };
        let mut line = format!(
            "stallscope: {} it × {} rank{} · median {:.3} s · {} · compute {:.0}%",
            self.iterations,
            self.ranks.len(),
            if self.ranks.len() == 1 { "" } else { "s" },
            secs(median),
            stall,
            split.get(Category::Compute) as f64 * 100.0 / split.total().max(1) as f64
        );
        if !self.gpu_busy.is_empty() {
            let sum: u64 = self.gpu_busy.iter().map(|p| u64::from(*p)).sum();
            let mean = sum as f64 / self.gpu_busy.len() as f64 / 1e4;
            line.push_str(&format!(" · GPU {mean:.0}% busy"));
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stallscope_analysis::attribution::Coverage;

    fn it(rank: u32, iter: u64, wall_ms: u64, prep_ms: u64) -> IterationBreakdown {
        let mut split = Split::default();
        split.add(Category::DataPrep, prep_ms * 1_000_000);
        split.add(Category::Compute, (wall_ms - prep_ms) * 1_000_000);
        IterationBreakdown {
            rank,
            pid: 1,
            iter,
            start_ns: 0,
            end_ns: wall_ms * 1_000_000,
            split,
            evidence: vec![],
            coverage: Coverage::default(),
        }
    }

    #[test]
    fn shows_iterations_median_and_largest_stall() {
        let mut m = StatusModel::default();
        assert!(m.render().contains("waiting"));
        m.update(&[it(0, 0, 100, 60), it(1, 0, 200, 120), it(0, 1, 300, 180)]);
        let s = m.render();
        assert!(s.contains("2 it × 2 ranks"), "{s}");
        assert!(s.contains("median 0.200 s"), "{s}");
        assert!(s.contains("largest stall data_prep 60%"), "{s}");
        assert!(!s.contains("GPU"), "no GPU, no GPU figure: {s}");
        for ppm in [800_000, 900_000] {
            m.gpu_busy(ppm);
        }
        let s = m.render();
        assert!(s.ends_with(" · GPU 85% busy"), "{s}");
    }
}
