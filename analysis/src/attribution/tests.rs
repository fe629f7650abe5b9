//! Attribution on constructed timelines with known answers.

use super::*;
use crate::category::Category::*;
use crate::loops::Span;
use crate::series::{SampleBatch, SeriesDecl, SeriesId, SeriesKind};
use crate::timeline::SeriesStore;

const MS: u64 = 1_000_000;

/// A scripted node: each series is a function of time (ms) giving its per-ms increase (for
/// counters) or its level (for gauges), sampled every 10 ms like the 100 Hz sampler.
struct Script {
    store: SeriesStore,
    next_id: u32,
}

impl Script {
    fn new() -> Self {
        Script {
            store: SeriesStore::default(),
            next_id: 0,
        }
    }

    fn series(&mut self, kind: SeriesKind, f: impl Fn(u64) -> f64, until_ms: u64) -> SeriesId {
        let id = SeriesId(self.next_id);
        self.next_id += 1;
        self.store.declare(SeriesDecl {
            id,
            name: format!("s{}", id.0),
            unit: "x".into(),
            kind,
            labels: vec![],
        });
        let mut acc = 0.0;
        let mut values = vec![(0u64, 0u64)];
        for ms in 0..until_ms {
            acc += f(ms);
            if (ms + 1) % 10 == 0 {
                let v = match kind {
                    SeriesKind::Counter => acc,
                    SeriesKind::Gauge => f(ms),
                };
                values.push(((ms + 1) * MS, v as u64));
            }
        }
        // Interleave into the store via a private store per series, then merge: the store
        // only needs monotonic batches, so feed each series' points in time order.
        let mut merged = std::mem::take(&mut self.store);
        for (t, v) in values {
            merged.ingest_unordered_for_tests(&SampleBatch {
                t_ns: t,
                dur_ns: 0,
                values: vec![(id, v)],
            });
        }
        self.store = merged;
        id
    }

    /// Busy ns per ms of a thread: 1 ms when `busy(ms)`.
    fn thread(
        &mut self,
        busy: impl Fn(u64) -> bool,
        blocked: impl Fn(u64) -> bool,
        until: u64,
    ) -> ThreadSeries {
        let cpu = self.series(
            SeriesKind::Counter,
            |ms| if busy(ms) { MS as f64 } else { 0.0 },
            until,
        );
        let blocked = self.series(
            SeriesKind::Gauge,
            |ms| if blocked(ms) { 1.0 } else { 0.0 },
            until,
        );
        ThreadSeries {
            pid: 0,
            cpu: Some(cpu),
            runq: None,
            blocked: Some(blocked),
            others: [None; 3],
            read_bytes: None,
        }
    }
}

fn input(start_ms: u64, end_ms: u64, spans: &[(&str, u64, u64)]) -> IterationInput {
    IterationInput {
        rank: 0,
        pid: 1,
        iter: 3,
        start: start_ms * MS,
        end: end_ms * MS,
        spans: spans
            .iter()
            .map(|(p, a, b)| Span {
                phase: p.to_string(),
                begin: a * MS,
                end: b * MS,
                op: None,
            })
            .collect(),
        peer_arrivals: vec![],
        gpu: None,
        waits: vec![],
    }
}

fn ms(b: &IterationBreakdown, c: Category) -> f64 {
    b.split.get(c) as f64 / MS as f64
}

#[test]
fn data_wait_with_a_busy_loop_thread_is_prep() {
    let mut s = Script::new();
    let main = s.thread(|_| true, |_| false, 200);
    let rank = RankSeries {
        main,
        loaders: vec![],
        gpu: None,
    };
    let b = attribute(
        &input(0, 100, &[("data", 0, 60)]),
        &s.store,
        &rank,
        &Links::default(),
    );
    assert_eq!(b.split.total(), 100 * MS);
    assert_eq!(ms(&b, DataPrep), 60.0);
    assert_eq!(ms(&b, Compute), 40.0);
    assert_eq!(b.coverage.marked_ns, 60 * MS);
    assert_eq!(b.coverage.sampled_ns, 100 * MS);
}

