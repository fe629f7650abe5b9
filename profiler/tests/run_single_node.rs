//! `stallscope run` around the real PyTorch example on one node.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

/// (i) One rank, no loader workers, heavy per-sample CPU work: the loop waits for data prep.
#[test]
fn heavy_preprocessing_without_workers_is_reported_as_data_prep() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("p.stallscope");
    let (out, s) = run_example(
        dir.path(),
        &[],
        &[
            "--iters",
            "12",
            "--workers",
            "0",
            "--batch",
            "4",
            "--data-delay-ms",
            "40",
            "--images",
            "64",
        ],
    );
    assert_eq!(largest(&s), "data_prep", "{s:#}");
    assert!(fraction(&s, "data_prep") > 0.6, "{s:#}");
    assert_eq!(s["finding"]["category"], "data_prep");
    assert_eq!(
        s["job"]["iterations"], 11,
        "12 iterations, 1 warm-up: {s:#}"
    );
    assert_eq!(s["exit_code"], 0);
    // The training's own output passed through unchanged, and the summary went to stderr.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("iter 11 "), "{stdout}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("finding: "), "{stderr}");
    assert!(stderr.contains(&profile.display().to_string()), "{stderr}");
    // The profile replays to the same figures.
    let replay = run_ok(stallscope().arg("summary").arg("--json").arg(&profile));
    let r = summary_json(&replay.stdout);
    assert_eq!(r["job"], s["job"]);
    // The report, where people read it: Chromium shows the verdict on data prep, the rank,
    // every iteration's parts, the iteration time and the node's CPU beside them.
    if let Some(dom) = report_in_chromium(dir.path(), "report", &[profile.as_os_str()]) {
        assert_report_holds(
            &dom,
            &[0],
            &[
                "chart-timeline",
                "chart-iteration-time",
                "chart-resource-cpu-busy",
            ],
        );
        let verdict = &dom[dom.find("id=\"verdict\"").unwrap()..];
        assert!(
            verdict[..verdict.find("</section>").unwrap()].contains("data prep"),
            "{verdict}"
        );
    }
}

/// Issue 17 item 9: a loader worker that decodes on a helper thread (as thread-pool decoders
/// do) while its own main thread waits asleep: the loop's data wait is the worker's prep, read
/// from all of the worker's threads, not an unexplained wait. 240 ms of decoding per batch
/// against ~50 ms of compute (~110 ms on a loaded machine); the worker's threads are watched
/// from the loop's first step, not from a discovery up to a second later.
#[test]
fn a_worker_decoding_on_a_helper_thread_is_data_prep() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_, s) = run_example(
        dir.path(),
        &[],
        &[
            "--iters",
            "12",
            "--workers",
            "1",
            "--batch",
            "4",
            "--data-delay-ms",
            "60",
            "--data-on-thread",
            "--images",
            "64",
        ],
    );
    assert_eq!(largest(&s), "data_prep", "{s:#}");
    assert!(fraction(&s, "data_prep") > fraction(&s, "other"), "{s:#}");
    assert_eq!(s["exit_code"], 0);
}

/// (iii) The training's exit code is stallscope's exit code.
#[test]
fn the_training_exit_code_comes_back() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let status = stallscope()
        .args(["run", "-q", "-o"])
        .arg(dir.path().join("p.stallscope"))
        .args([
            "--",
            &python(),
            &example(),
            "--iters",
            "2",
            "--workers",
            "0",
            "--images",
            "64",
            "--exit-code",
            "3",
        ])
        .args(["--data-dir", &data_dir()])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(3));
}

