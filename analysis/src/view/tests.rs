use super::*;
use crate::attribution::{Coverage, IterationBreakdown};
use crate::category::Category;
use crate::frame::{Frame, RunHeader};
use crate::job::JobTimeline;
use crate::series::{SampleBatch, SeriesDecl, SeriesId, SeriesKind};

const MS: u64 = 1_000_000;

fn iteration(rank: u32, iter: u64, wall_ms: u64, prep_ms: u64) -> IterationBreakdown {
    let mut split = Split::default();
    split.add(Category::DataPrep, prep_ms * MS);
    split.add(Category::Compute, (wall_ms - prep_ms) * MS);
    IterationBreakdown {
        rank,
        pid: 100 + rank,
        iter,
        start_ns: iter * wall_ms * MS,
        end_ns: (iter + 1) * wall_ms * MS,
        split,
        evidence: vec![],
        coverage: Coverage::default(),
    }
}

fn header(host: &str) -> Frame {
    Frame::Header(RunHeader {
        host: host.into(),
        command: vec!["python3".into(), "train.py".into()],
        ..RunHeader::default()
    })
}

#[test]
fn a_client_that_applies_the_updates_holds_the_servers_model() {
    let job = JobTimeline::default();
    let mut server = LiveModel::new("");
    server.ingest(&header("node-a"));
    let mut client: Option<JobView> = None;
    for round in 0..40u64 {
        let new: Vec<_> = (0..3)
            .map(|rank| {
                iteration(
                    rank,
                    round,
                    100 + u64::from(rank) * 10,
                    20 * u64::from(rank),
                )
            })
            .collect();
        server.observe(&job, &new, (round + 1) * 100 * MS, false);
        let update = server.take_update();
        match client.as_mut() {
            // The feed's first message: a snapshot taken after the round's update.
            None if round == 7 => client = Some(server.view().clone()),
            None => {}
            Some(c) => c.apply(update),
        }
    }
    let client = client.expect("snapshot taken");
    assert_eq!(&client, server.view());
    assert_eq!(client.name, "train");
    assert_eq!(client.ranks.len(), 3);
    assert_eq!(client.ranks[&2].node, "node-a");
    assert_eq!(client.iterations(), 40);
}

#[test]
fn its_memory_is_bounded_however_long_the_job() {
    let job = JobTimeline::default();
    let mut m = LiveModel::new("long");
    for round in 0..5_000u64 {
        m.observe(&job, &[iteration(0, round, 10, 2)], round * 10 * MS, false);
        let _ = m.take_update();
    }
    let v = m.view();
    assert_eq!(v.ranks[&0].recent.len(), RECENT_ITERATIONS);
    assert_eq!(v.ranks[&0].recent.back().map(|p| p.iter), Some(4_999));
    assert_eq!(v.attributed, 5_000);
    let w = v.window();
    assert_eq!(w.total(), WINDOW_ITERATIONS as u64 * 10 * MS);
    assert_eq!(v.window().largest_stall(), Some(Category::DataPrep));
}

