//! The feed's binary form (`stallscope.feed-bin/2`): each message one postcard frame, for
//! viewers that ask for it (`stallscope top`). The JSON lines stay the feed's default and what
//! `stallscope feed --json` prints.
//!
//! Why: at 1,024 ranks an update is ~190 kB of JSON, 10 a second, and parsing it cost the
//! dashboard as much CPU as drawing (issue 31). The same update in postcard is a fraction of
//! the bytes and has no text to parse.
//!
//! The model's types are written for JSON (optional fields left out, RDMA figures carried in
//! JSON only), which postcard cannot read back, so the frames carry mirrors of the parts that
//! change every round — ranks' figures, iterations' parts, nodes and their readings — field
//! for field, and so does the snapshot (at 1,024 ranks with their 512 recent iterations its
//! JSON passed 64 MiB). The summary, refreshed at most once a second and of many optional
//! fields, travels as its JSON inside the frame, all but its ranks: those go field for field
//! ([`BinarySummary`]; version 1 sent them as JSON too, 9 of the 12.5 MB of a 10,000-rank
//! update).
//!
//! A frame on a byte stream: a 4-byte little-endian length, then that many bytes of postcard
//! ([`BinaryFeed`]), at most [`MAX_FRAME`].

use serde::{Deserialize, Serialize};

use super::hub::FeedMessage;
use super::{IterationParts, JobView, NodeReading, NodeView, RankView, ViewUpdate};
use crate::collectives::Collective;
use crate::crossnode::StragglerWindow;
use crate::fast_hash::FastMap;
use crate::frame::{GpuIdentity, NicBytes, RdmaCount};
use crate::gpu_usage::RankGpu;
use crate::resources::{NodeCounters, NodeResources};
use crate::summary::{Figures, RankSummary, Summary};
use crate::wire::{push_opt, push_varint, Reader};
use crate::Nanos;

/// The binary form's name, as the feed socket's switch line and the README give it.
pub const BINARY_SCHEMA: &str = "stallscope.feed-bin/2";

/// bytes, the largest frame a reader takes: a snapshot of thousands of ranks is tens of MiB.
pub const MAX_FRAME: usize = 64 << 20;

/// Why a binary frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BinaryError {
    /// The length prefix is over [`MAX_FRAME`].
    #[error("a binary feed frame of {len} bytes, over the {limit_mib} MiB limit")]
    TooLong {
        /// bytes, as the prefix announced.
        len: usize,
        /// MiB, [`MAX_FRAME`].
        limit_mib: usize,
    },
    /// The bytes are not a frame of this form.
    #[error("a malformed binary feed frame ({0})")]
    Malformed(String),
}

/// One message of the binary feed.
#[derive(Debug, Serialize, Deserialize)]
enum BinaryFeed {
    /// The whole model.
    Snapshot(Box<BinarySnapshot>),
    /// What changed.
    Update(Box<BinaryUpdate>),
    /// The run ended.
    End,
}

/// [`ViewUpdate`], field for field, in a form postcard reads back.
#[derive(Debug, Serialize, Deserialize)]
struct BinaryUpdate {
    now_ns: Nanos,
    attributed: u64,
    samples_per_second: Option<f64>,
    batch_size: Option<u64>,
    records_dropped: u64,
    /// The summary, when refreshed.
    summary: Option<BinarySummary>,
    ranks: Vec<BinaryRank>,
    parts: Vec<(u32, IterationParts)>,
    nodes: Vec<BinaryNode>,
    stragglers: Vec<StragglerWindow>,
    readings: Vec<(String, BinaryResources)>,
    removed_ranks: Vec<u32>,
    /// The hang events' JSON, when there are any (their optional fields are JSON's).
    hangs: Option<String>,
}

/// [`JobView`], field for field.
#[derive(Debug, Serialize, Deserialize)]
struct BinarySnapshot {
    schema: String,
    name: String,
    summary: BinarySummary,
    now_ns: Nanos,
    attributed: u64,
    samples_per_second: Option<f64>,
    batch_size: Option<u64>,
    /// Each rank and its recent iterations.
    ranks: Vec<(BinaryRank, Vec<IterationParts>)>,
    /// Each node and its history.
    nodes: Vec<(BinaryNode, Vec<BinaryResources>)>,
    stragglers: Vec<StragglerWindow>,
    records_dropped: u64,
}

