//! GPU Performance Monitoring through the raw NVML table (the wrapper has none): two samples
//! alternated at least 100 ms apart, and the metrics read between them.

use super::*;

/// GPM metrics read, in [`GpmReading`] order.
pub(super) const GPM_METRICS: [c_uint; 7] = [
    sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL,
    sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_DRAM_BW_UTIL,
    sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_TX_PER_SEC,
    sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_RX_PER_SEC,
    sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC,
    sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC,
];

pub(super) struct Gpm {
    pub(super) samples: [sys::nvmlGpmSample_t; 2],
    /// Which of `samples` holds the previous read, once there is one.
    pub(super) previous: Option<usize>,
}

pub(super) fn probe_gpm(lib: &NvmlLib, dev: &mut Dev) -> Result<(), String> {
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

pub(super) fn read_gpm(lib: &NvmlLib, dev: &mut Dev) -> Result<Option<GpmReading>, String> {
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
