//! The capture thread: libpcap (the [`pcap`] crate) on the "any" device, headers only, with a
//! BPF filter the kernel runs, so that only the packets the source counts are copied out.
//!
//! It needs root or `CAP_NET_RAW`; [`PacketCapture::opened`] says why when it cannot. The
//! capture is non-blocking: the thread reads what the ring holds, then waits on its descriptor
//! (`poll`) for at most 100 ms (libpcap's own read timeout does not start on Linux until a
//! packet comes, so an idle link would hold the thread forever), and checks its stop flag
//! between reads, so it ends within about 100 ms of [`PacketCapture`] being dropped (which waits
//! for nothing). The thread opens the capture too, so the sampler never waits on it. What it
//! keeps is one bounded [`Tally`] (and the kernel's ring of at most [`BUFFER_BYTES`]).

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use super::headers::{parse, Tally, LINKTYPE_LINUX_SLL2, SNAPLEN};

/// The BPF filter: UDP only (TCP's bytes come exactly from sock_diag's `tcp_info`, so
/// capturing the collectives' TCP segments would cost a wake-up per batch of them for nothing).
pub const FILTER: &str = "udp";

/// bytes of the kernel's capture ring.
pub const BUFFER_BYTES: i32 = 4 << 20;

/// ms the thread waits for packets before it looks at its stop flag.
const READ_TIMEOUT_MS: i32 = 100;

/// What the thread hands over.
#[derive(Debug, Default)]
struct Shared {
    tally: Tally,
    /// Why the thread stopped early, once.
    error: Option<String>,
}

/// Counts the kernel reported, since the capture opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CaptureStats {
    /// packets the filter passed.
    pub received: u64,
    /// packets dropped for want of room in the ring.
    pub dropped: u64,
}

/// A capture on its own thread; dropping it tells the thread to stop (it ends within about
/// 100 ms; nobody waits for it).
pub struct PacketCapture {
    shared: Arc<Mutex<Shared>>,
    stats: Arc<Mutex<CaptureStats>>,
    stop: Arc<AtomicBool>,
    opening: Option<mpsc::Receiver<Result<(), String>>>,
    opened: Option<Result<(), String>>,
}

impl PacketCapture {
    /// Starts the thread, which opens `device` (`"any"`: every interface) and reads it, so that
    /// opening (a ring to map, a filter to compile) never holds up the caller.
    pub fn start(device: &str) -> PacketCapture {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let stats = Arc::new(Mutex::new(CaptureStats::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st, halt) = (shared.clone(), stats.clone(), stop.clone());
        let (tx, rx) = mpsc::sync_channel(1);
        let device = device.to_string();
        let spawned = std::thread::Builder::new()
            .name("stallscope-pcap".into())
            .spawn(move || match open(&device) {
                Ok(cap) => {
                    let _ = tx.send(Ok(()));
                    let linktype = cap.get_datalink().0;
                    read_loop(cap, linktype, loopback_index(), &s, &st, &halt);
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            });
        let opened = spawned.err().map(|e| Err(e.to_string()));
        PacketCapture {
            shared,
            stats,
            stop,
            opening: Some(rx),
            opened,
        }
    }

    /// Whether the capture opened, or why not; `None` while it is still opening. Waits up to
    /// `wait` for the answer.
    pub fn opened(&mut self, wait: Duration) -> Option<&Result<(), String>> {
        if self.opened.is_none() {
            let rx = self.opening.as_ref()?;
            self.opened = match rx.recv_timeout(wait) {
                Ok(r) => Some(r),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    Some(Err("the capture thread ended".into()))
                }
            };
            if self.opened.is_some() {
                self.opening = None;
            }
        }
        self.opened.as_ref()
    }

    /// What was counted since the last call, and why the thread stopped if it did.
    pub fn take(&self) -> (Tally, Option<String>) {
        let mut s = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        (s.tally.take(), s.error.take())
    }

    /// The kernel's counts so far (updated about once a second).
    pub fn stats(&self) -> CaptureStats {
        *self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for PacketCapture {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// Opens `device` headers-only, filtered, non-blocking; an error says why (most often: not
/// root and no `CAP_NET_RAW`).
fn open(device: &str) -> Result<pcap::Capture<pcap::Active>, String> {
    let mut cap = pcap::Capture::from_device(device)
        .map_err(|e| e.to_string())?
        .snaplen(SNAPLEN)
        .timeout(READ_TIMEOUT_MS)
        .buffer_size(BUFFER_BYTES)
        .promisc(false)
        .open()
        .map_err(|e| e.to_string())?;
    // The cooked header's second version names the interface: loopback's packets show once
    // as sent and once as received there, and are counted once.
    let _ = cap.set_datalink(pcap::Linktype(LINKTYPE_LINUX_SLL2));
    cap.filter(FILTER, true).map_err(|e| e.to_string())?;
    cap.setnonblock().map_err(|e| e.to_string())
}

/// The loopback interface's index (`lo`), if there is one.
fn loopback_index() -> Option<u32> {
    // SAFETY: a NUL-terminated name.
    let i = unsafe { libc::if_nametoindex(c"lo".as_ptr()) };
    (i != 0).then_some(i)
}

/// Waits until the capture has packets, at most [`READ_TIMEOUT_MS`].
fn wait_readable(cap: &pcap::Capture<pcap::Active>) {
    let mut fd = libc::pollfd {
        fd: cap.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd; an error or a signal only shortens the wait.
    unsafe { libc::poll(&mut fd, 1, READ_TIMEOUT_MS) };
}

fn read_loop(
    mut cap: pcap::Capture<pcap::Active>,
    linktype: i32,
    loopback: Option<u32>,
    shared: &Mutex<Shared>,
    stats: &Mutex<CaptureStats>,
    stop: &AtomicBool,
) {
    let mut last_stats = std::time::Instant::now();
    while !stop.load(Ordering::Acquire) {
        match cap.next_packet() {
            Ok(p) => {
                let Some(h) = parse(linktype, p.data) else {
                    continue;
                };
                if h.outgoing == Some(true) && h.ifindex.is_some() && h.ifindex == loopback {
                    continue;
                }
                shared
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .tally
                    .add(&h);
            }
            Err(pcap::Error::TimeoutExpired) => wait_readable(&cap),
            Err(e) => {
                shared.lock().unwrap_or_else(|p| p.into_inner()).error =
                    Some(format!("packet capture stopped: {e}"));
                return;
            }
        }
        if last_stats.elapsed().as_secs() >= 1 {
            last_stats = std::time::Instant::now();
            if let Ok(s) = cap.stats() {
                let mut st = stats.lock().unwrap_or_else(|p| p.into_inner());
                st.received = u64::from(s.received);
                st.dropped = u64::from(s.dropped) + u64::from(s.if_dropped);
            }
        }
    }
}
