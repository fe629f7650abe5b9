//! How the job is parallelised, as far as its markers tell: the finding's advice depends on it.
//!
//! DDP's facts (`comm_buckets`) come from the PyTorch hook's DDP path only, so a job that sent
//! none is not told to tune DDP. A job whose ranks sent to and received from each other with
//! point-to-point operations (`dist.send`/`recv`, marked with `p=`) pipelines its model
//! across them: a rank blocked in `recv` waits for the previous stage, and the advice is to
//! balance the stages.

use crate::loops::MarkerLog;
use crate::marker::Direction;

/// What the markers say of the job's parallelism.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Parallelism {
    /// Some loop wrapped its model in DistributedDataParallel (it sent `comm_buckets`).
    pub ddp: bool,
    /// The pipeline's stages, when ranks exchanged point-to-point operations.
    pub pipeline: Option<Pipeline>,
}

/// A pipeline-parallel job's stages.
#[derive(Clone, Debug, PartialEq)]
pub struct Pipeline {
    /// The ranks that sent or received point-to-point, in stage order (by rank: the order
    /// torch's pipelining schedules and hand-written GPipe loops place stages in).
    pub stages: Vec<u32>,
    /// Micro-batches per iteration: the sends of the first stage to the next, per iteration
    /// of the first stage, when it sent any.
    pub micro_batches: Option<f64>,
}

impl Pipeline {
    /// The stage index of `rank`, if it is one of the stages.
    pub fn stage_of(&self, rank: u32) -> Option<usize> {
        self.stages.iter().position(|r| *r == rank)
    }
}

/// What `log`'s loops said of the job's parallelism.
pub fn of_markers(log: &MarkerLog) -> Parallelism {
    let ranks = log.ranks();
    let ddp = log.loops().any(|p| p.meta.contains_key("comm_buckets"));
    let mut stages: Vec<u32> = log
        .loops()
        .filter(|p| !p.p2p.is_empty())
        .filter_map(|p| ranks.get(&p.pid).copied())
        .collect();
    stages.sort_unstable();
    stages.dedup();
    if stages.len() < 2 {
        return Parallelism {
            ddp,
            pipeline: None,
        };
    }
    let first = log.loops().find(|p| ranks.get(&p.pid) == Some(&stages[0]));
    let micro_batches = first.and_then(|p| {
        let sends = *p.p2p.get(&(stages[1], Direction::Send))?;
        let iterations = p.steps.keys().next_back()? + 1;
        Some(sends as f64 / iterations as f64)
    });
    Parallelism {
        ddp,
        pipeline: Some(Pipeline {
            stages,
            micro_batches,
        }),
    }
}
