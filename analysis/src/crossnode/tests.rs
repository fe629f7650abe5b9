use super::*;
use crate::attribution::{Basis, Coverage, Evidence};
use crate::category::Split;
use crate::frame::CommSpan;

const MS: u64 = 1_000_000;

/// A 100 ms iteration ending at `end` (node clock) of which the last `comm` ms were an
/// exposed collective the node counted as network, and the rest compute.
fn report(node: &str, rank: u32, iter: u64, end: Nanos, comm: u64) -> NodeIteration {
    let start = end - 100 * MS;
    let mut split = Split::default();
    split.add(Category::Compute, (100 - comm) * MS);
    split.add(Category::Network, comm * MS);
    NodeIteration {
        node: node.into(),
        breakdown: IterationBreakdown {
            rank,
            pid: 100 + rank,
            iter,
            start_ns: start,
            end_ns: end,
            split,
            evidence: vec![
                Evidence {
                    category: Category::Compute,
                    basis: Basis::CounterBusy,
                    ns: (100 - comm) * MS,
                },
                Evidence {
                    category: Category::Network,
                    basis: Basis::CommNicBytes,
                    ns: comm * MS,
                },
            ],
            coverage: Coverage::default(),
        },
        comm: vec![CommSpan {
            begin: end - comm * MS,
            end,
        }],
        world_size: Some(2),
    }
}

fn clock(node: &str, offset_ms: i64) -> NodeClock {
    NodeClock {
        node: node.into(),
        offset_ns: offset_ms * MS as i64,
        uncertainty_ns: 100_000,
        samples: 8,
        ..NodeClock::default()
    }
}

#[test]
fn the_early_rank_waits_for_the_late_one_across_nodes_despite_clock_offsets() {
    let mut j = CrossNode::default();
    // Node b's clock runs 50 ms ahead of the collector's; a's agrees with it.
    j.clock(&clock("a", 0));
    j.clock(&clock("b", 50));
    // Both end the collective at collector time 1000 ms; rank 0 (node a) began it 60 ms
    // before, rank 1 (node b) 10 ms before: rank 0 waited 50 ms for rank 1.
    j.report(&report("a", 0, 5, 1000 * MS, 60));
    assert!(j.join_ready(0, false).is_empty(), "rank 1 has not reported");
    j.report(&report("b", 1, 5, 1050 * MS, 10));
    let out = j.join_ready(0, false);
    assert_eq!(out.len(), 2);
    let r0 = out.iter().find(|b| b.rank == 0).unwrap();
    let r1 = out.iter().find(|b| b.rank == 1).unwrap();
    assert_eq!(r0.split.get(Category::PeerWait), 50 * MS);
    assert_eq!(r0.split.get(Category::Network), 10 * MS);
    assert_eq!(r0.split.total(), 100 * MS);
    assert_eq!(r1.split.get(Category::PeerWait), 0);
    assert_eq!(r1.split.get(Category::Network), 10 * MS);
    assert_eq!(r1.end_ns, 1000 * MS, "times are on the collector's clock");
}

/// `report`, as a GPU-timed rank: the exposed all-reduce its GPU saw (`comm` ms, which the
/// node counted as network) and a CPU-side span that says only when it was queued.
fn gpu_report(node: &str, rank: u32, iter: u64, end: Nanos, comm: u64) -> NodeIteration {
    let mut r = report(node, rank, iter, end, comm);
    r.breakdown.evidence[1].basis = Basis::GpuExposedComm;
    r.breakdown.evidence[0].basis = Basis::GpuWork;
    r.comm = vec![CommSpan {
        begin: end - 90 * MS,
        end: end - 89 * MS,
    }];
    r
}

#[test]
fn gpu_timed_ranks_wait_for_the_one_whose_gpu_saw_the_least_all_reduce() {
    let mut j = CrossNode::default();
    j.clock(&clock("a", 0));
    j.clock(&clock("b", 50));
    for iter in 0..10 {
        let end = (iter + 1) * 200 * MS;
        j.report(&gpu_report("a", 0, iter, end, 45));
        j.report(&gpu_report("b", 1, iter, end + 50 * MS, 5));
    }
    let out = j.join_ready(0, false);
    assert_eq!(out.len(), 20);
    let r0 = out.iter().find(|b| b.rank == 0).unwrap();
    let r1 = out.iter().find(|b| b.rank == 1).unwrap();
    assert_eq!(r0.split.get(Category::PeerWait), 40 * MS);
    assert_eq!(r0.split.get(Category::Network), 5 * MS);
    assert_eq!(r0.split.total(), 100 * MS);
    assert_eq!(r1.split.get(Category::PeerWait), 0);
    assert_eq!(r1.split.get(Category::Network), 5 * MS);
    let s = j.stragglers();
    assert_eq!(s.len(), 1, "{s:?}");
    assert_eq!((s[0].rank, s[0].node.as_str()), (1, "b"));
    assert!((s[0].held_seconds - 0.4).abs() < 1e-9, "{s:?}");
}

