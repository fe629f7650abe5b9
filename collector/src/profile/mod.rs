//! The profile file: an append-only log of [`Frame`]s.
//!
//! # Layout
//!
//! ```text
//! file   := header frame*
//! header := "SSPROF\r\n" version:u8
//! frame  := "SF" version:u8 len:u32le crc:u32le payload[len]
//!           crc = CRC-32 (IEEE) of version ‖ len ‖ payload
//!           payload = postcard encoding of one Frame (Frame::encode), len ≤ 16 MiB
//! ```
//!
//! Format 2 packs consecutive sample batches into one frame (`Frame::SampleRun`: the first
//! batch whole, then each as its time step and the values that changed), which the reader
//! gives back as the batches; a run stands alone, so damage costs at most that run (a second
//! of samples). Format-1 files read as before; a writer appends only to a file of its own
//! format.
//!
//! # Why this shape
//!
//! A profile is written while the training job runs and must survive the profiler being
//! killed at any instant, so the file is only ever appended to and every frame stands alone:
//! its own magic, version, length and checksum. There is no index or footer to keep in step;
//! a reader needs nothing but the bytes of the frame in front of it, and a frame's CRC tells
//! it whether those bytes are what the writer wrote.
//!
//! * The magic ends in `\r\n` (as PNG's does) so that a transfer that rewrites line endings is
//!   caught at once instead of producing frames that fail their CRCs one by one.
//! * The version sits in the file header, where a reader refuses a newer file by name before
//!   reading anything, and again in every frame, so that the resynchronising scan (below)
//!   looks for three fixed bytes rather than two.
//! * The CRC covers the version and the length as well as the payload: a flipped bit in the
//!   length would otherwise send the reader to a wrong frame boundary with nothing to say so.
//! * The length is bounded (16 MiB, far above any real frame) so that a damaged length is
//!   recognised as damage and never turned into an allocation.
//! * The writer buffers frames and hands them to the kernel in one `write` about once a
//!   second (the caller's flush), always as whole frames. A crash loses at most the frames of
//!   the last second; what reached the file is whole frames and, at worst, one torn tail.
//!
//! # Failure modes, and what the reader does
//!
//! * **Torn tail** (killed with `kill -9`, out of disk, power loss): the file ends inside a
//!   frame. The reader returns every frame before it and a [`ReadIssue::TornTail`]. This is
//!   the normal end of a profile whose run did not finish; the last frame is not
//!   [`Frame::End`].
//! * **Bit rot, or bytes overwritten in the middle** (a bad disk, a careless `dd`, a zeroed
//!   block after a crash): a frame's CRC fails, its payload does not decode, its length is
//!   over the bound or runs past the end, or the bytes where a frame should start are not a
//!   frame header. The reader reports a [`ReadIssue::Corrupt`] at that offset, scans forward
//!   byte by byte for the next frame header whose CRC checks, and carries on from there, so
//!   one bad frame costs that frame and no other.
//! * **Fake frame headers** (a crafted file, or an unlucky payload): every `SF` + version
//!   may claim 16 MiB whose checksum must be computed to reject it. Failed checks may hash
//!   16 MiB plus 8 bytes per byte read so far; a header beyond that is stepped over unchecked
//!   ([`Corruption::Unchecked`]), so no file costs more than linear work to read.
//! * **A newer writer**: a file whose header names a format version above
//!   [`FORMAT_VERSION`] is refused with [`ProfileError::NewerVersion`] ("upgrade
//!   stallscope"), never half-read. A newer stallscope that appended a [`Frame`] variant
//!   without bumping the version writes frames that pass their CRC but do not decode here;
//!   each is reported as corrupt and skipped whole, and the frames this build knows are read.
//! * **Not a profile at all**: refused with [`ProfileError::NotAProfile`], quoting the first
//!   bytes of the file so the user can see what it was.

mod reader;
mod writer;

use std::path::PathBuf;

