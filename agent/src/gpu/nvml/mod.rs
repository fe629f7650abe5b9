//! The real backend: NVML through nvml-wrapper, loaded at run time.
//!
//! Two handles on the one library: nvml-wrapper's [`Nvml`] for the typed calls, and the raw
//! function table ([`NvmlLib`]) for the batched `nvmlDeviceGetFieldValues`, because the
//! wrapper's `field_values_for` cannot set `scopeId` and so reads NVLink link 0 only; with
//! `scopeId = UINT_MAX` the driver sums all links. Where the driver refuses that scope, each
//! link is asked for and the links are summed. GPM goes through the raw table as well (the
//! wrapper has no GPM calls). `pcie_throughput` is never called: it blocks for ~20 ms.
//!
//! Both handles are leaked on purpose: device handles borrow the library for the life of the
//! process, and NVML is opened once per run.

use std::ffi::OsStr;
use std::os::raw::c_uint;
use std::time::{Duration, Instant};

use nvml_wrapper::enum_wrappers::device::Clock;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::sys_exports::field_id::{
    NVML_FI_DEV_NVLINK_LINK_COUNT, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
    NVML_FI_DEV_PCIE_COUNT_TX_BYTES, NVML_FI_DEV_POWER_INSTANT,
    NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
};
use nvml_wrapper::{cuda_driver_version_major, cuda_driver_version_minor, Device, Nvml};
use nvml_wrapper_sys::bindings as sys;
use stallscope_analysis::gpu_usage::human_bytes;
use sys::NvmlLib;

use super::backend::{
    Capabilities, DeviceInfo, DriverInfo, FastReading, GpmReading, GpuBackend, GpuError, Metric,
    ProcessUtil, SlowReading,
};

/// The library's name on Linux, found by the dynamic loader's search.
mod fields;
mod gpm;

use fields::*;
use gpm::*;

const LIB: &str = "libnvidia-ml.so.1";
/// Names the NVML library to load instead of [`LIB`]: a driver installed where the loader
/// does not look (`/usr/local/nvidia/lib64/libnvidia-ml.so.1` in some containers), or the
/// scripted library the tests use.
pub const LIB_ENV: &str = "STALLSCOPE_NVML_LIB";
/// `scopeId` that asks for the sum over all NVLinks.
const ALL_LINKS: c_uint = c_uint::MAX;
const SUCCESS: sys::nvmlReturn_t = 0;

/// GPM reports PCIe and NVLink rates in MiB/s.
const MIB: f64 = 1024.0 * 1024.0;

/// How NVLink bytes are read on a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NvlinkScope {
    /// One entry per direction with `scopeId = UINT_MAX`.
    AllLinks,
    /// One entry per link and direction, summed.
    PerLink(u32),
}

struct Dev {
    device: Device<'static>,
    handle: sys::nvmlDevice_t,
    nvlink: Option<NvlinkScope>,
    /// Field-value request of the fast tier, reused every round.
    fields: Vec<sys::nvmlFieldValue_t>,
    /// One per entry of `fields`: the counters' wraps.
    unwrapped: Vec<Unwrapped>,
    gpm: Option<Gpm>,
    /// µs, NVML timestamp of the newest per-process sample seen.
    last_process_ts: u64,
}

// SAFETY: the raw handles are opaque NVML pointers, which NVML allows to be used from any
// thread; the backend is used from one thread at a time (it is moved to the GPU thread).
unsafe impl Send for Dev {}

/// NVML on this machine.
pub struct NvmlBackend {
    nvml: &'static Nvml,
    lib: &'static NvmlLib,
    infos: Vec<DeviceInfo>,
    devs: Vec<Dev>,
}

fn call_error(call: &'static str, device: u32, e: impl std::fmt::Display) -> GpuError {
    GpuError::Call {
        call,
        device,
        message: e.to_string(),
    }
}

/// What NVML's "GPU is lost" means for the user.
const GPU_LOST: &str =
    "the GPU is lost (fell off the bus or stopped answering; see `dmesg` for Xid errors)";

