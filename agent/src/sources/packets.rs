//! UDP flows of the node from captured packet headers (libpcap through the [`pcap`] crate):
//! exact bytes per 5-tuple per read, joined to the owning processes like the TCP flows.
//!
//! sock_diag's `tcp_info` gives TCP's bytes exactly, but UDP sockets keep no byte counters, so
//! a UDP transfer (a dataset streamed over UDP, NCCL's or gloo's UDP-based transports, another
//! tenant's QUIC upload) was invisible per flow. Where the agent may capture (root or
//! `CAP_NET_RAW`), a thread ([`capture::PacketCapture`]) reads the "any" device with a 128-byte
//! snaplen and a BPF filter (`udp`) the kernel runs, and sums each packet's payload per
//! 5-tuple ([`headers::Tally`]). Every read (the slow tier, 100 ms) takes that tally: each
//! datagram's ends are placed on this node's UDP sockets (`<proc>/net/udp`, `udp6`, read again
//! only when a datagram reaches a port not placed yet), the socket's inode gives the job's
//! processes holding it ([`Owners`], as for TCP), and the flow is classed by
//! [`classify`]. A flow's `local` and `remote` end in `/udp`. The bytes are recorded per class
//! and link as the TCP flows' counters with `proto=udp` (so a collective's UDP bytes over the
//! NIC count as its network), and the flows that moved are shipped every half second as a
//! [`NodeFlows`] of their own.
//!
//! It is on whenever the agent reads the machine's own `/proc` and capture opens; it is off
//! with `STALLSCOPE_PCAP=off`. When capture cannot open, the source stays up with nothing to
//! read and says why once, in its status ("UDP flows off: …"), and `stallscope doctor` says it
//! too: TCP flows still come from sock_diag, and nothing else changes.
//!
//! What is lost: datagrams sent before the capture opened (at the source's first read, the
//! first 100 ms or so of a run); a datagram the kernel's ring had no room for (the capture's
//! `dropped`); a
//! flow idle for [`IDLE_NS`] is forgotten (its totals are already shipped) and starts again
//! from zero if it moves again; at most [`MAX_FLOWS`] flows are tracked, the bytes of any
//! further one only reach the class counters.

pub mod capture;
pub mod headers;
pub mod udp;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use stallscope_analysis::flows::{FlowClass, FlowSample, NodeFlows};
use stallscope_analysis::series::{SeriesKind, LINK_LOOPBACK, LINK_NIC};
use stallscope_analysis::Nanos;

use self::capture::{CaptureStats, PacketCapture};
use self::headers::{Proto, Tally};
use self::udp::UdpSockets;
use super::flows::{
    classify, is_loopback, master_port, DiagSocket, Owners, FLOW_RX_BYTES, FLOW_TX_BYTES,
};
use super::{Registry, Roots, Source, SourceError, Tier, Watched};
use crate::clock::monotonic_ns;

/// How long the first read waits for the capture to open (a refusal comes at once).
const OPEN_WAIT: Duration = Duration::from_millis(20);

/// ns between two [`NodeFlows`] handed to the sampler.
const SHIP_EVERY_NS: Nanos = 500_000_000;

/// ns without a byte after which a flow is forgotten.
pub const IDLE_NS: Nanos = 30_000_000_000;

/// Flows tracked at most.
pub const MAX_FLOWS: usize = 4096;

/// The environment variable that turns capture off (`off`).
pub const ENV_SWITCH: &str = "STALLSCOPE_PCAP";

/// Whether the agent should try to capture: it reads the machine's own `/proc` (not a
/// captured copy) and `STALLSCOPE_PCAP` is not `off`.
pub fn wanted(roots: &Roots) -> bool {
    roots.proc == Path::new("/proc") && std::env::var(ENV_SWITCH).map_or(true, |v| v != "off")
}

/// Whether capture would open under `roots` on `device`: what it reads, or why not (for
/// `stallscope doctor`).
pub fn probe(roots: &Roots, device: &str) -> Result<String, String> {
    if !wanted(roots) {
        return Err(if roots.proc == Path::new("/proc") {
            format!("off ({ENV_SWITCH}=off)")
        } else {
            "off: /proc is a copy, not this machine's".into()
        });
    }
    let mut source = PacketSource::new(roots, device);
    if source.wait_open(Duration::from_secs(2)) {
        Ok(source.describe())
    } else if source.off.is_some() {
        Err(source.describe())
    } else {
        Err(format!(
            "packet capture on \"{device}\" did not open within 2 s"
        ))
    }
}

/// One end of a datagram on this node.
#[derive(Debug)]
struct Moved {
    local: SocketAddr,
    remote: SocketAddr,
    /// The socket's inode (`None`: no socket of the node has that address any more).
    inode: Option<u32>,
    bytes: u64,
    outgoing: bool,
}