pub use reader::{read_profile, Corruption, ProfileReader, ReadIssue, ReadProfile};
pub use writer::ProfileWriter;

#[cfg(any(doc, test))]
use stallscope_analysis::frame::Frame;
#[cfg(doc)]
use stallscope_analysis::frame::FORMAT_VERSION;

/// The first eight bytes of every profile.
pub const MAGIC: [u8; 8] = *b"SSPROF\r\n";

/// bytes, the file header: [`MAGIC`] and the format version.
pub const FILE_HEADER_LEN: usize = MAGIC.len() + 1;

/// The first two bytes of every frame.
pub const FRAME_MAGIC: [u8; 2] = *b"SF";

/// bytes, a frame's header: magic, version, length, CRC.
pub const FRAME_HEADER_LEN: usize = 2 + 1 + 4 + 4;

/// bytes, the largest payload a frame may carry (16 MiB).
pub const MAX_PAYLOAD: u32 = 16 * 1024 * 1024;

/// bytes, the most a [`Frame::Deflated`] may inflate to: what a writer packs at most
/// ([`writer::DEFLATE_MAX`] plus one frame of at most as much), so that a crafted one cannot
/// make a reader hold more (its frames are decoded one at a time).
pub const MAX_INFLATED: usize = 2 * writer::DEFLATE_MAX;

/// Why a profile could not be written or read at all.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// The file does not begin with [`MAGIC`] and a version this format knows.
    #[error("{path}: not a stallscope profile ({detail})", path = path.display())]
    NotAProfile {
        /// The file.
        path: PathBuf,
        /// What was there instead.
        detail: String,
    },
    /// The file was written by a newer stallscope.
    #[error(
        "{path}: written by a newer stallscope (profile format {found}, this stallscope reads \
         up to {supported}); upgrade stallscope to read it",
        path = path.display()
    )]
    NewerVersion {
        /// The file.
        path: PathBuf,
        /// The format version in its header.
        found: u8,
        /// The newest format version this build reads ([`FORMAT_VERSION`]).
        supported: u8,
    },
    /// A frame to be written encodes to more than [`MAX_PAYLOAD`] bytes.
    #[error(
        "{path}: a frame of {bytes} bytes is over the {MAX_PAYLOAD}-byte limit and was not written",
        path = path.display()
    )]
    FrameTooLarge {
        /// The file.
        path: PathBuf,
        /// bytes, the encoded payload.
        bytes: usize,
    },
    /// Opening, reading or writing the file failed.
    #[error("{path}: {source}", path = path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
}

/// CRC of a frame: over the version byte, the little-endian length and the payload.
fn frame_crc(version: u8, len: [u8; 4], payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&[version]);
    h.update(&len);
    h.update(payload);
    h.finalize()
}

