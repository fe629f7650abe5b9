//! A constructed profile for tests of the report and its renderers (here and in the
//! dashboards crate): two ranks stepping every 100 ms for 20 s (data, compute and all-reduce
//! phases marked; each loop prepares its batches itself, on its CPU, as its main thread's
//! samples every 10 ms show; rank 1's preparation is slower, so rank 0 waits for it), with a
//! 2 s checkpoint save in iteration 100 and 3 s of start-up and 1.5 s of teardown around them.

use crate::frame::{Frame, RunEnd, RunHeader};
use crate::marker::{phase, Marker, MarkerEvent};
use crate::series::{names, SampleBatch, SeriesDecl, SeriesId, SeriesKind};
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
    let meta = || {
        MarkerEvent::Meta(vec![
            ("world_size".into(), "2".into()),
            ("workers".into(), "0".into()),
        ])
    };
    frames.push(Frame::Markers(vec![
        marker(0, first, 0, meta()),
        marker(1, first, 0, meta()),
    ]));
    // Each loop's main thread: on the CPU while it prepares its batch and computes.
    for rank in 0..2u32 {
        frames.push(Frame::Series(SeriesDecl {
            id: SeriesId(rank),
            name: names::PROC_CPU_NS.into(),
            unit: "ns".into(),
            kind: SeriesKind::Counter,
            labels: vec![("pid".into(), (100 + rank).to_string())],
        }));
    }
    let mut busy: [Vec<(Nanos, Nanos)>; 2] = Default::default();
    let cpu_ns = |busy: &[(Nanos, Nanos)], x: Nanos| -> u64 {
        busy.iter().map(|&(a, b)| b.min(x).saturating_sub(a)).sum()
    };
    let mut next_tick = first;
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
            busy[rank].push((s, s + (data_ms + 55) * MS));
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
        while next_tick <= t {
            frames.push(Frame::Samples(SampleBatch {
                t_ns: next_tick,
                dur_ns: 0,
                values: (0..2u32)
                    .map(|r| (SeriesId(r), cpu_ns(&busy[r as usize], next_tick)))
                    .collect(),
            }));
            next_tick += 10 * MS;
        }
    }
    if !cut {
        frames.push(Frame::End(RunEnd {
            ended_mono_ns: t + 1_500 * MS,
            ..RunEnd::default()
        }));
    }
    frames
}