fn why(e: &NvmlError) -> String {
    match e {
        NvmlError::NotSupported => "not supported by this device or driver".into(),
        NvmlError::NoPermission => "not permitted for this user".into(),
        NvmlError::FunctionNotFound => "the driver's NVML lacks this call (driver too old)".into(),
        NvmlError::GpuLost => GPU_LOST.into(),
        other => other.to_string(),
    }
}

fn return_text(code: sys::nvmlReturn_t) -> String {
    match code {
        sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED => {
            "not supported by this device or driver".into()
        }
        sys::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION => "not permitted for this user".into(),
        sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT => "field unknown to this driver".into(),
        sys::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST => GPU_LOST.into(),
        other => format!("NVML error {other}"),
    }
}

impl NvmlBackend {
    /// Loads NVML and enumerates the GPUs. `Err(NoDriver)` where there is no NVIDIA driver.
    /// The library is [`LIB_ENV`]'s path when set, else [`LIB`].
    pub fn open() -> Result<NvmlBackend, GpuError> {
        let lib = std::env::var_os(LIB_ENV).filter(|p| !p.is_empty());
        Self::open_library(lib.as_deref().unwrap_or(OsStr::new(LIB)))
    }

    /// Loads the NVML library at `lib` (a name the loader searches for, or a path).
    pub fn open_library(lib: &OsStr) -> Result<NvmlBackend, GpuError> {
        let shown = lib.to_string_lossy();
        let nvml = Nvml::builder()
            .lib_path(lib)
            .init()
            .map_err(|e| GpuError::NoDriver(format!("{shown}: {e}")))?;
        let nvml: &'static Nvml = Box::leak(Box::new(nvml));
        // SAFETY: loading the library NVML was just initialised from runs no foreign
        // initialiser a second time (the loader shares the one loaded image).
        let lib = unsafe { NvmlLib::new(lib) }
            .map_err(|e| GpuError::NoDriver(format!("{shown}: {e}")))?;
        let lib: &'static NvmlLib = Box::leak(Box::new(lib));
        let count = nvml
            .device_count()
            .map_err(|e| GpuError::NoDriver(format!("nvmlDeviceGetCount: {e}")))?;
        let mut backend = NvmlBackend {
            nvml,
            lib,
            infos: Vec::new(),
            devs: Vec::new(),
        };
        for index in 0..count {
            let device = nvml
                .device_by_index(index)
                .map_err(|e| call_error("nvmlDeviceGetHandleByIndex", index, e))?;
            // SAFETY: the handle stays valid while the (leaked) library is loaded.
            let handle = unsafe { device.handle() };
            let mut dev = Dev {
                device,
                handle,
                nvlink: None,
                fields: Vec::new(),
                unwrapped: Vec::new(),
                gpm: None,
                last_process_ts: 0,
            };
            let nvlinks = backend.link_count(&mut dev);
            backend.infos.push(DeviceInfo {
                index,
                uuid: dev.device.uuid().unwrap_or_default(),
                name: dev
                    .device
                    .name()
                    .unwrap_or_else(|e| format!("unknown ({e})")),
                pci_bus_id: dev.device.pci_info().map(|p| p.bus_id).unwrap_or_default(),
                nvlinks,
            });
            backend.devs.push(dev);
        }
        Ok(backend)
    }

    fn link_count(&self, dev: &mut Dev) -> Option<u32> {
        let mut f = [field(NVML_FI_DEV_NVLINK_LINK_COUNT, 0)];
        get_fields(self.lib, dev.handle, &mut f).ok()?;
        (f[0].nvmlReturn == SUCCESS).then(|| field_u64(&f[0]).unwrap_or(0) as u32)
    }
}

