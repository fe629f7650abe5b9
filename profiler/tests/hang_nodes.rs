//! A job that hangs across nodes (issue 28): two network namespaces, one rank each, each with
//! its agent, and a collector in a third (`stallscope collector --hang-after 8`). At
//! iteration 12 rank 1 (node-b) sleeps in `stuck_in_here` while rank 0 (node-a) enters that
//! iteration's all-reduce. The collector asks both agents where their ranks stand, and
//! declares one hang naming rank 1@node-b missing (not rank 0), rank 0@node-a waiting, and
//! rank 1's Python stack with that function. The stuck rank sleeps 30 s, then the job goes on
//! to its end: stallscope never stops it. Needs root for the namespaces; CI runs as root.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;

/// Rank 1 sleeps `STUCK_SECONDS` in `stuck_in_here` at iteration 12 (as in hang.rs).
const STUCK_RANK: &str = include_str!("common/stuck_rank.py");

#[test]
fn the_collector_names_the_rank_that_never_arrives_at_its_node_with_its_stack() {
    if !am_root("create network namespaces") || !have_torch() {
        return;
    }
    let prefix = format!("hx{}", std::process::id() % 100_000);
    let net = format!("{}", 50 + std::process::id() % 50);
    let _cluster = Cluster::up(&prefix, &["--net", &net, "--collector"]);
    let (na, nb, nc) = (
        format!("{prefix}a"),
        format!("{prefix}b"),
        format!("{prefix}c"),
    );
    let listen = format!("10.77.{net}.3:7571");
    let dir = tempfile::tempdir().unwrap();
    let d = |n: &str| -> PathBuf { dir.path().join(n) };
    std::fs::write(d("token"), "s3cret\n").unwrap();
    std::fs::write(d("train.py"), STUCK_RANK).unwrap();

    let mut col = Reaped::spawn(
        stallscope_in(&nc)
            .args(["collector", "-q", "--hang-after", "8", "--listen", &listen])
            .arg("--token-file")
            .arg(d("token"))
            .arg("--out")
            .arg(d("job.stallscope"))
            .arg("--summary-json")
            .arg(d("job.json")),
        &d("collector.log"),
    );
    assert!(wait_for_log(
        &d("collector.log"),
        "listening",
        Duration::from_secs(10)
    ));
    let mut agents: Vec<Reaped> = [("a", &na), ("b", &nb)]
        .iter()
        .map(|(n, ns)| {
            Reaped::spawn(
                stallscope_in(ns)
                    .args(["agent", "--collector", &listen, "--token-file"])
                    .arg(d("token"))
                    .arg("--socket")
                    .arg(d(&format!("{n}.sock")))
                    .args(["--node", &format!("node-{n}")]),
                &d(&format!("agent-{n}.log")),
            )
        })
        .collect();
    assert!(wait_for(Duration::from_secs(10), || {
        log_has(&d("collector.log"), "node node-a joined")
            && log_has(&d("collector.log"), "node node-b joined")
    }));
    let mut ranks: Vec<Reaped> = [(0, &na, "a"), (1, &nb, "b")]
        .iter()
        .map(|(r, ns, n)| {
            Reaped::spawn(
                stallscope_in(ns)
                    .args(["run", "-q", "--", &python()])
                    .arg(d("train.py"))
                    .env("STALLSCOPE_SOCKET", d(&format!("{n}.sock")))
                    .env("STUCK_SECONDS", "30")
                    .env("GLOO_SOCKET_IFNAME", "eth0")
                    .env("RANK", r.to_string())
                    .env("LOCAL_RANK", "0")
                    .env("WORLD_SIZE", "2")
                    .env("MASTER_ADDR", format!("10.77.{net}.1"))
                    .env("MASTER_PORT", "29561"),
                &d(&format!("rank{r}.log")),
            )
        })
        .collect();
    for (i, r) in ranks.iter_mut().enumerate() {
        r.wait_success(
            Duration::from_secs(240),
            "a rank",
            &d(&format!("rank{i}.log")),
        );
    }
    std::thread::sleep(Duration::from_secs(3));
    for a in &mut agents {
        assert!(a.stop(libc::SIGTERM, Duration::from_secs(20)));
    }
    assert!(col.stop(libc::SIGTERM, Duration::from_secs(20)));
    let log = std::fs::read_to_string(d("collector.log")).unwrap();
    check(&read_json(&d("job.json")), &log, &d("job.stallscope"));
}

/// The hang as the collector's summary, its stderr and the job profile say it.
fn check(s: &serde_json::Value, log: &str, profile: &Path) {
    let hangs = s["hangs"].as_array().expect("hangs");
    assert_eq!(hangs.len(), 1, "one hang, declared once: {s:#}\n{log}");
    let h = &hangs[0];
    let stalled = h["stalled_seconds"].as_f64().unwrap();
    eprintln!("hang declared {stalled:.2} s after the last iteration (threshold 8 s)");
    assert!((8.0..25.0).contains(&stalled), "{h:#}");
    assert!(h["resumed_after_seconds"].as_f64().is_some(), "{h:#}");
    assert_eq!(h["collective"]["op"], "all_reduce", "{h:#}");
    assert_eq!(h["collective"]["seq"], 12, "{h:#}");
    assert_eq!(h["missing_ranks"], serde_json::json!([1]), "{h:#}");
    assert_eq!(h["missing_at"], serde_json::json!(["1@node-b"]), "{h:#}");
    assert_eq!(h["waiting_at"], serde_json::json!(["0@node-a"]), "{h:#}");
    assert_eq!(h["unanswered_nodes"], serde_json::json!([]), "{h:#}");
    let states: Vec<(&str, &str)> = h["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["node"].as_str().unwrap(), r["state"].as_str().unwrap()))
        .collect();
    assert_eq!(
        states,
        [("node-a", "collective"), ("node-b", "compute_or_unknown")],
        "{h:#}"
    );
    let stack = h["stacks"]["1"].as_str().unwrap_or_default();
    assert!(stack.contains("stuck_in_here"), "{h:#}");
    let waiting = h["stacks"]["0"].as_str().unwrap_or_default();
    assert!(waiting.contains("all_reduce"), "{h:#}");
    assert!(
        log.contains(
            "rank 1@node-b never arrived at all_reduce #12 of group 0 (rank 0@node-a waits in it)"
        ),
        "{log}"
    );
    assert!(log.contains("the agents answered within"), "{log}");
    for line in log.lines().filter(|l| l.contains("answered within")) {
        eprintln!("{line}");
    }
    assert!(log.contains("stallscope: the job resumed"), "{log}");
    let replayed = run_ok(stallscope().args(["summary", "--json"]).arg(profile));
    let replayed: serde_json::Value = serde_json::from_slice(&replayed.stdout).unwrap();
    assert_eq!(
        replayed["hangs"], s["hangs"],
        "the job profile keeps the hang"
    );
}
