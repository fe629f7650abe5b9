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
    /// Print the summary of a profile written by `stallscope run`, `stallscope collector`
    /// or `stallscope experiment`.
    Summary(SummaryArgs),
    /// Export a profile (a run's or a job's) as a trace for ui.perfetto.dev or
    /// chrome://tracing (Trace Event Format JSON): per node a process, per rank its
    /// iterations, phases and collectives and its categories, the resources as counters,
    /// hangs as instants, all nodes on one clock.
    Trace(TraceArgs),
    /// Attach to the live feed of a running `stallscope run`, agent or collector on this node,
    /// or to a collector's HOST:PORT, and print its live model (the status line, or every
    /// message as JSON with --json).
    Feed(FeedArgs),
    /// The live terminal dashboard: attach to the run or agent on this node (or --attach
    /// SOCKET), to a whole job (--collector HOST:PORT), or replay a PROFILE.
    Top(TopArgs),
    /// Measure the stalls by difference between controlled runs of the training (Stash,
    /// DS-Analyzer): 1 process and all processes on synthetic data, over the nodes, real
    /// data with a warm and a cold page cache.
    Experiment(ExperimentArgs),
    /// Which instance type, node count and communication setup: predicted iteration time,
    /// time and cost to train for each catalog row, from a measured profile.
    Advise(AdviseArgs),
    /// The post-hoc report of a profile (a run's, a job's, an experiment's; or several run
    /// profiles of one job): verdict, breakdown, every iteration over the run, time outside
    /// iterations, stragglers, resources, advice. HTML (default), Markdown or JSON by the
    /// extension of -o; --compare BEFORE AFTER shows two runs side by side.
    Report(ReportArgs),
    /// Start the processes of a data-parallel job with torchrun's environment (RANK,
    /// LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, …), on this node or on several.
    Launch(LaunchArgs),
    /// Show what this machine lets stallscope see: each GPU and its readings, CPU, disk,
    /// NIC, PSI and perf sources, present or missing and why.
    Doctor(DoctorArgs),
    /// Measure what each NVML call the GPU source makes costs on this machine.
    NvmlBench(NvmlBenchArgs),
    /// Node agent of a multi-node job: receives the node's markers, samples and attributes
    /// its ranks, and streams their iterations to the collector.
    Agent(AgentArgs),
    /// Job collector of a multi-node job: takes the agents' streams, aligns their clocks,
    /// joins the ranks' iterations, names stragglers, and writes the job profile.
    Collector(CollectorArgs),
    /// Load benchmark of the collector: simulated agents on loopback against a real
    /// collector in a child process, ramped over agent counts.
    #[command(hide = true)]
    CollectorBench(CollectorBenchArgs),
    /// Cost benchmark of `stallscope report`: writes a long job's profile (24 h of 64 ranks
    /// by default) and reports it, measuring wall time, peak memory and size per node-hour.
    #[command(hide = true)]
    ReportBench(ReportBenchArgs),
    /// The forwarder of a training's output under `run --iter-regex` (profiler/src/forward.rs):
    /// copies stdin to stdout and to fd 3, outliving stallscope.
    #[command(hide = true)]
    ForwardOutput,
    /// The page-cache step of `stallscope experiment` on one node, run there through its
    /// --node-launch prefix (profiler/src/experiment/nodes.rs): empties the dataset from the
    /// cache and, with --read, reads it back in.
    #[command(hide = true)]
    CacheEvict(CacheEvictArgs),
}

