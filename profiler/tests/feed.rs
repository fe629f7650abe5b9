//! The live feed: a second process attaches to a running `stallscope run` around the real
//! PyTorch example and reads the live model; a client that never reads does not disturb the
//! training.

mod common;

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use serde_json::Value;

/// Where `stallscope run` (pid `pid`) serves its feed, as the README says.
fn feed_socket(pid: u32) -> PathBuf {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let dir = if uid == 0 {
        PathBuf::from("/run/stallscope")
    } else if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR").filter(|x| !x.is_empty()) {
        PathBuf::from(x).join("stallscope")
    } else {
        std::env::temp_dir().join(format!("stallscope-{uid}"))
    };
    dir.join(format!("run-{pid}.feed"))
}

#[test]
fn a_second_process_reads_the_live_model_of_a_run() {
    if !have_torch() {
        return;
    }
    generate_images();
    let dir = tempfile::tempdir().unwrap();
    let run = example_under(
        stallscope(),
        dir.path(),
        &["--job", "resnet-trial"],
        &[
            "--iters",
            "400",
            "--workers",
            "1",
            "--batch",
            "4",
            "--data-delay-ms",
            "5",
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let socket = feed_socket(run.id());
    assert!(
        wait_for(Duration::from_secs(60), || socket.exists()),
        "no feed at {}",
        socket.display()
    );
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the feed is the owner's alone");
    // A client that connects and never reads: it is dropped, the run is not slowed.
    let stalled = UnixStream::connect(&socket).unwrap();

    // Wait for the first iterations, then read 12 messages (a snapshot and 11 updates).
    let mut lines: Vec<Value> = Vec::new();
    let found = wait_for(Duration::from_secs(90), || {
        let out = stallscope()
            .arg("feed")
            .arg(&socket)
            .args(["--json", "--count", "12"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        lines = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).expect("each line is JSON"))
            .collect();
        lines[0]["snapshot"]["ranks"]["0"]["recent"]
            .as_array()
            .is_some_and(|r| !r.is_empty())
    });
    assert!(
        found,
        "the model never showed rank 0's iterations: {lines:?}"
    );
    assert_eq!(lines.len(), 12);
    let snapshot = &lines[0]["snapshot"];
    assert_eq!(snapshot["schema"], "stallscope.view/1");
    assert_eq!(snapshot["name"], "resnet-trial");
    assert_eq!(snapshot["batch_size"], 4);
    let node = snapshot["ranks"]["0"]["node"].as_str().unwrap().to_string();
    assert!(
        snapshot["nodes"][&node]["resources"]["cpu_busy_cores"].as_f64() > Some(0.0),
        "the node's CPU use is in the model: {snapshot:#}"
    );
    let updates: Vec<&Value> = lines[1..].iter().map(|l| &l["update"]).collect();
    assert!(
        updates.iter().all(|u| u.is_object()),
        "then updates: {lines:?}"
    );
    let new_parts: usize = updates
        .iter()
        .map(|u| u["parts"].as_array().map_or(0, Vec::len))
        .sum();
    assert!(new_parts > 0, "updates carry new iterations: {updates:?}");

    // The status form reads the same feed.
    let status = stallscope()
        .arg("feed")
        .arg(&socket)
        .args(["--count", "2"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains(" rank · median "), "{text}");

    let done = run.wait_with_output().unwrap();
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let s = read_json(&dir.path().join("s.json"));
    assert_eq!(
        s["job"]["iterations"], 399,
        "400 iterations, 1 warm-up: {s:#}"
    );
    assert!(!socket.exists(), "the feed socket is removed at the end");
    // The stalled client was dropped: its socket reads to the end, it does not hang.
    stalled
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut rest = Vec::new();
    let _ = (&stalled).read_to_end(&mut rest);
}
