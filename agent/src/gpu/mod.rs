//! GPUs through NVML: PCIe and NVLink bytes, power, clocks, utilisation.
//!
//! NVML calls block (some for milliseconds), so the GPU sources never share the CPU sampler's
//! thread: `stallscope run` gives them a sampler of their own ([`crate::sampler::spawn`] with
//! only these two sources), which ticks at `--rate` for the fast tier and every 100 ms for the
//! slow one, sends through the same sink, and follows the job's pids from the CPU sampler
//! rather than scanning /proc again. Device handles are opened and capabilities probed once;
//! a reading a device does not support is never asked for again and never reported as 0.
//!
//! The NVML library is loaded at run time: on a machine without the NVIDIA driver
//! [`nvml::NvmlBackend::open`] says so once and the run goes on without GPU sources.

use std::sync::{Arc, Mutex};

use stallscope_analysis::series::{
    names, SeriesId, SeriesKind, LABEL_GPU, LABEL_MODEL, LABEL_UUID,
};

use crate::sources::{Registry, Source, SourceError, Tier, Watched};

pub mod backend;
pub mod fake;
pub mod nvml;

use backend::{Capabilities, DeviceInfo, GpuBackend, GpuError, Metric};

/// The backend and what is known of each device, shared by the fast and the slow source
/// (both run on the one GPU thread; the lock is never contended).
struct GpuState {
    backend: Box<dyn GpuBackend>,
    devices: Vec<DeviceState>,
}

struct DeviceState {
    info: DeviceInfo,
    caps: Capabilities,
    /// Series ids of the fast tier, for the registry with this token.
    fast_ids: Option<(u64, [SeriesId; 10])>,
}

/// Opens the sources over `backend`: probes every device once and returns the fast and the
/// slow source, to be run together on one thread.
pub fn sources(mut backend: Box<dyn GpuBackend>) -> (GpuFastSource, GpuSlowSource) {
    let devices = (0..backend.devices().len())
        .map(|i| DeviceState {
            info: backend.devices()[i].clone(),
            caps: backend.probe(i),
            fast_ids: None,
        })
        .collect();
    let state = Arc::new(Mutex::new(GpuState { backend, devices }));
    (
        GpuFastSource {
            state: state.clone(),
        },
        GpuSlowSource { state },
    )
}

/// Probes every device of `backend`: what `stallscope doctor` shows.
pub fn probe_all(backend: &mut dyn GpuBackend) -> Vec<(DeviceInfo, Capabilities)> {
    (0..backend.devices().len())
        .map(|i| (backend.devices()[i].clone(), backend.probe(i)))
        .collect()
}

/// The labels of every series of a device: its index, UUID and (when NVML named it) its
/// product name, which views show next to its figures.
fn labels(info: &DeviceInfo) -> Vec<(&'static str, String)> {
    let mut labels = vec![
        (LABEL_GPU, info.index.to_string()),
        (LABEL_UUID, info.uuid.clone()),
    ];
    if !info.name.is_empty() {
        labels.push((LABEL_MODEL, info.name.clone()));
    }
    labels
}

fn declare(
    out: &mut Registry,
    info: &DeviceInfo,
    name: &str,
    unit: &str,
    kind: SeriesKind,
) -> SeriesId {
    let labels = labels(info);
    let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
    out.series(name, unit, kind, &labels)
}

fn failed(e: GpuError) -> SourceError {
    match e {
        GpuError::NoDriver(_) => SourceError::Unsupported(e.to_string()),
        GpuError::Call { .. } => SourceError::Call(e.to_string()),
    }
}

/// Fast tier: PCIe and NVLink byte counters, power, energy, clocks, throttle reasons and
/// memory used, every tick.
pub struct GpuFastSource {
    state: Arc<Mutex<GpuState>>,
}