#[derive(Debug, Args)]
pub struct CacheEvictArgs {
    /// The dataset's directory, at the same path as on the node that runs the experiment.
    #[arg(long, value_name = "DIR")]
    pub dataset_dir: PathBuf,
    /// How to empty the cache.
    #[arg(long, value_enum, default_value = "drop")]
    pub cold_cache: crate::experiment::cache::ColdCache,
    /// Then read the dataset once (the warm run, R3).
    #[arg(long)]
    pub read: bool,
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Where /proc and /sys are (hidden; tests point them at captured files).
    #[command(flatten)]
    pub roots: RootArgs,
}

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// Serve Prometheus /metrics from the live model on ADDR (HOST:PORT, :PORT or PORT;
    /// loopback unless a host is given; bare `--metrics`: 127.0.0.1:7572).
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "127.0.0.1:7572")]
    pub metrics: Option<String>,
    /// The collector, HOST:PORT.
    #[arg(long, value_name = "HOST:PORT")]
    pub collector: String,
    /// File holding the shared token the collector expects (first line).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// TLS to a collector started with --tls-cert.
    #[command(flatten)]
    pub tls: TlsClientArgs,
    /// Unix socket to receive markers on (default: $STALLSCOPE_SOCKET, else agent.sock in the
    /// runtime directory: /run/stallscope for root, else $XDG_RUNTIME_DIR/stallscope).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// This node's name in the job (default: the host name).
    #[arg(long)]
    pub node: Option<String>,
    /// Sampling rate of the fast sources, Hz.
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// Records kept for the collector while it is away; beyond, the oldest are dropped and
    /// counted.
    #[arg(long, default_value_t = 100_000)]
    pub buffer: usize,
    /// ms added to every time this agent reports (tests: a clock offset to recover).
    #[arg(long, default_value_t = 0, hide = true, allow_hyphen_values = true)]
    pub clock_offset_ms: i64,
    /// Where /proc and /sys are (hidden; tests point them at captured files).
    #[command(flatten)]
    pub roots: RootArgs,
}

#[derive(Debug, Args)]
pub struct NvmlBenchArgs {
    /// Calls timed per NVML function and GPU.
    #[arg(long, default_value_t = 1000)]
    pub rounds: u32,
}

#[derive(Debug, Args)]
pub struct CollectorBenchArgs {
    /// Agent counts, one step each, in order.
    #[arg(long, value_delimiter = ',', default_value = "100,250,500,1000,2000")]
    pub agents: Vec<usize>,
    /// Iterations each rank ships per second, Hz.
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// Ranks on each simulated node: its agent ships one frame per rank-iteration.
    #[arg(long, default_value_t = 1)]
    pub ranks_per_agent: usize,
    /// How often each simulated agent writes the rank-iterations that ended since, in one
    /// write, ms: `stallscope agent` ships what an attribution round gave, every 100 ms. 0: a
    /// write for each step as it ends (harsher than a real agent above 10 Hz). A record's
    /// latency counts its wait for the write.
    #[arg(long, default_value_t = 100)]
    pub send_every_ms: u64,
    /// Measured window per step, s.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Shipping before the window opens, s (not measured).
    #[arg(long, default_value_t = 2.0)]
    pub warmup: f64,
    /// How much each rank-iteration's wall time varies, % of the step: each lasts between
    /// 100 − this and 100% of it, as a real loop's vary (0: every one the whole step).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=50))]
    pub wall_spread: u64,
    /// Threads running the simulated agents.
    #[arg(long, default_value_t = 1)]
    pub agent_threads: usize,
    /// p99 latency a sustained step must stay under, ms.
    #[arg(long, default_value_t = 250.0)]
    pub p99_goal_ms: f64,
    /// Stop the ramp at the first step not sustained.
    #[arg(long)]
    pub stop_at_failure: bool,
    /// After each step, print the largest latency of each second since the collector
    /// started: where a p99 over the goal came from (the start's backlog, a stall that
    /// recurs). `--json` has it always.
    #[arg(long)]
    pub timeline: bool,
    /// Also write every step's figures here, as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Run the collector side (started by the benchmark itself).
    #[arg(long, hide = true)]
    pub collector_side: bool,
}

