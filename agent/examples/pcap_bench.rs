//! Cost of the UDP packet source (pcap): CPU of its capture thread and of its reads at the
//! slow tier's 10 Hz while a sender in this process ("the job") sends `R` UDP datagrams a
//! second of 1200 bytes over loopback, and how many of the bytes sent it counted. Needs root
//! (or CAP_NET_RAW).
//!
//! cargo run --release -p stallscope-agent --example pcap_bench -- [SECONDS] [R...]
//!
//! Prints, per R: the rate reached, the capture thread's % of one core, µs of CPU per read,
//! bytes counted / sent, the kernel's drops, and the whole process's % of one core with the
//! capture and, right after, for the same sending without it: the kernel runs the filter and
//! copies the headers into the ring in the sender's context, so that difference is the
//! capture's whole cost, the capture thread's share only a part.

use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stallscope_agent::sources::packets::PacketSource;
use stallscope_agent::sources::{Registry, Roots, Source, Watched};

/// ns of CPU this thread has used (user + kernel).
fn thread_cpu_ns() -> u64 {
    let (user, kernel) = stallscope_agent::clock::thread_cpu_ns();
    user + kernel
}

/// ns of CPU (user + kernel) of this process's thread named `name`, from /proc/self/task.
fn named_thread_cpu_ns(name: &str) -> Option<u64> {
    // SAFETY: no arguments.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
        let after = &stat[stat.rfind(')')? + 2..];
        let f: Vec<&str> = after.split(' ').collect();
        let ticks: u64 = f[11].parse::<u64>().ok()? + f[12].parse::<u64>().ok()?;
        return Some(ticks * 1_000_000_000 / hz);
    }
    None
}

/// bytes the flow from `src` sent so far, when the source shipped it since the last call.
fn sent_by(source: &mut PacketSource, src: std::net::SocketAddr) -> Option<u64> {
    let flows = source.take_flows()?;
    let local = format!("{src}/udp");
    flows
        .flows
        .iter()
        .find(|f| f.local == local)
        .map(|f| f.bytes_out)
}

/// ns of CPU this process has used (user + kernel).
fn process_cpu_ns() -> u64 {
    // SAFETY: a zeroed rusage is valid for the call to fill.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid rusage pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1_000;
    ns(ru.ru_utime) + ns(ru.ru_stime)
}

/// The process's % of one core while it sends `rate` datagrams a second for `seconds`, with
/// no capture.
fn without_capture(rate: u64, seconds: f64) -> f64 {
    let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let dst = rx.local_addr().unwrap();
    rx.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let halt = stop.clone();
    let drainer = std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        while !halt.load(Ordering::Relaxed) {
            let _ = rx.recv(&mut buf);
        }
    });
    let (cpu0, start) = (process_cpu_ns(), Instant::now());
    let payload = [7u8; 1200];
    let mut n = 0u64;
    while start.elapsed().as_secs_f64() < seconds {
        let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
        while n < due {
            tx.send_to(&payload, dst).unwrap();
            n += 1;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let pct = (process_cpu_ns() - cpu0) as f64 / start.elapsed().as_secs_f64() / 1e9 * 100.0;
    stop.store(true, Ordering::Relaxed);
    drainer.join().unwrap();
    pct
}

fn main() {
    let mut args = std::env::args().skip(1);
    let seconds: f64 = args.next().map_or(5.0, |s| s.parse().expect("SECONDS"));
    let rates: Vec<u64> = {
        let r: Vec<u64> = args.map(|s| s.parse().expect("R")).collect();
        if r.is_empty() {
            vec![1_000, 10_000, 50_000]
        } else {
            r
        }
    };
    let me = std::process::id();
    let watched = Watched {
        pids: vec![me],
        launchers: Vec::new(),
        loops: vec![me],
    };
    println!("| datagrams/s asked | reached | capture thread, % of one core | µs CPU per read (10 Hz) | bytes counted / sent | kernel drops | process % of one core: with capture / without |");
    println!("|---|---|---|---|---|---|---|");
    for rate in rates {
        let mut source = PacketSource::new(&Roots::default(), "lo");
        let mut reg = Registry::default();
        if !source.wait_open(Duration::from_secs(10)) {
            let why = source.off_reason().unwrap_or("it did not open in 10 s");
            eprintln!("pcap_bench: capture cannot open: {why} (run as root)");
            std::process::exit(1);
        }
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let (src, dst) = (tx.local_addr().unwrap(), rx.local_addr().unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let (halt, count) = (stop.clone(), sent.clone());
        // Drains the receiver so that the socket's queue never fills.
        let drain_stop = stop.clone();
        rx.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let drainer = std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while !drain_stop.load(Ordering::Relaxed) {
                let _ = rx.recv(&mut buf);
            }
        });
        let sender = std::thread::spawn(move || {
            let start = Instant::now();
            let payload = [7u8; 1200];
            let mut n = 0u64;
            while !halt.load(Ordering::Relaxed) {
                let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
                while n < due {
                    tx.send_to(&payload, dst).unwrap();
                    n += 1;
                }
                count.store(n, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        // Settle: the first read's tally is a partial interval.
        std::thread::sleep(Duration::from_millis(200));
        source.sample(&watched, &mut reg).unwrap();
        let _ = source.take_flows();
        let sent_before = sent.load(Ordering::Relaxed);
        let thread_before = named_thread_cpu_ns("stallscope-pcap").unwrap_or(0);
        let process_before = process_cpu_ns();
        let start = Instant::now();
        let end = start + Duration::from_secs_f64(seconds);
        let (mut reads, mut read_ns) = (0u64, 0u64);
        let mut counted = 0;
        while Instant::now() < end {
            std::thread::sleep(Duration::from_millis(100));
            let before = thread_cpu_ns();
            source.sample(&watched, &mut reg).unwrap();
            read_ns += thread_cpu_ns() - before;
            reads += 1;
            reg.take_new_decls();
            reg.take_values();
            counted = sent_by(&mut source, src).unwrap_or(counted);
        }
        let elapsed = start.elapsed().as_secs_f64();
        let process_ns = process_cpu_ns() - process_before;
        let thread_ns = named_thread_cpu_ns("stallscope-pcap").unwrap_or(0) - thread_before;
        stop.store(true, Ordering::Relaxed);
        sender.join().unwrap();
        drainer.join().unwrap();
        // What was in flight at the end: a read after the thread's timeout, and the flow's
        // totals (every datagram the sender sent, since the capture opened before it) half a
        // second later.
        for wait_ms in [300, 600] {
            std::thread::sleep(Duration::from_millis(wait_ms));
            source.sample(&watched, &mut reg).unwrap();
            counted = sent_by(&mut source, src).unwrap_or(counted);
        }
        let total_sent = sent.load(Ordering::Relaxed) * 1200;
        let reached = (sent.load(Ordering::Relaxed) - sent_before) as f64 / elapsed;
        let dropped = source.capture_stats().dropped;
        drop(source);
        let bare = without_capture(rate, seconds);
        println!(
            "| {rate} | {reached:.0} | {:.2} | {:.0} | {counted} / {total_sent} ({:.2} %) | {dropped} | {:.1} / {bare:.1} |",
            thread_ns as f64 / elapsed / 1e9 * 100.0,
            read_ns as f64 / reads as f64 / 1e3,
            counted as f64 / total_sent as f64 * 100.0,
            process_ns as f64 / elapsed / 1e9 * 100.0,
        );
    }
}
