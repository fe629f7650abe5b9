//! Iteration and phase markers, and their wire format.
//!
//! Training processes send one datagram per event on a Unix datagram socket, non-blocking, so
//! a slow or absent profiler costs the trainer nothing but a dropped event (or, after their
//! first event, on a connected pair of their own: agent/src/markers.rs). The format is one
//! line of ASCII text, versioned by its first word, so that any language can emit it with a
//! `printf` and a reader can reject what it does not understand with a precise message:
//!
//! ```text
//! SS1 <seq> <t_ns> <pid> <rank> <iter> <event> <phase> [key=value ...]
//! ```
//!
//! * `seq` — per-process sequence number, starting at 0; a gap tells the reader how many
//!   datagrams were dropped on the way.
//! * `t_ns` — `CLOCK_MONOTONIC` nanoseconds (`time.monotonic_ns()`).
//! * `rank` — the global rank, or `-1` when not yet known.
//! * `iter` — iterations completed by this process so far (0-based index of the current one).
//! * `event` — `B` phase begins, `E` phase ends, `S` step: iteration `iter` is complete (phase
//!   is `iter`), `M` metadata in the `key=value` fields (phase is `-`).
//! * `phase` — `data`, `h2d`, `compute`, `comm`, `iter`, or a user name: 1–64 characters from
//!   `[A-Za-z0-9_.:-]`.
//!
//! Keys and values of `M` fields use the phase alphabet too (values may also contain `/`).
//!
//! A `B` event may carry `w=<pid>`: in this phase the loop waits for that process (the
//! DataLoader worker whose batch is next), so the data stall is read from what that worker
//! did, not from what every worker did meanwhile.
//!
//! A `B` event may instead carry `op=<name>`: the phase is one communication operation
//! (`all_reduce`, `send`, `recv`, …), with `g=<group>` (a small id of its process group,
//! stable across ranks), `n=<seq>` (its number among the process's operations of that kind in
//! that group; for point-to-point operations, among those to or from that peer in that
//! direction), `b=<bytes>` and, for point-to-point operations, `p=<peer global rank>`. The
//! analysis matches an operation with the same one on the other ranks by this identity, not by
//! its position in the iteration. Other `B` and `E` fields are ignored, so that later senders
//! can add some.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::Nanos;

/// The protocol word every datagram starts with.
pub const PROTOCOL: &str = "SS1";

/// Longest datagram accepted, bytes.
pub const MAX_DATAGRAM: usize = 4096;

/// What the event says.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MarkerEvent {
    /// A phase begins.
    Begin(String),
    /// A phase ends.
    End(String),
    /// The iteration numbered `Marker::iter` is complete.
    Step,
    /// Facts about the sending process (local_rank, world_size, workers, role, …).
    Meta(Vec<(String, String)>),
    /// A phase begins in which the process waits for process `.1` (`B <phase> w=<pid>`).
    /// Last, so that profiles written before it still read.
    BeginWaiting(String, u32),
    /// A phase that is one communication operation begins (`B <phase> op=… g=… n=…`).
    /// Last, so that profiles written before it still read.
    BeginOp(String, CommOp),
}

/// The identity of one communication operation, as the sender numbered it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CommOp {
    /// The operation: `all_reduce`, `broadcast`, `send`, `irecv`, … (phase alphabet).
    pub op: String,
    /// Small id of its process group (`0` for the default group), the same on every rank.
    pub group: u32,
    /// Its number, from 0: per (group, op) for a collective, per (peer, direction) for a
    /// point-to-point operation.
    pub seq: u64,
    /// bytes of the tensors it sent or received on this rank.
    pub bytes: u64,
    /// The other end's global rank, for a point-to-point operation.
    pub peer: Option<u32>,
}

/// Which way a point-to-point operation moves data, seen from the rank that marked it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    /// `send`, `isend`.
    Send,
    /// `recv`, `irecv`.
    Recv,
}

impl CommOp {
    /// The direction of a point-to-point operation (it names a peer and is a send or a
    /// receive); `None` for a collective.
    pub fn direction(&self) -> Option<Direction> {
        self.peer?;
        match self.op.as_str() {
            "send" | "isend" => Some(Direction::Send),
            "recv" | "irecv" => Some(Direction::Recv),
            _ => None,
        }
    }

