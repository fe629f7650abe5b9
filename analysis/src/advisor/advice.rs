//! Communication and data-side advice, each with its predicted gain and the condition under
//! which it does not apply. The first question is whether communication is bound by latency
//! (many small collectives: a faster link does nothing) or by bandwidth (bytes over a link:
//! a faster link, compression or hierarchy helps); the measured bytes per collective decide.

use serde::{Deserialize, Serialize};

use super::catalog::Instance;
use super::measured::Measured;
use super::network::Buckets;
use super::network::{ranks_per_node, ALPHA_SECONDS};

/// One piece of advice.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Advice {
    /// Short name (`gradient_accumulation`, `loader_workers`, …).
    pub kind: String,
    /// What to change, in a sentence.
    pub change: String,
    /// s per iteration the model predicts it saves (an upper bound where it says so).
    pub gain_seconds: f64,
    /// The gain as a share of the measured iteration, 0–1.
    pub gain_fraction: f64,
    /// When it does not apply.
    pub unless: String,
}

/// How the measured communication is bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommBound {
    /// Per-collective latency dominates: bytes per collective are tiny for the link.
    Latency,
    /// Bytes over the link dominate.
    Bandwidth,
    /// Not measured (no DDP buckets seen, or no communication).
    Unknown,
}

/// Latency- or bandwidth-bound: a collective is latency-bound when moving its bytes at the
/// link's rate takes less than its fixed cost α.
pub fn comm_bound(m: &Measured, link_bytes_per_s: f64) -> CommBound {
    match (m.comm_bytes_per_iteration, m.collectives_per_iteration) {
        (Some(b), Some(c)) if c > 0.0 => {
            if b / c / link_bytes_per_s < ALPHA_SECONDS {
                CommBound::Latency
            } else {
                CommBound::Bandwidth
            }
        }
        _ => CommBound::Unknown,
    }
}

fn push(out: &mut Vec<Advice>, m: &Measured, kind: &str, change: String, gain: f64, unless: &str) {
    if gain <= 0.0 {
        return;
    }
    out.push(Advice {
        kind: kind.into(),
        change,
        gain_seconds: gain,
        gain_fraction: gain / m.iteration_seconds.max(1e-12),
        unless: unless.into(),
    });
}

/// The measured link as the network model calibrates it (`network::network`): the buckets
/// (on the wire), the achieved rate in bytes/s, and the ranks of the ring. `None` on one node
/// or without the gradient bytes or the link's nominal rate.
fn calibrated_link(m: &Measured, cur: &Instance) -> Option<(Buckets, f64, u32)> {
    let (buckets, gbps) = (Buckets::of(m)?, cur.network_gbps?);
    if m.nodes <= 1 {
        return None;
    }
    let w = m.ranks.max(2);
    let rate = gbps * 1e9 / 8.0;
    let share = buckets.efficiency(w, rate, m.breakdown.network).taken();
    Some((buckets, share * rate, w))
}

