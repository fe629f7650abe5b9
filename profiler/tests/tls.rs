//! TLS on the collector link (issue 17 item 3): `stallscope collector --tls-cert --tls-key`,
//! agents and viewers with `--tls-ca`. A certificate is made with the openssl CLI for each
//! test; what is checked is what a user reads: the node joins, its records reach the job's
//! live model, a viewer reads it, and each setup mistake is said with the flag to change while
//! the collector keeps serving the good agents.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

/// A self-signed certificate for localhost and 127.0.0.1 and its key, made by the openssl
/// CLI as the README says (`name`.pem, `name`.key); `None` (a skip) without openssl.
fn certificate(dir: &Path, name: &str) -> Option<(PathBuf, PathBuf)> {
    let (cert, key) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
    );
    let made = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-addext",
            "basicConstraints=critical,CA:FALSE",
            "-keyout",
        ])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    match made {
        Ok(st) if st.success() => Some((cert, key)),
        _ => {
            skip("the openssl CLI cannot make a test certificate (run scripts/install-deps.sh)");
            None
        }
    }
}

/// A loopback address with a port free a moment ago.
fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// `stallscope collector` on `listen` with the token in `dir`/token, over TLS with `tls`.
fn collector(dir: &Path, listen: &str, tls: Option<&(PathBuf, PathBuf)>) -> Command {
    let mut c = stallscope();
    c.args(["collector", "--quiet", "--listen", listen, "--token-file"])
        .arg(dir.join("token"))
        .arg("--out")
        .arg(dir.join(format!("job-{}.stallscope", listen.replace(':', "-"))));
    if let Some((cert, key)) = tls {
        c.arg("--tls-cert").arg(cert).arg("--tls-key").arg(key);
    }
    c
}

/// `stallscope agent` as node `node`, over TLS trusting `ca` when given.
fn agent(dir: &Path, collector: &str, node: &str, ca: Option<&Path>) -> Command {
    let mut c = stallscope();
    c.args([
        "agent",
        "--collector",
        collector,
        "--node",
        node,
        "--token-file",
    ])
    .arg(dir.join("token"))
    .arg("--socket")
    .arg(dir.join(format!("{node}.sock")))
    .env("XDG_RUNTIME_DIR", dir);
    if let Some(ca) = ca {
        c.arg("--tls-ca").arg(ca);
    }
    c
}

/// `stallscope feed HOST:PORT --json --count 1` with the token, over TLS trusting `ca`.
fn feed(dir: &Path, listen: &str, ca: Option<&Path>) -> std::process::Output {
    let mut c = stallscope();
    c.args(["feed", listen, "--json", "--count", "1", "--timeout", "20"])
        .arg("--token-file")
        .arg(dir.join("token"));
    if let Some(ca) = ca {
        c.arg("--tls-ca").arg(ca);
    }
    c.output().unwrap()
}

fn setup() -> Option<(tempfile::TempDir, (PathBuf, PathBuf))> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("token"), "tls-test-token\n").unwrap();
    let cert = certificate(dir.path(), "collector")?;
    Some((dir, cert))
}

