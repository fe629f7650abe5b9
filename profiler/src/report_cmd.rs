//! `stallscope report PROFILE…`: the post-hoc report. Replays the profiles through the same
//! live model the dashboard and `/metrics` render (`stallscope_analysis::report`), then writes
//! one self-contained page: HTML (default), Markdown with its SVG charts beside it, or JSON
//! (`stallscope.report/1`), chosen by the output's extension.
//!
//! A profile that cannot be read, is cut or damaged still gives a report: what went wrong is
//! the report's first lines, never a crash. Several run profiles of one job (one per node) are
//! joined on their wall clocks, as a collector would join them.

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::cli::ReportArgs;
use anyhow::Context;
use stallscope_analysis::advisor::{self, catalog, Request};
use stallscope_analysis::frame::Frame;
use stallscope_analysis::report::join::join_runs;
use stallscope_analysis::report::{compare, AdviceSection, Report, ReportBuilder, SourceProfile};
use stallscope_collector::profile::ProfileReader;
use stallscope_dashboards::report as render;

/// The output formats, by extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Html,
    Markdown,
    Json,
}

fn format_of(path: &Path) -> anyhow::Result<Format> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    match ext.as_str() {
        "html" | "htm" => Ok(Format::Html),
        "md" | "markdown" => Ok(Format::Markdown),
        "json" => Ok(Format::Json),
        _ => anyhow::bail!(
            "{}: the report's format follows the extension: use .html, .md or .json",
            path.display()
        ),
    }
}

/// Writes the report; exit code 0, also when the profiles were cut, damaged or empty (the
/// report says so).
pub fn report(args: ReportArgs) -> anyhow::Result<i32> {
    let format = format_of(&args.output)?;
    let stem = args
        .output
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("report")
        .to_string();
    let rendered = if let [before, after] = args.compare.as_slice() {
        let before = build(std::slice::from_ref(before), None, None);
        let after = build(std::slice::from_ref(after), None, None);
        let c = compare(before, after);
        match format {
            Format::Html => render::Rendered::page(render::html_comparison(&c)),
            Format::Markdown => render::markdown_comparison(&c, &stem),
            Format::Json => render::Rendered::page(render::json_comparison(&c)),
        }
    } else {
        let advice = (!args.no_advice).then_some(&args);
        let r = build(&args.profiles, args.experiment.as_deref(), advice);
        match format {
            Format::Html => render::Rendered::page(render::html(&r)),
            Format::Markdown => render::markdown(&r, &stem),
            Format::Json => render::Rendered::page(render::json(&r)),
        }
    };
    write(&args.output, &rendered)?;
    Ok(0)
}

fn write(output: &Path, rendered: &render::Rendered) -> anyhow::Result<()> {
    std::fs::write(output, &rendered.text)
        .with_context(|| format!("cannot write {}", output.display()))?;
    let dir = output.parent().unwrap_or(Path::new(""));
    for (name, content) in &rendered.files {
        let p = dir.join(name);
        std::fs::write(&p, content).with_context(|| format!("cannot write {}", p.display()))?;
    }
    let beside = if rendered.files.is_empty() {
        String::new()
    } else {
        format!(" and {} chart(s) beside it", rendered.files.len())
    };
    eprintln!(
        "stallscope: report written to {} ({} kB){beside}",
        output.display(),
        rendered.text.len().div_ceil(1000)
    );
    Ok(())
}

/// What one profile is, from its first frames.
fn kind_of(frames: &[Frame]) -> &'static str {
    for f in frames {
        match f {
            Frame::Experiment(_) => return "experiment",
            Frame::Header(h) if h.is_collectors() => return "job",
            Frame::Header(_) => return "run",
            _ => {}
        }
    }
    "run"
}

/// Reads `paths` (and the experiment) into a report. Never fails: what could not be read
/// becomes one of the report's problems.
fn build(paths: &[PathBuf], experiment: Option<&Path>, advice: Option<&ReportArgs>) -> Report {
    let mut b = ReportBuilder::new("");
    // What the advisor measured of each run profile (it pools one job's run profiles): one
    // profile streams through its fold beside the report's; several are held to be joined.
    let mut measured: Vec<advisor::Measured> = Vec::new();
    if let [path] = paths {
        let mut fold = advice.map(|_| advisor::Measuring::with_profiles_warmup());
        stream(&mut b, path, fold.as_mut());
        measured.extend(fold.map(advisor::Measuring::finish));
    } else {
        let mut read = Vec::new();
        for p in paths {
            let mut frames = Vec::new();
            if stream_into(&mut b, p, &mut frames) {
                read.push((p.display().to_string(), frames));
            }
        }
        match join_runs(&read) {
            Ok(joined) => {
                for f in &joined {
                    b.ingest(f);
                }
                if advice.is_some() {
                    measured = read
                        .iter()
                        .map(|(_, frames)| {
                            let mut fold = advisor::Measuring::with_profiles_warmup();
                            frames.iter().for_each(|f| fold.ingest(f));
                            fold.finish()
                        })
                        .collect();
                }
            }
            Err(why) => b.problem(format!("the profiles could not be joined: {why}")),
        }
    }
    if let Some(exp) = experiment {
        add_experiment(&mut b, exp);
    }
    let mut r = b.finish();
    if let Some(args) = advice {
        r.advice = Some(advice_section(&measured, args));
    }
    r
}

