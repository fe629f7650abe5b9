use super::*;
use crate::aggregate::MEDIAN_MAX_RELATIVE_ERROR;
use crate::attribution::Coverage;
use crate::category::{Category, Split};
use crate::summary::summarize;
use crate::{secs, NS_PER_SEC};

#[test]
fn a_long_job_keeps_bounded_state_and_its_summary_right() {
    const WARMUP: u64 = 5;
    const ITERS: u64 = 150_000; // per rank: 300,000 breakdowns
    let mut job = JobTimeline::default();
    job.ingest(&Frame::Header(RunHeader {
        warmup_iters: WARMUP as u32,
        ..RunHeader::default()
    }));
    let (mut walls, mut prep, mut marked) = (Vec::new(), 0u64, 0u64);
    let mut batch = Vec::new();
    for iter in 0..ITERS {
        for rank in 0..2u32 {
            // 1–2 ms, spread over the range.
            let wall = 1_000_000 + (iter * 7_919 + u64::from(rank) * 13) % 1_000_000;
            let mut split = Split::default();
            split.add(Category::Compute, wall - wall / 4);
            split.add(Category::DataPrep, wall / 4);
            let start = iter * 3_000_000;
            if iter >= WARMUP {
                walls.push(wall);
                prep += wall / 4;
                marked += wall / 2;
            }
            batch.push(IterationBreakdown {
                rank,
                pid: 100 + rank,
                iter,
                start_ns: start,
                end_ns: start + wall,
                split,
                evidence: Vec::new(),
                coverage: Coverage {
                    marked_ns: wall / 2,
                    sampled_ns: wall,
                },
            });
        }
        if batch.len() >= 1_000 {
            job.summary.record(&batch, WARMUP);
            batch.clear();
        }
    }
    job.summary.record(&batch, WARMUP);
    assert!(
        job.summary.totals.held() <= 3 * 2 * 128, // 1–2 ms spans two octaves
        "only histogram buckets are left: {}",
        job.summary.totals.held()
    );

    let s = summarize(&job);
    let counted = 2 * (ITERS - WARMUP);
    assert_eq!(s.job.iterations, counted);
    assert_eq!(s.ranks.len(), 2);
    assert_eq!(s.ranks[0].figures.iterations, ITERS - WARMUP);
    let total: u64 = walls.iter().sum();
    assert_eq!(s.job.wall_seconds, secs(total));
    assert_eq!(s.job.categories.data_prep.seconds, secs(prep));
    assert_eq!(s.job.coverage.marked, marked as f64 / total as f64);
    assert_eq!(s.job.coverage.sampled, 1.0);
    walls.sort_unstable();
    let n = walls.len();
    let exact = (walls[n / 2 - 1] + walls[n / 2]) as f64 / 2.0 / NS_PER_SEC as f64;
    let err = (s.job.median_iteration_seconds - exact).abs() / exact;
    assert!(
        err <= MEDIAN_MAX_RELATIVE_ERROR,
        "median {} vs {exact}",
        s.job.median_iteration_seconds
    );
    for r in &s.ranks {
        let err = (r.figures.median_iteration_seconds - exact).abs() / exact;
        assert!(err <= 2.0 * MEDIAN_MAX_RELATIVE_ERROR, "{r:?}");
    }
}

