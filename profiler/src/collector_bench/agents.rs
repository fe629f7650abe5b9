//! Simulated agents: many in one process, each a tokio task with its own TCP connection that
//! speaks the real protocol (`analysis::wire`): Hello with the token, answers to the
//! collector's clock pings (during the handshake and after), then numbered records, reading
//! the collector's acknowledgements, and a Bye at the end.
//!
//! What one agent ships is what `stallscope agent` ships: one [`Frame::NodeHealth`] first,
//! then one [`Frame::NodeReport`] per attributed iteration, with the readings of the rank's
//! GPU (every field NVML can give, as on an H100). A simulated agent is a node with
//! `ranks` ranks whose iterations end together at `rate` Hz (a synchronous step), so one frame
//! is one rank's iteration, the unit the collector joins; the frames of one step leave in one
//! write, as the agent's shipper writes what it has queued. Iteration `k` of every agent ends
//! at `go + phase + k / rate`, the
//! phases spread evenly over one period so that the load is as smooth as unsynchronised nodes
//! make it. Each record carries that scheduled end as its `end_ns` (`CLOCK_MONOTONIC`, the
//! collector's clock too on this one machine), so an agent that falls behind its schedule
//! counts against the latency instead of hiding it. Each rank-iteration's wall time varies
//! within 90–100% of the period by default ([`wall_of`]), as a real loop's does.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use stallscope_analysis::attribution::{Basis, Coverage, Evidence, IterationBreakdown};
use stallscope_analysis::category::{Category, Split};
use stallscope_analysis::frame::{CommSpan, Frame, NodeHealth, NodeIteration, NodeReport};
use stallscope_analysis::gpu_usage::NvmlReading;
use stallscope_analysis::wire::{self, AgentMsg, CollectorMsg, Hello, PROTOCOL_VERSION};
use stallscope_analysis::Nanos;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{watch, Notify, Semaphore};
use tokio::time::{Instant, MissedTickBehavior};

use stallscope_agent::clock::monotonic_ns;

/// How one simulated agent behaves.
#[derive(Clone, Debug)]
pub struct AgentPlan {
    /// The collector.
    pub addr: SocketAddr,
    /// The shared token.
    pub token: String,
    /// Agents in the job.
    pub agents: usize,
    /// Ranks per agent (the world size each rank announces is `agents × ranks`).
    pub ranks: usize,
    /// Hz, iterations per rank per second.
    pub rate_hz: f64,
    /// %, how much each rank-iteration's wall time varies below the step ([`wall_of`]).
    pub wall_spread_pct: u64,
    /// Between two writes of an agent (each holds every rank-iteration that ended since);
    /// zero or under a step: a write per step.
    pub send_every: Duration,
    /// How long an agent may take to be welcomed.
    pub connect_within: Duration,
    /// How long an agent waits at the end for every record to be acknowledged.
    pub drain_within: Duration,
}

/// When the agents start shipping, on both forms of the same monotonic clock.
#[derive(Clone, Copy, Debug)]
pub struct Go {
    /// The start, for tokio's timers.
    pub at: Instant,
    /// ns, `CLOCK_MONOTONIC`, the same instant.
    pub mono_ns: Nanos,
}

/// What the agents share with the driver.
pub struct Control {
    /// Agents welcomed so far.
    pub welcomed: AtomicUsize,
    /// Agents that gave up before being welcomed.
    pub failed: AtomicUsize,
    /// Raised whenever one of the counters above moves.
    pub changed: Notify,
    /// Connections opened at once (the listen backlog is finite).
    pub connecting: Semaphore,
    /// `Some` once the agents may ship.
    pub go: watch::Receiver<Option<Go>>,
    /// `true` once the agents should stop shipping and drain.
    pub stop: watch::Receiver<bool>,
}

/// How one agent's run went.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Records sent (the health report included).
    pub sent: u64,
    /// Records the collector acknowledged.
    pub acked: u64,
    /// Why the agent stopped early, if it did.
    pub error: Option<String>,
}

