//! The differential measurement of Stash (ICDCS 2023) and DS-Analyzer (VLDB 2021): stalls
//! measured as differences between controlled runs of the same training.
//!
//! The online breakdown infers stalls from markers and counters; this module is its ground
//! truth. The same per-process batch and the same iterations run in several configurations
//! ([`Config`]); each configuration adds one cause of delay to the one before it, so the
//! difference of their mean iteration times is what that cause costs:
//!
//! | stall | difference |
//! |---|---|
//! | compute | T(R0): one process, synthetic data |
//! | interconnect | T(R1) − T(R0): all local processes, synthetic |
//! | network | T(R1n) − T(R1): the processes spread over the nodes, synthetic |
//! | prep | T(R3) − T(R1n or R1): real data, warm page cache |
//! | fetch | T(R2) − T(R3): real data, cold page cache |
//!
//! The real-data runs use the full layout (the nodes when given), so the differences telescope:
//! T(R2) = compute + interconnect + network + prep + fetch. (The public Stash code computes
//! fetch as T2 − T3 + T1; that counts the synthetic time twice and is not copied here.)
//! Differences are reported as measured, negative ones included, with an uncertainty from the
//! spread of the iteration times, so noise shows as noise instead of being clipped away.

use serde::{Deserialize, Serialize};

use crate::category::Category;
use crate::figures::Categories;

mod render;
mod whatif;

pub use render::render_text;
pub use whatif::{predict, Bound, Prediction, WhatIf, WhatIfInputs};

/// Schema name of the experiment JSON.
pub const SCHEMA: &str = "stallscope.experiment/1";

/// One controlled configuration of the training.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Config {
    /// R0: one process, synthetic data (the first batch replayed).
    Single,
    /// R1: all local processes, synthetic data.
    Local,
    /// R1n: the same number of processes spread over the nodes, synthetic data.
    Nodes,
    /// R3: real data, warm page cache.
    Warm,
    /// R2: real data, cold page cache.
    Cold,
}

impl Config {
    /// Every configuration, in the order they run.
    pub const ALL: [Config; 5] = [
        Config::Single,
        Config::Local,
        Config::Nodes,
        Config::Warm,
        Config::Cold,
    ];

    /// The papers' name: `R0`, `R1`, `R1n`, `R2`, `R3`.
    pub fn label(self) -> &'static str {
        match self {
            Config::Single => "R0",
            Config::Local => "R1",
            Config::Nodes => "R1n",
            Config::Cold => "R2",
            Config::Warm => "R3",
        }
    }

    /// Parses a label (case-insensitive).
    pub fn from_label(s: &str) -> Option<Config> {
        Config::ALL
            .into_iter()
            .find(|c| c.label().eq_ignore_ascii_case(s.trim()))
    }

    /// What the configuration is, in a few words.
    pub fn describe(self) -> &'static str {
        match self {
            Config::Single => "1 process, synthetic data",
            Config::Local => "all local processes, synthetic data",
            Config::Nodes => "processes over the nodes, synthetic data",
            Config::Warm => "real data, warm cache",
            Config::Cold => "real data, cold cache",
        }
    }

    /// Whether the hook replays the first batch instead of loading data.
    pub fn synthetic(self) -> bool {
        matches!(self, Config::Single | Config::Local | Config::Nodes)
    }
}

/// The mean of a set of iteration times with its standard error.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// s per iteration.
    pub mean_s: f64,
    /// s, standard error of the mean (0 with fewer than 2 iterations).
    pub stderr_s: f64,
    /// Iterations counted.
    pub iterations: u64,
}

impl Timing {
    /// Mean and standard error of `xs` (s).
    pub fn of(xs: &[f64]) -> Timing {
        let n = xs.len();
        if n == 0 {
            return Timing::default();
        }
        let mean = xs.iter().sum::<f64>() / n as f64;
        let stderr = if n < 2 {
            0.0
        } else {
            let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
            (var / n as f64).sqrt()
        };
        Timing {
            mean_s: mean,
            stderr_s: stderr,
            iterations: n as u64,
        }
    }
}

/// One configuration as run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConfigRun {
    /// Which configuration.
    pub config: Config,
    /// Training processes.
    pub processes: u32,
    /// Nodes they ran on.
    pub nodes: u32,
    /// s, the wall time of each counted iteration (warm-up left out), averaged over ranks.
    pub iteration_seconds: Vec<f64>,
    /// Mean and spread of `iteration_seconds`.
    pub timing: Timing,
    /// The command's exit code (128 + signal when killed).
    pub exit_code: i32,
    /// The run's own profile.
    pub profile: String,
    /// The online breakdown of this run along the job's critical path (see
    /// [`crate::run_facts::RunFacts::critical_path`]), when iterations were attributed.
    pub online: Option<Categories>,
}

/// One stall measured by difference.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stall {
    /// s per iteration (negative when the later configuration ran faster: noise).
    pub seconds: f64,
    /// s, standard error of the difference.
    pub uncertainty_s: f64,
    /// Share of the real-data iteration time.
    pub fraction: f64,
}