/// A collector's job: each node's agent ships its rank's GPU readings with the iteration;
/// the summary shows every rank's GPU, warm-up left out, and a resent report (an agent
/// replaying what a dead collector had not acknowledged) counted once.
#[test]
fn a_collector_shows_the_gpu_of_every_nodes_rank_once() {
    use crate::frame::{NodeIteration, NodeReport};
    use crate::gpu_usage::NvmlReading;
    let mut job = JobTimeline::default();
    job.ingest(&Frame::Header(RunHeader {
        warmup_iters: 2,
        ..RunHeader::default()
    }));
    let report = |node: &str, rank: u32, iter: u64, rx: u64| {
        let start = iter * 100_000_000;
        let mut split = Split::default();
        split.add(Category::Compute, 100_000_000);
        Frame::NodeReport(Box::new(NodeReport {
            iteration: NodeIteration {
                node: node.into(),
                breakdown: IterationBreakdown {
                    rank,
                    pid: 7,
                    iter,
                    start_ns: start,
                    end_ns: start + 100_000_000,
                    split,
                    evidence: Vec::new(),
                    coverage: Coverage::default(),
                },
                comm: Vec::new(),
                world_size: Some(2),
            },
            gpu: Some(NvmlReading {
                gpu: "0".into(),
                busy_ppm: Some(500_000 + 400_000 * rank),
                pcie_rx_bytes: Some(rx),
                energy_mj: Some(30_000),
                batch_bytes: Some(1_000_000),
                ..NvmlReading::default()
            }),
        }))
    };
    for iter in 0..10 {
        // Warm-up iterations move far more bytes: they must not count.
        let rx = if iter < 2 { 50_000_000 } else { 2_000_000 };
        job.ingest(&report("node-a", 0, iter, rx));
        job.ingest(&report("node-b", 1, iter, 3 * rx));
    }
    for iter in 5..10 {
        job.ingest(&report("node-b", 1, iter, 999_000_000)); // resent
    }
    job.attribute_ready(0, true);
    for iter in 8..10 {
        job.ingest(&report("node-b", 1, iter, 999_000_000)); // resent after the join
    }
    let s = summarize(&job);
    let gpu = |rank: usize| s.ranks[rank].gpu.clone().expect("a GPU per rank");
    assert_eq!(s.ranks[1].node.as_deref(), Some("node-b"));
    assert_eq!(gpu(0).pcie_rx_bytes_per_iteration, Some(2e6));
    assert_eq!(gpu(1).pcie_rx_bytes_per_iteration, Some(6e6));
    assert_eq!(gpu(1).batch_bytes, Some(1_000_000));
    assert!((gpu(1).busy_fraction.unwrap() - 0.9).abs() < 1e-9);
    assert_eq!(gpu(0).energy_joules_per_iteration, Some(30.0));
    let text = crate::summary::render_text(&s);
    assert!(
        text.contains("gpu: rank 1 on node-b GPU 0: 90% busy, PCIe in 6.0 MB/iteration (6.00× the 1.0 MB batch)"),
        "{text}"
    );
}

/// Two loops on this node exchanging gradients (a `comm` phase of 40 ms per 100 ms
/// iteration) while an unrelated transfer (ssh, a dataset read over NFS) moves 2 MB/s on the
/// NIC and nothing is seen on loopback (shared memory); what the run attributes to network and
/// interconnect, for a job whose world is `world` ranks of which `local_world` are here.
fn comm_shares(world: &str, local_world: Option<&str>) -> (f64, f64) {
    let eth0 = [("iface", "eth0"), ("link", "nic")];
    comm_shares_over(
        Some(world),
        local_world,
        crate::series::names::NET_RX_BYTES,
        &eth0,
    )
}