/// An agent over TLS is welcomed and its records reach the job's live model, which a viewer
/// over TLS reads; at the same time a plain agent is told to add --tls-ca and takes nothing
/// from the good one, whose records are all acknowledged at its exit.
#[test]
fn an_agent_and_a_viewer_over_tls_are_served_while_a_plain_agent_is_told_to_add_tls_ca() {
    let Some((dir, tls)) = setup() else { return };
    let d = |f: &str| dir.path().join(f);
    let listen = free_addr();
    let mut col = Reaped::spawn(
        &mut collector(dir.path(), &listen, Some(&tls)),
        &d("collector.log"),
    );
    assert!(
        wait_for_log(&d("collector.log"), "listening on", Duration::from_secs(30)),
        "the collector did not start: {}",
        log_of(&d("collector.log"))
    );
    assert!(
        log_has(&d("collector.log"), "TLS with"),
        "the collector says TLS is on: {}",
        log_of(&d("collector.log"))
    );
    let mut good = Reaped::spawn(
        &mut agent(dir.path(), &listen, "node-a", Some(&tls.0)),
        &d("agent-a.log"),
    );
    let _plain = Reaped::spawn(
        &mut agent(dir.path(), &listen, "node-p", None),
        &d("agent-p.log"),
    );
    assert!(
        wait_for_log(
            &d("collector.log"),
            "node node-a joined",
            Duration::from_secs(60)
        ),
        "the TLS agent never joined: {}\n{}",
        log_of(&d("collector.log")),
        log_of(&d("agent-a.log"))
    );
    // The node's records reach the live model, read by a viewer over TLS.
    let mut seen = String::new();
    let arrived = wait_for(Duration::from_secs(60), || {
        let out = feed(dir.path(), &listen, Some(&tls.0));
        assert!(
            out.status.success(),
            "the viewer over TLS: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        seen = String::from_utf8_lossy(&out.stdout).to_string();
        let v: serde_json::Value = serde_json::from_str(seen.trim()).expect("a JSON line");
        v["snapshot"]["nodes"]["node-a"]["resources"]["t_ns"].is_number()
    });
    let seen: String = seen.chars().take(2000).collect();
    assert!(arrived, "node-a's records never reached the model: {seen}");
    // The plain agent is told what to change (the collector closes it at the end of its
    // handshake time, 5 s).
    assert!(
        wait_for_log(
            &d("agent-p.log"),
            "is the collector using --tls-cert? give the agent --tls-ca",
            Duration::from_secs(60)
        ),
        "the plain agent was not told to add --tls-ca: {}",
        log_of(&d("agent-p.log"))
    );
    // The collector says so on its side too, as it closes the connection: maybe just after
    // the agent saw it closed (a loaded machine showed that order).
    assert!(
        wait_for_log(
            &d("collector.log"),
            "TLS handshake",
            Duration::from_secs(30)
        ),
        "{}",
        log_of(&d("collector.log"))
    );
    let col_log = log_of(&d("collector.log"));
    assert!(!col_log.contains("node node-p joined"), "{col_log}");
    assert!(!col_log.contains("node node-a left"), "{col_log}");
    // Everything the TLS agent sent was acknowledged.
    good.stop(libc::SIGTERM, Duration::from_secs(30));
    let a_log = log_of(&d("agent-a.log"));
    assert!(a_log.contains(" 0 records undelivered"), "{a_log}");
    col.stop(libc::SIGTERM, Duration::from_secs(30));
}

/// Setup mistakes, each said with what to change: a collector certificate the agent's or
/// viewer's --tls-ca did not sign, a plain viewer at a TLS collector, a TLS agent at a plain
/// collector.
#[test]
fn tls_mistakes_are_refused_with_what_to_change() {
    let Some((dir, tls)) = setup() else { return };
    let d = |f: &str| dir.path().join(f);
    let Some((other, _)) = certificate(dir.path(), "other") else {
        return;
    };
    let (listen, plain_listen) = (free_addr(), free_addr());
    let _col = Reaped::spawn(
        &mut collector(dir.path(), &listen, Some(&tls)),
        &d("collector.log"),
    );
    let _plain_col = Reaped::spawn(
        &mut collector(dir.path(), &plain_listen, None),
        &d("plain-collector.log"),
    );
    assert!(
        wait_for(Duration::from_secs(30), || log_has(
            &d("collector.log"),
            "listening on"
        ) && log_has(
            &d("plain-collector.log"),
            "listening on"
        )),
        "the collectors did not start"
    );
    let _wrong = Reaped::spawn(
        &mut agent(dir.path(), &listen, "node-w", Some(&other)),
        &d("agent-w.log"),
    );
    let _tls_at_plain = Reaped::spawn(
        &mut agent(dir.path(), &plain_listen, "node-t", Some(&tls.0)),
        &d("agent-t.log"),
    );
    let wrong_ca = format!(
        "the collector's certificate is not signed by --tls-ca {}",
        other.display()
    );
    assert!(
        wait_for(Duration::from_secs(60), || log_has(
            &d("agent-w.log"),
            &wrong_ca
        )),
        "{}",
        log_of(&d("agent-w.log"))
    );
    assert!(
        wait_for_log(
            &d("agent-t.log"),
            "the collector does not speak TLS",
            Duration::from_secs(60)
        ),
        "{}",
        log_of(&d("agent-t.log"))
    );
    assert!(
        wait_for_log(
            &d("plain-collector.log"),
            "this collector does not: start the collector with --tls-cert",
            Duration::from_secs(30)
        ),
        "{}",
        log_of(&d("plain-collector.log"))
    );
    // The viewers: a wrong CA, and no TLS at a TLS collector.
    let out = feed(dir.path(), &listen, Some(&other));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&wrong_ca), "{err}");
    let out = feed(dir.path(), &listen, None);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is the collector using --tls-cert? give --tls-ca"),
        "{err}"
    );
    let col_log = log_of(&d("collector.log"));
    assert!(!col_log.contains("node node-w joined"), "{col_log}");
}

/// A key that does not go with the certificate, or a file that is not one, stops the
/// collector at start with the file named.
#[test]
fn an_unusable_certificate_or_key_is_named_at_start() {
    let Some((dir, (cert, key))) = setup() else {
        return;
    };
    let Some((_, other_key)) = certificate(dir.path(), "other") else {
        return;
    };
    let run = |cert: &Path, key: &Path| {
        let out = stallscope()
            .args(["collector", "--listen", &free_addr()])
            .arg("--tls-cert")
            .arg(cert)
            .arg("--tls-key")
            .arg(key)
            .arg("--out")
            .arg(dir.path().join("job.stallscope"))
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let err = run(&cert, &other_key);
    assert!(
        err.contains("does not go with the certificate")
            && err.contains(&*other_key.to_string_lossy()),
        "{err}"
    );
    let err = run(&key, &key);
    assert!(
        err.contains(&format!(
            "cannot read certificates from --tls-cert {}",
            key.display()
        )),
        "{err}"
    );
    let missing = dir.path().join("missing.pem");
    let err = run(&cert, &missing);
    assert!(
        err.contains(&format!("--tls-key {}", missing.display())),
        "{err}"
    );
}
