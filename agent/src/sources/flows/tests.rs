use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

use super::*;

fn watched_loop(pid: u32) -> Watched {
    Watched {
        pids: vec![pid],
        launchers: Vec::new(),
        loops: vec![pid],
    }
}

/// Sends `bytes` over a fresh loopback connection and waits until the peer read them all.
fn transfer(bytes: usize) -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut tx = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (mut rx, _) = listener.accept().unwrap();
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0; bytes];
        rx.read_exact(&mut buf).unwrap();
        rx
    });
    tx.write_all(&vec![7u8; bytes]).unwrap();
    let rx = reader.join().unwrap();
    (tx, rx)
}

/// A real connection of the job's training loop (this test process) is seen by the dump with
/// the bytes it sent, classed `collective`, and counted in the class's loopback series.
#[test]
fn a_loops_connection_is_a_collective_flow_with_its_bytes() {
    let mut source = FlowSource::new(&Roots::default());
    let me = std::process::id();
    let mut reg = Registry::default();
    source
        .sample(&watched_loop(me), &mut reg)
        .expect("sock_diag works unprivileged");
    let (tx, _rx) = transfer(3_000_000);
    source.sample(&watched_loop(me), &mut reg).unwrap();
    let local = tx.local_addr().unwrap().to_string();
    // The first read shipped what was open then (if anything), not what moved since.
    source.take_flows();
    // The next ship is due a second after the first read.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    source.sample(&watched_loop(me), &mut reg).unwrap();
    let shipped = source
        .take_flows()
        .expect("a second later, what moved is shipped");
    let flow = shipped
        .flows
        .iter()
        .find(|f| f.local == local)
        .unwrap_or_else(|| panic!("{local} in {shipped:#?}"));
    assert_eq!(flow.class, Some(FlowClass::Collective));
    assert!(flow.loopback);
    assert_eq!(flow.pids, vec![me]);
    assert_eq!(flow.bytes_out, 3_000_000, "{flow:?}");
    let round = crate::sources::fake::Round::take(&mut reg);
    let sent = round
        .decls
        .iter()
        .filter(|d| d.name == FLOW_TX_BYTES && d.label("class") == Some("collective"))
        .filter_map(|d| round.values.iter().rev().find(|(id, _)| *id == d.id))
        .map(|&(_, v)| v)
        .sum::<u64>();
    assert!(sent >= 3_000_000, "collective bytes sent: {sent}");
}

/// A connection no job process holds is `other`, and the job's are found again after the job
/// gains a process (its fds are read again only then, or for a socket not placed yet).
#[test]
fn a_connection_outside_the_job_is_other_and_fds_are_read_only_when_needed() {
    let me = std::process::id();
    let (tx, _rx) = transfer(1000);
    let local = tx.local_addr().unwrap();
    let mut source = FlowSource::new(&Roots::default());
    let mut reg = Registry::default();
    // This process is stallscope itself here: its sockets are left out.
    source.sample(&Watched::new(vec![]), &mut reg).unwrap();
    let shipped = source.take_flows().unwrap_or_default();
    assert!(shipped.flows.iter().all(|f| f.local != local.to_string()));
    let rescans = source.owners.rescans;
    source.sample(&Watched::new(vec![]), &mut reg).unwrap();
    assert_eq!(source.owners.rescans, rescans, "nothing new: no fds read");
    assert_eq!(
        classify(&[], &Watched::new(vec![me]), None, local, local),
        FlowClass::Other
    );
}

#[test]
fn the_store_port_is_control_workers_are_data_launchers_control() {
    let w = Watched {
        pids: vec![1, 2, 3],
        launchers: vec![1],
        loops: vec![2],
    };
    let a: SocketAddr = "10.0.0.1:41000".parse().unwrap();
    let store: SocketAddr = "10.0.0.2:29500".parse().unwrap();
    assert_eq!(
        classify(&[2], &w, Some(29500), a, store),
        FlowClass::Control
    );
    assert_eq!(
        classify(&[2], &w, Some(29501), a, store),
        FlowClass::Collective
    );
    assert_eq!(classify(&[3], &w, None, a, store), FlowClass::Data);
    assert_eq!(classify(&[2, 3], &w, None, a, store), FlowClass::Collective);
    assert_eq!(classify(&[1], &w, None, a, store), FlowClass::Control);
    assert_eq!(
        socket_inode(std::ffi::OsStr::new("socket:[4711]")),
        Some(4711)
    );
    assert_eq!(socket_inode(std::ffi::OsStr::new("pipe:[4711]")), None);
}

