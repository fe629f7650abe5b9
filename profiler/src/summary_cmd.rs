//! `stallscope summary PROFILE`: replays a profile through the same timeline and attribution
//! the live run used, and prints the same summary (or its JSON). For the result of
//! `stallscope experiment` it prints the stalls by difference instead.

use anyhow::Context;
use stallscope_analysis::frame::Frame;
use stallscope_analysis::journal::{link_peaks_of, Journal};
use stallscope_analysis::summary::{render_text, summarize};
use stallscope_collector::profile::ProfileReader;

use crate::cli::SummaryArgs;

/// Prints the summary of a profile; exit code 0. The frames stream from the reader, twice
/// (the run's link peaks, then a replayed journal attributing as it goes with those peaks,
/// which gives what attributing everything at the end gives), and are never all held.
pub fn summary(args: SummaryArgs) -> anyhow::Result<i32> {
    let cannot_read = || format!("cannot read {}", args.profile.display());
    // First pass: the run's link peaks, which attributing everything at the end would use.
    let mut reader = ProfileReader::open(&args.profile).with_context(cannot_read)?;
    let peaks = link_peaks_of(reader.by_ref().map_while(Result::ok));
    let mut reader = ProfileReader::open(&args.profile).with_context(cannot_read)?;
    let mut failure = None;
    let mut experiment = None;
    let frames = reader
        .by_ref()
        .map_while(|f| f.map_err(|e| failure = Some(e)).ok())
        .inspect(|f| {
            if let (Frame::Experiment(r), None) = (f, &experiment) {
                experiment = Some(r.clone());
            }
        });
    let mut journal = Journal::reader("");
    journal.assume_link_peaks(peaks);
    let journal = journal.replaying(frames);
    if let Some(e) = failure {
        return Err(e).with_context(cannot_read);
    }
    for issue in reader.issues() {
        eprintln!(
            "stallscope: {}: {}",
            args.profile.display(),
            issue.describe()
        );
    }
    if let Some(report) = experiment {
        if args.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print!("{}", stallscope_analysis::experiment::render_text(&report));
        }
        return Ok(0);
    }
    let job = journal.timeline();
    if job.header.is_none() {
        anyhow::bail!(
            "{} holds no run header: it is empty or was cut before its first frame",
            args.profile.display()
        );
    }
    let mut s = summarize(job);
    s.profile = Some(args.profile.display().to_string());
    if args.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        print!("{}", render_text(&s));
    }
    Ok(0)
}
