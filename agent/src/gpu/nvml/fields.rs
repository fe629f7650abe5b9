//! NVML field values: the request entries (with their scope), the value read back in 64 bits
//! whatever its type, the counters that come in fewer bits unwrapped, and the probes.

use super::*;

/// A counter NVML may give in fewer than 64 bits, unwrapped into one that only grows.
/// Fields 197/198 are documented as "can be wrapped", and code that reads them takes them as
/// unsigned int: 32 bits wrap every 4.29 GB, every 78 ms at 55 GB/s, so each wrap is seen as
/// long as two reads are closer than that (the fast tier at 100 Hz reads every 10 ms).
/// A 64-bit counter that goes down was reset, and is left for the analysis to skip.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Unwrapped {
    pub(super) last: Option<u64>,
    /// Added for the wraps seen so far.
    pub(super) wrapped: u64,
}

impl Unwrapped {
    /// The unwrapped value of `raw`, a counter of `bits` bits.
    pub(super) fn next(&mut self, raw: u64, bits: u32) -> u64 {
        if bits < 64 && self.last.is_some_and(|last| raw < last) {
            self.wrapped += 1u64 << bits;
        }
        self.last = Some(raw);
        self.wrapped + raw
    }
}

/// A field value as u64 (`None` for a negative or non-finite value).
pub(super) fn field_u64(f: &sys::nvmlFieldValue_t) -> Option<u64> {
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
pub(super) fn field_bits(f: &sys::nvmlFieldValue_t) -> u32 {
    match f.valueType {
        sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT
        | sys::nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_INT => 32,
        sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_SHORT => 16,
        _ => 64,
    }
}

pub(super) fn field(id: u32, scope: c_uint) -> sys::nvmlFieldValue_t {
    // SAFETY: a plain C struct; all-zero is a valid request before the id is set.
    let mut f: sys::nvmlFieldValue_t = unsafe { std::mem::zeroed() };
    f.fieldId = id;
    f.scopeId = scope;
    f
}

/// Calls `nvmlDeviceGetFieldValues` on `fields` in place.
pub(super) fn get_fields(
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
pub(super) fn probe_field(
    lib: &NvmlLib,
    handle: sys::nvmlDevice_t,
    id: u32,
    scope: c_uint,
) -> Result<(), String> {
    probe_field_bits(lib, handle, id, scope).map(drop)
}

/// [`probe_field`], with the bits of the value's type when the driver answers.
pub(super) fn probe_field_bits(
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
