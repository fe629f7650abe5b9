//! Reading a captured packet's headers: the 5-tuple, the direction and the transport payload's
//! size, and summing them per 5-tuple ([`Tally`]).
//!
//! Only headers are captured (the snaplen is [`SNAPLEN`]), so sizes come from the headers'
//! length fields, never from how much was captured: a UDP datagram counts its `length` less
//! the 8-byte header, a TCP segment its IP payload less the TCP header. Those are the bytes the
//! sockets moved, the same quantity as `tcp_info`'s byte counters. A datagram the IP layer
//! fragmented counts once, at its first fragment (which carries the UDP header); the later
//! fragments are skipped.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// bytes captured per packet: a Linux cooked header (20), IPv6 (40) with an extension header
/// or two, and TCP with options (60) fit.
pub const SNAPLEN: i32 = 128;

/// `DLT_EN10MB`: Ethernet.
pub const LINKTYPE_ETHERNET: i32 = 1;
/// `DLT_RAW`: the IP header first.
pub const LINKTYPE_RAW: i32 = 101;
/// `DLT_LINUX_SLL`: the "any" device's cooked header, version 1 (16 bytes).
pub const LINKTYPE_LINUX_SLL: i32 = 113;
/// `DLT_LINUX_SLL2`: the cooked header, version 2 (20 bytes, with the interface index).
pub const LINKTYPE_LINUX_SLL2: i32 = 276;

/// `PACKET_OUTGOING` in a cooked header: sent by this host.
const PACKET_OUTGOING: u16 = 4;

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const ETHERTYPE_VLAN: u16 = 0x8100;

/// A transport protocol the source counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proto {
    /// IP protocol 6.
    Tcp,
    /// IP protocol 17.
    Udp,
}

/// One direction of a conversation: protocol, sender, receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FiveTuple {
    /// TCP or UDP.
    pub proto: Proto,
    /// The sender's address and port.
    pub src: SocketAddr,
    /// The receiver's address and port.
    pub dst: SocketAddr,
}

/// What one packet's headers say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Headers {
    /// Who sent it to whom.
    pub tuple: FiveTuple,
    /// bytes of transport payload (UDP: the datagram's data; TCP: the segment's).
    pub payload: u64,
    /// Whether this host sent it, when the link header says (cooked headers do).
    pub outgoing: Option<bool>,
    /// The interface index, when the link header says (`LINUX_SLL2`).
    pub ifindex: Option<u32>,
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// The headers of one captured packet whose link layer is `linktype` (a `LINKTYPE_*`); `None`
/// for what is not TCP or UDP over IP, a later fragment, or a packet cut before its ports.
pub fn parse(linktype: i32, data: &[u8]) -> Option<Headers> {
    let (ethertype, ip_at, outgoing, ifindex) = match linktype {
        LINKTYPE_LINUX_SLL => {
            let kind = be16(data, 0)?;
            (be16(data, 14)?, 16, Some(kind == PACKET_OUTGOING), None)
        }
        LINKTYPE_LINUX_SLL2 => {
            let kind = u16::from(*data.get(10)?);
            (
                be16(data, 0)?,
                20,
                Some(kind == PACKET_OUTGOING),
                Some(be32(data, 4)?),
            )
        }
        LINKTYPE_ETHERNET => match be16(data, 12)? {
            ETHERTYPE_VLAN => (be16(data, 16)?, 18, None, None),
            t => (t, 14, None, None),
        },
        LINKTYPE_RAW => match data.first()? >> 4 {
            4 => (ETHERTYPE_IPV4, 0, None, None),
            6 => (ETHERTYPE_IPV6, 0, None, None),
            _ => return None,
        },
        _ => return None,
    };
    let ip = data.get(ip_at..)?;
    let (proto, src, dst, l4, l4_len) = match ethertype {
        ETHERTYPE_IPV4 => ipv4(ip)?,
        ETHERTYPE_IPV6 => ipv6(ip)?,
        _ => return None,
    };
    let payload = match proto {
        Proto::Udp => u64::from(be16(l4, 4)?).saturating_sub(8),
        Proto::Tcp => {
            let header = u64::from(l4.get(12)? >> 4) * 4;
            l4_len.saturating_sub(header)
        }
    };
    Some(Headers {
        tuple: FiveTuple {
            proto,
            src: SocketAddr::new(src, be16(l4, 0)?),
            dst: SocketAddr::new(dst, be16(l4, 2)?),
        },
        payload,
        outgoing,
        ifindex,
    })
}

