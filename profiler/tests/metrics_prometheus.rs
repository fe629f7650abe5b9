//! `/metrics` end to end: a real Prometheus (Debian's package, on loopback, its own temp dir,
//! a 1 s scrape interval) scrapes `stallscope run --metrics` around the real PyTorch example on
//! the scripted GPU. The scrape passes `promtool check metrics`, every PromQL expression of the
//! Grafana dashboard returns data (so the dashboard cannot silently rot), and the stall shares
//! Prometheus holds match the run's summary. The series added after the dashboard are queried
//! too: a two-node DDP training's collectives, TCP flows and a slowdown (Prometheus inside one
//! node's network namespace, with the report of that node's profile opened in Chromium), and
//! a hang while it lasts and after it resumed. Polling is bounded; nothing waits on luck.

mod common;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind port 0");
    l.local_addr().unwrap().port()
}

/// `command`, inside network namespace `netns` when given (`ip netns exec`, which execs it:
/// the child's PID is the command's).
fn inside(netns: Option<&str>, command: &str) -> Command {
    match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, command]);
            c
        }
        None => Command::new(command),
    }
}

/// curl, inside `netns` when given.
fn curl_in(netns: Option<&str>, args: &[&str]) -> Option<Output> {
    inside(netns, "curl")
        .args(["-sf", "--max-time", "5"])
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
}

/// A Prometheus server ended (by its PID) when dropped.
struct Prometheus {
    child: Child,
    port: u16,
    /// The network namespace it runs in, if not this process's.
    netns: Option<String>,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(target: &str) -> Prometheus {
        Prometheus::start_in(None, target)
    }

    /// A Prometheus inside network namespace `netns` (when given) scraping `target` there.
    fn start_in(netns: Option<&str>, target: &str) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: stallscope\n    honor_labels: true\n    static_configs:\n      \
                 - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let port = free_port();
        let child = inside(netns, "prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("log")).unwrap())
            .spawn()
            .expect("prometheus starts");
        let p = Prometheus {
            child,
            port,
            netns: netns.map(String::from),
            _dir: dir,
        };
        assert!(
            wait_for(Duration::from_secs(90), || p
                .curl(&[&p.url("/-/ready")])
                .is_some()),
            "prometheus became ready"
        );
        p
    }

    /// The end of Prometheus's own log, for a failure's message.
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self._dir.path().join("log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// curl, in Prometheus's network namespace.
    fn curl(&self, args: &[&str]) -> Option<Output> {
        curl_in(self.netns.as_deref(), args)
    }

    /// The result vector of an instant query (empty on any error).
    fn query(&self, expr: &str) -> Vec<Value> {
        let q = format!("query={expr}");
        let Some(out) = self.curl(&["--get", "--data-urlencode", &q, &self.url("/api/v1/query")])
        else {
            return Vec::new();
        };
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        kill(self.child.id(), libc::SIGTERM);
        let _ = self.child.wait();
    }
}

/// Every `expr` of the dashboard's panels, its variables substituted (`job` = `job`).
fn dashboard_queries(job: &str) -> Vec<String> {
    let path = repo().join("dashboards/grafana/stallscope.json");
    let d: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut out = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            let e = t["expr"].as_str().unwrap();
            out.push(
                e.replace("$__rate_interval", "10s")
                    .replace("$job", job)
                    .replace("$node", ".*")
                    .replace("$rank", ".*"),
            );
        }
    }
    for v in d["templating"]["list"].as_array().unwrap() {
        if let Some(q) = v["query"]["query"].as_str() {
            let inner = q.trim_start_matches("label_values(").trim_end_matches(')');
            let metric = inner.rsplit_once(',').map_or(inner, |(m, _)| m);
            out.push(metric.replace("$job", job).replace("$node", ".*"));
        }
    }
    out
}

fn value(sample: &Value) -> f64 {
    sample["value"][1].as_str().unwrap().parse().unwrap()
}

/// `promtool check metrics` finds nothing wrong with a live scrape but the one thing we do
/// on purpose: the GPU families carry dcgm-exporter's `modelName` label, spelled as
/// dcgm-exporter spells it so that dashboards join the two, which promtool's lint calls
/// camelCase.
fn promtool_passes(addr: &str, dir: &Path) -> String {
    promtool_passes_in(None, addr, dir)
}

