//! A fully sharded job (`examples/fsdp2`: FSDP2's `fully_shard` over gloo, 2 ranks) under
//! `stallscope run` and `stallscope launch` (issue 27): the summary lists each rank's
//! all-gathers and reduce-scatters with the bytes the model's parameters imply, and no advice
//! speaks of DDP. Needs torch 2.x (`STALLSCOPE_TEST_PYTHON`); on torch 1.x, which has no FSDP2,
//! it returns at once.

mod common;

use std::process::Command;

use common::*;
use serde_json::Value;

/// The example's parameters: 4 layers of 256 × 256 weights and 256 biases, float32.
const PARAMETER_BYTES: f64 = (4 * (256 * 256 + 256) * 4) as f64;

fn fsdp_example() -> String {
    repo().join("examples/fsdp2/train.py").display().to_string()
}

/// Whether the test's torch has FSDP2; `None` (said why) when it cannot run here.
fn have_fully_shard() -> Option<()> {
    let probe = "import torch\n\
                 print(torch.__version__)\n\
                 try:\n    from torch.distributed.fsdp import fully_shard\n\
                 except ImportError:\n    from torch.distributed._composable.fsdp import fully_shard\n";
    let out = Command::new(python()).args(["-c", probe]).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    if text.starts_with("1.") {
        // Not a skip: torch 1.x has no FSDP2 at all; CI runs this test on torch 2.x too.
        eprintln!(
            "fsdp: {} has torch {}, without FSDP2: nothing to test (set STALLSCOPE_TEST_PYTHON to a torch 2.x Python)",
            python(),
            text.trim()
        );
        return None;
    }
    if !out.status.success() {
        skip(&format!(
            "{} has no torch with FSDP2's fully_shard: {}",
            python(),
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ));
        return None;
    }
    Some(())
}

fn op<'a>(rank: &'a Value, name: &str) -> &'a Value {
    rank["collectives"]
        .as_array()
        .expect("collectives listed")
        .iter()
        .find(|c| c["op"] == name)
        .unwrap_or_else(|| panic!("no {name} in {rank:#}"))
}

#[test]
fn the_all_gathers_and_reduce_scatters_are_listed_with_their_bytes() {
    if have_fully_shard().is_none() {
        return;
    }
    const ITERS: u64 = 12;
    let dir = tempfile::tempdir().unwrap();
    let iters = ITERS.to_string();
    let (out, s) = run_two_launched_ranks(dir.path(), 29593, &fsdp_example(), &["--iters", &iters]);
    let log = String::from_utf8_lossy(&out.stdout);
    assert!(log.contains("fsdp2: 12 iterations"), "{log}");
    assert!(log.contains("263168 parameters"), "{log}");
    let ranks = s["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 2, "{s:#}");
    let warmup = s["warmup_iterations"].as_u64().unwrap();
    // A datagram dropped on a loaded machine loses one operation's span: the summary counts
    // them, and the figures below are exact without drops.
    let dropped = s["markers"]["dropped"].as_u64().unwrap();
    let margin = if dropped == 0 { 1e-9 } else { 0.1 };
    let near = |got: f64, want: f64| (got - want).abs() <= margin * want;
    for r in ranks {
        // Exactly, unless a step's datagram was among those dropped.
        let counted = r["iterations"].as_u64().unwrap();
        assert!(
            counted == ITERS - warmup || (dropped > 0 && counted + dropped >= ITERS - warmup),
            "{counted} iterations of {}, {dropped} markers dropped: {s:#}",
            ITERS - warmup
        );
        // Each layer's parameters are gathered whole before its forward and again before its
        // backward (reshard_after_forward=True): twice the model per iteration, in 8 calls.
        let gather = op(r, "all_gather_into_tensor");
        assert_eq!(gather["role"], "fsdp", "{s:#}");
        assert_eq!(gather["group"], "0", "{s:#}");
        let bytes = gather["bytes_per_iteration"].as_f64().unwrap();
        assert!(near(bytes, 2.0 * PARAMETER_BYTES), "{bytes} {s:#}");
        assert!(
            near(gather["count_per_iteration"].as_f64().unwrap(), 8.0),
            "{s:#}"
        );
        // Each layer's gradients are reduce-scattered once: the whole model's, in 4 calls.
        let scatter = op(r, "reduce_scatter_tensor");
        assert_eq!(scatter["role"], "fsdp", "{s:#}");
        let bytes = scatter["bytes_per_iteration"].as_f64().unwrap();
        assert!(near(bytes, PARAMETER_BYTES), "{bytes} {s:#}");
        assert!(
            near(scatter["count_per_iteration"].as_f64().unwrap(), 4.0),
            "{s:#}"
        );
        for c in [gather, scatter] {
            let (t, w) = (
                c["seconds_per_iteration"].as_f64().unwrap(),
                c["waited_seconds_per_iteration"].as_f64().unwrap(),
            );
            assert!(t > 0.0 && (0.0..=t).contains(&w), "{c:#}");
        }
    }
    let f = &s["finding"];
    for key in ["sentence", "suggestion"] {
        let text = f[key].as_str().unwrap();
        assert!(!text.contains("no_sync") && !text.contains("DDP"), "{text}");
    }
}