/// Between two dumps the job's known flows are asked for by name: their bytes go on being
/// counted with no dump, and one that closes is forgotten.
#[test]
fn between_dumps_the_jobs_flows_are_looked_up_and_closed_ones_dropped() {
    let me = std::process::id();
    let (mut tx, mut rx) = transfer(1000);
    let key = (rx.local_addr().unwrap(), rx.peer_addr().unwrap());
    let mut source = FlowSource::new(&Roots::default());
    source.dump_every_ns = Nanos::MAX;
    source.quiet_read_every_ns = 0;
    let mut reg = Registry::default();
    source.sample(&watched_loop(me), &mut reg).unwrap();
    assert_eq!(source.dumps, 1, "the first read dumps");
    assert!(
        source.flows.contains_key(&key),
        "the open connection is known"
    );
    tx.write_all(&[7u8; 5000]).unwrap();
    rx.read_exact(&mut [0u8; 5000]).unwrap();
    source.sample(&watched_loop(me), &mut reg).unwrap();
    assert_eq!(source.dumps, 1, "the second read only looks up");
    let track = &source.flows[&key];
    assert_eq!(track.sample.bytes_in, 5000, "{track:?}");
    assert_eq!(track.sample.class, Some(FlowClass::Collective));
    drop(tx);
    drop(rx);
    // The close takes the kernel a moment (FIN, ACK): bounded in time, not in timing.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while source.flows.contains_key(&key) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
        source.sample(&watched_loop(me), &mut reg).unwrap();
    }
    assert_eq!(source.dumps, 1, "still no dump");
    assert!(
        !source.flows.contains_key(&key),
        "the closed connection is dropped"
    );
}

/// A foreign flow (no job process holds it: here, none can be placed, the fds being read from
/// an empty proc root) is asked for between dumps while it moves, so its bytes are counted
/// read by read and a close loses at most one read's; once a read finds it still, only the
/// next dump looks at it again. What a closed flow moved since the last ship is shipped.
#[test]
fn between_dumps_a_moving_foreign_flow_is_looked_up_a_still_one_waits_for_the_dump() {
    let (mut tx, mut rx) = transfer(1000);
    let key = (rx.local_addr().unwrap(), rx.peer_addr().unwrap());
    let local = key.0.to_string();
    let empty = tempfile::tempdir().unwrap();
    let roots = Roots {
        proc: empty.path().to_path_buf(),
        ..Roots::default()
    };
    let mut source = FlowSource::new(&roots);
    source.dump_every_ns = Nanos::MAX;
    source.quiet_read_every_ns = 0;
    let mut reg = Registry::default();
    let job = Watched::new(vec![]);
    let mut send = |n: usize| {
        tx.write_all(&vec![7u8; n]).unwrap();
        rx.read_exact(&mut vec![0u8; n]).unwrap();
    };
    source.sample(&job, &mut reg).unwrap();
    assert_eq!(source.flows[&key].sample.class, Some(FlowClass::Other));
    // It had not moved at the first read: the look-ups leave it be.
    send(5000);
    source.sample(&job, &mut reg).unwrap();
    assert_eq!((source.dumps, source.flows[&key].sample.bytes_in), (1, 0));
    // A dump sees it move; from then on every read asks for it.
    source.last_dump_ns = None;
    source.sample(&job, &mut reg).unwrap();
    assert_eq!(
        (source.dumps, source.flows[&key].sample.bytes_in),
        (2, 5000)
    );
    send(7000);
    source.sample(&job, &mut reg).unwrap();
    assert_eq!(
        (source.dumps, source.flows[&key].sample.bytes_in),
        (2, 12000)
    );
    // Still at a read: no longer asked for.
    source.sample(&job, &mut reg).unwrap();
    send(3000);
    source.sample(&job, &mut reg).unwrap();
    assert_eq!(
        (source.dumps, source.flows[&key].sample.bytes_in),
        (2, 12000)
    );
    // Moving again at a dump, then closed: dropped with no dump.
    source.last_dump_ns = None;
    source.sample(&job, &mut reg).unwrap();
    assert_eq!(
        (source.dumps, source.flows[&key].sample.bytes_in),
        (3, 15000)
    );
    // No ship until the close is seen (the close takes tens of ms, a ship is due in 500).
    source.last_ship_ns = Some(crate::clock::monotonic_ns());
    source.take_flows();
    drop(tx);
    drop(rx);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while source.flows.contains_key(&key) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
        source.sample(&job, &mut reg).unwrap();
    }
    assert_eq!(source.dumps, 3, "no dump");
    assert!(
        !source.flows.contains_key(&key),
        "the closed flow is dropped"
    );
    assert!(source.take_flows().is_none(), "no ship yet");
    std::thread::sleep(std::time::Duration::from_millis(550));
    source.sample(&job, &mut reg).unwrap();
    let shipped = source.take_flows().expect("a ship half a second on");
    let last = shipped.flows.iter().find(|f| f.local == local);
    assert_eq!(last.map(|f| f.bytes_in), Some(15000), "{shipped:#?}");
}

