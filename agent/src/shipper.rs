//! The shipper: streams the node's records to the collector, and keeps them until the
//! collector says they are in its profile.
//!
//! Records are numbered and held in a bounded queue. Once connected and welcomed, the
//! shipper sends what the collector has not acknowledged; an [`CollectorMsg::Ack`] frees
//! records up to its number. When the collector is away (not started, restarted, network
//! down) records pile up and the shipper reconnects every [`RECONNECT_EVERY`]; after a
//! reconnect it sends everything still unacknowledged, so nothing the queue held is lost.
//! When the queue is full the oldest record is dropped and counted ([`Shipper::dropped`]),
//! and the count reaches the collector in the node's health reports. The training never
//! waits on any of this: [`Shipper::push`] only takes a lock and appends.
//!
//! It runs on its own thread with a single-threaded tokio runtime.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use stallscope_analysis::clock::shift;
use stallscope_analysis::frame::Frame;
use stallscope_analysis::wire::{self, AgentMsg, CollectorMsg, Hello, PROTOCOL_VERSION};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Notify};

use crate::clock::monotonic_ns;
use crate::tls::TlsClient;

/// Between two connection attempts while the collector is away.
pub const RECONNECT_EVERY: Duration = Duration::from_millis(500);

/// Between two attempts after the collector refused this agent (a wrong token does not fix
/// itself; the collector's log should not fill with it).
pub const REFUSED_RETRY: Duration = Duration::from_secs(10);

/// How the shipper connects.
#[derive(Clone, Debug)]
pub struct ShipperConfig {
    /// The collector, `HOST:PORT`.
    pub collector: String,
    /// The shared token (empty for none).
    pub token: String,
    /// This node's name.
    pub node: String,
    /// Records held at most while unacknowledged.
    pub buffer_records: usize,
    /// ns added to every time this agent reports (tests inject a clock offset with it).
    pub clock_offset_ns: i64,
    /// TLS to the collector (`--tls-ca`); `None`: plain TCP.
    pub tls: Option<TlsClient>,
}

#[derive(Default)]
struct Queue {
    /// (sequence number, encoded [`AgentMsg::Record`]), oldest first.
    records: VecDeque<(u64, Vec<u8>)>,
    next_seq: u64,
    dropped: u64,
}

struct Shared {
    queue: Mutex<Queue>,
    more: Notify,
    stop: AtomicBool,
    connected: AtomicBool,
    /// How the last connection ended, said once per distinct reason.
    refused: Mutex<Option<ConnectionEnd>>,
    /// The collector's latest request for the ranks' places and stacks (0: none).
    stacks_asked: AtomicU64,
}

/// A running shipper.
pub struct Shipper {
    shared: Arc<Shared>,
    config: ShipperConfig,
    thread: Option<JoinHandle<()>>,
}

impl Shipper {
    /// Starts the shipper thread; it connects in the background.
    pub fn spawn(config: ShipperConfig) -> std::io::Result<Shipper> {
        let shared = Arc::new(Shared {
            queue: Mutex::default(),
            more: Notify::new(),
            stop: AtomicBool::new(false),
            connected: AtomicBool::new(false),
            refused: Mutex::default(),
            stacks_asked: AtomicU64::new(0),
        });
        let thread = {
            let (shared, config) = (shared.clone(), config.clone());
            std::thread::Builder::new()
                .name("stallscope-shipper".into())
                .spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("a tokio runtime starts");
                    rt.block_on(ship(shared, config));
                })?
        };
        Ok(Shipper {
            shared,
            config,
            thread: Some(thread),
        })
    }

    /// ns on this agent's reported clock (the node's clock plus any injected offset).
    pub fn now(&self) -> u64 {
        shift(monotonic_ns(), self.config.clock_offset_ns)
    }

    /// ns added to every time this agent reports.
    pub fn clock_offset_ns(&self) -> i64 {
        self.config.clock_offset_ns
    }

    /// Queues a frame for the collector; drops the oldest when the queue is full.
    pub fn push(&self, frame: Frame) {
        self.push_all([frame]);
    }

    /// Queues frames for the collector, in order, and wakes the sender once: what an
    /// attribution round gave (every rank's iterations) goes in one write, not the first
    /// alone and the rest after. Drops the oldest when the queue is full.
    pub fn push_all(&self, frames: impl IntoIterator<Item = Frame>) {
        let Ok(mut q) = self.shared.queue.lock() else {
            return;
        };
        for frame in frames {
            let seq = q.next_seq;
            q.next_seq += 1;
            // `AgentMsg::Record { seq, frame }`'s bytes, a rank's iteration written by hand.
            let mut record = Vec::new();
            wire::encode_record(seq, &frame, &mut record);
            q.records.push_back((seq, record));
        }
        while q.records.len() > self.config.buffer_records {
            q.records.pop_front();
            q.dropped += 1;
        }
        drop(q);
        self.shared.more.notify_one();
    }

    /// The collector's latest request for where this node's ranks stand and their stacks
    /// (`CollectorMsg::Stacks`; 0: none yet), to answer with a `Frame::NodeHang`.
    pub fn stacks_asked(&self) -> u64 {
        self.shared.stacks_asked.load(Ordering::Acquire)
    }

    /// Records dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.shared.queue.lock().map_or(0, |q| q.dropped)
    }

    /// Records not yet acknowledged.
    pub fn unacked(&self) -> usize {
        self.shared.queue.lock().map_or(0, |q| q.records.len())
    }

    /// Whether the collector has welcomed this agent on the current connection.
    pub fn connected(&self) -> bool {
        self.shared.connected.load(Ordering::Acquire)
    }

    /// Waits up to `within` for every record to be acknowledged, then says goodbye and stops.
    /// Returns the records left unacknowledged.
    pub fn finish(mut self, within: Duration) -> usize {
        let deadline = Instant::now() + within;
        while self.unacked() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.shared.stop.store(true, Ordering::Release);
        self.shared.more.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.unacked()
    }
}

