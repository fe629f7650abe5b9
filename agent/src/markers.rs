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
//! A process's own channel. A bound datagram socket queues at most 10 datagrams whoever sends
//! them, so the listener had to take each as it came: one thread wake-up per burst of a
//! loop's events, three or four per iteration of a DDP rank (a third of stallscope's CPU on the
//! issue-31 job was wake-ups, a sixth of it this thread's). So the marker package makes a
//! connected `SOCK_SEQPACKET` pair in each process and sends both ends here, with the
//! [`REGISTER`] datagram and `SCM_RIGHTS`. A connected pair is not held to that queue, only to
//! its sender's buffer (278 markers at the default 208 KiB; the listener raises it to
//! [`CHANNEL_BUFFER`] where it may, as root), so nothing needs to read it as each marker
//! comes: the listener keeps the reading end ([`Channel`]) and answers one byte on it. The
//! package goes on sending on the shared socket until it has read that answer (a listener
//! that does not know the pair loses nothing), then sends [`SWITCH`] there, its last datagram
//! on it, and everything after on the pair. The listener hands the channel to the recorder
//! only at that [`SWITCH`], behind every event the process sent on the shared socket, so its
//! events keep their order; the recorder reads every channel at each of its rounds
//! ([`Channel::drain`], every 100 ms, when it wakes anyway). The marker's pid is the
//! registering process's, as the kernel gave it with the registration. At most
//! [`MAX_CHANNELS`] are open; a process beyond them gets no answer and keeps the shared
//! socket.
//!
//! A marker's pid is not taken on trust: it decides which processes are sampled, and one
//! datagram claiming pid 1 would have the node's every process sampled at 100 Hz. The socket
//! asks the kernel for each sender's credentials (`SO_PASSCRED`), and the marker's pid is the
//! kernel's: the sending process as this agent's pid namespace sees it, which also maps the
//! pids a container's training claims (its own namespace's) to the ones `/proc` here shows.

use std::collections::HashMap;
use std::io;
use std::net::Shutdown;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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
    /// A process's own channel, to be read at every round ([`Channel::drain`]).
    Channel(Channel),
}

/// The payload of the datagram that registers a process's channel: its `SCM_RIGHTS` carry
/// the pair's receiving end, then its sending end.
pub const REGISTER: &[u8] = b"SSR1";

/// The payload of a process's last datagram on the shared socket: its later events come on the
/// channel it registered, which is handed on now, behind everything it sent here before.
pub const SWITCH: &[u8] = b"SSC1";

/// Channels registered but not yet switched to, beyond which those whose process closed them
/// are forgotten at the next registration.
const WAITING_SWEEP: usize = 64;

/// Channels open at most; a process beyond them keeps the shared socket.
pub const MAX_CHANNELS: usize = 1024;

/// bytes, the send buffer asked for a channel's sending end (`SO_SNDBUFFORCE`: root, or
/// `CAP_NET_ADMIN`); ~5,000 markers, 10 Hz reads of a 1-ms loop.
pub const CHANNEL_BUFFER: libc::c_int = 4 << 20;

/// Environment variable that sets the send buffer asked for a channel, bytes, in place of
/// [`CHANNEL_BUFFER`] (`0`: the sender's own, 208 KiB on Debian: 278 markers).
pub const CHANNEL_BUFFER_ENV: &str = "STALLSCOPE_CHANNEL_BUFFER";

/// bytes, the send buffer to ask for a channel ([`CHANNEL_BUFFER_ENV`], else
/// [`CHANNEL_BUFFER`]); 0 asks for nothing.
fn channel_buffer() -> libc::c_int {
    std::env::var(CHANNEL_BUFFER_ENV)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(CHANNEL_BUFFER)
}

/// Markers read from one channel per round at most: a round's time stays bounded whatever a
/// process sends (the rest wait in its buffer for the next round).
const MAX_PER_DRAIN: usize = 20_000;

/// One process's channel: the receiving end of the pair its marker package made.
#[derive(Debug)]
pub struct Channel {
    /// The registering process, as the kernel named it.
    pub pid: u32,
    socket: OwnedFd,
    counts: Counts,
    /// Channels open, shared with the listener (one less when this one is dropped).
    open: Arc<AtomicUsize>,
}

