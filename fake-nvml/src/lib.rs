//! A scripted `libnvidia-ml.so` for machines without a GPU.
//!
//! stallscope's GPU source has two halves: the NVML calls ([`stallscope_agent::gpu::nvml`])
//! and everything above them, which the agent's tests drive through a scripted backend
//! ([`stallscope_agent::gpu::fake::ScriptedGpu`]). That leaves the calls themselves — the
//! batched field request and its `scopeId`, the per-field return codes, the unit conversions,
//! GPM's sample pairs, the two-call per-process query, the capability probe — untested where
//! there is no driver. This library answers those calls through the C ABI, with the same
//! scripted device behind them, so the real backend, loaded as it is on a GPU machine
//! (`STALLSCOPE_NVML_LIB=path/to/libstallscope_fake_nvml.so`), runs end to end in CI.
//!
//! Every figure comes from [`ScriptedGpu`] (public readings of H100 SXM machines, cited
//! there), on a clock that runs from `nvmlInit`. What the device does and which driver
//! quirks it shows is set by `STALLSCOPE_FAKE_NVML`, a comma-separated list read at
//! `nvmlInit`:
//!
//! | entry | effect |
//! |---|---|
//! | `gpus=N` | N devices (default 1) |
//! | `activity=idle\|busy\|copying_in\|allreduce_nvlink` | what every device does (default `busy`) |
//! | `pcie=B` | plus B bytes/s over PCIe each way |
//! | `no_all_links_scope` | `scopeId = UINT_MAX` refused: NVLink only per link (older drivers) |
//! | `no_pcie_counters` | fields 197/198 unknown (drivers before the PCIe byte counters) |
//! | `pcie_32bit` | fields 197/198 as unsigned int, wrapping every 4.29 GB |
//! | `no_gpm` | GPM not supported (GPUs before Hopper) |
//! | `pcie_only` | no NVLinks (a PCIe card) |
//! | `no_process_permission` | per-process utilisation not permitted |
//! | `processes` | each process below the caller with `LOCAL_RANK=k` in its environment runs on GPU `gpus − 1 − k mod gpus` (the reverse of the local-rank guess) |
//! | `no_driver` | `nvmlInit` fails as without a loaded kernel driver |
//! | `lost_when=PATH` | every device call fails with "GPU is lost" once PATH exists |
//!
//! Only what stallscope calls is answered; nvml-wrapper resolves each symbol when it is
//! first used, so the rest need not exist.

#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, CStr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use nvml_wrapper_sys::bindings as sys;
use stallscope_agent::gpu::backend::{Capabilities, FastReading, GpuBackend, Metric};
use stallscope_agent::gpu::fake::{Activity, ScriptedGpu, H100_MEMORY_TOTAL_BYTES};

use sys::field_id::{
    NVML_FI_DEV_NVLINK_LINK_COUNT, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
    NVML_FI_DEV_PCIE_COUNT_TX_BYTES, NVML_FI_DEV_POWER_INSTANT,
    NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
};

type Ret = sys::nvmlReturn_t;
const SUCCESS: Ret = sys::nvmlReturn_enum_NVML_SUCCESS;
const UNINITIALIZED: Ret = sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
const INVALID_ARGUMENT: Ret = sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
const NOT_SUPPORTED: Ret = sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
const NO_PERMISSION: Ret = sys::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION;
const NOT_FOUND: Ret = sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
const INSUFFICIENT_SIZE: Ret = sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
const DRIVER_NOT_LOADED: Ret = sys::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED;
const GPU_IS_LOST: Ret = sys::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST;
const VERSION_MISMATCH: Ret = sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;

/// NVLinks of an H100 SXM (NVLink4).
const H100_NVLINKS: u32 = 18;
/// `NVML_STRUCT_VERSION(Memory, 2)`.
const MEMORY_V2_VERSION: c_uint =
    (std::mem::size_of::<sys::nvmlMemory_v2_t>() | (2 << 24)) as c_uint;

