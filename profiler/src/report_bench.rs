//! `stallscope report-bench` (hidden): the report's bounded cost, measured. Writes the job
//! profile a collector would write for a long job — `--nodes` × `--ranks-per-node` ranks
//! stepping every `--iteration-ms` for `--hours`, each iteration as the agents ship it
//! (attribution, collective span, GPU readings), every node's resources each second and its
//! clock estimate every 10 s, an hourly checkpoint and a straggler — then runs the real
//! `stallscope report` on it as a child process and reads its wall time and peak memory
//! (`wait4`'s rusage). It prints the profile's size per node-hour too.
//!
//! The figures go to docs/BENCHMARKS.md; the goals are a 24-hour, 64-rank profile reported in
//! under 30 s and 1 GB, and at most 20 MB of profile per node-hour.

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use stallscope_analysis::category::Category;
use stallscope_analysis::frame::{
    Frame, NodeClock, NodeHealth, NodeResourcesReport, RunEnd, RunHeader,
};
use stallscope_analysis::resources::NodeResources;
use stallscope_analysis::Nanos;
use stallscope_collector::profile::ProfileWriter;

use crate::cli::ReportBenchArgs;
use crate::collector_bench::agents;

const MS: Nanos = 1_000_000;
const SECOND: Nanos = 1_000 * MS;

/// ns, where the job starts on every clock (agents' and collector's alike, offsets aside).
const T0: Nanos = 100 * SECOND;

/// The rank slowed by 25% in the fourth hour, holding the others up.
const STRAGGLER: u32 = 13;

/// A small deterministic generator (splitmix64): jitter without a dependency.
struct Jitter(u64);

impl Jitter {
    /// A number in [0, 1).
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn node_name(n: usize) -> String {
    format!("node-{n:02}")
}

/// Writes the profile; returns (frames, iterations per rank).
fn write_profile(args: &ReportBenchArgs, path: &Path) -> anyhow::Result<(u64, u64)> {
    let mut w = ProfileWriter::create(path)?;
    let ranks = args.nodes * args.ranks_per_node;
    let mut frames = 0u64;
    let mut put = |w: &mut ProfileWriter, f: Frame| -> anyhow::Result<()> {
        frames += 1;
        w.write(&f).map_err(anyhow::Error::from)
    };
    put(
        &mut w,
        Frame::Header(RunHeader {
            stallscope_version: env!("CARGO_PKG_VERSION").into(),
            host: "collector".into(),
            command: vec!["stallscope".into(), "collector".into()],
            started_unix_ns: 1_790_000_000 * SECOND,
            started_mono_ns: T0 - SECOND,
            warmup_iters: 1,
            ..RunHeader::default()
        }),
    )?;
    let offset = |n: usize| (n as i64 - args.nodes as i64 / 2) * 3 * MS as i64;
    for n in 0..args.nodes {
        put(
            &mut w,
            Frame::NodeHealth(NodeHealth {
                node: node_name(n),
                ..NodeHealth::default()
            }),
        )?;
    }
    let period = args.iteration_ms * MS;
    let end_of_run = T0 + (args.hours * 3600.0 * SECOND as f64) as Nanos;
    let checkpoint_every = 3600 * SECOND;
    let mut jitter = Jitter(7);
    let mut t = T0;
    let mut iter = 0u64;
    let mut next_second = T0;
    let mut next_clock = T0;
    let mut next_checkpoint = T0 + checkpoint_every;
    while t < end_of_run {
        let hour = (t - T0) / (3600 * SECOND);
        let mut wall = (period as f64 * (0.95 + 0.1 * jitter.next())) as Nanos;
        let checkpoint = t >= next_checkpoint;
        if checkpoint {
            wall += 30 * SECOND;
            next_checkpoint += checkpoint_every;
        }
        let end = t + wall;
        while next_clock <= end {
            for n in 0..args.nodes {
                put(
                    &mut w,
                    Frame::NodeClock(NodeClock {
                        node: node_name(n),
                        offset_ns: offset(n),
                        drift_ppm: 0.0,
                        at_ns: next_clock,
                        uncertainty_ns: 40_000,
                        samples: 8,
                    }),
                )?;
            }
            next_clock += 10 * SECOND;
        }
        while next_second <= end {
            for n in 0..args.nodes {
                put(&mut w, resources(n, next_second, offset(n), &mut jitter))?;
            }
            next_second += SECOND;
        }
        for rank in 0..ranks as u32 {
            let n = rank as usize / args.ranks_per_node;
            let node_end = end.saturating_add_signed(offset(n));
            let mut r = agents::report(rank as usize, ranks, iter, node_end, wall);
            r.iteration.node = node_name(n);
            let split = &mut r.iteration.breakdown.split;
            if checkpoint {
                // The checkpoint's save is time no phase explains.
                let save = 30 * SECOND;
                let rest = wall - save;
                *split = Default::default();
                split.add(Category::Compute, rest * 6 / 10);
                split.add(Category::Network, rest * 3 / 10);
                split.add(Category::PeerWait, rest - rest * 6 / 10 - rest * 3 / 10);
                split.add(Category::Other, save);
            } else if hour == 3 {
                // The straggler computes 25% longer; the others wait for it.
                let extra = split.get(Category::Compute) / 4;
                let (from, to) = if rank == STRAGGLER {
                    (Category::PeerWait, Category::Compute)
                } else {
                    (Category::Compute, Category::PeerWait)
                };
                let moved = extra.min(split.get(from));
                split.ns[from.index()] -= moved;
                split.add(to, moved);
            }
            put(&mut w, Frame::NodeReport(Box::new(r)))?;
        }
        t = end;
        iter += 1;
    }
    put(
        &mut w,
        Frame::End(RunEnd {
            ended_mono_ns: t + SECOND,
            ..RunEnd::default()
        }),
    )?;
    w.finish()?;
    Ok((frames, iter))
}

/// One node's second of resources, in its own clock: 8 GPUs busy, NVLink and NIC moving.
fn resources(n: usize, t_ns: Nanos, offset_ns: i64, j: &mut Jitter) -> Frame {
    let wobble = |j: &mut Jitter, v: f64| Some(v * (0.9 + 0.2 * j.next()));
    Frame::NodeResources(Box::new(NodeResourcesReport {
        node: node_name(n),
        resources: NodeResources {
            t_ns: t_ns.saturating_add_signed(offset_ns),
            dur_ns: SECOND,
            cpu_busy_cores: wobble(j, 24.0),
            runq_delay: wobble(j, 0.3),
            nic_rx_bytes_per_s: wobble(j, 9e9),
            nic_tx_bytes_per_s: wobble(j, 9e9),
            disk_read_bytes_per_s: wobble(j, 2e8),
            disk_write_bytes_per_s: wobble(j, 1e6),
            psi_cpu: wobble(j, 0.05),
            psi_io: wobble(j, 0.01),
            psi_memory: Some(0.0),
            gpu_busy: wobble(j, 0.85),
            pcie_rx_bytes_per_s: wobble(j, 2e9),
            pcie_tx_bytes_per_s: wobble(j, 1e8),
            nvlink_rx_bytes_per_s: wobble(j, 1.2e11),
            nvlink_tx_bytes_per_s: wobble(j, 1.2e11),
            // Not in the frames (see `stallscope_analysis::resources`).
            rdma_rx_bytes_per_s: None,
            rdma_tx_bytes_per_s: None,
        },
    }))
}

/// Runs `stallscope report PROFILE -o OUT` and returns (wall s, CPU s, peak RSS MiB).
fn run_report(profile: &Path, out: &Path) -> anyhow::Result<(f64, f64, f64)> {
    let exe = std::env::current_exe().context("cannot find this stallscope")?;
    let start = Instant::now();
    let child = std::process::Command::new(exe)
        .arg("report")
        .arg(profile)
        .arg("-o")
        .arg(out)
        .spawn()
        .context("cannot start stallscope report")?;
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for the child we started.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, writing into the locals above.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    let wall = start.elapsed().as_secs_f64();
    anyhow::ensure!(pid > 0, "wait4 failed: {}", std::io::Error::last_os_error());
    anyhow::ensure!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "stallscope report failed (wait status {status})"
    );
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let cpu = secs(usage.ru_utime) + secs(usage.ru_stime);
    Ok((wall, cpu, usage.ru_maxrss as f64 / 1024.0))
}

