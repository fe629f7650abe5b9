//! Property-based fuzzing of everything the analysis crate decodes from outside the process:
//! marker datagrams (any process on the node may send them), wire messages (any peer that
//! reaches the collector's port), profile frame payloads (a file on disk, maybe damaged or
//! hostile), and the JSON lines of the live feed and a summary. Each must answer arbitrary or
//! mutated input with a value or an error that says what was wrong — never a panic, and
//! never an allocation out of proportion to the input (a length prefix of 4 GiB must not
//! allocate 4 GiB).
//!
//! Cases per property: `STALLSCOPE_FUZZ_CASES` (default 256, so CI stays fast); the long run
//! in docs/BENCHMARKS.md sets millions.

use proptest::prelude::*;

use stallscope_analysis::frame::{Frame, RunHeader};
use stallscope_analysis::marker::{self, Marker, MarkerEvent, MAX_DATAGRAM};
use stallscope_analysis::sample_run::{SampleRun, SampleRunBuilder, SampleStep};
use stallscope_analysis::series::{SampleBatch, SeriesDecl, SeriesId, SeriesKind};
use stallscope_analysis::summary::Summary;
use stallscope_analysis::view::hub::{json_line, parse_line, FeedMessage};
use stallscope_analysis::wire::{self, AgentMsg, CollectorMsg, Hello, MAX_MESSAGE};

mod support;
use support::fuzzing::{config, peak_of};

/// The most a decode of `input_len` bytes may hold: a generous multiple of its input plus a
/// fixed allowance (serde caps any preallocation from a length prefix at 1 MiB).
fn allowed(input_len: usize) -> usize {
    64 * input_len + (4 << 20)
}

// ---------------------------------------------------------------------------------------
// Inputs.

/// A mutation of a valid input: flipped, set, inserted or removed bytes, a cut, or a
/// 32-bit little- or big-endian length-like word written somewhere (0xFFFF_FFFF and
/// 0x4000_0000 among them).
#[derive(Clone, Debug)]
enum Edit {
    Flip(usize, u8),
    Set(usize, u8),
    Insert(usize, u8),
    Remove(usize),
    Cut(usize),
    Word(usize, u32, bool),
}