#[test]
fn data_wait_while_workers_block_on_io_is_fetch_and_mixed_workers_split() {
    let mut s = Script::new();
    let main = s.thread(|ms| ms >= 50, |_| false, 200);
    let reader = s.thread(|_| false, |ms| ms < 50, 200);
    let decoder = s.thread(|ms| ms < 50, |_| false, 200);
    let only_io = RankSeries {
        main,
        loaders: vec![reader],
        gpu: None,
    };
    let b = attribute(
        &input(0, 100, &[("data", 0, 50)]),
        &s.store,
        &only_io,
        &Links::default(),
    );
    assert_eq!(ms(&b, DataFetch), 50.0);
    assert_eq!(ms(&b, Compute), 50.0);
    let mixed = RankSeries {
        main,
        loaders: vec![reader, decoder],
        gpu: None,
    };
    let b = attribute(
        &input(0, 100, &[("data", 0, 50)]),
        &s.store,
        &mixed,
        &Links::default(),
    );
    assert_eq!(ms(&b, DataFetch), 25.0);
    assert_eq!(ms(&b, DataPrep), 25.0);
    assert!(b.evidence.iter().any(|e| e.basis == Basis::DataLoaderIo));
}

#[test]
fn a_data_wait_with_sleeping_workers_is_other_not_prep() {
    let mut s = Script::new();
    // The loop computes after its wait; its one worker sleeps (state S) through the wait, as
    // on an object-store or HTTP read, and decodes for the last 10 ms of it.
    let main = s.thread(|ms| ms >= 60, |_| false, 200);
    let worker = s.thread(|ms| (50..60).contains(&ms), |_| false, 200);
    let rank = RankSeries {
        main,
        loaders: vec![worker],
        gpu: None,
    };
    let b = attribute(
        &input(0, 100, &[("data", 0, 60)]),
        &s.store,
        &rank,
        &Links::default(),
    );
    assert_eq!(
        ms(&b, DataPrep),
        10.0,
        "only what the worker was seen doing"
    );
    assert_eq!(ms(&b, DataFetch), 0.0);
    assert_eq!(ms(&b, Other), 50.0, "nothing seen explains the rest");
    assert_eq!(ms(&b, Compute), 40.0);
    assert!(b
        .evidence
        .iter()
        .any(|e| e.basis == Basis::DataNoActivity && e.category == Other));
    // Nothing sampled at all: the wait is unexplained, not prep.
    let b = attribute(
        &input(0, 100, &[("data", 0, 60)]),
        &SeriesStore::default(),
        &RankSeries::default(),
        &Links::default(),
    );
    assert_eq!(ms(&b, DataPrep), 0.0);
    assert_eq!(ms(&b, Other), 100.0);
}

#[test]
fn a_data_wait_with_sleeping_workers_whose_sockets_receive_is_fetch() {
    let mut s = Script::new();
    // As above, but the worker's own sockets (flow class `data`) receive 1 kB/ms while it
    // sleeps: it waits on an object-store or HTTP read.
    let main = s.thread(|ms| ms >= 60, |_| false, 200);
    let worker = s.thread(|ms| (50..60).contains(&ms), |_| false, 200);
    let data_rx = s.series(
        SeriesKind::Counter,
        |ms| if ms < 50 { 1e3 } else { 0.0 },
        200,
    );
    let rank = RankSeries {
        main,
        loaders: vec![worker],
        gpu: None,
    };
    let links = Links {
        data_rx: vec![data_rx],
        ..Links::default()
    };
    let b = attribute(&input(0, 100, &[("data", 0, 60)]), &s.store, &rank, &links);
    assert_eq!(
        ms(&b, DataPrep),
        10.0,
        "the decode the worker was seen doing"
    );
    assert_eq!(ms(&b, DataFetch), 50.0, "asleep while its sockets received");
    assert_eq!(ms(&b, Other), 0.0);
    assert!(b
        .evidence
        .iter()
        .any(|e| e.basis == Basis::DataLoaderNet && e.category == DataFetch));
    // Without a loader marker, an idle rank whose loader sleeps on its sockets: fetch too.
    let b = attribute(
        &input(0, 40, &[]),
        &s.store,
        &RankSeries {
            main,
            loaders: vec![worker],
            gpu: None,
        },
        &links,
    );
    assert_eq!(ms(&b, DataFetch), 40.0);
}

