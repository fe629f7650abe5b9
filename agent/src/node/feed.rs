//! The live feed: the model of a running `stallscope run`, agent or collector, for a second
//! process (`stallscope feed`, `stallscope top`) or a view in this one.
//!
//! The journal's owner publishes every attribution round (at most 10 a second) to a
//! [`FeedHub`]. A subscriber first gets a snapshot of the whole model, then the updates. Each
//! subscriber has a bounded queue; one that falls behind is dropped, so a stalled client never
//! slows the recorder, and nothing is serialised while nobody listens.
//!
//! [`serve`] puts the hub on a Unix stream socket, owner-only (0600, in an owner-only
//! directory): one JSON object per line, documented in the README ("The live feed").

use std::io::{BufWriter, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
pub use stallscope_analysis::view::hub::{FeedHub, FeedMessage, SUBSCRIBER_QUEUE};
use stallscope_analysis::view::{JobView, ViewUpdate};

/// The feed's protocol name and version, the first field of its first line.
pub const FEED_SCHEMA: &str = "stallscope.feed/1";

/// How long one write to a socket client may block before the client is dropped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// One line of the feed's JSON form.
#[derive(Serialize)]
#[serde(rename_all = "lowercase")]
enum Line<'a> {
    Snapshot(&'a JobView),
    Update(&'a ViewUpdate),
    End(bool),
}

/// The JSON line of a message, without its newline: `{"snapshot":{…}}`, `{"update":{…}}` or
/// `{"end":true}`.
pub fn json_line(msg: &FeedMessage) -> String {
    let line = match msg {
        FeedMessage::Snapshot(v) => Line::Snapshot(v),
        FeedMessage::Update(u) => Line::Update(u),
        FeedMessage::End => Line::End(true),
    };
    serde_json::to_string(&line).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
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

/// Serves `hub` on a Unix stream socket at `path`, readable and writable by this user only.
/// Each client is written to by a thread of its own; one that cannot keep up is dropped.
pub fn serve(hub: Arc<FeedHub>, path: &Path) -> std::io::Result<FeedSocket> {
    let _ = std::fs::remove_file(path);
    // The socket is created under a umask that leaves it owner-only from the start.
    // SAFETY: umask only swaps the process's file-creation mask.
    let old = unsafe { libc::umask(0o177) };
    let bound = UnixListener::bind(path);
    // SAFETY: as above, restoring the previous mask.
    unsafe { libc::umask(old) };
    let listener = bound?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
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
    while let Ok(msg) = rx.recv() {
        let end = matches!(msg, FeedMessage::End);
        let mut line = json_line(&msg);
        line.push('\n');
        if out
            .write_all(line.as_bytes())
            .and_then(|_| out.flush())
            .is_err()
            || end
        {
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

/// A client of a feed socket: reads the hello, then each message, and keeps the model.
pub struct FeedClient {
    lines: std::io::Lines<std::io::BufReader<UnixStream>>,
    view: Option<JobView>,
    path: PathBuf,
}

/// What went wrong reading a feed.
#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    /// The socket could not be opened or read.
    #[error("the feed at {path}: {source}")]
    Io {
        /// The socket.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The server speaks another protocol.
    #[error("{path} speaks {hello}, this stallscope reads {{\"feed\":\"{FEED_SCHEMA}\"}}")]
    Version {
        /// The socket.
        path: PathBuf,
        /// Its first line.
        hello: String,
    },
    /// A line that is not a feed message.
    #[error("a malformed line from the feed at {path}: {line}")]
    Malformed {
        /// The socket.
        path: PathBuf,
        /// The line's first 80 characters.
        line: String,
    },
}

/// One line of the feed, as read.
#[derive(serde::Deserialize)]
#[serde(rename_all = "lowercase")]
enum ReadLine {
    Snapshot(Box<JobView>),
    Update(Box<ViewUpdate>),
    End(serde::de::IgnoredAny),
}

impl FeedClient {
    /// Attaches to the feed at `path`; a read that waits longer than `timeout` fails.
    pub fn connect(path: &Path, timeout: Duration) -> Result<FeedClient, FeedError> {
        use std::io::BufRead;
        let io = |source| FeedError::Io {
            path: path.to_path_buf(),
            source,
        };
        let stream = UnixStream::connect(path).map_err(io)?;
        stream.set_read_timeout(Some(timeout)).map_err(io)?;
        let mut lines = std::io::BufReader::new(stream).lines();
        let hello = lines
            .next()
            .unwrap_or_else(|| Err(std::io::ErrorKind::UnexpectedEof.into()))
            .map_err(io)?;
        if hello != format!("{{\"feed\":\"{FEED_SCHEMA}\"}}") {
            return Err(FeedError::Version {
                path: path.to_path_buf(),
                hello,
            });
        }
        Ok(FeedClient {
            lines,
            view: None,
            path: path.to_path_buf(),
        })
    }

    /// The next message, as its JSON line and as folded into the model; `None` at the end
    /// of the feed.
    pub fn next_message(&mut self) -> Option<Result<(String, FeedMessage), FeedError>> {
        let line = match self.lines.next()? {
            Ok(l) => l,
            Err(source) => {
                return Some(Err(FeedError::Io {
                    path: self.path.clone(),
                    source,
                }))
            }
        };
        let msg = match serde_json::from_str::<ReadLine>(&line) {
            Ok(ReadLine::Snapshot(v)) => {
                self.view = Some((*v).clone());
                FeedMessage::Snapshot(Arc::new(*v))
            }
            Ok(ReadLine::Update(u)) => {
                if let Some(v) = self.view.as_mut() {
                    v.apply((*u).clone());
                }
                FeedMessage::Update(Arc::new(*u))
            }
            Ok(ReadLine::End(_)) => FeedMessage::End,
            Err(_) => {
                return Some(Err(FeedError::Malformed {
                    path: self.path.clone(),
                    line: line.chars().take(80).collect(),
                }))
            }
        };
        Some(Ok((line, msg)))
    }

    /// The model as the messages so far make it (after the snapshot).
    pub fn view(&self) -> Option<&JobView> {
        self.view.as_ref()
    }
}

/// The newest feed socket (`*.feed`) in this user's feed directory.
pub fn newest_feed() -> std::io::Result<PathBuf> {
    let dir = super::feed_dir()?;
    std::fs::read_dir(&dir)?
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "feed"))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .max()
        .map(|(_, p)| p)
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!(
                    "no live feed in {}: is a `stallscope run`, agent or collector running as this user?",
                    dir.display()
                ),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_is_owner_only_and_speaks_json_lines() {
        use std::io::BufRead;
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