impl Source for GpuFastSource {
    fn name(&self) -> &'static str {
        "gpu"
    }

    fn tier(&self) -> Tier {
        Tier::Fast
    }

    fn describe(&self) -> String {
        let state = self
            .state
            .lock()
            .expect("the GPU thread does not panic holding it");
        let names: Vec<String> = state
            .devices
            .iter()
            .map(|d| format!("{} {}", d.info.index, d.info.name))
            .collect();
        format!("NVML: {} GPU(s): {}", names.len(), names.join(", "))
    }

    fn sample(&mut self, _: &Watched, out: &mut Registry) -> Result<(), SourceError> {
        let mut guard = self
            .state
            .lock()
            .expect("the GPU thread does not panic holding it");
        let GpuState { backend, devices } = &mut *guard;
        let token = out.token();
        for (i, d) in devices.iter_mut().enumerate() {
            let reading = backend.read_fast(i, &d.caps).map_err(failed)?;
            let ids = match d.fast_ids {
                Some((t, ids)) if t == token => ids,
                _ => {
                    let info = &d.info;
                    let (c, g) = (SeriesKind::Counter, SeriesKind::Gauge);
                    let ids = [
                        declare(out, info, names::GPU_PCIE_TX_BYTES, "bytes", c),
                        declare(out, info, names::GPU_PCIE_RX_BYTES, "bytes", c),
                        declare(out, info, names::GPU_NVLINK_TX_BYTES, "bytes", c),
                        declare(out, info, names::GPU_NVLINK_RX_BYTES, "bytes", c),
                        declare(out, info, names::GPU_POWER_MW, "mW", g),
                        declare(out, info, names::GPU_ENERGY_MJ, "mJ", c),
                        declare(out, info, names::GPU_SM_CLOCK_MHZ, "MHz", g),
                        declare(out, info, names::GPU_MEM_CLOCK_MHZ, "MHz", g),
                        declare(out, info, names::GPU_THROTTLE_REASONS, "bitmask", g),
                        declare(out, info, names::GPU_MEMORY_USED_BYTES, "bytes", g),
                    ];
                    d.fast_ids = Some((token, ids));
                    ids
                }
            };
            let values = [
                reading.pcie_tx_bytes,
                reading.pcie_rx_bytes,
                reading.nvlink_tx_bytes,
                reading.nvlink_rx_bytes,
                reading.power_mw,
                reading.energy_mj,
                reading.sm_clock_mhz,
                reading.mem_clock_mhz,
                reading.throttle_reasons,
                reading.memory_used_bytes,
            ];
            for (id, v) in ids.into_iter().zip(values) {
                if let Some(v) = v {
                    out.push(id, v);
                }
            }
        }
        Ok(())
    }
}

/// Slow tier (≥ 100 ms): utilisation, GPM metrics, and the SM share of each of the job's
/// processes on each GPU (which maps ranks to devices).
pub struct GpuSlowSource {
    state: Arc<Mutex<GpuState>>,
}

/// A percentage as permille, rounded.
fn permille(pct: f64) -> u64 {
    (pct * 10.0).round().max(0.0) as u64
}

