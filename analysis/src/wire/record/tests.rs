//! The hand-written record codec against postcard, byte for byte.

use proptest::prelude::*;

use super::*;
use crate::frame::NodeHealth;
use crate::wire::encode_into;

fn arb_evidence() -> impl Strategy<Value = Evidence> {
    (0..Category::ALL.len(), 0..BASES.len(), any::<u64>()).prop_map(|(c, b, ns)| Evidence {
        category: Category::ALL[c],
        basis: BASES[b],
        ns,
    })
}

/// A `u64` as often small (a byte or two of varint) as huge.
fn arb_u64() -> impl Strategy<Value = u64> {
    prop_oneof![0..200u64, 0..100_000u64, any::<u64>()]
}

fn arb_reading() -> impl Strategy<Value = NvmlReading> {
    (
        ".{0,12}",
        proptest::option::of("[ -~é€]{0,48}"),
        any::<bool>(),
        proptest::option::of(any::<u32>()),
        proptest::collection::vec(proptest::option::of(arb_u64()), 6),
    )
        .prop_map(|(gpu, uuid, cuda_timed, busy_ppm, o)| NvmlReading {
            gpu,
            uuid,
            cuda_timed,
            busy_ppm,
            power_mw: o[0],
            pcie_rx_bytes: o[1],
            pcie_tx_bytes: o[2],
            nvlink_bytes: o[3],
            energy_mj: o[4],
            batch_bytes: o[5],
        })
}

fn arb_report() -> impl Strategy<Value = NodeReport> {
    (
        (
            ".{0,8}",
            any::<u32>(),
            any::<u32>(),
            arb_u64(),
            arb_u64(),
            arb_u64(),
        ),
        proptest::collection::vec(arb_u64(), 7),
        proptest::collection::vec(arb_evidence(), 0..6),
        (arb_u64(), arb_u64()),
        proptest::collection::vec((arb_u64(), arb_u64()), 0..4),
        proptest::option::of(any::<u32>()),
        proptest::option::of(arb_reading()),
    )
        .prop_map(
            |((node, rank, pid, iter, start_ns, end_ns), ns, evidence, cov, comm, world, gpu)| {
                NodeReport {
                    iteration: NodeIteration {
                        node,
                        breakdown: IterationBreakdown {
                            rank,
                            pid,
                            iter,
                            start_ns,
                            end_ns,
                            split: Split {
                                ns: ns.try_into().expect("7"),
                            },
                            evidence,
                            coverage: Coverage {
                                marked_ns: cov.0,
                                sampled_ns: cov.1,
                            },
                        },
                        comm: comm
                            .into_iter()
                            .map(|(begin, end)| CommSpan { begin, end })
                            .collect(),
                        world_size: world,
                    },
                    gpu,
                }
            },
        )
}

fn serde_record(seq: u64, frame: Frame) -> Vec<u8> {
    let mut out = vec![9u8];
    encode_into(&AgentMsg::Record { seq, frame }, &mut out);
    out
}

/// What postcard reads of a payload, as comparable values.
fn postcard_take(payload: &[u8]) -> Option<(AgentMsg, usize)> {
    postcard::take_from_bytes::<AgentMsg>(payload)
        .ok()
        .map(|(m, rest)| (m, rest.len()))
}

#[test]
fn every_basis_and_category_is_numbered_as_serde_numbers_it() {
    for (i, b) in BASES.iter().enumerate() {
        assert_eq!(basis_index(*b) as usize, i, "{b:?}");
        assert_eq!(postcard::to_allocvec(b).unwrap(), vec![i as u8], "{b:?}");
    }
    for (i, c) in Category::ALL.iter().enumerate() {
        assert_eq!(c.index(), i);
        assert_eq!(postcard::to_allocvec(c).unwrap(), vec![i as u8], "{c:?}");
    }
    // One past the last is no variant.
    assert!(postcard::from_bytes::<Basis>(&[BASES.len() as u8]).is_err());
    assert!(postcard::from_bytes::<Category>(&[Category::ALL.len() as u8]).is_err());
}