/// A job of many ranks keeps fewer iterations per rank, and a viewer that applies the updates
/// keeps the same as the model, however the ranks come and whatever the updates' boundaries:
/// here 1,000 ranks hold 200 parts each, then in one update half of them report once more
/// while 2,500 ranks join, then 500 more join in the next.
#[test]
fn a_large_job_keeps_fewer_parts_per_rank_and_its_viewer_the_same() {
    let job = JobTimeline::default();
    let mut server = LiveModel::new("");
    let mut client = JobView::new("");
    let round = |server: &mut LiveModel, ranks: &[(u32, u32)], iter: u64| {
        let new: Vec<_> = ranks
            .iter()
            .flat_map(|&(from, to)| from..to)
            .map(|rank| iteration(rank, iter, 10, 2))
            .collect();
        server.observe(&job, &new, (iter + 1) * 10 * MS, false);
        server.take_update()
    };
    for iter in 0..200 {
        client.apply(round(&mut server, &[(0, 1_000)], iter));
    }
    assert!(server.view().ranks.values().all(|r| r.recent.len() == 200));
    let (grown, more) = (
        round(&mut server, &[(0, 500), (1_000, 3_500)], 200),
        round(&mut server, &[(3_500, 4_000)], 201),
    );
    let mut merged = client.clone();
    merged.apply(grown.clone().then(more.clone()));
    client.apply(grown);
    assert_eq!(recent_kept(3_500), 149);
    assert!(client.ranks.values().all(|r| r.recent.len() <= 149));
    client.apply(more);

    let kept = recent_kept(4_000);
    assert_eq!(kept, 131);
    let v = server.view();
    assert_eq!(v.ranks.len(), 4_000);
    assert!(v.ranks.values().all(|r| r.recent.len() <= kept));
    // A rank that reported in the growing update, and one that did not: both the newest.
    assert_eq!(v.ranks[&0].recent.len(), kept);
    assert_eq!(v.ranks[&0].recent.back().map(|p| p.iter), Some(200));
    assert_eq!(v.ranks[&999].recent.len(), kept);
    assert_eq!(v.ranks[&999].recent.back().map(|p| p.iter), Some(199));
    assert_eq!(v.ranks[&3_999].recent.len(), 1);
    assert_eq!(client.ranks, v.ranks);
    assert_eq!(
        merged.ranks, v.ranks,
        "two updates merged keep what both in turn keep"
    );
    assert_eq!(recent_kept(1_024), RECENT_ITERATIONS);
    assert_eq!(recent_kept(10_000), MIN_RECENT_ITERATIONS);
}

/// A bounded queue never grows its buffer past its bound: 64 parts take 64 places, not the
/// 128 a push before the pop would make.
#[test]
fn a_full_recent_window_takes_no_more_room_than_it_holds() {
    let mut q = VecDeque::new();
    for i in 0..1_000u64 {
        push_bounded(&mut q, i, 64);
    }
    assert_eq!(q.len(), 64);
    assert_eq!(q.front(), Some(&936));
    assert!(q.capacity() < 128, "capacity {}", q.capacity());
}

fn decl(id: u32, name: &str, kind: SeriesKind, labels: &[(&str, &str)]) -> Frame {
    Frame::Series(SeriesDecl {
        id: SeriesId(id),
        name: name.into(),
        unit: String::new(),
        kind,
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    })
}

#[test]
fn the_node_meter_reads_rates_from_raw_counters() {
    use crate::series::names;
    let mut m = LiveModel::new("");
    m.ingest(&header("node-a"));
    m.ingest(&decl(
        1,
        names::PROC_ALL_CPU_NS,
        SeriesKind::Counter,
        &[("pid", "7")],
    ));
    m.ingest(&decl(
        2,
        names::NET_RX_BYTES,
        SeriesKind::Counter,
        &[("iface", "eth0"), ("link", "nic")],
    ));
    m.ingest(&decl(
        3,
        names::NET_RX_BYTES,
        SeriesKind::Counter,
        &[("iface", "lo"), ("link", "loopback")],
    ));
    m.ingest(&decl(
        4,
        names::GPU_UTIL_PCT,
        SeriesKind::Gauge,
        &[("gpu", "0")],
    ));
    m.ingest(&decl(
        5,
        names::PSI_SOME_US,
        SeriesKind::Counter,
        &[("resource", "io")],
    ));
    m.ingest(&decl(
        6,
        names::NET_TX_BYTES,
        SeriesKind::Counter,
        &[("iface", "ib0"), ("link", "nic")],
    ));
    // 1.5 cores busy, 2 MB/s in on the NIC, 9 MB/s on loopback (left out), GPU 40%, 25% I/O
    // pressure; sampled every 100 ms for 3 s.
    for tick in 0..=30u64 {
        let t = tick * 100 * MS;
        m.ingest(&Frame::Samples(SampleBatch {
            t_ns: t,
            dur_ns: 0,
            values: vec![
                (SeriesId(1), tick * 150 * MS),
                (SeriesId(2), tick * 200_000),
                (SeriesId(3), tick * 900_000),
                (SeriesId(4), 40),
                (SeriesId(5), tick * 25_000),
                (SeriesId(6), 7_000 + tick * 1_000),
            ],
        }));
    }
    let node = &m.view().nodes["node-a"];
    assert_eq!(node.history.len(), 3, "three whole seconds read");
    let r = node.resources.as_ref().expect("a reading");
    let near = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < b * 1e-9);
    assert!(near(r.cpu_busy_cores, 1.5), "{r:?}");
    assert!(near(r.nic_rx_bytes_per_s, 2e6), "{r:?}");
    assert!(near(r.gpu_busy, 0.4), "{r:?}");
    assert!(near(r.psi_io, 0.25), "{r:?}");
    assert_eq!(
        r.disk_read_bytes_per_s, None,
        "not measured is absent, not 0"
    );
    // Each NIC's bytes since the first sample; loopback left out.
    let nic = |iface: &str, rx_bytes: u64, tx_bytes: u64| crate::frame::NicBytes {
        iface: iface.into(),
        rx_bytes,
        tx_bytes,
    };
    assert_eq!(
        node.nics,
        [nic("eth0", 6_000_000, 0), nic("ib0", 0, 30_000)]
    );
    // Another node's NICs come from its agent.
    m.ingest(&Frame::NodeNics(crate::frame::NodeNics {
        node: "node-b".into(),
        nics: vec![nic("eth1", 5, 6)],
    }));
    assert_eq!(m.view().nodes["node-b"].nics, [nic("eth1", 5, 6)]);
}

