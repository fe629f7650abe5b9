//! The fault matrix: what goes wrong around a training must never change the training. Each
//! test runs the real PyTorch example under `stallscope run` while one thing fails — the
//! profile's disk fills up, a source fails every tick, the marker socket is full because the
//! profiler stopped reading, the training runs in a process group and session of its own or
//! execs another program, the node's agent the training joined is killed —
//! and asserts what the user of the training sees is untouched: its exit code and every one
//! of its iterations (the example prints one line per iteration), and that stallscope said
//! what went wrong once, not on every tick.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;

/// Iterations each training runs.
const ITERS: usize = 30;
/// The exit code each training ends with, so that a lost one shows.
const EXIT: i32 = 3;
/// How long one run may take before the test ends it (by pid) and fails.
const RUN_LIMIT: Duration = Duration::from_secs(300);

/// The example's flags for a short single-process run.
fn example_flags(iters: usize) -> Vec<String> {
    [
        "--iters",
        &iters.to_string(),
        "--workers",
        "0",
        "--batch",
        "4",
        "--images",
        "64",
        "--image-size",
        "32",
        "--exit-code",
        &EXIT.to_string(),
        "--data-dir",
        &data_dir(),
    ]
    .map(String::from)
    .to_vec()
}

/// What a run showed: its exit code, the iterations the training printed, stallscope's
/// stderr.
struct Ran {
    code: Option<i32>,
    iterations: usize,
    stderr: String,
}

/// Runs `cmd` (a `stallscope run`), bounded by [`RUN_LIMIT`]; `during` is called with
/// stallscope's pid once the training printed its `at`-th iteration.
fn run(cmd: &mut Command, at: usize, during: impl FnOnce(u32)) -> Ran {
    run_counting(cmd, at, during, &Arc::default())
}

/// [`run`], counting the iterations printed so far in `printed`.
fn run_counting(
    cmd: &mut Command,
    at: usize,
    during: impl FnOnce(u32),
    printed: &Arc<AtomicUsize>,
) -> Ran {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("stallscope starts");
    let pid = child.id();
    let mut stderr = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if finished.recv_timeout(RUN_LIMIT).is_err() {
            kill(pid, libc::SIGKILL);
        }
    });
    let mut iterations = 0;
    let mut during = Some(during);
    for line in BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
    {
        if line.starts_with("iter ") {
            iterations += 1;
            printed.store(iterations, Ordering::Release);
            if iterations == at {
                if let Some(f) = during.take() {
                    f(pid);
                }
            }
        }
    }
    let status = child.wait().unwrap();
    let _ = done.send(());
    let _ = watchdog.join();
    Ran {
        code: status.code(),
        iterations,
        stderr: stderr.join().unwrap(),
    }
}

fn stallscope_run(profile: &Path, extra: &[&str], iters: usize) -> Command {
    let mut c = stallscope();
    c.args(["run", "-q", "-o"])
        .arg(profile)
        .args(extra)
        .args(["--", &python(), &example()])
        .args(example_flags(iters));
    c
}

/// The training is untouched: its exit code and all its `iters` iterations.
fn assert_untouched(r: &Ran, iters: usize) {
    assert_eq!(r.code, Some(EXIT), "the training's exit code: {}", r.stderr);
    assert_eq!(r.iterations, iters, "every iteration: {}", r.stderr);
}

/// A tmpfs of 64 KiB mounted on a fresh folder, filled up on demand; unmounted (and the
/// folder removed) on drop.
struct TinyDisk(PathBuf);

impl TinyDisk {
    fn mount(at: &Path) -> Option<TinyDisk> {
        std::fs::create_dir_all(at).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
            .arg(at)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            skip("cannot mount a tmpfs here");
            return None;
        }
        Some(TinyDisk(at.to_path_buf()))
    }

    /// Takes every byte left (the write stops at ENOSPC): writes that need a new page fail
    /// from now on.
    fn fill(&self) {
        let _ = std::fs::write(self.0.join("filler"), vec![0u8; 64 * 1024]);
    }
}