/// The numbers a frame carries, per [`NodeReport`]: start and end, 7 categories, each
/// evidence entry, the 2 coverage figures, begin and end of each collective, and the GPU's
/// readings (busy, power, PCIe in and out, NVLink, energy, batch bytes).
pub fn values_per_frame(r: &NodeReport) -> usize {
    let it = &r.iteration;
    let gpu = r
        .gpu
        .as_ref()
        .map_or(0, |g| g.readings() + usize::from(g.batch_bytes.is_some()));
    2 + it.breakdown.split.ns.len() + it.breakdown.evidence.len() + 2 + 2 * it.comm.len() + gpu
}

/// What an H100 busy in a DDP step reads over one iteration of `wall_ns`: 87% busy, 300 W,
/// a 12.6 MB batch in, NVLink at 378 GB/s each way for the collective's 20%.
fn gpu_reading(wall_ns: u64) -> NvmlReading {
    NvmlReading {
        gpu: "0".into(),
        uuid: Some("GPU-5f4c7a1e-8b2d-4c3f-9e6a-1d2b3c4d5e6f".into()),
        cuda_timed: true,
        busy_ppm: Some(870_000),
        power_mw: Some(300_000),
        pcie_rx_bytes: Some(12_600_000),
        pcie_tx_bytes: Some(40_000),
        nvlink_bytes: Some(nvlink_bytes(wall_ns)),
        energy_mj: Some(energy_mj(wall_ns)),
        batch_bytes: Some(12_600_000),
    }
}

/// bytes over NVLink in an iteration of `wall_ns`: 378 GB/s each way for a fifth of it.
fn nvlink_bytes(wall_ns: u64) -> u64 {
    (2.0 * 378e9 * 0.2 * wall_ns as f64 / 1e9) as u64
}

/// mJ an iteration of `wall_ns` takes at 300 W.
fn energy_mj(wall_ns: u64) -> u64 {
    (300.0 * wall_ns as f64 / 1e9 * 1e3) as u64
}

/// [`iteration`] with its GPU's readings, as a GPU node's agent ships it.
pub fn report(rank: usize, world: usize, iter: u64, end_ns: Nanos, wall_ns: u64) -> NodeReport {
    NodeReport {
        iteration: iteration(rank, world, iter, end_ns, wall_ns),
        gpu: Some(gpu_reading(wall_ns)),
    }
}

/// Moves `r`, a [`report`] of the same rank, to iteration `iter` ending at `end_ns` after
/// `wall_ns`: the report [`report`] would make, without making it again (a fresh one per
/// rank-iteration, five allocations and their frees, was a quarter of the simulated agents' own
/// CPU, on the cores the collector shares with them).
pub fn advance(r: &mut NodeReport, iter: u64, end_ns: Nanos, wall_ns: u64) {
    let b = &mut r.iteration.breakdown;
    b.iter = iter;
    b.start_ns = end_ns.saturating_sub(wall_ns);
    b.end_ns = end_ns;
    b.split = split_of(wall_ns);
    for e in &mut b.evidence {
        e.ns = b.split.get(e.category);
    }
    b.coverage = Coverage {
        marked_ns: wall_ns,
        sampled_ns: wall_ns,
    };
    for span in &mut r.iteration.comm {
        span.begin = end_ns.saturating_sub(wall_ns * 30 / 100);
        span.end = end_ns;
    }
    if let Some(g) = r.gpu.as_mut() {
        g.nvlink_bytes = Some(nvlink_bytes(wall_ns));
        g.energy_mj = Some(energy_mj(wall_ns));
    }
}

/// ns, how long rank `rank`'s iteration `iter` took in a step of `period_ns`: between
/// `100 − spread_pct` and 100% of it, scattered as a hash of the two, so that each rank's wall
/// times vary as a real loop's do (what the collector makes of them costs what it costs in a
/// real job: a stream of one time repeated is sorted in one pass).
pub fn wall_of(rank: usize, iter: u64, period_ns: u64, spread_pct: u64) -> u64 {
    let spread = period_ns * spread_pct.min(100) / 100;
    if spread == 0 {
        return period_ns;
    }
    let mut x = (rank as u64) << 32 ^ iter;
    x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 29;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 32;
    period_ns - spread + x % spread
}

