//! A viewer's connection: after its Watch and the Welcome, the job's live model as the feed
//! socket's JSON lines, each in parts small enough for one message.

use super::*;

/// Between two looks at a viewer's queue of feed messages.
const WATCH_POLL: Duration = Duration::from_millis(50);

/// A viewer: the live model's feed lines, in parts, until the job ends or the viewer falls
/// behind (the hub drops it) or goes away.
pub(super) async fn watch<W: AsyncWrite + Unpin>(
    mut w: W,
    hub: &FeedHub,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), ConnError> {
    let feed = hub.subscribe(SUBSCRIBER_QUEUE);
    loop {
        match feed.try_recv() {
            Ok(msg) => {
                let line = json_line(&msg);
                let parts: Vec<&[u8]> = line.as_bytes().chunks(wire::FEED_PART).collect();
                for (i, part) in parts.iter().enumerate() {
                    let last = i + 1 == parts.len();
                    let msg = CollectorMsg::Feed {
                        part: part.to_vec(),
                        last,
                    };
                    send(&mut w, &msg).await?;
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
