//! The eBPF thread-state source on the real kernel: a child that spins, sleeps and blocks in
//! state D, followed through the scheduler's events, against what `/proc` says of it.
//!
//! Needs root and a kernel with BTF (`/sys/kernel/btf/vmlinux`); elsewhere it says so and
//! checks only that the source declines to load with a reason.

use std::process::{Child, Command};
use std::thread::sleep;
use std::time::Duration;

use stallscope_agent::sources::thread_states::ThreadStateSource;
use stallscope_agent::sources::{Registry, Source, Watched};
use stallscope_analysis::series::{names, SampleBatch};

fn ebpf_expected() -> bool {
    let root = unsafe { libc::geteuid() } == 0;
    root && std::path::Path::new("/sys/kernel/btf/vmlinux").exists()
}

/// A Python loop on its main thread: 300 ms of busy work, then 300 ms asleep, three times.
fn spinner() -> Child {
    let script = "import time\nfor _ in range(3):\n    end = time.monotonic() + 0.3\n    while time.monotonic() < end: pass\n    time.sleep(0.3)\n";
    Command::new("python3")
        .args(["-c", script])
        .spawn()
        .expect("python3 runs")
}

fn schedstat_cpu_ns(pid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/schedstat")).unwrap();
    text.split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
fn the_kernels_events_rebuild_a_threads_cpu_time() {
    let source = ThreadStateSource::load(std::path::Path::new("/proc"));
    if !ebpf_expected() {
        let why = source
            .err()
            .expect("without root or BTF the programs cannot load");
        eprintln!("skipped: not root or no BTF ({why})");
        return;
    }
    let mut source = source.unwrap_or_else(|why| panic!("eBPF should load here: {why}"));
    source.set_period(10_000_000);
    let mut child = spinner();
    let pid = child.id();
    let watched = Watched::new(vec![pid]);
    let mut reg = Registry::default();
    let mut batches: Vec<SampleBatch> = Vec::new();
    let mut last_proc_cpu = 0;
    for _ in 0..15 {
        source.sample(&watched, &mut reg).expect("reads");
        source.take_backfill(&mut batches);
        last_proc_cpu = schedstat_cpu_ns(pid).max(last_proc_cpu);
        sleep(Duration::from_millis(100));
    }
    let cpu_id = reg
        .decls()
        .iter()
        .find(|d| d.name == names::PROC_CPU_NS)
        .map(|d| d.id)
        .expect("the child's CPU series is declared");
    let cpu: Vec<(u64, u64)> = batches
        .iter()
        .filter_map(|b| {
            b.values
                .iter()
                .find(|(i, _)| *i == cpu_id)
                .map(|(_, v)| (b.at(), *v))
        })
        .collect();
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        cpu.len() >= 100,
        "ticks every 10 ms over ~1.5 s: {}",
        cpu.len()
    );
    assert!(cpu
        .windows(2)
        .all(|w| w[1].0 - w[0].0 == 10_000_000 && w[1].1 >= w[0].1));
    // Busy and idle stretches of 300 ms are told apart: ticks that gain CPU (all of it on a
    // quiet machine, less on a loaded one) and ticks that gain none.
    let gains: Vec<u64> = cpu.windows(2).map(|w| w[1].1 - w[0].1).collect();
    let busy = gains.iter().filter(|g| **g >= 2_000_000).count();
    let idle = gains.iter().filter(|g| **g == 0).count();
    eprintln!(
        "gains per tick, ms: {:?}",
        gains.iter().map(|g| g / 1_000_000).collect::<Vec<_>>()
    );
    assert!(
        busy >= 20 && idle >= 20,
        "busy {busy}, idle {idle} of {}",
        gains.len()
    );
    // The rebuilt total agrees with the kernel's own (read within the last 100 ms) to 20 ms.
    let rebuilt = cpu.last().unwrap().1;
    let diff = rebuilt.abs_diff(last_proc_cpu);
    assert!(
        diff < 20_000_000,
        "rebuilt {rebuilt} ns against schedstat {last_proc_cpu} ns"
    );
}
