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
                let bytes = if binary {
                    let mut frame = stallscope_analysis::view::binary::encode_frame(&msg);
                    frame.drain(..4); // the parts carry the length
                    frame
                } else {
                    json_line(&msg).into_bytes()
                };
                let parts: Vec<&[u8]> = bytes.chunks(wire::FEED_PART).collect();
                for (i, part) in parts.iter().enumerate() {
                    let last = i + 1 == parts.len();
                    let msg = CollectorMsg::Feed {
                        part: part.to_vec(),
                        last,
                    };
                    tokio::time::timeout(VIEWER_WRITE_TIMEOUT, send(&mut w, &msg))
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