/// Writes the profile, reports it and prints the figures; exit code 0.
pub fn report_bench(args: ReportBenchArgs) -> anyhow::Result<i32> {
    let temp;
    let dir = match &args.dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            d.clone()
        }
        None => {
            temp = tempfile::tempdir()?;
            temp.path().to_path_buf()
        }
    };
    let profile = dir.join("job.stallscope");
    let ranks = args.nodes * args.ranks_per_node;
    eprintln!(
        "report-bench: writing {} h of {} ranks on {} nodes, one iteration every {} ms",
        args.hours, ranks, args.nodes, args.iteration_ms
    );
    let started = Instant::now();
    let (frames, iterations) = write_profile(&args, &profile)?;
    let written_s = started.elapsed().as_secs_f64();
    let bytes = std::fs::metadata(&profile)?.len();
    let node_hours = args.nodes as f64 * args.hours;
    let out = dir.join(format!("report.{}", args.format));
    let (wall, cpu, rss) = run_report(&profile, &out)?;
    let report_bytes = std::fs::metadata(&out)?.len();
    println!("profile      {} h × {ranks} ranks on {} nodes: {iterations} iterations per rank, {frames} frames, written in {written_s:.1} s", args.hours, args.nodes);
    println!(
        "size         {:.1} MB, {:.2} MB per node-hour, {:.0} bytes per rank-iteration",
        bytes as f64 / 1e6,
        bytes as f64 / 1e6 / node_hours,
        bytes as f64 / (iterations as f64 * ranks as f64)
    );
    println!(
        "report       {wall:.1} s wall, {cpu:.1} s CPU, peak RSS {rss:.0} MiB; {} written, {:.0} kB",
        out.display(),
        report_bytes as f64 / 1e3
    );
    Ok(0)
}
