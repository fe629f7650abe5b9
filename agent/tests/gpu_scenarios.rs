//! GPU jobs attributed end to end: the scripted H100 backend behind the real GPU sources,
//! the CPU and NIC counters a node would show, and the markers the PyTorch hook sends, all
//! fed as frames through the `JobTimeline` the live run and the replay use.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use stallscope_agent::gpu::backend::Metric;
use stallscope_agent::gpu::fake::{Activity, ScriptedGpu, H100_H2D_BYTES_PER_S};
use stallscope_agent::gpu::{self, GpuFastSource, GpuSlowSource};
use stallscope_agent::sources::{Registry, Source, Watched};
use stallscope_analysis::attribution::{Basis, IterationBreakdown};
use stallscope_analysis::category::Category;
use stallscope_analysis::frame::Frame;
use stallscope_analysis::job::JobTimeline;
use stallscope_analysis::marker::{Marker, MarkerEvent};
use stallscope_analysis::series::{names, SampleBatch, SeriesKind, LINK_NIC};
use stallscope_analysis::summary::{render_text, summarize, Summary};
use stallscope_analysis::Nanos;

const MS: Nanos = 1_000_000;
/// The fast tier's tick (100 Hz) and the slow tier's interval.
const TICK: Nanos = 10 * MS;
const SLOW: Nanos = 100 * MS;

/// One node: the GPU sources on the scripted backend, scripted CPU and NIC counters, markers.
struct Node {
    clock: Arc<AtomicU64>,
    gpu: Option<(GpuFastSource, GpuSlowSource)>,
    registry: Registry,
    watched: Watched,
    job: JobTimeline,
    /// Cumulative value per (series name, label value).
    counters: HashMap<(&'static str, String), f64>,
    seqs: HashMap<u32, u64>,
}

/// What the CPU side of the node does at one instant.
#[derive(Default)]
struct Cpu {
    /// (pid, share of a core its main thread runs).
    threads: Vec<(u32, f64)>,
    /// bytes/s over the NIC, each direction.
    nic_bytes_per_s: f64,
}

impl Node {
    fn new(gpu: Option<ScriptedGpu>, clock: Arc<AtomicU64>, pids: &[u32]) -> Node {
        Node {
            clock,
            gpu: gpu.map(|g| gpu::sources(Box::new(g))),
            registry: Registry::default(),
            watched: Watched::new(pids.to_vec()),
            job: JobTimeline::default(),
            counters: HashMap::new(),
            seqs: HashMap::new(),
        }
    }

    fn counter(
        &mut self,
        name: &'static str,
        label: (&str, &str),
        extra: &[(&str, &str)],
        add: f64,
    ) {
        let key = (name, label.1.to_string());
        let v = self.counters.entry(key).or_insert(0.0);
        *v += add;
        let mut labels = vec![label];
        labels.extend_from_slice(extra);
        let id = self
            .registry
            .series(name, "x", SeriesKind::Counter, &labels);
        self.registry.push(id, *v as u64);
    }

    /// Samples from `from` to `to` as the 100 Hz sampler would, `cpu(t)` saying what the CPU
    /// side did during the tick ending at `t`.
    fn run(&mut self, from: Nanos, to: Nanos, cpu: impl Fn(Nanos) -> Cpu) {
        let mut t = from;
        while t <= to {
            self.clock.store(t, Ordering::Relaxed);
            if let Some((fast, slow)) = &mut self.gpu {
                fast.sample(&self.watched, &mut self.registry).unwrap();
                if t % SLOW == 0 {
                    slow.sample(&self.watched, &mut self.registry).unwrap();
                }
            }
            let now = cpu(t);
            let secs = TICK as f64 / 1e9;
            for (pid, share) in now.threads {
                let pid = pid.to_string();
                let ns = if t == from { 0.0 } else { share * TICK as f64 };
                self.counter(names::PROC_CPU_NS, ("pid", &pid), &[], ns);
            }
            let nic = if t == from {
                0.0
            } else {
                now.nic_bytes_per_s * secs
            };
            for name in [names::NET_RX_BYTES, names::NET_TX_BYTES] {
                self.counter(name, ("iface", "eth0"), &[("link", LINK_NIC)], nic);
            }
            for d in self.registry.take_new_decls() {
                self.job.ingest(&Frame::Series(d));
            }
            let values = self.registry.take_values();
            self.job.ingest(&Frame::Samples(SampleBatch {
                t_ns: t,
                dur_ns: 0,
                values,
            }));
            t += TICK;
        }
    }

