//! Property-based fuzzing of the profile reader: a profile is a file on disk, cut short by a
//! kill, damaged by a disk, or not a profile at all, and `report`, `summary` and `top --replay`
//! read whatever they are given. On arbitrary bytes and on mutations of valid profiles
//! (damage the checksums catch, and damage re-checksummed so the frame decoder sees it) the
//! reader must never panic, must say what was wrong in words (a [`ProfileError`] or
//! [`ReadIssue`]s), and must hold memory in proportion to one frame, whatever a length inside
//! claims.
//!
//! Cases per property: `STALLSCOPE_FUZZ_CASES` (default 256); see docs/BENCHMARKS.md for the
//! long run.

use std::io::Cursor;

use proptest::prelude::*;

use stallscope_analysis::frame::{Frame, RunHeader, FORMAT_VERSION};
use stallscope_analysis::marker::{Marker, MarkerEvent};
use stallscope_analysis::sample_run::{SampleRun, SampleStep};
use stallscope_analysis::series::{SampleBatch, SeriesDecl, SeriesId, SeriesKind};
use stallscope_collector::profile::{
    ProfileError, ProfileReader, ProfileWriter, ReadIssue, FRAME_HEADER_LEN, FRAME_MAGIC, MAGIC,
    MAX_PAYLOAD,
};

#[path = "../../analysis/tests/support/fuzzing.rs"]
mod fuzzing;
use fuzzing::{config, peak_of};

/// What reading `bytes` as a profile gave: frames, issues (each described), or the error.
#[derive(Debug)]
struct Read {
    frames: usize,
    issues: Vec<ReadIssue>,
    /// bytes held at the peak, beyond what was live before.
    peak: usize,
}

/// Reads `bytes` to the end, frame by frame, as `report` does, counting what it holds.
fn read(bytes: &[u8]) -> Result<Read, ProfileError> {
    let (peak, read) = peak_of(|| {
        let mut reader = ProfileReader::new(Cursor::new(bytes), "fuzzed.stallscope")?;
        let mut frames = 0;
        for f in reader.by_ref() {
            f?;
            frames += 1;
        }
        Ok::<_, ProfileError>((frames, reader.take_issues()))
    });
    let (frames, issues) = read?;
    Ok(Read {
        frames,
        issues,
        peak,
    })
}

/// The most reading `len` bytes may hold: one frame at most (a claimed length is capped at
/// [`MAX_PAYLOAD`]), decoded at a generous multiple, plus a fixed allowance.
fn allowed(len: usize) -> usize {
    let frame = len.min(MAX_PAYLOAD as usize + FRAME_HEADER_LEN);
    2 * (MAX_PAYLOAD as usize).min(len.next_power_of_two().max(1 << 16)) + 64 * frame + (4 << 20)
}

fn check(bytes: &[u8]) -> Result<(), TestCaseError> {
    match read(bytes) {
        Ok(r) => {
            prop_assert!(
                r.peak <= allowed(bytes.len()),
                "{} bytes for {}",
                r.peak,
                bytes.len()
            );
            for i in &r.issues {
                prop_assert!(!i.describe().is_empty());
            }
            let _ = r.frames;
        }
        Err(e) => {
            let text = e.to_string();
            prop_assert!(text.starts_with("fuzzed.stallscope: "), "{text}");
        }
    }
    Ok(())
}

/// A valid profile of a few frames of every common kind, samples packed into runs.
fn valid_profile(batches: usize, seed: u64) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.stallscope");
    let mut w = ProfileWriter::create(&path).unwrap();
    w.write(&Frame::Header(RunHeader {
        command: vec!["python3".into(), "train.py".into()],
        ..RunHeader::default()
    }))
    .unwrap();
    for id in 0..4 {
        w.write(&Frame::Series(SeriesDecl {
            id: SeriesId(id),
            name: "proc.cpu_ns".into(),
            unit: "ns".into(),
            kind: SeriesKind::Counter,
            labels: vec![("pid".into(), id.to_string())],
        }))
        .unwrap();
    }
    for k in 0..batches as u64 {
        w.write(&Frame::Samples(SampleBatch {
            t_ns: 10_000_000 * k,
            dur_ns: 20_000,
            values: (0..4)
                .map(|id| (SeriesId(id), (seed ^ id as u64).wrapping_mul(k + 1)))
                .collect(),
        }))
        .unwrap();
        if k % 7 == 3 {
            w.write(&Frame::Markers(vec![Marker {
                seq: k,
                t_ns: 10_000_000 * k,
                pid: 7,
                rank: Some(0),
                iter: k,
                event: MarkerEvent::Step,
            }]))
            .unwrap();
        }
    }
    w.finish().unwrap();
    std::fs::read(&path).unwrap()
}

