//! `stallscope experiment` end to end: two configurations of the real example, the stall by
//! difference, and the result read back by `stallscope summary`.

mod common;

use common::*;

/// One process that prepares its data in the loop (no workers) with 40 ms of CPU per sample:
/// the warm real-data run (R3) is slower than the synthetic one (R0) by the preparation,
/// which the experiment reports as data_prep, as the online breakdown does.
#[test]
fn a_prep_bound_training_shows_prep_by_difference() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("e.json");
    let profile = dir.path().join("e.stallscope");
    let out = run_ok(
        stallscope()
            .args(["experiment", "-q", "--configs", "R0,R3", "--iters", "4"])
            .args(["--warmup", "1", "-o"])
            .arg(&profile)
            .arg("--json")
            .arg(&json)
            .args(["--", &python(), &example()])
            .args(["--workers", "0", "--batch", "4", "--images", "64"])
            .args(["--data-delay-ms", "40", "--iters", "100"])
            .args(["--data-dir", &data_dir()]),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The hook ended each run in its 1 + 4th optimizer step, not after the example's 100
    // (rank 0 prints after each step: 4 lines per run).
    let printed = stdout.lines().filter(|l| l.starts_with("iter ")).count();
    assert_eq!(printed, 2 * 4, "{stdout}");
    assert!(
        stdout.contains("Stalls by difference"),
        "{stdout}\n{stderr}"
    );

    let e = read_json(&json);
    assert_eq!(e["schema"], "stallscope.experiment/1");
    let runs = e["runs"].as_array().unwrap();
    let labels: Vec<&str> = runs.iter().map(|r| r["config"].as_str().unwrap()).collect();
    assert_eq!(labels, ["Single", "Warm"], "{e:#}");
    for r in runs {
        assert_eq!(r["exit_code"], 0, "{e:#}");
        assert_eq!(r["timing"]["iterations"], 4, "{e:#}");
        assert!(std::path::Path::new(r["profile"].as_str().unwrap()).exists());
    }
    let diff = &e["differential"];
    assert_eq!(diff["basis"], "Warm");
    let prep = diff["data_prep"]["fraction"].as_f64().unwrap();
    let compute = diff["compute"]["fraction"].as_f64().unwrap();
    assert!(prep > 0.5, "prep by difference {prep}: {e:#}");
    assert!((prep + compute - 1.0).abs() < 1e-6, "{e:#}");
    assert!(diff["data_fetch"].is_null() && diff["interconnect"].is_null());
    let online_prep = e["agreement"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["category"] == "data_prep")
        .unwrap()["online"]
        .as_f64()
        .unwrap();
    assert!(online_prep > 0.5, "online data_prep {online_prep}: {e:#}");

    // The result is a profile `stallscope summary` prints again, text and JSON.
    let again = run_ok(stallscope().arg("summary").arg(&profile));
    let text = String::from_utf8_lossy(&again.stdout);
    assert!(text.contains("T(R3) - T(R0)"), "{text}");
    let again = run_ok(stallscope().args(["summary", "--json"]).arg(&profile));
    let replayed = summary_json(&again.stdout);
    assert_eq!(replayed["differential"], e["differential"]);

    // The report of the warm run with the experiment beside it: online and by difference.
    let warm = runs[1]["profile"].as_str().unwrap();
    let args = [
        std::ffi::OsStr::new(warm),
        std::ffi::OsStr::new("--experiment"),
        profile.as_os_str(),
    ];
    if let Some(dom) = report_in_chromium(dir.path(), "report", &args) {
        assert_report_holds(&dom, &[0], &["chart-timeline", "chart-iteration-time"]);
        let section = &dom[dom.find("id=\"experiment\"").unwrap()..];
        let section = &section[..section.find("</section>").unwrap()];
        assert!(section.contains("data prep"), "{section}");
    }
}

/// A configuration that cannot run is refused before anything starts.
#[test]
fn a_cold_cache_run_without_a_dataset_is_refused() {
    let out = stallscope()
        .args(["experiment", "--configs", "R2", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("needs --dataset-dir"), "{stderr}");
}

/// Issue 17 item 11: with the ranks spread over two nodes, the cold-cache run (R2) empties the
/// page cache on each node, through the same --node-launch prefix that starts the ranks there
/// (here a prefix that records the node and runs the command on this machine, as two nodes on
/// one host), and the ranks it starts still run the hook and stop at the iteration limit.
#[test]
fn a_spread_cold_run_empties_each_nodes_cache_through_its_prefix() {
    use std::os::unix::fs::PermissionsExt;
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("nodes.log");
    let prefix = dir.path().join("on-node.sh");
    std::fs::write(
        &prefix,
        format!(
            "#!/bin/sh\nnode=$1; shift\necho \"$node $2\" >> {}\nexec \"$@\"\n",
            log.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&prefix, std::fs::Permissions::from_mode(0o755)).unwrap();
    let json = dir.path().join("e.json");
    let data = data_dir();
    let out = run_ok(
        stallscope()
            .args(["experiment", "-q", "--configs", "R2", "--iters", "3"])
            .args(["--warmup", "1", "--nproc", "2", "--nodes", "nsa,nsb"])
            .args(["--master-addr", "127.0.0.1", "--cold-cache", "fadvise"])
            .arg("--node-launch")
            .arg(format!("{} {{node}}", prefix.display()))
            .arg("--dataset-dir")
            .arg(&data)
            .arg("-o")
            .arg(dir.path().join("e.stallscope"))
            .arg("--json")
            .arg(&json)
            .args(["--", &python(), &example()])
            .args(["--workers", "0", "--batch", "4", "--images", "64"])
            .args(["--iters", "100", "--data-dir", &data]),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let said = std::fs::read_to_string(&log).unwrap();
    // Each node: the cache step, then its rank.
    for node in ["nsa", "nsb"] {
        assert!(
            said.lines().any(|l| l == format!("{node} cache-evict")),
            "{said}\n{stderr}"
        );
        assert!(
            stderr.contains(&format!("on {node}: cache emptied (posix_fadvise")),
            "{stderr}"
        );
    }
    assert_eq!(
        said.lines().count(),
        4,
        "two cache steps, two ranks: {said}"
    );
    let e = read_json(&json);
    let run = &e["runs"][0];
    assert_eq!(run["config"], "Cold", "{e:#}");
    assert_eq!(run["exit_code"], 0, "{e:#}");
    assert_eq!(run["timing"]["iterations"], 3, "{e:#}");
}
