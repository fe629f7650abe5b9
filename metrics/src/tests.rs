use std::sync::Arc;

use stallscope_analysis::category::{Category, Split};
use stallscope_analysis::summary::{Categories, Figures};
use stallscope_analysis::view::hub::FeedMessage;
use stallscope_analysis::view::{
    IterationParts, JobView, NodeResources, NodeView, RankView, ViewUpdate,
};

use super::*;

fn parts(iter: u64, compute_ms: u64, wait_ms: u64) -> IterationParts {
    let mut split = Split::default();
    split.add(Category::Compute, compute_ms * 1_000_000);
    split.add(Category::PeerWait, wait_ms * 1_000_000);
    IterationParts {
        iter,
        end_ns: (iter + 1) * 100_000_000,
        split,
        gpu_busy_ppm: None,
    }
}

fn model() -> JobView {
    let mut view = JobView::new("train");
    let mut split = Split::default();
    split.add(Category::Compute, 3_000_000_000);
    split.add(Category::PeerWait, 1_000_000_000);
    let rank = RankView {
        rank: 0,
        node: "a\"b".into(),
        pid: 42,
        figures: Figures {
            iterations: 40,
            wall_seconds: 4.0,
            categories: Categories::from_split(&split),
            ..Figures::default()
        },
        p95_iteration_seconds: 0.12,
        recent: (0..3).map(|i| parts(i, 80, 20)).collect(),
        ..RankView::default()
    };
    view.ranks.insert(0, rank);
    let res = NodeResources {
        t_ns: 1_000_000_000,
        dur_ns: 1_000_000_000,
        nic_rx_bytes_per_s: Some(1000.0),
        nic_tx_bytes_per_s: Some(500.0),
        psi_cpu: Some(0.25),
        ..NodeResources::default()
    };
    view.nodes.insert(
        "a\"b".into(),
        NodeView {
            node: "a\"b".into(),
            ranks: vec![0],
            resources: Some(res.clone()),
            history: [res].into(),
            clock_offset_ns: Some(-1_500_000),
            sources_down: vec!["disk: no whole disk".into()],
            ..NodeView::default()
        },
    );
    view
}

#[test]
fn a_scrape_of_a_model_has_every_family_and_no_unread_source() {
    let mut state = MetricsState::default();
    state.fold(FeedMessage::Snapshot(Arc::new(model())));
    state.fold(FeedMessage::Update(Arc::new(ViewUpdate {
        parts: vec![(0, parts(3, 900, 0))],
        ..ViewUpdate::default()
    })));
    let text = expose::render_with(&state, Some(1.5));
    insta::assert_snapshot!(text);
    assert!(text.contains(
        "stallscope_iteration_duration_seconds_count{job=\"train\",node=\"a\\\"b\",rank=\"0\"} 4"
    ));
    assert!(
        !text.contains("stallscope_node_disk_read_bytes_total"),
        "an unread source is left out"
    );
    assert!(text.contains("source=\"disk\"} 0"));
}

#[test]
fn addresses_default_to_loopback() {
    assert_eq!(
        parse_address(":9").unwrap(),
        SocketAddr::from(([127, 0, 0, 1], 9))
    );
    assert_eq!(
        parse_address("0.0.0.0:7").unwrap(),
        SocketAddr::from(([0, 0, 0, 0], 7))
    );
    assert!(parse_address("nowhere").is_err());
}

#[test]
fn a_histogram_counts_every_iteration_once() {
    let mut h = Histogram::default();
    for s in [0.0005, 0.02, 100.0] {
        h.observe(s);
    }
    assert_eq!(h.count(), 3);
    assert_eq!(h.over, 1);
}

/// The scrape's cost at 1,024 ranks on 128 nodes (docs/BENCHMARKS.md):
/// `cargo test --release -p stallscope-metrics --lib scrape_of_1024_ranks -- --ignored --nocapture`
#[test]
#[ignore]
fn scrape_of_1024_ranks() {
    scrape_of(1024, false, 20.0);
}

