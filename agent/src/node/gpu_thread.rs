//! The NVML thread: the GPU sources on a sampler of their own, because NVML calls block.

use crate::gpu::backend::GpuBackend;
use crate::gpu::{self, nvml::NvmlBackend};
use crate::sampler::{self, Pids, SamplerConfig, SamplerEvent, SamplerHandle, SharedPids};
use crate::sink::Sink;

/// Starts the NVML thread at the CPU sampler's rate, following the pids it publishes.
/// With the thread comes what it reads ("NVML: 1 GPU(s): 0 NVIDIA H100 80GB HBM3"). Without
/// an NVIDIA driver, the reason, for the caller to say or not: the run goes on without GPU
/// sources (a CPU machine's `run -q` says nothing of it; `doctor` and the agent do).
pub fn spawn_gpu(
    config: &SamplerConfig,
    pids: SharedPids,
    sink: impl Sink<SamplerEvent>,
) -> Result<(SamplerHandle, String), String> {
    let backend = NvmlBackend::open().map_err(|e| e.to_string())?;
    Ok(spawn_backend(config, pids, Box::new(backend), sink))
}

/// Starts the GPU sources of `backend` on a sampler of their own, as [`spawn_gpu`] does for
/// NVML (tests pass the scripted GPU).
pub fn spawn_backend(
    config: &SamplerConfig,
    pids: SharedPids,
    backend: Box<dyn GpuBackend>,
    sink: impl Sink<SamplerEvent>,
) -> (SamplerHandle, String) {
    let (fast, slow) = gpu::sources(backend);
    let what = crate::sources::Source::describe(&fast);
    let config = SamplerConfig {
        pids: Pids::Follow(pids),
        thread_name: "stallscope-nvml".into(),
        ..config.clone()
    };
    let handle = sampler::spawn(config, vec![Box::new(fast), Box::new(slow)], sink);
    (handle, what)
}
