//! TCP flows of the node (sock_diag): whose bytes crossed which connection.
//!
//! A netlink `inet_diag` dump ([`netlink_packet_sock_diag`] over [`netlink_sys`]) lists every
//! TCP socket of the agent's network namespace, IPv4 and IPv6, with its `tcp_info`: bytes
//! acknowledged and received, retransmitted segments, the smoothed RTT, and the socket's inode.
//! It needs no privileges. The owner of a socket comes from its inode: the source reads
//! `<proc>/PID/fd` of the job's processes only (not the whole node), and only when a socket it
//! has not placed appears or the job's processes change; a socket no job process holds is
//! `other`. Each flow is classed ([`FlowClass`]):
//! - `control`: a job socket to or from the store's port (`MASTER_PORT`, as the loop's
//!   environment says), or a launcher's;
//! - `collective`: a training loop's other sockets (gloo, NCCL's socket transport; a worker
//!   forked from the loop inherits them, and they stay the loop's);
//! - `data`: a data-loader worker's own sockets;
//! - `other`: not the job's. stallscope's own sockets are left out.
//!
//! Read on the slow tier (every 100 ms) while the job has a flow the attribution reads tick
//! by tick (a collective over a NIC, a loader's own), else every [`QUIET_READ_EVERY_NS`], it
//! records per class and link (`nic` or `loopback`)
//! the bytes moved as counters (`flow.rx_bytes`, `flow.tx_bytes`, `flow.retransmits`): the
//! attribution reads the job's collective bytes from them instead of the NIC's, and the
//! `data` class's received bytes as a loader's network fetch. Every half
//! second it hands the flows that moved to the sampler ([`FlowSource::take_flows`]), which
//! sends them as one [`NodeFlows`].
//!
//! A dump walks every bucket of the kernel's TCP hash table, whatever the number of sockets
//! (0.44% of a core at 10 Hz on the development VM, two families): so the whole table is
//! dumped once every [`DUMP_EVERY_NS`], and the reads in between ask the kernel for the job's
//! known flows by name (`exact`: one send for all of them), and for the foreign flows that
//! moved at the last read that saw them: a transfer that shares the link is counted read by
//! read, like the job's, until a read finds it still. A dump that finds a new flow of
//! the job makes every read a dump for [`UNSETTLED_NS`], so a job that keeps opening
//! connections has each seen at the next read, as before.
//!
//! What is lost: a connection that opens and closes between two reads is never seen; one that
//! closes loses what it moved since the last read (at most 100 ms of it while the job has a
//! flow read tick by tick, else half a second; what earlier reads saw is still shipped).
//! While the job's flows hold still, a new one is seen at the next dump (at most a second
//! late, its bytes so far counted then), and so is a foreign one (class `other`) that was
//! still at the last read and moves again. A flow open before the first read counts from that
//! read; one opened later counts from its start (`tcp_info` totals are the connection's own).

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_sock_diag::constants::{AF_INET, AF_INET6, IPPROTO_TCP};
use netlink_packet_sock_diag::inet::nlas::Nla;
use netlink_packet_sock_diag::inet::{
    ExtensionFlags, InetRequest, InetResponse, SocketId, StateFlags,
};
use netlink_packet_sock_diag::SockDiagMessage;
use netlink_sys::protocols::NETLINK_SOCK_DIAG;
use netlink_sys::{Socket, SocketAddr as NetlinkAddr};
use stallscope_analysis::flows::{FlowClass, FlowSample, NodeFlows};
use stallscope_analysis::series::{SeriesKind, LINK_LOOPBACK, LINK_NIC};
use stallscope_analysis::Nanos;

use super::{Registry, Roots, Source, SourceError, Tier, Watched};
use crate::clock::monotonic_ns;

pub use stallscope_analysis::series::names::{FLOW_RETRANSMITS, FLOW_RX_BYTES, FLOW_TX_BYTES};