fn edit() -> impl Strategy<Value = Edit> {
    let word = prop_oneof![
        Just(u32::MAX),
        Just(1u32 << 30),
        Just(MAX_MESSAGE + 1),
        any::<u32>()
    ];
    prop_oneof![
        (any::<usize>(), 1..=255u8).prop_map(|(i, b)| Edit::Flip(i, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Set(i, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Insert(i, b)),
        any::<usize>().prop_map(Edit::Remove),
        any::<usize>().prop_map(Edit::Cut),
        (any::<usize>(), word, any::<bool>()).prop_map(|(i, w, be)| Edit::Word(i, w, be)),
    ]
}

fn mutate(mut bytes: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    for e in edits {
        let n = bytes.len();
        match *e {
            Edit::Flip(i, b) if n > 0 => bytes[i % n] ^= b,
            Edit::Set(i, b) if n > 0 => bytes[i % n] = b,
            Edit::Insert(i, b) => bytes.insert(i % (n + 1), b),
            Edit::Remove(i) if n > 0 => {
                bytes.remove(i % n);
            }
            Edit::Cut(i) => bytes.truncate(i % (n + 1)),
            Edit::Word(i, w, be) if n >= 4 => {
                let at = i % (n - 3);
                let w = if be { w.to_be_bytes() } else { w.to_le_bytes() };
                bytes[at..at + 4].copy_from_slice(&w);
            }
            _ => {}
        }
    }
    bytes
}

fn edits() -> impl Strategy<Value = Vec<Edit>> {
    prop::collection::vec(edit(), 1..8)
}

fn name() -> impl Strategy<Value = String> {
    "[A-Za-z0-9_.:-]{1,64}"
}

fn marker() -> impl Strategy<Value = Marker> {
    let event = prop_oneof![
        name().prop_map(MarkerEvent::Begin),
        name().prop_map(MarkerEvent::End),
        (name(), any::<u32>()).prop_map(|(n, pid)| MarkerEvent::BeginWaiting(n, pid)),
        Just(MarkerEvent::Step),
        prop::collection::vec((name(), "[A-Za-z0-9_.:/-]{0,64}"), 0..6).prop_map(MarkerEvent::Meta),
    ];
    (
        any::<u64>(),
        any::<u64>(),
        any::<u32>(),
        any::<Option<u32>>(),
        any::<u64>(),
        event,
    )
        .prop_map(|(seq, t_ns, pid, rank, iter, event)| Marker {
            seq,
            t_ns,
            pid,
            rank,
            iter,
            event,
        })
}

fn batch() -> impl Strategy<Value = SampleBatch> {
    (
        any::<u64>(),
        any::<u32>(),
        prop::collection::vec((0..40u32, any::<u64>()), 0..20),
    )
        .prop_map(|(t_ns, dur_ns, values)| SampleBatch {
            t_ns,
            dur_ns,
            values: values.into_iter().map(|(i, v)| (SeriesId(i), v)).collect(),
        })
}

/// Valid frames: a header, a declaration, markers, a batch, and a run packed from batches.
fn frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        "[a-z ]{0,20}".prop_map(|c| Frame::Header(RunHeader {
            command: c.split(' ').map(str::to_string).collect(),
            ..RunHeader::default()
        })),
        (0..40u32, name()).prop_map(|(id, n)| Frame::Series(SeriesDecl {
            id: SeriesId(id),
            name: n,
            unit: "ns".into(),
            kind: SeriesKind::Counter,
            labels: vec![("pid".into(), id.to_string())],
        })),
        prop::collection::vec(marker(), 0..5).prop_map(Frame::Markers),
        batch().prop_map(Frame::Samples),
        (batch(), prop::collection::vec(batch(), 1..10)).prop_map(|(first, rest)| {
            let mut b = SampleRunBuilder::new(first);
            for next in &rest {
                if !b.push(next) {
                    break;
                }
            }
            Frame::SampleRun(Box::new(b.finish()))
        }),
    ]
}

fn hello() -> impl Strategy<Value = AgentMsg> {
    (
        any::<u16>(),
        prop::collection::vec(any::<u8>(), 0..40),
        name(),
    )
        .prop_map(|(protocol, proof, node)| {
            AgentMsg::Hello(Hello {
                protocol,
                proof,
                node,
                agent_version: "0.1.0".into(),
            })
        })
}

/// Decodes a frame payload as the profile reader does, unpacking a run one batch at a time.
fn decode_frame(bytes: &[u8]) -> Result<usize, String> {
    match Frame::decode(bytes).map_err(|e| e.to_string())? {
        Frame::SampleRun(run) => Ok(run
            .into_batches(bytes.len())
            .map_err(|e| e.to_string())?
            .count()),
        _ => Ok(1),
    }
}

// ---------------------------------------------------------------------------------------
// Properties.

