//! `stallscope`: the command line that composes the agent, the analysis and the views.

/// mimalloc instead of glibc's allocator: the report and the collector decode and join
/// millions of small records, and glibc's malloc and free took a third of their time.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod advise_cmd;
mod agent_cmd;
mod child;
mod cli;
mod collector_bench;
mod collector_cmd;
mod doctor;
mod experiment;
mod feed_cmd;
mod forward;
mod launch;
mod limits;
mod nvml_bench;
mod python_env;
mod report_bench;
mod report_cmd;
mod run;
mod summary_cmd;
mod terminal;
mod top;
mod trace_cmd;

use clap::Parser;

fn main() {
    limits::raise_open_files();
    let cli = cli::Cli::parse();
    let result = match cli.command {
        cli::Command::Run(args) => run::run(args),
        cli::Command::Summary(args) => summary_cmd::summary(args),
        cli::Command::Trace(args) => trace_cmd::trace(args),
        cli::Command::Feed(args) => feed_cmd::feed(args),
        cli::Command::Top(args) => top::top(args),
        cli::Command::Experiment(args) => experiment::experiment(args),
        cli::Command::Advise(args) => advise_cmd::advise(args),
        cli::Command::Report(args) => report_cmd::report(args),
        cli::Command::ReportBench(args) => report_bench::report_bench(args),
        cli::Command::Launch(args) => launch::launch(args),
        cli::Command::Doctor(args) => doctor::doctor(args),
        cli::Command::NvmlBench(args) => nvml_bench::nvml_bench(args),
        cli::Command::Agent(args) => agent_cmd::agent(args),
        cli::Command::Collector(args) => collector_cmd::collector(args),
        cli::Command::ForwardOutput => forward::forward_output(),
        cli::Command::CacheEvict(args) => experiment::nodes::cache_evict(args),
        cli::Command::CollectorBench(args) => collector_bench::collector_bench(args),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("stallscope: error: {e:#}");
            std::process::exit(2);
        }
    }
}