/// ns between two [`NodeFlows`] handed to the sampler.
const SHIP_EVERY_NS: Nanos = 500_000_000;

/// ns between two dumps of the whole table while the job's flows hold still; the reads in
/// between ask only for the flows that matter ([`SockDiag::look_up`]): the job's, and the
/// foreign ones moving.
pub const DUMP_EVERY_NS: Nanos = 1_000_000_000;

/// ns of reads that all dump, after a dump that found a new flow of the job: a job that
/// keeps opening connections (a loader fetching sample by sample) has each seen at once.
pub const UNSETTLED_NS: Nanos = 10_000_000_000;

/// ns between two reads while the job has no flow the attribution reads tick by tick (a
/// collective's over a NIC, or a loader's own: [`Track::is_per_tick`]): its other flows (the
/// collectives over loopback of a job on one node, the store's) are shown per flow and per
/// second, so reading them ten times a second bought nothing, and the look-ups were a third
/// of the sampler's CPU on the issue-31 job (one node, 2 ranks).
pub const QUIET_READ_EVERY_NS: Nanos = 500_000_000;

/// More flows to look up than this (the job's, and the foreign ones moving), and every read
/// dumps (the dump costs the same whatever the number of sockets; the look-ups grow with
/// them).
const MAX_LOOKUPS: usize = 256;

/// One socket as the dump gave it.
#[derive(Clone, Debug, PartialEq)]
pub struct DiagSocket {
    /// This end.
    pub local: SocketAddr,
    /// The peer.
    pub remote: SocketAddr,
    /// The socket's inode (0 for one no process holds any more).
    pub inode: u32,
    /// bytes, `tcpi_bytes_received`.
    pub bytes_in: u64,
    /// bytes, `tcpi_bytes_acked`.
    pub bytes_out: u64,
    /// segments, `tcpi_total_retrans`.
    pub retransmits: u64,
    /// us, `tcpi_rtt`.
    pub rtt_us: u32,
    /// The interface it is bound to (0: none), as the kernel's socket id gives it.
    pub interface: u32,
    /// The kernel's cookie of the socket: with the addresses, it names this socket and no
    /// later one on the same ports ([`SockDiag::look_up`]).
    pub cookie: [u8; 8],
}

/// A netlink `NETLINK_SOCK_DIAG` socket that dumps TCP sockets.
pub struct SockDiag {
    socket: Socket,
    buf: Vec<u8>,
    seq: u32,
}

impl SockDiag {
    /// Opens the netlink socket (no privileges needed), with a 1 s receive timeout so that a
    /// dump never blocks the sampler for longer.
    pub fn open() -> std::io::Result<Self> {
        let mut socket = Socket::new(NETLINK_SOCK_DIAG)?;
        socket.bind_auto()?;
        socket.connect(&NetlinkAddr::new(0, 0))?;
        let timeout = libc::timeval {
            tv_sec: 1,
            tv_usec: 0,
        };
        // SAFETY: a valid socket and a timeval of the size given.
        let rc = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&timeout as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(SockDiag {
            socket,
            buf: vec![0; 64 << 10],
            seq: 0,
        })
    }

    /// Every TCP socket of the namespace but listening and time-wait ones, of both families,
    /// appended to `out`.
    pub fn dump(&mut self, out: &mut Vec<DiagSocket>) -> std::io::Result<()> {
        self.dump_family(AF_INET, out)?;
        self.dump_family(AF_INET6, out)
    }

