//! The marker listener: receives the training processes' datagrams on a Unix socket.
//!
//! A Unix datagram socket keeps each marker whole and lets senders stay non-blocking: when the
//! listener falls behind, the kernel queue (`net.unix.max_dgram_qlen`, 10 on Debian) fills and
//! the *sender* keeps the event (the Python package holds up to 1,024, sent first, in order,
//! with its next event that finds room) or drops it (and the gap in its sequence numbers tells
//! us). The listener therefore does nothing but receive, parse
//! and hand on, on its own thread; a malformed datagram is counted and reported once, and the
//! others go on.
//!
//! The thread blocks in `recv` with no timeout, so it wakes only for a datagram: stopping shuts
//! the socket down for reading, which ends the wait at once.
//!
//! A marker's pid is not taken on trust: it decides which processes are sampled, and one
//! datagram claiming pid 1 would have the node's every process sampled at 100 Hz. The socket
//! asks the kernel for each sender's credentials (`SO_PASSCRED`), and the marker's pid is the
//! kernel's: the sending process as this agent's pid namespace sees it, which also maps the
//! pids a container's training claims (its own namespace's) to the ones `/proc` here shows.

use std::io;
use std::net::Shutdown;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use stallscope_analysis::marker::{self, Marker, MAX_DATAGRAM};

use crate::sink::Sink;

/// What the listener hands on.
#[derive(Debug)]
pub enum Datagram {
    /// A well-formed marker.
    Marker(Marker),
    /// The first malformed datagram (later ones are only counted).
    Rejected(String),
}

/// A running listener.
pub struct MarkerListener {
    path: PathBuf,
    /// The receiving socket, shut down for reading to end the thread's wait.
    socket: UnixDatagram,
    stop: Arc<AtomicBool>,
    rejected: Arc<AtomicU64>,
    /// Markers whose claimed pid was not the sender's, by the kernel.
    remapped: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

/// Receive buffer asked of the kernel, bytes: room for bursts from many ranks at one step.
const RECV_BUFFER: usize = 4 << 20;

impl MarkerListener {
    /// Binds `path` (removing a stale socket file first) and starts receiving.
    pub fn bind(path: &Path, tx: impl Sink<Datagram>) -> io::Result<MarkerListener> {
        if path.exists() {
            std::fs::remove_file(path)?;
        }
        let socket = UnixDatagram::bind(path)?;
        set_recv_buffer(&socket, RECV_BUFFER);
        pass_credentials(&socket)?;
        let receiving = socket.try_clone()?;
        let stop = Arc::new(AtomicBool::new(false));
        let rejected = Arc::new(AtomicU64::new(0));
        let remapped = Arc::new(AtomicU64::new(0));
        let thread = {
            let counts = Counts {
                rejected: rejected.clone(),
                remapped: remapped.clone(),
            };
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("stallscope-markers".into())
                .spawn(move || receive(receiving, tx, &stop, &counts))?
        };
        Ok(MarkerListener {
            path: path.to_path_buf(),
            socket,
            stop,
            rejected,
            remapped,
            thread: Some(thread),
        })
    }

    /// Markers whose claimed pid was not their sender's (a container's namespace, or a lie),
    /// and were taken with the sender's.
    pub fn remapped(&self) -> u64 {
        self.remapped.load(Ordering::Relaxed)
    }

