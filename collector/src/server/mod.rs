//! The ingest server: one task per agent connection.
//!
//! A connection is on its own: a bad token, a malformed or oversized message, a wrong
//! protocol version or a dead peer end that connection with a [`CollectorMsg::Refused`] that
//! says why (and an [`Ingest::NodeDown`] for the job), and never touches another. Records go to
//! the job task through a bounded channel, so a collector that falls behind slows its agents
//! down through TCP instead of growing without bound; the agents buffer meanwhile.
//!
//! Before a peer is welcomed it is a stranger: it is sent a fresh nonce and must answer with a
//! Hello proving it holds the token (HMAC of the nonce, [`wire::prove`]), so the token never
//! crosses the network; its messages may be at most [`wire::MAX_PREAUTH`] bytes, so it cannot
//! make the collector allocate more; and at most [`MAX_STRANGERS`] are served at once, at most
//! [`MAX_STRANGERS_PER_ADDRESS`] from one address, the oldest of the busiest address closed
//! to make room for a newcomer ([`strangers`]), so a flood of idle connections cannot starve
//! the real agents (each stranger has [`ServerConfig::handshake_timeout`] to become an agent).
//!
//! With [`ServerConfig::tls`] every connection first does a TLS handshake and the protocol
//! runs inside it ([`crate::tls`]). The TLS handshake is part of the stranger's time: it
//! counts among the [`MAX_STRANGERS`] and must be over, Hello and clock exchanges included,
//! within the handshake time; a peer that does not speak TLS (a plain agent, which waits for
//! the challenge and sends nothing) is closed when that time is up, and one that sends
//! something else is closed at once. Neither touches another connection.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use stallscope_analysis::frame::{Frame, NodeClock, NodeMeta};
use stallscope_analysis::marker::MAX_META_VALUE;
use stallscope_analysis::wire::{
    self, AgentMsg, CollectorMsg, Hello, Role, WireError, PROTOCOL_VERSION,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use stallscope_analysis::view::hub::{json_line, FeedHub, FeedMessage, SUBSCRIBER_QUEUE};
use std::sync::mpsc::TryRecvError;

use crate::clock::{ClockEstimator, BUCKET};

mod strangers;
mod viewer;
use crate::monotonic_ns;
use strangers::{StrangerPass, Strangers};
pub use strangers::{MAX_STRANGERS, MAX_STRANGERS_PER_ADDRESS};
use viewer::watch;

/// How long the server waits after a failed accept (no file descriptor left) before it tries
/// again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// How often a welcomed connection looks for a request for the ranks' stacks, whether a
/// clock ping is due, and whether to acknowledge what the job task wrote
/// ([`ACK_AT_LEAST_EVERY`]).
const CONNECTION_TICK: Duration = Duration::from_millis(200);

/// How often an agent that keeps sending is told what the job task wrote. An agent that has
/// sent nothing the job task has not written yet (it is quiet, or finishing and waiting for
/// its last records' acknowledgement) is told at the next [`CONNECTION_TICK`]. An
/// acknowledgement is a write, and a read by the agent: at every tick (200 ms), at 1,250
/// agents, writing them was 13% of the collector's connection thread. An agent keeps what
/// is not acknowledged yet, a second of records (its buffer holds 100,000 by default).
const ACK_AT_LEAST_EVERY: Duration = Duration::from_secs(1);

/// How the server behaves.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The token agents must present; `None` accepts any (loopback only).
    pub token: Option<String>,
    /// Clock exchanges before the Welcome.
    pub sync_exchanges: usize,
    /// Between two clock exchanges once welcomed.
    pub ping_every: Duration,
    /// How long an agent has to say Hello and answer the first pings.
    pub handshake_timeout: Duration,
    /// The job's live model, for viewers (`AgentMsg::Watch`); `None` refuses them.
    pub feed: Option<Arc<FeedHub>>,
    /// TLS on every connection (`--tls-cert`, `--tls-key`); `None`: plain TCP.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// The job task's latest request for the ranks' places and stacks (0: none yet): each
    /// agent's connection passes a new one on as [`CollectorMsg::Stacks`].
    pub stacks_asked: Option<watch::Receiver<u64>>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            token: None,
            sync_exchanges: 2 * BUCKET,
            ping_every: Duration::from_millis(500),
            handshake_timeout: Duration::from_secs(5),
            feed: None,
            tls: None,
            stacks_asked: None,
        }
    }
}

/// What connections hand to the job task.
#[derive(Debug)]
pub enum Ingest {
    /// An agent was welcomed.
    NodeUp {
        /// Its node name.
        node: String,
        /// Its address.
        peer: SocketAddr,
    },
    /// A new clock estimate.
    Clock(NodeClock),
    /// Frames from a node, in order, as one read took them; `ack` is raised to the last
    /// one's sequence number once they are in the profile.
    Records {
        /// (agent's sequence number, the frame with its node set from the handshake).
        records: Vec<(u64, Frame)>,
        /// The profile's encoding of those it could be made for from the bytes received.
        encoded: Encoded,
        /// The connection's acknowledged sequence number.
        ack: Arc<AtomicU64>,
    },
    /// A connection ended (`node` is `None` when it never said who it was).
    NodeDown {
        /// Its node name, if it said Hello.
        node: Option<String>,
        /// Its address.
        peer: SocketAddr,
        /// Why, when it was not a clean goodbye.
        reason: Option<String>,
    },
}

/// The profile's encodings of some of one read's records, made from the bytes they came in
/// ([`splice_node`]) so that the job task writes them without encoding them again.
#[derive(Debug, Default)]
pub struct Encoded {
    /// The encodings, one after the other.
    bytes: Vec<u8>,
    /// Per record, in order: where its encoding lies in `bytes`; `None` for a record the
    /// profile encodes itself.
    spans: Vec<Option<(u32, u32)>>,
}

impl Encoded {
    /// Record `i`'s encoding (its frame's, node name included), when it has one.
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        let (start, end) = self.spans.get(i).copied().flatten()?;
        self.bytes.get(start as usize..end as usize)
    }

    /// Notes the next record: `frame` as tagged, which came in message `msg` (an
    /// [`AgentMsg::Record`]'s whole payload, nothing after it).
    fn push(&mut self, frame: &Frame, msg: &[u8], node: &str) {
        let span = match frame {
            Frame::NodeReport(_) | Frame::NodeIteration(_) => {
                splice_node(msg, node, &mut self.bytes)
            }
            _ => None,
        };
        self.spans.push(span);
    }
}

/// Appends to `out` the encoding of the rank's iteration in record `msg` once tagged with
/// `node`, and returns where it lies, when the agent sent it with an empty node name (as
/// agents do: the collector names the node). Postcard writes a [`Frame::NodeReport`]'s or
/// [`Frame::NodeIteration`]'s node name first, right after the variant's tag, so the
/// encoding is the bytes received with the name put in: no second encoding of the frame
/// (at 10,000 ranks, 300,000 a second).
fn splice_node(msg: &[u8], node: &str, out: &mut Vec<u8>) -> Option<(u32, u32)> {
    let (_, after_msg_tag) = postcard::take_from_bytes::<u32>(msg).ok()?;
    let (_, frame) = postcard::take_from_bytes::<u64>(after_msg_tag).ok()?;
    let (_, after_tag) = postcard::take_from_bytes::<u32>(frame).ok()?;
    // An empty name is its length, 0, alone.
    let rest = after_tag.strip_prefix(&[0])?;
    let start = out.len();
    out.reserve(frame.len() + node.len() + 10);
    out.extend_from_slice(&frame[..frame.len() - after_tag.len()]);
    // The name as postcard writes a `str`: its length (a varint), then its bytes.
    push_varint(out, node.len() as u64);
    out.extend_from_slice(node.as_bytes());
    out.extend_from_slice(rest);
    Some((u32::try_from(start).ok()?, u32::try_from(out.len()).ok()?))
}

