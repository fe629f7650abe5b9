//! A job that hangs (issue 28, one node): `stallscope run --hang-after 5` declares the hang
//! while it lasts, names the rank that never arrived at the collective and the one that waits
//! in it, and shows the stuck rank's Python stack; a rank stuck in its data loading is told
//! apart. Each job is bounded: the stuck rank sleeps ~15 s, then the job goes on and ends by
//! itself (so the hang is also seen to resume), and stallscope never stops it.

mod common;

use std::path::Path;

use common::*;
use serde_json::Value;

/// Two ranks over gloo; at iteration 12 rank 1 sleeps in `stuck_in_here` while rank 0 enters
/// that iteration's all-reduce (its 13th, #12).
const STUCK_RANK: &str = include_str!("common/stuck_rank.py");

/// One loop (no rank said: rank 0, the only one) whose dataset takes 15 s for the first
/// sample of batch 6.
const SLOW_DATASET: &str = r#"
import time
import torch

class Slow(torch.utils.data.Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        if i == 24:
            time.sleep(15)
        return torch.randn(8)

model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x in torch.utils.data.DataLoader(Slow(), batch_size=4, num_workers=0):
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
print("trained")
"#;

/// Two ranks over gloo, each reading its batches from a DataLoader; rank 1's dataset takes
/// 15 s for the first sample of batch 12 while rank 0 enters that iteration's all-reduce.
const LOADER_STUCK_RANK: &str = r#"
import time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()

class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 60

    def __getitem__(self, i):
        if rank == 1 and i == 48:
            time.sleep(15)
        return torch.randn(8)

model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x in torch.utils.data.DataLoader(Data(), batch_size=4, num_workers=0):
    model(x).sum().backward()
    dist.all_reduce(torch.ones(4))
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
print("trained")
"#;

/// Runs `launch` + the script under `stallscope run --hang-after 5`; the summary (the same
/// hangs as `stallscope summary --json` of the profile gives) and stallscope's stderr.
fn run_hanging(dir: &Path, script: &str, launch: &[&str]) -> (Value, String) {
    let path = dir.join("train.py");
    std::fs::write(&path, script).unwrap();
    let summary = dir.join("s.json");
    let out = run_ok(
        stallscope()
            .args(["run", "-q", "--hang-after", "5", "-o"])
            .arg(dir.join("p.stallscope"))
            .arg("--summary-json")
            .arg(&summary)
            .arg("--")
            .args(launch)
            .arg(python())
            .arg(&path),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("trained"),
        "the job went on to its end: {stdout}"
    );
    let s = read_json(&summary);
    let replayed = run_ok(
        stallscope()
            .args(["summary", "--json"])
            .arg(dir.join("p.stallscope")),
    );
    let replayed = summary_json(&replayed.stdout);
    assert_eq!(replayed["hangs"], s["hangs"], "the profile keeps the hangs");
    (s, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The one hang of the summary, with when it was reported after its start.
fn the_hang(s: &Value, stderr: &str) -> Value {
    let hangs = s["hangs"].as_array().expect("hangs");
    assert_eq!(hangs.len(), 1, "one hang, declared once: {s:#}\n{stderr}");
    let h = hangs[0].clone();
    let stalled = h["stalled_seconds"].as_f64().unwrap();
    eprintln!("hang reported {stalled:.2} s after the last iteration (threshold 5 s)");
    assert!((5.0..10.0).contains(&stalled), "{h:#}");
    let resumed = h["resumed_after_seconds"].as_f64();
    assert!(resumed.is_some(), "iterations resumed: {h:#}");
    h
}

#[test]
fn a_rank_that_never_arrives_is_named_with_its_stack() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_stallscope");
    let launch = [bin, "launch", "--nproc-per-node", "2", "--master-port"];
    let launch: Vec<&str> = launch.into_iter().chain(["29591", "--"]).collect();
    let (s, stderr) = run_hanging(dir.path(), STUCK_RANK, &launch);
    let h = the_hang(&s, &stderr);
    assert_eq!(h["collective"]["op"], "all_reduce", "{h:#}");
    assert_eq!(h["collective"]["group"], 0, "{h:#}");
    assert_eq!(h["collective"]["seq"], 12, "{h:#}");
    assert_eq!(h["waiting_ranks"], serde_json::json!([0]), "{h:#}");
    assert_eq!(h["missing_ranks"], serde_json::json!([1]), "{h:#}");
    assert_eq!(h["last_iteration"], 11, "{h:#}");
    let stack = h["stacks"]["1"].as_str().unwrap_or_default();
    assert!(stack.contains("stuck_in_here"), "{h:#}");
    let waiting = h["stacks"]["0"].as_str().unwrap_or_default();
    assert!(waiting.contains("all_reduce"), "{h:#}");
    assert!(
        stderr.contains("rank 1 never arrived at all_reduce #12 of group 0 (rank 0 waits in it)"),
        "{stderr}"
    );
    assert!(stderr.contains("stallscope: the job resumed"), "{stderr}");
}

#[test]
fn a_rank_stuck_in_its_data_loading_is_told_apart() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (s, stderr) = run_hanging(dir.path(), SLOW_DATASET, &[]);
    let h = the_hang(&s, &stderr);
    assert_eq!(h["ranks"][0]["state"], "data_loading", "{h:#}");
    assert!(h["collective"].is_null(), "{h:#}");
    let stack = h["stacks"]["0"].as_str().unwrap_or_default();
    assert!(stack.contains("__getitem__"), "{h:#}");
    assert!(stderr.contains("stuck in data loading"), "{stderr}");
}

#[test]
fn a_rank_stuck_in_its_data_loading_is_missing_and_not_in_a_collective() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_stallscope");
    let launch = [bin, "launch", "--nproc-per-node", "2", "--master-port"];
    let launch: Vec<&str> = launch.into_iter().chain(["29593", "--"]).collect();
    let (s, stderr) = run_hanging(dir.path(), LOADER_STUCK_RANK, &launch);
    let h = the_hang(&s, &stderr);
    assert_eq!(h["missing_ranks"], serde_json::json!([1]), "{h:#}");
    assert_eq!(h["waiting_ranks"], serde_json::json!([0]), "{h:#}");
    assert_eq!(h["ranks"][0]["state"], "collective", "{h:#}");
    assert_eq!(h["ranks"][1]["state"], "data_loading", "{h:#}");
    assert!(h["ranks"][1]["collective"].is_null(), "{h:#}");
    let stack = h["stacks"]["1"].as_str().unwrap_or_default();
    assert!(stack.contains("__getitem__"), "{h:#}");
    assert!(
        stderr.contains("rank 1 (pid") && stderr.contains("stuck in data loading"),
        "{stderr}"
    );
}
