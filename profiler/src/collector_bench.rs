//! `stallscope collector-bench` (hidden): load on one collector from many simulated agents.
pub fn bench(_args: crate::cli::CollectorBenchArgs) -> anyhow::Result<i32> {
    anyhow::bail!("not yet")
}
