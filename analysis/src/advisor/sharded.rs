//! FSDP's all-gathers and reduce-scatters and a pipeline's point-to-point activations: how
//! many bytes each rank moves per iteration (read from the hook's operation markers), and what
//! they cost over the network on a candidate with more than one node.
//!
//! DDP's gradient all-reduce is replayed bucket by bucket (`super::network`). A fully sharded
//! job has no buckets: each layer's parameters are all-gathered before it runs and its
//! gradients reduce-scattered after, over every rank of the shard group; once the group spans
//! nodes each of them crosses the network as a ring, `(W−1)·α + (W−1)/W · s / ρ` for `s`
//! bytes (the whole tensor gathered or reduced). They sit in front of each layer's compute, so
//! they are taken as exposed: an upper bound, prefetching hides part. A pipeline whose stages
//! span nodes sends its activations (and receives their gradients) across the boundary
//! between the nodes' stages: the boundary stage's point-to-point bytes at the link's rate,
//! plus α per operation, on the critical path of every micro-batch.

use std::collections::HashMap;

use super::measured::Measured;
use super::network::ALPHA_SECONDS;
use crate::collectives::FSDP_OPS;
use crate::frame::Frame;
use crate::marker::MarkerEvent;

/// Point-to-point operations: a pipeline's.
const P2P_OPS: [&str; 5] = ["send", "recv", "isend", "irecv", "batch_isend_irecv"];

/// Bytes and operations of one kind, summed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Sum {
    bytes: f64,
    ops: f64,
}

impl Sum {
    fn add(&mut self, other: Sum) {
        self.bytes += other.bytes;
        self.ops += other.ops;
    }
}

/// One process's operations: those of iterations it ended, and of the one under way.
#[derive(Debug, Default)]
struct Process {
    /// FSDP's and point-to-point operations of the counted iterations it ended.
    sharded: Sum,
    p2p: Sum,
    /// Of the iteration under way (its step not yet seen).
    pending_sharded: Sum,
    pending_p2p: Sum,
    /// Counted iterations it ended.
    iterations: u64,
}

/// Reads the operation markers of a profile, one frame at a time, in memory bounded by the
/// processes.
#[derive(Debug, Default)]
pub struct OpsRead {
    warmup: u32,
    procs: HashMap<u32, Process>,
}

impl OpsRead {
    /// A fold leaving the first `warmup` iterations of each process out.
    pub fn new(warmup: u32) -> OpsRead {
        OpsRead {
            warmup,
            ..OpsRead::default()
        }
    }

    /// Sets the warm-up (before the first marker arrives).
    pub fn set_warmup(&mut self, warmup: u32) {
        self.warmup = warmup;
    }

    /// Takes the profile's next frame.
    pub fn ingest(&mut self, frame: &Frame) {
        let Frame::Markers(markers) = frame else {
            return;
        };
        let warmup = u64::from(self.warmup);
        for mk in markers {
            let counted = mk.iter >= warmup;
            match &mk.event {
                MarkerEvent::BeginOp(_, op) if counted => {
                    let proc = self.procs.entry(mk.pid).or_default();
                    let one = Sum {
                        bytes: op.bytes as f64,
                        ops: 1.0,
                    };
                    if FSDP_OPS.contains(&op.op.as_str()) {
                        proc.pending_sharded.add(one);
                    } else if P2P_OPS.contains(&op.op.as_str()) {
                        proc.pending_p2p.add(one);
                    }
                }
                MarkerEvent::Step if counted => {
                    let proc = self.procs.entry(mk.pid).or_default();
                    let (s, q) = (proc.pending_sharded, proc.pending_p2p);
                    proc.sharded.add(s);
                    proc.p2p.add(q);
                    proc.pending_sharded = Sum::default();
                    proc.pending_p2p = Sum::default();
                    proc.iterations += 1;
                }
                _ => {}
            }
        }
    }

    /// Puts the per-iteration figures into `m`: FSDP's the mean over the ranks (only for a
    /// job without DDP, whose all-gathers are not FSDP's), point-to-point the busiest rank's.
    pub fn finish(self, m: &mut Measured, ddp: bool) {
        let per = |s: Sum, p: &Process| Sum {
            bytes: s.bytes / p.iterations as f64,
            ops: s.ops / p.iterations as f64,
        };
        let counted: Vec<&Process> = self.procs.values().filter(|p| p.iterations > 0).collect();
        let sharded: Vec<Sum> = counted
            .iter()
            .filter(|p| p.sharded.ops > 0.0)
            .map(|p| per(p.sharded, p))
            .collect();
        if !ddp && !sharded.is_empty() {
            let n = sharded.len() as f64;
            m.sharded_bytes_per_iteration = Some(sharded.iter().map(|s| s.bytes).sum::<f64>() / n);
            m.sharded_collectives_per_iteration =
                Some(sharded.iter().map(|s| s.ops).sum::<f64>() / n);
        }
        let busiest = counted
            .iter()
            .filter(|p| p.p2p.ops > 0.0)
            .map(|p| per(p.p2p, p))
            .max_by(|a, b| a.bytes.total_cmp(&b.bytes));
        if let Some(s) = busiest {
            m.p2p_bytes_per_iteration = Some(s.bytes);
            m.p2p_ops_per_iteration = Some(s.ops);
        }
    }
}

