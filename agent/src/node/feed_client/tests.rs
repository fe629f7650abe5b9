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

/// A hub on a feed socket, and a model it publishes: a snapshot, an update of two ranks, the
/// end. Returns the socket (kept open) and a function publishing once a client subscribed.
fn served_hub(
    dir: &std::path::Path,
) -> (
    super::super::feed::FeedSocket,
    std::sync::Arc<super::super::feed::FeedHub>,
) {
    let hub = std::sync::Arc::new(super::super::feed::FeedHub::default());
    let socket = super::super::feed::serve(hub.clone(), &dir.join("run.feed")).unwrap();
    (socket, hub)
}

fn publish_a_run(hub: &super::super::feed::FeedHub) -> JobView {
    use stallscope_analysis::view::{IterationParts, RankView, ViewUpdate};
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while hub.subscribers() == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    // Time for the client's request to arrive before the first message (it may not: the
    // switch then comes at a later message, which the client also reads).
    std::thread::sleep(Duration::from_millis(50));
    let mut view = JobView::new("train");
    hub.publish(&view, ViewUpdate::default());
    let update = ViewUpdate {
        now_ns: 5,
        attributed: 2,
        ranks: (0..2)
            .map(|rank| RankView {
                rank,
                node: "n0".into(),
                ..RankView::default()
            })
            .collect(),
        parts: (0..2)
            .map(|rank| (rank, IterationParts::default()))
            .collect(),
        ..ViewUpdate::default()
    };
    view.apply(update.clone());
    hub.publish(&view, update);
    hub.end();
    view
}

/// Issue 31: `top` asks for the binary form and folds the same model the JSON gives.
#[test]
fn a_viewer_that_asks_gets_the_binary_form_and_the_same_model() {
    let dir = tempfile::tempdir().unwrap();
    let (socket, hub) = served_hub(dir.path());
    let client = FeedClient::connect(socket.path(), Duration::from_secs(30)).unwrap();
    let mut client = client.binary();
    let publishing = std::thread::spawn(move || publish_a_run(&hub));
    let mut messages = 0;
    while let Some(next) = client.next_message() {
        let (line, msg) = next.unwrap();
        messages += 1;
        if client.is_binary() {
            assert!(line.is_empty(), "no JSON line in the binary form: {line}");
        }
        if matches!(msg, FeedMessage::End) {
            break;
        }
    }
    let view = publishing.join().unwrap();
    assert_eq!(messages, 3);
    assert!(client.is_binary(), "the server switched to the binary form");
    assert_eq!(client.view(), Some(&view));
}

/// `stallscope feed --json` asks nothing and keeps the JSON lines.
#[test]
fn a_viewer_that_asks_nothing_keeps_the_json_lines() {
    let dir = tempfile::tempdir().unwrap();
    let (socket, hub) = served_hub(dir.path());
    let mut client = FeedClient::connect(socket.path(), Duration::from_secs(30)).unwrap();
    let publishing = std::thread::spawn(move || publish_a_run(&hub));
    let mut lines = Vec::new();
    while let Some(next) = client.next_message() {
        let (line, msg) = next.unwrap();
        lines.push(line);
        if matches!(msg, FeedMessage::End) {
            break;
        }
    }
    let view = publishing.join().unwrap();
    assert!(!client.is_binary());
    assert_eq!(lines.len(), 3);
    assert!(lines[0].starts_with("{\"snapshot\":"), "{}", lines[0]);
    assert!(lines[1].starts_with("{\"update\":"), "{}", lines[1]);
    assert_eq!(lines[2], "{\"end\":true}");
    assert_eq!(client.view(), Some(&view));
}

/// A server that switches and then sends bytes that are no frame: a clear error.
#[test]
fn a_malformed_binary_frame_is_an_error_that_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.feed");
    let listener = UnixListener::bind(&path).unwrap();
    let serving = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let hello = format!("{{\"feed\":\"{FEED_SCHEMA}\"}}\n");
        let switch = format!("{}\n", binary_request());
        s.write_all(hello.as_bytes()).unwrap();
        s.write_all(switch.as_bytes()).unwrap();
        // A frame of 3 bytes whose variant does not exist.
        s.write_all(&[3, 0, 0, 0, 200, 1, 2]).unwrap();
        // Until the client hangs up.
        let _ = s.read_to_end(&mut Vec::new());
    });
    let client = FeedClient::connect(&path, Duration::from_secs(30)).unwrap();
    let mut client = client.binary();
    let err = match client.next_message() {
        Some(Err(e)) => e,
        other => panic!("expected an error, got {:?}", other.map(|r| r.is_ok())),
    };
    assert!(matches!(err, FeedError::Malformed { .. }), "{err}");
    assert!(
        err.to_string().contains("malformed binary feed frame"),
        "{err}"
    );
    drop(client);
    serving.join().unwrap();
}
