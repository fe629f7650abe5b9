//! A viewer's connection: after its Watch and the Welcome, the job's live model as the feed
//! socket's JSON lines, each in parts small enough for one message; after a WatchBinary, as
//! binary frames' payloads ([`stallscope_analysis::view::binary`]) in the same parts.
//!
//! A viewer that stops reading (a stopped `stallscope feed | less`, a dead host without a
//! reset) must not hold its task, its socket and its subscription for ever: a part not written
//! within [`VIEWER_WRITE_TIMEOUT`] ends the connection, as the feed socket's 2 s write timeout
//! does on a node.

use super::*;

/// Between two looks at a viewer's queue of feed messages.
const WATCH_POLL: Duration = Duration::from_millis(50);

/// How long one feed part may wait to be written to a viewer before the viewer is dropped.
pub(super) const VIEWER_WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// A viewer: the live model's feed lines, in parts, until the job ends or the viewer falls
/// behind (the hub drops it) or goes away.
pub(super) async fn watch<W: AsyncWrite + Unpin>(
    mut w: W,
    hub: &FeedHub,
    mut shutdown: watch::Receiver<bool>,
    binary: bool,
) -> Result<(), ConnError> {
    let feed = hub.subscribe(SUBSCRIBER_QUEUE);
    loop {
        match feed.try_recv() {
            Ok(msg) => {
                let (bytes, skip) = if binary {
                    // The parts carry the length: the frame's own is left out.
                    (stallscope_analysis::view::binary::encode_frame(&msg), 4)
                } else {
                    (json_line(&msg).into_bytes(), 0)
                };
                let parts: Vec<&[u8]> = bytes
                    .get(skip..)
                    .unwrap_or_default()
                    .chunks(wire::FEED_PART)
                    .collect();
                let mut message = Vec::new();
                for (i, part) in parts.iter().enumerate() {
                    let last = i + 1 == parts.len();
                    feed_message(part, last, &mut message);
                    tokio::time::timeout(VIEWER_WRITE_TIMEOUT, send_bytes(&mut w, &message))
                        .await
                        .map_err(|_| {
                            ConnError::Refused(format!(
                                "the viewer read nothing for {} s and was dropped",
                                VIEWER_WRITE_TIMEOUT.as_secs()
                            ))
                        })??;
                }
                if matches!(msg, FeedMessage::End) {
                    return Ok(());
                }
            }
            Err(TryRecvError::Empty) => {
                tokio::select! {
                    _ = tokio::time::sleep(WATCH_POLL) => {}
                    _ = shutdown.changed() => return Ok(()),
                }
            }
            Err(TryRecvError::Disconnected) => {
                return Err(ConnError::Refused(
                    "the viewer fell behind the live model and was dropped".into(),
                ))
            }
        }
    }
}

/// Variant index of [`CollectorMsg::Feed`] in postcard's encoding.
const FEED_VARIANT: u64 = 4;

/// Makes `out` the message [`wire::encode`] makes of `CollectorMsg::Feed { part, last }`
/// (length prefix, variant, the part's length and bytes, `last`), without the part's copy
/// into a message nor a serializer's call per byte: a viewer of 10,000 ranks is sent
/// hundreds of kilobytes a second.
fn feed_message(part: &[u8], last: bool, out: &mut Vec<u8>) {
    out.clear();
    out.reserve(4 + 1 + 10 + part.len() + 1);
    out.extend_from_slice(&[0; 4]);
    push_varint(out, FEED_VARIANT);
    push_varint(out, part.len() as u64);
    out.extend_from_slice(part);
    out.push(u8::from(last));
    let len = (out.len() - 4) as u32;
    out[..4].copy_from_slice(&len.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_feed_message_is_the_wire_encoding_of_the_feed_variant() {
        let mut out = Vec::new();
        for len in [0usize, 1, 127, 128, 300, 16_384, 16_385, wire::FEED_PART] {
            let part: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            for last in [false, true] {
                feed_message(&part, last, &mut out);
                let want = wire::encode(&CollectorMsg::Feed {
                    part: part.clone(),
                    last,
                });
                assert_eq!(out, want, "{len} bytes, last {last}");
            }
        }
    }
}