#[derive(Debug)]
struct Track {
    sample: FlowSample,
    changed: bool,
    last_moved_ns: Nanos,
}

/// The UDP packet flow source.
pub struct PacketSource {
    roots: Roots,
    device: String,
    capture: Option<PacketCapture>,
    /// Why capture is off, once it failed to open.
    off: Option<String>,
    /// The node's UDP sockets.
    pub sockets: UdpSockets,
    /// The owners of socket inodes.
    pub owners: Owners,
    placed: Vec<DiagSocket>,
    ports: HashMap<u32, Option<u16>>,
    flows: HashMap<(SocketAddr, SocketAddr), Track>,
    /// Per class (index in [`FlowClass::ALL`]) and link (0 `nic`, 1 `loopback`): bytes in, out.
    totals: [[(u64, u64); 2]; 4],
    reads: u64,
    last_ship_ns: Option<Nanos>,
    pending: Option<NodeFlows>,
}

impl PacketSource {
    /// The source on the machine under `roots`, capturing on `device` ("any": every
    /// interface) from its first read.
    pub fn new(roots: &Roots, device: &str) -> Self {
        PacketSource {
            roots: roots.clone(),
            device: device.to_string(),
            capture: None,
            off: None,
            sockets: UdpSockets::default(),
            owners: Owners::default(),
            placed: Vec::new(),
            ports: HashMap::new(),
            flows: HashMap::new(),
            totals: [[(0, 0); 2]; 4],
            reads: 0,
            last_ship_ns: None,
            pending: None,
        }
    }

    /// Why capture is off, when it could not open.
    pub fn off_reason(&self) -> Option<&str> {
        self.off.as_deref()
    }

    /// Whether the capture is open and counting.
    pub fn capturing(&mut self) -> bool {
        self.capture
            .as_mut()
            .is_some_and(|c| matches!(c.opened(Duration::ZERO), Some(Ok(()))))
    }

