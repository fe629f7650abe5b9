use super::*;

const CATALOG: &str = "\
InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,SpotPrice,NetworkGbps,GpuLinkGBps
slow,,0,4,16,1.0,,0.1,
fast,,0,4,16,3.0,,0.4,
small,,0,1,4,0.5,,0.1,
a100x8,A100,8,96,1152,32.77,,400,600
h100x8,H100,8,192,2048,98.32,40.0,3200,900
";

fn catalog() -> Vec<Instance> {
    parse_instances(CATALOG).unwrap()
}

fn gpus() -> Vec<Gpu> {
    parse_gpus(catalog::SHIPPED_GPUS).unwrap()
}

/// Two CPU ranks on two nodes, 5 MB of gradients in 2 buckets, 0.4 s of network in 0.5 s.
fn network_bound() -> Measured {
    Measured {
        iteration_seconds: 0.5,
        breakdown: Breakdown {
            compute: 0.1,
            network: 0.4,
            ..Default::default()
        },
        iterations: 20,
        ranks: 2,
        nodes: 2,
        batch_size: Some(8),
        workers: Some(0),
        cpus: 4,
        comm_bytes_per_iteration: Some(5e6),
        collectives_per_iteration: Some(2.0),
        ..Default::default()
    }
}

fn find<'a>(r: &'a AdviceReport, name: &str) -> &'a InstancePrediction {
    r.instances
        .iter()
        .find(|p| p.instance_type == name)
        .unwrap()
}

#[test]
fn a_four_times_faster_network_cuts_the_network_part_four_times() {
    let cat = catalog();
    let m = network_bound();
    let r = advise(&m, &cat[0], &cat, &gpus(), &Request::default());
    let slow = find(&r, "slow").predicted_iteration_seconds.unwrap();
    let fast = find(&r, "fast").predicted_iteration_seconds.unwrap();
    assert!(
        (slow - 0.5).abs() < 1e-9,
        "the measured shape predicts itself: {slow}"
    );
    // latency terms are tiny next to 5 MB at 0.4 Gbit/s: 0.1 + 0.4 / 4
    assert!((fast - 0.2).abs() < 0.002, "{fast}");
    assert!(find(&r, "slow").current);
    assert!(find(&r, "fast").extrapolations.is_empty());
}

#[test]
fn a_cpu_job_is_never_offered_gpus() {
    let cat = catalog();
    let r = advise(
        &network_bound(),
        &cat[0],
        &cat,
        &gpus(),
        &Request::default(),
    );
    let gpu = find(&r, "a100x8");
    assert!(gpu.predicted_iteration_seconds.is_none());
    assert!(gpu
        .not_applicable
        .as_ref()
        .unwrap()
        .contains("does not use"));
    let text = render_text(&r);
    assert!(!text.contains("a100x8  "));
    // Said once for all the machines it leaves out, each named once.
    assert_eq!(text.matches("does not use").count(), 1, "{text}");
    assert!(text.contains("a100x8, h100x8"), "{text}");
}

#[test]
fn latency_bound_allreduce_gets_accumulation_not_nvlink() {
    // The ddp-tutorial-series case: 21 parameters (84 bytes) all-reduced over gloo on one
    // host, communication most of the iteration.
    let cat = catalog();
    let m = Measured {
        iteration_seconds: 0.01,
        breakdown: Breakdown {
            compute: 0.003,
            interconnect: 0.007,
            ..Default::default()
        },
        ranks: 2,
        nodes: 1,
        comm_bytes_per_iteration: Some(84.0),
        collectives_per_iteration: Some(1.0),
        ..network_bound()
    };
    let r = advise(&m, &cat[0], &cat, &gpus(), &Request::default());
    assert_eq!(r.communication_bound, CommBound::Latency);
    assert_eq!(r.communication[0].kind, "gradient_accumulation");
    let text = render_text(&r);
    assert!(text.contains("latency-bound"), "{text}");
    assert!(
        !text
            .to_lowercase()
            .contains("use accelerators joined by nvlink"),
        "{text}"
    );
}