#[test]
fn exposed_comm_goes_to_the_link_that_moved_the_bytes() {
    let mut s = Script::new();
    let main = s.thread(|ms| ms < 70, |_| false, 200);
    // 1 MB/ms on the NIC during comm, nothing on loopback.
    let nic = s.series(
        SeriesKind::Counter,
        |ms| if ms >= 70 { 1e6 } else { 0.0 },
        200,
    );
    let lo = s.series(SeriesKind::Counter, |_| 0.0, 200);
    let rank = RankSeries {
        main,
        loaders: vec![],
        gpu: None,
    };
    let links = Links {
        nic: vec![nic],
        local: vec![lo],
        nic_bytes_per_s: 1e9,
        local_bytes_per_s: 1e10,
        comm_fallback: Interconnect,
        ..Links::default()
    };
    let b = attribute(
        &input(0, 100, &[("comm", 70, 100)]),
        &s.store,
        &rank,
        &links,
    );
    assert_eq!(ms(&b, Network), 30.0);
    assert_eq!(ms(&b, Compute), 70.0);
    // The same bytes on loopback are interconnect.
    let swapped = Links {
        nic: vec![lo],
        local: vec![nic],
        ..links.clone()
    };
    let b = attribute(
        &input(0, 100, &[("comm", 70, 100)]),
        &s.store,
        &rank,
        &swapped,
    );
    assert_eq!(ms(&b, Interconnect), 30.0);
}

#[test]
fn comm_splits_by_estimated_transfer_time_not_bytes() {
    let mut s = Script::new();
    let main = s.thread(|_| false, |_| false, 200);
    let nic = s.series(SeriesKind::Counter, |_| 1e5, 200); // 100 MB/s
    let lo = s.series(SeriesKind::Counter, |_| 1e6, 200); // 1 GB/s
    let links = Links {
        nic: vec![nic],
        local: vec![lo],
        nic_bytes_per_s: 1e8,
        local_bytes_per_s: 1e10,
        comm_fallback: Network,
        ..Links::default()
    };
    // Per second of comm: NIC takes 0.1e9/1e8 = 1 s-units, loopback 1e9/1e10 = 0.1.
    let b = attribute(
        &input(0, 110, &[("comm", 0, 110)]),
        &s.store,
        &RankSeries {
            main,
            loaders: vec![],
            gpu: None,
        },
        &links,
    );
    assert_eq!(ms(&b, Network), 100.0);
    assert_eq!(ms(&b, Interconnect), 10.0);
}

#[test]
fn waiting_for_the_last_rank_is_peer_wait() {
    let mut s = Script::new();
    let main = s.thread(|ms| ms < 50, |_| false, 200);
    let nic = s.series(
        SeriesKind::Counter,
        |ms| if ms >= 80 { 1e6 } else { 0.0 },
        200,
    );
    let links = Links {
        nic: vec![nic],
        nic_bytes_per_s: 1e9,
        ..Links::default()
    };
    let mut inp = input(0, 100, &[("comm", 50, 100)]);
    inp.peer_arrivals = vec![Some(80 * MS)];
    let b = attribute(
        &inp,
        &s.store,
        &RankSeries {
            main,
            loaders: vec![],
            gpu: None,
        },
        &links,
    );
    assert_eq!(ms(&b, PeerWait), 30.0);
    assert_eq!(ms(&b, Network), 20.0);
    assert_eq!(ms(&b, Compute), 50.0);
}

