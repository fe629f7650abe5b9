//! What each rank's GPU did per iteration: the figures a user checks first on a GPU job
//! (busy share, bytes over PCIe and NVLink, energy), next to the batch the loop copied in.
//!
//! Samples are pruned as iterations are attributed, so the figures are accumulated then, per
//! rank, over the counted (post-warm-up) iterations, from the same series attribution reads.
//! PCIe bytes received per iteration next to the bytes of one batch tell at a glance whether
//! the host-to-device copies are the batch (≈ 1×), or something else crosses PCIe every step.

use serde::{Deserialize, Serialize};

use crate::series::{names, LABEL_UUID};
use crate::timeline::SeriesStore;
use crate::Nanos;

/// What a rank's GPU did in one iteration: the readings [`GpuUsage`] sums, and what a node's
/// agent ships with the iteration so that a job's collector shows every rank's GPU. In whole
/// units (ppm, mW, bytes, mJ) so that frames stay exact and compact. A reading NVML did not
/// give is `None`, never 0.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvmlReading {
    /// NVML index of the GPU.
    pub gpu: String,
    /// Its UUID (`GPU-…`), when NVML gave one.
    pub uuid: Option<String>,
    /// Whether the iteration's GPU times came from CUDA events.
    pub cuda_timed: bool,
    /// Share of the iteration a kernel ran (NVML utilisation, time-weighted), parts per
    /// million.
    pub busy_ppm: Option<u32>,
    /// mW, mean board power over the iteration.
    pub power_mw: Option<u64>,
    /// bytes received over PCIe in the iteration.
    pub pcie_rx_bytes: Option<u64>,
    /// bytes sent over PCIe in the iteration.
    pub pcie_tx_bytes: Option<u64>,
    /// bytes over NVLink in the iteration, both directions.
    pub nvlink_bytes: Option<u64>,
    /// mJ the GPU used in the iteration.
    pub energy_mj: Option<u64>,
    /// bytes of one batch as the loop's DataLoader returned it (`batch_bytes` meta), when the
    /// loop said.
    pub batch_bytes: Option<u64>,
}

/// The `gpu` of a reading that NVML could not give: `cuda:` and the CUDA device index the loop
/// said it drives (NVML indices are plain numbers, so the two never clash).
pub const UNMEASURED_PREFIX: &str = "cuda:";

impl NvmlReading {
    /// An iteration of a loop timed with CUDA events (on `cuda_device`, as it said) on a node
    /// where NVML gave no GPU: every reading is `None`.
    pub fn unmeasured(
        cuda_device: Option<&str>,
        cuda_timed: bool,
        batch_bytes: Option<u64>,
    ) -> NvmlReading {
        NvmlReading {
            gpu: format!("{UNMEASURED_PREFIX}{}", cuda_device.unwrap_or("?")),
            cuda_timed,
            batch_bytes,
            ..NvmlReading::default()
        }
    }

    /// Reads iteration `[a, b]` on GPU `gpu` (NVML index label) from the series NVML filled.
    pub fn read(
        store: &SeriesStore,
        gpu: &str,
        (a, b): (Nanos, Nanos),
        cuda_timed: bool,
        batch_bytes: Option<u64>,
    ) -> NvmlReading {
        let on_gpu = |name: &'static str| store.on_gpu(name, gpu);
        let uuid = [
            names::GPU_PCIE_RX_BYTES,
            names::GPU_UTIL_PCT,
            names::GPU_POWER_MW,
        ]
        .into_iter()
        .filter_map(on_gpu)
        .find_map(|d| d.label(LABEL_UUID).map(str::to_string));
        let delta = |name| on_gpu(name).and_then(|d| store.counter_delta(d.id, a, b));
        let mean = |name| on_gpu(name).and_then(|d| store.gauge_mean(d.id, a, b));
        let nvlink = [names::GPU_NVLINK_RX_BYTES, names::GPU_NVLINK_TX_BYTES]
            .into_iter()
            .filter_map(delta)
            .reduce(|x, y| x + y);
        let whole = |v: f64| v.max(0.0).round() as u64;
        NvmlReading {
            gpu: gpu.to_string(),
            uuid,
            cuda_timed,
            busy_ppm: mean(names::GPU_UTIL_PCT).map(|p| (p * 1e4).clamp(0.0, 1e6).round() as u32),
            power_mw: mean(names::GPU_POWER_MW).map(whole),
            pcie_rx_bytes: delta(names::GPU_PCIE_RX_BYTES).map(whole),
            pcie_tx_bytes: delta(names::GPU_PCIE_TX_BYTES).map(whole),
            nvlink_bytes: nvlink.map(whole),
            energy_mj: delta(names::GPU_ENERGY_MJ).map(whole),
            batch_bytes,
        }
    }