/// The same at 10,240 ranks on 1,280 nodes, a collector's job (issue 31, goal < 100 ms):
/// `cargo test --release -p stallscope-metrics --lib scrape_of_10240_ranks -- --ignored --nocapture`
#[test]
#[ignore]
fn scrape_of_10240_ranks() {
    scrape_of(10_240, false, 100.0);
}

/// The same with each rank's summary listing DDP's all-reduce and a broadcast, as a data
/// parallel job's does (8 more series a rank in the four collective families):
/// `cargo test --release -p stallscope-metrics --lib scrape_of_10240_ranks_with_collectives -- --ignored --nocapture`
#[test]
#[ignore]
fn scrape_of_10240_ranks_with_collectives() {
    scrape_of(10_240, true, 100.0);
}

/// Two collectives of a data parallel rank, per iteration.
fn ddp_collectives() -> Vec<stallscope_analysis::collectives::Collective> {
    use stallscope_analysis::collectives::{Collective, Role};
    let op = |op: &str, group: &str, role| Collective {
        op: op.into(),
        group: Some(group.into()),
        role,
        count_per_iteration: 1.0,
        bytes_per_iteration: 4.5e7,
        seconds_per_iteration: 0.012,
        waited_seconds_per_iteration: 0.004,
    };
    vec![
        op("all_reduce", "ddp", Some(Role::DataParallel)),
        op("broadcast", "0", None),
    ]
}

/// Renders a model of `ranks` ranks, 8 a node, 512 recent iterations each (and with
/// `collectives`, two in each rank's summary), 21 times; prints the first scrape's size and
/// the min, median and max of the 20 after it, in CPU time of the rendering thread and in wall
/// time, and fails when the CPU time's median is over `goal_ms`.
fn scrape_of(ranks: u32, collectives: bool, goal_ms: f64) {
    use stallscope_analysis::figures::RankSummary;
    let mut view = model();
    let template = view.ranks[&0].clone();
    let node = view.nodes.values().next().unwrap().clone();
    view.nodes.clear();
    for rank in 0..ranks {
        let name = format!("node{:04}", rank / 8);
        let recent = (0..512)
            .map(|i| parts(i, 80 + u64::from(rank % 7), 20))
            .collect();
        if collectives {
            view.summary.ranks.push(RankSummary {
                rank,
                node: Some(name.clone()),
                figures: template.figures.clone(),
                collectives: ddp_collectives(),
                ..RankSummary::default()
            });
        }
        view.ranks.insert(
            rank,
            RankView {
                rank,
                node: name.clone(),
                recent,
                ..template.clone()
            },
        );
        view.nodes.entry(name.clone()).or_insert_with(|| NodeView {
            node: name,
            ..node.clone()
        });
    }
    let nodes = view.nodes.len();
    let mut state = MetricsState::default();
    state.fold(FeedMessage::Snapshot(Arc::new(view)));
    let text = expose::render(&state);
    let series = text.lines().filter(|l| !l.starts_with('#')).count();
    let (mut cpu, mut wall): (Vec<f64>, Vec<f64>) = (0..20)
        .map(|_| {
            let (cpu, wall) = (thread_cpu_ms(), std::time::Instant::now());
            drop(expose::render(&state));
            (thread_cpu_ms() - cpu, wall.elapsed().as_secs_f64() * 1e3)
        })
        .unzip();
    cpu.sort_by(f64::total_cmp);
    wall.sort_by(f64::total_cmp);
    let median = |v: &[f64]| (v[9] + v[10]) / 2.0;
    println!(
        "{ranks} ranks, {nodes} nodes{}: {} bytes, {series} series; a scrape's CPU min {:.1} ms, median {:.1} ms, max {:.1} ms; wall min {:.1} ms, median {:.1} ms, max {:.1} ms (20 scrapes)",
        if collectives { ", 2 collectives a rank" } else { "" },
        text.len(),
        cpu[0],
        median(&cpu),
        cpu[19],
        wall[0],
        median(&wall),
        wall[19],
    );
    let cpu = median(&cpu);
    assert!(cpu < goal_ms, "a scrape took {cpu:.1} ms of CPU (median)");
}