/// Protocol, addresses, the transport header on, and the transport's length (bytes).
type Ip<'a> = (Proto, IpAddr, IpAddr, &'a [u8], u64);

fn proto_of(number: u8) -> Option<Proto> {
    match number {
        6 => Some(Proto::Tcp),
        17 => Some(Proto::Udp),
        _ => None,
    }
}

fn ipv4(ip: &[u8]) -> Option<Ip<'_>> {
    let header = usize::from(ip.first()? & 0x0f) * 4;
    let total = u64::from(be16(ip, 2)?);
    // A later fragment carries no transport header.
    if be16(ip, 6)? & 0x1fff != 0 {
        return None;
    }
    let proto = proto_of(*ip.get(9)?)?;
    let src = Ipv4Addr::from(be32(ip, 12)?);
    let dst = Ipv4Addr::from(be32(ip, 16)?);
    Some((
        proto,
        src.into(),
        dst.into(),
        ip.get(header..)?,
        total.saturating_sub(header as u64),
    ))
}

fn ipv6(ip: &[u8]) -> Option<Ip<'_>> {
    let mut len = u64::from(be16(ip, 4)?);
    let mut next = *ip.get(6)?;
    let src = Ipv6Addr::from(<[u8; 16]>::try_from(ip.get(8..24)?).ok()?);
    let dst = Ipv6Addr::from(<[u8; 16]>::try_from(ip.get(24..40)?).ok()?);
    let mut at = 40;
    // Hop-by-hop, routing, fragment and destination options headers before the transport.
    for _ in 0..4 {
        let ext = match next {
            0 | 43 | 60 => (usize::from(*ip.get(at + 1)?) + 1) * 8,
            44 => {
                if be16(ip, at + 2)? & 0xfff8 != 0 {
                    return None;
                }
                8
            }
            _ => break,
        };
        next = *ip.get(at)?;
        at += ext;
        len = len.saturating_sub(ext as u64);
    }
    let proto = proto_of(next)?;
    Some((proto, src.into(), dst.into(), ip.get(at..)?, len))
}

/// Payload bytes and packets per 5-tuple and direction since the last [`Tally::take`], for at
/// most [`Tally::MAX_TUPLES`] keys: past that, a new key's bytes are only counted in
/// [`Tally::overflow_bytes`].
#[derive(Debug, Default)]
pub struct Tally {
    /// Per 5-tuple and whether this host sent it (false when the link header does not say):
    /// payload bytes, packets.
    pub by_tuple: HashMap<(FiveTuple, bool), (u64, u64)>,
    /// bytes of tuples left out for room.
    pub overflow_bytes: u64,
}

impl Tally {
    /// Tuples kept between two takes (about 80 bytes each: a few MiB at most).
    pub const MAX_TUPLES: usize = 65_536;

    /// Adds one packet.
    pub fn add(&mut self, h: &Headers) {
        let room = self.by_tuple.len() < Self::MAX_TUPLES;
        let key = (h.tuple, h.outgoing == Some(true));
        match self.by_tuple.get_mut(&key) {
            Some(c) => {
                c.0 += h.payload;
                c.1 += 1;
            }
            None if room => {
                self.by_tuple.insert(key, (h.payload, 1));
            }
            None => self.overflow_bytes += h.payload,
        }
    }

    /// What was counted since the last take; the tally starts again from zero.
    pub fn take(&mut self) -> Tally {
        std::mem::take(self)
    }
}