#[test]
fn a_report_sent_again_after_a_reconnect_is_not_counted_twice() {
    let mut j = CrossNode::default();
    j.report(&report("a", 0, 1, 1000 * MS, 10));
    j.report(&report("b", 1, 1, 1000 * MS, 10));
    assert_eq!(j.join_ready(0, false).len(), 2);
    j.report(&report("a", 0, 1, 1000 * MS, 10));
    assert!(j.join_ready(u64::MAX, true).is_empty());
}

#[test]
fn the_rank_that_keeps_the_others_waiting_is_named_per_window() {
    let mut j = CrossNode::default();
    for iter in 0..20 {
        let end = (iter + 1) * 200 * MS;
        // In the first window rank 1 arrives 40 ms late; in the second nobody is late.
        let (c0, c1) = if iter < 10 { (50, 10) } else { (10, 10) };
        j.report(&report("a", 0, iter, end, c0));
        j.report(&report("b", 1, iter, end, c1));
    }
    j.join_ready(0, true);
    let s = j.stragglers();
    assert_eq!(s.len(), 1, "{s:?}");
    assert_eq!((s[0].rank, s[0].node.as_str()), (1, "b"));
    assert_eq!((s[0].first_iter, s[0].last_iter), (0, 9));
    assert!((s[0].held_seconds - 0.4).abs() < 1e-9, "{s:?}");
    assert!((s[0].others_wait_fraction - 0.4).abs() < 1e-9, "{s:?}");
}

#[test]
fn a_rank_that_never_reports_does_not_hold_the_join_forever() {
    let mut j = CrossNode::default();
    j.report(&report("a", 0, 3, 1000 * MS, 10));
    j.report(&report("b", 1, 2, 800 * MS, 10));
    assert!(
        j.join_ready(2000 * MS, false).is_empty(),
        "within the patience"
    );
    let late = j.join_ready(1000 * MS + JOIN_PATIENCE_NS + 1, false);
    assert_eq!(
        late.len(),
        2,
        "both iterations, each without the missing rank"
    );
}

#[test]
fn a_long_job_keeps_the_join_bounded_and_its_straggler_windows() {
    const ITERS: u64 = 50_000;
    const FIRST: u64 = 5;
    let mut j = CrossNode::default();
    j.set_first_iter(FIRST);
    let late = |iter: u64| iter >= FIRST && ((iter - FIRST) / WINDOW_ITERS) % 3 == 0;
    let mut most = 0;
    for iter in 0..ITERS {
        let end = (iter + 1) * 200 * MS;
        // Every third window rank 1 arrives 40 ms late; otherwise nobody is late.
        let (c0, c1) = if late(iter) { (50, 10) } else { (10, 10) };
        j.report(&report("a", 0, iter, end, c0));
        j.report(&report("b", 1, iter, end, c1));
        assert_eq!(j.join_ready(end, false).len(), 2);
        most = most.max(j.held());
    }
    // Two ranks' remembered joins plus the open windows' entries (4 per window).
    let bound = 2 + 4 * (WINDOW_CLOSE_LAG_ITERS / WINDOW_ITERS + 2) as usize;
    assert!(most <= bound, "{most} > {bound}");
    // A report sent again, old or recent, is still dropped.
    j.report(&report("a", 0, 7, 1000 * MS, 10));
    j.report(&report("b", 1, ITERS - 1, 1000 * MS, 10));
    assert!(j.join_ready(u64::MAX, true).is_empty());
    let s = j.stragglers();
    let windows = (ITERS - FIRST).div_ceil(WINDOW_ITERS);
    assert_eq!(s.len() as u64, windows.div_ceil(3), "{:?}", &s[..3]);
    for (k, w) in s.iter().enumerate() {
        let first = FIRST + 3 * k as u64 * WINDOW_ITERS;
        assert_eq!(
            (w.first_iter, w.last_iter),
            (first, first + WINDOW_ITERS - 1)
        );
        assert_eq!((w.rank, w.node.as_str()), (1, "b"));
        assert!((w.held_seconds - 0.4).abs() < 1e-9, "{w:?}");
        assert!((w.others_wait_fraction - 0.4).abs() < 1e-9, "{w:?}");
    }
}