/// ms, the CPU time this thread used so far (a scrape's cost whatever else the machine runs).
fn thread_cpu_ms() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec to write to.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 * 1e3 + t.tv_nsec as f64 / 1e6
}

#[test]
fn the_text_format_names_counter_families_with_total_and_has_no_eof() {
    let mut state = MetricsState::default();
    state.fold(FeedMessage::Snapshot(Arc::new(model())));
    let open = expose::render_with(&state, Some(1.5));
    assert!(open.contains("# TYPE stallscope_iterations counter\n"));
    assert!(open.ends_with("# EOF\n"));
    let text = expose::to_text_format(&open);
    assert!(text.contains(
        "# HELP stallscope_iterations_total Iterations counted (warm-up left out).\n# TYPE stallscope_iterations_total counter\n"
    ));
    assert!(text.contains("# TYPE stallscope_iteration_duration_seconds histogram\n"));
    assert!(!text.contains("# EOF"));
    // Only the family lines differ.
    let samples = |t: &str| t.lines().filter(|l| !l.starts_with('#')).count();
    assert_eq!(samples(&open), samples(&text));
    assert!(expose::accepts_openmetrics(
        "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
    ));
    assert!(!expose::accepts_openmetrics("*/*"));
}

#[test]
fn gpu_figures_carry_the_gpus_model_name_as_dcgm_exporter_does() {
    use stallscope_analysis::frame::GpuIdentity;
    use stallscope_analysis::gpu_usage::RankGpu;
    let mut view = model();
    view.ranks.get_mut(&0).unwrap().gpu = Some(RankGpu {
        gpu: "0".into(),
        uuid: Some("GPU-1".into()),
        busy_fraction: Some(0.5),
        ..RankGpu::default()
    });
    let mut state = MetricsState::default();
    state.fold(FeedMessage::Snapshot(Arc::new(view.clone())));
    let text = expose::render_with(&state, None);
    assert!(
        text.contains("stallscope_gpu_busy_ratio{job=\"train\",node=\"a\\\"b\",rank=\"0\",gpu=\"0\",UUID=\"GPU-1\"} 0.5"),
        "no name known, no label: {text}"
    );
    view.nodes.get_mut("a\"b").unwrap().gpus = vec![GpuIdentity {
        gpu: "0".into(),
        uuid: Some("GPU-1".into()),
        model: Some("NVIDIA H100 80GB HBM3".into()),
    }];
    let mut state = MetricsState::default();
    state.fold(FeedMessage::Snapshot(Arc::new(view)));
    let text = expose::render_with(&state, None);
    assert!(
        text.contains("UUID=\"GPU-1\",modelName=\"NVIDIA H100 80GB HBM3\"} 0.5"),
        "{text}"
    );
}

#[test]
fn nic_bytes_are_per_interface_where_the_node_counted_them() {
    use stallscope_analysis::frame::NicBytes;
    let mut view = model();
    view.nodes.insert(
        "b".into(),
        NodeView {
            node: "b".into(),
            nics: vec![
                NicBytes {
                    iface: "eth0".into(),
                    rx_bytes: 7,
                    tx_bytes: 8,
                },
                NicBytes {
                    iface: "ib0".into(),
                    rx_bytes: 9_000_000_000,
                    tx_bytes: 10,
                },
            ],
            ..NodeView::default()
        },
    );
    let mut state = MetricsState::default();
    state.fold(FeedMessage::Snapshot(Arc::new(view)));
    let text = expose::render_with(&state, None);
    for want in [
        "stallscope_node_network_bytes_total{job=\"train\",node=\"b\",device=\"eth0\",direction=\"rx\"} 7.0",
        "stallscope_node_network_bytes_total{job=\"train\",node=\"b\",device=\"ib0\",direction=\"rx\"} 9000000000.0",
        "stallscope_node_network_bytes_total{job=\"train\",node=\"b\",device=\"ib0\",direction=\"tx\"} 10.0",
        // A node known only by its readings: its sum, without a device.
        "stallscope_node_network_bytes_total{job=\"train\",node=\"a\\\"b\",direction=\"rx\"} 1000.0",
    ] {
        assert!(text.contains(want), "{want} in {text}");
    }
    assert_eq!(
        text.matches("# TYPE stallscope_node_network_bytes counter")
            .count(),
        1,
        "one family"
    );
}