/// The communication advice for the job as measured on `cur`, and what was considered and
/// not advised.
pub fn communication(m: &Measured, cur: &Instance) -> (CommBound, Vec<Advice>, Vec<Advice>) {
    let b = &m.breakdown;
    let exposed = b.network + b.interconnect;
    let link = cur.network_gbps.unwrap_or(10.0) * 1e9 / 8.0;
    let bound = comm_bound(m, link);
    let (mut out, mut not) = (Vec::new(), Vec::new());
    if exposed <= 0.02 * m.iteration_seconds {
        return (bound, out, not);
    }
    let k = 4.0;
    if m.collectives_per_iteration.is_none() {
        // No DDP gradient buckets: the exposed time is not one gradient all-reduce per batch
        // (FSDP gathers parameters for every micro-batch, a pipeline sends activations), so
        // accumulating would not divide it by k, and DDP's knobs do not apply.
        return (bound, out, not);
    }
    push(
        &mut out,
        m,
        "gradient_accumulation",
        format!("accumulate gradients over {k:.0} micro-batches (DDP's no_sync() on all but the last), or a {k:.0}× larger batch per process: one all-reduce per {k:.0} batches"),
        exposed * (1.0 - 1.0 / k),
        "the larger effective batch changes convergence (retune the learning rate)",
    );
    let (Some(bytes), Some(colls)) = (m.comm_bytes_per_iteration, m.collectives_per_iteration)
    else {
        return (bound, out, not);
    };
    let w = m.ranks.max(2) as f64;
    if bound == CommBound::Latency {
        let saved = 2.0 * (w - 1.0) * ALPHA_SECONDS * (colls - 1.0);
        push(
            &mut out,
            m,
            "bucket_size",
            format!("fewer, larger DDP buckets (bucket_cap_mb above {:.1}): {colls:.0} collectives of {:.0} bytes each are latency-bound; a faster link or NVLink would not help", bytes / 1e6 + 1.0, bytes / colls),
            saved.min(exposed),
            "the model has a single bucket already",
        );
        return (bound, out, not);
    }
    let compression = "compress gradients to FP16/BF16 (DDP comm hook fp16_compress_hook / bf16_compress_hook): half the bytes";
    if let Some(hook) = m.comm_hook.as_deref().filter(|_| m.compressed()) {
        not.push(Advice {
            kind: "compression".into(),
            change: compression.into(),
            gain_seconds: 0.0,
            gain_fraction: 0.0,
            unless: format!("the program's comm hook {hook} already sends FP16/BF16"),
        });
    } else {
        // Half the bytes through the same buckets and link: the part hidden behind backward
        // stays hidden, so the exposed time falls by more than half where the link was busy
        // throughout.
        let gain = match calibrated_link(m, cur) {
            Some((buckets, rate, w)) => b.network - buckets.exposed(w, 2.0 * rate, 1.0),
            None => b.network * 0.5,
        };
        push(
            &mut out,
            m,
            "compression",
            compression.into(),
            gain,
            "the gradients are FP16 already, or the job is compute-bound",
        );
    }
    if cur.network_gbps.is_some_and(|g| g <= 25.0) && b.network > 0.2 * m.iteration_seconds {
        let (gain, how) = p3_gain(m);
        push(
            &mut out,
            m,
            "priority_propagation",
            format!("P3-style sliced, prioritised propagation: send the first layers' gradients first so the next forward starts once they arrive ({how})"),
            gain,
            "the network is fast and communication already hidden behind backward",
        );
    }
    let g = ranks_per_node(m, cur) as f64;
    if m.nodes > 1 && g > 1.0 {
        push(
            &mut out,
            m,
            "hierarchical",
            format!("PHub-style hierarchical aggregation: reduce the {g:.0} local ranks first, then one ring across nodes"),
            b.network * (1.0 - 1.0 / g),
            "one rank per node, or NCCL already does a tree/hierarchy",
        );
    }
    (bound, out, not)
}

/// A parameter server in place of the ring, reckoned per worker link (BytePS's analysis):
/// a worker pushes its gradients and pulls the new ones, `B` each way, where the ring moves
/// `2(W−1)/W · B` each way; `k` servers with links like the workers' each take `W·B/k` each way.
/// With dedicated servers (`k = W`) a worker's bytes fall by `W / (2(W−1))`: nothing with 2
/// workers, up to half with many. Co-located on the workers' nodes the servers' bytes share
/// the workers' links and it moves what the ring moves. Each is replayed through the measured
/// buckets (their ready times, the link's achieved share) as [`network`](super::network)
/// predicts the ring. Returns the advised (gain > 0) and the considered but not advised.
pub fn parameter_server(
    m: &Measured,
    cur: &Instance,
    catalog: &[Instance],
) -> (Vec<Advice>, Vec<Advice>) {
    let (mut advised, mut not) = (Vec::new(), Vec::new());
    let Some((buckets, rate, w)) = calibrated_link(m, cur) else {
        return (advised, not);
    };
    let gbps = cur.network_gbps.unwrap_or_default();
    if m.breakdown.network <= 0.02 * m.iteration_seconds {
        return (advised, not);
    }
    // One server machine per worker machine (BytePS's sizing), each with the workers' network.
    let servers = m.nodes;
    let ring = buckets.exposed(w, rate, 1.0);
    let ring_bytes = 2.0 * (w as f64 - 1.0) / w as f64;
    // Dedicated: each worker's link carries B each way against the ring's 2(W−1)/W·B.
    let dedicated = buckets.exposed(w, rate * ring_bytes, 1.0);
    let gain = ring - dedicated;
    let server = catalog
        .iter()
        .filter(|i| !i.has_gpu() && i.network_gbps.is_some_and(|g| g >= gbps))
        .min_by(|a, b| a.price.total_cmp(&b.price));
    let cost = match server {
        Some(s) => {
            let before = m.nodes as f64 * cur.price * m.iteration_seconds;
            let after = (m.nodes as f64 * cur.price + servers as f64 * s.price)
                * (m.iteration_seconds - gain.max(0.0));
            format!(
                "; {servers} × {} at ${:.2}/h each: {:+.0}% cost per iteration",
                s.instance_type,
                s.price,
                (after / before.max(1e-12) - 1.0) * 100.0
            )
        }
        None => "; their machines are not in the catalog (no CPU row with this network)".into(),
    };
    let entry = |kind: &str, change: String, gain: f64, unless: &str| Advice {
        kind: kind.into(),
        change,
        gain_seconds: gain.max(0.0),
        gain_fraction: gain.max(0.0) / m.iteration_seconds.max(1e-12),
        unless: unless.into(),
    };
    let dedicated = entry(
        "parameter_server",
        format!(
            "a parameter server on {servers} dedicated machines (BytePS-style; a worker then moves its gradients once each way, {:.0}% of the ring's bytes){cost}",
            100.0 / ring_bytes
        ),
        gain,
        "2 workers (the ring already moves each byte once each way), fewer servers than workers (their links become the bottleneck), or no machines to spare",
    );
    if gain > 0.0 {
        advised.push(dedicated);
    } else {
        not.push(Advice {
            unless: if w == 2 {
                "with 2 workers the ring already moves each gradient byte once each way".into()
            } else {
                "the exposed communication is per-collective latency, not bytes".into()
            },
            ..dedicated
        });
    }
    not.push(entry(
        "parameter_server_colocated",
        "a parameter server co-located on the workers' nodes: each node's link carries the ring's bytes, now as server and worker".into(),
        0.0,
        "it moves the ring's bytes over each node's link and saves only per-collective latency (2 steps instead of 2(W−1))",
    ));
    (advised, not)
}

