//! Jobs stallscope did not write (issue 27): PyTorch's own tensor-parallel example, its
//! pipelining tutorial and its FSDP1 tutorial (`profiler/tests/fixtures`, changed only to run
//! on the CPU; the fixtures' README lists each change), under `stallscope run -- torchrun …`
//! and `stallscope run -- python …`: iterations are counted exactly, each parallelism's
//! operations are listed with their role and bytes, the waiting stage of a pipeline is peer
//! wait, and no advice speaks of DDP. They need torch 2.x (`STALLSCOPE_TEST_PYTHON`): Debian's
//! torch 1.13 has no DTensor tensor parallelism and no `torch.distributed.pipelining`, and its
//! `torch.distributed.fsdp` does not import under Python 3.11; there they return at once.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::*;
use serde_json::Value;

fn fixture(path: &str) -> String {
    repo()
        .join("profiler/tests/fixtures")
        .join(path)
        .display()
        .to_string()
}

/// Whether the test's Python has torch 2.x; says why not when it has torch 1.x.
fn torch2(test: &str) -> bool {
    if !have_torch() {
        return false;
    }
    let out = Command::new(python())
        .args(["-c", "import torch; print(torch.__version__)"])
        .output()
        .expect("python runs");
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if version.starts_with("1.") {
        // Not a skip: the APIs these jobs use do not exist there; CI runs them on torch 2.x.
        eprintln!(
            "{test}: {} has torch {version}, without it: nothing to test (set STALLSCOPE_TEST_PYTHON to a torch 2.x Python)",
            python()
        );
        return false;
    }
    true
}

/// `stallscope run -q -o DIR/p.stallscope --summary-json DIR/s.json -- COMMAND…` in `dir`, with
/// `env`; it must succeed. Returns its output and summary.
fn run_under_stallscope(dir: &Path, env: &[(&str, &str)], command: &[&str]) -> (Output, Value) {
    let summary = dir.join("s.json");
    let mut cmd = stallscope();
    cmd.current_dir(dir)
        .args(["run", "-q", "-o"])
        .arg(dir.join("p.stallscope"))
        .arg("--summary-json")
        .arg(&summary)
        .arg("--")
        .args(command)
        .envs(env.iter().copied());
    let out = run_ok(&mut cmd);
    (out, read_json(&summary))
}

/// `python -m torch.distributed.run --nproc-per-node 2 --master-port PORT SCRIPT` (torchrun).
fn torchrun(port: &str, script: &str) -> Vec<String> {
    [
        &python(),
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        port,
        script,
    ]
    .map(String::from)
    .to_vec()
}

/// Markers the summary says were lost: a datagram dropped on a loaded machine loses one step
/// or one operation's span, and the figures below are exact without drops.
fn dropped(s: &Value) -> u64 {
    s["markers"]["dropped"].as_u64().unwrap()
}

/// Asserts each rank counted `iters` less the warm-up iterations, exactly unless markers were
/// lost.
fn assert_counted(s: &Value, iters: u64) {
    let ranks = s["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 2, "{s:#}");
    let want = iters - s["warmup_iterations"].as_u64().unwrap();
    let lost = dropped(s);
    for r in ranks {
        let counted = r["iterations"].as_u64().unwrap();
        assert!(
            counted == want || (lost > 0 && counted < want && counted + lost >= want),
            "{counted} iterations of {want}, {lost} markers lost: {s:#}"
        );
    }
}

fn ops<'a>(rank: &'a Value, part: &str) -> Vec<&'a Value> {
    rank["collectives"]
        .as_array()
        .expect("collectives listed")
        .iter()
        .filter(|c| c["op"].as_str().unwrap().contains(part))
        .collect()
}

fn assert_no_ddp_advice(s: &Value) {
    for key in ["sentence", "suggestion"] {
        let text = s["finding"][key].as_str().unwrap();
        assert!(!text.contains("no_sync") && !text.contains("DDP"), "{text}");
    }
}

#[test]
fn pytorchs_tensor_parallel_example_is_told_as_tensor_parallel() {
    if !torch2("tensor parallel") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = fixture("pytorch_examples/tensor_parallel_example.py");
    let command = torchrun("29601", &script);
    let command: Vec<&str> = command.iter().map(String::as_str).collect();
    let (out, s) = run_under_stallscope(dir.path(), &[], &command);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("Tensor Parallel training completed!"), "{log}");
    // The example trains 10 iterations.
    assert_counted(&s, 10);
    let exact = dropped(&s) == 0;
    for r in s["ranks"].as_array().unwrap() {
        // DTensor's RowwiseParallel sums the second layer's partial outputs, 20 × 5 float32,
        // with one all-reduce per iteration (the input needs no gradient: no backward one).
        let reduces = ops(r, "all_reduce");
        assert_eq!(reduces.len(), 1, "{s:#}");
        let c = reduces[0];
        assert_eq!(c["role"], "tensor_parallel", "{s:#}");
        if exact {
            assert_eq!(c["count_per_iteration"].as_f64(), Some(1.0), "{s:#}");
            assert_eq!(c["bytes_per_iteration"].as_f64(), Some(400.0), "{s:#}");
        }
        let (t, w) = (
            c["seconds_per_iteration"].as_f64().unwrap(),
            c["waited_seconds_per_iteration"].as_f64().unwrap(),
        );
        assert!(t > 0.0 && (0.0..=t).contains(&w), "{c:#}");
    }
    // The toy model computes almost nothing: its all-reduce is the largest stall, and the
    // finding is tensor parallelism's.
    let f = &s["finding"];
    let sentence = f["sentence"].as_str().unwrap();
    assert!(
        sentence.contains("tensor parallelism's exposed communication"),
        "{s:#}"
    );
    // No GPU here: the advice is for TP between CPU processes, not NVLink domains.
    let suggestion = f["suggestion"].as_str().unwrap();
    assert!(
        suggestion.contains("on the CPU") && suggestion.contains("smaller TP degree"),
        "{s:#}"
    );
    assert!(!suggestion.contains("fast-link domain"), "{s:#}");
    assert_no_ddp_advice(&s);
}

