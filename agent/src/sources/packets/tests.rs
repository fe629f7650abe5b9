use std::net::{SocketAddr, UdpSocket};

use super::headers::*;
use super::*;

/// A cooked (`LINUX_SLL2`) header on interface `ifindex`, sent (`outgoing`) or received.
fn sll2(ethertype: u16, ifindex: u32, outgoing: bool) -> Vec<u8> {
    let mut h = vec![0u8; 20];
    h[0..2].copy_from_slice(&ethertype.to_be_bytes());
    h[4..8].copy_from_slice(&ifindex.to_be_bytes());
    h[10] = if outgoing { 4 } else { 0 };
    h
}

/// IPv4 + UDP headers of a datagram of `payload` bytes from `src` to `dst`, cut at the
/// snaplen as a capture would (only headers, whatever the payload).
fn udp4(src: SocketAddr, dst: SocketAddr, payload: u16, frag_offset: u16) -> Vec<u8> {
    let (SocketAddr::V4(s), SocketAddr::V4(d)) = (src, dst) else {
        panic!("v4 only")
    };
    let mut ip = vec![0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&(20 + 8 + payload).to_be_bytes());
    ip[6..8].copy_from_slice(&frag_offset.to_be_bytes());
    ip[9] = 17;
    ip[12..16].copy_from_slice(&s.ip().octets());
    ip[16..20].copy_from_slice(&d.ip().octets());
    let mut udp = vec![0u8; 8];
    udp[0..2].copy_from_slice(&s.port().to_be_bytes());
    udp[2..4].copy_from_slice(&d.port().to_be_bytes());
    udp[4..6].copy_from_slice(&(8 + payload).to_be_bytes());
    ip.extend(udp);
    ip
}

