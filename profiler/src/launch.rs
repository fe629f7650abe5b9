//! `stallscope launch`: starts the processes of a data-parallel job with the environment
//! torchrun gives them (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR`, …), on this node
//! or, through a command prefix such as `ip netns exec {node}` or `ssh {node} env {env}`, on
//! several.
//!
//! `stallscope experiment` runs every configuration through it, so the user's command is the
//! same in all of them and needs no launcher of its own. It is also a small torchrun for
//! machines where torchrun is missing or broken. When one process fails, the others are ended
//! (a data-parallel job cannot go on without it) and the failure's exit code is returned.

use std::net::TcpListener;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::child::exit_code;
use crate::cli::LaunchArgs;

/// How long the other processes get after SIGTERM, when one has failed, before SIGKILL.
const FAILURE_GRACE: Duration = Duration::from_secs(10);

/// One process to start: where, and with what environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Node index (0 for a single node).
    pub node_rank: u32,
    /// Global rank.
    pub rank: u32,
    /// Rank on its node.
    pub local_rank: u32,
    /// The environment the process gets, torchrun's names.
    pub env: Vec<(String, String)>,
    /// The full command line, prefix included.
    pub argv: Vec<String>,
}

/// A free TCP port on this machine for the rendezvous.
fn free_port() -> anyhow::Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("cannot find a free port")?;
    Ok(l.local_addr()?.port())
}

/// What `{env}` carries besides torchrun's variables, from this process's environment: the
/// hook's `PYTHONPATH` and every `STALLSCOPE_*` setting (the marker socket, synthetic data, the
/// iteration limit an experiment sets), so that a rank started through ssh runs as a local
/// one does. Local ranks inherit them anyway.
pub fn forwarded_env() -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| {
            k == "PYTHONPATH" || k == "PYTHONUNBUFFERED" || k.starts_with("STALLSCOPE_")
        })
        .collect();
    out.sort();
    out
}

/// `value` as one word of a remote shell's command line (ssh joins its arguments with spaces
/// and hands them to the remote shell): as it is when it holds only characters no shell
/// treats specially, else single-quoted.
pub(crate) fn shell_word(value: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./:,=@%+".contains(c);
    if !value.is_empty() && value.chars().all(plain) {
        value.to_string()
    } else {
        format!("'{}'", value.replace('\'', "'\\''"))
    }
}

/// The command line that runs `argv` on `node` (number `node_rank` of `nnodes`) through the
/// prefix `template`, as a rank is started there but with no torchrun variables (`{env}`
/// carries only the forwarded ones; `{rank}` and `{local_rank}` are 0). Through `ssh` the
/// words of `argv` are quoted for the remote shell.
pub fn on_node(
    template: &str,
    node: &str,
    node_rank: u32,
    nnodes: usize,
    argv: &[String],
) -> Vec<String> {
    let p = Placement {
        node_rank,
        rank: 0,
        local_rank: 0,
        env: Vec::new(),
        argv: Vec::new(),
    };
    let through_shell = template.split_whitespace().next() == Some("ssh");
    let mut out = expand(template, node, &p, nnodes, &forwarded_env());
    out.extend(argv.iter().map(|w| {
        if through_shell {
            shell_word(w)
        } else {
            w.clone()
        }
    }));
    out
}

/// Expands the prefix template for one process: `{node}`, `{node_rank}`, `{nnodes}`,
/// `{rank}`, `{local_rank}` in any word, and a word `{env}` into one `KEY=VALUE` word per
/// variable, torchrun's and `forwarded`'s (for launchers such as ssh that do not pass the
/// environment on; through `ssh` each value is quoted for the remote shell).
fn expand(
    template: &str,
    node: &str,
    p: &Placement,
    nnodes: usize,
    forwarded: &[(String, String)],
) -> Vec<String> {
    let through_shell = template.split_whitespace().next() == Some("ssh");
    let mut out = Vec::new();
    for word in template.split_whitespace() {
        if word == "{env}" {
            let torchrun = p.env.iter().map(|(k, v)| (k.as_str(), v.as_str()));
            let extra = forwarded
                .iter()
                .filter(|(k, _)| !p.env.iter().any(|(e, _)| e == k))
                .map(|(k, v)| (k.as_str(), v.as_str()));
            out.extend(torchrun.chain(extra).map(|(k, v)| {
                if through_shell {
                    format!("{k}={}", shell_word(v))
                } else {
                    format!("{k}={v}")
                }
            }));
            continue;
        }
        out.push(
            word.replace("{node}", node)
                .replace("{node_rank}", &p.node_rank.to_string())
                .replace("{nnodes}", &nnodes.to_string())
                .replace("{rank}", &p.rank.to_string())
                .replace("{local_rank}", &p.local_rank.to_string()),
        );
    }
    out
}

