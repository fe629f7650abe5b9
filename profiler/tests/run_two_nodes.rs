//! (ii) Two ranks on two "nodes" (network namespaces) joined by a veth shaped to 50 Mbit/s:
//! the all-reduce is slow, so `network` must be the largest category and `compute` must not.
//! Needs root for the namespaces; CI runs as root.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;

#[test]
fn a_slow_network_makes_network_the_largest_category() {
    if !am_root("create network namespaces") || !have_torch() {
        return;
    }
    // Generate the images before the clock starts (both ranks read the same folder).
    generate_images();
    let prefix = format!("ss{}", std::process::id() % 100_000);
    let net = format!("{}", 100 + std::process::id() % 100);
    let _cluster = Cluster::up(&prefix, &["50mbit", "--net", &net]);
    let master = format!("10.77.{net}.1");
    let dir = tempfile::tempdir().unwrap();
    let mut ranks = Vec::new();
    for node in 0..2 {
        let ns = format!("{prefix}{}", if node == 0 { "a" } else { "b" });
        let json = dir.path().join(format!("node{node}.json"));
        let child = stallscope_in(&ns)
            .args(["run", "-q", "-o"])
            .arg(dir.path().join(format!("node{node}.stallscope")))
            .arg("--summary-json")
            .arg(&json)
            // The environment torchrun would give each rank (Debian's torch 1.13 torchrun
            // fails on Python 3.11), one rank per node.
            .args([
                "--",
                &python(),
                &example(),
                "--iters",
                "8",
                "--workers",
                "0",
                "--batch",
                "4",
                "--image-size",
                "32",
            ])
            .args(["--width", "48", "--images", "64", "--data-dir", &data_dir()])
            .env("GLOO_SOCKET_IFNAME", "eth0")
            .env("RANK", node.to_string())
            .env("LOCAL_RANK", "0")
            .env("WORLD_SIZE", "2")
            .env("MASTER_ADDR", &master)
            .env("MASTER_PORT", "29531")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        ranks.push((Reaped(child), json));
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    for (child, _) in &mut ranks {
        loop {
            if let Some(status) = child.0.try_wait().unwrap() {
                let mut err = String::new();
                use std::io::Read;
                let _ = child
                    .0
                    .stderr
                    .take()
                    .map(|mut e| e.read_to_string(&mut err));
                assert!(status.success(), "a node failed: {status:?}\n{err}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the two-node training did not finish in 300 s"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    for (_, json) in &ranks {
        let s = read_json(json);
        assert_eq!(s["ranks"].as_array().unwrap().len(), 1, "{s:#}");
        assert_eq!(largest(&s), "network", "{s:#}");
        assert!(fraction(&s, "network") > fraction(&s, "compute"), "{s:#}");
        assert_eq!(s["finding"]["category"], "network", "{s:#}");
    }
    // The two nodes' run profiles, joined as the collector would: one report of both ranks
    // with network as the verdict.
    let profiles: Vec<std::path::PathBuf> = (0..2)
        .map(|n| dir.path().join(format!("node{n}.stallscope")))
        .collect();
    let args: Vec<&std::ffi::OsStr> = profiles.iter().map(|p| p.as_os_str()).collect();
    if let Some(dom) = report_in_chromium(dir.path(), "joined", &args) {
        assert_report_holds(
            &dom,
            &[0, 1],
            &[
                "chart-timeline",
                "chart-iteration-time",
                "chart-resource-nic",
            ],
        );
        let verdict = &dom[dom.find("id=\"verdict\"").unwrap()..];
        assert!(
            verdict[..verdict.find("</section>").unwrap()].contains("network"),
            "{verdict}"
        );
    }
}