/// (iv) A profile cut by `kill -9` of stallscope still reads up to its last whole frame.
#[test]
fn a_profile_cut_by_kill_9_is_still_summarised() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("cut.stallscope");
    let mut run = stallscope()
        .args(["run", "-q", "-o"])
        .arg(&profile)
        .args([
            "--",
            &python(),
            &example(),
            "--iters",
            "100000",
            "--workers",
            "0",
            "--batch",
            "4",
            "--images",
            "64",
        ])
        .args(["--data-dir", &data_dir()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = run.id();
    // Wait until at least a few iterations are in the file (it is flushed every second).
    let enough = wait_for(Duration::from_secs(60), || {
        let out = stallscope()
            .arg("summary")
            .arg("--json")
            .arg(&profile)
            .output()
            .unwrap();
        serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .map(|v| v["job"]["iterations"].as_u64().unwrap_or(0) >= 3)
            .unwrap_or(false)
    });
    let training = children(pid);
    kill(pid, libc::SIGKILL);
    let _ = run.wait();
    // The training outlives stallscope (it must never be harmed by it); end it here.
    for p in &training {
        kill(*p, libc::SIGKILL);
    }
    assert!(enough, "no iterations reached the profile in 60 s");
    let out = run_ok(stallscope().arg("summary").arg("--json").arg(&profile));
    let s = summary_json(&out.stdout);
    assert_eq!(s["complete"], false);
    assert!(s["job"]["iterations"].as_u64().unwrap() >= 3, "{s:#}");
    assert!(s["exit_code"].is_null());
    let text = run_ok(stallscope().arg("summary").arg(&profile));
    assert!(String::from_utf8_lossy(&text.stdout).contains("cut short"));
    // The report of the cut profile says so first, and still shows what it holds.
    if let Some(dom) = report_in_chromium(dir.path(), "cut", &[profile.as_os_str()]) {
        assert!(dom.contains("id=\"problems\""), "{dom}");
        assert!(dom.contains("the profile was cut"), "{dom}");
        assert_report_holds(&dom, &[0], &["chart-timeline", "chart-iteration-time"]);
    }
}

/// SIGTERM to stallscope reaches the training's process group, and stallscope dies of it too.
#[test]
fn sigterm_reaches_the_training_and_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = stallscope()
        .args(["run", "-q", "-o"])
        .arg(dir.path().join("p.stallscope"))
        .args(["--", "sh", "-c", "sleep 300 & wait"])
        .spawn()
        .unwrap();
    let pid = run.id();
    assert!(wait_for(Duration::from_secs(10), || children(pid)
        .iter()
        .any(|c| !children(*c).is_empty())));
    let sh = children(pid)[0];
    let sleep = children(sh)[0];
    kill(pid, libc::SIGTERM);
    let status = run.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    assert!(
        wait_for(Duration::from_secs(5), || !alive(sleep)),
        "the grandchild survived"
    );
}

/// No process of the job outlives stallscope, even one the command left behind.
#[test]
fn nothing_the_command_started_is_left_behind() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let script = format!(
        "sleep 300 & echo $! > {}; sleep 2; exit 0",
        pidfile.display()
    );
    let status = stallscope()
        .args(["run", "-q", "-o"])
        .arg(dir.path().join("p.stallscope"))
        .args(["--", "sh", "-c", &script])
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(0));
    let left: u32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        wait_for(Duration::from_secs(5), || !alive(left)),
        "pid {left} outlived stallscope"
    );
}

/// `--iter-regex` counts iterations from the command's output, for any framework.
#[test]
fn iterations_can_come_from_the_output() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("s.json");
    let out = run_ok(
        stallscope()
            .args(["run", "-q", "--no-auto", "-o"])
            .arg(dir.path().join("p.stallscope"))
            .arg("--summary-json")
            .arg(&json)
            .args(["--iter-regex", r"^step (?P<iter>\d+)$", "--"])
            .args([
                "sh",
                "-c",
                "for i in 0 1 2 3 4 5; do echo step $i; sleep 0.1; done",
            ]),
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("step 5"));
    let s = read_json(&json);
    assert_eq!(s["job"]["iterations"], 5, "{s:#}");
    let median = s["job"]["median_iteration_seconds"].as_f64().unwrap();
    assert!((0.08..0.5).contains(&median), "{median}");
}

