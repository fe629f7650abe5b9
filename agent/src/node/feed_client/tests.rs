//! The client against servers that never end a line (issue 30, item 6): it stops at its
//! limit with an error naming it, instead of growing for as long as the server sends.

use std::io::Write;
use std::net::TcpListener;
use std::os::unix::net::UnixListener;

use super::*;

/// bytes, the limit the tests give the client (the real one is 64 MiB).
const LIMIT: usize = 1 << 20;

/// A collector that welcomes any viewer and then sends `parts` feed parts of
/// [`wire::FEED_PART`] bytes, none of them the last, and hangs up.
fn endless_collector(parts: usize) -> (String, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let serving = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let challenge = CollectorMsg::Challenge {
            nonce: vec![7; wire::NONCE_BYTES],
        };
        s.write_all(&wire::encode(&challenge)).unwrap();
        let _watch = read_agent_msg(&mut s);
        let welcome = CollectorMsg::Welcome {
            collector_version: "test".into(),
        };
        s.write_all(&wire::encode(&welcome)).unwrap();
        let part = wire::encode(&CollectorMsg::Feed {
            part: vec![b'x'; wire::FEED_PART],
            last: false,
        });
        for _ in 0..parts {
            if s.write_all(&part).is_err() {
                return; // the client gave up: what the test wants
            }
        }
    });
    (addr, serving)
}

fn read_agent_msg(s: &mut impl Read) -> AgentMsg {
    let mut prefix = [0u8; 4];
    s.read_exact(&mut prefix).unwrap();
    let mut payload = vec![0u8; wire::payload_len(prefix).unwrap()];
    s.read_exact(&mut payload).unwrap();
    wire::decode(&payload).unwrap()
}

#[test]
fn a_collector_that_never_ends_a_line_is_stopped_at_the_limit() {
    // 32 parts: 8 MiB, eight times the limit.
    let (addr, serving) = endless_collector(32);
    let client = FeedClient::connect_tcp(&addr, "", Duration::from_secs(30), None).unwrap();
    let mut client = FeedClient {
        max_line: LIMIT,
        ..client
    };
    let err = match client.next_message() {
        Some(Err(e)) => e,
        other => panic!(
            "expected the limit's error, got {:?}",
            other.map(|r| r.is_ok())
        ),
    };
    assert!(
        matches!(err, FeedError::TooLong { limit: LIMIT, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("over the 1 MiB limit"), "{err}");
    drop(client);
    serving.join().unwrap();
}

#[test]
fn a_feed_socket_that_never_ends_a_line_is_stopped_at_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.feed");
    let listener = UnixListener::bind(&path).unwrap();
    let serving = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.write_all(format!("{{\"feed\":\"{FEED_SCHEMA}\"}}\n").as_bytes())
            .unwrap();
        let chunk = vec![b'x'; 64 * 1024];
        for _ in 0..4 * LIMIT / chunk.len() {
            if s.write_all(&chunk).is_err() {
                return;
            }
        }
    });
    let client = FeedClient::connect(&path, Duration::from_secs(30)).unwrap();
    let mut client = FeedClient {
        max_line: LIMIT,
        ..client
    };
    let err = match client.next_message() {
        Some(Err(e)) => e,
        other => panic!(
            "expected the limit's error, got {:?}",
            other.map(|r| r.is_ok())
        ),
    };
    assert!(matches!(err, FeedError::TooLong { .. }), "{err}");
    drop(client);
    serving.join().unwrap();
}

#[test]
fn lines_within_the_limit_are_read_whole() {
    let mut r = std::io::Cursor::new(b"{\"a\":1}\n\nlast".to_vec());
    let mut lines = Vec::new();
    while let Ok(Some(l)) = read_line_within(&mut r, 8) {
        lines.push(String::from_utf8(l).unwrap());
    }
    assert_eq!(lines, ["{\"a\":1}", "", "last"]);
    let mut r = std::io::Cursor::new(b"123456789\n".to_vec());
    assert!(matches!(
        read_line_within(&mut r, 8),
        Err(LineError::TooLong)
    ));
}