/// Appends `v` as postcard writes an unsigned integer: 7 bits a byte, lowest first, the top
/// bit set on every byte but the last.
fn push_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Why a connection ends.
#[derive(Debug, thiserror::Error)]
enum ConnError {
    #[error("{0}")]
    Refused(String),
    #[error("connection lost ({0})")]
    Io(#[from] std::io::Error),
}

impl From<WireError> for ConnError {
    fn from(e: WireError) -> Self {
        ConnError::Refused(e.to_string())
    }
}

/// Reads one message's payload (the tests' side of a conversation; the server's agents are
/// read in chunks by [`spawn_reader`]).
#[cfg(test)]
async fn read_payload<R: AsyncRead + Unpin>(r: &mut R, buf: &mut Vec<u8>) -> Result<(), ConnError> {
    read_payload_within(r, buf, wire::MAX_MESSAGE).await
}

/// Reads one message's payload of at most `max` bytes; a longer one is refused before
/// anything is allocated for it.
async fn read_payload_within<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
    max: u32,
) -> Result<(), ConnError> {
    let mut prefix = [0u8; 4];
    r.read_exact(&mut prefix).await?;
    let len = wire::payload_len_within(prefix, max)?;
    buf.resize(len, 0);
    r.read_exact(buf).await?;
    Ok(())
}

/// Reads a stranger's first message, at most [`wire::MAX_PREAUTH`] bytes. On a plain
/// connection, a TLS ClientHello (a record of type 22, version 3.x) is refused with what to
/// change: the peer was given --tls-ca and this collector no --tls-cert.
async fn first_payload<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
    tls: bool,
) -> Result<(), ConnError> {
    let mut prefix = [0u8; 4];
    r.read_exact(&mut prefix).await?;
    if !tls && prefix[..2] == [0x16, 0x03] {
        return Err(ConnError::Refused(
            "the peer speaks TLS (it was given --tls-ca) and this collector does not: start the collector with --tls-cert and --tls-key, or leave out --tls-ca".into(),
        ));
    }
    let len = wire::payload_len_within(prefix, wire::MAX_PREAUTH)?;
    buf.resize(len, 0);
    r.read_exact(buf).await?;
    Ok(())
}

/// A fresh nonce for one connection's challenge.
fn nonce() -> std::io::Result<Vec<u8>> {
    let mut n = vec![0u8; wire::NONCE_BYTES];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut n)?;
    Ok(n)
}

async fn send<W: AsyncWrite + Unpin>(w: &mut W, msg: &CollectorMsg) -> std::io::Result<()> {
    send_bytes(w, &wire::encode(msg)).await
}

/// Writes an encoded message and flushes it.
async fn send_bytes<W: AsyncWrite + Unpin>(w: &mut W, message: &[u8]) -> std::io::Result<()> {
    w.write_all(message).await?;
    // Over TLS the bytes may wait in the session's buffer until flushed.
    w.flush().await
}

/// Who is on the other end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Peer {
    /// An agent: it sends records.
    Agent,
    /// A viewer: it is sent the live model, as JSON lines or (`binary`) binary frames.
    Viewer {
        /// Whether it asked for the binary form ([`AgentMsg::WatchBinary`]).
        binary: bool,
    },
}

/// Checks an agent's (or a viewer's) first message, the answer to the challenge `nonce`.
fn check_hello(
    payload: &[u8],
    token: Option<&str>,
    nonce: &[u8],
) -> Result<(Hello, Peer), ConnError> {
    let (hello, peer) = match wire::decode::<AgentMsg>(payload) {
        Ok(AgentMsg::Hello(h)) => (h, Peer::Agent),
        Ok(AgentMsg::Watch(h)) => (h, Peer::Viewer { binary: false }),
        Ok(AgentMsg::WatchBinary(h)) => (h, Peer::Viewer { binary: true }),
        Ok(_) | Err(_) => {
            return Err(ConnError::Refused(match wire::hello_version(payload) {
                Some(v) if v != PROTOCOL_VERSION => format!(
                    "the agent speaks protocol version {v}, this collector speaks {PROTOCOL_VERSION}: run the same stallscope version on both"
                ),
                _ => "the first message was not a stallscope Hello (is this a stallscope agent?)".into(),
            }))
        }
    };
    if hello.protocol != PROTOCOL_VERSION {
        return Err(ConnError::Refused(format!(
            "the agent speaks protocol version {}, this collector speaks {PROTOCOL_VERSION}: run the same stallscope version on both",
            hello.protocol
        )));
    }
    if let Some(expected) = token {
        if hello.proof.is_empty() {
            return Err(ConnError::Refused(
                "this collector requires a token: give the agent --token-file".into(),
            ));
        }
        let role = match peer {
            Peer::Agent => Role::Agent,
            Peer::Viewer { .. } => Role::Viewer,
        };
        if !wire::verify(expected, role, nonce, &hello.proof) {
            return Err(ConnError::Refused(
                "wrong token: the agent's --token-file does not match the collector's".into(),
            ));
        }
    }
    let name_ok = !hello.node.is_empty()
        && hello.node.len() <= 64
        && hello
            .node
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-:".contains(c));
    if !name_ok {
        return Err(ConnError::Refused(format!(
            "node name {:?} is not 1-64 characters of [A-Za-z0-9._:-]",
            hello.node
        )));
    }
    Ok((hello, peer))
}