impl Drop for TinyDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_file(self.0.join("filler"));
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// The profile's disk fills up: the training goes on to its end and its exit code, and
/// stallscope says once that it cannot write the profile any more.
#[test]
fn a_full_profile_disk_leaves_the_training_alone() {
    if !have_torch() || !am_root("mounting a 64 KiB tmpfs") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(disk) = TinyDisk::mount(&dir.path().join("tiny")) else {
        return;
    };
    // Full from the training's second iteration on. What the profile still has to write then
    // must be more than the slack of its last page (up to 4 KiB, which tmpfs fills without
    // asking for space): a 30-iteration run of 0.4 s wrote less on a fast day (CI failed), so
    // this one runs 150 iterations, seconds of samples, all of them kept: a run's profile
    // is packed and its samples thinned now, and 150 iterations of it fit in that slack on
    // a fast day. (Full before the run, stallscope refuses to start: it cannot write the
    // profile's header.)
    let iters = 5 * ITERS;
    let r = run(
        &mut stallscope_run(&disk.0.join("p.stallscope"), &["--keep-all-samples"], iters),
        2,
        |_| disk.fill(),
    );
    assert_untouched(&r, iters);
    let said = r
        .stderr
        .matches("cannot write the profile any more")
        .count();
    assert_eq!(said, 1, "said once: {}", r.stderr);
    assert!(r.stderr.contains("No space left on device"), "{}", r.stderr);
}

/// The GPU (the scripted NVML) is lost at the training's second iteration and fails every
/// time it is read from then on: its sources are said to be down once each, and the training
/// is untouched. (Lost before the first read, NVML lists no device and nothing is said to
/// be down: the run only shows "NVML readings on 0% of iterations".)
#[test]
fn a_source_failing_every_tick_is_said_once() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let lost = dir.path().join("gpu-lost");
    let mut cmd = stallscope_run(&dir.path().join("p.stallscope"), &[], ITERS);
    fake_gpu(&mut cmd, &format!("lost_when={}", lost.display()));
    let r = run(&mut cmd, 2, |_| std::fs::write(&lost, "").unwrap());
    assert_untouched(&r, ITERS);
    let down: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| l.starts_with("stallscope: source ") && l.contains(" is down"))
        .collect();
    assert_eq!(
        down.len(),
        2,
        "once per GPU source (fast, slow): {}",
        r.stderr
    );
    let mut unique = down.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(down.len(), unique.len(), "each said once: {}", r.stderr);
}

/// stallscope stops reading (SIGSTOP) while the training sends markers: the process's marker
/// channel fills (its sender's own buffer, 278 markers: `STALLSCOPE_CHANNEL_BUFFER=0`), then
/// the 1,024 the package holds, the hook's sends fail without blocking, and the training runs
/// on to its end; once stallscope runs again (SIGCONT) it finishes with the training's exit
/// code.
#[test]
fn a_full_marker_socket_does_not_block_the_training() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Enough markers to fill the channel and the package's hold many times over (~6 an
    // iteration).
    let iters = 600;
    let stopped = Arc::new(Mutex::new(None::<u32>));
    let printed = Arc::new(AtomicUsize::new(0));
    let stop = stopped.clone();
    let cont = std::thread::spawn({
        let (stopped, printed) = (stopped.clone(), printed.clone());
        move || {
            // Resumes stallscope once the training has printed its last iteration (it ran
            // all of them with the profiler stopped), or after 240 s at the latest.
            let end = Instant::now() + Duration::from_secs(240);
            while Instant::now() < end && printed.load(Ordering::Acquire) < iters {
                std::thread::sleep(Duration::from_millis(50));
            }
            // Its last markers go out as it exits, just after its last line.
            std::thread::sleep(Duration::from_secs(2));
            if let Some(pid) = *stopped.lock().unwrap() {
                kill(pid, libc::SIGCONT);
            }
        }
    });
    let json = dir.path().join("s.json");
    let json_flag = json.to_str().unwrap();
    let mut cmd = stallscope_run(
        &dir.path().join("p.stallscope"),
        &["--summary-json", json_flag],
        iters,
    );
    cmd.env("STALLSCOPE_CHANNEL_BUFFER", "0");
    let started = Instant::now();
    let r = run_counting(
        &mut cmd,
        2,
        move |pid| {
            kill(pid, libc::SIGSTOP);
            *stop.lock().unwrap() = Some(pid);
        },
        &printed,
    );
    // The training's stdout closed when it exited, whether or not stallscope was stopped;
    // stallscope itself is resumed by `cont` and then returns the exit code.
    let _ = cont.join();
    assert_untouched(&r, iters);
    let s = read_json(&json);
    // What stallscope saw is less than what ran when the socket was full: the datagrams sent
    // into it were dropped by the kernel, not waited for.
    let seen = s["ranks"][0]["iterations"].as_u64().unwrap_or(0) + 1;
    eprintln!(
        "stallscope saw {seen} of {iters} iterations; markers {}",
        s["markers"]
    );
    assert!(
        seen < iters as u64,
        "the socket was full while stopped: {s:#}"
    );
    assert!(started.elapsed() < RUN_LIMIT);
}

