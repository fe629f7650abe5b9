//! `stallscope trace` (issue 28): the trace of a real two-rank training opens in the Perfetto
//! UI (its own trace_processor engine, offline in headless Chromium: not stallscope's code),
//! with a track per rank, one slice per iteration run, the resources as counter tracks, and
//! the two ranks' iterations on one clock; a hang makes the flight recorder write the last
//! minutes' trace beside the profile.

mod common;

use common::*;

/// Two ranks of the example, 12 iterations each: the trace holds each rank's 12 iterations,
/// its phases and categories, the node's counters, and the ranks' iterations overlap.
#[test]
fn a_two_rank_trace_opens_in_perfetto_with_its_ranks_on_one_clock() {
    if !have_torch() {
        return;
    }
    let Some(ui) = perfetto_ui() else { return };
    generate_images();
    let dir = tempfile::tempdir().unwrap();
    let flags = [
        "--nproc",
        "2",
        "--port",
        "29613",
        "--iters",
        "12",
        "--workers",
        "0",
    ];
    run_example(
        dir.path(),
        &[],
        &[&flags[..], &["--batch", "8", "--images", "64"]].concat(),
    );
    let trace = dir.path().join("t.json");
    let out = run_ok(
        stallscope()
            .arg("trace")
            .arg(dir.path().join("p.stallscope"))
            .arg("-o")
            .arg(&trace),
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("trace written to"), "{said}");

    let [iterations, categories, counters, errors] = &perfetto_query(
        &ui,
        &trace,
        &[
            &perfetto_slices("iteration"),
            &perfetto_slices("category"),
            PERFETTO_COUNTERS,
            PERFETTO_ERRORS,
        ],
    )[..] else {
        panic!("four queries, four results")
    };
    assert!(errors.is_empty(), "Perfetto's importer: {errors:?}");
    for rank in ["rank 0", "rank 1"] {
        let n = iterations.iter().filter(|r| r["thread"] == rank).count();
        assert_eq!(n, 12, "{rank}'s iterations: {iterations:?}");
        let cats = format!("{rank} categories");
        assert!(
            categories.iter().any(|r| r["thread"] == cats.as_str()),
            "{cats}: {categories:?}"
        );
    }
    let process = iterations[0]["process"].as_str().unwrap();
    assert!(process.starts_with("node "), "{process}");
    for track in ["CPU busy cores", "disk read MB/s", "NIC rx MB/s"] {
        assert!(
            counters
                .iter()
                .any(|c| c["name"] == track && c["n"].as_u64() > Some(1)),
            "no {track} counter: {counters:?}"
        );
    }
    assert!(assert_iterations_line_up(iterations) >= 10);
}

/// Two ranks over gloo; at iteration 12 rank 1 sleeps 15 s while rank 0 waits in the
/// all-reduce (as in tests/hang.rs).
const STUCK_RANK: &str = r#"
import time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(15):
    if rank == 1 and i == 12:
        time.sleep(15)
    model(torch.randn(4, 8)).sum().backward()
    dist.all_reduce(torch.ones(4))
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
"#;

/// A hang declared during the run writes PROFILE.hang-<at>.trace.json: said on stderr, it
/// opens in Perfetto with the hang as an instant naming rank 1 missing, and both ranks'
/// iterations before it.
#[test]
fn a_hang_makes_the_flight_recorder_write_the_last_minutes_trace() {
    if !have_torch() {
        return;
    }
    let Some(ui) = perfetto_ui() else { return };
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("train.py");
    std::fs::write(&script, STUCK_RANK).unwrap();
    let profile = dir.path().join("p.stallscope");
    let out = run_ok(
        stallscope()
            .args([
                "run",
                "-q",
                "--hang-after",
                "5",
                "--flight-recorder",
                "120",
                "-o",
            ])
            .arg(&profile)
            .args(["--", env!("CARGO_BIN_EXE_stallscope"), "launch"])
            .args(["--nproc-per-node", "2", "--master-port", "29617", "--"])
            .arg(python())
            .arg(&script),
    );
    let said = String::from_utf8_lossy(&out.stderr);
    let line = said
        .lines()
        .find(|l| l.contains("flight recorder: the last 120 s"))
        .unwrap_or_else(|| panic!("no flight recorder line: {said}"));
    let written = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.to_string_lossy().contains(".hang-") && p.to_string_lossy().ends_with(".trace.json")
        })
        .unwrap_or_else(|| panic!("no trace beside the profile: {said}"));
    assert!(line.contains(&written.display().to_string()), "{line}");

    let [hangs, iterations, errors] = &perfetto_query(
        &ui,
        &written,
        &[
            "select name, ts from slice where category = 'hang'",
            &perfetto_slices("iteration"),
            PERFETTO_ERRORS,
        ],
    )[..] else {
        panic!("three queries, three results")
    };
    assert!(errors.is_empty(), "Perfetto's importer: {errors:?}");
    assert_eq!(hangs.len(), 1, "{hangs:?}");
    assert_eq!(hangs[0]["name"], "hang: rank 1 missing", "{hangs:?}");
    for rank in ["rank 0", "rank 1"] {
        let n = iterations.iter().filter(|r| r["thread"] == rank).count();
        assert!(
            n >= 10,
            "{rank}'s iterations before the hang: {iterations:?}"
        );
    }
    let hang_at = hangs[0]["ts"].as_f64().unwrap();
    assert!(
        iterations
            .iter()
            .all(|r| r["ts"].as_f64().unwrap() < hang_at),
        "the trace was written at the hang: nothing after it"
    );
}
