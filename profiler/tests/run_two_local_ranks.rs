//! Two local ranks (its own test binary, so it does not share the 2 cores with the other
//! trainings of the suite).

mod common;

use common::*;

/// Two local ranks, rank 1 slowed by its data preparation: rank 1 shows data_prep, rank 0
/// waits for it at the collectives (peer_wait), and the finding names the cause on rank 1.
#[test]
fn a_slow_rank_shows_as_peer_wait_on_the_other() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_, s) = run_example(
        dir.path(),
        &[],
        &[
            "--nproc",
            "2",
            "--port",
            "29571",
            "--iters",
            "10",
            "--workers",
            "0",
            "--batch",
            "8",
            "--images",
            "64",
            "--data-delay-ms",
            "1:30",
        ],
    );
    let ranks = s["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 2, "{s:#}");
    let share = |r: usize, c: &str| ranks[r]["categories"][c]["fraction"].as_f64().unwrap();
    assert!(share(0, "peer_wait") > 0.4, "{s:#}");
    assert!(share(1, "data_prep") > 0.4, "{s:#}");
    assert!(share(1, "peer_wait") < 0.1, "{s:#}");
    // DDP's exposed all-reduce, one per backward, is listed as such; rank 0's is mostly
    // waiting for rank 1.
    for r in ranks {
        let ddp = r["collectives"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["group"] == "ddp")
            .unwrap_or_else(|| panic!("no DDP all-reduce: {s:#}"));
        assert_eq!(
            (&ddp["op"], &ddp["role"]),
            (&"all_reduce".into(), &"data_parallel".into())
        );
        assert!(ddp["count_per_iteration"].as_f64().unwrap() >= 0.9, "{s:#}");
        assert!(ddp["bytes_per_iteration"].as_f64().unwrap() > 0.0, "{s:#}");
    }
    let waited = ranks[0]["collectives"][0]["waited_seconds_per_iteration"].as_f64();
    assert!(waited > Some(0.0), "{s:#}");
    assert_eq!(s["finding"]["category"], "data_prep");
    assert_eq!(s["finding"]["rank"], 1);
}
