use super::*;
use stallscope_analysis::hang::Collective;

const S: Nanos = 1_000_000_000;

fn nodes(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| n.to_string()).collect()
}

fn rank(rank: u32, node: &str, state: &str, collective: Option<Collective>) -> RankAtHang {
    RankAtHang {
        rank,
        pid: 100 + rank,
        last_iteration: Some(11),
        state: state.into(),
        collective,
        has_hook: true,
        node: Some(node.into()),
    }
}

fn all_reduce_12() -> Option<Collective> {
    Some(Collective {
        op: "all_reduce".into(),
        group: 0,
        seq: 12,
    })
}

fn answer(id: u64, node: &str, ranks: Vec<RankAtHang>) -> NodeHang {
    let stacks = ranks
        .iter()
        .map(|r| {
            (
                r.rank.to_string(),
                format!("File train.py, line 9 in f{}", r.rank),
            )
        })
        .collect();
    NodeHang {
        node: node.into(),
        id,
        ranks,
        groups: BTreeMap::new(),
        world_size: Some(2),
        stacks,
    }
}

/// Two nodes, one rank each, twelve iterations of 1 s up to t = 12 s.
fn stepped() -> JobHangs {
    let mut h = JobHangs::new(Some(5 * S));
    for i in 0..12 {
        h.on_iteration("a", 0, i, S, (i + 1) * S);
        h.on_iteration("b", 1, i, S, (i + 1) * S);
    }
    h
}

#[test]
fn a_stall_is_asked_about_then_declared_with_the_missing_rank_at_its_node() {
    let mut h = stepped();
    let up = nodes(&["a", "b"]);
    assert_eq!(h.check(16 * S, 0, &up), None, "below the threshold");
    assert_eq!(h.check(17 * S, 0, &up), Some(HangAction::Ask(1)));
    assert_eq!(h.check(17 * S + 1, 0, &up), None, "answers awaited");
    h.on_answer(
        answer(1, "a", vec![rank(0, "a", "collective", all_reduce_12())]),
        17 * S + 5,
    );
    assert_eq!(h.check(17 * S + 6, 0, &up), None, "b has not answered");
    h.on_answer(
        answer(1, "b", vec![rank(1, "b", "compute_or_unknown", None)]),
        18 * S,
    );
    let Some(HangAction::Declared {
        report,
        answered_after_seconds,
    }) = h.check(18 * S, 0, &up)
    else {
        panic!("declared once both answered");
    };
    assert_eq!(answered_after_seconds, Some(1.0));
    assert_eq!(report.missing_ranks, vec![1]);
    assert_eq!(report.missing_at, vec!["1@b".to_string()]);
    assert_eq!(report.waiting_at, vec!["0@a".to_string()]);
    assert_eq!(report.collective, all_reduce_12());
    assert!(report.stacks["1"].contains("f1"), "{report:?}");
    assert_eq!(report.stalled_seconds, 6.0);
    assert_eq!(h.check(30 * S, 0, &up), None, "one hang per stall");
    h.on_iteration("b", 1, 12, S, 31 * S);
    let Some(HangAction::Resumed(r)) = h.check(31 * S, 0, &up) else {
        panic!("resumed");
    };
    assert_eq!(r.resumed_after_seconds, Some(13.0));
}

#[test]
fn a_stall_without_a_live_loop_is_no_hang_and_is_not_asked_again() {
    let mut h = stepped();
    let up = nodes(&["a", "b"]);
    assert_eq!(h.check(20 * S, 0, &up), Some(HangAction::Ask(1)));
    h.on_answer(answer(1, "a", vec![]), 20 * S);
    // A loop that destroyed its process group is ending, not hung.
    h.on_answer(
        answer(1, "b", vec![rank(1, "b", "finishing", None)]),
        20 * S,
    );
    assert_eq!(h.check(20 * S, 0, &up), None);
    assert_eq!(
        h.check(100 * S, 0, &up),
        None,
        "quiet until iterations come"
    );
}

#[test]
fn a_node_that_does_not_answer_is_named_and_its_ranks_are_unknown() {
    let mut h = stepped();
    let up = nodes(&["a", "b"]);
    assert_eq!(h.check(20 * S, 0, &up), Some(HangAction::Ask(1)));
    h.on_answer(
        answer(1, "a", vec![rank(0, "a", "data_loading", None)]),
        20 * S,
    );
    h.on_answer(
        answer(7, "b", vec![rank(1, "b", "compute_or_unknown", None)]),
        20 * S,
    );
    assert_eq!(h.check(24 * S, 0, &up), None, "the wait is not over");
    let Some(HangAction::Declared { report, .. }) = h.check(25 * S, 0, &up) else {
        panic!("declared at the end of the wait");
    };
    assert_eq!(report.unanswered_nodes, vec!["b".to_string()]);
    assert_eq!(report.ranks[0].state, "data_loading");
    assert_eq!(report.ranks[1].state, "no_answer");
    assert_eq!(report.ranks[1].node.as_deref(), Some("b"));
    assert!(report.collective.is_none());
}

#[test]
fn an_agent_resending_old_iterations_is_no_progress() {
    let mut h = stepped();
    let up = nodes(&["a"]);
    h.on_iteration("a", 0, 3, S, 16 * S);
    assert_eq!(h.check(17 * S, 0, &up), Some(HangAction::Ask(1)));
}
