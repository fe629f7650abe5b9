//! The eBPF side: loads `bpf/thread_states.bpf.c` (built by `build.rs`), attaches it to the
//! scheduler's tracepoints, and hands over what it recorded.
//!
//! The programs run in the kernel at every context switch and wake-up on the machine, look
//! the thread's process up in the `watched` map, and write a 24-byte event to a ring buffer
//! for watched ones only; the agent reads the ring through shared memory (no system call per
//! event) about ten times a second.

use aya::maps::{Array, HashMap, MapData, RingBuf};
use aya::programs::BtfTracePoint;
use aya::{Btf, Ebpf, EbpfLoader};

use super::accounts::{Event, EventKind, Scope};

/// The object `build.rs` compiled; empty when clang was missing. Aligned: the ELF parser
/// reads its headers in place.
static OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/thread_states.bpf.o"));

/// `(program, tracepoint)` pairs of the object.
const PROGRAMS: [(&str, &str); 3] = [
    ("stallscope_switch", "sched_switch"),
    ("stallscope_wakeup", "sched_wakeup"),
    ("stallscope_wakeup_new", "sched_wakeup_new"),
];

/// Bytes of one event in the ring (`struct event`).
const EVENT_BYTES: usize = 24;

/// Where the events come from: the kernel, or a script in tests.
pub trait EventFeed: Send {
    /// Reports the process `pid`'s events from now on, of its main thread or of all.
    fn watch(&mut self, pid: u32, scope: Scope) -> Result<(), String>;
    /// Stops reporting `pid`.
    fn unwatch(&mut self, pid: u32);
    /// Appends what was recorded since the last call; returns how many events the kernel
    /// has dropped since the start (the ring was full).
    fn drain(&mut self, out: &mut Vec<Event>) -> u64;
}

/// The programs attached, and their maps.
pub struct Kernel {
    /// Owns the programs and their links: dropping it detaches them.
    _ebpf: Ebpf,
    watched: HashMap<MapData, u32, u8>,
    events: RingBuf<MapData>,
    lost: Array<MapData, u64>,
}

impl Kernel {
    /// Loads and attaches the programs; why not, when it cannot (no clang at build time, not
    /// permitted, a kernel without BTF or older than 5.18).
    pub fn load() -> Result<Self, String> {
        if OBJECT.is_empty() {
            return Err("built without eBPF (clang was missing)".into());
        }
        if !kernel_at_least(5, 18) {
            return Err("the kernel is older than 5.18 (sched_switch has no prev_state)".into());
        }
        let btf = Btf::from_sys_fs().map_err(|e| format!("no kernel BTF: {e}"))?;
        // The same parse serves the CO-RE relocations and the tracepoints' types. (aya's
        // loader also parses the kernel's BTF once more when it is made: 20-60 ms of CPU at
        // start-up on the issue-31 machine, most of it zeroing fresh memory.)
        let mut ebpf = EbpfLoader::new()
            .btf(Some(&btf))
            .load(OBJECT)
            .map_err(|e| format!("cannot load: {e}"))?;
        for (name, tracepoint) in PROGRAMS {
            let program: &mut BtfTracePoint = ebpf
                .program_mut(name)
                .ok_or_else(|| format!("no program {name} in the object"))?
                .try_into()
                .map_err(|e| format!("{name}: {e}"))?;
            program
                .load(tracepoint, &btf)
                .map_err(|e| format!("cannot load {name}: {e}"))?;
            program
                .attach()
                .map_err(|e| format!("cannot attach to {tracepoint}: {e}"))?;
        }
        let watched = take(&mut ebpf, "watched")
            .and_then(|m| HashMap::try_from(m).map_err(|e| format!("map watched: {e}")))?;
        let events = take(&mut ebpf, "events")
            .and_then(|m| RingBuf::try_from(m).map_err(|e| e.to_string()))?;
        let lost =
            take(&mut ebpf, "lost").and_then(|m| Array::try_from(m).map_err(|e| e.to_string()))?;
        Ok(Kernel {
            _ebpf: ebpf,
            watched,
            events,
            lost,
        })
    }
}

fn take(ebpf: &mut Ebpf, name: &str) -> Result<aya::maps::Map, String> {
    ebpf.take_map(name)
        .ok_or_else(|| format!("no map {name} in the object"))
}

impl EventFeed for Kernel {
    fn watch(&mut self, pid: u32, scope: Scope) -> Result<(), String> {
        let mode = match scope {
            Scope::Main => 1,
            Scope::All => 2,
        };
        self.watched
            .insert(pid, mode, 0)
            .map_err(|e| format!("cannot watch pid {pid}: {e}"))
    }

    fn unwatch(&mut self, pid: u32) {
        // Gone already is fine.
        let _ = self.watched.remove(&pid);
    }

    fn drain(&mut self, out: &mut Vec<Event>) -> u64 {
        while let Some(item) = self.events.next() {
            if let Some(e) = parse_event(&item) {
                out.push(e);
            }
        }
        self.lost.get(&0, 0).unwrap_or(0)
    }
}

/// One `struct event`: ns, tid, tgid, state, kind, native-endian.
pub fn parse_event(bytes: &[u8]) -> Option<Event> {
    let bytes: &[u8; EVENT_BYTES] = bytes.get(..EVENT_BYTES)?.try_into().ok()?;
    let u32_at = |i: usize| u32::from_ne_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
    let ns = u64::from_ne_bytes(bytes[..8].try_into().expect("8 bytes"));
    let kind = match u32_at(20) {
        0 => EventKind::Off { state: u32_at(16) },
        1 => EventKind::On,
        2 => EventKind::Wake,
        _ => return None,
    };
    Some(Event {
        ns,
        tid: u32_at(8),
        tgid: u32_at(12),
        kind,
    })
}

/// Whether the running kernel's release is at least `major.minor`.
fn kernel_at_least(major: u32, minor: u32) -> bool {
    let Ok(release) = std::fs::read_to_string("/proc/sys/kernel/osrelease") else {
        return false;
    };
    let mut parts = release
        .trim()
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (a, b) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (a, b) >= (major, minor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_read_in_the_programs_layout() {
        let mut bytes = Vec::new();
        bytes.extend(123_456_789u64.to_ne_bytes());
        bytes.extend(4242u32.to_ne_bytes());
        bytes.extend(4240u32.to_ne_bytes());
        bytes.extend(2u32.to_ne_bytes());
        bytes.extend(0u32.to_ne_bytes());
        assert_eq!(
            parse_event(&bytes),
            Some(Event {
                ns: 123_456_789,
                tid: 4242,
                tgid: 4240,
                kind: EventKind::Off { state: 2 },
            })
        );
        bytes[20] = 7;
        assert_eq!(parse_event(&bytes), None, "an unknown kind is skipped");
        assert_eq!(parse_event(&bytes[..10]), None, "a short record is skipped");
    }
}