#[test]
fn the_model_names_each_gpu_from_its_series_or_its_agent() {
    use crate::frame::{GpuIdentity, NodeGpus};
    use crate::series::{LABEL_GPU, LABEL_MODEL, LABEL_UUID};
    let mut live = LiveModel::new("train");
    live.ingest(&header("gpu-1"));
    // A run's own GPUs: the labels of their series.
    for (id, gpu) in [(1, "0"), (2, "1")] {
        live.ingest(&Frame::Series(SeriesDecl {
            id: SeriesId(id),
            name: "gpu.util_pct".into(),
            unit: "%".into(),
            kind: SeriesKind::Gauge,
            labels: vec![
                (LABEL_GPU.into(), gpu.into()),
                (LABEL_UUID.into(), format!("GPU-{gpu}")),
                (LABEL_MODEL.into(), "NVIDIA H100 80GB HBM3".into()),
            ],
        }));
    }
    // A series without a GPU label names nothing.
    live.ingest(&Frame::Series(SeriesDecl {
        id: SeriesId(3),
        name: "cpu.busy_ns".into(),
        unit: "ns".into(),
        kind: SeriesKind::Counter,
        labels: vec![],
    }));
    // Another node's GPUs come from its agent.
    live.ingest(&Frame::NodeGpus(NodeGpus {
        node: "gpu-2".into(),
        gpus: vec![GpuIdentity {
            gpu: "0".into(),
            uuid: None,
            model: Some("NVIDIA A100-SXM4-40GB".into()),
        }],
    }));
    let v = live.view();
    let local = &v.nodes["gpu-1"];
    assert_eq!(local.gpus.len(), 2);
    assert_eq!(local.gpu_model("1"), Some("NVIDIA H100 80GB HBM3"));
    assert_eq!(local.gpus[1].uuid.as_deref(), Some("GPU-1"));
    assert_eq!(
        v.nodes["gpu-2"].gpu_model("0"),
        Some("NVIDIA A100-SXM4-40GB")
    );
    assert_eq!(v.nodes["gpu-2"].gpu_model("1"), None);
}

