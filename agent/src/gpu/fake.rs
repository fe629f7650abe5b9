//! A scripted GPU behind the same [`GpuBackend`] trait as NVML, for tests and for machines
//! without a GPU.
//!
//! There is no GPU where stallscope is built and tested, so the attribution of GPU jobs is
//! tested on this stand-in: every figure it returns is taken from a real device's published
//! readings, and counters are integrated from rates over a clock the test moves, so the GPU
//! source, its series and the attribution see exactly what they would see from NVML.
//!
//! Where the figures come from (public outputs of real H100 80GB HBM3 / SXM machines):
//! - idle: 145 W in P0 at 0 % utilisation, power cap 700 W, 72790 MiB of 81559 MiB used,
//!   driver 550.90.07 — `nvidia-smi` on an 8× H100 80GB HBM3 node,
//!   <https://github.com/wilicc/gpu-burn/issues/114>;
//! - NVLink: 376–380 GB/s one-way GPU-to-GPU on HGX H100 SXM (NVLink4, 450 GB/s line rate),
//!   <https://github.com/NVIDIA/nccl/issues/1264>; NCCL's effective NVLink bus bandwidth
//!   ~370 GB/s, <https://github.com/NVIDIA/nccl-tests/issues/212>;
//! - PCIe: host-to-device 35.2 GB/s, device-to-host 52.8 GB/s per H100 (nvbandwidth memcpy),
//!   <https://github.com/NVIDIA/nvbandwidth/issues/24>;
//! - clocks: 1980 MHz SM and 2619 MHz memory, the H100 SXM5 maximum clocks NVML reports
//!   (`nvidia-smi -q -d CLOCK`, "Max Clocks"); the busy power, 650 W, is a scenario value
//!   under the 700 W cap above.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use stallscope_analysis::Nanos;

use super::backend::{
    Capabilities, DeviceInfo, DriverInfo, FastReading, GpmReading, GpuBackend, GpuError, Metric,
    ProcessUtil, SlowReading,
};

/// bytes per GB.
const GB: f64 = 1e9;
/// bytes per MiB.
const MIB: u64 = 1024 * 1024;
/// ns over which NVML averages utilisation on recent GPUs (1/6 s).
const UTIL_WINDOW_NS: Nanos = 166_666_667;

/// H100 SXM one-way NVLink rate achieved GPU to GPU, bytes/s (nccl#1264).
pub const H100_NVLINK_BYTES_PER_S: f64 = 378.0 * GB;
/// H100 host-to-device copy rate, bytes/s (nvbandwidth#24).
pub const H100_H2D_BYTES_PER_S: f64 = 35.2 * GB;
/// H100 80GB HBM3 device memory as NVML reports its total, bytes (gpu-burn#114).
pub const H100_MEMORY_TOTAL_BYTES: u64 = 81_559 * MIB;

/// What a device does from some instant on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Activity {
    /// %, a kernel running.
    pub util_pct: f64,
    /// bytes/s sent over PCIe.
    pub pcie_tx_bytes_per_s: f64,
    /// bytes/s received over PCIe (host-to-device copies).
    pub pcie_rx_bytes_per_s: f64,
    /// bytes/s sent over all NVLinks.
    pub nvlink_tx_bytes_per_s: f64,
    /// bytes/s received over all NVLinks.
    pub nvlink_rx_bytes_per_s: f64,
    /// mW.
    pub power_mw: u64,
    /// MHz.
    pub sm_clock_mhz: u64,
    /// MHz.
    pub mem_clock_mhz: u64,
    /// bytes.
    pub memory_used_bytes: u64,
}

impl Activity {
    /// An H100 with a training process attached and nothing running (gpu-burn#114).
    pub fn h100_idle() -> Activity {
        Activity {
            util_pct: 0.0,
            pcie_tx_bytes_per_s: 0.0,
            pcie_rx_bytes_per_s: 0.0,
            nvlink_tx_bytes_per_s: 0.0,
            nvlink_rx_bytes_per_s: 0.0,
            power_mw: 145_000,
            sm_clock_mhz: 1980,
            mem_clock_mhz: 2619,
            memory_used_bytes: 72_790 * MIB,
        }
    }

    /// An H100 running kernels back to back.
    pub fn h100_busy() -> Activity {
        Activity {
            util_pct: 100.0,
            power_mw: 650_000,
            ..Activity::h100_idle()
        }
    }

