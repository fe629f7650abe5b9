//! The performance model: each measured component of the iteration is scaled by what changes
//! between the machine it was measured on and a candidate, and the parts are summed again.
//! Scaling measured parts (rather than predicting from datasheets alone) keeps everything the
//! model does not know — framework overheads, the achieved fraction of a link's nominal rate
//! — at its measured value. See docs/ADVISOR.md for the equations and their sources.

use serde::{Deserialize, Serialize};

use super::catalog::{gpu, Gpu, Instance};
use super::measured::{Breakdown, Measured};
use super::network::{self, ranks_per_node};
use super::notes::Notes;

/// A candidate: an instance type and how many of them.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate<'a> {
    /// The instance.
    pub instance: &'a Instance,
    /// Nodes.
    pub nodes: u32,
}

/// The model's answer for one candidate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InstancePrediction {
    /// The instance type.
    pub instance_type: String,
    /// Provider, when the catalog says.
    pub provider: Option<String>,
    /// Nodes.
    pub nodes: u32,
    /// Ranks (GPUs, or processes on a CPU machine) over all nodes.
    pub ranks: u32,
    /// s, predicted iteration time; `None` when the job cannot run there.
    pub predicted_iteration_seconds: Option<f64>,
    /// The predicted breakdown of one iteration, s.
    pub breakdown: Option<Breakdown>,
    /// Samples per second over the job.
    pub samples_per_second: Option<f64>,
    /// h, predicted time to train.
    pub predicted_hours: Option<f64>,
    /// USD, predicted cost to train (nodes × hours × price).
    pub predicted_cost: Option<f64>,
    /// USD per node-hour used.
    pub price_per_node_hour: f64,
    /// What the prediction rests on.
    pub assumptions: Vec<String>,
    /// Where it leaves what was measured (empty: within it).
    pub extrapolations: Vec<String>,
    /// Why there is no prediction, when there is none.
    pub not_applicable: Option<String>,
    /// On the Pareto front of (hours, cost).
    pub pareto: bool,
    /// This is the machine the profile was measured on, at the measured node count.
    pub current: bool,
}

/// What the training needs to finish.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Work {
    /// Samples to train on (over all ranks).
    Samples(f64),
    /// Iterations to run.
    Iterations(f64),
}

/// Ratio of per-rank compute time on `new` to that on `cur` (1 = as fast).
fn compute_ratio(
    m: &Measured,
    cur: &Instance,
    new: &Instance,
    gpus: &[Gpu],
    notes: &mut Notes,
) -> Option<f64> {
    if !m.on_gpu {
        let _ = (cur, new);
        notes.assume(
            "CPU compute: each rank's compute threads keep their speed; sharing cores with the loader is in the data pipeline's CPU-capacity rate",
        );
        return Some(1.0);
    }
    let (Some(a), Some(b)) = (
        cur.accelerator.as_deref().and_then(|n| gpu(gpus, n)),
        new.accelerator.as_deref().and_then(|n| gpu(gpus, n)),
    ) else {
        notes.extrapolate("a GPU model is not in the GPU table: compute kept as measured");
        return Some(1.0);
    };
    let memory = m.gpu_bound.as_ref().is_some_and(|g| g.memory);
    if a.name != b.name {
        let why = m.gpu_bound.as_ref().map_or_else(
            || "no GPU utilisation figures in the profile: taken as tensor-bound".to_string(),
            |g| g.evidence.clone(),
        );
        notes.assume(if memory {
            format!(
                "compute scales by memory bandwidth, {} {:.0} → {} {:.0} GB/s: the job is memory-bound ({why}); tensor throughput would give {} → {} TFLOPS",
                a.name, a.memory_gbps, b.name, b.memory_gbps, a.bf16_tflops, b.bf16_tflops
            )
        } else {
            format!(
                "compute scales by dense BF16 tensor throughput, {} {} → {} {} TFLOPS ({why}; a job bound by memory bandwidth would scale by {:.0} → {:.0} GB/s)",
                a.name, a.bf16_tflops, b.name, b.bf16_tflops, a.memory_gbps, b.memory_gbps
            )
        });
        notes.extrapolate(format!("compute measured on {}, not on {}", a.name, b.name));
    }
    Some(if memory {
        a.memory_gbps / b.memory_gbps.max(1e-9)
    } else {
        a.bf16_tflops / b.bf16_tflops.max(1e-9)
    })
}