/// The last, partial second of a run is a reading too once the run ends: a report's resource
/// charts stopped up to a second before the run did (seen in Chromium on a 3.6 s run whose CPU
/// line ended at 2.0 s).
#[test]
fn the_meter_gives_the_runs_last_partial_second_at_its_end() {
    use crate::series::names;
    use crate::view::NodeMeter;
    let mut meter = NodeMeter::default();
    meter.ingest(&decl(
        1,
        names::PROC_ALL_CPU_NS,
        SeriesKind::Counter,
        &[("pid", "7")],
    ));
    // 1.5 cores busy, sampled every 100 ms for 2.5 s.
    let mut readings = Vec::new();
    for tick in 0..=25u64 {
        readings.extend(meter.ingest(&Frame::Samples(SampleBatch {
            t_ns: tick * 100 * MS,
            dur_ns: 0,
            values: vec![(SeriesId(1), tick * 150 * MS)],
        })));
    }
    assert_eq!(readings.len(), 2, "two whole seconds");
    let last = meter.flush().expect("the half second left");
    assert_eq!((last.t_ns, last.dur_ns), (2_000 * MS, 500 * MS));
    assert!(
        (last.cpu_busy_cores.unwrap() - 1.5).abs() < 1e-9,
        "{last:?}"
    );
    assert!(meter.flush().is_none(), "nothing left after it");
}

/// Issue 30, item 12: a process whose rank label changes (pid 100 reports as rank 0, then as
/// rank 5, then as rank 7) leaves no rank behind in the model, on the server or on a client
/// that applies the updates; another process taking a freed rank is that rank. A rank taken
/// over by another process (rank 7 by pid 300) is that process's: when pid 100 comes back as
/// rank 9, rank 7 stays.
#[test]
fn a_process_whose_rank_changes_leaves_no_rank_behind() {
    let job = JobTimeline::default();
    let mut server = LiveModel::new("");
    server.ingest(&header("node-a"));
    let mut client = server.view().clone();
    let mut round = 0u64;
    for (rank, pid) in [
        (0u32, 100u32),
        (5, 100),
        (7, 100),
        (0, 200),
        (7, 300),
        (9, 100),
    ] {
        for _ in 0..3 {
            let mut b = iteration(rank, round, 100, 0);
            b.pid = pid;
            server.observe(&job, &[b], (round + 1) * 100 * MS, false);
            client.apply(server.take_update());
            round += 1;
        }
    }
    let ranks: Vec<(u32, u32)> = server
        .view()
        .ranks
        .values()
        .map(|r| (r.rank, r.pid))
        .collect();
    assert_eq!(ranks, [(0, 200), (7, 300), (9, 100)]);
    assert_eq!(&client, server.view());
}

/// Issue 29: another node's RDMA bytes come from its agent in `Frame::NodeRdma`, just before
/// the reading and counters they complete (whose own RDMA fields are not encoded); a reading
/// of another second does not take them.
#[test]
fn another_nodes_rdma_bytes_complete_its_reading_and_counters() {
    use crate::frame::{NodeCountersReport, NodeRdma, NodeResourcesReport};
    use crate::resources::{NodeCounters, NodeResources};
    let mut m = LiveModel::new("train");
    let reading = |t_ns| {
        Frame::NodeResources(Box::new(NodeResourcesReport {
            node: "node-b".into(),
            resources: NodeResources {
                t_ns,
                dur_ns: 1_000_000_000,
                nic_rx_bytes_per_s: Some(1e3),
                ..NodeResources::default()
            },
        }))
    };
    m.ingest(&Frame::NodeRdma(NodeRdma {
        node: "node-b".into(),
        t_ns: 5,
        rx_bytes_per_s: Some(12e9),
        tx_bytes_per_s: Some(11e9),
        rx_bytes: Some(1e12),
        tx_bytes: Some(9e11),
        counters: vec![crate::frame::RdmaCount {
            device: "mlx5_0".into(),
            port: "1".into(),
            counter: "np_cnp_sent".into(),
            value: 4210,
        }],
    }));
    m.ingest(&reading(5));
    m.ingest(&Frame::NodeCounters(NodeCountersReport {
        node: "node-b".into(),
        counters: NodeCounters {
            nic_rx_bytes: Some(1e6),
            ..NodeCounters::default()
        },
    }));
    let node = &m.view().nodes["node-b"];
    let r = node.resources.as_ref().unwrap();
    assert_eq!(
        (r.rdma_rx_bytes_per_s, r.rdma_tx_bytes_per_s),
        (Some(12e9), Some(11e9))
    );
    let c = node.counters.as_ref().unwrap();
    assert_eq!((c.rdma_rx_bytes, c.rdma_tx_bytes), (Some(1e12), Some(9e11)));
    assert_eq!(c.nic_rx_bytes, Some(1e6));
    assert_eq!(node.rdma_counters[0].value, 4210);
    m.ingest(&reading(1_000_000_005));
    let r = m.view().nodes["node-b"].resources.clone().unwrap();
    assert_eq!(
        r.rdma_rx_bytes_per_s, None,
        "not the second it was sent with"
    );
}