    /// Idle but copying a batch host-to-device at the measured H100 rate.
    pub fn h100_copying_in() -> Activity {
        Activity {
            pcie_rx_bytes_per_s: H100_H2D_BYTES_PER_S,
            power_mw: 160_000,
            ..Activity::h100_idle()
        }
    }

    /// An NCCL all-reduce over NVLink: both directions at the achieved H100 rate; the
    /// reduction kernels keep the GPU partly busy.
    pub fn h100_allreduce_nvlink() -> Activity {
        Activity {
            util_pct: 20.0,
            nvlink_tx_bytes_per_s: H100_NVLINK_BYTES_PER_S,
            nvlink_rx_bytes_per_s: H100_NVLINK_BYTES_PER_S,
            power_mw: 300_000,
            ..Activity::h100_idle()
        }
    }

    /// The same activity with PCIe traffic both ways at `bytes_per_s` (GPUDirect RDMA: the
    /// NIC reads and writes GPU memory across PCIe).
    pub fn with_pcie(self, bytes_per_s: f64) -> Activity {
        Activity {
            pcie_tx_bytes_per_s: bytes_per_s,
            pcie_rx_bytes_per_s: bytes_per_s,
            ..self
        }
    }
}

/// Counters a device has accumulated before the script starts (a driver loaded hours ago).
const START_PCIE_BYTES: f64 = 3.1e12;
const START_NVLINK_BYTES: f64 = 7.4e13;
const START_ENERGY_MJ: f64 = 9.6e9;

struct Device {
    info: DeviceInfo,
    /// (from ns, activity), in time order; the first entry starts at 0.
    script: Vec<(Nanos, Activity)>,
    missing: Vec<(Metric, String)>,
    pids: Vec<u32>,
}

/// A node of scripted GPUs on a clock the caller moves.
pub struct ScriptedGpu {
    clock: Arc<AtomicU64>,
    devices: Vec<Device>,
    infos: Vec<DeviceInfo>,
}

impl ScriptedGpu {
    /// `count` idle H100 SXM GPUs with 18 NVLinks each, reading time from `clock` (ns).
    pub fn h100_node(count: u32, clock: Arc<AtomicU64>) -> ScriptedGpu {
        let devices: Vec<Device> = (0..count)
            .map(|index| Device {
                info: DeviceInfo {
                    index,
                    uuid: format!("GPU-5f7c1a2e-0000-4000-8000-00000000000{index}"),
                    name: "NVIDIA H100 80GB HBM3".into(),
                    pci_bus_id: format!("00000000:{:02X}:00.0", 0x19 + index * 0x22),
                    nvlinks: Some(18),
                },
                script: vec![(0, Activity::h100_idle())],
                missing: Vec::new(),
                pids: Vec::new(),
            })
            .collect();
        let infos = devices.iter().map(|d| d.info.clone()).collect();
        ScriptedGpu {
            clock,
            devices,
            infos,
        }
    }

    /// Device `device` does `activity` from `from_ns` on.
    pub fn set(&mut self, device: usize, from_ns: Nanos, activity: Activity) {
        let script = &mut self.devices[device].script;
        script.retain(|(t, _)| *t < from_ns);
        script.push((from_ns, activity));
    }

    /// Device `device` does not support `metric` (as an A100 lacks GPM).
    pub fn unsupported(&mut self, device: usize, metric: Metric, why: &str) {
        self.devices[device].missing.push((metric, why.to_string()));
    }

    /// Process `pid` runs on device `device`.
    pub fn attach(&mut self, device: usize, pid: u32) {
        self.devices[device].pids.push(pid);
    }

    fn now(&self) -> Nanos {
        self.clock.load(Ordering::Relaxed)
    }

    /// ∫ f(activity) dt over [0, t], with f in units per second.
    fn integral(&self, device: usize, t: Nanos, f: impl Fn(&Activity) -> f64) -> f64 {
        let script = &self.devices[device].script;
        let mut total = 0.0;
        for (k, (from, a)) in script.iter().enumerate() {
            if *from >= t {
                break;
            }
            let to = script.get(k + 1).map_or(t, |n| n.0.min(t));
            total += f(a) * (to - from) as f64 / 1e9;
        }
        total
    }

    fn activity(&self, device: usize, t: Nanos) -> Activity {
        let script = &self.devices[device].script;
        script
            .iter()
            .rev()
            .find(|(from, _)| *from <= t)
            .map_or(script[0].1, |s| s.1)
    }

