//! `stallscope experiment`: the differential measurement of Stash and DS-Analyzer as one
//! command. The same training runs in up to five configurations (one process and all
//! processes on synthetic data, the processes spread over nodes, real data with a warm and
//! with a cold page cache); the differences of their iteration times are the stalls.
//!
//! Every configuration is an ordinary `stallscope run` of `stallscope launch -- COMMAND`, so
//! each leaves its own profile with the online breakdown, and the user's command is the same
//! in all of them: the PyTorch hook replays the first batch when `STALLSCOPE_SYNTHETIC=1` and
//! ends the process after `STALLSCOPE_MAX_ITERS` iterations. The result is written as an
//! `Experiment` frame into a profile of its own, which `stallscope summary` prints.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use stallscope_analysis::experiment::{
    agreement, differential, render_text, Config, ConfigRun, ExperimentReport, Timing, WhatIf,
    WhatIfInputs, SCHEMA,
};
use stallscope_analysis::frame::{Frame, RunEnd, RunHeader};
use stallscope_analysis::run_facts::{run_facts, RunFacts};
use stallscope_analysis::summary::Categories;
use stallscope_collector::profile::{read_profile, ProfileWriter};

use crate::child::exit_code;
use crate::cli::{ExperimentArgs, RunArgs};
use crate::run;

pub mod cache;
pub mod nodes;

use cache::Dataset;

/// Exit code of an experiment in which a configuration failed.
const FAILED_RUN: i32 = 1;

/// How one configuration is laid out.
struct Layout {
    /// Processes per node.
    per_node: u32,
    /// Nodes (empty: this one).
    nodes: Vec<String>,
}

impl Layout {
    fn processes(&self) -> u32 {
        self.per_node * self.nodes.len().max(1) as u32
    }
}

/// The configurations to run, in order.
fn configs(args: &ExperimentArgs) -> anyhow::Result<Vec<Config>> {
    if let Some(list) = &args.configs {
        let mut out = Vec::new();
        for label in list {
            let c = Config::from_label(label).with_context(|| {
                format!("--configs: unknown configuration {label:?} (use R0, R1, R1n, R2, R3)")
            })?;
            if c == Config::Nodes && args.nodes.len() < 2 {
                bail!("--configs R1n needs --nodes with at least two nodes");
            }
            if c == Config::Cold && args.dataset_dir.is_none() {
                bail!("--configs R2 (cold cache) needs --dataset-dir");
            }
            out.push(c);
        }
        out.sort();
        out.dedup();
        return Ok(out);
    }
    Ok(Config::ALL
        .into_iter()
        .filter(|c| match c {
            Config::Local => args.nproc > 1 || args.nodes.len() > 1,
            Config::Nodes => args.nodes.len() > 1,
            Config::Cold => args.dataset_dir.is_some(),
            _ => true,
        })
        .collect())
}

fn layout(args: &ExperimentArgs, config: Config) -> Layout {
    let spread =
        args.nodes.len() > 1 && matches!(config, Config::Nodes | Config::Warm | Config::Cold);
    match config {
        Config::Single => Layout {
            per_node: 1,
            nodes: vec![],
        },
        _ if spread => Layout {
            per_node: args.nproc / args.nodes.len() as u32,
            nodes: args.nodes.clone(),
        },
        _ => Layout {
            per_node: args.nproc,
            nodes: vec![],
        },
    }
}

fn launch_command(args: &ExperimentArgs, layout: &Layout) -> anyhow::Result<Vec<String>> {
    let exe = std::env::current_exe().context("cannot find the stallscope executable")?;
    let mut cmd = vec![
        exe.display().to_string(),
        "launch".to_string(),
        "--nproc-per-node".to_string(),
        layout.per_node.to_string(),
    ];
    if !layout.nodes.is_empty() {
        cmd.push("--nodes".into());
        cmd.push(layout.nodes.join(","));
        cmd.push("--node-launch".into());
        cmd.push(args.node_launch.clone().unwrap_or_default());
        if let Some(a) = &args.master_addr {
            cmd.push("--master-addr".into());
            cmd.push(a.clone());
        }
    }
    cmd.push("--".into());
    cmd.extend(args.command.iter().cloned());
    Ok(cmd)
}

/// `job.stallscope` → `job.R1n.stallscope`.
fn config_profile(out: &Path, config: Config) -> PathBuf {
    let stem = out
        .file_stem()
        .map_or("experiment".into(), |s| s.to_string_lossy().into_owned());
    out.with_file_name(format!("{stem}.{}.stallscope", config.label()))
}

fn default_output() -> PathBuf {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    PathBuf::from(format!("stallscope-experiment-{secs}.stallscope"))
}

