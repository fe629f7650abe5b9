//! Consecutive markers and breakdowns packed column by column, their times as deltas
//! ([`Frame::IterationPack`]).
//!
//! Once the flight recorder thinned a run profile's samples (`crate::journal::retention`),
//! what is left per iteration is its markers (~7 per rank-iteration) and its breakdown:
//! ~128 bytes per rank-iteration deflated, written one postcard frame each (issue 31). In
//! those frames every time is a full `CLOCK_MONOTONIC` nanosecond count (8 bytes as a
//! varint), every phase name a string, and every field sits next to the other fields of its
//! frame, so deflate finds little to share. An [`IterationPack`] keeps the frames' order and
//! every value, but stores each field as a column, numbers as the difference from the same
//! process's previous one (a marker's time from its previous marker's, a breakdown's start
//! from its previous end), and repeated values (processes, events, evidence rules) as indices
//! into tables. The profile's reader gives the frames back one at a time
//! ([`IterationPack::into_frames`]), so nothing past the file sees this variant.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::attribution::{Basis, Coverage, Evidence, IterationBreakdown};
use crate::category::{Category, Split};
use crate::frame::Frame;
use crate::marker::{Marker, MarkerEvent};

/// Items a pack holds at most, a marker counting 1 and a breakdown [`BREAKDOWN_ITEMS`]
/// (~10 and ~40 bytes packed), so that a pack stays under the profile writer's 32-KiB
/// deflate chunk (one markers frame larger than that is packed whole).
pub const PACK_MAX_ITEMS: usize = 1_536;

/// Items a breakdown counts for.
pub const BREAKDOWN_ITEMS: usize = 4;

/// Consecutive [`Frame::Markers`] and [`Frame::Breakdown`] frames, column by column.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IterationPack {
    /// Each frame in order: 0 for a breakdown, `n + 1` for a markers frame of `n` markers.
    pub frames: Vec<u32>,
    /// The processes the markers and breakdowns are of.
    pub pids: Vec<u32>,
    /// The distinct marker events, in first-seen order.
    pub events: Vec<MarkerEvent>,
    /// Per marker: its process, an index into `pids`.
    pub m_pid: Vec<u32>,
    /// Per marker: its rank plus one, 0 when it did not know it.
    pub m_rank: Vec<u32>,
    /// Per marker: its sequence number minus its process's previous one's in the pack (the
    /// first: itself).
    pub m_seq: Vec<i64>,
    /// Per marker: ns, its time minus its process's previous marker's (the first: itself).
    pub m_t: Vec<i64>,
    /// Per marker: its iteration minus its process's previous marker's (the first: itself).
    pub m_iter: Vec<i64>,
    /// Per marker: its event, an index into `events` (an operation's with its number 0).
    pub m_event: Vec<u32>,
    /// Per marker that begins a communication operation: its number minus its process's
    /// previous operation's in the pack (the first: itself).
    pub m_op_seq: Vec<i64>,
    /// The distinct evidence rules of a breakdown, in first-seen order.
    pub rules: Vec<Vec<(Category, Basis)>>,
    /// Per breakdown: its process, an index into `pids`.
    pub b_pid: Vec<u32>,
    /// Per breakdown: its rank.
    pub b_rank: Vec<u32>,
    /// Per breakdown: its iteration minus its process's previous breakdown's (the first:
    /// itself).
    pub b_iter: Vec<i64>,
    /// Per breakdown: ns, its start minus its process's previous breakdown's end (the first:
    /// itself).
    pub b_start: Vec<i64>,
    /// Per breakdown: ns, its wall time minus the sum of its split (0: they agree).
    pub b_wall: Vec<i64>,
    /// Per category ([`Category::index`]), per breakdown: ns.
    pub b_split: Vec<Vec<u64>>,
    /// Per breakdown: its evidence's rules, an index into `rules`.
    pub b_rules: Vec<u32>,
    /// Every breakdown's evidence's ns minus its category's ns in the split, in order.
    pub b_evidence_ns: Vec<i64>,
    /// Per breakdown: ns inside marked phases minus its wall time.
    pub b_marked: Vec<i64>,
    /// Per breakdown: ns covered by sample ticks minus its wall time.
    pub b_sampled: Vec<i64>,
}

/// `now - before` as a signed delta (wrapping, so any two values round-trip).
fn delta(now: u64, before: u64) -> i64 {
    now.wrapping_sub(before) as i64
}

/// The value `d` after `before`.
fn undelta(before: u64, d: i64) -> u64 {
    before.wrapping_add(d as u64)
}

/// Each process's previous values, while packing or unpacking.
#[derive(Clone, Copy, Default)]
struct Last {
    seq: u64,
    t: u64,
    iter: u64,
    op_seq: u64,
    b_iter: u64,
    b_end: u64,
}