/// [`comm_shares`] with the moving bytes on series `nic` (labels `nic_labels`), and the world
/// size said or not.
fn comm_shares_over(
    world: Option<&str>,
    local_world: Option<&str>,
    nic: &str,
    nic_labels: &[(&str, &str)],
) -> (f64, f64) {
    use crate::frame::Frame;
    use crate::marker::{phase, Marker, MarkerEvent};
    use crate::series::{names, SampleBatch, SeriesDecl, SeriesId, SeriesKind};
    const MS: u64 = 1_000_000;
    let mut job = JobTimeline::default();
    job.ingest(&Frame::Header(RunHeader::default()));
    let lo = [("iface", "lo"), ("link", "loopback")];
    for (id, name, labels) in [(1, nic, nic_labels), (2, names::NET_RX_BYTES, &lo[..])] {
        job.ingest(&Frame::Series(SeriesDecl {
            id: SeriesId(id),
            name: name.into(),
            unit: "bytes".into(),
            kind: SeriesKind::Counter,
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }));
    }
    let mut markers = Vec::new();
    let mut seq = 0;
    let mut mark = |pid: u32, t_ns: u64, iter: u64, event: MarkerEvent| {
        seq += 1;
        markers.push(Marker {
            seq,
            t_ns,
            pid,
            rank: Some(pid - 100),
            iter,
            event,
        });
    };
    for pid in [100, 101] {
        let mut kv: Vec<(String, String)> = world
            .map(|w| ("world_size".to_string(), w.to_string()))
            .into_iter()
            .collect();
        if let Some(l) = local_world {
            kv.push(("local_world_size".into(), l.into()));
        }
        mark(pid, MS, 0, MarkerEvent::Meta(kv));
        for i in 0..20u64 {
            let t = i * 100 * MS;
            mark(pid, t + 1, i, MarkerEvent::Begin(phase::COMPUTE.into()));
            mark(pid, t + 60 * MS, i, MarkerEvent::End(phase::COMPUTE.into()));
            mark(pid, t + 60 * MS, i, MarkerEvent::Begin(phase::COMM.into()));
            mark(pid, t + 100 * MS, i, MarkerEvent::End(phase::COMM.into()));
            mark(pid, t + 100 * MS, i, MarkerEvent::Step);
        }
    }
    job.ingest(&Frame::Markers(markers));
    for tick in 0..=200u64 {
        job.ingest(&Frame::Samples(SampleBatch {
            t_ns: tick * 10 * MS,
            dur_ns: 0,
            values: vec![(SeriesId(1), tick * 20_000), (SeriesId(2), 0)],
        }));
    }
    job.attribute_ready(u64::MAX, true);
    let s = summarize(&job);
    (
        s.job.categories.network.fraction,
        s.job.categories.interconnect.fraction,
    )
}

/// Issue 17, item 6: whether communication is the network's is decided by where the peers
/// are, not by unrelated bytes on the NIC.
#[test]
fn unrelated_nic_traffic_does_not_make_a_one_node_job_network_bound() {
    for local_world in [None, Some("2")] {
        let (network, interconnect) = comm_shares("2", local_world);
        assert_eq!(network, 0.0, "every peer is here ({local_world:?})");
        assert!((interconnect - 0.4).abs() < 0.01, "{interconnect}");
    }
    // Two of four ranks here: the collectives cross the network.
    let (network, interconnect) = comm_shares("4", Some("2"));
    assert!((network - 0.4).abs() < 0.01, "{network}");
    assert_eq!(interconnect, 0.0);
    let (network, _) = comm_shares("4", None);
    assert!((network - 0.4).abs() < 0.01, "{network}");
}

/// Issue 29: NCCL over InfiniBand, RoCE or EFA moves its bytes past the kernel, so only the
/// RDMA port counters see them. A comm wait while they move is the network's, as with TCP
/// bytes on a NIC; with nothing moving anywhere (and the peers' places unknown) it is not.
#[test]
fn rdma_bytes_moving_while_a_collective_waits_make_the_wait_network() {
    use crate::series::names::{NET_RX_BYTES, RDMA_RX_BYTES};
    let port = [("device", "mlx5_0"), ("port", "1")];
    let (network, interconnect) = comm_shares_over(None, None, RDMA_RX_BYTES, &port);
    assert!((network - 0.4).abs() < 0.01, "{network}");
    assert_eq!(interconnect, 0.0);
    // The same job with the bytes on a series no link reads: nothing moved on the NICs.
    let (network, interconnect) = comm_shares_over(None, None, NET_RX_BYTES, &port);
    assert_eq!(network, 0.0);
    assert!((interconnect - 0.4).abs() < 0.01, "{interconnect}");
}

