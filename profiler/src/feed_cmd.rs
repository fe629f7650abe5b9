//! `stallscope feed [SOCKET | HOST:PORT]`: attaches to the live feed of a running `stallscope run`,
//! agent or collector on this node, or to a collector's TCP port, and prints the live model: each message as a JSON line
//! (`--json`), or the status line as it changes.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use stallscope_agent::node::feed::{newest_feed, FeedMessage};
use stallscope_agent::node::feed_client::FeedClient;

use crate::cli::{FeedArgs, TlsClientArgs};

/// Attaches to `socket` (a feed socket, or a collector's HOST:PORT with the token in
/// `token_file`, over TLS with `tls`; none: the newest feed socket of this user); a read that
/// waits longer than `timeout` fails. With `binary`, asks for the feed's binary form (what a
/// dashboard reads; `feed` prints the JSON lines). Returns the client and what it is attached
/// to.
pub fn attach(
    socket: Option<&Path>,
    token_file: Option<&Path>,
    tls: &TlsClientArgs,
    timeout: Duration,
    binary: bool,
) -> anyhow::Result<(FeedClient, String)> {
    let (client, at) = match socket {
        // HOST:PORT that is no file here: a collector's TCP port.
        Some(p) if !p.exists() && p.to_string_lossy().contains(':') => {
            let addr = p.to_string_lossy().to_string();
            let token = match token_file {
                Some(t) => crate::agent_cmd::read_token(t)?,
                None => String::new(),
            };
            let tls = tls.client(&addr)?;
            let client = if binary {
                FeedClient::connect_tcp_binary(&addr, &token, timeout, tls.as_ref())?
            } else {
                FeedClient::connect_tcp(&addr, &token, timeout, tls.as_ref())?
            };
            (client, addr)
        }
        Some(_) | None if tls.tls_ca.is_some() => {
            anyhow::bail!("--tls-ca is for a collector's HOST:PORT, not a feed socket")
        }
        Some(p) => (FeedClient::connect(p, timeout)?, p.display().to_string()),
        None => {
            let p = newest_feed()?;
            (FeedClient::connect(&p, timeout)?, p.display().to_string())
        }
    };
    // A feed socket is asked once attached (a collector's port was asked in its Watch).
    Ok((if binary { client.binary() } else { client }, at))
}

/// Prints the feed; exit code 0 when it ended or `--count` messages were printed.
pub fn feed(args: FeedArgs) -> anyhow::Result<i32> {
    let timeout = Duration::from_secs_f64(args.timeout.max(0.1));
    let (mut client, at) = attach(
        args.socket.as_deref(),
        args.token_file.as_deref(),
        &args.tls,
        timeout,
        false,
    )?;
    let mut out = std::io::stdout().lock();
    let mut printed = 0u64;
    while let Some(next) = client.next_message() {
        let (line, msg) = next.with_context(|| format!("reading {at}"))?;
        let text = match (args.json, client.view()) {
            (true, _) => line,
            (false, Some(v)) => stallscope_dashboards::status::render(v),
            (false, None) => continue,
        };
        if writeln!(out, "{text}").and_then(|_| out.flush()).is_err() {
            return Ok(0);
        }
        printed += 1;
        if matches!(msg, FeedMessage::End) || args.count.is_some_and(|n| printed >= n) {
            break;
        }
    }
    Ok(0)
}
