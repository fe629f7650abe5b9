//! The node's core, composed: the recorder (events → frames → the journal → the live model),
//! the NVML thread, what an agent ships per attributed iteration, and the live feed.
//!
//! `stallscope run` and `stallscope agent` are both built from these; the binary keeps only
//! its arguments, the training's child process and the terminal.

pub mod feed;
pub mod feed_client;
pub mod gpu_thread;
pub mod recorder;
pub mod sample_merge;
pub mod shipping;
pub mod stacks;
pub mod sweep;

#[cfg(test)]
mod tests;

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use stallscope_analysis::frame::RunHeader;

use crate::clock::monotonic_ns;
use crate::sampler::{self, MarkerNews, Pids, SamplerConfig, SamplerHandle, SharedPids};
use crate::sources::Roots;
use recorder::Inbox;

/// The name of an agent's marker socket in its runtime directory ([`runtime_dir`]); the
/// marker package looks for it in the same places.
pub const AGENT_SOCKET_NAME: &str = "agent.sock";

/// Where a root agent's marker socket is: every user's training may reach it.
pub const ROOT_AGENT_SOCKET: &str = "/run/stallscope/agent.sock";

/// The socket an agent binds: `given`, `$STALLSCOPE_SOCKET`, or `agent.sock` in the runtime
/// directory, which [`runtime_dir`] creates and checks (made reachable by other users for a
/// root agent, which serves them all).
pub fn agent_socket(given: Option<&Path>) -> std::io::Result<PathBuf> {
    if let Some(p) = given
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("STALLSCOPE_SOCKET").map(PathBuf::from))
    {
        return Ok(p);
    }
    // SAFETY: getuid cannot fail.
    let shared = unsafe { libc::getuid() } == 0;
    Ok(runtime_dir(shared)?.join(AGENT_SOCKET_NAME))
}

/// The node agent a run or the marker package should send to: `$STALLSCOPE_SOCKET`, else a
/// root agent's socket, else this user's own agent's; each default only where its directory
/// is one that nobody but root or this user can have put a socket in ([`trusted_dir`]). A
/// socket another user planted is never joined.
pub fn agent_candidates() -> Vec<PathBuf> {
    if let Some(p) = std::env::var_os("STALLSCOPE_SOCKET") {
        return vec![PathBuf::from(p)];
    }
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let mut out = vec![PathBuf::from(ROOT_AGENT_SOCKET)];
    let own = runtime_dir_path(uid).join(AGENT_SOCKET_NAME);
    if !out.contains(&own) {
        out.push(own);
    }
    out.retain(|p| p.parent().is_some_and(|d| trusted_dir(d, uid)));
    out
}

/// Whether `dir` (not followed if a link) is a directory owned by root or `uid` that no other
/// user may write in, and so holds only what root or `uid` put there.
pub fn trusted_dir(dir: &Path, uid: u32) -> bool {
    std::fs::symlink_metadata(dir).is_ok_and(|m| {
        m.file_type().is_dir()
            && (m.uid() == 0 || m.uid() == uid)
            && m.permissions().mode() & 0o022 == 0
    })
}

/// The node's host name (`/proc/sys/kernel/hostname`), empty when unreadable.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The run header of a recorder started now.
pub fn header(command: &[String], rate_hz: f64, warmup_iters: u32) -> RunHeader {
    RunHeader {
        stallscope_version: env!("CARGO_PKG_VERSION").to_string(),
        host: host_name(),
        command: command.to_vec(),
        started_unix_ns: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0),
        started_mono_ns: monotonic_ns(),
        rate_hz,
        warmup_iters,
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
    }
}

/// The one check of a sampling rate, Hz: above 0, at most 10 kHz.
pub fn check_rate(rate_hz: f64) -> Result<(), String> {
    if rate_hz > 0.0 && rate_hz <= 10_000.0 {
        Ok(())
    } else {
        Err(format!(
            "--rate must be between 0 and 10000 Hz, not {rate_hz}"
        ))
    }
}

/// Where the GPU readings come from.
pub enum GpuInput {
    /// The NVIDIA driver's NVML, when it loads (said once when not).
    Nvml,
    /// A given backend: tests pass the scripted GPU.
    Backend(Box<dyn crate::gpu::backend::GpuBackend>),
    /// No GPU sources.
    None,
}

/// Everything the node reads from the operating system, in one place (bandwhich's pattern):
/// `/proc` and `/sys` under `roots`, and the GPU. `stallscope run` and `agent` pass the
/// machine's own; tests pass captured text and the scripted GPU, and run the whole node
/// in-process.
pub struct NodeInputs {
    /// Where `/proc` and `/sys` are.
    pub roots: Roots,
    /// The GPU.
    pub gpu: GpuInput,
}

impl NodeInputs {
    /// The machine's `/proc`, `/sys` under `roots`, and NVML.
    pub fn machine(roots: Roots) -> NodeInputs {
        NodeInputs {
            roots,
            gpu: GpuInput::Nvml,
        }
    }
}

/// The node's samplers: the CPU one (the sources under `roots`, discovering the job's
/// processes) and, with a GPU, the GPU thread following the pids it finds.
pub struct Samplers {
    cpu: SamplerHandle,
    gpu: Option<SamplerHandle>,
    /// What the NVML thread reads, when it runs.
    pub gpu_described: Option<String>,
    /// Why there is no NVML thread, when NVML was asked for and did not load ("no NVIDIA
    /// driver found (…)"): for the caller to say, or not under `run -q`.
    pub gpu_missing: Option<String>,
}

