//! The real NVML backend, end to end, against the scripted `libnvidia-ml`
//! (`fake-nvml/`, loaded through `STALLSCOPE_NVML_LIB`): what `doctor`, `nvml-bench`, `run`
//! and `agent` show when the driver answers, refuses a scope or a field, fails to start, or
//! loses its GPU in the middle of a run. The figures the scripted device gives are the
//! agent's H100 readings ([`Activity`]), so each check compares what the user reads with
//! the rate the device was scripted to move.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::*;
use serde_json::Value;
use stallscope_agent::gpu::fake::Activity;
use stallscope_analysis::series::names;

/// `stallscope ARGS` on the scripted GPU described by `script` (`STALLSCOPE_FAKE_NVML`).
fn on_fake_gpu(script: &str) -> Command {
    let mut c = stallscope();
    fake_gpu(&mut c, script);
    c
}

/// Example flags for a short single-process-per-rank run.
const SMALL: &[&str] = &["--workers", "0", "--batch", "4", "--images", "64"];

/// The example under `stallscope run RUN_FLAGS` on the scripted GPU; its output and summary.
fn run_on_fake_gpu(
    dir: &Path,
    script: &str,
    run_flags: &[&str],
    example_flags: &[&str],
) -> (Output, Value) {
    let out = run_ok(&mut example_under(
        on_fake_gpu(script),
        dir,
        run_flags,
        example_flags,
    ));
    (out, read_json(&dir.join("s.json")))
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

#[test]
fn doctor_lists_the_scripted_h100_and_how_each_reading_is_taken() {
    let out = run_ok(on_fake_gpu("gpus=2").arg("doctor"));
    let t = text(&out);
    assert!(
        t.contains("driver 550.90.07 · NVML 12.550.90.07 · CUDA 12.4"),
        "{t}"
    );
    for gpu in 0..2 {
        assert!(
            t.contains(&format!("GPU {gpu} NVIDIA H100 80GB HBM3 · GPU-")),
            "{t}"
        );
    }
    assert!(t.contains("bus 00000000:19:00.0 · NVLinks 18"), "{t}");
    assert!(!t.contains("    missing"), "every reading is present: {t}");
    assert!(
        t.contains("present  nvlink_tx_bytes (field 138): all links in one request"),
        "{t}"
    );
}

#[test]
fn doctor_says_why_each_refused_reading_is_missing() {
    let out = run_ok(
        on_fake_gpu("no_all_links_scope,no_pcie_counters,no_gpm,no_process_permission")
            .arg("doctor"),
    );
    let t = text(&out);
    for expected in [
        "missing  pcie_rx_bytes (field 198): field unknown to this driver",
        "present  nvlink_rx_bytes (field 139): asked per link and summed over 18 links",
        "missing  process_utilization: not permitted for this user",
        "missing  gpm (sm, tensor, dram, pcie, nvlink): GPM needs a Hopper or newer GPU",
        "present  power_instant (field 186)",
    ] {
        assert!(t.contains(expected), "{expected:?} not in:\n{t}");
    }
    let narrow = text(&run_ok(on_fake_gpu("pcie_32bit").arg("doctor")));
    assert!(
        narrow.contains(
            "present  pcie_rx_bytes (field 198): 32-bit counter, unwrapped (wraps every 4.3 GB)"
        ),
        "{narrow}"
    );
    let pcie_card = text(&run_ok(on_fake_gpu("pcie_only").arg("doctor")));
    assert!(
        pcie_card.contains("missing  nvlink_tx_bytes (field 138): no NVLink on this device"),
        "{pcie_card}"
    );
}

#[test]
fn without_a_loaded_driver_doctor_says_so_and_still_lists_the_node() {
    let out = run_ok(on_fake_gpu("no_driver").arg("doctor"));
    let t = text(&out);
    assert!(t.contains("missing  no NVIDIA driver found ("), "{t}");
    assert!(
        t.contains("Driver Not Loaded") || t.contains("not loaded"),
        "{t}"
    );
    // The job's threads: from eBPF where it could be loaded (root, BTF), else polled.
    assert!(
        t.contains("present  cpu (thread states from the scheduler's events, eBPF)")
            || t.contains("present  cpu (process schedstat, state)"),
        "{t}"
    );
}

#[test]
fn nvml_bench_times_every_call_the_source_makes() {
    let out = run_ok(on_fake_gpu("").args(["nvml-bench", "--rounds", "50"]));
    let t = text(&out);
    for call in [
        "nvmlDeviceGetFieldValues (fast batch)",
        "nvmlDeviceGetClockInfo (SM)",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetProcessUtilization",
        "nvmlGpmSampleGet + nvmlGpmMetricsGet",
    ] {
        let line = t
            .lines()
            .find(|l| l.contains(call))
            .unwrap_or_else(|| panic!("{call} not timed:\n{t}"));
        let us: f64 = line
            .split_whitespace()
            .last()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no µs figure in {line:?}"));
        assert!((0.0..10_000.0).contains(&us), "{line}");
    }
}

/// Relative difference of `got` from `want`.
fn off(got: f64, want: f64) -> f64 {
    (got - want).abs() / want
}

/// What a per-iteration counter figure may be off by besides sampling (the first counted
/// iteration's partial coverage, rounding): the rest comes from [`SamplingSlack`].
const MARGIN: f64 = 0.05;

/// Asserts that `got`, the mean per-iteration delta of counter `series` (a `bits`-bit counter
/// moving at `bytes_per_s` on GPU `gpu`), is the scripted rate times the mean iteration of
/// `rank` (its summary), within [`MARGIN`] plus what sampling on this machine could take
/// from it as the profile's own sample timestamps show: a loaded machine that delays the
/// sampler widens the bound by exactly that, and nothing else does.
fn assert_counter_matches(
    profile: &Path,
    rank: &Value,
    (series, gpu, bits): (&str, &str, u32),
    bytes_per_s: f64,
    got: f64,
) {
    let iterations = rank["iterations"].as_f64().unwrap();
    let wall_ns = rank["wall_seconds"].as_f64().unwrap() * 1e9;
    let want = bytes_per_s * wall_ns / 1e9 / iterations;
    let slack = SamplingSlack::of_gpu_counter(profile, series, gpu, bytes_per_s, bits);
    assert!(
        slack.samples > 10,
        "{series} of GPU {gpu} was sampled: {slack:?}"
    );
    let lag = slack.relative(bytes_per_s, wall_ns, 64);
    let sampling = slack.relative(bytes_per_s, wall_ns, bits);
    let (low, high) = (
        want * (1.0 - MARGIN - sampling),
        want * (1.0 + MARGIN + lag),
    );
    eprintln!(
        "{series} GPU {gpu}: {got:.4e} per iteration, scripted {want:.4e} ({:+.2}%); \
         sampling slack {:.2}% ({slack:?})",
        (got / want - 1.0) * 100.0,
        sampling * 100.0
    );
    assert!(
        (low..=high).contains(&got),
        "{series} of GPU {gpu}: {got} per iteration, not within [{low}, {high}] \
         (scripted {want}, {slack:?}): {rank:#}"
    );
}

/// The example under `run` on a GPU doing an NVLink all-reduce plus 2 GB/s of PCIe each way,
/// on a driver that refuses the all-links scope: the `gpu:` figures are the scripted rates
/// times the iteration time, so PCIe bytes, NVLink bytes summed over 18 links from KiB,
/// power and energy all came through the real calls in their units.
#[test]
fn run_shows_the_bytes_and_energy_the_gpu_was_scripted_to_move() {
    if !have_torch() {
        return;
    }
    let pcie = 2e9;
    let dir = tempfile::tempdir().unwrap();
    let script = format!("activity=allreduce_nvlink,pcie={pcie},no_all_links_scope");
    let (out, s) = run_on_fake_gpu(
        dir.path(),
        &script,
        &[],
        &[&["--iters", "25"], SMALL].concat(),
    );
    let rank = &s["ranks"][0];
    let g = &rank["gpu"];
    assert_eq!(g["gpu"], "0", "{s:#}");
    let scripted = Activity::h100_allreduce_nvlink();
    let f = |k: &str| {
        g[k].as_f64()
            .unwrap_or_else(|| panic!("{k} missing: {g:#}"))
    };
    let profile = dir.path().join("p.stallscope");
    let counter = |series: &'static str| (series, "0", 64);
    for (series, figure) in [
        (names::GPU_PCIE_RX_BYTES, "pcie_rx_bytes_per_iteration"),
        (names::GPU_PCIE_TX_BYTES, "pcie_tx_bytes_per_iteration"),
    ] {
        assert_counter_matches(&profile, rank, counter(series), pcie, f(figure));
    }
    // NVLink is read per link, both directions, and summed: the rx series stands for the
    // reads' timing.
    let nvlink = scripted.nvlink_tx_bytes_per_s + scripted.nvlink_rx_bytes_per_s;
    let nvlink_series = counter(names::GPU_NVLINK_RX_BYTES);
    assert_counter_matches(
        &profile,
        rank,
        nvlink_series,
        nvlink,
        f("nvlink_bytes_per_iteration"),
    );
    // Power is scripted constant: its time-weighted mean is exact whatever the sampling.
    let watts = scripted.power_mw as f64 / 1e3;
    assert!(off(f("power_watts"), watts) < 0.01, "{g:#}");
    let joules = f("energy_joules_per_iteration") * 1e3; // mJ, the counter's unit
    assert_counter_matches(
        &profile,
        rank,
        counter(names::GPU_ENERGY_MJ),
        watts * 1e3,
        joules,
    );
    assert!(
        off(f("busy_fraction"), scripted.util_pct / 100.0) < 0.05,
        "{g:#}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("gpu: rank 0 on GPU 0: 20% busy, PCIe in "),
        "{stderr}"
    );
}

/// On a node with a GPU the samplers are two threads: the CPU one, which with the eBPF
/// thread states sends the last 100 ms of instants at once, and the GPU one, every 10 ms.
/// The profile holds their batches in time order, and the counters saw every iteration:
/// when the batches were written as they came, two in five were older than the one before
/// and lost, iterations were attributed before their samples came, and 15–20% of a two-rank
/// run was `other` for want of samples (a steady rank could even look like it turned slow).
#[test]
fn a_gpu_nodes_two_samplers_are_written_in_time_order_and_see_every_iteration() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_, s) = run_on_fake_gpu(
        dir.path(),
        "gpus=2",
        &[],
        &[&["--iters", "60", "--nproc", "2"], SMALL].concat(),
    );
    let read = stallscope_collector::profile::read_profile(dir.path().join("p.stallscope"))
        .expect("the profile reads");
    let (mut batches, mut older) = (0, 0);
    let mut newest = 0;
    for f in &read.frames {
        if let stallscope_analysis::frame::Frame::Samples(b) = f {
            batches += 1;
            if b.at() < newest {
                older += 1;
            }
            newest = newest.max(b.at());
        }
    }
    assert!(batches > 100, "{batches} sample batches");
    // A sampler stalled for over a second is let go past (sample_merge::MAX_LAG_NS).
    assert!(
        older * 100 < batches,
        "{older} of {batches} sample batches were older than one before them"
    );
    let sampled = s["job"]["coverage"]["sampled"].as_f64().unwrap();
    assert!(
        sampled >= 0.97,
        "the counters saw {:.1}% of the iterations: {:#}",
        sampled * 100.0,
        s["job"]
    );
}

