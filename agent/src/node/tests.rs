//! The whole node in-process: the samplers on captured `/proc` text and the scripted H100
//! (all OS input through [`NodeInputs`]), markers as the hook sends them, the recorder with
//! its journal, and a feed subscriber reading the live model.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::channel;
use std::sync::Arc;
use std::time::Duration;

use stallscope_analysis::marker::{Marker, MarkerEvent};
use stallscope_analysis::view::hub::{FeedHub, FeedMessage};
use stallscope_analysis::view::JobView;

use super::recorder::{Event, Inbox, Recorder, Stderr};
use super::{header, GpuInput, NodeInputs, Samplers};
use crate::clock::monotonic_ns;
use crate::gpu::fake::{Activity, ScriptedGpu};
use crate::markers::Datagram;
use crate::sink::Sink;
use crate::sources::fake::FakeRoots;

/// The captured `dd` process (pid 6971, see agent/testdata/README.md).
const PID: u32 = 6971;

fn fake_node() -> FakeRoots {
    let fake = FakeRoots::new();
    fake.proc("6971/stat", "dd_stat.txt");
    fake.proc("6971/task/6971/stat", "dd_stat.txt");
    fake.proc("6971/task/6971/schedstat", "dd_schedstat.txt");
    fake.proc("6971/io", "dd_io.txt");
    fake.proc("net/dev", "net_dev.txt");
    fake.sys("class/net/lo/flags", "net_lo_flags.txt");
    fake.sys("class/net/eth0/flags", "net_eth0_flags.txt");
    fake.proc("diskstats", "diskstats.txt");
    fake.proc("pressure/cpu", "pressure_cpu.txt");
    fake.proc("pressure/io", "pressure_io.txt");
    fake.proc("pressure/memory", "pressure_memory.txt");
    fake
}

fn mark(inbox: &Inbox, seq: u64, iter: u64, event: MarkerEvent) {
    inbox.put(Datagram::Marker(Marker {
        seq,
        t_ns: monotonic_ns(),
        pid: PID,
        rank: Some(0),
        iter,
        event,
    }));
}

#[test]
fn a_gpu_rank_flows_from_the_os_inputs_to_the_live_model() {
    let fake = fake_node();
    let clock = Arc::new(AtomicU64::new(monotonic_ns()));
    let mut gpu = ScriptedGpu::h100_node(1, clock.clone());
    gpu.set(0, 0, Activity::h100_busy());
    gpu.attach(0, PID);
    // 40 iterations of 40 ms: the node's resources are read over whole seconds.
    // The scripted GPU reads its time from `clock`: keep it on the node's clock.
    let ticking = Arc::new(AtomicBool::new(true));
    let ticker = {
        let (clock, ticking) = (clock.clone(), ticking.clone());
        std::thread::spawn(move || {
            while ticking.load(Ordering::Relaxed) {
                clock.store(monotonic_ns(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };

    let hub = Arc::new(FeedHub::default());
    let feed = hub.subscribe(10_000);
    let recorder = Recorder::new(
        None,
        header(&[], 100.0, 1),
        "pipeline",
        Box::new(Stderr),
        false,
    )
    .with_feed(hub);
    let inbox = Inbox::default();
    let inputs = NodeInputs {
        roots: fake.roots.clone(),
        gpu: GpuInput::Backend(Box::new(gpu)),
    };
    let samplers = Samplers::start(100.0, inputs, PID, None, recorder.news.clone(), &inbox);
    assert!(
        samplers.gpu_described.is_some(),
        "the scripted GPU's thread runs"
    );
    let (tx, rx) = channel();
    let running = {
        let inbox = inbox.clone();
        std::thread::spawn(move || recorder.run(rx, inbox, || 0))
    };

    let mut seq = 0;
    mark(
        &inbox,
        seq,
        0,
        MarkerEvent::Meta(vec![("batch_size".into(), "32".into())]),
    );
    for iter in 0..40 {
        std::thread::sleep(Duration::from_millis(40));
        seq += 1;
        mark(&inbox, seq, iter, MarkerEvent::Step);
    }
    std::thread::sleep(Duration::from_millis(300));
    tx.send(Event::Finish(0)).unwrap();
    let summary = running.join().expect("the recorder ends");
    samplers.stop();
    ticking.store(false, Ordering::Relaxed);
    ticker.join().unwrap();

    assert_eq!(summary.job.iterations, 39, "40 iterations, 1 warm-up");
    let mut view: Option<JobView> = None;
    let mut updates = 0;
    for msg in feed.try_iter() {
        match msg {
            FeedMessage::Snapshot(v) => view = Some((*v).clone()),
            FeedMessage::Update(u) => {
                updates += 1;
                if let Some(v) = view.as_mut() {
                    v.apply((*u).clone());
                }
            }
            FeedMessage::End => break,
        }
    }
    let view = view.expect("a snapshot");
    assert!(updates > 0);
    assert_eq!(view.name, "pipeline");
    assert_eq!(view.batch_size, Some(32));
    let rank = &view.ranks[&0];
    assert_eq!(rank.recent.len(), 40);
    assert_eq!(rank.figures.iterations, 39);
    let busy: Vec<u32> = rank.recent.iter().filter_map(|p| p.gpu_busy_ppm).collect();
    assert!(
        !busy.is_empty(),
        "the rank's iterations carry its GPU's busy share"
    );
    assert!(busy.iter().all(|ppm| *ppm > 900_000), "{busy:?}");
    let node = view.nodes.values().next().expect("the node");
    let res = node.resources.as_ref().expect("a resource reading");
    assert!(res.gpu_busy.is_some_and(|b| b > 0.9), "{res:?}");
    assert!(
        res.cpu_busy_cores.is_some(),
        "the process's CPU time is read: {res:?}"
    );
    assert_eq!(rank.gpu.as_ref().map(|g| g.gpu.as_str()), Some("0"));
}