/// DS-Analyzer's pipeline: the loader workers fetch and prepare the next batches while the
/// rank computes, so only loading slower than the rest of the iteration is exposed. Returns
/// the predicted (compute, exposed prep, exposed fetch), s per iteration, given the compute
/// scaled for the candidate. The model's figure for the measured machine is compared with
/// what was measured and the difference (queueing, collation in the main process, other load
/// on the machine) carried over unchanged.
fn loader(
    m: &Measured,
    cur: &Instance,
    new: &Instance,
    compute: f64,
    notes: &mut Notes,
) -> (f64, f64, f64) {
    let b = &m.breakdown;
    // Without the storage rates or the bytes read, a fetch stall scales with the rate alone.
    let linear_fetch = match (cur.storage_mbps, new.storage_mbps) {
        (Some(c), Some(n)) => b.data_fetch * c / n,
        _ => b.data_fetch,
    };
    let (Some(per_sample), Some(batch), Some(workers)) =
        (m.loader_cpu_seconds_per_sample, m.batch_size, m.workers)
    else {
        notes.assume("data preparation kept as measured (loader CPU per sample not measured)");
        return (compute, b.data_prep, linear_fetch);
    };
    if workers == 0 {
        notes
            .assume("data preparation runs in the training process (no workers): kept as measured");
        return (compute, b.data_prep, linear_fetch);
    }
    let batch_cpu = per_sample * batch as f64;
    // Storage in the pipeline: the bytes a batch reads from storage (the uncached share as
    // measured), at each instance's storage rate, shared by the node's ranks.
    let storage = match (
        m.loader_read_bytes_per_sample,
        cur.storage_mbps,
        new.storage_mbps,
    ) {
        (Some(bytes), Some(c), Some(n)) if bytes > 0.0 => {
            let batch_bytes = bytes * batch as f64;
            notes.assume(format!(
                "storage: {:.1} kB read per sample (what the page cache did not hold) at {n} MB/s, shared by the node's ranks",
                bytes / 1e3
            ));
            Some((batch_bytes / (c * 1e6), batch_bytes / (n * 1e6)))
        }
        _ => None,
    };
    let (io_cur, io_new) = storage.unwrap_or((0.0, 0.0));
    // On the CPU the measured compute is stretched by the workers sharing its cores; the
    // rank's own CPU time is its compute on a machine with cores to spare.
    let own = |c: f64| match m.rank_cpu_seconds_per_iteration {
        Some(w) if !m.on_gpu => w.min(c),
        _ => c,
    };
    let cur_pipe = pipeline(
        m,
        cur,
        workers,
        (batch_cpu, io_cur),
        own(b.compute) + b.other,
    );
    let fetch_measured = if storage.is_some() { b.data_fetch } else { 0.0 };
    let residual = b.compute + b.other + b.data_prep + fetch_measured - cur_pipe;
    notes.assume(format!(
        "loader: {:.2} ms CPU per sample measured, {} workers on {:.1} cores per rank (min-of-rates pipeline)",
        per_sample * 1e3,
        workers,
        new.vcpus / ranks_per_node(m, new) as f64
    ));
    let compute_new = own(compute);
    let total = pipeline(m, new, workers, (batch_cpu, io_new), compute_new + b.other) + residual;
    let exposed = (total - compute_new - b.other).max(0.0);
    if storage.is_none() {
        return (compute_new, exposed, linear_fetch);
    }
    // The exposed loading is fetch and prep in the proportion of their parts of the loaders'
    // time per batch.
    let cpu_part = batch_cpu
        / (new.vcpus / ranks_per_node(m, new) as f64)
            .min(workers as f64)
            .max(1.0);
    let io_part = io_new * ranks_per_node(m, new) as f64;
    let fetch_share = io_part / (io_part + cpu_part).max(1e-12);
    (
        compute_new,
        exposed * (1.0 - fetch_share),
        exposed * fetch_share,
    )
}

/// s per iteration of the data pipeline with the rank's other work `rest`: the slowest of the
/// rank's own work; the workers' preparation of one batch (`cpu` CPU seconds over the cores
/// they get); the node's storage reading every rank's batch (`io` s per batch at the full
/// rate); each worker making its batch alone, CPU then reads, over the workers taking turns;
/// and — for a job training on the CPU — all the CPU work of an iteration over the cores the
/// rank has.
fn pipeline(m: &Measured, inst: &Instance, workers: u32, (cpu, io): (f64, f64), rest: f64) -> f64 {
    let ranks = ranks_per_node(m, inst) as f64;
    let per_rank = inst.vcpus / ranks;
    let w = workers as f64;
    let loading = (io * ranks).max((cpu + io) / w);
    if m.on_gpu {
        let cores = (per_rank - 1.0).max(1.0).min(w);
        return rest.max(cpu / cores).max(loading);
    }
    let cores = per_rank.max(1.0);
    rest.max(cpu / cores.min(w))
        .max((rest + cpu) / cores)
        .max(loading)
}