/// The GPU is read by a sampler of its own, which may lag the CPU sampler (NVML calls
/// block; on a loaded machine its thread waits for a core). An iteration attributed once the
/// CPU samples have passed its end, before the GPU's have, lost the bytes of its last
/// moments for good: the GPU figures came out short (`each_local_rank_shows_its_own_gpu`
/// read 6.6% short in CI). It now waits for the GPU's samples too (with the same patience).
#[test]
fn an_iteration_waits_for_its_gpus_samples_past_its_end() {
    use crate::gpu_usage::NvmlReading;
    use crate::marker::{Marker, MarkerEvent};
    use crate::series::{names, SampleBatch, SeriesDecl, SeriesId, SeriesKind, LABEL_GPU};
    const MS: Nanos = 1_000_000;
    /// bytes per ns: 1 GB/s.
    const RATE: u64 = 1;
    let mut job = JobTimeline::default();
    for (id, name, labels) in [
        (0, "cpu.busy_ns", vec![]),
        (
            1,
            names::GPU_PCIE_RX_BYTES,
            vec![(LABEL_GPU.to_string(), "0".to_string())],
        ),
    ] {
        job.ingest(&Frame::Series(SeriesDecl {
            id: SeriesId(id),
            name: name.into(),
            unit: "bytes".into(),
            kind: SeriesKind::Counter,
            labels,
        }));
    }
    let marker = |seq: u64, t_ns: Nanos, iter: u64, event: MarkerEvent| Marker {
        seq,
        t_ns,
        pid: 100,
        rank: Some(0),
        iter,
        event,
    };
    job.ingest(&Frame::Markers(vec![
        marker(
            0,
            0,
            0,
            MarkerEvent::Meta(vec![("local_rank".into(), "0".into())]),
        ),
        marker(1, 100 * MS, 0, MarkerEvent::Step),
        marker(2, 200 * MS, 1, MarkerEvent::Step),
    ]));
    let batch = |t_ns: Nanos, id: u32, v: u64| {
        Frame::Samples(SampleBatch {
            t_ns,
            dur_ns: 0,
            values: vec![(SeriesId(id), v)],
        })
    };
    // The GPU sampler read up to 150 ms (after the CPU's round at 140 ms), the CPU sampler
    // up to 230 ms; the GPU's read at 250 ms is still on its way.
    for t in (0..=230).step_by(10) {
        if t <= 150 && t % 50 == 0 && t > 0 {
            job.ingest(&batch(t * MS - MS / 2, 1, RATE * (t * MS - MS / 2)));
        }
        job.ingest(&batch(t * MS, 0, t));
    }
    let first = job.attribute_ready(240 * MS, false);
    let attributed: Vec<u64> = first.iter().map(|b| b.iter).collect();
    assert_eq!(
        attributed,
        vec![0],
        "iteration 1 waits for the GPU's samples"
    );
    job.ingest(&batch(250 * MS, 1, RATE * 250 * MS));
    job.ingest(&batch(260 * MS, 0, 260));
    let later = job.attribute_ready(270 * MS, false);
    assert_eq!(later.len(), 1);
    let got: Option<&NvmlReading> = job.gpu_reading(0, 1);
    assert_eq!(
        got.and_then(|r| r.pcie_rx_bytes),
        Some(RATE * 100 * MS),
        "all of iteration 1's bytes"
    );
}

