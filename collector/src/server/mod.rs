//! The ingest server: one task per agent connection.
//!
//! A connection is on its own: a bad token, a malformed or oversized message, a wrong
//! protocol version or a dead peer end that connection with a [`CollectorMsg::Refused`] that
//! says why (and an [`Ingest::NodeDown`] for the job), and never touches another. Records go to
//! the job task through a bounded channel, so a collector that falls behind slows its agents
//! down through TCP instead of growing without bound; the agents buffer meanwhile.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use stallscope_analysis::frame::{Frame, NodeClock};
use stallscope_analysis::wire::{self, AgentMsg, CollectorMsg, Hello, WireError, PROTOCOL_VERSION};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use stallscope_analysis::view::hub::{json_line, FeedHub, FeedMessage, SUBSCRIBER_QUEUE};
use std::sync::mpsc::TryRecvError;

use crate::clock::{ClockEstimator, BUCKET};

mod viewer;
use crate::monotonic_ns;
use viewer::watch;

/// How long the server waits after a failed accept (no file descriptor left) before it tries
/// again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

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
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            token: None,
            sync_exchanges: 2 * BUCKET,
            ping_every: Duration::from_millis(500),
            handshake_timeout: Duration::from_secs(5),
            feed: None,
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
    /// A frame from a node; `ack` is raised to `seq` once it is in the profile.
    Record {
        /// Agent's sequence number.
        seq: u64,
        /// The frame, its node set from the handshake.
        frame: Frame,
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

/// Reads one message's payload.
async fn read_payload<R: AsyncRead + Unpin>(r: &mut R, buf: &mut Vec<u8>) -> Result<(), ConnError> {
    let mut prefix = [0u8; 4];
    r.read_exact(&mut prefix).await?;
    let len = wire::payload_len(prefix)?;
    buf.resize(len, 0);
    r.read_exact(buf).await?;
    Ok(())
}

async fn send<W: AsyncWrite + Unpin>(w: &mut W, msg: &CollectorMsg) -> std::io::Result<()> {
    w.write_all(&wire::encode(msg)).await
}

/// Who is on the other end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Peer {
    /// An agent: it sends records.
    Agent,
    /// A viewer: it is sent the live model.
    Viewer,
}