/// Builds an [`IterationPack`] frame by frame.
#[derive(Default)]
pub struct IterationPackBuilder {
    pack: IterationPack,
    pid_index: HashMap<u32, u32>,
    event_index: HashMap<MarkerEvent, u32>,
    rule_index: HashMap<Vec<(Category, Basis)>, u32>,
    last: Vec<Last>,
    items: usize,
}

impl IterationPackBuilder {
    /// Whether nothing was packed.
    pub fn is_empty(&self) -> bool {
        self.pack.frames.is_empty()
    }

    /// Markers and breakdowns packed.
    pub fn items(&self) -> usize {
        self.items
    }

    fn pid(&mut self, pid: u32) -> usize {
        let next = self.pack.pids.len() as u32;
        let i = *self.pid_index.entry(pid).or_insert(next);
        if i == next {
            self.pack.pids.push(pid);
            self.last.push(Last::default());
        }
        i as usize
    }

    /// Packs `frame` when it is markers or a breakdown; false (nothing packed) otherwise.
    pub fn push(&mut self, frame: &Frame) -> bool {
        match frame {
            Frame::Markers(ms) => {
                self.pack.frames.push(ms.len() as u32 + 1);
                ms.iter().for_each(|m| self.push_marker(m));
                self.items += ms.len().max(1);
                true
            }
            Frame::Breakdown(b) => {
                self.pack.frames.push(0);
                self.push_breakdown(b);
                self.items += BREAKDOWN_ITEMS;
                true
            }
            _ => false,
        }
    }

    fn push_marker(&mut self, m: &Marker) {
        let p = self.pid(m.pid);
        let last = self.last[p];
        let pack = &mut self.pack;
        pack.m_pid.push(p as u32);
        pack.m_rank.push(m.rank.map_or(0, |r| r.wrapping_add(1)));
        pack.m_seq.push(delta(m.seq, last.seq));
        pack.m_t.push(delta(m.t_ns, last.t));
        pack.m_iter.push(delta(m.iter, last.iter));
        let mut event = m.event.clone();
        let mut op_seq = last.op_seq;
        if let MarkerEvent::BeginOp(_, op) = &mut event {
            op_seq = std::mem::take(&mut op.seq);
            pack.m_op_seq.push(delta(op_seq, last.op_seq));
        }
        let next = pack.events.len() as u32;
        let e = *self.event_index.entry(event).or_insert_with_key(|event| {
            pack.events.push(event.clone());
            next
        });
        pack.m_event.push(e);
        let l = &mut self.last[p];
        (l.seq, l.t, l.iter, l.op_seq) = (m.seq, m.t_ns, m.iter, op_seq);
    }

    fn push_breakdown(&mut self, b: &IterationBreakdown) {
        let p = self.pid(b.pid);
        let last = self.last[p];
        let pack = &mut self.pack;
        pack.b_pid.push(p as u32);
        pack.b_rank.push(b.rank);
        pack.b_iter.push(delta(b.iter, last.b_iter));
        pack.b_start.push(delta(b.start_ns, last.b_end));
        let wall = b.end_ns.wrapping_sub(b.start_ns);
        let sum = b.split.ns.iter().fold(0u64, |a, ns| a.wrapping_add(*ns));
        pack.b_wall.push(delta(wall, sum));
        if pack.b_split.is_empty() {
            pack.b_split = vec![Vec::new(); b.split.ns.len()];
        }
        for (column, ns) in pack.b_split.iter_mut().zip(b.split.ns) {
            column.push(ns);
        }
        let rules: Vec<(Category, Basis)> =
            b.evidence.iter().map(|e| (e.category, e.basis)).collect();
        let next = pack.rules.len() as u32;
        let r = match self.rule_index.get(&rules) {
            Some(r) => *r,
            None => {
                pack.rules.push(rules.clone());
                self.rule_index.insert(rules, next);
                next
            }
        };
        pack.b_rules.push(r);
        pack.b_evidence_ns.extend(
            b.evidence
                .iter()
                .map(|e| delta(e.ns, b.split.get(e.category))),
        );
        pack.b_marked.push(delta(b.coverage.marked_ns, wall));
        pack.b_sampled.push(delta(b.coverage.sampled_ns, wall));
        let l = &mut self.last[p];
        (l.b_iter, l.b_end) = (b.iter, b.end_ns);
    }

    /// The pack, and an empty builder in place of this one.
    pub fn take(&mut self) -> IterationPack {
        std::mem::take(self).pack
    }
}

/// Reads one column in order, or says which ran short.
struct Column<'a, T> {
    name: &'static str,
    values: std::slice::Iter<'a, T>,
}

impl<'a, T: Copy> Column<'a, T> {
    fn of(name: &'static str, values: &'a [T]) -> Self {
        Column {
            name,
            values: values.iter(),
        }
    }

