//! DS-Analyzer's what-if model: a data-parallel job runs at the slowest of three rates — how
//! fast the accelerators consume samples (compute), how fast the CPUs prepare them (prep), and
//! how fast storage delivers the part of the dataset that is not cached (fetch). Each rate is
//! measured once; the model then predicts the throughput for other cache sizes and core
//! counts, which is the question "buy more memory, more cores, or faster storage?".

use serde::{Deserialize, Serialize};

/// What the model needs, as measured by the experiment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WhatIfInputs {
    /// Samples per iteration over all processes (the global batch); 1 when unknown, which
    /// makes every rate below iterations/s.
    pub samples_per_iteration: f64,
    /// samples/s the job reaches with synthetic data (no data stall): the compute rate.
    pub compute_samples_per_s: f64,
    /// CPU seconds to prepare one sample (decode, augment, collate), when measured.
    pub prep_core_seconds_per_sample: Option<f64>,
    /// Cores the preparation used in the real-data run.
    pub prep_cores_now: f64,
    /// bytes/s, storage read throughput with a cold cache, when measured.
    pub storage_bytes_per_s: Option<f64>,
    /// bytes read from storage per sample, when measured.
    pub bytes_per_sample: Option<f64>,
    /// Logical CPUs of the node.
    pub cpus: u32,
}

/// The rate that limits a prediction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    /// The accelerators (or compute threads).
    Compute,
    /// CPU preparation.
    Prep,
    /// Storage reads.
    Fetch,
}

/// The predicted throughput at one cache size and core count.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    /// Share of the dataset in the page cache, 0–1.
    pub cached_fraction: f64,
    /// Cores preparing data.
    pub cores: f64,
    /// samples/s.
    pub samples_per_s: f64,
    /// Which rate limits it.
    pub bound: Bound,
}

/// The model's inputs and its table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WhatIf {
    /// What was measured.
    pub inputs: WhatIfInputs,
    /// Predictions over cache fractions 0, ¼, ½, ¾, 1 and a range of core counts.
    pub table: Vec<Prediction>,
}

/// Predicts the throughput with `cached_fraction` of the dataset cached and `cores` preparing.
pub fn predict(inputs: &WhatIfInputs, cached_fraction: f64, cores: f64) -> Prediction {
    let compute = inputs.compute_samples_per_s;
    let prep = match inputs.prep_core_seconds_per_sample {
        Some(s) if s > 0.0 => cores / s,
        _ => f64::INFINITY,
    };
    let uncached = (1.0 - cached_fraction).clamp(0.0, 1.0);
    let fetch = match (inputs.storage_bytes_per_s, inputs.bytes_per_sample) {
        (Some(bw), Some(b)) if b > 0.0 && uncached > 0.0 => bw / (b * uncached),
        _ => f64::INFINITY,
    };
    let (samples_per_s, bound) = [
        (compute, Bound::Compute),
        (prep, Bound::Prep),
        (fetch, Bound::Fetch),
    ]
    .into_iter()
    .fold((f64::INFINITY, Bound::Compute), |best, x| {
        if x.0 < best.0 {
            x
        } else {
            best
        }
    });
    Prediction {
        cached_fraction,
        cores,
        samples_per_s,
        bound,
    }
}

impl WhatIf {
    /// The table for the usual grid: cache fractions 0–1 in quarters; 1, 2, 4, … cores up to
    /// twice the node's, plus the cores used now.
    pub fn tabulate(inputs: WhatIfInputs) -> WhatIf {
        let mut cores: Vec<f64> = Vec::new();
        let mut c = 1.0;
        while c <= (2 * inputs.cpus.max(1)) as f64 {
            cores.push(c);
            c *= 2.0;
        }
        if inputs.prep_cores_now > 0.0 {
            cores.push(inputs.prep_cores_now);
        }
        cores.sort_by(f64::total_cmp);
        cores.dedup_by(|a, b| (*a - *b).abs() < 1e-9);
        let mut table = Vec::new();
        for x in [0.0, 0.25, 0.5, 0.75, 1.0] {
            for &c in &cores {
                table.push(predict(&inputs, x, c));
            }
        }
        WhatIf { inputs, table }
    }
}
