//! Multi-node: an agent per node streams to one collector, which aligns clocks, joins the
//! ranks and names stragglers. Two real DDP trainings:
//!
//! 1. Three network namespaces (two nodes and the collector) on a bridge shaped to 20 Mbit/s,
//!    one rank per node, token required. Node b's agent reports its clock 50 ms behind; a third
//!    agent with a wrong token and a client sending garbage are refused; the collector is
//!    killed (SIGKILL) mid-run and restarted on the same profile. The job profile must hold
//!    every iteration of both ranks, `network` must be the largest category, and both clock
//!    offsets must be recovered within 1 ms.
//! 2. On loopback, two agents (one rank each) with rank 1 slowed (`--data-delay-ms 1:30`):
//!    rank 1 is named straggler, and rank 0's time goes to `peer_wait`.
//!
//! Needs root for the namespaces; CI runs as root.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

fn in_ns(ns: Option<&str>) -> Command {
    match ns {
        Some(ns) => stallscope_in(ns),
        None => stallscope(),
    }
}

/// `stallscope run` around one rank of the example, joining the agent at `socket`.
fn rank(
    ns: Option<&str>,
    socket: &Path,
    rank: u32,
    master: &str,
    port: &str,
    extra: &[&str],
) -> Command {
    let mut c = in_ns(ns);
    c.args([
        "run",
        "-q",
        "--",
        &python(),
        &example(),
        "--workers",
        "0",
        "--batch",
        "4",
    ])
    .args([
        "--image-size",
        "32",
        "--images",
        "64",
        "--data-dir",
        &data_dir(),
    ])
    .args(extra)
    .env("STALLSCOPE_SOCKET", socket)
    .env(
        "GLOO_SOCKET_IFNAME",
        if ns.is_some() { "eth0" } else { "lo" },
    )
    .env("RANK", rank.to_string())
    .env("LOCAL_RANK", "0")
    .env("WORLD_SIZE", "2")
    .env("MASTER_ADDR", master)
    .env("MASTER_PORT", port);
    c
}

fn agent(ns: Option<&str>, collector: &str, token: &Path, socket: &Path, node: &str) -> Command {
    let mut c = in_ns(ns);
    c.args(["agent", "--collector", collector, "--token-file"])
        .arg(token)
        .arg("--socket")
        .arg(socket)
        .args(["--node", node]);
    c
}

fn collector(ns: Option<&str>, listen: &str, token: &Path, out: &Path, json: &Path) -> Command {
    let mut c = in_ns(ns);
    c.args(["collector", "--listen", listen, "--token-file"])
        .arg(token)
        .arg("--out")
        .arg(out)
        .arg("--summary-json")
        .arg(json);
    c
}

fn node<'a>(s: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    s["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node"] == name)
        .unwrap_or_else(|| panic!("node {name} in {s:#}"))
}