/// [`Summary`] as the binary form carries it: its ranks' entries (thousands, in a large job)
/// field for field, and the rest as its JSON. At 10,000 ranks the whole summary's JSON was
/// 9 MB of a 12.5 MB update, which the collector's connection thread spent ~140 ms writing
/// while the agents' records waited, and the viewer as long parsing.
#[derive(Debug, Serialize, Deserialize)]
struct BinarySummary {
    /// The summary's JSON, its `ranks` left empty.
    json: String,
    ranks: Vec<BinaryRankSummary>,
}

/// [`RankSummary`], field for field.
#[derive(Debug, Serialize, Deserialize)]
struct BinaryRankSummary {
    rank: u32,
    pid: u32,
    node: Option<String>,
    /// Its figures and GPU; `None` where the message's view of the rank holds the same ones
    /// (a refresh copies them there), which the reader takes from that view.
    figures: Option<(Figures, Option<RankGpu>)>,
    collectives: Vec<Collective>,
}

/// The figures and GPU of the rank views a message carries, by rank.
type ViewFigures<'a> = FastMap<u32, (&'a Figures, &'a Option<RankGpu>)>;

fn view_figures<'a>(
    ranks: impl Iterator<Item = (u32, &'a Figures, &'a Option<RankGpu>)>,
) -> ViewFigures<'a> {
    ranks.map(|(rank, f, g)| (rank, (f, g))).collect()
}

fn summary_to_binary(s: &Summary, views: &ViewFigures) -> BinarySummary {
    BinarySummary {
        json: serde_json::to_string(&s.clone_without_ranks()).unwrap_or_default(),
        ranks: s
            .ranks
            .iter()
            .map(|r| BinaryRankSummary {
                rank: r.rank,
                pid: r.pid,
                node: r.node.clone(),
                figures: match views.get(&r.rank) {
                    Some(&(f, g)) if *f == r.figures && *g == r.gpu => None,
                    _ => Some((r.figures.clone(), r.gpu.clone())),
                },
                collectives: r.collectives.clone(),
            })
            .collect(),
    }
}

/// The summary `b` carries, inside `what` (for errors), whose rank views are `views`.
fn summary_from_binary(
    b: BinarySummary,
    views: &ViewFigures,
    what: &str,
) -> Result<Summary, BinaryError> {
    let mut summary: Summary = serde_json::from_str(&b.json)
        .map_err(|e| BinaryError::Malformed(format!("the summary inside {what}: {e}")))?;
    summary.ranks = b
        .ranks
        .into_iter()
        .map(|r| {
            let (figures, gpu) = match r.figures {
                Some(carried) => carried,
                None => {
                    let &(f, g) = views.get(&r.rank).ok_or_else(|| {
                        BinaryError::Malformed(format!(
                            "the summary inside {what} takes rank {}'s figures from its view, which {what} does not carry",
                            r.rank
                        ))
                    })?;
                    (f.clone(), g.clone())
                }
            };
            Ok(RankSummary {
                rank: r.rank,
                pid: r.pid,
                node: r.node,
                figures,
                gpu,
                collectives: r.collectives,
            })
        })
        .collect::<Result<_, BinaryError>>()?;
    Ok(summary)
}

fn snapshot_to_binary(v: &JobView) -> BinarySnapshot {
    let views = view_figures(v.ranks.values().map(|r| (r.rank, &r.figures, &r.gpu)));
    BinarySnapshot {
        schema: v.schema.clone(),
        name: v.name.clone(),
        summary: summary_to_binary(&v.summary, &views),
        now_ns: v.now_ns,
        attributed: v.attributed,
        samples_per_second: v.samples_per_second,
        batch_size: v.batch_size,
        ranks: v
            .ranks
            .values()
            .map(|r| (BinaryRank::from(r), r.recent.iter().copied().collect()))
            .collect(),
        nodes: v
            .nodes
            .values()
            .map(|n| {
                let history = n.history.iter().map(BinaryResources::from).collect();
                (BinaryNode::from(n), history)
            })
            .collect(),
        stragglers: v.stragglers.iter().cloned().collect(),
        records_dropped: v.records_dropped,
    }
}