/// Accepts agents until `shutdown` turns true.
pub async fn serve(
    listener: TcpListener,
    config: ServerConfig,
    tx: mpsc::Sender<Ingest>,
    mut shutdown: watch::Receiver<bool>,
) {
    let config = Arc::new(config);
    let strangers = Arc::new(Strangers::default());
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(_) => {
                        // Out of file descriptors (or memory): the pending connection stays
                        // queued and accept fails again at once, so wait instead of spinning.
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                };
                let stranger = match strangers.admit(peer.ip()) {
                    Ok(pass) => pass,
                    Err(reason) => {
                        // Said in the clear only to a plain peer; a TLS one sees the close.
                        if config.tls.is_none() {
                            let _ = stream.try_write(&wire::encode(&CollectorMsg::Refused { reason }));
                        }
                        drop(stream);
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let (config, tx, shutdown) = (config.clone(), tx.clone(), shutdown.clone());
                tokio::spawn(async move {
                    connection(stream, peer, config, tx, shutdown, stranger).await
                });
            }
            _ = shutdown.changed() => break,
        }
    }
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    config: Arc<ServerConfig>,
    tx: mpsc::Sender<Ingest>,
    shutdown: watch::Receiver<bool>,
    mut stranger: StrangerPass,
) {
    // One deadline for the whole stranger's time: the TLS handshake, the Hello and the
    // first clock exchanges.
    let deadline = tokio::time::Instant::now() + config.handshake_timeout;
    let Some(tls) = config.tls.clone() else {
        let (r, w) = stream.into_split();
        return converse(r, w, peer, deadline, config, tx, shutdown, stranger).await;
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let accepted = tokio::select! {
        accepted = tokio::time::timeout_at(deadline, acceptor.accept(stream)) => accepted,
        _ = stranger.evicted() => return,
    };
    let reason = match accepted {
        Ok(Ok(stream)) => {
            let (r, w) = tokio::io::split(stream);
            return converse(r, w, peer, deadline, config, tx, shutdown, stranger).await;
        }
        Ok(Err(e)) => crate::tls::explain_accept(&e),
        Err(_) => "no TLS handshake within the handshake time (a plain agent or viewer waits for a challenge it is not sent: give it --tls-ca, since this collector uses --tls-cert)".to_string(),
    };
    drop(stranger);
    let _ = tx
        .send(Ingest::NodeDown {
            node: None,
            peer,
            reason: Some(reason),
        })
        .await;
}

/// bytes, the buffer a connection's handshake is read through (the Hello and the clock
/// answers: small messages, each read in two parts). An agent's records are read without it
/// ([`spawn_reader`]): a buffer of 64 KiB was 80 MB at 1,250 agents, and every record's
/// bytes were copied out of it once more.
const HANDSHAKE_BUFFER: usize = 4 * 1024;

/// One connection's conversation on any stream (plain TCP, or TLS over it): the challenge
/// and Hello before `deadline`, then an agent's records or a viewer's feed.
#[allow(clippy::too_many_arguments)]
async fn converse<R, W>(
    r: R,
    mut w: W,
    peer: SocketAddr,
    deadline: tokio::time::Instant,
    config: Arc<ServerConfig>,
    tx: mpsc::Sender<Ingest>,
    shutdown: watch::Receiver<bool>,
    mut stranger: StrangerPass,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let mut r = BufReader::with_capacity(HANDSHAKE_BUFFER, r);
    let mut node = None;
    let result = async {
        let shaken = tokio::select! {
            shaken = tokio::time::timeout_at(deadline, handshake(&mut r, &mut w, &config)) => shaken,
            _ = stranger.evicted() => {
                let reason = strangers::EVICTED.to_string();
                let _ = send(&mut w, &CollectorMsg::Refused { reason: reason.clone() }).await;
                return Err(ConnError::Refused(reason));
            }
        };
        let (hello, who, clock) = shaken.map_err(|_| {
            ConnError::Refused("no Hello and clock answers within the handshake time".into())
        })??;
        drop(stranger);
        send(
            &mut w,
            &CollectorMsg::Welcome {
                collector_version: env!("CARGO_PKG_VERSION").into(),
            },
        )
        .await?;
        if let (Peer::Viewer { binary }, Some(hub)) = (who, &config.feed) {
            let watched = watch(&mut w, hub, shutdown.clone(), binary).await;
            // TLS says goodbye (close_notify) before the socket closes.
            let _ = w.shutdown().await;
            return watched;
        }
        node = Some(hello.node.clone());
        let _ = tx
            .send(Ingest::NodeUp {
                node: hello.node.clone(),
                peer,
            })
            .await;
        if let Some(c) = clock.estimate(&hello.node) {
            let _ = tx.send(Ingest::Clock(c)).await;
        }
        welcomed(r, w, &hello.node, clock, &config, &tx, shutdown).await
    }
    .await;
    let reason = match result {
        Ok(()) => None,
        Err(e) => Some(e.to_string()),
    };
    let _ = tx.send(Ingest::NodeDown { node, peer, reason }).await;
}

/// Hello, then the first clock exchanges, one at a time.
async fn handshake<R, W>(
    r: &mut R,
    w: &mut W,
    config: &ServerConfig,
) -> Result<(Hello, Peer, ClockEstimator), ConnError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let nonce = nonce()?;
    send(
        w,
        &CollectorMsg::Challenge {
            nonce: nonce.clone(),
        },
    )
    .await?;
    let mut buf = Vec::new();
    let first = first_payload(r, &mut buf, config.tls.is_some()).await;
    let hello = match first {
        Ok(()) => check_hello(&buf, config.token.as_deref(), &nonce),
        Err(e) => Err(e),
    };
    let (hello, peer) = match hello {
        Ok((_, Peer::Viewer { .. })) if config.feed.is_none() => {
            let reason = "this collector serves no live feed".to_string();
            let _ = send(
                w,
                &CollectorMsg::Refused {
                    reason: reason.clone(),
                },
            )
            .await;
            return Err(ConnError::Refused(reason));
        }
        Ok(h) => h,
        Err(ConnError::Refused(reason)) => {
            let _ = send(
                w,
                &CollectorMsg::Refused {
                    reason: reason.clone(),
                },
            )
            .await;
            return Err(ConnError::Refused(reason));
        }
        Err(e) => return Err(e),
    };
    let mut clock = ClockEstimator::default();
    let exchanges = match peer {
        Peer::Agent => config.sync_exchanges,
        Peer::Viewer { .. } => 0,
    };
    for _ in 0..exchanges {
        let t1 = monotonic_ns();
        send(w, &CollectorMsg::Ping { t1 }).await?;
        read_payload_within(r, &mut buf, wire::MAX_PREAUTH).await?;
        let t4 = monotonic_ns();
        match wire::decode::<AgentMsg>(&buf)? {
            AgentMsg::Pong { t1: echo, t2, t3 } if echo == t1 => clock.add(t1, t2, t3, t4),
            _ => {
                return Err(ConnError::Refused(
                    "expected a clock answer during the handshake".into(),
                ))
            }
        }
    }
    Ok((hello, peer, clock))
}

/// bytes, what the reader asks of the socket at least per read: every whole message that
/// arrived is taken in one go (an agent writes all it has queued at once).
const READ_CHUNK: usize = 16 * 1024;

/// An agent's messages after the Welcome other than records, with the time each arrived; or
/// why reading stopped.
type Received = Result<(AgentMsg, u64), ConnError>;

/// Reads an agent's messages on a task of its own (reading is not cancel-safe), starting with
/// what the handshake's buffer `r` holds already (an agent writes its first records as soon
/// as it has answered the clock), then straight from the stream under it. Records go
/// straight to the job task, tagged with the connection's node and in one [`Ingest::Records`]
/// per read, so a record costs one channel hop, and the job task's queue takes a node's
/// records of one write as one item; the rest (pongs, goodbye, errors) goes to the connection
/// task, in order after the records before it. The channel of the rest closes without an
/// error when the job task is gone.
fn spawn_reader<R>(
    r: BufReader<R>,
    node: String,
    ack: Arc<AtomicU64>,
    received: Arc<AtomicU64>,
    job: mpsc::Sender<Ingest>,
) -> (tokio::task::JoinHandle<()>, mpsc::Receiver<Received>)
where
    R: AsyncRead + Unpin + Send + 'static,
{
    let (msg_tx, msgs) = mpsc::channel::<Received>(64);
    let reader = tokio::spawn(async move {
        let mut inbox: Vec<u8> = Vec::with_capacity(READ_CHUNK.max(r.buffer().len()));
        inbox.extend_from_slice(r.buffer());
        let mut r = r.into_inner();
        // Records the previous read held: the room made for the next read's, which an agent
        // writing a step of its ranks at a time makes alike.
        let mut last_count = 0;
        loop {
            let mut records = Vec::with_capacity(last_count);
            let mut encoded = Encoded {
                // Their encodings are the bytes received and the node's name in each.
                bytes: Vec::with_capacity(match inbox.len() {
                    n if n < 4 => 0,
                    n => n + last_count.max(1) * (node.len() + 1),
                }),
                spans: Vec::with_capacity(last_count),
            };
            let mut taken = 0;
            let mut failed = None;
            while inbox.len() - taken >= 4 {
                let prefix: [u8; 4] = inbox[taken..taken + 4].try_into().expect("4 bytes");
                let len = match wire::payload_len(prefix) {
                    Ok(len) => len,
                    Err(e) => {
                        failed = Some(ConnError::from(e));
                        break;
                    }
                };
                if inbox.len() - taken - 4 < len {
                    break;
                }
                let msg = &inbox[taken + 4..taken + 4 + len];
                // Whether the message is the record and nothing after it: only then are its
                // bytes the frame's encoding.
                let decoded = wire::take_agent_msg(msg).map(|(m, rest)| (m, rest.is_empty()));
                taken += 4 + len;
                match decoded {
                    Ok((AgentMsg::Record { seq, frame }, whole)) => match tag(frame, &node) {
                        Ok(frame) => {
                            if whole {
                                encoded.push(&frame, msg, &node);
                            } else {
                                encoded.spans.push(None);
                            }
                            records.push((seq, frame));
                        }
                        Err(e) => {
                            failed = Some(e);
                            break;
                        }
                    },
                    Ok((other, _)) => {
                        if !send_records(&job, &mut records, &mut encoded, &ack, &received).await {
                            return;
                        }
                        if msg_tx.send(Ok((other, monotonic_ns()))).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        failed = Some(e.into());
                        break;
                    }
                }
            }
            inbox.drain(..taken);
            last_count = records.len();
            if !send_records(&job, &mut records, &mut encoded, &ack, &received).await {
                return;
            }
            if let Some(e) = failed {
                let _ = msg_tx.send(Err(e)).await;
                return;
            }
            if inbox.capacity() - inbox.len() < READ_CHUNK / 4 {
                inbox.reserve(READ_CHUNK);
            }
            match r.read_buf(&mut inbox).await {
                Ok(0) => {
                    let eof = std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
                    let _ = msg_tx.send(Err(eof.into())).await;
                    return;
                }
                Ok(_) => {}
                Err(e) => {
                    let _ = msg_tx.send(Err(e.into())).await;
                    return;
                }
            }
        }
    });
    (reader, msgs)
}