    /// How many of the six NVML readings (busy, power, PCIe in and out, NVLink, energy) the
    /// iteration has; 0 when NVML gave none (a GPU lost mid-run).
    pub fn readings(&self) -> usize {
        [
            self.busy_ppm.is_some(),
            self.power_mw.is_some(),
            self.pcie_rx_bytes.is_some(),
            self.pcie_tx_bytes.is_some(),
            self.nvlink_bytes.is_some(),
            self.energy_mj.is_some(),
        ]
        .into_iter()
        .filter(|present| *present)
        .count()
    }
}

/// Sums over one rank's counted iterations on its GPU.
#[derive(Clone, Debug, Default)]
pub struct GpuUsage {
    /// NVML index of the GPU.
    pub gpu: String,
    /// Its UUID, when NVML gave one.
    pub uuid: Option<String>,
    /// Iterations summed.
    pub iterations: u64,
    /// Iterations whose GPU times came from CUDA events.
    pub cuda_timed: u64,
    /// ns summed over the iterations' wall times.
    pub wall_ns: u64,
    /// Iterations with at least one GPU reading (a GPU lost mid-run gives none after).
    pub read: u64,
    /// bytes of one batch, as the loop last said.
    pub batch_bytes: Option<u64>,
    /// ns × (busy share) where utilisation was read, and the ns it was read over.
    busy: Option<(f64, f64)>,
    /// ns × mW where power was read, and the ns it was read over.
    power: Option<(f64, f64)>,
    /// bytes, received over PCIe.
    pcie_rx: Option<PerIteration>,
    /// bytes, sent over PCIe.
    pcie_tx: Option<PerIteration>,
    /// bytes, NVLink both directions.
    nvlink: Option<PerIteration>,
    /// mJ.
    energy: Option<PerIteration>,
}

/// A quantity summed over the iterations that had it, so that iterations without the
/// reading do not dilute the mean.
#[derive(Clone, Copy, Debug, Default)]
struct PerIteration {
    total: f64,
    iterations: u64,
}

impl PerIteration {
    fn mean(self) -> f64 {
        self.total / self.iterations.max(1) as f64
    }
}

/// Adds one iteration's `v`.
fn add(acc: &mut Option<PerIteration>, v: Option<u64>) {
    if let Some(v) = v {
        let sum = acc.get_or_insert_with(PerIteration::default);
        sum.total += v as f64;
        sum.iterations += 1;
    }
}

/// Adds one iteration's time-weighted `mean` over `ns`.
fn add_mean(acc: &mut Option<(f64, f64)>, mean: Option<f64>, ns: f64) {
    if let Some(m) = mean {
        let (sum, over) = acc.unwrap_or((0.0, 0.0));
        *acc = Some((sum + m * ns, over + ns));
    }
}

impl GpuUsage {
    /// Adds one iteration's readings, over `wall_ns` of the rank's time.
    pub fn add(&mut self, it: &NvmlReading, wall_ns: u64) {
        if self.gpu != it.gpu {
            // The first iterations may go by a guess (local rank, the node's only GPU) that
            // better evidence (NVML seeing the process on a device) corrects: the figures are
            // of the GPU the rank is on now.
            *self = GpuUsage {
                gpu: it.gpu.clone(),
                ..GpuUsage::default()
            };
        }
        // Compared first: the same UUID comes with every iteration, and a copy of it each
        // time was 1.3% of a 10,000-rank collector's job thread.
        if it.uuid.is_some() && it.uuid != self.uuid {
            self.uuid.clone_from(&it.uuid);
        }
        if it.batch_bytes.is_some() {
            self.batch_bytes = it.batch_bytes;
        }
        let ns = wall_ns as f64;
        self.iterations += 1;
        self.cuda_timed += u64::from(it.cuda_timed);
        self.wall_ns += wall_ns;
        self.read += u64::from(it.readings() > 0);
        add_mean(&mut self.busy, it.busy_ppm.map(|p| f64::from(p) / 1e6), ns);
        add_mean(&mut self.power, it.power_mw.map(|p| p as f64), ns);
        add(&mut self.pcie_rx, it.pcie_rx_bytes);
        add(&mut self.pcie_tx, it.pcie_tx_bytes);
        add(&mut self.nvlink, it.nvlink_bytes);
        add(&mut self.energy, it.energy_mj);
    }