    fn dump_family(&mut self, family: u8, out: &mut Vec<DiagSocket>) -> std::io::Result<()> {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        header.sequence_number = self.seq;
        let socket_id = if family == AF_INET {
            SocketId::new_v4()
        } else {
            SocketId::new_v6()
        };
        let mut packet = NetlinkMessage::new(
            header,
            SockDiagMessage::InetRequest(InetRequest {
                family,
                protocol: IPPROTO_TCP,
                extensions: ExtensionFlags::INFO,
                states: StateFlags::all() - StateFlags::LISTEN - StateFlags::TIME_WAIT,
                socket_id,
            })
            .into(),
        );
        packet.finalize();
        let mut request = vec![0; packet.buffer_len()];
        packet.serialize(&mut request);
        self.socket.send(&request, 0)?;
        loop {
            let size = self.socket.recv(&mut &mut self.buf[..], 0)?;
            let mut offset = 0;
            while offset < size {
                let msg = <NetlinkMessage<SockDiagMessage>>::deserialize(&self.buf[offset..size])
                    .map_err(|e| std::io::Error::other(format!("sock_diag: {e}")))?;
                let len = msg.header.length as usize;
                match msg.payload {
                    NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => {
                        out.extend(diag_socket(&r));
                    }
                    NetlinkPayload::Done(_) => return Ok(()),
                    NetlinkPayload::Error(e) => {
                        return Err(std::io::Error::other(format!("sock_diag: {e:?}")))
                    }
                    _ => {}
                }
                if len == 0 {
                    break;
                }
                offset += len;
            }
        }
    }
}

/// The socket an answer describes; `None` without `tcp_info` (a socket in time-wait).
fn diag_socket(r: &InetResponse) -> Option<DiagSocket> {
    let i = r.nlas.iter().find_map(|n| match n {
        Nla::TcpInfo(i) => Some(i),
        _ => None,
    })?;
    let id = &r.header.socket_id;
    Some(DiagSocket {
        local: SocketAddr::new(id.source_address, id.source_port),
        remote: SocketAddr::new(id.destination_address, id.destination_port),
        inode: r.header.inode,
        bytes_in: i.bytes_received,
        bytes_out: i.bytes_acked,
        retransmits: u64::from(i.total_retrans),
        rtt_us: i.rtt,
        interface: id.interface_id,
        cookie: id.cookie,
    })
}

/// Which of the job's processes hold which socket inodes, read from `<proc>/PID/fd`.
#[derive(Debug, Default)]
pub struct Owners {
    /// inode → the job's pids holding it.
    by_inode: HashMap<u32, Vec<u32>>,
    /// Inodes no job process held at the last look.
    foreign: HashSet<u32>,
    /// stallscope's own sockets.
    own: HashSet<u32>,
    /// The job's pids at the last look.
    pids: Vec<u32>,
    /// How many times the fds were read (for tests and the benchmark).
    pub rescans: u64,
}