#[test]
fn agents_stream_to_a_collector_across_namespaces_through_refusals_and_a_restart() {
    if !am_root("create network namespaces") || !have_torch() {
        return;
    }
    generate_images();
    let prefix = format!("mn{}", std::process::id() % 100_000);
    let net = format!("{}", 150 + std::process::id() % 100);
    let _cluster = Cluster::up(&prefix, &["20mbit", "--net", &net, "--collector"]);
    let (na, nb, nc) = (
        format!("{prefix}a"),
        format!("{prefix}b"),
        format!("{prefix}c"),
    );
    let master = format!("10.77.{net}.1");
    let listen = format!("10.77.{net}.3:7571");
    let dir = tempfile::tempdir().unwrap();
    let d = |n: &str| -> PathBuf { dir.path().join(n) };
    std::fs::write(d("token"), "s3cret\n").unwrap();
    std::fs::write(d("wrong"), "guess\n").unwrap();

    let mut col = Reaped::spawn(
        &mut collector(
            Some(&nc),
            &listen,
            &d("token"),
            &d("job.stallscope"),
            &d("first.json"),
        ),
        &d("collector1.log"),
    );
    assert!(wait_for_log(
        &d("collector1.log"),
        "listening",
        Duration::from_secs(10)
    ));
    let mut a = Reaped::spawn(
        &mut agent(Some(&na), &listen, &d("token"), &d("a.sock"), "node-a"),
        &d("agent-a.log"),
    );
    let mut b = Reaped::spawn(
        agent(Some(&nb), &listen, &d("token"), &d("b.sock"), "node-b").arg("--clock-offset-ms=-50"),
        &d("agent-b.log"),
    );
    let mut intruder = Reaped::spawn(
        &mut agent(Some(&na), &listen, &d("wrong"), &d("x.sock"), "intruder"),
        &d("agent-x.log"),
    );
    assert!(wait_for(Duration::from_secs(10), || {
        log_has(&d("collector1.log"), "node node-a joined")
            && log_has(&d("collector1.log"), "node node-b joined")
            && log_has(&d("collector1.log"), "wrong token")
    }));
    // A client that speaks no stallscope is told so (after the challenge every connection
    // opens with), and nobody else notices.
    let garbage = Command::new("ip")
        .args(["netns", "exec", &na, &python(), "-c"])
        .arg(format!(
            "import socket; s=socket.create_connection(('10.77.{net}.3',7571),5); s.sendall(b'\\x00\\x00\\x00\\x08GARBAGE!'); s.settimeout(5); print(b''.join(iter(lambda: s.recv(4096), b'')))"
        ))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&garbage.stdout).contains("not a stallscope Hello"),
        "{garbage:?}"
    );

    let iters = 30;
    let mut ranks: Vec<Reaped> = Vec::new();
    for (r, ns, sock) in [(0, &na, d("a.sock")), (1, &nb, d("b.sock"))] {
        ranks.push(Reaped::spawn(
            &mut rank(
                Some(ns),
                &sock,
                r,
                &master,
                "29541",
                &["--iters", &iters.to_string(), "--width", "48"],
            ),
            &d(&format!("rank{r}.log")),
        ));
    }
    // Kill the collector once iterations flow, and bring it back on the same profile.
    assert!(
        wait_for(Duration::from_secs(120), || {
            let r = stallscope()
                .args(["summary", "--json"])
                .arg(d("job.stallscope"))
                .output()
                .unwrap();
            serde_json::from_slice::<serde_json::Value>(&r.stdout)
                .is_ok_and(|s| s["job"]["iterations"].as_u64().unwrap_or(0) >= 6)
        }),
        "no iterations reached the collector: {}",
        std::fs::read_to_string(d("collector1.log")).unwrap_or_default()
    );
    kill(col.0.id(), libc::SIGKILL);
    let _ = col.0.wait();
    std::thread::sleep(Duration::from_secs(2));
    let mut col2 = Reaped::spawn(
        &mut collector(
            Some(&nc),
            &listen,
            &d("token"),
            &d("job.stallscope"),
            &d("job.json"),
        ),
        &d("collector2.log"),
    );
    for (i, r) in ranks.iter_mut().enumerate() {
        r.wait_success(
            Duration::from_secs(240),
            "a rank",
            &d(&format!("rank{i}.log")),
        );
    }
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        a.stop(libc::SIGTERM, Duration::from_secs(20)),
        "agent a did not end cleanly"
    );
    assert!(
        b.stop(libc::SIGTERM, Duration::from_secs(20)),
        "agent b did not end cleanly"
    );
    intruder.stop(libc::SIGTERM, Duration::from_secs(5));
    assert!(
        col2.stop(libc::SIGTERM, Duration::from_secs(20)),
        "the collector did not end cleanly"
    );
    let log2 = std::fs::read_to_string(d("collector2.log")).unwrap();
    assert!(
        log2.contains("straggler") || log2.contains("finding"),
        "{log2}"
    );

    // The whole job, from the profile both collector lifetimes wrote.
    let out = run_ok(
        stallscope()
            .args(["summary", "--json"])
            .arg(d("job.stallscope")),
    );
    let s = summary_json(&out.stdout);
    let ranks_json = s["ranks"].as_array().unwrap();
    assert_eq!(ranks_json.len(), 2, "{s:#}");
    for r in ranks_json {
        assert_eq!(
            r["iterations"],
            iters - 1,
            "every iteration but the warm-up, no loss: {s:#}"
        );
    }
    assert_eq!(largest(&s), "network", "{s:#}");
    let off_a = node(&s, "node-a")["clock_offset_ms"].as_f64().unwrap();
    let off_b = node(&s, "node-b")["clock_offset_ms"].as_f64().unwrap();
    assert!(off_a.abs() < 1.0, "node a's clock: {off_a} ms");
    assert!(
        (off_b + 50.0).abs() < 1.0,
        "node b's injected -50 ms: {off_b} ms"
    );
    assert!(!s["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|n| n["node"] == "intruder"));
}

/// A job of two nodes on loopback: a collector, an agent per node (`node-a`, `node-b`; `node`
/// may add to each agent's command) and one rank of the example per node, with `example`'s
/// flags. `slot` (0, 1, …) keeps the ports of tests that run at once apart. `while_running`
/// gets the collector's address and token file once the ranks have started. Returns the
/// collector's summary and its log, after every process ended.
fn loopback_job(
    slot: u32,
    dir: &Path,
    node: impl Fn(&str, &mut Command),
    example: &[&str],
    while_running: impl FnOnce(&str, &Path),
) -> (serde_json::Value, String) {
    let d = |n: &str| -> PathBuf { dir.join(n) };
    std::fs::write(d("token"), "t\n").unwrap();
    let port = 17000 + std::process::id() % 300 * 4 + slot;
    let listen = format!("127.0.0.1:{port}");
    let mut col = Reaped::spawn(
        &mut collector(
            None,
            &listen,
            &d("token"),
            &d("job.stallscope"),
            &d("job.json"),
        ),
        &d("collector.log"),
    );
    assert!(wait_for_log(
        &d("collector.log"),
        "listening",
        Duration::from_secs(10)
    ));
    let mut agents: Vec<Reaped> = ["a", "b"]
        .iter()
        .map(|n| {
            let name = format!("node-{n}");
            let mut cmd = agent(None, &listen, &d("token"), &d(&format!("{n}.sock")), &name);
            node(&name, &mut cmd);
            Reaped::spawn(&mut cmd, &d(&format!("agent-{n}.log")))
        })
        .collect();
    assert!(wait_for(Duration::from_secs(10), || {
        log_has(&d("collector.log"), "node-a joined")
            && log_has(&d("collector.log"), "node-b joined")
    }));
    let gloo_port = (28000 + std::process::id() % 300 * 4 + slot).to_string();
    let mut ranks: Vec<Reaped> = [(0, "a"), (1, "b")]
        .iter()
        .map(|(r, n)| {
            Reaped::spawn(
                &mut rank(
                    None,
                    &d(&format!("{n}.sock")),
                    *r,
                    "127.0.0.1",
                    &gloo_port,
                    example,
                ),
                &d(&format!("rank{r}.log")),
            )
        })
        .collect();
    while_running(&listen, &d("token"));
    for (i, r) in ranks.iter_mut().enumerate() {
        r.wait_success(
            Duration::from_secs(240),
            "a rank",
            &d(&format!("rank{i}.log")),
        );
    }
    std::thread::sleep(Duration::from_secs(3));
    for a in &mut agents {
        assert!(a.stop(libc::SIGTERM, Duration::from_secs(20)));
    }
    assert!(col.stop(libc::SIGTERM, Duration::from_secs(20)));
    let log = std::fs::read_to_string(d("collector.log")).unwrap();
    (read_json(&d("job.json")), log)
}

#[test]
fn a_slowed_rank_on_another_node_is_named_straggler() {
    if !have_torch() {
        return;
    }
    generate_images();
    let dir = tempfile::tempdir().unwrap();
    let (s, log) = loopback_job(
        0,
        dir.path(),
        |_, _| {},
        &["--iters", "25", "--data-delay-ms", "1:30"],
        |_, _| {},
    );
    let main = &s["stragglers"];
    let named: Vec<u64> = main
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["rank"].as_u64().unwrap())
        .collect();
    assert!(!named.is_empty() && named.iter().all(|r| *r == 1), "{s:#}");
    assert_eq!(main[0]["node"], "node-b", "{s:#}");
    let r0 = s["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["rank"] == 0)
        .unwrap();
    assert!(
        r0["categories"]["peer_wait"]["fraction"].as_f64().unwrap() > 0.3,
        "rank 0 waits for rank 1: {s:#}"
    );
    assert!(log.contains("straggler: rank 1 on node node-b"), "{log}");
    // The job profile's report names the straggler, its node, and what it was doing.
    let profile = dir.path().join("job.stallscope");
    if let Some(dom) = report_in_chromium(dir.path(), "job", &[profile.as_os_str()]) {
        assert_report_holds(&dom, &[0, 1], &["chart-timeline", "chart-iteration-time"]);
        let section = &dom[dom.find("id=\"stragglers\"").unwrap()..];
        let section = &section[..section.find("</section>").unwrap()];
        assert!(section.contains("node-b"), "{section}");
        assert!(section.contains("data-straggler=\"1\""), "{section}");
        assert!(!section.contains("data-straggler=\"0\""), "{section}");
    }
}

/// The monotonic clocks of two nodes 10 s apart (node-b's agent shifts its clock by 10 s):
/// the collector measures the offset, joins the ranks' iterations on its own clock, and still
/// names the slowed rank the straggler.
#[test]
fn nodes_whose_clocks_are_10_s_apart_are_joined() {
    if !have_torch() {
        return;
    }
    generate_images();
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = loopback_job(
        2,
        dir.path(),
        |name, cmd| {
            if name == "node-b" {
                cmd.arg("--clock-offset-ms=10000");
            }
        },
        &["--iters", "25", "--data-delay-ms", "1:30"],
        |_, _| {},
    );
    let b = node(&s, "node-b");
    let offset = b["clock_offset_ms"].as_f64().unwrap();
    assert!((offset - 10_000.0).abs() < 50.0, "node-b's offset: {s:#}");
    let named: Vec<u64> = s["stragglers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["rank"].as_u64().unwrap())
        .collect();
    assert!(!named.is_empty() && named.iter().all(|r| *r == 1), "{s:#}");
    for r in s["ranks"].as_array().unwrap() {
        assert!(
            r["iterations"].as_u64().unwrap() >= 20,
            "every iteration joined: {s:#}"
        );
    }
    // Issue 28: the job profile's trace opens in Perfetto with each node a process, and the
    // two nodes' ranks on the collector's clock: rank 0 (node-a) and rank 1 (node-b, 10 s
    // ahead) meet at every all-reduce, so their iterations of the same number overlap.
    let Some(ui) = perfetto_ui() else { return };
    let trace = dir.path().join("job.trace.json");
    run_ok(
        stallscope()
            .arg("trace")
            .arg(dir.path().join("job.stallscope"))
            .arg("-o")
            .arg(&trace),
    );
    let [iterations, errors] = &perfetto_query(
        &ui,
        &trace,
        &[&perfetto_slices("iteration"), PERFETTO_ERRORS],
    )[..] else {
        panic!("two queries, two results")
    };
    assert!(errors.is_empty(), "Perfetto's importer: {errors:?}");
    let on = |rank: &str| -> Vec<&str> {
        let mut p: Vec<&str> = iterations
            .iter()
            .filter(|r| r["thread"] == rank)
            .map(|r| r["process"].as_str().unwrap_or(""))
            .collect();
        p.dedup();
        p
    };
    assert_eq!(on("rank 0"), ["node node-a"], "{iterations:?}");
    assert_eq!(on("rank 1"), ["node node-b"], "{iterations:?}");
    let pairs = assert_iterations_line_up(iterations);
    assert!(pairs >= 15, "{pairs} iterations of both ranks compared");
}

/// Each node's agent reads its own GPU (the scripted library, moving 1 GB/s over PCIe on
/// node-a and 3 GB/s on node-b) and ships the readings with every iteration: the collector's
/// summary shows each rank's GPU, from its node, at the rate that node's GPU was scripted to
/// move.
#[test]
fn the_collector_shows_each_nodes_gpu() {
    if !have_torch() {
        return;
    }
    generate_images();
    let dir = tempfile::tempdir().unwrap();
    let rate = |node: &str| if node == "node-a" { 1e9 } else { 3e9 };
    let (s, log) = loopback_job(
        1,
        dir.path(),
        |node, cmd| {
            fake_gpu(cmd, &format!("activity=copying_in,pcie={}", rate(node)));
        },
        &["--iters", "15"],
        |_, _| {},
    );
    for r in s["ranks"].as_array().unwrap() {
        let node = r["node"].as_str().unwrap();
        let g = &r["gpu"];
        let per_iteration_s =
            r["wall_seconds"].as_f64().unwrap() / r["iterations"].as_f64().unwrap();
        let rx = g["pcie_rx_bytes_per_iteration"]
            .as_f64()
            .unwrap_or_else(|| panic!("{node}'s GPU readings reach the collector: {r:#}"));
        let want = rate(node) * per_iteration_s;
        assert!(
            (rx - want).abs() / want < 0.05,
            "{node}: {rx} vs {want}: {r:#}"
        );
        assert!(g["batch_bytes"].as_u64().is_some_and(|b| b > 0), "{r:#}");
        let rank = r["rank"].as_u64().unwrap();
        assert!(
            log.contains(&format!("gpu: rank {rank} on {node} GPU 0: ")),
            "{log}"
        );
    }
    assert_eq!(s["ranks"].as_array().unwrap().len(), 2, "{s:#}");
}

/// A viewer with the job's token reads the whole job's live model from the collector's TCP
/// port: both nodes' ranks and resources. A viewer with a wrong token is refused, and says why.
#[test]
fn a_viewer_reads_the_whole_jobs_model_from_the_collectors_port() {
    if !have_torch() {
        return;
    }
    generate_images();
    let dir = tempfile::tempdir().unwrap();
    let wrong = dir.path().join("wrong-token");
    std::fs::write(&wrong, "not-t\n").unwrap();
    let mut seen = serde_json::Value::Null;
    let (s, _) = loopback_job(
        2,
        dir.path(),
        |_, _| {},
        &["--iters", "80"],
        |listen, token| {
            let both = wait_for(Duration::from_secs(120), || {
                let out = stallscope()
                    .args(["feed", listen, "--json", "--count", "1", "--token-file"])
                    .arg(token)
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let line = String::from_utf8_lossy(&out.stdout).to_string();
                seen = serde_json::from_str(line.trim()).expect("a JSON line");
                let v = &seen["snapshot"];
                ["0", "1"].iter().all(|r| {
                    v["ranks"][r]["recent"]
                        .as_array()
                        .is_some_and(|p| !p.is_empty())
                }) && ["node-a", "node-b"]
                    .iter()
                    .all(|n| v["nodes"][n]["resources"]["cpu_busy_cores"].is_number())
            });
            assert!(
                both,
                "the model never held both nodes' ranks and resources: {seen:#}"
            );
            let out = stallscope()
                .args(["feed", listen, "--json", "--count", "1", "--token-file"])
                .arg(&wrong)
                .output()
                .unwrap();
            assert!(!out.status.success());
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.contains("refused") && err.contains("wrong token"),
                "{err}"
            );
        },
    );
    assert_eq!(seen["snapshot"]["schema"], "stallscope.view/1");
    assert_eq!(seen["snapshot"]["ranks"]["1"]["node"], "node-b");
    assert_eq!(s["ranks"].as_array().unwrap().len(), 2, "{s:#}");
}

/// The advisor reads a collector's job profile as it reads a run's: the agents forward each
/// rank's DDP buckets, so the job's network part is predicted for another link.
#[test]
fn a_collectors_job_profile_is_advised_from_what_its_agents_forwarded() {
    if !have_torch() {
        return;
    }
    generate_images();
    let dir = tempfile::tempdir().unwrap();
    loopback_job(3, dir.path(), |_, _| {}, &["--iters", "40"], |_, _| {});
    let catalog = dir.path().join("catalog.csv");
    std::fs::write(
        &catalog,
        "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,NetworkGbps\n\
         here,,0,2,4,1.0,10\n\
         slow,,0,2,4,1.0,0.01\n",
    )
    .unwrap();
    let json = dir.path().join("advice.json");
    let out = stallscope()
        .arg("advise")
        .arg(dir.path().join("job.stallscope"))
        .args(["--catalog"])
        .arg(&catalog)
        .args(["--current", "here", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = read_json(&json);
    let m = &r["measured"];
    assert_eq!(m["nodes"], 2, "{m}");
    assert_eq!(m["hosts"], serde_json::json!(["node-a", "node-b"]));
    assert!(m["comm_bytes_per_iteration"].as_f64().unwrap() > 0.0, "{m}");
    assert!(!m["bucket_bytes"].as_array().unwrap().is_empty(), "{m}");
    let slow = r["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["instance_type"] == "slow")
        .unwrap();
    // 10 Mbit/s: the example's gradients (~0.2 MB here) take tens of ms a step.
    assert!(
        slow["breakdown"]["network"].as_f64().unwrap()
            > m["breakdown"]["network"].as_f64().unwrap(),
        "{slow}"
    );
}
