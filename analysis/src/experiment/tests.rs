//! The stall arithmetic on constructed timings.

use super::*;
use crate::attribution::{Coverage, IterationBreakdown};
use crate::category::Split;
use crate::frame::{Frame, ProcessInfo, RunHeader};
use crate::marker::{Marker, MarkerEvent};
use crate::run_facts::run_facts;
use crate::series::{SampleBatch, SeriesDecl, SeriesId, SeriesKind};

fn run(config: Config, times: &[f64]) -> ConfigRun {
    ConfigRun {
        config,
        processes: 2,
        nodes: 1,
        iteration_seconds: times.to_vec(),
        timing: Timing::of(times),
        exit_code: 0,
        profile: String::new(),
        online: None,
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn timing_is_mean_and_standard_error() {
    let t = Timing::of(&[1.0, 2.0, 3.0, 4.0]);
    assert!(close(t.mean_s, 2.5));
    // sample variance 5/3, stderr sqrt(5/3/4)
    assert!(close(t.stderr_s, (5.0f64 / 12.0).sqrt()));
    assert_eq!(t.iterations, 4);
    assert_eq!(Timing::of(&[]).iterations, 0);
    assert!(close(Timing::of(&[7.0]).stderr_s, 0.0));
}

#[test]
fn stalls_are_differences_that_sum_to_the_cold_run() {
    let runs = vec![
        run(Config::Single, &[0.10, 0.10]),
        run(Config::Local, &[0.12, 0.12]),
        run(Config::Nodes, &[0.20, 0.20]),
        run(Config::Warm, &[0.35, 0.35]),
        run(Config::Cold, &[0.50, 0.50]),
    ];
    let d = differential(&runs);
    assert_eq!(d.basis, Some(Config::Cold));
    assert!(close(d.basis_seconds, 0.50));
    assert!(close(d.compute.unwrap().seconds, 0.10));
    assert!(close(d.interconnect.unwrap().seconds, 0.02));
    assert!(close(d.network.unwrap().seconds, 0.08));
    // prep is against the synthetic run in the same layout (R1n), fetch against R3 alone:
    // not the public Stash code's T2 - T3 + T1.
    assert!(close(d.data_prep.unwrap().seconds, 0.15));
    assert!(close(d.data_fetch.unwrap().seconds, 0.15));
    let sum: f64 = [
        d.compute,
        d.interconnect,
        d.network,
        d.data_prep,
        d.data_fetch,
    ]
    .iter()
    .map(|s| s.unwrap().fraction)
    .sum();
    assert!(close(sum, 1.0));
    assert!(close(d.data_fetch.unwrap().fraction, 0.3));
}

#[test]
fn without_nodes_prep_is_against_the_local_synthetic_run() {
    let runs = vec![
        run(Config::Single, &[0.1]),
        run(Config::Local, &[0.2]),
        run(Config::Warm, &[0.5]),
    ];
    let d = differential(&runs);
    assert_eq!(d.basis, Some(Config::Warm));
    assert!(d.network.is_none());
    assert!(d.data_fetch.is_none());
    assert!(close(d.data_prep.unwrap().seconds, 0.3));
    assert!(close(d.data_prep.unwrap().fraction, 0.6));
}

#[test]
fn a_missing_or_empty_run_leaves_its_stalls_unmeasured() {
    let runs = vec![run(Config::Local, &[0.2]), run(Config::Warm, &[])];
    let d = differential(&runs);
    assert_eq!(d.basis, Some(Config::Local));
    assert!(d.compute.is_none());
    assert!(d.interconnect.is_none());
    assert!(d.data_prep.is_none());
    assert_eq!(differential(&[]).basis, None);
}

#[test]
fn negative_differences_are_kept_and_flagged_as_noise() {
    let runs = vec![
        run(Config::Local, &[0.20, 0.22, 0.18, 0.20]),
        run(Config::Warm, &[0.19, 0.20, 0.19, 0.20]),
    ];
    let prep = differential(&runs).data_prep.unwrap();
    assert!(prep.seconds < 0.0);
    assert!(prep.uncertainty_s > 0.0);
    assert!(prep.within_noise());
    let big = differential(&[
        run(Config::Local, &[0.20, 0.21, 0.19]),
        run(Config::Warm, &[0.40, 0.41, 0.39]),
    ])
    .data_prep
    .unwrap();
    assert!(!big.within_noise());
}

#[test]
fn agreement_gives_points_per_measured_category() {
    let runs = vec![
        run(Config::Single, &[0.2]),
        run(Config::Local, &[0.2]),
        run(Config::Warm, &[0.8]),
    ];
    let d = differential(&runs);
    let mut online = Categories::default();
    online.compute.fraction = 0.30;
    online.data_prep.fraction = 0.65;
    online.peer_wait.fraction = 0.05;
    let a = agreement(&online, &d);
    let get = |c: Category| a.iter().find(|x| x.category == c).unwrap();
    assert!(close(get(Category::Compute).error_points().unwrap(), 5.0));
    assert!(close(get(Category::DataPrep).error_points().unwrap(), 10.0));
    assert!(close(
        get(Category::Interconnect).error_points().unwrap(),
        0.0
    ));
    assert_eq!(get(Category::PeerWait).error_points(), None);
    assert_eq!(get(Category::Network).error_points(), None);
}

#[test]
fn what_if_takes_the_slowest_rate() {
    let inputs = WhatIfInputs {
        samples_per_iteration: 64.0,
        compute_samples_per_s: 1000.0,
        prep_core_seconds_per_sample: Some(0.004), // 250 samples/s per core
        prep_cores_now: 2.0,
        storage_bytes_per_s: Some(10e6),
        bytes_per_sample: Some(100e3), // 100 samples/s from storage when nothing is cached
        cpus: 2,
    };
    let p = predict(&inputs, 0.0, 2.0);
    assert_eq!(p.bound, Bound::Fetch);
    assert!(close(p.samples_per_s, 100.0));
    let p = predict(&inputs, 0.9, 2.0); // fetch 1000/s, prep 500/s
    assert_eq!(p.bound, Bound::Prep);
    assert!(close(p.samples_per_s, 500.0));
    let p = predict(&inputs, 1.0, 8.0);
    assert_eq!(p.bound, Bound::Compute);
    assert!(close(p.samples_per_s, 1000.0));
    let table = WhatIf::tabulate(inputs);
    // cores 1, 2, 4 (up to twice the node's 2) × 5 cache fractions
    assert_eq!(table.table.len(), 15);
    let unknown = WhatIfInputs {
        compute_samples_per_s: 30.0,
        ..Default::default()
    };
    assert_eq!(predict(&unknown, 0.0, 1.0).bound, Bound::Compute);
}

fn breakdown(rank: u32, iter: u64, start_ms: u64, wall_ms: u64) -> Frame {
    let mut split = Split::default();
    split.add(Category::Compute, wall_ms * 1_000_000);
    Frame::Breakdown(IterationBreakdown {
        rank,
        pid: 100 + rank,
        iter,
        start_ns: start_ms * 1_000_000,
        end_ns: (start_ms + wall_ms) * 1_000_000,
        split,
        evidence: vec![],
        coverage: Coverage::default(),
    })
}

#[test]
fn facts_average_ranks_per_iteration_and_skip_warmup() {
    let loader = ProcessInfo {
        pid: 200,
        ppid: 100,
        comm: "python3".into(),
        role: crate::frame::Role::Loader,
        rank: Some(0),
        rank_pid: Some(100),
        seen_ns: 0,
    };
    let frames = vec![
        Frame::Header(RunHeader {
            cpus: 8,
            ..Default::default()
        }),
        Frame::Process(loader),
        Frame::Series(SeriesDecl {
            id: SeriesId(3),
            name: crate::series::names::PROC_ALL_CPU_NS.into(),
            unit: "ns".into(),
            kind: SeriesKind::Counter,
            labels: vec![("pid".into(), "200".into())],
        }),
        Frame::Samples(SampleBatch {
            t_ns: 1,
            dur_ns: 0,
            values: vec![(SeriesId(3), 500_000_000)],
        }),
        Frame::Samples(SampleBatch {
            t_ns: 2,
            dur_ns: 0,
            values: vec![(SeriesId(3), 1_500_000_000)],
        }),
        Frame::Markers(vec![Marker {
            seq: 0,
            t_ns: 0,
            pid: 100,
            rank: Some(0),
            iter: 0,
            event: MarkerEvent::Meta(vec![
                ("workers".into(), "1".into()),
                ("batch_size".into(), "32".into()),
                ("dataset_samples".into(), "1000".into()),
            ]),
        }]),
        breakdown(0, 0, 0, 900),
        breakdown(1, 0, 0, 950),
        breakdown(0, 1, 900, 100),
        breakdown(1, 1, 950, 140),
        breakdown(0, 2, 1000, 200),
        breakdown(1, 2, 1090, 100),
    ];
    let f = run_facts(&frames, 1);
    assert_eq!(f.ranks, 2);
    assert_eq!(f.iterations_total, 3);
    assert_eq!(f.iteration_seconds.len(), 2);
    assert!(close(f.iteration_seconds[0], 0.12));
    assert!(close(f.iteration_seconds[1], 0.15));
    assert_eq!(f.batch_size, Some(32));
    assert_eq!(f.workers, Some(1));
    assert_eq!(f.dataset_samples, Some(1000));
    assert!(close(f.loader_cpu_seconds.unwrap(), 1.5));
    assert_eq!(f.batches_prepared_per_rank(), 5);
    assert_eq!(f.cpus, 8);
}

#[test]
fn the_text_names_each_stall_and_what_was_not_measured() {
    let runs = vec![
        run(Config::Single, &[0.1, 0.1]),
        run(Config::Local, &[0.1, 0.1]),
        run(Config::Warm, &[0.4, 0.4]),
    ];
    let differential = differential(&runs);
    let report = ExperimentReport {
        schema: SCHEMA.into(),
        command: vec!["python3".into(), "train.py".into()],
        iterations: 2,
        warmup_iterations: 1,
        agreement: agreement(&Categories::default(), &differential),
        differential,
        runs,
        what_if: None,
    };
    let text = render_text(&report);
    assert!(text.contains("share of R3"), "{text}");
    assert!(text.contains("T(R3) - T(R1)"), "{text}");
    assert!(text.contains("75.0%"), "{text}");
    assert!(text
        .lines()
        .any(|l| l.contains("network") && l.contains("not measured")));
}

#[test]
fn the_critical_path_takes_the_rank_the_others_waited_for() {
    let mk = |rank: u32, iter: u64, parts: &[(Category, u64)]| {
        let mut split = Split::default();
        for (c, ms) in parts {
            split.add(*c, ms * 1_000_000);
        }
        Frame::Breakdown(IterationBreakdown {
            rank,
            pid: rank,
            iter,
            start_ns: 0,
            end_ns: split.total(),
            split,
            evidence: vec![],
            coverage: Coverage::default(),
        })
    };
    use Category::*;
    let frames = vec![
        // rank 1 fetches for 60 ms while rank 0 waits for it
        mk(0, 0, &[(Compute, 40), (PeerWait, 60)]),
        mk(1, 0, &[(Compute, 40), (DataFetch, 60)]),
        // next iteration rank 0 is the slow one
        mk(0, 1, &[(Compute, 40), (DataPrep, 30)]),
        mk(1, 1, &[(Compute, 40), (PeerWait, 30)]),
    ];
    let f = run_facts(&frames, 0);
    let c = Categories::from_split(&f.critical_path);
    assert!(close(c.data_fetch.seconds, 0.06));
    assert!(close(c.data_prep.seconds, 0.03));
    assert!(close(c.compute.seconds, 0.08));
    assert!(close(c.peer_wait.seconds, 0.0));
}

#[test]
fn the_text_of_a_full_experiment() {
    let runs = vec![
        run(Config::Single, &[0.100, 0.102]),
        run(Config::Local, &[0.120, 0.118]),
        run(Config::Nodes, &[0.150, 0.152]),
        run(Config::Warm, &[0.250, 0.254]),
        run(Config::Cold, &[0.400, 0.396]),
    ];
    let differential = differential(&runs);
    let mut online = Split::default();
    for (c, ms) in [
        (Category::Compute, 100),
        (Category::Interconnect, 15),
        (Category::Network, 35),
        (Category::DataPrep, 90),
        (Category::DataFetch, 160),
    ] {
        online.add(c, ms);
    }
    let report = ExperimentReport {
        schema: SCHEMA.into(),
        command: vec![
            "python3".into(),
            "train.py".into(),
            "--workers".into(),
            "2".into(),
        ],
        iterations: 2,
        warmup_iterations: 1,
        agreement: agreement(&Categories::from_split(&online), &differential),
        differential,
        runs,
        what_if: Some(WhatIf::tabulate(WhatIfInputs {
            samples_per_iteration: 32.0,
            compute_samples_per_s: 320.0,
            prep_core_seconds_per_sample: Some(0.01),
            prep_cores_now: 2.0,
            storage_bytes_per_s: Some(50e6),
            bytes_per_sample: Some(200e3),
            cpus: 8,
        })),
    };
    insta::assert_snapshot!(render_text(&report));
}