/// The inode of a `socket:[N]` link target.
fn socket_inode(target: &std::ffi::OsStr) -> Option<u32> {
    let s = target.to_str()?;
    s.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

impl Owners {
    /// Makes sure every inode of `sockets` is placed: re-reads the job's fds when one is not,
    /// or when the job's processes changed since the last look.
    pub fn resolve(&mut self, roots: &Roots, pids: &[u32], sockets: &[DiagSocket]) {
        // The same processes in another order are no change.
        let changed = self.pids.len() != pids.len() || pids.iter().any(|p| !self.pids.contains(p));
        let unknown = sockets.iter().any(|s| {
            !self.by_inode.contains_key(&s.inode)
                && !self.foreign.contains(&s.inode)
                && !self.own.contains(&s.inode)
        });
        if !changed && !unknown {
            return;
        }
        self.rescans += 1;
        self.pids = pids.to_vec();
        self.by_inode.clear();
        self.foreign.clear();
        let own = std::process::id();
        for &pid in pids.iter().chain(std::iter::once(&own)) {
            let Ok(fds) = std::fs::read_dir(roots.proc.join(pid.to_string()).join("fd")) else {
                continue;
            };
            for fd in fds.flatten() {
                let Some(inode) = std::fs::read_link(fd.path())
                    .ok()
                    .and_then(|t| socket_inode(t.as_os_str()))
                else {
                    continue;
                };
                if pid == own && !pids.contains(&own) {
                    self.own.insert(inode);
                } else {
                    let holders = self.by_inode.entry(inode).or_default();
                    if !holders.contains(&pid) {
                        holders.push(pid);
                    }
                }
            }
        }
        for s in sockets {
            if !self.by_inode.contains_key(&s.inode) && !self.own.contains(&s.inode) {
                self.foreign.insert(s.inode);
            }
        }
    }

    /// The job's pids holding `inode` (empty: not the job's).
    pub fn of(&self, inode: u32) -> &[u32] {
        self.by_inode.get(&inode).map_or(&[], Vec::as_slice)
    }

    /// Whether `inode` is one of stallscope's own sockets.
    pub fn is_own(&self, inode: u32) -> bool {
        self.own.contains(&inode)
    }
}

/// The class of a socket held by `holders` (the job's pids; empty: not the job's), with
/// `store_port` the job's `MASTER_PORT` when known.
pub fn classify(
    holders: &[u32],
    watched: &Watched,
    store_port: Option<u16>,
    local: SocketAddr,
    remote: SocketAddr,
) -> FlowClass {
    if holders.is_empty() {
        return FlowClass::Other;
    }
    if store_port.is_some_and(|p| local.port() == p || remote.port() == p) {
        return FlowClass::Control;
    }
    if holders.iter().any(|p| watched.loops.contains(p)) {
        return FlowClass::Collective;
    }
    if holders.iter().any(|p| watched.is_worker(*p)) {
        return FlowClass::Data;
    }
    if holders.iter().any(|p| watched.is_launcher(*p)) {
        return FlowClass::Control;
    }
    // Loops not known yet: the ranks' own sockets.
    FlowClass::Collective
}

/// `MASTER_PORT` in `<proc>/PID/environ`.
pub(crate) fn master_port(roots: &Roots, pid: u32) -> Option<u16> {
    let env = std::fs::read(roots.proc.join(pid.to_string()).join("environ")).ok()?;
    env.split(|&b| b == 0)
        .find_map(|kv| kv.strip_prefix(b"MASTER_PORT="))
        .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse().ok())
}

pub(crate) fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v| v.is_loopback()),
    }
}

#[derive(Debug)]
struct Track {
    /// Counters at the first read, for a flow open before it (else 0).
    base: (u64, u64, u64),
    /// Counters at the last read.
    last: (u64, u64, u64),
    sample: FlowSample,
    /// Moved since the last [`NodeFlows`].
    changed: bool,
    /// The read that last saw it (a flow no read sees any more has closed).
    read: u64,
    /// It moved at the last read that saw it.
    moving: bool,
    /// The read in progress asked for it by name: not seen, it has closed.
    asked: bool,
    /// What names the socket to the kernel, for a look-up.
    key: SocketKey,
}

impl Track {
    /// Whether a job process holds it: a flow the reads between two dumps ask for.
    fn is_job(&self) -> bool {
        matches!(self.sample.class, Some(c) if c != FlowClass::Other)
    }

    /// Whether the reads between two dumps ask for it: the job's flows, and a foreign one
    /// while it moves (a transfer sharing the link, whose bytes a close would otherwise
    /// lose back to the last dump).
    fn is_looked_up(&self) -> bool {
        self.is_job() || self.moving
    }

    /// Whether the attribution reads its class's bytes tick by tick: a collective over a NIC
    /// (the network's share of an exposed collective) or a loader's own socket (a fetch over
    /// the network).
    fn is_per_tick(&self) -> bool {
        match self.sample.class {
            Some(FlowClass::Data) => true,
            Some(FlowClass::Collective) => !self.sample.loopback,
            _ => false,
        }
    }
}

/// Per class (index in [`FlowClass::ALL`]) and link (0 `nic`, 1 `loopback`): bytes in, out.
type ClassTotals = [[(u64, u64); 2]; 4];