/// Where the frames of `bytes` (a profile) begin, and their payload lengths.
fn frames_of(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut at = MAGIC.len() + 1;
    while at + FRAME_HEADER_LEN <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at + 3..at + 7].try_into().unwrap()) as usize;
        out.push((at, len));
        at += FRAME_HEADER_LEN + len;
    }
    out
}

/// A frame around `payload`, checksummed as the writer does.
fn framed(payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_le_bytes();
    let mut h = crc32fast::Hasher::new();
    h.update(&[FORMAT_VERSION]);
    h.update(&len);
    h.update(payload);
    let mut out = FRAME_MAGIC.to_vec();
    out.push(FORMAT_VERSION);
    out.extend_from_slice(&len);
    out.extend_from_slice(&h.finalize().to_le_bytes());
    out.extend_from_slice(payload);
    out
}

fn file_header() -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.push(FORMAT_VERSION);
    out
}

proptest! {
    #![proptest_config(config())]

    /// Arbitrary bytes, alone or after a valid file header.
    #[test]
    fn arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..4096), headed in any::<bool>()) {
        let bytes = if headed { [file_header(), bytes].concat() } else { bytes };
        check(&bytes)?;
    }

    /// A valid profile with bytes flipped, cut, inserted or a frame length overwritten:
    /// what the checksums catch is stepped over and said.
    #[test]
    fn damaged_profiles(
        batches in 1..300usize,
        seed in any::<u64>(),
        edits in prop::collection::vec((any::<usize>(), any::<u8>(), 0..4u8), 1..6),
    ) {
        let mut bytes = valid_profile(batches, seed);
        let good = read(&bytes).unwrap();
        prop_assert!(good.issues.is_empty(), "{:?}", good.issues);
        for (i, b, kind) in edits {
            let n = bytes.len();
            match kind {
                0 => bytes[i % n] ^= b | 1,
                1 => bytes.truncate(i % n),
                2 => bytes.insert(i % n, b),
                _ => {
                    // A frame's length: huge, zero, or off by a little.
                    if let Some(&(at, len)) = frames_of(&bytes).get(i % 16) {
                        let claim = [u32::MAX, 0, (len as u32).wrapping_add(1), MAX_PAYLOAD][b as usize % 4];
                        bytes[at + 3..at + 7].copy_from_slice(&claim.to_le_bytes());
                    }
                }
            }
            if bytes.is_empty() {
                break;
            }
        }
        check(&bytes)?;
    }

    /// A frame's payload damaged and checksummed again, so the decoder itself meets it.
    #[test]
    fn damaged_payloads_that_pass_the_checksum(
        batches in 1..300usize,
        seed in any::<u64>(),
        which in any::<usize>(),
        edits in prop::collection::vec((any::<usize>(), any::<u8>(), any::<bool>()), 1..6),
    ) {
        let bytes = valid_profile(batches, seed);
        let frames = frames_of(&bytes);
        let (at, len) = frames[which % frames.len()];
        let mut payload = bytes[at + FRAME_HEADER_LEN..at + FRAME_HEADER_LEN + len].to_vec();
        for (i, b, insert) in edits {
            if insert || payload.is_empty() {
                payload.insert(i % (payload.len() + 1), b);
            } else {
                let n = payload.len();
                payload[i % n] = b;
            }
        }
        let damaged = [
            &bytes[..at],
            &framed(&payload),
            &bytes[at + FRAME_HEADER_LEN + len..],
        ]
        .concat();
        check(&damaged)?;
    }
}

/// A checksummed run of few bytes that would unpack into gigabytes (a wide first batch and a
/// million empty steps) is refused as damage, in bounded memory, and the frames around it
/// are read.
#[test]
fn a_run_that_would_unpack_into_gigabytes_is_stepped_over() {
    let run = SampleRun {
        first: SampleBatch {
            t_ns: 0,
            dur_ns: 0,
            values: (0..100_000).map(|i| (SeriesId(i), 0)).collect(),
        },
        steps: vec![SampleStep::default(); 1_000_000],
    };
    let valid = valid_profile(20, 1);
    let bytes = [
        valid.clone(),
        framed(&Frame::SampleRun(Box::new(run)).encode()),
        valid[MAGIC.len() + 1..].to_vec(),
    ]
    .concat();
    let r = read(&bytes).unwrap();
    let good = read(&valid).unwrap();
    assert_eq!(r.frames, 2 * good.frames, "every good frame read");
    assert_eq!(r.issues.len(), 1, "{:?}", r.issues);
    let said = r.issues[0].describe();
    assert!(
        said.contains("a run of 1000001 sample batches, over the 100"),
        "{said}"
    );
    assert!(r.peak <= allowed(bytes.len()), "{} bytes", r.peak);
}