/// Issue 30, item 1: `--iter-regex` capturing a token counter as the iteration number (a
/// jump from 2 to 10^14) used to hang `stallscope run` for ever, pinning a core, after the
/// command ended. It ends with the command, and the iterations either side are counted.
#[test]
fn a_token_counter_taken_for_the_iteration_ends_with_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("s.json");
    let mut child = stallscope()
        .args(["run", "-q", "--no-auto", "-o"])
        .arg(dir.path().join("p.stallscope"))
        .arg("--summary-json")
        .arg(&json)
        .args(["--iter-regex", r"tokens=(?P<iter>\d+)", "--"])
        .args([
            "sh",
            "-c",
            "for t in 0 1 2 100000000000000 100000000000001 100000000000002; do \
             echo tokens=$t; sleep 0.1; done",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let ended = wait_for(Duration::from_secs(60), || {
        matches!(child.try_wait(), Ok(Some(_)))
    });
    if !ended {
        kill_tree(child.id());
        let _ = child.wait();
    }
    assert!(ended, "stallscope did not end with its command");
    assert!(child.wait().unwrap().success());
    let s = read_json(&json);
    // Iterations 0–2 and the two after the jump; one warm-up left out.
    assert_eq!(s["job"]["iterations"], 4, "{s:#}");
}

/// Issue 17, item 13: under `--iter-regex` the training's output goes through a forwarder
/// that outlives stallscope. Killed mid-run (SIGKILL, no clean-up), stallscope takes nothing
/// of the training with it: every line still reaches the output, and the training finishes.
#[test]
fn killing_stallscope_under_iter_regex_does_not_break_the_trainings_output() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let done = dir.path().join("done");
    let script = format!(
        "for i in $(seq 1 30); do echo step $i || exit 3; sleep 0.05; done; echo finished > {}",
        done.display()
    );
    let mut child = stallscope()
        .args(["run", "-q", "--no-auto", "-o"])
        .arg(dir.path().join("p.stallscope"))
        .args([
            "--iter-regex",
            r"^step (?P<iter>\d+)$",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    // The first lines have come through: stallscope is running the training.
    let mut seen = Vec::new();
    let mut buf = [0u8; 256];
    while !String::from_utf8_lossy(&seen).contains("step 3") {
        let n = out.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "output ended early: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    kill(child.id(), libc::SIGKILL);
    let _ = child.wait();
    // The rest arrives; the read ends when the training (and the forwarder) are done.
    let reader = std::thread::spawn(move || {
        let mut rest = Vec::new();
        let _ = out.read_to_end(&mut rest);
        rest
    });
    assert!(
        wait_for(Duration::from_secs(60), || done.exists()),
        "the training did not finish after stallscope was killed"
    );
    let rest = reader.join().unwrap();
    seen.extend_from_slice(&rest);
    let text = String::from_utf8_lossy(&seen);
    for i in 1..=30 {
        assert!(
            text.contains(&format!("step {i}\n")),
            "step {i} lost: {text}"
        );
    }
}

/// Bad command lines get a clear error and start nothing.
#[test]
fn a_bad_regex_is_refused_before_anything_runs() {
    let out = stallscope()
        .args(["run", "--iter-regex", "(", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a valid regular expression"));
    let _ = Command::new("true");
}

/// Issue 30: an unknown option before the command is named as such (it was run as the
/// command: "cannot run \"--no-such-flag\""), and numbers that became durations are refused
/// instead of panicking (`feed --timeout inf`, `top --fps nan`).
#[test]
fn bad_options_are_named_and_refused_before_anything_runs() {
    let cases: [&[&str]; 4] = [
        &["run", "-q", "--no-such-flag", "--", "true"],
        &["feed", "--timeout", "inf"],
        &["feed", "--timeout", "1e300"],
        &["top", "p.stallscope", "--fps", "nan"],
    ];
    for args in cases {
        let out = stallscope().args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(!stderr.contains("cannot run"), "{args:?}: {stderr}");
        let named = args
            .iter()
            .find(|a| a.starts_with("--no") || **a == "inf" || **a == "1e300" || **a == "nan");
        assert!(stderr.contains(named.unwrap()), "{args:?}: {stderr}");
    }
}