/// A job whose flows are all collectives over loopback (one node) is read every half second,
/// not at every call: the attribution reads none of them tick by tick. Once one of its
/// processes is a loader worker holding a connection (a flow of class `data`), every call
/// reads, and the bytes it received are counted at once.
#[test]
fn flows_the_attribution_reads_per_tick_are_read_at_every_call_the_others_twice_a_second() {
    let me = std::process::id();
    let (mut tx, mut rx) = transfer(1000);
    let mut source = FlowSource::new(&Roots::default());
    let mut reg = Registry::default();
    source.sample(&watched_loop(me), &mut reg).unwrap();
    for _ in 0..5 {
        source.sample(&watched_loop(me), &mut reg).unwrap();
    }
    assert_eq!(
        source.reads_made, 1,
        "loopback collectives: no read within 500 ms"
    );
    std::thread::sleep(std::time::Duration::from_millis(550));
    source.sample(&watched_loop(me), &mut reg).unwrap();
    assert_eq!(source.reads_made, 2, "and one once they passed");
    // The same process as a loader worker: its connection is the loader's own (`data`).
    let worker = Watched {
        pids: vec![1, me],
        launchers: Vec::new(),
        loops: vec![1],
    };
    assert!(worker.is_worker(me));
    std::thread::sleep(std::time::Duration::from_millis(550));
    source.sample(&worker, &mut reg).unwrap();
    assert_eq!(source.reads_made, 3);
    let key = (rx.local_addr().unwrap(), rx.peer_addr().unwrap());
    assert_eq!(source.flows[&key].sample.class, Some(FlowClass::Data));
    tx.write_all(&[7u8; 5000]).unwrap();
    rx.read_exact(&mut [0u8; 5000]).unwrap();
    source.sample(&worker, &mut reg).unwrap();
    assert_eq!(source.reads_made, 4, "a data flow: every call reads");
    assert_eq!(source.flows[&key].sample.bytes_in, 5000);
}

/// What a whole-table dump (both families) and a look-up of the known sockets cost here, with
/// ten loopback connections open: the reason the reads between dumps look up.
/// `cargo test -p stallscope-agent --release --lib -- --ignored --nocapture dump_and_look_up_costs`
#[test]
#[ignore = "a measurement, not a check"]
fn dump_and_look_up_costs() {
    let _open: Vec<_> = (0..10).map(|_| transfer(1000)).collect();
    let mut diag = SockDiag::open().unwrap();
    let mut sockets = Vec::new();
    diag.dump(&mut sockets).unwrap();
    let keys: Vec<SocketKey> = sockets
        .iter()
        .map(|s| SocketKey {
            local: s.local,
            remote: s.remote,
            interface: s.interface,
            cookie: s.cookie,
        })
        .collect();
    let cpu_us = |f: &mut dyn FnMut()| {
        let t = std::time::Instant::now();
        let before = thread_cpu_ns();
        for _ in 0..200 {
            f();
        }
        let cpu = (thread_cpu_ns() - before) as f64 / 200.0 / 1e3;
        (cpu, t.elapsed().as_secs_f64() * 1e6 / 200.0)
    };
    let (dump_cpu, dump_wall) = cpu_us(&mut || {
        let mut out = Vec::new();
        diag.dump(&mut out).unwrap();
    });
    let mut found = 0;
    let (look_cpu, look_wall) = cpu_us(&mut || {
        let mut out = Vec::new();
        diag.look_up(&keys, &mut out).unwrap();
        found = out.len();
    });
    println!(
        "dump (IPv4 + IPv6, {} sockets): {dump_cpu:.1} us CPU ({dump_wall:.1} us wall); \
         look-up of {} sockets: {look_cpu:.1} us CPU ({look_wall:.1} us wall), {found} found",
        sockets.len(),
        keys.len()
    );
}

/// ns on the CPU of the calling thread.
fn thread_cpu_ns() -> u64 {
    let (user, kernel) = crate::clock::thread_cpu_ns();
    user + kernel
}