#[test]
fn pytorchs_pipelining_tutorial_with_a_heavier_stage_is_told_in_stages() {
    if !torch2("pipelining") {
        return;
    }
    const ITERS: u64 = 10;
    let dir = tempfile::tempdir().unwrap();
    let script = fixture("pytorch_tutorials/pipelining_tutorial.py");
    let command = torchrun("29602", &script);
    let command: Vec<&str> = command.iter().map(String::as_str).collect();
    // Stage 0 keeps 1 of the 8 decoder layers; stage 1 the other 7, the norm and the output.
    let iters = ITERS.to_string();
    let env = [("ITERS", iters.as_str()), ("STAGE0_LAYERS", "1")];
    let (out, s) = run_under_stallscope(dir.path(), &env, &command);
    let log = String::from_utf8_lossy(&out.stdout);
    assert_eq!(log.matches("losses: [").count(), ITERS as usize, "{log}");
    assert_counted(&s, ITERS);
    let ranks = s["ranks"].as_array().unwrap();
    let exact = dropped(&s) == 0;
    for r in ranks {
        // GPipe over 4 micro-batches: each stage posts one batch of sends or receives per
        // micro-batch forward and one backward, each 2 sequences × 32 tokens × 64 float32.
        let batches = ops(r, "batch_isend_irecv");
        assert_eq!(batches.len(), 1, "{s:#}");
        let c = batches[0];
        assert_eq!(c["role"], "pipeline", "{s:#}");
        if exact {
            assert_eq!(c["count_per_iteration"].as_f64(), Some(8.0), "{s:#}");
            assert_eq!(
                c["bytes_per_iteration"].as_f64(),
                Some(8.0 * 16_384.0),
                "{s:#}"
            );
        }
    }
    let share = |r: usize, c: &str| ranks[r]["categories"][c]["fraction"].as_f64().unwrap();
    assert!(share(0, "peer_wait") > 0.3, "{s:#}");
    assert!(
        share(0, "peer_wait") > share(0, "interconnect"),
        "stage 0 waits for stage 1, it does not move data: {s:#}"
    );
    assert!(share(1, "peer_wait") < share(0, "peer_wait"), "{s:#}");
    let f = &s["finding"];
    assert_eq!(f["category"], "peer_wait", "{s:#}");
    assert_eq!(f["rank"], 1, "the slowest stage: {s:#}");
    let sentence = f["sentence"].as_str().unwrap();
    assert!(
        sentence.contains("rank 0 (pipeline stage 0)") && sentence.contains("stage 1 (rank 1)"),
        "{sentence}"
    );
    assert!(
        f["suggestion"].as_str().unwrap().contains("from stage 1"),
        "{s:#}"
    );
    assert_no_ddp_advice(&s);
}

/// The FSDP1 tutorial's `Net`: two convolutions and two linear layers, float32.
const FSDP1_NET_PARAMETERS: u64 = (32 * 9 + 32)     // conv1: 1 → 32 channels, 3 × 3
    + (64 * 32 * 9 + 64)                            // conv2: 32 → 64 channels, 3 × 3
    + (128 * 9216 + 128)                            // fc1: 9216 → 128
    + (10 * 128 + 10); // fc2: 128 → 10

#[test]
fn pytorchs_fsdp1_tutorial_lists_its_all_gathers_and_reduce_scatters_with_their_bytes() {
    if !torch2("FSDP1") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = fixture("pytorch_tutorials/FSDP_mnist.py");
    // 1280 samples over 2 ranks in batches of 64: 10 iterations per rank.
    let py = python();
    let command = [
        py.as_str(),
        &script,
        "--epochs",
        "1",
        "--batch-size",
        "64",
        "--train-samples",
        "1280",
        "--test-samples",
        "256",
    ];
    let (out, s) = run_under_stallscope(dir.path(), &[("MASTER_PORT", "29603")], &command);
    let log = String::from_utf8_lossy(&out.stdout);
    assert!(log.contains("Train Epoch: 1"), "{log}");
    assert_counted(&s, 10);
    // FSDP(model) wraps the whole model as one flat parameter, an even number of elements
    // (no padding for 2 ranks): it is all-gathered whole once per iteration (the root keeps
    // it unsharded from forward to backward) and its gradient reduce-scattered whole once.
    let model_bytes = (FSDP1_NET_PARAMETERS * 4) as f64;
    assert_eq!(model_bytes, 4_799_528.0);
    let exact = dropped(&s) == 0;
    for r in s["ranks"].as_array().unwrap() {
        for part in ["gather", "scatter"] {
            let found = ops(r, part);
            assert_eq!(found.len(), 1, "{part}: {s:#}");
            let c = found[0];
            assert_eq!(c["role"], "fsdp", "{s:#}");
            if exact {
                assert_eq!(c["count_per_iteration"].as_f64(), Some(1.0), "{s:#}");
                assert_eq!(
                    c["bytes_per_iteration"].as_f64(),
                    Some(model_bytes),
                    "{s:#}"
                );
            }
        }
    }
    assert_no_ddp_advice(&s);
}