/// The categories of an iteration of `wall_ns`: 60% compute, 10% data prep, 20% network, the
/// rest peer wait.
fn split_of(wall_ns: u64) -> Split {
    let part = |pct: u64| wall_ns * pct / 100;
    let mut split = Split::default();
    split.add(Category::Compute, part(60));
    split.add(Category::DataPrep, part(10));
    split.add(Category::Network, part(20));
    split.add(Category::PeerWait, wall_ns - part(60) - part(10) - part(20));
    split
}

/// Iteration `iter` of rank `index` of `agents`, ending at `end_ns` after `wall_ns`: 60%
/// compute, 10% data prep, then one collective of 30% (20% network, 10% peer wait), as a DDP
/// step would.
pub fn iteration(
    index: usize,
    agents: usize,
    iter: u64,
    end_ns: Nanos,
    wall_ns: u64,
) -> NodeIteration {
    let part = |pct: u64| wall_ns * pct / 100;
    let split = split_of(wall_ns);
    let evidence = [
        (Category::Compute, Basis::ComputeMarker),
        (Category::DataPrep, Basis::DataLoaderCpu),
        (Category::Network, Basis::CommNicBytes),
        (Category::PeerWait, Basis::PeerArrival),
    ]
    .into_iter()
    .map(|(category, basis)| Evidence {
        category,
        basis,
        ns: split.get(category),
    })
    .collect();
    NodeIteration {
        node: String::new(),
        breakdown: IterationBreakdown {
            rank: index as u32,
            pid: 10_000 + index as u32,
            iter,
            start_ns: end_ns.saturating_sub(wall_ns),
            end_ns,
            split,
            evidence,
            coverage: Coverage {
                marked_ns: wall_ns,
                sampled_ns: wall_ns,
            },
        },
        comm: vec![CommSpan {
            begin: end_ns.saturating_sub(part(30)),
            end: end_ns,
        }],
        world_size: Some(agents as u32),
    }
}

/// One agent's connection, its incoming bytes and its record counters.
struct Conn {
    stream: TcpStream,
    inbox: Vec<u8>,
    next_seq: u64,
    acked: u64,
    /// The token its Hello proves, and its node name.
    token: String,
    node: String,
}

impl Conn {
    async fn send(&mut self, msg: &AgentMsg) -> Result<(), String> {
        self.stream
            .write_all(&wire::encode(msg))
            .await
            .map_err(|e| format!("send: {e}"))
    }

    async fn record(&mut self, frame: Frame) -> Result<(), String> {
        let mut out = Vec::new();
        self.queue(&frame, &mut out);
        self.write(&out).await
    }

    /// Appends `frame` to `out` as the next numbered record (the bytes [`wire::encode`]
    /// makes, written in place as the agent's shipper writes them: [`wire::encode_record`]).
    fn queue(&mut self, frame: &Frame, out: &mut Vec<u8>) {
        let seq = self.next_seq;
        self.next_seq += 1;
        wire::encode_record(seq, frame, out);
    }

    async fn write(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.stream
            .write_all(bytes)
            .await
            .map_err(|e| format!("send: {e}"))
    }

    /// Takes the messages that have arrived whole, answering pings; returns whether the
    /// collector welcomed the agent among them.
    async fn handle(&mut self) -> Result<bool, String> {
        let mut welcomed = false;
        loop {
            if self.inbox.len() < 4 {
                return Ok(welcomed);
            }
            let len = wire::payload_len(self.inbox[..4].try_into().expect("4 bytes"))
                .map_err(|e| e.to_string())?;
            if self.inbox.len() < 4 + len {
                return Ok(welcomed);
            }
            let msg: CollectorMsg =
                wire::decode(&self.inbox[4..4 + len]).map_err(|e| e.to_string())?;
            self.inbox.drain(..4 + len);
            match msg {
                CollectorMsg::Ping { t1 } => {
                    let t2 = monotonic_ns();
                    self.send(&AgentMsg::Pong { t1, t2, t3: t2 }).await?;
                }
                CollectorMsg::Welcome { .. } => welcomed = true,
                CollectorMsg::Ack { upto } => self.acked = self.acked.max(upto + 1),
                CollectorMsg::Refused { reason } => return Err(format!("refused: {reason}")),
                CollectorMsg::Feed { .. } => return Err("a viewer's feed sent to an agent".into()),
                // Simulated agents run no loops: the collector declares no hang without one.
                CollectorMsg::Stacks { .. } => {}
                CollectorMsg::Challenge { nonce } => {
                    let hello = AgentMsg::Hello(Hello {
                        protocol: PROTOCOL_VERSION,
                        proof: wire::prove(&self.token, wire::Role::Agent, &nonce),
                        node: self.node.clone(),
                        agent_version: env!("CARGO_PKG_VERSION").into(),
                    });
                    self.send(&hello).await?;
                }
            }
        }
    }