fn snapshot_from_binary(b: BinarySnapshot) -> Result<JobView, BinaryError> {
    let views = view_figures(b.ranks.iter().map(|(r, _)| (r.rank, &r.figures, &r.gpu)));
    let summary = summary_from_binary(b.summary, &views, "a snapshot")?;
    Ok(JobView {
        schema: b.schema,
        name: b.name,
        summary,
        now_ns: b.now_ns,
        attributed: b.attributed,
        samples_per_second: b.samples_per_second,
        batch_size: b.batch_size,
        ranks: b
            .ranks
            .into_iter()
            .map(|(r, recent)| {
                let r = RankView {
                    recent: recent.into(),
                    ..RankView::from(r)
                };
                (r.rank, r)
            })
            .collect(),
        nodes: b
            .nodes
            .into_iter()
            .map(|(n, history)| {
                let n = NodeView {
                    history: history.into_iter().map(NodeResources::from).collect(),
                    ..NodeView::from(n)
                };
                (n.node.clone(), n)
            })
            .collect(),
        stragglers: b.stragglers.into(),
        records_dropped: b.records_dropped,
    })
}

/// [`RankView`] as an update sends it (no `recent`).
#[derive(Debug, Serialize, Deserialize)]
struct BinaryRank {
    rank: u32,
    node: String,
    pid: u32,
    figures: Figures,
    p95_iteration_seconds: f64,
    gpu: Option<RankGpu>,
    loader_workers: Option<u32>,
    loader_pids: Vec<u32>,
}

/// [`NodeView`] as an update sends it (no `history`).
#[derive(Debug, Serialize, Deserialize)]
struct BinaryNode {
    node: String,
    ranks: Vec<u32>,
    resources: Option<BinaryResources>,
    clock_offset_ns: Option<i64>,
    clock_uncertainty_ns: Option<u64>,
    records_dropped: u64,
    markers_dropped: u64,
    sources_down: Vec<String>,
    gpus: Vec<GpuIdentity>,
    nics: Vec<NicBytes>,
    counters: Option<BinaryCounters>,
    rdma_counters: Vec<RdmaCount>,
    flow_classes: Vec<crate::flows::FlowClassTotals>,
}

/// [`NodeResources`] with the RDMA rates its postcard form leaves out.
#[derive(Debug, Serialize, Deserialize)]
struct BinaryResources {
    resources: NodeResources,
    rdma_rx_bytes_per_s: Option<f64>,
    rdma_tx_bytes_per_s: Option<f64>,
}

/// [`NodeCounters`] with the RDMA bytes its postcard form leaves out.
#[derive(Debug, Serialize, Deserialize)]
struct BinaryCounters {
    counters: NodeCounters,
    rdma_rx_bytes: Option<f64>,
    rdma_tx_bytes: Option<f64>,
}

impl From<&NodeResources> for BinaryResources {
    fn from(r: &NodeResources) -> Self {
        BinaryResources {
            resources: r.clone(),
            rdma_rx_bytes_per_s: r.rdma_rx_bytes_per_s,
            rdma_tx_bytes_per_s: r.rdma_tx_bytes_per_s,
        }
    }
}

impl From<BinaryResources> for NodeResources {
    fn from(b: BinaryResources) -> Self {
        NodeResources {
            rdma_rx_bytes_per_s: b.rdma_rx_bytes_per_s,
            rdma_tx_bytes_per_s: b.rdma_tx_bytes_per_s,
            ..b.resources
        }
    }
}

impl From<&RankView> for BinaryRank {
    fn from(r: &RankView) -> Self {
        BinaryRank {
            rank: r.rank,
            node: r.node.clone(),
            pid: r.pid,
            figures: r.figures.clone(),
            p95_iteration_seconds: r.p95_iteration_seconds,
            gpu: r.gpu.clone(),
            loader_workers: r.loader_workers,
            loader_pids: r.loader_pids.clone(),
        }
    }
}

impl From<BinaryRank> for RankView {
    fn from(b: BinaryRank) -> Self {
        RankView {
            rank: b.rank,
            node: b.node,
            pid: b.pid,
            figures: b.figures,
            p95_iteration_seconds: b.p95_iteration_seconds,
            gpu: b.gpu,
            loader_workers: b.loader_workers,
            loader_pids: b.loader_pids,
            recent: Default::default(),
        }
    }
}