/// Where every process goes, with its environment and command line; `forwarded` is what
/// `{env}` carries besides torchrun's variables ([`forwarded_env`]).
pub fn plan(
    args: &LaunchArgs,
    master_port: u16,
    forwarded: &[(String, String)],
) -> anyhow::Result<Vec<Placement>> {
    if args.nproc_per_node == 0 {
        bail!("--nproc-per-node must be at least 1");
    }
    if args.command.is_empty() {
        bail!("no command to launch");
    }
    let nodes: Vec<String> = if args.nodes.is_empty() {
        vec![String::new()]
    } else {
        args.nodes.clone()
    };
    if nodes.len() > 1 && args.node_launch.trim().is_empty() {
        bail!("--nodes needs --node-launch, the command prefix that runs a process on a node (e.g. 'ip netns exec {{node}}' or 'ssh {{node}} env {{env}}')");
    }
    let master_addr = match (&args.master_addr, nodes.len()) {
        (Some(a), _) => a.clone(),
        (None, 1) => "127.0.0.1".to_string(),
        (None, _) => bail!("--nodes needs --master-addr, the address of the first node"),
    };
    let world = args.nproc_per_node * nodes.len() as u32;
    let mut out = Vec::new();
    for (node_rank, node) in nodes.iter().enumerate() {
        for local_rank in 0..args.nproc_per_node {
            let rank = node_rank as u32 * args.nproc_per_node + local_rank;
            let env: Vec<(String, String)> = [
                ("RANK", rank.to_string()),
                ("LOCAL_RANK", local_rank.to_string()),
                ("WORLD_SIZE", world.to_string()),
                ("LOCAL_WORLD_SIZE", args.nproc_per_node.to_string()),
                ("GROUP_RANK", node_rank.to_string()),
                ("NODE_RANK", node_rank.to_string()),
                ("MASTER_ADDR", master_addr.clone()),
                ("MASTER_PORT", master_port.to_string()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
            let mut p = Placement {
                node_rank: node_rank as u32,
                rank,
                local_rank,
                env,
                argv: Vec::new(),
            };
            p.argv = expand(&args.node_launch, node, &p, nodes.len(), forwarded);
            p.argv.extend(args.command.iter().cloned());
            out.push(p);
        }
    }
    Ok(out)
}

fn terminate(children: &mut [(Placement, Child)], signal: i32) {
    for (_, c) in children.iter_mut() {
        if matches!(c.try_wait(), Ok(None)) {
            // SAFETY: signalling a child we started and have not reaped.
            unsafe { libc::kill(c.id() as i32, signal) };
        }
    }
}

/// Starts the processes, waits for all, and returns the exit code: 0, or the first failure's.
pub fn launch(args: LaunchArgs) -> anyhow::Result<i32> {
    let port = match args.master_port {
        Some(p) => p,
        None => free_port()?,
    };
    let placements = plan(&args, port, &forwarded_env())?;
    let mut children: Vec<(Placement, Child)> = Vec::new();
    for p in placements {
        let mut command = Command::new(&p.argv[0]);
        command.args(&p.argv[1..]).envs(p.env.iter().cloned());
        match command.spawn() {
            Ok(child) => children.push((p, child)),
            Err(e) => {
                terminate(&mut children, libc::SIGTERM);
                for (_, c) in children.iter_mut() {
                    let _ = c.wait();
                }
                return Err(e).with_context(|| format!("cannot start {:?}", p.argv[0]));
            }
        }
    }
    let mut failure: Option<(u32, i32)> = None;
    let mut failed_at: Option<Instant> = None;
    loop {
        let mut running = 0;
        for (p, c) in children.iter_mut() {
            match c.try_wait() {
                Ok(Some(status)) => {
                    let code = exit_code(&status);
                    if code != 0 && failure.is_none() {
                        failure = Some((p.rank, code));
                    }
                }
                Ok(None) => running += 1,
                Err(_) => {}
            }
        }
        if running == 0 {
            break;
        }
        match (failure, failed_at) {
            (Some((rank, code)), None) => {
                eprintln!(
                    "stallscope launch: rank {rank} exited with {code}; ending the other ranks"
                );
                terminate(&mut children, libc::SIGTERM);
                failed_at = Some(Instant::now());
            }
            (Some(_), Some(at)) if at.elapsed() > FAILURE_GRACE => {
                terminate(&mut children, libc::SIGKILL);
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(failure.map_or(0, |(_, code)| code))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(nodes: &[&str], template: &str) -> LaunchArgs {
        LaunchArgs {
            nproc_per_node: 2,
            nodes: nodes.iter().map(|s| s.to_string()).collect(),
            node_launch: template.to_string(),
            master_addr: (!nodes.is_empty()).then(|| "10.0.0.1".to_string()),
            master_port: None,
            command: vec!["python3".into(), "train.py".into()],
        }
    }

    fn env<'a>(p: &'a Placement, key: &str) -> &'a str {
        &p.env.iter().find(|(k, _)| k == key).unwrap().1
    }

    #[test]
    fn one_node_gets_torchrun_environment() {
        let p = plan(&args(&[], ""), 29500, &[]).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[1].argv, vec!["python3", "train.py"]);
        assert_eq!(env(&p[1], "RANK"), "1");
        assert_eq!(env(&p[1], "LOCAL_RANK"), "1");
        assert_eq!(env(&p[1], "WORLD_SIZE"), "2");
        assert_eq!(env(&p[0], "MASTER_ADDR"), "127.0.0.1");
        assert_eq!(env(&p[0], "MASTER_PORT"), "29500");
    }

    #[test]
    fn nodes_get_ranks_in_order_and_an_expanded_prefix() {
        let p = plan(&args(&["nsa", "nsb"], "ssh {node} env {env}"), 1234, &[]).unwrap();
        assert_eq!(p.len(), 4);
        assert_eq!(env(&p[3], "RANK"), "3");
        assert_eq!(env(&p[3], "LOCAL_RANK"), "1");
        assert_eq!(env(&p[3], "NODE_RANK"), "1");
        assert_eq!(env(&p[3], "WORLD_SIZE"), "4");
        assert_eq!(p[3].argv[0..3], ["ssh", "nsb", "env"]);
        assert!(p[3].argv.contains(&"RANK=3".to_string()));
        assert!(p[3].argv.contains(&"MASTER_ADDR=10.0.0.1".to_string()));
        assert_eq!(p[3].argv.last().unwrap(), "train.py");
    }

    /// Issue 17, item 11: a rank started through ssh gets the hook's path and every
    /// stallscope setting, quoted for the remote shell; a launcher without a shell gets them
    /// as they are.
    #[test]
    fn env_carries_the_hook_and_stallscope_settings_to_remote_ranks() {
        let forwarded = vec![
            (
                "PYTHONPATH".to_string(),
                "/tmp/ss run/site:/tmp/ss run/pkg".to_string(),
            ),
            ("STALLSCOPE_MAX_ITERS".to_string(), "20".to_string()),
            (
                "STALLSCOPE_SOCKET".to_string(),
                "/tmp/ss/markers.sock".to_string(),
            ),
            ("STALLSCOPE_SYNTHETIC".to_string(), "it's".to_string()),
        ];
        let p = plan(&args(&["a", "b"], "ssh {node} env {env}"), 1, &forwarded).unwrap();
        let argv = &p[2].argv;
        assert!(argv.contains(&"RANK=2".to_string()));
        assert!(
            argv.contains(&"PYTHONPATH='/tmp/ss run/site:/tmp/ss run/pkg'".to_string()),
            "{argv:?}"
        );
        assert!(argv.contains(&"STALLSCOPE_MAX_ITERS=20".to_string()));
        assert!(argv.contains(&"STALLSCOPE_SOCKET=/tmp/ss/markers.sock".to_string()));
        assert!(
            argv.contains(&"STALLSCOPE_SYNTHETIC='it'\\''s'".to_string()),
            "{argv:?}"
        );
        // Through `sh -c`, as the remote side would, the words come back as they were.
        let line = argv[3..argv.len() - 2].join(" ");
        let out = std::process::Command::new("sh")
            .args(["-c", &format!("env -i {line} env")])
            .output()
            .unwrap();
        let env = String::from_utf8_lossy(&out.stdout);
        assert!(
            env.contains("PYTHONPATH=/tmp/ss run/site:/tmp/ss run/pkg\n"),
            "{env}"
        );
        assert!(env.contains("STALLSCOPE_SYNTHETIC=it's\n"), "{env}");
        let p = plan(
            &args(&["a", "b"], "ip netns exec {node} env {env}"),
            1,
            &forwarded,
        )
        .unwrap();
        assert!(p[2]
            .argv
            .contains(&"PYTHONPATH=/tmp/ss run/site:/tmp/ss run/pkg".to_string()));
    }

    #[test]
    fn a_command_on_a_node_goes_through_the_prefix() {
        let argv = vec!["/opt/stall scope".to_string(), "cache-evict".to_string()];
        let ns = on_node("ip netns exec {node}", "nsb", 1, 2, &argv);
        assert_eq!(
            ns,
            [
                "ip",
                "netns",
                "exec",
                "nsb",
                "/opt/stall scope",
                "cache-evict"
            ]
        );
        let ssh = on_node("ssh {node}", "hostb", 1, 2, &argv);
        assert_eq!(ssh, ["ssh", "hostb", "'/opt/stall scope'", "cache-evict"]);
    }

    #[test]
    fn several_nodes_need_a_prefix_and_an_address() {
        let e = plan(&args(&["a", "b"], ""), 1, &[]).unwrap_err();
        assert!(e.to_string().contains("--node-launch"), "{e}");
        let mut a = args(&["a", "b"], "ip netns exec {node}");
        a.master_addr = None;
        let e = plan(&a, 1, &[]).unwrap_err();
        assert!(e.to_string().contains("--master-addr"), "{e}");
    }
}
