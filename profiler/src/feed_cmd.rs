//! `stallscope feed [SOCKET]`: attaches to the live feed of a running `stallscope run`, agent
//! or collector on this node and prints the live model: each message as a JSON line
//! (`--json`), or the status line as it changes.

use std::io::Write;
use std::time::Duration;

use anyhow::Context;
use stallscope_agent::node::feed::{newest_feed, FeedClient, FeedMessage};

use crate::cli::FeedArgs;

/// Prints the feed; exit code 0 when it ended or `--count` messages were printed.
pub fn feed(args: FeedArgs) -> anyhow::Result<i32> {
    let path = match &args.socket {
        Some(p) => p.clone(),
        None => newest_feed()?,
    };
    let timeout = Duration::from_secs_f64(args.timeout.max(0.1));
    let mut client = FeedClient::connect(&path, timeout)?;
    let mut out = std::io::stdout().lock();
    let mut printed = 0u64;
    while let Some(next) = client.next_message() {
        let (line, msg) = next.with_context(|| format!("reading {}", path.display()))?;
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
