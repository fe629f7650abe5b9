//! The page-cache step on every node of a spread run.
//!
//! R2 (cold cache) and R3 (warm) are facts only where the ranks read: with the processes spread
//! over `--nodes`, each node's page cache is emptied (and for R3 filled) by running the hidden
//! `stallscope cache-evict` there through the same `--node-launch` prefix that starts the
//! ranks, at the same path as this executable (the ranks already need the hook and the
//! dataset at the same paths). A node where that fails is said by name: the run goes on, but
//! it is not cold there.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::ValueEnum;

use super::cache::{ColdCache, Dataset};
use crate::cli::CacheEvictArgs;

/// How long one node's step may take (a cold read of a large dataset), s.
const NODE_STEP_LIMIT: Duration = Duration::from_secs(900);

/// `stallscope cache-evict`: empties the dataset from this node's page cache and, with
/// `--read`, reads it back; prints one line saying what it did.
pub fn cache_evict(args: CacheEvictArgs) -> anyhow::Result<i32> {
    let ds = Dataset::scan(&args.dataset_dir)?;
    let how = ds.evict(args.cold_cache)?;
    let mut line = format!("cache emptied ({how})");
    if args.read {
        let (bytes, secs) = ds.read_all()?;
        line.push_str(&format!(
            ", then the dataset read: {:.1} MB in {secs:.2} s",
            bytes as f64 / 1e6
        ));
    }
    line.push_str(&format!(
        "; {:.0}% of it cached now",
        ds.resident_fraction().unwrap_or(f64::NAN) * 100.0
    ));
    println!("{line}");
    Ok(0)
}

/// Runs the cache step on each of `nodes` through `template`, with `exe` as the stallscope
/// executable there; says on stderr what each node did, or why it could not. Returns the
/// nodes where it failed.
pub fn on_each_node(
    exe: &Path,
    template: &str,
    nodes: &[String],
    dataset_dir: &Path,
    how: ColdCache,
    read: bool,
) -> Vec<String> {
    let how = how
        .to_possible_value()
        .map_or_else(|| "drop".to_string(), |v| v.get_name().to_string());
    let mut argv = vec![
        exe.display().to_string(),
        "cache-evict".into(),
        "--dataset-dir".into(),
        dataset_dir.display().to_string(),
        "--cold-cache".into(),
        how,
    ];
    if read {
        argv.push("--read".into());
    }
    let mut failed = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let cmd = crate::launch::on_node(template, node, i as u32, nodes.len(), &argv);
        match run_bounded(&cmd, NODE_STEP_LIMIT) {
            Ok(said) => eprintln!("stallscope experiment: on {node}: {said}"),
            Err(e) => {
                eprintln!(
                    "stallscope experiment: the page cache could not be emptied on {node} ({e:#}): the run is not cold there"
                );
                failed.push(node.clone());
            }
        }
    }
    failed
}

/// Runs `cmd`, killing it after `limit`; its stdout's last line when it succeeds.
fn run_bounded(cmd: &[String], limit: Duration) -> anyhow::Result<String> {
    let (program, args) = cmd
        .split_first()
        .context("an empty --node-launch command")?;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {program}"))?;
    let started = Instant::now();
    loop {
        if child.try_wait()?.is_some() {
            break;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!("no answer within {} s", limit.as_secs());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output()?;
    let last = |bytes: &[u8]| {
        String::from_utf8_lossy(bytes)
            .lines()
            .last()
            .unwrap_or("")
            .trim()
            .to_string()
    };
    if out.status.success() {
        Ok(last(&out.stdout))
    } else {
        anyhow::bail!("{}: {}", out.status, last(&out.stderr))
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// A prefix that records which node it was asked for and what it ran, then runs it.
    fn logging_prefix(dir: &Path) -> (String, std::path::PathBuf) {
        let log = dir.join("nodes.log");
        let script = dir.join("on-node.sh");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\nnode=$1; shift\necho \"$node $*\" >> {}\nexec \"$@\"\n",
                log.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        (format!("{} {{node}}", script.display()), log)
    }

    /// Each node runs the cache step through the prefix, with the dataset, the way and the
    /// read; a node where it fails is named, and the others still run.
    #[test]
    fn every_node_runs_the_cache_step_through_its_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let (template, log) = logging_prefix(dir.path());
        let nodes = vec!["nsa".to_string(), "nsb".to_string()];
        let failed = on_each_node(
            Path::new("/bin/echo"),
            &template,
            &nodes,
            Path::new("/data/set"),
            ColdCache::Fadvise,
            true,
        );
        assert!(failed.is_empty(), "{failed:?}");
        let said = std::fs::read_to_string(&log).unwrap();
        let lines: Vec<&str> = said.lines().collect();
        assert_eq!(
            lines,
            [
                "nsa /bin/echo cache-evict --dataset-dir /data/set --cold-cache fadvise --read",
                "nsb /bin/echo cache-evict --dataset-dir /data/set --cold-cache fadvise --read",
            ]
        );
        let failed = on_each_node(
            Path::new("/bin/false"),
            &template,
            &nodes,
            Path::new("/data/set"),
            ColdCache::Drop,
            false,
        );
        assert_eq!(failed, nodes);
    }
}