/// Hands `records` and their `encoded` forms (taken) to the job task, noting the last one's
/// sequence number in `received` first (the job task cannot acknowledge past it); `false`
/// when the job task is gone.
async fn send_records(
    job: &mpsc::Sender<Ingest>,
    records: &mut Vec<(u64, Frame)>,
    encoded: &mut Encoded,
    ack: &Arc<AtomicU64>,
    received: &AtomicU64,
) -> bool {
    let Some(&(last, _)) = records.last() else {
        return true;
    };
    received.store(last, Ordering::Release);
    let records = std::mem::take(records);
    job.send(Ingest::Records {
        records,
        encoded: std::mem::take(encoded),
        ack: ack.clone(),
    })
    .await
    .is_ok()
}

/// Takes one message of a welcomed agent other than a record: a pong to the clock.
/// `Ok(false)`: the connection ends cleanly (a goodbye).
async fn on_message(
    item: Received,
    node: &str,
    clock: &mut ClockEstimator,
    tx: &mpsc::Sender<Ingest>,
) -> Result<bool, ConnError> {
    match item? {
        // The reader sends records to the job task itself.
        (AgentMsg::Record { .. }, _) => Ok(true),
        (AgentMsg::Pong { t1, t2, t3 }, t4) => {
            clock.add(t1, t2, t3, t4);
            if clock.exchanges() % BUCKET as u32 == 0 {
                if let Some(c) = clock.estimate(node) {
                    let _ = tx.send(Ingest::Clock(c)).await;
                }
            }
            Ok(true)
        }
        (AgentMsg::Bye, _) => Ok(false),
        (AgentMsg::Hello(_) | AgentMsg::Watch(_) | AgentMsg::WatchBinary(_), _) => Err(
            ConnError::Refused("a second Hello on one connection".into()),
        ),
    }
}

/// After the Welcome: records in (`r`: the stream under the handshake's buffer); pings and
/// acks out.
async fn welcomed<R, W>(
    r: BufReader<R>,
    mut w: W,
    node: &str,
    mut clock: ClockEstimator,
    config: &ServerConfig,
    tx: &mpsc::Sender<Ingest>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), ConnError>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let ack = Arc::new(AtomicU64::new(u64::MAX));
    // The last record's sequence number the reader handed to the job task.
    let received = Arc::new(AtomicU64::new(0));
    let (reader, mut msgs) = spawn_reader(
        r,
        node.to_string(),
        ack.clone(),
        received.clone(),
        tx.clone(),
    );
    let mut tick = tokio::time::interval(CONNECTION_TICK);
    let mut last_ping = tokio::time::Instant::now();
    let mut acked = u64::MAX;
    let mut last_ack = tokio::time::Instant::now();
    // A request made before this agent came (or came back) is sent at the first tick: its
    // answer is still awaited, and the agent answers each request once. Requests are looked
    // for at each tick rather than awaited: a wait on the one channel every connection
    // shares registers and unregisters with it at every turn of this loop (at 1,250 agents,
    // a lock taken 12,500 times a second), and a hang's question can wait a tick.
    let mut asks = config.stacks_asked.clone();
    let result = loop {
        tokio::select! {
            item = msgs.recv() => {
                let Some(item) = item else { break Ok(()) };
                match on_message(item, node, &mut clock, tx).await {
                    Ok(true) => {}
                    Ok(false) => break Ok(()),
                    Err(e) => break Err(e),
                }
            }
            _ = tick.tick() => {
                if let Some(a) = asks.as_mut() {
                    match a.has_changed() {
                        Ok(true) => {
                            let id = *a.borrow_and_update();
                            send(&mut w, &CollectorMsg::Stacks { id }).await?;
                        }
                        Ok(false) => {}
                        // The job task is gone: nothing will ask again.
                        Err(_) => asks = None,
                    }
                }
                let now_acked = ack.load(Ordering::Acquire);
                let caught_up = now_acked >= received.load(Ordering::Acquire);
                if now_acked != u64::MAX
                    && now_acked != acked
                    && (caught_up || last_ack.elapsed() >= ACK_AT_LEAST_EVERY)
                {
                    acked = now_acked;
                    last_ack = tokio::time::Instant::now();
                    send(&mut w, &CollectorMsg::Ack { upto: acked }).await?;
                }
                if last_ping.elapsed() >= config.ping_every {
                    last_ping = tokio::time::Instant::now();
                    send(&mut w, &CollectorMsg::Ping { t1: monotonic_ns() }).await?;
                }
            }
            _ = shutdown.changed() => break Ok(()),
        }
    };
    reader.abort();
    if let Err(ConnError::Refused(reason)) = &result {
        let _ = send(
            &mut w,
            &CollectorMsg::Refused {
                reason: reason.clone(),
            },
        )
        .await;
    }
    // Whatever was acknowledged at the end still reaches the agent.
    let last = ack.load(Ordering::Acquire);
    if last != u64::MAX && last != acked {
        let _ = send(&mut w, &CollectorMsg::Ack { upto: last }).await;
    }
    let _ = w.shutdown().await;
    result
}

/// Puts the connection's node name on a record, refusing frames an agent may not send.
fn tag(frame: Frame, node: &str) -> Result<Frame, ConnError> {
    match frame {
        Frame::NodeIteration(mut it) => {
            it.node = node.to_string();
            Ok(Frame::NodeIteration(it))
        }
        Frame::NodeReport(mut r) => {
            r.iteration.node = node.to_string();
            Ok(Frame::NodeReport(r))
        }
        Frame::NodeHealth(mut h) => {
            h.node = node.to_string();
            Ok(Frame::NodeHealth(h))
        }
        Frame::NodeResources(mut r) => {
            r.node = node.to_string();
            Ok(Frame::NodeResources(r))
        }
        Frame::NodeGpus(mut g) => {
            g.node = node.to_string();
            Ok(Frame::NodeGpus(g))
        }
        Frame::NodeNics(mut n) => {
            n.node = node.to_string();
            Ok(Frame::NodeNics(n))
        }
        Frame::NodeCounters(mut c) => {
            c.node = node.to_string();
            Ok(Frame::NodeCounters(c))
        }
        Frame::NodeRdma(mut x) => {
            x.node = node.to_string();
            Ok(Frame::NodeRdma(x))
        }
        Frame::NodeFlows(mut f) => {
            f.node = node.to_string();
            Ok(Frame::NodeFlows(f))
        }
        Frame::NodeHang(mut h) => {
            h.node = node.to_string();
            for r in &mut h.ranks {
                r.node = Some(node.to_string());
            }
            Ok(Frame::NodeHang(h))
        }
        Frame::NodeMeta(mut m) => {
            // Only what the advisor reads, as the hook's wire format bounds it.
            m.node = node.to_string();
            m.fields
                .retain(|(k, v)| NodeMeta::forwards(k) && v.len() <= MAX_META_VALUE);
            Ok(Frame::NodeMeta(m))
        }
        other => Err(ConnError::Refused(format!(
            "agents send iterations and health reports, not {}",
            match other {
                Frame::Header(_) => "run headers",
                Frame::End(_) => "run ends",
                Frame::NodeClock(_) => "clock estimates",
                _ => "raw samples, markers or processes",
            }
        ))),
    }
}

