//! A constructed profile for tests of the report and its renderers (here and in the
//! dashboards crate): two ranks stepping every 100 ms for 20 s (data, compute and all-reduce phases marked; rank 1's loader slower, so rank 0 waits for it), with a 2 s checkpoint save in
//! iteration 100 and 3 s of start-up and 1.5 s of teardown around them.

use crate::frame::{Frame, RunEnd, RunHeader};
use crate::marker::{phase, Marker, MarkerEvent};
use crate::Nanos;

const MS: Nanos = 1_000_000;

/// ns, the run's start on the profile's clock.
pub const START_NS: Nanos = 1_000 * MS;

/// The profile's frames; `cut` leaves the end frame out (a profiler killed with -9).
pub fn two_rank_profile(cut: bool) -> Vec<Frame> {
    let mut frames = vec![Frame::Header(RunHeader {
        stallscope_version: "test".into(),
        host: "node-a".into(),
        command: vec!["python3".into(), "train.py".into()],
        started_mono_ns: START_NS,
        warmup_iters: 2,
        cpus: 4,
        ..RunHeader::default()
    })];
    let mut seq = [0u64; 2];
    let mut marker = |rank: usize, t: Nanos, iter: u64, event: MarkerEvent| {
        seq[rank] += 1;
        Marker {
            seq: seq[rank] - 1,
            t_ns: t,
            pid: 100 + rank as u32,
            rank: Some(rank as u32),
            iter,
            event,
        }
    };
    let first = START_NS + 2_000 * MS;
    frames.push(Frame::Markers(vec![
        marker(
            0,
            first,
            0,
            MarkerEvent::Meta(vec![("world_size".into(), "2".into())]),
        ),
        marker(
            1,
            first,
            0,
            MarkerEvent::Meta(vec![("world_size".into(), "2".into())]),
        ),
    ]));
    let mut t = first + 1_000 * MS;
    for i in 0..200u64 {
        // Rank 1 waits 35 ms for its batch, rank 0 20 ms; both compute 55 ms; rank 0 then
        // waits in the all-reduce for rank 1. Iteration 100 saves a checkpoint (2 s of
        // unmarked time).
        let ms = if i == 100 { 2_000 } else { 100 };
        let mut batch = Vec::new();
        for (rank, data_ms) in [(0usize, 20), (1, 35)] {
            let s = t + rank as Nanos * 5 * MS;
            let phases = [
                (phase::DATA, 0, data_ms),
                (phase::COMPUTE, data_ms, data_ms + 55),
                (phase::COMM, data_ms + 55, 95),
            ];
            for (name, from, to) in phases {
                batch.push(marker(
                    rank,
                    s + from * MS,
                    i,
                    MarkerEvent::Begin(name.into()),
                ));
                batch.push(marker(rank, s + to * MS, i, MarkerEvent::End(name.into())));
            }
            batch.push(marker(rank, s + ms * MS, i, MarkerEvent::Step));
        }
        t += ms * MS;
        frames.push(Frame::Markers(batch));
    }
    if !cut {
        frames.push(Frame::End(RunEnd {
            ended_mono_ns: t + 1_500 * MS,
            ..RunEnd::default()
        }));
    }
    frames
}
