//! The agent ↔ collector protocol: messages, and their framing on a TCP stream.
//!
//! Every message is a big-endian `u32` length followed by that many bytes of postcard. The
//! length is bounded ([`MAX_MESSAGE`]) so a hostile or broken peer cannot make the collector
//! allocate more than that; a message that does not decode ends that one connection with a
//! [`CollectorMsg::Refused`] that says why, and nothing else.
//!
//! A connection goes: the collector's [`CollectorMsg::Challenge`] (a fresh random nonce) →
//! the agent's [`Hello`] (protocol version, node name, and the proof that it holds the token:
//! HMAC-SHA256, keyed with the token, of its [`Role`] and the nonce, [`prove`]; the token
//! itself never crosses the network, and a proof is good for one role and one nonce only) → the collector's clock exchanges ([`CollectorMsg::Ping`] / [`AgentMsg::Pong`], NTP's four
//! timestamps) → [`CollectorMsg::Welcome`] or [`CollectorMsg::Refused`] → records, each with
//! the agent's sequence number, acknowledged by [`CollectorMsg::Ack`] once the collector has
//! written them to its profile; pings go on every few seconds to follow drift. The agent keeps
//! every record until it is acknowledged and sends the unacknowledged ones again after a
//! reconnect, so a collector that dies loses nothing the agent's buffer still holds; the
//! collector drops records it has already seen (by node, rank and iteration).
//!
//! The Hello puts the protocol version first, so a collector can name the version of an agent
//! it cannot otherwise understand. Until an agent is welcomed, the collector reads messages of
//! at most [`MAX_PREAUTH`] bytes: a stranger cannot make it allocate more than that.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::frame::Frame;
use crate::Nanos;

mod record;
pub use record::{encode_record, take_agent_msg};
pub(crate) use record::{push_opt, push_varint, Reader};

/// Version of this protocol; both sides must speak the same one. 2: breakdowns may carry the
/// CUDA-event evidence (`Basis::Gpu*` beyond `H2dPcieBytes`), which version 1 cannot decode.
/// 3: iterations travel as [`Frame::NodeReport`], with the rank's GPU readings. 4: agents also
/// send their node's resources ([`Frame::NodeResources`]). 5: and their GPUs' names
/// ([`Frame::NodeGpus`]) and bytes per NIC ([`Frame::NodeNics`]). 6: the collector challenges,
/// the agent proves it holds the token ([`prove`]) instead of sending it. 7: agents forward
/// their ranks' facts for the advisor ([`Frame::NodeMeta`]). 8: the proof binds the peer's
/// role ([`Role`]), so a viewer's proof cannot be relayed as an agent's. 9: agents send their
/// node's RDMA bytes ([`Frame::NodeRdma`]). 10: and their TCP flows ([`Frame::NodeFlows`]);
/// the collector asks where the ranks stand when the job stalls ([`CollectorMsg::Stacks`]),
/// agents answer with [`Frame::NodeHang`]. 11: a viewer's binary feed is
/// `stallscope.feed-bin/2` (the summary's ranks in binary, [`crate::view::binary`]).
pub const PROTOCOL_VERSION: u16 = 11;

/// bytes, the largest message either side accepts (1 MiB).
pub const MAX_MESSAGE: u32 = 1 << 20;

/// bytes, the largest message the collector reads from a peer it has not welcomed yet (a
/// Hello, a clock answer).
pub const MAX_PREAUTH: u32 = 4 << 10;

/// bytes of a challenge's nonce.
pub const NONCE_BYTES: usize = 32;

/// TCP port the collector listens on unless told otherwise.
pub const DEFAULT_PORT: u16 = 7571;

/// An agent introduces itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// [`PROTOCOL_VERSION`] of the agent. First, so that it decodes whatever follows.
    pub protocol: u16,
    /// HMAC-SHA256 of the collector's nonce keyed with the shared token ([`prove`]); empty
    /// when the agent has no token.
    pub proof: Vec<u8>,
    /// The node's name (host name unless given).
    pub node: String,
    /// stallscope version of the agent.
    pub agent_version: String,
}