    /// Datagrams rejected as malformed so far.
    pub fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::Relaxed)
    }

    /// Stops receiving, joins the thread and removes the socket file.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the blocked recv, which then returns 0. Cannot fail on a bound socket; if it
        // did, the join below would wait for the next datagram, so say it and go on.
        if self.socket.shutdown(Shutdown::Read).is_err() {
            eprintln!("stallscope: cannot stop the marker listener; it is left running");
            self.thread.take();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for MarkerListener {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn set_recv_buffer(socket: &UnixDatagram, bytes: usize) {
    use std::os::fd::AsRawFd;
    let size = bytes as libc::c_int;
    // SAFETY: a valid socket fd and a pointer to an int of the right size. Failure only
    // leaves the default buffer, which is fine.
    unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            &size as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// Asks the kernel to attach each sender's credentials to its datagrams.
fn pass_credentials(socket: &UnixDatagram) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let on: libc::c_int = 1;
    // SAFETY: a valid socket fd and a pointer to an int of the right size.
    let r = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PASSCRED,
            &on as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Receives one datagram into `buf`: its length and, when the kernel attached them, its
/// sender's pid (in this process's pid namespace).
fn recv_with_pid(socket: &UnixDatagram, buf: &mut [u8]) -> io::Result<(usize, Option<u32>)> {
    use std::os::fd::AsRawFd;
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // Room for one SCM_CREDENTIALS message, aligned as cmsghdr needs.
    let mut control = [0u64; 8];
    // SAFETY: an all-zero msghdr is valid; the pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: recvmsg writes at most iov_len bytes into buf and msg_controllen into control.
    let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut pid = None;
    // SAFETY: the CMSG macros walk the control buffer recvmsg filled, within its length.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_CREDENTIALS {
                let cred = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::ucred);
                if cred.pid > 0 {
                    pid = Some(cred.pid as u32);
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n as usize, pid))
}

/// What the receiving thread counts.
struct Counts {
    rejected: Arc<AtomicU64>,
    remapped: Arc<AtomicU64>,
}

fn receive(socket: UnixDatagram, tx: impl Sink<Datagram>, stop: &AtomicBool, counts: &Counts) {
    let rejected = &counts.rejected;
    let mut buf = vec![0u8; MAX_DATAGRAM + 1];
    while !stop.load(Ordering::Relaxed) {
        let (n, sender) = match recv_with_pid(&socket, &mut buf) {
            // After a shutdown for reading, recv returns 0 at once: the stop flag is set.
            Ok((0, _)) if stop.load(Ordering::Relaxed) => break,
            Ok(got) => got,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let event = match marker::parse(&buf[..n]) {
            Ok(mut m) => {
                if let Some(pid) = sender.filter(|p| *p != m.pid) {
                    counts.remapped.fetch_add(1, Ordering::Relaxed);
                    m.pid = pid;
                }
                Datagram::Marker(m)
            }
            Err(e) => {
                if rejected.fetch_add(1, Ordering::Relaxed) > 0 {
                    continue;
                }
                let shown: String = String::from_utf8_lossy(&buf[..n.min(80)]).into();
                Datagram::Rejected(format!("{e}: {shown:?}"))
            }
        };
        if !tx.put(event) {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;
    use std::time::{Duration, Instant};

    #[test]
    fn receives_markers_and_rejects_garbage_without_losing_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.sock");
        let (tx, rx) = channel();
        let listener = MarkerListener::bind(&path, tx).unwrap();
        let sender = UnixDatagram::unbound().unwrap();
        sender.send_to(b"SS1 0 10 99 0 0 B data", &path).unwrap();
        sender.send_to(b"garbage", &path).unwrap();
        sender.send_to(b"SS1 1 20 99 0 0 E data", &path).unwrap();
        sender.send_to(b"SS1 2 x 99 0 0 S iter", &path).unwrap();
        let mut got = Vec::new();
        while got.len() < 3 {
            got.push(rx.recv_timeout(Duration::from_secs(5)).unwrap());
        }
        assert!(matches!(&got[0], Datagram::Marker(m) if m.t_ns == 10));
        assert!(
            matches!(&got[1], Datagram::Rejected(why) if why.contains("unknown marker protocol"))
        );
        assert!(matches!(&got[2], Datagram::Marker(m) if m.t_ns == 20));
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(listener.rejected(), 2);
        listener.stop();
        assert!(!path.exists());
    }

    /// Issue 17, item 2: the pid a marker claims is replaced by its sender's, as the kernel
    /// gives it: one datagram claiming pid 1 does not make init a sampling root.
    #[test]
    fn a_marker_carries_its_senders_pid_not_the_one_it_claims() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.sock");
        let (tx, rx) = channel();
        let listener = MarkerListener::bind(&path, tx).unwrap();
        let sender = UnixDatagram::unbound().unwrap();
        let me = std::process::id();
        sender.send_to(b"SS1 0 10 1 0 0 S iter", &path).unwrap();
        sender
            .send_to(format!("SS1 1 20 {me} 0 0 S iter").as_bytes(), &path)
            .unwrap();
        for _ in 0..2 {
            match rx.recv_timeout(Duration::from_secs(5)).unwrap() {
                Datagram::Marker(m) => assert_eq!(m.pid, me, "{m:?}"),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(listener.remapped(), 1, "the lie is counted");
        listener.stop();
    }

    #[test]
    fn an_idle_listener_stops_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, _rx) = channel();
        let listener = MarkerListener::bind(&dir.path().join("m.sock"), tx).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let asked = Instant::now();
        listener.stop();
        // No timeout to wait out: the shutdown ends the blocked recv.
        assert!(
            asked.elapsed() < Duration::from_millis(500),
            "{:?}",
            asked.elapsed()
        );
    }
}