/// Issue 17, item 7: a collective the node saw moving over the GPU's own links (NVLink) is
/// split again like any other: the wait for the late rank comes out of it.
#[test]
fn a_collective_over_gpu_links_is_split_again_too() {
    let mut j = CrossNode::default();
    j.clock(&clock("a", 0));
    j.clock(&clock("b", 0));
    let mut r0 = report("a", 0, 5, 1000 * MS, 30);
    let b = &mut r0.breakdown;
    b.split = Split::default();
    b.split.add(Category::Compute, 70 * MS);
    b.split.add(Category::Interconnect, 30 * MS);
    b.evidence[1] = Evidence {
        category: Category::Interconnect,
        basis: Basis::CommGpuLinkBytes,
        ns: 30 * MS,
    };
    j.report(&r0);
    // Rank 1 began the collective 20 ms after rank 0.
    j.report(&report("b", 1, 5, 1000 * MS, 10));
    let out = j.join_ready(0, false);
    let r0 = out.iter().find(|b| b.rank == 0).unwrap();
    assert_eq!(r0.split.get(Category::PeerWait), 20 * MS);
    assert_eq!(r0.split.get(Category::Interconnect), 10 * MS);
    assert_eq!(r0.split.total(), 100 * MS);
}

/// Issue 17, item 8: two nodes whose loops never said their rank both report "rank 0"; the
/// join keeps the first node's, refuses the other's, and says so, instead of silently
/// dropping or mixing them.
#[test]
fn two_nodes_reporting_one_rank_are_refused_and_said() {
    let mut j = CrossNode::default();
    j.clock(&clock("a", 0));
    j.clock(&clock("b", 0));
    for iter in 0..3 {
        j.report(&report("a", 0, iter, (iter + 1) * 100 * MS, 10));
        assert!(!j.report(&report("b", 0, iter, (iter + 1) * 100 * MS, 10)));
    }
    assert_eq!(j.rank_nodes[&0], "a", "the first node keeps the rank");
    let out = j.join_ready(u64::MAX, true);
    assert_eq!(out.len(), 3, "node a's iterations, once each");
    // After the join too.
    assert!(!j.report(&report("b", 0, 1, 200 * MS, 10)));
    let said = j.rank_clashes();
    assert_eq!(said.len(), 1);
    assert!(
        said[0].contains("rank 0 was reported by a and b"),
        "{}",
        said[0]
    );
    assert!(
        said[0].contains("4 reports of b were refused"),
        "{}",
        said[0]
    );
    // A rank that moves to another node (an elastic restart) with new iterations is no clash.
    assert!(j.report(&report("b", 0, 7, 800 * MS, 10)));
    assert_eq!(j.rank_nodes[&0], "b");
}

/// The join takes an iteration's reports in the order they came: whatever that order, the
/// same breakdowns, in the same order, and the same stragglers (a run of iterations of
/// many ranks on three nodes, reported rank by rank and in a shuffled order).
#[test]
fn the_order_reports_come_in_changes_nothing_joined() {
    let run = |order: &dyn Fn(u64) -> Vec<u32>| {
        let mut j = CrossNode::default();
        j.clock(&clock("a", 0));
        j.clock(&clock("b", 7));
        j.clock(&clock("c", -3));
        let mut out = Vec::new();
        for iter in 0..40u64 {
            for rank in order(iter) {
                let node = ["a", "b", "c"][rank as usize % 3];
                let end = (1_000 + iter * 100) * MS + u64::from(rank) * 13_000;
                // Ranks 4 and 9 come late to the collective on some iterations.
                let comm = 10 + (u64::from(rank) * 7 + iter * 3) % 40;
                let mut r = report(node, rank, iter, end, comm);
                r.world_size = Some(12);
                if rank == 4 && iter % 3 == 0 || rank == 9 && iter % 5 == 1 {
                    r.comm[0].begin = end - MS;
                }
                j.report(&r);
            }
            out.extend(j.join_ready(0, false));
        }
        out.extend(j.join_ready(0, true));
        (out, j.stragglers())
    };
    let in_order = run(&|_| (0..12).collect());
    let shuffled = run(&|iter| {
        let mut ranks: Vec<u32> = (0..12).collect();
        let mut seed = iter.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        for i in (1..ranks.len()).rev() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            ranks.swap(i, (seed % (i as u64 + 1)) as usize);
        }
        ranks
    });
    assert_eq!(in_order.0.len(), 12 * 40);
    assert_eq!(in_order.0, shuffled.0);
    assert_eq!(in_order.1, shuffled.1);
    assert!(!in_order.1.is_empty(), "some window names a straggler");
}

