//! A rank's iteration as a record, written and read without serde's generic machinery.
//!
//! At 10,000 ranks an agent's shipper writes, and the collector reads, 300,000
//! [`AgentMsg::Record`]s of a [`Frame::NodeReport`] a second. Through serde, postcard took
//! ~2,900 instructions (callgrind) to write one and ~3,500 to read it; by hand ~1,700 and
//! ~3,000 (the reading's rest is its varints, 7-byte times among them, and its allocations).
//! This writes and reads the same bytes, postcard's:
//!
//! - [`encode_record`] appends exactly what [`super::encode_into`] appends for
//!   `AgentMsg::Record { seq, frame }` (any frame; a `NodeReport` by hand, the rest through
//!   postcard);
//! - [`take_agent_msg`] gives exactly what `postcard::take_from_bytes::<AgentMsg>` gives: a
//!   record of a `NodeReport` is read by hand, and whatever that reading does not take
//!   (another message, another frame, or anything it does not expect: a bad varint, a
//!   variant it does not know, bytes missing) is read again by postcard, which then decides.
//!
//! Postcard's format, as far as used here: unsigned integers as varints (7 bits a byte, least
//! first, the top bit on every byte but the last; at most 5 bytes for a `u32`, 10 for a
//! `u64`, the last byte's extra bits zero), an enum's variant as a varint of its index, an
//! `Option` as a byte 0 or 1 then the value, a `bool` as a byte 0 or 1, a string or vector as
//! a varint length then its items, a struct or array as its fields in order. The tests check
//! every byte against postcard's.

use crate::attribution::{Basis, Coverage, Evidence, IterationBreakdown};
use crate::category::{Category, Split};
use crate::frame::{CommSpan, Frame, NodeIteration, NodeReport};
use crate::gpu_usage::NvmlReading;

use super::{AgentMsg, WireError};

/// [`AgentMsg::Record`]'s variant index.
const RECORD: u32 = 2;
/// [`Frame::NodeReport`]'s variant index.
const NODE_REPORT: u32 = 13;

/// Appends to `out` the bytes [`super::encode_into`] appends for
/// `AgentMsg::Record { seq, frame }`: length prefix and payload, a [`Frame::NodeReport`]
/// written by hand, without taking the frame.
pub fn encode_record(seq: u64, frame: &Frame, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    push_varint(out, u64::from(RECORD));
    push_varint(out, seq);
    match frame {
        Frame::NodeReport(r) => {
            push_varint(out, u64::from(NODE_REPORT));
            push_report(out, r);
        }
        other => {
            *out = postcard::to_extend(other, std::mem::take(out)).expect("frames always encode");
        }
    }
    let len = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&len.to_be_bytes());
}

/// `postcard::take_from_bytes::<AgentMsg>(payload)`: the message and the bytes after it.
pub fn take_agent_msg(payload: &[u8]) -> Result<(AgentMsg, &[u8]), WireError> {
    if let Some(taken) = take_report_record(payload) {
        return Ok(taken);
    }
    Ok(postcard::take_from_bytes::<AgentMsg>(payload)?)
}

/// A record of a [`Frame::NodeReport`] read by hand; `None` for anything else, or anything
/// this reading does not expect (postcard reads it then).
fn take_report_record(payload: &[u8]) -> Option<(AgentMsg, &[u8])> {
    let mut r = Reader { rest: payload };
    if r.u32()? != RECORD {
        return None;
    }
    let seq = r.u64()?;
    if r.u32()? != NODE_REPORT {
        return None;
    }
    let report = r.report()?;
    let msg = AgentMsg::Record {
        seq,
        frame: Frame::NodeReport(Box::new(report)),
    };
    Some((msg, r.rest))
}

