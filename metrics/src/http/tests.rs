//! The server against clients that hold connections open (issue 30, item 2), over real
//! loopback sockets. Bounds are generous: a loaded machine's timers run late.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::Instant;

use super::*;

fn serve(limits: Limits) -> MetricsServer {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    start_on(listener, Arc::default(), limits).unwrap()
}

/// Whether the server closed `s` within `within` (it reads end of stream or a reset).
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {} // an answer: read on to the close
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false, // timed out: still open
        }
    }
}

fn scrape(addr: SocketAddr) -> std::io::Result<String> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)?;
    Ok(answer)
}

/// A request whose head never ends is closed at the header time (before: hyper had no timer,
/// and the connection stayed open as long as the client wished).
#[test]
fn a_half_sent_request_is_closed_at_the_header_time() {
    let server = serve(Limits {
        header_read: Duration::from_secs(1),
        ..Limits::default()
    });
    let mut s = TcpStream::connect(server.local_addr()).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    assert!(
        closed_within(&mut s, Duration::from_secs(30)),
        "still open 30 s after a 1 s header time"
    );
    // And a connection kept alive after its answer, then idle, the same.
    let mut s = TcpStream::connect(server.local_addr()).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert!(
        closed_within(&mut s, Duration::from_secs(30)),
        "idle, still open"
    );
}

/// Connections over the limit are closed at accept (before: each was served, holding a file
/// descriptor); once the idle ones go, scrapes are answered.
#[test]
fn connections_over_the_limit_are_closed_at_accept() {
    let server = serve(Limits {
        max_connections: 4,
        // Longer than the test: only the limit can close the newcomer.
        header_read: Duration::from_secs(120),
        ..Limits::default()
    });
    let addr = server.local_addr();
    let idle: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let mut extra = TcpStream::connect(addr).unwrap();
    assert!(
        closed_within(&mut extra, Duration::from_secs(20)),
        "the fifth connection is served"
    );
    drop(idle);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match scrape(addr) {
            Ok(answer) if answer.starts_with("HTTP/1.1 200") => break,
            other => assert!(Instant::now() < deadline, "no scrape answered: {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A listener whose `accept` fails at once every time (shut down: EINVAL, as EMFILE does when
/// no descriptor is left) is retried with pauses, not in a loop at full CPU.
#[test]
fn failed_accepts_are_retried_after_a_pause() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let fd = listener.as_raw_fd();
    let server = start_on(listener, Arc::default(), Limits::default()).unwrap();
    // SAFETY: the fd is the server's listener, open until `server` is dropped below.
    assert_eq!(unsafe { libc::shutdown(fd, libc::SHUT_RDWR) }, 0);
    let _wake = TcpStream::connect(server.local_addr());
    std::thread::sleep(Duration::from_millis(1500));
    let errors = server.accept_errors();
    // 10, 20, 40 ... 1000 ms: about 8 in 1.5 s; an unpaused loop makes millions.
    assert!(
        (1..=30).contains(&errors),
        "{errors} failed accepts in 1.5 s"
    );
    drop(server);
}