/// Two ranks on a two-GPU node: each rank is matched with its own GPU (by its local rank)
/// and shows that GPU's host-to-device copies, though the driver gives the PCIe counters in
/// 32 bits (at 35.2 GB/s they wrap every 122 ms). At 20 Hz a wrap not unwrapped would lose
/// 50 of every 122 ms of bytes.
#[test]
fn each_local_rank_shows_its_own_gpu() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let two_ranks = [&["--nproc", "2", "--port", "29583", "--iters", "12"], SMALL].concat();
    let script = "gpus=2,activity=copying_in,pcie_32bit";
    let (_, s) = run_on_fake_gpu(dir.path(), script, &["--rate", "20"], &two_ranks);
    let ranks = s["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 2, "{s:#}");
    let h2d = Activity::h100_copying_in().pcie_rx_bytes_per_s;
    let profile = dir.path().join("p.stallscope");
    for r in ranks {
        let rank = r["rank"].as_u64().unwrap();
        let gpu = rank.to_string();
        assert_eq!(r["gpu"]["gpu"], gpu, "{r:#}");
        let rx = r["gpu"]["pcie_rx_bytes_per_iteration"].as_f64().unwrap();
        // Not unwrapped, the 32-bit counter would lose ~50 of every 122 ms (41%); a sampler
        // round delayed past 122 ms on a loaded machine loses a wrap, which the bound allows.
        let series = (names::GPU_PCIE_RX_BYTES, gpu.as_str(), 32);
        assert_counter_matches(&profile, r, series, h2d, rx);
    }
}

/// NVML's per-process utilisation (the two-call query, its samples and timestamps) is the
/// better evidence of which GPU a rank drives: the scripted driver puts local rank k on GPU
/// 1 − k, and each rank's figures are of that GPU, not of the one its local rank suggests.
#[test]
fn the_gpu_nvml_sees_a_rank_on_beats_the_local_rank_guess() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let two_ranks = [&["--nproc", "2", "--port", "29587", "--iters", "12"], SMALL].concat();
    let (_, s) = run_on_fake_gpu(
        dir.path(),
        "gpus=2,activity=copying_in,processes",
        &[],
        &two_ranks,
    );
    let ranks = s["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 2, "{s:#}");
    for r in ranks {
        let rank = r["rank"].as_u64().unwrap();
        assert_eq!(r["gpu"]["gpu"], (1 - rank).to_string(), "{r:#}");
        let uuid = r["gpu"]["uuid"].as_str().unwrap();
        assert!(uuid.ends_with(&format!("{}", 1 - rank)), "{uuid}");
    }
}

/// NVML that loses its GPU at iteration 15 of 40: said once per GPU source, the training
/// and its summary go on, and the per-iteration GPU figures are over the iterations that had
/// readings, not diluted by the ones after the loss.
#[test]
fn a_gpu_lost_mid_run_is_reported_once_and_the_job_goes_on() {
    use std::io::{BufRead, BufReader, Read};
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let lost = dir.path().join("gpu-lost");
    let script = format!("lost_when={}", lost.display());
    let flags = [&["--iters", "40"], SMALL].concat();
    let mut child = example_under(on_fake_gpu(&script), dir.path(), &[], &flags)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut stderr = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let stdout = BufReader::new(child.stdout.take().unwrap());
    // Bounds the run (the training takes ~5 s here); ends it by pid only while it runs.
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if finished.recv_timeout(COMMAND_LIMIT).is_err() {
            kill(pid, libc::SIGKILL);
        }
    });
    for line in stdout.lines().map_while(Result::ok) {
        if line.starts_with("iter 15 ") {
            std::fs::write(&lost, "").unwrap();
        }
    }
    let status = child.wait().unwrap();
    let _ = done.send(());
    watchdog.join().unwrap();
    let stderr = stderr.join().unwrap();
    assert!(status.success(), "{status:?}\n{stderr}");
    let s = read_json(&dir.path().join("s.json"));
    assert_eq!(s["exit_code"], 0);
    assert_eq!(s["job"]["iterations"], 39, "{s:#}");
    let down: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("stallscope: source gpu") && l.contains("is down"))
        .collect();
    assert_eq!(down.len(), 2, "once per GPU source (fast, slow):\n{stderr}");
    assert!(
        down.iter().all(|l| l.contains("the GPU is lost")),
        "{down:#?}"
    );
    let rank = &s["ranks"][0];
    let g = &rank["gpu"];
    let read = g["read_fraction"].as_f64().unwrap();
    assert!(
        read > 0.2 && read < 0.6,
        "readings on iterations 1–15 of 39: {g:#}"
    );
    let per_iteration_s =
        rank["wall_seconds"].as_f64().unwrap() / rank["iterations"].as_f64().unwrap();
    let watts = Activity::h100_busy().power_mw as f64 / 1e3;
    let joules = g["energy_joules_per_iteration"].as_f64().unwrap();
    // Over the read iterations alone it is the power times their time; diluted over all 39 it
    // would be read / 1 of that, about 0.38. The read iterations' own times are not in the
    // summary, and on a loaded machine (the other trainings of this binary, other builds)
    // the early iterations can be half or twice as long as the mean: the bound tells the
    // two apart whatever the load, and says nothing finer.
    let ratio = joules / (watts * per_iteration_s);
    assert!(
        ratio > read.max(0.38) * 1.5 && ratio < 2.0,
        "energy over the read iterations, not diluted ({ratio:.2} of the power times the \
         mean iteration): {g:#}"
    );
    assert!(stderr.contains("NVML readings on only "), "{stderr}");
}

/// The node agent reads the GPUs too, and says which.
#[test]
fn the_agent_starts_the_gpu_sources() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "t0ken-for-this-test\n").unwrap();
    let log = dir.path().join("agent.log");
    let mut agent = on_fake_gpu("gpus=2")
        .args(["agent", "--collector", "127.0.0.1:9", "--token-file"])
        .arg(&token)
        .arg("--socket")
        .arg(dir.path().join("agent.sock"))
        .args(["--node", "n0"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let pid = agent.id();
    let said = wait_for(Duration::from_secs(20), || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("GPU sources: NVML: 2 GPU(s)"))
    });
    kill(pid, libc::SIGTERM);
    let ended = wait_for(Duration::from_secs(20), || {
        agent.try_wait().ok().flatten().is_some()
    });
    if !ended {
        let _ = agent.kill();
        let _ = agent.wait();
    }
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(said, "{log}");
    assert!(ended, "the agent did not end on SIGTERM: {log}");
}
