//! `stallscope summary PROFILE`: replays a profile through the same timeline and attribution
//! the live run used, and prints the same summary (or its JSON). For the result of
//! `stallscope experiment` it prints the stalls by difference instead.

use anyhow::Context;
use stallscope_analysis::frame::Frame;
use stallscope_analysis::job::JobTimeline;
use stallscope_analysis::summary::{render_text, summarize};
use stallscope_collector::profile::read_profile;

use crate::cli::SummaryArgs;

/// Prints the summary of a profile; exit code 0.
pub fn summary(args: SummaryArgs) -> anyhow::Result<i32> {
    let read = read_profile(&args.profile)
        .with_context(|| format!("cannot read {}", args.profile.display()))?;
    for issue in &read.issues {
        eprintln!(
            "stallscope: {}: {}",
            args.profile.display(),
            issue.describe()
        );
    }
    if let Some(report) = read.frames.iter().find_map(|f| match f {
        Frame::Experiment(r) => Some(r),
        _ => None,
    }) {
        if args.json {
            println!("{}", serde_json::to_string_pretty(report)?);
        } else {
            print!("{}", stallscope_analysis::experiment::render_text(report));
        }
        return Ok(0);
    }
    let mut job = JobTimeline::default();
    for frame in &read.frames {
        job.ingest(frame);
    }
    if job.header.is_none() {
        anyhow::bail!(
            "{} holds no run header: it is empty or was cut before its first frame",
            args.profile.display()
        );
    }
    job.attribute_ready(u64::MAX, true);
    let mut s = summarize(&job);
    s.profile = Some(args.profile.display().to_string());
    if args.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        print!("{}", render_text(&s));
    }
    Ok(0)
}
