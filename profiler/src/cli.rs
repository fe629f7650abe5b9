//! Command-line arguments.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// A stall-centric profiler for distributed deep-learning training: where does each
/// iteration's time go, and what should change?
#[derive(Debug, Parser)]
#[command(name = "stallscope", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a training command and split every iteration of every rank into stalls.
    Run(RunArgs),
    /// Print the summary of a profile written by `stallscope run`.
    Summary(SummaryArgs),
    /// Show what this machine lets stallscope see: each GPU and its readings, CPU, disk,
    /// NIC, PSI and perf sources, present or missing and why.
    Doctor(DoctorArgs),
    /// Measure what each NVML call the GPU source makes costs on this machine.
    NvmlBench(NvmlBenchArgs),
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Root of procfs (for tests).
    #[arg(long, default_value = "/proc", hide = true)]
    pub proc_root: PathBuf,
    /// Root of sysfs (for tests).
    #[arg(long, default_value = "/sys", hide = true)]
    pub sys_root: PathBuf,
}

#[derive(Debug, Args)]
pub struct NvmlBenchArgs {
    /// Calls timed per NVML function and GPU.
    #[arg(long, default_value_t = 1000)]
    pub rounds: u32,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Where to write the profile (default: stallscope-<time>.stallscope in the current directory).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Also write the summary as JSON to this file.
    #[arg(long)]
    pub summary_json: Option<PathBuf>,
    /// Sampling rate of the fast sources (process states, NIC bytes), Hz.
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// Iterations at the start of each rank left out of the summary.
    #[arg(long, default_value_t = 1)]
    pub warmup: u32,
    /// Do not instrument PyTorch automatically (the `stallscope` Python package stays importable).
    #[arg(long)]
    pub no_auto: bool,
    /// Count an iteration each time a line of the command's stdout matches REGEX (for any
    /// framework). Named groups `rank` and `iter` are used when present.
    #[arg(long, value_name = "REGEX")]
    pub iter_regex: Option<String>,
    /// No live status line.
    #[arg(short, long)]
    pub quiet: bool,
    /// Root of procfs (for tests).
    #[arg(long, default_value = "/proc", hide = true)]
    pub proc_root: PathBuf,
    /// Root of sysfs (for tests).
    #[arg(long, default_value = "/sys", hide = true)]
    pub sys_root: PathBuf,
    /// The training command and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "COMMAND"
    )]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct SummaryArgs {
    /// The profile.
    pub profile: PathBuf,
    /// Print the summary JSON instead of text.
    #[arg(long)]
    pub json: bool,
}