/// Checks an agent's (or a viewer's) first message.
fn check_hello(payload: &[u8], token: Option<&str>) -> Result<(Hello, Peer), ConnError> {
    let (hello, peer) = match wire::decode::<AgentMsg>(payload) {
        Ok(AgentMsg::Hello(h)) => (h, Peer::Agent),
        Ok(AgentMsg::Watch(h)) => (h, Peer::Viewer),
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
        if hello.token.is_empty() {
            return Err(ConnError::Refused(
                "this collector requires a token: give the agent --token-file".into(),
            ));
        }
        if !constant_time_eq(hello.token.as_bytes(), expected.as_bytes()) {
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

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Accepts agents until `shutdown` turns true.
pub async fn serve(
    listener: TcpListener,
    config: ServerConfig,
    tx: mpsc::Sender<Ingest>,
    mut shutdown: watch::Receiver<bool>,
) {
    let config = Arc::new(config);
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
                let _ = stream.set_nodelay(true);
                let (config, tx, shutdown) = (config.clone(), tx.clone(), shutdown.clone());
                tokio::spawn(async move { connection(stream, peer, config, tx, shutdown).await });
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
) {
    let (r, mut w) = stream.into_split();
    let mut r = BufReader::with_capacity(64 * 1024, r);
    let mut node = None;
    let result = async {
        let (hello, who, clock) =
            tokio::time::timeout(config.handshake_timeout, handshake(&mut r, &mut w, &config))
                .await
                .map_err(|_| {
                    ConnError::Refused(
                        "no Hello and clock answers within the handshake time".into(),
                    )
                })??;
        send(
            &mut w,
            &CollectorMsg::Welcome {
                collector_version: env!("CARGO_PKG_VERSION").into(),
            },
        )
        .await?;
        if let (Peer::Viewer, Some(hub)) = (who, &config.feed) {
            return watch(w, hub, shutdown.clone()).await;
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
    let mut buf = Vec::new();
    let first = read_payload(r, &mut buf).await;
    let hello = match first {
        Ok(()) => check_hello(&buf, config.token.as_deref()),
        Err(e) => Err(e),
    };
    let (hello, peer) = match hello {
        Ok((_, Peer::Viewer)) if config.feed.is_none() => {
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
        Peer::Viewer => 0,
    };
    for _ in 0..exchanges {
        let t1 = monotonic_ns();
        send(w, &CollectorMsg::Ping { t1 }).await?;
        read_payload(r, &mut buf).await?;
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

/// An agent's messages after the Welcome, read on a task of their own (reading is not
/// cancel-safe), each with the time it arrived.
type Received = Result<(AgentMsg, u64), ConnError>;

fn spawn_reader<R>(mut r: R) -> (tokio::task::JoinHandle<()>, mpsc::Receiver<Received>)
where
    R: AsyncRead + Unpin + Send + 'static,
{
    let (msg_tx, msgs) = mpsc::channel::<Received>(1024);
    let reader = tokio::spawn(async move {
        let mut buf = Vec::with_capacity(4096);
        loop {
            let item = match read_payload(&mut r, &mut buf).await {
                Ok(()) => wire::decode::<AgentMsg>(&buf)
                    .map(|m| (m, monotonic_ns()))
                    .map_err(ConnError::from),
                Err(e) => Err(e),
            };
            let stop = item.is_err();
            if msg_tx.send(item).await.is_err() || stop {
                break;
            }
        }
    });
    (reader, msgs)
}

/// Takes one message of a welcomed agent: a record to the job task, a pong to the clock.
/// `Ok(false)`: the connection ends cleanly (a goodbye, or the job task is gone).
async fn on_message(
    item: Received,
    node: &str,
    clock: &mut ClockEstimator,
    tx: &mpsc::Sender<Ingest>,
    ack: &Arc<AtomicU64>,
) -> Result<bool, ConnError> {
    match item? {
        (AgentMsg::Record { seq, frame }, _) => {
            let frame = tag(frame, node)?;
            let ack = ack.clone();
            Ok(tx.send(Ingest::Record { seq, frame, ack }).await.is_ok())
        }
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
        (AgentMsg::Hello(_), _) | (AgentMsg::Watch(_), _) => Err(ConnError::Refused(
            "a second Hello on one connection".into(),
        )),
    }
}

/// After the Welcome: records in; pings and acks out.
async fn welcomed<R, W>(
    r: R,
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
    let (reader, mut msgs) = spawn_reader(r);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut last_ping = tokio::time::Instant::now();
    let mut acked = u64::MAX;
    let result = loop {
        tokio::select! {
            item = msgs.recv() => {
                let Some(item) = item else { break Ok(()) };
                match on_message(item, node, &mut clock, tx, &ack).await {
                    Ok(true) => {}
                    Ok(false) => break Ok(()),
                    Err(e) => break Err(e),
                }
            }
            _ = tick.tick() => {
                let now_acked = ack.load(Ordering::Acquire);
                if now_acked != u64::MAX && now_acked != acked {
                    acked = now_acked;
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

    fn hello(token: &str) -> Hello {
        Hello {
            protocol: PROTOCOL_VERSION,
            token: token.into(),
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

    #[tokio::test]
    async fn an_agent_answering_the_pings_is_handed_its_clock() {
        let (server, agent) = duplex(64 * 1024);
        let (mut sr, mut sw) = split(server);
        let (mut ar, mut aw) = split(agent);
        let config = config();
        let serving = tokio::spawn(async move { handshake(&mut sr, &mut sw, &config).await });
        aw.write_all(&wire::encode(&AgentMsg::Hello(hello("secret"))))
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

    #[tokio::test]
    async fn a_wrong_token_is_refused_with_the_reason() {
        let (server, agent) = duplex(64 * 1024);
        let (mut sr, mut sw) = split(server);
        let (mut ar, mut aw) = split(agent);
        let config = config();
        let serving = tokio::spawn(async move { handshake(&mut sr, &mut sw, &config).await });
        aw.write_all(&wire::encode(&AgentMsg::Hello(hello("guess"))))
            .await
            .unwrap();
        let CollectorMsg::Refused { reason } = read_msg(&mut ar).await else {
            panic!("refused")
        };
        assert!(reason.contains("wrong token"), "{reason}");
        assert!(serving.await.unwrap().is_err());
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
            tokio::spawn(async move { watch(sw, &hub, shutdown).await })
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
}