impl Drop for Channel {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Channel {
    /// Whether the process closed its end with nothing left to read.
    fn is_closed(&self) -> bool {
        let mut byte = [0u8; 1];
        // SAFETY: peeks at most one byte into a local buffer.
        let n = unsafe {
            libc::recv(
                self.socket.as_raw_fd(),
                byte.as_mut_ptr().cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        n == 0
    }

    /// Hands on every marker waiting in the channel (at most [`MAX_PER_DRAIN`]), with the
    /// registering process's pid; a malformed one is counted, and the first of the listener's
    /// and every channel's handed on as [`Datagram::Rejected`]. Returns whether the channel is
    /// still open (`false` once the process closed it and everything was read).
    pub fn drain(&mut self, buf: &mut [u8], mut put: impl FnMut(Datagram)) -> bool {
        for _ in 0..MAX_PER_DRAIN {
            // SAFETY: recv writes at most buf.len() bytes into buf.
            let n = unsafe {
                libc::recv(
                    self.socket.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                return match e.kind() {
                    io::ErrorKind::WouldBlock => true,
                    io::ErrorKind::Interrupted => continue,
                    _ => false,
                };
            }
            if n == 0 {
                return false; // the process closed its end and everything was read
            }
            if let Some(item) = parse_one(&buf[..n as usize], Some(self.pid), &self.counts) {
                put(item);
            }
        }
        true
    }
}

/// A running listener.
pub struct MarkerListener {
    path: PathBuf,
    /// The receiving socket, shut down for reading to end the thread's wait.
    socket: UnixDatagram,
    stop: Arc<AtomicBool>,
    counts: Counts,
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
        let counts = Counts::default();
        let thread = {
            let counts = counts.clone();
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("stallscope-markers".into())
                .spawn(move || receive(receiving, tx, &stop, &counts))?
        };
        Ok(MarkerListener {
            path: path.to_path_buf(),
            socket,
            stop,
            counts,
            thread: Some(thread),
        })
    }

    /// Markers whose claimed pid was not their sender's (a container's namespace, or a lie),
    /// and were taken with the sender's.
    pub fn remapped(&self) -> u64 {
        self.counts.remapped.load(Ordering::Relaxed)
    }

    /// Datagrams rejected as malformed so far (on the shared socket and the channels).
    pub fn rejected(&self) -> u64 {
        self.counts.rejected.load(Ordering::Relaxed)
    }

    /// The counter behind [`MarkerListener::rejected`], for whoever outlives the listener.
    pub fn rejected_counter(&self) -> Arc<AtomicU64> {
        self.counts.rejected.clone()
    }

    /// Channels open now.
    pub fn channels(&self) -> usize {
        self.counts.channels.load(Ordering::Relaxed)
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

/// One datagram as received: its length, its sender's pid (in this process's pid namespace)
/// when the kernel attached it, and the descriptors it carried.
struct Received {
    len: usize,
    pid: Option<u32>,
    fds: Vec<OwnedFd>,
}

/// Receives one datagram into `buf`, with its sender's credentials and descriptors.
fn recv_with_pid(socket: &UnixDatagram, buf: &mut [u8]) -> io::Result<Received> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // Room for one SCM_CREDENTIALS message and a few descriptors, aligned as cmsghdr needs
    // (descriptors that do not fit are closed by the kernel).
    let mut control = [0u64; 16];
    // SAFETY: an all-zero msghdr is valid; the pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: recvmsg writes at most iov_len bytes into buf and msg_controllen into control;
    // descriptors it installs are close-on-exec.
    let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut pid = None;
    let mut fds = Vec::new();
    // SAFETY: the CMSG macros walk the control buffer recvmsg filled, within its length; each
    // descriptor of an SCM_RIGHTS message is ours from now on, owned once.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_CREDENTIALS {
                let cred = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::ucred);
                if cred.pid > 0 {
                    pid = Some(cred.pid as u32);
                }
            }
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const RawFd;
                let bytes = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..bytes / std::mem::size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok(Received {
        len: n as usize,
        pid,
        fds,
    })
}

/// What the receiving thread and the channels count, shared with the listener.
#[derive(Clone, Debug, Default)]
struct Counts {
    rejected: Arc<AtomicU64>,
    remapped: Arc<AtomicU64>,
    /// Channels open.
    channels: Arc<AtomicUsize>,
}

/// The marker in `bytes`, its pid the `sender`'s when the kernel named one; `None` for a
/// malformed one after the first (only counted).
fn parse_one(bytes: &[u8], sender: Option<u32>, counts: &Counts) -> Option<Datagram> {
    match marker::parse(bytes) {
        Ok(mut m) => {
            if let Some(pid) = sender.filter(|p| *p != m.pid) {
                counts.remapped.fetch_add(1, Ordering::Relaxed);
                m.pid = pid;
            }
            Some(Datagram::Marker(m))
        }
        Err(e) => {
            if counts.rejected.fetch_add(1, Ordering::Relaxed) > 0 {
                return None;
            }
            let shown: String = String::from_utf8_lossy(&bytes[..bytes.len().min(80)]).into();
            Some(Datagram::Rejected(format!("{e}: {shown:?}")))
        }
    }
}

/// The channel a [`REGISTER`] datagram brought (`fds`: the pair's receiving end, then its
/// sending end), answered; `None` (the descriptors closed, no answer: the process keeps the
/// shared socket) when they are not a Unix `SOCK_SEQPACKET` pair's, when the kernel did not
/// name the sender, or when [`MAX_CHANNELS`] are open.
fn register(fds: Vec<OwnedFd>, sender: Option<u32>, counts: &Counts) -> Option<Channel> {
    let pid = sender?;
    let [receiving, sending]: [OwnedFd; 2] = fds.try_into().ok()?;
    if !is_seqpacket(&receiving) || !is_seqpacket(&sending) {
        return None;
    }
    if counts.channels.fetch_add(1, Ordering::Relaxed) >= MAX_CHANNELS {
        counts.channels.fetch_sub(1, Ordering::Relaxed);
        return None;
    }
    let channel = Channel {
        pid,
        socket: receiving,
        counts: counts.clone(),
        open: counts.channels.clone(),
    };
    // Room for a 1-ms loop's markers between two reads, where the kernel lets us (root).
    let bytes = channel_buffer();
    if bytes > 0 {
        // SAFETY: a valid socket and a pointer to an int of the right size; failure leaves
        // the sender's own buffer.
        unsafe {
            libc::setsockopt(
                sending.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDBUFFORCE,
                (&bytes as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
    drop(sending);
    // The answer: from now on the package sends on the pair.
    // SAFETY: sends one byte from a static buffer.
    let sent = unsafe {
        libc::send(
            channel.socket.as_raw_fd(),
            b"\x01".as_ptr().cast(),
            1,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    (sent == 1).then_some(channel)
}

/// Whether `fd` is a Unix `SOCK_SEQPACKET` socket.
fn is_seqpacket(fd: &OwnedFd) -> bool {
    let option = |name: libc::c_int| {
        let mut value: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: a pointer to an int and its size.
        let r = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                name,
                (&mut value as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        (r == 0).then_some(value)
    };
    option(libc::SO_DOMAIN) == Some(libc::AF_UNIX)
        && option(libc::SO_TYPE) == Some(libc::SOCK_SEQPACKET)
}

fn receive(socket: UnixDatagram, tx: impl Sink<Datagram>, stop: &AtomicBool, counts: &Counts) {
    let mut buf = vec![0u8; MAX_DATAGRAM + 1];
    // Registered channels, by process, until the process says [`SWITCH`].
    let mut waiting: HashMap<u32, Channel> = HashMap::new();
    while !stop.load(Ordering::Relaxed) {
        let got = match recv_with_pid(&socket, &mut buf) {
            // After a shutdown for reading, recv returns 0 at once: the stop flag is set.
            Ok(r) if r.len == 0 && stop.load(Ordering::Relaxed) => break,
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let bytes = &buf[..got.len];
        let event = if bytes == REGISTER {
            if waiting.len() >= WAITING_SWEEP {
                waiting.retain(|_, c| !c.is_closed());
            }
            if let Some(c) = register(got.fds, got.pid, counts) {
                waiting.insert(c.pid, c); // a process registering again replaces its first
            }
            None
        } else if bytes == SWITCH {
            got.pid
                .and_then(|pid| waiting.remove(&pid))
                .map(Datagram::Channel)
        } else {
            drop(got.fds); // a marker carries none
            parse_one(bytes, got.pid, counts)
        };
        if let Some(event) = event {
            if !tx.put(event) {
                break;
            }
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

    /// A connected `SOCK_SEQPACKET` pair: (receiving end, sending end).
    fn seqpacket_pair() -> (OwnedFd, OwnedFd) {
        let mut fds = [0; 2];
        // SAFETY: socketpair writes two descriptors into the array.
        let r =
            unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0, fds.as_mut_ptr()) };
        assert_eq!(r, 0, "{}", io::Error::last_os_error());
        // SAFETY: both were just made and are ours.
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    }

    /// Sends `payload` to `path` from `sender` with `fds` in `SCM_RIGHTS`, as the package does.
    fn send_with_fds(sender: &UnixDatagram, path: &Path, payload: &[u8], fds: &[RawFd]) {
        use std::os::unix::ffi::OsStrExt;
        // SAFETY: a zeroed sockaddr_un filled with a path shorter than sun_path.
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (d, s) in addr.sun_path.iter_mut().zip(path.as_os_str().as_bytes()) {
            *d = *s as libc::c_char;
        }
        let mut iov = libc::iovec {
            iov_base: payload.as_ptr() as *mut libc::c_void,
            iov_len: payload.len(),
        };
        let mut control = [0u64; 8];
        // SAFETY: msghdr pointers to locals that outlive the call; the CMSG macros stay within
        // `control`, which has room for the descriptors given (at most 4).
        unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_name = (&mut addr as *mut libc::sockaddr_un).cast();
            msg.msg_namelen = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of_val(fds) as u32) as _;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(c) as *mut RawFd,
                fds.len(),
            );
            let n = libc::sendmsg(sender.as_raw_fd(), &msg, 0);
            assert_eq!(n as usize, payload.len(), "{}", io::Error::last_os_error());
        }
    }

    fn send_on(fd: &OwnedFd, bytes: &[u8]) {
        // SAFETY: sends from a live slice.
        let n = unsafe { libc::send(fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), 0) };
        assert_eq!(n as usize, bytes.len());
    }

    /// A process registers its pair, reads the answer, says SSC1 on the shared socket, and
    /// sends on the pair: the channel comes after what it sent on the shared socket, and its
    /// markers carry the process's pid as the kernel gave it with the registration, whatever
    /// they claim; once the process closes its end, the channel is done.
    #[test]
    fn a_process_channel_is_answered_handed_on_at_its_switch_and_read_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.sock");
        let (tx, rx) = channel();
        let listener = MarkerListener::bind(&path, tx).unwrap();
        let me = std::process::id();
        let sender = UnixDatagram::unbound().unwrap();
        sender
            .send_to(format!("SS1 0 10 {me} 0 0 S iter").as_bytes(), &path)
            .unwrap();
        let (theirs, ours) = seqpacket_pair();
        send_with_fds(
            &sender,
            &path,
            REGISTER,
            &[theirs.as_raw_fd(), ours.as_raw_fd()],
        );
        drop(theirs);
        let mut answer = [0u8; 1];
        // SAFETY: reads one byte into a local buffer (blocking: the listener answers at once).
        let n = unsafe { libc::recv(ours.as_raw_fd(), answer.as_mut_ptr().cast(), 1, 0) };
        assert_eq!((n, answer[0]), (1, 1), "the listener answers one byte");
        sender
            .send_to(format!("SS1 1 20 {me} 0 0 S iter").as_bytes(), &path)
            .unwrap();
        sender.send_to(SWITCH, &path).unwrap();
        send_on(&ours, format!("SS1 2 30 {me} 0 1 S iter").as_bytes());
        send_on(&ours, b"SS1 3 40 4242 0 2 S iter"); // claims another pid
        let mut got = Vec::new();
        let mut channel = loop {
            match rx.recv_timeout(Duration::from_secs(5)).unwrap() {
                Datagram::Marker(m) => got.push(m.seq),
                Datagram::Channel(c) => break c,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(
            got,
            [0, 1],
            "what came before the switch, before the channel"
        );
        assert_eq!(channel.pid, me);
        assert_eq!(listener.channels(), 1);
        let mut buf = vec![0u8; MAX_DATAGRAM + 1];
        let mut read = Vec::new();
        assert!(channel.drain(&mut buf, |d| read.push(d)));
        let read: Vec<(u64, u32)> = read
            .into_iter()
            .map(|d| match d {
                Datagram::Marker(m) => (m.seq, m.pid),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(read, [(2, me), (3, me)]);
        assert_eq!(listener.remapped(), 1);
        drop(ours);
        assert!(
            !channel.drain(&mut buf, |_| {}),
            "closed by the process: done"
        );
        drop(channel);
        assert_eq!(listener.channels(), 0);
        listener.stop();
    }

    /// Descriptors that are not a Unix seqpacket pair's (a pipe) are closed unanswered, and a
    /// switch with no channel registered hands nothing on.
    #[test]
    fn a_registration_of_anything_but_a_seqpacket_pair_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.sock");
        let (tx, rx) = channel();
        let listener = MarkerListener::bind(&path, tx).unwrap();
        let sender = UnixDatagram::unbound().unwrap();
        let mut pipe = [0; 2];
        // SAFETY: pipe writes two descriptors into the array.
        assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
        // SAFETY: both were just made and are ours.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(pipe[0]), OwnedFd::from_raw_fd(pipe[1])) };
        send_with_fds(&sender, &path, REGISTER, &[r.as_raw_fd(), w.as_raw_fd()]);
        sender.send_to(SWITCH, &path).unwrap();
        sender.send_to(b"SS1 0 10 1 0 0 S iter", &path).unwrap();
        match rx.recv_timeout(Duration::from_secs(5)).unwrap() {
            Datagram::Marker(m) => assert_eq!(m.seq, 0),
            other => panic!("only the marker is handed on: {other:?}"),
        }
        assert_eq!(listener.channels(), 0);
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
