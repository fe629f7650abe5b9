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
const LIB: &str = "libnvidia-ml.so.1";
/// Names the NVML library to load instead of [`LIB`]: a driver installed where the loader
/// does not look (`/usr/local/nvidia/lib64/libnvidia-ml.so.1` in some containers), or the
/// scripted library the tests use.
pub const LIB_ENV: &str = "STALLSCOPE_NVML_LIB";
/// `scopeId` that asks for the sum over all NVLinks.
const ALL_LINKS: c_uint = c_uint::MAX;
const SUCCESS: sys::nvmlReturn_t = 0;

/// GPM metrics read, in [`GpmReading`] order.
const GPM_METRICS: [c_uint; 7] = [
    sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL,
    sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_DRAM_BW_UTIL,
    sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_TX_PER_SEC,
    sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_RX_PER_SEC,
    sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC,
    sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC,
];
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

struct Gpm {
    samples: [sys::nvmlGpmSample_t; 2],
    /// Which of `samples` holds the previous read, once there is one.
    previous: Option<usize>,
}

/// A counter NVML may give in fewer than 64 bits, unwrapped into one that only grows.
/// Fields 197/198 are documented as "can be wrapped", and code that reads them takes them as
/// unsigned int: 32 bits wrap every 4.29 GB, every 78 ms at 55 GB/s, so each wrap is seen as
/// long as two reads are closer than that (the fast tier at 100 Hz reads every 10 ms).
/// A 64-bit counter that goes down was reset, and is left for the analysis to skip.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Unwrapped {
    last: Option<u64>,
    /// Added for the wraps seen so far.
    wrapped: u64,
}