impl From<&NodeView> for BinaryNode {
    fn from(n: &NodeView) -> Self {
        BinaryNode {
            node: n.node.clone(),
            ranks: n.ranks.clone(),
            resources: n.resources.as_ref().map(BinaryResources::from),
            clock_offset_ns: n.clock_offset_ns,
            clock_uncertainty_ns: n.clock_uncertainty_ns,
            records_dropped: n.records_dropped,
            markers_dropped: n.markers_dropped,
            sources_down: n.sources_down.clone(),
            gpus: n.gpus.clone(),
            nics: n.nics.clone(),
            counters: n.counters.as_ref().map(|c| BinaryCounters {
                counters: c.clone(),
                rdma_rx_bytes: c.rdma_rx_bytes,
                rdma_tx_bytes: c.rdma_tx_bytes,
            }),
            rdma_counters: n.rdma_counters.clone(),
            flow_classes: n.flow_classes.clone(),
        }
    }
}

impl From<BinaryNode> for NodeView {
    fn from(b: BinaryNode) -> Self {
        NodeView {
            node: b.node,
            ranks: b.ranks,
            resources: b.resources.map(NodeResources::from),
            history: Default::default(),
            clock_offset_ns: b.clock_offset_ns,
            clock_uncertainty_ns: b.clock_uncertainty_ns,
            records_dropped: b.records_dropped,
            markers_dropped: b.markers_dropped,
            sources_down: b.sources_down,
            gpus: b.gpus,
            nics: b.nics,
            counters: b.counters.map(|c| NodeCounters {
                rdma_rx_bytes: c.rdma_rx_bytes,
                rdma_tx_bytes: c.rdma_tx_bytes,
                ..c.counters
            }),
            rdma_counters: b.rdma_counters,
            flow_classes: b.flow_classes,
        }
    }
}

fn to_binary(u: &ViewUpdate) -> BinaryUpdate {
    BinaryUpdate {
        now_ns: u.now_ns,
        attributed: u.attributed,
        samples_per_second: u.samples_per_second,
        batch_size: u.batch_size,
        records_dropped: u.records_dropped,
        summary: u.summary.as_ref().map(|s| {
            let views = view_figures(u.ranks.iter().map(|r| (r.rank, &r.figures, &r.gpu)));
            summary_to_binary(s, &views)
        }),
        ranks: u.ranks.iter().map(BinaryRank::from).collect(),
        parts: u.parts.clone(),
        nodes: u.nodes.iter().map(BinaryNode::from).collect(),
        stragglers: u.stragglers.clone(),
        readings: u
            .readings
            .iter()
            .map(|r| (r.node.clone(), BinaryResources::from(&r.resources)))
            .collect(),
        removed_ranks: u.removed_ranks.clone(),
        hangs: (!u.hangs.is_empty())
            .then(|| serde_json::to_string(&u.hangs).ok())
            .flatten(),
    }
}

fn from_binary(b: BinaryUpdate) -> Result<ViewUpdate, BinaryError> {
    let summary = match b.summary {
        Some(s) => {
            let views = view_figures(b.ranks.iter().map(|r| (r.rank, &r.figures, &r.gpu)));
            Some(Box::new(summary_from_binary(s, &views, "an update")?))
        }
        None => None,
    };
    let hangs = match b.hangs {
        Some(json) => serde_json::from_str(&json)
            .map_err(|e| BinaryError::Malformed(format!("the hangs inside an update: {e}")))?,
        None => Vec::new(),
    };
    Ok(ViewUpdate {
        now_ns: b.now_ns,
        attributed: b.attributed,
        samples_per_second: b.samples_per_second,
        batch_size: b.batch_size,
        records_dropped: b.records_dropped,
        summary,
        ranks: b.ranks.into_iter().map(RankView::from).collect(),
        parts: b.parts,
        nodes: b.nodes.into_iter().map(NodeView::from).collect(),
        stragglers: b.stragglers,
        readings: b
            .readings
            .into_iter()
            .map(|(node, r)| NodeReading {
                node,
                resources: r.into(),
            })
            .collect(),
        removed_ranks: b.removed_ranks,
        hangs,
    })
}