proptest! {
    #![proptest_config(config())]

    /// Any datagram parses or says why not, in words, and allocates in proportion.
    #[test]
    fn marker_parse_of_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..MAX_DATAGRAM + 64)) {
        let (peak, r) = peak_of(|| marker::parse(&bytes));
        prop_assert!(peak <= allowed(bytes.len()), "{peak} bytes for {}", bytes.len());
        if let Err(e) = r {
            prop_assert!(!e.to_string().is_empty());
        }
    }

    /// What the hook sends reads back as sent; any mutation of it parses or says why not.
    #[test]
    fn marker_round_trips_and_survives_mutation(m in marker(), e in edits()) {
        let text = marker::format(&m);
        prop_assert_eq!(marker::parse(text.as_bytes()), Ok(m));
        let bad = mutate(text.into_bytes(), &e);
        let (peak, r) = peak_of(|| marker::parse(&bad));
        prop_assert!(peak <= allowed(bad.len()));
        if let Err(e) = r {
            prop_assert!(!e.to_string().is_empty());
        }
    }

    /// Any 4-byte prefix announces a length within the limit or is refused.
    #[test]
    fn wire_length_prefix(prefix in any::<[u8; 4]>()) {
        match wire::payload_len(prefix) {
            Ok(n) => prop_assert!(n <= MAX_MESSAGE as usize),
            Err(e) => prop_assert!(e.to_string().contains("limit")),
        }
    }

    /// Any payload decodes as either side's message or is refused as malformed, without
    /// allocating what a length inside it claims.
    #[test]
    fn wire_decode_of_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        let (peak, _) = peak_of(|| {
            let a = wire::decode::<AgentMsg>(&bytes).map_err(|e| e.to_string());
            let c = wire::decode::<CollectorMsg>(&bytes).map_err(|e| e.to_string());
            let _ = wire::hello_version(&bytes);
            for r in [a.err(), c.err()].into_iter().flatten() {
                assert!(r.starts_with("malformed message"), "{r}");
            }
        });
        prop_assert!(peak <= allowed(bytes.len()), "{peak} bytes for {}", bytes.len());
    }

    /// A valid message round-trips; mutated, it decodes or is refused.
    #[test]
    fn wire_decode_of_mutated_messages(m in hello(), e in edits()) {
        let bytes = wire::encode(&m);
        prop_assert_eq!(wire::decode::<AgentMsg>(&bytes[4..]).ok(), Some(m));
        let bad = mutate(bytes[4..].to_vec(), &e);
        let (peak, _) = peak_of(|| wire::decode::<AgentMsg>(&bad).map(|_| ()));
        prop_assert!(peak <= allowed(bad.len()));
    }

    /// Any profile frame payload decodes (a run unpacks) or is refused, in bounded memory.
    #[test]
    fn frame_decode_of_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..4096)) {
        let (peak, _) = peak_of(|| decode_frame(&bytes));
        prop_assert!(peak <= allowed(bytes.len()), "{peak} bytes for {}", bytes.len());
    }

    /// Valid frames round-trip; mutated, they decode or are refused, in bounded memory.
    #[test]
    fn frame_decode_of_mutated_frames(f in frame(), e in edits()) {
        let bytes = f.encode();
        prop_assert_eq!(Frame::decode(&bytes).ok(), Some(f));
        let bad = mutate(bytes, &e);
        let (peak, _) = peak_of(|| decode_frame(&bad));
        prop_assert!(peak <= allowed(bad.len()), "{peak} bytes for {}", bad.len());
    }

    /// Any line a feed client reads is a message or nothing.
    #[test]
    fn feed_line_of_arbitrary_text(line in ".{0,512}", e in edits()) {
        let _ = parse_line(&line);
        let end = json_line(&FeedMessage::End);
        let bad = mutate(end.into_bytes(), &e);
        let (peak, _) = peak_of(|| parse_line(&String::from_utf8_lossy(&bad)));
        prop_assert!(peak <= allowed(bad.len()));
    }

    /// A summary's JSON reads back as itself; mutated, it reads or says why not.
    #[test]
    fn summary_json_survives_mutation(e in edits()) {
        let json = serde_json::to_string(&Summary::default()).unwrap();
        let back: Summary = serde_json::from_str(&json).unwrap();
        prop_assert_eq!(&back, &Summary::default());
        let bad = mutate(json.into_bytes(), &e);
        let (peak, r) = peak_of(|| serde_json::from_slice::<Summary>(&bad).map(|_| ()));
        prop_assert!(peak <= allowed(bad.len()));
        if let Err(e) = r {
            prop_assert!(!e.to_string().is_empty());
        }
    }
}

// ---------------------------------------------------------------------------------------
// Regressions: inputs crafted to break a bound that random cases would take long to find.

/// A payload announcing a 4 GiB vector, string or message allocates nothing of the sort.
#[test]
fn length_prefixes_of_4_gib_allocate_nothing_like_it() {
    // postcard varint of 0xFFFF_FFFF, then too few bytes.
    let huge = [0xff, 0xff, 0xff, 0xff, 0x0f, 1, 2, 3];
    for tag in 0..8u8 {
        let bytes = [&[tag][..], &huge].concat();
        let (peak, _) = peak_of(|| {
            let _ = wire::decode::<AgentMsg>(&bytes);
            let _ = wire::decode::<CollectorMsg>(&bytes);
            let _ = decode_frame(&bytes);
        });
        assert!(peak <= allowed(bytes.len()), "tag {tag}: {peak} bytes");
    }
    assert!(wire::payload_len(u32::MAX.to_be_bytes()).is_err());
}