    fn mark(&mut self, pid: u32, rank: u32, iter: u64, t_ns: Nanos, event: MarkerEvent) {
        let seq = self.seqs.entry(pid).or_insert(0);
        let m = Marker {
            seq: *seq,
            t_ns,
            pid,
            rank: Some(rank),
            iter,
            event,
        };
        *seq += 1;
        self.job.ingest(&Frame::Markers(vec![m]));
    }

    fn meta(&mut self, pid: u32, rank: u32, kv: &[(&str, &str)]) {
        let kv = kv
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.mark(pid, rank, 0, 0, MarkerEvent::Meta(kv));
    }

    fn phase(&mut self, pid: u32, rank: u32, iter: u64, name: &str, from: Nanos, to: Nanos) {
        self.mark(pid, rank, iter, from, MarkerEvent::Begin(name.into()));
        self.mark(pid, rank, iter, to, MarkerEvent::End(name.into()));
    }

    fn breakdowns(&mut self) -> Vec<IterationBreakdown> {
        let now = self.clock.load(Ordering::Relaxed);
        self.job.attribute_ready(now, true)
    }
}

/// Share of the summed wall time of `bs` (iterations 1.. — iteration 0 starts at the first
/// marker) that went to `c`.
fn share(bs: &[IterationBreakdown], c: Category) -> f64 {
    let counted: Vec<_> = bs.iter().filter(|b| b.iter > 0).collect();
    let wall: u64 = counted.iter().map(|b| b.wall_ns()).sum();
    counted.iter().map(|b| b.split.get(c)).sum::<u64>() as f64 / wall as f64
}

fn has_basis(bs: &[IterationBreakdown], basis: Basis) -> bool {
    bs.iter()
        .any(|b| b.evidence.iter().any(|e| e.basis == basis))
}

const ITERS: u64 = 8;

/// One rank on one H100, DataLoader with one worker. Per 400 ms iteration: the loop waits
/// 280 ms for the batch while the worker decodes; the batch is copied in (20 ms of PCIe at the
/// measured H100 rate, unmarked, as `.to("cuda")` is); then 100 ms of kernels while the loop's
/// CPU thread sleeps in a CUDA sync.
fn data_bound(with_gpu: bool) -> Vec<IterationBreakdown> {
    data_bound_job(with_gpu).0
}

/// [`data_bound`], with the job's summary. The loop says its batch is the 20 ms of PCIe copy.
fn data_bound_job(with_gpu: bool) -> (Vec<IterationBreakdown>, Summary) {
    let (rank, worker) = (100, 101);
    let clock = Arc::new(AtomicU64::new(0));
    let mut gpu = ScriptedGpu::h100_node(1, clock.clone());
    gpu.attach(0, rank);
    let period = 400 * MS;
    for i in 0..ITERS {
        let t = i * period;
        gpu.set(0, t, Activity::h100_idle());
        gpu.set(0, t + 280 * MS, Activity::h100_copying_in());
        gpu.set(0, t + 300 * MS, Activity::h100_busy());
    }
    let mut node = Node::new(with_gpu.then_some(gpu), clock, &[rank, worker]);
    let batch_bytes = (H100_H2D_BYTES_PER_S * 0.020) as u64;
    node.meta(
        rank,
        0,
        &[
            ("workers", "1"),
            ("cuda_device", "0"),
            ("batch_bytes", &batch_bytes.to_string()),
        ],
    );
    node.meta(worker, 0, &[("role", "loader"), ("parent", "100")]);
    for i in 0..ITERS {
        let t = i * period;
        node.phase(rank, 0, i, "data", t + MS, t + 280 * MS);
        node.mark(rank, 0, i, t + period, MarkerEvent::Step);
    }
    node.run(0, ITERS * period + 50 * MS, |t| {
        let phase = (t.saturating_sub(1) % period) / MS;
        let loading = phase < 280;
        Cpu {
            threads: vec![
                (
                    rank,
                    if (280..300).contains(&phase) {
                        0.3
                    } else {
                        0.05
                    },
                ),
                (worker, if loading { 1.0 } else { 0.0 }),
            ],
            nic_bytes_per_s: 0.0,
        }
    });
    let bs = node.breakdowns();
    (bs, summarize(&node.job))
}

#[test]
fn single_gpu_data_bound_job_shows_data_prep_and_gpu_compute_and_the_copy() {
    let bs = data_bound(true);
    assert_eq!(bs.len() as u64, ITERS);
    let prep = share(&bs, Category::DataPrep);
    let compute = share(&bs, Category::Compute);
    let inter = share(&bs, Category::Interconnect);
    let other = share(&bs, Category::Other);
    // 280 of 400 ms waiting for data, 100 ms of kernels, 20 ms copying in. NVML averages
    // utilisation over 1/6 s, so part of the kernels' 25 % smears into the idle copy and the
    // wait, and shows as other; never more compute than there was.
    assert!((prep - 0.70).abs() < 0.03, "data_prep {prep:.3}");
    assert!(compute > 0.12 && compute < 0.29, "compute {compute:.3}");
    assert!(
        inter > 0.02 && inter < 0.10,
        "interconnect (host-to-device) {inter:.3}"
    );
    assert!(has_basis(&bs, Basis::GpuBusy));
    assert!(has_basis(&bs, Basis::CounterGpuLink));
    // Without the GPU source the kernels' time is invisible: the loop's thread slept.
    let cpu_only = data_bound(false);
    let blind = share(&cpu_only, Category::Compute);
    assert!(
        compute > blind + 0.1,
        "GPU evidence turns idle-looking time into compute: {compute:.3} vs {blind:.3}"
    );
    assert!(
        share(&cpu_only, Category::Other) > other + 0.1,
        "other {other:.3}"
    );
}

#[test]
fn the_summary_shows_what_the_gpu_did_per_iteration_next_to_the_batch() {
    let (_, summary) = data_bound_job(true);
    let g = summary.ranks[0].gpu.as_ref().expect("rank 0 has a GPU");
    assert_eq!(g.gpu, "0");
    assert!(g.uuid.as_deref().is_some_and(|u| u.starts_with("GPU-")));
    // The copy is the batch: PCIe bytes received per iteration over the batch's bytes.
    let rx = g.pcie_rx_bytes_per_iteration.unwrap();
    let ratio = rx / g.batch_bytes.unwrap() as f64;
    assert!((ratio - 1.0).abs() < 0.05, "PCIe in / batch = {ratio:.3}");
    // 100 of 400 ms of kernels; NVML's 1/6 s window smears but does not add.
    let busy = g.busy_fraction.unwrap();
    assert!((busy - 0.25).abs() < 0.05, "busy {busy:.3}");
    // Energy per iteration is the mean power over the iteration's 0.4 s.
    let (w, j) = (
        g.power_watts.unwrap(),
        g.energy_joules_per_iteration.unwrap(),
    );
    assert!(
        (j - w * 0.4).abs() < 0.05 * j,
        "{j:.1} J vs {w:.0} W × 0.4 s"
    );
    let text = render_text(&summary);
    assert!(
        text.contains("gpu: rank 0 on GPU 0: "),
        "the text summary has the GPU line:\n{text}"
    );
    assert!(text.contains("1.00× the 704.0 MB batch"), "{text}");
    // Without NVML the loop still drives CUDA device 0: nothing is measured, and the summary
    // says so in words rather than leaving the GPU out.
    let (_, unread) = data_bound_job(false);
    let g = unread.ranks[0]
        .gpu
        .as_ref()
        .expect("the rank's GPU is named");
    assert_eq!((g.read_fraction, g.busy_fraction), (0.0, None));
    let text = render_text(&unread);
    assert!(text.contains("no NVML readings"), "{text}");
    assert!(
        unread
            .warnings
            .iter()
            .any(|w| w.contains("CUDA device 0") && w.contains("not measured")),
        "{:?}",
        unread.warnings
    );
}

/// Eight ranks, one per H100 of an HGX node. Per 100 ms iteration: 70 ms of kernels, then
/// the exposed all-reduce (marked `comm` by the hook) over NVLink at the achieved rate.
fn eight_gpus(nic_in_comm: bool) -> Vec<IterationBreakdown> {
    let ranks: Vec<u32> = (0..8).map(|r| 200 + r).collect();
    let clock = Arc::new(AtomicU64::new(0));
    let mut gpu = ScriptedGpu::h100_node(8, clock.clone());
    // A100-like gaps: no GPM on GPU 7; the rest of the evidence stands.
    gpu.unsupported(7, Metric::Gpm, "GPM needs a Hopper or newer GPU");
    let period = 100 * MS;
    // The NIC (2-node job): 200 Gb/s shared by 8 GPUs, each GPU's share crossing PCIe.
    let nic_rate = 25e9;
    for (d, &pid) in ranks.iter().enumerate() {
        gpu.attach(d, pid);
        for i in 0..ITERS {
            let t = i * period;
            gpu.set(d, t, Activity::h100_busy());
            gpu.set(d, t + 70 * MS, Activity::h100_allreduce_nvlink());
            if nic_in_comm {
                // Hierarchical all-reduce: 3 ms within the node, then across the network.
                let across = Activity {
                    util_pct: 10.0,
                    ..Activity::h100_idle()
                };
                gpu.set(d, t + 73 * MS, across.with_pcie(nic_rate / 8.0));
            }
        }
    }
    let mut node = Node::new(Some(gpu), clock, &ranks);
    for (r, &pid) in ranks.iter().enumerate() {
        let local = r.to_string();
        node.meta(pid, r as u32, &[("workers", "0"), ("local_rank", &local)]);
        for i in 0..ITERS {
            let t = i * period;
            node.phase(pid, r as u32, i, "comm", t + 70 * MS, t + period - MS);
            node.mark(pid, r as u32, i, t + period, MarkerEvent::Step);
        }
    }
    let threads: Vec<(u32, f64)> = ranks.iter().map(|&p| (p, 0.1)).collect();
    node.run(0, ITERS * period + 50 * MS, |t| {
        let phase = (t.saturating_sub(1) % period) / MS;
        Cpu {
            threads: threads.clone(),
            nic_bytes_per_s: if nic_in_comm && phase >= 73 {
                nic_rate
            } else {
                2e3
            },
        }
    });
    for (d, &pid) in ranks.iter().enumerate() {
        assert_eq!(
            node.job.node.gpu_of(pid),
            Some(d.to_string()),
            "rank {d}'s GPU"
        );
    }
    node.breakdowns()
}

#[test]
fn eight_gpu_node_all_reduce_over_nvlink_is_interconnect() {
    let bs = eight_gpus(false);
    assert_eq!(bs.len() as u64, ITERS * 8);
    let inter = share(&bs, Category::Interconnect);
    let net = share(&bs, Category::Network);
    let compute = share(&bs, Category::Compute);
    assert!((inter - 0.29).abs() < 0.03, "interconnect {inter:.3}");
    assert!(net < 0.01, "network {net:.3}");
    // 70 % kernels; NVML's 1/6 s utilisation window smears the all-reduce's low utilisation
    // over part of them.
    assert!(compute > 0.45 && compute < 0.72, "compute {compute:.3}");
    assert!(compute > inter, "compute {compute:.3} is the largest");
    assert!(has_basis(&bs, Basis::CommGpuLinkBytes));
}

#[test]
fn two_node_all_reduce_leaving_over_the_nic_is_network() {
    let bs = eight_gpus(true);
    let inter = share(&bs, Category::Interconnect);
    let net = share(&bs, Category::Network);
    // 26 of the 29 ms of exposed comm on the NIC, 3 ms on NVLink; the GPUs' PCIe bytes are
    // the NIC's own (GPUDirect RDMA) and do not count as interconnect. The 3 ms NVLink burst
    // is shorter than a 10 ms tick, so its peak rate is underestimated and it weighs up to
    // ~3× its true time.
    assert!(net > 0.2, "network {net:.3}");
    assert!(inter < 0.1, "interconnect {inter:.3}");
    assert!(
        net > 2.5 * inter,
        "network {net:.3} vs interconnect {inter:.3}"
    );
    assert!(has_basis(&bs, Basis::CommNicBytes));
}

/// Two ranks on two H100s of one node, DDP over NVLink, a CUDA loop with no sync of its own:
/// the CPU thread queues an iteration in 6 ms and goes straight back to the DataLoader, whose
/// one worker per rank delivers a batch every 100 ms. Rank 1's kernels take 80 ms, rank 0's
/// 60 ms; each GPU then all-reduces over NVLink for 10 ms, rank 0's NCCL kernel first spinning
/// 20 ms (100% utilisation, no bytes) until rank 1 joins. So per 100 ms each GPU idles 10 ms
/// for data; rank 0 computes 60 and waits 20 for rank 1; both move bytes 10. On the CPU the
/// loop waits 94 ms of every 100 for data, while its GPU runs the queued step.
///
/// The hook's CUDA-event times of iteration k arrive with the step of iteration k + 1, as the
/// lazy read-back sends them. Returns the breakdowns, and how many iterations the live path
/// attributed before the last iteration's GPU times had arrived.
fn cuda_ddp_running_ahead(with_events: bool) -> (Vec<IterationBreakdown>, usize) {
    let (ranks, workers) = ([300u32, 301], [310u32, 311]);
    let clock = Arc::new(AtomicU64::new(0));
    let mut gpu = ScriptedGpu::h100_node(2, clock.clone());
    let period = 100 * MS;
    let kernels = [60 * MS, 80 * MS];
    let nccl_spinning = Activity {
        power_mw: 250_000,
        ..Activity::h100_busy()
    };
    for d in 0..2 {
        gpu.attach(d, ranks[d]);
        // GPU iteration k runs from k·period (when it was queued) for 90 ms.
        for k in 0..=ITERS {
            let t = k * period;
            gpu.set(d, t, Activity::h100_busy());
            if kernels[d] < 80 * MS {
                gpu.set(d, t + kernels[d], nccl_spinning);
            }
            gpu.set(d, t + 80 * MS, Activity::h100_allreduce_nvlink());
            gpu.set(d, t + 90 * MS, Activity::h100_idle());
        }
    }
    let mut node = Node::new(
        Some(gpu),
        clock,
        &[ranks[0], ranks[1], workers[0], workers[1]],
    );
    for r in 0..2u32 {
        let (pid, worker) = (ranks[r as usize], workers[r as usize]);
        let local = r.to_string();
        node.meta(pid, r, &[("workers", "1"), ("local_rank", &local)]);
        node.meta(
            worker,
            r,
            &[("role", "loader"), ("parent", &pid.to_string())],
        );
        if with_events {
            node.meta(pid, r, &[("cuda_device", &local)]);
        }
    }
    // CPU iteration k: from step k - 1 at (k-1)·period + 6 ms, the data wait until k·period,
    // then 6 ms queueing the step, its all-reduce queued in the last 1 ms.
    let step_at = |k: u64| k * period + 6 * MS;
    let mut last_times = Vec::new();
    for r in 0..2u32 {
        let pid = ranks[r as usize];
        for k in 0..ITERS {
            let wait_from = if k == 0 { MS } else { step_at(k - 1) };
            node.phase(pid, r, k, "data", wait_from, k * period);
            node.phase(pid, r, k, "comm", k * period + 5 * MS, step_at(k));
            node.mark(pid, r, k, step_at(k), MarkerEvent::Step);
            if !with_events || k == 0 {
                continue;
            }
            // Read back at step k: iteration k - 1's times.
            let comm_us = (90 * MS - kernels[r as usize]) / 1000;
            let times = [
                ("gpu_iter", (k - 1).to_string()),
                ("gpu_iter_us", "100000".to_string()),
                ("gpu_data_us", "10000".to_string()),
                ("gpu_comm_us", comm_us.to_string()),
            ];
            let kv: Vec<(&str, &str)> = times.iter().map(|(a, b)| (*a, b.as_str())).collect();
            if k == ITERS - 1 {
                last_times.push((
                    pid,
                    r,
                    kv.iter()
                        .map(|(a, b)| (a.to_string(), b.to_string()))
                        .collect::<Vec<_>>(),
                ));
            } else {
                node.meta(pid, r, &kv);
            }
        }
    }
    node.run(0, ITERS * period + 50 * MS, |t| {
        let in_period = (t.saturating_sub(1) % period) / MS;
        let queueing = in_period < 6;
        let mut threads: Vec<(u32, f64)> = ranks
            .iter()
            .map(|&p| (p, if queueing { 1.0 } else { 0.02 }))
            .collect();
        // Each rank's one worker decodes through the whole of every wait (a wait the loader
        // is not seen working through is unexplained, `other`).
        threads.extend(workers.iter().map(|&w| (w, 1.0)));
        Cpu {
            threads,
            nic_bytes_per_s: 0.0,
        }
    });
    // Live: everything is sampled, but iteration ITERS - 2's GPU times are not in yet.
    let now = node.clock.load(Ordering::Relaxed);
    let mut bs = node.job.attribute_ready(now, false);
    let before = bs.len();
    for (pid, r, kv) in last_times {
        let kv: Vec<(&str, &str)> = kv.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        node.meta(pid, r, &kv);
    }
    bs.extend(node.breakdowns());
    (bs, before)
}

#[test]
fn cuda_events_tell_a_wait_the_gpu_spent_on_queued_kernels_from_a_stall() {
    let (bs, attributed_early) = cuda_ddp_running_ahead(true);
    let rank = |r: u32| -> Vec<IterationBreakdown> {
        bs.iter()
            .filter(|b| b.rank == r && b.iter > 0 && b.iter < ITERS - 1)
            .cloned()
            .collect()
    };
    let (r0, r1) = (rank(0), rank(1));
    for (name, bs, compute, wait) in [("rank 0", &r0, 0.60, 0.20), ("rank 1", &r1, 0.80, 0.0)] {
        let data = share(bs, Category::DataPrep) + share(bs, Category::DataFetch);
        let got = share(bs, Category::Compute);
        let peer = share(bs, Category::PeerWait);
        let inter = share(bs, Category::Interconnect);
        assert!((data - 0.10).abs() < 0.01, "{name}: data {data:.3}");
        assert!((got - compute).abs() < 0.03, "{name}: compute {got:.3}");
        assert!((peer - wait).abs() < 0.01, "{name}: peer_wait {peer:.3}");
        assert!(
            (inter - 0.10).abs() < 0.03,
            "{name}: interconnect {inter:.3}"
        );
        assert!(share(bs, Category::Other) < 0.01, "{name}");
    }
    assert!(has_basis(&r0, Basis::GpuSlowestPeer));
    assert!(has_basis(&r0, Basis::GpuIdleForData));
    // Iterations wait for their GPU times: live, the last two iterations of each rank (whose
    // times were still on their way) were held back, the earlier ones attributed.
    let total = 2 * ITERS as usize;
    assert_eq!(attributed_early, total - 4);
    assert_eq!(bs.len(), total);

    // Without the events the CPU's view stands: a job that looks data-bound.
    let (cpu_view, _) = cuda_ddp_running_ahead(false);
    let data = share(&cpu_view, Category::DataPrep);
    assert!(data > 0.8, "CPU-side data_prep {data:.3}");
}