/// The frame of a message: its 4-byte little-endian length, then the postcard bytes.
pub fn encode_frame(msg: &FeedMessage) -> Vec<u8> {
    let bin = match msg {
        FeedMessage::Snapshot(v) => BinaryFeed::Snapshot(Box::new(snapshot_to_binary(v))),
        FeedMessage::Update(u) => {
            let mut out = vec![0u8; 4];
            encode_update(&to_binary(u), &mut out);
            let len = (out.len() - 4) as u32;
            out[..4].copy_from_slice(&len.to_le_bytes());
            return out;
        }
        FeedMessage::End => BinaryFeed::End,
    };
    let mut out = vec![0u8; 4];
    // Serialising plain data into a Vec cannot fail.
    out = postcard::to_extend(&bin, out).unwrap_or_default();
    let len = (out.len().saturating_sub(4)) as u32;
    if out.len() >= 4 {
        out[..4].copy_from_slice(&len.to_le_bytes());
    }
    out
}

/// [`BinaryFeed::Update`]'s variant index.
const UPDATE: u64 = 1;

/// Appends postcard's bytes of `BinaryFeed::Update(u)`: the iterations' parts (one per
/// rank-iteration, 300,000 a second at 10,000 ranks) written by hand, each other field by
/// postcard (a field's bytes are its own whatever follows it).
fn encode_update(u: &BinaryUpdate, out: &mut Vec<u8>) {
    fn field<T: Serialize>(out: &mut Vec<u8>, v: &T) {
        *out = postcard::to_extend(v, std::mem::take(out)).expect("plain data always encodes");
    }
    let BinaryUpdate {
        now_ns,
        attributed,
        samples_per_second,
        batch_size,
        records_dropped,
        summary,
        ranks,
        parts,
        nodes,
        stragglers,
        readings,
        removed_ranks,
        hangs,
    } = u;
    push_varint(out, UPDATE);
    push_varint(out, *now_ns);
    push_varint(out, *attributed);
    field(out, samples_per_second);
    field(out, batch_size);
    push_varint(out, *records_dropped);
    field(out, summary);
    field(out, ranks);
    out.reserve(parts.len() * 24);
    push_varint(out, parts.len() as u64);
    for (rank, p) in parts {
        let IterationParts {
            iter,
            end_ns,
            split,
            gpu_busy_ppm,
        } = p;
        push_varint(out, u64::from(*rank));
        push_varint(out, *iter);
        push_varint(out, *end_ns);
        for v in split.ns {
            push_varint(out, v);
        }
        push_opt(out, gpu_busy_ppm.map(u64::from));
    }
    field(out, nodes);
    field(out, stragglers);
    field(out, readings);
    field(out, removed_ranks);
    field(out, hangs);
}

/// `postcard::from_bytes::<BinaryFeed>` of an update, its parts read by hand; `None` for
/// another message or whatever this reading does not take (postcard reads it then).
fn decode_update(payload: &[u8]) -> Option<BinaryUpdate> {
    fn field<T: serde::de::DeserializeOwned>(r: &mut Reader) -> Option<T> {
        let (v, rest) = postcard::take_from_bytes(r.rest).ok()?;
        r.rest = rest;
        Some(v)
    }
    let mut r = Reader { rest: payload };
    if r.u32()? != UPDATE as u32 {
        return None;
    }
    let now_ns = r.u64()?;
    let attributed = r.u64()?;
    let samples_per_second = field(&mut r)?;
    let batch_size = field(&mut r)?;
    let records_dropped = r.u64()?;
    let summary = field(&mut r)?;
    let ranks = field(&mut r)?;
    let n = r.len(11)?;
    let mut parts = Vec::with_capacity(n);
    for _ in 0..n {
        let rank = r.u32()?;
        let iter = r.u64()?;
        let end_ns = r.u64()?;
        let mut split = crate::category::Split::default();
        for v in &mut split.ns {
            *v = r.u64()?;
        }
        let gpu_busy_ppm = r.opt_u32()?;
        parts.push((
            rank,
            IterationParts {
                iter,
                end_ns,
                split,
                gpu_busy_ppm,
            },
        ));
    }
    Some(BinaryUpdate {
        now_ns,
        attributed,
        samples_per_second,
        batch_size,
        records_dropped,
        summary,
        ranks,
        parts,
        nodes: field(&mut r)?,
        stragglers: field(&mut r)?,
        readings: field(&mut r)?,
        removed_ranks: field(&mut r)?,
        hangs: field(&mut r)?,
    })
}