    /// The per-iteration figures.
    pub fn figures(&self) -> RankGpu {
        let n = self.iterations.max(1) as f64;
        RankGpu {
            gpu: self.gpu.clone(),
            uuid: self.uuid.clone(),
            busy_fraction: self.busy.filter(|b| b.1 > 0.0).map(|(s, over)| s / over),
            power_watts: self
                .power
                .filter(|p| p.1 > 0.0)
                .map(|(s, over)| s / over / 1e3),
            pcie_rx_bytes_per_iteration: self.pcie_rx.map(PerIteration::mean),
            pcie_tx_bytes_per_iteration: self.pcie_tx.map(PerIteration::mean),
            nvlink_bytes_per_iteration: self.nvlink.map(PerIteration::mean),
            energy_joules_per_iteration: self.energy.map(|e| e.mean() / 1e3),
            batch_bytes: self.batch_bytes,
            cuda_timed_fraction: self.cuda_timed as f64 / n,
            read_fraction: self.read as f64 / n,
        }
    }
}

/// A rank's GPU, per counted iteration. Fields NVML did not give are `null`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankGpu {
    /// NVML index.
    pub gpu: String,
    /// `GPU-…`.
    pub uuid: Option<String>,
    /// Share of the time a kernel ran (NVML utilisation, time-weighted), 0–1.
    pub busy_fraction: Option<f64>,
    /// W, mean board power.
    pub power_watts: Option<f64>,
    /// bytes received over PCIe per iteration (host-to-device copies, peer traffic in).
    pub pcie_rx_bytes_per_iteration: Option<f64>,
    /// bytes sent over PCIe per iteration.
    pub pcie_tx_bytes_per_iteration: Option<f64>,
    /// bytes over NVLink per iteration, both directions.
    pub nvlink_bytes_per_iteration: Option<f64>,
    /// J per iteration.
    pub energy_joules_per_iteration: Option<f64>,
    /// bytes of one batch as the DataLoader returned it (`batch_bytes` meta), to compare with
    /// the PCIe bytes received.
    pub batch_bytes: Option<u64>,
    /// Share of the iterations timed on the GPU with CUDA events, 0–1.
    pub cuda_timed_fraction: f64,
    /// Share of the iterations with any NVML reading, 0–1 (below 1 when the GPU source
    /// failed during the run); the per-iteration figures are over those iterations.
    #[serde(default = "one")]
    pub read_fraction: f64,
}

/// A profile written before `read_fraction` existed had readings on every iteration.
fn one() -> f64 {
    1.0
}

