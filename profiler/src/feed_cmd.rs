//! `stallscope feed [SOCKET]`: attaches to the live feed of a running `stallscope run`, agent
//! or collector on this node and prints the live model: each message as a JSON line
//! (`--json`), or the status line as it changes.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Deserialize;
use stallscope_agent::node::feed::FEED_SCHEMA;
use stallscope_analysis::view::{JobView, ViewUpdate};

use crate::cli::FeedArgs;

/// One line of the feed.
#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum Line {
    Snapshot(Box<JobView>),
    Update(Box<ViewUpdate>),
    End(serde::de::IgnoredAny),
}

/// The newest feed socket in this user's feed directory.
fn newest_feed() -> anyhow::Result<PathBuf> {
    let dir = stallscope_agent::node::feed_dir().context("no feed directory")?;
    let newest = std::fs::read_dir(&dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "feed"))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .max();
    match newest {
        Some((_, p)) => Ok(p),
        None => bail!(
            "no live feed in {}: is a `stallscope run`, agent or collector running as this user?",
            dir.display()
        ),
    }
}

/// Prints the feed; exit code 0 when it ended or `--count` messages were printed.
pub fn feed(args: FeedArgs) -> anyhow::Result<i32> {
    let path = match &args.socket {
        Some(p) => p.clone(),
        None => newest_feed()?,
    };
    let stream = UnixStream::connect(&path)
        .with_context(|| format!("cannot attach to the feed at {}", path.display()))?;
    stream.set_read_timeout(Some(Duration::from_secs_f64(args.timeout.max(0.1))))?;
    let mut lines = BufReader::new(stream).lines();
    let hello = lines
        .next()
        .context("the feed closed before saying hello")?
        .context("the feed said nothing")?;
    let expected = format!("{{\"feed\":\"{FEED_SCHEMA}\"}}");
    if hello != expected {
        bail!(
            "{} speaks {hello}, this stallscope reads {expected}",
            path.display()
        );
    }
    let mut out = std::io::stdout().lock();
    let mut view: Option<JobView> = None;
    let mut printed = 0u64;
    for line in lines {
        let line = line.with_context(|| format!("reading the feed at {}", path.display()))?;
        let parsed: Line = serde_json::from_str(&line).with_context(|| {
            format!(
                "a malformed feed line: {}",
                line.chars().take(80).collect::<String>()
            )
        })?;
        let end = matches!(parsed, Line::End(_));
        match parsed {
            Line::Snapshot(v) => view = Some(*v),
            Line::Update(u) => {
                if let Some(v) = view.as_mut() {
                    v.apply(*u);
                }
            }
            Line::End(_) => {}
        }
        let text = if args.json {
            line
        } else if let Some(v) = &view {
            stallscope_dashboards::status::render(v)
        } else {
            continue;
        };
        if writeln!(out, "{text}").and_then(|_| out.flush()).is_err() {
            return Ok(0);
        }
        printed += 1;
        if end || args.count.is_some_and(|n| printed >= n) {
            break;
        }
    }
    Ok(0)
}