impl Unwrapped {
    /// The unwrapped value of `raw`, a counter of `bits` bits.
    fn next(&mut self, raw: u64, bits: u32) -> u64 {
        if bits < 64 && self.last.is_some_and(|last| raw < last) {
            self.wrapped += 1u64 << bits;
        }
        self.last = Some(raw);
        self.wrapped + raw
    }
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

/// A field value as u64 (`None` for a negative or non-finite value).
fn field_u64(f: &sys::nvmlFieldValue_t) -> Option<u64> {
    // SAFETY: `valueType` says which member of the union NVML wrote.
    unsafe {
        match f.valueType {
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_DOUBLE => {
                let d = f.value.dVal;
                (d.is_finite() && d >= 0.0).then_some(d as u64)
            }
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT => Some(u64::from(f.value.uiVal)),
            // c_ulong is u64 on 64-bit Linux but u32 elsewhere: the conversion is not useless.
            #[allow(clippy::useless_conversion)]
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG => Some(u64::from(f.value.ulVal)),
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG => Some(f.value.ullVal),
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_LONG_LONG => {
                u64::try_from(f.value.sllVal).ok()
            }
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_INT => u64::try_from(f.value.siVal).ok(),
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_SHORT => {
                Some(u64::from(f.value.usVal))
            }
            _ => None,
        }
    }
}

/// Bits of a field value's type: where a counter of that type wraps.
fn field_bits(f: &sys::nvmlFieldValue_t) -> u32 {
    match f.valueType {
        sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT
        | sys::nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_INT => 32,
        sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_SHORT => 16,
        _ => 64,
    }
}

fn field(id: u32, scope: c_uint) -> sys::nvmlFieldValue_t {
    // SAFETY: a plain C struct; all-zero is a valid request before the id is set.
    let mut f: sys::nvmlFieldValue_t = unsafe { std::mem::zeroed() };
    f.fieldId = id;
    f.scopeId = scope;
    f
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

/// Calls `nvmlDeviceGetFieldValues` on `fields` in place.
fn get_fields(
    lib: &NvmlLib,
    handle: sys::nvmlDevice_t,
    fields: &mut [sys::nvmlFieldValue_t],
) -> Result<(), String> {
    let f = lib
        .nvmlDeviceGetFieldValues
        .as_ref()
        .map_err(|e| format!("nvmlDeviceGetFieldValues missing: {e}"))?;
    // SAFETY: `fields` is a valid array of `len` requests NVML fills in.
    let code = unsafe { f(handle, fields.len() as i32, fields.as_mut_ptr()) };
    if code == SUCCESS {
        Ok(())
    } else {
        Err(return_text(code))
    }
}

/// One probe of a field with a given scope: `Ok` when the driver answers it.
fn probe_field(
    lib: &NvmlLib,
    handle: sys::nvmlDevice_t,
    id: u32,
    scope: c_uint,
) -> Result<(), String> {
    probe_field_bits(lib, handle, id, scope).map(drop)
}

/// [`probe_field`], with the bits of the value's type when the driver answers.
fn probe_field_bits(
    lib: &NvmlLib,
    handle: sys::nvmlDevice_t,
    id: u32,
    scope: c_uint,
) -> Result<u32, String> {
    let mut f = [field(id, scope)];
    get_fields(lib, handle, &mut f)?;
    if f[0].nvmlReturn == SUCCESS {
        Ok(field_bits(&f[0]))
    } else {
        Err(return_text(f[0].nvmlReturn))
    }
}

fn probe_gpm(lib: &NvmlLib, dev: &mut Dev) -> Result<(), String> {
    let query = lib
        .nvmlGpmQueryDeviceSupport
        .as_ref()
        .map_err(|_| "the driver's NVML has no GPM (driver older than 520)".to_string())?;
    let mut support = sys::nvmlGpmSupport_t {
        version: sys::NVML_GPM_SUPPORT_VERSION,
        isSupportedDevice: 0,
    };
    // SAFETY: NVML fills the struct we own.
    let code = unsafe { query(dev.handle, &mut support) };
    if code != SUCCESS {
        return Err(return_text(code));
    }
    if support.isSupportedDevice == 0 {
        return Err("GPM needs a Hopper or newer GPU".into());
    }
    let alloc = lib.nvmlGpmSampleAlloc.as_ref().map_err(|e| e.to_string())?;
    let mut samples: [sys::nvmlGpmSample_t; 2] = [std::ptr::null_mut(); 2];
    for s in &mut samples {
        // SAFETY: NVML allocates a sample and writes its handle.
        let code = unsafe { alloc(s) };
        if code != SUCCESS {
            return Err(return_text(code));
        }
    }
    dev.gpm = Some(Gpm {
        samples,
        previous: None,
    });
    Ok(())
}

fn read_gpm(lib: &NvmlLib, dev: &mut Dev) -> Result<Option<GpmReading>, String> {
    let Some(gpm) = dev.gpm.as_mut() else {
        return Ok(None);
    };
    let get = lib.nvmlGpmSampleGet.as_ref().map_err(|e| e.to_string())?;
    let current = gpm.previous.map_or(0, |p| 1 - p);
    // SAFETY: the sample was allocated by NVML for this purpose.
    let code = unsafe { get(dev.handle, gpm.samples[current]) };
    if code != SUCCESS {
        return Err(return_text(code));
    }
    let Some(previous) = gpm.previous.replace(current) else {
        return Ok(None);
    };
    let metrics_get = lib.nvmlGpmMetricsGet.as_ref().map_err(|e| e.to_string())?;
    // SAFETY: a plain C struct, filled in below and by NVML.
    let mut req: Box<sys::nvmlGpmMetricsGet_t> = Box::new(unsafe { std::mem::zeroed() });
    req.version = sys::NVML_GPM_METRICS_GET_VERSION;
    req.numMetrics = GPM_METRICS.len() as c_uint;
    req.sample1 = gpm.samples[previous];
    req.sample2 = gpm.samples[current];
    for (slot, id) in req.metrics.iter_mut().zip(GPM_METRICS) {
        slot.metricId = id;
    }
    // SAFETY: the request is valid and sized as NVML expects.
    let code = unsafe { metrics_get(&mut *req) };
    if code != SUCCESS {
        return Err(return_text(code));
    }
    let value = |i: usize| {
        let m = &req.metrics[i];
        (m.nvmlReturn == SUCCESS && m.value.is_finite()).then_some(m.value)
    };
    Ok(Some(GpmReading {
        sm_activity_pct: value(0),
        tensor_activity_pct: value(1),
        dram_bw_pct: value(2),
        pcie_tx_bytes_per_s: value(3).map(|v| v * MIB),
        pcie_rx_bytes_per_s: value(4).map(|v| v * MIB),
        nvlink_tx_bytes_per_s: value(5).map(|v| v * MIB),
        nvlink_rx_bytes_per_s: value(6).map(|v| v * MIB),
    }))
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