/// The sock_diag flow source.
pub struct FlowSource {
    roots: Roots,
    diag: Option<SockDiag>,
    sockets: Vec<DiagSocket>,
    /// The owners of socket inodes.
    pub owners: Owners,
    ports: HashMap<u32, Option<u16>>,
    flows: HashMap<(SocketAddr, SocketAddr), Track>,
    reads: u64,
    /// Sockets the last read listed.
    listed: usize,
    totals: ClassTotals,
    retransmits: [u64; 4],
    last_ship_ns: Option<Nanos>,
    /// Flows that closed with moves not shipped yet: the next [`NodeFlows`] has them.
    closed: Vec<FlowSample>,
    pending: Option<NodeFlows>,
    /// ns, when the table was last dumped (`None`: dump next).
    last_dump_ns: Option<Nanos>,
    /// ns, until when every read dumps ([`UNSETTLED_NS`]).
    unsettled_until_ns: Nanos,
    /// ns, the last read (`None`: none yet).
    last_read_ns: Option<Nanos>,
    /// ns, until when the source reads at every call: [`UNSETTLED_NS`] after it last saw a
    /// flow the attribution reads tick by tick ([`Track::is_per_tick`]); after that, every
    /// [`QUIET_READ_EVERY_NS`].
    per_tick_until_ns: Nanos,
    /// Whole-table dumps so far (for tests and the benchmark).
    pub dumps: u64,
    /// ns between two dumps while the job's flows hold still ([`DUMP_EVERY_NS`]).
    pub dump_every_ns: Nanos,
    /// ns between two reads while no flow is read tick by tick ([`QUIET_READ_EVERY_NS`]).
    pub quiet_read_every_ns: Nanos,
    /// Calls that read (a dump or look-ups; for tests and the benchmark).
    pub reads_made: u64,
}

impl FlowSource {
    /// The source on the machine under `roots`; the netlink socket opens on the first read.
    pub fn new(roots: &Roots) -> Self {
        FlowSource {
            roots: roots.clone(),
            diag: None,
            sockets: Vec::new(),
            owners: Owners::default(),
            ports: HashMap::new(),
            flows: HashMap::new(),
            reads: 0,
            listed: 0,
            totals: [[(0, 0); 2]; 4],
            retransmits: [0; 4],
            last_ship_ns: None,
            closed: Vec::new(),
            pending: None,
            last_dump_ns: None,
            unsettled_until_ns: 0,
            last_read_ns: None,
            per_tick_until_ns: 0,
            dumps: 0,
            dump_every_ns: DUMP_EVERY_NS,
            quiet_read_every_ns: QUIET_READ_EVERY_NS,
            reads_made: 0,
        }
    }

    /// Whether the call at `t_ns` reads at all: every call (the slow tier's 100 ms) while the
    /// job has a flow the attribution reads tick by tick, or had one in the last
    /// [`UNSETTLED_NS`]; else every [`QUIET_READ_EVERY_NS`].
    fn read_due(&self, t_ns: Nanos) -> bool {
        t_ns < self.per_tick_until_ns
            || self
                .last_read_ns
                .is_none_or(|last| t_ns >= last.saturating_add(self.quiet_read_every_ns))
    }

    /// Whether the read at `t_ns` dumps the whole table rather than asking for the flows
    /// it knows ([`Track::is_looked_up`]).
    fn dump_due(&self, t_ns: Nanos) -> bool {
        let looked_up = self.flows.values().filter(|t| t.is_looked_up()).count();
        self.last_dump_ns
            .is_none_or(|last| t_ns >= last.saturating_add(self.dump_every_ns))
            || t_ns < self.unsettled_until_ns
            || looked_up > MAX_LOOKUPS
    }

    /// How many TCP sockets the last read listed.
    pub fn sockets_last_read(&self) -> usize {
        self.listed
    }

    /// The flows that moved since the last call, every half second.
    pub fn take_flows(&mut self) -> Option<NodeFlows> {
        self.pending.take()
    }