#[test]
fn gpu_compute_scales_by_tensor_throughput_and_says_it_extrapolates() {
    let cat = catalog();
    let m = Measured {
        iteration_seconds: 1.0,
        breakdown: Breakdown {
            compute: 1.0,
            ..Default::default()
        },
        ranks: 8,
        nodes: 1,
        on_gpu: true,
        batch_size: Some(32),
        ..Default::default()
    };
    let req = Request {
        work: Some(Work::Iterations(3600.0)),
        ..Default::default()
    };
    let r = advise(&m, &cat[3], &cat, &gpus(), &req);
    let h = find(&r, "h100x8");
    let t = h.predicted_iteration_seconds.unwrap();
    assert!((t - 312.0 / 989.0).abs() < 1e-6, "{t}");
    assert!(!h.extrapolations.is_empty());
    assert!((h.predicted_cost.unwrap() - t * 98.32).abs() < 1e-6);
    assert!(find(&r, "small").not_applicable.is_some());
    // H100 is faster and (per iteration) cheaper here: the A100 is off the front.
    assert!(h.pareto && !find(&r, "a100x8").pareto);
}

#[test]
fn more_cpus_shrink_an_exposed_prep_stall() {
    let cat = catalog();
    let m = Measured {
        iteration_seconds: 0.107,
        breakdown: Breakdown {
            compute: 0.023,
            data_prep: 0.084,
            ..Default::default()
        },
        ranks: 1,
        nodes: 1,
        batch_size: Some(8),
        workers: Some(2),
        loader_cpu_seconds_per_sample: Some(0.0105),
        rank_cpu_seconds_per_iteration: Some(0.023),
        cpus: 1,
        ..Default::default()
    };
    let r = advise(&m, &cat[2], &cat, &gpus(), &Request::default());
    let one = find(&r, "small").predicted_iteration_seconds.unwrap();
    let four = find(&r, "slow").predicted_iteration_seconds.unwrap();
    assert!((one - 0.107).abs() < 1e-9);
    // two workers on four cores: 0.084 / 2 per batch, the slowest rate
    assert!((four - 0.042).abs() < 1e-3, "{four}");
    // on its one core, more workers would not help: no such advice
    assert!(
        r.data.iter().all(|a| a.kind != "loader_workers"),
        "{:?}",
        r.data
    );
}

#[test]
fn budget_picks_the_cheapest_fast_enough() {
    let cat = catalog();
    let req = Request {
        work: Some(Work::Iterations(36_000.0)),
        budget_hours: Some(3.0),
        ..Default::default()
    };
    let r = advise(&network_bound(), &cat[0], &cat, &gpus(), &req);
    // slow: 5 h at $1 (over budget); fast: 2 h × 2 nodes × $3 = $12
    assert_eq!(r.cheapest_within_budget.as_deref(), Some("2× fast"));
}

#[test]
fn a_bad_cell_names_its_line_and_column() {
    let csv =
        "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price\nx,,0,four,1,1\n";
    let e = parse_instances(csv).unwrap_err().to_string();
    assert_eq!(
        e,
        "line 2, column `vCPUs`: cannot read `four` as a number ≥ 0"
    );
    let e = parse_instances("InstanceType,vCPUs\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("AcceleratorName"), "{e}");
}

#[test]
fn the_shipped_catalog_loads_and_covers_the_families() {
    let cat = parse_instances(catalog::SHIPPED_INSTANCES).unwrap();
    let g = gpus();
    for family in [
        "p3.",
        "p4d",
        "p5",
        "g4dn",
        "g5.",
        "g6.",
        "a2-",
        "a3-",
        "Standard_ND",
        "Standard_NC",
    ] {
        assert!(
            cat.iter().any(|i| i.instance_type.starts_with(family)),
            "{family}"
        );
    }
    for i in cat.iter().filter(|i| i.has_gpu()) {
        assert!(
            catalog::gpu(&g, i.accelerator.as_deref().unwrap()).is_some(),
            "{}",
            i.instance_type
        );
        assert!(i.source.is_some(), "{}", i.instance_type);
    }
}

#[test]
fn json_names_the_fields_the_readme_documents() {
    let cat = catalog();
    let r = advise(
        &network_bound(),
        &cat[0],
        &cat,
        &gpus(),
        &Request::default(),
    );
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["schema"], "stallscope.advice/1");
    let first = &v["instances"][0];
    for k in [
        "instance_type",
        "predicted_iteration_seconds",
        "predicted_hours",
        "predicted_cost",
        "breakdown",
    ] {
        assert!(first.get(k).is_some(), "{k}");
    }
}

