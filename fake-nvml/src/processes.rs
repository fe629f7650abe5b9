//! The per-process query, in NVML's two calls: the job's ranks, found by `LOCAL_RANK` in
//! their environment, on the GPUs the scripted quirks put them on.

use super::*;

/// Processes below this one (the job under `stallscope run`) with their `LOCAL_RANK`.
fn local_ranks_below_me() -> Vec<(u32, usize)> {
    let me = std::process::id();
    let mut parent_of = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let ppid = stat
            .rfind(')')
            .and_then(|close| stat[close + 1..].split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(ppid) = ppid {
            parent_of.push((pid, ppid));
        }
    }
    let below_me = |mut pid: u32| {
        for _ in 0..64 {
            match parent_of.iter().find(|(p, _)| *p == pid) {
                Some((_, ppid)) if *ppid == me => return true,
                Some((_, ppid)) => pid = *ppid,
                None => return false,
            }
        }
        false
    };
    let local_rank = |pid: u32| {
        let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        env.split(|b| *b == 0)
            .find_map(|kv| kv.strip_prefix(b"LOCAL_RANK="))
            .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
    };
    parent_of
        .iter()
        .filter(|(pid, _)| below_me(*pid))
        .filter_map(|(pid, _)| Some((*pid, local_rank(*pid)?)))
        .collect()
}

/// The processes on device `d`: with `processes`, the ranks whose reversed local rank is `d`.
fn processes_on(f: &Fake, d: usize) -> Vec<u32> {
    if !f.script.processes {
        return Vec::new();
    }
    let gpus = f.script.gpus as usize;
    local_ranks_below_me()
        .into_iter()
        .filter(|(_, k)| gpus - 1 - k % gpus == d)
        .map(|(pid, _)| pid)
        .collect()
}

/// Each process on the device ran kernels for the device's whole busy share since the last
/// read; with none, NVML answers "not found". Asked with too small a buffer (nvml-wrapper
/// asks first with none), it says how many samples there are.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: sys::nvmlDevice_t,
    samples: *mut sys::nvmlProcessUtilizationSample_t,
    count: *mut c_uint,
    last_seen_us: c_ulonglong,
) -> Ret {
    if count.is_null() {
        return INVALID_ARGUMENT;
    }
    with_device(device, |f, d| {
        if !f.script.process_permission {
            return NO_PERMISSION;
        }
        let pids = processes_on(f, d);
        if pids.is_empty() {
            *count = 0;
            return NOT_FOUND;
        }
        if samples.is_null() || (*count as usize) < pids.len() {
            *count = pids.len() as c_uint;
            return INSUFFICIENT_SIZE;
        }
        f.tick();
        let util = f
            .gpu
            .read_slow(d, &f.all)
            .expect("scripted")
            .util_pct
            .unwrap_or(0);
        let now_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |t| t.as_micros() as u64)
            .max(last_seen_us + 1);
        for (k, pid) in pids.iter().enumerate() {
            *samples.add(k) = sys::nvmlProcessUtilizationSample_t {
                pid: *pid,
                timeStamp: now_us,
                smUtil: util,
                memUtil: util * 2 / 5,
                encUtil: 0,
                decUtil: 0,
            };
        }
        *count = pids.len() as c_uint;
        SUCCESS
    })
}
