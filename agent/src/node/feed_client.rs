//! A client of the live feed: the feed socket of a run, agent or collector on this node, or a
//! collector's TCP port (a viewer's Watch, token-checked like an agent's Hello; the same JSON
//! lines arrive in parts), over TLS when the collector uses it ([`crate::tls`]). It keeps the
//! model the messages make.
//!
//! A viewer that draws (`stallscope top`) asks a feed socket for the binary form
//! ([`FeedClient::binary`], see [`super::feed`]); `stallscope feed` keeps the JSON lines.
//!
//! A line is bounded ([`MAX_FEED_LINE`]) on both transports: a server that never ends a line
//! (a Unix socket that sends no newline, a collector whose `Feed` parts never say `last`)
//! ends the feed with [`FeedError::TooLong`] instead of growing the client without bound.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use stallscope_analysis::view::binary;
use stallscope_analysis::view::hub::{parse_line, FeedMessage};
use stallscope_analysis::view::JobView;
use stallscope_analysis::wire::{self, AgentMsg, CollectorMsg, Hello, PROTOCOL_VERSION};

use super::feed::{binary_request, FEED_SCHEMA};
use crate::tls::{SyncStream, TlsClient};

/// bytes, the longest feed line (one message) a client assembles: a snapshot of a job of
/// thousands of ranks is tens of MiB; the collector sends it in [`wire::FEED_PART`] parts.
pub const MAX_FEED_LINE: usize = 64 << 20;

/// What went wrong reading a feed.
#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    /// The feed could not be reached or read.
    #[error("the feed at {at}: {source}")]
    Io {
        /// The socket or address.
        at: String,
        /// Why.
        source: std::io::Error,
    },
    /// The TLS handshake with the collector failed (the reason names the flag to change).
    #[error("the collector at {at}: {reason}")]
    Tls {
        /// The address.
        at: String,
        /// Why, for the user.
        reason: String,
    },
    /// The server speaks another protocol.
    #[error("{at} speaks {hello}, this stallscope reads {{\"feed\":\"{FEED_SCHEMA}\"}}")]
    Version {
        /// The socket.
        at: String,
        /// Its first line.
        hello: String,
    },
    /// A collector refused the viewer.
    #[error("the collector at {at} refused: {reason}")]
    Refused {
        /// The address.
        at: String,
        /// Its reason.
        reason: String,
    },
    /// A line longer than the client takes: the server never ended it.
    #[error("the feed at {at} sent a line over the {} MiB limit without ending it", limit >> 20)]
    TooLong {
        /// The socket or address.
        at: String,
        /// bytes, the limit ([`MAX_FEED_LINE`]).
        limit: usize,
    },
    /// A line or message that is not the feed's.
    #[error("a malformed message from the feed at {at}: {what}")]
    Malformed {
        /// The socket or address.
        at: String,
        /// The line's first 80 characters, or what was wrong.
        what: String,
    },
}

/// Where the lines come from.
enum Source {
    Unix(BufReader<UnixStream>),
    Tcp(BufReader<Box<dyn SyncStream>>),
}

/// Which form the feed's messages come in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    /// JSON lines, not asked otherwise.
    Json,
    /// JSON lines until the server's switch line: the binary form was asked for.
    Asked,
    /// Binary frames ([`binary`]).
    Binary,
}

/// A feed being read, and the model its messages make.
pub struct FeedClient {
    source: Source,
    form: Form,
    view: Option<JobView>,
    /// Whether messages are folded into `view` (a caller that keeps its own model says no).
    folds: bool,
    at: String,
    /// bytes, the longest line taken ([`MAX_FEED_LINE`]; tests lower it).
    max_line: usize,
}