#[cfg(test)]
mod tests {
    //! The server's conversations over in-memory pipes (tokio's duplex): no socket, no port.

    use super::*;
    use stallscope_analysis::view::{JobView, ViewUpdate};
    use tokio::io::{duplex, split};

    async fn read_msg<R: AsyncRead + Unpin>(r: &mut R) -> CollectorMsg {
        let mut buf = Vec::new();
        read_payload(r, &mut buf).await.expect("a message");
        wire::decode(&buf).expect("a collector message")
    }

    /// The Hello of an agent holding `token`, answering the server's challenge read from `r`.
    async fn hello<R: AsyncRead + Unpin>(r: &mut R, token: &str) -> Hello {
        let CollectorMsg::Challenge { nonce } = read_msg(r).await else {
            panic!("the server speaks first, with a challenge")
        };
        assert_eq!(nonce.len(), wire::NONCE_BYTES);
        Hello {
            protocol: PROTOCOL_VERSION,
            proof: wire::prove(token, Role::Agent, &nonce),
            node: "node-a".into(),
            agent_version: "test".into(),
        }
    }

    fn config() -> ServerConfig {
        ServerConfig {
            token: Some("secret".into()),
            sync_exchanges: 2 * BUCKET,
            ..ServerConfig::default()
        }
    }

    /// The agent's side of a pipe to a welcomed connection of node `node-a` served with
    /// `config`: the serving task, the agent's reading and writing halves, what reaches the
    /// job task, and the shutdown sender (kept alive by the caller).
    #[allow(clippy::type_complexity)]
    fn welcomed_over_a_pipe(
        config: ServerConfig,
    ) -> (
        tokio::task::JoinHandle<Result<(), ConnError>>,
        (
            tokio::io::ReadHalf<tokio::io::DuplexStream>,
            tokio::io::WriteHalf<tokio::io::DuplexStream>,
        ),
        mpsc::Receiver<Ingest>,
        watch::Sender<bool>,
    ) {
        let (server, agent) = duplex(1024 * 1024);
        let (sr, sw) = split(server);
        let (tx, rx) = mpsc::channel(1024);
        let (stop, stop_rx) = watch::channel(false);
        let serving = tokio::spawn(async move {
            welcomed(
                BufReader::new(sr),
                sw,
                "node-a",
                ClockEstimator::default(),
                &config,
                &tx,
                stop_rx,
            )
            .await
        });
        (serving, split(agent), rx, stop)
    }

    #[tokio::test]
    async fn an_agent_answering_the_pings_is_handed_its_clock() {
        let (server, agent) = duplex(64 * 1024);
        let (mut sr, mut sw) = split(server);
        let (mut ar, mut aw) = split(agent);
        let config = config();
        let serving = tokio::spawn(async move { handshake(&mut sr, &mut sw, &config).await });
        let hello = hello(&mut ar, "secret").await;
        aw.write_all(&wire::encode(&AgentMsg::Hello(hello)))
            .await
            .unwrap();
        for _ in 0..2 * BUCKET {
            let CollectorMsg::Ping { t1 } = read_msg(&mut ar).await else {
                panic!("a ping")
            };
            let now = monotonic_ns();
            let pong = AgentMsg::Pong {
                t1,
                t2: now,
                t3: now,
            };
            aw.write_all(&wire::encode(&pong)).await.unwrap();
        }
        let (h, peer, clock) = serving.await.unwrap().expect("welcomed");
        assert_eq!((h.node.as_str(), peer), ("node-a", Peer::Agent));
        let c = clock
            .estimate("node-a")
            .expect("an estimate from the exchanges");
        assert!(c.offset_ns.abs() < 1_000_000_000, "{c:?}");
    }

    /// Issue 28: a request of the job task reaches a welcomed agent as `Stacks`, and its
    /// answer comes back under the connection's node name, each rank's node set.
    #[tokio::test]
    async fn a_stacks_request_reaches_the_agent_and_its_answer_is_tagged_with_its_node() {
        use stallscope_analysis::hang::{NodeHang, RankAtHang};
        let (asks, asks_rx) = watch::channel(0);
        let config = ServerConfig {
            stacks_asked: Some(asks_rx),
            ..config()
        };
        let (serving, (mut ar, mut aw), mut rx, _stop) = welcomed_over_a_pipe(config);
        asks.send_replace(3);
        let asked = async {
            loop {
                if let CollectorMsg::Stacks { id } = read_msg(&mut ar).await {
                    return id;
                }
            }
        };
        let id = tokio::time::timeout(Duration::from_secs(10), asked)
            .await
            .expect("the request is sent");
        assert_eq!(id, 3);
        let answer = NodeHang {
            node: "claimed".into(),
            id,
            ranks: vec![RankAtHang {
                rank: 1,
                pid: 7,
                last_iteration: Some(11),
                state: "data_loading".into(),
                collective: None,
                has_hook: true,
                node: None,
            }],
            ..NodeHang::default()
        };
        let record = AgentMsg::Record {
            seq: 0,
            frame: Frame::NodeHang(Box::new(answer)),
        };
        aw.write_all(&wire::encode(&record)).await.unwrap();
        let Some(Ingest::Records { records, .. }) = rx.recv().await else {
            panic!("the answer reaches the job task");
        };
        let [(_, Frame::NodeHang(h))] = &records[..] else {
            panic!("the answer alone: {records:?}");
        };
        assert_eq!(h.node, "node-a");
        assert_eq!(h.ranks[0].node.as_deref(), Some("node-a"));
        aw.write_all(&wire::encode(&AgentMsg::Bye)).await.unwrap();
        assert!(serving.await.unwrap().is_ok());
    }