/// `bytes` with a decimal unit: `12.6 MB`.
pub fn human_bytes(bytes: f64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut v = bytes;
    let mut unit = 0;
    while v.abs() >= 1000.0 && unit < UNITS.len() - 1 {
        v /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{v:.0} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// One line for the text summary: `rank 0 on GPU 0: 87% busy, …`, or `rank 3 on node-b GPU
/// 1: …` when the rank's node is known (a job across nodes).
pub fn render_line(rank: u32, node: Option<&str>, g: &RankGpu) -> String {
    let mut parts = Vec::new();
    if let Some(b) = g.busy_fraction {
        parts.push(format!("{:.0}% busy", b * 100.0));
    }
    if let Some(rx) = g.pcie_rx_bytes_per_iteration {
        let mut s = format!("PCIe in {}/iteration", human_bytes(rx));
        if let Some(batch) = g.batch_bytes.filter(|b| *b > 0) {
            s.push_str(&format!(
                " ({:.2}× the {} batch)",
                rx / batch as f64,
                human_bytes(batch as f64)
            ));
        }
        parts.push(s);
    }
    if let Some(tx) = g.pcie_tx_bytes_per_iteration {
        parts.push(format!("out {}", human_bytes(tx)));
    }
    if let Some(nv) = g.nvlink_bytes_per_iteration {
        parts.push(format!("NVLink {}/iteration", human_bytes(nv)));
    }
    if let Some(w) = g.power_watts {
        parts.push(format!("{w:.0} W"));
    }
    if let Some(j) = g.energy_joules_per_iteration {
        parts.push(format!("{j:.1} J/iteration"));
    }
    parts.push(format!(
        "GPU times from CUDA events on {:.0}% of iterations",
        g.cuda_timed_fraction * 100.0
    ));
    if g.read_fraction == 0.0 {
        parts.push(
            "no NVML readings: busy, power, PCIe and NVLink are not measured (is the NVIDIA driver's libnvidia-ml there? `stallscope doctor` tells)"
                .into(),
        );
    } else if g.read_fraction < 1.0 {
        parts.push(format!(
            "NVML readings on only {:.0}% of iterations (figures are over those)",
            g.read_fraction * 100.0
        ));
    }
    let on = node.map_or_else(String::new, |n| format!("{n} "));
    format!(
        "gpu: rank {rank} on {on}GPU {}: {}",
        g.gpu,
        parts.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::series::{SampleBatch, SeriesDecl, SeriesId, SeriesKind};

    /// Two GPUs whose PCIe counters grow 1 and 2 GB per second, sampled every 100 ms.
    fn two_gpus() -> SeriesStore {
        let mut store = SeriesStore::default();
        for gpu in 0..2u32 {
            store.declare(SeriesDecl {
                id: SeriesId(gpu),
                name: names::GPU_PCIE_RX_BYTES.into(),
                unit: "bytes".into(),
                kind: SeriesKind::Counter,
                labels: vec![("gpu".into(), gpu.to_string())],
            });
        }
        for k in 0..=20u64 {
            store.ingest(&SampleBatch {
                t_ns: k * 100_000_000,
                dur_ns: 0,
                values: vec![
                    (SeriesId(0), k * 100_000_000),
                    (SeriesId(1), k * 200_000_000),
                ],
            });
        }
        store
    }

    #[test]
    fn a_rank_found_on_another_gpu_shows_that_gpu_alone() {
        let store = two_gpus();
        let mut usage = GpuUsage::default();
        for (gpu, a) in [("0", 0), ("1", 500_000_000), ("1", 1_000_000_000)] {
            let b = a + 500_000_000;
            usage.add(&NvmlReading::read(&store, gpu, (a, b), false, None), b - a);
        }
        let g = usage.figures();
        assert_eq!(g.gpu, "1");
        assert_eq!(usage.iterations, 2);
        let rx = g.pcie_rx_bytes_per_iteration.unwrap();
        assert!(
            (rx - 1e9).abs() < 1.0,
            "2 GB/s over 0.5 s, not mixed with GPU 0: {rx}"
        );
    }

    #[test]
    fn bytes_read_as_people_write_them() {
        assert_eq!(human_bytes(512.0), "512 B");
        assert_eq!(human_bytes(12_600_000.0), "12.6 MB");
        assert_eq!(human_bytes(3.1e12), "3.1 TB");
    }

    #[test]
    fn the_line_compares_pcie_bytes_with_the_batch() {
        let g = RankGpu {
            gpu: "0".into(),
            busy_fraction: Some(0.874),
            pcie_rx_bytes_per_iteration: Some(25_200_000.0),
            batch_bytes: Some(12_600_000),
            cuda_timed_fraction: 1.0,
            read_fraction: 1.0,
            ..RankGpu::default()
        };
        let line = render_line(3, None, &g);
        assert!(line.starts_with("gpu: rank 3 on GPU 0: 87% busy"), "{line}");
        let across = render_line(3, Some("node-b"), &g);
        assert!(
            across.starts_with("gpu: rank 3 on node-b GPU 0: 87%"),
            "{across}"
        );
        assert!(
            line.contains("PCIe in 25.2 MB/iteration (2.00× the 12.6 MB batch)"),
            "{line}"
        );
        assert!(
            !line.contains("NVLink"),
            "absent readings are left out: {line}"
        );
    }
}