/// Issue 30, item 12: a fold dropped by the hub (its queue full while a scrape held the
/// state) subscribes again and serves the model as it is now, saying it resynced; before, it
/// served the model it had when dropped for ever.
#[test]
fn a_fold_dropped_by_the_hub_starts_again_from_a_snapshot() {
    use stallscope_analysis::view::hub::{FeedHub, SUBSCRIBER_QUEUE};
    use std::sync::atomic::AtomicBool;
    use std::time::{Duration, Instant};
    let hub = Arc::new(FeedHub::default());
    let state = Arc::new(Mutex::new(MetricsState::default()));
    let stop = Arc::new(AtomicBool::new(false));
    spawn_fold(hub.clone(), state.clone(), stop.clone()).unwrap();
    let mut view = model();
    {
        let _scrape = state.lock().unwrap(); // the fold waits on it
        for _ in 0..2 * SUBSCRIBER_QUEUE {
            hub.publish(&view, ViewUpdate::default());
        }
    }
    view.name = "after".into();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        hub.publish(&view, ViewUpdate::default());
        let s = state.lock().unwrap();
        if s.view.name == "after" {
            assert_eq!(s.resyncs, 1);
            let text = expose::render_with(&s, None);
            assert!(
                text.contains("stallscope_feed_resyncs_total{job=\"after\"} 1"),
                "{text}"
            );
            // The snapshot's iterations were counted before: not again.
            assert_eq!(s.histograms[&0].count(), 3);
            break;
        }
        drop(s);
        assert!(
            Instant::now() < deadline,
            "still the model from before the drop"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, std::sync::atomic::Ordering::Release);
}

/// Issue 30, item 12: a rank that moved to another node (a restarted process given the rank)
/// leaves no series under its former node, and a rank gone from the model none at all.
#[test]
fn a_rank_that_moves_leaves_no_series_behind() {
    use stallscope_analysis::crossnode::StragglerWindow;
    let mut state = MetricsState::default();
    let mut view = model();
    view.stragglers.push_back(StragglerWindow {
        rank: 0,
        node: "a\"b".into(),
        first_iter: 10,
        last_iter: 19,
        held_seconds: 1.5,
        others_wait_fraction: 0.3,
    });
    state.fold(FeedMessage::Snapshot(Arc::new(view.clone())));
    assert!(expose::render_with(&state, None).contains(
        "stallscope_straggler_held_seconds_total{job=\"train\",node=\"a\\\"b\",rank=\"0\"} 1.5"
    ));
    let mut moved = view.ranks[&0].clone();
    moved.node = "c".into();
    state.fold(FeedMessage::Update(Arc::new(ViewUpdate {
        ranks: vec![moved],
        ..ViewUpdate::default()
    })));
    let text = expose::render_with(&state, None);
    assert!(
        !text.contains("node=\"a\\\"b\",rank=\"0\"}"),
        "a series under the former node: {text}"
    );
    view.ranks.clear();
    state.fold(FeedMessage::Snapshot(Arc::new(view)));
    assert!(state.histograms.is_empty() && state.held.is_empty());
}