    /// Parses the `op=`, `g=`, `n=`, `b=`, `p=` fields of a `B` event; `None` without `op=`.
    fn parse(fields: &[&str]) -> Result<Option<CommOp>, MarkerError> {
        let get = |key: &str| {
            fields
                .iter()
                .find_map(|f| f.strip_prefix(key)?.strip_prefix('='))
        };
        let Some(op) = get("op") else {
            return Ok(None);
        };
        if !valid_name(op) {
            return Err(MarkerError::Name(op.into()));
        }
        let required = |key: &'static str| get(key).ok_or(MarkerError::MissingField(key));
        Ok(Some(CommOp {
            op: op.into(),
            group: number("g", required("g")?)?,
            seq: number("n", required("n")?)?,
            bytes: get("b").map(|b| number("b", b)).transpose()?.unwrap_or(0),
            peer: get("p").map(|p| number("p", p)).transpose()?,
        }))
    }

    /// The fields as [`CommOp::parse`] reads them, with a leading space.
    fn format(&self) -> String {
        let peer = self.peer.map(|p| format!(" p={p}")).unwrap_or_default();
        format!(
            " op={} g={} n={} b={}{peer}",
            self.op, self.group, self.seq, self.bytes
        )
    }
}

/// One event from a training process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Marker {
    /// Per-process sequence number.
    pub seq: u64,
    /// ns, `CLOCK_MONOTONIC` of the sender's node.
    pub t_ns: Nanos,
    /// Sender's process id.
    pub pid: u32,
    /// Global rank, if the sender knew it.
    pub rank: Option<u32>,
    /// Iterations completed by the sender before this event.
    pub iter: u64,
    /// What happened.
    pub event: MarkerEvent,
}

/// Well-known phase names.
pub mod phase {
    /// The loop waits for the next batch.
    pub const DATA: &str = "data";
    /// Host-to-device copy of the batch.
    pub const H2D: &str = "h2d";
    /// Forward, backward and optimizer work.
    pub const COMPUTE: &str = "compute";
    /// The loop waits on a collective or a parameter-server push/pull.
    pub const COMM: &str = "comm";
    /// The phase name carried by step events.
    pub const ITER: &str = "iter";
}

/// Why a datagram was rejected.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum MarkerError {
    /// Over [`MAX_DATAGRAM`] bytes.
    #[error("marker of {0} bytes is longer than {MAX_DATAGRAM}")]
    TooLong(usize),
    /// Not ASCII text.
    #[error("marker is not ASCII text")]
    NotText,
    /// Starts with something other than `SS1`.
    #[error("unknown marker protocol {0:?} (this stallscope reads {PROTOCOL})")]
    Protocol(String),
    /// Fewer than the eight fixed fields.
    #[error("marker has {0} fields, needs at least 8: SS1 seq t_ns pid rank iter event phase")]
    Fields(usize),
    /// A numeric field did not parse.
    #[error("marker field {field} is not a valid number: {value:?}")]
    Number {
        /// Field name.
        field: &'static str,
        /// What was there.
        value: String,
    },
    /// Event letter other than B, E, S, M.
    #[error("unknown marker event {0:?} (expected B, E, S or M)")]
    Event(String),
    /// Phase name outside the alphabet or too long.
    #[error("invalid phase or key {0:?}: 1-64 characters of [A-Za-z0-9_.:-]")]
    Name(String),
    /// A communication operation's `B` event without one of its identifying fields.
    #[error("marker with op= lacks its {0}= field (op=NAME g=GROUP n=SEQ [b=BYTES] [p=PEER])")]
    MissingField(&'static str),
    /// A metadata field without `=`.
    #[error("metadata field {0:?} is not key=value")]
    Meta(String),
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'))
}

/// bytes, the longest `meta` value the wire format takes.
pub const MAX_META_VALUE: usize = 256;

fn valid_value(s: &str) -> bool {
    s.len() <= MAX_META_VALUE
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-' | b'/'))
}