fn file_bytes(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

/// Frames handed from the reading thread to the builder at a time.
const BATCH_FRAMES: usize = 512;

/// Batches in flight between the reading thread and the builder: what bounds the memory the
/// reading adds.
const BATCHES_AHEAD: usize = 8;

/// Streams one profile into the builder (and into `keep`, when given). A second thread reads
/// and decodes the frames while this one attributes them.
fn stream(b: &mut ReportBuilder, path: &Path, measuring: Option<&mut advisor::Measuring>) {
    let Some(reader) = open(b, path) else {
        return;
    };
    let before = b.frames();
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Frame>>(BATCHES_AHEAD);
    let reading = std::thread::spawn(move || {
        let mut reader = reader;
        let mut batch = Vec::with_capacity(BATCH_FRAMES);
        let mut error = None;
        for frame in reader.by_ref() {
            match frame {
                Ok(f) => {
                    batch.push(f);
                    if batch.len() == BATCH_FRAMES {
                        let full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH_FRAMES));
                        if tx.send(full).is_err() {
                            break;
                        }
                    }
                }
                Err(e) => {
                    error = Some(e.to_string());
                    break;
                }
            }
        }
        if !batch.is_empty() {
            let _ = tx.send(batch);
        }
        (reader, error)
    });
    let mut first: Vec<Frame> = Vec::new();
    let mut measuring = measuring;
    for batch in rx {
        for f in batch {
            b.ingest(&f);
            if let Some(m) = measuring.as_deref_mut() {
                m.ingest(&f);
            }
            if first.len() < 2 {
                first.push(f);
            }
        }
    }
    match reading.join() {
        Ok((mut reader, error)) => {
            if let Some(e) = error {
                b.problem(format!("reading stopped early: {e}"));
            }
            let frames = b.frames() - before;
            finish_source(b, path, &mut reader, frames, kind_of(&first));
        }
        Err(_) => b.problem(format!("{}: reading failed", path.display())),
    }
}

/// Reads one profile whole into `frames` (for joining); false when it could not be opened.
fn stream_into(b: &mut ReportBuilder, path: &Path, frames: &mut Vec<Frame>) -> bool {
    let Some(mut reader) = open(b, path) else {
        return false;
    };
    for frame in reader.by_ref() {
        match frame {
            Ok(f) => frames.push(f),
            Err(e) => {
                b.problem(format!("reading stopped early: {e}"));
                break;
            }
        }
    }
    let kind = kind_of(frames);
    finish_source(b, path, &mut reader, frames.len() as u64, kind);
    true
}

fn open(b: &mut ReportBuilder, path: &Path) -> Option<ProfileReader<File>> {
    match ProfileReader::open(path) {
        Ok(r) => Some(r),
        Err(e) => {
            b.problem(e.to_string());
            b.source(SourceProfile {
                path: path.display().to_string(),
                kind: "unreadable".into(),
                bytes: file_bytes(path),
                ..SourceProfile::default()
            });
            None
        }
    }
}

fn finish_source(
    b: &mut ReportBuilder,
    path: &Path,
    reader: &mut ProfileReader<File>,
    frames: u64,
    kind: &str,
) {
    for issue in reader.take_issues() {
        b.problem(format!("{}: {}", path.display(), issue.describe()));
    }
    let host = b.header().map(|h| h.host.clone()).unwrap_or_default();
    b.source(SourceProfile {
        path: path.display().to_string(),
        kind: kind.into(),
        host,
        bytes: file_bytes(path),
        frames,
        complete: b.saw_end(),
    });
}

fn add_experiment(b: &mut ReportBuilder, path: &Path) {
    let Some(mut reader) = open(b, path) else {
        return;
    };
    let mut frames = 0;
    let mut found = false;
    for f in reader.by_ref().map_while(Result::ok) {
        frames += 1;
        if matches!(f, Frame::Experiment(_)) {
            b.ingest(&f);
            found = true;
        }
    }
    if !found {
        b.problem(format!(
            "{}: not the result of `stallscope experiment` (it holds no experiment frame)",
            path.display()
        ));
    }
    for issue in reader.take_issues() {
        b.problem(format!("{}: {}", path.display(), issue.describe()));
    }
    b.source(SourceProfile {
        path: path.display().to_string(),
        kind: "experiment".into(),
        bytes: file_bytes(path),
        frames,
        complete: found,
        ..SourceProfile::default()
    });
}

/// The advisor over the shipped catalog (or `--catalog`), as `stallscope advise` runs it
/// with its defaults.
fn advice_section(runs: &[advisor::Measured], args: &ReportArgs) -> AdviceSection {
    match run_advisor(runs, args) {
        Ok(a) => AdviceSection::Advice(Box::new(a)),
        Err(why) => AdviceSection::Unavailable(why),
    }
}

fn run_advisor(
    runs: &[advisor::Measured],
    args: &ReportArgs,
) -> Result<stallscope_analysis::advisor::AdviceReport, String> {
    let text = match &args.catalog {
        Some(p) => std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?,
        None => catalog::SHIPPED_INSTANCES.to_string(),
    };
    let instances = catalog::parse_instances(&text).map_err(|e| e.to_string())?;
    let gpus = catalog::parse_gpus(catalog::SHIPPED_GPUS).map_err(|e| e.to_string())?;
    if runs.iter().any(|m| m.iterations == 0) {
        return Err("the profile holds no counted iterations to predict from".into());
    }
    let m = advisor::pool(runs).ok_or("no profile to predict from")?;
    let current = advisor::find_current(&instances, args.current.as_deref(), &m)?;
    Ok(advisor::advise(
        &m,
        current,
        &instances,
        &gpus,
        &Request::default(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_format_follows_the_extension() {
        assert_eq!(format_of(Path::new("a/r.HTML")).unwrap(), Format::Html);
        assert_eq!(format_of(Path::new("r.md")).unwrap(), Format::Markdown);
        assert_eq!(format_of(Path::new("r.json")).unwrap(), Format::Json);
        let e = format_of(Path::new("r.pdf")).unwrap_err().to_string();
        assert!(e.contains(".html, .md or .json"), "{e}");
    }
}