/// Items come out in the order of their keys, for items already in order and for shuffled
/// ones.
#[test]
fn items_are_put_in_the_order_of_their_keys() {
    let mut state = 7u64;
    let mut keys: Vec<u64> = (0..500u64).collect();
    for i in (1..keys.len()).rev() {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        keys.swap(i, (state >> 33) as usize % (i + 1));
    }
    let mut items: Vec<(u64, String)> = keys.iter().map(|k| (*k, format!("item {k}"))).collect();
    sort_by_unique_key(&mut items, |x| x.0);
    let expected: Vec<(u64, String)> = (0..500u64).map(|k| (k, format!("item {k}"))).collect();
    assert_eq!(items, expected);
    sort_by_unique_key(&mut items, |x| x.0);
    assert_eq!(items, expected, "in order already");
}

/// A round's breakdowns come by iteration, then rank, whatever order the ranks reported in.
#[test]
fn joined_breakdowns_come_by_iteration_then_rank() {
    let mut c = CrossNode::default();
    for iter in 0..3u64 {
        for rank in [5u32, 0, 3, 1, 4, 2] {
            let node = if rank % 2 == 0 { "a" } else { "b" };
            let end = 1_000 * MS + iter * 100 * MS + u64::from(7 - rank) * MS;
            assert!(c.report(&report(node, rank, iter, end, 10)));
        }
    }
    let out = c.join_ready(10_000 * MS, false);
    let order: Vec<(u64, u32)> = out.iter().map(|b| (b.iter, b.rank)).collect();
    let expected: Vec<(u64, u32)> = (0..3u64)
        .flat_map(|i| (0..6u32).map(move |r| (i, r)))
        .collect();
    assert_eq!(order, expected);
}

/// With a round limit, a backlog of ready iterations is joined a few whole iterations per
/// call, oldest first, and at least one iteration even when it alone exceeds the limit; the
/// breakdowns are those one unlimited call gives, and finishing joins everything.
#[test]
fn a_limited_round_joins_a_backlog_over_several_calls() {
    let feed = |j: &mut CrossNode| {
        for iter in 0..5u64 {
            for (node, rank) in [("a", 0u32), ("b", 1), ("b", 2)] {
                j.report(&report(node, rank, iter, 1000 * MS + iter * 100 * MS, 10));
            }
        }
        // A sixth iteration only rank 0 reported: finishing joins it.
        j.report(&report("a", 0, 5, 1500 * MS, 10));
    };
    let mut unlimited = CrossNode::default();
    feed(&mut unlimited);
    let all = unlimited.join_ready(0, false);
    assert_eq!(all.len(), 15);

    let mut limited = CrossNode::default();
    limited.limit_rounds(7);
    feed(&mut limited);
    let mut rounds = Vec::new();
    let mut joined = Vec::new();
    for _ in 0..4 {
        let out = limited.join_ready(0, false);
        rounds.push(
            out.iter()
                .map(|b| b.iter)
                .collect::<std::collections::BTreeSet<_>>(),
        );
        joined.extend(out);
    }
    let sets: Vec<Vec<u64>> = rounds.iter().map(|r| r.iter().copied().collect()).collect();
    assert_eq!(sets, [vec![0, 1], vec![2, 3], vec![4], vec![]]);
    assert_eq!(joined, all, "the same breakdowns, in the same order");

    let mut one = CrossNode::default();
    one.limit_rounds(1);
    feed(&mut one);
    assert_eq!(
        one.join_ready(0, false).len(),
        3,
        "one whole iteration at least"
    );
    assert_eq!(
        one.join_ready(0, true).len(),
        13,
        "finishing joins everything"
    );
}