#[derive(Debug, Args)]
pub struct CollectorArgs {
    /// Serve Prometheus /metrics from the live model on ADDR (HOST:PORT, :PORT or PORT;
    /// loopback unless a host is given; bare `--metrics`: 127.0.0.1:7572).
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "127.0.0.1:7572")]
    pub metrics: Option<String>,
    /// Address to listen on for agents. Anything but loopback requires --token-file.
    #[arg(long, default_value = "127.0.0.1:7571", value_name = "ADDR")]
    pub listen: String,
    /// File holding the shared token agents must present (first line).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// TLS on the agents' port: this certificate (PEM; chain, the collector's first). Agents
    /// and viewers then need --tls-ca. For networks that are not trusted: the token never
    /// crosses the network either way, but without TLS the records and the live model do, in
    /// the clear.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// The job profile (appended to when it exists, so a restarted collector continues it).
    #[arg(long, short, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Also write the job summary JSON here at the end.
    #[arg(long)]
    pub summary_json: Option<PathBuf>,
    /// Iterations per rank left out of the summary.
    #[arg(long, default_value_t = 1)]
    pub warmup: u32,
    /// No live status lines (node events are still said).
    #[arg(short, long)]
    pub quiet: bool,
    /// The job's name in the live feed and its views.
    #[arg(long, value_name = "NAME")]
    pub job: Option<String>,
    /// Declare a hang when no rank of the job finishes an iteration for SECONDS (default: the
    /// longer of 60 s and 20 median iterations; never before the first iteration): ask every
    /// agent where its ranks stand and for their Python stacks, and say it on stderr, in the
    /// summary and the live model. The job is not stopped.
    #[arg(long, value_name = "SECONDS", value_parser = seconds_up_to_a_day)]
    pub hang_after: Option<f64>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Serve Prometheus /metrics from the live model on ADDR (HOST:PORT, :PORT or PORT;
    /// loopback unless a host is given; bare `--metrics`: 127.0.0.1:7572).
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "127.0.0.1:7572")]
    pub metrics: Option<String>,
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
    /// The live terminal dashboard instead of the status line; the training's output goes
    /// to PROFILE.log and a pane of the dashboard (needs a terminal; falls back to the status
    /// line without one).
    #[arg(long, conflicts_with = "quiet")]
    pub tui: bool,
    /// The job's name in the live feed and its views (default: the training script's or
    /// program's name).
    #[arg(long, value_name = "NAME")]
    pub job: Option<String>,
    /// Declare a hang when no rank finishes an iteration for SECONDS (default: the longer of
    /// 60 s and 20 median iterations; never before the first iteration): say where each rank
    /// stands and its Python stacks, on stderr and in the summary. The job is not stopped.
    #[arg(long, value_name = "SECONDS", value_parser = seconds_up_to_a_day)]
    pub hang_after: Option<f64>,
    /// The flight recorder: when a hang is declared or a rank turns slow, the trace of the
    /// run's last SECONDS is written beside the profile (PROFILE.hang-<at>s.trace.json,
    /// PROFILE.slowdown-rank<r>-iter<i>.trace.json, at most one a minute, see
    /// `stallscope trace`); 0: never.
    #[arg(long, value_name = "SECONDS", default_value_t = 300.0, value_parser = seconds_up_to_a_day)]
    pub flight_recorder: f64,
    /// Write every raw sample and every iteration's markers to the profile. By default the
    /// 100 Hz samples are kept in a ring in memory and written only for the first and last
    /// seconds and around hangs and long iterations, and a loop faster than 50
    /// rank-iterations a second has the markers and breakdowns of only 50 a second written
    /// (and of its ends, hangs, slowdowns and long iterations), with the run's exact totals;
    /// the summary's figures are the same either way.
    #[arg(long)]
    pub keep_all_samples: bool,
    /// Where /proc and /sys are (hidden; tests point them at captured files).
    #[command(flatten)]
    pub roots: RootArgs,
    /// The training command and its arguments.
    #[arg(required = true, trailing_var_arg = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct TraceArgs {
    /// The profile.
    pub profile: PathBuf,
    /// The trace file to write (JSON; `.pftrace` is not written).
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
    /// Only the last SECONDS of the profile (what ends in them).
    #[arg(long, value_name = "SECONDS")]
    pub last: Option<f64>,
}