/// [`promtool_passes`] of a server in network namespace `netns`; the scrape it checked.
fn promtool_passes_in(netns: Option<&str>, addr: &str, dir: &Path) -> String {
    let out = curl_in(netns, &[&format!("http://{addr}/metrics")]).expect("a scrape");
    let file = dir.join("scrape.txt");
    std::fs::write(&file, &out.stdout).unwrap();
    let check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(&file).unwrap())
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    let camel = " label names should be written in 'snake_case' not 'camelCase'";
    let problems: Vec<&str> = said
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter(|l| !(l.starts_with("stallscope_gpu_") && l.ends_with(camel)))
        .collect();
    assert!(
        problems.is_empty(),
        "promtool check metrics: {}",
        problems.join("\n")
    );
    let scrape = String::from_utf8_lossy(&out.stdout);
    assert!(
        scrape
            .lines()
            .all(|l| !l.starts_with("stallscope_gpu_") || l.contains("modelName=")),
        "the camelCase lint is only for modelName"
    );
    assert!(
        check.status.success() || said.contains(camel),
        "promtool failed without saying why: {said}"
    );
    scrape.into_owned()
}

#[test]
fn prometheus_scrapes_a_run_and_every_dashboard_query_has_data() {
    if !have_torch() || !have("prometheus") || !have("promtool") {
        skip("needs torch, prometheus and promtool (scripts/install-deps.sh)");
        return;
    }
    generate_images();
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let prom = Prometheus::start(&addr);
    let mut cmd = stallscope();
    fake_gpu(&mut cmd, "gpus=1");
    let mut run = example_under(
        cmd,
        dir.path(),
        &["--metrics", &addr, "--job", "train"],
        // 20 ms of loader work a sample: the run lasts 12 s at least, however fast the
        // machine (a quiet one ran the 150 iterations in 2.9 s, before Prometheus's first
        // scrapes had 5 of them).
        &[
            "--iters",
            "150",
            "--workers",
            "0",
            "--batch",
            "4",
            "--images",
            "64",
            "--data-delay-ms",
            "20",
        ],
    )
    .stdout(Stdio::null())
    .spawn()
    .expect("stallscope run starts");

    let mut missing = dashboard_queries("train");
    missing.push(gpu_named("train"));
    missing.push(per_device("train"));
    let mut checked = false;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(300);
    let mut ended = None;
    let mut iterations_seen = Vec::new();
    // Until both: every query has data, and a scrape was checked (on a quiet machine the
    // queries had data while Prometheus held 4 iterations, before any check).
    while (!missing.is_empty() || !checked) && Instant::now() < deadline {
        if let Some(status) = run.try_wait().unwrap() {
            ended = Some((status, started.elapsed()));
            break;
        }
        iterations_seen = prom.query("stallscope_iterations_total");
        if !checked && !prom.query("stallscope_iterations_total > 5").is_empty() {
            promtool_passes(&addr, dir.path());
            checked = true;
        }
        missing.retain(|e| prom.query(e).is_empty());
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        checked,
        "a scrape of the live run was checked with promtool; the run ended {ended:?}, \
         Prometheus last held stallscope_iterations_total {iterations_seen:?}, \
         its log: {}",
        prom.log_tail()
    );
    assert!(
        missing.is_empty(),
        "dashboard queries without data: {missing:#?}"
    );
    assert!(run.wait().unwrap().success());

    let summary = read_json(&dir.path().join("s.json"));
    shares_match(&prom, "train", &summary);
}

/// A query with data once the job's GPU figures carry the scripted GPU's product name, as
/// dcgm-exporter labels them (`modelName`).
fn gpu_named(job: &str) -> String {
    format!("stallscope_gpu_busy_ratio{{job=\"{job}\",modelName=\"NVIDIA H100 80GB HBM3\"}}")
}

/// A query with data once the job's NIC bytes are per interface (`device`).
fn per_device(job: &str) -> String {
    format!("stallscope_node_network_bytes_total{{job=\"{job}\",device=~\".+\"}}")
}

/// The stall shares Prometheus holds for `job` are the summary's within 5 points.
fn shares_match(prom: &Prometheus, job: &str, summary: &Value) {
    let totals = prom.query(&format!(
        "sum by (category) (last_over_time(stallscope_stall_seconds_total{{job=\"{job}\"}}[10m]))"
    ));
    let all: f64 = totals.iter().map(value).sum();
    assert!(all > 0.0, "Prometheus holds stall seconds");
    for t in &totals {
        let category = t["metric"]["category"].as_str().unwrap();
        let share = value(t) / all;
        let want = fraction(summary, category);
        assert!(
            (share - want).abs() < 0.05,
            "{category}: Prometheus {share:.3}, summary {want:.3}"
        );
    }
}

