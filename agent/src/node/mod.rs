//! The node's core, composed: the recorder (events → frames → the journal → the live model),
//! the NVML thread, what an agent ships per attributed iteration, and the live feed.
//!
//! `stallscope run` and `stallscope agent` are both built from these; the binary keeps only
//! its arguments, the training's child process and the terminal.

pub mod feed;
pub mod feed_client;
pub mod gpu_thread;
pub mod recorder;
pub mod report;

#[cfg(test)]
mod tests;

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use stallscope_analysis::frame::RunHeader;

use crate::clock::monotonic_ns;
use crate::sampler::{self, LoopPids, Pids, SamplerConfig, SamplerHandle, SharedPids};
use crate::sources::Roots;
use recorder::Inbox;

/// Where an agent receives markers when neither `--socket` nor `$STALLSCOPE_SOCKET` says
/// (the marker package falls back to the same path).
pub const AGENT_SOCKET: &str = "/tmp/stallscope/agent.sock";

/// The agent's marker socket: `given`, `$STALLSCOPE_SOCKET`, or [`AGENT_SOCKET`].
pub fn agent_socket(given: Option<&Path>) -> PathBuf {
    given
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("STALLSCOPE_SOCKET").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(AGENT_SOCKET))
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
}

impl Samplers {
    /// Starts both at `rate_hz` into `inbox`, reading `inputs`, rooted at `root_pid` (0: none,
    /// the agent's case) plus `extra_roots`, telling `loops` which processes run training
    /// loops.
    pub fn start(
        rate_hz: f64,
        inputs: NodeInputs,
        root_pid: u32,
        extra_roots: Option<sampler::ExtraRoots>,
        loops: LoopPids,
        inbox: &Inbox,
    ) -> Samplers {
        let pids = SharedPids::default();
        let config = SamplerConfig {
            rate_hz,
            roots: inputs.roots,
            pids: Pids::DiscoverAndPublish(pids.clone()),
            extra_roots,
            loops: Some(loops),
            ..SamplerConfig::new(root_pid)
        };
        let cpu = sampler::spawn(
            config.clone(),
            sampler::default_sources(&config.roots),
            inbox.clone(),
        );
        let spawned = match inputs.gpu {
            GpuInput::Nvml => gpu_thread::spawn_gpu(&config, pids, inbox.clone()),
            GpuInput::Backend(b) => {
                Some(gpu_thread::spawn_backend(&config, pids, b, inbox.clone()))
            }
            GpuInput::None => None,
        };
        let (gpu, gpu_described) = match spawned {
            Some((h, what)) => (Some(h), Some(what)),
            None => (None, None),
        };
        Samplers {
            cpu,
            gpu,
            gpu_described,
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

/// The directory for this user's feed sockets: `/run/stallscope` for root,
/// `$XDG_RUNTIME_DIR/stallscope` otherwise, or `/tmp/stallscope-UID`; created owner-only and
/// refused when it is a symbolic link, belongs to another user, or others may write in it.
pub fn feed_dir() -> std::io::Result<PathBuf> {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let dir = if uid == 0 {
        PathBuf::from("/run/stallscope")
    } else if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR").filter(|x| !x.is_empty()) {
        PathBuf::from(x).join("stallscope")
    } else {
        std::env::temp_dir().join(format!("stallscope-{uid}"))
    };
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(&dir)?;
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
    Ok(dir)
}