/// A job whose two workers wait on a 0.25 MB/s disk: 8 samples of 4 kB read per batch (0.128 s
/// at that rate) against 0.01 s of CPU and 0.03 s of compute. On a 1 MB/s disk the reads take
/// 0.032 s: loading is then as fast as compute, so the iteration is about the compute, not the
/// quarter of the fetch that a linear scaling of the measured stall would give.
#[test]
fn faster_storage_shrinks_a_fetch_stall_down_to_the_rest_of_the_pipeline() {
    let cat = parse_instances(
        "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,StorageMBps\n\
         disk250,,0,4,16,1.0,0.25\n\
         disk1000,,0,4,16,1.0,1\n",
    )
    .unwrap();
    let m = Measured {
        iteration_seconds: 0.128,
        breakdown: Breakdown {
            compute: 0.03,
            data_fetch: 0.098,
            ..Default::default()
        },
        ranks: 1,
        nodes: 1,
        batch_size: Some(8),
        workers: Some(2),
        loader_cpu_seconds_per_sample: Some(0.01 / 8.0),
        loader_read_bytes_per_sample: Some(4_000.0),
        rank_cpu_seconds_per_iteration: Some(0.03),
        cpus: 4,
        ..Default::default()
    };
    let r = advise(&m, &cat[0], &cat, &gpus(), &Request::default());
    let same = find(&r, "disk250");
    assert!((same.predicted_iteration_seconds.unwrap() - 0.128).abs() < 1e-9);
    let fast = find(&r, "disk1000");
    let t = fast.predicted_iteration_seconds.unwrap();
    // loading: max(0.032 s of reads, (0.01 + 0.032) / 2 workers) = 0.032 ≈ compute 0.03
    assert!((t - 0.032).abs() < 1e-3, "{t}");
    let bd = fast.breakdown.unwrap();
    assert!(bd.data_fetch > bd.data_prep, "{bd:?}");
    assert!(
        fast.assumptions
            .iter()
            .any(|a| a.contains("kB read per sample")),
        "{:?}",
        fast.assumptions
    );
}

/// A job whose GPU figures say memory bandwidth bounds it scales by bandwidth, not by tensor
/// throughput, and says from what it told.
#[test]
fn a_memory_bound_gpu_job_scales_by_bandwidth() {
    let cat = catalog();
    let m = Measured {
        iteration_seconds: 1.0,
        breakdown: Breakdown {
            compute: 1.0,
            ..Default::default()
        },
        ranks: 8,
        nodes: 1,
        on_gpu: true,
        gpu_bound: Some(GpuBound {
            memory: true,
            evidence: "GPM: DRAM bandwidth at 81% of peak, tensor cores active 9% of the time"
                .into(),
        }),
        ..Default::default()
    };
    let r = advise(&m, &cat[3], &cat, &gpus(), &Request::default());
    let h = find(&r, "h100x8");
    let table = gpus();
    let bw = |n: &str| table.iter().find(|g| g.name == n).unwrap().memory_gbps;
    let t = h.predicted_iteration_seconds.unwrap();
    assert!((t - bw("A100") / bw("H100")).abs() < 1e-6, "{t}");
    assert!(
        h.assumptions
            .iter()
            .any(|a| a.contains("memory-bound") && a.contains("DRAM bandwidth at 81%")),
        "{:?}",
        h.assumptions
    );
}

/// The bound is read from the profile: GPM's DRAM bandwidth against tensor activity, else
/// NVML's memory utilisation against its utilisation.
#[test]
fn the_bound_comes_from_the_gpu_figures() {
    use crate::frame::Frame;
    use crate::series::{names, SampleBatch, SeriesDecl, SeriesId, SeriesKind};
    let frames = |series: &[(&str, u64)]| -> Vec<Frame> {
        let mut out = Vec::new();
        for (i, (name, _)) in series.iter().enumerate() {
            out.push(Frame::Series(SeriesDecl {
                id: SeriesId(i as u32),
                name: name.to_string(),
                unit: String::new(),
                kind: SeriesKind::Gauge,
                labels: vec![("gpu".into(), "0".into())],
            }));
        }
        for t in 0..10u64 {
            out.push(Frame::Samples(SampleBatch {
                t_ns: t * 1_000_000,
                dur_ns: 0,
                values: series
                    .iter()
                    .enumerate()
                    .map(|(i, (_, v))| (SeriesId(i as u32), *v))
                    .collect(),
            }));
        }
        out
    };
    let gpm_memory = measure(
        &frames(&[
            (names::GPU_GPM_DRAM_BW, 800),
            (names::GPU_GPM_TENSOR_ACTIVITY, 100),
        ]),
        0,
    );
    assert!(gpm_memory.on_gpu);
    assert!(gpm_memory.gpu_bound.unwrap().memory);
    let gpm_tensor = measure(
        &frames(&[
            (names::GPU_GPM_DRAM_BW, 300),
            (names::GPU_GPM_TENSOR_ACTIVITY, 700),
        ]),
        0,
    );
    assert!(!gpm_tensor.gpu_bound.unwrap().memory);
    let nvml = measure(
        &frames(&[(names::GPU_MEM_UTIL_PCT, 25), (names::GPU_UTIL_PCT, 98)]),
        0,
    );
    let b = nvml.gpu_bound.unwrap();
    assert!(!b.memory && b.evidence.contains("25%"), "{b:?}");
}

