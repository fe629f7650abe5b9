//! Issue 29: a dataset read over the network is a data fetch, not data preparation. The
//! example's JPEGs are served by `python3 -m http.server` in node B of a two-namespace cluster
//! whose link is shaped to 128 kbit/s, so fetching them is the training's bottleneck; the
//! training runs under `stallscope run` in node A with two loader workers that fetch each
//! sample with urllib (`--data-url`). The summary's largest category is `data_fetch` and the
//! workers' sockets are listed as `data` flows; the report, in headless Chromium, has the flows
//! and a TCP retransmissions chart. Needs root for the namespaces; CI runs as root.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

/// The job's shares, for docs/BENCHMARKS.md (`--nocapture`).
fn print_shares(what: &str, s: &serde_json::Value) {
    let shares: Vec<String> = ["compute", "data_fetch", "data_prep", "other"]
        .iter()
        .map(|c| format!("{c} {:.0}%", fraction(s, c) * 100.0))
        .collect();
    eprintln!(
        "{what}: median iteration {:.3} s, {}",
        s["job"]["median_iteration_seconds"].as_f64().unwrap_or(0.0),
        shares.join(", ")
    );
}

#[test]
fn a_dataset_fetched_over_http_is_data_fetch_and_its_sockets_are_data_flows() {
    if !am_root("create network namespaces") || !have_torch() {
        return;
    }
    generate_images();
    let prefix = format!("rd{}", std::process::id() % 100_000);
    let net = format!("{}", 50 + std::process::id() % 97);
    let _cluster = Cluster::up(&prefix, &["128kbit", "--net", &net]);
    let addr_b = format!("10.77.{net}.2");
    let dir = tempfile::tempdir().unwrap();

    let folder = std::path::Path::new(&data_dir()).join("n64-s64");
    let port = "8931";
    let server_log = dir.path().join("server.log");
    let mut server = Reaped::spawn(
        Command::new("ip")
            .args(["netns", "exec", &format!("{prefix}b"), &python()])
            .args(["-m", "http.server", port, "--bind", &addr_b, "--directory"])
            .arg(&folder),
        &server_log,
    );
    let url = format!("http://{addr_b}:{port}");
    let listening = wait_for(Duration::from_secs(60), || {
        Command::new("ip")
            .args(["netns", "exec", &format!("{prefix}a"), &python(), "-c"])
            .arg("import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)")
            .arg(&url)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    assert!(listening, "the HTTP server: {}", log_of(&server_log));

    let json = dir.path().join("summary.json");
    let log = dir.path().join("run.log");
    let mut run = Reaped::spawn(
        stallscope_in(&format!("{prefix}a"))
            .args(["run", "-q", "-o"])
            .arg(dir.path().join("run.stallscope"))
            .arg("--summary-json")
            .arg(&json)
            .args(["--", &python(), &example()])
            .args(["--iters", "16", "--workers", "2", "--batch", "4"])
            .args(["--data-url", &url]),
        &log,
    );
    run.wait_success(Duration::from_secs(400), "the training", &log);
    server.stop(libc::SIGTERM, Duration::from_secs(10));

    let s = read_json(&json);
    print_shares("http", &s);
    assert_eq!(largest(&s), "data_fetch", "{s:#}");
    assert!(
        fraction(&s, "data_fetch") > 2.0 * fraction(&s, "data_prep"),
        "waiting on the network is fetch, not prep: {s:#}"
    );
    let flows = s["nodes"][0]["flows"].as_array().expect("flows listed");
    let data: Vec<_> = flows.iter().filter(|f| f["class"] == "data").collect();
    let fetched: f64 = data.iter().map(|f| f["bytes_in"].as_f64().unwrap()).sum();
    // 16 batches of 4 samples of about 3.3 kB (JPEG and headers) came in, each over its own
    // connection; sock_diag sees a connection only if it is open at one of the flow source's
    // reads (every 100 ms), and a closing one loses what it moved since the last read, so
    // only part of them is counted (about a fifth here: BENCHMARKS.md).
    let listed = data.iter().filter(|f| !f["remote"].is_null()).count();
    assert!(
        fetched > 10_000.0 && listed >= 3,
        "the loader workers' sockets received the samples ({fetched} bytes, {listed} flows \
         listed): {flows:#?}"
    );
    assert!(
        data.iter().all(|f| f["remote"]
            .as_str()
            .is_none_or(|r| r == format!("{addr_b}:{port}"))),
        "the data flows go to the object server: {flows:#?}"
    );
    let loop_pid = s["ranks"][0]["pid"].as_u64();
    assert!(
        data.iter().all(|f| f["pids"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p.as_u64() != loop_pid)),
        "held by the workers, not the loop: {flows:#?}"
    );

    // The report, in a browser: the flows table and retransmissions over time (none on this
    // link, a flat line at 0 segments/s, but read).
    let profile = dir.path().join("run.stallscope");
    if let Some(dom) = report_in_chromium(dir.path(), "remote", &[profile.as_os_str()]) {
        assert_report_holds(
            &dom,
            &[0],
            &["chart-timeline", "chart-resource-tcp-retransmissions"],
        );
        assert!(dom.contains("id=\"flows\""), "a flows section");
    }
}

/// The node's network file system, where one can run here: sshfs (FUSE over SFTP) mounted in
/// node A from an sshd in node B, over the same kind of shaped link (256 kbit/s); the training
/// reads its JPEGs from the mount with its usual `--data-dir`. A FUSE (or NFS) read waits in
/// the kernel killably, which `/proc` shows as state D, so this is the disk rule's fetch; the
/// sockets are sshfs's, not the loader's.
#[test]
fn a_dataset_on_a_network_file_system_is_data_fetch() {
    if !am_root("create network namespaces and mount FUSE") || !have_torch() {
        return;
    }
    for tool in ["sshfs", "fusermount", "ssh-keygen"] {
        if which(tool).is_err() {
            skip(&format!(
                "{tool} is not installed (run scripts/install-deps.sh)"
            ));
            return;
        }
    }
    if !Path::new("/usr/sbin/sshd").exists() {
        skip("sshd is not installed (run scripts/install-deps.sh)");
        return;
    }
    generate_images();
    let prefix = format!("rf{}", std::process::id() % 100_000);
    let net = format!("{}", 60 + std::process::id() % 89);
    let _cluster = Cluster::up(&prefix, &["256kbit", "--net", &net]);
    let addr_b = format!("10.77.{net}.2");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for key in ["host", "user"] {
        run_ok(
            Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                .arg(d.join(key)),
        );
    }
    std::fs::copy(d.join("user.pub"), d.join("authorized_keys")).unwrap();
    std::fs::create_dir_all("/run/sshd").unwrap();
    let config = d.join("sshd_config");
    std::fs::write(
        &config,
        format!(
            "HostKey {host}\nListenAddress {addr_b}\nPort 2222\nPermitRootLogin prohibit-password\n\
             AuthorizedKeysFile {keys}\nStrictModes no\nPasswordAuthentication no\nUsePAM no\n\
             Subsystem sftp internal-sftp\nPidFile none\n",
            host = d.join("host").display(),
            keys = d.join("authorized_keys").display(),
        ),
    )
    .unwrap();
    let sshd_log = d.join("sshd.log");
    let _sshd = Reaped::spawn(
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &format!("{prefix}b"),
                "/usr/sbin/sshd",
                "-D",
                "-e",
                "-f",
            ])
            .arg(&config),
        &sshd_log,
    );
    // sshfs, the run and the unmount in one shell: `ip netns exec` gives each command a mount
    // namespace of its own, so the mount is seen only inside it.
    let mount = d.join("mnt");
    std::fs::create_dir(&mount).unwrap();
    let json = d.join("summary.json");
    let script = format!(
        "for i in $(seq 100); do sshfs -o IdentityFile={key},StrictHostKeyChecking=no,\
         UserKnownHostsFile=/dev/null,port=2222,cache=no root@{addr_b}:{data} {mnt} && break; \
         sleep 0.2; done; ls {mnt}/n64-s64 >/dev/null || exit 90; \
         {stallscope} run -q -o {profile} --summary-json {json} -- {python} {example} \
         --iters 12 --workers 2 --batch 4 --data-dir {mnt}; rc=$?; fusermount -u {mnt}; exit $rc",
        key = d.join("user").display(),
        data = data_dir(),
        mnt = mount.display(),
        stallscope = env!("CARGO_BIN_EXE_stallscope"),
        profile = d.join("run.stallscope").display(),
        json = json.display(),
        python = python(),
        example = example(),
    );
    let log = d.join("run.log");
    let mut run = Reaped::spawn(
        Command::new("ip").args([
            "netns",
            "exec",
            &format!("{prefix}a"),
            "bash",
            "-c",
            &script,
        ]),
        &log,
    );
    run.wait_success(Duration::from_secs(400), "the training on sshfs", &log);
    let s = read_json(&json);
    print_shares("sshfs", &s);
    assert_eq!(
        largest(&s),
        "data_fetch",
        "{s:#}\nsshd: {}",
        log_of(&sshd_log)
    );
    assert!(
        fraction(&s, "data_fetch") > 2.0 * fraction(&s, "data_prep"),
        "waiting on the network file system is fetch, not prep: {s:#}"
    );
}
