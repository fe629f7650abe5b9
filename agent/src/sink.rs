//! Where the agent's threads put what they produce.
//!
//! A channel wakes its reader for every message; at 100 samples a second plus every marker,
//! those wake-ups cost more CPU than the reads themselves on a small VM. A [`Mailbox`] lets
//! the producer put without waking anyone, and the reader drains it on its own schedule
//! (the recorder does every 100 ms). Channels stay available for tests and simple callers.

use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

/// Takes items from a producer thread.
pub trait Sink<T>: Send + 'static {
    /// Puts one item; `false` when nobody will ever read it (the producer should stop).
    fn put(&self, item: T) -> bool;
}

impl<T: Send + 'static> Sink<T> for Sender<T> {
    fn put(&self, item: T) -> bool {
        self.send(item).is_ok()
    }
}

/// A shared queue drained by its reader when it chooses; putting never wakes the reader.
#[derive(Debug)]
pub struct Mailbox<T> {
    items: Arc<Mutex<Vec<T>>>,
}

impl<T> Clone for Mailbox<T> {
    fn clone(&self) -> Self {
        Mailbox {
            items: self.items.clone(),
        }
    }
}

impl<T> Default for Mailbox<T> {
    fn default() -> Self {
        Mailbox {
            items: Arc::default(),
        }
    }
}

impl<T> Mailbox<T> {
    /// Appends an item.
    pub fn push(&self, item: T) {
        if let Ok(mut v) = self.items.lock() {
            v.push(item);
        }
    }

    /// Takes every item put so far, oldest first. The mailbox keeps room for as many, so that
    /// a steady producer does not regrow it between two drains.
    pub fn take_all(&self) -> Vec<T> {
        self.items
            .lock()
            .map(|mut v| {
                let room = v.len();
                std::mem::replace(&mut *v, Vec::with_capacity(room))
            })
            .unwrap_or_default()
    }
}

impl<T: Send + 'static> Sink<T> for Mailbox<T> {
    fn put(&self, item: T) -> bool {
        self.push(item);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mailbox_hands_over_everything_in_order() {
        let m = Mailbox::default();
        let producer = m.clone();
        std::thread::spawn(move || {
            for i in 0..100 {
                producer.put(i);
            }
        })
        .join()
        .unwrap();
        assert_eq!(m.take_all(), (0..100).collect::<Vec<_>>());
        assert!(m.take_all().is_empty());
    }
}