/// A run of few bytes that unpacks into a great many samples (a wide first batch and many
/// empty steps) is refused, not unpacked into gigabytes: the writer never packs more than
/// `RUN_MAX_BATCHES` batches into a run, nor more than `RUN_MAX_VALUES_PER_BYTE` values per
/// byte of it.
#[test]
fn a_run_that_would_unpack_into_gigabytes_is_refused() {
    let run = SampleRun {
        first: SampleBatch {
            t_ns: 0,
            dur_ns: 0,
            values: (0..100_000).map(|i| (SeriesId(i), 0)).collect(),
        },
        steps: vec![SampleStep::default(); 1_000_000],
    };
    let bytes = Frame::SampleRun(Box::new(run)).encode();
    assert!(
        bytes.len() < 16 << 20,
        "fits in one frame: {} bytes",
        bytes.len()
    );
    let (peak, r) = peak_of(|| decode_frame(&bytes));
    assert!(
        peak <= allowed(bytes.len()),
        "{peak} bytes for {}",
        bytes.len()
    );
    let e = r.expect_err("refused");
    assert!(e.contains("run of 1000001 sample batches"), "{e}");

    // As many batches as a writer packs, each repeating 100 000 values in a few bytes:
    // refused before anything is unpacked (it would be 10 million values).
    let wide = SampleBatch {
        t_ns: 0,
        dur_ns: 0,
        values: (0..100_000).map(|i| (SeriesId(i), 0)).collect(),
    };
    let run = SampleRun {
        first: wide.clone(),
        steps: vec![SampleStep::default(); 99],
    };
    let bytes = Frame::SampleRun(Box::new(run)).encode();
    let (peak, r) = peak_of(|| decode_frame(&bytes));
    let e = r.expect_err("refused");
    assert!(
        e.contains("unpacks to more than 4 sample values per byte"),
        "{e}"
    );
    assert!(
        peak <= allowed(bytes.len()),
        "{peak} bytes for {}",
        bytes.len()
    );

    // Ten batches of 100 000 values that each step moves: read one at a time.
    let step = SampleStep {
        changed: (0..100_000).map(|i| (SeriesId(i), 1)).collect(),
        ..SampleStep::default()
    };
    let run = SampleRun {
        first: wide,
        steps: vec![step; 9],
    };
    let bytes = Frame::SampleRun(Box::new(run)).encode();
    let (peak, r) = peak_of(|| decode_frame(&bytes));
    assert_eq!(r, Ok(10));
    assert!(
        peak <= allowed(bytes.len()),
        "{peak} bytes for {}",
        bytes.len()
    );
}

/// A step adding many series at once unpacks in time proportional to its size (inserted
/// one by one at the front, 200 000 took minutes; merged, milliseconds).
#[test]
fn a_step_adding_many_series_unpacks_in_linear_time() {
    let n = 200_000u32;
    let run = SampleRun {
        first: SampleBatch::default(),
        steps: vec![SampleStep {
            changed: (0..n).map(|i| (SeriesId(i), 1)).collect(),
            added_at: vec![0; n as usize],
            ..SampleStep::default()
        }],
    };
    let started = std::time::Instant::now();
    let batches = run.unpack().unwrap();
    assert_eq!(batches[1].values.len(), n as usize);
    // Bounded a thousand times above what linear takes, so no loaded machine fails it.
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
}

/// Runs unpack to exactly the batches packed (the merge of new series keeps their places).
#[test]
fn runs_unpack_to_what_was_packed() {
    let mut runner = proptest::test_runner::TestRunner::new(config());
    let batches = prop::collection::vec(batch(), 2..30);
    runner
        .run(&batches, |bs| {
            let mut b = SampleRunBuilder::new(bs[0].clone());
            let mut packed = vec![bs[0].clone()];
            for next in &bs[1..] {
                if !b.push(next) {
                    break;
                }
                packed.push(next.clone());
            }
            prop_assert_eq!(b.finish().unpack().unwrap(), packed);
            Ok(())
        })
        .unwrap();
}