    /// An agent that keeps sending is acknowledged about once a second, not at every tick;
    /// one whose records are all written is acknowledged at the next tick (a finishing agent
    /// waits for that before its goodbye). Tokio's clock is paused: time moves only when
    /// every task waits, so the ticks fall where the test says.
    #[tokio::test(start_paused = true)]
    async fn a_sending_agent_is_acknowledged_each_second_and_a_quiet_one_at_the_next_tick() {
        let (_serving, (mut ar, mut aw), mut rx, _stop) = welcomed_over_a_pipe(config());
        // The job task's part: each record written at once but the latest, until `all` says.
        let all = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let all_written = all.clone();
        tokio::spawn(async move {
            while let Some(Ingest::Records { records, ack, .. }) = rx.recv().await {
                let last = records.last().expect("records").0;
                let upto = if all_written.load(Ordering::Acquire) {
                    last
                } else {
                    last.saturating_sub(1)
                };
                ack.store(upto, Ordering::Release);
            }
        });
        let acks = Arc::new(std::sync::Mutex::new(Vec::new()));
        let heard = acks.clone();
        tokio::spawn(async move {
            loop {
                if let CollectorMsg::Ack { upto } = read_msg(&mut ar).await {
                    heard
                        .lock()
                        .unwrap()
                        .push((tokio::time::Instant::now(), upto));
                }
            }
        });
        let record = |seq: u64| {
            wire::encode(&AgentMsg::Record {
                seq,
                frame: Frame::NodeHealth(Default::default()),
            })
        };
        // 3 s of a record every 50 ms, the job task always one behind.
        let start = tokio::time::Instant::now();
        let mut seq = 0;
        while start.elapsed() < Duration::from_secs(3) {
            aw.write_all(&record(seq)).await.unwrap();
            seq += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let sending = acks.lock().unwrap().len();
        assert!(
            (2..=4).contains(&sending),
            "{sending} acknowledgements in 3 s of sending (a tick is 200 ms): {:?}",
            acks.lock().unwrap()
        );
        // The last record, every record written: acknowledged within a tick.
        all.store(true, Ordering::Release);
        aw.write_all(&record(seq)).await.unwrap();
        let sent_at = tokio::time::Instant::now();
        tokio::time::sleep(CONNECTION_TICK * 2).await;
        let heard = acks.lock().unwrap();
        let (at, upto) = *heard.last().expect("an acknowledgement");
        assert_eq!(upto, seq, "{heard:?}");
        assert!(at - sent_at <= CONNECTION_TICK, "{:?}", at - sent_at);
    }

    #[test]
    fn a_forwarded_meta_keeps_only_the_advisors_keys_under_the_agents_node_name() {
        let meta = NodeMeta {
            node: "claimed".into(),
            pid: 7,
            rank: Some(0),
            fields: vec![
                ("comm_bytes".into(), "4916000".into()),
                ("password".into(), "hunter2".into()),
                ("world_size".into(), "x".repeat(MAX_META_VALUE + 1)),
            ],
        };
        let Ok(Frame::NodeMeta(m)) = tag(Frame::NodeMeta(meta), "node-a") else {
            panic!("a meta is a record an agent may send");
        };
        assert_eq!(m.node, "node-a");
        assert_eq!(m.fields, vec![("comm_bytes".into(), "4916000".into())]);
    }

    #[test]
    fn a_varint_is_postcards() {
        for v in [
            0u64,
            1,
            63,
            64,
            127,
            128,
            300,
            16_383,
            16_384,
            u32::MAX as u64,
            u64::MAX,
        ] {
            let mut out = vec![9];
            push_varint(&mut out, v);
            assert_eq!(out[1..], postcard::to_allocvec(&v).unwrap()[..], "{v}");
        }
        // A name longer than a one-byte length.
        let name = "n".repeat(200);
        let mut out = Vec::new();
        push_varint(&mut out, name.len() as u64);
        out.extend_from_slice(name.as_bytes());
        assert_eq!(out, postcard::to_allocvec(name.as_str()).unwrap());
    }

    #[test]
    fn a_rank_iteration_is_written_as_it_came_with_its_node_name_put_in() {
        let mut spliced = 0;
        for frame in crate::profile::every_variant() {
            let mut sent = frame.clone();
            match &mut sent {
                Frame::NodeIteration(it) => it.node.clear(),
                Frame::NodeReport(r) => r.iteration.node.clear(),
                _ => {}
            }
            let msg = wire::encode(&AgentMsg::Record {
                seq: 300,
                frame: sent.clone(),
            });
            let Ok(tagged) = tag(sent, "node-a") else {
                continue;
            };
            let mut encoded = Encoded {
                bytes: vec![7; 3],
                spans: Vec::new(),
            };
            encoded.push(&tagged, &msg[4..], "node-a");
            match &tagged {
                Frame::NodeIteration(_) | Frame::NodeReport(_) => {
                    assert_eq!(encoded.get(0), Some(&tagged.encode()[..]), "{tagged:?}");
                    spliced += 1;
                }
                _ => assert_eq!(encoded.get(0), None, "{tagged:?}"),
            }
        }
        assert_eq!(spliced, 2, "a NodeIteration and a NodeReport");

        // A record that named a node itself is encoded as usual.
        let named = crate::profile::every_variant()
            .into_iter()
            .find(|f| matches!(f, Frame::NodeReport(r) if !r.iteration.node.is_empty()))
            .expect("a report with its node");
        let msg = wire::encode(&AgentMsg::Record {
            seq: 0,
            frame: named,
        });
        assert_eq!(splice_node(&msg[4..], "node-a", &mut Vec::new()), None);
    }

    /// An agent writes its first records as soon as it has answered the clock, often in the
    /// same write as its last answer: what the handshake's buffer read ahead reaches the job
    /// task, in order, before what the socket holds after it.
    #[tokio::test]
    async fn records_read_ahead_with_the_last_clock_answer_are_not_lost() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, mut rx) = mpsc::channel(64);
        let (_stop, shutdown) = watch::channel(false);
        let config = ServerConfig {
            sync_exchanges: 1,
            ..config()
        };
        tokio::spawn(serve(listener, config, tx, shutdown));
        let (mut ar, mut aw) = TcpStream::connect(addr).await.unwrap().into_split();
        let hello = hello(&mut ar, "secret").await;
        aw.write_all(&wire::encode(&AgentMsg::Hello(hello)))
            .await
            .unwrap();
        let CollectorMsg::Ping { t1 } = read_msg(&mut ar).await else {
            panic!("a ping")
        };
        let record = |seq: u64| {
            let mut it = crate::profile::every_variant()
                .into_iter()
                .find_map(|f| match f {
                    Frame::NodeIteration(it) => Some(it),
                    _ => None,
                })
                .expect("an iteration");
            it.breakdown.iter = seq;
            wire::encode(&AgentMsg::Record {
                seq,
                frame: Frame::NodeIteration(it),
            })
        };
        // The pong and three records in one write, then a fourth after the Welcome.
        let mut first = wire::encode(&AgentMsg::Pong { t1, t2: t1, t3: t1 });
        for seq in 0..3 {
            first.extend(record(seq));
        }
        aw.write_all(&first).await.unwrap();
        let CollectorMsg::Welcome { .. } = read_msg(&mut ar).await else {
            panic!("welcomed")
        };
        aw.write_all(&record(3)).await.unwrap();
        let mut seen = Vec::new();
        while seen.len() < 4 {
            let next = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await;
            match next.expect("the records within 10 s").expect("the server") {
                Ingest::Records { records, .. } => {
                    for (seq, frame) in records {
                        let it = frame.node_iteration().expect("an iteration");
                        assert_eq!((it.node.as_str(), it.breakdown.iter), ("node-a", seq));
                        seen.push(seq);
                    }
                }
                Ingest::NodeUp { .. } | Ingest::Clock(_) => {}
                Ingest::NodeDown { reason, .. } => panic!("the agent was dropped: {reason:?}"),
            }
        }
        assert_eq!(seen, [0, 1, 2, 3]);
    }

    #[tokio::test]
    async fn a_wrong_token_is_refused_with_the_reason() {
        let (server, agent) = duplex(64 * 1024);
        let (mut sr, mut sw) = split(server);
        let (mut ar, mut aw) = split(agent);
        let config = config();
        let serving = tokio::spawn(async move { handshake(&mut sr, &mut sw, &config).await });
        let hello = hello(&mut ar, "guess").await;
        aw.write_all(&wire::encode(&AgentMsg::Hello(hello)))
            .await
            .unwrap();
        let CollectorMsg::Refused { reason } = read_msg(&mut ar).await else {
            panic!("refused")
        };
        assert!(reason.contains("wrong token"), "{reason}");
        assert!(serving.await.unwrap().is_err());
    }

    /// Issue 30, item 12: a viewer's proof relayed in an agent's Hello is a wrong token, and
    /// an agent of the protocol before the proofs named their role is told to upgrade.
    #[test]
    fn a_viewers_proof_does_not_admit_an_agent_and_an_old_agent_is_told_why() {
        let nonce = [5u8; wire::NONCE_BYTES];
        let hello = |protocol, role| Hello {
            protocol,
            proof: wire::prove("secret", role, &nonce),
            node: "node-a".into(),
            agent_version: "test".into(),
        };
        let check = |msg: AgentMsg| {
            let bytes = wire::encode(&msg);
            check_hello(&bytes[4..], Some("secret"), &nonce).map(|(_, peer)| peer)
        };
        let relayed = check(AgentMsg::Hello(hello(PROTOCOL_VERSION, Role::Viewer)));
        assert!(
            matches!(&relayed, Err(ConnError::Refused(r)) if r.contains("wrong token")),
            "{relayed:?}"
        );
        let viewer = check(AgentMsg::Watch(hello(PROTOCOL_VERSION, Role::Viewer)));
        assert!(
            matches!(viewer, Ok(Peer::Viewer { binary: false })),
            "{viewer:?}"
        );
        let viewer = check(AgentMsg::WatchBinary(hello(PROTOCOL_VERSION, Role::Viewer)));
        assert!(
            matches!(viewer, Ok(Peer::Viewer { binary: true })),
            "{viewer:?}"
        );
        let old = check(AgentMsg::Hello(hello(8, Role::Agent)));
        assert!(
            matches!(&old, Err(ConnError::Refused(r)) if r.contains(&format!("protocol version 8, this collector speaks {PROTOCOL_VERSION}: run the same stallscope version"))),
            "{old:?}"
        );
    }

    /// Issue 17, item 3: a stranger's message over 4 KiB is refused from its length prefix,
    /// before anything is allocated for it (the prefix announces 1 MiB; nothing follows).
    #[tokio::test]
    async fn a_strangers_large_message_is_refused_unread() {
        let (server, agent) = duplex(64 * 1024);
        let (mut sr, mut sw) = split(server);
        let (mut ar, mut aw) = split(agent);
        let config = config();
        let serving = tokio::spawn(async move { handshake(&mut sr, &mut sw, &config).await });
        let _ = read_msg(&mut ar).await; // the challenge
        aw.write_all(&wire::MAX_MESSAGE.to_be_bytes())
            .await
            .unwrap();
        let CollectorMsg::Refused { reason } = read_msg(&mut ar).await else {
            panic!("refused")
        };
        assert!(reason.contains("over the 4096-byte limit"), "{reason}");
        assert!(serving.await.unwrap().is_err());
    }

    /// A connection to `addr` from 127.0.0.`host` (all of 127/8 is loopback on Linux).
    async fn connect_from(host: u8, addr: SocketAddr) -> TcpStream {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(SocketAddr::from(([127, 0, 0, host], 0)))
            .unwrap();
        socket.connect(addr).await.unwrap()
    }

    /// The first message on a connection, if one comes within 10 s.
    async fn first_msg(r: &mut (impl AsyncRead + Unpin)) -> Option<CollectorMsg> {
        tokio::time::timeout(Duration::from_secs(10), async {
            let mut buf = Vec::new();
            read_payload(r, &mut buf).await.ok()?;
            wire::decode::<CollectorMsg>(&buf).ok()
        })
        .await
        .ok()
        .flatten()
    }

    /// Issue 30, item 5 (and issue 17, item 3): idle connections, more than the collector
    /// serves, from one address and from several, reopened as they close, do not keep an agent
    /// from another address out while they are held; the address over its limit is told why;
    /// the token never crosses the wire.
    #[tokio::test]
    async fn idle_strangers_cannot_keep_an_agent_out() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, mut rx) = mpsc::channel(16);
        let (_stop, shutdown) = watch::channel(false);
        let config = ServerConfig {
            sync_exchanges: 1,
            // Longer than the test: the idle ones are held all through it.
            handshake_timeout: Duration::from_secs(120),
            ..config()
        };
        tokio::spawn(serve(listener, config, tx, shutdown));
        // One address: its first connections are challenged, the rest refused with why.
        let mut idle = Vec::new();
        for i in 0..2 * MAX_STRANGERS_PER_ADDRESS {
            let mut s = connect_from(1, addr).await;
            match first_msg(&mut s).await {
                Some(CollectorMsg::Challenge { .. }) if i < MAX_STRANGERS_PER_ADDRESS => {}
                Some(CollectorMsg::Refused { reason }) if i >= MAX_STRANGERS_PER_ADDRESS => {
                    assert!(reason.contains("its limit per address"), "{reason}")
                }
                other => panic!("connection {i}: {other:?}"),
            }
            idle.push(s);
        }
        // Nine more addresses at their limit: more than the collector serves, each newcomer
        // making room by closing the oldest of the busiest address; those closed come back.
        let reopening = tokio::spawn(async move {
            let mut held = Vec::new();
            for host in 10..19u8 {
                for _ in 0..MAX_STRANGERS_PER_ADDRESS {
                    held.push((host, connect_from(host, addr).await));
                }
            }
            loop {
                for (host, s) in held.iter_mut() {
                    let mut byte = [0u8; 256];
                    let closed = matches!(
                        tokio::time::timeout(Duration::from_millis(1), s.read(&mut byte)).await,
                        Ok(Ok(0)) | Ok(Err(_))
                    );
                    if closed {
                        *s = connect_from(*host, addr).await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        // An agent from another address is served while all that is held.
        let s = connect_from(2, addr).await;
        let (mut r, mut w) = s.into_split();
        let Some(CollectorMsg::Challenge { nonce }) = first_msg(&mut r).await else {
            panic!("the agent was kept out")
        };
        let hello = AgentMsg::Hello(Hello {
            protocol: PROTOCOL_VERSION,
            proof: wire::prove("secret", Role::Agent, &nonce),
            node: "node-a".into(),
            agent_version: "test".into(),
        });
        let sent = wire::encode(&hello);
        assert!(
            !sent.windows(6).any(|x| x == b"secret"),
            "the token is never sent"
        );
        w.write_all(&sent).await.unwrap();
        let CollectorMsg::Ping { t1 } = read_msg(&mut r).await else {
            panic!("a clock exchange")
        };
        let pong = AgentMsg::Pong { t1, t2: t1, t3: t1 };
        w.write_all(&wire::encode(&pong)).await.unwrap();
        assert!(matches!(
            read_msg(&mut r).await,
            CollectorMsg::Welcome { .. }
        ));
        let up = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if let Some(Ingest::NodeUp { node, .. }) = rx.recv().await {
                    return node;
                }
            }
        })
        .await
        .unwrap();
        assert_eq!(up, "node-a");
        reopening.abort();
        drop(idle);
    }

    /// A self-signed certificate for localhost and 127.0.0.1 made by the openssl CLI, as PEM
    /// files in `dir`; `None` without openssl (a failure under CI=true).
    fn certificate(dir: &std::path::Path) -> Option<(std::path::PathBuf, std::path::PathBuf)> {
        let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
        let made = std::process::Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
            .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"])
            .args(["-subj", "/CN=localhost", "-addext"])
            .args(["subjectAltName=DNS:localhost,IP:127.0.0.1", "-addext"])
            .args(["basicConstraints=critical,CA:FALSE", "-keyout"])
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output();
        if made.is_ok_and(|o| o.status.success()) {
            return Some((cert, key));
        }
        let why = "the openssl CLI cannot make a test certificate (run scripts/install-deps.sh)";
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
        eprintln!("SKIP: {why}");
        None
    }

    /// With TLS, a peer that does not speak it is closed (at once when it sends something
    /// else, at the end of the handshake time when it waits for a challenge, as a plain agent
    /// does) and said so to the job, while a TLS agent at the same time is challenged, welcomed
    /// and its records taken.
    #[tokio::test]
    async fn a_tls_collector_closes_plain_peers_and_serves_a_tls_agent() {
        let dir = tempfile::tempdir().unwrap();
        let Some((cert, key)) = certificate(dir.path()) else {
            return;
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, mut rx) = mpsc::channel(64);
        let (_stop, shutdown) = watch::channel(false);
        let config = ServerConfig {
            sync_exchanges: 1,
            handshake_timeout: Duration::from_secs(2),
            tls: Some(crate::tls::server_config(&cert, &key).unwrap()),
            ..config()
        };
        tokio::spawn(serve(listener, config, tx, shutdown));

        // A plain agent: it waits for the challenge, which never comes in the clear.
        let mut waiting = TcpStream::connect(addr).await.unwrap();
        // Something that is not TLS at all: closed at once.
        let mut http = TcpStream::connect(addr).await.unwrap();
        http.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();

        // The TLS agent, meanwhile.
        let mut roots = rustls::RootCertStore::empty();
        for c in crate::tls::read_certs(&cert, "--tls-ca").unwrap() {
            roots.add(c).unwrap();
        }
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let tcp = TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let tls = tokio_rustls::TlsConnector::from(Arc::new(client))
            .connect(name, tcp)
            .await
            .expect("the TLS handshake");
        let (mut r, mut w) = split(tls);
        let hello = hello(&mut r, "secret").await;
        w.write_all(&wire::encode(&AgentMsg::Hello(hello)))
            .await
            .unwrap();
        w.flush().await.unwrap();
        let CollectorMsg::Ping { t1 } = read_msg(&mut r).await else {
            panic!("a clock exchange")
        };
        let pong = AgentMsg::Pong { t1, t2: t1, t3: t1 };
        w.write_all(&wire::encode(&pong)).await.unwrap();
        w.flush().await.unwrap();
        assert!(matches!(
            read_msg(&mut r).await,
            CollectorMsg::Welcome { .. }
        ));
        let record = AgentMsg::Record {
            seq: 0,
            frame: Frame::NodeHealth(Default::default()),
        };
        w.write_all(&wire::encode(&record)).await.unwrap();
        w.flush().await.unwrap();

        // The non-TLS request is closed at once (after a TLS alert), the waiting plain agent
        // at the handshake time; neither is sent a challenge in the clear.
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(1), http.read_to_end(&mut got))
            .await
            .expect("closed at once")
            .ok();
        assert!(
            got.is_empty() || got[0] == 0x15,
            "at most a TLS alert: {got:?}"
        );
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), waiting.read_to_end(&mut got))
            .await
            .expect("closed at the handshake time")
            .ok();
        assert!(got.is_empty(), "nothing in the clear: {got:?}");

        let mut refused = Vec::new();
        let mut recorded = false;
        let mut up = false;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !(recorded && up && refused.len() == 2) {
            let msg = tokio::time::timeout_at(deadline, rx.recv())
                .await
                .unwrap_or_else(|_| panic!("up {up}, recorded {recorded}, refused {refused:?}"))
                .unwrap();
            match msg {
                Ingest::NodeUp { node, .. } => up = node == "node-a",
                Ingest::Records { records, .. } => {
                    recorded =
                        matches!(&records[..], [(0, Frame::NodeHealth(h))] if h.node == "node-a")
                }
                Ingest::NodeDown {
                    node: None,
                    reason: Some(r),
                    ..
                } => refused.push(r),
                other => panic!("{other:?}"),
            }
        }
        assert!(
            refused.iter().any(|r| r.contains("does not speak TLS")),
            "{refused:?}"
        );
        assert!(
            refused
                .iter()
                .any(|r| r.contains("no TLS handshake within the handshake time")
                    && r.contains("--tls-ca")),
            "{refused:?}"
        );
    }

    /// Issue 30, item 12: a viewer that stops reading is dropped after the write timeout, not
    /// waited on for ever (its pipe holds 64 KiB; the snapshot is 2 MiB).
    #[tokio::test]
    async fn a_viewer_that_stops_reading_is_dropped() {
        let hub = Arc::new(FeedHub::default());
        let (server, viewer) = duplex(64 * 1024);
        let (_, sw) = split(server);
        let (_stop, shutdown) = watch::channel(false);
        let serving = {
            let hub = hub.clone();
            tokio::spawn(async move { watch(sw, &hub, shutdown, false).await })
        };
        while hub.subscribers() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        hub.publish(&JobView::new(&"x".repeat(2 << 20)), ViewUpdate::default());
        let ended = tokio::time::timeout(Duration::from_secs(60), serving)
            .await
            .expect("the stuck viewer is dropped, not waited on")
            .unwrap();
        let Err(ConnError::Refused(reason)) = ended else {
            panic!("{ended:?}")
        };
        assert!(reason.contains("read nothing"), "{reason}");
        drop(viewer);
    }

    #[tokio::test]
    async fn a_viewer_is_sent_the_models_lines_in_parts() {
        let hub = Arc::new(FeedHub::default());
        let (server, viewer) = duplex(1024 * 1024);
        let (_, sw) = split(server);
        let (mut vr, _) = split(viewer);
        let (_stop, shutdown) = watch::channel(false);
        let serving = {
            let hub = hub.clone();
            tokio::spawn(async move { watch(sw, &hub, shutdown, false).await })
        };
        // A model whose snapshot is larger than one part.
        let mut view = JobView::new(&"x".repeat(600 * 1024));
        view.attributed = 7;
        while hub.subscribers() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        hub.publish(&view, ViewUpdate::default());
        hub.end();
        let mut lines = Vec::new();
        let mut line = Vec::new();
        while lines.len() < 2 {
            let CollectorMsg::Feed { part, last } = read_msg(&mut vr).await else {
                panic!("feed parts")
            };
            assert!(part.len() <= wire::FEED_PART);
            line.extend(part);
            if last {
                lines.push(String::from_utf8(std::mem::take(&mut line)).unwrap());
            }
        }
        assert_eq!(lines[0], json_line(&FeedMessage::Snapshot(Arc::new(view))));
        assert_eq!(lines[1], "{\"end\":true}");
        serving.await.unwrap().expect("the job ended cleanly");
    }

    /// A viewer that opened with WatchBinary gets binary frames' payloads in the same parts.
    #[tokio::test]
    async fn a_binary_viewer_is_sent_frames_in_parts() {
        use stallscope_analysis::view::binary;
        let hub = Arc::new(FeedHub::default());
        let (server, viewer) = duplex(1024 * 1024);
        let (_, sw) = split(server);
        let (mut vr, _) = split(viewer);
        let (_stop, shutdown) = watch::channel(false);
        let serving = {
            let hub = hub.clone();
            tokio::spawn(async move { watch(sw, &hub, shutdown, true).await })
        };
        let mut view = JobView::new(&"x".repeat(600 * 1024));
        view.attributed = 7;
        while hub.subscribers() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        hub.publish(&view, ViewUpdate::default());
        hub.end();
        let mut messages = Vec::new();
        let mut payload = Vec::new();
        while messages.len() < 2 {
            let CollectorMsg::Feed { part, last } = read_msg(&mut vr).await else {
                panic!("feed parts")
            };
            payload.extend(part);
            if last {
                messages.push(binary::decode_payload(&std::mem::take(&mut payload)).unwrap());
            }
        }
        assert!(matches!(&messages[0], FeedMessage::Snapshot(v) if **v == view));
        assert!(matches!(messages[1], FeedMessage::End));
        serving.await.unwrap().expect("the job ended cleanly");
    }
}
