//! What the GPU source asks of NVML, as a trait: the real library ([`super::nvml`]) and a
//! scripted stand-in ([`super::fake`]) answer the same questions, so every line above the NVML
//! calls — capability handling, series, tiers, the thread — is the same for both.
//!
//! "Unsupported" is a value, not an error: [`Capabilities`] says per device which readings
//! exist, decided once when the device is probed, and a reading that is not supported is
//! `None`, never 0.

use crate::sources::Tier;

/// The driver as NVML reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DriverInfo {
    /// Kernel driver version (`550.90.07`).
    pub driver_version: String,
    /// NVML library version.
    pub nvml_version: String,
    /// CUDA driver API version (`12.4`), when reported.
    pub cuda_version: Option<String>,
}

/// One GPU, as enumerated once when the backend opens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// NVML index (not necessarily the CUDA index under `CUDA_VISIBLE_DEVICES`).
    pub index: u32,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// Product name (`NVIDIA H100 80GB HBM3`).
    pub name: String,
    /// PCI bus id (`00000000:19:00.0`).
    pub pci_bus_id: String,
    /// NVLinks of the device (0 on a PCIe-only card), `None` when NVML cannot tell.
    pub nvlinks: Option<u32>,
}

/// A reading the GPU source takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Metric {
    /// bytes sent over PCIe, field 197.
    PcieTx,
    /// bytes received over PCIe, field 198.
    PcieRx,
    /// NVLink data bytes sent, all links (field 138).
    NvlinkTx,
    /// NVLink data bytes received, all links (field 139).
    NvlinkRx,
    /// instant power, field 186.
    Power,
    /// total energy, field 83.
    Energy,
    /// SM clock.
    SmClock,
    /// memory clock.
    MemClock,
    /// clock-throttle reasons.
    Throttle,
    /// device memory used.
    MemoryUsed,
    /// utilisation rates (GPU, memory).
    Utilization,
    /// per-process SM utilisation.
    ProcessUtilization,
    /// GPU performance monitoring (Hopper and newer).
    Gpm,
}

impl Metric {
    /// Every reading, in the order `stallscope doctor` lists them.
    pub const ALL: [Metric; 13] = [
        Metric::PcieTx,
        Metric::PcieRx,
        Metric::NvlinkTx,
        Metric::NvlinkRx,
        Metric::Power,
        Metric::Energy,
        Metric::SmClock,
        Metric::MemClock,
        Metric::Throttle,
        Metric::MemoryUsed,
        Metric::Utilization,
        Metric::ProcessUtilization,
        Metric::Gpm,
    ];

    /// Short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Metric::PcieTx => "pcie_tx_bytes (field 197)",
            Metric::PcieRx => "pcie_rx_bytes (field 198)",
            Metric::NvlinkTx => "nvlink_tx_bytes (field 138)",
            Metric::NvlinkRx => "nvlink_rx_bytes (field 139)",
            Metric::Power => "power_instant (field 186)",
            Metric::Energy => "total_energy (field 83)",
            Metric::SmClock => "sm_clock",
            Metric::MemClock => "mem_clock",
            Metric::Throttle => "throttle_reasons",
            Metric::MemoryUsed => "memory_used",
            Metric::Utilization => "utilization_rates",
            Metric::ProcessUtilization => "process_utilization",
            Metric::Gpm => "gpm (sm, tensor, dram, pcie, nvlink)",
        }
    }

    /// How often it is read.
    pub fn tier(self) -> Tier {
        match self {
            Metric::Utilization | Metric::ProcessUtilization | Metric::Gpm => Tier::Slow,
            _ => Tier::Fast,
        }
    }
}

/// Which readings a device supports, decided once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// Per reading: supported, or why not.
    pub entries: Vec<(Metric, Result<(), String>)>,
    /// How some supported readings are taken, where a device differs from the usual way
    /// (NVLink bytes asked per link because the driver refuses the all-links scope).
    pub notes: Vec<(Metric, String)>,
}