/// s per iteration P3-style prioritisation would recover, and how it was reckoned. With the
/// buckets' sizes in ready order, the next forward must wait only for the last-ready bucket
/// (the first layers'); the rest of the exposed transfer can run under the forward, taken as
/// a third of compute (forward against backward's two thirds). Without them, half the exposed
/// network time, as a bound.
fn p3_gain(m: &Measured) -> (f64, String) {
    let b = &m.breakdown;
    let Some(sizes) = m.bucket_bytes.as_ref().filter(|s| s.len() > 1) else {
        return (
            b.network * 0.5,
            "bucket sizes not measured: half the exposed network time, a bound".into(),
        );
    };
    let total: f64 = sizes.iter().sum();
    let first_needed = sizes.last().copied().unwrap_or(0.0) / total.max(1.0);
    let forward = b.compute / 3.0;
    let gain = (b.network * (1.0 - first_needed)).min(forward);
    (
        gain,
        format!(
            "the forward waits for the first layers' bucket, {:.0}% of the {:.1} MB; the rest can hide under a forward of about {:.0} ms",
            first_needed * 100.0,
            // On the wire: half the buckets' FP32 bytes where the program compresses.
            total / 1e6 / if m.compressed() { 2.0 } else { 1.0 },
            forward * 1e3
        ),
    )
}

/// Data-side advice: loader workers, caching the dataset, faster storage.
pub fn data(m: &Measured, cur: &Instance) -> Vec<Advice> {
    let b = &m.breakdown;
    let mut out = Vec::new();
    let cores = cur.vcpus / ranks_per_node(m, cur) as f64;
    if b.data_prep > 0.02 * m.iteration_seconds {
        let w = m.workers.unwrap_or(0);
        let gain = match (m.loader_cpu_seconds_per_sample, m.batch_size) {
            (Some(s), Some(batch)) if w > 0 => {
                let now = s * batch as f64 / (w as f64).min(cores);
                let best = s * batch as f64 / (cores - 1.0).max(1.0);
                (now - best).clamp(0.0, b.data_prep)
            }
            _ => b.data_prep,
        };
        push(
            &mut out,
            m,
            "loader_workers",
            format!("DataLoader num_workers = {:.0} (now {w}; {cores:.0} cores per rank)", (cores - 1.0).max(1.0)),
            gain,
            "the cores are busy with compute (CPU training), or preparation is bound by one worker's Python",
        );
    }
    if b.data_fetch > 0.02 * m.iteration_seconds {
        push(
            &mut out,
            m,
            "cache_dataset",
            "cache the dataset in memory (page cache or a RAM copy): fetch disappears for the cached share".into(),
            b.data_fetch,
            "the dataset does not fit the node's memory (then the gain scales with the cached share)",
        );
        push(
            &mut out,
            m,
            "faster_storage",
            "twice as fast storage (local NVMe instead of network storage)".into(),
            b.data_fetch * 0.5,
            "the reads are bound by decoding, not the device",
        );
    }
    out
}