/// A loop that drives a CUDA device (it said `cuda_device` and sent CUDA-timed iterations) on
/// a node where NVML gave no GPU at all: the summary says, in words, that the GPU figures are
/// not measured, and the rank's GPU line says so too, instead of the GPU going unmentioned.
#[test]
fn a_gpu_that_nvml_never_saw_is_said_in_words() {
    use crate::marker::{Marker, MarkerEvent};
    use crate::series::{SampleBatch, SeriesDecl, SeriesId, SeriesKind};
    const MS: Nanos = 1_000_000;
    let mut job = JobTimeline::default();
    job.ingest(&Frame::Header(RunHeader::default()));
    job.ingest(&Frame::Series(SeriesDecl {
        id: SeriesId(0),
        name: "cpu.busy_ns".into(),
        unit: "ns".into(),
        kind: SeriesKind::Counter,
        labels: vec![],
    }));
    let marker = |seq: u64, t_ns: Nanos, iter: u64, event: MarkerEvent| Marker {
        seq,
        t_ns,
        pid: 100,
        rank: Some(0),
        iter,
        event,
    };
    let mut marks = vec![marker(
        0,
        0,
        0,
        MarkerEvent::Meta(vec![("cuda_device".into(), "0".into())]),
    )];
    for iter in 0..5u64 {
        marks.push(marker(
            1 + iter,
            (iter + 1) * 100 * MS,
            iter,
            MarkerEvent::Step,
        ));
    }
    job.ingest(&Frame::Markers(marks));
    for t in (0..=600).step_by(10) {
        job.ingest(&Frame::Samples(SampleBatch {
            t_ns: t * MS,
            dur_ns: 0,
            values: vec![(SeriesId(0), t)],
        }));
    }
    job.attribute_ready(600 * MS, true);
    let s = summarize(&job);
    let said: Vec<&String> = s
        .warnings
        .iter()
        .filter(|w| w.contains("CUDA device 0") && w.contains("not measured"))
        .collect();
    assert_eq!(said.len(), 1, "{:#?}", s.warnings);
    let gpu = s.ranks[0].gpu.as_ref().expect("the rank's GPU is named");
    assert_eq!(gpu.read_fraction, 0.0);
    assert!(crate::summary::render_text(&s).contains("no NVML readings"));
}

/// The same loop without CUDA (a CPU training) on the same node: no GPU, no warning.
#[test]
fn a_cpu_loop_without_nvml_gets_no_gpu_warning() {
    use crate::marker::{Marker, MarkerEvent};
    const MS: Nanos = 1_000_000;
    let mut job = JobTimeline::default();
    job.ingest(&Frame::Header(RunHeader::default()));
    let marks: Vec<Marker> = (0..5u64)
        .map(|iter| Marker {
            seq: iter,
            t_ns: (iter + 1) * 100 * MS,
            pid: 100,
            rank: Some(0),
            iter,
            event: MarkerEvent::Step,
        })
        .collect();
    job.ingest(&Frame::Markers(marks));
    job.attribute_ready(600 * MS, true);
    let s = summarize(&job);
    assert!(s.warnings.is_empty(), "{:#?}", s.warnings);
    assert!(s.ranks.iter().all(|r| r.gpu.is_none()));
}

/// Issue 30, item 1: a step numbered 10^15 (`--iter-regex` capturing a token counter, a
/// crafted datagram or profile) used to send the attribution through every number in between,
/// one at a time, for days. It now goes straight to the next step the loop sent: the
/// iterations before the jump are attributed, and the ones after it too.
#[test]
fn a_step_with_a_huge_iteration_number_is_reached_in_one_jump() {
    use crate::marker::{Marker, MarkerEvent};
    const MS: u64 = 1_000_000;
    const HUGE: u64 = 1_000_000_000_000_000;
    let mut job = JobTimeline::default();
    job.ingest(&Frame::Header(RunHeader::default()));
    let iters = (0..10u64).chain([HUGE, HUGE + 1, HUGE + 2]);
    let markers: Vec<Marker> = iters
        .enumerate()
        .map(|(k, iter)| Marker {
            seq: k as u64,
            t_ns: (k as u64 + 1) * 10 * MS,
            pid: 100,
            rank: Some(0),
            iter,
            event: MarkerEvent::Step,
        })
        .collect();
    job.ingest(&Frame::Markers(markers));
    let started = std::time::Instant::now();
    let done = job.attribute_ready(u64::MAX, true);
    let iters: Vec<u64> = done.iter().map(|b| b.iter).collect();
    assert_eq!(
        iters,
        (0..10).chain([HUGE + 1, HUGE + 2]).collect::<Vec<_>>(),
        "every iteration whose two steps are known, and no other"
    );
    // Generous for a loaded machine; the old walk needed ~9 ns × 10^15, i.e. about 100 days.
    assert!(started.elapsed().as_secs() < 30, "{:?}", started.elapsed());
}