#[test]
fn the_variant_numbers_are_serdes() {
    let report = NodeReport {
        iteration: NodeIteration {
            node: String::new(),
            breakdown: IterationBreakdown {
                rank: 0,
                pid: 0,
                iter: 0,
                start_ns: 0,
                end_ns: 0,
                split: Split::default(),
                evidence: vec![],
                coverage: Coverage::default(),
            },
            comm: vec![],
            world_size: None,
        },
        gpu: None,
    };
    let msg = AgentMsg::Record {
        seq: 0,
        frame: Frame::NodeReport(Box::new(report)),
    };
    let bytes = postcard::to_allocvec(&msg).unwrap();
    assert_eq!(bytes[..3], [RECORD as u8, 0, NODE_REPORT as u8]);
}

#[test]
fn other_frames_are_postcards_too() {
    let frame = Frame::NodeHealth(NodeHealth {
        node: "n".into(),
        records_dropped: 300,
        ..NodeHealth::default()
    });
    let mut out = vec![9u8];
    encode_record(1 << 40, &frame, &mut out);
    assert_eq!(out, serde_record(1 << 40, frame));
    let (msg, rest) = take_agent_msg(&out[5..]).unwrap();
    assert!(rest.is_empty());
    assert_eq!(Some((msg, 0)), postcard_take(&out[5..]));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn a_report_record_is_postcards_bytes_and_reads_back(
        seq in arb_u64(),
        report in arb_report(),
        tail in proptest::collection::vec(any::<u8>(), 0..4),
    ) {
        let frame = Frame::NodeReport(Box::new(report));
        let mut out = vec![9u8];
        encode_record(seq, &frame, &mut out);
        prop_assert_eq!(&out, &serde_record(seq, frame.clone()));
        let mut payload = out[5..].to_vec();
        payload.extend_from_slice(&tail);
        let (msg, rest) = take_report_record(&payload).expect("read by hand");
        prop_assert_eq!(rest, &tail[..]);
        prop_assert_eq!(&msg, &AgentMsg::Record { seq, frame });
        prop_assert_eq!(Some((msg, tail.len())), postcard_take(&payload));
    }

    /// Damaged bytes: what the hand reading takes, postcard takes alike; and the reading as a
    /// whole (postcard where the hand reading gives up) is postcard's, accepted or refused.
    #[test]
    fn damaged_records_read_as_postcard_reads_them(
        report in arb_report(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let mut out = Vec::new();
        encode_record(7, &Frame::NodeReport(Box::new(report)), &mut out);
        let mut payload = out[4..].to_vec();
        for (at, byte) in edits {
            let i = at.index(payload.len());
            payload[i] = byte;
        }
        if truncate {
            payload.truncate(cut.index(payload.len()));
        }
        let want = postcard_take(&payload);
        if let Some((msg, rest)) = take_report_record(&payload) {
            prop_assert_eq!(Some((msg, rest.len())), want.clone());
        }
        let got = take_agent_msg(&payload).ok().map(|(m, rest)| (m, rest.len()));
        prop_assert_eq!(got, want);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// A varint read by hand, from one word or byte by byte, is postcard's: the same value and
    /// bytes left, or refused alike (too long, a last byte too large, bytes missing).
    #[test]
    fn varints_read_as_postcard_reads_them(
        bytes in proptest::collection::vec(
            prop_oneof![any::<u8>(), 0x80..=0xffu8, 0..=0x7fu8, Just(0x0f), Just(0x10), Just(1), Just(2)],
            0..14,
        ),
    ) {
        let mut r = Reader { rest: &bytes };
        let got = r.u64().map(|v| (v, r.rest.len()));
        let want = postcard::take_from_bytes::<u64>(&bytes).ok().map(|(v, rest)| (v, rest.len()));
        prop_assert_eq!(got, want);
        let mut r = Reader { rest: &bytes };
        let got = r.u32().map(|v| (v, r.rest.len()));
        let want = postcard::take_from_bytes::<u32>(&bytes).ok().map(|(v, rest)| (v, rest.len()));
        prop_assert_eq!(got, want);
    }

    /// A varint written by hand is postcard's.
    #[test]
    fn varints_are_written_as_postcard_writes_them(v in arb_u64()) {
        let mut out = vec![3u8];
        push_varint(&mut out, v);
        let mut want = vec![3u8];
        want.extend(postcard::to_allocvec(&v).unwrap());
        prop_assert_eq!(out, want);
    }
}
