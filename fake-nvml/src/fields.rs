//! `nvmlDeviceGetFieldValues`: each requested field answered from the fast reading, with its
//! scope, value type and per-field return code.

use super::*;

/// Answers one field request from reading `r`: its value and type, or its return code.
fn answer_field(f: &Fake, r: &FastReading, v: &mut sys::nvmlFieldValue_t) {
    let nvlink = |bytes: Option<u64>| -> Result<u64, Ret> {
        let links = f.script.nvlinks;
        let kib = bytes.unwrap_or(0) / 1024;
        match v.scopeId {
            _ if links == 0 => Err(NOT_SUPPORTED),
            c_uint::MAX if f.script.all_links_scope => Ok(kib),
            c_uint::MAX => Err(INVALID_ARGUMENT),
            // Link 0 carries the remainder, so the links sum to the device's total.
            0 => Ok(kib / u64::from(links) + kib % u64::from(links)),
            link if link < links => Ok(kib / u64::from(links)),
            _ => Err(INVALID_ARGUMENT),
        }
    };
    let pcie = |bytes: Option<u64>| {
        if f.script.pcie_counters {
            Ok(bytes.unwrap_or(0))
        } else {
            Err(INVALID_ARGUMENT)
        }
    };
    let narrow = f.script.pcie_32bit;
    let value: Result<(u64, bool), Ret> = match v.fieldId {
        NVML_FI_DEV_PCIE_COUNT_TX_BYTES => pcie(r.pcie_tx_bytes).map(|b| (b, narrow)),
        NVML_FI_DEV_PCIE_COUNT_RX_BYTES => pcie(r.pcie_rx_bytes).map(|b| (b, narrow)),
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX => nvlink(r.nvlink_tx_bytes).map(|k| (k, false)),
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX => nvlink(r.nvlink_rx_bytes).map(|k| (k, false)),
        NVML_FI_DEV_NVLINK_LINK_COUNT => Ok((u64::from(f.script.nvlinks), true)),
        NVML_FI_DEV_POWER_INSTANT => Ok((r.power_mw.unwrap_or(0), true)),
        NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION => Ok((r.energy_mj.unwrap_or(0), false)),
        _ => Err(INVALID_ARGUMENT),
    };
    v.timestamp = f.started.elapsed().as_micros() as i64;
    v.latencyUsec = 0;
    match value {
        // Link counts and power as unsigned int (a counter so given wraps at 2^32), the other
        // counters as unsigned long long.
        Ok((x, true)) => {
            v.nvmlReturn = SUCCESS;
            v.valueType = sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT;
            v.value.uiVal = x as c_uint;
        }
        Ok((x, false)) => {
            v.nvmlReturn = SUCCESS;
            v.valueType = sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
            v.value.ullVal = x;
        }
        Err(code) => v.nvmlReturn = code,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: sys::nvmlDevice_t,
    count: c_int,
    values: *mut sys::nvmlFieldValue_t,
) -> Ret {
    if values.is_null() || count < 0 {
        return INVALID_ARGUMENT;
    }
    with_device(device, |f, d| {
        let r = f.fast(d);
        let values = std::slice::from_raw_parts_mut(values, count as usize);
        for v in values {
            answer_field(f, &r, v);
        }
        SUCCESS
    })
}