/// One frame of every variant, with every optional part filled, for the tests of the
/// writer and the reader.
#[cfg(test)]
pub(crate) fn every_variant() -> Vec<Frame> {
    use stallscope_analysis::attribution::{Basis, Coverage, Evidence, IterationBreakdown};
    use stallscope_analysis::category::{Category, Split};
    use stallscope_analysis::frame::{ProcessInfo, Role, RunEnd, RunHeader, SourceStatus};
    use stallscope_analysis::marker::{Marker, MarkerEvent};
    use stallscope_analysis::series::{SampleBatch, SeriesDecl, SeriesId, SeriesKind};

    let mut frames = vec![
        Frame::Header(RunHeader {
            stallscope_version: "0.1.0".into(),
            host: "node-a".into(),
            command: vec!["python3".into(), "train.py".into(), "--epochs=1".into()],
            started_unix_ns: 1_700_000_000_000_000_000,
            started_mono_ns: 12_345_678_901,
            rate_hz: 100.0,
            warmup_iters: 3,
            cpus: 16,
        }),
        Frame::Series(SeriesDecl {
            id: SeriesId(7),
            name: "net.rx_bytes".into(),
            unit: "bytes".into(),
            kind: SeriesKind::Counter,
            labels: vec![
                ("iface".into(), "eth0".into()),
                ("link".into(), "nic".into()),
            ],
        }),
        Frame::Samples(SampleBatch {
            t_ns: 12_400_000_000,
            dur_ns: 81_000,
            values: (0..40)
                .map(|i| (SeriesId(i), u64::MAX / (i as u64 + 1)))
                .collect(),
        }),
        Frame::Markers(vec![
            Marker {
                seq: 0,
                t_ns: 12_500_000_000,
                pid: 4242,
                rank: Some(1),
                iter: 17,
                event: MarkerEvent::Begin("data".into()),
            },
            Marker {
                seq: 1,
                t_ns: 12_600_000_000,
                pid: 4242,
                rank: None,
                iter: 17,
                event: MarkerEvent::End("data".into()),
            },
            Marker {
                seq: 2,
                t_ns: 12_700_000_000,
                pid: 4242,
                rank: Some(1),
                iter: 17,
                event: MarkerEvent::Step,
            },
            Marker {
                seq: 3,
                t_ns: 12_800_000_000,
                pid: 4242,
                rank: Some(1),
                iter: 18,
                event: MarkerEvent::Meta(vec![("workers".into(), "4".into())]),
            },
        ]),
        Frame::Process(ProcessInfo {
            pid: 4243,
            ppid: 4242,
            comm: "pt_data_worker".into(),
            role: Role::Loader,
            rank: Some(1),
            rank_pid: Some(4242),
            seen_ns: 12_450_000_000,
        }),
        Frame::ProcessExit {
            pid: 4243,
            t_ns: 19_000_000_000,
        },
        Frame::Breakdown(IterationBreakdown {
            rank: 1,
            pid: 4242,
            iter: 17,
            start_ns: 12_400_000_000,
            end_ns: 12_700_000_000,
            split: Split {
                ns: [
                    150_000_000,
                    40_000_000,
                    60_000_000,
                    10_000_000,
                    20_000_000,
                    15_000_000,
                    5_000_000,
                ],
            },
            evidence: vec![Evidence {
                category: Category::DataFetch,
                basis: Basis::DataLoaderIo,
                ns: 40_000_000,
            }],
            coverage: Coverage {
                marked_ns: 280_000_000,
                sampled_ns: 300_000_000,
            },
        }),
        Frame::Source(SourceStatus {
            source: "gpu".into(),
            up: false,
            message: "libnvidia-ml.so.1 not found".into(),
        }),
        Frame::End(RunEnd {
            ended_mono_ns: 20_000_000_000,
            exit_code: 137,
            markers_dropped: 2,
            markers_rejected: 1,
        }),
        Frame::NodeClock(stallscope_analysis::frame::NodeClock {
            node: "b".into(),
            offset_ns: -50_000_000,
            drift_ppm: 1.5,
            at_ns: 9,
            uncertainty_ns: 40_000,
            samples: 8,
        }),
        Frame::NodeHealth(stallscope_analysis::frame::NodeHealth {
            node: "b".into(),
            records_dropped: 3,
            ..Default::default()
        }),
        Frame::Experiment(Box::new(sample_experiment())),
    ];
    let breakdown = frames
        .iter()
        .find_map(|f| match f {
            Frame::Breakdown(b) => Some(b.clone()),
            _ => None,
        })
        .expect("a breakdown above");
    let iteration = stallscope_analysis::frame::NodeIteration {
        node: "b".into(),
        breakdown,
        comm: vec![stallscope_analysis::frame::CommSpan { begin: 1, end: 2 }],
        world_size: Some(2),
    };
    frames.push(Frame::NodeIteration(iteration.clone()));
    frames.push(Frame::NodeReport(Box::new(
        stallscope_analysis::frame::NodeReport {
            iteration,
            gpu: Some(stallscope_analysis::gpu_usage::NvmlReading {
                gpu: "0".into(),
                uuid: Some("GPU-00000000-1111-2222-3333-444444444444".into()),
                cuda_timed: true,
                busy_ppm: Some(874_000),
                pcie_rx_bytes: Some(25_200_000),
                energy_mj: Some(9_270),
                batch_bytes: Some(12_600_000),
                ..Default::default()
            }),
        },
    )));
    frames.push(Frame::NodeResources(Box::new(
        stallscope_analysis::frame::NodeResourcesReport {
            node: "b".into(),
            resources: stallscope_analysis::resources::NodeResources {
                t_ns: 7,
                ..Default::default()
            },
        },
    )));
    frames.push(Frame::NodeGpus(stallscope_analysis::frame::NodeGpus {
        node: "b".into(),
        gpus: vec![stallscope_analysis::frame::GpuIdentity {
            gpu: "0".into(),
            uuid: Some("GPU-00000000-1111-2222-3333-444444444444".into()),
            model: Some("NVIDIA H100 80GB HBM3".into()),
        }],
    }));
    frames.push(Frame::NodeNics(stallscope_analysis::frame::NodeNics {
        node: "b".into(),
        nics: vec![stallscope_analysis::frame::NicBytes {
            iface: "eth0".into(),
            rx_bytes: 1 << 40,
            tx_bytes: 12,
        }],
    }));
    frames.push(Frame::NodeMeta(stallscope_analysis::frame::NodeMeta {
        node: "b".into(),
        pid: 4242,
        rank: Some(1),
        fields: vec![
            ("comm_bucket_kb".into(), "2505:2411".into()),
            ("comm_bucket_ready_ms".into(), "0.0:36.8".into()),
        ],
    }));
    frames.push(Frame::NodeCounters(
        stallscope_analysis::frame::NodeCountersReport {
            node: "b".into(),
            counters: stallscope_analysis::resources::NodeCounters {
                cpu_seconds: Some(12.5),
                nic_rx_bytes: Some(1e12),
                ..Default::default()
            },
        },
    ));
    frames.push(Frame::NodeRdma(stallscope_analysis::frame::NodeRdma {
        node: "b".into(),
        t_ns: 7,
        rx_bytes_per_s: Some(12e9),
        tx_bytes_per_s: None,
        rx_bytes: Some(1e12),
        tx_bytes: Some(3.0),
        counters: vec![stallscope_analysis::frame::RdmaCount {
            device: "mlx5_0".into(),
            port: "1".into(),
            counter: "np_cnp_sent".into(),
            value: 4210,
        }],
    }));
    frames.push(Frame::Hang(Box::new(
        stallscope_analysis::hang::HangReport {
            at_seconds: 75.5,
            stalled_seconds: 61.0,
            last_iteration: Some(11),
            collective: Some(stallscope_analysis::hang::Collective {
                op: "all_reduce".into(),
                group: 0,
                seq: 12,
            }),
            waiting_ranks: vec![0],
            missing_ranks: vec![1],
            ranks: vec![stallscope_analysis::hang::RankAtHang {
                rank: 1,
                pid: 4243,
                last_iteration: Some(11),
                state: "compute_or_unknown".into(),
                collective: None,
                has_hook: true,
                node: Some("b".into()),
            }],
            stacks: [(
                "1".to_string(),
                "Thread 0x1 (most recent call first):\n".to_string(),
            )]
            .into(),
            resumed_after_seconds: None,
            missing_at: vec!["1@b".into()],
            waiting_at: vec!["0@a".into()],
            unanswered_nodes: vec![],
        },
    )));
    frames.push(Frame::NodeHang(Box::new(
        stallscope_analysis::hang::NodeHang {
            node: "b".into(),
            id: 3,
            ranks: vec![],
            groups: [(0, vec![0, 1])].into(),
            world_size: Some(2),
            stacks: [("1".to_string(), "Thread 0x1:\n".to_string())].into(),
        },
    )));
    frames.push(Frame::NodeFlows(stallscope_analysis::flows::NodeFlows {
        node: "b".into(),
        t_ns: 9,
        since_ns: 8,
        flows: vec![stallscope_analysis::flows::FlowSample {
            class: Some(stallscope_analysis::flows::FlowClass::Other),
            local: "10.0.0.2:41000".into(),
            remote: "10.0.0.1:5001".into(),
            loopback: false,
            pids: vec![],
            bytes_in: 25_000_000,
            bytes_out: 12,
            retransmits: 3,
            rtt_us: 1200,
        }],
    }));
    frames.push(Frame::SamplesThinned(
        stallscope_analysis::frame::SamplesThinned {
            window_ns: 60_000_000_000,
        },
    ));
    frames.push(Frame::IterationTotals(Box::new(
        stallscope_analysis::frame::IterationTotals {
            progress: vec![(4242, 12)],
            totals: Default::default(),
            comm: vec![((0, 4242), Default::default())],
            slowdowns: vec![Default::default()],
            markers_dropped: 3,
        },
    )));
    // A new variant makes this match fail to compile until it is added above.
    let mut seen = [false; 25];
    for f in &frames {
        let i = match f {
            Frame::Header(_) => 0,
            Frame::Series(_) => 1,
            Frame::Samples(_) => 2,
            Frame::Markers(_) => 3,
            Frame::Process(_) => 4,
            Frame::ProcessExit { .. } => 5,
            Frame::Breakdown(_) => 6,
            Frame::Source(_) => 7,
            Frame::End(_) => 8,
            Frame::NodeClock(_) => 9,
            Frame::NodeIteration(_) => 10,
            Frame::NodeHealth(_) => 11,
            Frame::Experiment(_) => 12,
            Frame::NodeReport(_) => 13,
            Frame::NodeResources(_) => 14,
            Frame::NodeGpus(_) => 15,
            Frame::NodeNics(_) => 16,
            Frame::NodeMeta(_) => 17,
            Frame::NodeCounters(_) => 18,
            Frame::NodeRdma(_) => 19,
            Frame::Hang(_) => 20,
            Frame::NodeFlows(_) => 21,
            Frame::SamplesThinned(_) => 22,
            Frame::NodeHang(_) => 23,
            // The writer packs Samples frames into runs and the reader unpacks them: a run
            // never comes back out; `samples_are_packed_and_read_back` tests them. Deflated
            // frames likewise (`deflated_frames_read_back_as_written`), and iteration packs
            // (`iteration_packs_read_back_as_written`).
            Frame::IterationTotals(_) => 24,
            Frame::SampleRun(_) | Frame::Deflated(_) | Frame::IterationPack(_) => {
                unreachable!("not a frame callers write")
            }
        };
        seen[i] = true;
    }
    assert!(seen.iter().all(|s| *s));
    frames
}

#[cfg(test)]
fn sample_experiment() -> stallscope_analysis::experiment::ExperimentReport {
    use stallscope_analysis::experiment::*;
    let runs: Vec<ConfigRun> = [(Config::Single, 0.1), (Config::Warm, 0.3)]
        .into_iter()
        .map(|(config, t)| ConfigRun {
            config,
            processes: 1,
            nodes: 1,
            iteration_seconds: vec![t, t + 0.01],
            timing: Timing::of(&[t, t + 0.01]),
            exit_code: 0,
            profile: format!("job.{}.stallscope", config.label()),
            online: None,
        })
        .collect();
    ExperimentReport {
        schema: SCHEMA.into(),
        command: vec!["python3".into(), "train.py".into()],
        iterations: 2,
        warmup_iterations: 1,
        differential: differential(&runs),
        agreement: vec![],
        what_if: Some(WhatIf::tabulate(WhatIfInputs {
            samples_per_iteration: 16.0,
            compute_samples_per_s: 160.0,
            cpus: 2,
            ..Default::default()
        })),
        runs,
    }
}
