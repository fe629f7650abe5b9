use super::*;
use crate::attribution::IterationBreakdown;
use crate::frame::{RunEnd, RunHeader};
use crate::journal::retention::Retention;
use crate::journal::{Breakdowns, CollectingSink, Journal};
use crate::marker::{phase, Marker};
use crate::series::{names, SampleBatch, SeriesDecl, SeriesId, SeriesKind};
use crate::summary::summarize;

const MS: Nanos = 1_000_000;
const S: Nanos = 1_000_000_000;

/// A live run of two ranks (pids 7 and 8) of `iter_ms`-ms iterations (the last third in
/// communication, rank 1's iteration 3000 ten times longer) for `seconds`, their CPU sampled
/// every 10 ms, recorded through the flight recorder and [`Thinning`]: the live summary and
/// the frames written.
fn live_run(iter_ms: u64, seconds: u64) -> (crate::summary::Summary, Vec<Frame>) {
    live_run_thinned(iter_ms, seconds, true)
}

/// [`live_run`], `thinned` or with every iteration kept.
fn live_run_thinned(
    iter_ms: u64,
    seconds: u64,
    thinned: bool,
) -> (crate::summary::Summary, Vec<Frame>) {
    let out = CollectingSink::default();
    let sink = if thinned {
        Retention::new(Box::new(Thinning::new(Box::new(out.clone()))))
    } else {
        Retention::new(Box::new(out.clone()))
    };
    let header = RunHeader {
        warmup_iters: 5,
        ..RunHeader::default()
    };
    let mut j = Journal::new(Some(Box::new(sink)), header, "", Breakdowns::Written);
    for (id, pid) in [(1, 7u32), (2, 8)] {
        j.emit(Frame::Series(SeriesDecl {
            id: SeriesId(id),
            name: names::PROC_CPU_NS.into(),
            unit: "ns".into(),
            kind: SeriesKind::Counter,
            labels: vec![("pid".into(), pid.to_string())],
        }));
    }
    let start = 1_000 * S;
    let mut next_end = [start + iter_ms * MS; 2];
    let mut iter = [0u64; 2];
    let mut seq = [0u64; 2];
    let end = start + seconds * S;
    let mut t = start;
    while t < end {
        t += 10 * MS;
        j.emit(Frame::Samples(SampleBatch {
            t_ns: t,
            dur_ns: 0,
            values: vec![(SeriesId(1), t / 2), (SeriesId(2), t / 3)],
        }));
        for r in 0..2 {
            let pid = 7 + r as u32;
            let mut ms = Vec::new();
            while next_end[r] <= t {
                let e = next_end[r];
                let wall = if r == 1 && iter[r] == 3_000 {
                    10 * iter_ms * MS
                } else {
                    iter_ms * MS
                };
                let mut mark = |t_ns: Nanos, event: MarkerEvent| {
                    seq[r] += 1;
                    ms.push(Marker {
                        seq: seq[r],
                        t_ns,
                        pid,
                        rank: Some(r as u32),
                        iter: iter[r],
                        event,
                    });
                };
                mark(e - wall / 3, MarkerEvent::Begin(phase::COMM.into()));
                mark(e - MS / 10, MarkerEvent::End(phase::COMM.into()));
                mark(e, MarkerEvent::Step);
                iter[r] += 1;
                next_end[r] = e + wall;
            }
            if !ms.is_empty() {
                j.emit(Frame::Markers(ms));
            }
        }
        if t % S == 0 {
            j.attribute(t, false);
            j.take_update();
            j.prune();
        }
    }
    let (summary, failure) = j.finish(
        end,
        RunEnd {
            ended_mono_ns: end,
            ..RunEnd::default()
        },
    );
    assert_eq!(failure, None);
    let frames = out.0.lock().unwrap().clone();
    (summary, frames)
}

fn breakdowns(frames: &[Frame]) -> Vec<&IterationBreakdown> {
    frames
        .iter()
        .filter_map(|f| match f {
            Frame::Breakdown(b) => Some(b),
            _ => None,
        })
        .collect()
}

#[test]
fn a_fast_loop_keeps_detail_at_the_bounded_rate_and_reads_back_the_live_figures() {
    let (live, frames) = live_run(5, 30);
    let counted: u64 = live.ranks.iter().map(|r| r.figures.iterations).sum();
    assert!(counted > 11_000, "{counted} iterations");
    let kept = breakdowns(&frames);
    // The first and last 1 s of 2 ranks (800), 28 s at 50 a second (1,400), the burst
    // and the long iteration.
    assert!(kept.len() < 2_600, "{} breakdowns kept", kept.len());
    assert!(kept.len() > 2_000, "{} breakdowns kept", kept.len());
    let near: Vec<(u32, u64, u64)> = kept
        .iter()
        .filter(|b| (2_990..3_010).contains(&b.iter))
        .map(|b| (b.rank, b.iter, b.wall_ns() / MS))
        .collect();
    assert!(
        kept.iter().any(|b| b.rank == 1 && b.wall_ns() == 50 * MS),
        "the long one: {near:?}"
    );
    assert!(frames
        .iter()
        .any(|f| matches!(f, Frame::IterationTotals(_))));
    let replayed = summarize(Journal::replay(&frames, "").timeline());
    let (a, b) = (format!("{replayed:#?}"), format!("{live:#?}"));
    let diff: Vec<(&str, &str)> = a.lines().zip(b.lines()).filter(|(x, y)| x != y).collect();
    assert!(diff.is_empty(), "replayed / live: {diff:#?}");
    assert_eq!(replayed, live);
    // Without the totals, the kept iterations alone give other figures.
    let without: Vec<&Frame> = frames
        .iter()
        .filter(|f| !matches!(f, Frame::IterationTotals(_)))
        .collect();
    let partial = summarize(Journal::replay(without, "").timeline());
    assert_ne!(partial.job.iterations, live.job.iterations);
}

