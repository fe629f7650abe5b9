use super::*;
use crate::category::Split;

fn flow(class: FlowClass, local: &str, remote: &str, bytes_out: u64) -> FlowSample {
    FlowSample {
        class: Some(class),
        local: local.into(),
        remote: remote.into(),
        bytes_out,
        ..Default::default()
    }
}

fn frame(since_s: u64, t_s: u64, flows: Vec<FlowSample>) -> NodeFlows {
    NodeFlows {
        node: String::new(),
        t_ns: t_s * 1_000_000_000,
        since_ns: since_s * 1_000_000_000,
        flows,
    }
}

fn iteration(iter: u64, from_s: u64, to_s: u64, network_ns: u64) -> IterationBreakdown {
    let mut split = Split::default();
    split.add(Category::Network, network_ns);
    IterationBreakdown {
        rank: 0,
        pid: 1,
        iter,
        start_ns: from_s * 1_000_000_000,
        end_ns: to_s * 1_000_000_000,
        split,
        evidence: Vec::new(),
        coverage: Default::default(),
    }
}

/// The bulk transfer moved bytes from second 4 to 8; iterations 3–6 (seconds 3–7) waited on
/// the network: the transfer shared the link at iterations 4–6 (3 ended before it began),
/// whichever of the two arrived first.
#[test]
fn another_transfer_moving_while_collectives_waited_shared_the_link() {
    for flows_first in [true, false] {
        let mut ledger = FlowLedger::default();
        let bulk = |b| flow(FlowClass::Other, "10.0.0.1:40000", "10.0.0.2:5001", b);
        let grads = |b| flow(FlowClass::Collective, "10.0.0.1:40001", "10.0.0.2:29500", b);
        let frames = [
            frame(0, 1, vec![grads(1_000)]),
            frame(4, 5, vec![bulk(10_000_000), grads(2_000)]),
            frame(5, 8, vec![bulk(25_000_000)]),
        ];
        let iterations: Vec<_> = (1..=6)
            .map(|i| iteration(i, i, i + 1, if i >= 3 { 1 } else { 0 }))
            .collect();
        if flows_first {
            frames.iter().for_each(|f| ledger.ingest(f));
            ledger.iterations("", &iterations);
        } else {
            ledger.ingest(&frames[0]);
            ledger.iterations("", &iterations);
            frames[1..].iter().for_each(|f| ledger.ingest(f));
        }
        let shared = ledger.shared_links("node-a");
        assert_eq!(shared.len(), 1, "{shared:?}");
        assert_eq!(shared[0].iterations, (3, 6), "flows first: {flows_first}");
        assert_eq!(shared[0].bytes, 25_000_000);
        let sentence = shared_link_sentence(&shared[0]);
        assert!(
            sentence.contains("transfer of 25 MB") && sentence.contains("iterations 3–6"),
            "{sentence}"
        );
        let rows = ledger.summary("");
        assert_eq!(rows[0].class, Some(FlowClass::Other));
        assert_eq!(rows[0].bytes_out, 25_000_000);
        assert_eq!(rows[1].class, Some(FlowClass::Collective));
    }
}

/// A loopback transfer or one while no collective waited never shared the link.
#[test]
fn a_transfer_on_loopback_or_while_nothing_waited_shares_nothing() {
    let mut ledger = FlowLedger::default();
    let mut lo = flow(FlowClass::Other, "127.0.0.1:1", "127.0.0.1:2", 5_000);
    lo.loopback = true;
    ledger.ingest(&frame(0, 2, vec![lo]));
    ledger.ingest(&frame(
        20,
        21,
        vec![flow(FlowClass::Other, "a:1", "b:2", 9)],
    ));
    ledger.iterations("", &[iteration(0, 0, 2, 5), iteration(1, 20, 21, 0)]);
    assert!(ledger.shared_links("n").is_empty());
}

/// Past the listed flows, the rest are summed per class.
#[test]
fn the_largest_flows_are_listed_and_the_rest_summed_per_class() {
    let mut ledger = FlowLedger::default();
    let flows = (0..LISTED_FLOWS as u64 + 5)
        .map(|i| flow(FlowClass::Data, &format!("a:{i}"), "b:80", 100 + i))
        .collect();
    ledger.ingest(&frame(0, 1, flows));
    let rows = ledger.summary("");
    assert_eq!(rows.len(), LISTED_FLOWS + 1);
    let rest = rows.last().unwrap();
    assert_eq!(
        (rest.class, rest.flows, rest.local.as_deref()),
        (Some(FlowClass::Data), 5, None)
    );
    assert_eq!(rest.bytes_out, 100 + 101 + 102 + 103 + 104);
    assert_eq!(rows[0].bytes_out, 100 + LISTED_FLOWS as u64 + 4);
}