impl Samplers {
    /// Starts both at `rate_hz` into `inbox`, reading `inputs`, rooted at `root_pid` (0: none,
    /// the agent's case) plus `extra_roots`, told by `news` which processes run training loops
    /// and when to discover again at once.
    pub fn start(
        rate_hz: f64,
        inputs: NodeInputs,
        root_pid: u32,
        extra_roots: Option<sampler::ExtraRoots>,
        news: MarkerNews,
        inbox: &Inbox,
    ) -> Samplers {
        let pids = SharedPids::default();
        let config = SamplerConfig {
            rate_hz,
            roots: inputs.roots,
            pids: Pids::DiscoverAndPublish(pids.clone()),
            extra_roots,
            loops: Some(news.loops),
            discover_now: Some(news.discover_now),
            ..SamplerConfig::new(root_pid)
        };
        let cpu = sampler::spawn(
            config.clone(),
            sampler::default_sources(&config.roots),
            inbox.clone(),
        );
        let spawned = match inputs.gpu {
            GpuInput::Nvml => Some(gpu_thread::spawn_gpu(&config, pids, inbox.gpu())),
            GpuInput::Backend(b) => {
                Some(Ok(gpu_thread::spawn_backend(&config, pids, b, inbox.gpu())))
            }
            GpuInput::None => None,
        };
        let (gpu, gpu_described, gpu_missing) = match spawned {
            Some(Ok((h, what))) => (Some(h), Some(what), None),
            Some(Err(why)) => (None, None, Some(why)),
            None => (None, None, None),
        };
        Samplers {
            cpu,
            gpu,
            gpu_described,
            gpu_missing,
        }
    }

    /// Stops both.
    pub fn stop(self) {
        self.cpu.stop();
        if let Some(g) = self.gpu {
            g.stop();
        }
    }
}

/// The directory for this user's feed sockets (owner-only, see [`runtime_dir`]).
pub fn feed_dir() -> std::io::Result<PathBuf> {
    runtime_dir(false)
}

/// This user's runtime directory: `/run/stallscope` for root, `$XDG_RUNTIME_DIR/stallscope`
/// otherwise, or `/tmp/stallscope-UID`.
fn runtime_dir_path(uid: u32) -> PathBuf {
    if uid == 0 {
        PathBuf::from("/run/stallscope")
    } else if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR").filter(|x| !x.is_empty()) {
        PathBuf::from(x).join("stallscope")
    } else {
        std::env::temp_dir().join(format!("stallscope-{uid}"))
    }
}

/// This user's runtime directory ([`runtime_dir_path`]), created owner-only (`shared`: also
/// searchable by others, for a root agent's socket) and refused when it is a symbolic link,
/// belongs to another user, or others may write in it. Since nobody else can create, remove
/// or rename anything in it, a socket's mode set by path right after bind cannot be raced.
pub fn runtime_dir(shared: bool) -> std::io::Result<PathBuf> {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let dir = runtime_dir_path(uid);
    checked_dir(&dir, uid, shared)?;
    Ok(dir)
}

/// Creates `dir` (mode 0700, or 0755 when `shared`) unless it exists, then checks it as
/// [`runtime_dir`] says.
fn checked_dir(dir: &Path, uid: u32, shared: bool) -> std::io::Result<()> {
    let mode = if shared { 0o755 } else { 0o700 };
    match std::fs::DirBuilder::new().mode(mode).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    let refuse = |why: &str| {
        Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("{} {why}", dir.display()),
        ))
    };
    if !meta.file_type().is_dir() {
        return refuse("is not a directory (a symbolic link?)");
    }
    if meta.uid() != uid {
        return refuse(&format!("belongs to uid {}, not {uid}", meta.uid()));
    }
    if meta.permissions().mode() & 0o022 != 0 {
        return refuse("can be written by other users");
    }
    if shared && meta.permissions().mode() & 0o055 != 0o055 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(())
}

#[cfg(test)]
mod runtime_dir_tests {
    use super::*;

    /// Issue 17, item 1: a runtime directory another user could have prepared is refused, in
    /// words; a trusted one is used (made searchable by others only for a shared agent).
    #[test]
    fn a_runtime_directory_another_user_could_control_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;

        let fresh = tmp.path().join("fresh");
        checked_dir(&fresh, uid, false).unwrap();
        assert_eq!(mode(&fresh), 0o700);
        assert!(trusted_dir(&fresh, uid));
        checked_dir(&fresh, uid, true).unwrap();
        assert_eq!(
            mode(&fresh),
            0o755,
            "a shared agent's: searchable by others"
        );

        let open = tmp.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = checked_dir(&open, uid, false).unwrap_err();
        assert!(
            e.to_string().contains("can be written by other users"),
            "{e}"
        );
        assert!(!trusted_dir(&open, uid));

        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&fresh, &link).unwrap();
        let e = checked_dir(&link, uid, false).unwrap_err();
        assert!(e.to_string().contains("not a directory"), "{e}");
        assert!(!trusted_dir(&link, uid));

        if uid == 0 {
            let theirs = tmp.path().join("theirs");
            std::fs::create_dir(&theirs).unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            let e = checked_dir(&theirs, uid, false).unwrap_err();
            assert!(e.to_string().contains("belongs to uid 65534"), "{e}");
            assert!(!trusted_dir(&theirs, uid));
        }
    }
}