/// Runs the example through `sh -c "<shell_prefix> python example …"` under `stallscope run`:
/// the exit code comes back untouched and the summary counts every iteration.
fn run_under_a_shell(shell_prefix: &str) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let flags = example_flags(ITERS).join(" ");
    let script = format!("{shell_prefix} {} {} {flags}", python(), example());
    let mut cmd = stallscope();
    cmd.args(["run", "-q", "-o"])
        .arg(dir.path().join("p.stallscope"))
        .arg("--summary-json")
        .arg(dir.path().join("s.json"))
        .args(["--", "sh", "-c", &script]);
    let r = run(&mut cmd, 0, |_| {});
    assert_untouched(&r, ITERS);
    let s = read_json(&dir.path().join("s.json"));
    let total = s["job"]["iterations"].as_u64().unwrap() + s["warmup_iterations"].as_u64().unwrap();
    assert_eq!(total as usize, ITERS, "{s:#}");
    s
}

/// The training runs in a session and process group of its own (`setsid`, under a shell):
/// stallscope still finds its markers and its processes, and returns its exit code.
#[test]
fn a_training_in_its_own_session_is_followed() {
    if !have_torch() {
        return;
    }
    let s = run_under_a_shell("setsid -w");
    assert_eq!(s["ranks"].as_array().unwrap().len(), 1, "{s:#}");
}

/// The training execs another program (`sh -c 'exec python3 …'`): the process stallscope
/// started becomes the training, which is still followed to its exit code.
#[test]
fn a_training_that_execs_is_followed() {
    if !have_torch() {
        return;
    }
    run_under_a_shell("exec");
}

/// The node's agent is killed (SIGKILL) while a training sends it markers: the training,
/// started under `stallscope run`, which joined the agent, carries on to its end and its exit
/// code; its markers are dropped.
#[test]
fn the_agent_killed_mid_run_leaves_the_training_alone() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    // No collector: the agent keeps its records meanwhile, as it would while one restarts.
    let unused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let collector = unused.local_addr().unwrap().to_string();
    drop(unused);
    let mut agent = stallscope()
        .args(["agent", "--collector", &collector, "--node", "n"])
        .arg("--socket")
        .arg(&socket)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        wait_for(Duration::from_secs(30), || socket.exists()),
        "the agent listens"
    );
    let mut cmd = stallscope_run(&dir.path().join("p.stallscope"), &[], ITERS);
    cmd.env("STALLSCOPE_SOCKET", &socket);
    let agent_pid = agent.id();
    let r = run(&mut cmd, 5, |_| kill(agent_pid, libc::SIGKILL));
    let _ = agent.wait();
    assert!(r.stderr.contains("joined the node's agent"), "{}", r.stderr);
    assert_untouched(&r, ITERS);
}