impl Drop for Shipper {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.more.notify_one();
    }
}

/// Why a connection to the collector ended.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
enum ConnectionEnd {
    /// The collector refused this agent (a token, a version, a name): retried slowly.
    #[error("refused this agent: {0}")]
    Refused(String),
    /// It could not be reached or the connection broke: retried soon.
    #[error("{0}")]
    Lost(String),
    /// The TLS handshake failed (a certificate not trusted, a collector without TLS): a
    /// setup mistake, retried slowly like a refusal.
    #[error("{0}")]
    Tls(String),
}

impl From<String> for ConnectionEnd {
    fn from(why: String) -> ConnectionEnd {
        ConnectionEnd::Lost(why)
    }
}

async fn ship(shared: Arc<Shared>, config: ShipperConfig) {
    while !shared.stop.load(Ordering::Acquire) {
        let result = connection(&shared, &config).await;
        shared.connected.store(false, Ordering::Release);
        if let Err(why) = result {
            let mut last = shared.refused.lock().unwrap_or_else(|e| e.into_inner());
            if last.as_ref() != Some(&why) {
                eprintln!("stallscope agent: collector {}: {why}", config.collector);
                *last = Some(why);
            }
        }
        let refused = shared
            .refused
            .lock()
            .map(|r| {
                matches!(
                    *r,
                    Some(ConnectionEnd::Refused(_)) | Some(ConnectionEnd::Tls(_))
                )
            })
            .unwrap_or(false);
        let until = Instant::now()
            + if refused {
                REFUSED_RETRY
            } else {
                RECONNECT_EVERY
            };
        while Instant::now() < until && !shared.stop.load(Ordering::Acquire) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// One connection, until it breaks or the shipper stops. `Err` says why, for the user.
/// What the collector sent, each with the time it arrived (the agent's clock, shifted by
/// the injected offset).
type Received = Result<(CollectorMsg, u64), String>;

/// Reads the collector's messages on a task of their own (reading is not cancel-safe);
/// pings are stamped on arrival.
fn spawn_reader<R: AsyncRead + Unpin + Send + 'static>(
    r: R,
    offset: i64,
) -> (tokio::task::JoinHandle<()>, mpsc::Receiver<Received>) {
    let (tx, rx) = mpsc::channel::<Received>(256);
    let reader = tokio::spawn(async move {
        let mut r = BufReader::new(r);
        let mut buf = Vec::new();
        loop {
            let mut prefix = [0u8; 4];
            let item = match r.read_exact(&mut prefix).await {
                Err(e) => Err(format!("connection lost ({e})")),
                Ok(_) => match wire::payload_len(prefix) {
                    Err(e) => Err(format!("the collector sent {e}")),
                    Ok(len) => {
                        buf.resize(len, 0);
                        match r.read_exact(&mut buf).await {
                            Err(e) => Err(format!("connection lost ({e})")),
                            Ok(_) => wire::decode::<CollectorMsg>(&buf)
                                .map(|m| (m, shift(monotonic_ns(), offset)))
                                .map_err(|e| format!("the collector sent {e}")),
                        }
                    }
                },
            };
            let stop = item.is_err();
            if tx.send(item).await.is_err() || stop {
                break;
            }
        }
    });
    (reader, rx)
}

/// The collector welcomed this agent: say so once after a refusal.
fn on_welcome(shared: &Shared, config: &ShipperConfig) {
    shared.connected.store(true, Ordering::Release);
    if let Ok(mut last) = shared.refused.lock() {
        if last.take().is_some() {
            eprintln!(
                "stallscope agent: connected to collector {}",
                config.collector
            );
        }
    }
}

/// The queued records not yet sent on this connection, up to about 256 KiB, in order;
/// `sent_upto` moves past them.
fn unsent(shared: &Shared, sent_upto: &mut Option<u64>) -> Vec<u8> {
    let Ok(q) = shared.queue.lock() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    // Numbers are consecutive from the front: the first unsent is found, not walked to (the
    // queue holds a second of records between acknowledgements).
    let first_unsent = match (*sent_upto, q.records.front()) {
        (Some(s), Some((front, _))) => {
            ((s + 1).saturating_sub(*front) as usize).min(q.records.len())
        }
        _ => 0,
    };
    for (seq, bytes) in q.records.range(first_unsent..) {
        out.extend_from_slice(bytes);
        *sent_upto = Some(*seq);
        if out.len() > 256 * 1024 {
            break;
        }
    }
    out
}

async fn connection(shared: &Shared, config: &ShipperConfig) -> Result<(), ConnectionEnd> {
    let stream = tokio::time::timeout(
        Duration::from_secs(2),
        TcpStream::connect(&config.collector),
    )
    .await
    .map_err(|_| "no answer within 2 s; retrying".to_string())?
    .map_err(|e| format!("cannot connect ({e}); retrying, records are kept meanwhile"))?;
    let _ = stream.set_nodelay(true);
    let Some(tls) = &config.tls else {
        let (r, w) = stream.into_split();
        return converse(r, w, shared, config).await;
    };
    let stream = tokio::time::timeout(Duration::from_secs(10), tls.connect(stream))
        .await
        .map_err(|_| {
            ConnectionEnd::Tls(
                "no TLS handshake within 10 s: is the collector started with --tls-cert?".into(),
            )
        })?
        .map_err(ConnectionEnd::Tls)?;
    let (r, w) = tokio::io::split(stream);
    converse(r, w, shared, config).await
}

/// One connection's conversation, on any stream: Hello, then pongs, records and acks until
/// the shipper stops (Bye) or the connection ends.
async fn converse<R, W>(
    r: R,
    mut w: W,
    shared: &Shared,
    config: &ShipperConfig,
) -> Result<(), ConnectionEnd>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin,
{
    let io = |e: std::io::Error| format!("connection lost ({e})");
    let offset = config.clock_offset_ns;
    let (reader, mut rx) = spawn_reader(r, offset);
    let waited = Instant::now();
    let result = async {
        // The collector speaks first: a nonce, which the Hello answers with the proof that
        // this agent holds the token (the token itself is never sent).
        let nonce = match rx.recv().await {
            Some(Ok((CollectorMsg::Challenge { nonce }, _))) => nonce,
            Some(Ok((CollectorMsg::Refused { reason }, _))) => {
                return Err(ConnectionEnd::Refused(reason))
            }
            Some(Ok(_)) => {
                return Err(ConnectionEnd::Lost(
                    "the collector did not open with a challenge: is it the same stallscope version as this agent?".into(),
                ))
            }
            // A collector using TLS waits for a TLS handshake that a plain agent never
            // starts, and closes the connection at the end of its handshake time (seconds);
            // one serving too many strangers refuses with its reason, read above.
            Some(Err(e)) if config.tls.is_none() && waited.elapsed() >= Duration::from_secs(1) => {
                return Err(ConnectionEnd::Tls(format!(
                    "{e} before the collector's challenge: is the collector using --tls-cert? give the agent --tls-ca (its certificate or CA); else the collector closed this connection unsaid (a collector at its limit of connections that have not proven the token says so)"
                )))
            }
            Some(Err(e)) => return Err(ConnectionEnd::Lost(e)),
            None => return Err(ConnectionEnd::Lost("connection lost".into())),
        };
        let hello = AgentMsg::Hello(Hello {
            protocol: PROTOCOL_VERSION,
            proof: wire::prove(&config.token, wire::Role::Agent, &nonce),
            node: config.node.clone(),
            agent_version: env!("CARGO_PKG_VERSION").into(),
        });
        // Flushed after each write: over TLS, written bytes may wait in the session's buffer.
        w.write_all(&wire::encode(&hello)).await.map_err(io)?;
        w.flush().await.map_err(io)?;
        let mut welcomed = false;
        let mut sent_upto: Option<u64> = None;
        let mut poll = tokio::time::interval(Duration::from_millis(50));
        loop {
            if shared.stop.load(Ordering::Acquire) {
                let _ = w.write_all(&wire::encode(&AgentMsg::Bye)).await;
                let _ = w.shutdown().await;
                return Ok(());
            }
            tokio::select! {
                msg = rx.recv() => {
                    let Some(msg) = msg else { return Err(ConnectionEnd::Lost("connection lost".into())) };
                    match msg? {
                        (CollectorMsg::Ping { t1 }, t2) => {
                            let pong = AgentMsg::Pong { t1, t2, t3: shift(monotonic_ns(), offset) };
                            w.write_all(&wire::encode(&pong)).await.map_err(io)?;
                            w.flush().await.map_err(io)?;
                        }
                        (CollectorMsg::Welcome { .. }, _) => {
                            welcomed = true;
                            on_welcome(shared, config);
                        }
                        (CollectorMsg::Ack { upto }, _) => {
                            if let Ok(mut q) = shared.queue.lock() {
                                while q.records.front().is_some_and(|(s, _)| *s <= upto) {
                                    q.records.pop_front();
                                }
                            }
                        }
                        (CollectorMsg::Refused { reason }, _) => {
                            return Err(ConnectionEnd::Refused(reason));
                        }
                        (CollectorMsg::Feed { .. }, _) => {
                            return Err(ConnectionEnd::Lost("the collector sent a viewer's feed to an agent".into()));
                        }
                        (CollectorMsg::Challenge { .. }, _) => {
                            return Err(ConnectionEnd::Lost("the collector challenged twice".into()));
                        }
                        (CollectorMsg::Stacks { id }, _) => {
                            shared.stacks_asked.store(id, Ordering::Release);
                        }
                    }
                }
                _ = shared.more.notified() => {}
                _ = poll.tick() => {}
            }
            if welcomed {
                let batch = unsent(shared, &mut sent_upto);
                if !batch.is_empty() {
                    w.write_all(&batch).await.map_err(io)?;
                    w.flush().await.map_err(io)?;
                }
            }
        }
    }
    .await;
    reader.abort();
    result
}

#[cfg(test)]
mod tests {
    //! The shipper's side of the protocol over an in-memory pipe (tokio's duplex), the
    //! collector played by the test.

    use super::*;
    use stallscope_analysis::frame::NodeHealth;
    use tokio::io::{duplex, split};

    async fn read_agent<R: AsyncRead + Unpin>(r: &mut R) -> AgentMsg {
        let mut prefix = [0u8; 4];
        r.read_exact(&mut prefix).await.unwrap();
        let mut buf = vec![0u8; wire::payload_len(prefix).unwrap()];
        r.read_exact(&mut buf).await.unwrap();
        wire::decode(&buf).unwrap()
    }

    /// Record `seq` as the queue holds it: a health report, encoded.
    fn queued_record(seq: u64) -> (u64, Vec<u8>) {
        let frame = Frame::NodeHealth(NodeHealth::default());
        (seq, wire::encode(&AgentMsg::Record { seq, frame }))
    }

    fn shared_with(records: u64) -> Shared {
        let mut q = Queue::default();
        q.records.extend((0..records).map(queued_record));
        q.next_seq = records;
        Shared {
            queue: Mutex::new(q),
            more: Notify::new(),
            stop: AtomicBool::new(false),
            connected: AtomicBool::new(false),
            refused: Mutex::default(),
            stacks_asked: AtomicU64::new(0),
        }
    }

    fn config() -> ShipperConfig {
        ShipperConfig {
            collector: "in-memory".into(),
            token: "t".into(),
            node: "node-a".into(),
            buffer_records: 16,
            clock_offset_ns: 0,
            tls: None,
        }
    }

    /// The records' numbers in `bytes`, a run of encoded records.
    fn seqs_in(mut bytes: &[u8]) -> Vec<u64> {
        let mut seqs = Vec::new();
        while !bytes.is_empty() {
            let len = wire::payload_len(bytes[..4].try_into().unwrap()).unwrap();
            let AgentMsg::Record { seq, .. } = wire::decode(&bytes[4..4 + len]).unwrap() else {
                panic!("not a record");
            };
            seqs.push(seq);
            bytes = &bytes[4 + len..];
        }
        seqs
    }

    #[test]
    fn what_is_unsent_follows_the_last_sent_whatever_the_queue_freed() {
        let shared = shared_with(10);
        let mut sent_upto = None;
        assert_eq!(
            seqs_in(&unsent(&shared, &mut sent_upto)),
            (0..10).collect::<Vec<_>>()
        );
        assert_eq!(sent_upto, Some(9));
        assert!(unsent(&shared, &mut sent_upto).is_empty());
        // Acknowledged up to 3, then three more queued.
        {
            let mut q = shared.queue.lock().unwrap();
            q.records.drain(..4);
            q.records.extend((10..13).map(queued_record));
        }
        assert_eq!(seqs_in(&unsent(&shared, &mut sent_upto)), vec![10, 11, 12]);
        // A new connection sends everything still held, from the oldest.
        let mut fresh = None;
        assert_eq!(
            seqs_in(&unsent(&shared, &mut fresh)),
            (4..13).collect::<Vec<_>>()
        );
        // Sent up to a record the full queue has dropped since: from the oldest held.
        shared.queue.lock().unwrap().records.drain(..6);
        let mut behind = Some(7);
        assert_eq!(seqs_in(&unsent(&shared, &mut behind)), vec![10, 11, 12]);
    }

    #[tokio::test]
    async fn hello_pong_records_after_the_welcome_and_acks_free_them() {
        let shared = Arc::new(shared_with(3));
        let (agent, collector) = duplex(64 * 1024);
        let (ar, aw) = split(agent);
        let (mut cr, mut cw) = split(collector);
        let talking = {
            let shared = shared.clone();
            tokio::spawn(async move { converse(ar, aw, &shared, &config()).await })
        };
        let nonce = vec![9u8; wire::NONCE_BYTES];
        cw.write_all(&wire::encode(&CollectorMsg::Challenge {
            nonce: nonce.clone(),
        }))
        .await
        .unwrap();
        let AgentMsg::Hello(h) = read_agent(&mut cr).await else {
            panic!("a Hello answers the challenge")
        };
        assert_eq!((h.node.as_str(), h.protocol), ("node-a", PROTOCOL_VERSION));
        assert!(
            wire::verify("t", wire::Role::Agent, &nonce, &h.proof),
            "it proves the token"
        );
        cw.write_all(&wire::encode(&CollectorMsg::Ping { t1: 7 }))
            .await
            .unwrap();
        assert!(matches!(
            read_agent(&mut cr).await,
            AgentMsg::Pong { t1: 7, .. }
        ));
        let welcome = CollectorMsg::Welcome {
            collector_version: "test".into(),
        };
        cw.write_all(&wire::encode(&welcome)).await.unwrap();
        for want in 0..3 {
            let AgentMsg::Record { seq, .. } = read_agent(&mut cr).await else {
                panic!("records after the welcome")
            };
            assert_eq!(seq, want);
        }
        assert!(shared.connected.load(Ordering::Acquire));
        cw.write_all(&wire::encode(&CollectorMsg::Ack { upto: 1 }))
            .await
            .unwrap();
        let freed = async {
            while shared.queue.lock().unwrap().records.len() != 1 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), freed)
            .await
            .expect("acknowledged records are freed, the rest kept");
        // The collector asks where the ranks stand (the job stalls): the request is kept for
        // the recorder's tap to answer.
        cw.write_all(&wire::encode(&CollectorMsg::Stacks { id: 4 }))
            .await
            .unwrap();
        let asked = async {
            while shared.stacks_asked.load(Ordering::Acquire) != 4 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), asked)
            .await
            .expect("the request is kept");
        shared.stop.store(true, Ordering::Release);
        shared.more.notify_one();
        assert!(matches!(read_agent(&mut cr).await, AgentMsg::Bye));
        assert_eq!(talking.await.unwrap(), Ok(()));
    }

    #[tokio::test]
    async fn a_refusal_ends_the_conversation_with_the_reason() {
        let shared = shared_with(0);
        let (agent, collector) = duplex(64 * 1024);
        let (ar, aw) = split(agent);
        let (mut cr, mut cw) = split(collector);
        let refused = CollectorMsg::Refused {
            reason: "wrong token".into(),
        };
        let collector_side = async move {
            let challenge = CollectorMsg::Challenge {
                nonce: vec![1; wire::NONCE_BYTES],
            };
            cw.write_all(&wire::encode(&challenge)).await.unwrap();
            let _ = read_agent(&mut cr).await;
            cw.write_all(&wire::encode(&refused)).await.unwrap();
            (cr, cw)
        };
        let config = config();
        let (result, _) = tokio::join!(converse(ar, aw, &shared, &config), collector_side);
        let err = result.unwrap_err();
        assert_eq!(err, ConnectionEnd::Refused("wrong token".into()));
        assert_eq!(err.to_string(), "refused this agent: wrong token");
    }
}