#[derive(Debug, Args)]
pub struct SummaryArgs {
    /// The profile.
    pub profile: PathBuf,
    /// Print the summary JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ExperimentArgs {
    /// Training processes in the multi-process configurations (on one node for R1; spread
    /// evenly over --nodes for R1n and the real-data runs).
    #[arg(long, default_value_t = 1)]
    pub nproc: u32,
    /// Nodes to spread the processes over (comma-separated names, given to --node-launch as
    /// {node}). With two or more, R1n runs.
    #[arg(long, value_delimiter = ',')]
    pub nodes: Vec<String>,
    /// Command prefix that runs a process on a node: {node}, {node_rank}, {rank},
    /// {local_rank} are replaced, a word {env} becomes the torchrun variables as KEY=VALUE
    /// words. E.g. 'ip netns exec {node}' or 'ssh {node} env {env}'.
    #[arg(long, value_name = "TEMPLATE")]
    pub node_launch: Option<String>,
    /// Address of the first node, for the rendezvous (MASTER_ADDR) when --nodes is given.
    #[arg(long)]
    pub master_addr: Option<String>,
    /// The dataset's directory: emptied from the page cache for R2 and read into it for R3.
    /// Without it R2 is not run and R3 uses the cache as it is.
    #[arg(long, value_name = "DIR")]
    pub dataset_dir: Option<PathBuf>,
    /// How the cold-cache run empties the cache.
    #[arg(long, value_enum, default_value = "drop")]
    pub cold_cache: crate::experiment::cache::ColdCache,
    /// Iterations per process counted in each configuration.
    #[arg(long, default_value_t = 20)]
    pub iters: u32,
    /// Iterations per process left out at the start of each configuration.
    #[arg(long, default_value_t = 3)]
    pub warmup: u32,
    /// Only these configurations (comma-separated: R0, R1, R1n, R2, R3).
    #[arg(long, value_delimiter = ',')]
    pub configs: Option<Vec<String>>,
    /// Where to write the result (default: stallscope-experiment-<time>.stallscope); each
    /// configuration's profile goes beside it as NAME.R0.stallscope, ….
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Also write the result as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Sampling rate of the fast sources, Hz.
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// No live status line.
    #[arg(short, long)]
    pub quiet: bool,
    /// The training command and its arguments (started once per process, without a launcher).
    #[arg(required = true, trailing_var_arg = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct LaunchArgs {
    /// Processes per node.
    #[arg(long, default_value_t = 1)]
    pub nproc_per_node: u32,
    /// Nodes (comma-separated names, given to --node-launch as {node}); default: this one.
    #[arg(long, value_delimiter = ',')]
    pub nodes: Vec<String>,
    /// Command prefix that runs a process on a node (see `stallscope experiment --help`).
    #[arg(long, value_name = "TEMPLATE", default_value = "")]
    pub node_launch: String,
    /// Address of the first node (MASTER_ADDR); default 127.0.0.1 on one node.
    #[arg(long)]
    pub master_addr: Option<String>,
    /// Rendezvous port (MASTER_PORT); default: a free port.
    #[arg(long)]
    pub master_port: Option<u16>,
    /// The command each process runs.
    #[arg(required = true, trailing_var_arg = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// Where the sources read, as hidden options shared by every command that samples.
#[derive(Clone, Debug, Args)]
pub struct RootArgs {
    /// Root of procfs (for tests).
    #[arg(long, default_value = "/proc", hide = true)]
    pub proc_root: PathBuf,
    /// Root of sysfs (for tests).
    #[arg(long, default_value = "/sys", hide = true)]
    pub sys_root: PathBuf,
}

impl RootArgs {
    /// The machine's own /proc and /sys.
    pub fn live() -> RootArgs {
        RootArgs {
            proc_root: PathBuf::from("/proc"),
            sys_root: PathBuf::from("/sys"),
        }
    }

