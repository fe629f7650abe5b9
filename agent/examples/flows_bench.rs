//! Cost of the flow source (sock_diag): CPU time of its reads at the slow tier's 10 Hz with
//! `N` TCP connections open on the node (loopback pairs held by this process, which is
//! "the job", so every read also places their inodes among the job's fds when they are new).
//!
//! cargo run --release -p stallscope-agent --example flows_bench -- [SECONDS] [N...]
//!
//! Prints, per N: µs of CPU per read and % of one core at 10 Hz.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use stallscope_agent::clock::thread_cpu_ns;
use stallscope_agent::sources::flows::FlowSource;
use stallscope_agent::sources::{Registry, Roots, Source, Watched};

fn main() {
    let mut args = std::env::args().skip(1);
    let seconds: f64 = args.next().map_or(5.0, |s| s.parse().expect("SECONDS"));
    let counts: Vec<usize> = {
        let c: Vec<usize> = args.map(|s| s.parse().expect("N")).collect();
        if c.is_empty() {
            vec![5, 50, 400]
        } else {
            c
        }
    };
    let me = std::process::id();
    let watched = Watched {
        pids: vec![me],
        launchers: Vec::new(),
        loops: vec![me],
    };
    println!("| TCP sockets read | reads | fd rescans | µs CPU per read (user + kernel) | % of one core at 10 Hz |");
    println!("|---|---|---|---|---|");
    for n in counts {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut pairs = Vec::with_capacity(n);
        for _ in 0..n {
            let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (b, _) = listener.accept().unwrap();
            pairs.push((a, b));
        }
        let mut source = FlowSource::new(&Roots::default());
        let mut reg = Registry::default();
        let end = Instant::now() + Duration::from_secs_f64(seconds);
        let (mut reads, mut user, mut kernel, mut sockets) = (0u64, 0u64, 0u64, 0usize);
        while Instant::now() < end {
            // Some bytes move on a tenth of the connections between reads.
            for (a, _) in pairs.iter_mut().step_by(10) {
                a.write_all(&[0u8; 512]).unwrap();
            }
            let before = thread_cpu_ns();
            source.sample(&watched, &mut reg).expect("sock_diag");
            let after = thread_cpu_ns();
            user += after.0 - before.0;
            kernel += after.1 - before.1;
            sockets = source.sockets_last_read();
            reads += 1;
            reg.take_new_decls();
            reg.take_values();
            let _ = source.take_flows();
            std::thread::sleep(Duration::from_millis(100));
        }
        let us = |ns: u64| ns as f64 / reads as f64 / 1e3;
        let per_read_us = us(user + kernel);
        println!(
            "| {sockets} ({} of them this bench's) | {reads} | {} | {per_read_us:.0} ({:.0} + {:.0}) | {:.2} |",
            2 * n,
            source.owners.rescans,
            us(user),
            us(kernel),
            per_read_us * 10.0 / 1e6 * 100.0
        );
    }
}