#[test]
fn without_markers_counters_decide_per_tick() {
    let mut s = Script::new();
    // 0-40 busy; 40-70 idle with NIC traffic; 70-90 idle, loader busy; 90-100 nothing.
    let main = s.thread(|ms| ms < 40, |_| false, 200);
    let loader = s.thread(|ms| (70..90).contains(&ms), |_| false, 200);
    let nic = s.series(
        SeriesKind::Counter,
        |ms| if (40..70).contains(&ms) { 1e5 } else { 0.0 },
        200,
    );
    let links = Links {
        nic: vec![nic],
        nic_bytes_per_s: 1e8,
        ..Links::default()
    };
    let b = attribute(
        &input(0, 100, &[]),
        &s.store,
        &RankSeries {
            main,
            loaders: vec![loader],
            gpu: None,
        },
        &links,
    );
    assert_eq!(ms(&b, Compute), 40.0);
    assert_eq!(ms(&b, Network), 30.0);
    assert_eq!(ms(&b, DataPrep), 20.0);
    assert_eq!(ms(&b, Other), 10.0);
    assert_eq!(b.coverage.marked_ns, 0);
}

#[test]
fn no_samples_at_all_still_sums_to_wall_time() {
    let store = SeriesStore::default();
    let b = attribute(
        &input(5, 107, &[("data", 5, 50), ("comm", 90, 107)]),
        &store,
        &RankSeries::default(),
        &Links {
            comm_fallback: Network,
            ..Links::default()
        },
    );
    assert_eq!(b.split.total(), 102 * MS);
    assert_eq!(ms(&b, DataPrep), 0.0, "no loader activity was seen");
    assert_eq!(ms(&b, Network), 17.0);
    assert_eq!(ms(&b, Other), 85.0);
    assert_eq!(b.coverage.sampled_ns, 0);
}

#[test]
fn parts_always_sum_exactly_to_the_wall_time() {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |m: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % m
    };
    let mut s = Script::new();
    let main = s.thread(|ms| ms % 3 == 0, |ms| ms % 7 == 0, 1000);
    let loader = s.thread(|ms| ms % 5 < 2, |ms| ms % 11 < 3, 1000);
    let nic = s.series(SeriesKind::Counter, |ms| (ms % 13) as f64 * 1e4, 1000);
    let links = Links {
        nic: vec![nic],
        nic_bytes_per_s: 3e7,
        ..Links::default()
    };
    let rank = RankSeries {
        main,
        loaders: vec![loader],
        gpu: None,
    };
    for _ in 0..200 {
        let a = next(500) * MS + next(MS);
        let b = a + 1 + next(400) * MS + next(MS);
        let x = a + next(b - a);
        let y = x + next(b - x);
        let mut inp = input(0, 0, &[]);
        inp.start = a;
        inp.end = b;
        inp.spans = vec![
            Span {
                phase: "data".into(),
                begin: a,
                end: x,
                op: None,
            },
            Span {
                phase: "comm".into(),
                begin: y,
                end: b,
                op: None,
            },
        ];
        inp.peer_arrivals = vec![Some(y + next(b - y + 1))];
        let out = attribute(&inp, &s.store, &rank, &links);
        assert_eq!(out.split.total(), b - a);
        assert_eq!(out.evidence.iter().map(|e| e.ns).sum::<u64>(), b - a);
        // The same with GPU times of any size, some missing.
        let some = |v: u64| (v % 4 != 0).then_some(v);
        let comm = some(next(2 * (b - a)));
        inp.gpu = Some(CudaIteration {
            iter_ns: some(next(3 * (b - a))),
            data_idle_ns: some(next(2 * (b - a))),
            comm_ns: comm,
            fastest_comm_ns: comm.and_then(|c| some(next(c + 1))),
        });
        let out = attribute(&inp, &s.store, &rank, &links);
        assert_eq!(out.split.total(), b - a, "{:?}", inp.gpu);
        assert_eq!(out.evidence.iter().map(|e| e.ns).sum::<u64>(), b - a);
    }
}

