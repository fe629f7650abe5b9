//! How the job is parallelised, as far as its markers tell: the finding's advice depends on it.
//!
//! DDP's facts (`comm_buckets`) come from the PyTorch hook's DDP path only, so a job that sent
//! none is not told to tune DDP. A job whose ranks sent to and received from each other with
//! point-to-point operations (`dist.send`/`recv`, marked with `p=`, or batches of them:
//! `batch_isend_irecv`, which `torch.distributed.pipelining` uses) pipelines its model across
//! them: a rank blocked in `recv` waits for the previous stage, and the advice is to
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

/// What `log`'s loops said of the job's parallelism, those it forgot (they ended) included.
pub fn of_markers(log: &MarkerLog) -> Parallelism {
    let ddp = log.ddp();
    let loops = log.pipeline_stages();
    let mut stages: Vec<u32> = loops.iter().map(|l| l.rank).collect();
    stages.sort_unstable();
    stages.dedup();
    if stages.len() < 2 {
        return Parallelism {
            ddp,
            pipeline: None,
        };
    }
    let first = loops.iter().rev().find(|l| l.rank == stages[0]);
    let micro_batches = first.and_then(|l| {
        let sends = *l.p2p.get(&(stages[1], Direction::Send))?;
        Some(sends as f64 / l.iterations? as f64)
    });
    Parallelism {
        ddp,
        pipeline: Some(Pipeline {
            stages,
            micro_batches,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::marker::{CommOp, Marker, MarkerEvent};

    /// Rank `rank` (process `pid`) marks 2 iterations, each with `ops` communication
    /// operations named `op` (a send or receive to rank `peer` when `peer` is given).
    fn rank(log: &mut MarkerLog, pid: u32, rank: u32, op: &str, peer: Option<u32>) {
        let mut seq = 0;
        let mut mark = |t, iter, event| {
            log.ingest(&Marker {
                seq,
                t_ns: t,
                pid,
                rank: Some(rank),
                iter,
                event,
            });
            seq += 1;
        };
        for iter in 0..2 {
            let t = iter * 1_000;
            for n in 0..4 {
                let op = CommOp {
                    op: op.into(),
                    group: 0,
                    seq: iter * 4 + n,
                    bytes: 16_384,
                    peer,
                };
                mark(t + n * 100, iter, MarkerEvent::BeginOp("comm".into(), op));
                mark(t + n * 100 + 50, iter, MarkerEvent::End("comm".into()));
            }
            mark(t + 900, iter, MarkerEvent::Step);
        }
    }

    #[test]
    fn ranks_that_send_point_to_point_or_in_batches_are_pipeline_stages() {
        let mut log = MarkerLog::default();
        rank(&mut log, 10, 0, "send", Some(1));
        rank(&mut log, 11, 1, "recv", Some(0));
        let p = of_markers(&log)
            .pipeline
            .expect("send and recv make a pipeline");
        assert_eq!(p.stages, [0, 1]);
        assert_eq!(p.micro_batches, Some(4.0));

        // torch.distributed.pipelining's schedules post each micro-batch's sends and
        // receives as one batch, which names no peer.
        let mut log = MarkerLog::default();
        rank(&mut log, 10, 0, "batch_isend_irecv", None);
        rank(&mut log, 11, 1, "batch_isend_irecv", None);
        let p = of_markers(&log).pipeline.expect("batches make a pipeline");
        assert_eq!((&p.stages, p.micro_batches), (&vec![0, 1], None));

        // Ranks that ended are forgotten (a node's agent serves job after job): what they
        // said of their sends and receives stays.
        log.forget(10);
        log.forget(11);
        assert_eq!(of_markers(&log).pipeline, Some(p));

        let mut log = MarkerLog::default();
        rank(&mut log, 10, 0, "all_reduce", None);
        rank(&mut log, 11, 1, "all_reduce", None);
        assert_eq!(
            of_markers(&log).pipeline,
            None,
            "collectives are no pipeline"
        );
    }
}
