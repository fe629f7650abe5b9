//! The advisor: which instance type and node count, and which communication architecture,
//! for a job that was profiled once. It is a pure function ([`advise`]) from what was measured
//! ([`Measured`]) and a catalog to a report ([`AdviceReport`]), rendered separately as text
//! ([`render_text`]) and JSON (schema [`SCHEMA`]), so that `stallscope advise` and later a
//! section of `stallscope report` show the same thing.
//!
//! Every prediction scales the measured parts of the iteration (see [`model`]) and carries
//! the assumptions it rests on; one that leaves what was measured (another GPU model, another
//! node count) says so. docs/ADVISOR.md has the model; docs/BENCHMARKS.md its check against
//! measurements on local "instance shapes".

pub mod advice;
pub mod catalog;
pub mod measured;
pub mod model;
pub mod network;
#[cfg(test)]
mod node_count_tests;
mod notes;
mod render;
mod self_check;
pub mod shape;
pub mod sharded;
#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

pub use advice::{Advice, CommBound};
pub use catalog::{parse_gpus, parse_instances, CatalogError, Gpu, Instance};
pub use measured::{mean, measure, median, pool, Breakdown, GpuBound, Measured, Measuring};
pub use model::{predict, Candidate, InstancePrediction, Work};
pub use render::render_text;

/// Schema name of the JSON.
pub const SCHEMA: &str = "stallscope.advice/1";

/// What the user asked.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// Node counts to consider for every instance type (the measured count when empty).
    pub nodes: Vec<u32>,
    /// How much training is left.
    pub work: Option<Work>,
    /// h, the longest acceptable time to train.
    pub budget_hours: Option<f64>,
    /// Price at spot rates.
    pub spot: bool,
}

/// The advisor's answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdviceReport {
    /// Always [`SCHEMA`].
    pub schema: String,
    /// What was measured.
    pub measured: Measured,
    /// The catalog row the profile was measured on.
    pub current: String,
    /// Every candidate, fastest first; ones the job cannot use last.
    pub instances: Vec<InstancePrediction>,
    /// The cheapest candidate within the budget (or overall, without a budget).
    pub cheapest_within_budget: Option<String>,
    /// How the measured communication is bound.
    pub communication_bound: CommBound,
    /// Communication advice, largest gain first.
    pub communication: Vec<Advice>,
    /// Communication changes considered and not advised (no gain here), with why.
    #[serde(default)]
    pub not_advised: Vec<Advice>,
    /// Data-side advice, largest gain first.
    pub data: Vec<Advice>,
}

/// Runs the model over the catalog.
pub fn advise(
    m: &Measured,
    current: &Instance,
    catalog: &[Instance],
    gpus: &[Gpu],
    req: &Request,
) -> AdviceReport {
    let counts = if req.nodes.is_empty() {
        vec![m.nodes]
    } else {
        req.nodes.clone()
    };
    let mut instances = Vec::new();
    for inst in catalog {
        for &nodes in &counts {
            let cand = Candidate {
                instance: inst,
                nodes,
            };
            let mut p = predict(m, current, &cand, gpus, req.work, req.spot);
            self_check::check(m, &mut p);
            instances.push(p);
        }
    }
    model::mark_pareto(&mut instances);
    instances.sort_by(|a, b| {
        let k = |p: &InstancePrediction| p.predicted_iteration_seconds.unwrap_or(f64::INFINITY);
        k(a).total_cmp(&k(b))
    });
    let cost = |p: &InstancePrediction| {
        p.predicted_cost.or_else(|| {
            p.predicted_iteration_seconds
                .map(|t| t * p.price_per_node_hour * p.nodes as f64)
        })
    };
    let cheapest_within_budget = instances
        .iter()
        .filter(|p| match (req.budget_hours, p.predicted_hours) {
            (Some(b), Some(h)) => h <= b,
            _ => p.predicted_iteration_seconds.is_some(),
        })
        .filter_map(|p| cost(p).filter(|c| c.is_finite()).map(|c| (c, p)))
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, p)| label(p));
    let (communication_bound, mut communication, mut not_advised) =
        advice::communication(m, current);
    let (server, not_server) = advice::parameter_server(m, current, catalog);
    communication.extend(server);
    not_advised.extend(not_server);
    let mut data = advice::data(m, current);
    communication.sort_by(|a, b| b.gain_seconds.total_cmp(&a.gain_seconds));
    data.sort_by(|a, b| b.gain_seconds.total_cmp(&a.gain_seconds));
    AdviceReport {
        schema: SCHEMA.into(),
        measured: m.clone(),
        current: current.instance_type.clone(),
        instances,
        cheapest_within_budget,
        communication_bound,
        communication,
        not_advised,
        data,
    }
}

/// `TYPE` or `N× TYPE`.
pub fn label(p: &InstancePrediction) -> String {
    if p.nodes == 1 {
        p.instance_type.clone()
    } else {
        format!("{}× {}", p.nodes, p.instance_type)
    }
}

/// The catalog row the profile was measured on: the named one, else the only row whose
/// vCPUs and accelerators match the measured node.
pub fn find_current<'a>(
    catalog: &'a [Instance],
    name: Option<&str>,
    m: &Measured,
) -> Result<&'a Instance, String> {
    if let Some(n) = name {
        return catalog
            .iter()
            .find(|i| i.instance_type == n)
            .ok_or_else(|| format!("--current {n}: no such InstanceType in the catalog"));
    }
    let matches: Vec<&Instance> = catalog
        .iter()
        .filter(|i| i.vcpus as u32 == m.cpus && i.has_gpu() == m.on_gpu)
        .collect();
    match matches.as_slice() {
        [one] => Ok(one),
        [] => Err(format!(
            "no catalog row matches the measured node ({} CPUs, {}): name it with --current TYPE",
            m.cpus,
            if m.on_gpu { "GPUs" } else { "no GPU" }
        )),
        many => Err(format!(
            "{} catalog rows match the measured node ({} CPUs): name one with --current TYPE",
            many.len(),
            m.cpus
        )),
    }
}