/// A CUDA rank whose loop thread sleeps except while it queues work (the first 5 ms after
/// each wait) and whose DataLoader worker decodes for the first 60 ms of each 100 ms.
fn cuda_rank(s: &mut Script) -> RankSeries {
    let main = s.thread(|ms| (60..65).contains(&(ms % 100)), |_| false, 300);
    let worker = s.thread(|ms| ms % 100 < 60, |_| false, 300);
    RankSeries {
        main,
        loaders: vec![worker],
        gpu: None,
    }
}

#[test]
fn a_data_wait_the_gpu_spent_on_queued_kernels_is_not_a_stall() {
    let mut s = Script::new();
    let rank = cuda_rank(&mut s);
    let mut inp = input(100, 200, &[("data", 100, 160)]);
    let cpu_only = attribute(&inp, &s.store, &rank, &Links::default());
    assert_eq!(ms(&cpu_only, DataPrep), 60.0, "the CPU saw a 60 ms wait");
    // The GPU ran the previous step's kernels all through the wait.
    inp.gpu = Some(CudaIteration {
        iter_ns: Some(100 * MS),
        data_idle_ns: Some(0),
        ..CudaIteration::default()
    });
    let b = attribute(&inp, &s.store, &rank, &Links::default());
    assert_eq!(ms(&b, DataPrep), 0.0);
    assert_eq!(ms(&b, Compute), 100.0);
    assert_eq!(ms(&b, Other), 0.0, "a slept-through sync is GPU work");
    assert!(b.evidence.iter().any(|e| e.basis == Basis::GpuWork));
}

#[test]
fn the_gpu_idle_part_of_a_data_wait_is_the_stall_of_the_kind_the_loader_showed() {
    let mut s = Script::new();
    let main = s.thread(|_| false, |_| false, 300);
    let reader = s.thread(|_| false, |ms| ms % 100 < 60, 300);
    let rank = RankSeries {
        main,
        loaders: vec![reader],
        gpu: None,
    };
    let mut inp = input(100, 200, &[("data", 100, 160)]);
    // The GPU's iteration took 110 ms on its clock, 22 of them idle for data: laid onto the
    // CPU's 100 ms, 20.
    inp.gpu = Some(CudaIteration {
        iter_ns: Some(110 * MS),
        data_idle_ns: Some(22 * MS),
        ..CudaIteration::default()
    });
    let b = attribute(&inp, &s.store, &rank, &Links::default());
    assert_eq!(ms(&b, DataFetch), 20.0);
    assert_eq!(ms(&b, DataPrep), 0.0);
    assert_eq!(ms(&b, Compute), 80.0);
}

#[test]
fn the_exposed_all_reduce_on_the_gpu_is_comm_and_waiting_for_the_fastest_is_peer_wait() {
    let mut s = Script::new();
    let main = s.thread(|ms| ms % 100 < 5, |_| false, 300);
    // NIC bytes flow for the last 40 ms of each iteration, while the CPU thread sleeps in a
    // sync it counts as compute (spinning) or nothing.
    let nic = s.series(
        SeriesKind::Counter,
        |ms| if ms % 100 >= 60 { 1e6 } else { 0.0 },
        300,
    );
    let links = Links {
        nic: vec![nic],
        nic_bytes_per_s: 1e9,
        comm_fallback: Network,
        ..Links::default()
    };
    let rank = RankSeries {
        main,
        loaders: vec![],
        gpu: None,
    };
    // On the CPU the all-reduce was queued at once: a 1 ms comm span.
    let mut inp = input(100, 200, &[("comm", 104, 105)]);
    inp.gpu = Some(CudaIteration {
        iter_ns: Some(100 * MS),
        data_idle_ns: None,
        comm_ns: Some(40 * MS),
        fastest_comm_ns: Some(10 * MS),
    });
    let b = attribute(&inp, &s.store, &rank, &links);
    assert_eq!(ms(&b, PeerWait), 30.0);
    assert_eq!(ms(&b, Network), 10.0);
    assert_eq!(ms(&b, Compute), 60.0);
    assert!(b.evidence.iter().any(|e| e.basis == Basis::GpuSlowestPeer));
    // Without the other ranks' times, the whole exposed all-reduce is the transfer.
    inp.gpu = inp.gpu.map(|g| CudaIteration {
        fastest_comm_ns: None,
        ..g
    });
    let b = attribute(&inp, &s.store, &rank, &links);
    assert_eq!(ms(&b, Network), 40.0);
}