    /// Takes one dump's sockets at `t_ns`: classes, deltas, series, and the flows to ship.
    pub fn ingest(&mut self, t_ns: Nanos, watched: &Watched, out: &mut Registry) {
        self.ingest_read(t_ns, watched, out, true);
    }

    /// Takes one read's sockets at `t_ns`: a whole dump (`dumped`), or the answers to the
    /// look-ups of the flows marked `asked` (the others are left as they were).
    fn ingest_read(&mut self, t_ns: Nanos, watched: &Watched, out: &mut Registry, dumped: bool) {
        let sockets = std::mem::take(&mut self.sockets);
        self.owners.resolve(&self.roots, &watched.pids, &sockets);
        let first = self.reads == 0;
        self.reads += 1;
        if dumped {
            self.listed = sockets.len();
        }
        let read = self.reads;
        self.last_read_ns = Some(t_ns);
        let mut new_job_flow = false;
        for s in &sockets {
            if s.inode == 0 || self.owners.is_own(s.inode) {
                continue;
            }
            let holders = self.owners.of(s.inode);
            let port = holders.first().and_then(|&pid| {
                *self
                    .ports
                    .entry(pid)
                    .or_insert_with(|| master_port(&self.roots, pid))
            });
            let class = classify(holders, watched, port, s.local, s.remote);
            let now = (s.bytes_in, s.bytes_out, s.retransmits);
            // Most sockets are unchanged between reads: their strings are made once.
            let track = self
                .flows
                .entry((s.local, s.remote))
                .or_insert_with(|| Track {
                    // `tcpi_bytes_acked` counts the SYN's sequence number too.
                    base: if first { now } else { (0, 1, 0) },
                    last: if first { now } else { (0, 0, 0) },
                    sample: FlowSample {
                        local: s.local.to_string(),
                        remote: s.remote.to_string(),
                        // A connection to one of the node's own addresses stays on the node too.
                        loopback: is_loopback(s.remote.ip()) || s.remote.ip() == s.local.ip(),
                        ..FlowSample::default()
                    },
                    changed: true,
                    read,
                    moving: false,
                    asked: false,
                    key: SocketKey {
                        local: s.local,
                        remote: s.remote,
                        interface: s.interface,
                        cookie: s.cookie,
                    },
                });
            new_job_flow |= track.sample.class.is_none() && !first && !holders.is_empty();
            track.read = read;
            track.key.cookie = s.cookie;
            track.sample.rtt_us = s.rtt_us;
            let (d_in, d_out, d_re) = (
                now.0.saturating_sub(track.last.0),
                now.1.saturating_sub(track.last.1),
                now.2.saturating_sub(track.last.2),
            );
            let moved = d_in + d_out + d_re > 0;
            track.moving = moved;
            if !moved && track.sample.class == Some(class) && track.sample.pids == holders {
                continue;
            }
            let c = FlowClass::ALL.iter().position(|k| *k == class).unwrap_or(3);
            let l = usize::from(track.sample.loopback);
            self.totals[c][l].0 += d_in;
            self.totals[c][l].1 += d_out;
            self.retransmits[c] += d_re;
            track.changed = true;
            track.last = now;
            let t = &mut track.sample;
            t.class = Some(class);
            t.pids = holders.to_vec();
            t.bytes_in = now.0 - track.base.0.min(now.0);
            t.bytes_out = now.1 - track.base.1.min(now.1);
            t.retransmits = now.2 - track.base.2.min(now.2);
        }
        // A flow not seen has closed; between dumps, only those asked for were looked for.
        // What it moved since the last ship still goes out with the next.
        let closed = &mut self.closed;
        self.flows.retain(|_, t| {
            let open = t.read == read || (!dumped && !t.asked);
            if !open && t.changed {
                closed.push(std::mem::take(&mut t.sample));
            }
            open
        });
        if self
            .flows
            .values()
            .any(|t| t.read == read && t.is_per_tick())
        {
            self.per_tick_until_ns = t_ns + UNSETTLED_NS;
        }
        if dumped {
            self.last_dump_ns = Some(t_ns);
            if new_job_flow {
                self.unsettled_until_ns = t_ns + UNSETTLED_NS;
            }
        }
        // The ports of processes that are gone.
        self.ports.retain(|pid, _| watched.pids.contains(pid));
        self.record(out);
        let since = *self.last_ship_ns.get_or_insert(t_ns);
        if t_ns >= since + SHIP_EVERY_NS || first {
            let mut flows = std::mem::take(&mut self.closed);
            flows.extend(
                self.flows
                    .values_mut()
                    .filter_map(|t| std::mem::take(&mut t.changed).then(|| t.sample.clone())),
            );
            self.last_ship_ns = Some(t_ns);
            if !flows.is_empty() {
                self.pending = Some(NodeFlows {
                    node: String::new(),
                    t_ns,
                    since_ns: since,
                    flows,
                });
            }
        }
        self.sockets = sockets;
        self.sockets.clear();
    }