/// A collector with two agents on loopback (one rank each, each node on a scripted GPU):
/// Prometheus scrapes the collector; every dashboard query has data for the whole job and
/// its stall shares match the job summary.
#[test]
fn prometheus_scrapes_a_collector_with_two_agents() {
    if !have_torch() || !have("prometheus") {
        skip("needs torch and prometheus (scripts/install-deps.sh)");
        return;
    }
    generate_images();
    let dir = tempfile::tempdir().unwrap();
    let d = |n: &str| dir.path().join(n);
    std::fs::write(d("token"), "t\n").unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let metrics = format!("127.0.0.1:{}", free_port());
    let prom = Prometheus::start(&metrics);
    let mut col = Reaped::spawn(
        stallscope()
            .args([
                "collector",
                "--listen",
                &listen,
                "--job",
                "ddp",
                "--metrics",
                &metrics,
            ])
            .arg("--token-file")
            .arg(d("token"))
            .arg("--out")
            .arg(d("job.stallscope"))
            .arg("--summary-json")
            .arg(d("job.json")),
        &d("collector.log"),
    );
    assert!(wait_for_log(
        &d("collector.log"),
        "listening",
        Duration::from_secs(30)
    ));
    let _agents: Vec<Reaped> = ["a", "b"]
        .iter()
        .map(|n| {
            let mut c = stallscope();
            fake_gpu(&mut c, "gpus=1");
            c.args([
                "agent",
                "--collector",
                &listen,
                "--node",
                &format!("node-{n}"),
            ])
            .arg("--token-file")
            .arg(d("token"))
            .arg("--socket")
            .arg(d(&format!("{n}.sock")));
            Reaped::spawn(&mut c, &d(&format!("agent-{n}.log")))
        })
        .collect();
    assert!(wait_for(Duration::from_secs(30), || {
        log_has(&d("collector.log"), "node-a joined")
            && log_has(&d("collector.log"), "node-b joined")
    }));
    let gloo_port = free_port().to_string();
    let mut ranks: Vec<Reaped> = [(0, "a"), (1, "b")]
        .iter()
        .map(|(r, n)| {
            let mut c = stallscope();
            c.args(["run", "-q", "--", &python(), &example()])
                .args([
                    "--workers",
                    "0",
                    "--batch",
                    "4",
                    "--images",
                    "64",
                    "--iters",
                    "300",
                ])
                .args(["--data-dir", &data_dir()])
                .env("STALLSCOPE_SOCKET", d(&format!("{n}.sock")))
                .env("GLOO_SOCKET_IFNAME", "lo")
                .env("RANK", r.to_string())
                .env("LOCAL_RANK", "0")
                .env("WORLD_SIZE", "2")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &gloo_port);
            Reaped::spawn(&mut c, &d(&format!("rank{r}.log")))
        })
        .collect();
    let mut missing = dashboard_queries("ddp");
    missing.push(gpu_named("ddp"));
    missing.push(per_device("ddp"));
    let deadline = Instant::now() + Duration::from_secs(300);
    while !missing.is_empty() && Instant::now() < deadline {
        if ranks[0].0.try_wait().unwrap().is_some() {
            break;
        }
        missing.retain(|e| prom.query(e).is_empty());
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        missing.is_empty(),
        "dashboard queries without data: {missing:#?}"
    );
    for (r, rank) in ranks.iter_mut().enumerate() {
        rank.wait_success(
            Duration::from_secs(300),
            "a rank",
            &d(&format!("rank{r}.log")),
        );
    }
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        col.stop(libc::SIGTERM, Duration::from_secs(30)),
        "the collector ended"
    );
    shares_match(&prom, "ddp", &read_json(&d("job.json")));
}