/// Issue 17 item 9: the loop waits for one worker's batch while another worker prepares a
/// later one. The wait is what the awaited worker did (here: asleep, as on an HTTP read), not
/// the busy neighbour's CPU; without the name the neighbour's CPU would make it all prep.
#[test]
fn a_data_wait_reads_the_worker_it_names_not_its_neighbours() {
    let mut s = Script::new();
    let main = s.thread(|ms| ms >= 60, |_| false, 200);
    let awaited = ThreadSeries {
        pid: 11,
        ..s.thread(|_| false, |_| false, 200)
    };
    let neighbour = ThreadSeries {
        pid: 12,
        ..s.thread(|_| true, |_| false, 200)
    };
    let rank = RankSeries {
        main,
        loaders: vec![awaited, neighbour],
        gpu: None,
    };
    let unnamed = input(0, 100, &[("data", 0, 60)]);
    let b = attribute(&unnamed, &s.store, &rank, &Links::default());
    assert_eq!(ms(&b, DataPrep), 60.0, "every worker's CPU, as before");
    let named = IterationInput {
        waits: vec![(0, 60 * MS, 11)],
        ..unnamed.clone()
    };
    let b = attribute(&named, &s.store, &rank, &Links::default());
    assert_eq!(ms(&b, DataPrep), 0.0, "the awaited worker did not compute");
    assert_eq!(ms(&b, Other), 60.0);
    // Naming the busy one makes the same wait prep.
    let busy = IterationInput {
        waits: vec![(0, 60 * MS, 12)],
        ..unnamed
    };
    let b = attribute(&busy, &s.store, &rank, &Links::default());
    assert_eq!(ms(&b, DataPrep), 60.0);
}

/// Issue 17 item 9: a worker whose main thread sleeps while a thread of its pool decodes (or
/// blocks reading) is busy: the wait is prep (or fetch), not unexplained.
#[test]
fn a_workers_pool_threads_explain_the_wait_its_main_thread_sleeps_through() {
    let mut s = Script::new();
    let main = s.thread(|ms| ms >= 60, |_| false, 200);
    let asleep = s.thread(|_| false, |_| false, 200);
    let pool = s.thread(|ms| ms < 30, |ms| (30..60).contains(&ms), 200);
    let worker = ThreadSeries {
        pid: 11,
        others: [pool.cpu, None, pool.blocked],
        ..asleep
    };
    let rank = RankSeries {
        main,
        loaders: vec![worker],
        gpu: None,
    };
    let b = attribute(
        &input(0, 100, &[("data", 0, 60)]),
        &s.store,
        &rank,
        &Links::default(),
    );
    assert_eq!(ms(&b, DataPrep), 30.0, "the pool thread decoding");
    assert_eq!(ms(&b, DataFetch), 30.0, "the pool thread blocked reading");
    assert_eq!(ms(&b, Other), 0.0);
}

