//! Peer matching of point-to-point operations: a receive waits for the sender's send of the
//! same number, whatever else either rank did before it.

use super::*;
use crate::frame::Frame;
use crate::marker::{phase, CommOp, Marker, MarkerEvent};
use crate::summary::summarize;

const MS: u64 = 1_000_000;

/// A three-stage pipeline (0 → 1 → 2 and back), 100 ms iterations. Stage 1 computes 38 ms,
/// stage 2 44 ms; each rank's operations, as (rank, begin ms, end ms, op, peer).
fn pipeline_ops() -> Vec<(u32, u64, u64, &'static str, u32)> {
    vec![
        (0, 1, 2, "send", 1),
        (0, 3, 99, "recv", 1),
        (1, 1, 2, "recv", 0),
        (1, 40, 41, "send", 2),
        (1, 41, 85, "recv", 2),
        (1, 90, 99, "send", 0),
        (2, 1, 41, "recv", 1),
        (2, 85, 86, "send", 1),
    ]
}

fn pipeline_job() -> JobTimeline {
    let mut job = JobTimeline::default();
    job.ingest(&Frame::Header(RunHeader::default()));
    let mut markers = Vec::new();
    let mut seqs = [0u64; 3];
    for i in 0..20u64 {
        let t = i * 100 * MS;
        for (rank, a, b, op, peer) in pipeline_ops() {
            let event = MarkerEvent::BeginOp(
                phase::COMM.into(),
                CommOp {
                    op: op.into(),
                    group: 0,
                    seq: i,
                    bytes: 16_384,
                    peer: Some(peer),
                },
            );
            for (t_ns, event) in [
                (t + a * MS, event),
                (t + b * MS, MarkerEvent::End(phase::COMM.into())),
            ] {
                markers.push((rank, t_ns, i, event));
            }
        }
        for rank in 0..3 {
            markers.push((rank, t + 100 * MS, i, MarkerEvent::Step));
        }
    }
    markers.sort_by_key(|m| (m.0, m.1));
    let markers = markers
        .into_iter()
        .map(|(rank, t_ns, iter, event)| {
            let seq = &mut seqs[rank as usize];
            *seq += 1;
            Marker {
                seq: *seq - 1,
                t_ns,
                pid: 100 + rank,
                rank: Some(rank),
                iter,
                event,
            }
        })
        .collect();
    job.ingest(&Frame::Markers(markers));
    job.attribute_ready(u64::MAX, true);
    job
}

/// Stage 2's first operation is its receive from stage 1, which sends only once it has
/// computed: by position it would match the other ranks' first operations (begun at once)
/// and wait for nobody.
#[test]
fn a_receive_waits_for_the_senders_send_of_the_same_number() {
    let s = summarize(&pipeline_job());
    let wait = |rank: usize| s.ranks[rank].figures.categories.peer_wait.fraction;
    let moved = |rank: usize| s.ranks[rank].figures.categories.interconnect.fraction;
    assert!(
        (wait(0) - 0.87).abs() < 0.01,
        "rank 0 waits 3→90 ms: {}",
        wait(0)
    );
    assert!(
        (wait(1) - 0.44).abs() < 0.01,
        "rank 1 waits 41→85 ms: {}",
        wait(1)
    );
    assert!(
        (wait(2) - 0.39).abs() < 0.01,
        "rank 2 waits 2→41 ms: {}",
        wait(2)
    );
    // The rest of each operation is the transfer (on this node: interconnect).
    assert!((moved(0) - 0.10).abs() < 0.01, "{}", moved(0));
    assert!((moved(2) - 0.02).abs() < 0.01, "{}", moved(2));
}

/// The summary lists each rank's sends and receives, per iteration, with the part of their
/// time that was waiting for the peer: what the categories say in total, per operation.
#[test]
fn each_ranks_operations_are_listed_with_their_wait() {
    let s = summarize(&pipeline_job());
    let rank0 = &s.ranks[0];
    let iterations = rank0.figures.iterations;
    assert!(iterations >= 19, "{iterations}");
    let op = |name: &str| {
        rank0
            .collectives
            .iter()
            .find(|c| c.op == name)
            .unwrap_or_else(|| panic!("{name}: {:?}", rank0.collectives))
    };
    let recv = op("recv");
    assert_eq!(recv.role, Some(crate::collectives::Role::Pipeline));
    assert_eq!(recv.group.as_deref(), Some("0"));
    assert_eq!(recv.count_per_iteration, 1.0);
    assert_eq!(recv.bytes_per_iteration, 16_384.0);
    // Rank 0's receive spans 3→99 ms; rank 1 begins its send at 90 ms.
    assert!(
        (recv.seconds_per_iteration - 0.096).abs() < 1e-6,
        "{recv:?}"
    );
    assert!(
        (recv.waited_seconds_per_iteration - 0.087).abs() < 1e-6,
        "{recv:?}"
    );
    let send = op("send");
    assert!(
        (send.seconds_per_iteration - 0.001).abs() < 1e-6,
        "{send:?}"
    );
    // The most exposed first.
    assert_eq!(rank0.collectives[0].op, "recv");
}
