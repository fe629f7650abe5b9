//! `stallscope advise PROFILE…`: reads what a profile measured, runs the advisor's model over
//! the instance catalog (the shipped one, or the user's `--catalog`), prints the table and the
//! advice, and writes the JSON with `--json`.

use std::path::PathBuf;

use crate::cli::AdviseArgs;
use anyhow::Context;
use stallscope_analysis::advisor::{self, catalog, Measured, Request, Work};
use stallscope_analysis::frame::Frame;
use stallscope_collector::profile::{read_profile, ProfileReader};

fn frames_of(path: &PathBuf) -> anyhow::Result<Vec<Frame>> {
    let read = read_profile(path).with_context(|| format!("cannot read {}", path.display()))?;
    for issue in &read.issues {
        eprintln!("stallscope: {}: {}", path.display(), issue.describe());
    }
    Ok(read.frames)
}

/// What profile `path` measured, its frames streamed from the reader into the advisor's
/// fold: nothing holds the profile, whatever its size.
fn measure_streaming(path: &PathBuf, warmup: u32) -> anyhow::Result<Measured> {
    let mut reader =
        ProfileReader::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut m = advisor::Measuring::new(warmup);
    for frame in reader.by_ref() {
        match frame {
            Ok(f) => m.ingest(&f),
            Err(e) => {
                eprintln!("stallscope: {}: reading stopped early: {e}", path.display());
                break;
            }
        }
    }
    for issue in reader.take_issues() {
        eprintln!("stallscope: {}: {}", path.display(), issue.describe());
    }
    Ok(m.finish())
}

/// The profiles pooled as one job (`advisor::pool`); `--measured-nodes` overrides the node
/// count they tell (`advisor::shape`).
fn measured(args: &AdviseArgs) -> anyhow::Result<Measured> {
    let mut all: Vec<Measured> = Vec::new();
    for p in &args.profiles {
        let m = measure_streaming(p, args.warmup)?;
        if m.iterations == 0 {
            anyhow::bail!("{} holds no counted iterations", p.display());
        }
        all.push(m);
    }
    let mut m = advisor::pool(&all).context("no profile given")?;
    if let Some(nodes) = args.measured_nodes {
        advisor::shape::override_nodes(&mut m, nodes);
    }
    Ok(m)
}

/// MB/s the experiment's cold-cache run read its dataset at, when it measured it.
fn experiment_storage_mbps(exp: &PathBuf) -> anyhow::Result<Option<f64>> {
    let frames = frames_of(exp)?;
    let report = frames
        .iter()
        .find_map(|f| match f {
            Frame::Experiment(r) => Some(r),
            _ => None,
        })
        .with_context(|| {
            format!(
                "{} is not the result of `stallscope experiment`",
                exp.display()
            )
        })?;
    Ok(report
        .what_if
        .as_ref()
        .and_then(|w| w.inputs.storage_bytes_per_s)
        .map(|b| b / 1e6))
}

/// Prints the advice; exit code 0.
pub fn advise(args: AdviseArgs) -> anyhow::Result<i32> {
    let text = match &args.catalog {
        Some(p) => {
            std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?
        }
        None => catalog::SHIPPED_INSTANCES.to_string(),
    };
    let name = args
        .catalog
        .as_ref()
        .map_or("the shipped catalog".into(), |p| p.display().to_string());
    let instances = catalog::parse_instances(&text).with_context(|| name.clone())?;
    let gpus = catalog::parse_gpus(catalog::SHIPPED_GPUS).context("the shipped GPU table")?;
    let m = measured(&args)?;
    let storage = match &args.experiment {
        Some(exp) => Some(experiment_storage_mbps(exp)?),
        None => None,
    };
    let mut current = advisor::find_current(&instances, args.current.as_deref(), &m)
        .map_err(anyhow::Error::msg)?
        .clone();
    if let (Some(Some(mbps)), None) = (storage, current.storage_mbps) {
        // The measured machine's storage rate, as the experiment's cold-cache run read it.
        current.storage_mbps = Some(mbps);
    }
    let current = &current;
    let req = Request {
        nodes: args.nodes.clone(),
        work: match (args.train_samples, args.iterations) {
            (Some(s), _) => Some(Work::Samples(s)),
            (_, Some(i)) => Some(Work::Iterations(i)),
            _ => None,
        },
        budget_hours: args.budget_hours,
        spot: args.spot,
    };
    let report = advisor::advise(&m, current, &instances, &gpus, &req);
    print!("{}", advisor::render_text(&report));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(0)
}