/// Ethernet + IPv6 (with a hop-by-hop header) + TCP (32-byte header) of a `payload`-byte
/// segment.
fn tcp6_eth(src: SocketAddr, dst: SocketAddr, payload: u16) -> Vec<u8> {
    let (SocketAddr::V6(s), SocketAddr::V6(d)) = (src, dst) else {
        panic!("v6 only")
    };
    let mut p = vec![0u8; 14];
    p[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
    let mut ip = vec![0u8; 40];
    ip[0] = 0x60;
    ip[4..6].copy_from_slice(&(8 + 32 + payload).to_be_bytes());
    ip[6] = 0; // hop-by-hop first
    ip[8..24].copy_from_slice(&s.ip().octets());
    ip[24..40].copy_from_slice(&d.ip().octets());
    let mut hop = vec![0u8; 8];
    hop[0] = 6; // then TCP
    let mut tcp = vec![0u8; 32];
    tcp[0..2].copy_from_slice(&s.port().to_be_bytes());
    tcp[2..4].copy_from_slice(&d.port().to_be_bytes());
    tcp[12] = 8 << 4;
    p.extend(ip);
    p.extend(hop);
    p.extend(tcp);
    p
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

#[test]
fn headers_give_the_tuple_the_direction_and_the_payload_from_the_length_fields() {
    let (a, b) = (addr("10.0.0.1:5000"), addr("10.0.0.2:6000"));
    let mut p = sll2(0x0800, 3, true);
    p.extend(udp4(a, b, 1400, 0));
    let h = parse(LINKTYPE_LINUX_SLL2, &p).expect("a UDP datagram");
    assert_eq!(
        h.tuple,
        FiveTuple {
            proto: Proto::Udp,
            src: a,
            dst: b
        }
    );
    assert_eq!(h.payload, 1400);
    assert_eq!(h.outgoing, Some(true));
    assert_eq!(h.ifindex, Some(3));

    // A later fragment has no UDP header: skipped (its datagram counted at the first).
    let mut frag = sll2(0x0800, 3, false);
    frag.extend(udp4(a, b, 1400, 185));
    assert_eq!(parse(LINKTYPE_LINUX_SLL2, &frag), None);
    // Cut before the ports: nothing.
    assert_eq!(parse(LINKTYPE_LINUX_SLL2, &p[..30]), None);
    // ARP is not IP.
    assert_eq!(parse(LINKTYPE_LINUX_SLL2, &sll2(0x0806, 3, false)), None);

    let (c, d) = (addr("[fd00::1]:41000"), addr("[fd00::2]:29500"));
    let seg = tcp6_eth(c, d, 9000);
    let h = parse(LINKTYPE_ETHERNET, &seg).expect("a TCP segment");
    assert_eq!(h.tuple.proto, Proto::Tcp);
    assert_eq!((h.tuple.src, h.tuple.dst), (c, d));
    assert_eq!(
        h.payload, 9000,
        "IPv6 payload less hop-by-hop and the TCP header"
    );
    assert_eq!(h.outgoing, None);
    assert!(seg.len() <= SNAPLEN as usize, "headers fit the snaplen");
}

#[test]
fn the_tally_sums_bytes_per_tuple_and_direction_and_is_bounded() {
    let (a, b) = (addr("10.0.0.1:5000"), addr("10.0.0.2:6000"));
    let mut t = Tally::default();
    for payload in [1000, 200, 30] {
        let mut p = sll2(0x0800, 3, true);
        p.extend(udp4(a, b, payload, 0));
        t.add(&parse(LINKTYPE_LINUX_SLL2, &p).unwrap());
    }
    let mut back = sll2(0x0800, 3, false);
    back.extend(udp4(b, a, 7, 0));
    t.add(&parse(LINKTYPE_LINUX_SLL2, &back).unwrap());
    let out = FiveTuple {
        proto: Proto::Udp,
        src: a,
        dst: b,
    };
    let back_tuple = FiveTuple {
        proto: Proto::Udp,
        src: b,
        dst: a,
    };
    assert_eq!(t.by_tuple[&(out, true)], (1230, 3));
    assert_eq!(t.by_tuple[&(back_tuple, false)], (7, 1));
    let taken = t.take();
    assert_eq!(taken.by_tuple.len(), 2);
    assert!(t.by_tuple.is_empty(), "each take starts from zero");

    // Past the bound, a new tuple's bytes go to the overflow only.
    for port in 0..Tally::MAX_TUPLES as u32 + 10 {
        let mut p = sll2(0x0800, 3, true);
        p.extend(udp4(
            a,
            SocketAddr::new(b.ip(), (port % 60_000) as u16),
            10,
            0,
        ));
        let mut h = parse(LINKTYPE_LINUX_SLL2, &p).unwrap();
        h.tuple.src = SocketAddr::new(a.ip(), (port / 60_000) as u16);
        t.add(&h);
    }
    assert_eq!(t.by_tuple.len(), Tally::MAX_TUPLES);
    assert_eq!(t.overflow_bytes, 100);
}

/// Datagrams between two real UDP sockets of this process (the job's training loop) are
/// placed on both sockets through `/proc/net/udp` and the fds, classed `collective`, shipped
/// as `/udp` flows with their bytes, and counted in the class's loopback series.
#[test]
fn datagrams_of_the_jobs_sockets_are_classed_and_counted_from_a_tally() {
    let me = std::process::id();
    let watched = Watched {
        pids: vec![me],
        launchers: Vec::new(),
        loops: vec![me],
    };
    let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let (src, dst) = (tx.local_addr().unwrap(), rx.local_addr().unwrap());
    let mut tally = Tally::default();
    for _ in 0..10 {
        let mut p = sll2(0x0800, 1, false);
        p.extend(udp4(src, dst, 1000, 0));
        tally.add(&parse(LINKTYPE_LINUX_SLL2, &p).unwrap());
    }
    let mut source = PacketSource::new(&Roots::default(), "lo");
    let mut reg = Registry::default();
    source.ingest(1_000, &tally, &watched, &mut reg);
    let shipped = source.take_flows().expect("the first read ships");
    let sent = shipped
        .flows
        .iter()
        .find(|f| f.local == format!("{src}/udp"))
        .unwrap_or_else(|| panic!("{src} in {shipped:#?}"));
    assert_eq!(sent.class, Some(FlowClass::Collective));
    assert_eq!(sent.pids, vec![me]);
    assert_eq!((sent.bytes_out, sent.bytes_in), (10_000, 0));
    assert!(sent.loopback);
    let got = shipped
        .flows
        .iter()
        .find(|f| f.local == format!("{dst}/udp"))
        .expect("the receiving socket's flow");
    assert_eq!((got.bytes_in, got.bytes_out), (10_000, 0));
    let round = crate::sources::fake::Round::take(&mut reg);
    let collective_tx = round
        .decls
        .iter()
        .filter(|d| d.name == FLOW_TX_BYTES && d.label("proto") == Some("udp"))
        .filter(|d| d.label("class") == Some("collective"))
        .filter_map(|d| round.values.iter().rev().find(|(id, _)| *id == d.id))
        .map(|&(_, v)| v)
        .sum::<u64>();
    assert_eq!(collective_tx, 10_000);

    // The next read's bytes add to the flow's totals; an unchanged socket table is not read.
    let reads = source.sockets.reads;
    source.ingest(600_000_000, &tally, &watched, &mut reg);
    let shipped = source.take_flows().expect("half a second later");
    let sent = shipped
        .flows
        .iter()
        .find(|f| f.local == format!("{src}/udp"))
        .unwrap();
    assert_eq!(sent.bytes_out, 20_000);
    assert_eq!(source.sockets.reads, reads);
    drop((rx, tx));
}

/// A datagram to a port no socket of the node holds is `other`, oriented by the direction the
/// link header gave.
#[test]
fn a_datagram_no_socket_holds_is_other() {
    let mut tally = Tally::default();
    let mut p = sll2(0x0800, 3, false);
    p.extend(udp4(addr("10.9.9.9:53"), addr("10.9.9.8:1"), 64, 0));
    tally.add(&parse(LINKTYPE_LINUX_SLL2, &p).unwrap());
    let mut source = PacketSource::new(&Roots::default(), "lo");
    let mut reg = Registry::default();
    source.ingest(1, &tally, &Watched::new(vec![std::process::id()]), &mut reg);
    let shipped = source.take_flows().unwrap();
    assert_eq!(shipped.flows.len(), 1);
    let f = &shipped.flows[0];
    assert_eq!(f.local, "10.9.9.8:1/udp");
    assert_eq!(f.class, Some(FlowClass::Other));
    assert_eq!((f.bytes_in, f.bytes_out), (64, 0));
    assert!(!f.loopback);
}

/// As root, the capture thread on every interface ("any", as the agent opens it) counts a real
/// loopback UDP transfer of known size once; without
/// the privilege it cannot open, and the source says so and reads nothing.
#[test]
fn a_loopback_udp_transfer_is_captured_or_capture_is_said_off() {
    let me = std::process::id();
    let watched = Watched {
        pids: vec![me],
        launchers: Vec::new(),
        loops: vec![me],
    };
    let mut source = PacketSource::new(&Roots::default(), "any");
    let mut reg = Registry::default();
    let open = source.wait_open(std::time::Duration::from_secs(10));
    // SAFETY: no arguments.
    if unsafe { libc::geteuid() } != 0 {
        assert!(!open && source.off_reason().is_some());
        assert!(source.describe().starts_with("UDP flows off"));
        return;
    }
    assert!(open, "root may capture: {:?}", source.off_reason());
    let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    rx.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let (src, dst) = (tx.local_addr().unwrap(), rx.local_addr().unwrap());
    let mut buf = vec![0u8; 2000];
    for _ in 0..500 {
        tx.send_to(&[1u8; 1200], dst).unwrap();
        rx.recv(&mut buf).unwrap();
    }
    // The thread hands packets over after its read timeout at most.
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut sent = 0;
    while sent < 600_000 && std::time::Instant::now() < end {
        std::thread::sleep(std::time::Duration::from_millis(200));
        source.sample(&watched, &mut reg).unwrap();
        if let Some(f) = source.take_flows() {
            if let Some(s) = f.flows.iter().find(|f| f.local == format!("{src}/udp")) {
                sent = s.bytes_out;
                assert_eq!(s.class, Some(FlowClass::Collective));
            }
        }
    }
    assert_eq!(
        sent, 600_000,
        "500 datagrams of 1200 bytes, each counted once"
    );
}