fn number<T: std::str::FromStr>(field: &'static str, value: &str) -> Result<T, MarkerError> {
    value.parse().map_err(|_| MarkerError::Number {
        field,
        value: value.to_string(),
    })
}

/// Parses one datagram. Trailing newlines are allowed.
pub fn parse(datagram: &[u8]) -> Result<Marker, MarkerError> {
    if datagram.len() > MAX_DATAGRAM {
        return Err(MarkerError::TooLong(datagram.len()));
    }
    let text = std::str::from_utf8(datagram)
        .ok()
        .filter(|t| t.is_ascii())
        .ok_or(MarkerError::NotText)?;
    let fields: Vec<&str> = text.split_ascii_whitespace().collect();
    if fields.first() != Some(&PROTOCOL) {
        let word = fields.first().copied().unwrap_or("").chars().take(16);
        return Err(MarkerError::Protocol(word.collect()));
    }
    if fields.len() < 8 {
        return Err(MarkerError::Fields(fields.len()));
    }
    let seq = number("seq", fields[1])?;
    let t_ns = number("t_ns", fields[2])?;
    let pid = number("pid", fields[3])?;
    let rank: i64 = number("rank", fields[4])?;
    let rank = match rank {
        -1 => None,
        r if (0..=u32::MAX as i64).contains(&r) => Some(r as u32),
        _ => {
            return Err(MarkerError::Number {
                field: "rank",
                value: fields[4].into(),
            })
        }
    };
    let iter = number("iter", fields[5])?;
    let phase = fields[7];
    let event = match fields[6] {
        "B" | "E" => {
            if !valid_name(phase) {
                return Err(MarkerError::Name(phase.into()));
            }
            if fields[6] == "B" {
                let waits_for = fields[8..]
                    .iter()
                    .find_map(|f| f.strip_prefix("w="))
                    .map(|pid| number("w", pid))
                    .transpose()?;
                match (waits_for, CommOp::parse(&fields[8..])?) {
                    (Some(pid), _) => MarkerEvent::BeginWaiting(phase.into(), pid),
                    (None, Some(op)) => MarkerEvent::BeginOp(phase.into(), op),
                    (None, None) => MarkerEvent::Begin(phase.into()),
                }
            } else {
                MarkerEvent::End(phase.into())
            }
        }
        "S" => MarkerEvent::Step,
        "M" => {
            let mut kv = Vec::new();
            for f in &fields[8..] {
                let (k, v) = f
                    .split_once('=')
                    .ok_or_else(|| MarkerError::Meta((*f).into()))?;
                if !valid_name(k) || !valid_value(v) {
                    return Err(MarkerError::Meta((*f).into()));
                }
                kv.push((k.to_string(), v.to_string()));
            }
            MarkerEvent::Meta(kv)
        }
        other => return Err(MarkerError::Event(other.chars().take(8).collect())),
    };
    Ok(Marker {
        seq,
        t_ns,
        pid,
        rank,
        iter,
        event,
    })
}