    fn next(&mut self) -> Result<T, String> {
        self.values
            .next()
            .copied()
            .ok_or_else(|| format!("an iteration pack's column {} runs short", self.name))
    }
}

impl IterationPack {
    /// The frames packed, in their order; an error when the columns do not agree (a pack
    /// whose checksum held but that no writer made).
    pub fn into_frames(self) -> Result<Vec<Frame>, String> {
        let p = &self;
        let mut last = vec![Last::default(); p.pids.len()];
        let pid_at = |i: u32| -> Result<(usize, u32), String> {
            p.pids
                .get(i as usize)
                .map(|pid| (i as usize, *pid))
                .ok_or_else(|| format!("an iteration pack names process {i} of {}", p.pids.len()))
        };
        let (mut m_pid, mut m_rank, mut m_seq) = (
            Column::of("m_pid", &p.m_pid),
            Column::of("m_rank", &p.m_rank),
            Column::of("m_seq", &p.m_seq),
        );
        let (mut m_t, mut m_iter, mut m_event, mut m_op_seq) = (
            Column::of("m_t", &p.m_t),
            Column::of("m_iter", &p.m_iter),
            Column::of("m_event", &p.m_event),
            Column::of("m_op_seq", &p.m_op_seq),
        );
        let (mut b_pid, mut b_rank, mut b_iter, mut b_start, mut b_wall) = (
            Column::of("b_pid", &p.b_pid),
            Column::of("b_rank", &p.b_rank),
            Column::of("b_iter", &p.b_iter),
            Column::of("b_start", &p.b_start),
            Column::of("b_wall", &p.b_wall),
        );
        let (mut b_rules, mut b_evidence_ns, mut b_marked, mut b_sampled) = (
            Column::of("b_rules", &p.b_rules),
            Column::of("b_evidence_ns", &p.b_evidence_ns),
            Column::of("b_marked", &p.b_marked),
            Column::of("b_sampled", &p.b_sampled),
        );
        let mut split: Vec<Column<u64>> =
            p.b_split.iter().map(|c| Column::of("b_split", c)).collect();
        let categories = Split::default().ns.len();
        if !p.b_wall.is_empty() && split.len() != categories {
            return Err(format!(
                "an iteration pack splits into {} categories, not {categories}",
                split.len()
            ));
        }
        // A writer packs at most PACK_MAX_ITEMS frames besides those with values.
        if p.frames.len() > p.m_pid.len() + p.b_pid.len() + PACK_MAX_ITEMS {
            return Err(format!(
                "an iteration pack holds {} frames of {} values",
                p.frames.len(),
                p.m_pid.len() + p.b_pid.len()
            ));
        }
        let mut frames = Vec::with_capacity(p.frames.len());
        for &n in &p.frames {
            if n == 0 {
                let (i, pid) = pid_at(b_pid.next()?)?;
                let l = &mut last[i];
                let iter = undelta(l.b_iter, b_iter.next()?);
                let start_ns = undelta(l.b_end, b_start.next()?);
                let mut s = Split::default();
                for (ns, column) in s.ns.iter_mut().zip(split.iter_mut()) {
                    *ns = column.next()?;
                }
                let sum = s.ns.iter().fold(0u64, |a, ns| a.wrapping_add(*ns));
                let wall = undelta(sum, b_wall.next()?);
                let end_ns = start_ns.wrapping_add(wall);
                (l.b_iter, l.b_end) = (iter, end_ns);
                let r = b_rules.next()?;
                let rules = p
                    .rules
                    .get(r as usize)
                    .ok_or_else(|| format!("an iteration pack names rules {r}"))?;
                let evidence = rules
                    .iter()
                    .map(|(category, basis)| {
                        Ok(Evidence {
                            category: *category,
                            basis: *basis,
                            ns: undelta(s.get(*category), b_evidence_ns.next()?),
                        })
                    })
                    .collect::<Result<_, String>>()?;
                frames.push(Frame::Breakdown(IterationBreakdown {
                    rank: b_rank.next()?,
                    pid,
                    iter,
                    start_ns,
                    end_ns,
                    split: s,
                    evidence,
                    coverage: Coverage {
                        marked_ns: undelta(wall, b_marked.next()?),
                        sampled_ns: undelta(wall, b_sampled.next()?),
                    },
                }));
                continue;
            }
            let n = n as usize - 1;
            let mut ms = Vec::with_capacity(n.min(p.m_pid.len()));
            for _ in 0..n {
                let (i, pid) = pid_at(m_pid.next()?)?;
                let rank = m_rank.next()?;
                let l = &mut last[i];
                let seq = undelta(l.seq, m_seq.next()?);
                let t_ns = undelta(l.t, m_t.next()?);
                let iter = undelta(l.iter, m_iter.next()?);
                (l.seq, l.t, l.iter) = (seq, t_ns, iter);
                let e = m_event.next()?;
                let mut event = p
                    .events
                    .get(e as usize)
                    .cloned()
                    .ok_or_else(|| format!("an iteration pack names event {e}"))?;
                if let MarkerEvent::BeginOp(_, op) = &mut event {
                    op.seq = undelta(l.op_seq, m_op_seq.next()?);
                    l.op_seq = op.seq;
                }
                ms.push(Marker {
                    seq,
                    t_ns,
                    pid,
                    rank: rank.checked_sub(1),
                    iter,
                    event,
                });
            }
            frames.push(Frame::Markers(ms));
        }
        Ok(frames)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::marker::CommOp;

    fn marker(seq: u64, t_ns: u64, pid: u32, iter: u64, event: MarkerEvent) -> Marker {
        Marker {
            seq,
            t_ns,
            pid,
            rank: if pid == 8 { None } else { Some(pid - 7) },
            iter,
            event,
        }
    }

    /// Two processes' markers and breakdowns interleaved, an empty markers frame, every kind
    /// of event and values at the ends of their ranges.
    fn frames() -> Vec<Frame> {
        let mut frames = vec![Frame::Markers(vec![])];
        let mut t = 5_000_000_000_000u64;
        for i in 0..20u64 {
            for pid in [7u32, 8, 9] {
                let s = 10 * i;
                frames.push(Frame::Markers(vec![
                    marker(s, t, pid, i, MarkerEvent::Begin("data".into())),
                    marker(s + 1, t + 1_234, pid, i, MarkerEvent::End("data".into())),
                    marker(
                        s + 2,
                        t + 5_000,
                        pid,
                        i,
                        MarkerEvent::BeginOp(
                            "all_reduce".into(),
                            CommOp {
                                op: "all_reduce".into(),
                                group: 0,
                                seq: i,
                                bytes: 1 << 20,
                                peer: None,
                            },
                        ),
                    ),
                    marker(
                        s + 3,
                        t + 9_000,
                        pid,
                        i,
                        MarkerEvent::BeginWaiting("x".into(), 3),
                    ),
                    marker(s + 4, t + 10_000, pid, i + 1, MarkerEvent::Step),
                ]));
                let mut split = Split::default();
                split.ns[0] = 3_000;
                split.ns[6] = 7_000 + i;
                frames.push(Frame::Breakdown(IterationBreakdown {
                    rank: pid - 7,
                    pid,
                    iter: i,
                    start_ns: t,
                    end_ns: t + 10_000 + i,
                    split,
                    evidence: if i % 2 == 0 {
                        vec![]
                    } else {
                        vec![Evidence {
                            category: Category::Compute,
                            basis: Basis::ComputeMarker,
                            ns: 7_000,
                        }]
                    },
                    coverage: Coverage {
                        marked_ns: 9_000,
                        sampled_ns: u64::MAX,
                    },
                }));
            }
            t += 10_000 + i;
        }
        frames.push(Frame::Markers(vec![marker(
            u64::MAX,
            0,
            7,
            0,
            MarkerEvent::Meta(vec![("workers".into(), "2".into())]),
        )]));
        frames
    }

    #[test]
    fn a_pack_gives_back_its_frames_in_order_and_is_smaller() {
        let frames = frames();
        let mut b = IterationPackBuilder::default();
        for f in &frames {
            assert!(b.push(f));
        }
        assert!(!b.push(&Frame::ProcessExit { pid: 7, t_ns: 1 }));
        let pack = b.take();
        assert!(b.is_empty());
        let packed = Frame::IterationPack(Box::new(pack.clone())).encode().len();
        let plain: usize = frames.iter().map(|f| f.encode().len()).sum();
        assert!(packed * 2 < plain, "{packed} bytes packed, {plain} plain");
        let back = Frame::decode(&Frame::IterationPack(Box::new(pack)).encode()).unwrap();
        let Frame::IterationPack(pack) = back else {
            panic!("not a pack")
        };
        assert_eq!(pack.into_frames().unwrap(), frames);
    }

    #[test]
    fn a_pack_whose_columns_disagree_is_an_error_not_a_panic() {
        let mut b = IterationPackBuilder::default();
        frames().iter().for_each(|f| {
            b.push(f);
        });
        let whole = b.take();
        let mut short = whole.clone();
        short.m_t.pop();
        assert!(short.into_frames().unwrap_err().contains("m_t"));
        let mut bad = whole.clone();
        bad.m_pid[3] = 99;
        assert!(bad.into_frames().is_err());
        let mut bad = whole;
        bad.b_split.pop();
        assert!(bad.into_frames().is_err());
    }
}
