//! A two-stage pipeline (`examples/pipeline_sendrecv`: GPipe order, `dist.send`/`recv` over
//! gloo) whose second stage is 3× heavier, under `stallscope run` and `stallscope launch`
//! (issue 27): the first stage's wait in `recv` is waiting for its peer, not moving data, and
//! the finding speaks of stages, not of DDP.

mod common;

use common::*;

fn pipeline_example() -> String {
    repo()
        .join("examples/pipeline_sendrecv/train.py")
        .display()
        .to_string()
}

#[test]
fn the_lighter_stage_waits_for_the_heavier_one() {
    if !have_torch() {
        return;
    }
    const ITERS: u64 = 12;
    let dir = tempfile::tempdir().unwrap();
    let iters = ITERS.to_string();
    let (out, s) = run_two_launched_ranks(
        dir.path(),
        29583,
        &pipeline_example(),
        &[
            "--iters",
            &iters,
            "--micro-batches",
            "4",
            "--stage-work-ms",
            "10,30",
        ],
    );
    let log = String::from_utf8_lossy(&out.stdout);
    assert!(log.contains("pipeline: 12 iterations"), "{log}");
    let ranks = s["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 2, "{s:#}");
    let warmup = s["warmup_iterations"].as_u64().unwrap();
    for r in ranks {
        assert_eq!(r["iterations"].as_u64(), Some(ITERS - warmup), "{s:#}");
    }
    for r in ranks {
        // Each rank sends and receives once per micro-batch, 16 kB of activations or
        // gradients (32 samples × 128 float32), the receive the one it waits in.
        for op in ["send", "recv"] {
            let c = r["collectives"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["op"] == op)
                .unwrap_or_else(|| panic!("no {op}: {s:#}"));
            assert_eq!(c["role"], "pipeline", "{s:#}");
            let count = c["count_per_iteration"].as_f64().unwrap();
            // A datagram dropped on a loaded machine loses one span of 44.
            assert!((3.5..=4.0).contains(&count), "{s:#}");
            let bytes = c["bytes_per_iteration"].as_f64().unwrap();
            assert!((bytes - count * 16_384.0).abs() < 1.0, "{s:#}");
        }
    }
    let share = |r: usize, c: &str| ranks[r]["categories"][c]["fraction"].as_f64().unwrap();
    // Stage 0 works 40 ms of stage 1's 120 per iteration: ideally it waits 2/3 of its time.
    assert!(share(0, "peer_wait") > 0.3, "{s:#}");
    assert!(
        share(0, "peer_wait") > share(0, "interconnect"),
        "rank 0's wait is for its peer, not the transfer: {s:#}"
    );
    assert!(share(1, "peer_wait") < share(0, "peer_wait"), "{s:#}");
    let f = &s["finding"];
    assert_eq!(f["category"], "peer_wait", "{s:#}");
    assert_eq!(f["rank"], 1, "the slowest stage: {s:#}");
    let sentence = f["sentence"].as_str().unwrap();
    let suggestion = f["suggestion"].as_str().unwrap();
    assert!(
        sentence.contains("rank 0 (pipeline stage 0)") && sentence.contains("stage 1 (rank 1)"),
        "{sentence}"
    );
    assert!(
        suggestion.contains("per micro-batch from stage 1"),
        "{suggestion}"
    );
    for text in [sentence, suggestion] {
        assert!(!text.contains("no_sync") && !text.contains("DDP"), "{text}");
    }
}