/// Appends `v` as a postcard varint.
#[inline]
pub(crate) fn push_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn push_str(out: &mut Vec<u8>, s: &str) {
    push_varint(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

/// An `Option` as postcard writes it: byte 0, or byte 1 and the value as a varint.
pub(crate) fn push_opt(out: &mut Vec<u8>, v: Option<u64>) {
    match v {
        None => out.push(0),
        Some(v) => {
            out.push(1);
            push_varint(out, v);
        }
    }
}

fn push_report(out: &mut Vec<u8>, r: &NodeReport) {
    let NodeReport { iteration, gpu } = r;
    let NodeIteration {
        node,
        breakdown,
        comm,
        world_size,
    } = iteration;
    out.reserve(160 + node.len());
    push_str(out, node);
    push_breakdown(out, breakdown);
    push_varint(out, comm.len() as u64);
    for CommSpan { begin, end } in comm {
        push_varint(out, *begin);
        push_varint(out, *end);
    }
    push_opt(out, world_size.map(u64::from));
    match gpu {
        None => out.push(0),
        Some(g) => {
            out.push(1);
            push_reading(out, g);
        }
    }
}

fn push_breakdown(out: &mut Vec<u8>, b: &IterationBreakdown) {
    let IterationBreakdown {
        rank,
        pid,
        iter,
        start_ns,
        end_ns,
        split,
        evidence,
        coverage,
    } = b;
    push_varint(out, u64::from(*rank));
    push_varint(out, u64::from(*pid));
    push_varint(out, *iter);
    push_varint(out, *start_ns);
    push_varint(out, *end_ns);
    let Split { ns } = split;
    for v in ns {
        push_varint(out, *v);
    }
    push_varint(out, evidence.len() as u64);
    for Evidence {
        category,
        basis,
        ns,
    } in evidence
    {
        push_varint(out, category.index() as u64);
        push_varint(out, u64::from(basis_index(*basis)));
        push_varint(out, *ns);
    }
    let Coverage {
        marked_ns,
        sampled_ns,
    } = coverage;
    push_varint(out, *marked_ns);
    push_varint(out, *sampled_ns);
}

fn push_reading(out: &mut Vec<u8>, g: &NvmlReading) {
    let NvmlReading {
        gpu,
        uuid,
        cuda_timed,
        busy_ppm,
        power_mw,
        pcie_rx_bytes,
        pcie_tx_bytes,
        nvlink_bytes,
        energy_mj,
        batch_bytes,
    } = g;
    push_str(out, gpu);
    match uuid {
        None => out.push(0),
        Some(u) => {
            out.push(1);
            push_str(out, u);
        }
    }
    out.push(u8::from(*cuda_timed));
    push_opt(out, busy_ppm.map(u64::from));
    push_opt(out, *power_mw);
    push_opt(out, *pcie_rx_bytes);
    push_opt(out, *pcie_tx_bytes);
    push_opt(out, *nvlink_bytes);
    push_opt(out, *energy_mj);
    push_opt(out, *batch_bytes);
}

/// [`Basis`]'s variant index (its place in the declaration), as serde numbers it. A new
/// variant must be added here and to [`BASES`] (the compiler asks for the first, a test for
/// the second).
fn basis_index(b: Basis) -> u32 {
    match b {
        Basis::DataLoaderCpu => 0,
        Basis::DataLoaderIo => 1,
        Basis::DataNoActivity => 2,
        Basis::CommNicBytes => 3,
        Basis::CommLocalBytes => 4,
        Basis::CommNoBytes => 5,
        Basis::PeerArrival => 6,
        Basis::ComputeMarker => 7,
        Basis::CounterBusy => 8,
        Basis::CounterNic => 9,
        Basis::CounterLocal => 10,
        Basis::CounterLoader => 11,
        Basis::Unexplained => 12,
        Basis::GpuBusy => 13,
        Basis::CommGpuLinkBytes => 14,
        Basis::CounterGpuLink => 15,
        Basis::H2dPcieBytes => 16,
        Basis::GpuIdleForData => 17,
        Basis::GpuExposedComm => 18,
        Basis::GpuSlowestPeer => 19,
        Basis::GpuWork => 20,
        Basis::DataLoaderNet => 21,
        Basis::DataLoaderReads => 22,
        Basis::CounterRunQueue => 23,
        Basis::LoaderRunQueue => 24,
    }
}

/// Every [`Basis`], by variant index.
const BASES: [Basis; 25] = [
    Basis::DataLoaderCpu,
    Basis::DataLoaderIo,
    Basis::DataNoActivity,
    Basis::CommNicBytes,
    Basis::CommLocalBytes,
    Basis::CommNoBytes,
    Basis::PeerArrival,
    Basis::ComputeMarker,
    Basis::CounterBusy,
    Basis::CounterNic,
    Basis::CounterLocal,
    Basis::CounterLoader,
    Basis::Unexplained,
    Basis::GpuBusy,
    Basis::CommGpuLinkBytes,
    Basis::CounterGpuLink,
    Basis::H2dPcieBytes,
    Basis::GpuIdleForData,
    Basis::GpuExposedComm,
    Basis::GpuSlowestPeer,
    Basis::GpuWork,
    Basis::DataLoaderNet,
    Basis::DataLoaderReads,
    Basis::CounterRunQueue,
    Basis::LoaderRunQueue,
];

/// The 7-bit groups of `word` (one per byte, least first, top bits clear) packed together.
#[inline(always)]
fn pack_groups(word: u64) -> u64 {
    let x = (word & 0x007f_007f_007f_007f) | ((word & 0x7f00_7f00_7f00_7f00) >> 1);
    let x = (x & 0x0000_3fff_0000_3fff) | ((x & 0x3fff_0000_3fff_0000) >> 2);
    (x & 0x0000_0000_0fff_ffff) | ((x & 0x0fff_ffff_0000_0000) >> 4)
}

/// Reads postcard's encoding as its deserializer does; `None` where it would fail (and
/// where this reading is not sure: postcard reads those bytes again and decides).
pub(crate) struct Reader<'a> {
    /// The bytes not read yet.
    pub(crate) rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.rest.split_first()?;
        self.rest = rest;
        Some(b)
    }

    /// A varint of at most `max` bytes whose last byte holds at most `last_max` (postcard's
    /// `try_take_varint_u64`/`_u32`).
    #[inline(always)]
    fn varint(&mut self, max: usize, last_max: u8) -> Option<u64> {
        // Most values are a byte: that byte alone.
        let (&first, rest) = self.rest.split_first()?;
        if first & 0x80 == 0 {
            self.rest = rest;
            return Some(u64::from(first));
        }
        // Up to 8 bytes (a time in ns is 7) from one word: the first byte without its top
        // bit ends the varint, and the 7-bit groups before it are packed together. Within
        // 8 bytes a `u64` is never too large; a `u32` is up to its 5th byte.
        if let Some(word) = self.rest.first_chunk::<8>() {
            let word = u64::from_le_bytes(*word);
            let ends = !word & 0x8080_8080_8080_8080;
            if ends != 0 {
                let len = ends.trailing_zeros() as usize / 8 + 1;
                if len < max || (len == max && (word >> (8 * (len - 1))) as u8 <= last_max) {
                    self.rest = &self.rest[len..];
                    let kept = if len == 8 {
                        word
                    } else {
                        word & ((1u64 << (8 * len)) - 1)
                    };
                    return Some(pack_groups(kept & 0x7f7f_7f7f_7f7f_7f7f));
                }
            }
        }
        let first = self.byte()?;
        let mut out = u64::from(first & 0x7f);
        for i in 1..max {
            let b = self.byte()?;
            out |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                if i == max - 1 && b > last_max {
                    return None;
                }
                return Some(out);
            }
        }
        None
    }

    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.varint(10, 0x01)
    }

    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.varint(5, 0x0f).map(|v| v as u32)
    }

    pub(crate) fn bool(&mut self) -> Option<bool> {
        match self.byte()? {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        }
    }

    fn opt_u64(&mut self) -> Option<Option<u64>> {
        Some(if self.bool()? {
            Some(self.u64()?)
        } else {
            None
        })
    }

    pub(crate) fn opt_u32(&mut self) -> Option<Option<u32>> {
        Some(if self.bool()? {
            Some(self.u32()?)
        } else {
            None
        })
    }

    /// A length (postcard's `usize`, a `u64` here) that the bytes left can hold `each` bytes
    /// at least of each item of.
    pub(crate) fn len(&mut self, each: usize) -> Option<usize> {
        let n = usize::try_from(self.u64()?).ok()?;
        (n.checked_mul(each)? <= self.rest.len()).then_some(n)
    }

    fn string(&mut self) -> Option<String> {
        let n = self.len(1)?;
        let (bytes, rest) = self.rest.split_at(n);
        self.rest = rest;
        std::str::from_utf8(bytes).ok().map(String::from)
    }

    fn report(&mut self) -> Option<NodeReport> {
        let node = self.string()?;
        let breakdown = self.breakdown()?;
        let n = self.len(2)?;
        let mut comm = Vec::with_capacity(n);
        for _ in 0..n {
            comm.push(CommSpan {
                begin: self.u64()?,
                end: self.u64()?,
            });
        }
        let world_size = self.opt_u32()?;
        let gpu = if self.bool()? {
            Some(self.reading()?)
        } else {
            None
        };
        Some(NodeReport {
            iteration: NodeIteration {
                node,
                breakdown,
                comm,
                world_size,
            },
            gpu,
        })
    }

    fn breakdown(&mut self) -> Option<IterationBreakdown> {
        let rank = self.u32()?;
        let pid = self.u32()?;
        let iter = self.u64()?;
        let start_ns = self.u64()?;
        let end_ns = self.u64()?;
        let mut split = Split::default();
        for v in &mut split.ns {
            *v = self.u64()?;
        }
        let n = self.len(3)?;
        let mut evidence = Vec::with_capacity(n);
        for _ in 0..n {
            let category = *Category::ALL.get(self.u32()? as usize)?;
            let basis = *BASES.get(self.u32()? as usize)?;
            evidence.push(Evidence {
                category,
                basis,
                ns: self.u64()?,
            });
        }
        let coverage = Coverage {
            marked_ns: self.u64()?,
            sampled_ns: self.u64()?,
        };
        Some(IterationBreakdown {
            rank,
            pid,
            iter,
            start_ns,
            end_ns,
            split,
            evidence,
            coverage,
        })
    }

    fn reading(&mut self) -> Option<NvmlReading> {
        let gpu = self.string()?;
        let uuid = if self.bool()? {
            Some(self.string()?)
        } else {
            None
        };
        Some(NvmlReading {
            gpu,
            uuid,
            cuda_timed: self.bool()?,
            busy_ppm: self.opt_u32()?,
            power_mw: self.opt_u64()?,
            pcie_rx_bytes: self.opt_u64()?,
            pcie_tx_bytes: self.opt_u64()?,
            nvlink_bytes: self.opt_u64()?,
            energy_mj: self.opt_u64()?,
            batch_bytes: self.opt_u64()?,
        })
    }
}

#[cfg(test)]
mod tests;