impl Capabilities {
    /// Whether `metric` is supported.
    pub fn has(&self, metric: Metric) -> bool {
        self.entries.iter().any(|(m, r)| *m == metric && r.is_ok())
    }

    /// How `metric` is taken on this device, when that is worth saying.
    pub fn note(&self, metric: Metric) -> Option<&str> {
        self.notes
            .iter()
            .find(|(m, _)| *m == metric)
            .map(|(_, n)| n.as_str())
    }
}

/// The fast tier of one device: what one round reads. `None` = not supported, or the call
/// failed this time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FastReading {
    /// bytes, cumulative, NVML field 197.
    pub pcie_tx_bytes: Option<u64>,
    /// bytes, cumulative, NVML field 198.
    pub pcie_rx_bytes: Option<u64>,
    /// bytes, cumulative, NVML field 138 (KiB) × 1024, all links.
    pub nvlink_tx_bytes: Option<u64>,
    /// bytes, cumulative, NVML field 139 (KiB) × 1024, all links.
    pub nvlink_rx_bytes: Option<u64>,
    /// mW, instant, NVML field 186.
    pub power_mw: Option<u64>,
    /// mJ, cumulative since the driver loaded, NVML field 83.
    pub energy_mj: Option<u64>,
    /// MHz.
    pub sm_clock_mhz: Option<u64>,
    /// MHz.
    pub mem_clock_mhz: Option<u64>,
    /// NVML throttle-reason bitmask.
    pub throttle_reasons: Option<u64>,
    /// bytes.
    pub memory_used_bytes: Option<u64>,
}

/// GPM metrics of one device over the last slow interval.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GpmReading {
    /// %, SM activity.
    pub sm_activity_pct: Option<f64>,
    /// %, any tensor pipe active.
    pub tensor_activity_pct: Option<f64>,
    /// %, DRAM bandwidth of the peak.
    pub dram_bw_pct: Option<f64>,
    /// bytes/s.
    pub pcie_tx_bytes_per_s: Option<f64>,
    /// bytes/s.
    pub pcie_rx_bytes_per_s: Option<f64>,
    /// bytes/s, all links.
    pub nvlink_tx_bytes_per_s: Option<f64>,
    /// bytes/s, all links.
    pub nvlink_rx_bytes_per_s: Option<f64>,
}

/// One process's share of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessUtil {
    /// Process id (host namespace).
    pub pid: u32,
    /// %, SM utilisation.
    pub sm_pct: u32,
}

/// The slow tier of one device.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SlowReading {
    /// %, time a kernel ran over NVML's sample period.
    pub util_pct: Option<u32>,
    /// %, time memory was read or written.
    pub mem_util_pct: Option<u32>,
    /// GPM metrics, when supported and two samples exist.
    pub gpm: Option<GpmReading>,
    /// Processes NVML saw on the device since the previous read.
    pub processes: Vec<ProcessUtil>,
}

/// Why NVML could not be used.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// The library is not there, or does not initialise.
    #[error("no NVIDIA driver found ({0})")]
    NoDriver(String),
    /// A call failed on a device.
    #[error("{call} failed on GPU {device}: {message}")]
    Call {
        /// The NVML call.
        call: &'static str,
        /// NVML index.
        device: u32,
        /// NVML's message.
        message: String,
    },
}

/// The NVML calls the GPU source makes. Implementations block (NVML calls do); they run on
/// the GPU thread only.
pub trait GpuBackend: Send {
    /// The driver.
    fn driver(&self) -> DriverInfo;
    /// The devices, enumerated once.
    fn devices(&self) -> &[DeviceInfo];
    /// Tries each reading once on device `device` (position in [`GpuBackend::devices`]).
    fn probe(&mut self, device: usize) -> Capabilities;
    /// Reads the fast tier of a device, only what `caps` supports.
    fn read_fast(&mut self, device: usize, caps: &Capabilities) -> Result<FastReading, GpuError>;
    /// Reads the slow tier of a device, only what `caps` supports.
    fn read_slow(&mut self, device: usize, caps: &Capabilities) -> Result<SlowReading, GpuError>;
}