impl NvmlBackend {
    /// Builds the fast tier's field request from the capabilities.
    fn fast_fields(dev: &Dev, caps: &Capabilities) -> Vec<sys::nvmlFieldValue_t> {
        let mut fields = Vec::new();
        let plain = [
            (Metric::PcieTx, NVML_FI_DEV_PCIE_COUNT_TX_BYTES),
            (Metric::PcieRx, NVML_FI_DEV_PCIE_COUNT_RX_BYTES),
            (Metric::Power, NVML_FI_DEV_POWER_INSTANT),
            (Metric::Energy, NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION),
        ];
        for (m, id) in plain {
            if caps.has(m) {
                fields.push(field(id, 0));
            }
        }
        for (m, id) in [
            (Metric::NvlinkTx, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX),
            (Metric::NvlinkRx, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX),
        ] {
            match (caps.has(m), dev.nvlink) {
                (true, Some(NvlinkScope::AllLinks)) => fields.push(field(id, ALL_LINKS)),
                (true, Some(NvlinkScope::PerLink(n))) => {
                    fields.extend((0..n).map(|link| field(id, link)))
                }
                _ => {}
            }
        }
        fields
    }

    /// Times each NVML call the GPU source makes, `rounds` times on every device: the mean
    /// cost per call, or why the call cannot be made.
    pub fn bench(&mut self, rounds: u32) -> Vec<BenchRow> {
        let mut rows = Vec::new();
        for i in 0..self.devs.len() {
            let caps = self.probe(i);
            let index = self.infos[i].index;
            let mut time = |call: &'static str, f: &mut dyn FnMut() -> Result<(), String>| {
                let mut outcome = Ok(());
                let start = Instant::now();
                for _ in 0..rounds {
                    if let Err(e) = f() {
                        outcome = Err(e);
                        break;
                    }
                }
                let per_call = start.elapsed() / rounds.max(1);
                rows.push(BenchRow {
                    gpu: index,
                    call,
                    per_call: outcome.map(|()| per_call),
                });
            };
            let lib = self.lib;
            let dev = &mut self.devs[i];
            let mut fields = Self::fast_fields(dev, &caps);
            let handle = dev.handle;
            time("nvmlDeviceGetFieldValues (fast batch)", &mut || {
                if fields.is_empty() {
                    return Err("no field supported".into());
                }
                get_fields(lib, handle, &mut fields)
            });
            let d = &dev.device;
            time("nvmlDeviceGetClockInfo (SM)", &mut || {
                d.clock_info(Clock::SM).map(drop).map_err(|e| why(&e))
            });
            time("nvmlDeviceGetClockInfo (memory)", &mut || {
                d.clock_info(Clock::Memory).map(drop).map_err(|e| why(&e))
            });
            time("nvmlDeviceGetCurrentClocksThrottleReasons", &mut || {
                d.current_throttle_reasons().map(drop).map_err(|e| why(&e))
            });
            time("nvmlDeviceGetMemoryInfo", &mut || {
                d.memory_info().map(drop).map_err(|e| why(&e))
            });
            time("nvmlDeviceGetUtilizationRates", &mut || {
                d.utilization_rates().map(drop).map_err(|e| why(&e))
            });
            time(
                "nvmlDeviceGetProcessUtilization",
                &mut || match d.process_utilization_stats(None) {
                    Ok(_) | Err(NvmlError::NotFound) => Ok(()),
                    Err(e) => Err(why(&e)),
                },
            );
            if dev.gpm.is_some() {
                time("nvmlGpmSampleGet + nvmlGpmMetricsGet", &mut || {
                    read_gpm(lib, dev).map(drop)
                });
            }
        }
        rows
    }
}

/// One line of `stallscope nvml-bench`.
#[derive(Clone, Debug)]
pub struct BenchRow {
    /// NVML index.
    pub gpu: u32,
    /// The call.
    pub call: &'static str,
    /// Mean wall time of one call, or why it could not be made.
    pub per_call: Result<Duration, String>,
}

impl GpuBackend for NvmlBackend {
    fn driver(&self) -> DriverInfo {
        DriverInfo {
            driver_version: self.nvml.sys_driver_version().unwrap_or_default(),
            nvml_version: self.nvml.sys_nvml_version().unwrap_or_default(),
            cuda_version: self.nvml.sys_cuda_driver_version().ok().map(|v| {
                format!(
                    "{}.{}",
                    cuda_driver_version_major(v),
                    cuda_driver_version_minor(v)
                )
            }),
        }
    }

