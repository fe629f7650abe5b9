//! Whether a training loop is waiting for its data loaders: the marker listener tells the
//! sampler, so that the loaders are read every tick only when it matters.
//!
//! A loop's DataLoader workers are read for one thing: what they were doing while the loop
//! waited for them (a `data` phase: preparing, or blocked reading). In a compute-bound job the
//! loop waits for data a few percent of the time, and the workers (four on the 2-rank example,
//! with their pool threads) were two thirds of the sampler's `/proc` reads, every tick. Once a
//! loop marks its data waits, the workers are read every tick only while some loop is inside
//! one, on the first tick after a wait began (however short it was), and otherwise every
//! [`IDLE_EVERY`] ticks, which keeps their CPU counters (interpolated between readings) and
//! the views of them current. Before any loop has marked a data wait (a loop that marks only
//! its steps, or none) the workers are read every tick, as the unmarked rule needs.
//!
//! The listener's thread updates the state as markers pass (a few atomics; the per-loop set is
//! its own), and the sampler reads it with two atomic loads a tick: nothing here waits.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use stallscope_analysis::marker::{phase, Marker, MarkerEvent};

use crate::markers::Datagram;
use crate::sink::Sink;
use crate::sources::LoaderTick;

/// The environment variable that, set to `off`, has the loaders read every tick whatever the
/// loops do (to compare, or should a job's data waits be marked wrongly).
pub const ENV_SWITCH: &str = "STALLSCOPE_LOADER_GATE";

/// Ticks between two readings of the loaders while no loop waits for them (10 Hz at the
/// default 100 Hz).
pub const IDLE_EVERY: u64 = 10;

/// The loops' data waits, as the markers tell them; cloned between the listener and the
/// sampler.
#[derive(Clone, Debug, Default)]
pub struct LoaderWaits {
    state: Arc<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Some loop has marked a data wait: the gate is in force.
    marked: AtomicBool,
    /// Loops inside a data wait now.
    waiting: AtomicU32,
    /// A data wait began since the sampler last asked.
    began: AtomicBool,
    /// The loops inside a data wait (the listener's alone; locked only on a data marker).
    inside: Mutex<BTreeSet<u32>>,
}

impl LoaderWaits {
    /// Whether the gate is on: [`ENV_SWITCH`] is not `off`.
    pub fn enabled() -> bool {
        std::env::var(ENV_SWITCH).map_or(true, |v| v != "off")
    }

    /// Takes note of `m`: a data wait beginning or ending. Other markers change nothing.
    pub fn observe(&self, m: &Marker) {
        let (name, begins) = match &m.event {
            MarkerEvent::Begin(p) | MarkerEvent::BeginWaiting(p, _) => (p, true),
            MarkerEvent::End(p) => (p, false),
            _ => return,
        };
        if name != phase::DATA {
            return;
        }
        let s = &self.state;
        let Ok(mut inside) = s.inside.lock() else {
            return;
        };
        if begins {
            inside.insert(m.pid);
            s.began.store(true, Ordering::Relaxed);
            s.marked.store(true, Ordering::Relaxed);
        } else {
            inside.remove(&m.pid);
        }
        s.waiting.store(inside.len() as u32, Ordering::Relaxed);
    }

    /// Whether the loaders are read at tick number `tick`: at every source's own rate until a
    /// loop marks a data wait; then while one waits, on the first tick after one began, and
    /// every [`IDLE_EVERY`] ticks.
    pub fn tick(&self, tick: u64) -> LoaderTick {
        let s = &self.state;
        let began = s.began.swap(false, Ordering::Relaxed);
        if !s.marked.load(Ordering::Relaxed) {
            LoaderTick::Always
        } else if began || s.waiting.load(Ordering::Relaxed) > 0 || tick % IDLE_EVERY == 0 {
            LoaderTick::Due
        } else {
            LoaderTick::Skip
        }
    }
}

/// A marker sink that tells [`LoaderWaits`] of each marker it hands on.
#[derive(Clone)]
pub struct ObservingLoaderWaits<S> {
    /// Where the markers go.
    pub inner: S,
    /// What is told.
    pub waits: LoaderWaits,
}

impl<S: Sink<Datagram>> Sink<Datagram> for ObservingLoaderWaits<S> {
    fn put(&self, item: Datagram) -> bool {
        if let Datagram::Marker(m) = &item {
            self.waits.observe(m);
        }
        self.inner.put(item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marker(pid: u32, event: MarkerEvent) -> Marker {
        Marker {
            seq: 0,
            t_ns: 0,
            pid,
            rank: Some(0),
            iter: 0,
            event,
        }
    }

    fn begin(pid: u32) -> Marker {
        marker(pid, MarkerEvent::Begin(phase::DATA.into()))
    }

    fn end(pid: u32) -> Marker {
        marker(pid, MarkerEvent::End(phase::DATA.into()))
    }

    /// The ticks in `ticks` on which the loaders are read.
    fn due_ticks(w: &LoaderWaits, ticks: std::ops::RangeInclusive<u64>) -> Vec<u64> {
        ticks.filter(|t| w.tick(*t) != LoaderTick::Skip).collect()
    }

    #[test]
    fn until_a_loop_marks_a_data_wait_the_loaders_are_read_every_tick() {
        let w = LoaderWaits::default();
        w.observe(&marker(7, MarkerEvent::Step));
        w.observe(&marker(7, MarkerEvent::Begin("forward".into())));
        assert!((1..=25).all(|t| w.tick(t) == LoaderTick::Always));
    }

    #[test]
    fn while_no_loop_waits_the_loaders_are_read_every_tenth_tick() {
        let w = LoaderWaits::default();
        w.observe(&begin(7));
        w.observe(&end(7));
        assert_eq!(w.tick(1), LoaderTick::Due, "the tick after a wait began");
        assert_eq!(due_ticks(&w, 2..=30), vec![10, 20, 30]);
    }

    #[test]
    fn while_any_loop_waits_every_tick_is_due() {
        let w = LoaderWaits::default();
        w.observe(&begin(7));
        w.observe(&marker(
            8,
            MarkerEvent::BeginWaiting(phase::DATA.into(), 41),
        ));
        w.observe(&end(7));
        assert_eq!(due_ticks(&w, 1..=15).len(), 15, "loop 8 still waits");
        w.observe(&end(8));
        assert_eq!(due_ticks(&w, 11..=19), Vec::<u64>::new());
    }

    /// A wait shorter than a tick still gets the tick after it began; an end for a loop that
    /// never began (its begin lost) changes nothing.
    #[test]
    fn a_wait_shorter_than_a_tick_is_read_once_and_a_lone_end_is_harmless() {
        let w = LoaderWaits::default();
        w.observe(&begin(7));
        w.observe(&end(7));
        w.observe(&end(9));
        assert_eq!(due_ticks(&w, 11..=15), vec![11]);
        assert_eq!(due_ticks(&w, 11..=15), Vec::<u64>::new());
    }

    #[test]
    fn the_sink_tells_the_waits_and_hands_every_marker_on() {
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = ObservingLoaderWaits {
            inner: tx,
            waits: LoaderWaits::default(),
        };
        assert!(sink.put(Datagram::Marker(begin(7))));
        assert!(sink.put(Datagram::Rejected("x".into())));
        assert_eq!(rx.try_iter().count(), 2);
        assert_eq!(sink.waits.state.waiting.load(Ordering::Relaxed), 1);
    }
}
