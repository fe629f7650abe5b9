//! Issue 29: UDP flows from captured packet headers. A "job" in node A (a network namespace)
//! sends a UDP transfer of known size to a receiver in node B over the veth; `stallscope run`
//! as root captures (pcap on "any", headers only) and node A's summary lists the flow as the
//! job's, with the bytes sent within a few percent. Needs root for the namespaces and the
//! capture; CI runs as root.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

/// Counts the bytes of the datagrams that reach `addr:port` until none came for 3 s (after
/// the first), and writes the count to `out` (after `ready` once bound).
const RECEIVER: &str = r#"
import socket, sys
addr, port, ready, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
s.bind((addr, port))
open(ready, "w").close()
s.settimeout(120)
n = 0
while True:
    try:
        b = s.recv(65536)
    except socket.timeout:
        break
    n += len(b)
    s.settimeout(3)
with open(out, "w") as f:
    f.write(str(n))
"#;

/// The job: after a second (a training job's start takes longer; the capture opens at the
/// source's first read), sends `n` bytes to `addr:port` in 1400-byte datagrams, about 10 MB/s,
/// then waits long enough for the agent to read and ship the flow.
const JOB: &str = r#"
import socket, sys, time
addr, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
time.sleep(1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
chunk = b"u" * 1400
sent = 0
while sent < n:
    k = min(len(chunk), n - sent)
    s.sendto(chunk[:k], (addr, port))
    sent += k
    if sent % (1400 * 14) == 0:
        time.sleep(0.002)
time.sleep(2)
"#;

#[test]
fn a_udp_transfer_of_known_size_is_the_jobs_flow_with_its_bytes() {
    if !am_root("create network namespaces and capture packets") {
        return;
    }
    let prefix = format!("ud{}", std::process::id() % 100_000);
    let net = format!("{}", 60 + std::process::id() % 89);
    let _cluster = Cluster::up(&prefix, &["--net", &net]);
    let (addr_b, port) = (format!("10.77.{net}.2"), "5301");
    let dir = tempfile::tempdir().unwrap();
    let (ready, counted) = (dir.path().join("ready"), dir.path().join("counted"));
    let mut receiver = Reaped::spawn(
        Command::new("ip")
            .args(["netns", "exec", &format!("{prefix}b"), &python(), "-c"])
            .args([RECEIVER, &addr_b, port])
            .arg(&ready)
            .arg(&counted),
        &dir.path().join("receiver.log"),
    );
    wait_for_file(&ready, Duration::from_secs(60), "the UDP receiver");

    let bytes: u64 = 4_000_000;
    let json = dir.path().join("node.json");
    let log = dir.path().join("run.log");
    let mut run = Reaped::spawn(
        stallscope_in(&format!("{prefix}a"))
            .args(["run", "-q", "-o"])
            .arg(dir.path().join("node.stallscope"))
            .arg("--summary-json")
            .arg(&json)
            .args([
                "--",
                &python(),
                "-c",
                JOB,
                &addr_b,
                port,
                &bytes.to_string(),
            ]),
        &log,
    );
    run.wait_success(Duration::from_secs(120), "the job under stallscope", &log);
    receiver.wait_success(
        Duration::from_secs(60),
        "the UDP receiver",
        &dir.path().join("receiver.log"),
    );
    let received = count_written_in(&counted);

    let s = read_json(&json);
    let nodes = s["nodes"].as_array().expect("nodes");
    let flows = nodes[0]["flows"].as_array().expect("flows listed");
    let remote = format!("{addr_b}:{port}/udp");
    let flow = flows
        .iter()
        .find(|f| f["remote"] == remote)
        .unwrap_or_else(|| panic!("the UDP flow to {remote} is listed: {flows:#?}"));
    assert_eq!(
        flow["class"], "collective",
        "the job's own socket: {flow:#}"
    );
    assert!(!flow["pids"].as_array().unwrap().is_empty(), "{flow:#}");
    let sent = flow["bytes_out"].as_f64().unwrap();
    eprintln!("the UDP flow counted {sent} bytes of the {bytes} sent ({received} received)");
    let known = bytes as f64;
    assert!(
        (sent - known).abs() <= 0.03 * known,
        "the flow's {sent} bytes within 3% of the {bytes} sent ({received} received): {flow:#}"
    );
}