    fn devices(&self) -> &[DeviceInfo] {
        &self.infos
    }

    fn probe(&mut self, i: usize) -> Capabilities {
        let lib = self.lib;
        let dev = &mut self.devs[i];
        let links = self.infos[i].nvlinks.unwrap_or(0);
        let mut entries = Vec::new();
        let mut notes = Vec::new();
        for (m, id) in [
            (Metric::PcieTx, NVML_FI_DEV_PCIE_COUNT_TX_BYTES),
            (Metric::PcieRx, NVML_FI_DEV_PCIE_COUNT_RX_BYTES),
        ] {
            let bits = probe_field_bits(lib, dev.handle, id, 0);
            if let Some(b) = bits.as_ref().ok().filter(|b| **b < 64) {
                let wraps = human_bytes((1u64 << b) as f64);
                notes.push((
                    m,
                    format!("{b}-bit counter, unwrapped (wraps every {wraps})"),
                ));
            }
            entries.push((m, bits.map(drop)));
        }
        for (m, id) in [
            (Metric::NvlinkTx, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX),
            (Metric::NvlinkRx, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX),
        ] {
            let r = if links == 0 {
                Err("no NVLink on this device".to_string())
            } else if probe_field(lib, dev.handle, id, ALL_LINKS).is_ok() {
                dev.nvlink = Some(NvlinkScope::AllLinks);
                notes.push((m, "all links in one request (scopeId UINT_MAX)".to_string()));
                Ok(())
            } else {
                probe_field(lib, dev.handle, id, 0).map(|()| {
                    dev.nvlink = Some(NvlinkScope::PerLink(links));
                    notes.push((
                        m,
                        format!(
                            "asked per link and summed over {links} links \
                             (the driver refuses scopeId UINT_MAX)"
                        ),
                    ));
                })
            };
            entries.push((m, r));
        }
        let mut plain = |m: Metric, id: u32| {
            entries.push((m, probe_field(lib, dev.handle, id, 0)));
        };
        plain(Metric::Power, NVML_FI_DEV_POWER_INSTANT);
        plain(Metric::Energy, NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION);
        let d = &dev.device;
        entries.push((
            Metric::SmClock,
            d.clock_info(Clock::SM).map(drop).map_err(|e| why(&e)),
        ));
        entries.push((
            Metric::MemClock,
            d.clock_info(Clock::Memory).map(drop).map_err(|e| why(&e)),
        ));
        entries.push((
            Metric::Throttle,
            d.current_throttle_reasons().map(drop).map_err(|e| why(&e)),
        ));
        entries.push((
            Metric::MemoryUsed,
            d.memory_info().map(drop).map_err(|e| why(&e)),
        ));
        entries.push((
            Metric::Utilization,
            d.utilization_rates().map(drop).map_err(|e| why(&e)),
        ));
        let per_process = match d.process_utilization_stats(None) {
            Ok(_) | Err(NvmlError::NotFound) => Ok(()),
            Err(e) => Err(why(&e)),
        };
        entries.push((Metric::ProcessUtilization, per_process));
        let gpm = if dev.gpm.is_some() {
            Ok(())
        } else {
            probe_gpm(lib, dev)
        };
        entries.push((Metric::Gpm, gpm));
        let caps = Capabilities { entries, notes };
        dev.fields = Self::fast_fields(dev, &caps);
        dev.unwrapped = vec![Unwrapped::default(); dev.fields.len()];
        caps
    }