    /// Reads until the capture opened or failed to, at most `within`; whether it opened.
    pub fn wait_open(&mut self, within: Duration) -> bool {
        let end = std::time::Instant::now() + within;
        loop {
            let _ = self.sample(&Watched::default(), &mut Registry::default());
            if self.capturing() || self.off.is_some() || std::time::Instant::now() >= end {
                return self.capturing();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The kernel's counts of the capture (zero when it is off).
    pub fn capture_stats(&self) -> CaptureStats {
        self.capture
            .as_ref()
            .map(PacketCapture::stats)
            .unwrap_or_default()
    }

    /// The flows that moved since the last call, every half second.
    pub fn take_flows(&mut self) -> Option<NodeFlows> {
        self.pending.take()
    }

    /// The ends on this node of each datagram counted in `tally`.
    fn place(&mut self, tally: &Tally) -> Vec<Moved> {
        let mut refreshed = false;
        let mut moved = Vec::with_capacity(tally.by_tuple.len());
        for (&(t, outgoing), &(bytes, _)) in &tally.by_tuple {
            if t.proto != Proto::Udp {
                continue;
            }
            // A datagram between two addresses of this node went over loopback: both ends
            // are here. Otherwise the sender is here when it was sent, the receiver if not.
            let on_node = is_loopback(t.dst.ip()) || t.src.ip() == t.dst.ip();
            let ends = [
                (outgoing || on_node).then_some((t.src, t.dst, true)),
                (!outgoing || on_node).then_some((t.dst, t.src, false)),
            ];
            for (local, remote, out) in ends.into_iter().flatten() {
                let mut inode = self.sockets.find(local);
                if inode.is_none() && !refreshed {
                    self.sockets.refresh(&self.roots);
                    refreshed = true;
                    inode = self.sockets.find(local);
                }
                moved.push(Moved {
                    local,
                    remote,
                    inode,
                    bytes,
                    outgoing: out,
                });
            }
        }
        moved
    }

    /// Takes one read's tally at `t_ns`: places, classes, counts, and the flows to ship.
    pub fn ingest(&mut self, t_ns: Nanos, tally: &Tally, watched: &Watched, out: &mut Registry) {
        let first = self.reads == 0;
        self.reads += 1;
        let moved = self.place(tally);
        self.placed.clear();
        self.placed.extend(moved.iter().filter_map(|m| {
            m.inode.map(|inode| DiagSocket {
                local: m.local,
                remote: m.remote,
                inode,
                bytes_in: 0,
                bytes_out: 0,
                retransmits: 0,
                rtt_us: 0,
                // A UDP socket found through /proc/net/udp: no sock_diag id to look it up by.
                interface: 0,
                cookie: [0; 8],
            })
        }));
        self.owners
            .resolve(&self.roots, &watched.pids, &self.placed);
        for m in &moved {
            if m.inode.is_some_and(|i| self.owners.is_own(i)) {
                continue;
            }
            let holders = m.inode.map_or(&[][..], |i| self.owners.of(i));
            let port = holders.first().and_then(|&pid| {
                *self
                    .ports
                    .entry(pid)
                    .or_insert_with(|| master_port(&self.roots, pid))
            });
            let class = classify(holders, watched, port, m.local, m.remote);
            let loopback = is_loopback(m.remote.ip()) || m.remote.ip() == m.local.ip();
            let c = FlowClass::ALL.iter().position(|k| *k == class).unwrap_or(3);
            let l = usize::from(loopback);
            if m.outgoing {
                self.totals[c][l].1 += m.bytes;
            } else {
                self.totals[c][l].0 += m.bytes;
            }
            let key = (m.local, m.remote);
            if !self.flows.contains_key(&key) && self.flows.len() >= MAX_FLOWS {
                continue;
            }
            let track = self.flows.entry(key).or_insert_with(|| Track {
                sample: FlowSample {
                    local: format!("{}/udp", m.local),
                    remote: format!("{}/udp", m.remote),
                    loopback,
                    ..FlowSample::default()
                },
                changed: true,
                last_moved_ns: t_ns,
            });
            let s = &mut track.sample;
            if m.outgoing {
                s.bytes_out += m.bytes;
            } else {
                s.bytes_in += m.bytes;
            }
            s.class = Some(class);
            if s.pids != holders {
                s.pids = holders.to_vec();
            }
            track.changed = true;
            track.last_moved_ns = t_ns;
        }
        self.ports.retain(|pid, _| watched.pids.contains(pid));
        self.record(out);
        let since = *self.last_ship_ns.get_or_insert(t_ns);
        if t_ns >= since + SHIP_EVERY_NS || first {
            let flows: Vec<FlowSample> = self
                .flows
                .values_mut()
                .filter_map(|t| std::mem::take(&mut t.changed).then(|| t.sample.clone()))
                .collect();
            self.last_ship_ns = Some(t_ns);
            self.flows
                .retain(|_, t| t.last_moved_ns + IDLE_NS > t_ns || t.changed);
            if !flows.is_empty() {
                self.pending = Some(NodeFlows {
                    node: String::new(),
                    t_ns,
                    since_ns: since,
                    flows,
                });
            }
        }
    }

    fn record(&self, out: &mut Registry) {
        for (c, class) in FlowClass::ALL.iter().enumerate() {
            for (l, link) in [LINK_NIC, LINK_LOOPBACK].into_iter().enumerate() {
                let (rx, tx) = self.totals[c][l];
                if rx + tx == 0 {
                    continue;
                }
                let labels = [("class", class.as_str()), ("link", link), ("proto", "udp")];
                let id = out.series(FLOW_RX_BYTES, "bytes", SeriesKind::Counter, &labels);
                out.push(id, rx);
                let id = out.series(FLOW_TX_BYTES, "bytes", SeriesKind::Counter, &labels);
                out.push(id, tx);
            }
        }
    }
}

impl Source for PacketSource {
    fn name(&self) -> &'static str {
        "packets"
    }

    fn tier(&self) -> Tier {
        Tier::Slow
    }

    fn sample(&mut self, watched: &Watched, out: &mut Registry) -> Result<(), SourceError> {
        if self.off.is_some() {
            return Ok(());
        }
        // The first read waits a little for the capture to open, so that its status (said
        // once, after it) says whether UDP flows are on; later reads never wait.
        let wait = if self.capture.is_none() {
            OPEN_WAIT
        } else {
            Duration::ZERO
        };
        let capture = self
            .capture
            .get_or_insert_with(|| PacketCapture::start(&self.device));
        match capture.opened(wait) {
            None => return Ok(()),
            Some(Err(why)) => {
                self.off = Some(why.clone());
                self.capture = None;
                return Ok(());
            }
            Some(Ok(())) => {}
        }
        let t_ns = monotonic_ns();
        let (tally, stopped) = capture.take();
        self.ingest(t_ns, &tally, watched, out);
        if let Some(why) = stopped {
            // The thread ended (the device went away): open again at the next read.
            self.capture = None;
            return Err(SourceError::Call(why));
        }
        Ok(())
    }

    fn describe(&self) -> String {
        match &self.off {
            Some(why) => format!(
                "UDP flows off: packet capture cannot open \"{}\" ({why}; it needs root or \
                 CAP_NET_RAW); TCP flows still come from sock_diag",
                self.device
            ),
            None => format!(
                "UDP flows (pcap on \"{}\": headers only, kernel filter `{}`, bytes per 5-tuple)",
                self.device,
                capture::FILTER
            ),
        }
    }

    fn take_flows(&mut self) -> Option<NodeFlows> {
        PacketSource::take_flows(self)
    }
}

#[cfg(test)]
mod tests;