    /// Reads what arrives (cancel-safe: `read_buf` reads nothing when cancelled).
    async fn read(&mut self) -> Result<(), String> {
        match self.stream.read_buf(&mut self.inbox).await {
            Ok(0) => Err("the collector closed the connection".into()),
            Ok(_) => Ok(()),
            Err(e) => Err(format!("read: {e}")),
        }
    }
}

/// Connects and waits for the Welcome.
async fn connect(index: usize, plan: &AgentPlan) -> Result<Conn, String> {
    let stream = match plan.addr {
        // Each simulated agent from a loopback address of its own, as agents on their own
        // nodes come from theirs: the collector limits the connections of one address that
        // have not yet proven the token (a stranger's flood), which a whole benchmark from
        // 127.0.0.1 would hit at its first connections.
        SocketAddr::V4(a) if a.ip().is_loopback() => {
            let socket = tokio::net::TcpSocket::new_v4().map_err(|e| format!("socket: {e}"))?;
            let own = std::net::Ipv4Addr::new(127, 1, (index / 250) as u8, (index % 250 + 1) as u8);
            socket
                .bind(SocketAddr::from((own, 0)))
                .map_err(|e| format!("bind {own}: {e}"))?;
            socket.connect(plan.addr).await
        }
        addr => TcpStream::connect(addr).await,
    }
    .map_err(|e| format!("connect: {e}"))?;
    let _ = stream.set_nodelay(true);
    let mut conn = Conn {
        stream,
        inbox: Vec::with_capacity(256),
        next_seq: 0,
        acked: 0,
        token: plan.token.clone(),
        node: format!("sim-{index}"),
    };
    // The collector's challenge comes first; `handle` answers it with the Hello.
    loop {
        conn.read().await?;
        if conn.handle().await? {
            return Ok(conn);
        }
    }
}

/// Runs agent `index` from connection to goodbye.
pub async fn agent(index: usize, plan: Arc<AgentPlan>, control: Arc<Control>) -> Outcome {
    let mut outcome = Outcome::default();
    let conn = {
        let _permit = control.connecting.acquire().await;
        tokio::time::timeout(plan.connect_within, connect(index, &plan)).await
    };
    let mut conn = match conn {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            outcome.error = Some(e);
            control.failed.fetch_add(1, Ordering::AcqRel);
            control.changed.notify_one();
            return outcome;
        }
        Err(_) => {
            outcome.error = Some("not welcomed in time".into());
            control.failed.fetch_add(1, Ordering::AcqRel);
            control.changed.notify_one();
            return outcome;
        }
    };
    control.welcomed.fetch_add(1, Ordering::AcqRel);
    control.changed.notify_one();
    let result = ship(index, &plan, &control, &mut conn).await;
    outcome.sent = conn.next_seq;
    outcome.acked = conn.acked;
    outcome.error = result.err();
    let _ = conn.send(&AgentMsg::Bye).await;
    let _ = conn.stream.shutdown().await;
    outcome
}