    /// Mean of `f` over the `window` ns before `t`.
    fn mean(&self, device: usize, t: Nanos, window: Nanos, f: impl Fn(&Activity) -> f64) -> f64 {
        let from = t.saturating_sub(window);
        if t == from {
            return f(&self.activity(device, t));
        }
        let f = &f;
        (self.integral(device, t, f) - self.integral(device, from, f)) / ((t - from) as f64 / 1e9)
    }
}

impl GpuBackend for ScriptedGpu {
    fn driver(&self) -> DriverInfo {
        DriverInfo {
            driver_version: "550.90.07".into(),
            nvml_version: "12.550.90.07".into(),
            cuda_version: Some("12.4".into()),
        }
    }

    fn devices(&self) -> &[DeviceInfo] {
        &self.infos
    }

    fn probe(&mut self, device: usize) -> Capabilities {
        let missing = &self.devices[device].missing;
        Capabilities {
            entries: Metric::ALL
                .iter()
                .map(|m| {
                    let r = match missing.iter().find(|(x, _)| x == m) {
                        Some((_, why)) => Err(why.clone()),
                        None => Ok(()),
                    };
                    (*m, r)
                })
                .collect(),
            notes: Vec::new(),
        }
    }

    fn read_fast(&mut self, device: usize, caps: &Capabilities) -> Result<FastReading, GpuError> {
        let t = self.now();
        let a = self.activity(device, t);
        let has = |m| caps.has(m);
        let counter = |m: Metric, start: f64, f: fn(&Activity) -> f64| {
            has(m).then(|| (start + self.integral(device, t, f)) as u64)
        };
        Ok(FastReading {
            pcie_tx_bytes: counter(Metric::PcieTx, START_PCIE_BYTES, |a| a.pcie_tx_bytes_per_s),
            pcie_rx_bytes: counter(Metric::PcieRx, START_PCIE_BYTES, |a| a.pcie_rx_bytes_per_s),
            nvlink_tx_bytes: counter(Metric::NvlinkTx, START_NVLINK_BYTES, |a| {
                a.nvlink_tx_bytes_per_s
            }),
            nvlink_rx_bytes: counter(Metric::NvlinkRx, START_NVLINK_BYTES, |a| {
                a.nvlink_rx_bytes_per_s
            }),
            power_mw: has(Metric::Power).then_some(a.power_mw),
            // mJ = ∫ mW dt / 1000 … per second: mW × s = mJ.
            energy_mj: counter(Metric::Energy, START_ENERGY_MJ, |a| a.power_mw as f64),
            sm_clock_mhz: has(Metric::SmClock).then_some(a.sm_clock_mhz),
            mem_clock_mhz: has(Metric::MemClock).then_some(a.mem_clock_mhz),
            throttle_reasons: has(Metric::Throttle).then_some(if a.util_pct > 0.0 { 0 } else { 1 }),
            memory_used_bytes: has(Metric::MemoryUsed).then_some(a.memory_used_bytes),
        })
    }

    fn read_slow(&mut self, device: usize, caps: &Capabilities) -> Result<SlowReading, GpuError> {
        let t = self.now();
        let util = self.mean(device, t, UTIL_WINDOW_NS, |a| a.util_pct);
        let util_pct = caps.has(Metric::Utilization).then_some(util.round() as u32);
        let gpm = caps.has(Metric::Gpm).then(|| {
            let window = 100_000_000;
            GpmReading {
                sm_activity_pct: Some(self.mean(device, t, window, |a| a.util_pct)),
                tensor_activity_pct: Some(self.mean(device, t, window, |a| a.util_pct * 0.6)),
                dram_bw_pct: Some(self.mean(device, t, window, |a| a.util_pct * 0.4)),
                pcie_tx_bytes_per_s: Some(self.mean(device, t, window, |a| a.pcie_tx_bytes_per_s)),
                pcie_rx_bytes_per_s: Some(self.mean(device, t, window, |a| a.pcie_rx_bytes_per_s)),
                nvlink_tx_bytes_per_s: Some(
                    self.mean(device, t, window, |a| a.nvlink_tx_bytes_per_s),
                ),
                nvlink_rx_bytes_per_s: Some(
                    self.mean(device, t, window, |a| a.nvlink_rx_bytes_per_s),
                ),
            }
        });
        let processes = if caps.has(Metric::ProcessUtilization) {
            self.devices[device]
                .pids
                .iter()
                .map(|&pid| ProcessUtil {
                    pid,
                    sm_pct: util.round() as u32,
                })
                .collect()
        } else {
            Vec::new()
        };
        Ok(SlowReading {
            util_pct,
            mem_util_pct: util_pct.map(|u| u * 2 / 5),
            gpm,
            processes,
        })
    }
}