/// Issue 28: a hang is a feed event the moment it is declared (not at the next summary), and
/// its end updates it in place, in the model and in a client applying the updates.
#[test]
fn a_hang_is_a_feed_event_and_its_end_updates_it_in_place() {
    use crate::hang::HangReport;
    let mut live = LiveModel::new("train");
    live.ingest(&header("vm"));
    let mut client = live.view().clone();
    client.apply(live.take_update());
    let hang = HangReport {
        at_seconds: 70.0,
        missing_ranks: vec![1],
        missing_at: vec!["1@node-b".into()],
        ..HangReport::default()
    };
    live.ingest(&Frame::Hang(Box::new(hang.clone())));
    assert_eq!(live.view().summary.hangs, vec![hang.clone()]);
    let update = live.take_update();
    let line = hub::json_line(&hub::FeedMessage::Update(std::sync::Arc::new(
        update.clone(),
    )));
    assert!(line.contains("\"hangs\":[{\"at_seconds\":70.0"), "{line}");
    assert!(line.contains("\"missing_at\":[\"1@node-b\"]"), "{line}");
    client.apply(update);
    assert_eq!(client.summary.hangs, vec![hang.clone()]);
    let resumed = HangReport {
        resumed_after_seconds: Some(3.0),
        ..hang
    };
    live.ingest(&Frame::Hang(Box::new(resumed.clone())));
    client.apply(live.take_update());
    assert_eq!(client.summary.hangs, vec![resumed]);
    assert!(live.take_update().hangs.is_empty(), "said once");
}

/// The GPU busy share another node's agent reported with a rank's iteration reaches that
/// iteration's parts when it is joined, whatever the order the rank's iterations are joined
/// in; one no report carried has none.
#[test]
fn a_reported_gpu_busy_share_reaches_the_joined_iterations_parts() {
    use crate::frame::{NodeIteration, NodeReport};
    use crate::gpu_usage::NvmlReading;
    let job = JobTimeline::default();
    let mut model = LiveModel::new("job");
    for (iter, busy) in [(7u64, Some(870_000u32)), (8, Some(420_000)), (9, None)] {
        model.ingest(&Frame::NodeReport(Box::new(NodeReport {
            iteration: NodeIteration {
                node: "node-b".into(),
                breakdown: iteration(3, iter, 100, 10),
                comm: vec![],
                world_size: Some(4),
            },
            gpu: Some(NvmlReading {
                gpu: "0".into(),
                busy_ppm: busy,
                ..NvmlReading::default()
            }),
        })));
    }
    // Iteration 8 joined before 7 (7 waited for a late rank), then 9.
    for iter in [8u64, 7, 9] {
        model.observe(
            &job,
            &[iteration(3, iter, 100, 10)],
            (iter + 1) * 100 * MS,
            false,
        );
    }
    let busy: Vec<(u64, Option<u32>)> = model.view().ranks[&3]
        .recent
        .iter()
        .map(|p| (p.iter, p.gpu_busy_ppm))
        .collect();
    assert_eq!(
        busy,
        [(8, Some(420_000)), (7, Some(870_000)), (9, None)],
        "each iteration its own reading"
    );
}