    fn record(&self, out: &mut Registry) {
        for (c, class) in FlowClass::ALL.iter().enumerate() {
            for (l, link) in [LINK_NIC, LINK_LOOPBACK].into_iter().enumerate() {
                let (rx, tx) = self.totals[c][l];
                if rx + tx == 0 {
                    continue;
                }
                let labels = [("class", class.as_str()), ("link", link)];
                let id = out.series(FLOW_RX_BYTES, "bytes", SeriesKind::Counter, &labels);
                out.push(id, rx);
                let id = out.series(FLOW_TX_BYTES, "bytes", SeriesKind::Counter, &labels);
                out.push(id, tx);
            }
            if self.retransmits[c] > 0 {
                let labels = [("class", class.as_str())];
                let id = out.series(FLOW_RETRANSMITS, "segments", SeriesKind::Counter, &labels);
                out.push(id, self.retransmits[c]);
            }
        }
    }
}

impl Source for FlowSource {
    fn name(&self) -> &'static str {
        "flows"
    }

    fn tier(&self) -> Tier {
        Tier::Slow
    }

    fn sample(&mut self, watched: &Watched, out: &mut Registry) -> Result<(), SourceError> {
        if self.diag.is_none() {
            self.diag =
                Some(SockDiag::open().map_err(|e| {
                    SourceError::Unsupported(format!("sock_diag netlink socket: {e}"))
                })?);
        }
        let t_ns = monotonic_ns();
        if !self.read_due(t_ns) {
            return Ok(());
        }
        self.reads_made += 1;
        let mut sockets = std::mem::take(&mut self.sockets);
        let dump = self.dump_due(t_ns);
        let diag = self.diag.as_mut().expect("opened above");
        let read = if dump {
            self.dumps += 1;
            diag.dump(&mut sockets)
        } else {
            let mut keys = Vec::new();
            for t in self.flows.values_mut() {
                t.asked = t.is_looked_up();
                if t.asked {
                    keys.push(t.key);
                }
            }
            if keys.is_empty() {
                Ok(())
            } else {
                diag.look_up(&keys, &mut sockets)
            }
        };
        if let Err(e) = read {
            // A read cut short leaves the socket out of step: open a fresh one next time,
            // and dump then.
            self.diag = None;
            self.last_dump_ns = None;
            sockets.clear();
            self.sockets = sockets;
            return Err(SourceError::Call(format!("sock_diag read: {e}")));
        }
        self.sockets = sockets;
        self.ingest_read(t_ns, watched, out, dump);
        Ok(())
    }

    fn describe(&self) -> String {
        "TCP flows (sock_diag: bytes, retransmissions, RTT, owner by socket inode)".into()
    }

    fn take_flows(&mut self) -> Option<NodeFlows> {
        FlowSource::take_flows(self)
    }
}

mod exact;
pub use exact::SocketKey;

#[cfg(test)]
mod tests;