    /// As the agent's sources take them.
    pub fn roots(&self) -> stallscope_agent::sources::Roots {
        stallscope_agent::sources::Roots {
            proc: self.proc_root.clone(),
            sys: self.sys_root.clone(),
        }
    }
}

#[derive(Debug, Args)]
pub struct FeedArgs {
    /// The feed socket (default: the newest in this user's feed directory, /run/stallscope
    /// for root, else $XDG_RUNTIME_DIR/stallscope), or a collector's HOST:PORT.
    pub socket: Option<PathBuf>,
    /// With HOST:PORT: the collector's token file.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// With HOST:PORT: TLS to a collector started with --tls-cert.
    #[command(flatten)]
    pub tls: TlsClientArgs,
    /// Print every message as one JSON line (the first a snapshot of the model, then updates).
    #[arg(long)]
    pub json: bool,
    /// Stop after N messages.
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
    /// Give up when the feed says nothing for this long, s (at most a day).
    #[arg(long, default_value_t = 30.0, value_parser = seconds_up_to_a_day)]
    pub timeout: f64,
}

/// TLS to a collector started with `--tls-cert` (agents and viewers).
#[derive(Clone, Debug, Default, Args)]
pub struct TlsClientArgs {
    /// Connect to the collector over TLS, trusting only the certificates in FILE (PEM): the
    /// collector's own self-signed certificate, or the CA that signed it.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// The name the collector's certificate must hold (default: the host of the collector's
    /// address; an IP address is checked against the certificate's IP addresses).
    #[arg(long, value_name = "NAME", requires = "tls_ca")]
    pub tls_name: Option<String>,
}

impl TlsClientArgs {
    /// The TLS client for the collector at `addr` (HOST:PORT); `None` without --tls-ca.
    pub fn client(&self, addr: &str) -> anyhow::Result<Option<stallscope_agent::tls::TlsClient>> {
        let Some(ca) = &self.tls_ca else {
            return Ok(None);
        };
        Ok(Some(stallscope_agent::tls::TlsClient::new(
            ca,
            self.tls_name.as_deref(),
            addr,
        )?))
    }
}

/// Arguments of `stallscope advise`.
#[derive(Debug, Args)]
pub struct AdviseArgs {
    /// Profiles of the same job on the same machine (`stallscope run -o`); with several,
    /// their iterations are pooled.
    #[arg(required = true)]
    pub profiles: Vec<PathBuf>,
    /// The result of `stallscope experiment` for this job: its cold-cache read rate stands
    /// for the measured machine's storage rate in the fetch model.
    #[arg(long, value_name = "EXP")]
    pub experiment: Option<PathBuf>,
    /// Instance catalog CSV (SkyPilot's columns: InstanceType, AcceleratorName,
    /// AcceleratorCount, vCPUs, MemoryGiB, Price; optional SpotPrice, NetworkGbps,
    /// GpuLinkGBps, StorageMBps, Provider, Region). Default: the shipped catalog.
    #[arg(long, value_name = "FILE")]
    pub catalog: Option<PathBuf>,
    /// The catalog row the profile was measured on (default: matched by CPUs and GPUs).
    #[arg(long, value_name = "TYPE")]
    pub current: Option<String>,
    /// Node counts to consider, e.g. 1,2,4 (default: the measured count).
    #[arg(long, value_delimiter = ',', value_name = "N")]
    pub nodes: Vec<u32>,
    /// Nodes the profile was measured on, over what the profile tells (the ranks'
    /// world_size / local_world_size, else the hosts); said where it contradicts the profile.
    #[arg(long, value_name = "N")]
    pub measured_nodes: Option<u32>,
    /// Samples to train on, over all ranks.
    #[arg(long, value_name = "N", conflicts_with = "iterations", value_parser = crate::cli::positive_number)]
    pub train_samples: Option<f64>,
    /// Iterations to train.
    #[arg(long, value_name = "N", value_parser = crate::cli::positive_number)]
    pub iterations: Option<f64>,
    /// Longest acceptable time to train, hours.
    #[arg(long, value_name = "H", value_parser = crate::cli::positive_number)]
    pub budget_hours: Option<f64>,
    /// Price at spot rates (rows without a spot price are left out).
    #[arg(long)]
    pub spot: bool,
    /// Iterations per rank left out as warm-up.
    #[arg(long, default_value_t = 1)]
    pub warmup: u32,
    /// Also write the advice as JSON (schema stallscope.advice/1).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// Arguments of `stallscope report`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// The profile to report: a run's (`stallscope run -o`), a collector's job profile, or an
    /// experiment's; or several run profiles of one job (one per node), joined as the
    /// collector would join them.
    #[arg(required_unless_present = "compare", value_name = "PROFILE")]
    pub profiles: Vec<PathBuf>,
    /// The result of `stallscope experiment` for this job: its stalls by difference and
    /// what-if chart beside the online ones.
    #[arg(long, value_name = "EXP")]
    pub experiment: Option<PathBuf>,
    /// Two profiles side by side: what changed per category, per rank and in iteration time.
    #[arg(long, num_args = 2, value_names = ["BEFORE", "AFTER"], conflicts_with_all = ["profiles", "experiment"])]
    pub compare: Vec<PathBuf>,
    /// Where to write the report; the format follows the extension: .html (self-contained,
    /// no script, prints to PDF), .md (SVG charts written beside it), .json.
    #[arg(short = 'o', long, default_value = "report.html", value_name = "FILE")]
    pub output: PathBuf,
    /// Instance catalog CSV for the advisor's section (as `stallscope advise --catalog`).
    #[arg(long, value_name = "FILE")]
    pub catalog: Option<PathBuf>,
    /// The catalog row the profile was measured on (as `stallscope advise --current`).
    #[arg(long, value_name = "TYPE")]
    pub current: Option<String>,
    /// Leave the advisor's section out.
    #[arg(long)]
    pub no_advice: bool,
}

/// Arguments of `stallscope report-bench`.
#[derive(Debug, Args)]
pub struct ReportBenchArgs {
    /// Hours of training in the profile.
    #[arg(long, default_value_t = 24.0)]
    pub hours: f64,
    /// Nodes of the job.
    #[arg(long, default_value_t = 8)]
    pub nodes: usize,
    /// Ranks (GPUs) per node.
    #[arg(long, default_value_t = 8)]
    pub ranks_per_node: usize,
    /// ms, one iteration.
    #[arg(long, default_value_t = 500)]
    pub iteration_ms: u64,
    /// Where to write the profile and the report (default: a fresh temporary folder,
    /// removed at the end).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// The report's format, by extension.
    #[arg(long, default_value = "html")]
    pub format: String,
}

/// `stallscope top`'s arguments.
#[derive(Debug, Args)]
pub struct TopArgs {
    /// A profile to replay (`stallscope run`'s, a collector's job profile) with a time cursor.
    pub profile: Option<PathBuf>,
    /// The feed socket of a given run or agent (default: the newest of this user's).
    #[arg(long, value_name = "SOCKET", conflicts_with_all = ["profile", "collector"])]
    pub attach: Option<PathBuf>,
    /// The whole job: a collector's HOST:PORT.
    #[arg(long, value_name = "HOST:PORT", conflicts_with = "profile")]
    pub collector: Option<String>,
    /// With --collector: the job's token file.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// With --collector: TLS to a collector started with --tls-cert.
    #[command(flatten)]
    pub tls: TlsClientArgs,
    /// Redraws per second at most (above 0, at most 60).
    #[arg(long, default_value_t = 4.0, value_parser = frames_per_second)]
    pub fps: f64,
}

/// A number of seconds given on the command line: finite, above 0, at most a day (86,400 s).
/// `inf` or `1e300` used to panic where the value became a `Duration`.
pub fn seconds_up_to_a_day(text: &str) -> Result<f64, String> {
    number_within(text, 0.0, 86_400.0, "seconds")
}

/// Redraws per second: finite, above 0, at most 60.
pub fn frames_per_second(text: &str) -> Result<f64, String> {
    number_within(text, 0.0, 60.0, "redraws per second")
}

/// A count or a duration that must be a number above 0 and at most 10^15 (`--train-samples`,
/// `--iterations`, `--budget-hours`): larger ones only overflow the costs to infinity.
pub fn positive_number(text: &str) -> Result<f64, String> {
    number_within(text, 0.0, 1e15, "the number")
}

/// `text` as a finite number in `(above, at_most]`, or an error saying what is expected.
fn number_within(text: &str, above: f64, at_most: f64, what: &str) -> Result<f64, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))?;
    if value.is_finite() && value > above && value <= at_most {
        Ok(value)
    } else {
        Err(format!(
            "{text} is out of range: {what} must be above {above} and at most {at_most}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_that_would_panic_as_durations_are_refused_with_a_reason() {
        for bad in ["inf", "1e300", "nan", "-1", "0", "NaN", "x"] {
            let err = seconds_up_to_a_day(bad).unwrap_err();
            assert!(!err.is_empty(), "{bad}");
            assert!(frames_per_second(bad).is_err(), "{bad}");
            assert!(positive_number(bad).is_err(), "{bad}");
        }
        assert_eq!(seconds_up_to_a_day("2.5"), Ok(2.5));
        assert_eq!(frames_per_second("4"), Ok(4.0));
        assert!(frames_per_second("61").unwrap_err().contains("at most 60"));
        assert_eq!(positive_number("1e6"), Ok(1e6));
    }
}
