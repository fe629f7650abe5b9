//! The job's size as the advisor reads it from profiles of one node, of several nodes, and
//! from a collector's job profile; and the measured shape predicting its own iteration.

use super::*;
use crate::attribution::{Coverage, IterationBreakdown};
use crate::category::{Category, Split};
use crate::frame::{Frame, NodeIteration, NodeMeta, NodeReport, RunHeader};
use crate::marker::{Marker, MarkerEvent};

/// 30 Mbit/s between nodes, as a catalog row; `net100` the faster link.
const LINKS: &str = "\
InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,NetworkGbps
net30,,0,4,16,1.0,0.03
net100,,0,4,16,1.0,0.1
";

/// The hook's facts of a rank of a job of 4 ranks, 2 per node: 1.2 MB of gradients in 2
/// buckets, 20 ms apart.
fn hook_facts() -> Vec<(String, String)> {
    [
        ("comm_bucket_kb", "600:600"),
        ("comm_bucket_ready_ms", "0.0:20.0"),
        ("comm_buckets", "2"),
        ("comm_bytes", "1200000"),
        ("world_size", "4"),
        ("local_world_size", "2"),
        ("batch_size", "8"),
        ("workers", "0"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// One iteration of `rank`: 50 ms of compute and 400 ms of network.
fn iteration(rank: u32, iter: u64) -> IterationBreakdown {
    let mut split = Split::default();
    split.add(Category::Compute, 50_000_000);
    split.add(Category::Network, 400_000_000);
    IterationBreakdown {
        rank,
        pid: 100 + rank,
        iter,
        start_ns: iter * 450_000_000,
        end_ns: (iter + 1) * 450_000_000,
        split,
        evidence: Vec::new(),
        coverage: Coverage::default(),
    }
}

/// `stallscope run` on one node (host `host`) of the job: its local ranks `ranks` only.
fn run_profile(host: &str, ranks: [u32; 2]) -> Vec<Frame> {
    let mut frames = vec![Frame::Header(RunHeader {
        host: host.into(),
        command: vec!["stallscope".into(), "run".into()],
        cpus: 4,
        ..RunHeader::default()
    })];
    for rank in ranks {
        frames.push(Frame::Markers(vec![Marker {
            seq: 0,
            t_ns: 0,
            pid: 100 + rank,
            rank: Some(rank),
            iter: 0,
            event: MarkerEvent::Meta(hook_facts()),
        }]));
        for iter in 0..6 {
            frames.push(Frame::Breakdown(iteration(rank, iter)));
        }
    }
    frames
}

fn row<'a>(r: &'a AdviceReport, name: &str, nodes: u32) -> &'a InstancePrediction {
    r.instances
        .iter()
        .find(|p| p.instance_type == name && p.nodes == nodes)
        .unwrap_or_else(|| panic!("no {nodes}× {name}"))
}

fn advise_links(m: &Measured, nodes: Vec<u32>) -> AdviceReport {
    let cat = parse_instances(LINKS).unwrap();
    let gpus = parse_gpus(catalog::SHIPPED_GPUS).unwrap();
    let req = Request {
        nodes,
        ..Default::default()
    };
    advise(m, &cat[0], &cat, &gpus, &req)
}

/// One node's run profile of a two-node job (world_size 4, local_world_size 2) is the whole
/// job: 4 ranks on 2 nodes, and the measured shape predicts its own 0.45 s with its network.
#[test]
fn one_nodes_run_profile_of_a_two_node_job_is_predicted_for_the_whole_job() {
    let m = measure(&run_profile("node0", [0, 1]), 1);
    assert_eq!((m.ranks, m.nodes), (4, 2), "{m:?}");
    // `stallscope advise` pools what it is given, one profile too.
    assert_eq!(pool(std::slice::from_ref(&m)).as_ref(), Some(&m));
    let r = advise_links(&m, Vec::new());
    let own = row(&r, "net30", 2);
    assert!(own.current);
    let t = own.predicted_iteration_seconds.unwrap();
    assert!((t - 0.45).abs() < 0.45 * 0.01, "{t}");
    assert!((own.breakdown.unwrap().network - 0.4).abs() < 0.01);
    // A faster link: faster, not free.
    let fast = row(&r, "net100", 2).predicted_iteration_seconds.unwrap();
    assert!(fast < 0.45 && fast > 0.1, "{fast}");
    // Asked for 2 nodes, the job keeps its 2 ranks per node.
    let asked = advise_links(&m, vec![2]);
    assert_eq!(row(&asked, "net30", 2).ranks, 4);
}

/// Both nodes' run profiles pooled: still 2 nodes of 2 ranks, though network namespaces give
/// both the one host name, and the disagreement is said.
#[test]
fn pooled_run_profiles_of_namespace_nodes_are_the_job_their_meta_says() {
    let a = measure(&run_profile("box", [0, 1]), 1);
    let b = measure(&run_profile("box", [2, 3]), 1);
    let m = pool(&[a, b]).unwrap();
    assert_eq!((m.ranks, m.nodes), (4, 2), "{m:?}");
    let said = serde_json::to_string(&m).unwrap();
    assert!(said.contains("host name"), "{said}");
    let r = advise_links(&m, Vec::new());
    let t = row(&r, "net30", 2).predicted_iteration_seconds.unwrap();
    assert!((t - 0.45).abs() < 0.45 * 0.01, "{t}");
}

/// A collector's job profile from agents on 2 of a job's 4 nodes (world_size 8,
/// local_world_size 2): the job has 4 nodes, and the advisor says it heard from 2.
#[test]
fn a_job_profile_counts_the_jobs_nodes_not_the_agents_it_heard_from() {
    let mut frames = vec![Frame::Header(RunHeader {
        host: "head".into(),
        command: vec!["stallscope".into(), "collector".into()],
        warmup_iters: 1,
        ..RunHeader::default()
    })];
    for (rank, node) in [(0u32, "a"), (1, "a"), (2, "b"), (3, "b")] {
        let mut fields = hook_facts();
        for (k, v) in fields.iter_mut() {
            if k == "world_size" {
                *v = "8".into();
            }
        }
        frames.push(Frame::NodeMeta(NodeMeta {
            node: node.into(),
            pid: 100 + rank,
            rank: Some(rank),
            fields,
        }));
        for iter in 0..5 {
            frames.push(Frame::NodeReport(Box::new(NodeReport {
                iteration: NodeIteration {
                    node: node.into(),
                    breakdown: iteration(rank, iter),
                    comm: Vec::new(),
                    world_size: Some(8),
                },
                gpu: None,
            })));
        }
    }
    let m = measure(&frames, 1);
    assert_eq!((m.ranks, m.nodes), (8, 4), "{m:?}");
    assert_eq!(m.hosts, vec!["a".to_string(), "b".to_string()]);
    let said = serde_json::to_string(&m).unwrap();
    assert!(said.contains("heard from 2"), "{said}");
}

/// A measured network part the prediction for the measured shape drops is said, with why:
/// here the profile was taken as one node's job (as `--measured-nodes 1` would).
#[test]
fn the_measured_shape_that_misses_its_own_time_says_so() {
    let mut m = measure(&run_profile("node0", [0, 1]), 1);
    m.nodes = 1;
    let r = advise_links(&m, Vec::new());
    let own = row(&r, "net30", 1);
    assert!(own.current);
    let said = own.extrapolations.join("\n");
    assert!(said.contains("measured shape"), "{said}");
    assert!(said.contains("network"), "{said}");
}

/// The advisor reads a profile one frame at a time (`stallscope advise` and the report stream
/// it from the reader, holding nothing): the warm-up comes from the header, and what it
/// measures is what a pass over the frames in memory measures.
#[test]
fn a_profile_streamed_through_the_fold_measures_what_its_frames_do() {
    let mut frames = run_profile("node0", [0, 1]);
    if let Frame::Header(h) = &mut frames[0] {
        h.warmup_iters = 2;
    }
    let mut fold = super::Measuring::with_profiles_warmup();
    frames.iter().for_each(|f| fold.ingest(f));
    let streamed = fold.finish();
    let held = measure(&frames, 2);
    assert_eq!(streamed.iterations, 4, "6 iterations, 2 of warm-up");
    assert_eq!(
        serde_json::to_string(&streamed).unwrap(),
        serde_json::to_string(&held).unwrap()
    );
    assert_ne!(
        serde_json::to_string(&measure(&frames, 1)).unwrap(),
        serde_json::to_string(&held).unwrap(),
        "the warm-up matters here"
    );
}