/// s per iteration FSDP's all-gathers and reduce-scatters take over `ranks` ranks at
/// `bytes_per_s`, each a ring of `(W−1)` steps; 0 without them or with one rank.
pub fn sharded_seconds(m: &Measured, ranks: u32, bytes_per_s: f64) -> f64 {
    let (Some(bytes), Some(ops)) = (
        m.sharded_bytes_per_iteration,
        m.sharded_collectives_per_iteration,
    ) else {
        return 0.0;
    };
    if ranks <= 1 {
        return 0.0;
    }
    let w = f64::from(ranks);
    (w - 1.0) * ALPHA_SECONDS * ops + (w - 1.0) / w * bytes / bytes_per_s
}

/// s per iteration the pipeline's stage at a node boundary spends sending and receiving its
/// activations and their gradients at `bytes_per_s`; 0 without them.
pub fn p2p_seconds(m: &Measured, bytes_per_s: f64) -> f64 {
    match (m.p2p_bytes_per_iteration, m.p2p_ops_per_iteration) {
        (Some(bytes), Some(ops)) => ALPHA_SECONDS * ops + bytes / bytes_per_s,
        _ => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::marker::{CommOp, Marker};

    fn marker(pid: u32, seq: u64, iter: u64, event: MarkerEvent) -> Marker {
        Marker {
            seq,
            t_ns: seq * 1_000,
            pid,
            rank: Some(pid),
            iter,
            event,
        }
    }

    fn op(name: &str, bytes: u64) -> MarkerEvent {
        let op = CommOp {
            op: name.into(),
            group: 0,
            seq: 0,
            bytes,
            peer: None,
        };
        MarkerEvent::BeginOp("comm".into(), op)
    }

    /// Two ranks' 3 iterations (the first a warm-up): per iteration 2 all-gathers of 1 MB and
    /// a reduce-scatter of 1 MB, and a batch of point-to-point operations of `p2p` bytes; an
    /// operation after the last step, in no counted iteration.
    fn frames(p2p: [u64; 2]) -> Frame {
        let mut out = Vec::new();
        for pid in 0..2 {
            let mut seq = 0;
            let mut push = |iter, event| {
                out.push(marker(pid, seq, iter, event));
                seq += 1;
            };
            for iter in 0..3 {
                push(iter, op("all_gather_into_tensor", 1_000_000));
                push(iter, op("all_gather_into_tensor", 1_000_000));
                push(iter, op("reduce_scatter_tensor", 1_000_000));
                push(iter, op("batch_isend_irecv", p2p[pid as usize]));
                push(iter, MarkerEvent::Step);
            }
            push(3, op("all_gather_into_tensor", 1_000_000));
        }
        Frame::Markers(out)
    }

    #[test]
    fn each_ranks_counted_iterations_give_its_bytes_per_iteration() {
        let mut read = OpsRead::new(1);
        read.ingest(&frames([65_536, 131_072]));
        let mut m = Measured::default();
        read.finish(&mut m, false);
        assert_eq!(m.sharded_bytes_per_iteration, Some(3e6));
        assert_eq!(m.sharded_collectives_per_iteration, Some(3.0));
        assert_eq!(
            m.p2p_bytes_per_iteration,
            Some(131_072.0),
            "the busiest rank's"
        );
        assert_eq!(m.p2p_ops_per_iteration, Some(1.0));

        // In a DDP job the all-gathers are not FSDP's.
        let mut read = OpsRead::new(1);
        read.ingest(&frames([0, 0]));
        let mut ddp = Measured::default();
        read.finish(&mut ddp, true);
        assert_eq!(ddp.sharded_bytes_per_iteration, None);
    }

    #[test]
    fn gathers_and_scatters_cost_a_ring_and_activations_the_boundarys_bytes() {
        let m = Measured {
            sharded_bytes_per_iteration: Some(8e6),
            sharded_collectives_per_iteration: Some(12.0),
            p2p_bytes_per_iteration: Some(1e6),
            p2p_ops_per_iteration: Some(8.0),
            ..Measured::default()
        };
        let rate = 1e9; // bytes/s
                        // 4 ranks: 3 steps of α per operation, 3/4 of the bytes through the slowest link.
        let want = 3.0 * 50e-6 * 12.0 + 0.75 * 8e6 / rate;
        assert!((sharded_seconds(&m, 4, rate) - want).abs() < 1e-12);
        assert_eq!(sharded_seconds(&m, 1, rate), 0.0);
        let want = 50e-6 * 8.0 + 1e6 / rate;
        assert!((p2p_seconds(&m, rate) - want).abs() < 1e-12);
        assert_eq!(p2p_seconds(&Measured::default(), rate), 0.0);
    }
}