/// Issue 30: a collector's model has a node's latest one-second reading only every 2 s (what
/// its agent ships), so integrating the readings counted about half the bytes. The node's
/// exact counters, where the model has them, are what the counters expose.
#[test]
fn node_counters_are_the_models_exact_sums_not_integrated_readings() {
    use stallscope_analysis::resources::{NodeCounters, NodeResources};
    let mut view = model();
    let node = view.nodes.values_mut().next().unwrap();
    let name = node.node.clone();
    // Two readings of 1 s at 1 MB/s shipped, over 4 s of the node's time.
    node.history = [0u64, 2]
        .iter()
        .map(|s| NodeResources {
            t_ns: s * 1_000_000_000,
            dur_ns: 1_000_000_000,
            nic_rx_bytes_per_s: Some(1e6),
            ..NodeResources::default()
        })
        .collect();
    node.resources = node.history.back().cloned();
    let mut integrated = MetricsState::default();
    integrated.fold(FeedMessage::Snapshot(Arc::new(view.clone())));
    assert_eq!(
        integrated.nodes[&name].nic_rx_bytes,
        Some(2e6),
        "half of it"
    );

    view.nodes.get_mut(&name).unwrap().counters = Some(NodeCounters {
        nic_rx_bytes: Some(4e6),
        ..NodeCounters::default()
    });
    let mut exact = MetricsState::default();
    exact.fold(FeedMessage::Snapshot(Arc::new(view)));
    assert_eq!(exact.nodes[&name].nic_rx_bytes, Some(4e6));
    let text = expose::render_with(&exact, None);
    assert!(
        text.contains("stallscope_node_network_bytes_total") && text.contains("4000000"),
        "{text}"
    );
}