/// What `STALLSCOPE_FAKE_NVML` asked for.
#[derive(Clone, Debug, PartialEq)]
pub struct Script {
    /// Devices.
    pub gpus: u32,
    /// What each device does, throughout.
    pub activity: Activity,
    /// `scopeId = UINT_MAX` answered.
    pub all_links_scope: bool,
    /// Fields 197/198 known.
    pub pcie_counters: bool,
    /// Fields 197/198 given in 32 bits (so they wrap), not 64.
    pub pcie_32bit: bool,
    /// GPM supported.
    pub gpm: bool,
    /// NVLinks per device.
    pub nvlinks: u32,
    /// Per-process utilisation permitted.
    pub process_permission: bool,
    /// Per-process utilisation reports the job's ranks (by `LOCAL_RANK`), on reversed GPUs.
    pub processes: bool,
    /// `nvmlInit` succeeds.
    pub driver_loaded: bool,
    /// Once this file exists, every device call fails (a test creates it mid-run).
    pub lost_when: Option<std::path::PathBuf>,
}

impl Script {
    /// Parses `STALLSCOPE_FAKE_NVML`'s value (empty: one busy H100).
    pub fn parse(spec: &str) -> Result<Script, String> {
        let mut s = Script {
            gpus: 1,
            activity: Activity::h100_busy(),
            all_links_scope: true,
            pcie_counters: true,
            pcie_32bit: false,
            gpm: true,
            nvlinks: H100_NVLINKS,
            process_permission: true,
            processes: false,
            driver_loaded: true,
            lost_when: None,
        };
        let mut pcie = None;
        for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (key, value) = entry.split_once('=').unwrap_or((entry, ""));
            let number = || {
                value
                    .parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite() && *v >= 0.0)
                    .ok_or_else(|| format!("{key}= needs a number ≥ 0, got {value:?}"))
            };
            match key {
                "gpus" => s.gpus = number()? as u32,
                "activity" => {
                    s.activity = match value {
                        "idle" => Activity::h100_idle(),
                        "busy" => Activity::h100_busy(),
                        "copying_in" => Activity::h100_copying_in(),
                        "allreduce_nvlink" => Activity::h100_allreduce_nvlink(),
                        other => return Err(format!("unknown activity {other:?}")),
                    }
                }
                "pcie" => pcie = Some(number()?),
                "no_all_links_scope" => s.all_links_scope = false,
                "no_pcie_counters" => s.pcie_counters = false,
                "pcie_32bit" => s.pcie_32bit = true,
                "no_gpm" => s.gpm = false,
                "pcie_only" => s.nvlinks = 0,
                "no_process_permission" => s.process_permission = false,
                "processes" => s.processes = true,
                "no_driver" => s.driver_loaded = false,
                "lost_when" if !value.is_empty() => s.lost_when = Some(value.into()),
                other => return Err(format!("unknown entry {other:?}")),
            }
        }
        if let Some(bytes_per_s) = pcie {
            s.activity = s.activity.with_pcie(bytes_per_s);
        }
        if s.nvlinks == 0 {
            s.activity.nvlink_tx_bytes_per_s = 0.0;
            s.activity.nvlink_rx_bytes_per_s = 0.0;
        }
        Ok(s)
    }
}

/// One GPM sample: the device and the instant it was taken.
struct GpmSample {
    device: usize,
    /// ns on the script's clock; `None` before the sample is taken.
    at_ns: Option<u64>,
}

/// The loaded library: the script and the device behind it.
struct Fake {
    script: Script,
    started: Instant,
    clock: Arc<AtomicU64>,
    gpu: ScriptedGpu,
    /// Every capability, so the scripted device answers every reading.
    all: Capabilities,
}

impl Fake {
    /// Moves the scripted clock to now; ns since `nvmlInit`.
    fn tick(&self) -> u64 {
        let now = self.started.elapsed().as_nanos() as u64;
        self.clock.store(now, Ordering::Relaxed);
        now
    }

    fn lost(&self) -> bool {
        self.script.lost_when.as_ref().is_some_and(|p| p.exists())
    }

    fn fast(&mut self, device: usize) -> FastReading {
        self.tick();
        self.gpu
            .read_fast(device, &self.all)
            .expect("the scripted device always answers")
    }
}

static FAKE: Mutex<Option<Fake>> = Mutex::new(None);
/// One byte per device, so that each handle is a distinct valid address.
static HANDLES: [u8; 64] = [0; 64];

fn fake() -> MutexGuard<'static, Option<Fake>> {
    FAKE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `f` on the device behind `handle`, with NVML's errors for a bad handle, an