impl Source for GpuSlowSource {
    fn name(&self) -> &'static str {
        "gpu_slow"
    }

    fn tier(&self) -> Tier {
        Tier::Slow
    }

    fn describe(&self) -> String {
        let state = self
            .state
            .lock()
            .expect("the GPU thread does not panic holding it");
        let gpm = state
            .devices
            .iter()
            .filter(|d| d.caps.has(Metric::Gpm))
            .count();
        format!(
            "NVML utilisation and per-process SM share; GPM on {gpm} of {} GPU(s)",
            state.devices.len()
        )
    }

    fn sample(&mut self, watched: &Watched, out: &mut Registry) -> Result<(), SourceError> {
        let mut guard = self
            .state
            .lock()
            .expect("the GPU thread does not panic holding it");
        let GpuState { backend, devices } = &mut *guard;
        for (i, d) in devices.iter_mut().enumerate() {
            let reading = backend.read_slow(i, &d.caps).map_err(failed)?;
            let info = &d.info;
            let g = SeriesKind::Gauge;
            let mut gauge = |name: &str, unit: &str, v: Option<u64>| {
                if let Some(v) = v {
                    let id = declare(out, info, name, unit, g);
                    out.push(id, v);
                }
            };
            gauge(names::GPU_UTIL_PCT, "%", reading.util_pct.map(u64::from));
            gauge(
                names::GPU_MEM_UTIL_PCT,
                "%",
                reading.mem_util_pct.map(u64::from),
            );
            if let Some(gpm) = reading.gpm {
                let rate = |v: Option<f64>| v.map(|r| r.max(0.0).round() as u64);
                gauge(
                    names::GPU_GPM_SM_ACTIVITY,
                    "permille",
                    gpm.sm_activity_pct.map(permille),
                );
                gauge(
                    names::GPU_GPM_TENSOR_ACTIVITY,
                    "permille",
                    gpm.tensor_activity_pct.map(permille),
                );
                gauge(
                    names::GPU_GPM_DRAM_BW,
                    "permille",
                    gpm.dram_bw_pct.map(permille),
                );
                gauge(
                    names::GPU_GPM_PCIE_TX_RATE,
                    "bytes/s",
                    rate(gpm.pcie_tx_bytes_per_s),
                );
                gauge(
                    names::GPU_GPM_PCIE_RX_RATE,
                    "bytes/s",
                    rate(gpm.pcie_rx_bytes_per_s),
                );
                gauge(
                    names::GPU_GPM_NVLINK_TX_RATE,
                    "bytes/s",
                    rate(gpm.nvlink_tx_bytes_per_s),
                );
                gauge(
                    names::GPU_GPM_NVLINK_RX_RATE,
                    "bytes/s",
                    rate(gpm.nvlink_rx_bytes_per_s),
                );
            }
            let device_labels = labels(info);
            for p in reading
                .processes
                .iter()
                .filter(|p| watched.pids.contains(&p.pid))
            {
                let pid = p.pid.to_string();
                let mut labels: Vec<(&str, &str)> = device_labels
                    .iter()
                    .map(|(k, v)| (*k, v.as_str()))
                    .collect();
                labels.push(("pid", &pid));
                let id = out.series(names::GPU_PROC_SM_PCT, "%", SeriesKind::Gauge, &labels);
                out.push(id, u64::from(p.sm_pct));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use super::fake::{Activity, ScriptedGpu};
    use super::*;
    use crate::sources::fake::Round;

    #[test]
    fn an_unsupported_reading_is_absent_not_zero() {
        let clock = Arc::new(AtomicU64::new(0));
        let mut gpu = ScriptedGpu::h100_node(2, clock.clone());
        gpu.unsupported(1, Metric::NvlinkTx, "no NVLink on this device");
        gpu.unsupported(1, Metric::NvlinkRx, "no NVLink on this device");
        gpu.set(0, 0, Activity::h100_allreduce_nvlink());
        let (mut fast, mut slow) = sources(Box::new(gpu));
        let mut reg = Registry::default();
        let watched = Watched::default();
        clock.store(20_000_000, std::sync::atomic::Ordering::Relaxed);
        fast.sample(&watched, &mut reg).unwrap();
        slow.sample(&watched, &mut reg).unwrap();
        let round = Round::take(&mut reg);
        let nvlink0 = round.get(names::GPU_NVLINK_TX_BYTES, (LABEL_GPU, "0"));
        assert!(nvlink0.is_some_and(|v| v > 0));
        assert_eq!(
            round.get(names::GPU_NVLINK_TX_BYTES, (LABEL_GPU, "1")),
            None
        );
        assert_eq!(
            round.get(names::GPU_POWER_MW, (LABEL_GPU, "1")),
            Some(145_000)
        );
        assert!(round.get(names::GPU_UTIL_PCT, (LABEL_GPU, "0")).is_some());
        assert!(fast.describe().contains("2 GPU(s)"), "{}", fast.describe());
    }
}