impl FeedClient {
    /// Attaches to the feed socket at `path`; a read that waits longer than `timeout` fails.
    pub fn connect(path: &Path, timeout: Duration) -> Result<FeedClient, FeedError> {
        let at = path.display().to_string();
        let io = |source| FeedError::Io {
            at: at.clone(),
            source,
        };
        let stream = UnixStream::connect(path).map_err(io)?;
        stream.set_read_timeout(Some(timeout)).map_err(io)?;
        let mut reader = BufReader::new(stream);
        let expected = format!("{{\"feed\":\"{FEED_SCHEMA}\"}}");
        let hello = match read_line_within(&mut reader, expected.len() + 1024) {
            Ok(Some(line)) => String::from_utf8_lossy(&line).into_owned(),
            Ok(None) => return Err(io(std::io::ErrorKind::UnexpectedEof.into())),
            Err(LineError::TooLong) => "a line of over 1 KiB".into(),
            Err(LineError::Io(e)) => return Err(io(e)),
        };
        if hello != expected {
            return Err(FeedError::Version { at, hello });
        }
        Ok(FeedClient {
            source: Source::Unix(reader),
            form: Form::Json,
            view: None,
            folds: true,
            at,
            max_line: MAX_FEED_LINE,
        })
    }

    /// Attaches to a collector's live model at `addr` (HOST:PORT) with `token` (empty: none),
    /// over TLS with `tls` (the collector's `--tls-cert`).
    pub fn connect_tcp(
        addr: &str,
        token: &str,
        timeout: Duration,
        tls: Option<&TlsClient>,
    ) -> Result<FeedClient, FeedError> {
        Self::connect_tcp_as(addr, token, timeout, tls, false)
    }

    /// [`FeedClient::connect_tcp`] asking for the binary form ([`AgentMsg::WatchBinary`]); a
    /// collector that predates it refuses the request, and the viewer asks again for JSON.
    pub fn connect_tcp_binary(
        addr: &str,
        token: &str,
        timeout: Duration,
        tls: Option<&TlsClient>,
    ) -> Result<FeedClient, FeedError> {
        match Self::connect_tcp_as(addr, token, timeout, tls, true) {
            Err(FeedError::Refused { .. }) => {
                Self::connect_tcp_as(addr, token, timeout, tls, false)
            }
            other => other,
        }
    }

    fn connect_tcp_as(
        addr: &str,
        token: &str,
        timeout: Duration,
        tls: Option<&TlsClient>,
        binary: bool,
    ) -> Result<FeedClient, FeedError> {
        let at = addr.to_string();
        let io = |source| FeedError::Io {
            at: at.clone(),
            source,
        };
        let tcp = TcpStream::connect(addr).map_err(io)?;
        tcp.set_read_timeout(Some(timeout)).map_err(io)?;
        let stream: Box<dyn SyncStream> = match tls {
            Some(tls) => Box::new(tls.connect_sync(tcp).map_err(|reason| FeedError::Tls {
                at: at.clone(),
                reason,
            })?),
            None => Box::new(tcp),
        };
        let mut reader = BufReader::new(stream);
        // The collector speaks first: a nonce, answered with the proof of the token.
        let first = match read_msg(&mut reader, &at) {
            // A collector using TLS waits for a handshake this viewer does not start, and
            // closes the connection at the end of its handshake time.
            Err(FeedError::Io { at, source }) if tls.is_none() => {
                return Err(FeedError::Tls {
                    at,
                    reason: format!(
                        "{source} before the collector's challenge: is the collector using --tls-cert? give --tls-ca (its certificate or CA); else the collector closed this connection unsaid (a collector at its limit of connections that have not proven the token says so)"
                    ),
                })
            }
            other => other?,
        };
        let nonce = match first {
            CollectorMsg::Challenge { nonce } => nonce,
            CollectorMsg::Refused { reason } => return Err(FeedError::Refused { at, reason }),
            other => {
                return Err(FeedError::Malformed {
                    at,
                    what: format!("expected a challenge, got {other:?}"),
                })
            }
        };
        let hello = Hello {
            protocol: PROTOCOL_VERSION,
            proof: wire::prove(token, wire::Role::Viewer, &nonce),
            node: "viewer".into(),
            agent_version: env!("CARGO_PKG_VERSION").into(),
        };
        let watch = if binary {
            AgentMsg::WatchBinary(hello)
        } else {
            AgentMsg::Watch(hello)
        };
        let w = reader.get_mut();
        w.write_all(&wire::encode(&watch))
            .and_then(|_| w.flush())
            .map_err(io)?;
        match read_msg(&mut reader, &at)? {
            CollectorMsg::Welcome { .. } => {}
            CollectorMsg::Refused { reason } => return Err(FeedError::Refused { at, reason }),
            other => {
                return Err(FeedError::Malformed {
                    at,
                    what: format!("expected a Welcome, got {other:?}"),
                })
            }
        }
        Ok(FeedClient {
            source: Source::Tcp(reader),
            form: if binary { Form::Binary } else { Form::Json },
            view: None,
            folds: true,
            at,
            max_line: MAX_FEED_LINE,
        })
    }