/// Issue 29 item 3: a loop loading its own batches (0 workers) through throttled storage
/// waits in state D, but the state is sampled: a D wait that fell between the samples leaves
/// the loop neither busy nor seen blocked. When its process read from storage meanwhile
/// (`io` read_bytes advanced), that sleep is the fetch; without reads it stays unexplained.
#[test]
fn an_unseen_sleep_while_the_loop_reads_from_storage_is_fetch() {
    let mut s = Script::new();
    // Decodes 10 ms, sleeps 50 ms of which the state samples saw only the first 20 in D.
    let main = s.thread(|ms| (50..60).contains(&ms) || ms >= 60, |ms| ms < 20, 200);
    let reads = s.series(
        SeriesKind::Counter,
        |ms| if ms < 50 { 80.0 } else { 0.0 },
        200,
    );
    let data = input(0, 100, &[("data", 0, 60)]);
    let b = attribute(
        &data,
        &s.store,
        &RankSeries {
            main,
            ..Default::default()
        },
        &Links::default(),
    );
    assert_eq!(ms(&b, DataFetch), 20.0, "only the D the samples saw");
    assert_eq!(ms(&b, Other), 30.0);
    let reading = RankSeries {
        main: ThreadSeries {
            read_bytes: Some(reads),
            ..main
        },
        ..Default::default()
    };
    let b = attribute(&data, &s.store, &reading, &Links::default());
    assert_eq!(ms(&b, DataPrep), 10.0);
    assert_eq!(
        ms(&b, DataFetch),
        50.0,
        "seen in D, and asleep while reading"
    );
    assert_eq!(ms(&b, Other), 0.0);
    assert_eq!(ms(&b, Compute), 40.0);
    assert!(b
        .evidence
        .iter()
        .any(|e| e.basis == Basis::DataLoaderReads && e.category == DataFetch));
    // Reads that stopped before the wait do not explain it.
    let late = input(100, 200, &[("data", 100, 160)]);
    let b = attribute(&late, &s.store, &reading, &Links::default());
    assert_eq!(ms(&b, DataFetch), 0.0);
}

/// ns of `b`'s evidence with `basis` in category `c`, in ms.
fn evidence_ms(b: &IterationBreakdown, c: Category, basis: Basis) -> f64 {
    b.evidence
        .iter()
        .filter(|e| e.category == c && e.basis == basis)
        .map(|e| e.ns)
        .sum::<u64>() as f64
        / MS as f64
}

/// The kernel's thread states say when a thread waited on a run queue rather than ran. That
/// wait stays where rule 4 and rule 2 put it (the loop busy: compute; the loader busy:
/// `data_prep`), and the evidence tells it apart from time on a CPU.
#[test]
fn time_waiting_for_a_cpu_is_busy_and_told_apart() {
    let mut s = Script::new();
    // The loop: on a CPU 0-30 ms, queued 30-50 ms, asleep after; in `data` from 60 ms.
    let mut main = s.thread(|ms| ms < 30, |_| false, 200);
    main.runq = Some(s.series(
        SeriesKind::Counter,
        |ms| {
            if (30..50).contains(&ms) {
                MS as f64
            } else {
                0.0
            }
        },
        200,
    ));
    // Its loader worker: on a CPU 60-80 ms, queued 80-100 ms.
    let mut loader = s.thread(|ms| (60..80).contains(&ms), |_| false, 200);
    loader.runq = Some(s.series(
        SeriesKind::Counter,
        |ms| {
            if (80..100).contains(&ms) {
                MS as f64
            } else {
                0.0
            }
        },
        200,
    ));
    let b = attribute(
        &input(0, 100, &[("data", 60, 100)]),
        &s.store,
        &RankSeries {
            main,
            loaders: vec![loader],
            gpu: None,
        },
        &Links::default(),
    );
    assert_eq!(ms(&b, Compute), 50.0);
    assert_eq!(evidence_ms(&b, Compute, Basis::CounterBusy), 30.0);
    assert_eq!(evidence_ms(&b, Compute, Basis::CounterRunQueue), 20.0);
    assert_eq!(ms(&b, Other), 10.0);
    assert_eq!(ms(&b, DataPrep), 40.0);
    assert_eq!(evidence_ms(&b, DataPrep, Basis::DataLoaderCpu), 20.0);
    assert_eq!(evidence_ms(&b, DataPrep, Basis::LoaderRunQueue), 20.0);
}
