use super::*;
use crate::marker::{phase, CommOp};

const MS: Nanos = 1_000_000;

/// Two ranks of one node stepping every 100 ms for `iters` iterations, each all-reducing
/// for the last 30 ms of it.
fn two_ranks(iters: u64) -> Vec<Frame> {
    let mut frames = vec![Frame::Header(RunHeader {
        host: "n1".into(),
        ..RunHeader::default()
    })];
    for i in 1..=iters {
        let t = i * 100 * MS;
        for rank in 0..2u32 {
            let mark = |seq: u64, t_ns: Nanos, event: MarkerEvent| Marker {
                seq,
                t_ns,
                pid: 100 + rank,
                rank: Some(rank),
                iter: i - 1,
                event,
            };
            let op = CommOp {
                op: "all_reduce".into(),
                group: 0,
                seq: i,
                bytes: 4096,
                peer: None,
            };
            frames.push(Frame::Markers(vec![
                mark(
                    3 * i,
                    t - 30 * MS,
                    MarkerEvent::BeginOp(phase::COMM.into(), op),
                ),
                mark(3 * i + 1, t, MarkerEvent::End(phase::COMM.into())),
                mark(3 * i + 2, t, MarkerEvent::Step),
            ]));
        }
    }
    frames
}

fn exported(frames: &[Frame], since_ns: Option<Nanos>) -> (TraceStats, Value) {
    let options = TraceOptions {
        since_ns,
        profile: "p".into(),
    };
    let (stats, bytes) = export(frames, None, &options, Vec::new()).unwrap();
    let v: Value = serde_json::from_slice(&bytes).expect("the trace is JSON");
    (stats, v)
}

fn events<'a>(v: &'a Value, cat: &str) -> Vec<&'a Value> {
    v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["cat"] == cat)
        .collect()
}

#[test]
fn each_rank_has_its_named_track_with_its_iterations_and_collectives() {
    let (stats, v) = exported(&two_ranks(20), None);
    assert_eq!(v["displayTimeUnit"], "ms");
    let names: Vec<&Value> = v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
        .map(|e| &e["args"]["name"])
        .collect();
    assert!(
        names.contains(&&json!("rank 0")) && names.contains(&&json!("rank 1")),
        "{names:?}"
    );
    let iterations = events(&v, "iteration");
    // Each rank's first iteration runs from its first marker.
    assert_eq!(iterations.len(), 2 * 20, "{stats:?}");
    assert_eq!(stats.iterations, 40);
    let collectives = events(&v, "collective");
    assert_eq!(collectives.len(), 40);
    let c = collectives
        .iter()
        .find(|e| e["name"] == "all_reduce g0 #7")
        .unwrap();
    assert!((c["dur"].as_f64().unwrap() - 30_000.0).abs() < 1e-6, "{c}");
    // A rank's iterations thread holds its iterations only: nothing that could straddle an
    // iteration's boundary, which a viewer would answer by dropping the iteration.
    for it in &iterations {
        let others = v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X" && e["pid"] == it["pid"] && e["tid"] == it["tid"])
            .filter(|e| e["cat"] != "iteration")
            .count();
        assert_eq!(others, 0, "{it}");
    }
    // Each iteration's category slices fill it exactly.
    for it in &iterations {
        let (pid, tid, i) = (
            &it["pid"],
            it["tid"].as_u64().unwrap(),
            &it["args"]["iteration"],
        );
        let parts: f64 = events(&v, "category")
            .iter()
            .filter(|e| &e["pid"] == pid && e["tid"].as_u64() == Some(tid + 1))
            .filter(|e| &e["args"]["iteration"] == i)
            .map(|e| e["dur"].as_f64().unwrap())
            .sum();
        assert!((parts - it["dur"].as_f64().unwrap()).abs() < 1e-3, "{it}");
    }
}

#[test]
fn a_window_keeps_only_what_ends_in_it() {
    let (_, v) = exported(&two_ranks(20), Some(1_500 * MS));
    let iterations = events(&v, "iteration");
    // Iterations ending at 1.5 s … 2.0 s: 6 per rank.
    assert_eq!(iterations.len(), 12);
    assert!(iterations
        .iter()
        .all(|e| e["ts"].as_f64().unwrap() + e["dur"].as_f64().unwrap() >= 1_500_000.0));
}

#[test]
fn a_hang_is_a_global_instant_naming_the_missing_rank() {
    let mut frames = two_ranks(5);
    frames.push(Frame::Hang(Box::new(HangReport {
        at_seconds: 70.0,
        missing_ranks: vec![1],
        waiting_ranks: vec![0],
        ..HangReport::default()
    })));
    let (stats, v) = exported(&frames, None);
    assert_eq!(stats.hangs, 1);
    let hang = events(&v, "hang");
    assert_eq!(hang.len(), 1);
    assert_eq!(hang[0]["name"], "hang: rank 1 missing");
    assert_eq!(hang[0]["s"], "g");
    assert_eq!(hang[0]["ts"].as_f64(), Some(70e6));
}

#[test]
fn a_cut_profile_still_gives_a_whole_trace() {
    let frames = two_ranks(20);
    let (_, v) = exported(&frames[..frames.len() / 2], None);
    assert!(!events(&v, "iteration").is_empty());
}

/// A job profile's slices come through the collector's estimate of each node's clock, which
/// moves between two iterations: the next slice on a track whose slices follow one another
/// begins where the previous one ended at the earliest, so the viewer drops none (in CI under
/// load, Perfetto dropped 11 overlapping slices of a two-node job's trace). Slices that do not
/// touch stay where they are.
#[test]
fn a_slice_that_would_overlap_its_predecessor_on_its_track_follows_it() {
    let out = TraceJson::start(Vec::new(), &json!({})).unwrap();
    let mut tracks = Tracks::new(out, 0);
    let track = (1, 1);
    assert_eq!(
        tracks.in_turn(track, 100 * MS, 200 * MS),
        (100 * MS, 200 * MS)
    );
    // The next iteration began 40 us earlier on the trace's clock than the last one ended.
    assert_eq!(
        tracks.in_turn(track, 200 * MS - 40_000, 300 * MS),
        (200 * MS, 300 * MS)
    );
    // One that ended before its predecessor is a zero-length slice at that end.
    assert_eq!(
        tracks.in_turn(track, 250 * MS, 290 * MS),
        (300 * MS, 300 * MS)
    );
    assert_eq!(
        tracks.in_turn(track, 400 * MS, 500 * MS),
        (400 * MS, 500 * MS)
    );
    assert_eq!(
        tracks.in_turn((1, 2), 100 * MS, 150 * MS),
        (100 * MS, 150 * MS),
        "tracks apart"
    );
}