/// What an agent sends.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum AgentMsg {
    /// First message of a connection.
    Hello(Hello),
    /// Answer to a ping: `t1` echoed, `t2` when the ping arrived and `t3` when the pong left,
    /// both ns on the agent's clock.
    Pong {
        /// ns, the collector's clock, from the ping.
        t1: Nanos,
        /// ns, the agent's clock.
        t2: Nanos,
        /// ns, the agent's clock.
        t3: Nanos,
    },
    /// A frame for the job, numbered from 0 by the agent over its whole life.
    Record {
        /// Sequence number, one more than the previous record's.
        seq: u64,
        /// [`Frame::NodeReport`], [`Frame::NodeIteration`] or [`Frame::NodeHealth`].
        frame: Frame,
    },
    /// The agent is shutting down after sending everything.
    Bye,
    /// Instead of a Hello: a viewer (`stallscope feed HOST:PORT`, `stallscope top`) asks for
    /// the job's live model; after the Welcome it is sent [`CollectorMsg::Feed`] parts.
    Watch(Hello),
    /// Instead of a Hello: a viewer that reads the feed's binary form
    /// (`crate::view::binary`, what `stallscope top` asks for): the [`CollectorMsg::Feed`] parts
    /// then make up binary frames' payloads instead of JSON lines. The proof is a viewer's.
    /// Last, so that the other variants keep their tags; a collector that predates it refuses
    /// it, and the viewer asks again with a [`AgentMsg::Watch`].
    WatchBinary(Hello),
}

/// What the collector sends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CollectorMsg {
    /// The agent may send records.
    Welcome {
        /// stallscope version of the collector.
        collector_version: String,
    },
    /// The connection is refused, and why; the collector closes it.
    Refused {
        /// For the agent's user.
        reason: String,
    },
    /// A clock exchange: `t1` is ns on the collector's clock.
    Ping {
        /// ns.
        t1: Nanos,
    },
    /// Every record up to and including `upto` is in the collector's profile.
    Ack {
        /// Sequence number.
        upto: u64,
    },
    /// To a viewer: part of one line of the live feed (`stallscope.feed/1`, the same JSON
    /// lines as the feed socket); a line is its parts in order, up to the one with `last`.
    Feed {
        /// UTF-8 bytes of the line, at most [`FEED_PART`]. As bytes: the same encoding as a
        /// sequence of `u8` in postcard, read and written in one piece instead of a call per
        /// byte.
        #[serde(with = "bytes")]
        part: Vec<u8>,
        /// Whether the line ends here.
        last: bool,
    },
    /// First message of every connection: the nonce the Hello's proof answers. Last, so
    /// that the other variants keep their tags.
    Challenge {
        /// [`NONCE_BYTES`] random bytes, fresh per connection.
        nonce: Vec<u8>,
    },
    /// To an agent: no rank of the job finished an iteration for the hang threshold; say
    /// where this node's ranks stand, with their stacks ([`Frame::NodeHang`] answering `id`).
    /// Last, so that the other variants keep their tags.
    Stacks {
        /// The request, answered as [`NodeHang::id`](crate::hang::NodeHang::id).
        id: u64,
    },
}

/// A `Vec<u8>` serialised as bytes: in postcard a length and the bytes, as for a sequence of
/// `u8`, but in one piece (a viewer of 10,000 ranks reads hundreds of kilobytes a second of
/// feed parts; serde's sequence took a visitor's call per byte).
mod bytes {
    use serde::{de, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(v)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        struct Bytes;
        impl<'de> de::Visitor<'de> for Bytes {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("bytes")
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                Ok(v.to_vec())
            }
            fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
                Ok(v)
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
                while let Some(b) = seq.next_element()? {
                    out.push(b);
                }
                Ok(out)
            }
        }
        d.deserialize_byte_buf(Bytes)
    }
}

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// What a proof of the token is for: the MAC covers it, so a proof made for one role (say a
/// viewer's, given to a spoofed collector) does not pass as the other's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// An agent's [`AgentMsg::Hello`]: it sends records.
    Agent,
    /// A viewer's [`AgentMsg::Watch`]: it is sent the live model.
    Viewer,
}

impl Role {
    /// The bytes the MAC covers before the nonce: the role, and that the nonce is the
    /// collector's challenge answered by its peer (the only direction a proof goes).
    fn context(self) -> &'static [u8] {
        match self {
            Role::Agent => b"stallscope v8 agent answers collector nonce\0",
            Role::Viewer => b"stallscope v8 viewer answers collector nonce\0",
        }
    }
}

fn mac(token: &str, role: Role, nonce: &[u8]) -> HmacSha256 {
    use hmac::Mac;
    let mut mac = HmacSha256::new_from_slice(token.as_bytes()).expect("HMAC takes any key");
    mac.update(role.context());
    mac.update(nonce);
    mac
}

