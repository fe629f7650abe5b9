//! GPU Performance Monitoring: sample allocation, sampling and the metrics between two
//! samples.

use super::*;

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmQueryDeviceSupport(
    device: sys::nvmlDevice_t,
    support: *mut sys::nvmlGpmSupport_t,
) -> Ret {
    with_device(device, |f, _| {
        let s = &mut *support;
        if s.version != sys::NVML_GPM_SUPPORT_VERSION {
            return VERSION_MISMATCH;
        }
        s.isSupportedDevice = c_uint::from(f.script.gpm);
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmSampleAlloc(sample: *mut sys::nvmlGpmSample_t) -> Ret {
    if sample.is_null() {
        return INVALID_ARGUMENT;
    }
    let s = Box::new(GpmSample {
        device: usize::MAX,
        at_ns: None,
    });
    *sample = Box::into_raw(s).cast();
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmSampleFree(sample: sys::nvmlGpmSample_t) -> Ret {
    if !sample.is_null() {
        drop(Box::from_raw(sample.cast::<GpmSample>()));
    }
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmSampleGet(
    device: sys::nvmlDevice_t,
    sample: sys::nvmlGpmSample_t,
) -> Ret {
    if sample.is_null() {
        return INVALID_ARGUMENT;
    }
    with_device(device, |f, d| {
        if !f.script.gpm {
            return NOT_SUPPORTED;
        }
        let s = &mut *sample.cast::<GpmSample>();
        s.device = d;
        s.at_ns = Some(f.tick());
        SUCCESS
    })
}

/// Metrics over the interval between two samples of one device, in the units NVML gives
/// (% and MiB/s): the scripted device's means over the slow tier's window ending at the
/// second sample.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpmMetricsGet(request: *mut sys::nvmlGpmMetricsGet_t) -> Ret {
    let Some(req) = request.as_mut() else {
        return INVALID_ARGUMENT;
    };
    if req.version != sys::NVML_GPM_METRICS_GET_VERSION {
        return VERSION_MISMATCH;
    }
    let (Some(s1), Some(s2)) = (
        req.sample1.cast::<GpmSample>().as_ref(),
        req.sample2.cast::<GpmSample>().as_ref(),
    ) else {
        return INVALID_ARGUMENT;
    };
    let (Some(t1), Some(t2)) = (s1.at_ns, s2.at_ns) else {
        return INVALID_ARGUMENT;
    };
    if s1.device != s2.device || t2 <= t1 {
        return INVALID_ARGUMENT;
    }
    let mut guard = fake();
    let Some(f) = guard.as_mut() else {
        return UNINITIALIZED;
    };
    f.clock.store(t2, Ordering::Relaxed);
    let gpm = f
        .gpu
        .read_slow(s2.device, &f.all)
        .expect("scripted")
        .gpm
        .unwrap_or_default();
    const MIB: f64 = 1024.0 * 1024.0;
    let n = (req.numMetrics as usize).min(req.metrics.len());
    for m in &mut req.metrics[..n] {
        let value = match m.metricId {
            sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL => gpm.sm_activity_pct,
            sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_ANY_TENSOR_UTIL => gpm.tensor_activity_pct,
            sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_DRAM_BW_UTIL => gpm.dram_bw_pct,
            sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_TX_PER_SEC => {
                gpm.pcie_tx_bytes_per_s.map(|b| b / MIB)
            }
            sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_RX_PER_SEC => {
                gpm.pcie_rx_bytes_per_s.map(|b| b / MIB)
            }
            sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC => {
                gpm.nvlink_tx_bytes_per_s.map(|b| b / MIB)
            }
            sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC => {
                gpm.nvlink_rx_bytes_per_s.map(|b| b / MIB)
            }
            _ => None,
        };
        match value {
            Some(v) => {
                m.nvmlReturn = SUCCESS;
                m.value = v;
            }
            None => m.nvmlReturn = NOT_SUPPORTED,
        }
    }
    SUCCESS
}
