//! Tests of the report model on constructed profiles.

use super::sample::{two_rank_profile, START_NS};
use super::*;
use crate::category::Category;
use crate::frame::Frame;

fn report_of(frames: &[Frame]) -> Report {
    let mut b = ReportBuilder::new("");
    for f in frames {
        b.ingest(f);
    }
    b.finish()
}

#[test]
fn the_report_says_what_the_live_model_ended_with() {
    let frames = two_rank_profile(false);
    let r = report_of(&frames);
    let live = crate::journal::Journal::replay(&frames, "");
    assert_eq!(r.summary, live.view().summary);
    assert_eq!(r.name, "train");
    // The verdict is on the critical path: rank 1, whose loader is slower, held every
    // iteration up, so its data prep weighs fully there, where the average over both ranks
    // dilutes it with rank 0's waiting. The live summary's finding reads the same path.
    let live_finding = &live.view().summary.finding;
    let averaged = live.view().summary.job.categories.data_prep.fraction;
    assert_eq!(r.verdict.category, Some(Category::DataPrep));
    assert_eq!(live_finding.category, Some(Category::DataPrep));
    assert_eq!(
        r.verdict.fraction,
        r.breakdown.critical_path.data_prep.fraction
    );
    assert!((live_finding.fraction - r.verdict.fraction).abs() < 1e-9);
    assert!(
        r.verdict.fraction > averaged + 0.05,
        "{} against {averaged}",
        r.verdict.fraction,
    );
    assert_eq!(r.breakdown.ranks.len(), 2);
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    assert_eq!(
        r.verdict.confidence.level, "high",
        "samples cover the iterations, nothing was lost: {:?}",
        r.verdict.confidence
    );
}

#[test]
fn time_outside_iterations_adds_up_and_names_the_checkpoint() {
    let r = report_of(&two_rank_profile(false));
    let o = &r.outside;
    // 2 s before the first marker, 1 s first iteration, 19.9 + 2 s of steps, 1.5 s after.
    assert!((o.run_seconds - 26.4).abs() < 0.01, "{}", o.run_seconds);
    let r0 = &o.ranks[0];
    assert!((r0.before_loop_seconds - 2.0).abs() < 0.01, "{r0:?}");
    assert!((r0.first_iteration_seconds - 1.1).abs() < 0.01, "{r0:?}");
    assert_eq!(r0.long_iterations, 1, "{r0:?}");
    assert!((r0.long_seconds - 2.0).abs() < 0.05, "{r0:?}");
    let sum = r0.before_loop_seconds
        + r0.first_iteration_seconds
        + r0.warmup_seconds
        + r0.steady_seconds
        + r0.long_seconds
        + r0.teardown_seconds;
    assert!(
        (sum - o.run_seconds).abs() < 0.01,
        "{sum} vs {}",
        o.run_seconds
    );
    assert!((r0.teardown_seconds - 1.5).abs() < 0.01, "{r0:?}");
    let long = &o.long_iterations[0];
    assert_eq!(long.iter, 100);
    assert!((long.seconds - 2.0).abs() < 0.01);
    assert!(o.sentence.contains("took far longer"), "{}", o.sentence);
}

#[test]
fn the_timeline_keeps_the_spike_in_its_column() {
    let r = report_of(&two_rank_profile(false));
    let cols = &r.timeline.columns;
    assert!(cols.len() > 20, "{}", cols.len());
    let total: u64 = cols.iter().map(|c| c.iterations).sum();
    assert_eq!(total, 400);
    let spike = cols
        .iter()
        .filter_map(|c| c.slowest.as_ref())
        .max_by(|a, b| a.seconds.total_cmp(&b.seconds))
        .expect("a slowest");
    assert_eq!(spike.iter, 100);
    assert!((spike.seconds - 2.0).abs() < 0.01);
    // Every column's start lies within the run.
    assert!(cols.iter().all(|c| c.start_seconds <= r.run_seconds));
}

