//! The model a dashboard draws while a feed runs: a thread folds the feed's messages into it
//! as they come, so the feed is read at its own pace whatever the terminal does (a stalled
//! terminal delays frames, never the feed, and the run never waits on either).

use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, MutexGuard};

use stallscope_agent::node::feed::FeedMessage;
use stallscope_agent::node::feed_client::FeedClient;
use stallscope_analysis::view::JobView;

/// Where the feed stands.
#[derive(Clone, Debug, PartialEq)]
pub enum FeedStatus {
    /// Messages are arriving.
    Live,
    /// The run ended.
    Ended,
    /// The feed broke off (why).
    Lost(String),
}

/// The model and the feed's status, as the folding thread leaves them.
pub struct Live {
    /// The model, once the snapshot arrived.
    pub view: Option<JobView>,
    /// Where the feed stands.
    pub status: FeedStatus,
    /// Messages folded so far: a dashboard redraws when this changed.
    pub messages: u64,
}

/// A [`Live`] shared between the folding thread and the dashboard: the job model as a client
/// follows it (the journal's own is `analysis::view::LiveModel`).
#[derive(Clone)]
pub struct FollowedModel(Arc<Mutex<Live>>);

impl FollowedModel {
    fn new() -> FollowedModel {
        FollowedModel(Arc::new(Mutex::new(Live {
            view: None,
            status: FeedStatus::Live,
            messages: 0,
        })))
    }

    /// The model, locked: hold it only to draw or to take a key.
    pub fn lock(&self) -> MutexGuard<'_, Live> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn fold(&self, msg: FeedMessage) {
        let mut live = self.lock();
        live.messages += 1;
        match msg {
            FeedMessage::Snapshot(v) => live.view = Some(Arc::unwrap_or_clone(v)),
            FeedMessage::Update(u) => {
                if let Some(v) = live.view.as_mut() {
                    v.apply(Arc::unwrap_or_clone(u));
                }
            }
            FeedMessage::End => live.status = FeedStatus::Ended,
        }
    }

    /// Follows a feed socket or a collector's port on a thread of its own.
    pub fn follow_client(client: FeedClient) -> std::io::Result<FollowedModel> {
        let model = FollowedModel::new();
        let m = model.clone();
        let mut client = client.without_model();
        std::thread::Builder::new()
            .name("stallscope-top-feed".into())
            .spawn(move || loop {
                match client.next_message() {
                    Some(Ok((_, msg))) => {
                        let end = matches!(msg, FeedMessage::End);
                        m.fold(msg);
                        if end {
                            return;
                        }
                    }
                    Some(Err(e)) => {
                        m.lock().status = FeedStatus::Lost(e.to_string());
                        return;
                    }
                    None => {
                        let mut live = m.lock();
                        if live.status == FeedStatus::Live {
                            live.status = FeedStatus::Lost("the feed closed".into());
                        }
                        return;
                    }
                }
            })?;
        Ok(model)
    }

    /// Follows an in-process feed (`run --tui`) on a thread of its own.
    pub fn follow_hub(rx: Receiver<FeedMessage>) -> std::io::Result<FollowedModel> {
        let model = FollowedModel::new();
        let m = model.clone();
        std::thread::Builder::new()
            .name("stallscope-top-feed".into())
            .spawn(move || {
                for msg in rx {
                    let end = matches!(msg, FeedMessage::End);
                    m.fold(msg);
                    if end {
                        return;
                    }
                }
            })?;
        Ok(model)
    }
}