/// Formats a marker in the wire format (without trailing newline).
pub fn format(m: &Marker) -> String {
    let rank = m.rank.map(|r| r as i64).unwrap_or(-1);
    let (ev, phase, extra) = match &m.event {
        MarkerEvent::Begin(p) => ("B", p.as_str(), String::new()),
        MarkerEvent::BeginWaiting(p, pid) => ("B", p.as_str(), format!(" w={pid}")),
        MarkerEvent::BeginOp(p, op) => ("B", p.as_str(), op.format()),
        MarkerEvent::End(p) => ("E", p.as_str(), String::new()),
        MarkerEvent::Step => ("S", phase::ITER, String::new()),
        MarkerEvent::Meta(kv) => (
            "M",
            "-",
            kv.iter().map(|(k, v)| format!(" {k}={v}")).collect(),
        ),
    };
    format!(
        "{PROTOCOL} {} {} {} {rank} {} {ev} {phase}{extra}",
        m.seq, m.t_ns, m.pid, m.iter
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_the_python_package_sends() {
        let m = parse(b"SS1 7 123456789 4242 1 17 B data\n").unwrap();
        assert_eq!(m.seq, 7);
        assert_eq!(m.t_ns, 123456789);
        assert_eq!(m.pid, 4242);
        assert_eq!(m.rank, Some(1));
        assert_eq!(m.iter, 17);
        assert_eq!(m.event, MarkerEvent::Begin("data".into()));
        let s = parse(b"SS1 8 2 4242 -1 18 S iter").unwrap();
        assert_eq!(s.rank, None);
        assert_eq!(s.event, MarkerEvent::Step);
    }

    #[test]
    fn a_data_wait_names_the_worker_it_waits_for() {
        let text = "SS1 9 5 10 0 3 B data w=4711";
        let m = parse(text.as_bytes()).unwrap();
        assert_eq!(m.event, MarkerEvent::BeginWaiting("data".into(), 4711));
        assert_eq!(format(&m), text);
        // Fields it does not know are left alone; a bad pid is refused with its reason.
        let other = parse(b"SS1 9 5 10 0 3 B data x=1").unwrap();
        assert_eq!(other.event, MarkerEvent::Begin("data".into()));
        assert!(matches!(
            parse(b"SS1 9 5 10 0 3 B data w=-1"),
            Err(MarkerError::Number { field: "w", .. })
        ));
    }

    #[test]
    fn a_communication_operation_carries_its_identity() {
        let text = "SS1 9 5 10 1 3 B comm op=recv g=0 n=4 b=16384 p=0";
        let m = parse(text.as_bytes()).unwrap();
        let MarkerEvent::BeginOp(phase, op) = &m.event else {
            panic!("{:?}", m.event);
        };
        assert_eq!(phase, "comm");
        assert_eq!(
            (op.group, op.seq, op.bytes, op.peer),
            (0, 4, 16384, Some(0))
        );
        assert_eq!(op.direction(), Some(Direction::Recv));
        assert_eq!(format(&m), text);
        let all_reduce = parse(b"SS1 9 5 10 1 3 B comm op=all_reduce g=2 n=0").unwrap();
        let MarkerEvent::BeginOp(_, op) = &all_reduce.event else {
            panic!("{:?}", all_reduce.event);
        };
        assert_eq!((op.bytes, op.peer, op.direction()), (0, None, None));
        // A broken identity is refused with its reason, not read as a plain phase.
        assert_eq!(
            parse(b"SS1 9 5 10 1 3 B comm op=send g=0 b=4"),
            Err(MarkerError::MissingField("n"))
        );
        assert!(matches!(
            parse(b"SS1 9 5 10 1 3 B comm op=send g=0 n=1 p=x"),
            Err(MarkerError::Number { field: "p", .. })
        ));
    }

    #[test]
    fn metadata_round_trips() {
        let text = "SS1 0 5 10 0 0 M - local_rank=0 workers=2 framework=torch-1.13.1";
        let m = parse(text.as_bytes()).unwrap();
        assert_eq!(format(&m), text);
    }

    #[test]
    fn rejects_malformed_markers_with_a_reason() {
        assert!(matches!(parse(b"XX9 1 2 3"), Err(MarkerError::Protocol(_))));
        assert_eq!(parse(b"SS1 1 2 3"), Err(MarkerError::Fields(4)));
        assert!(matches!(
            parse(b"SS1 1 x 3 0 0 B data"),
            Err(MarkerError::Number { field: "t_ns", .. })
        ));
        assert!(matches!(
            parse(b"SS1 1 2 3 0 0 Q data"),
            Err(MarkerError::Event(_))
        ));
        assert!(matches!(
            parse(b"SS1 1 2 3 0 0 B da\xffta"),
            Err(MarkerError::NotText)
        ));
        assert!(matches!(
            parse(b"SS1 1 2 3 0 0 B bad/phase"),
            Err(MarkerError::Name(_))
        ));
        assert!(matches!(
            parse(b"SS1 1 2 3 -7 0 B data"),
            Err(MarkerError::Number { field: "rank", .. })
        ));
        assert!(matches!(
            parse(b"SS1 1 2 3 0 0 M - novalue"),
            Err(MarkerError::Meta(_))
        ));
        assert!(matches!(
            parse(&[b'S'; 5000]),
            Err(MarkerError::TooLong(5000))
        ));
    }
}
