//! `stallscope advise` end to end: on a real profile of the example training, and one pair of
//! local "instance shapes" measured (bench/advisor.py: profiled at 50 Mbit/s between two
//! network-namespace nodes, predicted and then run at 200 Mbit/s).

mod common;

use std::process::Command;

use common::*;

#[test]
fn a_bad_catalog_cell_is_named_by_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("c.csv");
    std::fs::write(
        &csv,
        "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price\nm,,0,2,4,cheap\n",
    )
    .unwrap();
    let out = stallscope()
        .args(["advise", "missing.stallscope", "--catalog"])
        .arg(&csv)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("line 2, column `Price`: cannot read `cheap`"),
        "{err}"
    );
}

#[test]
fn a_zero_storage_rate_is_refused_naming_its_row_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("c.csv");
    std::fs::write(
        &csv,
        "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,StorageMBps\n\
         disk,,0,2,4,1.0,1\n\
         nodisk,,0,2,4,0.5,0\n",
    )
    .unwrap();
    let out = stallscope()
        .args(["advise", "missing.stallscope", "--catalog"])
        .arg(&csv)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("line 3 (nodisk), column `StorageMBps`: a rate of 0"),
        "{err}"
    );
}

#[test]
fn a_cpu_job_gets_cpu_machines_and_its_measured_time_back() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    run_example(
        dir.path(),
        &[],
        &[
            "--iters",
            "8",
            "--workers",
            "1",
            "--batch",
            "4",
            "--image-size",
            "32",
        ],
    );
    let json = dir.path().join("a.json");
    let out = run_ok(
        stallscope()
            .args([
                "advise",
                "--current",
                "c5.4xlarge",
                "--iterations",
                "10000",
                "--json",
            ])
            .arg(&json)
            .arg(dir.path().join("p.stallscope")),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("has GPUs the job does not use"), "{text}");
    let v = read_json(&json);
    assert_eq!(v["schema"], "stallscope.advice/1");
    let me = v["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["instance_type"] == "c5.4xlarge")
        .unwrap();
    let measured = v["measured"]["iteration_seconds"].as_f64().unwrap();
    let predicted = me["predicted_iteration_seconds"].as_f64().unwrap();
    assert!(
        (predicted - measured).abs() < 1e-6 * measured.max(1.0),
        "{v:#}"
    );
    assert!(me["predicted_cost"].as_f64().unwrap() > 0.0);
}

#[test]
fn a_four_times_faster_link_is_predicted_and_measured_faster() {
    if !am_root("create network namespaces") || !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("pairs.json");
    let status = Command::new(python())
        .arg(repo().join("bench/advisor.py"))
        .args(["--stallscope", env!("CARGO_BIN_EXE_stallscope")])
        .args([
            "--reps",
            "1",
            // The hook sends the buckets' ready times once 16 backwards have run.
            "--iters",
            "16",
            "--pairs",
            "net50:net200",
            "--advice",
            "",
            "--json",
        ])
        .arg(&json)
        .status()
        .unwrap();
    assert!(status.success());
    let rows = read_json(&json);
    let row = &rows[0];
    let profiled = row["profiled_mean"].as_f64().unwrap();
    let predicted = row["predicted"].as_f64().unwrap();
    let measured = row["measured_median"].as_f64().unwrap();
    // The order a user acts on, then a bound generous enough for a loaded 2-core machine.
    assert!(predicted < profiled && measured < profiled, "{row:#}");
    assert!((predicted - measured).abs() / measured < 0.4, "{row:#}");
}