/// Ships on schedule until told to stop, then waits for the acknowledgements.
async fn ship(
    index: usize,
    plan: &AgentPlan,
    control: &Control,
    conn: &mut Conn,
) -> Result<(), String> {
    let mut go_rx = control.go.clone();
    let go = loop {
        if let Some(go) = *go_rx.borrow_and_update() {
            break go;
        }
        tokio::select! {
            r = go_rx.changed() => r.map_err(|_| "the driver went away".to_string())?,
            r = conn.read() => { r?; conn.handle().await?; }
        }
    };
    let period_ns = (1e9 / plan.rate_hz) as u64;
    let agents = plan.agents.max(1) as u64;
    let phase_ns = period_ns * index as u64 / agents;
    let first_end = go.mono_ns + phase_ns;
    // The agents' writes spread over their interval as their iterations' ends over a step.
    let send_ns = (plan.send_every.as_nanos() as u64).max(period_ns);
    let mut tick = tokio::time::interval_at(
        go.at + Duration::from_nanos(send_ns * index as u64 / agents),
        Duration::from_nanos(send_ns),
    );
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    conn.record(Frame::NodeHealth(NodeHealth::default()))
        .await?;
    let mut iter = 0u64;
    let mut stop = control.stop.clone();
    let world = plan.agents * plan.ranks.max(1);
    let mut out = Vec::with_capacity(plan.ranks.max(1) * 256);
    // One report per rank, moved to each iteration in turn.
    let mut reports: Vec<Frame> = (0..plan.ranks.max(1))
        .map(|r| {
            let rank = index * plan.ranks.max(1) + r;
            Frame::NodeReport(Box::new(report(rank, world, 0, first_end, period_ns)))
        })
        .collect();
    loop {
        tokio::select! {
            _ = tick.tick() => {
                // Every iteration whose end is due since the last write, each rank's,
                // stamped with its scheduled end, in one write.
                let now = monotonic_ns();
                out.clear();
                while first_end + iter * period_ns <= now {
                    let end = first_end + iter * period_ns;
                    for frame in &mut reports {
                        if let Frame::NodeReport(r) = frame {
                            let wall = wall_of(
                                r.iteration.breakdown.rank as usize,
                                iter,
                                period_ns,
                                plan.wall_spread_pct,
                            );
                            advance(r, iter, end, wall);
                        }
                        conn.queue(frame, &mut out);
                    }
                    iter += 1;
                }
                if !out.is_empty() {
                    conn.write(&out).await?;
                }
            }
            r = conn.read() => { r?; conn.handle().await?; }
            _ = stop.changed() => break,
        }
    }
    let deadline = Instant::now() + plan.drain_within;
    while conn.acked < conn.next_seq {
        match tokio::time::timeout_at(deadline, conn.read()).await {
            Ok(r) => {
                r?;
                conn.handle().await?;
            }
            Err(_) => break,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report moved to another iteration is the report made for it: the agents send the
    /// bytes they sent when they made a report per rank-iteration.
    #[test]
    fn an_advanced_report_is_the_one_made_for_its_iteration() {
        let period = 33_333_333;
        let mut r = report(17, 10_000, 0, 5_000_000_000, wall_of(17, 0, period, 10));
        for iter in [1u64, 2, 977] {
            let end = 5_000_000_000 + iter * period;
            let wall = wall_of(17, iter, period, 10);
            advance(&mut r, iter, end, wall);
            let made = report(17, 10_000, iter, end, wall);
            assert_eq!(r, made);
            let (mut a, mut b) = (Vec::new(), Vec::new());
            wire::encode_record(iter, &Frame::NodeReport(Box::new(r.clone())), &mut a);
            wire::encode_record(iter, &Frame::NodeReport(Box::new(made)), &mut b);
            assert_eq!(a, b);
        }
    }

    /// A rank's wall times vary within 90–100% of the step, as a loop's do.
    #[test]
    fn wall_times_vary_within_a_tenth_of_the_step() {
        let period = 33_333_333;
        let walls: Vec<u64> = (0..1_000)
            .map(|iter| wall_of(5, iter, period, 10))
            .collect();
        assert!(walls.iter().all(|w| (period * 9 / 10..period).contains(w)));
        let distinct: std::collections::BTreeSet<_> = walls.iter().collect();
        assert!(distinct.len() > 900, "{} distinct of 1000", distinct.len());
        assert_ne!(wall_of(5, 7, period, 10), wall_of(6, 7, period, 10));
        assert_eq!(wall_of(5, 7, period, 0), period);
    }
}
