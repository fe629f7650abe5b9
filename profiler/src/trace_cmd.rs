//! `stallscope trace PROFILE -o trace.json`: the profile as a Trace Event Format trace for
//! ui.perfetto.dev ([`stallscope_analysis::trace`]), and the flight recorder's
//! [`write_recent_trace`]: the last minutes of a profile still being written, beside it.
//!
//! The frames stream from the profile's reader twice (the run's link peaks, then the export
//! through a reader journal) and are never all held; each event is written as it is known.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use anyhow::Context;
use stallscope_analysis::journal::link_peaks_of;
use stallscope_analysis::journal::replay::frame_time;
use stallscope_analysis::trace::{export, TraceOptions, TraceStats};
use stallscope_analysis::Nanos;
use stallscope_collector::profile::ProfileReader;

use crate::cli::TraceArgs;

/// Writes the trace of `args.profile`; exit code 0. A profile that cannot be read to its end
/// still gives the trace of what came before the damage, and an error naming it.
pub fn trace(args: TraceArgs) -> anyhow::Result<i32> {
    let since = match args.last {
        Some(s) if !(s.is_finite() && s >= 0.0) => {
            anyhow::bail!("--last takes seconds, 0 or more (got {s})")
        }
        Some(s) => {
            let last = last_time(&args.profile)?;
            Some(last.saturating_sub((s * 1e9) as Nanos))
        }
        None => None,
    };
    let stats = write_trace(&args.profile, since, &args.output)?;
    eprintln!(
        "stallscope: trace written to {} ({} ranks on {} nodes, {} iterations, {} events): open it in https://ui.perfetto.dev",
        args.output.display(),
        stats.ranks,
        stats.nodes,
        stats.iterations,
        stats.events
    );
    Ok(0)
}

/// The flight recorder: writes the trace of what in `profile` ends at or after `since_ns`
/// (ns, the profile's clock) to `out`. Safe on a profile still being written: it reads what
/// was flushed. What a hang (and a slowdown) calls; see [`flight_record_path`].
pub fn write_recent_trace(
    profile: &Path,
    since_ns: Nanos,
    out: &Path,
) -> anyhow::Result<TraceStats> {
    write_trace(profile, Some(since_ns), out)
}

/// Where the flight recorder puts the trace of an event named `what` (`hang-37s`): beside
/// the profile, `PROFILE.what.trace.json`.
pub fn flight_record_path(profile: &Path, what: &str) -> PathBuf {
    let mut name = profile.as_os_str().to_owned();
    name.push(format!(".{what}.trace.json"));
    PathBuf::from(name)
}

/// The latest instant of the profile's frames, ns.
fn last_time(profile: &Path) -> anyhow::Result<Nanos> {
    let reader = ProfileReader::open(profile)
        .with_context(|| format!("cannot read {}", profile.display()))?;
    Ok(reader
        .map_while(Result::ok)
        .filter_map(|f| frame_time(&f))
        .max()
        .unwrap_or(0))
}

fn write_trace(profile: &Path, since_ns: Option<Nanos>, out: &Path) -> anyhow::Result<TraceStats> {
    let cannot_read = || format!("cannot read {}", profile.display());
    let mut reader = ProfileReader::open(profile).with_context(cannot_read)?;
    let peaks = link_peaks_of(reader.by_ref().map_while(Result::ok));
    let mut reader = ProfileReader::open(profile).with_context(cannot_read)?;
    let file = File::create(out).with_context(|| format!("cannot write {}", out.display()))?;
    let options = TraceOptions {
        since_ns,
        profile: profile.display().to_string(),
    };
    let mut failure = None;
    let mut header = false;
    let frames = reader
        .by_ref()
        .map_while(|f| f.map_err(|e| failure = Some(e)).ok())
        .inspect(|f| header |= matches!(f, stallscope_analysis::frame::Frame::Header(_)));
    let (stats, _) = export(frames, Some(peaks), &options, BufWriter::new(file))
        .with_context(|| format!("cannot write {}", out.display()))?;
    for issue in reader.issues() {
        eprintln!("stallscope: {}: {}", profile.display(), issue.describe());
    }
    if let Some(e) = failure {
        return Err(e).with_context(|| {
            format!(
                "cannot read all of {}: {} holds the trace of what came before",
                profile.display(),
                out.display()
            )
        });
    }
    if !header {
        anyhow::bail!(
            "{} holds no run header: it is empty or was cut before its first frame",
            profile.display()
        );
    }
    Ok(stats)
}