/// P3's gain from the buckets' sizes: of 5 MB in two buckets the last-ready (first layers')
/// one is 1 MB; the next forward waits for it, the other 80% of the 0.4 s exposed transfer can
/// hide under a forward of a third of the 0.1 s compute. Without sizes: half, as a bound.
#[test]
fn p3_recovers_what_the_next_forward_can_hide_given_the_bucket_sizes() {
    let cat = catalog();
    let p3 = |m: &Measured| {
        let r = advise(m, &cat[0], &cat, &gpus(), &Request::default());
        r.communication
            .iter()
            .find(|a| a.kind == "priority_propagation")
            .cloned()
            .expect("P3 advised on a slow network")
    };
    let bound = p3(&network_bound());
    assert!((bound.gain_seconds - 0.2).abs() < 1e-9, "{bound:?}");
    assert!(bound.change.contains("a bound"), "{}", bound.change);
    let sized = p3(&Measured {
        bucket_bytes: Some(vec![4e6, 1e6]),
        ..network_bound()
    });
    assert!((sized.gain_seconds - 0.1 / 3.0).abs() < 1e-9, "{sized:?}");
    assert!(
        sized.change.contains("20% of the 5.0 MB"),
        "{}",
        sized.change
    );
}

#[test]
fn a_parameter_server_pays_with_many_workers_on_dedicated_machines_and_not_with_two() {
    let cat = catalog();
    // Two workers: the ring already sends each byte once each way.
    let two = advise(
        &network_bound(),
        &cat[0],
        &cat,
        &gpus(),
        &Request::default(),
    );
    assert!(two
        .communication
        .iter()
        .all(|a| a.kind != "parameter_server"));
    let not = two
        .not_advised
        .iter()
        .find(|a| a.kind == "parameter_server")
        .expect("considered");
    assert!(not.unless.contains("2 workers"), "{}", not.unless);
    assert!(render_text(&two).contains("considered, not advised"));
    // Eight workers on eight nodes: a worker's bytes fall from 2·7/8 B to B each way, so the
    // 0.4 s of network (no overlap measured) becomes 0.4 × 8/14.
    let eight = Measured {
        ranks: 8,
        nodes: 8,
        ..network_bound()
    };
    let r = advise(&eight, &cat[0], &cat, &gpus(), &Request::default());
    let ps = r
        .communication
        .iter()
        .find(|a| a.kind == "parameter_server")
        .expect("advised with 8 workers");
    let expect = 0.4 * (1.0 - 8.0 / 14.0);
    assert!(
        (ps.gain_seconds - expect).abs() < 0.005,
        "{}",
        ps.gain_seconds
    );
    // Its servers are the cheapest CPU row with at least the workers' network, and the cost
    // per iteration says what they add: (8 + 8 × 0.5) $/h over 0.5 − 0.171 s against 8 $/h over 0.5 s.
    assert!(ps.change.contains("8 × small at $0.50/h"), "{}", ps.change);
    assert!(
        ps.change.contains("-1% cost per iteration"),
        "{}",
        ps.change
    );
    assert!(r
        .not_advised
        .iter()
        .any(|a| a.kind == "parameter_server_colocated"));
}

