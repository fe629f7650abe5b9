//! Which GPU a rank drives, and which of the node's series speak for it: the evidence in the
//! order it is trusted (the UUID the hook sent, NVML's per-process utilisation, the CUDA
//! device through `CUDA_VISIBLE_DEVICES`, the local rank, the node's only GPU).

use crate::attribution::GpuSeries;
use crate::series::{names, LABEL_GPU, LABEL_UUID};

use super::node::NodeTimeline;

impl NodeTimeline {
    /// The NVML index (label `gpu`) of the GPU that loop `pid` drives, from the first of: the
    /// `gpu_uuid` it sent; NVML's per-process utilisation naming its pid; the `cuda_device` it
    /// sent, through the `cuda_visible` list (`CUDA_VISIBLE_DEVICES`) when it sent one; its
    /// `local_rank`; the only GPU of the node.
    pub fn gpu_of(&self, pid: u32) -> Option<String> {
        let mut gpus: Vec<(&str, Option<&str>)> = self
            .series
            .named(names::GPU_PCIE_RX_BYTES)
            .chain(self.series.named(names::GPU_UTIL_PCT))
            .chain(self.series.named(names::GPU_POWER_MW))
            .filter_map(|d| Some((d.label(LABEL_GPU)?, d.label(LABEL_UUID))))
            .collect();
        gpus.sort_unstable();
        gpus.dedup_by(|a, b| a.0 == b.0);
        if gpus.is_empty() {
            return None;
        }
        let exists = |index: &str| gpus.iter().any(|g| g.0 == index).then(|| index.to_string());
        let by_uuid = |uuid: &str| {
            gpus.iter()
                .find(|g| g.1.is_some_and(|u| u.starts_with(uuid)))
                .map(|g| g.0.to_string())
        };
        let meta = self.markers.procs.get(&pid).map(|m| &m.meta);
        let get = |key: &str| meta.and_then(|m| m.get(key)).map(String::as_str);
        if let Some(found) = get("gpu_uuid").and_then(by_uuid) {
            return Some(found);
        }
        let pid_label = pid.to_string();
        if let Some(d) = self
            .series
            .named(names::GPU_PROC_SM_PCT)
            .find(|d| d.label("pid") == Some(&pid_label))
        {
            return d.label(LABEL_GPU).map(str::to_string);
        }
        if let Some(device) = get("cuda_device").and_then(|d| d.parse::<usize>().ok()) {
            let visible = get("cuda_visible").map(|v| v.split(':').nth(device));
            match visible {
                Some(Some(entry)) if entry.starts_with("GPU-") => return by_uuid(entry),
                Some(Some(entry)) => return exists(entry.trim()),
                Some(None) => {}
                None => return exists(&device.to_string()),
            }
        }
        if let Some(found) = get("local_rank").and_then(exists) {
            return Some(found);
        }
        (gpus.len() == 1).then(|| gpus[0].0.to_string())
    }

    /// The series of GPU `gpu` (NVML index) that speak for loop `pid`.
    pub(super) fn gpu_series(&self, pid: u32, gpu: &str) -> GpuSeries {
        let on_gpu = |name: &'static str| self.series.on_gpu(name, gpu).map(|d| d.id);
        let pid_label = pid.to_string();
        let own_sm = self
            .series
            .named(names::GPU_PROC_SM_PCT)
            .find(|d| d.label(LABEL_GPU) == Some(gpu) && d.label("pid") == Some(&pid_label))
            .map(|d| d.id);
        GpuSeries {
            busy_pct: on_gpu(names::GPU_UTIL_PCT).or(own_sm),
            pcie_rx: on_gpu(names::GPU_PCIE_RX_BYTES),
            pcie_tx: on_gpu(names::GPU_PCIE_TX_BYTES),
            nvlink: [names::GPU_NVLINK_RX_BYTES, names::GPU_NVLINK_TX_BYTES]
                .into_iter()
                .filter_map(on_gpu)
                .collect(),
        }
    }
}