/// uninitialised library and a lost GPU.
fn with_device(handle: sys::nvmlDevice_t, f: impl FnOnce(&mut Fake, usize) -> Ret) -> Ret {
    let mut guard = fake();
    let Some(fake) = guard.as_mut() else {
        return UNINITIALIZED;
    };
    let offset = (handle as usize).wrapping_sub(HANDLES.as_ptr() as usize);
    if offset >= fake.script.gpus as usize {
        return INVALID_ARGUMENT;
    }
    if fake.lost() {
        return GPU_IS_LOST;
    }
    f(fake, offset)
}

/// Copies `text` into a C buffer of `length` bytes.
unsafe fn write_str(text: &str, out: *mut c_char, length: c_uint) -> Ret {
    if out.is_null() {
        return INVALID_ARGUMENT;
    }
    let bytes = text.as_bytes();
    if bytes.len() + 1 > length as usize {
        return INSUFFICIENT_SIZE;
    }
    std::ptr::copy_nonoverlapping(bytes.as_ptr().cast(), out, bytes.len());
    *out.add(bytes.len()) = 0;
    SUCCESS
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> Ret {
    let spec = std::env::var("STALLSCOPE_FAKE_NVML").unwrap_or_default();
    let script = match Script::parse(&spec) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("fake NVML: STALLSCOPE_FAKE_NVML={spec:?}: {e}");
            return INVALID_ARGUMENT;
        }
    };
    if !script.driver_loaded {
        return DRIVER_NOT_LOADED;
    }
    let mut guard = fake();
    if guard.is_none() {
        let clock = Arc::new(AtomicU64::new(0));
        let mut gpu = ScriptedGpu::h100_node(script.gpus.min(HANDLES.len() as u32), clock.clone());
        for d in 0..script.gpus as usize {
            gpu.set(d, 0, script.activity);
        }
        let all = Capabilities {
            entries: Metric::ALL.iter().map(|m| (*m, Ok(()))).collect(),
            notes: Vec::new(),
        };
        *guard = Some(Fake {
            script,
            started: Instant::now(),
            clock,
            gpu,
            all,
        });
    }
    SUCCESS
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Ret {
    nvmlInit_v2()
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> Ret {
    SUCCESS
}

#[no_mangle]
pub extern "C" fn nvmlErrorString(result: Ret) -> *const c_char {
    let text: &'static CStr = match result {
        SUCCESS => c"Success",
        UNINITIALIZED => c"Uninitialized",
        INVALID_ARGUMENT => c"Invalid Argument",
        NOT_SUPPORTED => c"Not Supported",
        NO_PERMISSION => c"Insufficient Permissions",
        NOT_FOUND => c"Not Found",
        INSUFFICIENT_SIZE => c"Insufficient Size",
        DRIVER_NOT_LOADED => c"Driver Not Loaded",
        GPU_IS_LOST => c"GPU is lost",
        _ => c"Unknown Error",
    };
    text.as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> Ret {
    match fake().as_ref() {
        Some(f) => write_str(&f.gpu.driver().driver_version, version, length),
        None => UNINITIALIZED,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> Ret {
    match fake().as_ref() {
        Some(f) => write_str(&f.gpu.driver().nvml_version, version, length),
        None => UNINITIALIZED,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> Ret {
    let guard = fake();
    let Some(f) = guard.as_ref() else {
        return UNINITIALIZED;
    };
    // "12.4" → 12040, as NVML encodes it (major × 1000 + minor × 10).
    let cuda = f.gpu.driver().cuda_version.unwrap_or_default();
    let (major, minor) = cuda.split_once('.').unwrap_or((&cuda, "0"));
    *version =
        major.parse::<c_int>().unwrap_or(0) * 1000 + minor.parse::<c_int>().unwrap_or(0) * 10;
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> Ret {
    match fake().as_ref() {
        Some(f) => {
            *count = f.script.gpus;
            SUCCESS
        }
        None => UNINITIALIZED,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut sys::nvmlDevice_t,
) -> Ret {
    match fake().as_ref() {
        Some(f) if index < f.script.gpus => {
            *device = HANDLES.as_ptr().add(index as usize) as sys::nvmlDevice_t;
            SUCCESS
        }
        Some(_) => INVALID_ARGUMENT,
        None => UNINITIALIZED,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: sys::nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> Ret {
    with_device(device, |f, d| {
        write_str(&f.gpu.devices()[d].name, name, length)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: sys::nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> Ret {
    with_device(device, |f, d| {
        write_str(&f.gpu.devices()[d].uuid, uuid, length)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: sys::nvmlDevice_t,
    pci: *mut sys::nvmlPciInfo_t,
) -> Ret {
    with_device(device, |f, d| {
        let bus_id = f.gpu.devices()[d].pci_bus_id.clone();
        // "00000000:19:00.0": domain, bus, device.function.
        let part = |i: usize| {
            let field = bus_id.split([':', '.']).nth(i).unwrap_or("0");
            c_uint::from_str_radix(field, 16).unwrap_or(0)
        };
        let p = &mut *pci;
        *p = std::mem::zeroed();
        p.domain = part(0);
        p.bus = part(1);
        p.device = part(2);
        // H100 SXM5 80GB: vendor 10de, device 2330.
        p.pciDeviceId = 0x2330_10de;
        p.pciSubSystemId = 0x16c1_10de;
        let legacy = format!("{:04X}:{:02X}:{:02X}.0", p.domain, p.bus, p.device);
        let ok = write_str(&legacy, p.busIdLegacy.as_mut_ptr(), 16);
        if ok != SUCCESS {
            return ok;
        }
        write_str(&bus_id, p.busId.as_mut_ptr(), 32)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: sys::nvmlDevice_t,
    kind: sys::nvmlClockType_t,
    clock: *mut c_uint,
) -> Ret {
    with_device(device, |f, d| {
        let r = f.fast(d);
        let mhz = match kind {
            sys::nvmlClockType_enum_NVML_CLOCK_SM | sys::nvmlClockType_enum_NVML_CLOCK_GRAPHICS => {
                r.sm_clock_mhz
            }
            sys::nvmlClockType_enum_NVML_CLOCK_MEM => r.mem_clock_mhz,
            _ => return NOT_SUPPORTED,
        };
        *clock = mhz.unwrap_or(0) as c_uint;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    device: sys::nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> Ret {
    with_device(device, |f, d| {
        *reasons = f.fast(d).throttle_reasons.unwrap_or(0);
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: sys::nvmlDevice_t,
    memory: *mut sys::nvmlMemory_v2_t,
) -> Ret {
    with_device(device, |f, d| {
        let m = &mut *memory;
        if m.version != MEMORY_V2_VERSION {
            return VERSION_MISMATCH;
        }
        let used = f.fast(d).memory_used_bytes.unwrap_or(0);
        m.total = H100_MEMORY_TOTAL_BYTES;
        m.reserved = 0;
        m.used = used;
        m.free = H100_MEMORY_TOTAL_BYTES.saturating_sub(used);
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: sys::nvmlDevice_t,
    utilization: *mut sys::nvmlUtilization_t,
) -> Ret {
    with_device(device, |f, d| {
        f.tick();
        let r = f.gpu.read_slow(d, &f.all).expect("scripted");
        (*utilization).gpu = r.util_pct.unwrap_or(0);
        (*utilization).memory = r.mem_util_pct.unwrap_or(0);
        SUCCESS
    })
}

mod fields;
mod gpm;
mod processes;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_reads_as_documented() {
        let s = Script::parse("gpus=2, activity=copying_in, pcie_only, lost_when=/tmp/x").unwrap();
        assert_eq!(s.gpus, 2);
        assert_eq!(s.nvlinks, 0);
        assert_eq!(s.lost_when, Some("/tmp/x".into()));
        assert_eq!(
            s.activity.pcie_rx_bytes_per_s,
            Activity::h100_copying_in().pcie_rx_bytes_per_s
        );
        assert_eq!(Script::parse("").unwrap().activity, Activity::h100_busy());
    }

    #[test]
    fn a_bad_script_is_refused_with_the_entry_named() {
        let e = Script::parse("gpus=two").unwrap_err();
        assert!(e.contains("gpus="), "{e}");
        let e = Script::parse("activity=dancing").unwrap_err();
        assert!(e.contains("dancing"), "{e}");
        let e = Script::parse("turbo").unwrap_err();
        assert!(e.contains("turbo"), "{e}");
    }
}