    /// The next line of the feed; `None` at its end.
    fn next_line(&mut self) -> Option<Result<String, FeedError>> {
        match &mut self.source {
            Source::Unix(reader) => match read_line_within(reader, self.max_line) {
                Ok(None) => None,
                Ok(Some(line)) => Some(String::from_utf8(line).map_err(|e| FeedError::Malformed {
                    at: self.at.clone(),
                    what: e.to_string(),
                })),
                Err(LineError::TooLong) => Some(Err(self.too_long())),
                Err(LineError::Io(source)) => Some(Err(FeedError::Io {
                    at: self.at.clone(),
                    source,
                })),
            },
            Source::Tcp(_) => Some(self.next_parts()?.and_then(|line| {
                String::from_utf8(line).map_err(|e| FeedError::Malformed {
                    at: self.at.clone(),
                    what: e.to_string(),
                })
            })),
        }
    }

    /// The bytes of the collector's next [`CollectorMsg::Feed`] parts, up to the `last`;
    /// `None` at the end of the stream.
    fn next_parts(&mut self) -> Option<Result<Vec<u8>, FeedError>> {
        let Source::Tcp(reader) = &mut self.source else {
            return None;
        };
        let mut line = Vec::new();
        loop {
            match read_msg(reader, &self.at) {
                Ok(CollectorMsg::Feed { part, last }) => {
                    if line.len() + part.len() > self.max_line {
                        return Some(Err(self.too_long()));
                    }
                    line.extend_from_slice(&part);
                    if last {
                        return Some(Ok(line));
                    }
                }
                Ok(CollectorMsg::Refused { reason }) => {
                    return Some(Err(FeedError::Refused {
                        at: self.at.clone(),
                        reason,
                    }))
                }
                Ok(_) => {}
                Err(FeedError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::UnexpectedEof =>
                {
                    return None
                }
                Err(e) => return Some(Err(e)),
            }
        }
    }

    fn too_long(&self) -> FeedError {
        FeedError::TooLong {
            at: self.at.clone(),
            limit: self.max_line,
        }
    }

    /// Asks a feed socket for the binary form: the messages then come as postcard frames,
    /// cheaper to read than JSON, and [`FeedClient::next_message`] gives no JSON line. A server
    /// that predates it keeps sending JSON lines, which are read as before. A collector's port
    /// sends JSON whatever is asked.
    pub fn binary(mut self) -> FeedClient {
        if let Source::Unix(reader) = &mut self.source {
            let request = format!("{}\n", binary_request());
            let w = reader.get_mut();
            // A server that already closed its side is seen by the next read, with what it
            // sent before: the request failing to go out changes nothing else.
            if w.write_all(request.as_bytes())
                .and_then(|_| w.flush())
                .is_ok()
            {
                self.form = Form::Asked;
            }
        }
        self
    }

    /// The next binary frame's message; `None` at the end of the stream.
    fn next_frame(&mut self) -> Option<Result<FeedMessage, FeedError>> {
        if let Source::Tcp(_) = self.source {
            let at = self.at.clone();
            return Some(self.next_parts()?.and_then(|payload| {
                binary::decode_payload(&payload).map_err(|e| FeedError::Malformed {
                    at,
                    what: e.to_string(),
                })
            }));
        }
        let malformed = |e: binary::BinaryError| FeedError::Malformed {
            at: self.at.clone(),
            what: e.to_string(),
        };
        let Source::Unix(reader) = &mut self.source else {
            return None;
        };
        let mut prefix = [0u8; 4];
        match reader.read_exact(&mut prefix) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return None,
            Err(source) => {
                return Some(Err(FeedError::Io {
                    at: self.at.clone(),
                    source,
                }))
            }
        }
        let len = match binary::frame_len(prefix) {
            Ok(len) if len <= self.max_line => len,
            Ok(_) => return Some(Err(self.too_long())),
            Err(e) => return Some(Err(malformed(e))),
        };
        let mut payload = vec![0u8; len];
        if let Err(source) = reader.read_exact(&mut payload) {
            return Some(Err(FeedError::Io {
                at: self.at.clone(),
                source,
            }));
        }
        Some(binary::decode_payload(&payload).map_err(malformed))
    }