fn validate(args: &ExperimentArgs) -> anyhow::Result<()> {
    if args.nproc == 0 {
        bail!("--nproc must be at least 1");
    }
    if args.iters == 0 {
        bail!("--iters must be at least 1");
    }
    if args.nodes.len() == 1 {
        bail!("--nodes needs at least two nodes (the local run is R1 already)");
    }
    if args.nodes.len() > 1 {
        if args.nproc % args.nodes.len() as u32 != 0 {
            bail!(
                "--nproc {} cannot be spread evenly over {} nodes",
                args.nproc,
                args.nodes.len()
            );
        }
        if args.node_launch.is_none() || args.master_addr.is_none() {
            bail!("--nodes needs --node-launch (e.g. 'ip netns exec {{node}}' or 'ssh {{node}} env {{env}}') and --master-addr (the first node's address)");
        }
        if args
            .node_launch
            .as_deref()
            .is_some_and(|l| l.split_whitespace().next() == Some("ssh"))
        {
            eprintln!("stallscope experiment: through ssh, the other nodes must see the hook, the dataset and this stallscope executable at the same paths (a shared file system); their page caches are emptied through the same prefix for R2 and R3");
        }
    }
    Ok(())
}

/// The what-if model's inputs, from the runs and what the cache steps measured.
fn what_if_inputs(
    runs: &[ConfigRun],
    facts: &[(Config, RunFacts)],
    dataset: Option<&Dataset>,
    storage: Option<(u64, f64)>,
) -> Option<WhatIfInputs> {
    let fact = |c: Config| facts.iter().find(|f| f.0 == c).map(|f| &f.1);
    let real = fact(Config::Warm).or(fact(Config::Cold))?;
    let synthetic = [Config::Nodes, Config::Local, Config::Single]
        .into_iter()
        .find_map(|c| {
            runs.iter()
                .find(|r| r.config == c && r.timing.iterations > 0)
        })?;
    let processes = runs
        .iter()
        .find(|r| matches!(r.config, Config::Warm | Config::Cold))
        .map_or(1, |r| r.processes) as f64;
    let samples_per_iteration = real.batch_size.map_or(1.0, |b| b as f64 * processes);
    let compute_samples_per_s = samples_per_iteration / synthetic.timing.mean_s;
    let diff = differential(runs);
    let prep_core_seconds_per_sample = match real.loader_cpu_seconds {
        Some(cpu) if real.batch_size.is_some() => {
            let samples = real.batches_prepared_per_rank() as f64
                * real.ranks.max(1) as f64
                * real.batch_size.unwrap_or(1) as f64;
            Some(cpu / samples)
        }
        // No worker processes: each process prepares its batch on its own core, in line.
        _ => diff
            .data_prep
            .filter(|p| p.seconds > 0.0)
            .map(|p| p.seconds * processes / samples_per_iteration),
    };
    let workers = real.workers.unwrap_or(0);
    let prep_cores_now = (if workers > 0 {
        workers as f64 * processes
    } else {
        processes
    })
    .min(real.cpus.max(1) as f64);
    let storage_bytes_per_s = storage
        .filter(|(bytes, secs)| *bytes > 0 && *secs > 0.0)
        .map(|(bytes, secs)| bytes as f64 / secs);
    let bytes_per_sample = match (dataset, real.dataset_samples) {
        (Some(ds), Some(n)) if n > 0 => Some(ds.bytes() as f64 / n as f64),
        _ => None,
    };
    Some(WhatIfInputs {
        samples_per_iteration,
        compute_samples_per_s,
        prep_core_seconds_per_sample,
        prep_cores_now,
        storage_bytes_per_s,
        bytes_per_sample,
        cpus: real.cpus,
    })
}

fn write_report(path: &Path, report: &ExperimentReport) -> anyhow::Result<()> {
    let mut w =
        ProfileWriter::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    w.write(&Frame::Header(RunHeader {
        stallscope_version: env!("CARGO_PKG_VERSION").to_string(),
        host: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        command: report.command.clone(),
        warmup_iters: report.warmup_iterations,
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
        ..Default::default()
    }))?;
    w.write(&Frame::Experiment(Box::new(report.clone())))?;
    w.write(&Frame::End(RunEnd::default()))?;
    w.finish()?;
    Ok(())
}

/// Whether an exit code says the user (or the system) stopped the run: then the experiment
/// stops too.
fn interrupted(code: i32) -> bool {
    [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT]
        .iter()
        .any(|s| code == 128 + s)
}