impl Stall {
    /// Whether the difference is within two standard errors of zero.
    pub fn within_noise(&self) -> bool {
        self.seconds.abs() < 2.0 * self.uncertainty_s
    }
}

/// The stalls by difference; a stall whose two configurations did not both run is `None`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Differential {
    /// The configuration whose time the fractions are of (R2 when run, else R3, else the
    /// slowest synthetic one).
    pub basis: Option<Config>,
    /// s per iteration of the basis configuration.
    pub basis_seconds: f64,
    /// T(R0).
    pub compute: Option<Stall>,
    /// T(R1) − T(R0).
    pub interconnect: Option<Stall>,
    /// T(R1n) − T(R1).
    pub network: Option<Stall>,
    /// T(R3) − T(R1n or R1).
    pub data_prep: Option<Stall>,
    /// T(R2) − T(R3).
    pub data_fetch: Option<Stall>,
}

impl Differential {
    /// The stall of a category, where the differential method measures it.
    pub fn get(&self, c: Category) -> Option<Stall> {
        match c {
            Category::Compute => self.compute,
            Category::Interconnect => self.interconnect,
            Category::Network => self.network,
            Category::DataPrep => self.data_prep,
            Category::DataFetch => self.data_fetch,
            Category::PeerWait | Category::Other => None,
        }
    }
}

/// Times by configuration, as [`differential`] reads them.
pub fn timing_of(runs: &[ConfigRun], config: Config) -> Option<Timing> {
    runs.iter()
        .find(|r| r.config == config && r.timing.iterations > 0)
        .map(|r| r.timing)
}

/// Computes the stalls by difference from the configurations that ran.
pub fn differential(runs: &[ConfigRun]) -> Differential {
    let t = |c| timing_of(runs, c);
    // With one process on one node, R1 is R0 and is not run.
    let synthetic_full = t(Config::Nodes).or(t(Config::Local)).or(t(Config::Single));
    let basis = [
        Config::Cold,
        Config::Warm,
        Config::Nodes,
        Config::Local,
        Config::Single,
    ]
    .into_iter()
    .find(|c| t(*c).is_some());
    let basis_seconds = basis.and_then(t).map_or(0.0, |x| x.mean_s);
    let stall = |later: Option<Timing>, earlier: Option<Timing>| -> Option<Stall> {
        let later = later?;
        let (mean, var) = match earlier {
            Some(e) => (
                later.mean_s - e.mean_s,
                later.stderr_s.powi(2) + e.stderr_s.powi(2),
            ),
            None => (later.mean_s, later.stderr_s.powi(2)),
        };
        Some(Stall {
            seconds: mean,
            uncertainty_s: var.sqrt(),
            fraction: if basis_seconds > 0.0 {
                mean / basis_seconds
            } else {
                0.0
            },
        })
    };
    let pair = |later: Option<Timing>, earlier: Option<Timing>| {
        earlier.and_then(|e| stall(later, Some(e)))
    };
    Differential {
        basis,
        basis_seconds,
        compute: stall(t(Config::Single), None),
        interconnect: pair(t(Config::Local), t(Config::Single)),
        network: pair(t(Config::Nodes), t(Config::Local)),
        data_prep: pair(t(Config::Warm), synthetic_full),
        data_fetch: pair(t(Config::Cold), t(Config::Warm)),
    }
}

/// One category held against the differential truth.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Agreement {
    /// The category.
    pub category: Category,
    /// Share of the online breakdown, 0–1.
    pub online: f64,
    /// Share by difference, 0–1 (`None` where the method does not measure it).
    pub differential: Option<f64>,
}

impl Agreement {
    /// |online − differential| in percentage points.
    pub fn error_points(&self) -> Option<f64> {
        self.differential.map(|d| (self.online - d).abs() * 100.0)
    }
}

/// The online shares of `online` next to the differential ones, per category in report order.
pub fn agreement(online: &Categories, diff: &Differential) -> Vec<Agreement> {
    Category::ALL
        .into_iter()
        .map(|c| Agreement {
            category: c,
            online: online.get(c).fraction,
            differential: diff.get(c).map(|s| s.fraction),
        })
        .collect()
}

/// The whole experiment: what ran, the stalls by difference, the what-if table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExperimentReport {
    /// Always [`SCHEMA`].
    pub schema: String,
    /// The training command.
    pub command: Vec<String>,
    /// Iterations per process counted in each configuration.
    pub iterations: u32,
    /// Iterations per process left out at the start of each configuration.
    pub warmup_iterations: u32,
    /// Each configuration as run, in run order.
    pub runs: Vec<ConfigRun>,
    /// The stalls by difference.
    pub differential: Differential,
    /// The online breakdown (critical path) of the run the fractions are of, next to the
    /// differential.
    pub agreement: Vec<Agreement>,
    /// DS-Analyzer's what-if model, when its inputs were measured.
    pub what_if: Option<WhatIf>,
}

#[cfg(test)]
mod tests;
