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
    assert_eq!(s["finding"]["category"], "data_prep");
    assert_eq!(s["finding"]["rank"], 1);
}