/// The payload length a frame's prefix announces, refused when over [`MAX_FRAME`].
pub fn frame_len(prefix: [u8; 4]) -> Result<usize, BinaryError> {
    let len = u32::from_le_bytes(prefix) as usize;
    if len > MAX_FRAME {
        return Err(BinaryError::TooLong {
            len,
            limit_mib: MAX_FRAME >> 20,
        });
    }
    Ok(len)
}

/// The message a frame's payload (after its prefix) holds.
pub fn decode_payload(payload: &[u8]) -> Result<FeedMessage, BinaryError> {
    if let Some(u) = decode_update(payload) {
        return Ok(FeedMessage::Update(std::sync::Arc::new(from_binary(u)?)));
    }
    let bin: BinaryFeed =
        postcard::from_bytes(payload).map_err(|e| BinaryError::Malformed(e.to_string()))?;
    Ok(match bin {
        BinaryFeed::Snapshot(v) => {
            FeedMessage::Snapshot(std::sync::Arc::new(snapshot_from_binary(*v)?))
        }
        BinaryFeed::Update(u) => FeedMessage::Update(std::sync::Arc::new(from_binary(*u)?)),
        BinaryFeed::End => FeedMessage::End,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::category::{Category, Split};
    use std::sync::Arc;

    /// A summary of rank 5, whose view holds the same figures and GPU, and of rank 6,
    /// which has no view in the message and figures of its own.
    fn summary_of_ranks(figures: &Figures, gpu: &RankGpu) -> Summary {
        let collective = Collective {
            op: "all_gather_into_tensor".into(),
            group: Some("0".into()),
            role: Some(crate::collectives::Role::Fsdp),
            count_per_iteration: 12.0,
            bytes_per_iteration: 3e8,
            seconds_per_iteration: 0.02,
            waited_seconds_per_iteration: 0.005,
        };
        Summary {
            schema: crate::summary::SCHEMA.into(),
            wall_seconds: 12.5,
            ranks: vec![
                RankSummary {
                    rank: 5,
                    pid: 99,
                    node: Some("n1".into()),
                    figures: figures.clone(),
                    gpu: Some(gpu.clone()),
                    collectives: vec![collective.clone()],
                },
                RankSummary {
                    rank: 6,
                    pid: 98,
                    node: None,
                    figures: Figures {
                        iterations: 3,
                        ..figures.clone()
                    },
                    gpu: None,
                    collectives: vec![Collective {
                        group: None,
                        role: None,
                        ..collective
                    }],
                },
            ],
            warnings: vec!["two nodes report rank 6".into()],
            ..Summary::default()
        }
    }

    fn full_update() -> ViewUpdate {
        let mut split = Split::default();
        split.add(Category::Compute, 80_000_000);
        split.add(Category::PeerWait, 5_000_000);
        let figures = crate::figures::figures(&crate::aggregate::Totals {
            iterations: 40,
            split,
            marked_ns: split.total(),
            ..crate::aggregate::Totals::new(16)
        });
        let gpu = RankGpu {
            gpu: "NVIDIA H200".into(),
            uuid: Some("GPU-0b7c".into()),
            busy_fraction: Some(0.93),
            power_watts: Some(512.0),
            ..RankGpu::default()
        };
        let resources = NodeResources {
            t_ns: 1_000,
            dur_ns: 1_000_000_000,
            cpu_busy_cores: Some(3.5),
            rdma_rx_bytes_per_s: Some(12e9),
            rdma_tx_bytes_per_s: Some(11e9),
            ..NodeResources::default()
        };
        ViewUpdate {
            now_ns: 42,
            attributed: 7,
            samples_per_second: Some(1234.5),
            batch_size: Some(64),
            records_dropped: 3,
            summary: Some(Box::new(summary_of_ranks(&figures, &gpu))),
            ranks: vec![RankView {
                rank: 5,
                node: "n1".into(),
                pid: 99,
                figures: figures.clone(),
                p95_iteration_seconds: 0.12,
                gpu: Some(gpu.clone()),
                loader_workers: Some(2),
                loader_pids: vec![100, 101],
                ..RankView::default()
            }],
            parts: vec![(
                5,
                IterationParts {
                    iter: 10,
                    end_ns: 1_000_000,
                    split,
                    gpu_busy_ppm: Some(870_000),
                },
            )],
            nodes: vec![NodeView {
                node: "n1".into(),
                ranks: vec![5],
                resources: Some(resources.clone()),
                counters: Some(NodeCounters {
                    cpu_seconds: Some(1.5),
                    rdma_rx_bytes: Some(9e9),
                    rdma_tx_bytes: Some(8e9),
                    ..NodeCounters::default()
                }),
                sources_down: vec!["nvml: no driver".into()],
                clock_offset_ns: Some(-50),
                flow_classes: vec![crate::flows::FlowClassTotals {
                    class: Some(crate::flows::FlowClass::Collective),
                    bytes_in: 9_000,
                    bytes_out: 8_000,
                    retransmits: 12,
                }],
                ..NodeView::default()
            }],
            stragglers: vec![],
            readings: vec![NodeReading {
                node: "n1".into(),
                resources,
            }],
            removed_ranks: vec![2],
            hangs: vec![crate::hang::HangReport {
                at_seconds: 70.0,
                missing_ranks: vec![1],
                missing_at: vec!["1@n2".into()],
                ..Default::default()
            }],
        }
    }

    /// `u` encoded as a frame and read back.
    fn update_round_trip(u: &ViewUpdate) -> ViewUpdate {
        match round_trip(&FeedMessage::Update(Arc::new(u.clone()))) {
            FeedMessage::Update(back) => (*back).clone(),
            _ => panic!("not an update"),
        }
    }

    fn round_trip(msg: &FeedMessage) -> FeedMessage {
        let frame = encode_frame(msg);
        let len = frame_len(frame[..4].try_into().unwrap()).unwrap();
        assert_eq!(len, frame.len() - 4);
        decode_payload(&frame[4..]).unwrap()
    }

    #[test]
    fn an_update_reads_back_whole_rdma_figures_included() {
        let u = full_update();
        let back = update_round_trip(&u);
        assert_eq!(back, u);
    }

    #[test]
    fn a_snapshot_and_the_end_read_back() {
        let mut view = JobView::new("train");
        view.apply(full_update());
        let FeedMessage::Snapshot(back) =
            round_trip(&FeedMessage::Snapshot(Arc::new(view.clone())))
        else {
            panic!("not a snapshot");
        };
        assert_eq!(*back, view);
        assert!(matches!(round_trip(&FeedMessage::End), FeedMessage::End));
    }

    /// The bytes postcard makes of an update, and what it reads back of any bytes.
    fn serde_frame(msg: &FeedMessage) -> Vec<u8> {
        let FeedMessage::Update(u) = msg else {
            return encode_frame(msg);
        };
        let mut out = vec![0u8; 4];
        out = postcard::to_extend(&BinaryFeed::Update(Box::new(to_binary(u))), out).unwrap();
        let len = (out.len() - 4) as u32;
        out[..4].copy_from_slice(&len.to_le_bytes());
        out
    }

    fn updates() -> Vec<ViewUpdate> {
        let full = full_update();
        let mut many = full.clone();
        many.summary = None;
        many.hangs.clear();
        many.parts = (0..300u32)
            .map(|i| {
                let mut p = full.parts[0].1;
                p.iter = u64::from(i) * 977;
                p.end_ns = u64::from(i).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                p.split.ns[i as usize % 7] = u64::MAX >> (i % 64);
                p.gpu_busy_ppm = (i % 3 != 0).then_some(i * 4099);
                (i.wrapping_mul(2_654_435_761), p)
            })
            .collect();
        vec![full, many, ViewUpdate::default()]
    }

    /// An update's parts written and read by hand: postcard's bytes, read back as postcard
    /// reads them, damaged ones included.
    #[test]
    fn an_update_by_hand_is_postcards_bytes() {
        for u in updates() {
            let msg = FeedMessage::Update(Arc::new(u.clone()));
            let frame = encode_frame(&msg);
            assert_eq!(frame, serde_frame(&msg));
            assert!(decode_update(&frame[4..]).is_some());
            let FeedMessage::Update(back) = round_trip(&msg) else {
                panic!("not an update");
            };
            assert_eq!(*back, u);
            let payload = &frame[4..];
            let mut seed = 7u64;
            for cut in 0..payload.len().min(400) {
                seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                let mut damaged = payload[..payload.len() - cut].to_vec();
                if !damaged.is_empty() {
                    let at = (seed >> 33) as usize % damaged.len();
                    damaged[at] = (seed >> 20) as u8;
                }
                let serde: Option<BinaryFeed> = postcard::from_bytes(&damaged).ok();
                match (decode_update(&damaged), serde) {
                    (Some(hand), Some(BinaryFeed::Update(want))) => {
                        let bytes = |u: &BinaryUpdate| {
                            let mut out = Vec::new();
                            encode_update(u, &mut out);
                            out
                        };
                        assert_eq!(bytes(&hand), bytes(&want), "cut {cut}");
                    }
                    (Some(_), _) => panic!("read by hand, not by postcard: cut {cut}"),
                    (None, _) => {}
                }
            }
        }
    }

    /// A refresh sends every rank's view and its summary, both with the rank's figures: the
    /// summary's copy is left out where the view's is the same, and read back from it.
    #[test]
    fn a_summary_rank_takes_the_figures_of_its_view_in_the_message() {
        let u = full_update();
        let summary = to_binary(&u).summary.expect("the update has a summary");
        let carried: Vec<_> = summary
            .ranks
            .iter()
            .map(|r| (r.rank, r.figures.is_some()))
            .collect();
        assert_eq!(carried, [(5, false), (6, true)]);
        let back = update_round_trip(&u);
        assert_eq!(back.summary, u.summary);
        // A view whose figures differ from the summary's does not lend them.
        let mut other = u.clone();
        other.ranks[0].figures.iterations += 1;
        let summary = to_binary(&other).summary.expect("the update has a summary");
        assert!(summary.ranks.iter().all(|r| r.figures.is_some()));
        let back = update_round_trip(&other);
        assert_eq!(back, other);
    }

    /// A refresh of 1,000 ranks: the update with every rank's view and the summary is smaller
    /// than the summary's JSON alone, which version 1 of the form carried.
    #[test]
    fn a_refresh_of_many_ranks_is_smaller_than_its_summarys_json() {
        let one = full_update();
        let mut u = one.clone();
        let summary = u.summary.as_mut().expect("the update has a summary");
        summary.ranks = (0..1_000)
            .map(|rank| RankSummary {
                rank,
                node: Some(format!("node-{}", rank / 8)),
                ..one.summary.as_ref().unwrap().ranks[0].clone()
            })
            .collect();
        u.ranks = (0..1_000)
            .map(|rank| RankView {
                rank,
                node: format!("node-{}", rank / 8),
                ..one.ranks[0].clone()
            })
            .collect();
        let frame = encode_frame(&FeedMessage::Update(Arc::new(u.clone())));
        let summary_json = serde_json::to_string(u.summary.as_ref().unwrap()).unwrap();
        assert!(
            frame.len() < summary_json.len(),
            "{} bytes of frame, {} of the summary's JSON",
            frame.len(),
            summary_json.len()
        );
        let FeedMessage::Update(back) = decode_payload(&frame[4..]).unwrap() else {
            panic!("not an update");
        };
        assert_eq!(*back, u);
    }

    #[test]
    fn a_summary_rank_that_lends_figures_from_no_view_is_malformed() {
        let mut b = to_binary(&full_update());
        b.ranks.clear();
        let mut frame = Vec::new();
        encode_update(&b, &mut frame);
        let err = decode_payload(&frame).unwrap_err();
        assert!(
            err.to_string()
                .contains("takes rank 5's figures from its view, which an update does not carry"),
            "{err}"
        );
    }

    #[test]
    fn an_update_is_a_fraction_of_its_json() {
        let msg = FeedMessage::Update(Arc::new(full_update()));
        let json = super::super::hub::json_line(&msg);
        assert!(encode_frame(&msg).len() * 2 < json.len());
    }

    #[test]
    fn malformed_frames_are_errors_that_say_so() {
        let frame = encode_frame(&FeedMessage::Update(Arc::new(full_update())));
        let err = decode_payload(&frame[4..frame.len() / 2]).unwrap_err();
        assert!(
            err.to_string().contains("malformed binary feed frame"),
            "{err}"
        );
        let err = decode_payload(&[9, 1, 2]).unwrap_err();
        assert!(err.to_string().contains("malformed"), "{err}");
        let err = frame_len((MAX_FRAME as u32 + 1).to_le_bytes()).unwrap_err();
        assert!(err.to_string().contains("over the 64 MiB limit"), "{err}");
    }
}