    fn read_fast(&mut self, i: usize, caps: &Capabilities) -> Result<FastReading, GpuError> {
        let index = self.infos[i].index;
        let mut fields = std::mem::take(&mut self.devs[i].fields);
        let mut r = FastReading::default();
        if !fields.is_empty() {
            let result = get_fields(self.lib, self.devs[i].handle, &mut fields);
            if let Err(e) = result {
                self.devs[i].fields = fields;
                return Err(call_error("nvmlDeviceGetFieldValues", index, e));
            }
            let unwrapped = &mut self.devs[i].unwrapped;
            for (f, counter) in fields.iter().zip(unwrapped.iter_mut()) {
                let Some(v) = (f.nvmlReturn == SUCCESS).then(|| field_u64(f)).flatten() else {
                    continue;
                };
                let add = |slot: &mut Option<u64>, v: u64| *slot = Some(slot.unwrap_or(0) + v);
                let mut count = || counter.next(v, field_bits(f));
                match f.fieldId {
                    NVML_FI_DEV_PCIE_COUNT_TX_BYTES => r.pcie_tx_bytes = Some(count()),
                    NVML_FI_DEV_PCIE_COUNT_RX_BYTES => r.pcie_rx_bytes = Some(count()),
                    NVML_FI_DEV_POWER_INSTANT => r.power_mw = Some(v),
                    NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION => r.energy_mj = Some(count()),
                    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX => {
                        add(&mut r.nvlink_tx_bytes, count() * 1024)
                    }
                    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX => {
                        add(&mut r.nvlink_rx_bytes, count() * 1024)
                    }
                    _ => {}
                }
            }
        }
        self.devs[i].fields = fields;
        let d = &self.devs[i].device;
        if caps.has(Metric::SmClock) {
            r.sm_clock_mhz = d.clock_info(Clock::SM).ok().map(u64::from);
        }
        if caps.has(Metric::MemClock) {
            r.mem_clock_mhz = d.clock_info(Clock::Memory).ok().map(u64::from);
        }
        if caps.has(Metric::Throttle) {
            r.throttle_reasons = d.current_throttle_reasons().ok().map(|t| t.bits());
        }
        if caps.has(Metric::MemoryUsed) {
            r.memory_used_bytes = d.memory_info().ok().map(|m| m.used);
        }
        Ok(r)
    }

    fn read_slow(&mut self, i: usize, caps: &Capabilities) -> Result<SlowReading, GpuError> {
        let index = self.infos[i].index;
        let mut r = SlowReading::default();
        let d = &self.devs[i].device;
        if caps.has(Metric::Utilization) {
            if let Ok(u) = d.utilization_rates() {
                r.util_pct = Some(u.gpu);
                r.mem_util_pct = Some(u.memory);
            }
        }
        if caps.has(Metric::ProcessUtilization) {
            match d.process_utilization_stats(self.devs[i].last_process_ts) {
                Ok(samples) => {
                    for s in &samples {
                        self.devs[i].last_process_ts =
                            self.devs[i].last_process_ts.max(s.timestamp);
                    }
                    r.processes = samples
                        .iter()
                        .map(|s| ProcessUtil {
                            pid: s.pid,
                            sm_pct: s.sm_util,
                        })
                        .collect();
                }
                Err(NvmlError::NotFound) => {}
                Err(e) => {
                    return Err(call_error(
                        "nvmlDeviceGetProcessUtilization",
                        index,
                        why(&e),
                    ))
                }
            }
        }
        if caps.has(Metric::Gpm) {
            let gpm = read_gpm(self.lib, &mut self.devs[i]);
            r.gpm = gpm.map_err(|e| call_error("nvmlGpmMetricsGet", index, e))?;
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::Unwrapped;

    #[test]
    fn a_32_bit_counter_keeps_growing_across_its_wraps() {
        let mut c = Unwrapped::default();
        let step = 1_500_000_000u64; // 1.5 GB between reads: a wrap every third read
        let mut truth = 4_000_000_000u64;
        let mut got = Vec::new();
        for _ in 0..10 {
            got.push(c.next(truth % (1 << 32), 32));
            truth += step;
        }
        let deltas: Vec<u64> = got.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(deltas.iter().all(|d| *d == step), "{deltas:?}");
    }

    #[test]
    fn a_64_bit_counter_that_goes_down_is_left_as_a_reset() {
        let mut c = Unwrapped::default();
        assert_eq!(c.next(9_000_000_000, 64), 9_000_000_000);
        assert_eq!(c.next(5, 64), 5);
    }
}