/// The hook's bucket meta: sizes in ready order and each one's ready time; a list with a
/// value that is not a time is dropped whole, not read in part.
#[test]
fn the_buckets_ready_times_are_read_from_the_hooks_meta() {
    use crate::frame::Frame;
    use crate::marker::{Marker, MarkerEvent};
    let meta = |fields: &[(&str, &str)]| {
        Frame::Markers(vec![Marker {
            seq: 0,
            t_ns: 0,
            pid: 1,
            rank: Some(0),
            iter: 0,
            event: MarkerEvent::Meta(
                fields
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
        }])
    };
    let m = measure(
        &[meta(&[
            ("comm_bucket_kb", "2505:2411"),
            ("comm_bucket_ready_ms", "0.0:36.8"),
        ])],
        0,
    );
    assert_eq!(m.bucket_bytes, Some(vec![2.505e6, 2.411e6]));
    assert_eq!(m.bucket_ready_seconds, Some(vec![0.0, 0.0368]));
    for bad in ["0.0:-1", "0.0:x", "", "0::3", "0:inf"] {
        let m = measure(&[meta(&[("comm_bucket_ready_ms", bad)])], 0);
        assert_eq!(m.bucket_ready_seconds, None, "{bad}");
    }
}

/// Two nodes' run profiles of one job: their hosts make the node count, their iterations
/// are pooled.
#[test]
fn run_profiles_of_two_nodes_pool_into_one_job_on_two_nodes() {
    let node = |host: &str, seconds: f64, iterations: usize| Measured {
        iteration_seconds: seconds,
        median_iteration_seconds: seconds,
        iterations,
        nodes: 1,
        hosts: vec![host.to_string()],
        ..network_bound()
    };
    let m = pool(&[node("a", 0.4, 10), node("b", 0.6, 30)]).unwrap();
    assert_eq!(m.nodes, 2);
    assert_eq!(m.hosts, vec!["a".to_string(), "b".to_string()]);
    assert_eq!(m.iterations, 40);
    assert!((m.iteration_seconds - 0.55).abs() < 1e-12);
    assert!((m.breakdown.total() - 0.55).abs() < 1e-9);
    // The same host twice (two runs on one node): one node.
    assert_eq!(
        pool(&[node("a", 0.4, 10), node("a", 0.4, 10)])
            .unwrap()
            .nodes,
        1
    );
    assert!(pool(&[]).is_none());
}

/// A collector's job profile: its ranks' iterations as their agents shipped them, their
/// facts as the agents forwarded them; its nodes are the agents', not the collector's host.
#[test]
fn a_collectors_job_profile_is_measured_from_what_its_agents_shipped() {
    use crate::attribution::{Coverage, IterationBreakdown};
    use crate::category::{Category, Split};
    use crate::frame::{Frame, NodeIteration, NodeMeta, NodeReport, RunHeader};
    let mut frames = vec![Frame::Header(RunHeader {
        host: "head".into(),
        command: vec!["stallscope".into(), "collector".into()],
        warmup_iters: 1,
        ..RunHeader::default()
    })];
    for (rank, node) in [(0u32, "a"), (1, "b")] {
        frames.push(Frame::NodeMeta(NodeMeta {
            node: node.into(),
            pid: 7,
            rank: Some(rank),
            fields: vec![
                ("comm_bucket_kb".into(), "2505:2411".into()),
                ("comm_bucket_ready_ms".into(), "0.0:36.8".into()),
                ("comm_buckets".into(), "2".into()),
                ("comm_bytes".into(), "4916000".into()),
                ("world_size".into(), "2".into()),
            ],
        }));
        for iter in 0..5u64 {
            let mut split = Split::default();
            split.add(Category::Compute, 60_000_000);
            split.add(Category::Network, 80_000_000);
            frames.push(Frame::NodeReport(Box::new(NodeReport {
                iteration: NodeIteration {
                    node: node.into(),
                    breakdown: IterationBreakdown {
                        rank,
                        pid: 7,
                        iter,
                        start_ns: iter * 140_000_000,
                        end_ns: (iter + 1) * 140_000_000,
                        split,
                        evidence: Vec::new(),
                        coverage: Coverage::default(),
                    },
                    comm: Vec::new(),
                    world_size: Some(2),
                },
                gpu: None,
            })));
        }
    }
    let m = measure(&frames, 1);
    assert_eq!(m.iterations, 4);
    assert_eq!((m.nodes, m.ranks), (2, 2));
    assert_eq!(m.hosts, vec!["a".to_string(), "b".to_string()]);
    assert!((m.iteration_seconds - 0.14).abs() < 1e-9);
    assert!((m.breakdown.network - 0.08).abs() < 1e-9);
    assert_eq!(m.comm_bytes_per_iteration, Some(4.916e6));
    assert_eq!(m.bucket_ready_seconds, Some(vec![0.0, 0.0368]));
}

/// Compression halves the bytes through the same buckets and link: where the link was busy
/// from the first bucket on, the part hidden behind backward stays hidden and the exposed
/// time falls by more than half. A program already compressing is told so instead.
#[test]
fn compression_gains_what_half_the_bytes_leave_exposed_and_not_twice() {
    let cat = catalog();
    let m = Measured {
        bucket_bytes: Some(vec![2.5e6, 2.5e6]),
        bucket_ready_seconds: Some(vec![0.0, 0.1]),
        comm_overlap_seconds: Some(0.1),
        ..network_bound()
    };
    let r = advise(&m, &cat[0], &cat, &gpus(), &Request::default());
    let gain = |r: &AdviceReport| {
        r.communication
            .iter()
            .find(|a| a.kind == "compression")
            .map(|a| a.gain_seconds)
    };
    // 5 MB sent from the first bucket on: 0.1 + 0.4 s, so 10 MB/s; half the bytes take
    // 0.25 s, 0.15 s of it after backward: 0.25 s saved, not 0.2.
    let g = gain(&r).expect("advised");
    assert!((g - 0.25).abs() < 0.002, "{g}");
    let compressed = Measured {
        comm_hook: Some("fp16_compress_hook".into()),
        ..m
    };
    let r = advise(&compressed, &cat[0], &cat, &gpus(), &Request::default());
    assert_eq!(gain(&r), None);
    let not = r
        .not_advised
        .iter()
        .find(|a| a.kind == "compression")
        .unwrap();
    assert!(not.unless.contains("fp16_compress_hook"), "{}", not.unless);
    // The model knows half the bytes crossed the link.
    let slow = find(&r, "slow");
    assert!(slow
        .assumptions
        .iter()
        .any(|a| a.contains("sends half the buckets' bytes")));
}

/// A storage rate of 0 cannot be predicted with: the row and the column are named.
#[test]
fn a_zero_rate_in_the_catalog_is_an_error_naming_its_row_and_column() {
    let e = parse_instances(
        "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,StorageMBps\n\
         disk1,,0,4,16,1.0,1\n\
         disk0,,0,4,16,1.0,0\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("line 3"), "{e}");
    assert!(e.contains("disk0"), "{e}");
    assert!(e.contains("`StorageMBps`"), "{e}");
}

/// A candidate whose time is not a number (here a storage rate of 0 that bypassed the
/// catalog's parser) is never ranked: not on the Pareto front, never the cheapest.
#[test]
fn a_prediction_that_is_not_a_number_is_never_ranked() {
    let mut cat = parse_instances(
        "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,StorageMBps\n\
         disk250,,0,4,16,1.0,0.25\n\
         disk1000,,0,4,16,2.0,1\n\
         broken,,0,4,16,0.1,1\n",
    )
    .unwrap();
    cat[2].storage_mbps = Some(0.0);
    let m = Measured {
        iteration_seconds: 0.128,
        breakdown: Breakdown {
            compute: 0.03,
            data_fetch: 0.098,
            ..Default::default()
        },
        ranks: 1,
        nodes: 1,
        batch_size: Some(8),
        workers: Some(2),
        loader_cpu_seconds_per_sample: Some(0.01 / 8.0),
        loader_read_bytes_per_sample: Some(4_000.0),
        rank_cpu_seconds_per_iteration: Some(0.03),
        cpus: 4,
        ..Default::default()
    };
    let r = advise(&m, &cat[0], &cat, &gpus(), &Request::default());
    let broken = find(&r, "broken");
    assert!(!broken.pareto, "{broken:?}");
    assert!(
        broken
            .predicted_iteration_seconds
            .is_none_or(|t| t.is_finite()),
        "{broken:?}"
    );
    assert_ne!(r.cheapest_within_budget.as_deref(), Some("broken"));
    let text = render_text(&r);
    let line = text.lines().find(|l| l.starts_with("broken")).unwrap_or("");
    assert!(!line.contains("NaN") && !line.contains("pareto"), "{text}");
}

#[test]
fn a_job_without_ddp_is_not_told_to_accumulate_with_no_sync() {
    // An FSDP job: exposed all-gathers and reduce-scatters, no DDP gradient buckets.
    let cat = catalog();
    let m = Measured {
        iteration_seconds: 0.05,
        breakdown: Breakdown {
            compute: 0.02,
            interconnect: 0.03,
            ..Default::default()
        },
        ranks: 2,
        nodes: 1,
        comm_bytes_per_iteration: None,
        collectives_per_iteration: None,
        ..network_bound()
    };
    let r = advise(&m, &cat[0], &cat, &gpus(), &Request::default());
    assert!(
        r.communication
            .iter()
            .all(|a| !a.change.contains("no_sync")),
        "{:?}",
        r.communication
    );
    assert!(!render_text(&r).contains("no_sync"));
}