/// The series the live model gained after the dashboard was written, in a real Prometheus
/// (issue 31): a two-rank DDP training over gloo between two "nodes" (network namespaces
/// joined by a veth), each rank under its own `stallscope run`; node A's serves `/metrics`
/// to a Prometheus inside node A. Rank 0 turns slow at iteration 30 (its data preparation
/// grows). Prometheus must hold its collectives (all four families), its TCP flows over the
/// NIC per class and direction (the gradients: `collective`), the retransmits, and
/// `stallscope_slowdown` of rank 0's data preparation above 1; a live scrape holding them
/// passes `promtool check metrics`. The profile's report, opened in Chromium, shows the
/// collectives table and the slowdown's row. Needs root (namespaces); CI runs as root.
#[test]
fn prometheus_holds_collectives_flows_and_a_slowdown_of_a_two_node_training() {
    if !am_root("create network namespaces")
        || !have_torch()
        || !have("prometheus")
        || !have("promtool")
    {
        skip("needs root, torch, prometheus and promtool (scripts/install-deps.sh)");
        return;
    }
    generate_images();
    let prefix = format!("mp{}", std::process::id() % 100_000);
    let net = format!("{}", 60 + std::process::id() % 89);
    let _cluster = Cluster::up(&prefix, &["--net", &net]);
    let ns_a = format!("{prefix}a");
    let addr_a = format!("10.77.{net}.1");
    let dir = tempfile::tempdir().unwrap();
    let d = |n: &str| dir.path().join(n);
    let metrics = "127.0.0.1:7572";
    let prom = Prometheus::start_in(Some(&ns_a), metrics);

    let mut ranks: Vec<Reaped> = (0..2)
        .map(|rank| {
            let ns = format!("{prefix}{}", if rank == 0 { "a" } else { "b" });
            let mut c = stallscope_in(&ns);
            c.args(["run", "-q", "--job", "twonode", "-o"])
                .arg(d(&format!("rank{rank}.stallscope")));
            if rank == 0 {
                c.args(["--metrics", metrics]);
            }
            c.args(["--", &python(), &example()])
                .args(["--iters", "90", "--workers", "0", "--batch", "8"])
                .args(["--images", "64", "--image-size", "32", "--width", "16"])
                .args(["--slow-from", "30:0:data:25", "--data-dir", &data_dir()])
                .env("GLOO_SOCKET_IFNAME", "eth0")
                .env("RANK", rank.to_string())
                .env("LOCAL_RANK", "0")
                .env("WORLD_SIZE", "2")
                .env("MASTER_ADDR", &addr_a)
                .env("MASTER_PORT", "29561");
            Reaped::spawn(&mut c, &d(&format!("rank{rank}.log")))
        })
        .collect();

    // Once Prometheus holds the slowdown, a live scrape has every new family: promtool reads it.
    let job = "job=\"twonode\"";
    let slow = format!("stallscope_slowdown{{{job},rank=\"0\",category=\"data_prep\"}} > 1");
    let mut scrape = None;
    let deadline = Instant::now() + Duration::from_secs(400);
    while scrape.is_none() && Instant::now() < deadline {
        if ranks[0].0.try_wait().unwrap().is_some() {
            break;
        }
        if !prom.query(&slow).is_empty() {
            scrape = Some(promtool_passes_in(Some(&ns_a), metrics, dir.path()));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let scrape = scrape.unwrap_or_else(|| {
        panic!(
            "Prometheus never held {slow}; rank 0 said: {}",
            log_of(&d("rank0.log"))
        )
    });
    for family in [
        "stallscope_collective_seconds_total{",
        "stallscope_collective_waited_seconds_total{",
        "stallscope_collective_bytes_total{",
        "stallscope_collective_operations_total{",
        "stallscope_flow_bytes_total{",
        "stallscope_tcp_retransmits_total{",
        "stallscope_slowdown{",
    ] {
        assert!(
            scrape.contains(family),
            "the live scrape checked by promtool has {family}"
        );
    }
    for (r, rank) in ranks.iter_mut().enumerate() {
        rank.wait_success(
            Duration::from_secs(400),
            "a rank",
            &d(&format!("rank{r}.log")),
        );
    }

    // What Prometheus kept of the run, read after it (the run's last scrapes).
    let last = |series: &str| {
        let held = prom.query(&format!("last_over_time({series}[10m])"));
        assert!(!held.is_empty(), "Prometheus holds {series}");
        held
    };
    // DDP's all-reduce, once an iteration: its four counters.
    let ddp = |family: &str| {
        let held = last(&format!(
            "stallscope_collective_{family}_total{{{job},rank=\"0\",op=\"all_reduce\",group=\"ddp\",role=\"ddp\"}}"
        ));
        value(&held[0])
    };
    assert!(ddp("operations") >= 30.0, "an all-reduce an iteration");
    assert!(ddp("bytes") > 0.0);
    assert!(ddp("seconds") > 0.0);
    ddp("waited_seconds");
    // The gradients crossed the veth both ways, as collective flows, counted as counters.
    for direction in ["rx", "tx"] {
        let moved = last(&format!(
            "stallscope_flow_bytes_total{{{job},class=\"collective\",direction=\"{direction}\"}}"
        ));
        assert!(value(&moved[0]) > 1e6, "{direction}: {moved:?}");
    }
    let rate = prom.query(&format!(
        "max_over_time(rate(stallscope_flow_bytes_total{{{job},class=\"collective\"}}[10s])[10m:1s])"
    ));
    assert!(
        rate.iter().any(|s| value(s) > 0.0),
        "rate() of the flow counter: {rate:?}"
    );
    last(&format!(
        "stallscope_tcp_retransmits_total{{{job},class=\"collective\"}}"
    ));
    let slowdown = last(&format!(
        "stallscope_slowdown{{{job},rank=\"0\",category=\"data_prep\"}}"
    ));
    assert!(
        value(&slowdown[0]) > 1.2,
        "still slow at the end: {slowdown:?}"
    );
    assert!(
        prom.query(&format!("stallscope_slowdown{{{job},rank=\"1\"}}"))
            .is_empty(),
        "rank 1 is not named: node A's run sees rank 0 only"
    );

    // The report of rank 0's profile, where people read it.
    let profile = d("rank0.stallscope");
    if let Some(dom) = report_in_chromium(dir.path(), "twonode", &[profile.as_os_str()]) {
        assert!(
            dom.contains("id=\"collectives\""),
            "collectives table: {dom}"
        );
        assert!(
            dom.contains("<td>all_reduce</td>"),
            "the all-reduce is a row of it"
        );
        assert!(
            dom.contains("<tr data-slowdown=\"0\">"),
            "the slowdown's row: {dom}"
        );
        assert!(dom.contains("data_prep"), "what grew is named");
    }
}

/// One loop whose dataset takes 15 s for the first sample of batch 6, then goes on for about
/// 15 s more (0.1 s a sample), so that a hang is declared, lasts, and is seen to resume.
const STALLING_DATASET: &str = r#"
import time
import torch

class Stalling(torch.utils.data.Dataset):
    def __len__(self):
        return 200

    def __getitem__(self, i):
        time.sleep(15 if i == 24 else 0.1)
        return torch.randn(8)

model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x in torch.utils.data.DataLoader(Stalling(), batch_size=4, num_workers=0):
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
print("trained")
"#;

/// `stallscope_hang` in a real Prometheus: `stallscope run --hang-after 5 --metrics` of a
/// loop that stalls 15 s in its data and then goes on; Prometheus holds 1 while the hang
/// lasts (a live scrape with it passes promtool) and 0 once it resumed.
#[test]
fn prometheus_holds_a_hang_while_it_lasts_and_its_end() {
    if !have_torch() || !have("prometheus") || !have("promtool") {
        skip("needs torch, prometheus and promtool (scripts/install-deps.sh)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("train.py");
    std::fs::write(&script, STALLING_DATASET).unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let prom = Prometheus::start(&addr);
    let log = dir.path().join("run.log");
    let mut run = Reaped::spawn(
        stallscope()
            .args(["run", "-q", "--hang-after", "5", "--job", "stalls"])
            .args(["--metrics", &addr, "-o"])
            .arg(dir.path().join("p.stallscope"))
            .arg("--")
            .arg(python())
            .arg(&script),
        &log,
    );
    let hung = "stallscope_hang{job=\"stalls\"} == 1";
    let mut checked = false;
    let deadline = Instant::now() + Duration::from_secs(300);
    while !checked && Instant::now() < deadline {
        if run.0.try_wait().unwrap().is_some() {
            break;
        }
        if !prom.query(hung).is_empty() {
            let scrape = promtool_passes(&addr, dir.path());
            assert!(scrape.contains("stallscope_hang{"), "{scrape}");
            checked = true;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(
        checked,
        "Prometheus never held {hung}; the run said: {}",
        log_of(&log)
    );
    run.wait_success(Duration::from_secs(300), "the run", &log);
    let last = prom.query("last_over_time(stallscope_hang{job=\"stalls\"}[10m])");
    assert_eq!(
        last.iter().map(value).collect::<Vec<_>>(),
        [0.0],
        "the hang resumed: {last:?}"
    );
}