/// Issue 29: a node's RDMA bytes are a family of their own beside the NICs', per direction,
/// from its exact counters; a node without RDMA ports has none.
#[test]
fn rdma_bytes_are_exposed_per_direction() {
    use stallscope_analysis::resources::NodeCounters;
    let mut view = model();
    let node = view.nodes.keys().next().unwrap().clone();
    let mut without = MetricsState::default();
    without.fold(FeedMessage::Snapshot(Arc::new(view.clone())));
    let text = expose::render_with(&without, None);
    assert!(!text.contains("stallscope_node_rdma_bytes"), "{text}");
    let n = view.nodes.get_mut(&node).unwrap();
    n.counters = Some(NodeCounters {
        nic_rx_bytes: Some(1e3),
        rdma_rx_bytes: Some(4e9),
        rdma_tx_bytes: Some(2e9),
        ..NodeCounters::default()
    });
    n.rdma_counters = vec![stallscope_analysis::frame::RdmaCount {
        device: "mlx5_0".into(),
        port: "1".into(),
        counter: "np_cnp_sent".into(),
        value: 4210,
    }];
    let mut state = MetricsState::default();
    state.fold(FeedMessage::Snapshot(Arc::new(view)));
    let text = expose::render_with(&state, None);
    for direction in ["rx", "tx"] {
        let line = text
            .lines()
            .find(|l| {
                l.starts_with("stallscope_node_rdma_bytes_total{")
                    && l.contains(&format!("direction=\"{direction}\""))
            })
            .unwrap_or_else(|| panic!("{direction} in {text}"));
        let value = if direction == "rx" { 4e9 } else { 2e9 };
        let read: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert_eq!(read, value, "{line}");
    }
    assert!(
        text.contains("# TYPE stallscope_node_rdma_bytes counter"),
        "{text}"
    );
    let counter = text
        .lines()
        .find(|l| l.starts_with("stallscope_node_rdma_counter_total{"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        counter.contains(r#"device="mlx5_0",port="1",counter="np_cnp_sent"} 4210"#),
        "{counter}"
    );
}

#[test]
fn a_hang_is_a_gauge_naming_the_missing_ranks_until_it_resumes() {
    let mut state = MetricsState::default();
    state.fold(FeedMessage::Snapshot(Arc::new(model())));
    assert!(!expose::render_with(&state, None).contains("stallscope_hang"));
    state
        .view
        .summary
        .hangs
        .push(stallscope_analysis::hang::HangReport {
            missing_ranks: vec![1, 3],
            ..Default::default()
        });
    let text = expose::render_with(&state, None);
    assert!(
        text.contains("stallscope_hang{job=\"train\",missing_ranks=\"1,3\"} 1"),
        "{text}"
    );
    state.view.summary.hangs[0].resumed_after_seconds = Some(2.0);
    let text = expose::render_with(&state, None);
    assert!(text.contains("stallscope_hang{job=\"train\",missing_ranks=\"1,3\"} 0"));
    // The collector's names each missing rank's node.
    state
        .view
        .summary
        .hangs
        .push(stallscope_analysis::hang::HangReport {
            at_seconds: 90.0,
            missing_ranks: vec![1],
            missing_at: vec!["1@node-b".into()],
            ..Default::default()
        });
    let text = expose::render_with(&state, None);
    assert!(
        text.contains(
            "stallscope_hang{job=\"train\",missing_ranks=\"1\",missing_at=\"1@node-b\"} 1"
        ),
        "{text}"
    );
}

/// Issue 29: each node's flow bytes per class and direction, and its retransmissions.
#[test]
fn flow_bytes_per_class_and_retransmissions_are_counters() {
    use stallscope_analysis::flows::{FlowClass, FlowClassTotals};
    let mut view = model();
    let node = view.nodes.keys().next().unwrap().clone();
    view.nodes.get_mut(&node).unwrap().flow_classes = vec![
        FlowClassTotals {
            class: Some(FlowClass::Collective),
            bytes_in: 9_000,
            bytes_out: 8_000,
            retransmits: 12,
        },
        FlowClassTotals {
            class: Some(FlowClass::Other),
            bytes_in: 0,
            bytes_out: 25_000_000,
            retransmits: 0,
        },
    ];
    let mut state = MetricsState::default();
    state.fold(FeedMessage::Snapshot(Arc::new(view)));
    let text = expose::render_with(&state, None);
    let value = |prefix: &str, labels: &[&str]| -> f64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(prefix) && labels.iter().all(|x| l.contains(x)))
            .unwrap_or_else(|| panic!("{prefix} {labels:?} in {text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let bytes = "stallscope_flow_bytes_total{";
    assert_eq!(
        value(bytes, &[r#"class="other""#, r#"direction="tx""#]),
        25e6
    );
    assert_eq!(
        value(bytes, &[r#"class="collective""#, r#"direction="rx""#]),
        9e3
    );
    let retrans = "stallscope_tcp_retransmits_total{";
    assert_eq!(value(retrans, &[r#"class="collective""#]), 12.0);
    assert!(
        text.contains("# TYPE stallscope_flow_bytes counter"),
        "{text}"
    );
}

#[test]
fn a_rank_that_turned_slow_is_a_gauge_of_its_factor_until_it_recovers() {
    let mut state = MetricsState::default();
    state.fold(FeedMessage::Snapshot(Arc::new(model())));
    assert!(!expose::render_with(&state, None).contains("stallscope_slowdown"));
    state
        .view
        .summary
        .slowdowns
        .push(stallscope_analysis::slowdown::Slowdown {
            rank: 1,
            node: "n1".into(),
            category: "data_prep".into(),
            since_iteration: 30,
            detected_iteration: 33,
            factor: 2.5,
            ..Default::default()
        });
    let text = expose::render_with(&state, None);
    assert!(
        text.contains(
            "stallscope_slowdown{job=\"train\",rank=\"1\",node=\"n1\",category=\"data_prep\"} 2.5"
        ),
        "{text}"
    );
    state.view.summary.slowdowns[0].until_iteration = Some(60);
    let text = expose::render_with(&state, None);
    assert!(text.contains(
        "stallscope_slowdown{job=\"train\",rank=\"1\",node=\"n1\",category=\"data_prep\"} 0"
    ));
}

#[test]
fn each_ranks_collectives_are_counters_by_operation_group_and_role() {
    use stallscope_analysis::collectives::{Collective, Role};
    use stallscope_analysis::summary::RankSummary;
    let mut view = model();
    view.summary.ranks = vec![RankSummary {
        rank: 0,
        node: Some("n1".into()),
        figures: Figures {
            iterations: 10,
            ..Figures::default()
        },
        collectives: vec![
            Collective {
                op: "all_gather_into_tensor".into(),
                group: Some("0".into()),
                role: Some(Role::Fsdp),
                count_per_iteration: 8.0,
                bytes_per_iteration: 2_105_344.0,
                seconds_per_iteration: 0.012,
                waited_seconds_per_iteration: 0.003,
            },
            Collective {
                op: "all_reduce".into(),
                group: Some("ddp".into()),
                role: Some(Role::DataParallel),
                count_per_iteration: 1.0,
                bytes_per_iteration: 0.0,
                seconds_per_iteration: 0.02,
                waited_seconds_per_iteration: 0.01,
            },
        ],
        ..RankSummary::default()
    }];
    let mut state = MetricsState::default();
    state.fold(FeedMessage::Snapshot(Arc::new(view)));
    let text = expose::render(&state);
    // DDP's all-reduce whose bytes the hook never said: timed and counted, no bytes series.
    let ddp = "{job=\"train\",node=\"n1\",rank=\"0\",op=\"all_reduce\",group=\"ddp\",role=\"ddp\"}";
    assert!(
        text.contains(&format!("stallscope_collective_seconds_total{ddp} 0.2")),
        "{text}"
    );
    assert!(
        !text.contains(&format!("stallscope_collective_bytes_total{ddp}")),
        "{text}"
    );
    let labels = "{job=\"train\",node=\"n1\",rank=\"0\",op=\"all_gather_into_tensor\",group=\"0\",role=\"fsdp\"}";
    for (name, value) in [
        ("stallscope_collective_seconds_total", "0.12"),
        ("stallscope_collective_waited_seconds_total", "0.03"),
        ("stallscope_collective_bytes_total", "21053440"),
        ("stallscope_collective_operations_total", "80"),
    ] {
        let line = format!("{name}{labels} {value}");
        assert!(
            text.lines().any(|l| l.starts_with(&line)),
            "{line} in\n{text}"
        );
    }
    // A job without any has no such family.
    let mut state = MetricsState::default();
    state.fold(FeedMessage::Snapshot(Arc::new(model())));
    assert!(!expose::render(&state).contains("stallscope_collective_"));
}

/// The text format written line by line: every counter family's HELP and TYPE named with
/// `_total`, `# EOF` left out, every other line as it is.
fn text_format_line_by_line(openmetrics: &str) -> String {
    let mut out = String::new();
    let mut lines = openmetrics.lines().peekable();
    while let Some(line) = lines.next() {
        if line == "# EOF" {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap();
            if lines.peek() == Some(&format!("# TYPE {name} counter").as_str()) {
                out += &format!("# HELP {name}_total{}\n", &rest[name.len()..]);
                out += &format!("# TYPE {name}_total counter\n");
                lines.next();
                continue;
            }
        }
        out += line;
        out += "\n";
    }
    out
}

#[test]
fn the_text_format_copied_in_runs_is_the_same_as_line_by_line() {
    let mut state = MetricsState::default();
    let mut view = model();
    view.summary.ranks = vec![stallscope_analysis::figures::RankSummary {
        rank: 0,
        collectives: ddp_collectives(),
        ..Default::default()
    }];
    state.fold(FeedMessage::Snapshot(Arc::new(view)));
    let open = expose::render_with(&state, Some(1.5));
    assert_eq!(
        expose::to_text_format(&open),
        text_format_line_by_line(&open)
    );
    for odd in ["", "# EOF\n", "a 1\n# EOF\n", "a 1", "# HELP x_total y\n"] {
        assert_eq!(
            expose::to_text_format(odd),
            text_format_line_by_line(odd),
            "{odd:?}"
        );
    }
}