#[test]
fn a_long_run_keeps_its_columns_bounded() {
    // 3 hours of one step a second: the axis coarsens, totals stay.
    let mut frames = vec![Frame::Header(crate::frame::RunHeader {
        started_mono_ns: START_NS,
        ..Default::default()
    })];
    for i in 0..10_800u64 {
        frames.push(Frame::Markers(vec![crate::marker::Marker {
            seq: i,
            t_ns: START_NS + (i + 1) * 1_000_000_000,
            pid: 7,
            rank: Some(0),
            iter: i,
            event: crate::marker::MarkerEvent::Step,
        }]));
    }
    let r = report_of(&frames);
    assert!(r.timeline.columns.len() <= columns::MAX_COLUMNS);
    assert!(r.timeline.column_seconds >= 10_800.0 / columns::MAX_COLUMNS as f64);
    assert_eq!(
        r.timeline.columns.iter().map(|c| c.iterations).sum::<u64>(),
        10_800
    );
}

#[test]
fn a_cut_profile_says_so_and_still_reports_what_it_holds() {
    let r = report_of(&two_rank_profile(true));
    assert!(
        r.problems.iter().any(|p| p.contains("was cut")),
        "{:?}",
        r.problems
    );
    assert!(!r.verdict.confidence.complete);
    assert_eq!(r.verdict.confidence.level, "low");
    assert!(r.summary.job.iterations > 100);
}

#[test]
fn an_empty_profile_says_it_is_empty() {
    let r = report_of(&[]);
    assert!(
        r.problems.iter().any(|p| p.contains("no frames")),
        "{:?}",
        r.problems
    );
    assert!(r.timeline.columns.is_empty());
    assert_eq!(r.summary.job.iterations, 0);
}

#[test]
fn two_runs_compare_by_category_and_rank() {
    let before = report_of(&two_rank_profile(false));
    let mut frames = two_rank_profile(false);
    // The same run with every step twice as far apart.
    for f in &mut frames {
        if let Frame::Markers(ms) = f {
            for m in ms {
                m.t_ns = START_NS + (m.t_ns - START_NS) * 2;
            }
        }
        if let Frame::End(e) = f {
            e.ended_mono_ns = START_NS + (e.ended_mono_ns - START_NS) * 2;
        }
    }
    let after = report_of(&frames);
    let c = compare(before, after);
    assert!((c.median_change - 1.0).abs() < 0.05, "{}", c.median_change);
    assert_eq!(c.ranks.len(), 2);
    assert!(c.sentence.contains("+"), "{}", c.sentence);
}

#[test]
fn run_profiles_of_two_nodes_join_into_one_job() {
    let a = two_rank_profile(false);
    let mut b = two_rank_profile(false);
    for f in &mut b {
        match f {
            Frame::Header(h) => {
                h.host = "node-b".into();
                // Booted 5000 s later than node-a, started the same instant.
                h.started_mono_ns += 5_000_000_000_000;
            }
            Frame::Markers(ms) => {
                for m in ms {
                    m.t_ns += 5_000_000_000_000;
                    m.rank = m.rank.map(|r| r + 2);
                }
            }
            Frame::End(e) => e.ended_mono_ns += 5_000_000_000_000,
            _ => {}
        }
    }
    // node-b's GPU, as its run's series name it.
    b.insert(
        1,
        Frame::Series(crate::series::SeriesDecl {
            id: crate::series::SeriesId(900),
            name: "gpu.util_pct".into(),
            unit: "%".into(),
            kind: crate::series::SeriesKind::Gauge,
            labels: vec![
                ("gpu".into(), "0".into()),
                ("model".into(), "NVIDIA A100-SXM4-80GB".into()),
            ],
        }),
    );
    let joined = join::join_runs(&[("a".into(), a), ("b".into(), b)]).expect("joined");
    let r = report_of(&joined);
    assert_eq!(r.breakdown.ranks.len(), 4, "{:?}", r.breakdown.ranks);
    assert_eq!(r.breakdown.nodes.len(), 2);
    assert!((r.run_seconds - 26.4).abs() < 0.1, "{}", r.run_seconds);
    assert_eq!(r.verdict.confidence.clock_uncertainty_ms, Some(10.0));
    let gpus: Vec<(&str, usize)> = r
        .resources
        .iter()
        .map(|n| (n.node.as_str(), n.gpus.len()))
        .collect();
    assert!(gpus.contains(&("node-b", 1)), "{gpus:?}");
    let b = r.resources.iter().find(|n| n.node == "node-b").unwrap();
    assert_eq!(b.gpus[0].model.as_deref(), Some("NVIDIA A100-SXM4-80GB"));
}
