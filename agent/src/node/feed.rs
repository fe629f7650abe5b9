//! The live feed: the model of a running `stallscope run`, agent or collector, for a second
//! process (`stallscope feed`, `stallscope top`) or a view in this one.
//!
//! The journal's owner publishes every attribution round (at most 10 a second) to a
//! [`FeedHub`]. A subscriber first gets a snapshot of the whole model, then the updates. Each
//! subscriber has a bounded queue; one that falls behind is dropped, so a stalled client never
//! slows the recorder, and nothing is serialised while nobody listens.
//!
//! [`serve`] puts the hub on a Unix stream socket, owner-only (0600, in an owner-only
//! directory): one JSON object per line, documented in the README ("The live feed"). A client
//! that writes the line [`binary_request`] gets, from the next message on, the line
//! [`binary_request`] back and then the binary form
//! ([`stallscope_analysis::view::binary`]): what `stallscope top` reads, since at 1,024 ranks
//! parsing the JSON cost it as much as drawing. A client that asks nothing (`stallscope feed`,
//! older viewers) keeps the JSON lines; an older server never answers, so a client that asked
//! keeps reading them too.

use std::io::{BufWriter, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Duration;

pub use stallscope_analysis::view::binary::BINARY_SCHEMA;
pub use stallscope_analysis::view::hub::{
    json_line, parse_line, FeedHub, FeedMessage, SUBSCRIBER_QUEUE,
};

/// The feed's protocol name and version, the first field of its first line.
pub const FEED_SCHEMA: &str = "stallscope.feed/1";

/// How long one write to a socket client may block before the client is dropped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// bytes, the most a client may write before its request line ends (it has nothing else to
/// say): more is not a request, and the client stays on JSON lines.
const MAX_REQUEST: usize = 256;

/// The line (without its newline) by which a client asks for the binary form, and by which
/// the server says that it follows: `{"encoding":"stallscope.feed-bin/2"}`.
pub fn binary_request() -> String {
    format!("{{\"encoding\":\"{BINARY_SCHEMA}\"}}")
}

/// What a client asked for so far, read without blocking.
#[derive(Default)]
struct Request {
    bytes: Vec<u8>,
    /// The client said all it will (a line, too much, or it shut its side).
    done: bool,
}

impl Request {
    /// Reads what the client wrote since the last look, never waiting; whether its request
    /// line is complete and asks for the binary form.
    fn asks_binary(&mut self, stream: &UnixStream) -> bool {
        use std::os::fd::AsRawFd;
        let mut buf = [0u8; MAX_REQUEST];
        while !self.done {
            // SAFETY: recv writes at most `buf.len()` bytes into the buffer we own; MSG_DONTWAIT
            // makes this one call non-blocking without touching the socket's (shared) flags.
            let n = unsafe {
                libc::recv(
                    stream.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n <= 0 {
                // 0: the client shut its side; < 0: nothing yet (or an error the write sees).
                self.done = n == 0;
                break;
            }
            self.bytes.extend_from_slice(&buf[..n as usize]);
            self.done = self.bytes.contains(&b'\n') || self.bytes.len() > MAX_REQUEST;
        }
        self.done
            && self
                .bytes
                .split(|&b| b == b'\n')
                .next()
                .is_some_and(|line| line == binary_request().as_bytes())
    }
}

/// A socket serving the feed; removed when dropped.
pub struct FeedSocket {
    path: PathBuf,
    stop: Arc<AtomicBool>,
}

impl FeedSocket {
    /// Where it listens.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for FeedSocket {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wakes the accept loop, which then sees `stop`.
        let _ = UnixStream::connect(&self.path);
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A listening Unix stream socket at `path` whose file is owner-only (0600) from the moment it
/// exists: the socket's own mode is set (`fchmod`) before `bind` creates the file, which Linux
/// creates with that mode less the umask. Swapping the process's umask around `bind` instead
/// (as this did) changed it for every thread meanwhile: a directory another thread created
/// then came out 0600 where 0700 was asked for (a test saw it in CI).
fn bind_owner_only(path: &Path) -> std::io::Result<UnixListener> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    let last = std::io::Error::last_os_error;
    // SAFETY: socket takes no pointers; a negative result is an error, else a new descriptor
    // owned from here on.
    let raw = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(last());
    }
    // SAFETY: `raw` is a descriptor this function just opened and owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: fchmod on a descriptor we own.
    if unsafe { libc::fchmod(fd.as_raw_fd(), 0o600) } != 0 {
        return Err(last());
    }
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("socket path too long or not a path: {}", path.display()),
        ));
    }
    for (to, from) in addr.sun_path.iter_mut().zip(bytes) {
        *to = *from as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    // SAFETY: `addr` is a valid sockaddr_un of at least `len` bytes, NUL-terminated (zeroed).
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            std::ptr::addr_of!(addr).cast::<libc::sockaddr>(),
            len as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(last());
    }
    // SAFETY: listen on a bound socket we own.
    if unsafe { libc::listen(fd.as_raw_fd(), 128) } != 0 {
        return Err(last());
    }
    Ok(UnixListener::from(fd))
}