/// The proof that the sender holds `token`, as `role`: HMAC-SHA256, keyed with the token, of
/// the role's context and the collector's `nonce`. Empty without a token.
pub fn prove(token: &str, role: Role, nonce: &[u8]) -> Vec<u8> {
    use hmac::Mac;
    if token.is_empty() {
        return Vec::new();
    }
    mac(token, role, nonce).finalize().into_bytes().to_vec()
}

/// Whether `proof` proves `token` for `nonce` as `role`, compared in constant time.
pub fn verify(token: &str, role: Role, nonce: &[u8], proof: &[u8]) -> bool {
    use hmac::Mac;
    mac(token, role, nonce).verify_slice(proof).is_ok()
}

/// bytes of a feed line per [`CollectorMsg::Feed`] message: a snapshot of a large job is
/// tens of MiB, so it travels in parts below [`MAX_MESSAGE`].
pub const FEED_PART: usize = 256 * 1024;

/// Why a message could not be framed or read.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The length prefix is over the limit (`MAX_MESSAGE`, or `MAX_PREAUTH` before a peer is
    /// welcomed).
    #[error("a message of {len} bytes is over the {max}-byte limit")]
    TooLarge {
        /// bytes announced.
        len: u32,
        /// bytes allowed.
        max: u32,
    },
    /// The payload is not a message of this protocol.
    #[error("malformed message ({0})")]
    Malformed(#[from] postcard::Error),
}

/// The bytes to write for one message: length prefix and payload.
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(msg, &mut out);
    out
}

/// Appends [`encode`]'s bytes of `msg` to `out`: the payload written in place after its
/// length, not copied there (a sender of many messages reuses one buffer).
pub fn encode_into<T: Serialize>(msg: &T, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    *out = postcard::to_extend(msg, std::mem::take(out)).expect("messages always encode");
    let len = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&len.to_be_bytes());
}

/// The payload length a prefix announces, refused when over [`MAX_MESSAGE`].
pub fn payload_len(prefix: [u8; 4]) -> Result<usize, WireError> {
    payload_len_within(prefix, MAX_MESSAGE)
}

/// The payload length a prefix announces, refused when over `max` bytes.
pub fn payload_len_within(prefix: [u8; 4], max: u32) -> Result<usize, WireError> {
    let len = u32::from_be_bytes(prefix);
    if len > max {
        return Err(WireError::TooLarge { len, max });
    }
    Ok(len as usize)
}

/// Decodes one payload.
pub fn decode<T: DeserializeOwned>(payload: &[u8]) -> Result<T, WireError> {
    Ok(postcard::from_bytes(payload)?)
}