/// Predicts one candidate. `gpus` is the GPU table; `work` how much training is left.
pub fn predict(
    m: &Measured,
    cur: &Instance,
    cand: &Candidate,
    gpus: &[Gpu],
    work: Option<Work>,
    spot: bool,
) -> InstancePrediction {
    let new = cand.instance;
    let mut notes = Notes::default();
    let price = if spot {
        new.spot_price
    } else {
        Some(new.price)
    };
    let mut p = InstancePrediction {
        instance_type: new.instance_type.clone(),
        provider: new.provider.clone(),
        nodes: cand.nodes,
        ranks: cand.nodes * ranks_per_node(m, new),
        predicted_iteration_seconds: None,
        breakdown: None,
        samples_per_second: None,
        predicted_hours: None,
        predicted_cost: None,
        price_per_node_hour: price.unwrap_or(new.price),
        assumptions: Vec::new(),
        extrapolations: Vec::new(),
        not_applicable: None,
        pareto: false,
        current: new.instance_type == cur.instance_type && cand.nodes == m.nodes,
    };
    if m.on_gpu != new.has_gpu() {
        p.not_applicable = Some(if m.on_gpu {
            "a CPU machine: the job trains on GPUs".into()
        } else {
            "has GPUs the job does not use (it trains on the CPU)".into()
        });
        return p;
    }
    if price.is_none() {
        p.not_applicable = Some("no spot price in the catalog".into());
        return p;
    }
    let b = m.breakdown;
    let ratio = compute_ratio(m, cur, new, gpus, &mut notes).unwrap_or(1.0);
    let compute = b.compute * ratio;
    let interconnect = if ranks_per_node(m, new) <= 1 {
        if b.interconnect > 0.0 {
            notes.assume(format!(
                "interconnect: one rank per node has none; the {:.3} s measured is left out",
                b.interconnect
            ));
        }
        0.0
    } else {
        match (cur.gpu_link_gbps, new.gpu_link_gbps) {
            (Some(c), Some(n)) if m.on_gpu => b.interconnect * c / n,
            _ => b.interconnect,
        }
    };
    let network = network::network(m, cur, new, cand.nodes, ratio, &mut notes);
    let (compute, prep, fetch) = loader(m, cur, new, compute, &mut notes);
    notes.assume("peer wait and other time kept as measured; same per-process batch");
    let bd = Breakdown {
        compute,
        data_fetch: fetch,
        data_prep: prep,
        interconnect,
        network,
        peer_wait: b.peer_wait,
        other: b.other,
    };
    with_time(&mut p, m, bd, work, cand.nodes);
    p.assumptions = notes.assumptions;
    p.extrapolations = notes.extrapolations;
    p
}

/// Puts the predicted breakdown `bd` into `p` with what follows from it: throughput, and the
/// hours and cost of `work` on `nodes` nodes.
fn with_time(
    p: &mut InstancePrediction,
    m: &Measured,
    bd: Breakdown,
    work: Option<Work>,
    nodes: u32,
) {
    let t = bd.total();
    if !t.is_finite() {
        // A rate of 0 or a broken figure: no time at all is no candidate.
        p.not_applicable = Some(format!(
            "the model gives no finite time here ({}): a rate of 0 in the catalog?",
            non_finite_parts(&bd)
        ));
        return;
    }
    p.predicted_iteration_seconds = Some(t);
    p.breakdown = Some(bd);
    if let Some(batch) = m.batch_size {
        p.samples_per_second = Some(batch as f64 * p.ranks as f64 / t);
    }
    let iterations = match work {
        Some(Work::Iterations(n)) => Some(n),
        Some(Work::Samples(s)) => m.batch_size.map(|b| s / (b as f64 * p.ranks as f64)),
        None => None,
    };
    if let Some(n) = iterations {
        let hours = n * t / 3600.0;
        p.predicted_hours = Some(hours);
        p.predicted_cost = Some(hours * p.price_per_node_hour * nodes as f64);
    }
}

/// The parts of `bd` that are not finite numbers, by name.
fn non_finite_parts(bd: &Breakdown) -> String {
    bd.named()
        .iter()
        .filter(|(_, s)| !s.is_finite())
        .map(|(name, s)| format!("{name} {s}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Marks the Pareto front of (hours, cost) — or of (iteration time, price per iteration)
/// when no amount of work was given.
pub fn mark_pareto(ps: &mut [InstancePrediction]) {
    let key = |p: &InstancePrediction| -> Option<(f64, f64)> {
        let t = p.predicted_iteration_seconds?;
        let per_iter = t * p.price_per_node_hour * p.nodes as f64 / 3600.0;
        (t.is_finite() && per_iter.is_finite()).then_some((t, per_iter))
    };
    let keys: Vec<Option<(f64, f64)>> = ps.iter().map(key).collect();
    for (i, p) in ps.iter_mut().enumerate() {
        let Some((t, c)) = keys[i] else { continue };
        p.pareto = !keys.iter().enumerate().any(|(j, k)| {
            j != i && k.is_some_and(|(t2, c2)| t2 <= t && c2 <= c && (t2 < t || c2 < c))
        });
    }
}