/// Serves `hub` on a Unix stream socket at `path`, readable and writable by this user only.
/// Each client is written to by a thread of its own; one that cannot keep up is dropped.
pub fn serve(hub: Arc<FeedHub>, path: &Path) -> std::io::Result<FeedSocket> {
    let _ = std::fs::remove_file(path);
    let listener = bind_owner_only(path)?;
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        std::thread::Builder::new()
            .name("stallscope-feed".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::Acquire) {
                        break;
                    }
                    if let Ok(stream) = conn {
                        let rx = hub.subscribe(SUBSCRIBER_QUEUE);
                        let _ = std::thread::Builder::new()
                            .name("stallscope-feed-client".into())
                            .spawn(move || write_client(stream, rx));
                    }
                }
            })?;
    }
    Ok(FeedSocket {
        path: path.to_path_buf(),
        stop,
    })
}

fn write_client(stream: UnixStream, rx: Receiver<FeedMessage>) {
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let mut out = BufWriter::new(stream);
    let hello = format!("{{\"feed\":\"{FEED_SCHEMA}\"}}\n");
    if out
        .write_all(hello.as_bytes())
        .and_then(|_| out.flush())
        .is_err()
    {
        return;
    }
    let mut request = Request::default();
    let mut binary = false;
    while let Ok(msg) = rx.recv() {
        let end = matches!(msg, FeedMessage::End);
        let bytes = if binary {
            stallscope_analysis::view::binary::encode_frame(&msg)
        } else if request.asks_binary(out.get_ref()) {
            binary = true;
            let mut bytes = format!("{}\n", binary_request()).into_bytes();
            bytes.extend(stallscope_analysis::view::binary::encode_frame(&msg));
            bytes
        } else {
            let mut line = json_line(&msg);
            line.push('\n');
            line.into_bytes()
        };
        if out.write_all(&bytes).and_then(|_| out.flush()).is_err() || end {
            return;
        }
    }
}

/// Serves `hub` as `name` in this user's feed directory ([`super::feed_dir`]); says once why
/// not when it cannot (the run goes on without a feed).
pub fn open(hub: Arc<FeedHub>, name: &str) -> Option<FeedSocket> {
    match super::feed_dir().and_then(|d| serve(hub, &d.join(name))) {
        Ok(s) => Some(s),
        Err(e) => {
            eprintln!("stallscope: no live feed ({e}); the run goes on");
            None
        }
    }
}

/// The newest live feed socket (`*.feed`) in this user's feed directory: newest first, a
/// socket nothing listens on any more (its run or collector was killed) is removed and the
/// next one tried, so `top` and `feed` never attach to a dead run's leftover.
pub fn newest_feed() -> std::io::Result<PathBuf> {
    let dir = super::feed_dir()?;
    newest_live_feed(&dir)
}

fn newest_live_feed(dir: &Path) -> std::io::Result<PathBuf> {
    let mut feeds: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(dir)?
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "feed"))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    feeds.sort();
    while let Some((_, path)) = feeds.pop() {
        if !super::sweep::is_dead_socket(&path) {
            return Ok(path);
        }
        let _ = std::fs::remove_file(&path);
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::NotFound,
        format!(
            "no live feed in {}: is a `stallscope run`, agent or collector running as this user?",
            dir.display()
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 30, item 11: a killed run's socket is newer than the live agent's; the live one
    /// is chosen, and the dead one removed.
    #[test]
    fn the_newest_live_feed_is_chosen_over_a_newer_dead_one() {
        let dir = tempfile::tempdir().unwrap();
        let hub = Arc::new(FeedHub::default());
        let live = serve(hub, &dir.path().join("agent.feed")).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let dead = dir.path().join("run-1.feed");
        drop(UnixListener::bind(&dead).unwrap());
        assert_eq!(newest_live_feed(dir.path()).unwrap(), live.path());
        assert!(!dead.exists(), "the dead socket is swept");
        drop(live);
        let err = newest_live_feed(dir.path()).unwrap_err();
        assert!(err.to_string().contains("no live feed"), "{err}");
    }
    use stallscope_analysis::view::{JobView, ViewUpdate};

    #[test]
    fn the_socket_is_owner_only_and_speaks_json_lines() {
        use std::io::BufRead;
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.feed");
        let hub = Arc::new(FeedHub::default());
        let socket = serve(hub.clone(), &path).unwrap();
        let mode = std::fs::metadata(socket.path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let client = UnixStream::connect(&path).unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut lines = std::io::BufReader::new(client).lines();
        assert_eq!(
            lines.next().unwrap().unwrap(),
            format!("{{\"feed\":\"{FEED_SCHEMA}\"}}")
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while hub.subscribers() == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        hub.publish(&JobView::new("train"), ViewUpdate::default());
        hub.publish(&JobView::new("train"), ViewUpdate::default());
        hub.end();
        let snapshot = lines.next().unwrap().unwrap();
        assert!(
            snapshot
                .starts_with("{\"snapshot\":{\"schema\":\"stallscope.view/1\",\"name\":\"train\""),
            "{snapshot}"
        );
        assert!(lines.next().unwrap().unwrap().starts_with("{\"update\":"));
        assert_eq!(lines.next().unwrap().unwrap(), "{\"end\":true}");
    }
}