/// The protocol version a first message announces, if it is a Hello, a Watch or a
/// WatchBinary at all (its variant tag and version decode), whatever follows.
pub fn hello_version(payload: &[u8]) -> Option<u16> {
    let (tag, rest) = postcard::take_from_bytes::<u32>(payload).ok()?;
    if tag != 0 && tag != 4 && tag != 5 {
        return None;
    }
    postcard::take_from_bytes::<u16>(rest).ok().map(|(v, _)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(protocol: u16) -> AgentMsg {
        AgentMsg::Hello(Hello {
            protocol,
            proof: prove("t", Role::Agent, &[1; NONCE_BYTES]),
            node: "n".into(),
            agent_version: "0".into(),
        })
    }

    #[test]
    fn a_message_round_trips_through_its_framing() {
        let bytes = encode(&hello(PROTOCOL_VERSION));
        let len = payload_len(bytes[..4].try_into().unwrap()).unwrap();
        assert_eq!(len, bytes.len() - 4);
        let back: AgentMsg = decode(&bytes[4..]).unwrap();
        assert_eq!(back, hello(PROTOCOL_VERSION));
    }

    /// Messages appended one after the other to one buffer are each the length, then the
    /// payload, as a stream carries them.
    #[test]
    fn messages_encoded_into_one_buffer_are_their_framings_one_after_the_other() {
        let msgs = [
            hello(PROTOCOL_VERSION),
            AgentMsg::Pong {
                t1: 1,
                t2: 2,
                t3: 3,
            },
            AgentMsg::Bye,
        ];
        let mut out = vec![7u8];
        let mut want = vec![7u8];
        for m in &msgs {
            encode_into(m, &mut out);
            let payload = postcard::to_allocvec(m).unwrap();
            want.extend_from_slice(&(payload.len() as u32).to_be_bytes());
            want.extend_from_slice(&payload);
        }
        assert_eq!(out, want);
        let first = u32::from_be_bytes(want[1..5].try_into().unwrap()) as usize;
        assert_eq!(encode(&msgs[0]), want[1..5 + first]);
    }

    /// A feed part is written and read as bytes: the same bytes as a sequence of `u8`.
    #[test]
    fn a_feed_part_is_the_encoding_of_its_bytes_as_a_sequence() {
        #[derive(Serialize)]
        enum Seq {
            _Welcome,
            _Refused,
            _Ping,
            _Ack,
            Feed { part: Vec<u8>, last: bool },
        }
        for len in [0usize, 1, 127, 128, 300, 70_000] {
            let part: Vec<u8> = (0..len).map(|i| (i * 13) as u8).collect();
            let msg = CollectorMsg::Feed {
                part: part.clone(),
                last: len % 2 == 0,
            };
            let bytes = postcard::to_allocvec(&msg).unwrap();
            let seq = Seq::Feed {
                part,
                last: len % 2 == 0,
            };
            assert_eq!(bytes, postcard::to_allocvec(&seq).unwrap(), "{len} bytes");
            assert_eq!(decode::<CollectorMsg>(&bytes).unwrap(), msg);
        }
    }

    #[test]
    fn an_oversized_length_is_refused_before_any_allocation() {
        let err = payload_len((MAX_MESSAGE + 1).to_be_bytes()).unwrap_err();
        assert!(err.to_string().contains("over the"), "{err}");
    }

    /// Issue 17, item 3: the token never crosses the network; a proof answers one nonce only.
    #[test]
    fn a_proof_shows_the_token_without_giving_it() {
        let (a, b) = ([1u8; NONCE_BYTES], [2u8; NONCE_BYTES]);
        let proof = prove("s3cret-token", Role::Agent, &a);
        assert_eq!(proof.len(), 32);
        assert!(verify("s3cret-token", Role::Agent, &a, &proof));
        assert!(
            !verify("s3cret-token", Role::Agent, &b, &proof),
            "replayed for another nonce"
        );
        assert!(!verify("guess", Role::Agent, &a, &proof));
        assert!(!verify("s3cret-token", Role::Agent, &a, &[]));
        let hello = encode(&AgentMsg::Hello(Hello {
            protocol: PROTOCOL_VERSION,
            proof,
            node: "n".into(),
            agent_version: "0".into(),
        }));
        assert!(!hello.windows(12).any(|w| w == b"s3cret-token"));
        assert!(prove("", Role::Agent, &a).is_empty(), "no token, no proof");
        let err = payload_len_within(4097u32.to_be_bytes(), MAX_PREAUTH).unwrap_err();
        assert!(
            err.to_string().contains("over the 4096-byte limit"),
            "{err}"
        );
    }

    /// Issue 30, item 12: a viewer's proof (say, given to a spoofed collector that relays
    /// its nonce) does not pass as an agent's, nor the other way, nor a bare HMAC of the
    /// nonce as protocol 7 made it.
    #[test]
    fn a_proof_is_good_for_one_role_only() {
        use hmac::Mac;
        let nonce = [3u8; NONCE_BYTES];
        let viewer = prove("tok", Role::Viewer, &nonce);
        let agent = prove("tok", Role::Agent, &nonce);
        assert!(verify("tok", Role::Viewer, &nonce, &viewer));
        assert!(
            !verify("tok", Role::Agent, &nonce, &viewer),
            "relayed as an agent's"
        );
        assert!(
            !verify("tok", Role::Viewer, &nonce, &agent),
            "relayed as a viewer's"
        );
        let mut bare = HmacSha256::new_from_slice(b"tok").unwrap();
        bare.update(&nonce);
        let bare = bare.finalize().into_bytes();
        assert!(
            !verify("tok", Role::Agent, &nonce, &bare),
            "protocol 7's proof"
        );
    }

    #[test]
    fn garbage_is_malformed_not_a_panic() {
        let r: Result<AgentMsg, _> = decode(&[0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
        assert!(matches!(r, Err(WireError::Malformed(_))));
    }

    #[test]
    fn the_version_of_a_future_hello_can_be_named() {
        let bytes = encode(&hello(7));
        assert_eq!(hello_version(&bytes[4..]), Some(7));
        let pong = encode(&AgentMsg::Pong {
            t1: 1,
            t2: 2,
            t3: 3,
        });
        assert_eq!(hello_version(&pong[4..]), None);
    }
}