#[test]
fn every_kept_iteration_reads_back_with_its_bounds() {
    let (_, frames) = live_run(5, 10);
    let kept: HashSet<(u32, u64)> = breakdowns(&frames)
        .iter()
        .map(|b| (b.pid, b.iter))
        .collect();
    let mut j = Journal::reader("");
    frames.iter().for_each(|f| j.ingest(f));
    let again: HashSet<(u32, u64)> = j
        .attribute(u64::MAX, true)
        .iter()
        .map(|b| (b.pid, b.iter))
        .collect();
    let mut missing: Vec<_> = kept.difference(&again).collect();
    let mut extra: Vec<_> = again.difference(&kept).collect();
    missing.sort();
    extra.sort();
    assert_eq!(
        (&missing, &extra),
        (&vec![], &vec![]),
        "{} kept",
        kept.len()
    );
}

#[test]
fn a_100_ms_loop_keeps_everything_and_writes_its_totals_once() {
    let (live, frames) = live_run(100, 20);
    let counted: u64 = live.ranks.iter().map(|r| r.figures.iterations).sum();
    assert_eq!(breakdowns(&frames).len() as u64, counted + 2 * 5);
    let totals = frames
        .iter()
        .filter(|f| matches!(f, Frame::IterationTotals(_)))
        .count();
    assert_eq!(totals, 1);
    assert_eq!(summarize(Journal::replay(&frames, "").timeline()), live);
}

#[test]
fn a_stretch_asked_for_keeps_its_iterations() {
    let out = CollectingSink::default();
    let keeper = KeepHandle::default();
    let mut t = Box::new(Thinning::new(Box::new(out.clone())).with_keeper(keeper.subscribe()));
    let b = |iter: u64| {
        Frame::Breakdown(IterationBreakdown {
            rank: 0,
            pid: 7,
            iter,
            start_ns: iter * MS,
            end_ns: (iter + 1) * MS,
            split: Default::default(),
            evidence: vec![],
            coverage: Default::default(),
        })
    };
    for i in 0..20_000u64 {
        if i == 10_000 {
            keeper.keep(9_000 * MS, 10_500 * MS);
        }
        t.write(&b(i)).unwrap();
    }
    t.finish().unwrap();
    let frames = out.0.lock().unwrap().clone();
    let kept: Vec<u64> = breakdowns(&frames).iter().map(|b| b.iter).collect();
    // Held for 2 s (2,000 iterations) before written: the 1,000 before the request too.
    assert!((8_999..10_500).all(|i| kept.contains(&i)), "{kept:?}");
    assert!(kept.len() < 8_000, "{}", kept.len());
}

/// Issue 31, item 2: `advise` and `experiment` read a profile through `run_facts`. A thinned
/// one gives the whole run's count, mean, median and critical path (its live totals), not
/// those of the iterations it kept.
#[test]
fn the_run_facts_of_a_thinned_profile_are_the_whole_runs() {
    let (_, thinned) = live_run(5, 30);
    let (_, whole) = live_run_thinned(5, 30, false);
    assert!(breakdowns(&thinned).len() * 3 < breakdowns(&whole).len());
    let (a, b) = (
        crate::run_facts::run_facts(&thinned, 5),
        crate::run_facts::run_facts(&whole, 5),
    );
    assert_eq!(a.ranks, b.ranks);
    assert_eq!(a.iterations_counted, b.iterations_counted);
    let close = |x: f64, y: f64| (x - y).abs() <= 0.005 * y;
    assert!(
        close(a.mean_iteration_seconds, b.mean_iteration_seconds),
        "{} / {}",
        a.mean_iteration_seconds,
        b.mean_iteration_seconds
    );
    assert!(close(
        a.median_iteration_seconds,
        b.median_iteration_seconds
    ));
    let share = |f: &crate::run_facts::RunFacts, c| {
        f.critical_path.get(c) as f64 / f.critical_path.total().max(1) as f64
    };
    for c in crate::category::Category::ALL {
        assert!(
            (share(&a, c) - share(&b, c)).abs() < 0.005,
            "{c:?}: {} / {}",
            share(&a, c),
            share(&b, c)
        );
    }
    assert!(a.critical_path.total() * 100 >= b.critical_path.total() * 99);
    // Without the totals the kept sample alone counts far fewer.
    let kept_only: Vec<Frame> = thinned
        .into_iter()
        .filter(|f| !matches!(f, Frame::IterationTotals(_)))
        .collect();
    let c = crate::run_facts::run_facts(&kept_only, 5);
    assert!(c.iterations_counted * 2 < b.iterations_counted);
}
