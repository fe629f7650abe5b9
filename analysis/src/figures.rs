//! The figures of a set of iterations — per category seconds and shares, the median, what was
//! seen — as the summary JSON, the finding, the experiment and the live model all read them.
//! Data and one constructor only, so every module that shows figures can depend on it.

use serde::{Deserialize, Serialize};

use crate::collectives::Collective;

use crate::aggregate::Totals;
use crate::category::{Category, Split};
use crate::gpu_usage::RankGpu;
use crate::secs;

/// One category's time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Share {
    /// Seconds, summed over the iterations counted.
    pub seconds: f64,
    /// Share of the iterations' wall time, 0–1.
    pub fraction: f64,
}

/// Every category's time, in report order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Categories {
    /// See [`Category::Compute`].
    pub compute: Share,
    /// See [`Category::DataFetch`].
    pub data_fetch: Share,
    /// See [`Category::DataPrep`].
    pub data_prep: Share,
    /// See [`Category::Interconnect`].
    pub interconnect: Share,
    /// See [`Category::Network`].
    pub network: Share,
    /// See [`Category::PeerWait`].
    pub peer_wait: Share,
    /// See [`Category::Other`].
    pub other: Share,
}

impl Categories {
    /// Seconds and fractions of a split.
    pub fn from_split(split: &Split) -> Categories {
        let total = split.total();
        let share = |c: Category| Share {
            seconds: secs(split.get(c)),
            fraction: if total == 0 {
                0.0
            } else {
                split.get(c) as f64 / total as f64
            },
        };
        Categories {
            compute: share(Category::Compute),
            data_fetch: share(Category::DataFetch),
            data_prep: share(Category::DataPrep),
            interconnect: share(Category::Interconnect),
            network: share(Category::Network),
            peer_wait: share(Category::PeerWait),
            other: share(Category::Other),
        }
    }

    /// The share of one category.
    pub fn get(&self, c: Category) -> Share {
        match c {
            Category::Compute => self.compute,
            Category::DataFetch => self.data_fetch,
            Category::DataPrep => self.data_prep,
            Category::Interconnect => self.interconnect,
            Category::Network => self.network,
            Category::PeerWait => self.peer_wait,
            Category::Other => self.other,
        }
    }
}

/// How much of the counted wall time markers and samples saw, 0–1.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CoverageShare {
    /// Share inside marked phases.
    pub marked: f64,
    /// Share covered by sample ticks.
    pub sampled: f64,
}

/// The figures of a set of iterations.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Figures {
    /// Iterations counted (warm-up left out).
    pub iterations: u64,
    /// Median iteration wall time, s.
    pub median_iteration_seconds: f64,
    /// Wall time of the counted iterations, s.
    pub wall_seconds: f64,
    /// Per category.
    pub categories: Categories,
    /// What was seen.
    pub coverage: CoverageShare,
}

/// One rank's figures.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankSummary {
    /// Global rank.
    pub rank: u32,
    /// The loop's process id.
    pub pid: u32,
    /// The rank's node, in a multi-node job profile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Figures.
    #[serde(flatten)]
    pub figures: Figures,
    /// Its GPU per counted iteration, when the node had NVML and the rank was mapped to a GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<RankGpu>,
    /// Its communication operations per counted iteration, per (op, group), the most exposed
    /// first; empty for a rank of another node (its agent reports categories only).
    #[serde(default)]
    pub collectives: Vec<Collective>,
}

/// The figures of a set of counted iterations, from their running totals.
pub fn figures(t: &Totals) -> Figures {
    let total = t.split.total();
    let frac = |x: u64| {
        if total == 0 {
            0.0
        } else {
            x as f64 / total as f64
        }
    };
    Figures {
        iterations: t.iterations,
        median_iteration_seconds: secs(t.walls.median()),
        wall_seconds: secs(total),
        categories: Categories::from_split(&t.split),
        coverage: CoverageShare {
            marked: frac(t.marked_ns),
            sampled: frac(t.sampled_ns),
        },
    }
}
