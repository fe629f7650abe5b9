//! The collector load benchmark, small: 20 simulated agents for about a second, every record
//! acknowledged and on the live feed. The benchmark proper (`stallscope collector-bench`, see
//! docs/BENCHMARKS.md) is not a test.

mod common;

use common::*;

#[test]
fn twenty_agents_for_a_second_deliver_every_record() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    // Exit code 1 says the bench's goal was not met (a window's rate under 99% of what was
    // offered, which a loaded machine can make so): the test judges delivery, below.
    let out = run_exiting_with(
        stallscope().args([
            "collector-bench",
            "--agents",
            "20",
            "--seconds",
            "1",
            "--warmup",
            "0.2",
            "--p99-goal-ms",
            "60000", // the latency is the benchmark's business, not CI's
            "--json",
            json.to_str().unwrap(),
            "--timeline",
        ]),
        &[0, 1],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let rows = read_json(&json);
    let row = &rows[0];
    let n = |k: &str| {
        row[k]
            .as_u64()
            .unwrap_or_else(|| panic!("{k} in {row}\n{stdout}"))
    };
    assert_eq!(n("connected"), 20, "{stdout}");
    assert!(row["error"].is_null(), "{stdout}");
    // Every record sent was written to the job profile and acknowledged…
    assert!(n("sent") > 20 * 100, "{stdout}");
    assert_eq!(n("acked"), n("sent"), "{stdout}");
    // …and every iteration (all records but one health report per agent) reached the feed.
    assert_eq!(
        row["totals"]["frames"].as_u64(),
        Some(n("sent") - 20),
        "{stdout}"
    );
    assert_eq!(row["totals"]["lagged"].as_u64(), Some(0), "{stdout}");
    assert!(row["window"]["p99_ms"].as_f64().is_some(), "{stdout}");
    assert!(row["window"]["cpu_s"].as_f64().unwrap() > 0.0, "{stdout}");
    // The job thread is found and measured: part of the collector's CPU (counted in 10 ms
    // ticks, so within a tick of it at most).
    let job = row["window"]["job_thread_cpu_s"]
        .as_f64()
        .unwrap_or_else(|| panic!("no job thread measured\n{stdout}"));
    let cpu = row["window"]["cpu_s"].as_f64().unwrap();
    assert!((0.0..=cpu + 0.011).contains(&job), "{stdout}");
    // The timeline: each second from the collector's start to the window's end, which
    // together saw every iteration the feed had by then; printed with `--timeline`.
    let timeline = row["window"]["timeline"].as_array().expect("a timeline");
    let from = row["window"]["window_from_s"].as_f64().unwrap();
    assert!(
        from > 0.0 && (timeline.len() as f64) >= from + 1.0,
        "{from} {timeline:?}"
    );
    let seen: u64 = timeline.iter().map(|s| s["frames"].as_u64().unwrap()).sum();
    assert!(seen > 0 && seen <= n("sent"), "{seen} {stdout}");
    let largest = timeline
        .iter()
        .map(|s| s["max_ms"].as_f64().unwrap())
        .fold(0.0, f64::max);
    assert!(
        largest >= row["window"]["max_ms"].as_f64().unwrap(),
        "{timeline:?}"
    );
    let line = stdout
        .lines()
        .find(|l| l.contains("largest latency each second since the start, ms:"))
        .unwrap_or_else(|| panic!("no timeline printed\n{stdout}"));
    assert_eq!(line.matches('|').count(), 1, "{line}");
}