/// Runs the experiment and prints its result; exit code 0, or 1 when a configuration failed.
pub fn experiment(args: ExperimentArgs) -> anyhow::Result<i32> {
    validate(&args)?;
    let configs = configs(&args)?;
    let dataset = args.dataset_dir.as_deref().map(Dataset::scan).transpose()?;
    if let (Some(ds), Some(avail)) = (&dataset, cache::mem_available()) {
        if ds.bytes() > avail {
            eprintln!(
                "stallscope experiment: the dataset ({:.1} GB) is larger than the memory available ({:.1} GB): the warm run will not be fully cached",
                ds.bytes() as f64 / 1e9,
                avail as f64 / 1e9
            );
        }
    }
    let out = args.output.clone().unwrap_or_else(default_output);
    let mut runs: Vec<ConfigRun> = Vec::new();
    let mut facts: Vec<(Config, RunFacts)> = Vec::new();
    let mut storage: Option<(u64, f64)> = None;
    let mut failed = false;
    for config in configs {
        if let Some(ds) = &dataset {
            storage = prepare_cache(ds, config, args.cold_cache)?.or(storage);
            prepare_other_nodes(&args, config)?;
        }
        let (run, f) = run_config(&args, config, &out)?;
        let code = run.exit_code;
        failed |= code != 0 || run.timing.iterations == 0;
        runs.push(run);
        facts.push((config, f));
        if interrupted(code) {
            eprintln!(
                "stallscope experiment: interrupted; the remaining configurations are not run"
            );
            break;
        }
    }
    let diff = differential(&runs);
    let online = diff
        .basis
        .and_then(|b| runs.iter().find(|r| r.config == b))
        .and_then(|r| r.online);
    let report = ExperimentReport {
        schema: SCHEMA.to_string(),
        command: args.command.clone(),
        iterations: args.iters,
        warmup_iterations: args.warmup,
        agreement: online.map_or(Vec::new(), |o| agreement(&o, &diff)),
        what_if: what_if_inputs(&runs, &facts, dataset.as_ref(), storage).map(WhatIf::tabulate),
        differential: diff,
        runs,
    };
    write_report(&out, &report)?;
    print!("{}", render_text(&report));
    println!("profile: {}", out.display());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(if failed { FAILED_RUN } else { 0 })
}

/// Empties the page cache before R3 (then reads the dataset cold, timed: the storage rate,
/// returned as bytes and seconds) and before R2.
fn prepare_cache(
    ds: &Dataset,
    config: Config,
    cold_cache: cache::ColdCache,
) -> anyhow::Result<Option<(u64, f64)>> {
    match config {
        Config::Warm => {
            let how = ds.evict(cold_cache)?;
            let (bytes, secs) = ds.read_all()?;
            eprintln!(
                "stallscope experiment: cache emptied ({how}), then the dataset read cold: {:.1} MB in {:.2} s ({:.1} MB/s); {:.0}% of it cached now",
                bytes as f64 / 1e6,
                secs,
                bytes as f64 / 1e6 / secs.max(1e-9),
                ds.resident_fraction().unwrap_or(f64::NAN) * 100.0
            );
            Ok(Some((bytes, secs)))
        }
        Config::Cold => {
            let how = ds.evict(cold_cache)?;
            eprintln!(
                "stallscope experiment: cache emptied ({how}); {:.0}% of the dataset cached now",
                ds.resident_fraction().unwrap_or(f64::NAN) * 100.0
            );
            Ok(None)
        }
        _ => Ok(None),
    }
}

/// The same cache step on every node the configuration spreads over (see [`nodes`]).
fn prepare_other_nodes(args: &ExperimentArgs, config: Config) -> anyhow::Result<()> {
    let layout = layout(args, config);
    let (Some(dir), Some(template)) = (&args.dataset_dir, &args.node_launch) else {
        return Ok(());
    };
    if layout.nodes.is_empty() || !matches!(config, Config::Warm | Config::Cold) {
        return Ok(());
    }
    let exe = std::env::current_exe().context("cannot find the stallscope executable")?;
    nodes::on_each_node(
        &exe,
        template,
        &layout.nodes,
        dir,
        args.cold_cache,
        config == Config::Warm,
    );
    Ok(())
}