    /// The next message, as its JSON line (empty in the binary form) and as folded into the
    /// model; `None` at the end of the feed.
    pub fn next_message(&mut self) -> Option<Result<(String, FeedMessage), FeedError>> {
        let (line, msg) = loop {
            if self.form == Form::Binary {
                match self.next_frame()? {
                    Ok(msg) => break (String::new(), msg),
                    Err(e) => return Some(Err(e)),
                }
            }
            let line = match self.next_line()? {
                Ok(l) => l,
                Err(e) => return Some(Err(e)),
            };
            if self.form == Form::Asked && line == binary_request() {
                self.form = Form::Binary;
                continue;
            }
            let Some(msg) = parse_line(&line) else {
                return Some(Err(FeedError::Malformed {
                    at: self.at.clone(),
                    what: line.chars().take(80).collect(),
                }));
            };
            break (line, msg);
        };
        match &msg {
            _ if !self.folds => {}
            FeedMessage::Snapshot(v) => self.view = Some((**v).clone()),
            FeedMessage::Update(u) => {
                if let Some(v) = self.view.as_mut() {
                    v.apply((**u).clone());
                }
            }
            FeedMessage::End => {}
        }
        Some(Ok((line, msg)))
    }

    /// Keeps no model: the caller folds the messages into its own ([`FeedClient::view`] stays
    /// `None`), so a large model is not held twice.
    pub fn without_model(mut self) -> FeedClient {
        self.folds = false;
        self
    }

    /// Takes lines (and binary frames) of up to `bytes` instead of [`MAX_FEED_LINE`]: for a
    /// benchmark whose JSON snapshot is larger.
    pub fn with_line_limit(mut self, bytes: usize) -> FeedClient {
        self.max_line = bytes;
        self
    }

    /// Whether the messages now come in the binary form (the server switched).
    pub fn is_binary(&self) -> bool {
        self.form == Form::Binary
    }

    /// Where it is attached (the socket or HOST:PORT).
    pub fn at(&self) -> &str {
        &self.at
    }

    /// The model as the messages so far make it (after the snapshot).
    pub fn view(&self) -> Option<&JobView> {
        self.view.as_ref()
    }
}

/// Why a line could not be read.
enum LineError {
    /// Over the limit before its newline.
    TooLong,
    Io(std::io::Error),
}

/// The next newline-ended line (without its newline) of at most `max` bytes; `None` at the
/// end of the stream. A longer line is an error as soon as its `max + 1`th byte is read, so
/// no more than that is held.
fn read_line_within(r: &mut impl BufRead, max: usize) -> Result<Option<Vec<u8>>, LineError> {
    let mut line = Vec::new();
    loop {
        let buf = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(LineError::Io(e)),
        };
        if buf.is_empty() {
            return Ok((!line.is_empty()).then_some(line));
        }
        let (taken, ended) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (buf.len(), false),
        };
        if line.len() + taken > max {
            return Err(LineError::TooLong);
        }
        line.extend_from_slice(&buf[..taken]);
        r.consume(taken + usize::from(ended));
        if ended {
            return Ok(Some(line));
        }
    }
}

/// Reads one collector message (length-prefixed postcard, at most [`wire::MAX_MESSAGE`]).
fn read_msg(r: &mut impl Read, at: &str) -> Result<CollectorMsg, FeedError> {
    let io = |source| FeedError::Io {
        at: at.to_string(),
        source,
    };
    let mut prefix = [0u8; 4];
    r.read_exact(&mut prefix).map_err(io)?;
    let malformed = |e: wire::WireError| FeedError::Malformed {
        at: at.to_string(),
        what: e.to_string(),
    };
    let len = wire::payload_len(prefix).map_err(malformed)?;
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).map_err(io)?;
    wire::decode(&payload).map_err(malformed)
}

#[cfg(test)]
mod tests;
