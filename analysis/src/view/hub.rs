//! The hub between the journal's owner, which publishes the live model every attribution
//! round (at most 10 a second), and its subscribers: the feed socket's clients, and views in
//! the same process. A subscriber first gets a snapshot of the whole model, then the updates.
//! Each subscriber has a bounded queue; one that falls behind is dropped, so a stalled client
//! never slows the recorder, and nothing is copied while nobody listens.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use super::{JobView, ViewUpdate};

/// Messages queued per subscriber before it counts as stalled and is dropped (10 s of
/// updates).
pub const SUBSCRIBER_QUEUE: usize = 100;

/// One message of the feed.
#[derive(Clone, Debug)]
pub enum FeedMessage {
    /// The whole model: the first message a subscriber gets.
    Snapshot(Arc<JobView>),
    /// What changed since the previous message.
    Update(Arc<ViewUpdate>),
    /// The run ended; nothing follows.
    End,
}

struct Subscriber {
    tx: SyncSender<FeedMessage>,
    has_snapshot: bool,
}

/// Where the journal's owner publishes the model and subscribers take it.
#[derive(Default)]
pub struct FeedHub {
    subscribers: Mutex<Vec<Subscriber>>,
    ended: AtomicBool,
}

impl FeedHub {
    /// A new subscriber, with a queue of `queue` messages.
    pub fn subscribe(&self, queue: usize) -> Receiver<FeedMessage> {
        let (tx, rx) = sync_channel(queue.max(2));
        if self.ended.load(Ordering::Acquire) {
            let _ = tx.try_send(FeedMessage::End);
        } else if let Ok(mut subs) = self.subscribers.lock() {
            subs.push(Subscriber {
                tx,
                has_snapshot: false,
            });
        }
        rx
    }

    /// Subscribers now.
    pub fn subscribers(&self) -> usize {
        self.subscribers.lock().map_or(0, |s| s.len())
    }

    /// Publishes one round: `view` as it stands after `update`. New subscribers get `view`
    /// whole, the others `update`; a subscriber whose queue is full is dropped.
    pub fn publish(&self, view: &JobView, update: ViewUpdate) {
        let Ok(mut subs) = self.subscribers.lock() else {
            return;
        };
        if subs.is_empty() {
            return;
        }
        let update = Arc::new(update);
        let mut snapshot: Option<Arc<JobView>> = None;
        subs.retain_mut(|s| {
            let msg = if s.has_snapshot {
                FeedMessage::Update(update.clone())
            } else {
                s.has_snapshot = true;
                FeedMessage::Snapshot(
                    snapshot
                        .get_or_insert_with(|| Arc::new(view.clone()))
                        .clone(),
                )
            };
            match s.tx.try_send(msg) {
                Ok(()) => true,
                Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => false,
            }
        });
    }

    /// Tells every subscriber the run ended, and any later one at once.
    pub fn end(&self) {
        self.ended.store(true, Ordering::Release);
        if let Ok(mut subs) = self.subscribers.lock() {
            for s in subs.drain(..) {
                let _ = s.tx.try_send(FeedMessage::End);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subscriber_gets_a_snapshot_then_updates_and_a_stalled_one_is_dropped() {
        let hub = FeedHub::default();
        let view = JobView::new("train");
        hub.publish(&view, ViewUpdate::default());
        let live = hub.subscribe(4);
        let stalled = hub.subscribe(4);
        for _ in 0..3 {
            hub.publish(&view, ViewUpdate::default());
            let _ = live.try_recv().expect("a message each round");
        }
        assert_eq!(hub.subscribers(), 2);
        for _ in 0..4 {
            hub.publish(&view, ViewUpdate::default());
            let _ = live.try_recv();
        }
        assert_eq!(
            hub.subscribers(),
            1,
            "the subscriber that read nothing is dropped"
        );
        let first = stalled.try_recv().expect("it had been sent the snapshot");
        assert!(matches!(first, FeedMessage::Snapshot(_)));
        hub.end();
        assert!(matches!(live.recv(), Ok(FeedMessage::End)));
        assert!(matches!(hub.subscribe(4).recv(), Ok(FeedMessage::End)));
    }
}

/// One line of the feed's JSON form.
#[derive(serde::Serialize)]
#[serde(rename_all = "lowercase")]
enum Line<'a> {
    Snapshot(&'a JobView),
    Update(&'a ViewUpdate),
    End(bool),
}

/// One line of the feed, as read.
#[derive(serde::Deserialize)]
#[serde(rename_all = "lowercase")]
enum ReadLine {
    Snapshot(Box<JobView>),
    Update(Box<ViewUpdate>),
    End(serde::de::IgnoredAny),
}

/// The JSON line of a message, without its newline: `{"snapshot":{…}}`, `{"update":{…}}` or
/// `{"end":true}` (`stallscope.feed/1`, documented in the README).
pub fn json_line(msg: &FeedMessage) -> String {
    let line = match msg {
        FeedMessage::Snapshot(v) => Line::Snapshot(v),
        FeedMessage::Update(u) => Line::Update(u),
        FeedMessage::End => Line::End(true),
    };
    serde_json::to_string(&line).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// A message from its JSON line; `None` when the line is not one.
pub fn parse_line(line: &str) -> Option<FeedMessage> {
    Some(match serde_json::from_str::<ReadLine>(line).ok()? {
        ReadLine::Snapshot(v) => FeedMessage::Snapshot(Arc::new(*v)),
        ReadLine::Update(u) => FeedMessage::Update(Arc::new(*u)),
        ReadLine::End(_) => FeedMessage::End,
    })
}

impl std::fmt::Debug for FeedHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeedHub")
            .field("subscribers", &self.subscribers())
            .finish()
    }
}