/// Runs one configuration under the embedded `stallscope run` and reads its profile back.
fn run_config(
    args: &ExperimentArgs,
    config: Config,
    out: &Path,
) -> anyhow::Result<(ConfigRun, RunFacts)> {
    let layout = layout(args, config);
    let profile = config_profile(out, config);
    eprintln!(
        "== {}: {} ({} processes on {} node{})",
        config.label(),
        config.describe(),
        layout.processes(),
        layout.nodes.len().max(1),
        if layout.nodes.len() > 1 { "s" } else { "" }
    );
    let run_args = RunArgs {
        metrics: None,
        output: Some(profile.clone()),
        summary_json: None,
        rate: args.rate,
        warmup: args.warmup,
        no_auto: false,
        iter_regex: None,
        quiet: args.quiet,
        tui: false,
        job: None,
        hang_after: None,
        flight_recorder: 0.0,
        keep_all_samples: false,
        roots: crate::cli::RootArgs::live(),
        command: launch_command(args, &layout)?,
    };
    let max_iters = (args.warmup + args.iters).to_string();
    let mut env = vec![("STALLSCOPE_MAX_ITERS".to_string(), max_iters)];
    if config.synthetic() {
        env.push(("STALLSCOPE_SYNTHETIC".to_string(), "1".to_string()));
    }
    let recorded = run::record(&run_args, &env)?;
    let code = exit_code(&recorded.status);
    let read = read_profile(&recorded.profile)
        .with_context(|| format!("cannot read {}", recorded.profile.display()))?;
    let f = run_facts(&read.frames, args.warmup);
    let timing = Timing::of(&f.iteration_seconds);
    eprintln!(
        "== {}: {:.4} s per iteration ± {:.4} over {} iterations; exit {}",
        config.label(),
        timing.mean_s,
        timing.stderr_s,
        timing.iterations,
        code
    );
    if code != 0 || timing.iterations == 0 {
        eprintln!(
            "stallscope experiment: {} {}",
            config.label(),
            if code != 0 {
                format!("exited with {code}")
            } else {
                "completed no iterations after the warm-up".to_string()
            }
        );
    }
    let run = ConfigRun {
        config,
        processes: layout.processes(),
        nodes: layout.nodes.len().max(1) as u32,
        iteration_seconds: f.iteration_seconds.clone(),
        timing,
        exit_code: code,
        profile: recorded.profile.display().to_string(),
        online: (f.critical_path.total() > 0).then(|| Categories::from_split(&f.critical_path)),
    };
    Ok((run, f))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(argv: &[&str]) -> ExperimentArgs {
        let mut full = vec!["stallscope", "experiment"];
        full.extend_from_slice(argv);
        match crate::cli::Cli::parse_from(full).command {
            crate::cli::Command::Experiment(a) => a,
            _ => unreachable!(),
        }
    }

    #[test]
    fn default_configurations_follow_what_was_given() {
        let a = parse(&["--nproc", "2", "--", "python3", "t.py"]);
        assert_eq!(
            configs(&a).unwrap(),
            vec![Config::Single, Config::Local, Config::Warm]
        );
        let a = parse(&["--dataset-dir", "/d", "--", "python3", "t.py"]);
        assert_eq!(
            configs(&a).unwrap(),
            vec![Config::Single, Config::Warm, Config::Cold]
        );
        let a = parse(&[
            "--nproc",
            "2",
            "--nodes",
            "a,b",
            "--node-launch",
            "ip netns exec {node}",
            "--master-addr",
            "10.0.0.1",
            "--dataset-dir",
            "/d",
            "--",
            "python3",
            "t.py",
        ]);
        validate(&a).unwrap();
        assert_eq!(configs(&a).unwrap(), Config::ALL.to_vec());
        assert_eq!(layout(&a, Config::Nodes).per_node, 1);
        assert_eq!(layout(&a, Config::Cold).nodes.len(), 2);
        assert_eq!(layout(&a, Config::Local).per_node, 2);
        assert!(layout(&a, Config::Local).nodes.is_empty());
    }

    #[test]
    fn impossible_requests_are_refused_with_the_reason() {
        let a = parse(&["--configs", "R2", "--", "x"]);
        assert!(configs(&a)
            .unwrap_err()
            .to_string()
            .contains("--dataset-dir"));
        let a = parse(&["--configs", "R7", "--", "x"]);
        assert!(configs(&a)
            .unwrap_err()
            .to_string()
            .contains("unknown configuration"));
        let a = parse(&["--nproc", "3", "--nodes", "a,b", "--", "x"]);
        assert!(validate(&a).unwrap_err().to_string().contains("evenly"));
        let a = parse(&["--nproc", "2", "--nodes", "a,b", "--", "x"]);
        assert!(validate(&a)
            .unwrap_err()
            .to_string()
            .contains("--node-launch"));
    }

    #[test]
    fn each_configuration_has_its_own_profile_beside_the_result() {
        let p = config_profile(Path::new("/tmp/job.stallscope"), Config::Nodes);
        assert_eq!(p, Path::new("/tmp/job.R1n.stallscope"));
    }
}
